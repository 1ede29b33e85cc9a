//! AVX-512 kernels (`avx512f`, `avx512bw`, `avx512vl`), chosen at run time over the AVX2 ones: the same per-block
//! sums as [`super::QMatrix::matmul_rows_scalar`], 16 f32 lanes wide, so a 32-element block is two vectors
//! (one nibble plane each for Q4_0/Q4_1), half the unpack and FMA instructions of AVX2.
//!
//! Activations stay f32 (see [`super`]). Bounds are checked once per call (asserts at the top of
//! [`matmul_rows`]); the inner loops then read through raw pointers. Every function requires the three target
//! features at run time ([`available`]).

use std::arch::x86_64::*;

use super::{BLOCK, Data, QMatrix};

/// Tokens per tile: 8 tokens × 2 accumulators + the block and two activations fit the 32 vector registers, so a
/// batch of 8 decode tokens dequantizes each weight block once (AVX2's 16 registers hold [`super::TOKEN_TILE`]).
const TILE: usize = 8;

/// Whether this CPU runs these kernels.
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// The 32 nibbles of a 4-bit block at `p` (16 bytes: element j low nibble of byte j, element j + 16 high) as two
/// vectors of i32 (elements 0-15, 16-31).
///
/// # Safety
/// `p` must point at 16 readable bytes; AVX-512 F/BW/VL must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn nibbles(p: *const u8) -> (__m512i, __m512i) {
    // SAFETY: the caller guarantees 16 readable bytes at `p`; unaligned load.
    let q = unsafe { _mm_loadu_si128(p.cast()) };
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(q, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), mask);
    (_mm512_cvtepu8_epi32(lo), _mm512_cvtepu8_epi32(hi))
}

/// Runs the rows of one token tile of `NT` tokens, two rows per pass so each activation load serves both: `$deq(b)`
/// yields block `b` (global index) dequantized as two vectors; each (row, token) keeps one accumulator (2 rows × 8
/// tokens + 4 weight and 2 activation vectors fit the 32 registers). An odd last row runs alone.
macro_rules! tile_rows {
    ($nt:ident, $c:expr, $nb:expr, $row0:expr, $nrows:expr, $xp:expr, $out:expr, $n_tok:expr, $t0:expr, |$b:ident| $deq:expr) => {{
        let mut i = 0;
        while i < $nrows {
            let pair = i + 1 < $nrows;
            let (ra, rb) = ($row0 + i, $row0 + i + usize::from(pair));
            let mut acc = [[_mm512_setzero_ps(); $nt]; 2];
            for j in 0..$nb {
                let wa: [__m512; 2] = {
                    let $b = ra * $nb + j;
                    $deq
                };
                let wb: [__m512; 2] = {
                    let $b = rb * $nb + j;
                    $deq
                };
                for t in 0..$nt {
                    // SAFETY: token `t0 + t < n_tok` and block `j < nb`, so these 32 f32 lie within `x`
                    // (`x.len() == n_tok * cols` was asserted); unaligned loads.
                    let (x0, x1) = unsafe {
                        let p = $xp.add(($t0 + t) * $c + j * BLOCK);
                        (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
                    };
                    acc[0][t] = _mm512_fmadd_ps(wa[1], x1, _mm512_fmadd_ps(wa[0], x0, acc[0][t]));
                    acc[1][t] = _mm512_fmadd_ps(wb[1], x1, _mm512_fmadd_ps(wb[0], x0, acc[1][t]));
                }
            }
            for t in 0..$nt {
                $out[i * $n_tok + $t0 + t] = _mm512_reduce_add_ps(acc[0][t]);
                if pair {
                    $out[(i + 1) * $n_tok + $t0 + t] = _mm512_reduce_add_ps(acc[1][t]);
                }
            }
            i += 1 + usize::from(pair);
        }
    }};
}

/// One tile of `NT` tokens starting at token `t0`, all rows of `out`.
///
/// # Safety
/// AVX-512 F/BW/VL must be available; `x.len() == n_tok * m.cols`, `t0 + NT <= n_tok` and rows
/// `row0 .. row0 + out.len() / n_tok` within the matrix (checked by [`matmul_rows`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[expect(
    clippy::needless_range_loop,
    reason = "indexing by a const-bounded token keeps accumulators in registers"
)]
unsafe fn tile<const NT: usize>(
    m: &QMatrix,
    x: &[f32],
    n_tok: usize,
    t0: usize,
    row0: usize,
    out: &mut [f32],
) {
    let c = m.cols;
    let nb = c / BLOCK;
    let nrows = out.len() / n_tok;
    let xp = x.as_ptr();
    match &m.data {
        Data::F32(v) => {
            for i in 0..nrows {
                let w = &v[(row0 + i) * c..(row0 + i + 1) * c];
                let mut acc = [_mm512_setzero_ps(); NT];
                let mut k = 0;
                while k + 16 <= c {
                    // SAFETY: `k + 16 <= c == w.len()`; unaligned load.
                    let wv = unsafe { _mm512_loadu_ps(w.as_ptr().add(k)) };
                    for t in 0..NT {
                        // SAFETY: `(t0 + t) * c + k + 16 <= n_tok * c == x.len()`.
                        let xv = unsafe { _mm512_loadu_ps(xp.add((t0 + t) * c + k)) };
                        acc[t] = _mm512_fmadd_ps(wv, xv, acc[t]);
                    }
                    k += 16;
                }
                for t in 0..NT {
                    let mut s = _mm512_reduce_add_ps(acc[t]);
                    for kk in k..c {
                        s += w[kk] * x[(t0 + t) * c + kk];
                    }
                    out[i * n_tok + t0 + t] = s;
                }
            }
        }
        Data::Q8_0 { d, qs } => {
            let qp = qs.as_ptr();
            tile_rows!(NT, c, nb, row0, nrows, xp, out, n_tok, t0, |b| {
                // SAFETY: block `b` of a matrix whose rows were checked: 32 quants at `32 b`; unaligned loads.
                let (q0, q1) = unsafe {
                    let p = qp.add(b * BLOCK);
                    (
                        _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())),
                        _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(16).cast())),
                    )
                };
                let dv = _mm512_set1_ps(d[b]);
                [
                    _mm512_mul_ps(_mm512_cvtepi32_ps(q0), dv),
                    _mm512_mul_ps(_mm512_cvtepi32_ps(q1), dv),
                ]
            })
        }
        Data::Q4_0 { d, qs } => {
            let qp = qs.as_ptr();
            tile_rows!(NT, c, nb, row0, nrows, xp, out, n_tok, t0, |b| {
                // SAFETY: block `b` of a matrix whose rows were checked: 16 bytes at `16 b`.
                let (lo, hi) = unsafe { nibbles(qp.add(b * 16)) };
                // (q - 8) * d = q * d - 8 d.
                let dv = _mm512_set1_ps(d[b]);
                let off = _mm512_set1_ps(-8.0 * d[b]);
                [
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), dv, off),
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), dv, off),
                ]
            })
        }
        Data::Q4_1 { d, m: mins, qs } => {
            let qp = qs.as_ptr();
            tile_rows!(NT, c, nb, row0, nrows, xp, out, n_tok, t0, |b| {
                // SAFETY: block `b` of a matrix whose rows were checked: 16 bytes at `16 b`.
                let (lo, hi) = unsafe { nibbles(qp.add(b * 16)) };
                let dv = _mm512_set1_ps(d[b]);
                let mv = _mm512_set1_ps(mins[b]);
                [
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), dv, mv),
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), dv, mv),
                ]
            })
        }
    }
}

/// See [`QMatrix::matmul_rows`]; same contract.
///
/// # Safety
/// AVX-512 F/BW/VL must be available ([`available`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn matmul_rows(m: &QMatrix, x: &[f32], n_tok: usize, row0: usize, out: &mut [f32]) {
    assert!(n_tok > 0 && x.len() == n_tok * m.cols && out.len().is_multiple_of(n_tok));
    let nrows = out.len() / n_tok;
    assert!(row0 + nrows <= m.rows);
    // The quantized stores hold whole rows (`from_ggml` checked their lengths): the raw block reads stay in them.
    let blocks = m.rows * m.cols / BLOCK;
    match &m.data {
        Data::F32(v) => assert_eq!(v.len(), m.rows * m.cols),
        Data::Q8_0 { d, qs } => assert!(d.len() == blocks && qs.len() == blocks * BLOCK),
        Data::Q4_0 { d, qs } => assert!(d.len() == blocks && qs.len() == blocks * 16),
        Data::Q4_1 { d, m: mins, qs } => {
            assert!(d.len() == blocks && mins.len() == blocks && qs.len() == blocks * 16)
        }
    }
    let mut t0 = 0;
    while t0 < n_tok {
        // SAFETY: features available (caller), bounds asserted above, `t0 + NT <= n_tok` in each arm.
        unsafe {
            match n_tok - t0 {
                1 => tile::<1>(m, x, n_tok, t0, row0, out),
                2 => tile::<2>(m, x, n_tok, t0, row0, out),
                3 => tile::<3>(m, x, n_tok, t0, row0, out),
                4 => tile::<4>(m, x, n_tok, t0, row0, out),
                5 => tile::<5>(m, x, n_tok, t0, row0, out),
                6 => tile::<6>(m, x, n_tok, t0, row0, out),
                7 => tile::<7>(m, x, n_tok, t0, row0, out),
                _ => tile::<TILE>(m, x, n_tok, t0, row0, out),
            }
        }
        t0 += (n_tok - t0).min(TILE);
    }
}

/// See [`super::dot`].
///
/// # Safety
/// AVX-512 F/BW/VL must be available ([`available`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = _mm512_setzero_ps();
    let mut k = 0;
    while k + 16 <= n {
        // SAFETY: `k + 16 <= n` and both slices hold at least `n` f32.
        acc = unsafe {
            _mm512_fmadd_ps(
                _mm512_loadu_ps(a.as_ptr().add(k)),
                _mm512_loadu_ps(b.as_ptr().add(k)),
                acc,
            )
        };
        k += 16;
    }
    if k < n {
        // Masked tail: lanes past `n` read nothing (masked loads do not fault) and add zero.
        let mask: __mmask16 = (1u16 << (n - k)) - 1;
        // SAFETY: the mask enables only lanes `k .. n`, within both slices.
        acc = unsafe {
            _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(mask, a.as_ptr().add(k)),
                _mm512_maskz_loadu_ps(mask, b.as_ptr().add(k)),
                acc,
            )
        };
    }
    _mm512_reduce_add_ps(acc)
}

/// See [`super::axpy`].
///
/// # Safety
/// AVX-512 F/BW/VL must be available ([`available`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let av = _mm512_set1_ps(a);
    let mut k = 0;
    while k + 16 <= n {
        // SAFETY: `k + 16 <= n`, within both slices; unaligned load/store.
        unsafe {
            let r = _mm512_fmadd_ps(
                av,
                _mm512_loadu_ps(x.as_ptr().add(k)),
                _mm512_loadu_ps(y.as_ptr().add(k)),
            );
            _mm512_storeu_ps(y.as_mut_ptr().add(k), r);
        }
        k += 16;
    }
    if k < n {
        let mask: __mmask16 = (1u16 << (n - k)) - 1;
        // SAFETY: the mask enables only lanes `k .. n`, within both slices (masked lanes are neither read nor
        // written).
        unsafe {
            let r = _mm512_fmadd_ps(
                av,
                _mm512_maskz_loadu_ps(mask, x.as_ptr().add(k)),
                _mm512_maskz_loadu_ps(mask, y.as_ptr().add(k)),
            );
            _mm512_mask_storeu_ps(y.as_mut_ptr().add(k), mask, r);
        }
    }
}
