//! AMX kernels (Advanced Matrix Extensions: `amx-tile`, `amx-bf16`, with AVX-512 F/BW/BF16/VBMI) for products over
//! several tokens: one `tdpbf16ps` multiplies a 16-row × 32-element weight block by the 32 × N block of the
//! tokens' activations (N ≤ 16), where the AVX-512 kernel spends two FMAs per row and token.
//!
//! **Sums as f32, not bf16.** The weights enter the tiles as their integer quants (Q8_0's −128…127, Q4's 0…15 or
//! −8…7 are exact in bf16) and each block's scale (and Q4_1's offset) is applied in f32 after the block's tile
//! product, as the scalar definition applies it per element. The activations enter as two bf16 halves,
//! `hi = bf16(x)` and `lo = bf16(x − hi)`, each multiplied by the same weight tile: together they carry 16 of
//! f32's 24 mantissa bits (relative error ≤ 2⁻¹⁷), and each product of two bf16 is exact in the tile's f32
//! accumulator. Results agree with the f32 kernels to about 1e-5 relative (tested against the scalar definition),
//! not bit for bit; plain bf16 would be 2⁻⁹.
//!
//! **Layout.** The tokens' activations are converted once per product group by [`Tiles::prepare`] (the caller's
//! thread, before the pool's tasks start; a 16 × 16 register transpose per block) into one record per (token tile
//! of ≤ 16, block): `hi` and `lo` as B tiles (16 rows of element pairs, tokens side by side: the tile unit's
//! "VNNI" order) and the block's sum per token (Q4_1's offset term). A tile of ≤ 8 tokens packs both halves into
//! one B tile (columns `t` and `nt + t`, added when read), so a decode step of 8 runs one tile product per block,
//! not two. Tasks share the records read-only. A task walks its rows in groups of 16, two blocks per step: it
//! writes the group's quants as two A tiles (16 rows × 32 bf16 each, by byte permute and table lookup), runs the
//! tile products into two C tiles, stores them, and adds the previous step's stored products (scaled per row and
//! block) into 16 accumulators held in registers while the tile unit works. The next group's weights are
//! prefetched a share per step.
//!
//! **Cost model** (measured on this machine, `docs/lab/engine-cpu.md`): a tile load takes about 10 cycles, a tile
//! store 17, a `tdpbf16ps` 18.5, and a tile load of data just written by vector stores waits for them to leave
//! the store buffer (about 56 cycles more). The exact per-block scaling needs a C tile stored per block, so the
//! kernel is bound by tile traffic and the vector work around it, not by the tile unit's multiplies: 1.3–1.4×
//! the AVX-512 kernel for 8 tokens, about 2× for 16 and more.
//!
//! The tile unit needs the kernel's permission (Linux ≥ 5.16, `arch_prctl(ARCH_REQ_XCOMP_PERM)`), asked once by
//! [`available`]; each call configures the tiles of its thread and releases them on return. Tile instructions are
//! written as inline assembly: their intrinsics are not stable Rust.

use std::arch::asm;
use std::arch::x86_64::*;

use super::{BLOCK, Data, MatOut, QMatrix, avx512};
use crate::quant::AlignedVec;

/// Tokens per tile: the B and C tiles' 16 columns of f32 (64 bytes).
const TOKENS: usize = 16;

/// Weight rows per A tile (and accumulators per row group).
const ROWS: usize = 16;

/// `u32` words of one (token tile, block) record: the `hi` and `lo` B tiles (16 pair-rows × 16 tokens each) and
/// the block's per-token sums (16 f32). A multiple of 16, so every record and tile starts on a 64-byte boundary.
const RECORD: usize = 2 * 16 * TOKENS + TOKENS;

/// Offset of the `lo` tile in a record.
const LO: usize = 16 * TOKENS;

/// Offset of the per-token sums in a record.
const SUMS: usize = 2 * 16 * TOKENS;

/// Whether this CPU and kernel run these kernels (AVX-512 F/BW/BF16, AMX-TILE, AMX-BF16, and the kernel's
/// permission to use tile data, requested on the first call).
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| cpu_has_amx() && request_tile_permission())
}

fn cpu_has_amx() -> bool {
    if !(avx512::available()
        && std::arch::is_x86_feature_detected!("avx512bf16")
        && std::arch::is_x86_feature_detected!("avx512vbmi"))
    {
        return false;
    }
    // CPUID leaf 7, subleaf 0, EDX: bit 22 AMX-BF16, bit 24 AMX-TILE (Intel SDM vol. 2A, CPUID).
    let edx = __cpuid_count(7, 0).edx;
    edx & (1 << 22) != 0 && edx & (1 << 24) != 0
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: without it the first tile instruction kills the
/// process with SIGILL. Fails on kernels without dynamic xstate (before 5.16) and where the OS disabled AMX.
fn request_tile_permission() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: a raw Linux x86_64 system call (number in rax, arguments in rdi and rsi; the kernel clobbers rcx and
    // r11); arch_prctl with this code only changes the process's permitted xstate features and touches no memory.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

/// The tokens' activations in tile layout, built by [`Tiles::prepare`] and read by [`matmul_rows`]; reusable
/// (the buffer grows, never shrinks).
#[derive(Default)]
pub struct Tiles {
    buf: Option<AlignedVec>,
    n_tok: usize,
    cols: usize,
}

impl Tiles {
    /// Converts `x` (`[n_tok][cols]`, `cols` a multiple of 32) into records: token tile `tt`, block `j` at
    /// `(tt · cols / 32 + j) · RECORD` words.
    ///
    /// # Panics
    /// If `x.len() != n_tok * cols` or `cols` is not a multiple of 32.
    ///
    /// # Safety
    /// [`available`] must be true.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub unsafe fn prepare(&mut self, x: &[f32], n_tok: usize, cols: usize) {
        assert!(
            x.len() == n_tok * cols && cols.is_multiple_of(BLOCK),
            "activations are not [n_tok][32 k]"
        );
        let nb = cols / BLOCK;
        let len = n_tok.div_ceil(TOKENS) * nb * RECORD;
        if self.buf.as_ref().is_none_or(|b| b.len() < len) {
            self.buf = Some(AlignedVec::zeroed(len));
        }
        let Some(buf) = self.buf.as_mut() else {
            unreachable!("allocated above")
        };
        self.n_tok = n_tok;
        self.cols = cols;
        let base = buf.as_mut_ptr().cast::<i32>();
        for tt in 0..n_tok.div_ceil(TOKENS) {
            let (t0, nt) = (tt * TOKENS, (n_tok - tt * TOKENS).min(TOKENS));
            let (packed, width) = columns(nt);
            let row_mask: __mmask16 = ((1u32 << width) - 1) as u16;
            for j in 0..nb {
                // Per token, its pairs as one vector (`hi` and `lo`; packed, `lo` after the tile's `hi`s), and its
                // block's elements folded to 16 partial sums; absent tokens zero.
                let (mut hv, mut lv, mut xs) = (
                    [_mm512_setzero_si512(); 16],
                    [_mm512_setzero_si512(); 16],
                    [_mm512_setzero_ps(); 16],
                );
                for n in 0..nt {
                    let blk = &x[(t0 + n) * cols + j * BLOCK..(t0 + n) * cols + (j + 1) * BLOCK];
                    // SAFETY: `blk` holds 32 f32; unaligned loads.
                    let (x0, x1) = unsafe {
                        (
                            _mm512_loadu_ps(blk.as_ptr()),
                            _mm512_loadu_ps(blk.as_ptr().add(16)),
                        )
                    };
                    let hi = bf16_pairs(x0, x1);
                    let lo = bf16_pairs(
                        _mm512_sub_ps(x0, widen_low(hi)),
                        _mm512_sub_ps(x1, widen_high(hi)),
                    );
                    hv[n] = hi;
                    if packed {
                        hv[nt + n] = lo;
                    } else {
                        lv[n] = lo;
                    }
                    xs[n] = _mm512_add_ps(x0, x1);
                }
                // Transposed, vector `k` is pair-row `k`: the tokens' pair `k` side by side.
                let rec = (tt * nb + j) * RECORD;
                let tiles: &[(usize, [__m512i; 16])] = if packed { &[(0, hv)] } else { &[(0, hv), (LO, lv)] };
                for &(at, v) in tiles {
                    for (k, row) in transpose16(v).iter().enumerate() {
                        // SAFETY: record `rec` lies within `buf` (`len` words, `tt < ⌈n_tok/16⌉`, `j < nb`);
                        // pair-row `k < 16` of `width ≤ 16` words at `at + k width` stays inside its tile.
                        unsafe { _mm512_mask_storeu_epi32(base.add(rec + at + k * width), row_mask, *row) };
                    }
                }
                // SAFETY: as above; the sums are 16 f32 at `SUMS` (64-byte aligned). Lanes past the tile's tokens
                // are zero: the kernel adds them to its accumulators' spare lanes.
                unsafe { _mm512_store_ps(base.add(rec + SUMS).cast(), avx512::sum16(&xs)) };
            }
        }
    }
}

/// The transpose of a 16 × 16 matrix of 32-bit words (row `i` = `v[i]`): 64 in-register shuffles.
#[target_feature(enable = "avx512f")]
fn transpose16(v: [__m512i; 16]) -> [__m512i; 16] {
    // Within each 128-bit lane: words, then word pairs, of neighbouring rows interleaved. `u[4 i + c]`'s lane
    // `l` holds column `4 l + c` of rows `4 i .. 4 i + 4`.
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    // Across lanes: row `4 l + c` of the result is lane `l` of `u[c]`, `u[4 + c]`, `u[8 + c]`, `u[12 + c]`.
    let mut out = [_mm512_setzero_si512(); 16];
    for c in 0..4 {
        let s0 = _mm512_shuffle_i32x4::<0b1000_1000>(u[c], u[4 + c]);
        let s1 = _mm512_shuffle_i32x4::<0b1101_1101>(u[c], u[4 + c]);
        let s2 = _mm512_shuffle_i32x4::<0b1000_1000>(u[8 + c], u[12 + c]);
        let s3 = _mm512_shuffle_i32x4::<0b1101_1101>(u[8 + c], u[12 + c]);
        out[c] = _mm512_shuffle_i32x4::<0b1000_1000>(s0, s2);
        out[8 + c] = _mm512_shuffle_i32x4::<0b1101_1101>(s0, s2);
        out[4 + c] = _mm512_shuffle_i32x4::<0b1000_1000>(s1, s3);
        out[12 + c] = _mm512_shuffle_i32x4::<0b1101_1101>(s1, s3);
    }
    out
}

/// Whether a token tile of `nt` tokens packs its `hi` and `lo` halves side by side in one B tile (`nt ≤ 8`:
/// one tile product per block instead of two, the C tile's columns `t` and `nt + t` summed when read), and the
/// B and C tiles' columns.
fn columns(nt: usize) -> (bool, usize) {
    if 2 * nt <= TOKENS {
        (true, 2 * nt)
    } else {
        (false, nt)
    }
}

/// Block elements 0–15 (`x0`) and 16–31 (`x1`) as 32 bf16 in order (round to nearest even): word `i` is element
/// `i`, so dword `k` is the pair `(2k, 2k + 1)` the tile product multiplies together.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn bf16_pairs(x0: __m512, x1: __m512) -> __m512i {
    // `vcvtne2ps2bf16 dst, a, b` puts `b`'s conversions in the low half.
    // SAFETY: `__m512bh` and `__m512i` are both 64 plain bytes.
    unsafe { std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(x1, x0)) }
}

/// The low 16 bf16 of `v` widened to f32 (exact: bf16 is f32's upper half).
#[target_feature(enable = "avx512f,avx512bw")]
fn widen_low(v: __m512i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
        _mm512_castsi512_si256(v),
    )))
}

/// The high 16 bf16 of `v` widened to f32.
#[target_feature(enable = "avx512f,avx512bw")]
fn widen_high(v: __m512i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
        _mm512_extracti64x4_epi64::<1>(v),
    )))
}

/// bf16 bits of `(i mod 16) + offset` for `i` in 0..32: a 4-bit quant's value, looked up by `vpermw` from the
/// low 5 bits of an index word (hence 16 entries twice). Exact: small integers.
const fn nibble_table(offset: f32) -> [u16; 32] {
    let mut t = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = (((i % 16) as f32 + offset).to_bits() >> 16) as u16;
        i += 1;
    }
    t
}

const Q4_1_TABLE: [u16; 32] = nibble_table(0.0);
const Q4_0_TABLE: [u16; 32] = nibble_table(-8.0);

/// The 32 quants of a 4-bit block at `p` (element `j` the low nibble of byte `j`, `j + 16` its high nibble) as
/// bf16 in element order: bytes widened to words, the high nibbles' copy shifted down, one `vpermw` (which reads
/// the low 5 bits: the table repeats every 16).
///
/// # Safety
/// `p` must point at 16 readable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
unsafe fn quants4(p: *const u8, table: __m512i) -> __m512i {
    // Byte `2 i` (the low byte of word `i`) takes byte `i mod 16` of the block.
    const SPREAD: [u8; 64] = {
        let mut s = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            s[i] = ((i / 2) % 16) as u8;
            i += 1;
        }
        s
    };
    // SAFETY: the caller guarantees 16 readable bytes; `SPREAD` is 64 bytes; unaligned loads.
    let (bytes, spread) = unsafe {
        (
            _mm512_broadcast_i32x4(_mm_loadu_si128(p.cast())),
            _mm512_loadu_si512(SPREAD.as_ptr().cast()),
        )
    };
    let words = _mm512_permutexvar_epi8(spread, bytes);
    let idx = _mm512_mask_srli_epi16::<4>(words, 0xFFFF_0000, words);
    _mm512_permutexvar_epi16(idx, table)
}

/// The 32 quants of a Q8_0 block at `p` as bf16 in element order (exact: |q| ≤ 128).
///
/// # Safety
/// `p` must point at 32 readable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn quants8(p: *const i8) -> __m512i {
    // SAFETY: the caller guarantees 32 readable bytes; unaligned loads.
    let (q0, q1) = unsafe {
        (
            _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())),
            _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(16).cast())),
        )
    };
    bf16_pairs(_mm512_cvtepi32_ps(q0), _mm512_cvtepi32_ps(q1))
}

/// The tile configuration (`ldtilecfg`'s 64-byte format, palette 1) for token tiles of `nt` tokens: tiles 0, 1
/// C (16 rows × `nt` f32), 2, 3 A (16 rows × 32 bf16), 4–7 B (`hi`, `lo` of two blocks: 16 pair-rows × `nt`).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn new(nt: usize) -> Self {
        let mut c = [0u8; 64];
        c[0] = 1;
        let colsb = (columns(nt).1 * 4) as u16;
        for (t, bytes) in [colsb, colsb, 64, 64, colsb, colsb, colsb, colsb]
            .into_iter()
            .enumerate()
        {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&bytes.to_le_bytes());
            c[48 + t] = 16;
        }
        TileConfig(c)
    }
}

/// 64-byte aligned scratch for two A tiles (16 rows × 32 bf16 each) or two C tiles (16 rows × 16 f32 each).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct TilePair([u32; 512]);

/// Loads B tiles: tile `$t` from each `$p` (16 rows of `$bstride` bytes).
macro_rules! load_b {
    ($bstride:expr; $($t:literal <- $p:expr),+) => {
        // SAFETY: the tiles are configured (`ldtilecfg` above); each pointer is a B tile inside a prepared record:
        // 16 rows of `$bstride` bytes.
        unsafe {
            asm!(
                $(concat!("tileloadd tmm", $t, ", [{} + {bs}*1]"),)+
                $(in(reg) $p,)+
                bs = in(reg) $bstride,
                options(nostack, readonly),
            )
        }
    };
}

/// One row group's products for blocks `j`, `j + 1`: C tile 0 = A₀ · B (tile 4), C tile 1 = A₁ · B (tile 6), with
/// A₀ from `$a` (into tile 2) and A₁ from `$a + 1024` (tile 3), then the `$lo` products (unpacked B: `A · lo` from
/// tiles 5 and 7), both C tiles stored to `$c` and `$c + 1024`.
macro_rules! group_product {
    ($a:expr, $c:expr $(, $lo:literal)*) => {
        // SAFETY: the tiles are configured (`ldtilecfg` above) and the B tiles loaded (`load_b!`); `$a` holds two A
        // tiles of 16 rows of 64 bytes, `$c` two C tiles' 16 × 64 writable bytes.
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tileloadd tmm2, [{a0} + {s64}*1]",
                "tileloadd tmm3, [{a1} + {s64}*1]",
                "tdpbf16ps tmm0, tmm2, tmm4",
                "tdpbf16ps tmm1, tmm3, tmm6",
                $($lo,)*
                "tilestored [{c0} + {s64}*1], tmm0",
                "tilestored [{c1} + {s64}*1], tmm1",
                a0 = in(reg) $a,
                a1 = in(reg) $a.add(1024),
                c0 = in(reg) $c,
                c1 = in(reg) $c.add(1024),
                s64 = in(reg) 64usize,
                options(nostack),
            )
        }
    };
}

/// Where a row group's block scales are: `d` (and `mins`) hold one f32 per block, `nb` per row; the group's
/// first row's first block of the step is `first`; the group has `rows` rows.
struct Scales {
    d: *const f32,
    mins: *const f32,
    nb: usize,
    first: usize,
    rows: usize,
}

/// Adds `PAIRS` stored block products (C tiles at `cp`, `cp + 256`) to the group's accumulators: row `r` gains
/// `d · C[r]` (and with `OFFSET`, Q4_1's `m · Σx`: `sums`) per block. All 16 rows, so the loop unrolls and the
/// accumulators stay in registers; rows past the group (zero products) read the last row's scales and are never
/// written out.
///
/// # Safety
/// `cp` must hold `PAIRS` C tiles (16 × 16 f32, 64-byte aligned); `at` must address `PAIRS` consecutive blocks of
/// `at.rows ≥ 1` rows inside the scale arrays (`mins` too with `OFFSET`).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn add_products<const PAIRS: usize, const OFFSET: bool>(
    acc: &mut [__m512; ROWS],
    cp: *const f32,
    sums: [__m512; 2],
    at: &Scales,
) {
    for (r, acc) in acc.iter_mut().enumerate() {
        let b = at.first + r.min(at.rows - 1) * at.nb;
        for (k, &sum_x) in sums.iter().enumerate().take(PAIRS) {
            // SAFETY: the caller's contract: C row `r` of tile `k` at `cp + 256 k + 16 r`, block `b + k` in range.
            unsafe {
                let c = _mm512_load_ps(cp.add(256 * k + 16 * r));
                *acc = _mm512_fmadd_ps(_mm512_set1_ps(*at.d.add(b + k)), c, *acc);
                if OFFSET {
                    *acc = _mm512_fmadd_ps(_mm512_set1_ps(*at.mins.add(b + k)), sum_x, *acc);
                }
            }
        }
    }
}

/// Rows `row0 .. row0 + out.rows()` of `m` times the prepared tokens, into `out`: the product of
/// [`QMatrix::matmul_rows`] (up to f32 rounding, see the module docs). F32 matrices go to the AVX-512 kernel
/// with the original activations (`x`).
///
/// # Panics
/// If `tiles` were prepared for another shape than `x` and `m`, or the rows are outside the matrix.
///
/// # Safety
/// [`available`] must be true.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")]
pub unsafe fn matmul_rows(m: &QMatrix, x: &[f32], tiles: &Tiles, row0: usize, out: &mut MatOut<'_>) {
    let n_tok = out.n_tok();
    assert!(tiles.n_tok == n_tok && tiles.cols == m.cols && x.len() == n_tok * m.cols);
    assert!(row0 + out.rows() <= m.rows);
    avx512::assert_storage(m);
    let Some(buf) = tiles.buf.as_ref() else {
        panic!("tiles were never prepared")
    };
    let nb = m.cols / BLOCK;
    let (kind, table, d, mins, qp): (u8, __m512i, &[f32], &[f32], *const u8) = match &m.data {
        // SAFETY: AVX-512 F/BW/VL are available (implied by `available`); the arguments are checked above.
        Data::F32(_) => return unsafe { avx512::matmul_rows(m, x, n_tok, row0, out) },
        // SAFETY: the tables hold 32 u16 (64 bytes); unaligned loads.
        Data::Q4_1 { d, m: mins, qs } => (
            1,
            unsafe { _mm512_loadu_si512(Q4_1_TABLE.as_ptr().cast()) },
            d,
            mins,
            qs.as_ptr(),
        ),
        // SAFETY: as above.
        Data::Q4_0 { d, qs } => (
            0,
            unsafe { _mm512_loadu_si512(Q4_0_TABLE.as_ptr().cast()) },
            d,
            &[],
            qs.as_ptr(),
        ),
        Data::Q8_0 { d, qs } => (8, _mm512_setzero_si512(), d, &[], qs.as_ptr().cast()),
    };
    let nrows = out.rows();
    // Two row groups in flight (alternating): their A tiles and stored C tiles.
    let mut a = [TilePair([0; 512]); 2];
    let mut c = [TilePair([0; 512]); 2];
    let recs = buf.as_ptr().cast::<u32>();
    let (dp, mp) = (d.as_ptr(), mins.as_ptr());
    for tt in 0..n_tok.div_ceil(TOKENS) {
        let (t0, nt) = (tt * TOKENS, (n_tok - tt * TOKENS).min(TOKENS));
        let cfg = TileConfig::new(nt);
        // SAFETY: a valid palette-1 configuration (64 bytes, 64-byte aligned); tile use was permitted by
        // `available`.
        unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
        let (packed, width) = columns(nt);
        let bstride = width * 4;
        // Record of block `j` of this token tile.
        // SAFETY: (tt, j < nb) lies within the prepared buffer (its shape was checked above).
        let rec = |j: usize| unsafe { recs.add((tt * nb + j) * RECORD) };
        let mut g0 = 0;
        while g0 < nrows {
            let g = (nrows - g0).min(ROWS);
            let r0 = row0 + g0;
            if g < ROWS {
                // Rows past the group multiply as zeros (their sums are never read).
                a[0].0.fill(0);
                a[1].0.fill(0);
            }
            // Row `r`'s sums, lane `t` for token `t` (packed: plus lane `nt + t`, folded at the end).
            let mut acc = [_mm512_setzero_ps(); ROWS];
            // Two blocks at a time (an odd last block pairs with itself, its second product unread). Step `p`
            // writes and multiplies its tiles, then adds up step `p - 1`'s stored products while the tile unit
            // works.
            let steps = nb.div_ceil(2);
            for p in 0..=steps {
                if p < steps {
                    // The next group's weights, a share per step.
                    avx512::prefetch_rows_part(m, r0 + ROWS, ROWS, p, steps);
                    let (j, j1) = (2 * p, (2 * p + 1).min(nb - 1));
                    let ap = a[p & 1].0.as_mut_ptr().cast::<__m512i>();
                    for r in 0..g {
                        let b = (r0 + r) * nb + j;
                        let b1 = b - j + j1;
                        // SAFETY: blocks `b`, `b1` of a row checked above: 16 (4-bit) or 32 (Q8_0) bytes at their
                        // offsets; `ap` holds two A tiles of 16 rows of 64 bytes (aligned stores).
                        unsafe {
                            let (q, q1) = if kind == 8 {
                                (
                                    quants8(qp.add(b * BLOCK).cast()),
                                    quants8(qp.add(b1 * BLOCK).cast()),
                                )
                            } else {
                                (quants4(qp.add(b * 16), table), quants4(qp.add(b1 * 16), table))
                            };
                            _mm512_store_si512(ap.add(r), q);
                            _mm512_store_si512(ap.add(ROWS + r), q1);
                        }
                    }
                    let (ap, cp) = (
                        a[p & 1].0.as_ptr().cast::<u8>(),
                        c[p & 1].0.as_mut_ptr().cast::<u8>(),
                    );
                    // Packed, each block's one B tile holds both halves; else its `lo` tile is a second product.
                    if packed {
                        load_b!(bstride; "4" <- rec(j), "6" <- rec(j1));
                        group_product!(ap, cp);
                    } else {
                        load_b!(bstride; "4" <- rec(j), "5" <- rec(j).add(LO), "6" <- rec(j1), "7" <- rec(j1).add(LO));
                        group_product!(ap, cp, "tdpbf16ps tmm0, tmm2, tmm5", "tdpbf16ps tmm1, tmm3, tmm7");
                    }
                }
                if p > 0 {
                    let (j, j1) = (2 * (p - 1), (2 * p - 1).min(nb - 1));
                    let cp = c[(p - 1) & 1].0.as_ptr().cast::<f32>();
                    // SAFETY: each record's sums are 16 f32 (aligned: records are 64-byte multiples).
                    let sums = unsafe {
                        [
                            _mm512_load_ps(rec(j).add(SUMS).cast()),
                            _mm512_load_ps(rec(j1).add(SUMS).cast()),
                        ]
                    };
                    let at = Scales {
                        d: dp,
                        mins: mp,
                        nb,
                        first: r0 * nb + j,
                        rows: g,
                    };
                    // SAFETY: `cp` holds two stored C tiles; `at` addresses blocks `j`, `j1` of the group's rows,
                    // all checked above.
                    unsafe {
                        match (j1 > j, kind == 1) {
                            (true, true) => add_products::<2, true>(&mut acc, cp, sums, &at),
                            (true, false) => add_products::<2, false>(&mut acc, cp, sums, &at),
                            (false, true) => add_products::<1, true>(&mut acc, cp, sums, &at),
                            (false, false) => add_products::<1, false>(&mut acc, cp, sums, &at),
                        }
                    }
                }
            }
            let fold = _mm512_and_si512(
                _mm512_add_epi32(
                    _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                    _mm512_set1_epi32(nt as i32),
                ),
                _mm512_set1_epi32(15),
            );
            for (r, &acc) in acc.iter().enumerate().take(g) {
                let mut lanes = [0f32; 16];
                let v = if packed {
                    _mm512_add_ps(acc, _mm512_permutexvar_ps(fold, acc))
                } else {
                    acc
                };
                // SAFETY: 16 writable f32; unaligned store.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), v) };
                for (t, &v) in lanes.iter().enumerate().take(nt) {
                    out.put(g0 + r, t0 + t, v);
                }
            }
            g0 += g;
        }
    }
    // SAFETY: releases this thread's tile state (configured above); no tile is used after.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}
