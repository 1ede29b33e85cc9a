//! Token sampling: greedy (temperature 0), temperature, nucleus (top-p), with a per-request seeded RNG.
//!
//! Owns the choice of the next token from a logits vector and nothing else. Deterministic for a given seed
//! (OpenAI's `seed`); the RNG is SplitMix64 (Steele, Lea, Flood 2014), small and good enough for sampling.
//! Never panics on odd logits (NaN, all -inf): it falls back to the argmax of the finite values or token 0.

/// Per-request sampling parameters.
#[derive(Debug, Clone, Copy)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables.
    pub top_p: f32,
}

impl SamplingParams {
    /// Whether the next token is simply the most likely one ([`argmax`]): temperature 0 (or not a finite
    /// number). A backend may then compute only the argmax of the logits instead of returning them
    /// ([`crate::backend::Logits::Argmax`]).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || !self.temperature.is_finite()
    }
}

/// SplitMix64 RNG.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded RNG.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Index of the largest logit (NaN ignored; ties: lowest index), 0 when every logit is NaN or -inf. The CUDA
/// backend's `argmax_rows` kernel follows the same rules.
///
/// Two passes that the compiler vectorizes (the maximum in sixteen independent lanes, a comparison that skips
/// NaN, then the first index holding it) instead of one branchy scan: greedy decoding runs this once per
/// sequence per step over the whole vocabulary (49,152 logits for SmolLM2).
pub fn argmax(logits: &[f32]) -> u32 {
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
    let max = lanes
        .iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |a, &b| keep_larger(a, b));
    if max == f32::NEG_INFINITY {
        return 0;
    }
    logits.iter().position(|&v| v == max).unwrap_or(0) as u32
}

/// Candidates sorted first for top-p (the rest only when these do not reach the nucleus mass).
const TOP_P_PARTIAL: usize = 256;

/// Number of leading (descending) entries whose mass reaches `mass`, if they do.
fn nucleus_len(sorted: &[(u32, f32)], mass: f32) -> Option<usize> {
    let mut acc = 0.0;
    for (k, x) in sorted.iter().enumerate() {
        acc += x.1;
        if acc >= mass {
            return Some(k + 1);
        }
    }
    None
}

/// Samples the next token.
pub fn sample(logits: &[f32], p: SamplingParams, rng: &mut Rng) -> u32 {
    if p.is_greedy() || logits.is_empty() {
        return argmax(logits);
    }
    let max = logits[argmax(logits) as usize];
    if !max.is_finite() {
        return argmax(logits);
    }
    let inv_t = 1.0 / p.temperature;
    let mut probs: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| (i as u32, ((v - max) * inv_t).exp()))
        .collect();
    let sum: f32 = probs.iter().map(|x| x.1).sum();
    if sum.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return argmax(logits);
    }
    let top_p = if p.top_p > 0.0 && p.top_p < 1.0 {
        p.top_p
    } else {
        1.0
    };
    let mut total = sum;
    if top_p < 1.0 {
        let desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1);
        // The nucleus is usually a few tokens: sort only the largest TOP_P_PARTIAL first (exact: fall back to a
        // full sort when they do not reach the mass).
        let mut sorted = probs.len();
        if probs.len() > TOP_P_PARTIAL {
            probs.select_nth_unstable_by(TOP_P_PARTIAL - 1, desc);
            sorted = TOP_P_PARTIAL;
        }
        probs[..sorted].sort_unstable_by(desc);
        let mut keep = nucleus_len(&probs[..sorted], top_p * sum);
        if keep.is_none() {
            probs.sort_unstable_by(desc);
            keep = nucleus_len(&probs, top_p * sum);
        }
        probs.truncate(keep.unwrap_or(probs.len()));
        total = probs.iter().map(|x| x.1).sum();
    }
    let mut r = rng.next_f64() as f32 * total;
    for &(id, w) in &probs {
        if r < w {
            return id;
        }
        r -= w;
    }
    probs.last().map_or(0, |x| x.0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax() {
        let mut r = Rng::new(1);
        let p = SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
        };
        assert_eq!(sample(&[0.1, 3.0, 2.0], p, &mut r), 1);
        assert_eq!(sample(&[f32::NAN, 1.0], p, &mut r), 1);
        assert_eq!(
            sample(
                &[f32::NEG_INFINITY; 3],
                SamplingParams {
                    temperature: 1.0,
                    top_p: 1.0
                },
                &mut r
            ),
            0
        );
    }

    #[test]
    fn argmax_matches_a_plain_scan_on_ties_nan_infinities_and_odd_lengths() {
        let scan = |v: &[f32]| {
            let (mut best, mut best_v) = (0usize, f32::NEG_INFINITY);
            for (i, &x) in v.iter().enumerate() {
                if x > best_v {
                    (best, best_v) = (i, x);
                }
            }
            best as u32
        };
        let mut r = Rng::new(3);
        for len in [0usize, 1, 7, 8, 9, 31, 49_152, 49_153] {
            for case in 0..6 {
                // Few distinct values, so ties are common; some NaN and infinities.
                let mut v: Vec<f32> = (0..len).map(|_| (r.next_u64() % 5) as f32 - 2.0).collect();
                for x in v.iter_mut() {
                    match r.next_u64() % 16 {
                        0 if case > 2 => *x = f32::NAN,
                        1 if case > 3 => *x = f32::NEG_INFINITY,
                        2 if case == 5 => *x = f32::INFINITY,
                        _ => {}
                    }
                }
                assert_eq!(argmax(&v), scan(&v), "len {len} case {case}");
            }
        }
        assert_eq!(argmax(&[f32::NAN; 9]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 9]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NAN, -1e30]), 2);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln()]; // p = 0.25, 0.75
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
        };
        let run = |seed| {
            let mut r = Rng::new(seed);
            (0..4000).map(|_| sample(&logits, p, &mut r)).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        let ones = run(7).iter().filter(|&&t| t == 1).count();
        assert!((2800..3200).contains(&ones), "{ones}");
    }

    #[test]
    fn top_p_over_a_large_flat_vocabulary_keeps_the_right_mass() {
        // 1000 equal logits: top_p 0.5 keeps ~500 tokens, more than the partial sort covers.
        let logits = vec![0.0f32; 1000];
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
        };
        let mut r = Rng::new(9);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..20_000 {
            seen.insert(sample(&logits, p, &mut r));
        }
        assert!((450..=550).contains(&seen.len()), "{}", seen.len());
    }

    #[test]
    fn top_p_cuts_the_tail() {
        let logits = [5.0f32, 0.0, 0.0, 0.0];
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
        };
        let mut r = Rng::new(3);
        assert!((0..1000).all(|_| sample(&logits, p, &mut r) == 0));
    }
}
