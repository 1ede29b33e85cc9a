//! Matrix products on tensor cores for steps with many tokens (prefill chunks, large batches): the
//! `matmul_mma_{f32,q8_0,q4_0,q4_1}` kernels (CUDA source, part of [`super::kernels::kernel_source`]).
//!
//!
//! Owns the tiled product `out[t][r] (=|+=|silu-gated) W[r]·x[t]` for a tile of [`MMA_BM`] tokens × [`MMA_BN`]
//! weight rows per block of 4 warps: per step of [`MMA_KB`] quant blocks (64 columns) the block's threads load the
//! activations and the weights into shared memory, and each warp multiplies its 32 × 16 part with
//! `mma.sync.aligned.m16n8k16` (f16 inputs, f32 accumulation), the next step's loads issued before the current
//! one's products (a step is a memory round trip: two quant blocks per step halve them). The operands are read from
//! shared memory by the fragment layout of the PTX ISA (no `ldmatrix`), rows padded so that a fragment load touches
//! 32 distinct banks. Needs sm_80 (the instruction's f16 form with f32 accumulators); the backend launches these only
//! there, and only where every product's width is a multiple of 32.
//!
//! Numerics, the CPU's AMX kernels' (docs/architecture.md, Decisions): **f32 results**, not f16 ones. The weights
//! enter the tensor cores as their integer quants (exact in f16), each quant block's product is scaled (and Q4_1's
//! minimum times the activations' sum added) in f32, and the activations enter as two f16 halves `hi + lo` (relative
//! error ≤ 2⁻²², two products per block; F32 weights are split too, three products). So a token's logits do not
//! depend on whether its step ran on tensor cores (a decode token beside a long prefill chunk, a batch of 64) or on
//! the CUDA-core kernels, to f32 rounding; plain f16 inputs would move them by ~7e-4 of the largest logit
//! (model_reference.rs simulates that on the CPU). The CUDA-core kernels stay for steps below [`MMA_MIN_TOKENS`];
//! [`MMA_ENV`] moves or disables the threshold. Never launched by this module (that is [`super::forward`]).

/// Tokens per block tile.
pub const MMA_BM: usize = 64;

/// Weight rows per block tile.
pub const MMA_BN: usize = 32;

/// Threads per block (4 warps).
pub const MMA_THREADS: usize = 128;

/// Quant blocks (32 columns each) per step of the product loop.
pub const MMA_KB: usize = 2;

/// Fewest tokens in a step for the tensor-core products: below it the tiles would be mostly padding, and decode
/// batches (up to the default `--max-num-seqs` of 32) keep the f32 kernels tuned for them.
pub const MMA_MIN_TOKENS: usize = 64;

/// Environment variable that sets [`super::CudaOptions::mma_min_tokens`] (a number of tokens; 0 turns the
/// tensor-core products off), to measure them against the CUDA-core kernels on a GPU.
pub const MMA_ENV: &str = "LLMSERVE_CUDA_MMA_MIN_TOKENS";

/// Whether a device of compute capability `cc` runs the tensor-core kernels (sm_80 and later).
pub fn supported(cc: (i32, i32)) -> bool {
    cc.0 >= 8
}

/// The kernels' source with the constants filled in (appended to the forward pass's source).
pub fn source() -> String {
    SOURCE
        .replace("@MMA_BM@", &MMA_BM.to_string())
        .replace("@MMA_BN@", &MMA_BN.to_string())
        .replace("@MMA_THREADS@", &MMA_THREADS.to_string())
        .replace("@MMA_KB@", &MMA_KB.to_string())
}

const SOURCE: &str = r#"
// ---- Tensor-core products for long steps (inference/src/backend/cuda/mma.rs) ----
#define MMA_BM @MMA_BM@
#define MMA_BN @MMA_BN@
#define MMA_KB @MMA_KB@  // quant blocks per step
#define MMA_KC (MMA_KB * QBLOCK)  // columns per step
#define MMA_LD (MMA_KC + 8)  // halves per shared-memory row: 8 of padding, so fragment loads hit 32 distinct banks
#define MMA_THREADS @MMA_THREADS@

// Two f16 bit patterns packed low then high, as the mma operands want them.
__device__ __forceinline__ unsigned pack_bits(unsigned short lo, unsigned short hi) {
    return (unsigned)lo | ((unsigned)hi << 16);
}

// d (4 f32, this lane's part of the 16x8 tile) += A (16x16 f16, a: 4 registers of 2) x B (16x8 f16, b: 2 registers)
// with the PTX ISA's fragment layout (groupID = lane / 4, threadID_in_group = lane % 4).
__device__ __forceinline__ void mma_16816(float* d, const unsigned* a, const unsigned* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
    __trap();  // no m16n8k16 before sm_80; the backend never launches these kernels there
#else
    emu_mma_m16n8k16(d, a, b);
#endif
}

// A fragment of A (16 rows from tm, 16 columns from ks, row-major tile t) and of B (8 rows of t from rn — the tile
// holds B transposed —, 16 columns from ks), as the PTX ISA lays them out for lane (g, tq) = (lane / 4, lane % 4).
__device__ __forceinline__ void frag_a(const unsigned short (*t)[MMA_LD], int tm, int ks, int g, int tq, unsigned* a) {
    a[0] = *(const unsigned*)&t[tm + g][ks + 2 * tq];
    a[1] = *(const unsigned*)&t[tm + g + 8][ks + 2 * tq];
    a[2] = *(const unsigned*)&t[tm + g][ks + 8 + 2 * tq];
    a[3] = *(const unsigned*)&t[tm + g + 8][ks + 8 + 2 * tq];
}
__device__ __forceinline__ void frag_b(const unsigned short (*t)[MMA_LD], int rn, int ks, int g, int tq, unsigned* b) {
    b[0] = *(const unsigned*)&t[rn + g][ks + 2 * tq];
    b[1] = *(const unsigned*)&t[rn + g][ks + 8 + 2 * tq];
}

// A warp's accumulators (2 x 2 tiles of 16 x 8, 4 per lane) set to 0.
__device__ __forceinline__ void zero_tiles(float (&a)[2][2][4]) {
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) a[i][j][e] = 0.0f;
}

// One thread's share of a step's loads (quant blocks kb .. kb + MMA_KB - 1; blocks past the row's end load as
// zeros): 16 activations of one token per block (half the block), and the raw weights of its weight rows (per
// block one wload part for Q4_x, two for Q8_0 and F32).
struct MmaLoads {
    float4 x[4 * MMA_KB];
    WRaw w[2 * MMA_KB];
};

// The step's tiles in shared memory: the activations as f16 hi + lo (x = hi + lo to 2^-22), the weights as f16 (the
// quants; F32 weights hi + lo), each (row, block)'s scale and minimum, and each (token, block)'s activation sum (the
// Q4_1 minimum's term).
struct MmaTiles {
    unsigned short x_hi[MMA_BM][MMA_LD], x_lo[MMA_BM][MMA_LD];
    unsigned short w_hi[MMA_BN][MMA_LD], w_lo[MMA_BN][MMA_LD];
    float scale[MMA_BN][MMA_KB], minimum[MMA_BN][MMA_KB], x_sum[MMA_BM][MMA_KB];
};

template <int TY>
__device__ __forceinline__ void mma_load(const float* __restrict__ f, const float* __restrict__ d,
                                         const float* __restrict__ m, const unsigned char* __restrict__ q, int rows,
                                         int cols, const float* __restrict__ x, int n_tok, int t0, int r0, int kb,
                                         MmaLoads& ld) {
    int tid = threadIdx.x, nb = cols / QBLOCK;
    int tok = t0 + tid / 2;
    const int LPB = lanes_per_block<TY>();
    const int PER_PASS = MMA_THREADS / LPB;  // weight rows loaded per pass
    const int PASSES = MMA_BN / PER_PASS;
#pragma unroll
    for (int kk = 0; kk < MMA_KB; kk++) {
        int b = kb + kk;
        const float* xp = x + (i64)tok * cols + (i64)b * QBLOCK + (tid % 2) * 16;
        bool live = tok < n_tok && b < nb;
#pragma unroll
        for (int i = 0; i < 4; i++)
            ld.x[4 * kk + i] = live ? ((const float4*)xp)[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int p = 0; p < PASSES; p++) {
            int r = r0 + p * PER_PASS + tid / LPB;
            WRaw& w = ld.w[kk * 2 + p];
            if (r < rows && b < nb) w = wload<TY>(f, d, m, q, (i64)r * nb + b, tid % LPB);
            else w = WRaw{make_float4(0.0f, 0.0f, 0.0f, 0.0f), 0, 0.0f, 0.0f};
        }
    }
}

// The loads into the shared tiles.
template <int TY>
__device__ __forceinline__ void mma_store(const MmaLoads& ld, MmaTiles& tl) {
    int tid = threadIdx.x;
    const int LPB = lanes_per_block<TY>();
    const int PER_PASS = MMA_THREADS / LPB;
    const int PASSES = MMA_BN / PER_PASS;
    int sub = tid % LPB;
#pragma unroll
    for (int kk = 0; kk < MMA_KB; kk++) {
        int col = kk * QBLOCK + (tid % 2) * 16;
        unsigned* hi = (unsigned*)&tl.x_hi[tid / 2][col];
        unsigned* lo = (unsigned*)&tl.x_lo[tid / 2][col];
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float v[4] = {ld.x[4 * kk + i].x, ld.x[4 * kk + i].y, ld.x[4 * kk + i].z, ld.x[4 * kk + i].w};
            unsigned short h[4], l[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                h[e] = f32_to_f16(v[e]);
                l[e] = f32_to_f16(v[e] - f16_to_f32(h[e]));
                sum += v[e];
            }
            hi[2 * i] = pack_bits(h[0], h[1]);
            hi[2 * i + 1] = pack_bits(h[2], h[3]);
            lo[2 * i] = pack_bits(l[0], l[1]);
            lo[2 * i + 1] = pack_bits(l[2], l[3]);
        }
        // The token's two threads are adjacent lanes.
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        if (tid % 2 == 0) tl.x_sum[tid / 2][kk] = sum;
#pragma unroll
        for (int p = 0; p < PASSES; p++) {
            float w[8];
            wquant<TY>(ld.w[kk * 2 + p], w);
            int row = p * PER_PASS + tid / LPB;
            unsigned* whi = (unsigned*)&tl.w_hi[row][kk * QBLOCK];
            unsigned* wlo = (unsigned*)&tl.w_lo[row][kk * QBLOCK];
            const int NW = LPB == 4 ? 8 : 4;
#pragma unroll
            for (int e = 0; e < NW; e += 2) {
                // Elements 4 sub + e (and for Q4_x, 16 + 4 sub + e - 4): word index of the pair.
                int word = e < 4 ? 2 * sub + e / 2 : 8 + 2 * sub + (e - 4) / 2;
                unsigned short a = f32_to_f16(w[e]), b = f32_to_f16(w[e + 1]);
                whi[word] = pack_bits(a, b);
                if (TY == TY_F32)
                    wlo[word] = pack_bits(f32_to_f16(w[e] - f16_to_f32(a)), f32_to_f16(w[e + 1] - f16_to_f32(b)));
            }
            if (sub == 0) {
                tl.scale[row][kk] = TY == TY_F32 ? 1.0f : ld.w[kk * 2 + p].s;
                tl.minimum[row][kk] = TY == TY_Q4_1 ? ld.w[kk * 2 + p].mn : 0.0f;
            }
        }
    }
}

// out[t][r] (=|+=|silu-gated) W[r]·x[t] for rows r of W (rows x cols, cols a multiple of 32) and tokens t of x
// ([n_tok][cols]); out is [n_tok][rows]. Per quant block the tensor cores multiply the quants (exact) by the
// activations' f16 hi and lo halves (F32 weights: hi and lo too, three products), summing in f32; the block's scale
// (and Q4_1's minimum times the activations' sum) is then applied in f32, as the CUDA-core kernels do. Grid:
// (ceil(rows / MMA_BN), ceil(n_tok / MMA_BM)); block: 128 threads, warp w computing tokens 32 (w / 2) .. +31 and
// rows 16 (w % 2) .. +15 of the block's tile.
template <int TY>
__device__ void matmul_mma_impl(const float* __restrict__ f, const float* __restrict__ d, const float* __restrict__ m,
                                const unsigned char* __restrict__ q, int rows, int cols, const float* __restrict__ x,
                                int n_tok, float* __restrict__ out, int mode) {
    __shared__ MmaTiles tl;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int g = lane / 4, tq = lane % 4;
    int r0 = blockIdx.x * MMA_BN, t0 = blockIdx.y * MMA_BM;
    int wm = (warp / 2) * 32, wn = (warp % 2) * 16;
    float acc[2][2][4];
    zero_tiles(acc);
    int nb = cols / QBLOCK;
    MmaLoads ld;
    mma_load<TY>(f, d, m, q, rows, cols, x, n_tok, t0, r0, 0, ld);
    for (int kb = 0; kb < nb; kb += MMA_KB) {
        __syncthreads();  // the previous step's products are done with the tiles
        mma_store<TY>(ld, tl);
        __syncthreads();
        if (kb + MMA_KB < nb) mma_load<TY>(f, d, m, q, rows, cols, x, n_tok, t0, r0, kb + MMA_KB, ld);
#pragma unroll
        for (int kk = 0; kk < MMA_KB; kk++) {
            float blk[2][2][4];
            zero_tiles(blk);
#pragma unroll
            for (int ks = kk * QBLOCK; ks < (kk + 1) * QBLOCK; ks += 16) {
                unsigned ah[2][4], al[2][4], bh[2][2], bl[2][2];
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    frag_a(tl.x_hi, wm + 16 * i, ks, g, tq, ah[i]);
                    frag_a(tl.x_lo, wm + 16 * i, ks, g, tq, al[i]);
                }
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    frag_b(tl.w_hi, wn + 8 * j, ks, g, tq, bh[j]);
                    if (TY == TY_F32) frag_b(tl.w_lo, wn + 8 * j, ks, g, tq, bl[j]);
                }
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        mma_16816(blk[i][j], ah[i], bh[j]);
                        mma_16816(blk[i][j], al[i], bh[j]);
                        if (TY == TY_F32) mma_16816(blk[i][j], ah[i], bl[j]);
                    }
            }
            // The block's scale (and Q4_1's minimum times the activations' sum), in f32.
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int tl_row = wm + 16 * i + g + (e >= 2 ? 8 : 0);
                        int wl_row = wn + 8 * j + 2 * tq + (e & 1);
                        float v = blk[i][j][e] * tl.scale[wl_row][kk];
                        if (TY == TY_Q4_1) v = fmaf(tl.minimum[wl_row][kk], tl.x_sum[tl_row][kk], v);
                        acc[i][j][e] += v;
                    }
        }
    }
    // acc[i][j]: (token wm + 16 i + g (+8 for e >= 2), row wn + 8 j + 2 tq (+1 for odd e)).
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int t = t0 + wm + 16 * i + g + (e >= 2 ? 8 : 0);
                int r = r0 + wn + 8 * j + 2 * tq + (e & 1);
                if (t < n_tok && r < rows) store_mode(out, (i64)t * rows + r, acc[i][j][e], mode);
            }
}

#define INSTANTIATE_MMA(NAME, TY)                                                                               \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS)                                                   \
        matmul_mma_##NAME(const float* f, const float* d, const float* m, const unsigned char* q, int rows,     \
                          int cols, const float* x, int n_tok, float* out, int mode) {                          \
        matmul_mma_impl<TY>(f, d, m, q, rows, cols, x, n_tok, out, mode);                                       \
    }

INSTANTIATE_MMA(f32, TY_F32)
INSTANTIATE_MMA(q8_0, TY_Q8_0)
INSTANTIATE_MMA(q4_0, TY_Q4_0)
INSTANTIATE_MMA(q4_1, TY_Q4_1)
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fit_the_block_and_the_source_is_filled_in() {
        let s = source();
        assert!(!s.contains('@'));
        // 128 threads: two per token of the activation tile, and the weight tile's rows in whole passes.
        assert_eq!(MMA_BM * 2, MMA_THREADS);
        assert!(MMA_BN.is_multiple_of(MMA_THREADS / 8) && MMA_BN.is_multiple_of(MMA_THREADS / 4));
        assert!(supported((9, 0)) && supported((8, 0)) && !supported((7, 5)));
    }
}
