//! The AVX-512 attention kernel (`avx512f`): the queries (pre-scaled) and the output accumulators live in registers
//! (head size / 16 vectors each), the query heads that share a KV head go through the cache together when they fit
//! the registers (each key and value row loaded once for all), a run's scores are one vector per head whose `exp`s
//! are computed together (the kernels' vector `exp`), and each value row is added once per head with its weight
//! broadcast.

use std::arch::x86_64::*;

use super::{F16, KvElem, KvHead, RUN};
use crate::quant::avx512::{exp, sum16};

/// A KV-cache element type the kernel loads 16 at a time as f32.
pub trait Lanes: KvElem {
    /// Elements `p .. p + 16` as f32.
    ///
    /// # Safety
    /// 16 elements must be readable at `p`; AVX-512 F must be available.
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Lanes for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        // SAFETY: the caller's contract; unaligned load.
        unsafe { _mm512_loadu_ps(p) }
    }
}

impl Lanes for F16 {
    #[inline(always)]
    unsafe fn load16(p: *const F16) -> __m512 {
        // SAFETY: the caller's contract (16 halves: 32 bytes); unaligned load; `vcvtph2ps` is AVX-512 F.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
}

/// Writes `src` as halves into `dst` (round to nearest even, as [`crate::quant::f32_to_f16`]).
///
/// # Safety
/// AVX-512 F must be available; `src.len() == dst.len()`.
#[target_feature(enable = "avx512f")]
pub unsafe fn store_f16(src: &[f32], dst: &mut [F16]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n` elements of both; unaligned load and store (`F16` is a transparent u16).
        unsafe {
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_loadu_ps(
                src.as_ptr().add(i),
            ));
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), h);
        }
        i += 16;
    }
    for (d, &v) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = F16(crate::quant::f32_to_f16(v));
    }
}

/// Largest head size the kernel keeps in registers (8 vectors of query + 8 of accumulator).
pub const MAX_HEAD_DIM: usize = 128;

/// Whether the kernel takes heads of `hd` f32.
pub fn supports(hd: usize) -> bool {
    hd > 0 && hd.is_multiple_of(16) && hd <= MAX_HEAD_DIM
}

/// Query heads of one KV head computed in one pass when their queries and accumulators fit the registers (`G × NV ≤
/// 12` vectors each way): each key and value row is then loaded once for all of them.
const GROUP_VECTORS: usize = 12;

/// See [`super::attend`]; same contract.
///
/// # Safety
/// AVX-512 F must be available; `supports(hd)`; `q.len() == out.len()`, a multiple of `hd`.
#[target_feature(enable = "avx512f")]
pub unsafe fn attend<T: Lanes>(q: &[f32], hd: usize, head: &KvHead<'_, T>, scale: f32, out: &mut [f32]) {
    let nv = hd / 16;
    // Heads per pass: a group of heads at 64 f32 (4 vectors) shares each load; larger heads go one at a time.
    let per_pass = if nv == 4 { GROUP_VECTORS / nv } else { 1 };
    for (qs, os) in q.chunks(per_pass * hd).zip(out.chunks_mut(per_pass * hd)) {
        // SAFETY (all arms): the caller guarantees AVX-512 F; `qs.len() == os.len() == 16 NV G` in each arm.
        unsafe {
            match (nv, qs.len() / hd) {
                (4, 3) => attend_nv::<T, 4, 3>(qs, head, scale, os),
                (4, 2) => attend_nv::<T, 4, 2>(qs, head, scale, os),
                (1, _) => attend_nv::<T, 1, 1>(qs, head, scale, os),
                (2, _) => attend_nv::<T, 2, 1>(qs, head, scale, os),
                (3, _) => attend_nv::<T, 3, 1>(qs, head, scale, os),
                (4, _) => attend_nv::<T, 4, 1>(qs, head, scale, os),
                (5, _) => attend_nv::<T, 5, 1>(qs, head, scale, os),
                (6, _) => attend_nv::<T, 6, 1>(qs, head, scale, os),
                (7, _) => attend_nv::<T, 7, 1>(qs, head, scale, os),
                _ => attend_nv::<T, 8, 1>(qs, head, scale, os),
            }
        }
    }
}

/// The kernel for `G` query heads of `16 * NV` f32 that share one KV head.
///
/// # Safety
/// AVX-512 F must be available; `q.len() == out.len() == 16 * NV * G`.
#[target_feature(enable = "avx512f")]
#[expect(
    clippy::needless_range_loop,
    reason = "indexing by const-bounded head and vector numbers keeps the queries and accumulators in registers"
)]
unsafe fn attend_nv<T: Lanes, const NV: usize, const G: usize>(
    q: &[f32],
    head: &KvHead<'_, T>,
    scale: f32,
    out: &mut [f32],
) {
    let hd = 16 * NV;
    assert!(q.len() == hd * G && out.len() == hd * G);
    let sv = _mm512_set1_ps(scale);
    let mut qv = [[_mm512_setzero_ps(); NV]; G];
    for g in 0..G {
        for i in 0..NV {
            // SAFETY: `g hd + 16 i + 16 <= G hd == q.len()`; unaligned load.
            qv[g][i] = _mm512_mul_ps(unsafe { _mm512_loadu_ps(q.as_ptr().add(g * hd + 16 * i)) }, sv);
        }
    }
    let mut acc = [[_mm512_setzero_ps(); NV]; G];
    let (mut max, mut sum) = ([f32::NEG_INFINITY; G], [0f32; G]);
    let mut sc = [[0f32; RUN]; G];
    // Per head, each slot's 16 partial products of the run (summed 16 at a time by `sum16`).
    let mut part = [[_mm512_setzero_ps(); RUN]; G];
    let mut runs = head.runs();
    let mut cur = runs.next();
    while let Some((slot0, cnt)) = cur {
        let next = runs.next();
        for j in 0..cnt {
            let kr = head.key(slot0 + j, hd);
            // This slot's value row is read after the run's scores: fetch it now.
            prefetch(head.value(slot0 + j, hd));
            let mut kvec = [_mm512_setzero_ps(); NV];
            for i in 0..NV {
                // SAFETY: `16 i + 16 <= hd == kr.len()`; unaligned load.
                kvec[i] = unsafe { T::load16(kr.as_ptr().add(16 * i)) };
            }
            for g in 0..G {
                let mut d = _mm512_mul_ps(qv[g][0], kvec[0]);
                for i in 1..NV {
                    d = _mm512_fmadd_ps(qv[g][i], kvec[i], d);
                }
                part[g][j] = d;
            }
        }
        let mask: __mmask16 = ((1u32 << cnt) - 1) as u16;
        for g in 0..G {
            // Lanes past `cnt` sum stale partials of an earlier run: masked off.
            let s = _mm512_maskz_mov_ps(mask, sum16(&part[g]));
            let run_max = _mm512_mask_reduce_max_ps(mask, s);
            if run_max > max[g] {
                let r = (max[g] - run_max).exp();
                sum[g] *= r;
                let rv = _mm512_set1_ps(r);
                for a in &mut acc[g] {
                    *a = _mm512_mul_ps(*a, rv);
                }
                max[g] = run_max;
            }
            let w = _mm512_maskz_mov_ps(mask, exp(_mm512_sub_ps(s, _mm512_set1_ps(max[g]))));
            sum[g] += _mm512_reduce_add_ps(w);
            // SAFETY: `sc[g]` holds 16 f32; unaligned store.
            unsafe { _mm512_storeu_ps(sc[g].as_mut_ptr(), w) };
        }
        for j in 0..cnt {
            let vr = head.value(slot0 + j, hd);
            // The next run's key rows, while this run's values are added.
            if let Some((n0, _)) = next.filter(|&(_, c)| j < c) {
                prefetch(head.key(n0 + j, hd));
            }
            for i in 0..NV {
                // SAFETY: `16 i + 16 <= hd == vr.len()`; unaligned load.
                let v = unsafe { T::load16(vr.as_ptr().add(16 * i)) };
                for g in 0..G {
                    acc[g][i] = _mm512_fmadd_ps(_mm512_set1_ps(sc[g][j]), v, acc[g][i]);
                }
            }
        }
        cur = next;
    }
    for g in 0..G {
        let inv = _mm512_set1_ps(if sum[g] > 0.0 { 1.0 / sum[g] } else { 0.0 });
        for i in 0..NV {
            // SAFETY: `g hd + 16 i + 16 <= G hd == out.len()`; unaligned store.
            unsafe {
                _mm512_storeu_ps(
                    out.as_mut_ptr().add(g * hd + 16 * i),
                    _mm512_mul_ps(acc[g][i], inv),
                )
            };
        }
    }
}

/// Asks for the cache lines of `row` (a hint: no fault, no effect on results).
#[target_feature(enable = "avx512f")]
fn prefetch<T>(row: &[T]) {
    let p = row.as_ptr().cast::<i8>();
    let mut off = 0;
    while off < std::mem::size_of_val(row) {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off));
        off += 64;
    }
}
