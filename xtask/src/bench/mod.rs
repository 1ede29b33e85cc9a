//! `cargo xtask bench <kind>`: benchmarks of the engine and of what llmprof costs a target.
//!
//! One module per kind ([`engine`], [`attach`], [`serve`], [`syscalls`], [`threads`], [`llama`], [`vllm`],
//! [`cuda`], [`startup`]), each owning its measurement and its report; the in-process kinds (`kernels`, `decode`,
//! `probes`, `trace`) are cargo bench targets of the crate they measure, run by [`micro`]. What several kinds
//! share lives beside them and never imports a kind: [`load`] (llmserve under a streaming HTTP load, and its
//! options), [`common`] (release build, the test process, llmprof sessions, the A/B setup) and [`stats`]
//! (medians and ranges). This module only names the kinds and hands each its options.

mod attach;
mod common;
mod cuda;
mod engine;
mod llama;
mod load;
mod micro;
mod serve;
mod startup;
mod stats;
mod syscalls;
mod threads;
mod vllm;

use anyhow::Result;

/// One bench, with its options.
#[derive(clap::Subcommand, Debug)]
pub enum Kind {
    /// Drives llmserve over HTTP at several concurrencies: decode tokens/s, TTFT/ITL p50/p95, peak RSS.
    #[command(after_help = "Example: cargo xtask bench engine --levels 1,8 --max-tokens 64")]
    Engine(load::EngineArgs),
    /// Decode tokens/s and TTFT with llmprof attached vs detached, A/B interleaved, and the trace size (root).
    #[command(after_help = "Example: sudo cargo xtask bench attach --levels 8")]
    Attach(load::EngineArgs),
    /// Decode tokens/s with `llmprof serve`'s flight recorder on vs off, A/B interleaved (root).
    #[command(after_help = "Example: sudo cargo xtask bench serve")]
    Serve(load::EngineArgs),
    /// A ~500k syscalls/s target detached / attached / attached with --overhead-budget (root).
    #[command(after_help = "Example: sudo cargo xtask bench syscalls --rounds 5 --budget 1%")]
    Syscalls(syscalls::Args),
    /// llmserve's CPU per generated token: detached vs stack samples and thread states on/off, interleaved (root).
    #[command(after_help = "Example: sudo cargo xtask bench threads --levels 4 --max-tokens 64")]
    Threads(load::EngineArgs),
    /// llama.cpp's server (llama_cpp.server): CPU per generated token detached vs attached, with the wire probe's
    /// and the samples' shares, interleaved (root; the servers venv of `cargo xtask setup`).
    #[command(after_help = "Example: sudo cargo xtask bench llama --levels 4 --max-tokens 64")]
    Llama(load::EngineArgs),
    /// vLLM's CPU build (vllm serve): its CPU per generated token under sampled requests, detached vs attached
    /// with the Python hooks vs `--python-hooks off`, interleaved (root; the vLLM venv of `cargo xtask setup`).
    #[command(after_help = "Example: sudo cargo xtask bench vllm --levels 8 --max-tokens 64")]
    Vllm(load::EngineArgs),
    /// Target CPU per CUDA kernel launch against the stand-in libcuda: detached, `--cuda-calls counted`
    /// (the default), `--cuda-calls all`, interleaved (root).
    /// With `--cupti`, the stand-in CUPTI too: detached, the default kernel summaries, `--gpu-kernels all`,
    /// `--gpu-kernels off` (the CPU twin of `tools/gpu/bench_attach.py`).
    #[command(
        after_help = "Example: sudo cargo xtask bench cuda --rounds 5; sudo cargo xtask bench cuda --cupti"
    )]
    Cuda(cuda::Args),
    /// `llmprof attach` on an idle target: command to "probes live", and the calibration beside the session
    /// (root).
    #[command(after_help = "Example: sudo cargo xtask bench startup --rounds 9")]
    Startup(startup::Args),
    /// The CPU kernels' quantized matmul throughput (GMAC/s of on-CPU time, one thread) per weight type and
    /// tokens per call, weights in cache and cold. `LLMSERVE_SIMD=avx512|avx2|scalar` caps the kernel family.
    #[command(after_help = "Example: cargo xtask bench kernels --rounds 3")]
    Kernels(micro::Args),
    /// The CPU engine's forward pass on the default model without the server: prefill and decode tokens/s,
    /// decode step time and CPU per token, for 1 and 8 sequences.
    #[command(after_help = "Example: LLMSERVE_BENCH_KV=f32 cargo xtask bench decode")]
    Decode(micro::Args),
    /// What a probe call costs the engine with no llmprof attached (ns per step, request and range call).
    #[command(after_help = "Example: cargo xtask bench probes")]
    Probes(micro::Args),
    /// Events per second through the merge and the Perfetto writer, and bytes per event in the trace.
    #[command(after_help = "Example: cargo xtask bench trace")]
    Trace(micro::Args),
}

/// `cargo xtask bench <kind>`.
pub fn run(kind: Kind) -> Result<()> {
    match kind {
        Kind::Engine(o) => engine::run(&o),
        Kind::Attach(o) => attach::run(&o),
        Kind::Serve(o) => serve::run(&o),
        Kind::Syscalls(o) => syscalls::run(&o),
        Kind::Threads(o) => threads::run(&o),
        Kind::Llama(o) => llama::run(&o),
        Kind::Vllm(o) => vllm::run(&o),
        Kind::Cuda(o) => cuda::run(&o),
        Kind::Startup(o) => startup::run(&o),
        Kind::Kernels(o) => micro::run(micro::KERNELS, &o),
        Kind::Decode(o) => micro::run(micro::DECODE, &o),
        Kind::Probes(o) => micro::run(micro::PROBES, &o),
        Kind::Trace(o) => micro::run(micro::TRACE, &o),
    }
}
