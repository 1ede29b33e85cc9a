//! GPU against CPU: logits of every tensor type, the f16 KV cache, tensor-core prefill, and the default model's
//! answer.

use super::*;

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
