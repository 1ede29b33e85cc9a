//! The default model (SmolLM2-135M-Instruct Q4_1) through the real loader, tokenizer, chat template and CPU
//! backend: the capital-of-France answer and tokenizer round trips against the file's own vocabulary (its speed
//! is `cargo xtask bench decode`).
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
