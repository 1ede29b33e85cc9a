//! Matrix products on tensor cores for steps with many tokens (prefill chunks, large batches): the
//! `matmul_mma_{f32,q8_0,q4_0,q4_1}` kernels (CUDA source, part of [`super::kernels::kernel_source`]).
//!
//! Owns the tiled product `out[t][r] (=|+=|silu-gated) W[r]·x[t]` for a tile of [`MMA_BM`] tokens × [`MMA_BN`]
//! weight rows per block of 4 warps: per step of [`MMA_KB`] quant blocks (64 columns) the block's threads load the
//! activations (f32, rounded to f16) and the weights (dequantized in registers as the CUDA-core kernels do, then
//! rounded to f16) into shared memory, and each warp multiplies its 32 × 16 part with
//! `mma.sync.aligned.m16n8k16` (f16 inputs, f32 accumulation), the next step's loads issued before the current
//! one's products (a step is a memory round trip: two quant blocks per step halve them). The operands are
//! read from shared memory by the fragment layout of the PTX ISA (no `ldmatrix`), rows padded so that a fragment
//! load touches 32 distinct banks. Needs sm_80 (the instruction's f16 form with f32 accumulators); the backend
//! launches these only there, and only where every product's width is a multiple of 32.
//!
//! Numerics: each input is rounded to f16 (relative error ≤ 2⁻¹¹, the f16 KV cache's); products of f16 are exact
//! in f32 and summed in f32. The f32 CUDA-core kernels stay for steps below [`MMA_MIN_TOKENS`] (every decode
//! batch by default), so greedy decoding is unchanged; [`MMA_ENV`] moves or disables the threshold. Never
//! launched by this module (that is [`super::forward`]).

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

// Two floats rounded to f16 (round to nearest even), packed low then high as the mma operands want them.
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {
    return (unsigned)f32_to_f16(lo) | ((unsigned)f32_to_f16(hi) << 16);
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

// One thread's share of a step's loads (quant blocks kb .. kb + MMA_KB - 1; blocks past the row's end load as
// zeros): 16 activations of one token per block (half the block), and the raw weights of its weight rows (per
// block one wload part for Q4_x, two for Q8_0 and F32).
struct MmaLoads {
    float4 x[4 * MMA_KB];
    WRaw w[2 * MMA_KB];
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

// The loads rounded to f16 into the shared tiles xs[token][col] and ws[row][col] (col within the step).
template <int TY>
__device__ __forceinline__ void mma_store(const MmaLoads& ld, unsigned short (*xs)[MMA_LD],
                                          unsigned short (*ws)[MMA_LD]) {
    int tid = threadIdx.x;
    const int LPB = lanes_per_block<TY>();
    const int PER_PASS = MMA_THREADS / LPB;
    const int PASSES = MMA_BN / PER_PASS;
    int sub = tid % LPB;
#pragma unroll
    for (int kk = 0; kk < MMA_KB; kk++) {
        unsigned* xrow = (unsigned*)&xs[tid / 2][kk * QBLOCK + (tid % 2) * 16];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float4& v = ld.x[4 * kk + i];
            xrow[2 * i] = pack_f16x2(v.x, v.y);
            xrow[2 * i + 1] = pack_f16x2(v.z, v.w);
        }
#pragma unroll
        for (int p = 0; p < PASSES; p++) {
            float w[8];
            wdequant<TY>(ld.w[kk * 2 + p], w);
            unsigned* wrow = (unsigned*)&ws[p * PER_PASS + tid / LPB][kk * QBLOCK];
            wrow[2 * sub] = pack_f16x2(w[0], w[1]);
            wrow[2 * sub + 1] = pack_f16x2(w[2], w[3]);
            if (LPB == 4) {
                wrow[8 + 2 * sub] = pack_f16x2(w[4], w[5]);
                wrow[8 + 2 * sub + 1] = pack_f16x2(w[6], w[7]);
            }
        }
    }
}

// out[t][r] (=|+=|silu-gated) W[r]·x[t] for rows r of W (rows x cols, cols a multiple of 32) and tokens t of x
// ([n_tok][cols]); out is [n_tok][rows]. Grid: (ceil(rows / MMA_BN), ceil(n_tok / MMA_BM)); block: 128 threads,
// warp w computing tokens 32 (w / 2) .. +31 and rows 16 (w % 2) .. +15 of the block's tile.
template <int TY>
__device__ void matmul_mma_impl(const float* __restrict__ f, const float* __restrict__ d, const float* __restrict__ m,
                                const unsigned char* __restrict__ q, int rows, int cols, const float* __restrict__ x,
                                int n_tok, float* __restrict__ out, int mode) {
    __shared__ unsigned short xs[MMA_BM][MMA_LD];
    __shared__ unsigned short ws[MMA_BN][MMA_LD];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int g = lane / 4, tq = lane % 4;
    int r0 = blockIdx.x * MMA_BN, t0 = blockIdx.y * MMA_BM;
    int wm = (warp / 2) * 32, wn = (warp % 2) * 16;
    float acc[2][2][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
    int nb = cols / QBLOCK;
    MmaLoads ld;
    mma_load<TY>(f, d, m, q, rows, cols, x, n_tok, t0, r0, 0, ld);
    for (int kb = 0; kb < nb; kb += MMA_KB) {
        __syncthreads();  // the previous step's products are done with the tiles
        mma_store<TY>(ld, xs, ws);
        __syncthreads();
        if (kb + MMA_KB < nb) mma_load<TY>(f, d, m, q, rows, cols, x, n_tok, t0, r0, kb + MMA_KB, ld);
#pragma unroll
        for (int ks = 0; ks < MMA_KC; ks += 16) {
            unsigned a[2][4], b[2][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int tm = wm + 16 * i;
                a[i][0] = *(const unsigned*)&xs[tm + g][ks + 2 * tq];
                a[i][1] = *(const unsigned*)&xs[tm + g + 8][ks + 2 * tq];
                a[i][2] = *(const unsigned*)&xs[tm + g][ks + 8 + 2 * tq];
                a[i][3] = *(const unsigned*)&xs[tm + g + 8][ks + 8 + 2 * tq];
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {
                int rn = wn + 8 * j;
                b[j][0] = *(const unsigned*)&ws[rn + g][ks + 2 * tq];
                b[j][1] = *(const unsigned*)&ws[rn + g][ks + 8 + 2 * tq];
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) mma_16816(acc[i][j], a[i], b[j]);
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
                if (t < n_tok && r < rows) {
                    i64 o = (i64)t * rows + r;
                    float v = acc[i][j][e];
                    if (mode == MODE_STORE) {
                        out[o] = v;
                    } else if (mode == MODE_ADD) {
                        out[o] += v;
                    } else {
                        float gt = out[o];
                        out[o] = gt / (1.0f + expf(-gt)) * v;
                    }
                }
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
