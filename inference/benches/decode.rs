//! `cargo xtask bench decode`: the CPU engine's forward pass on the default model without the server: prompts
//! prefilled together, then greedy decode steps of one token per sequence (the engine's decode step), for 1
//! and for 8 sequences (the engine's concurrency-8 step). Per round: the prefill's tokens/s, the median decode
//! step, decode tokens/s at that median, and the process's CPU per generated token (steal time on a shared VM
//! is not counted). 2 compute threads (`LLMSERVE_THREADS` sets another count); the server's f16 KV cache
//! (`LLMSERVE_BENCH_KV=f32` for the other); `LLMSERVE_SIMD=avx512|avx2|scalar` caps the kernel family.

mod common;

use std::sync::Arc;
use std::time::Instant;

use inference::backend::cpu::CpuBackend;
use inference::backend::{Backend, BatchItem, Logits};
use inference::model::{Model, default_model_path};

use common::{emit, fail, process_cpu_seconds, rounds};

/// Token slots per KV-cache block (the server's default).
const BLOCK_SIZE: usize = 16;
/// Decode steps per pass.
const STEPS: usize = 96;

/// One pass: prefill every prompt together, then [`STEPS`] greedy steps of one token each. Returns (prefill
/// seconds, step milliseconds, process CPU seconds of the steps).
fn pass(backend: &mut CpuBackend, prompts: &[Vec<u32>], tables: &[Vec<u32>]) -> (f64, Vec<f64>, f64) {
    let items: Vec<BatchItem<'_>> = prompts
        .iter()
        .zip(tables)
        .map(|(p, t)| BatchItem {
            tokens: p,
            start_pos: 0,
            block_table: t,
            logits: Logits::Argmax,
        })
        .collect();
    let t = Instant::now();
    let out = backend
        .forward(&items)
        .unwrap_or_else(|e| fail(&format!("prefill: {e}")));
    let prefill_s = t.elapsed().as_secs_f64();
    let mut next = out.tokens;
    let mut pos: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let mut times = Vec::with_capacity(STEPS);
    let cpu0 = process_cpu_seconds();
    for _ in 0..STEPS {
        let toks = next.clone();
        let items: Vec<BatchItem<'_>> = (0..prompts.len())
            .map(|s| BatchItem {
                tokens: std::slice::from_ref(&toks[s]),
                start_pos: pos[s],
                block_table: &tables[s],
                logits: Logits::Argmax,
            })
            .collect();
        let t = Instant::now();
        let out = backend
            .forward(&items)
            .unwrap_or_else(|e| fail(&format!("decode: {e}")));
        times.push(t.elapsed().as_secs_f64() * 1e3);
        next = out.tokens;
        pos.iter_mut().for_each(|p| *p += 1);
    }
    (prefill_s, times, process_cpu_seconds() - cpu0)
}

fn main() {
    let rounds = rounds();
    let path = default_model_path();
    if !path.exists() {
        fail(&format!(
            "the default model is missing at {} (cargo xtask fetch-model)",
            path.display()
        ));
    }
    let model = Arc::new(Model::load(&path).unwrap_or_else(|e| fail(&format!("{}: {e}", path.display()))));
    let threads: usize = std::env::var("LLMSERVE_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let kv_f16 = std::env::var("LLMSERVE_BENCH_KV").as_deref() != Ok("f32");
    for seqs in [1, 8] {
        let prompts: Vec<Vec<u32>> = (0..seqs)
            .map(|i| {
                model.tokenizer.encode(&format!(
                    "Story number {i}: once upon a time, in a land far away, there lived"
                ))
            })
            .collect();
        let per_seq = (prompts.iter().map(Vec::len).max().unwrap_or(0) + STEPS + 8).div_ceil(BLOCK_SIZE);
        let tables: Vec<Vec<u32>> = (0..seqs)
            .map(|s| (0..per_seq).map(|b| (s * per_seq + b) as u32).collect())
            .collect();
        let mut backend =
            CpuBackend::with_kv_f16(Arc::clone(&model), per_seq * seqs, BLOCK_SIZE, threads, kv_f16)
                .unwrap_or_else(|e| fail(&format!("backend: {e}")));
        eprintln!(
            "decode: {seqs} sequence(s), {threads} threads, kernels {:?}, KV cache {}, {rounds} rounds",
            inference::quant::simd_level(),
            backend.kv_cache_dtype()
        );
        // The first pass warms up (first touch of the KV blocks and buffers).
        pass(&mut backend, &prompts, &tables);
        let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
        for _ in 0..rounds {
            let (prefill_s, mut steps, cpu_s) = pass(&mut backend, &prompts, &tables);
            steps.sort_by(f64::total_cmp);
            let median = steps[STEPS / 2];
            emit(
                &format!("{seqs} seq prefill"),
                "tokens/s",
                prompt_tokens as f64 / prefill_s,
            );
            emit(&format!("{seqs} seq decode step, median"), "ms", median);
            emit(
                &format!("{seqs} seq decode"),
                "tokens/s",
                seqs as f64 * 1e3 / median,
            );
            emit(
                &format!("{seqs} seq decode CPU per token"),
                "ms",
                cpu_s * 1e3 / (STEPS * seqs) as f64,
            );
        }
    }
}
