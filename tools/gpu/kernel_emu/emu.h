// A minimal CUDA-on-CPU emulator for checking llmserve's kernels without a GPU. Each CUDA thread of a block is a
// fiber (its own stack and registers) on the calling OS thread; the block's fibers run one after another, each until
// it waits at a barrier (or finishes), so a barrier is a switch to the next fiber, not an OS wake-up (about 20 ns
// instead of microseconds: the sampling kernel's thousands of barriers per row stay affordable). Blocks run one at
// a time (so `__shared__` can be a static); warp shuffles, votes and __syncwarp are barriers among the 32 threads of
// a warp, __syncthreads a barrier of the block. Enough for kernels whose early returns are whole warps, or come after
// the block's last barrier (as llmserve's do). Races between barriers go unseen (a fiber runs alone until it waits).
// The tensor-core instruction the prefill kernels use (mma.sync m16n8k16, f16 inputs, f32 accumulation) is
// emulated from the PTX ISA's fragment layout (emu_mma_m16n8k16). x86-64 only (the context switch). Used by
// inference/tests/cuda_kernels_emulated.rs.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>
#include <algorithm>
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct float4 { float x, y, z, w; };
struct int4 { int x, y, z, w; };
// The running fiber's CUDA thread (set by the scheduler before it switches to the fiber).
static dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static int emu_lane, emu_warp;

// Saves the callee-saved registers on the current stack, stores the stack pointer in *from, and continues on the
// stack `to` (saved the same way, or prepared by emu_fiber_stack).
extern "C" void emu_switch(void** from, void* to);
asm(R"(
.text
.globl emu_switch
.type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
)");

struct EmuFiber {
    void* sp = nullptr;
    std::unique_ptr<char[]> stack;
    bool done = false;
    int phase = 0;           // which half of the shuffle buffer its next exchange uses
    unsigned wait_gen = 0;   // the generation of the barrier it waits at
    unsigned* wait_on = nullptr;
};
struct EmuBarrier {
    unsigned count = 0, arrived = 0, gen = 0;
};
static std::vector<EmuFiber> emu_fibers;
static std::vector<EmuBarrier> emu_warp_bars;
static EmuBarrier emu_block_bar;
static void* emu_sched_sp;
static int emu_cur;
static std::function<void()> emu_kernel;
static const size_t EMU_STACK = 256 * 1024;

// Back to the scheduler (the fiber resumes here).
static inline void emu_yield() { emu_switch(&emu_fibers[emu_cur].sp, emu_sched_sp); }
static inline void emu_wait(EmuBarrier& b) {
    unsigned gen = b.gen;
    if (++b.arrived == b.count) {
        b.arrived = 0;
        b.gen++;
        return;
    }
    EmuFiber& f = emu_fibers[emu_cur];
    f.wait_on = &b.gen;
    f.wait_gen = gen;
    while (b.gen == gen) emu_yield();
    emu_fibers[emu_cur].wait_on = nullptr;
}
static void emu_fiber_main() {
    emu_kernel();
    emu_fibers[emu_cur].done = true;
    emu_yield();
    std::abort();  // a finished fiber is never resumed
}
// A fresh stack whose first switch enters emu_fiber_main (with the stack aligned as after a call).
static void* emu_fiber_stack(char* base) {
    uintptr_t top = ((uintptr_t)(base + EMU_STACK)) & ~(uintptr_t)15;
    void** sp = (void**)top;
    *--sp = nullptr;                       // alignment: emu_fiber_main starts with rsp % 16 == 8
    *--sp = (void*)&emu_fiber_main;        // `ret` target
    for (int i = 0; i < 6; i++) *--sp = nullptr;  // rbp rbx r12 r13 r14 r15
    --sp;
    unsigned csr[2];
    __asm__ volatile("stmxcsr %0" : "=m"(csr[0]));
    __asm__ volatile("fnstcw %0" : "=m"(*(unsigned short*)&csr[1]));
    std::memcpy(sp, csr, 8);
    return sp;
}
// Double-buffered per warp: a lane can be one exchange ahead of the others without overwriting what they read.
static float shfl_buf[2][64][32];
#define emu_phase (emu_fibers[emu_cur].phase)
#define __global__
#define __launch_bounds__(...)
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
// Every lane publishes v, then reads lane src's (src < 0 or > 31: its own).
static inline float emu_exchange(float v, int src) {
    float (&buf)[32] = shfl_buf[emu_phase][emu_warp];
    emu_phase ^= 1;
    buf[emu_lane] = v; emu_wait(emu_warp_bars[emu_warp]);
    return src >= 0 && src < 32 ? buf[src] : v;
}
static inline float __shfl_xor_sync(unsigned, float v, int o) { return emu_exchange(v, emu_lane ^ o); }
static inline float __shfl_sync(unsigned, float v, int src) { return emu_exchange(v, src & 31); }
static inline float __shfl_up_sync(unsigned, float v, unsigned d) { return emu_exchange(v, emu_lane - (int)d); }
static inline int __shfl_up_sync(unsigned mask, int v, unsigned d) {
    float f; std::memcpy(&f, &v, 4); f = __shfl_up_sync(mask, f, d); int r; std::memcpy(&r, &f, 4); return r;
}
static inline unsigned __ballot_sync(unsigned, int pred) {
    float (&buf)[32] = shfl_buf[emu_phase][emu_warp];
    emu_phase ^= 1;
    buf[emu_lane] = pred ? 1.0f : 0.0f; emu_wait(emu_warp_bars[emu_warp]);
    unsigned bits = 0;
    for (int l = 0; l < 32; l++) if (buf[l] != 0.0f) bits |= 1u << l;
    return bits;
}
static inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline int __shfl_sync(unsigned mask, int v, int src) {
    float f; std::memcpy(&f, &v, 4); f = __shfl_sync(mask, f, src); int r; std::memcpy(&r, &f, 4); return r;
}
static inline int __shfl_xor_sync(unsigned mask, int v, int o) {
    float f; std::memcpy(&f, &v, 4); f = __shfl_xor_sync(mask, f, o); int r; std::memcpy(&r, &f, 4); return r;
}
static inline void __syncwarp() { emu_wait(emu_warp_bars[emu_warp]); }
static inline void __syncthreads() { emu_wait(emu_block_bar); }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __int_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
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
// Runs f as every thread of every block of the grid: the block's fibers round-robin until all are done.
template <typename F>
void launch(dim3 grid, dim3 block, F f) {
    gridDim = grid; blockDim = block;
    int nt = block.x, nw = (nt + 31) / 32;
    emu_fibers.resize(nt);
    for (auto& fb : emu_fibers) if (!fb.stack) fb.stack.reset(new char[EMU_STACK]);
    emu_warp_bars.assign(nw, EmuBarrier{});
    for (int w = 0; w < nw; w++) emu_warp_bars[w].count = std::min(32, nt - 32 * w);
    emu_block_bar = EmuBarrier{};
    emu_block_bar.count = nt;
    emu_kernel = f;
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            blockIdx.x = bx; blockIdx.y = by;
            for (int t = 0; t < nt; t++) {
                EmuFiber& fb = emu_fibers[t];
                fb.sp = emu_fiber_stack(fb.stack.get());
                fb.done = false; fb.phase = 0; fb.wait_on = nullptr;
            }
            for (int left = nt; left > 0;) {
                int progressed = 0;
                for (int t = 0; t < nt; t++) {
                    EmuFiber& fb = emu_fibers[t];
                    if (fb.done || (fb.wait_on && *fb.wait_on == fb.wait_gen)) continue;
                    emu_cur = t; threadIdx.x = t; emu_lane = t % 32; emu_warp = t / 32;
                    emu_switch(&emu_sched_sp, fb.sp);
                    progressed++;
                    if (fb.done) left--;
                }
                if (!progressed) { fprintf(stderr, "emulator: every thread waits at a barrier (deadlock)\n"); std::abort(); }
            }
        }
}

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 for the calling warp: every lane hands in its fragments (PTX ISA,
// "Matrix Fragments for mma.m16n8k16 with floating point type": groupID g = lane / 4, threadID_in_group t = lane % 4;
// A (16x16): a0,a1 = A[g][2t, 2t+1], a2,a3 = A[g+8][2t, 2t+1], a4,a5 = A[g][2t+8, 2t+9], a6,a7 = A[g+8][2t+8, 2t+9],
// two f16 per 32-bit register, the lower element in the lower half; B (16x8): b0,b1 = B[2t, 2t+1][g],
// b2,b3 = B[2t+8, 2t+9][g]; C/D (16x8, f32): c0,c1 = C[g][2t, 2t+1], c2,c3 = C[g+8][2t, 2t+1]), and gets its part
// of D = A B + C. The products are summed in double and rounded once (the hardware's f32 accumulation may differ in
// the last bits).
static unsigned emu_mma_a[2][64][32][4], emu_mma_b[2][64][32][2];
static inline void emu_mma_m16n8k16(float* d, const unsigned* a, const unsigned* b) {
    int ph = emu_phase;
    emu_phase ^= 1;
    for (int i = 0; i < 4; i++) emu_mma_a[ph][emu_warp][emu_lane][i] = a[i];
    for (int i = 0; i < 2; i++) emu_mma_b[ph][emu_warp][emu_lane][i] = b[i];
    emu_wait(emu_warp_bars[emu_warp]);
    float A[16][16], B[16][8];
    auto half = [](unsigned r, int hi) { return emu_f16_to_f32((unsigned short)(hi ? r >> 16 : r & 0xffff)); };
    for (int l = 0; l < 32; l++) {
        int g = l / 4, t = l % 4;
        const unsigned* ra = emu_mma_a[ph][emu_warp][l];
        const unsigned* rb = emu_mma_b[ph][emu_warp][l];
        for (int e = 0; e < 2; e++) {
            A[g][2 * t + e] = half(ra[0], e);
            A[g + 8][2 * t + e] = half(ra[1], e);
            A[g][2 * t + 8 + e] = half(ra[2], e);
            A[g + 8][2 * t + 8 + e] = half(ra[3], e);
            B[2 * t + e][g] = half(rb[0], e);
            B[2 * t + 8 + e][g] = half(rb[1], e);
        }
    }
    int g = emu_lane / 4, t = emu_lane % 4;
    for (int e = 0; e < 4; e++) {
        int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
        double s = d[e];
        for (int k = 0; k < 16; k++) s += (double)A[row][k] * B[k][col];
        d[e] = (float)s;
    }
}
