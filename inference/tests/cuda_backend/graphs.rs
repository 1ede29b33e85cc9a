//! CUDA graph replay against the eager launches.

use super::*;

/// What [`decode_run`] saw, per step.
struct DecodeRun {
    /// Each step's logits (empty for argmax-only steps).
    logits: Vec<Vec<Vec<f32>>>,
    /// Each step's argmax per sequence.
    argmax: Vec<Vec<u32>>,
    /// The graph batch each step replayed (0: eager).
    graphs: Vec<u32>,
}

/// Prefills `seqs` prompts, then decodes `steps` tokens for all of them and `steps` more for the first `tail`
/// only (a smaller, differently padded batch), feeding each sequence the token the backend picked. Odd decode
/// steps ask for the argmax only (greedy decoding: no logits come back), even ones for the logits too. Returns
/// every step's logits, argmax and the graph batch each step replayed.
fn decode_run(b: &mut dyn Backend, prompts: &[Vec<u32>], steps: usize, tail: usize) -> DecodeRun {
    let bs = 16;
    let tables: Vec<Vec<u32>> = (0..prompts.len())
        .map(|s| (0..32u32).map(|k| s as u32 * 32 + k).collect())
        .collect();
    let prefill: Vec<BatchItem<'_>> = prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| item(p, 0, t, Logits::Full))
        .collect();
    let out = b.forward(&prefill).unwrap();
    check_argmax("prefill", &out);
    let mut next = out.tokens.clone();
    let mut pos: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let (mut all, mut best, mut graphs) = (vec![out.logits], vec![out.tokens], vec![out.graph_batch]);
    for step in 0..2 * steps {
        let live = if step < steps { prompts.len() } else { tail };
        // Every third step draws with a temperature, a nucleus and penalties (on the device, inside the graphs).
        let want = match step % 3 {
            1 => Logits::Argmax,
            2 => Logits::Sample(SampleSpec {
                params: chat_sampling(),
                seed: 1000 + step as u64,
                index: step as u64,
                history: &HISTORY,
                logprobs: Some(2),
            }),
            _ => Logits::Full,
        };
        let toks = next.clone();
        let batch: Vec<BatchItem<'_>> = (0..live)
            .map(|s| item(&toks[s..s + 1], pos[s], &tables[s], want))
            .collect();
        assert!(pos[0] < 32 * bs, "tables too short");
        let out = b.forward(&batch).unwrap();
        assert_eq!(
            out.tokens.len(),
            live,
            "decode step {step}: one argmax per sequence"
        );
        match want {
            Logits::Full => check_argmax(&format!("decode step {step}"), &out),
            _ => assert!(
                out.logits.is_empty(),
                "decode step {step}: argmax-only and sampled items got logits"
            ),
        }
        if let Logits::Sample(_) = want {
            assert_eq!(
                out.logprobs.len(),
                live,
                "decode step {step}: one logprobs entry per sampled item"
            );
        }
        next[..live].copy_from_slice(&out.tokens);
        pos[..live].iter_mut().for_each(|p| *p += 1);
        all.push(out.logits);
        best.push(out.tokens);
        graphs.push(out.graph_batch);
    }
    DecodeRun {
        logits: all,
        argmax: best,
        graphs,
    }
}

/// Graph replay against eager launches of the same kernels: bit-identical logits (the padding rows never touch
/// a real row), before and after a weight swap (the graphs are recaptured on the new weights' buffers).
fn graphs_match_eager(model: &Arc<Model>, kv: KvDtype, prompts: &[Vec<u32>]) {
    let mut eager = cuda(model, 2048, 16, kv, false);
    let mut graphed = cuda(model, 2048, 16, kv, true);
    assert!(eager.graph_sizes().is_empty());
    eprintln!("{}", graphed.describe());
    for round in 0..2 {
        let e = decode_run(&mut eager, prompts, 12, 1);
        let g = decode_run(&mut graphed, prompts, 12, 1);
        let (le, ge, lg, gg) = (e.logits, e.graphs, g.logits, g.graphs);
        assert_eq!(
            e.argmax, g.argmax,
            "{kv:?} round {round}: graph replay picked other tokens than eager launches"
        );
        assert!(ge.iter().all(|&g| g == 0), "the eager backend replayed a graph");
        // Prefill eager; 3 sequences pad to 4, then 1 sequence replays the graph of 1.
        let want: Vec<u32> = std::iter::once(0)
            .chain(std::iter::repeat_n(prompts.len().next_power_of_two() as u32, 12))
            .chain(std::iter::repeat_n(1, 12))
            .collect();
        assert_eq!(gg, want, "graph batch per step ({kv:?}, round {round})");
        assert_eq!(le.len(), lg.len());
        for (i, (a, b)) in le.iter().zip(&lg).enumerate() {
            assert!(
                a == b,
                "{kv:?} round {round} step {i}: graph replay logits differ from eager launches"
            );
        }
        // Same weights re-uploaded to new buffers: a graph still holding the old addresses would read freed
        // memory.
        eager.swap_weights(model.clone()).unwrap();
        graphed.swap_weights(model.clone()).unwrap();
    }
    eprintln!(
        "{kv:?}: graph replay bit-identical to eager over {} steps x 2 (batch 3 padded to 4, batch 1), weight swap included",
        25
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_graph_replay_matches_eager_launches_exactly() {
    let model = tiny_model(GgmlType::Q4_1, false);
    let vocab = model.config.vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|s| (0..5 + 3 * s).map(|i| (i * 11 + s * 7 + 1) % vocab).collect())
        .collect();
    for kv in [KvDtype::F32, KvDtype::F16] {
        graphs_match_eager(&model, kv, &prompts);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and the default model (LLMSERVE_MODEL)"]
fn cuda_graph_replay_matches_eager_launches_on_the_default_model() {
    let model = load_default_model();
    let prompts: Vec<Vec<u32>> = ["The capital of France is", "Once upon a time", "def fib(n):"]
        .iter()
        .map(|p| model.tokenizer.encode(p))
        .collect();
    graphs_match_eager(&model, KvDtype::F16, &prompts);
}
