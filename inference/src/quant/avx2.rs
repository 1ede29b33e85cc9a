//! AVX2+FMA kernels, 8 f32 lanes: the fallback of [`super::avx512`] and the choice on CPUs without AVX-512.
//! Every function requires the `avx2` and `fma` target features at run time ([`super::simd_available`]).

use super::{BLOCK, Data, MatOut, QMatrix, TOKEN_TILE};
use std::arch::x86_64::*;

#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}

/// Loads 8 f32 from `s[i..i + 8]` (bounds-checked).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn load8(s: &[f32], i: usize) -> __m256 {
    let s8 = &s[i..i + 8];
    // SAFETY: `s8` has exactly 8 readable f32; unaligned load.
    unsafe { _mm256_loadu_ps(s8.as_ptr()) }
}

/// The 32 quants of a 4-bit block as 4 vectors of f32 (elements 0-7, 8-15, 16-23, 24-31), `bias`
/// subtracted (8 for Q4_0, 0 for Q4_1).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn unpack_q4<const BIAS: i32>(qs: &[u8]) -> [__m256; 4] {
    let q16 = &qs[..16];
    // SAFETY: `q16` has exactly 16 readable bytes; unaligned load.
    let q = unsafe { _mm_loadu_si128(q16.as_ptr().cast()) };
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(q, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), mask);
    [
        nibbles_to_f32::<BIAS>(lo),
        nibbles_to_f32::<BIAS>(_mm_srli_si128::<8>(lo)),
        nibbles_to_f32::<BIAS>(hi),
        nibbles_to_f32::<BIAS>(_mm_srli_si128::<8>(hi)),
    ]
}

/// The low 8 bytes of `v` (values 0..15) minus `BIAS`, as f32.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn nibbles_to_f32<const BIAS: i32>(v: __m128i) -> __m256 {
    let i = _mm256_cvtepu8_epi32(v);
    _mm256_cvtepi32_ps(if BIAS == 0 {
        i
    } else {
        _mm256_sub_epi32(i, _mm256_set1_epi32(BIAS))
    })
}

/// The 32 quants of a Q8_0 block as 4 vectors of f32.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn unpack_q8(qs: &[i8]) -> [__m256; 4] {
    let q32 = &qs[..32];
    let mut out = [_mm256_setzero_ps(); 4];
    for (k, o) in out.iter_mut().enumerate() {
        // SAFETY: `q32[8k..8k+8]` is in bounds (k < 4); 8-byte unaligned load.
        let v = unsafe { _mm_loadl_epi64(q32.as_ptr().add(8 * k).cast()) };
        *o = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    }
    out
}

/// Runs the row loop of a token tile of `NT` tokens: `$deq(b)` yields block `b` dequantized as 4 vectors;
/// each token keeps two accumulators so consecutive FMAs are independent (FMA latency 4, throughput 2/cycle).
macro_rules! tile_rows {
    ($nt:ident, $c:expr, $nb:expr, $row0:expr, $nrows:expr, $x:expr, $out:expr, $t0:expr, |$b:ident| $deq:expr) => {{
        for i in 0..$nrows {
            let r = $row0 + i;
            let mut acc = [[_mm256_setzero_ps(); 2]; $nt];
            for j in 0..$nb {
                let $b = r * $nb + j;
                let w: [__m256; 4] = $deq;
                for t in 0..$nt {
                    let xp = &$x[($t0 + t) * $c + j * BLOCK..($t0 + t) * $c + (j + 1) * BLOCK];
                    // SAFETY: `xp` has exactly 32 readable f32; unaligned loads at offsets 0, 8, 16, 24.
                    let (x0, x1, x2, x3) = unsafe {
                        let p = xp.as_ptr();
                        (
                            _mm256_loadu_ps(p),
                            _mm256_loadu_ps(p.add(8)),
                            _mm256_loadu_ps(p.add(16)),
                            _mm256_loadu_ps(p.add(24)),
                        )
                    };
                    acc[t][0] = _mm256_fmadd_ps(w[0], x0, acc[t][0]);
                    acc[t][1] = _mm256_fmadd_ps(w[1], x1, acc[t][1]);
                    acc[t][0] = _mm256_fmadd_ps(w[2], x2, acc[t][0]);
                    acc[t][1] = _mm256_fmadd_ps(w[3], x3, acc[t][1]);
                }
            }
            for t in 0..$nt {
                $out.put(i, $t0 + t, hsum(_mm256_add_ps(acc[t][0], acc[t][1])));
            }
        }
    }};
}

/// One tile of `NT` tokens starting at token `t0`, all rows.
#[target_feature(enable = "avx2,fma")]
#[expect(
    clippy::needless_range_loop,
    reason = "indexing by a const-bounded token keeps accumulators in registers"
)]
fn tile<const NT: usize>(m: &QMatrix, x: &[f32], t0: usize, row0: usize, out: &mut MatOut<'_>) {
    let c = m.cols;
    let nb = c / BLOCK;
    let nrows = out.rows();
    match &m.data {
        Data::F32(v) => {
            for i in 0..nrows {
                let r = row0 + i;
                let w = &v[r * c..(r + 1) * c];
                let mut acc = [_mm256_setzero_ps(); NT];
                let mut k = 0;
                while k + 8 <= c {
                    let wv = load8(w, k);
                    for t in 0..NT {
                        acc[t] = _mm256_fmadd_ps(wv, load8(x, (t0 + t) * c + k), acc[t]);
                    }
                    k += 8;
                }
                for t in 0..NT {
                    let mut s = hsum(acc[t]);
                    for kk in k..c {
                        s += w[kk] * x[(t0 + t) * c + kk];
                    }
                    out.put(i, t0 + t, s);
                }
            }
        }
        Data::Q8_0 { d, qs } => tile_rows!(NT, c, nb, row0, nrows, x, out, t0, |b| {
            let q = unpack_q8(&qs[b * BLOCK..]);
            let dv = _mm256_set1_ps(d[b]);
            [
                _mm256_mul_ps(q[0], dv),
                _mm256_mul_ps(q[1], dv),
                _mm256_mul_ps(q[2], dv),
                _mm256_mul_ps(q[3], dv),
            ]
        }),
        Data::Q4_0 { d, qs } => tile_rows!(NT, c, nb, row0, nrows, x, out, t0, |b| {
            let q = unpack_q4::<8>(&qs[b * 16..]);
            let dv = _mm256_set1_ps(d[b]);
            [
                _mm256_mul_ps(q[0], dv),
                _mm256_mul_ps(q[1], dv),
                _mm256_mul_ps(q[2], dv),
                _mm256_mul_ps(q[3], dv),
            ]
        }),
        Data::Q4_1 { d, m: mins, qs } => tile_rows!(NT, c, nb, row0, nrows, x, out, t0, |b| {
            let q = unpack_q4::<0>(&qs[b * 16..]);
            let dv = _mm256_set1_ps(d[b]);
            let mv = _mm256_set1_ps(mins[b]);
            [
                _mm256_fmadd_ps(q[0], dv, mv),
                _mm256_fmadd_ps(q[1], dv, mv),
                _mm256_fmadd_ps(q[2], dv, mv),
                _mm256_fmadd_ps(q[3], dv, mv),
            ]
        }),
    }
}

/// See [`QMatrix::matmul_rows`].
#[target_feature(enable = "avx2,fma")]
pub fn matmul_rows(m: &QMatrix, x: &[f32], n_tok: usize, row0: usize, out: &mut MatOut<'_>) {
    let mut t0 = 0;
    while t0 < n_tok {
        match n_tok - t0 {
            1 => tile::<1>(m, x, t0, row0, out),
            2 => tile::<2>(m, x, t0, row0, out),
            3 => tile::<3>(m, x, t0, row0, out),
            _ => tile::<TOKEN_TILE>(m, x, t0, row0, out),
        }
        t0 += (n_tok - t0).min(TOKEN_TILE);
    }
}

/// See [`super::dot`].
#[target_feature(enable = "avx2,fma")]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut k = 0;
    while k + 16 <= n {
        acc0 = _mm256_fmadd_ps(load8(a, k), load8(b, k), acc0);
        acc1 = _mm256_fmadd_ps(load8(a, k + 8), load8(b, k + 8), acc1);
        k += 16;
    }
    while k + 8 <= n {
        acc0 = _mm256_fmadd_ps(load8(a, k), load8(b, k), acc0);
        k += 8;
    }
    let mut s = hsum(_mm256_add_ps(acc0, acc1));
    for kk in k..n {
        s += a[kk] * b[kk];
    }
    s
}

/// See [`super::axpy`].
#[target_feature(enable = "avx2,fma")]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let av = _mm256_set1_ps(a);
    let mut k = 0;
    while k + 8 <= n {
        let r = _mm256_fmadd_ps(av, load8(x, k), load8(y, k));
        let y8 = &mut y[k..k + 8];
        // SAFETY: `y8` has exactly 8 writable f32; unaligned store.
        unsafe { _mm256_storeu_ps(y8.as_mut_ptr(), r) };
        k += 8;
    }
    for kk in k..n {
        y[kk] += a * x[kk];
    }
}
