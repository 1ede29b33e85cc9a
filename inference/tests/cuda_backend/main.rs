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

mod accuracy;
mod graphs;
mod sampling;
mod timing;

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

fn load_default_model() -> Arc<Model> {
    let path = default_model_path();
    assert!(
        path.exists(),
        "default model missing at {}: set LLMSERVE_MODEL to the SmolLM2-135M-Instruct.Q4_1.gguf file",
        path.display()
    );
    Arc::new(Model::load(&path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display())))
}
