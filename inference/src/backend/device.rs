//! Device selection for `llmserve --device cpu|cuda|auto`.
//!
//! Owns the choice between the CPU backend and the CUDA backend (feature `cuda`) and the failover rules:
//! `cpu` always gives the CPU backend; `cuda` gives the CUDA backend or a clear error saying why it cannot
//! (built without the feature, no driver, no GPU, no NVRTC); `auto` gives the CUDA backend when it can be
//! started and otherwise the CPU backend, saying why in one log line. The CUDA libraries are probed before any
//! CUDA call is made (cudarc panics when a library is missing). Logs go to stderr, like the rest of `llmserve`.

use std::sync::Arc;

use super::cpu::CpuBackend;
use super::{Backend, BackendError, KvCacheDtype};
use crate::model::Model;

/// What `--device` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceChoice {
    /// The CPU backend.
    Cpu,
    /// The CUDA backend; an error when it cannot start.
    Cuda,
    /// The CUDA backend when a GPU and the CUDA libraries are usable, else the CPU backend.
    Auto,
}

/// Why the requested device cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// `--device cuda` on a build without the `cuda` feature.
    #[error(
        "--device cuda: this llmserve was built without CUDA support; rebuild it with \
         `cargo build --release -p inference --features cuda`, or run with --device cpu"
    )]
    NotBuilt,
    /// The CUDA driver, a GPU or NVRTC is missing or does not work.
    #[error("--device cuda: {0}; run with --device cpu (or --device auto) to use the CPU")]
    CudaUnavailable(String),
    /// The backend could not be created.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl DeviceError {
    /// Why, without the advice of the full message (for `--device auto`'s log line).
    pub fn reason(&self) -> String {
        match self {
            DeviceError::NotBuilt => "this llmserve was built without the cuda feature".into(),
            DeviceError::CudaUnavailable(r) => r.clone(),
            DeviceError::Backend(e) => e.to_string(),
        }
    }
}

/// The backend that was created, with a one-line description for the startup log.
pub struct Selected {
    /// The backend.
    pub backend: Box<dyn Backend>,
    /// E.g. `cpu with 2 threads`, `cuda on NVIDIA H100 (sm_90, driver 13.0)`.
    pub description: String,
}

impl std::fmt::Debug for Selected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selected")
            .field("backend", &self.backend.name())
            .field("description", &self.description)
            .finish()
    }
}

/// What the backend is created with (from `llmserve`'s flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendOptions {
    /// KV-cache blocks.
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size: usize,
    /// CPU compute threads (0: all CPUs; the CPU backend).
    pub threads: usize,
    /// `--kv-cache-dtype`.
    pub kv_cache_dtype: KvCacheDtype,
    /// `--enforce-eager`: no CUDA graphs.
    pub enforce_eager: bool,
    /// `--max-num-seqs`: the largest decode batch (the largest CUDA graph).
    pub max_num_seqs: usize,
}

/// Creates the backend `choice` asks for, set up as `o` says.
pub fn create_backend(
    choice: DeviceChoice,
    model: Arc<Model>,
    o: &BackendOptions,
) -> Result<Selected, DeviceError> {
    match choice {
        DeviceChoice::Cpu => cpu(model, o),
        DeviceChoice::Cuda => cuda(model, o),
        DeviceChoice::Auto => match cuda(model.clone(), o) {
            Ok(s) => Ok(s),
            Err(e) => {
                eprintln!(
                    "llmserve: --device auto: CUDA is not usable ({}); using the CPU",
                    e.reason()
                );
                cpu(model, o)
            }
        },
    }
}

fn cpu(model: Arc<Model>, o: &BackendOptions) -> Result<Selected, DeviceError> {
    let f16 = o.kv_cache_dtype != KvCacheDtype::F32;
    let b = CpuBackend::with_kv_f16(model, o.num_blocks, o.block_size, o.threads, f16)?;
    let description = format!(
        "cpu with {} threads, KV cache {}",
        b.threads(),
        b.kv_cache_dtype()
    );
    Ok(Selected {
        backend: Box::new(b),
        description,
    })
}

#[cfg(feature = "cuda")]
fn cuda(model: Arc<Model>, o: &BackendOptions) -> Result<Selected, DeviceError> {
    use super::cuda::{CudaBackend, CudaOptions, KvDtype};
    let libs = super::cuda::libs::load().map_err(|e| DeviceError::CudaUnavailable(e.to_string()))?;
    eprintln!("llmserve: CUDA libraries: {libs}");
    let options = CudaOptions {
        ordinal: 0,
        kv_dtype: KvDtype::from_choice(o.kv_cache_dtype),
        graphs: !o.enforce_eager,
        max_graph_batch: o.max_num_seqs,
        ..CudaOptions::default()
    }
    .with_env()?;
    let b = CudaBackend::with_options(model, o.num_blocks, o.block_size, options)?;
    let description = b.describe();
    Ok(Selected {
        backend: Box::new(b),
        description,
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda(_model: Arc<Model>, _o: &BackendOptions) -> Result<Selected, DeviceError> {
    Err(DeviceError::NotBuilt)
}
