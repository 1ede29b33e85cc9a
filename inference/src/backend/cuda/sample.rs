//! Sampling on the device: the `sample_rows` kernel (CUDA source, part of [`super::kernels::kernel_source`]), the
//! parameter words each logit row carries in a step's index buffer, and the log-probability words the kernel
//! writes back.
//!
//! Owns the device side of [`crate::sampling`]'s rule: one block per logit row, every row of a step in one launch
//! at its end (inside the decode graphs: the rows' parameters and token histories are part of the packed index
//! arrays uploaded before each replay, like the block tables). Greedy rows (mode 0) take the argmax with the
//! host's rules (NaN ignored, ties to the lowest index); sampled rows (mode 1) apply the penalties in place (and
//! restore the raw logits at the end), draw the Philox uniform of (seed, output index), find the `top_k` /
//! `top_p` thresholds without sorting the vocabulary, and walk the kept weights in vocabulary order. Every sum
//! and comparison runs in an order fixed by the block's shape, so a row's token depends only on its logits and
//! parameters: the same on every run and in every batch.
//!
//! The thresholds: one pass counts and weighs the weights at or above a ladder of [`SAMPLE_LEVELS`] powers of
//! two; the highest level holding the top-k set (k weights) or, for top-p alone, the nucleus (its mass) bounds
//! the candidates; when at most [`SAMPLE_CAND`] weights lie above it they are gathered into shared memory and
//! sorted (bitonic), which gives the thresholds exactly; otherwise more passes split the remaining range of
//! weights (as 32-bit keys) [`SAMPLE_LEVELS`] + 1 ways until the candidates fit or the boundary is one key.
//! Never launched by this module (that is [`super::forward`]).

use crate::backend::Logits;
use crate::sampling::{MAX_TOP_LOGPROBS, PenaltyEntry, SampleSpec, TokenLogprobs};

/// Threads per block of `sample_rows` (one block per logit row).
pub const SAMPLE_THREADS: usize = 1024;

/// Parameter words per logit row ([`push_row`]).
pub const SAMPLE_WORDS: usize = 16;

/// Most candidate weights gathered and sorted in shared memory (a power of two).
pub const SAMPLE_CAND: usize = 2048;

/// Thresholds counted per pass over a row.
pub const SAMPLE_LEVELS: usize = 8;

/// Words per row of the log-probability output: the chosen token's, the count `n`, `n` ids, `n` values.
pub const LOGPROB_WORDS: usize = 2 + 2 * MAX_TOP_LOGPROBS;

/// Word indices of a row's parameters (the kernel's `SP_*`).
mod word {
    pub const MODE: usize = 0;
    pub const TEMPERATURE: usize = 1;
    pub const TOP_P: usize = 2;
    pub const TOP_K: usize = 3;
    pub const MIN_P: usize = 4;
    pub const PRESENCE: usize = 5;
    pub const FREQUENCY: usize = 6;
    pub const REPETITION: usize = 7;
    pub const SEED_LO: usize = 8;
    pub const SEED_HI: usize = 9;
    pub const INDEX_LO: usize = 10;
    pub const INDEX_HI: usize = 11;
    pub const HIST_OFF: usize = 12;
    pub const HIST_LEN: usize = 13;
    pub const LOGPROBS: usize = 14;
}

/// Appends the parameter words of one logit row to `params` (and, for a sampled row with penalties, its token
/// history to `history`, two words per entry: token, [`PenaltyEntry::word`]). Rows that are not
/// [`Logits::Sample`] take the argmax (mode 0).
pub fn push_row(logits: &Logits<'_>, params: &mut Vec<i32>, history: &mut Vec<i32>) {
    let mut w = [0i32; SAMPLE_WORDS];
    w[word::LOGPROBS] = -1;
    if let Logits::Sample(s) = logits {
        fill(&mut w, s, history);
    }
    params.extend_from_slice(&w);
}

fn fill(w: &mut [i32; SAMPLE_WORDS], s: &SampleSpec<'_>, history: &mut Vec<i32>) {
    let p = &s.params;
    let f = |x: f32| x.to_bits() as i32;
    w[word::MODE] = 1;
    w[word::TEMPERATURE] = f(p.temperature);
    w[word::TOP_P] = f(p.top_p);
    w[word::TOP_K] = p.top_k.min(i32::MAX as u32) as i32;
    w[word::MIN_P] = f(p.min_p);
    w[word::PRESENCE] = f(p.presence_penalty);
    w[word::FREQUENCY] = f(p.frequency_penalty);
    w[word::REPETITION] = f(p.repetition_penalty);
    w[word::SEED_LO] = s.seed as u32 as i32;
    w[word::SEED_HI] = (s.seed >> 32) as u32 as i32;
    w[word::INDEX_LO] = s.index as u32 as i32;
    w[word::INDEX_HI] = (s.index >> 32) as u32 as i32;
    w[word::LOGPROBS] = s.logprobs.map_or(-1, i32::from);
    if p.has_penalties() {
        w[word::HIST_OFF] = (history.len() / 2) as i32;
        w[word::HIST_LEN] = s.history.len() as i32;
        for &PenaltyEntry { token, word } in s.history {
            history.extend_from_slice(&[token as i32, word as i32]);
        }
    }
}

/// The log-probabilities in one row of the kernel's output (`LOGPROB_WORDS` words).
pub fn read_logprobs(words: &[i32]) -> TokenLogprobs {
    let f = |w: i32| f32::from_bits(w as u32);
    let n = (words.get(1).copied().unwrap_or(0).max(0) as usize).min(MAX_TOP_LOGPROBS);
    TokenLogprobs {
        logprob: words.first().map_or(f32::NEG_INFINITY, |&w| f(w)),
        top: (0..n)
            .map(|i| (words[2 + i] as u32, f(words[2 + MAX_TOP_LOGPROBS + i])))
            .collect(),
    }
}

/// The kernel's source with the constants filled in (appended to the forward pass's source).
pub fn source() -> String {
    SOURCE
        .replace("@SAMPLE_WORDS@", &SAMPLE_WORDS.to_string())
        .replace("@SAMPLE_THREADS@", &SAMPLE_THREADS.to_string())
        .replace("@SAMPLE_CAND@", &SAMPLE_CAND.to_string())
        .replace("@SAMPLE_LEVELS@", &SAMPLE_LEVELS.to_string())
        .replace("@MAX_TOP_LOGPROBS@", &MAX_TOP_LOGPROBS.to_string())
        .replace("@SP_MODE@", &word::MODE.to_string())
        .replace("@SP_TEMPERATURE@", &word::TEMPERATURE.to_string())
        .replace("@SP_TOP_P@", &word::TOP_P.to_string())
        .replace("@SP_TOP_K@", &word::TOP_K.to_string())
        .replace("@SP_MIN_P@", &word::MIN_P.to_string())
        .replace("@SP_PRESENCE@", &word::PRESENCE.to_string())
        .replace("@SP_FREQUENCY@", &word::FREQUENCY.to_string())
        .replace("@SP_REPETITION@", &word::REPETITION.to_string())
        .replace("@SP_SEED_LO@", &word::SEED_LO.to_string())
        .replace("@SP_SEED_HI@", &word::SEED_HI.to_string())
        .replace("@SP_INDEX_LO@", &word::INDEX_LO.to_string())
        .replace("@SP_INDEX_HI@", &word::INDEX_HI.to_string())
        .replace("@SP_HIST_OFF@", &word::HIST_OFF.to_string())
        .replace("@SP_HIST_LEN@", &word::HIST_LEN.to_string())
        .replace("@SP_LOGPROBS@", &word::LOGPROBS.to_string())
        .replace("@IN_PROMPT@", &format!("0x{:x}u", PenaltyEntry::IN_PROMPT))
}

const SOURCE: &str = r#"
// ---- Sampling on the device (inference/src/backend/cuda/sample.rs): the rule of inference/src/sampling.rs ----
#define SAMPLE_WORDS @SAMPLE_WORDS@
#define SAMPLE_THREADS @SAMPLE_THREADS@
#define SAMPLE_CAND @SAMPLE_CAND@
#define SAMPLE_LEVELS @SAMPLE_LEVELS@
#define MAX_TOP_LOGPROBS @MAX_TOP_LOGPROBS@
#define SP_MODE @SP_MODE@
#define SP_TEMPERATURE @SP_TEMPERATURE@
#define SP_TOP_P @SP_TOP_P@
#define SP_TOP_K @SP_TOP_K@
#define SP_MIN_P @SP_MIN_P@
#define SP_PRESENCE @SP_PRESENCE@
#define SP_FREQUENCY @SP_FREQUENCY@
#define SP_REPETITION @SP_REPETITION@
#define SP_SEED_LO @SP_SEED_LO@
#define SP_SEED_HI @SP_SEED_HI@
#define SP_INDEX_LO @SP_INDEX_LO@
#define SP_INDEX_HI @SP_INDEX_HI@
#define SP_HIST_OFF @SP_HIST_OFF@
#define SP_HIST_LEN @SP_HIST_LEN@
#define SP_LOGPROBS @SP_LOGPROBS@
#define HIST_IN_PROMPT @IN_PROMPT@
#define LOGPROB_WORDS (2 + 2 * MAX_TOP_LOGPROBS)
#define KEY_ONE 0x3f800000u
#define NO_INDEX 0x7fffffff

__device__ __forceinline__ float bits_f(int w) { return __int_as_float(w); }
__device__ __forceinline__ unsigned key_of(float w) { return (unsigned)__float_as_int(w); }
__device__ __forceinline__ float of_key(unsigned k) { return __int_as_float((int)k); }
__device__ __forceinline__ bool finite_f(float x) { return fabsf(x) <= 3.402823466e38f; }

// Philox4x32-10 (Salmon et al., SC 2011), as sampling::philox4x32_10: counter c, key (k0, k1).
__device__ __forceinline__ void philox(unsigned* c, unsigned k0, unsigned k1) {
#pragma unroll
    for (int round = 0; round < 10; round++) {
        if (round) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        unsigned long long p0 = 0xD2511F53ull * c[0], p1 = 0xCD9E8D57ull * c[2];
        unsigned n0 = (unsigned)(p1 >> 32) ^ c[1] ^ k0, n2 = (unsigned)(p0 >> 32) ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = (unsigned)p1;
        c[2] = n2;
        c[3] = (unsigned)p0;
    }
}

// sampling::uniform: the first Philox word of counter (index, 0, 0) under key seed, top 24 bits.
__device__ __forceinline__ float sample_uniform(unsigned seed_lo, unsigned seed_hi, unsigned idx_lo, unsigned idx_hi) {
    unsigned c[4] = {idx_lo, idx_hi, 0u, 0u};
    philox(c, seed_lo, seed_hi);
    return (float)(c[0] >> 8) * (1.0f / 16777216.0f);
}

// sampling::penalize.
__device__ __forceinline__ float penalize(float l, unsigned word, float pres, float freq, float rep) {
    l = l > 0.0f ? l / rep : l * rep;
    unsigned c = word & ~HIST_IN_PROMPT;
    l -= freq * (float)c;
    if (c > 0u) l -= pres;
    return l;
}

// A token's weight exp((l - max) / T), 0 below min_p (and for NaN and -inf logits).
__device__ __forceinline__ float weight_of(float l, float mx, float inv_t, float min_p) {
    float w = expf((l - mx) * inv_t);
    return w >= min_p && w > 0.0f ? w : 0.0f;
}

template <typename T>
__device__ __forceinline__ T warp_total(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide results every thread gets, in an order fixed by the block's shape: each warp's butterfly, then the
// warps' results one after another, combined by op. red: shared scratch of 32 entries (free again when these return).
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T* red, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    int nw = blockDim.x / 32;
    __syncthreads();
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    T r = red[0];
    for (int w = 1; w < nw; w++) r = op(r, red[w]);
    return r;
}
struct OpAdd {
    template <typename T>
    __device__ T operator()(T a, T b) const { return a + b; }
};
struct OpMin {
    __device__ int operator()(int a, int b) const { return min(a, b); }
};
struct OpMax {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* red) { return block_reduce(v, red, OpAdd()); }
__device__ __forceinline__ int block_min_int(int v, int* red) { return block_reduce(v, red, OpMin()); }
__device__ __forceinline__ float block_max(float v, float* red) { return block_reduce(v, red, OpMax()); }
// The best (value, index) of the block: larger value first, then lower index; NO_INDEX marks "none".
__device__ __forceinline__ void keep_better(float& best, int& bi, float v, int i) {
    if (i != NO_INDEX && (bi == NO_INDEX || v > best || (v == best && i < bi))) {
        best = v;
        bi = i;
    }
}
__device__ __forceinline__ void block_best(float& best, int& bi, float* red_v, int* red_i) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        keep_better(best, bi, ov, oi);
    }
    int nw = blockDim.x / 32;
    __syncthreads();
    if (threadIdx.x % 32 == 0) {
        red_v[threadIdx.x / 32] = best;
        red_i[threadIdx.x / 32] = bi;
    }
    __syncthreads();
    best = red_v[0];
    bi = red_i[0];
    for (int w = 1; w < nw; w++) keep_better(best, bi, red_v[w], red_i[w]);
}
// Exclusive prefix sum of v over the threads of the block, in thread order.
__device__ __forceinline__ float block_excl_scan(float v, float* red) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        float up = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += up;
    }
    __syncthreads();
    if (lane == 31) red[warp] = inc;
    __syncthreads();
    float before = 0.0f;
    for (int w = 0; w < warp; w++) before += red[w];
    return before + inc - v;
}

// Per-row scratch in shared memory.
struct SampleShared {
    float red_f[32];
    int red_i[32];
    unsigned th[SAMPLE_LEVELS];
    int lvl_cnt[SAMPLE_LEVELS];
    float lvl_mass[SAMPLE_LEVELS];
    int warp_cnt[32][SAMPLE_LEVELS + 1];
    float warp_mass[32][SAMPLE_LEVELS + 1];
    int n_cand;
    int result;
    float cand[SAMPLE_CAND];
};

// The count and mass of the row's weights at or above each threshold key sh.th[j] (into sh.lvl_*), and of all
// positive weights (returned). One pass over the row.
__device__ void level_stats(const float* l, int vocab, float mx, float inv_t, float min_p, SampleShared& sh,
                            int& n_pos, float& total) {
    unsigned th[SAMPLE_LEVELS];
    int c[SAMPLE_LEVELS + 1];
    float m[SAMPLE_LEVELS + 1];
#pragma unroll
    for (int j = 0; j < SAMPLE_LEVELS; j++) th[j] = sh.th[j];
#pragma unroll
    for (int j = 0; j <= SAMPLE_LEVELS; j++) {
        c[j] = 0;
        m[j] = 0.0f;
    }
    for (int k = threadIdx.x; k < vocab; k += blockDim.x) {
        float w = weight_of(l[k], mx, inv_t, min_p);
        if (w > 0.0f) {
            unsigned kw = key_of(w);
            c[SAMPLE_LEVELS]++;
            m[SAMPLE_LEVELS] += w;
#pragma unroll
            for (int j = 0; j < SAMPLE_LEVELS; j++) {
                if (kw >= th[j]) {
                    c[j]++;
                    m[j] += w;
                }
            }
        }
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
#pragma unroll
    for (int j = 0; j <= SAMPLE_LEVELS; j++) {
        c[j] = warp_total(c[j]);
        m[j] = warp_sum(m[j]);
    }
    __syncthreads();
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j <= SAMPLE_LEVELS; j++) {
            sh.warp_cnt[warp][j] = c[j];
            sh.warp_mass[warp][j] = m[j];
        }
    }
    __syncthreads();
    if ((int)threadIdx.x < SAMPLE_LEVELS) {
        int j = threadIdx.x, cs = 0;
        float ms = 0.0f;
        for (int w = 0; w < nw; w++) {
            cs += sh.warp_cnt[w][j];
            ms += sh.warp_mass[w][j];
        }
        sh.lvl_cnt[j] = cs;
        sh.lvl_mass[j] = ms;
    }
    n_pos = 0;
    total = 0.0f;
    for (int w = 0; w < nw; w++) {
        n_pos += sh.warp_cnt[w][SAMPLE_LEVELS];
        total += sh.warp_mass[w][SAMPLE_LEVELS];
    }
    __syncthreads();
}

// A candidate bound: every weight at or above key `key` (count `cnt`, mass `mass`) satisfies the search.
struct Floor {
    unsigned key;
    int cnt;
    float mass;
};

// The highest key `lo` (at least `start.key`) whose weights at or above it reach `need` (in count when by_count,
// else in mass), narrowed until at most SAMPLE_CAND weights lie above it or it is the boundary key itself. `start`
// must reach `need`; `ladder`: the first pass's thresholds are already counted in sh (the powers of two).
__device__ Floor find_floor(const float* l, int vocab, float mx, float inv_t, float min_p, bool by_count, float need,
                            Floor start, bool ladder, SampleShared& sh) {
    Floor lo = start;
    unsigned hi = KEY_ONE + 1u;
    for (;;) {
        if (!ladder) {
            if (lo.cnt <= SAMPLE_CAND || hi - lo.key <= 1u) return lo;
            // SAMPLE_LEVELS thresholds evenly between lo and hi (ascending).
            unsigned span = hi - lo.key;
            if ((int)threadIdx.x < SAMPLE_LEVELS) {
                unsigned long long t = (unsigned long long)span * (threadIdx.x + 1) / (SAMPLE_LEVELS + 1);
                sh.th[threadIdx.x] = lo.key + (unsigned)(t > 0 ? t : 1);
            }
            __syncthreads();
            int np;
            float tot;
            level_stats(l, vocab, mx, inv_t, min_p, sh, np, tot);
        }
        ladder = false;
        // Among the thresholds just counted (any order), the highest that reaches need and the lowest above it that
        // does not.
        unsigned next_hi = hi;
        Floor best = lo;
        for (int j = 0; j < SAMPLE_LEVELS; j++) {
            unsigned t = sh.th[j];
            if (t <= lo.key || t >= hi) continue;
            bool ok = by_count ? (float)sh.lvl_cnt[j] >= need : sh.lvl_mass[j] >= need;
            if (ok && t > best.key) {
                best.key = t;
                best.cnt = sh.lvl_cnt[j];
                best.mass = sh.lvl_mass[j];
            }
        }
        for (int j = 0; j < SAMPLE_LEVELS; j++) {
            unsigned t = sh.th[j];
            if (t > best.key && t < next_hi) next_hi = t;
        }
        lo = best;
        hi = next_hi;
        __syncthreads();
    }
}

// The weights at or above key `floor` (and at least `tau`) gathered into sh.cand and sorted descending (bitonic;
// the padding up to a power of two is -1). Returns how many there are (at most SAMPLE_CAND).
__device__ int gather_sorted(const float* l, int vocab, float mx, float inv_t, float min_p, unsigned floor, float tau,
                             SampleShared& sh) {
    if (threadIdx.x == 0) sh.n_cand = 0;
    __syncthreads();
    // One atomic per warp and pass: the warp's candidates take consecutive slots (their order does not matter,
    // they are sorted next).
    int lane = threadIdx.x % 32;
    for (int k0 = 0; k0 < vocab; k0 += blockDim.x) {
        int k = k0 + threadIdx.x;
        float w = k < vocab ? weight_of(l[k], mx, inv_t, min_p) : 0.0f;
        bool take = w > 0.0f && key_of(w) >= floor && w >= tau;
        unsigned m = __ballot_sync(0xffffffffu, take);
        int base = 0;
        if (lane == 0 && m) base = atomicAdd(&sh.n_cand, __popc(m));
        base = __shfl_sync(0xffffffffu, base, 0);
        int at = base + __popc(m & ((1u << lane) - 1u));
        if (take && at < SAMPLE_CAND) sh.cand[at] = w;
    }
    __syncthreads();
    int n = min(sh.n_cand, SAMPLE_CAND);
    int p2 = 1;
    while (p2 < n) p2 <<= 1;
    for (int i = n + threadIdx.x; i < p2; i += blockDim.x) sh.cand[i] = -1.0f;
    __syncthreads();
    for (int size = 2; size <= p2; size <<= 1) {
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < p2; i += blockDim.x) {
                int j = i ^ stride;
                if (j > i) {
                    float a = sh.cand[i], b = sh.cand[j];
                    bool swap = (i & size) == 0 ? a < b : a > b;
                    if (swap) {
                        sh.cand[i] = b;
                        sh.cand[j] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    return n;
}

// Of the n sorted candidates: the sum of the first `end`, and the weight at which their running sum (in order)
// first reaches `target` (the last one's when rounding keeps it below). Each thread sums a contiguous piece.
__device__ float nucleus_cut(SampleShared& sh, int end, float target) {
    int per = (end + (int)blockDim.x - 1) / (int)blockDim.x;
    int b = threadIdx.x * per, e = min(end, b + per);
    float s = 0.0f;
    for (int i = b; i < e; i++) s += sh.cand[i];
    float acc = block_excl_scan(s, sh.red_f);
    int found = NO_INDEX;
    for (int i = b; i < e; i++) {
        acc += sh.cand[i];
        if (acc >= target) {
            found = i;
            break;
        }
    }
    found = block_min_int(found, sh.red_i);
    return sh.cand[found == NO_INDEX ? end - 1 : found];
}
// The sum of the first `end` sorted candidates.
__device__ float cand_sum(SampleShared& sh, int end) {
    int per = (end + (int)blockDim.x - 1) / (int)blockDim.x;
    int b = threadIdx.x * per, e = min(end, b + per);
    float s = 0.0f;
    for (int i = b; i < e; i++) s += sh.cand[i];
    return block_sum(s, sh.red_f);
}

// Step 7 of the rule: the first token in vocabulary order whose running kept weight (w >= tau, w > 0) exceeds
// u times the kept total. Warp w owns a contiguous segment of the row; the warp holding the draw walks it 32
// tokens at a time. `fallback` when nothing is kept.
__device__ int walk(const float* l, int vocab, float mx, float inv_t, float min_p, float tau, float u, int fallback,
                    SampleShared& sh) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    int seg = ((vocab + nw - 1) / nw + 31) / 32 * 32;
    int s0 = warp * seg, s1 = min(vocab, s0 + seg);
    float part = 0.0f;
    for (int k = s0 + lane; k < s1; k += 32) {
        float w = weight_of(l[k], mx, inv_t, min_p);
        part += w >= tau ? w : 0.0f;
    }
    float wsum = warp_sum(part);
    __syncthreads();
    if (lane == 0) sh.red_f[warp] = wsum;
    if (threadIdx.x == 0) sh.result = fallback;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < nw; w++) total += sh.red_f[w];
    if (total > 0.0f) {
        float r = u * total, base = 0.0f;
        int tw = -1, last_pos = -1;
        for (int w = 0; w < nw; w++) {
            if (sh.red_f[w] > 0.0f) last_pos = w;
            if (tw < 0 && r < base + sh.red_f[w]) tw = w;
            if (tw < 0) base += sh.red_f[w];
        }
        if (tw < 0) {
            // Rounding put the draw at the total: the last kept token.
            tw = last_pos;
            base = total;
        }
        if (warp == tw) {
            float rr = r - base;
            int pick = -1, last = -1;
            for (int k0 = s0; k0 < s1 && pick < 0; k0 += 32) {
                int k = k0 + lane;
                float w = k < s1 ? weight_of(l[k], mx, inv_t, min_p) : 0.0f;
                if (w < tau) w = 0.0f;
                float inc = w;
                for (int o = 1; o < 32; o <<= 1) {
                    float up = __shfl_up_sync(0xffffffffu, inc, o);
                    if (lane >= o) inc += up;
                }
                unsigned hit = __ballot_sync(0xffffffffu, w > 0.0f && rr < inc);
                unsigned any = __ballot_sync(0xffffffffu, w > 0.0f);
                if (hit) pick = k0 + __ffs(hit) - 1;
                if (any) last = k0 + 31 - __clz(any);
                rr -= __shfl_sync(0xffffffffu, inc, 31);
            }
            if (lane == 0) sh.result = pick >= 0 ? pick : (last >= 0 ? last : fallback);
        }
    }
    __syncthreads();
    return sh.result;
}

// Steps 3-7 of the rule for a row whose (penalized) maximum is mx at index best: the drawn token.
__device__ int draw(const float* l, int vocab, float mx, int best, float temp, float top_p, int top_k, float min_p,
                    float u, SampleShared& sh) {
    float inv_t = 1.0f / temp;
    min_p = min_p > 0.0f ? min_p : 0.0f;
    // The ladder: weights at or above 2^-1, 2^-3, ..., 2^-(2 SAMPLE_LEVELS - 1).
    if ((int)threadIdx.x < SAMPLE_LEVELS) sh.th[threadIdx.x] = key_of(ldexpf(1.0f, -(2 * (int)threadIdx.x + 1)));
    __syncthreads();
    int n_pos;
    float total;
    level_stats(l, vocab, mx, inv_t, min_p, sh, n_pos, total);
    bool on_k = top_k > 0 && top_k < n_pos;
    bool on_p = top_p > 0.0f && top_p < 1.0f;
    float tau = 0.0f;
    if (on_k || on_p) {
        Floor all = {1u, n_pos, total};
        float mass_s = total, tau_k = 0.0f;
        bool done = false;
        if (on_k) {
            Floor f = find_floor(l, vocab, mx, inv_t, min_p, true, (float)top_k, all, true, sh);
            if (f.cnt <= SAMPLE_CAND) {
                int n = gather_sorted(l, vocab, mx, inv_t, min_p, f.key, 0.0f, sh);
                tau_k = sh.cand[top_k - 1];
                int c = 0;
                for (int i = threadIdx.x; i < n; i += blockDim.x) c += sh.cand[i] >= tau_k;
                int end = block_sum(c, sh.red_i);
                if (on_p) {
                    mass_s = cand_sum(sh, end);
                    float tau_p = nucleus_cut(sh, end, top_p * mass_s);
                    tau = fmaxf(tau_k, tau_p);
                } else {
                    tau = tau_k;
                }
                done = true;
            } else {
                // The k-th largest weight is the boundary key itself.
                tau_k = of_key(f.key);
                mass_s = f.mass;
                all = f;
            }
        }
        if (on_p && !done) {
            float target = top_p * mass_s;
            // Without top-k the ladder's counts start the search; after an exact top-k boundary, that boundary.
            Floor f = find_floor(l, vocab, mx, inv_t, min_p, false, target, all, !on_k, sh);
            float tau_p;
            if (f.cnt <= SAMPLE_CAND) {
                int n = gather_sorted(l, vocab, mx, inv_t, min_p, f.key, tau_k, sh);
                tau_p = nucleus_cut(sh, n, target);
            } else {
                tau_p = of_key(f.key);
            }
            tau = fmaxf(tau_k, tau_p);
        } else if (!done) {
            tau = tau_k;
        }
    }
    return walk(l, vocab, mx, inv_t, min_p, tau, u, best, sh);
}

// Log-probabilities of the raw row: the log-sum-exp (returned) and the n most likely tokens (value descending, id
// ascending; NaN never) into out[1] (count), out[2..] (ids) and out[2 + MAX_TOP_LOGPROBS..] (values).
__device__ float raw_logprobs(const float* l, int vocab, int n, int* out, SampleShared& sh) {
    float mx = __int_as_float(0xff800000);  // -inf: only larger values (never NaN) replace it
    for (int k = threadIdx.x; k < vocab; k += blockDim.x) {
        float v = l[k];
        if (v > mx) mx = v;
    }
    mx = block_max(mx, sh.red_f);
    float lse = mx;
    int count = 0;
    if (finite_f(mx)) {
        float s = 0.0f;
        for (int k = threadIdx.x; k < vocab; k += blockDim.x) {
            float v = l[k];
            if (v == v) s += expf(v - mx);
        }
        lse = mx + logf(block_sum(s, sh.red_f));
        float pv = __int_as_float(0x7f800000);
        int pi = -1;
        for (int i = 0; i < n; i++) {
            float best = 0.0f;
            int bi = NO_INDEX;
            for (int k = threadIdx.x; k < vocab; k += blockDim.x) {
                float v = l[k];
                if (v == v && (v < pv || (v == pv && k > pi))) keep_better(best, bi, v, k);
            }
            block_best(best, bi, sh.red_f, sh.red_i);
            if (bi == NO_INDEX) break;
            if (threadIdx.x == 0) {
                out[2 + i] = bi;
                out[2 + MAX_TOP_LOGPROBS + i] = __float_as_int(best - lse);
            }
            pv = best;
            pi = bi;
            count++;
        }
    }
    if (threadIdx.x == 0) out[1] = count;
    return lse;
}

// The next token of each logit row ([rows][vocab]) into tokens[row], as sampling.rs's rule says for the row's
// parameters (params: [rows][SAMPLE_WORDS]): mode 0 the argmax (NaN ignored, ties to the lowest index, 0 when
// every value is NaN or -inf); mode 1 penalties (history entries hist[2 (off + e)], the raw logits kept in
// hist_raw and put back at the end), temperature, min_p, top_k, top_p and the Philox draw, and with SP_LOGPROBS
// >= 0 the raw log-probabilities into lp_out[row] (LOGPROB_WORDS words). Grid: one block per row; block: a
// multiple of 32 threads (SAMPLE_THREADS on the GPU).
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_rows(float* __restrict__ logits, int vocab, const int* __restrict__ params,
                                       const int* __restrict__ hist, float* __restrict__ hist_raw,
                                       int* __restrict__ tokens, int* __restrict__ lp_out) {
    __shared__ SampleShared sh;
    const int row = blockIdx.x;
    float* l = logits + (i64)row * vocab;
    const int* pr = params + (i64)row * SAMPLE_WORDS;
    const int mode = pr[SP_MODE];
    const int n_lp = mode ? pr[SP_LOGPROBS] : -1;
    int* lp = lp_out + (i64)row * LOGPROB_WORDS;
    float lse = 0.0f;
    if (n_lp >= 0) lse = raw_logprobs(l, vocab, min(n_lp, MAX_TOP_LOGPROBS), lp, sh);
    const float pres = bits_f(pr[SP_PRESENCE]), freq = bits_f(pr[SP_FREQUENCY]), rep = bits_f(pr[SP_REPETITION]);
    const bool pen = mode && (pres != 0.0f || freq != 0.0f || rep != 1.0f);
    const int h_off = pr[SP_HIST_OFF], h_len = pen ? pr[SP_HIST_LEN] : 0;
    if (pen) {
        __syncthreads();
        for (int e = threadIdx.x; e < h_len; e += blockDim.x) {
            int tok = hist[2 * (i64)(h_off + e)];
            unsigned word = (unsigned)hist[2 * (i64)(h_off + e) + 1];
            if ((unsigned)tok < (unsigned)vocab) {
                float raw = l[tok];
                hist_raw[h_off + e] = raw;
                l[tok] = penalize(raw, word, pres, freq, rep);
            }
        }
        __syncthreads();
    }
    float best = __int_as_float(0xff800000);
    int bi = NO_INDEX;
    for (int k = threadIdx.x; k < vocab; k += blockDim.x) {
        float v = l[k];
        if (v > best) {
            best = v;
            bi = k;
        }
    }
    block_best(best, bi, sh.red_f, sh.red_i);
    int token = bi == NO_INDEX ? 0 : bi;
    const float temp = bits_f(pr[SP_TEMPERATURE]);
    if (mode && temp > 0.0f && finite_f(temp) && bi != NO_INDEX && finite_f(best)) {
        float u = sample_uniform((unsigned)pr[SP_SEED_LO], (unsigned)pr[SP_SEED_HI], (unsigned)pr[SP_INDEX_LO],
                                 (unsigned)pr[SP_INDEX_HI]);
        token = draw(l, vocab, best, token, temp, bits_f(pr[SP_TOP_P]), pr[SP_TOP_K], bits_f(pr[SP_MIN_P]), u, sh);
    }
    if (pen) {
        __syncthreads();
        for (int e = threadIdx.x; e < h_len; e += blockDim.x) {
            int tok = hist[2 * (i64)(h_off + e)];
            if ((unsigned)tok < (unsigned)vocab) l[tok] = hist_raw[h_off + e];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        tokens[row] = token;
        if (n_lp >= 0) lp[0] = __float_as_int(l[token] - lse);
    }
}
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    #[test]
    fn a_sampled_row_carries_its_parameters_and_history() {
        let hist = [
            PenaltyEntry {
                token: 7,
                word: PenaltyEntry::IN_PROMPT | 2,
            },
            PenaltyEntry { token: 9, word: 1 },
        ];
        let params = SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            top_k: 40,
            min_p: 0.05,
            presence_penalty: 0.5,
            frequency_penalty: 0.0,
            repetition_penalty: 1.1,
        };
        let spec = SampleSpec {
            params,
            seed: 0x1234_5678_9abc_def0,
            index: 5,
            history: &hist,
            logprobs: Some(3),
        };
        let (mut p, mut h) = (Vec::new(), vec![1, 2]);
        push_row(&Logits::Argmax, &mut p, &mut h);
        push_row(&Logits::Sample(spec), &mut p, &mut h);
        assert_eq!(p.len(), 2 * SAMPLE_WORDS);
        assert_eq!((p[word::MODE], p[word::LOGPROBS]), (0, -1), "an argmax row");
        let r = &p[SAMPLE_WORDS..];
        assert_eq!(r[word::MODE], 1);
        assert_eq!(f32::from_bits(r[word::TEMPERATURE] as u32), 0.8);
        assert_eq!(r[word::TOP_K], 40);
        assert_eq!(r[word::SEED_LO] as u32, 0x9abc_def0);
        assert_eq!(r[word::SEED_HI] as u32, 0x1234_5678);
        assert_eq!((r[word::INDEX_LO], r[word::LOGPROBS]), (5, 3));
        // The history follows what was there (one entry): offset 1, two entries.
        assert_eq!((r[word::HIST_OFF], r[word::HIST_LEN]), (1, 2));
        assert_eq!(&h[2..], &[7, (PenaltyEntry::IN_PROMPT | 2) as i32, 9, 1]);
        // Without penalties no history is uploaded.
        let plain = SampleSpec {
            params: SamplingParams::default(),
            ..spec
        };
        push_row(&Logits::Sample(plain), &mut p, &mut h);
        assert_eq!(h.len(), 6);
        assert_eq!(p[2 * SAMPLE_WORDS + word::HIST_LEN], 0);
    }

    #[test]
    fn logprob_words_decode_into_token_logprobs() {
        let mut w = vec![0i32; LOGPROB_WORDS];
        w[0] = (-0.5f32).to_bits() as i32;
        w[1] = 2;
        w[2] = 11;
        w[3] = 4;
        w[2 + MAX_TOP_LOGPROBS] = (-0.25f32).to_bits() as i32;
        w[3 + MAX_TOP_LOGPROBS] = (-1.5f32).to_bits() as i32;
        let lp = read_logprobs(&w);
        assert_eq!(lp.logprob, -0.5);
        assert_eq!(lp.top, vec![(11, -0.25), (4, -1.5)]);
    }

    #[test]
    fn the_source_is_filled_in() {
        let s = source();
        assert!(!s.contains('@'), "unsubstituted placeholder");
        assert!(s.contains(&format!("#define SAMPLE_CAND {SAMPLE_CAND}")));
        assert!(SAMPLE_CAND.is_power_of_two());
        assert!(SAMPLE_THREADS.is_multiple_of(32) && SAMPLE_THREADS <= 1024);
    }
}
