//! Tensor types (F32, F16, Q8_0, Q4_0, Q4_1 in ggml's block layouts), dequantization, and the hot kernels:
//! quantized weight rows × f32 activations with f32 accumulation.
//!
//! Weights stay quantized in memory (F16 is widened to F32 at load: no model of interest ships F16 matrices
//! big enough to matter). At load the ggml blocks are split into structure-of-arrays form (scales widened to
//! f32, quants contiguous) so the kernels do no f16 conversion. Kernels dequantize each 32-element block in
//! registers and FMA it with **f32** activations: activations are never quantized (8-bit activations change
//! the default model's answer: docs/architecture.md, Decisions). AVX-512 (F/BW/VL, [`avx512`]) or AVX2+FMA kernels
//! are chosen at run time (`is_x86_feature_detected!`, once: [`simd_level`]; `LLMSERVE_SIMD=avx512|avx2|scalar`
//! caps the choice for comparisons), with a scalar fallback computing the same sums. Batched variants load a
//! weight block once and use it for several tokens (decode batches, prefill). Where the CPU has AMX-BF16 (and the
//! kernel permits it), products over two or more tokens whose activations were prepared once for the group
//! ([`Prepared`]) run on the tile unit (`amx`): integer quants exact in bf16, activations as two bf16 halves,
//! block scales in f32, so sums stay within about 1e-5 of the f32 kernels'.
//!
//! Never allocates in the kernels; never spawns threads (the backend splits rows across its pool).

use std::sync::atomic::{AtomicU8, Ordering};

use crate::gguf::GgmlType;

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
mod out;
mod quantize;

pub use out::{AlignedVec, MatOut, SharedCols};
pub use quantize::quantize_ggml;

/// The kernel family in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// Portable scalar code.
    Scalar = 1,
    /// AVX2 + FMA, 8 lanes.
    Avx2 = 2,
    /// AVX-512 F/BW/VL, 16 lanes.
    Avx512 = 3,
    /// AVX-512, and AMX-BF16 tiles for products over [`AMX_MIN_TOKENS`] or more prepared tokens ([`Prepared`]).
    Amx = 4,
}

/// The detected level (0: not yet detected).
static SIMD_LEVEL: AtomicU8 = AtomicU8::new(0);

/// Environment variable capping the kernel family (`avx512`, `avx2` or `scalar`), for side-by-side comparisons.
pub const SIMD_ENV: &str = "LLMSERVE_SIMD";

/// The best kernel family this CPU runs (detected once), capped by [`SIMD_ENV`].
pub fn simd_level() -> SimdLevel {
    match SIMD_LEVEL.load(Ordering::Relaxed) {
        1 => SimdLevel::Scalar,
        2 => SimdLevel::Avx2,
        3 => SimdLevel::Avx512,
        4 => SimdLevel::Amx,
        _ => {
            let l = detect_simd();
            SIMD_LEVEL.store(l as u8, Ordering::Relaxed);
            l
        }
    }
}

fn detect_simd() -> SimdLevel {
    let cap = simd_cap();
    let mut best = SimdLevel::Scalar;
    #[cfg(target_arch = "x86_64")]
    {
        if simd_available() {
            best = SimdLevel::Avx2;
        }
        if best == SimdLevel::Avx2 && avx512::available() {
            best = SimdLevel::Avx512;
        }
        // Only asked (it requests the kernel's permission for tile state) when the cap allows it.
        if best == SimdLevel::Avx512 && cap == SimdLevel::Amx && amx::available() {
            best = SimdLevel::Amx;
        }
    }
    best.min(cap)
}

/// The cap [`SIMD_ENV`] sets (no cap when unset or unknown).
fn simd_cap() -> SimdLevel {
    match std::env::var(SIMD_ENV).as_deref() {
        Ok("scalar") => SimdLevel::Scalar,
        Ok("avx2") => SimdLevel::Avx2,
        Ok("avx512") => SimdLevel::Avx512,
        _ => SimdLevel::Amx,
    }
}

/// Elements per quantization block (ggml-common.h: QK4_0 = QK4_1 = QK8_0 = 32).
pub const BLOCK: usize = 32;

/// Tokens sharing one dequantized weight block in the batched kernels (4 accumulators + 4 weight registers +
/// activation loads fit the 16 AVX2 registers).
pub const TOKEN_TILE: usize = 4;

/// Errors building a quantized matrix.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// The tensor type is not supported by this engine.
    #[error("unsupported tensor type {0:?} (supported: F32, F16, Q8_0, Q4_0, Q4_1)")]
    Unsupported(GgmlType),
    /// The row length is not a multiple of the block size, or the data has the wrong length.
    #[error("bad tensor shape: {0}")]
    Shape(String),
}

/// Converts an IEEE half (as bits) to f32.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let mant = u32::from(h & 0x3ff);
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: value = m * 2^-24.
            let v = m as f32 * f32::from_bits(0x3380_0000); // 2^-24
            return if sign != 0 { -v } else { v };
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// Converts an f32 to IEEE half bits (round to nearest even); used to write test models.
pub fn f32_to_f16(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}

/// Storage of a matrix's weights.
#[derive(Debug, Clone)]
enum Data {
    /// Plain f32 (also F16 files, widened).
    F32(Vec<f32>),
    /// Q8_0: per block an f32 scale and 32 signed quants; value = q * d.
    Q8_0 { d: Vec<f32>, qs: Vec<i8> },
    /// Q4_0: per block a scale and 16 bytes of nibbles; value = (q - 8) * d.
    Q4_0 { d: Vec<f32>, qs: Vec<u8> },
    /// Q4_1: per block scale and min and 16 bytes of nibbles; value = q * d + m.
    Q4_1 { d: Vec<f32>, m: Vec<f32>, qs: Vec<u8> },
}

/// Borrowed view of a matrix's repacked storage (structure of arrays), for backends that copy it elsewhere
/// (the CUDA backend uploads these arrays as they are).
#[derive(Debug, Clone, Copy)]
pub enum QData<'a> {
    /// Plain f32, row-major (F32 and widened F16 tensors).
    F32(&'a [f32]),
    /// Q8_0: one scale per 32-element block, 32 signed quants per block; value = q * d.
    Q8_0 {
        /// Scales, one per block.
        d: &'a [f32],
        /// Quants, 32 per block.
        qs: &'a [i8],
    },
    /// Q4_0: one scale per block, 16 bytes of nibbles per block (byte j: element j low, j + 16 high);
    /// value = (q - 8) * d.
    Q4_0 {
        /// Scales, one per block.
        d: &'a [f32],
        /// Nibbles, 16 bytes per block.
        qs: &'a [u8],
    },
    /// Q4_1: scale and min per block, nibbles as Q4_0; value = q * d + m.
    Q4_1 {
        /// Scales, one per block.
        d: &'a [f32],
        /// Minimums, one per block.
        m: &'a [f32],
        /// Nibbles, 16 bytes per block.
        qs: &'a [u8],
    },
}

/// A 2-D weight matrix of `rows` rows of `cols` elements, kept in its (repacked) quantized form.
#[derive(Clone)]
pub struct QMatrix {
    rows: usize,
    cols: usize,
    ty: GgmlType,
    data: Data,
}

impl std::fmt::Debug for QMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QMatrix({:?}, {}x{})", self.ty, self.rows, self.cols)
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

impl QMatrix {
    /// Builds a matrix from ggml-layout bytes (`rows` rows of `cols` elements, each row contiguous).
    pub fn from_ggml(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Self, QuantError> {
        let (per, bsize) = ty.block_layout().ok_or(QuantError::Unsupported(ty))?;
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| QuantError::Shape(format!("{rows}x{cols} overflows")))?;
        if !cols.is_multiple_of(per) || (n / per).checked_mul(bsize) != Some(bytes.len()) {
            return Err(QuantError::Shape(format!(
                "{ty:?} {rows}x{cols} with {} bytes (block of {per} elements = {bsize} bytes)",
                bytes.len()
            )));
        }
        let nb = n / BLOCK;
        let data = match ty {
            GgmlType::F32 => Data::F32(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            GgmlType::F16 => Data::F32(
                bytes
                    .chunks_exact(2)
                    .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
            ),
            GgmlType::Q8_0 => {
                let mut d = Vec::with_capacity(nb);
                let mut qs = Vec::with_capacity(n);
                for b in bytes.chunks_exact(bsize) {
                    d.push(f16_at(b, 0));
                    qs.extend(b[2..34].iter().map(|&q| q as i8));
                }
                Data::Q8_0 { d, qs }
            }
            GgmlType::Q4_0 => {
                let mut d = Vec::with_capacity(nb);
                let mut qs = Vec::with_capacity(n / 2);
                for b in bytes.chunks_exact(bsize) {
                    d.push(f16_at(b, 0));
                    qs.extend_from_slice(&b[2..18]);
                }
                Data::Q4_0 { d, qs }
            }
            GgmlType::Q4_1 => {
                let mut d = Vec::with_capacity(nb);
                let mut m = Vec::with_capacity(nb);
                let mut qs = Vec::with_capacity(n / 2);
                for b in bytes.chunks_exact(bsize) {
                    d.push(f16_at(b, 0));
                    m.push(f16_at(b, 2));
                    qs.extend_from_slice(&b[4..20]);
                }
                Data::Q4_1 { d, m, qs }
            }
            GgmlType::Other(_) => return Err(QuantError::Unsupported(ty)),
        };
        if !matches!(data, Data::F32(_)) && !cols.is_multiple_of(BLOCK) {
            return Err(QuantError::Shape(format!(
                "{cols} columns is not a multiple of {BLOCK}"
            )));
        }
        Ok(QMatrix { rows, cols, ty, data })
    }

    /// Number of rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (inputs).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The type of the file's tensor.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// The repacked storage, borrowed.
    pub fn data(&self) -> QData<'_> {
        match &self.data {
            Data::F32(v) => QData::F32(v),
            Data::Q8_0 { d, qs } => QData::Q8_0 { d, qs },
            Data::Q4_0 { d, qs } => QData::Q4_0 { d, qs },
            Data::Q4_1 { d, m, qs } => QData::Q4_1 { d, m, qs },
        }
    }

    /// Bytes of weight storage in memory.
    pub fn storage_bytes(&self) -> usize {
        match &self.data {
            Data::F32(v) => v.len() * 4,
            Data::Q8_0 { d, qs } => d.len() * 4 + qs.len(),
            Data::Q4_0 { d, qs } => d.len() * 4 + qs.len(),
            Data::Q4_1 { d, m: _, qs } => d.len() * 8 + qs.len(),
        }
    }

    /// Dequantizes row `r` into `out` (`cols` elements).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let c = self.cols;
        match &self.data {
            Data::F32(v) => out[..c].copy_from_slice(&v[r * c..(r + 1) * c]),
            _ => {
                for (j, chunk) in out[..c].chunks_exact_mut(BLOCK).enumerate() {
                    let mut blk = [0f32; BLOCK];
                    self.block(r * c / BLOCK + j, &mut blk);
                    chunk.copy_from_slice(&blk);
                }
            }
        }
    }

    /// The whole matrix as f32 (row-major), for reference computations.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(r, row);
        }
        out
    }

    /// Dequantizes block `b` (global block index) of a quantized matrix.
    fn block(&self, b: usize, out: &mut [f32; BLOCK]) {
        match &self.data {
            Data::F32(v) => out.copy_from_slice(&v[b * BLOCK..(b + 1) * BLOCK]),
            Data::Q8_0 { d, qs } => {
                for (o, &q) in out.iter_mut().zip(&qs[b * BLOCK..(b + 1) * BLOCK]) {
                    *o = f32::from(q) * d[b];
                }
            }
            Data::Q4_0 { d, qs } => {
                // ggml layout: byte j holds element j (low nibble) and element j + 16 (high nibble).
                for (j, &q) in qs[b * 16..(b + 1) * 16].iter().enumerate() {
                    out[j] = (f32::from(q & 0x0f) - 8.0) * d[b];
                    out[j + 16] = (f32::from(q >> 4) - 8.0) * d[b];
                }
            }
            Data::Q4_1 { d, m, qs } => {
                for (j, &q) in qs[b * 16..(b + 1) * 16].iter().enumerate() {
                    out[j] = f32::from(q & 0x0f) * d[b] + m[b];
                    out[j + 16] = f32::from(q >> 4) * d[b] + m[b];
                }
            }
        }
    }

    /// Computes rows `row0 .. row0 + out.len() / n_tok` of `W · x_t` for `n_tok` tokens.
    ///
    /// `x` holds the tokens' activations, `[n_tok][cols]`; `out` is written `[row][token]`.
    pub fn matmul_rows(&self, x: &[f32], n_tok: usize, row0: usize, out: &mut [f32]) {
        self.matmul_into(x, n_tok, row0, &mut MatOut::row_major(out, n_tok));
    }

    /// Computes rows `row0 .. row0 + out.rows()` of `W · x_t` for `out.n_tok()` tokens into `out` (any layout,
    /// stored or accumulated: [`MatOut`]).
    ///
    /// `x` holds the tokens' activations, `[n_tok][cols]`.
    pub fn matmul_into(&self, x: &[f32], n_tok: usize, row0: usize, out: &mut MatOut<'_>) {
        assert!(n_tok > 0 && x.len() == n_tok * self.cols && out.n_tok() == n_tok);
        assert!(row0 + out.rows() <= self.rows);
        #[cfg(target_arch = "x86_64")]
        match simd_level() {
            // SAFETY: the CPU supports AVX-512 F/BW/VL (detected by `simd_level`); the kernel asserts bounds.
            SimdLevel::Avx512 | SimdLevel::Amx => {
                return unsafe { avx512::matmul_rows(self, x, n_tok, row0, out) };
            }
            // SAFETY: the CPU supports AVX2 and FMA (detected by `simd_level`); the slices' bounds were checked
            // by the asserts above and are re-checked by the kernel's indexing.
            SimdLevel::Avx2 => return unsafe { avx2::matmul_rows(self, x, n_tok, row0, out) },
            SimdLevel::Scalar => {}
        }
        self.matmul_scalar(x, n_tok, row0, out);
    }

    /// [`Self::matmul_into`] over activations prepared once for several products ([`Prepared::prepare`]): with
    /// AMX, the tile kernels.
    pub fn matmul_prepared(&self, a: &Acts<'_>, row0: usize, out: &mut MatOut<'_>) {
        #[cfg(target_arch = "x86_64")]
        if let Some(tiles) = a.tiles {
            // SAFETY: tiles exist only where `simd_level` selected AMX (`amx::available`); the kernel asserts the
            // shapes and bounds.
            return unsafe { amx::matmul_rows(self, a.x, tiles, row0, out) };
        }
        self.matmul_into(a.x, a.n_tok, row0, out);
    }

    /// Portable kernel, `[row][token]` output: the same per-block sums as the SIMD kernels, in scalar code.
    pub fn matmul_rows_scalar(&self, x: &[f32], n_tok: usize, row0: usize, out: &mut [f32]) {
        self.matmul_scalar(x, n_tok, row0, &mut MatOut::row_major(out, n_tok));
    }

    /// Portable kernel: per row and token, the sum over blocks (in order) of each block's dot product.
    fn matmul_scalar(&self, x: &[f32], n_tok: usize, row0: usize, out: &mut MatOut<'_>) {
        let c = self.cols;
        let mut blk = [0f32; BLOCK];
        for i in 0..out.rows() {
            let r = row0 + i;
            for t in 0..n_tok {
                let xt = &x[t * c..(t + 1) * c];
                let s = if let Data::F32(v) = &self.data {
                    v[r * c..(r + 1) * c].iter().zip(xt).map(|(a, b)| a * b).sum()
                } else {
                    let mut s = 0f32;
                    for (j, xs) in xt.chunks_exact(BLOCK).enumerate() {
                        self.block(r * c / BLOCK + j, &mut blk);
                        s += blk.iter().zip(xs).map(|(a, b)| a * b).sum::<f32>();
                    }
                    s
                };
                out.put(i, t, s);
            }
        }
    }
}

/// Fewest tokens for which [`Prepared::prepare`] builds AMX tiles: one token's product reads each weight once
/// and is bound by memory, not arithmetic.
pub const AMX_MIN_TOKENS: usize = 2;

/// Reusable storage for activations prepared once for several products over the same tokens (Q, K and V; gate
/// and up): on CPUs where [`simd_level`] is [`SimdLevel::Amx`], their tile layout.
#[derive(Default)]
pub struct Prepared {
    #[cfg(target_arch = "x86_64")]
    tiles: amx::Tiles,
}

/// Activations ready for [`QMatrix::matmul_prepared`]: the f32 rows and, where AMX runs, their tiles.
#[derive(Clone, Copy)]
pub struct Acts<'a> {
    x: &'a [f32],
    n_tok: usize,
    #[cfg(target_arch = "x86_64")]
    tiles: Option<&'a amx::Tiles>,
}

impl<'a> Acts<'a> {
    /// Tokens.
    pub fn n_tok(&self) -> usize {
        self.n_tok
    }
}

impl Prepared {
    /// Prepares `x` (`[n_tok][cols]`) for products with matrices of `cols` columns (runs on the calling thread).
    ///
    /// # Panics
    /// If `x.len() != n_tok * cols`.
    pub fn prepare<'a>(&'a mut self, x: &'a [f32], n_tok: usize, cols: usize) -> Acts<'a> {
        assert_eq!(x.len(), n_tok * cols, "activations are not [n_tok][cols]");
        #[cfg(target_arch = "x86_64")]
        {
            let tiles =
                if simd_level() == SimdLevel::Amx && n_tok >= AMX_MIN_TOKENS && cols.is_multiple_of(BLOCK) {
                    // SAFETY: AMX is available (`simd_level` selected it); the shape was checked above.
                    unsafe { self.tiles.prepare(x, n_tok, cols) };
                    Some(&self.tiles)
                } else {
                    None
                };
            Acts { x, n_tok, tiles }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Acts { x, n_tok }
    }
}

/// Whether the AVX2+FMA kernels run on this CPU.
pub fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Dot product of two f32 slices (AVX-512 or AVX2+FMA when available); used by attention.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    match simd_level() {
        // SAFETY: AVX-512 F/BW/VL are available (detected by `simd_level`).
        SimdLevel::Avx512 | SimdLevel::Amx => return unsafe { avx512::dot(a, b) },
        // SAFETY: AVX2 and FMA are available (detected by `simd_level`).
        SimdLevel::Avx2 => return unsafe { avx2::dot(a, b) },
        SimdLevel::Scalar => {}
    }
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `y += a * x` (AVX-512 or AVX2+FMA when available); used by attention.
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    match simd_level() {
        // SAFETY: AVX-512 F/BW/VL are available (detected by `simd_level`).
        SimdLevel::Avx512 | SimdLevel::Amx => return unsafe { avx512::axpy(a, x, y) },
        // SAFETY: AVX2 and FMA are available (detected by `simd_level`).
        SimdLevel::Avx2 => return unsafe { avx2::axpy(a, x, y) },
        SimdLevel::Scalar => {}
    }
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// `out = SiLU(gate) · up` element-wise (`SiLU(g) = g / (1 + e^-g)`), the gated feed-forward's activation.
///
/// # Panics
/// If the three slices differ in length.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == out.len() && up.len() == out.len(),
        "SiLU operands differ in length"
    );
    #[cfg(target_arch = "x86_64")]
    if simd_level() >= SimdLevel::Avx512 {
        // SAFETY: AVX-512 F/BW/VL are available (detected by `simd_level`).
        return unsafe { avx512::silu_mul(gate, up, out) };
    }
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(test)]
pub(crate) mod tests;
