//! Command-line configuration of `llmserve` (clap) and its defaults.
//!
//! Owns the flags, their defaults (each with where its value comes from) and the conversion into the engine's
//! configuration. Does no I/O.

use std::path::PathBuf;

use clap::Parser;

use crate::backend::KvCacheDtype;
use crate::backend::device::{BackendOptions, DeviceChoice};
use crate::engine::EngineConfig;
use crate::scheduler::SchedulerConfig;

/// Default KV-cache size in blocks: 1024 blocks × 16 tokens = 16384 token slots, enough for 8 sequences of the
/// default model's 2048-token context; at SmolLM2-135M's 30 layers × 3 KV heads × 64 dims × 2 (K,V) × 4 bytes =
/// 46 KiB per token this is ~720 MiB.
pub const DEFAULT_NUM_KV_BLOCKS: usize = 1024;
/// Default block size in tokens (vLLM's default `--block-size` 16).
pub const DEFAULT_BLOCK_SIZE: usize = 16;
/// Default cap on running sequences ([`crate::backend::DEFAULT_MAX_BATCH`]: the backends are sized for it).
pub const DEFAULT_MAX_NUM_SEQS: usize = crate::backend::DEFAULT_MAX_BATCH;
/// Default per-step token budget (vLLM V1's default `max_num_batched_tokens` for online serving is 2048; a CPU
/// step of 512 prompt tokens keeps decode stalls of running sequences short).
pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 512;
/// Default cap on requests waiting to be scheduled before 429.
pub const DEFAULT_MAX_QUEUE: usize = 256;
/// Messages buffered per client stream before output is held back and coalesced.
pub const DEFAULT_STREAM_CAPACITY: usize = 64;

/// `llmserve`: an OpenAI-compatible LLM server for GGUF Llama-family models.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "llmserve",
    version,
    about = "OpenAI-compatible LLM server (GGUF Llama-family models) with continuous batching, vLLM metrics and llmprof probe points",
    after_help = "Examples:
  llmserve                                   # default model (cargo xtask fetch-model), port 8000
  llmserve --model ./model.gguf --port 0     # any free port; the address is printed on stdout
  llmserve --device cuda                     # on the GPU (build with --features cuda)
  curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
       -d '{\"messages\":[{\"role\":\"user\",\"content\":\"What is the capital of France?\"}],\"temperature\":0}'
  curl -s -XPOST localhost:8000/admin/reload -d '{\"path\":\"./other.gguf\"}'   # swap weights while serving"
)]
pub struct Args {
    /// GGUF model file [default: $LLMSERVE_MODEL or ~/.cache/llmprof/models/SmolLM2-135M-Instruct.Q4_1.gguf].
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Model name reported by the API and the metrics [default: the model file name without `.gguf`].
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// KV-cache size in blocks.
    #[arg(long, default_value_t = DEFAULT_NUM_KV_BLOCKS)]
    pub num_kv_blocks: usize,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = DEFAULT_BLOCK_SIZE)]
    pub block_size: usize,
    /// Most sequences running at once.
    #[arg(long, default_value_t = DEFAULT_MAX_NUM_SEQS)]
    pub max_num_seqs: usize,
    /// Most tokens computed per engine step (chunked prefill beyond it).
    #[arg(long, default_value_t = DEFAULT_MAX_NUM_BATCHED_TOKENS)]
    pub max_num_batched_tokens: usize,
    /// Most requests waiting to be scheduled; more get 429.
    #[arg(long, default_value_t = DEFAULT_MAX_QUEUE)]
    pub max_queue: usize,
    /// Compute threads [default: available CPUs].
    #[arg(long)]
    pub threads: Option<usize>,
    /// POST anonymous usage statistics (model, uptime, counters) to this `http://` URL, like vLLM's usage
    /// reporting. Off by default.
    #[arg(long, value_name = "URL")]
    pub usage_stats_url: Option<String>,
    /// Interval between usage-stats reports, e.g. `30s`, `500ms`, `5m`.
    #[arg(long, default_value = "300s", value_parser = llmprof_units::parse_duration)]
    pub usage_stats_interval: std::time::Duration,
    /// Compute device: `cpu`; `cuda` (an NVIDIA GPU; needs a build with `--features cuda`, the NVIDIA driver
    /// and NVRTC, and fails with the reason when one is missing); `auto` (CUDA when usable, else the CPU).
    #[arg(long, value_enum, default_value_t = DeviceChoice::Cpu)]
    pub device: DeviceChoice,
    /// KV-cache element type: `auto` (f16), `f16`, `f32`.
    #[arg(long, value_enum, default_value_t = KvCacheDtype::Auto)]
    pub kv_cache_dtype: KvCacheDtype,
    /// GPU: launch every decode step's kernels one by one instead of replaying CUDA graphs (vLLM's flag).
    #[arg(long)]
    pub enforce_eager: bool,
}

impl Args {
    /// Compute threads to use.
    pub fn threads(&self) -> usize {
        self.threads
            .filter(|&t| t > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// How to create the compute backend.
    pub fn backend_options(&self) -> BackendOptions {
        BackendOptions {
            num_blocks: self.num_kv_blocks.max(1),
            block_size: self.block_size.max(1),
            threads: self.threads(),
            kv_cache_dtype: self.kv_cache_dtype,
            enforce_eager: self.enforce_eager,
            max_num_seqs: self.max_num_seqs.max(1),
        }
    }

    /// The engine configuration for a model named `model_name`.
    pub fn engine_config(&self, model_name: &str) -> EngineConfig {
        EngineConfig {
            scheduler: SchedulerConfig {
                max_num_seqs: self.max_num_seqs.max(1),
                max_num_batched_tokens: self.max_num_batched_tokens.max(1),
            },
            num_blocks: self.num_kv_blocks.max(1),
            block_size: self.block_size.max(1),
            max_queue: self.max_queue,
            stream_capacity: DEFAULT_STREAM_CAPACITY,
            served_model_name: self
                .served_model_name
                .clone()
                .unwrap_or_else(|| model_name.to_string()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;

    #[test]
    fn parses_flags_and_defaults() {
        let a = Args::try_parse_from([
            "llmserve",
            "--port",
            "0",
            "--num-kv-blocks",
            "8",
            "--served-model-name",
            "m",
        ])
        .unwrap();
        assert_eq!(a.port, 0);
        assert_eq!(a.usage_stats_interval, std::time::Duration::from_secs(300));
        let c = a.engine_config("x");
        assert_eq!(
            (c.num_blocks, c.block_size, c.served_model_name.as_str()),
            (8, 16, "m")
        );
        assert_eq!(a.device, DeviceChoice::Cpu);
        assert!(Args::try_parse_from(["llmserve", "--device", "tpu"]).is_err());
        for (flag, want) in [
            ("cpu", DeviceChoice::Cpu),
            ("cuda", DeviceChoice::Cuda),
            ("auto", DeviceChoice::Auto),
        ] {
            let a = Args::try_parse_from(["llmserve", "--device", flag]).unwrap();
            assert_eq!(a.device, want);
        }
        let a = Args::try_parse_from(["llmserve", "--usage-stats-interval", "1.5min"]).unwrap();
        assert_eq!(a.usage_stats_interval, std::time::Duration::from_secs(90));
        // The shared parser's errors (a huge value was a panic before it).
        for bad in ["100000000000000000000", "-1s", "5 days"] {
            let flag = format!("--usage-stats-interval={bad}");
            assert!(
                Args::try_parse_from(["llmserve", flag.as_str()]).is_err(),
                "{bad}"
            );
        }
    }
}
