//! The AVX-512 attention kernel (`avx512f`): the query (pre-scaled) and the output accumulator live in registers
//! (head size / 16 vectors each), a run's scores are one vector whose `exp`s are computed together (the kernels'
//! vector `exp`), and
//! each value row is added once with its weight broadcast.

use std::arch::x86_64::*;

use super::{PagedKv, RUN};
use crate::quant::avx512::exp;

/// Largest head size the kernel keeps in registers (8 vectors of query + 8 of accumulator).
pub const MAX_HEAD_DIM: usize = 128;

/// Whether the kernel takes heads of `hd` f32.
pub fn supports(hd: usize) -> bool {
    hd > 0 && hd.is_multiple_of(16) && hd <= MAX_HEAD_DIM
}

/// See [`super::attend`]; same contract.
///
/// # Safety
/// AVX-512 F must be available; `supports(q.len())`.
#[target_feature(enable = "avx512f")]
pub unsafe fn attend(
    q: &[f32],
    kv: &PagedKv<'_>,
    table: &[u32],
    offset: usize,
    len: usize,
    scale: f32,
    out: &mut [f32],
) {
    // SAFETY (all arms): the caller guarantees AVX-512 F; `q.len() == 16 * NV` in each arm.
    unsafe {
        match q.len() / 16 {
            1 => attend_nv::<1>(q, kv, table, offset, len, scale, out),
            2 => attend_nv::<2>(q, kv, table, offset, len, scale, out),
            3 => attend_nv::<3>(q, kv, table, offset, len, scale, out),
            4 => attend_nv::<4>(q, kv, table, offset, len, scale, out),
            5 => attend_nv::<5>(q, kv, table, offset, len, scale, out),
            6 => attend_nv::<6>(q, kv, table, offset, len, scale, out),
            7 => attend_nv::<7>(q, kv, table, offset, len, scale, out),
            _ => attend_nv::<8>(q, kv, table, offset, len, scale, out),
        }
    }
}

/// The kernel for heads of `16 * NV` f32.
///
/// # Safety
/// AVX-512 F must be available; `q.len() == out.len() == 16 * NV`.
#[target_feature(enable = "avx512f")]
#[expect(
    clippy::needless_range_loop,
    reason = "indexing by a const-bounded vector number keeps the query and accumulator in registers"
)]
unsafe fn attend_nv<const NV: usize>(
    q: &[f32],
    kv: &PagedKv<'_>,
    table: &[u32],
    offset: usize,
    len: usize,
    scale: f32,
    out: &mut [f32],
) {
    let hd = 16 * NV;
    assert!(q.len() == hd && out.len() == hd);
    let sv = _mm512_set1_ps(scale);
    let mut qv = [_mm512_setzero_ps(); NV];
    for i in 0..NV {
        // SAFETY: `16 i + 16 <= hd == q.len()`; unaligned load.
        qv[i] = _mm512_mul_ps(unsafe { _mm512_loadu_ps(q.as_ptr().add(16 * i)) }, sv);
    }
    let mut acc = [_mm512_setzero_ps(); NV];
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    let mut sc = [0f32; RUN];
    let mut runs = kv.runs(table, len);
    let mut cur = runs.next();
    while let Some((slot0, cnt)) = cur {
        let next = runs.next();
        for (j, s) in sc[..cnt].iter_mut().enumerate() {
            let base = (slot0 + j) * kv.stride + offset;
            let kr = &kv.k[base..base + hd];
            // This slot's value row is read after the run's scores: fetch it now.
            prefetch(&kv.v[base..base + hd]);
            let mut d = _mm512_setzero_ps();
            for i in 0..NV {
                // SAFETY: `16 i + 16 <= hd == kr.len()`; unaligned load.
                d = _mm512_fmadd_ps(qv[i], unsafe { _mm512_loadu_ps(kr.as_ptr().add(16 * i)) }, d);
            }
            *s = _mm512_reduce_add_ps(d);
        }
        let mask: __mmask16 = ((1u32 << cnt) - 1) as u16;
        // SAFETY: the mask enables lanes `0 .. cnt <= RUN == 16` of `sc`.
        let s = unsafe { _mm512_maskz_loadu_ps(mask, sc.as_ptr()) };
        let run_max = _mm512_mask_reduce_max_ps(mask, s);
        if run_max > max {
            let r = (max - run_max).exp();
            sum *= r;
            let rv = _mm512_set1_ps(r);
            for a in &mut acc {
                *a = _mm512_mul_ps(*a, rv);
            }
            max = run_max;
        }
        let w = _mm512_maskz_mov_ps(mask, exp(_mm512_sub_ps(s, _mm512_set1_ps(max))));
        sum += _mm512_reduce_add_ps(w);
        // SAFETY: `sc` holds 16 f32; unaligned store.
        unsafe { _mm512_storeu_ps(sc.as_mut_ptr(), w) };
        for (j, &wj) in sc[..cnt].iter().enumerate() {
            let base = (slot0 + j) * kv.stride + offset;
            let vr = &kv.v[base..base + hd];
            // The next run's key rows, while this run's values are added.
            if let Some((n0, _)) = next.filter(|&(_, c)| j < c) {
                let nb = (n0 + j) * kv.stride + offset;
                prefetch(&kv.k[nb..nb + hd]);
            }
            let wv = _mm512_set1_ps(wj);
            for i in 0..NV {
                // SAFETY: `16 i + 16 <= hd == vr.len()`; unaligned load.
                acc[i] = _mm512_fmadd_ps(wv, unsafe { _mm512_loadu_ps(vr.as_ptr().add(16 * i)) }, acc[i]);
            }
        }
        cur = next;
    }
    let inv = _mm512_set1_ps(if sum > 0.0 { 1.0 / sum } else { 0.0 });
    for i in 0..NV {
        // SAFETY: `16 i + 16 <= hd == out.len()`; unaligned store.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * i), _mm512_mul_ps(acc[i], inv)) };
    }
}

/// Asks for the cache lines of `row` (a hint: no fault, no effect on results).
#[target_feature(enable = "avx512f")]
fn prefetch(row: &[f32]) {
    for line in row.chunks(16) {
        _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast());
    }
}
