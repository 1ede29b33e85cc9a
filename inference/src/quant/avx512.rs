//! AVX-512 kernels (`avx512f`, `avx512bw`, `avx512vl`), chosen at run time over the AVX2 ones: the same per-block
//! sums as [`super::QMatrix::matmul_rows_scalar`], 16 f32 lanes wide, so a 32-element block is two vectors
//! (one nibble plane each for Q4_0/Q4_1), half the unpack and FMA instructions of AVX2.
//!
//! Activations stay f32 (see [`super`]). Bounds are checked once per call (asserts at the top of
//! [`matmul_rows`]); the inner loops then read through raw pointers. Every function requires the three target
//! features at run time ([`available`]).

use std::arch::x86_64::*;

use super::{BLOCK, Data, MatOut, QMatrix};

/// Tokens per tile: 8 tokens × 2 accumulators + the block and two activations fit the 32 vector registers, so a
/// batch of 8 decode tokens dequantizes each weight block once (AVX2's 16 registers hold [`super::TOKEN_TILE`]).
const TILE: usize = 8;

/// Whether this CPU runs these kernels.
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// Row pairs ahead of the one being computed whose weights are prefetched: one pair takes about as long as a
/// load from outside the core's caches (the weights of a step do not stay in L2 between steps).
const PREFETCH_PAIRS: usize = 2;

/// Asks for the storage of rows `r0 .. r0 + n` of `m` (clamped to the matrix) to be brought into L1: a hint, no
/// effect on results.
#[inline(always)]
fn prefetch_rows(m: &QMatrix, r0: usize, n: usize) {
    prefetch_rows_part(m, r0, n, 0, 1);
}

/// Part `part` of `parts` of [`prefetch_rows`]'s lines (each array of the storage split evenly): spread over a
/// loop's iterations, a group's worth of prefetches does not fill the core's miss buffers at once.
#[inline(always)]
pub(super) fn prefetch_rows_part(m: &QMatrix, r0: usize, n: usize, part: usize, parts: usize) {
    let end = (r0 + n).min(m.rows);
    if r0 >= end {
        return;
    }
    let nb = m.cols / BLOCK;
    let (b0, b1) = (r0 * nb, end * nb);
    match &m.data {
        Data::F32(v) => prefetch_lines(part_of(&v[r0 * m.cols..end * m.cols], part, parts)),
        Data::Q8_0 { d, qs } => {
            prefetch_lines(part_of(&qs[b0 * BLOCK..b1 * BLOCK], part, parts));
            prefetch_lines(part_of(&d[b0..b1], part, parts));
        }
        Data::Q4_0 { d, qs } => {
            prefetch_lines(part_of(&qs[b0 * 16..b1 * 16], part, parts));
            prefetch_lines(part_of(&d[b0..b1], part, parts));
        }
        Data::Q4_1 { d, m: mins, qs } => {
            prefetch_lines(part_of(&qs[b0 * 16..b1 * 16], part, parts));
            prefetch_lines(part_of(&d[b0..b1], part, parts));
            prefetch_lines(part_of(&mins[b0..b1], part, parts));
        }
    }
}

/// Part `part` of `parts` of `s` (split evenly).
#[inline(always)]
fn part_of<T>(s: &[T], part: usize, parts: usize) -> &[T] {
    &s[s.len() * part / parts..s.len() * (part + 1) / parts]
}

/// Prefetches every cache line of `s`.
#[inline(always)]
fn prefetch_lines<T>(s: &[T]) {
    let p = s.as_ptr().cast::<i8>();
    let mut off = 0;
    while off < std::mem::size_of_val(s) {
        // SAFETY: SSE is part of the x86_64 baseline; a prefetch reads nothing architecturally and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off)) };
        off += 64;
    }
}

/// The 32 elements of a 4-bit block at `p` (16 bytes: element j is the low nibble of byte j, element j + 16 the
/// high nibble) looked up in `table` (lane k: the value of nibble k), as two vectors. `vpermps` reads only the low
/// 4 bits of each index lane, so the zero-extended bytes index the low nibbles as they are and, shifted right by 4,
/// the high ones: one widening, one shift and two permutes per block, where a convert-and-scale took twice that.
///
/// # Safety
/// `p` must point at 16 readable bytes; AVX-512 F/BW/VL must be available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn lookup4(p: *const u8, table: __m512) -> [__m512; 2] {
    // SAFETY: the caller guarantees 16 readable bytes at `p`; unaligned load.
    let bytes = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(p.cast()) });
    [
        _mm512_permutexvar_ps(bytes, table),
        _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(bytes), table),
    ]
}

/// Lanes 0, 1, …, 15 as f32: a 4-bit block's table is `IOTA · d + offset`.
const IOTA: [f32; 16] = [
    0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
];

/// Runs the rows of one token tile of `NT` tokens, two rows per pass so each activation load serves both: `$deq(b)`
/// yields block `b` (global index) dequantized as two vectors; each (row, token) keeps one accumulator (2 rows × 8
/// tokens + 4 weight and 2 activation vectors fit the 32 registers). An odd last row runs alone.
macro_rules! tile_rows {
    ($nt:ident, $m:expr, $nb:expr, $row0:expr, $nrows:expr, $xp:expr, $out:expr, $t0:expr, |$b:ident| $deq:expr) => {{
        // The first pairs' weights, before the loop below asks for each pair's successors.
        prefetch_rows($m, $row0, 2 * PREFETCH_PAIRS);
        let mut i = 0;
        while i < $nrows {
            let pair = i + 1 < $nrows;
            let (ra, rb) = ($row0 + i, $row0 + i + usize::from(pair));
            prefetch_rows($m, ra + 2 * PREFETCH_PAIRS, 2);
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
                // SAFETY: `$xp` is the tile packed by `pack_tile`: block `j < nb` of token `t < NT` is the 32 f32
                // at `(j NT + t) 32`, inside its `NT × cols` elements; unaligned loads.
                let pj = unsafe { $xp.add(j * $nt * BLOCK) };
                for t in 0..$nt {
                    // SAFETY: as above.
                    let (x0, x1) = unsafe {
                        let p = pj.add(t * BLOCK);
                        (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
                    };
                    acc[0][t] = _mm512_fmadd_ps(wa[1], x1, _mm512_fmadd_ps(wa[0], x0, acc[0][t]));
                    acc[1][t] = _mm512_fmadd_ps(wb[1], x1, _mm512_fmadd_ps(wb[0], x0, acc[1][t]));
                }
            }
            for t in 0..$nt {
                $out.put(i, $t0 + t, _mm512_reduce_add_ps(acc[0][t]));
                if pair {
                    $out.put(i + 1, $t0 + t, _mm512_reduce_add_ps(acc[1][t]));
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
/// `row0 .. row0 + out.rows()` within the matrix (checked by [`matmul_rows`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn tile<const NT: usize>(m: &QMatrix, x: &[f32], t0: usize, row0: usize, out: &mut MatOut<'_>) {
    let c = m.cols;
    let nb = c / BLOCK;
    let nrows = out.rows();
    if let Data::F32(v) = &m.data {
        // SAFETY: this function's contract is `f32_rows`'s; `v` is the matrix's storage.
        return unsafe { f32_rows::<NT>(v, c, x, t0, row0, nrows, out) };
    }
    // Taken out of the thread-local for the call (the loops below stay free of closure captures) and put back.
    let mut packed = PACKED.with_borrow_mut(std::mem::take);
    let xp = pack_tile::<NT>(x, c, t0, &mut packed).as_ptr();
    match &m.data {
        Data::Q8_0 { d, qs } => {
            let qp = qs.as_ptr();
            tile_rows!(NT, m, nb, row0, nrows, xp, out, t0, |b| {
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
            // SAFETY: `IOTA` holds 16 f32; unaligned load.
            let iota = unsafe { _mm512_loadu_ps(IOTA.as_ptr()) };
            tile_rows!(NT, m, nb, row0, nrows, xp, out, t0, |b| {
                // Nibble k is worth (k - 8) d = k d - 8 d (the same FMA the scalar definition rounds).
                let table = _mm512_fmadd_ps(iota, _mm512_set1_ps(d[b]), _mm512_set1_ps(-8.0 * d[b]));
                // SAFETY: block `b` of a matrix whose rows were checked: 16 bytes at `16 b`.
                unsafe { lookup4(qp.add(b * 16), table) }
            })
        }
        Data::Q4_1 { d, m: mins, qs } => {
            let qp = qs.as_ptr();
            // SAFETY: `IOTA` holds 16 f32; unaligned load.
            let iota = unsafe { _mm512_loadu_ps(IOTA.as_ptr()) };
            tile_rows!(NT, m, nb, row0, nrows, xp, out, t0, |b| {
                // Nibble k is worth k d + m.
                let table = _mm512_fmadd_ps(iota, _mm512_set1_ps(d[b]), _mm512_set1_ps(mins[b]));
                // SAFETY: block `b` of a matrix whose rows were checked: 16 bytes at `16 b`.
                unsafe { lookup4(qp.add(b * 16), table) }
            })
        }
        Data::F32(_) => unreachable!("F32 matrices returned above"),
    }
    PACKED.with_borrow_mut(|p| *p = packed);
}

/// The F32 arm of [`tile`]: rows of plain floats against the tile's tokens read in place.
///
/// # Safety
/// As [`tile`]; `v` holds the matrix's `rows × c` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[expect(
    clippy::needless_range_loop,
    reason = "indexing by a const-bounded token keeps accumulators in registers"
)]
unsafe fn f32_rows<const NT: usize>(
    v: &[f32],
    c: usize,
    x: &[f32],
    t0: usize,
    row0: usize,
    nrows: usize,
    out: &mut MatOut<'_>,
) {
    let xp = x.as_ptr();
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
            out.put(i, t0 + t, s);
        }
    }
}

thread_local! {
    /// The current tile's activations, interleaved by [`pack_tile`] (reused: grown, never shrunk).
    static PACKED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Copies tokens `t0 .. t0 + NT` of `x` (`[n_tok][c]`) into `packed`, interleaved by block, and returns the
/// packed tile: block `j` of token `t` at `(j · NT + t) · 32`, the tile starting on a 64-byte boundary. The tile's
/// inner loop then reads every token's block from one pointer at constant offsets, each 64-byte load within one
/// cache line (from the activations in place, `NT` row pointers did not fit the registers and, the buffers being
/// 16-byte aligned, loads could straddle two lines).
fn pack_tile<'p, const NT: usize>(x: &[f32], c: usize, t0: usize, packed: &'p mut Vec<f32>) -> &'p [f32] {
    const LINE: usize = 64 / std::mem::size_of::<f32>();
    let len = NT * (c / BLOCK) * BLOCK;
    if packed.len() < len + LINE {
        packed.resize(len + LINE, 0.0);
    }
    let skip = packed.as_ptr().align_offset(64).min(LINE);
    let tile = &mut packed[skip..skip + len];
    for t in 0..NT {
        let row = &x[(t0 + t) * c..(t0 + t + 1) * c];
        for (j, blk) in row.chunks_exact(BLOCK).enumerate() {
            tile[(j * NT + t) * BLOCK..(j * NT + t + 1) * BLOCK].copy_from_slice(blk);
        }
    }
    tile
}

/// Asserts that `m`'s storage holds whole rows of whole blocks (`from_ggml` checked their lengths), so the
/// kernels' raw block reads stay inside it.
pub(super) fn assert_storage(m: &QMatrix) {
    let blocks = m.rows * m.cols / BLOCK;
    match &m.data {
        Data::F32(v) => assert_eq!(v.len(), m.rows * m.cols),
        Data::Q8_0 { d, qs } => assert!(d.len() == blocks && qs.len() == blocks * BLOCK),
        Data::Q4_0 { d, qs } => assert!(d.len() == blocks && qs.len() == blocks * 16),
        Data::Q4_1 { d, m: mins, qs } => {
            assert!(d.len() == blocks && mins.len() == blocks && qs.len() == blocks * 16)
        }
    }
}

/// See [`QMatrix::matmul_rows`]; same contract.
///
/// # Safety
/// AVX-512 F/BW/VL must be available ([`available`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn matmul_rows(m: &QMatrix, x: &[f32], n_tok: usize, row0: usize, out: &mut MatOut<'_>) {
    assert!(n_tok > 0 && x.len() == n_tok * m.cols && out.n_tok() == n_tok);
    assert!(row0 + out.rows() <= m.rows);
    assert_storage(m);
    let mut t0 = 0;
    while t0 < n_tok {
        // SAFETY: features available (caller), bounds asserted above, `t0 + NT <= n_tok` in each arm.
        unsafe {
            match n_tok - t0 {
                1 => tile::<1>(m, x, t0, row0, out),
                2 => tile::<2>(m, x, t0, row0, out),
                3 => tile::<3>(m, x, t0, row0, out),
                4 => tile::<4>(m, x, t0, row0, out),
                5 => tile::<5>(m, x, t0, row0, out),
                6 => tile::<6>(m, x, t0, row0, out),
                7 => tile::<7>(m, x, t0, row0, out),
                _ => tile::<TILE>(m, x, t0, row0, out),
            }
        }
        t0 += (n_tok - t0).min(TILE);
    }
}

/// Lane `j` of the result is the sum of the 16 lanes of `v[j]`: 16 dot products (attention's scores of a run)
/// or block sums reduced together in 46 instructions (pairs of vectors folded into one, halving the partial sums
/// each level), where reducing each alone takes about 8.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn sum16(v: &[__m512; 16]) -> __m512 {
    // Level 1: 128-bit chunks; w[i] = (v[2i]'s 8 partial sums, v[2i+1]'s 8).
    let mut w = [_mm512_setzero_ps(); 8];
    for (i, w) in w.iter_mut().enumerate() {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        *w = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b0100_0100>(a, b),
            _mm512_shuffle_f32x4::<0b1110_1110>(a, b),
        );
    }
    // Level 2: x[i] chunk c = 4 partial sums of v[4i + c].
    let mut x = [_mm512_setzero_ps(); 4];
    for (i, x) in x.iter_mut().enumerate() {
        let (a, b) = (w[2 * i], w[2 * i + 1]);
        *x = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b1000_1000>(a, b),
            _mm512_shuffle_f32x4::<0b1101_1101>(a, b),
        );
    }
    // Level 3: y[i] chunk c = 2 partial sums each of v[8i + c] (lanes 0, 2) and v[8i + 4 + c] (lanes 1, 3).
    let y = [
        _mm512_add_ps(_mm512_unpacklo_ps(x[0], x[1]), _mm512_unpackhi_ps(x[0], x[1])),
        _mm512_add_ps(_mm512_unpacklo_ps(x[2], x[3]), _mm512_unpackhi_ps(x[2], x[3])),
    ];
    // Level 4: chunk c = the sums of v[c], v[8 + c], v[4 + c], v[12 + c].
    let z = _mm512_add_ps(_mm512_unpacklo_ps(y[0], y[1]), _mm512_unpackhi_ps(y[0], y[1]));
    // Lane 4c + k holds v[(c, 8 + c, 4 + c, 12 + c)[k]]: put v[j] in lane j.
    let order = _mm512_set_epi32(15, 11, 7, 3, 13, 9, 5, 1, 14, 10, 6, 2, 12, 8, 4, 0);
    _mm512_permutexvar_ps(order, z)
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

/// `e^x` per lane, to within 2 ulp of `expf` over `[-87.3, 88.7]`: `x = n ln 2 + r` with `|r| <= ln 2 / 2`,
/// Cephes' `expf` polynomial for `e^r`, and `2^n` applied by `vscalefps`. Lanes below -87.3 give 0 (the smallest
/// normal's exponent: an attention weight that small is below f32 resolution against the max's 1), lanes above
/// 88.7 give infinity.
#[target_feature(enable = "avx512f")]
pub(crate) fn exp(x: __m512) -> __m512 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n · LN2_HI is exact (Cephes).
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5, // Cephes: 5.0000001201e-1, which is 0.5 in f32
    ];
    let tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-87.3));
    let x = _mm512_max_ps(x, _mm512_set1_ps(-87.3));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        x,
        _mm512_set1_ps(LOG2E),
    ));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(P[0]);
    for &c in &P[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    // e^r = 1 + r + r² p(r).
    let e = _mm512_fmadd_ps(_mm512_mul_ps(r, r), p, _mm512_add_ps(r, _mm512_set1_ps(1.0)));
    _mm512_maskz_mov_ps(!tiny, _mm512_scalef_ps(e, n))
}

/// See [`super::silu_mul`].
///
/// # Safety
/// AVX-512 F/BW/VL must be available ([`available`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = out.len();
    assert!(gate.len() == n && up.len() == n);
    let one = _mm512_set1_ps(1.0);
    let mut k = 0;
    while k < n {
        let mask: __mmask16 = if n - k >= 16 {
            0xffff
        } else {
            ((1u32 << (n - k)) - 1) as u16
        };
        // SAFETY: the mask enables lanes `k .. min(k + 16, n)`, within all three slices (masked lanes are neither
        // read nor written).
        unsafe {
            let g = _mm512_maskz_loadu_ps(mask, gate.as_ptr().add(k));
            let u = _mm512_maskz_loadu_ps(mask, up.as_ptr().add(k));
            let e = exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
            let s = _mm512_div_ps(g, _mm512_add_ps(one, e));
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(k), mask, _mm512_mul_ps(s, u));
        }
        k += 16;
    }
}
