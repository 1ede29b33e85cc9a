// A minimal CUDA-on-CPU-threads emulator for checking llmserve's kernels without a GPU: one std::thread per CUDA
// thread, blocks run one at a time (so `__shared__` can be a static), warp shuffles and __syncwarp are barriers
// among the 32 threads of a warp, __syncthreads a barrier of the block. Enough for kernels whose early returns are
// whole warps (as llmserve's are). Used by inference/tests/cuda_kernels_emulated.rs.
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
#include <algorithm>
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct float4 { float x, y, z, w; };
struct int4 { int x, y, z, w; };
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
thread_local int emu_lane, emu_warp;
static std::vector<std::unique_ptr<std::barrier<>>> warp_bars;
static std::unique_ptr<std::barrier<>> block_bar;
static float shfl_buf[64][32];
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
static inline float __shfl_xor_sync(unsigned, float v, int o) {
    shfl_buf[emu_warp][emu_lane] = v; warp_bars[emu_warp]->arrive_and_wait();
    float r = shfl_buf[emu_warp][emu_lane ^ o]; warp_bars[emu_warp]->arrive_and_wait(); return r;
}
static inline float __shfl_sync(unsigned, float v, int src) {
    shfl_buf[emu_warp][emu_lane] = v; warp_bars[emu_warp]->arrive_and_wait();
    float r = shfl_buf[emu_warp][src]; warp_bars[emu_warp]->arrive_and_wait(); return r;
}
static inline int __shfl_sync(unsigned mask, int v, int src) {
    float f; std::memcpy(&f, &v, 4); f = __shfl_sync(mask, f, src); int r; std::memcpy(&r, &f, 4); return r;
}
static inline int __shfl_xor_sync(unsigned mask, int v, int o) {
    float f; std::memcpy(&f, &v, 4); f = __shfl_xor_sync(mask, f, o); int r; std::memcpy(&r, &f, 4); return r;
}
static inline void __syncwarp() { warp_bars[emu_warp]->arrive_and_wait(); }
static inline void __syncthreads() { block_bar->arrive_and_wait(); }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __int_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
using std::min;
// IEEE half conversions (round to nearest even), as the PTX `cvt.rn.f16.f32` / `cvt.f32.f16` the kernels use on a GPU.
static inline unsigned short emu_f32_to_f16(float f) {
    unsigned x; std::memcpy(&x, &f, 4);
    unsigned sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, man = x & 0x7fffff;
    if (exp == 0xff) return sign | 0x7c00 | (man ? 0x200 : 0);
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f) return sign | 0x7c00;
    if (e <= 0) {
        if (e < -10) return sign;
        man |= 0x800000;
        int shift = 14 - e;
        unsigned h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return sign | h;
    }
    unsigned h = ((unsigned)e << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return sign | h;
}
static inline float emu_f16_to_f32(unsigned short h) {
    unsigned sign = (unsigned)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, x;
    if (exp == 0x1f) x = sign | 0x7f800000 | (man << 13);
    else if (exp == 0) { float f = std::ldexp((float)man, -24); std::memcpy(&x, &f, 4); x |= sign; }
    else x = sign | ((exp + 112) << 23) | (man << 13);
    float f; std::memcpy(&f, &x, 4); return f;
}
template <typename F>
void launch(dim3 grid, dim3 block, F f) {
    gridDim = grid; blockDim = block;
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            int nw = (block.x + 31) / 32;
            warp_bars.clear();
            for (int w = 0; w < nw; w++) warp_bars.emplace_back(new std::barrier<>(std::min(32u, block.x - 32 * w)));
            block_bar.reset(new std::barrier<>(block.x));
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < block.x; t++)
                ts.emplace_back([=] {
                    threadIdx.x = t; blockIdx.x = bx; blockIdx.y = by; emu_lane = t % 32; emu_warp = t / 32; f();
                });
            for (auto& t : ts) t.join();
        }
}
