// llmserve CUDA kernels: this file with the constants of kernels.rs filled in, compiled at run time by NVRTC.
#define QBLOCK @QBLOCK@
#define TOKEN_TILE @TOKEN_TILE@
#define WARPS @WARPS@
#define MAX_HEAD_DIM @MAX_HEAD_DIM@
#define HD_PER_LANE (MAX_HEAD_DIM / 32)
#define ROW_PREFETCH @ROW_PREFETCH@
#define MODE_STORE @MODE_STORE@
#define MODE_ADD @MODE_ADD@
#define MODE_SILU_MUL @MODE_SILU_MUL@

#define TY_F32 0
#define TY_Q8_0 1
#define TY_Q4_0 2
#define TY_Q4_1 3

typedef long long i64;

// Element idx (row-major over the whole matrix) of a weight matrix stored as structure of arrays:
// f (F32 values) or d (block scales), m (block minimums, Q4_1) and q (quants: 32 bytes per block for Q8_0,
// 16 bytes of nibbles for Q4_x, byte j holding element j in its low and element j + 16 in its high nibble).
template <int TY>
__device__ __forceinline__ float wval(const float* __restrict__ f, const float* __restrict__ d,
                                      const float* __restrict__ m, const unsigned char* __restrict__ q, i64 idx) {
    if (TY == TY_F32) return f[idx];
    i64 b = idx / QBLOCK;
    int j = (int)(idx % QBLOCK);
    if (TY == TY_Q8_0) return (float)(signed char)q[idx] * d[b];
    unsigned char byte = q[b * (QBLOCK / 2) + (j & 15)];
    int nib = j < 16 ? (byte & 15) : (byte >> 4);
    if (TY == TY_Q4_0) return (float)(nib - 8) * d[b];
    return (float)nib * d[b] + m[b];
}

// Lane part `sub` of quant block b (elements b*32 .. b*32+31 of the row-major matrix) as loaded, before
// dequantization (wdequant): for Q4_x the 4 bytes of nibbles at 4*sub and the block's scale (and minimum); for Q8_0
// the 4 quants at 4*sub and the scale; for F32 the 4 elements at 4*sub. The loads are aligned when the row length
// is a multiple of 32.
struct WRaw {
    float4 f;
    int v;
    float s, mn;
};
template <int TY>
__device__ __forceinline__ WRaw wload(const float* __restrict__ f, const float* __restrict__ d,
                                      const float* __restrict__ m, const unsigned char* __restrict__ q, i64 b,
                                      int sub) {
    WRaw w;
    if (TY == TY_F32) {
        w.f = *(const float4*)(f + b * QBLOCK + 4 * sub);
    } else if (TY == TY_Q8_0) {
        w.v = *(const int*)(q + b * QBLOCK + 4 * sub);
        w.s = d[b];
    } else {
        w.v = *(const int*)(q + b * (QBLOCK / 2) + 4 * sub);
        w.s = d[b];
        w.mn = TY == TY_Q4_1 ? m[b] : 0.0f;
    }
    return w;
}

// wload's lane part as the quants' values, before the block's scale (and minimum): small integers (exact in f16:
// Q8_0's -127..127, Q4_0's nibble - 8, Q4_1's nibble; the tensor-core products take them so), F32 weights as they
// are. For Q4_x elements 4*sub+k in w[k], 16+4*sub+k in w[4+k]; for Q8_0 and F32 the 4 elements at 4*sub in w[0..4].
template <int TY>
__device__ __forceinline__ void wquant(const WRaw& r, float* w) {
    if (TY == TY_F32) {
        w[0] = r.f.x;
        w[1] = r.f.y;
        w[2] = r.f.z;
        w[3] = r.f.w;
    } else if (TY == TY_Q8_0) {
#pragma unroll
        for (int k = 0; k < 4; k++) w[k] = (float)(signed char)(r.v >> (8 * k));
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int byte = (r.v >> (8 * k)) & 0xff;
            int off = TY == TY_Q4_0 ? 8 : 0;
            w[k] = (float)((byte & 15) - off);
            w[4 + k] = (float)((byte >> 4) - off);
        }
    }
}

// wload's lane part dequantized into w (wquant's layout): the quants times the block's scale (plus Q4_1's minimum).
template <int TY>
__device__ __forceinline__ void wdequant(const WRaw& r, float* w) {
    wquant<TY>(r, w);
    if (TY == TY_Q8_0) {
#pragma unroll
        for (int k = 0; k < 4; k++) w[k] *= r.s;
    } else if (TY != TY_F32) {
#pragma unroll
        for (int k = 0; k < 8; k++) w[k] = TY == TY_Q4_0 ? w[k] * r.s : w[k] * r.s + r.mn;
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Lanes per quant block in row_dots (4 for Q4_x, whose lanes read 4 bytes holding 8 elements; 8 otherwise).
template <int TY>
__device__ __forceinline__ int lanes_per_block() {
    return (TY == TY_Q4_0 || TY == TY_Q4_1) ? 4 : 8;
}

// Issues the weight loads of a lane's ROW_PREFETCH blocks g0, g0 + BPI, ... (those below nb) of the row whose first
// block is rb into raw, all before any is used.
template <int TY>
__device__ __forceinline__ void row_load_group(const float* __restrict__ f, const float* __restrict__ d,
                                               const float* __restrict__ m, const unsigned char* __restrict__ q,
                                               i64 rb, int nb, int g0, int sub, WRaw* raw) {
    const int BPI = 32 / lanes_per_block<TY>();
#pragma unroll
    for (int i = 0; i < ROW_PREFETCH; i++) {
        int b = g0 + i * BPI;
        if (b < nb) raw[i] = wload<TY>(f, d, m, q, rb + b, sub);
    }
}

// Issues the weight loads of this lane's first ROW_PREFETCH blocks of row r into raw (what row_dots uses first), so
// a caller can start them before other work (the fused launches' norms). Rows whose length is not a multiple of 32
// load nothing here.
template <int TY>
__device__ __forceinline__ void row_prefetch(const float* __restrict__ f, const float* __restrict__ d,
                                             const float* __restrict__ m, const unsigned char* __restrict__ q, int r,
                                             int cols, int lane, WRaw* raw) {
    if (cols % QBLOCK != 0) return;
    const int LPB = lanes_per_block<TY>();
    int nb = cols / QBLOCK;
    row_load_group<TY>(f, d, m, q, (i64)r * nb, nb, lane / LPB, lane % LPB, raw);
}

// Adds to acc[t] this lane's part of row r of W (rows x cols) times token t of the tile xt ([nt][cols]) — with NORM,
// times xt ⊙ nw (the RMSNorm weight; the caller scales by each token's 1/rms); the warp's lanes together cover the
// row (their partial sums are added by the caller). raw holds row_prefetch's loads for this row.
template <int TY, bool NORM>
__device__ __forceinline__ void row_dots(const float* __restrict__ f, const float* __restrict__ d,
                                         const float* __restrict__ m, const unsigned char* __restrict__ q, int r,
                                         int cols, const float* __restrict__ xt, const float* __restrict__ nw,
                                         int nt, int lane, WRaw* raw, float* acc) {
    if (cols % QBLOCK == 0) {
        // LPB lanes share a quant block, each taking 4 consecutive bytes of its quants (Q4_x: elements
        // 4s..4s+3 and 16+4s..16+4s+3; Q8_0 and F32: 4s..4s+3), so the warp reads the weights and the
        // activations in contiguous runs (the activations once per row, from L1). All of a row's loads are
        // independent and issued ahead (ROW_PREFETCH): a decode matmul has few warps per SM, so latency must be
        // hidden inside the warp.
        const int LPB = lanes_per_block<TY>();
        const int BPI = 32 / LPB;
        int sub = lane % LPB;
        int nb = cols / QBLOCK;
        i64 rb = (i64)r * nb;
        // The weight loads of ROW_PREFETCH blocks per lane are issued before the first is used (the first group's
        // by row_prefetch): a warp issues in order and stalls at the first instruction whose operand is still
        // loading, so loads placed after the use of an earlier one (the next trip of a loop the compiler does not
        // unroll) wait a whole memory round each.
        for (int g0 = lane / LPB; g0 < nb; g0 += BPI * ROW_PREFETCH) {
            if (g0 != lane / LPB) row_load_group<TY>(f, d, m, q, rb, nb, g0, sub, raw);
#pragma unroll
            for (int i = 0; i < ROW_PREFETCH; i++) {
                int b = g0 + i * BPI;
                if (b >= nb) break;
                float w[8];
                wdequant<TY>(raw[i], w);
                if (NORM) {
                    // The norm weight folded into this lane's weights (it multiplies the same columns for every
                    // token).
                    float4 g = *(const float4*)(nw + (i64)b * QBLOCK + 4 * sub);
                    w[0] *= g.x;
                    w[1] *= g.y;
                    w[2] *= g.z;
                    w[3] *= g.w;
                    if (LPB == 4) {
                        float4 h = *(const float4*)(nw + (i64)b * QBLOCK + 16 + 4 * sub);
                        w[4] *= h.x;
                        w[5] *= h.y;
                        w[6] *= h.z;
                        w[7] *= h.w;
                    }
                }
#pragma unroll
                for (int t = 0; t < TOKEN_TILE; t++) {
                    if (t < nt) {
                        const float* xb = xt + (i64)t * cols + (i64)b * QBLOCK + 4 * sub;
                        float4 v = *(const float4*)xb;
                        float s = w[0] * v.x;
                        s = fmaf(w[1], v.y, s);
                        s = fmaf(w[2], v.z, s);
                        s = fmaf(w[3], v.w, s);
                        if (LPB == 4) {
                            float4 u = *(const float4*)(xb + 16);
                            s = fmaf(w[4], u.x, s);
                            s = fmaf(w[5], u.y, s);
                            s = fmaf(w[6], u.z, s);
                            s = fmaf(w[7], u.w, s);
                        }
                        acc[t] += s;
                    }
                }
            }
        }
    } else {
        // F32 rows of any length: lane l takes elements l, l + 32, ...
        i64 base = (i64)r * cols;
#pragma unroll 4
        for (int k = lane; k < cols; k += 32) {
            float w = wval<TY>(f, d, m, q, base + k);
            if (NORM) w *= nw[k];
#pragma unroll
            for (int t = 0; t < TOKEN_TILE; t++)
                if (t < nt) acc[t] = fmaf(w, xt[(i64)t * cols + k], acc[t]);
        }
    }
}

// 1/rms of each of the tile's tokens (RMSNorm's scale: 1 / sqrt(mean(x²) + eps)), computed by the whole warp. The
// tokens' sums run side by side over the columns, so all of an iteration's loads are independent (one token after
// another, each load waited for before the next, was ~18 dependent L2 round trips per token at dim 576: microseconds
// of every fused launch at 8 tokens).
__device__ __forceinline__ void inv_rms(const float* __restrict__ xt, int cols, int nt, int lane, float eps,
                                        float* inv) {
    float ss[TOKEN_TILE];
#pragma unroll
    for (int t = 0; t < TOKEN_TILE; t++) ss[t] = 0.0f;
    if (cols % 4 == 0) {
        // 16-byte loads: rows of cols floats start 16-byte aligned when cols is a multiple of 4.
        int c4 = cols / 4;
#pragma unroll 2
        for (int k = lane; k < c4; k += 32) {
#pragma unroll
            for (int t = 0; t < TOKEN_TILE; t++) {
                if (t < nt) {
                    float4 v = ((const float4*)(xt + (i64)t * cols))[k];
                    ss[t] = fmaf(v.x, v.x, ss[t]);
                    ss[t] = fmaf(v.y, v.y, ss[t]);
                    ss[t] = fmaf(v.z, v.z, ss[t]);
                    ss[t] = fmaf(v.w, v.w, ss[t]);
                }
            }
        }
    } else {
#pragma unroll 2
        for (int k = lane; k < cols; k += 32) {
#pragma unroll
            for (int t = 0; t < TOKEN_TILE; t++)
                if (t < nt) ss[t] = fmaf(xt[(i64)t * cols + k], xt[(i64)t * cols + k], ss[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < TOKEN_TILE; t++) {
        if (t < nt) inv[t] = 1.0f / sqrtf(warp_sum(ss[t]) / (float)cols + eps);
    }
}

// out[o] = v, += v, or (the gate already in out[o]) silu(out[o]) * v: the matmul epilogues.
__device__ __forceinline__ void store_mode(float* __restrict__ out, i64 o, float v, int mode) {
    if (mode == MODE_STORE) {
        out[o] = v;
    } else if (mode == MODE_ADD) {
        out[o] += v;
    } else {
        float g = out[o];
        out[o] = g / (1.0f + expf(-g)) * v;
    }
}

// out[t0 + t][r] (=|+=|silu-gated) the warp's sum of acc[t], for the tile's nt tokens (nt is the same in all lanes,
// so only the live tokens' sums are reduced).
__device__ __forceinline__ void store_row(const float* acc, int nt, int lane, float* __restrict__ out, int rows,
                                          int r, int t0, int mode) {
#pragma unroll
    for (int t = 0; t < TOKEN_TILE; t++) {
        if (t < nt) {
            float v = warp_sum(acc[t]);
            if (lane == 0) store_mode(out, (i64)(t0 + t) * rows + r, v, mode);
        }
    }
}

// out[t][r] for rows r of W (rows x cols) and tokens t of x ([n_tok][cols]); out is [n_tok][rows].
// Grid: (ceil(rows / WARPS), ceil(n_tok / TOKEN_TILE)); block: 32 * WARPS threads; one warp per row.
template <int TY>
__device__ void matmul_impl(const float* __restrict__ f, const float* __restrict__ d, const float* __restrict__ m,
                            const unsigned char* __restrict__ q, int rows, int cols, const float* __restrict__ x,
                            int n_tok, float* __restrict__ out, int mode) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int r = blockIdx.x * WARPS + warp;
    if (r >= rows) return;
    int t0 = blockIdx.y * TOKEN_TILE;
    int nt = min(TOKEN_TILE, n_tok - t0);
    float acc[TOKEN_TILE];
#pragma unroll
    for (int t = 0; t < TOKEN_TILE; t++) acc[t] = 0.0f;
    WRaw raw[ROW_PREFETCH];
    row_prefetch<TY>(f, d, m, q, r, cols, lane, raw);
    row_dots<TY, false>(f, d, m, q, r, cols, x + (i64)t0 * cols, nullptr, nt, lane, raw, acc);
    store_row(acc, nt, lane, out, rows, r, t0, mode);
}

// The feed-forward's RMSNorm (weight nw) and gate and up projections of the residual stream x in one launch:
// out[t][r] = silu(Wg[r]·x̂[t]) * (Wu[r]·x̂[t]) with x̂ the normed x, one warp per row computing both.
template <int TY>
__device__ void gate_up_impl(const float* fg, const float* dg, const float* mg, const unsigned char* qg,
                             const float* fu, const float* du, const float* mu, const unsigned char* qu, int rows,
                             int cols, const float* __restrict__ x, const float* __restrict__ nw, float eps,
                             int n_tok, float* __restrict__ out) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int r = blockIdx.x * WARPS + warp;
    if (r >= rows) return;
    int t0 = blockIdx.y * TOKEN_TILE;
    int nt = min(TOKEN_TILE, n_tok - t0);
    float g[TOKEN_TILE], u[TOKEN_TILE];
#pragma unroll
    for (int t = 0; t < TOKEN_TILE; t++) g[t] = u[t] = 0.0f;
    const float* xt = x + (i64)t0 * cols;
    // Both rows' first weight loads in flight while the norms are computed.
    WRaw rg[ROW_PREFETCH], ru[ROW_PREFETCH];
    row_prefetch<TY>(fg, dg, mg, qg, r, cols, lane, rg);
    row_prefetch<TY>(fu, du, mu, qu, r, cols, lane, ru);
    float inv[TOKEN_TILE];
    inv_rms(xt, cols, nt, lane, eps, inv);
    row_dots<TY, true>(fg, dg, mg, qg, r, cols, xt, nw, nt, lane, rg, g);
    row_dots<TY, true>(fu, du, mu, qu, r, cols, xt, nw, nt, lane, ru, u);
#pragma unroll
    for (int t = 0; t < TOKEN_TILE; t++) {
        if (t < nt) {
            float gs = warp_sum(g[t] * inv[t]), us = warp_sum(u[t] * inv[t]);
            if (lane == 0) out[(i64)(t0 + t) * rows + r] = gs / (1.0f + expf(-gs)) * us;
        }
    }
}

// out[t][k] = E[tokens[t]][k]. Grid: n_tok blocks.
template <int TY>
__device__ void embed_impl(const float* __restrict__ f, const float* __restrict__ d, const float* __restrict__ m,
                           const unsigned char* __restrict__ q, int cols, const int* __restrict__ tokens,
                           float* __restrict__ out) {
    int t = blockIdx.x;
    i64 row = (i64)tokens[t] * cols;
    for (int k = threadIdx.x; k < cols; k += blockDim.x) out[(i64)t * cols + k] = wval<TY>(f, d, m, q, row + k);
}

#define INSTANTIATE(NAME, TY)                                                                                   \
    extern "C" __global__ void matmul_##NAME(const float* f, const float* d, const float* m,                   \
                                             const unsigned char* q, int rows, int cols, const float* x,       \
                                             int n_tok, float* out, int mode) {                                \
        matmul_impl<TY>(f, d, m, q, rows, cols, x, n_tok, out, mode);                                          \
    }                                                                                                           \
    extern "C" __global__ void embed_##NAME(const float* f, const float* d, const float* m,                    \
                                            const unsigned char* q, int cols, const int* tokens, float* out) { \
        embed_impl<TY>(f, d, m, q, cols, tokens, out);                                                          \
    }                                                                                                           \
    extern "C" __global__ void gate_up_##NAME(const float* fg, const float* dg, const float* mg,               \
                                              const unsigned char* qg, const float* fu, const float* du,       \
                                              const float* mu, const unsigned char* qu, int rows, int cols,    \
                                              const float* x, const float* nw, float eps, int n_tok,           \
                                              float* out) {                                                     \
        gate_up_impl<TY>(fg, dg, mg, qg, fu, du, mu, qu, rows, cols, x, nw, eps, n_tok, out);                   \
    }

INSTANTIATE(f32, TY_F32)
INSTANTIATE(q8_0, TY_Q8_0)
INSTANTIATE(q4_0, TY_Q4_0)
INSTANTIATE(q4_1, TY_Q4_1)

// out[i] = x[src] / rms(x[src]) * w, src = rows[i] when use_rows, else i. Grid: one block per output row.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                    float* __restrict__ out, int dim, float eps, const int* __restrict__ rows,
                                    int use_rows) {
    __shared__ float red[32];
    int i = blockIdx.x;
    int src = use_rows ? rows[i] : i;
    const float* xr = x + (i64)src * dim;
    float ss = 0.0f;
    for (int k = threadIdx.x; k < dim; k += blockDim.x) ss = fmaf(xr[k], xr[k], ss);
    ss = warp_sum(ss);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        int nw = (blockDim.x + 31) / 32;
        float v = lane < nw ? red[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) red[0] = v;
    }
    __syncthreads();
    float scale = 1.0f / sqrtf(red[0] / (float)dim + eps);
    for (int k = threadIdx.x; k < dim; k += blockDim.x) out[(i64)i * dim + k] = xr[k] * scale * w[k];
}

// KV-cache elements: f32 as is, or f16 as its 16 bits (IEEE half; converted with the PTX instructions, no
// header needed; the CPU emulator supplies the same conversions in software).
#ifdef __CUDA_ARCH__
__device__ __forceinline__ unsigned short f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
#else
#define f32_to_f16 emu_f32_to_f16
#define f16_to_f32 emu_f16_to_f32
#endif
__device__ __forceinline__ float kv_load(const float* p) { return *p; }
__device__ __forceinline__ float kv_load(const unsigned short* p) { return f16_to_f32(*p); }
__device__ __forceinline__ void kv_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void kv_store(unsigned short* p, float v) { *p = f32_to_f16(v); }
// Eight consecutive elements of the cache as loaded from a 16-byte-aligned address (two 16-byte loads for f32, one
// for f16), and widened to f32 (piece_unpack). Loading a group of pieces before unpacking any keeps their loads in
// flight together: a warp issues in order and stalls at the first use of a load still on its way, and the compiler
// does not move loads above the uses of earlier ones across the exits of a loop with a run-time trip count.
template <typename KV>
struct Piece;
template <>
struct Piece<float> {
    float4 a, b;
};
template <>
struct Piece<unsigned short> {
    int4 a;
};
__device__ __forceinline__ void piece_load(const float* p, Piece<float>& r) {
    r.a = ((const float4*)p)[0];
    r.b = ((const float4*)p)[1];
}
__device__ __forceinline__ void piece_load(const unsigned short* p, Piece<unsigned short>& r) {
    r.a = *(const int4*)p;
}
__device__ __forceinline__ void piece_unpack(const Piece<float>& r, float* o) {
    o[0] = r.a.x; o[1] = r.a.y; o[2] = r.a.z; o[3] = r.a.w; o[4] = r.b.x; o[5] = r.b.y; o[6] = r.b.z; o[7] = r.b.w;
}
__device__ __forceinline__ void piece_unpack(const Piece<unsigned short>& r, float* o) {
    int words[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        o[2 * i] = f16_to_f32((unsigned short)(words[i] & 0xffff));
        o[2 * i + 1] = f16_to_f32((unsigned short)((unsigned)words[i] >> 16));
    }
}

// Pieces loaded together per group in the attention kernel: 8 of f16 (a head of 64 is one group), 4 of f32 (twice
// the registers per piece; 8 took the kernel to 247 registers).
template <typename KV>
__device__ __forceinline__ constexpr int pieces_per_group() {
    return sizeof(KV) == 2 ? 8 : 4;
}

// RoPE (adjacent pairs) on q ([n_tok][n_heads*hd]) and k ([n_tok][n_kv*hd]) at each token's position, then
// k and v ([n_tok][n_kv*hd]) stored at each token's cache slot. Grid: one block per token.
template <typename KV>
__device__ void rope_kv_impl(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v,
                             KV* __restrict__ kc, KV* __restrict__ vc, const int* __restrict__ pos,
                             const int* __restrict__ slot, const float* __restrict__ inv_freq, int n_heads,
                             int n_kv, int hd) {
    int t = blockIdx.x;
    int qd = n_heads * hd, kvd = n_kv * hd, half = hd / 2;
    float p = (float)pos[t];
    for (int i = threadIdx.x; i < (n_heads + n_kv) * half; i += blockDim.x) {
        int h = i / half, j = i % half;
        float s, c;
        sincosf(p * inv_freq[j], &s, &c);
        float* vec = h < n_heads ? q + (i64)t * qd + h * hd : k + (i64)t * kvd + (h - n_heads) * hd;
        float a = vec[2 * j], b = vec[2 * j + 1];
        vec[2 * j] = a * c - b * s;
        vec[2 * j + 1] = a * s + b * c;
    }
    __syncthreads();
    i64 sl = slot[t];
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        kv_store(&kc[sl * kvd + i], k[(i64)t * kvd + i]);
        kv_store(&vc[sl * kvd + i], v[(i64)t * kvd + i]);
    }
}

// The attention block's first half for up to TOKEN_TILE tokens per block row, in one launch: RMSNorm (weight nw) of
// the residual stream x, the Q, K and V projections (three matrices of one type; the grid's first dimension covers
// the row blocks of Q, then of K, then of V), RoPE on Q and K, and K and V stored at each token's cache slot —
// what qkv (unfused: rms_norm and three matmuls) and rope_kv do in five launches, with the same arithmetic. Each
// warp computes one row for the tile's tokens (and its tokens' norms itself); a RoPE pair is rows 2j and 2j + 1
// of a head, computed by warps w and w ^ 1 of one block (WARPS is even and a block's first row even), which trade
// their sums through shared memory. Q goes to q ([n_tok][rows0], rotated); K and V only into the cache.
template <int TY, typename KV>
__device__ void qkv_rope_impl(const float* f0, const float* d0, const float* m0, const unsigned char* q0,
                              const float* f1, const float* d1, const float* m1, const unsigned char* q1,
                              const float* f2, const float* d2, const float* m2, const unsigned char* q2, int rows0,
                              int rows1, int rows2, int cols, const float* __restrict__ x,
                              const float* __restrict__ nw, float eps, int n_tok, float* __restrict__ q,
                              KV* __restrict__ kc, KV* __restrict__ vc, const int* __restrict__ pos,
                              const int* __restrict__ slot, const float* __restrict__ inv_freq, int hd) {
    static_assert(WARPS % 2 == 0, "a RoPE pair's rows 2j, 2j + 1 are warps w, w ^ 1 of one block");
    __shared__ float sums[WARPS][TOKEN_TILE];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int b0 = (rows0 + WARPS - 1) / WARPS, b1 = (rows1 + WARPS - 1) / WARPS;
    int bx = blockIdx.x;
    int which = bx < b0 ? 0 : (bx < b0 + b1 ? 1 : 2);
    int first = which == 0 ? 0 : (which == 1 ? b0 : b0 + b1);
    int rows = which == 0 ? rows0 : (which == 1 ? rows1 : rows2);
    int r = (bx - first) * WARPS + warp;
    bool live = r < rows;  // the same for the whole warp; a dead warp still meets the block barrier
    int t0 = blockIdx.y * TOKEN_TILE;
    int nt = min(TOKEN_TILE, n_tok - t0);
    if (live) {
        float acc[TOKEN_TILE];
#pragma unroll
        for (int t = 0; t < TOKEN_TILE; t++) acc[t] = 0.0f;
        const float* xt = x + (i64)t0 * cols;
        // The row's matrix; its first weight loads in flight while the norms are computed.
        const float* f = which == 0 ? f0 : (which == 1 ? f1 : f2);
        const float* d = which == 0 ? d0 : (which == 1 ? d1 : d2);
        const float* m = which == 0 ? m0 : (which == 1 ? m1 : m2);
        const unsigned char* wq = which == 0 ? q0 : (which == 1 ? q1 : q2);
        WRaw raw[ROW_PREFETCH];
        row_prefetch<TY>(f, d, m, wq, r, cols, lane, raw);
        float inv[TOKEN_TILE];
        inv_rms(xt, cols, nt, lane, eps, inv);
        row_dots<TY, true>(f, d, m, wq, r, cols, xt, nw, nt, lane, raw, acc);
#pragma unroll
        for (int t = 0; t < TOKEN_TILE; t++) {
            if (t < nt) {
                float v = warp_sum(acc[t] * inv[t]);
                if (lane == 0) sums[warp][t] = v;
            }
        }
    }
    __syncthreads();
    // Lane t finishes token t of the tile.
    if (!live || lane >= nt) return;
    int t = t0 + lane;
    i64 sl = slot[t];
    if (which == 2) {
        kv_store(&vc[sl * rows2 + r], sums[warp][lane]);
        return;
    }
    float a = sums[warp & ~1][lane], b = sums[warp | 1][lane];
    float s, c;
    sincosf((float)pos[t] * inv_freq[(r % hd) / 2], &s, &c);
    float v = (r & 1) ? a * s + b * c : a * c - b * s;
    if (which == 0) q[(i64)t * rows0 + r] = v;
    else kv_store(&kc[sl * rows1 + r], v);
}

// Causal attention of token t, head h over positions 0..pos[t] of its sequence, K/V read through the block
// table tables[table_off[t]..]. out is [n_tok][n_heads*hd]. Grid: n_tok*n_heads blocks of WARPS warps, one block
// per (t, h); warp w takes the chunks of 32 keys w, w + WARPS, ... (one key per lane for the scores, then for the
// values 16-byte pieces of several keys per pass) with its own online softmax (running max and sum); the warps'
// partial results are combined through shared memory at the end.
template <typename KV>
__device__ void attention_impl(const float* __restrict__ q, const KV* __restrict__ kc, const KV* __restrict__ vc,
                               float* __restrict__ out, const int* __restrict__ pos,
                               const int* __restrict__ table_off, const int* __restrict__ tables, int n_tok,
                               int n_heads, int n_kv, int hd, int bs, float scale) {
    __shared__ float qsh[MAX_HEAD_DIM];
    __shared__ float part_max[WARPS];
    __shared__ float part_sum[WARPS];
    __shared__ float part_acc[WARPS][MAX_HEAD_DIM];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int idx = blockIdx.x;
    if (idx >= n_tok * n_heads) return;
    int t = idx / n_heads, h = idx % n_heads;
    int qd = n_heads * hd, kvd = n_kv * hd;
    int koff = (h / (n_heads / n_kv)) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qsh[d] = q[(i64)t * qd + h * hd + d];
    __syncthreads();
    const int* tab = tables + table_off[t];
    int last = pos[t];
    float run_max = __int_as_float(0xff800000);  // -inf
    float run_sum = 0.0f;
    // Values: with hd a multiple of 8, lane (kg, sub) = (lane / G, lane % G) accumulates elements 8 sub .. 8 sub + 7
    // of keys kg, kg + KPP, ... (G = hd / 8 lanes cover a key's row, KPP = 32 / G keys per pass; acc[0..8]); else
    // lane l accumulates elements l, l + 32, ... of every key (acc[i]: element l + 32 i).
    static_assert(HD_PER_LANE >= 8, "acc holds a lane's 8-element piece");
    const bool pieces = hd % 8 == 0;
    constexpr int PIECES = pieces_per_group<KV>();
    const int G = pieces ? hd / 8 : 32, KPP = 32 / G, kg = lane / G, sub = lane % G;
    float acc[HD_PER_LANE];
#pragma unroll
    for (int i = 0; i < HD_PER_LANE; i++) acc[i] = 0.0f;
    for (int p0 = warp * 32; p0 <= last; p0 += 32 * WARPS) {
        int p = p0 + lane;
        float sc = __int_as_float(0xff800000);
        int sl = 0;
        if (p <= last) {
            sl = tab[p / bs] * bs + p % bs;
            const KV* kr = kc + (i64)sl * kvd + koff;
            float s = 0.0f;
            if (hd % 8 == 0) {
                // Each lane reads its own key's row in 16-byte pieces (aligned: kv_dim and the head offset are
                // multiples of 8 elements), PIECES loads issued before the first is used.
                for (int d0 = 0; d0 < hd; d0 += 8 * PIECES) {
                    Piece<KV> pk[PIECES];
#pragma unroll
                    for (int u = 0; u < PIECES; u++)
                        if (d0 + 8 * u < hd) piece_load(kr + d0 + 8 * u, pk[u]);
#pragma unroll
                    for (int u = 0; u < PIECES; u++) {
                        if (d0 + 8 * u < hd) {
                            float kv[8];
                            piece_unpack(pk[u], kv);
#pragma unroll
                            for (int e = 0; e < 8; e++) s = fmaf(qsh[d0 + 8 * u + e], kv[e], s);
                        }
                    }
                }
            } else {
                for (int d = 0; d < hd; d++) s = fmaf(qsh[d], kv_load(&kr[d]), s);
            }
            sc = s * scale;
        }
        float new_max = fmaxf(run_max, warp_max(sc));
        float r = expf(run_max - new_max);
        float w = p <= last ? expf(sc - new_max) : 0.0f;
        run_sum = run_sum * r + warp_sum(w);
#pragma unroll
        for (int i = 0; i < HD_PER_LANE; i++) acc[i] *= r;
        int n = min(32, last - p0 + 1);
        // The chunk's values; each key's weight and slot come from the lane that scored it.
        if (pieces) {
            // KPP keys per pass, each lane one 16-byte piece (8 elements) of one key; PIECES passes' loads issued
            // before the first is used (hd 64: the chunk's 32 keys in one group of 8 passes).
            for (int g0 = 0; g0 < n; g0 += KPP * PIECES) {
                Piece<KV> pv[PIECES];
                float wv[PIECES];
#pragma unroll
                for (int u = 0; u < PIECES; u++) {
                    int j = g0 + u * KPP + kg;
                    float wj = __shfl_sync(0xffffffffu, w, j & 31);
                    int slj = __shfl_sync(0xffffffffu, sl, j & 31);
                    bool live_key = kg < KPP && j < n;
                    wv[u] = live_key ? wj : 0.0f;
                    if (live_key) piece_load(vc + (i64)slj * kvd + koff + 8 * sub, pv[u]);
                }
#pragma unroll
                for (int u = 0; u < PIECES; u++) {
                    if (kg < KPP && g0 + u * KPP + kg < n) {
                        float v8[8];
                        piece_unpack(pv[u], v8);
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[e] = fmaf(wv[u], v8[e], acc[e]);
                    }
                }
            }
        } else {
#pragma unroll 8
            for (int j = 0; j < n; j++) {
                float wj = __shfl_sync(0xffffffffu, w, j);
                int slj = __shfl_sync(0xffffffffu, sl, j);
                const KV* vr = vc + (i64)slj * kvd + koff;
#pragma unroll
                for (int i = 0; i < HD_PER_LANE; i++) {
                    int d = lane + 32 * i;
                    if (d < hd) acc[i] = fmaf(wj, kv_load(&vr[d]), acc[i]);
                }
            }
        }
        run_max = new_max;
    }
    // Combine the warps: rescale each one's sums to the common maximum (a warp that saw no key has max -inf
    // and contributes nothing; warp 0 always sees key 0).
    if (lane == 0) {
        part_max[warp] = run_max;
        part_sum[warp] = run_sum;
    }
    if (pieces) {
        // Add the key groups' sums into group 0 (lanes 0..G-1), which holds the warp's row.
        for (int k = 1; k < KPP; k++) {
#pragma unroll
            for (int u = 0; u < 8; u++) {
                float o = __shfl_sync(0xffffffffu, acc[u], (lane + k * G) & 31);
                if (kg == 0) acc[u] += o;
            }
        }
        if (kg == 0) {
#pragma unroll
            for (int u = 0; u < 8; u++) part_acc[warp][8 * sub + u] = acc[u];
        }
    } else {
#pragma unroll
        for (int i = 0; i < HD_PER_LANE; i++) {
            int d = lane + 32 * i;
            if (d < hd) part_acc[warp][d] = acc[i];
        }
    }
    __syncthreads();
    if (warp != 0) return;
    float mx = part_max[0];
    for (int w = 1; w < WARPS; w++) mx = fmaxf(mx, part_max[w]);
    float f[WARPS];
    float sum = 0.0f;
    for (int w = 0; w < WARPS; w++) {
        f[w] = expf(part_max[w] - mx);
        sum += part_sum[w] * f[w];
    }
    float inv = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < HD_PER_LANE; i++) {
        int d = lane + 32 * i;
        if (d < hd) {
            float o = 0.0f;
            for (int w = 0; w < WARPS; w++) o = fmaf(part_acc[w][d], f[w], o);
            out[(i64)t * qd + h * hd + d] = o * inv;
        }
    }
}

#define INSTANTIATE_KV(NAME, KV)                                                                                \
    extern "C" __global__ void rope_kv_##NAME(float* q, float* k, const float* v, KV* kc, KV* vc,              \
                                              const int* pos, const int* slot, const float* inv_freq,          \
                                              int n_heads, int n_kv, int hd) {                                  \
        rope_kv_impl<KV>(q, k, v, kc, vc, pos, slot, inv_freq, n_heads, n_kv, hd);                              \
    }                                                                                                           \
    extern "C" __global__ void attention_##NAME(const float* q, const KV* kc, const KV* vc, float* out,        \
                                                const int* pos, const int* table_off, const int* tables,       \
                                                int n_tok, int n_heads, int n_kv, int hd, int bs,              \
                                                float scale) {                                                  \
        attention_impl<KV>(q, kc, vc, out, pos, table_off, tables, n_tok, n_heads, n_kv, hd, bs, scale);        \
    }

INSTANTIATE_KV(f32, float)
INSTANTIATE_KV(f16, unsigned short)

#define INSTANTIATE_QKV(NAME, TY, KVNAME, KV)                                                                   \
    extern "C" __global__ void qkv_rope_##NAME##_##KVNAME(                                                      \
        const float* f0, const float* d0, const float* m0, const unsigned char* q0, const float* f1,            \
        const float* d1, const float* m1, const unsigned char* q1, const float* f2, const float* d2,            \
        const float* m2, const unsigned char* q2, int rows0, int rows1, int rows2, int cols, const float* x,   \
        const float* nw, float eps, int n_tok, float* q, KV* kc, KV* vc, const int* pos, const int* slot,      \
        const float* inv_freq, int hd) {                                                                        \
        qkv_rope_impl<TY, KV>(f0, d0, m0, q0, f1, d1, m1, q1, f2, d2, m2, q2, rows0, rows1, rows2, cols, x, nw, \
                              eps, n_tok, q, kc, vc, pos, slot, inv_freq, hd);                                 \
    }

INSTANTIATE_QKV(f32, TY_F32, f32, float)
INSTANTIATE_QKV(f32, TY_F32, f16, unsigned short)
INSTANTIATE_QKV(q8_0, TY_Q8_0, f32, float)
INSTANTIATE_QKV(q8_0, TY_Q8_0, f16, unsigned short)
INSTANTIATE_QKV(q4_0, TY_Q4_0, f32, float)
INSTANTIATE_QKV(q4_0, TY_Q4_0, f16, unsigned short)
INSTANTIATE_QKV(q4_1, TY_Q4_1, f32, float)
INSTANTIATE_QKV(q4_1, TY_Q4_1, f16, unsigned short)

