//! Device selection for `llmserve --device cpu|cuda|auto`.
//!
//! Owns the choice between the CPU backend and the CUDA backend (feature `cuda`) and the failover rules:
//! `cpu` always gives the CPU backend; `cuda` gives the CUDA backend or a clear error saying why it cannot
//! (built without the feature, no driver, no GPU, no NVRTC); `auto` gives the CUDA backend when it can be
//! started and otherwise the CPU backend, saying why in one log line. The CUDA libraries are probed before any
//! CUDA call is made (cudarc panics when a library is missing). Logs go to stderr, like the rest of `llmserve`.

use std::sync::Arc;

use super::cpu::CpuBackend;
use super::{Backend, BackendError};
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

/// Creates the backend `choice` asks for, with a KV cache of `num_blocks` × `block_size` token slots and
/// `threads` CPU threads (0: all CPUs; used by the CPU backend).
pub fn create_backend(
    choice: DeviceChoice,
    model: Arc<Model>,
    num_blocks: usize,
    block_size: usize,
    threads: usize,
) -> Result<Selected, DeviceError> {
    match choice {
        DeviceChoice::Cpu => cpu(model, num_blocks, block_size, threads),
        DeviceChoice::Cuda => cuda(model, num_blocks, block_size),
        DeviceChoice::Auto => match cuda(model.clone(), num_blocks, block_size) {
            Ok(s) => Ok(s),
            Err(e) => {
                eprintln!(
                    "llmserve: --device auto: CUDA is not usable ({}); using the CPU",
                    e.reason()
                );
                cpu(model, num_blocks, block_size, threads)
            }
        },
    }
}

fn cpu(
    model: Arc<Model>,
    num_blocks: usize,
    block_size: usize,
    threads: usize,
) -> Result<Selected, DeviceError> {
    let b = CpuBackend::new(model, num_blocks, block_size, threads)?;
    let description = format!("cpu with {} threads", b.threads());
    Ok(Selected {
        backend: Box::new(b),
        description,
    })
}

#[cfg(feature = "cuda")]
fn cuda(model: Arc<Model>, num_blocks: usize, block_size: usize) -> Result<Selected, DeviceError> {
    let libs = super::cuda::libs::load().map_err(|e| DeviceError::CudaUnavailable(e.to_string()))?;
    eprintln!("llmserve: CUDA libraries: {libs}");
    let b = super::cuda::CudaBackend::new(model, num_blocks, block_size, 0)?;
    let description = b.describe();
    Ok(Selected {
        backend: Box::new(b),
        description,
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda(_model: Arc<Model>, _num_blocks: usize, _block_size: usize) -> Result<Selected, DeviceError> {
    Err(DeviceError::NotBuilt)
}
