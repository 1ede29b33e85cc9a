//! Token sampling: from one row of logits to the next token, with the options OpenAI-style clients send
//! (temperature, `top_p`, `top_k`, `min_p`, presence/frequency/repetition penalties, `seed`, `logprobs`).
//!
//! Owns the sampling rule both backends follow (the CPU backend calls [`Sampler::sample`]; the CUDA backend's
//! `sample_rows` kernel implements the same steps on the device, `backend::cuda::kernels`), the per-request
//! random numbers, the penalties' token history and the log-probabilities reported back. For one row:
//! 1. **Penalties** (vLLM's): for every token of the prompt or the output, a repetition penalty `r` divides a
//!    positive logit by `r` and multiplies a negative one by `r`; then each token generated `c` times loses
//!    `frequency × c + presence × (c > 0)`.
//! 2. **Temperature 0** (or not a number): the argmax of the penalized logits ([`argmax`]'s rules).
//! 3. Weights `w_i = exp((l_i − max) / T)` (0 for NaN and −∞), so the most likely token weighs 1.
//! 4. **`min_p`**: tokens with `w_i < min_p` are dropped.
//! 5. **`top_k`**: tokens below the k-th largest remaining weight are dropped.
//! 6. **`top_p`**: of what remains, sorted by weight, the shortest head whose weight reaches `top_p` times the
//!    remaining total is kept: tokens below the weight where that head ends are dropped.
//! 7. One uniform `u` in [0, 1) from Philox4x32-10 ([`uniform`]: key = the request's seed, counter = the token's
//!    index in the output), and the first kept token in vocabulary order whose running weight exceeds `u` times
//!    the kept total.
//!
//! Steps 5 and 6 are thresholds on the weight: tokens tied with the last one kept are kept too, so the rule does
//! not depend on any sort order and the device can find the thresholds without sorting. The random number
//! depends only on (seed, output index): a seed gives the same tokens on every run, whatever else is batched.
//! Log-probabilities are those of the model's raw logits (`log_softmax` before penalties and temperature, as
//! vLLM reports by default). Never panics on odd logits (NaN, ±∞): the argmax of what is finite, or token 0.

use std::collections::HashMap;

mod simd;

/// Most alternatives `top_logprobs` may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Per-request sampling parameters, validated by the HTTP layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens; 0 disables.
    pub top_k: u32,
    /// Drop tokens less likely than `min_p` times the most likely one, in [0, 1]; 0 disables.
    pub min_p: f32,
    /// Subtracted once from the logit of every token already generated (OpenAI's, in [-2, 2]).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated (OpenAI's, in [-2, 2]).
    pub frequency_penalty: f32,
    /// Divides (positive) or multiplies (negative) the logits of the prompt's and output's tokens; 1 disables.
    pub repetition_penalty: f32,
}

impl Default for SamplingParams {
    /// OpenAI's defaults: temperature 1, everything else off.
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding without penalties.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }
    }

    /// Whether any penalty changes the logits.
    pub fn has_penalties(&self) -> bool {
        self.presence_penalty != 0.0 || self.frequency_penalty != 0.0 || self.repetition_penalty != 1.0
    }

    /// Whether the next token is simply the most likely one of the raw logits ([`argmax`]): temperature 0 (or
    /// not a finite number) and no penalty. A backend may then compute only the argmax
    /// ([`crate::backend::Logits::Argmax`]).
    pub fn is_greedy(&self) -> bool {
        !self.samples() && !self.has_penalties()
    }

    /// Whether a random draw picks the token (a positive, finite temperature).
    fn samples(&self) -> bool {
        self.temperature > 0.0 && self.temperature.is_finite()
    }
}

/// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
/// counter-based generator, the output a pure function of (counter, key). The CUDA kernels implement the same
/// function (`philox` in the kernel source).
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;
    let (mut c, mut k) = (ctr, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = M0 * u64::from(c[0]);
        let p1 = M1 * u64::from(c[2]);
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

/// The uniform in [0, 1) that picks output token `index` of a request seeded `seed`: the first Philox word of
/// counter (index, 0, 0, 0) under key `seed`, top 24 bits, so the value is exact in f32 on every backend.
pub fn uniform(seed: u64, index: u64) -> f32 {
    let r = philox4x32_10(
        [index as u32, (index >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    );
    (r[0] >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
}

/// Index of the largest logit (NaN ignored; ties: lowest index), 0 when every logit is NaN or -inf. The CUDA
/// backend's `sample_rows` kernel follows the same rules for greedy rows.
///
/// Two passes that the compiler vectorizes (the maximum in sixteen independent lanes, a comparison that skips
/// NaN, then the first index holding it) instead of one branchy scan: greedy decoding runs this once per
/// sequence per step over the whole vocabulary (49,152 logits for SmolLM2).
pub fn argmax(logits: &[f32]) -> u32 {
    let max = max_value(logits);
    if max == f32::NEG_INFINITY {
        return 0;
    }
    logits.iter().position(|&v| v == max).unwrap_or(0) as u32
}

/// The largest logit, NaN ignored (-inf when there is none).
fn max_value(logits: &[f32]) -> f32 {
    // `v > m` is false for a NaN `v`: the select compiles to `maxps` without the NaN fix-ups `f32::max` needs.
    let keep_larger = |m: f32, v: f32| if v > m { v } else { m };
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = logits.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = keep_larger(*m, v);
        }
    }
    lanes
        .iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |a, &b| keep_larger(a, b))
}

/// One entry of a request's token history ([`TokenHistory`]): a token and how it occurred. The CUDA backend
/// uploads these as two 32-bit words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct PenaltyEntry {
    /// The token.
    pub token: u32,
    /// Times it was generated (low 31 bits, saturating), and [`PenaltyEntry::IN_PROMPT`].
    pub word: u32,
}

impl PenaltyEntry {
    /// Set in [`PenaltyEntry::word`] when the prompt holds the token.
    pub const IN_PROMPT: u32 = 1 << 31;

    /// Times the token was generated.
    pub fn count(self) -> u32 {
        self.word & !Self::IN_PROMPT
    }

    /// Whether the prompt holds the token.
    pub fn in_prompt(self) -> bool {
        self.word & Self::IN_PROMPT != 0
    }
}

/// The tokens a request has seen, for the penalties: each distinct token once ([`PenaltyEntry`]). Kept only
/// for requests with penalties; updated once per generated token.
#[derive(Debug, Default, Clone)]
pub struct TokenHistory {
    entries: Vec<PenaltyEntry>,
    index: HashMap<u32, usize>,
}

impl TokenHistory {
    /// The history of a prompt (no output yet).
    pub fn new(prompt: &[u32]) -> Self {
        let mut h = TokenHistory::default();
        for &t in prompt {
            let i = h.slot(t);
            h.entries[i].word |= PenaltyEntry::IN_PROMPT;
        }
        h
    }

    fn slot(&mut self, token: u32) -> usize {
        let next = self.entries.len();
        let i = *self.index.entry(token).or_insert(next);
        if i == next {
            self.entries.push(PenaltyEntry { token, word: 0 });
        }
        i
    }

    /// Counts one more generation of `token`.
    pub fn push(&mut self, token: u32) {
        let i = self.slot(token);
        let e = &mut self.entries[i];
        if e.count() < !PenaltyEntry::IN_PROMPT {
            e.word += 1;
        }
    }

    /// Every distinct token seen, in order of first appearance.
    pub fn entries(&self) -> &[PenaltyEntry] {
        &self.entries
    }
}

/// What a backend needs to pick one sequence's next token.
#[derive(Debug, Clone, Copy)]
pub struct SampleSpec<'a> {
    /// The request's parameters.
    pub params: SamplingParams,
    /// The request's seed ([`uniform`]'s key).
    pub seed: u64,
    /// The token's index in the output ([`uniform`]'s counter).
    pub index: u64,
    /// The request's token history (empty without penalties).
    pub history: &'a [PenaltyEntry],
    /// `None`: no log-probabilities; `Some(n)`: the chosen token's and the `n` most likely tokens'
    /// (n ≤ [`MAX_TOP_LOGPROBS`]).
    pub logprobs: Option<u8>,
}

/// Log-probabilities of one output position (of the raw logits).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The chosen token's.
    pub logprob: f32,
    /// The most likely tokens and theirs, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// A chosen token.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The token.
    pub token: u32,
    /// Its log-probabilities, when asked for.
    pub logprobs: Option<TokenLogprobs>,
}

/// Penalized logit `l` of a token with history entry `e` (step 1 of the module's rule).
pub fn penalize(l: f32, e: PenaltyEntry, p: &SamplingParams) -> f32 {
    let mut l = if l > 0.0 {
        l / p.repetition_penalty
    } else {
        l * p.repetition_penalty
    };
    let c = e.count();
    l -= p.frequency_penalty * c as f32;
    if c > 0 {
        l -= p.presence_penalty;
    }
    l
}

/// Elements per block of the sampling walk's running sums (the block holding the draw is walked one by one).
const WALK_BLOCK: usize = 1024;

/// The CPU sampler: [`Sampler::sample`] with scratch buffers reused from row to row.
#[derive(Debug, Default)]
pub struct Sampler {
    weights: Vec<f32>,
    candidates: Vec<f32>,
    block_sums: Vec<f32>,
    saved: Vec<(usize, f32)>,
}

impl Sampler {
    /// A sampler with empty scratch buffers.
    pub fn new() -> Self {
        Sampler::default()
    }

    /// The next token from one row of logits, as the module's rule says. The row is penalized in place while
    /// the token is chosen and restored before returning.
    pub fn sample(&mut self, logits: &mut [f32], spec: &SampleSpec<'_>) -> Sampled {
        let p = &spec.params;
        let raw = spec.logprobs.map(|n| RawStats::of(logits, usize::from(n)));
        self.saved.clear();
        if p.has_penalties() {
            for &e in spec.history {
                if let Some(l) = logits.get_mut(e.token as usize) {
                    self.saved.push((e.token as usize, *l));
                    *l = penalize(*l, e, p);
                }
            }
        }
        let token = self.choose(logits, p, uniform(spec.seed, spec.index));
        for &(i, l) in self.saved.iter().rev() {
            logits[i] = l;
        }
        Sampled {
            token,
            logprobs: raw.map(|r| TokenLogprobs {
                logprob: logits
                    .get(token as usize)
                    .map_or(f32::NEG_INFINITY, |&l| l - r.lse),
                top: r.top,
            }),
        }
    }

    /// Steps 2–7 of the rule on penalized logits, with the uniform `u`.
    fn choose(&mut self, logits: &[f32], p: &SamplingParams, u: f32) -> u32 {
        let best = argmax(logits);
        let max = logits.get(best as usize).copied().unwrap_or(f32::NEG_INFINITY);
        if !p.samples() || !max.is_finite() {
            return best;
        }
        let min_p = if p.min_p > 0.0 { p.min_p } else { 0.0 };
        let inv_t = 1.0 / p.temperature;
        let truncates = p.top_k > 0 || (p.top_p > 0.0 && p.top_p < 1.0);
        let stats = if truncates {
            simd::weights_and_ladder(logits, max, inv_t, min_p, &mut self.weights)
        } else {
            simd::weights(logits, max, inv_t, min_p, &mut self.weights)
        };
        let tau = self.threshold(p, &stats);
        // Walk: the kept weights' sums per block of WALK_BLOCK (vectorized), then the block holding the draw one
        // by one; the total is the sum of the block sums, so the walk ends inside it.
        let kept = |w: f32| if w >= tau && w > 0.0 { w } else { 0.0 };
        let total = simd::kept_block_sums(&self.weights, tau, WALK_BLOCK, &mut self.block_sums);
        if total.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            return best;
        }
        let mut r = u * total;
        for (bi, &s) in self.block_sums.iter().enumerate() {
            if r >= s {
                r -= s;
                continue;
            }
            let mut last = None;
            for (j, &w) in self.weights[bi * WALK_BLOCK..]
                .iter()
                .take(WALK_BLOCK)
                .enumerate()
            {
                let w = kept(w);
                if w > 0.0 {
                    let t = (bi * WALK_BLOCK + j) as u32;
                    if r < w {
                        return t;
                    }
                    r -= w;
                    last = Some(t);
                }
            }
            // The block's one-by-one sum rounded below its lane sum: its last kept token.
            if let Some(t) = last {
                return t;
            }
        }
        // Rounding left the draw at the total: the last kept token.
        self.weights
            .iter()
            .rposition(|&w| kept(w) > 0.0)
            .map_or(best, |i| i as u32)
    }

    /// The weight below which tokens are dropped by `top_k` and `top_p` (steps 5 and 6; 0: none), from the
    /// weights and what their pass found.
    fn threshold(&mut self, p: &SamplingParams, stats: &simd::WeightStats) -> f32 {
        let k = p.top_k as usize;
        let top_k = k > 0 && k < stats.positive;
        let top_p = p.top_p > 0.0 && p.top_p < 1.0;
        if !top_k && !top_p {
            return 0.0;
        }
        let total = stats.total;
        // The candidates: every weight above the highest ladder floor that holds the top-k set (k of them) or, for
        // top-p alone, the nucleus (their sum reaches the target); all positive weights when none does.
        let target = p.top_p * total;
        let floor = (0..simd::LADDER.len())
            .find(|&j| {
                if top_k {
                    stats.ladder_count[j] >= k
                } else {
                    stats.ladder_mass[j] >= target
                }
            })
            .map_or(0.0, |j| simd::LADDER[j]);
        simd::collect_at_least(&self.weights, floor.max(f32::MIN_POSITIVE), &mut self.candidates);
        let c = &mut self.candidates[..];
        let mut tau = 0.0f32;
        let mut set = c.len();
        if top_k {
            // The k-th largest, and the candidates at or above it moved to the front.
            let desc = |a: &f32, b: &f32| b.total_cmp(a);
            tau = *c.select_nth_unstable_by(k - 1, desc).1;
            set = k;
            for i in k..c.len() {
                if c[i] >= tau {
                    c.swap(i, set);
                    set += 1;
                }
            }
        }
        if top_p {
            let mass = if top_k { c[..set].iter().sum() } else { total };
            tau = tau.max(nucleus_cut(&mut c[..set], p.top_p * mass));
        }
        tau
    }
}

/// The weight at which the heaviest of `c` (in descending order) first reach `target` together: the largest `v`
/// with `Σ {x ∈ c : x ≥ v} ≥ target`, or the smallest weight when rounding keeps the whole sum below it. A
/// quickselect on mass (three-way partitions around a median of three), so a nucleus of thousands of tokens costs
/// linear time, not a sort.
fn nucleus_cut(c: &mut [f32], target: f32) -> f32 {
    let (mut lo, mut hi) = (0, c.len());
    let mut above = 0.0f32;
    while hi - lo > 32 {
        let s = &mut c[lo..hi];
        let (a, b, m) = (s[0], s[s.len() / 2], s[s.len() - 1]);
        let pivot = a.max(b).min(a.min(b).max(m));
        // Three-way partition, descending: [> pivot | == pivot | < pivot].
        let (mut gt, mut i, mut lt) = (0, 0, s.len());
        while i < lt {
            if s[i] > pivot {
                s.swap(i, gt);
                gt += 1;
                i += 1;
            } else if s[i] < pivot {
                lt -= 1;
                s.swap(i, lt);
            } else {
                i += 1;
            }
        }
        let heavier: f32 = s[..gt].iter().sum();
        if above + heavier >= target {
            hi = lo + gt;
            continue;
        }
        let equal = pivot * (lt - gt) as f32;
        if above + heavier + equal >= target {
            return pivot;
        }
        above += heavier + equal;
        lo += lt;
    }
    let rest = &mut c[lo..hi];
    rest.sort_unstable_by(|a, b| b.total_cmp(a));
    for &w in rest.iter() {
        above += w;
        if above >= target {
            return w;
        }
    }
    c.iter().copied().fold(f32::INFINITY, f32::min)
}

/// What log-probabilities need of the raw logits: their log-sum-exp and the `n` most likely tokens.
struct RawStats {
    lse: f32,
    top: Vec<(u32, f32)>,
}

impl RawStats {
    fn of(logits: &[f32], n: usize) -> Self {
        let max = max_value(logits);
        if !max.is_finite() {
            return RawStats {
                lse: max,
                top: Vec::new(),
            };
        }
        let lse = max + simd::sum_exp(logits, max).ln();
        // The n largest (value descending, id ascending), by insertion into a short sorted list.
        let n = n.min(MAX_TOP_LOGPROBS);
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
        if n > 0 {
            for (i, &l) in logits.iter().enumerate() {
                if l.is_nan() || (top.len() == n && l <= top[n - 1].1) {
                    continue;
                }
                let at = top.partition_point(|&(_, v)| v >= l);
                top.insert(at, (i as u32, l));
                top.truncate(n);
            }
        }
        RawStats {
            lse,
            top: top.into_iter().map(|(i, l)| (i, l - lse)).collect(),
        }
    }
}

#[cfg(test)]
mod tests;
