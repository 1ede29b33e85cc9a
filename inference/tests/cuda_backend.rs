//! The CUDA backend on a real GPU (every test is `#[ignore]`: run with `--ignored` where a GPU is present):
//! CPU and GPU logits agree on tiny generated models of every tensor type through chunked prefill, mixed
//! batches and decode (replayed as CUDA graphs) over a scattered paged KV cache; graph replay computes exactly
//! the eager launches' logits, padded batches and weight swaps included; the f16 KV cache stays within its
//! tolerance of the f32 one; the default model answers "Paris" on the GPU; step device times lie on the host
//! BOOTTIME clock inside the host interval of the call; tokens drawn on the device follow sampling.rs's rule
//! (chi-square) and agree with the host sampler's; tensor-core prefill stays within the f16 tolerance; and
//! (printing only) decode throughput at batch 1 and 32 with and without graphs, greedy against sampled, and the
//! time of a 512-token prompt on tensor cores and CUDA cores.
//!
//! Build here, run on the GPU machine:
//! `cargo test --release -p inference --features cuda --test cuda_backend --no-run`, then
//! `LLMSERVE_MODEL=/path/SmolLM2-135M-Instruct.Q4_1.gguf ./cuda_backend-* --ignored --nocapture --test-threads 1`.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use e2e::gguf::{TinyModelSpec, write_tiny_gguf};
use inference::backend::cpu::CpuBackend;
use inference::backend::cuda::{CudaBackend, CudaOptions, KvDtype};
use inference::backend::{Backend, BatchItem, DeviceClock, Logits};
use inference::chat_template::ChatMessage;
use inference::gguf::GgmlType;
use inference::model::{Model, default_model_path};
use inference::sampling::{PenaltyEntry, SampleSpec, Sampler, SamplingParams};

/// Largest |GPU - CPU| logit difference allowed, relative to the largest |CPU logit| of the step. Both compute in
/// f32 with f32 accumulation; only summation order differs.
const REL_TOL: f32 = 2e-3;

fn tiny_model(ty: GgmlType, tied: bool) -> Arc<Model> {
    let dir = std::env::temp_dir().join(format!("llmserve-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join(format!("tiny-{ty:?}-{tied}.gguf"));
    let spec = TinyModelSpec {
        weight_type: ty,
        tied_embeddings: tied,
        seed: 7,
        ..Default::default()
    };
    write_tiny_gguf(&path, &spec).unwrap();
    let m = Model::load(&path).unwrap();
    std::fs::remove_file(&path).ok();
    Arc::new(m)
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Compares one step's logits; returns the relative error.
fn compare(what: &str, cpu: &[Vec<f32>], gpu: &[Vec<f32>]) -> f32 {
    assert_eq!(cpu.len(), gpu.len(), "{what}: number of logit rows");
    let mut worst = 0f32;
    for (i, (c, g)) in cpu.iter().zip(gpu).enumerate() {
        assert_eq!(c.len(), g.len(), "{what}: row {i} length");
        let scale = c.iter().fold(0f32, |a, v| a.max(v.abs())).max(1e-6);
        let diff = c.iter().zip(g).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        let rel = diff / scale;
        assert!(
            rel <= REL_TOL,
            "{what}: row {i}: max |gpu - cpu| = {diff} (relative {rel}, tolerance {REL_TOL})"
        );
        // The greedy choice agrees, unless the CPU's top two are tied within the tolerance.
        let (ac, ag) = (argmax(c), argmax(g));
        assert!(
            ac == ag || (c[ac] - c[ag]).abs() <= REL_TOL * scale,
            "{what}: row {i}: argmax {ag} on the GPU, {ac} on the CPU ({} vs {})",
            c[ag],
            c[ac]
        );
        worst = worst.max(rel);
    }
    worst
}

fn cuda(model: &Arc<Model>, num_blocks: usize, bs: usize, kv_dtype: KvDtype, graphs: bool) -> CudaBackend {
    let options = CudaOptions {
        kv_dtype,
        graphs,
        ..CudaOptions::default()
    };
    CudaBackend::with_options(model.clone(), num_blocks, bs, options).unwrap()
}

fn item<'a>(
    tokens: &'a [u32],
    start_pos: usize,
    block_table: &'a [u32],
    logits: Logits<'a>,
) -> BatchItem<'a> {
    BatchItem {
        tokens,
        start_pos,
        block_table,
        logits,
    }
}

/// The device's argmax of every logit row against the host's argmax of the logits it copied back (the same
/// values, so exactly equal: NaN, ties and infinities are handled alike).
fn check_argmax(what: &str, out: &inference::backend::StepOutput) {
    let host: Vec<u32> = out
        .logits
        .iter()
        .map(|l| inference::sampling::argmax(l))
        .collect();
    assert_eq!(
        out.tokens, host,
        "{what}: the device argmax differs from the host's"
    );
}

/// Runs the same steps on both backends and compares every step's logits.
fn cpu_vs_gpu(ty: GgmlType, tied: bool) {
    let model = tiny_model(ty, tied);
    let (num_blocks, bs) = (64, 4);
    let mut cpu = CpuBackend::new(model.clone(), num_blocks, bs, 2).unwrap();
    // The CPU's precision (f32 KV); the decode steps below replay CUDA graphs.
    let mut gpu = cuda(&model, num_blocks, bs, KvDtype::F32, true);
    assert!(!gpu.graph_sizes().is_empty(), "{}", gpu.describe());
    let vocab = model.config.vocab_size as u32;
    let a: Vec<u32> = (0..23).map(|i| (i * 7 + 3) % vocab).collect();
    let b: Vec<u32> = (0..17).map(|i| (i * 13 + 5) % vocab).collect();
    // Scattered, interleaved block tables.
    let ta: Vec<u32> = vec![40, 3, 17, 60, 9, 22, 51, 30];
    let tb: Vec<u32> = vec![5, 41, 0, 63, 12, 33];
    let (a, b, ta, tb) = (&a[..], &b[..], &ta[..], &tb[..]);
    let steps: Vec<Vec<BatchItem<'_>>> = vec![
        // A's first prefill chunk alone (no logits), then A's rest with B's whole prompt (mixed prefill).
        vec![item(&a[..9], 0, ta, Logits::None)],
        vec![
            item(&a[9..20], 9, ta, Logits::Full),
            item(&b[..17], 0, tb, Logits::Full),
        ],
        // Decode-like single tokens and a chunk together.
        vec![
            item(&a[20..21], 20, ta, Logits::Full),
            item(&b[..1], 17, tb, Logits::Full),
        ],
        vec![
            item(&a[21..23], 21, ta, Logits::Full),
            item(&b[1..2], 18, tb, Logits::Full),
        ],
    ];
    let mut worst = 0f32;
    for (i, s) in steps.iter().enumerate() {
        let c = cpu.forward(s).unwrap();
        let g = gpu.forward(s).unwrap();
        check_argmax(&format!("{ty:?} tied={tied} step {i}"), &g);
        let decode = s.iter().all(|it| it.tokens.len() == 1 && it.logits.wanted());
        assert_eq!(
            g.graph_batch > 0,
            decode,
            "step {i}: graph replay only for decode steps"
        );
        worst = worst.max(compare(
            &format!("{ty:?} tied={tied} step {i}"),
            &c.logits,
            &g.logits,
        ));
    }
    eprintln!("{ty:?} tied={tied}: CPU and GPU logits agree, worst relative difference {worst:.2e}");
}

#[test]
#[ignore = "needs an NVIDIA GPU (run with --ignored on the GPU machine)"]
fn cuda_logits_match_cpu_on_tiny_models_of_every_type() {
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
    ] {
        cpu_vs_gpu(ty, false);
    }
    cpu_vs_gpu(GgmlType::Q4_1, true);
    cpu_vs_gpu(GgmlType::Q8_0, true);
}

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

/// What a chat client sends: temperature 0.8, nucleus 0.95, and (to exercise the histories) light penalties.
fn chat_sampling() -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        presence_penalty: 0.2,
        frequency_penalty: 0.1,
        ..SamplingParams::default()
    }
}

/// A token history for the penalties (tokens of every tiny model's vocabulary).
const HISTORY: [PenaltyEntry; 3] = [
    PenaltyEntry {
        token: 3,
        word: PenaltyEntry::IN_PROMPT,
    },
    PenaltyEntry { token: 7, word: 2 },
    PenaltyEntry {
        token: 11,
        word: PenaltyEntry::IN_PROMPT | 1,
    },
];

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

/// Largest |f16 KV − f32 KV| logit difference allowed, relative to the step's largest |f32 logit|. An f16 K or V
/// element carries a relative rounding error of at most 2⁻¹¹ ≈ 4.9e-4; attention averages V (no growth) but the
/// score q·k of a 64-dimension head sums 64 rounded products and 30 layers compound it through the residual
/// stream, so a few ‰ of the largest logit is expected. 1e-2 leaves room for that and is still 20x below the gap
/// between the top two logits of a confident greedy choice.
const REL_TOL_F16: f32 = 1e-2;

#[test]
#[ignore = "needs an NVIDIA GPU and the default model (LLMSERVE_MODEL)"]
fn cuda_f16_kv_cache_stays_within_tolerance_of_f32() {
    let model = load_default_model();
    let template = model.chat_template.as_ref().unwrap();
    let question = [ChatMessage::new("user", "What is the capital of France?")];
    let prompt = model.tokenizer.encode(&template.render(&question, true).unwrap());
    let mut f32_kv = cuda(&model, 64, 16, KvDtype::F32, true);
    let mut f16_kv = cuda(&model, 64, 16, KvDtype::F16, true);
    // Teacher-forced: both caches are fed the f32 path's greedy tokens, so every step compares the same input.
    let table: Vec<u32> = (0..8).collect();
    let first = [item(&prompt, 0, &table, Logits::Full)];
    let (a, b) = (f32_kv.forward(&first).unwrap(), f16_kv.forward(&first).unwrap());
    let mut worst = 0f32;
    let mut rel = |what: &str, x: &[f32], y: &[f32]| {
        let scale = x.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        let diff = x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        let r = diff / scale;
        assert!(
            r <= REL_TOL_F16,
            "{what}: f16 KV logits {r:.2e} of the largest logit from f32 KV"
        );
        worst = worst.max(r);
    };
    rel("prefill", &a.logits[0], &b.logits[0]);
    let (mut next, mut next16) = (argmax(&a.logits[0]) as u32, argmax(&b.logits[0]) as u32);
    let (mut ids, mut agree) = (vec![next], usize::from(next == next16));
    for step in 0..40 {
        let pos = prompt.len() + step;
        let t = [next];
        let batch = [item(&t, pos, &table, Logits::Full)];
        let (a, b) = (f32_kv.forward(&batch).unwrap(), f16_kv.forward(&batch).unwrap());
        rel(&format!("decode step {step}"), &a.logits[0], &b.logits[0]);
        next = argmax(&a.logits[0]) as u32;
        next16 = argmax(&b.logits[0]) as u32;
        agree += usize::from(next == next16);
        ids.push(next);
        if model.config.eos_token_ids.contains(&next) {
            break;
        }
    }
    eprintln!(
        "f16 KV vs f32 KV: worst logit difference {worst:.2e} of the largest logit over {} steps; greedy choice \
         agrees on {agree} of them; answer {:?}",
        ids.len(),
        model.tokenizer.decode(&ids)
    );
}

fn load_default_model() -> Arc<Model> {
    let path = default_model_path();
    assert!(
        path.exists(),
        "default model missing at {}: set LLMSERVE_MODEL to the SmolLM2-135M-Instruct.Q4_1.gguf file",
        path.display()
    );
    Arc::new(Model::load(&path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display())))
}

/// Greedy generation on one backend: prefill in chunks of `chunk`, then up to `max_new` tokens (stops at EOS),
/// each decode step asking for the argmax only, as the engine does for greedy requests.
fn generate(backend: &mut dyn Backend, prompt: &[u32], chunk: usize, max_new: usize) -> Vec<u32> {
    let eos = backend.config().eos_token_ids.clone();
    let total = prompt.len() + max_new;
    let table: Vec<u32> = (0..total.div_ceil(16) as u32).rev().collect();
    let mut logits = Vec::new();
    let mut pos = 0;
    while pos < prompt.len() {
        let end = (pos + chunk).min(prompt.len());
        let out = backend
            .forward(&[BatchItem {
                tokens: &prompt[pos..end],
                start_pos: pos,
                block_table: &table,
                logits: if end == prompt.len() {
                    Logits::Full
                } else {
                    Logits::None
                },
            }])
            .unwrap();
        if end == prompt.len() {
            logits = out.logits.into_iter().next().unwrap();
        }
        pos = end;
    }
    let mut out_ids = Vec::new();
    let mut next = argmax(&logits) as u32;
    while out_ids.len() < max_new {
        out_ids.push(next);
        if eos.contains(&next) {
            break;
        }
        let p = prompt.len() + out_ids.len() - 1;
        let out = backend
            .forward(&[BatchItem {
                tokens: std::slice::from_ref(&next),
                start_pos: p,
                block_table: &table,
                logits: Logits::Argmax,
            }])
            .unwrap();
        next = out.tokens[0];
    }
    out_ids
}

#[test]
#[ignore = "needs an NVIDIA GPU and the default model (LLMSERVE_MODEL)"]
fn cuda_answers_capital_of_france_like_the_cpu() {
    let model = load_default_model();
    let template = model.chat_template.as_ref().unwrap();
    let question = [ChatMessage::new("user", "What is the capital of France?")];
    let prompt = model.tokenizer.encode(&template.render(&question, true).unwrap());
    let mut gpu = CudaBackend::new(model.clone(), 64, 16, 0).unwrap();
    let ids = generate(&mut gpu, &prompt, 7, 20);
    let answer = model.tokenizer.decode(&ids);
    eprintln!("GPU answer: {answer:?}");
    assert!(answer.contains("Paris"), "GPU answer {answer:?} lacks Paris");
    let mut cpu = CpuBackend::new(model.clone(), 64, 16, 0).unwrap();
    let cpu_ids = generate(&mut cpu, &prompt, 7, 20);
    eprintln!("CPU answer: {:?}", model.tokenizer.decode(&cpu_ids));
    eprintln!(
        "greedy outputs {} on CPU and GPU",
        if ids == cpu_ids {
            "identical"
        } else {
            "DIFFER (near-tied logits?)"
        }
    );
    // Whole-prompt prefill logits agree too.
    let table: Vec<u32> = (0..8).collect();
    let item = [BatchItem {
        tokens: &prompt,
        start_pos: 0,
        block_table: &table,
        logits: Logits::Full,
    }];
    let worst = compare(
        "default model prefill",
        &cpu.forward(&item).unwrap().logits,
        &gpu.forward(&item).unwrap().logits,
    );
    eprintln!("default model: prefill logits agree, worst relative difference {worst:.2e}");
}

/// Prefill of a long prompt on tensor cores (the default from 64 tokens on sm_80+: exact quants, activations as f16
/// hi + lo, f32 sums and scales) against the same prompt on CUDA cores (`mma_min_tokens` 0) and on the CPU: the
/// logits agree within [`REL_TOL`] (f32 results both ways; the bound is the f16 cache's [`REL_TOL_F16`]), the
/// greedy token is the same, in one step and in chunks; and (printing only) the time of a 512-token prompt both
/// ways, the goal being 5 ms.
#[test]
#[ignore = "needs an NVIDIA GPU of sm_80 or later and the default model (LLMSERVE_MODEL)"]
fn cuda_tensor_core_prefill_stays_within_the_f16_tolerance() {
    let model = load_default_model();
    let text = "The history of the Roman Empire begins with the founding of the city of Rome. ".repeat(40);
    let mut prompt = model.tokenizer.encode(&text);
    prompt.truncate(512);
    assert_eq!(prompt.len(), 512);
    let mut tc = cuda(&model, 256, 16, KvDtype::F16, true);
    assert!(
        tc.describe().contains("tensor-core products from"),
        "{}",
        tc.describe()
    );
    let options = CudaOptions {
        mma_min_tokens: 0,
        ..CudaOptions::default()
    };
    let mut cc = CudaBackend::with_options(model.clone(), 256, 16, options).unwrap();
    let mut cpu = CpuBackend::new(model.clone(), 256, 16, 0).unwrap();
    let table: Vec<u32> = (0..33).collect();
    let whole = [item(&prompt, 0, &table, Logits::Full)];
    let want = cpu.forward(&whole).unwrap().logits;
    for (what, gpu) in [("tensor cores", &mut tc), ("CUDA cores", &mut cc)] {
        let got = gpu.forward(&whole).unwrap().logits;
        let scale = want[0].iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = want[0]
            .iter()
            .zip(&got[0])
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!(
            "512-token prefill on {what}: logits {:.2e} of the largest from the CPU's",
            diff / scale
        );
        assert!(diff / scale <= REL_TOL, "{what}: {:.2e}", diff / scale);
        assert_eq!(argmax(&got[0]), argmax(&want[0]), "{what}: the greedy token");
    }
    // In chunks (the scheduler's way): 300 tokens, then 212 with the logits.
    tc.forward(&[item(&prompt[..300], 0, &table, Logits::None)])
        .unwrap();
    let chunked = tc
        .forward(&[item(&prompt[300..], 300, &table, Logits::Full)])
        .unwrap()
        .logits;
    assert_eq!(argmax(&chunked[0]), argmax(&want[0]), "chunked: the greedy token");
    for (what, gpu) in [("tensor cores", &mut tc), ("CUDA cores", &mut cc)] {
        let rounds = 20;
        let one = [item(&prompt, 0, &table, Logits::Argmax)];
        gpu.forward(&one).unwrap();
        let t0 = Instant::now();
        for _ in 0..rounds {
            gpu.forward(&one).unwrap();
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3 / rounds as f64;
        eprintln!(
            "512-token prompt on {what}: {ms:.2} ms ({:.0} tokens/s; goal: 5 ms)",
            512.0 / ms * 1e3
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_step_times_are_cuda_events_on_the_host_boottime_clock() {
    let model = tiny_model(GgmlType::Q4_1, false);
    let mut gpu = CudaBackend::new(model, 64, 4, 0).unwrap();
    assert_eq!(gpu.device_clock(), DeviceClock::CudaEvents);
    let toks: Vec<u32> = (3..40).collect();
    let table: Vec<u32> = (0..16).collect();
    let started = Instant::now();
    let mut n = 0;
    // Run for over two anchor intervals so the clock is re-anchored.
    while started.elapsed().as_secs_f64() < 2.5 {
        let before = llmprof_probes::boottime_ns();
        let out = gpu
            .forward(&[BatchItem {
                tokens: &toks,
                start_pos: 0,
                block_table: &table,
                logits: Logits::Full,
            }])
            .unwrap();
        let after = llmprof_probes::boottime_ns();
        // The anchor's uncertainty is a few microseconds; allow 50 µs.
        let slack = 50_000;
        assert!(
            out.device_start_ns + slack >= before,
            "device start {} before the call began {before}",
            out.device_start_ns
        );
        assert!(
            out.device_end_ns <= after + slack,
            "device end {} after the call returned {after}",
            out.device_end_ns
        );
        assert!(out.device_end_ns > out.device_start_ns, "empty device interval");
        n += 1;
    }
    assert!(
        gpu.clock_anchors() >= 2,
        "{} anchors in 2.5 s of steps: the clock is not re-anchored",
        gpu.clock_anchors()
    );
    eprintln!("{n} steps, {} clock anchors", gpu.clock_anchors());
}

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

#[test]
#[ignore = "needs an NVIDIA GPU and the default model; prints decode throughput"]
fn cuda_decode_throughput_batch_1_and_32() {
    let model = load_default_model();
    for (kv, graphs) in [(KvDtype::F16, true), (KvDtype::F32, false), (KvDtype::F16, false)] {
        let mut gpu = cuda(&model, 1024, 16, kv, graphs);
        decode_throughput(&mut gpu, &format!("KV {kv:?}, graphs {graphs}"));
    }
    // Without the fused RMSNorm launches (separate norm, matmul and RoPE launches; the default fuses steps of up
    // to 256 tokens).
    let options = CudaOptions {
        fuse_max_tokens: 0,
        ..CudaOptions::default()
    };
    let mut gpu = CudaBackend::with_options(model.clone(), 1024, 16, options).unwrap();
    decode_throughput(&mut gpu, "KV F16, graphs true, no fused launches");
}

/// Decode tokens/s at batch 1 and 32: greedy (argmax only, what the engine asks for greedy requests), drawn on the
/// device as a chat client asks (temperature 0.8, top_p 0.95; and OpenAI's default, temperature 1), and with the
/// logits copied back, side by side, with the sampled/greedy ratio; then prefill tokens/s of one 512-token prompt
/// (the engine's default step budget).
fn decode_throughput(gpu: &mut CudaBackend, what: &str) {
    let chat = SampleSpec {
        params: SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            ..SamplingParams::default()
        },
        seed: 1,
        index: 0,
        history: &[],
        logprobs: None,
    };
    let openai_default = SampleSpec {
        params: SamplingParams::default(),
        ..chat
    };
    for batch in [1usize, 32] {
        let mut greedy_tps = 0.0;
        for (name, want) in [
            ("greedy", Logits::Argmax),
            ("T 0.8 top_p 0.95", Logits::Sample(chat)),
            ("T 1.0", Logits::Sample(openai_default)),
            ("full logits", Logits::Full),
        ] {
            let prompt_len = 32;
            let steps = 128;
            let tables: Vec<Vec<u32>> = (0..batch)
                .map(|s| {
                    (0..((prompt_len + steps) / 16 + 1) as u32)
                        .map(|b| s as u32 * 16 + b)
                        .collect()
                })
                .collect();
            let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| 100 + i).collect();
            let items: Vec<BatchItem<'_>> =
                tables.iter().map(|t| item(&prompt, 0, t, Logits::Full)).collect();
            gpu.forward(&items).unwrap();
            let toks: Vec<u32> = vec![200; batch];
            let t0 = Instant::now();
            let mut device_ns = 0u64;
            for s in 0..steps {
                let items: Vec<BatchItem<'_>> = tables
                    .iter()
                    .enumerate()
                    .map(|(i, t)| item(&toks[i..i + 1], prompt_len + s, t, want))
                    .collect();
                let out = gpu.forward(&items).unwrap();
                device_ns += out.device_end_ns - out.device_start_ns;
            }
            let wall = t0.elapsed().as_secs_f64();
            let tps = (batch * steps) as f64 / wall;
            if matches!(want, Logits::Argmax) {
                greedy_tps = tps;
            }
            eprintln!(
                "{what}: batch {batch}, {name}: {tps:.0} tokens/s decode ({:.2} ms/step; device busy {:.0}% of the \
                 step; {:.2}x greedy)",
                wall * 1e3 / steps as f64,
                100.0 * device_ns as f64 / 1e9 / wall,
                tps / greedy_tps.max(1e-9)
            );
        }
    }
    let prompt: Vec<u32> = (0..512u32).map(|i| 100 + i).collect();
    let table: Vec<u32> = (0..33).collect();
    let rounds = 8;
    let t0 = Instant::now();
    for _ in 0..rounds {
        gpu.forward(&[item(&prompt, 0, &table, Logits::Argmax)]).unwrap();
    }
    let wall = t0.elapsed().as_secs_f64();
    eprintln!(
        "{what}: prefill of 512 tokens: {:.0} tokens/s ({:.2} ms per prompt)",
        (rounds * prompt.len()) as f64 / wall,
        wall * 1e3 / rounds as f64
    );
}
