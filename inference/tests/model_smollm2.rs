//! The default model (SmolLM2-135M-Instruct Q4_1) through the real loader, tokenizer, chat template and CPU
//! backend: the capital-of-France answer, tokenizer round trips against the file's own vocabulary, and (ignored,
//! release builds) a decode/prefill speed measurement.
//!
//! Without the model file these tests skip loudly, unless `CI=true`, where a missing model fails them
//! (run `cargo xtask fetch-model`).

use std::sync::Arc;
use std::time::Instant;

use inference::backend::cpu::CpuBackend;
use inference::backend::{Backend, BatchItem, Logits};
use inference::chat_template::ChatMessage;
use inference::model::{Model, default_model_path};

/// Block size of the KV cache in these tests (vLLM's default block size is 16).
const BLOCK_SIZE: usize = 16;

fn load_default_model() -> Option<Arc<Model>> {
    let path = default_model_path();
    if !e2e::require(
        path.exists(),
        &format!(
            "default model missing at {} (run `cargo xtask fetch-model`)",
            path.display()
        ),
    ) {
        return None;
    }
    Some(Arc::new(
        Model::load(&path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display())),
    ))
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy generation: prefill in chunks of `chunk` tokens, then decode up to `max_new` tokens (stops at EOS).
/// Returns (generated ids, prefill seconds, decode seconds).
fn generate(
    backend: &mut CpuBackend,
    prompt: &[u32],
    chunk: usize,
    max_new: usize,
    stop_at_eos: bool,
) -> (Vec<u32>, f64, f64) {
    let eos = backend.config().eos_token_ids.clone();
    let total = prompt.len() + max_new;
    let table: Vec<u32> = (0..total.div_ceil(BLOCK_SIZE) as u32).rev().collect();
    let t0 = Instant::now();
    let mut logits = Vec::new();
    let mut pos = 0;
    while pos < prompt.len() {
        let end = (pos + chunk).min(prompt.len());
        let item = BatchItem {
            tokens: &prompt[pos..end],
            start_pos: pos,
            block_table: &table,
            logits: if end == prompt.len() {
                Logits::Full
            } else {
                Logits::None
            },
        };
        let out = backend.forward(&[item]).expect("prefill");
        if end == prompt.len() {
            logits = out.logits.into_iter().next().expect("logits");
            assert_eq!(
                out.tokens,
                [argmax(&logits)],
                "the backend's argmax of the logits it returned"
            );
        }
        pos = end;
    }
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut out_ids = Vec::new();
    let mut next = argmax(&logits);
    while out_ids.len() < max_new {
        out_ids.push(next);
        if stop_at_eos && eos.contains(&next) {
            break;
        }
        let p = prompt.len() + out_ids.len() - 1;
        let item = BatchItem {
            tokens: std::slice::from_ref(&next),
            start_pos: p,
            block_table: &table,
            logits: Logits::Argmax,
        };
        // Greedy decoding as the engine does it: only the most likely token comes back.
        let out = backend.forward(&[item]).expect("decode");
        assert!(out.logits.is_empty(), "an argmax-only item gets no logits");
        next = out.tokens[0];
    }
    (out_ids, prefill_s, t1.elapsed().as_secs_f64())
}

/// User + system CPU seconds of this process (from /proc/self/stat, in clock ticks of 1/100 s on Linux).
fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_comm = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 14 and 15 of proc(5) are utime and stime; `after_comm` starts at field 3.
    let ticks = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(14) + ticks(15)) / 100.0
}

#[test]
fn model_answers_capital_of_france() {
    let Some(model) = load_default_model() else { return };
    assert_eq!(model.config.n_layers, 30);
    assert_eq!(model.config.dim, 576);
    assert_eq!(
        model.file_bytes,
        std::fs::metadata(&model.path).expect("stat").len()
    );
    let template = model
        .chat_template
        .as_ref()
        .expect("the default model has a chat template");
    let question = [ChatMessage::new("user", "What is the capital of France?")];
    let prompt_text = template.render(&question, true).expect("render");
    assert!(
        prompt_text.contains("<|im_start|>user\nWhat is the capital of France?<|im_end|>"),
        "{prompt_text}"
    );
    let prompt = model.tokenizer.encode(&prompt_text);
    // Both KV-cache types: f16 is the server's default, f32 the reference's.
    for kv_f16 in [true, false] {
        let mut backend =
            CpuBackend::with_kv_f16(Arc::clone(&model), 64, BLOCK_SIZE, 0, kv_f16).expect("backend");
        let (ids, _, _) = generate(&mut backend, &prompt, 7, 20, true);
        let answer = model.tokenizer.decode(&ids);
        eprintln!("answer (KV cache {}): {answer:?}", backend.kv_cache_dtype());
        assert!(answer.contains("Paris"), "answer {answer:?} lacks Paris");
    }
}

#[test]
fn model_tokenizer_round_trips_and_matches_vocabulary() {
    let Some(model) = load_default_model() else { return };
    let tok = &model.tokenizer;
    for text in [
        "Hello, world! What is the capital of France?",
        "naïve café — 日本語 😀 emoji\n\n  indented\tand 12345 numbers",
        "<|im_start|>user\nHi<|im_end|>\n",
    ] {
        let ids = tok.encode(text);
        assert_eq!(tok.decode(&ids), text);
    }
    // Specials are whole tokens.
    let im_start = tok.token_id("<|im_start|>").expect("<|im_start|> in vocab");
    assert!(tok.is_special(im_start));
    assert_eq!(tok.encode("<|im_start|>"), vec![im_start]);
    // Strings that are single vocabulary entries encode to that entry.
    for word in ["Hello", "Ġworld", "Ġcapital", "ĠParis"] {
        let id = tok.token_id(word).unwrap_or_else(|| panic!("{word} in vocab"));
        let text = word.replace('Ġ', " ");
        assert_eq!(tok.encode(&text), vec![id], "{text:?}");
        assert_eq!(tok.token_bytes(id), text.as_bytes());
    }
    // SmolLM's pre-tokenizer splits digits one by one.
    let digits = tok.encode("2024");
    assert_eq!(digits.len(), 4, "{digits:?}");
    // A long run without spaces (one pre-token) encodes to few tokens and round-trips (the merge is
    // O(n log n): this used to take minutes of CPU).
    let long = "a".repeat(20_000);
    let ids = tok.encode(&long);
    assert!(
        ids.len() < long.len() / 2,
        "long run merged: {} tokens",
        ids.len()
    );
    assert_eq!(tok.decode(&ids), long);
}

/// `cargo test --release -p inference --test model_smollm2 -- --ignored --nocapture`
#[test]
#[ignore = "speed measurement; run in release with --ignored --nocapture"]
fn model_decode_speed() {
    let t_load = Instant::now();
    let Some(model) = load_default_model() else { return };
    println!(
        "load: {:.2} s for {} bytes ({} bytes of weights in memory)",
        t_load.elapsed().as_secs_f64(),
        model.file_bytes,
        model.weights.storage_bytes()
    );
    let threads: usize = std::env::var("LLMSERVE_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let mut backend = CpuBackend::new(Arc::clone(&model), 64, BLOCK_SIZE, threads).expect("backend");
    let template = model.chat_template.as_ref().expect("template");
    let text = template
        .render(
            &[ChatMessage::new(
                "user",
                "Write a long story about a dragon who learns to cook.",
            )],
            true,
        )
        .expect("render");
    let prompt = model.tokenizer.encode(&text);
    // Warm up.
    generate(&mut backend, &prompt, 256, 4, false);
    let cpu0 = process_cpu_seconds();
    let (ids, prefill_s, decode_s) = generate(&mut backend, &prompt, 256, 128, false);
    let cpu_s = process_cpu_seconds() - cpu0;
    // One forward per generated token (the first one comes from the prefill, the loop runs one more).
    let decode_tps = ids.len() as f64 / decode_s;
    println!(
        "threads={threads} simd={} prompt={} tokens prefill {:.1} tokens/s, decode {} tokens {:.1} tokens/s",
        inference::quant::simd_available(),
        prompt.len(),
        prompt.len() as f64 / prefill_s,
        ids.len(),
        decode_tps
    );
    println!(
        "process CPU time {cpu_s:.2} s over {:.2} s wall (CPU-bound ideal on {threads} idle cores: {:.1} tokens/s overall)",
        prefill_s + decode_s,
        (ids.len() + prompt.len()) as f64 / (cpu_s / threads as f64)
    );
    println!("text: {:?}", model.tokenizer.decode(&ids));
}

/// Batched decode without the server: 8 sequences prefilled together, then decode steps of 8 tokens (the
/// engine's concurrency-8 step), greedy; step times as median and range, and the process's CPU time per token
/// (steal time on a shared VM is not counted). Side by side: run once plain and once with `LLMSERVE_SIMD=avx512`
/// (kernel families) or `LLMSERVE_BENCH_KV=f32` (KV-cache types).
/// `cargo test --release -p inference --test model_smollm2 model_batch_decode_speed -- --ignored --nocapture`
#[test]
#[ignore = "speed measurement; run in release with --ignored --nocapture"]
fn model_batch_decode_speed() {
    let Some(model) = load_default_model() else { return };
    const SEQS: usize = 8;
    const STEPS: usize = 96;
    // The server's default KV cache (f16); `LLMSERVE_BENCH_KV=f32` for the other.
    let kv_f16 = std::env::var("LLMSERVE_BENCH_KV").as_deref() != Ok("f32");
    let mut backend =
        CpuBackend::with_kv_f16(Arc::clone(&model), 64 * SEQS, BLOCK_SIZE, 2, kv_f16).expect("backend");
    let prompts: Vec<Vec<u32>> = (0..SEQS)
        .map(|i| {
            model.tokenizer.encode(&format!(
                "Story number {i}: once upon a time, in a land far away, there lived"
            ))
        })
        .collect();
    let per_seq = (prompts.iter().map(Vec::len).max().unwrap_or(0) + STEPS + 8).div_ceil(BLOCK_SIZE);
    let tables: Vec<Vec<u32>> = (0..SEQS)
        .map(|s| (0..per_seq).map(|b| (s * per_seq + b) as u32).collect())
        .collect();
    // The first pass warms up (first touch of the KV blocks and buffers); the second is measured.
    let mut measured = None;
    for _pass in 0..2 {
        measured = Some(batch_decode(&mut backend, &prompts, &tables, STEPS));
    }
    let Some((prefill_s, mut steps, cpu_s)) = measured else {
        unreachable!("two passes")
    };
    steps.sort_by(f64::total_cmp);
    println!(
        "kernels {:?}, KV cache {}: prefill {} tokens in {:.1} ms; decode step of {SEQS}: median {:.2} ms [{:.2}–{:.2}], {:.0} tokens/s; \
         CPU {:.2} ms per token",
        inference::quant::simd_level(),
        backend.kv_cache_dtype(),
        prompts.iter().map(Vec::len).sum::<usize>(),
        prefill_s * 1e3,
        steps[STEPS / 2],
        steps[0],
        steps[STEPS - 1],
        SEQS as f64 * 1e3 / steps[STEPS / 2],
        cpu_s * 1e3 / (STEPS * SEQS) as f64
    );
}

/// One pass of [`model_batch_decode_speed`]: prefill all `prompts` together, then `steps` greedy decode steps
/// of one token each. Returns (prefill seconds, step milliseconds, process CPU seconds of the steps).
fn batch_decode(
    backend: &mut CpuBackend,
    prompts: &[Vec<u32>],
    tables: &[Vec<u32>],
    steps: usize,
) -> (f64, Vec<f64>, f64) {
    let seqs = prompts.len();
    let items: Vec<BatchItem<'_>> = (0..seqs)
        .map(|s| BatchItem {
            tokens: &prompts[s],
            start_pos: 0,
            block_table: &tables[s],
            logits: Logits::Full,
        })
        .collect();
    let t = Instant::now();
    let out = backend.forward(&items).expect("prefill");
    let prefill_s = t.elapsed().as_secs_f64();
    let mut next: Vec<u32> = out.logits.iter().map(|l| argmax(l)).collect();
    let mut pos: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let mut times = Vec::with_capacity(steps);
    let cpu0 = process_cpu_seconds();
    for _ in 0..steps {
        let toks = next.clone();
        let items: Vec<BatchItem<'_>> = (0..seqs)
            .map(|s| BatchItem {
                tokens: std::slice::from_ref(&toks[s]),
                start_pos: pos[s],
                block_table: &tables[s],
                logits: Logits::Argmax,
            })
            .collect();
        let t = Instant::now();
        let out = backend.forward(&items).expect("decode");
        times.push(t.elapsed().as_secs_f64() * 1e3);
        next = out.tokens;
        pos.iter_mut().for_each(|p| *p += 1);
    }
    (prefill_s, times, process_cpu_seconds() - cpu0)
}
