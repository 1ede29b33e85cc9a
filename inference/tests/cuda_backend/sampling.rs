//! Tokens drawn on the device: sampling.rs's rule (chi-square) and the host sampler's choices.

use super::*;

/// The rule's probability of each token of `logits` (sampling.rs's rule, in f64 with a full sort).
fn rule_probs(logits: &[f32], p: &SamplingParams, history: &[PenaltyEntry]) -> Vec<f64> {
    let mut l = logits.to_vec();
    if p.has_penalties() {
        for e in history {
            l[e.token as usize] = inference::sampling::penalize(l[e.token as usize], *e, p);
        }
    }
    let max = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let mut w: Vec<f64> = l
        .iter()
        .map(|&x| {
            let w = ((x as f64 - max) / p.temperature as f64).exp();
            if w < p.min_p as f64 { 0.0 } else { w }
        })
        .collect();
    let mut sorted: Vec<f64> = w.iter().copied().filter(|&x| x > 0.0).collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let mut tau = 0.0;
    if p.top_k > 0 && (p.top_k as usize) < sorted.len() {
        tau = sorted[p.top_k as usize - 1];
    }
    if p.top_p < 1.0 {
        let kept: Vec<f64> = sorted.iter().copied().filter(|&x| x >= tau).collect();
        let target = p.top_p as f64 * kept.iter().sum::<f64>();
        let mut acc = 0.0;
        for x in kept {
            acc += x;
            if acc >= target {
                tau = tau.max(x);
                break;
            }
        }
    }
    w.iter_mut().filter(|x| **x < tau).for_each(|x| *x = 0.0);
    let total: f64 = w.iter().sum();
    w.iter().map(|x| x / total).collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_sampling_follows_the_rule_and_the_host_sampler() {
    let model = tiny_model(GgmlType::Q8_0, false);
    let mut gpu = cuda(&model, 2048, 16, KvDtype::F16, true);
    let prompt: Vec<u32> = (0..9).map(|i| (i * 5 + 3) % 64).collect();
    let rows = 32;
    let tables: Vec<Vec<u32>> = (0..rows as u32).map(|r| vec![2 * r, 2 * r + 1]).collect();
    let configs = [
        SamplingParams::default(),
        chat_sampling(),
        SamplingParams {
            top_k: 20,
            temperature: 1.3,
            ..SamplingParams::default()
        },
        SamplingParams {
            min_p: 0.05,
            repetition_penalty: 1.3,
            ..SamplingParams::default()
        },
    ];
    let mut host = Sampler::new();
    for p in configs {
        let rounds = 100;
        let mut counts: Vec<usize> = Vec::new();
        let (mut agree, mut draws) = (0, 0);
        let mut probs = Vec::new();
        for round in 0..rounds {
            // Row 0 brings the logits back; rows 1.. draw with seeds of their own from the same logits.
            let specs: Vec<SampleSpec<'_>> = (1..rows)
                .map(|r| SampleSpec {
                    params: p,
                    seed: (round * rows + r) as u64,
                    index: 4,
                    history: &HISTORY,
                    logprobs: (r == 1).then_some(5),
                })
                .collect();
            let batch: Vec<BatchItem<'_>> = (0..rows)
                .map(|r| {
                    let want = if r == 0 {
                        Logits::Full
                    } else {
                        Logits::Sample(specs[r - 1])
                    };
                    item(&prompt, 0, &tables[r], want)
                })
                .collect();
            let out = gpu.forward(&batch).unwrap();
            let logits = &out.logits[0];
            if round == 0 {
                probs = rule_probs(logits, &p, &HISTORY);
                counts = vec![0; probs.len()];
                // The raw log-probabilities of row 1 against the host's.
                let mut row = logits.clone();
                let want = host.sample(&mut row, &specs[0]).logprobs.unwrap();
                let got = &out.logprobs[0];
                assert_eq!(
                    got.top.iter().map(|x| x.0).collect::<Vec<_>>(),
                    want.top.iter().map(|x| x.0).collect::<Vec<_>>()
                );
                assert!(
                    (got.logprob - want.logprob).abs() < 1e-4,
                    "{got:?} against {want:?}"
                );
            }
            for (r, spec) in (1..rows).zip(&specs) {
                let t = out.tokens[r] as usize;
                assert!(probs[t] > 0.0, "{p:?}: token {t} outside the kept set");
                counts[t] += 1;
                let mut row = logits.clone();
                agree += usize::from(host.sample(&mut row, spec).token as usize == t);
                draws += 1;
            }
        }
        // Chi-square over bins of consecutive kept tokens expecting at least 5 draws each.
        let (mut chi2, mut df, mut e, mut c) = (0.0, -1i64, 0.0, 0.0);
        for (q, &n) in probs.iter().zip(&counts) {
            if *q > 0.0 {
                e += q * draws as f64;
                c += n as f64;
                if e >= 5.0 {
                    chi2 += (c - e) * (c - e) / e;
                    df += 1;
                    (e, c) = (0.0, 0.0);
                }
            }
        }
        let df = df.max(1) as f64;
        let crit = df * (1.0 - 2.0 / (9.0 * df) + 3.09 * (2.0 / (9.0 * df)).sqrt()).powi(3);
        eprintln!(
            "{p:?}: {draws} draws on the GPU, chi-square {chi2:.1} over {df} degrees of freedom (critical {crit:.1}); \
             the host sampler drew the same token {agree} times"
        );
        assert!(chi2 < crit, "{p:?}: the GPU's draws do not follow the rule");
        assert!(
            agree * 100 >= draws * 99,
            "{p:?}: GPU and host disagree on {} of {draws}",
            draws - agree
        );
    }
}
