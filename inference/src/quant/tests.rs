//! Tests of the tensor types and the kernels: every SIMD family against the scalar sums, round trips of the
//! conversions, the ggml layouts.

use super::*;

/// `n` pseudo-random values in [-1, 1] (xorshift), the same for the same seed.
pub(crate) fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn f16_round_trip() {
    for v in [0.0f32, 1.0, -2.5, 0.000_123, 65504.0, 1e-7, -0.333_251_95] {
        let h = f32_to_f16(v);
        let back = f16_to_f32(h);
        assert!(
            (back - v).abs() <= v.abs() * 1e-3 + 1e-7,
            "{v} -> {h:#x} -> {back}"
        );
    }
    assert_eq!(f16_to_f32(0x3c00), 1.0);
    assert_eq!(f16_to_f32(0xc000), -2.0);
}

/// `w` (rows × cols, row-major) quantized as `ty` the way a GGUF file stores it, loaded as a matrix.
pub(crate) fn quantized(ty: GgmlType, rows: usize, cols: usize, w: &[f32]) -> QMatrix {
    let bytes = quantize_ggml(ty, w).expect("quantize");
    QMatrix::from_ggml(ty, rows, cols, &bytes).expect("matrix")
}

#[test]
fn quantized_matmul_matches_dequantized_reference() {
    let (rows, cols) = (13, 96);
    let w = pseudo_random(rows * cols, 1);
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
    ] {
        let m = quantized(ty, rows, cols, &w);
        let deq = m.dequantize();
        // Quantization error is bounded by the block's scale.
        let max_err = deq
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(max_err < 0.15, "{ty:?}: dequantization error {max_err}");
        for n_tok in [1, 3, 4, 7] {
            let x = pseudo_random(n_tok * cols, 7 + n_tok as u32);
            let mut out = vec![0f32; rows * n_tok];
            let mut out_scalar = vec![0f32; rows * n_tok];
            m.matmul_rows(&x, n_tok, 0, &mut out);
            m.matmul_rows_scalar(&x, n_tok, 0, &mut out_scalar);
            for r in 0..rows {
                for t in 0..n_tok {
                    let want: f64 = (0..cols)
                        .map(|k| f64::from(deq[r * cols + k]) * f64::from(x[t * cols + k]))
                        .sum();
                    for got in [out[r * n_tok + t], out_scalar[r * n_tok + t]] {
                        assert!(
                            (f64::from(got) - want).abs() < 1e-4,
                            "{ty:?} r{r} t{t}: {got} vs {want}"
                        );
                    }
                }
            }
            // A row sub-range gives the same rows.
            let mut part = vec![0f32; 5 * n_tok];
            m.matmul_rows(&x, n_tok, 4, &mut part);
            assert_eq!(&part[..], &out[4 * n_tok..9 * n_tok]);
        }
    }
}

/// The AVX-512 and AVX2 kernels give the scalar kernel's sums (up to f32 summation order) on every tensor
/// type, token count (tiles of 1-4 and a remainder) and row range, with columns that are not a multiple of
/// 16 for the F32 tail.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_and_avx2_kernels_match_scalar() {
    if !avx512::available() || !simd_available() {
        eprintln!("skipped: this CPU lacks AVX-512 F/BW/VL or AVX2+FMA");
        return;
    }
    for (ty, cols) in [
        (GgmlType::F32, 200),
        (GgmlType::F16, 96),
        (GgmlType::Q8_0, 576),
        (GgmlType::Q4_0, 576),
        (GgmlType::Q4_1, 1536),
    ] {
        let rows = 19;
        let w = pseudo_random(rows * cols, 11);
        let m = quantized(ty, rows, cols, &w);
        for n_tok in [1, 2, 3, 4, 5, 7, 8, 9, 13, 17] {
            let x = pseudo_random(n_tok * cols, 3 + n_tok as u32);
            let (row0, nrows) = (2, 15);
            let mut scalar = vec![0f32; nrows * n_tok];
            let mut wide = vec![0f32; nrows * n_tok];
            let mut narrow = vec![0f32; nrows * n_tok];
            m.matmul_rows_scalar(&x, n_tok, row0, &mut scalar);
            // SAFETY: AVX-512 F/BW/VL and AVX2+FMA were detected above.
            unsafe {
                avx512::matmul_rows(&m, &x, n_tok, row0, &mut MatOut::row_major(&mut wide, n_tok));
                avx2::matmul_rows(&m, &x, n_tok, row0, &mut MatOut::row_major(&mut narrow, n_tok));
            }
            for (k, &s) in scalar.iter().enumerate() {
                let tol = 1e-5 * (1.0 + s.abs()) * (cols as f32).sqrt();
                assert!(
                    (wide[k] - s).abs() <= tol,
                    "{ty:?} n_tok {n_tok} [{k}]: avx512 {} vs scalar {s}",
                    wide[k]
                );
                assert!(
                    (narrow[k] - s).abs() <= tol,
                    "{ty:?} n_tok {n_tok} [{k}]: avx2 {} vs scalar {s}",
                    narrow[k]
                );
            }
        }
    }
    for n in [1, 15, 16, 17, 64, 100] {
        let a = pseudo_random(n, 5);
        let b = pseudo_random(n, 6);
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        // SAFETY: AVX-512 F/BW/VL were detected above.
        let (got, mut y) = (unsafe { avx512::dot(&a, &b) }, b.clone());
        assert!((got - want).abs() < 1e-5, "dot n {n}: {got} vs {want}");
        // SAFETY: as above.
        unsafe { avx512::axpy(0.25, &a, &mut y) };
        for k in 0..n {
            assert!((y[k] - (b[k] + 0.25 * a[k])).abs() < 1e-6, "axpy n {n} [{k}]");
        }
    }
    if std::env::var_os(SIMD_ENV).is_none() {
        // What `matmul_rows`, `dot` and `axpy` dispatch to on this CPU.
        assert!(
            simd_level() >= SimdLevel::Avx512,
            "AVX-512 F/BW/VL detected but not selected"
        );
    }
}

/// The AMX kernels give the scalar kernel's sums to f32 accuracy (bf16 halves of the activations, exact
/// quants, scales in f32) on every quantized type, token counts around the 16-token tile, row ranges that
/// end mid-group, and a second preparation of fewer tokens into the same storage.
#[cfg(target_arch = "x86_64")]
#[test]
fn amx_kernels_match_scalar() {
    if simd_level() != SimdLevel::Amx {
        eprintln!("skipped: AMX-BF16 is not in use here ({:?})", simd_level());
        return;
    }
    let mut prep = Prepared::default();
    for (ty, cols) in [
        (GgmlType::F32, 64),
        (GgmlType::Q8_0, 576),
        (GgmlType::Q4_0, 576),
        (GgmlType::Q4_1, 1536),
    ] {
        let rows = 53;
        let w = pseudo_random(rows * cols, 13);
        let m = quantized(ty, rows, cols, &w);
        let deq = m.dequantize();
        for n_tok in [17, 2, 3, 8, 15, 16, 33, 40, 64] {
            // Activations of mixed magnitude: the `lo` half matters.
            let x: Vec<f32> = pseudo_random(n_tok * cols, 5 + n_tok as u32)
                .iter()
                .enumerate()
                .map(|(i, v)| v * (1.0 + (i % 7) as f32 * 3.7))
                .collect();
            let acts = prep.prepare(&x, n_tok, cols);
            assert!(acts.tiles.is_some(), "no tiles for {n_tok} tokens");
            for (row0, nrows) in [(0, rows), (5, 37), (50, 3)] {
                let mut scalar = vec![0f32; nrows * n_tok];
                let mut tiled = vec![0f32; nrows * n_tok];
                m.matmul_rows_scalar(&x, n_tok, row0, &mut scalar);
                m.matmul_prepared(&acts, row0, &mut MatOut::row_major(&mut tiled, n_tok));
                for (k, &s) in scalar.iter().enumerate() {
                    // Each product carries x's relative error (≤ 2⁻¹⁷ from the two halves; plain bf16 would
                    // be 2⁻⁹) plus f32 rounding of the sums: bounded by 2⁻¹⁵ Σ |w x|.
                    let (r, t) = (row0 + k / n_tok, k % n_tok);
                    let mag: f32 = (deq[r * cols..(r + 1) * cols].iter())
                        .zip(&x[t * cols..(t + 1) * cols])
                        .map(|(w, x)| (w * x).abs())
                        .sum();
                    let tol = mag / 32768.0 + 1e-6;
                    assert!(
                        (tiled[k] - s).abs() <= tol,
                        "{ty:?} n_tok {n_tok} rows {row0}+{nrows} [{k}]: amx {} vs scalar {s}",
                        tiled[k]
                    );
                }
            }
        }
    }
    assert!(
        prep.prepare(&[0.0; 64], 1, 64).tiles.is_none(),
        "one token takes the AVX-512 kernel"
    );
}

#[test]
fn ggml_nibble_layout() {
    // A Q4_1 block with d = 1, m = 0 and byte j = (j + 1) << 4 | j: element j = j, element j+16 = j+1.
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&f32_to_f16(1.0).to_le_bytes());
    bytes.extend_from_slice(&f32_to_f16(0.0).to_le_bytes());
    bytes.extend((0..16u8).map(|j| (((j + 1) & 0xf) << 4) | j));
    let m = QMatrix::from_ggml(GgmlType::Q4_1, 1, 32, &bytes).expect("matrix");
    let d = m.dequantize();
    assert_eq!(d[3], 3.0);
    assert_eq!(d[16 + 3], 4.0);
}

#[test]
fn dot_and_axpy() {
    let a = pseudo_random(37, 3);
    let b = pseudo_random(37, 4);
    let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    assert!((dot(&a, &b) - want).abs() < 1e-5);
    let mut y = b.clone();
    axpy(0.5, &a, &mut y);
    for k in 0..37 {
        assert!((y[k] - (b[k] + 0.5 * a[k])).abs() < 1e-6);
    }
}

/// Token-major output through column views, stored and accumulated, equals the `[row][token]` product.
#[test]
fn token_major_columns_match_row_major() {
    let (rows, cols, n_tok) = (21, 64, 5);
    let m = quantized(GgmlType::Q4_1, rows, cols, &pseudo_random(rows * cols, 9));
    let x = pseudo_random(n_tok * cols, 10);
    let mut want = vec![0f32; rows * n_tok];
    m.matmul_rows(&x, n_tok, 0, &mut want);
    for accumulate in [false, true] {
        let base = if accumulate { 1.5 } else { f32::NAN };
        let mut got = vec![base; n_tok * rows];
        let shared = SharedCols::new(&mut got, n_tok, rows, accumulate);
        for (row0, nr) in [(0, 8), (8, 13)] {
            // SAFETY: columns 0-7 and 8-20: each view is the only one alive.
            let mut view = unsafe { shared.columns(row0, nr) };
            m.matmul_into(&x, n_tok, row0, &mut view);
        }
        for r in 0..rows {
            for t in 0..n_tok {
                let want = want[r * n_tok + t] + if accumulate { 1.5 } else { 0.0 };
                assert_eq!(
                    got[t * rows + r],
                    want,
                    "row {r} token {t} accumulate {accumulate}"
                );
            }
        }
    }
}

/// `silu_mul` on this CPU's kernel against the scalar definition, over lengths with and without a tail and
/// gates from far negative (e^-g overflows) to far positive.
#[test]
fn silu_mul_matches_definition() {
    for n in [1, 15, 16, 17, 100, 1536] {
        let gate: Vec<f32> = pseudo_random(n, 21).iter().map(|g| g * 120.0).collect();
        let up = pseudo_random(n, 22);
        let mut got = vec![f32::NAN; n];
        silu_mul(&gate, &up, &mut got);
        for k in 0..n {
            let (g, u) = (f64::from(gate[k]), f64::from(up[k]));
            let want = g / (1.0 + (-g).exp()) * u;
            assert!(
                (f64::from(got[k]) - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "n {n} [{k}]: silu({g}) * {u} = {} vs {want}",
                got[k]
            );
        }
    }
}

/// The AVX-512 vector `exp` (attention weights, SiLU) against `f32::exp`.
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_exp_matches_expf() {
    use std::arch::x86_64::{_mm512_loadu_ps, _mm512_set1_ps, _mm512_storeu_ps};
    if !avx512::available() {
        eprintln!("skipped: this CPU lacks AVX-512 F/BW/VL");
        return;
    }
    let mut worst = 0f32;
    let mut x = -87.0f32;
    while x <= 88.0 {
        let xs: [f32; 16] = std::array::from_fn(|i| x - i as f32 * 1e-3);
        let mut got = [0f32; 16];
        // SAFETY: AVX-512 F was detected above; `xs` and `got` hold 16 f32.
        unsafe { _mm512_storeu_ps(got.as_mut_ptr(), avx512::exp(_mm512_loadu_ps(xs.as_ptr()))) };
        for (g, &xi) in got.iter().zip(&xs) {
            let want = xi.exp();
            if want > f32::MIN_POSITIVE {
                worst = worst.max(((g - want) / want).abs());
            }
        }
        x += 0.0137;
    }
    assert!(worst < 2.5e-7, "worst relative error {worst}");
    let at = |v: f32| {
        let mut got = [1f32; 16];
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(got.as_mut_ptr(), avx512::exp(_mm512_set1_ps(v))) };
        got[0]
    };
    assert_eq!(at(-200.0), 0.0, "far below the max: weight 0");
    assert_eq!(at(0.0), 1.0, "the max itself: weight 1");
    assert_eq!(at(200.0), f32::INFINITY);
}
