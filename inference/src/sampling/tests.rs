//! The sampler's unit tests: Philox's known answers, greedy, the exact distributions, penalties, seeds, top-p,
//! log-probabilities.

#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

use super::*;

fn spec(params: SamplingParams, seed: u64, index: u64) -> SampleSpec<'static> {
    SampleSpec {
        params,
        seed,
        index,
        history: &[],
        logprobs: None,
    }
}

fn with(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams::default();
    f(&mut p);
    p
}

#[test]
fn philox_matches_the_random123_known_answers() {
    assert_eq!(
        philox4x32_10([0; 4], [0; 2]),
        [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
    );
    assert_eq!(
        philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
        [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
    );
    assert_eq!(
        philox4x32_10(
            [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
            [0xa409_3822, 0x299f_31d0]
        ),
        [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
    );
    let u: Vec<f32> = (0..1000).map(|i| uniform(7, i)).collect();
    assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
    let mean = u.iter().sum::<f32>() / 1000.0;
    assert!((mean - 0.5).abs() < 0.03, "{mean}");
}

#[test]
fn greedy_is_argmax() {
    let mut s = Sampler::new();
    let g = SamplingParams::greedy();
    assert_eq!(s.sample(&mut [0.1, 3.0, 2.0], &spec(g, 1, 0)).token, 1);
    assert_eq!(s.sample(&mut [f32::NAN, 1.0], &spec(g, 1, 0)).token, 1);
    let t1 = SamplingParams::default();
    assert_eq!(s.sample(&mut [f32::NEG_INFINITY; 3], &spec(t1, 1, 0)).token, 0);
    assert_eq!(s.sample(&mut [f32::NAN; 3], &spec(t1, 1, 0)).token, 0);
    assert_eq!(s.sample(&mut [0.0, f32::INFINITY, 1.0], &spec(t1, 1, 0)).token, 1);
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
    let mut n = 0u64;
    let mut next = || {
        n += 1;
        philox4x32_10([n as u32, 0, 0, 0], [3, 0])[0]
    };
    for len in [0usize, 1, 7, 8, 9, 31, 49_152, 49_153] {
        for case in 0..6 {
            // Few distinct values, so ties are common; some NaN and infinities.
            let mut v: Vec<f32> = (0..len).map(|_| (next() % 5) as f32 - 2.0).collect();
            for x in v.iter_mut() {
                match next() % 16 {
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

/// The rule of the module in f64 with a full sort: each token's probability of being drawn.
fn reference(logits: &[f32], p: &SamplingParams, history: &[PenaltyEntry]) -> Vec<f64> {
    let mut l: Vec<f64> = logits.iter().map(|&x| x as f64).collect();
    if p.has_penalties() {
        for e in history {
            l[e.token as usize] = penalize(logits[e.token as usize], *e, p) as f64;
        }
    }
    let max = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let mut w: Vec<f64> = l
        .iter()
        .map(|&x| ((x - max) / p.temperature as f64).exp())
        .collect();
    for x in w.iter_mut() {
        if *x < p.min_p as f64 {
            *x = 0.0;
        }
    }
    let mut sorted: Vec<f64> = w.iter().cloned().filter(|&x| x > 0.0).collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let mut tau = 0.0;
    if p.top_k > 0 && (p.top_k as usize) < sorted.len() {
        tau = sorted[p.top_k as usize - 1];
    }
    if p.top_p < 1.0 {
        let s: Vec<f64> = sorted.iter().cloned().filter(|&x| x >= tau).collect();
        let target = p.top_p as f64 * s.iter().sum::<f64>();
        let mut acc = 0.0;
        for &x in &s {
            acc += x;
            if acc >= target {
                tau = tau.max(x);
                break;
            }
        }
    }
    for x in w.iter_mut() {
        if *x < tau {
            *x = 0.0;
        }
    }
    let total: f64 = w.iter().sum();
    w.iter().map(|x| x / total).collect()
}

/// Draws `n` tokens (seeds 0.., output index 5) and checks them against [`reference`]: no token outside the
/// kept set, and Pearson's chi-square over the kept tokens below the 0.1 % critical value.
fn check_distribution(logits: &[f32], p: SamplingParams, history: &[PenaltyEntry], n: usize) {
    let want = reference(logits, &p, history);
    let mut counts = vec![0usize; logits.len()];
    let mut s = Sampler::new();
    let mut row = logits.to_vec();
    for seed in 0..n as u64 {
        let sp = SampleSpec {
            history,
            ..spec(p, seed, 5)
        };
        counts[s.sample(&mut row, &sp).token as usize] += 1;
    }
    assert_eq!(row, logits, "the row is restored");
    let mut chi2 = 0.0;
    let mut df = 0usize;
    for (i, (&c, &q)) in counts.iter().zip(&want).enumerate() {
        if q == 0.0 {
            assert_eq!(
                c, 0,
                "token {i} is outside the kept set but was drawn {c} times ({p:?})"
            );
            continue;
        }
        let e = q * n as f64;
        chi2 += (c as f64 - e).powi(2) / e;
        df += 1;
    }
    let df = df.saturating_sub(1).max(1) as f64;
    // Wilson-Hilferty: the chi-square quantile at 1 - 1e-3 (z = 3.09).
    let crit = df * (1.0 - 2.0 / (9.0 * df) + 3.09 * (2.0 / (9.0 * df)).sqrt()).powi(3);
    assert!(
        chi2 < crit,
        "chi-square {chi2:.1} over {df} degrees of freedom (critical {crit:.1}) for {p:?}"
    );
}

/// 64 logits spread over [-4, 4] (distinct: no ties at any threshold).
fn spread() -> Vec<f32> {
    (0..64).map(|i| ((i * 37) % 64) as f32 / 8.0 - 4.0).collect()
}

#[test]
fn draws_follow_the_softmax_and_the_truncations_exactly() {
    let l = spread();
    for p in [
        SamplingParams::default(),
        with(|p| p.temperature = 0.7),
        with(|p| p.temperature = 1.6),
        with(|p| p.top_p = 0.8),
        with(|p| {
            p.temperature = 0.8;
            p.top_p = 0.95
        }),
        with(|p| p.top_k = 5),
        with(|p| p.top_k = 40),
        with(|p| p.min_p = 0.1),
        with(|p| {
            p.top_k = 20;
            p.top_p = 0.5;
            p.min_p = 0.05
        }),
    ] {
        check_distribution(&l, p, &[], 40_000);
    }
}

#[test]
fn penalties_move_the_distribution_as_vllm_applies_them() {
    let l = spread();
    let mut h = TokenHistory::new(&[3, 3, 17]);
    for t in [17, 17, 40, 63] {
        h.push(t);
    }
    let e = h.entries();
    assert_eq!(e.len(), 4);
    assert_eq!((e[0].token, e[0].count(), e[0].in_prompt()), (3, 0, true));
    assert_eq!((e[1].token, e[1].count(), e[1].in_prompt()), (17, 2, true));
    assert_eq!((e[2].token, e[2].count(), e[2].in_prompt()), (40, 1, false));
    let p = with(|p| {
        p.presence_penalty = 0.5;
        p.frequency_penalty = 0.3;
        p.repetition_penalty = 1.3
    });
    check_distribution(&l, p, e, 40_000);
    // Greedy with penalties: the penalized argmax.
    let mut logits = [2.0f32, 1.9, -1.0];
    let mut h = TokenHistory::new(&[]);
    h.push(0);
    let g = with(|p| {
        p.temperature = 0.0;
        p.frequency_penalty = 0.5
    });
    assert!(!g.is_greedy());
    let sp = SampleSpec {
        history: h.entries(),
        ..spec(g, 1, 0)
    };
    assert_eq!(Sampler::new().sample(&mut logits, &sp).token, 1);
    assert_eq!(
        penalize(2.0, h.entries()[0], &with(|p| p.repetition_penalty = 2.0)),
        1.0
    );
    assert_eq!(
        penalize(
            -2.0,
            PenaltyEntry {
                token: 0,
                word: PenaltyEntry::IN_PROMPT
            },
            &with(|p| p.repetition_penalty = 2.0)
        ),
        -4.0
    );
}

#[test]
fn a_seed_gives_the_same_tokens_and_the_index_moves_the_draw() {
    let l = spread();
    let p = with(|p| p.top_p = 0.9);
    let run = |seed| {
        let mut s = Sampler::new();
        let mut row = l.clone();
        (0..200)
            .map(|i| s.sample(&mut row, &spec(p, seed, i)).token)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    assert!(run(42).windows(2).any(|w| w[0] != w[1]));
}

#[test]
fn top_p_over_a_large_flat_vocabulary_keeps_the_right_mass() {
    // 1000 equal weights: all tie at the nucleus boundary, so all are kept.
    let p = with(|p| p.top_p = 0.5);
    check_distribution(&[0.0f32; 1000], p, &[], 20_000);
    // 49,152 logits with twelve copies of each value: a nucleus of thousands of tokens.
    let l: Vec<f32> = (0..49_152).map(|i| -((i % 4096) as f32) / 500.0).collect();
    let want = reference(&l, &with(|p| p.top_p = 0.9), &[]);
    let kept = want.iter().filter(|&&q| q > 0.0).count();
    assert!(kept > 4096, "{kept}");
    let mut s = Sampler::new();
    let mut row = l.clone();
    for seed in 0..2000 {
        let t = s.sample(&mut row, &spec(with(|p| p.top_p = 0.9), seed, 0)).token;
        assert!(want[t as usize] > 0.0, "token {t} outside the nucleus");
    }
}

#[test]
fn the_nucleus_cut_equals_a_sorted_walk() {
    let sorted_cut = |c: &[f32], target: f32| {
        let mut s = c.to_vec();
        s.sort_by(|a, b| b.total_cmp(a));
        let mut acc = 0.0f32;
        s.iter()
            .copied()
            .find(|&w| {
                acc += w;
                acc >= target
            })
            .unwrap_or(s[s.len() - 1])
    };
    for n in [1usize, 5, 33, 200, 5000] {
        for case in 0..4u32 {
            // Distinct weights, and (cases 2, 3) few distinct values: ties at the cut.
            let c: Vec<f32> = (0..n as u32)
                .map(|i| {
                    let r = philox4x32_10([i, case, 0, 0], [n as u32, 1])[0];
                    if case >= 2 {
                        (r % 7 + 1) as f32 / 8.0
                    } else {
                        (r >> 8) as f32 / (1 << 24) as f32
                    }
                })
                .collect();
            let sum: f32 = c.iter().sum();
            for frac in [0.1f32, 0.5, 0.9, 0.999] {
                let want = sorted_cut(&c, frac * sum);
                let got = nucleus_cut(&mut c.clone(), frac * sum);
                // Sums in another order may round across a boundary of distinct weights: then the neighbour.
                let mut s = c.clone();
                s.sort_by(|a, b| b.total_cmp(a));
                let at = s.iter().position(|&w| w == want).unwrap();
                let near = s[at.saturating_sub(1)..(at + 2).min(n)].contains(&got);
                assert!(
                    got == want || near,
                    "n {n} case {case} frac {frac}: {got} against {want}"
                );
            }
        }
    }
}

#[test]
fn logprobs_are_the_raw_log_softmax() {
    let l = [1.0f32, 3.0, 3.0, -2.0, f32::NEG_INFINITY, f32::NAN];
    let finite = [1.0f64, 3.0, 3.0, -2.0];
    let lse = finite.iter().map(|x| x.exp()).sum::<f64>().ln();
    let mut h = TokenHistory::new(&[]);
    h.push(1);
    let p = with(|p| {
        p.temperature = 0.0;
        p.frequency_penalty = 1.0
    });
    let sp = SampleSpec {
        history: h.entries(),
        logprobs: Some(3),
        ..spec(p, 0, 0)
    };
    let mut row = l;
    let s = Sampler::new().sample(&mut row, &sp);
    // Token 1 is penalized below token 2, which is chosen; the log-probabilities are the raw ones.
    assert_eq!(s.token, 2);
    let lp = s.logprobs.unwrap();
    assert!((lp.logprob as f64 - (3.0 - lse)).abs() < 1e-6, "{lp:?}");
    let ids: Vec<u32> = lp.top.iter().map(|x| x.0).collect();
    assert_eq!(ids, [1, 2, 0], "ties: lower id first");
    for (id, v) in &lp.top {
        assert!((*v as f64 - (finite[*id as usize] - lse)).abs() < 1e-6);
    }
    assert_eq!(row[1], 3.0, "the row is restored");
}
