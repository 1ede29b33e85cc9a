//! The CUDA backend (feature `cuda`): the same Llama forward pass as the CPU backend, on an NVIDIA GPU, with a
//! paged f32 KV cache in device memory and step times from CUDA events.
//!
//! Modules: [`libs`] (finding and loading libcuda and NVRTC before cudarc may panic on them), [`kernels`]
//! (CUDA C source, NVRTC compilation), [`weights`] (upload of the quantized weights), [`layout`] (per-step
//! index arrays for the paged cache), [`forward`] (the launch sequence), [`clock`] (CUDA events on the host's
//! BOOTTIME clock).
//!
//! Owns one CUDA context on one device, one stream (everything of a step is queued on it in order), the device
//! weights, the KV cache (`num_blocks × block_size` slots per layer for K and V, addressed through the same
//! block tables the KV-cache manager hands the CPU backend) and the scratch buffers. Each step records a CUDA
//! event before its first upload and after its last kernel; both are mapped onto BOOTTIME and returned as the
//! step's device interval ([`DeviceClock::CudaEvents`]). Sampling stays on the host: the logits of the rows that
//! need them are copied back. Never blocks on anything but its own stream.

pub mod clock;
pub mod forward;
pub mod kernels;
pub mod layout;
pub mod libs;
pub mod weights;

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DriverError};
use cudarc::nvrtc::Ptx;

use super::{Backend, BackendError, BatchItem, DeviceClock, StepOutput};
use crate::model::{Model, ModelConfig};

use clock::EventClock;
use forward::{Kernels, Scratch, Step};
use weights::DeviceWeights;

/// The CUDA backend.
pub struct CudaBackend {
    model: Arc<Model>,
    num_blocks: usize,
    block_size: usize,
    stream: Arc<CudaStream>,
    kernels: Kernels,
    weights: DeviceWeights,
    inv_freq: CudaSlice<f32>,
    k_cache: Vec<CudaSlice<f32>>,
    v_cache: Vec<CudaSlice<f32>>,
    scratch: Scratch,
    clock: EventClock,
    ev_start: CudaEvent,
    ev_end: CudaEvent,
    device_name: String,
    compute_capability: (i32, i32),
    compiled: String,
    // Last: dropped after everything allocated in it.
    _ctx: Arc<CudaContext>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("model", &self.model.config.name)
            .field("device", &self.device_name)
            .field("num_blocks", &self.num_blocks)
            .field("block_size", &self.block_size)
            .finish()
    }
}

/// `context: error` as a backend error.
fn dev(context: &str) -> impl FnOnce(DriverError) -> BackendError + '_ {
    move |e| BackendError::Device(format!("{context}: {e}"))
}

/// Checks that the kernels can run `c` with a cache of `num_blocks × block_size` slots.
pub fn check_geometry(c: &ModelConfig, num_blocks: usize, block_size: usize) -> Result<(), BackendError> {
    if num_blocks == 0 || block_size == 0 {
        return Err(BackendError::InvalidBatch(
            "KV cache needs at least one block of at least one slot".into(),
        ));
    }
    if c.head_dim > kernels::MAX_HEAD_DIM || !c.head_dim.is_multiple_of(2) {
        return Err(BackendError::Device(format!(
            "head dimension {} is not supported by the CUDA kernels (even, at most {})",
            c.head_dim,
            kernels::MAX_HEAD_DIM
        )));
    }
    if c.n_kv_heads == 0 || !c.n_heads.is_multiple_of(c.n_kv_heads) {
        return Err(BackendError::Device(format!(
            "{} heads are not a multiple of {} KV heads",
            c.n_heads, c.n_kv_heads
        )));
    }
    let slots = num_blocks.checked_mul(block_size);
    let elems = slots.and_then(|s| s.checked_mul(c.kv_dim()));
    if slots.is_none_or(|s| s > i32::MAX as usize) || elems.is_none() {
        return Err(BackendError::InvalidBatch(format!(
            "KV cache of {num_blocks} blocks x {block_size} slots is too large for the CUDA kernels (2^31 slots)"
        )));
    }
    Ok(())
}

impl CudaBackend {
    /// A backend for `model` on GPU `ordinal` with a KV cache of `num_blocks` blocks of `block_size` tokens.
    /// Loads the CUDA libraries first ([`libs::load`]), so a missing driver is an error, not a panic.
    pub fn new(
        model: Arc<Model>,
        num_blocks: usize,
        block_size: usize,
        ordinal: usize,
    ) -> Result<Self, BackendError> {
        libs::load().map_err(|e| BackendError::Device(e.to_string()))?;
        let c = &model.config;
        check_geometry(c, num_blocks, block_size)?;
        let t0 = Instant::now();
        let ctx = CudaContext::new(ordinal).map_err(dev("creating the CUDA context"))?;
        // SAFETY: called right after creating the context, before any allocation or stream exists; this backend
        // uses one stream, so cudarc's cross-stream event tracking is not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(dev("creating the CUDA stream"))?;
        let device_name = ctx.name().map_err(dev("reading the device name"))?;
        let cc = ctx
            .compute_capability()
            .map_err(dev("reading the compute capability"))?;
        let total_mem = ctx.total_mem().map_err(dev("reading the device memory size"))?;

        let tc = Instant::now();
        let compiled = kernels::compile_cached(cc).map_err(BackendError::Device)?;
        let module = ctx
            .load_module(Ptx::from_binary(compiled.image.clone()))
            .map_err(dev("loading the compiled kernels"))?;
        let kernels = Kernels::load(&module).map_err(BackendError::Device)?;
        eprintln!(
            "llmserve: CUDA kernels compiled by NVRTC ({}) and loaded in {:.2}s",
            compiled.kind,
            tc.elapsed().as_secs_f64()
        );

        let tw = Instant::now();
        let weights = DeviceWeights::upload(&stream, &model).map_err(dev("uploading the weights"))?;
        let inv_freq = stream
            .clone_htod(&super::cpu::rope_inv_freq(c))
            .map_err(dev("uploading RoPE frequencies"))?;
        let per_layer = num_blocks * block_size * c.kv_dim();
        let alloc = |what: &str| {
            (0..c.n_layers)
                .map(|_| stream.alloc_zeros::<f32>(per_layer))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    BackendError::Device(format!(
                        "allocating the {what} cache ({} MiB per layer): {e}",
                        (per_layer * 4) >> 20
                    ))
                })
        };
        let k_cache = alloc("K")?;
        let v_cache = alloc("V")?;
        let scratch = Scratch::new(&stream).map_err(dev("allocating scratch buffers"))?;
        stream.synchronize().map_err(dev("uploading the weights"))?;
        let kv_bytes = 2 * c.n_layers * per_layer * 4;
        eprintln!(
            "llmserve: CUDA device {ordinal}: {device_name} (sm_{}{}, {} MiB); weights {} MiB on the device ({}) \
             in {:.2}s; KV cache {} MiB ({num_blocks} blocks x {block_size} tokens); setup {:.2}s",
            cc.0,
            cc.1,
            total_mem >> 20,
            weights.bytes() >> 20,
            weights.kinds_summary(),
            tw.elapsed().as_secs_f64(),
            kv_bytes >> 20,
            t0.elapsed().as_secs_f64()
        );
        let clock = EventClock::new(&ctx).map_err(dev("creating the reference event"))?;
        let ev_start = clock::timing_event(&ctx).map_err(dev("creating step events"))?;
        let ev_end = clock::timing_event(&ctx).map_err(dev("creating step events"))?;
        Ok(CudaBackend {
            model,
            num_blocks,
            block_size,
            stream,
            kernels,
            weights,
            inv_freq,
            k_cache,
            v_cache,
            scratch,
            clock,
            ev_start,
            ev_end,
            device_name,
            compute_capability: cc,
            compiled: compiled.kind.clone(),
            _ctx: ctx,
        })
    }

    /// One line for the startup log.
    pub fn describe(&self) -> String {
        format!(
            "cuda on {} (sm_{}{}, kernels {})",
            self.device_name, self.compute_capability.0, self.compute_capability.1, self.compiled
        )
    }

    /// The GPU's name.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// Blocks in the KV cache.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// How many times the event clock was anchored to the host clock.
    pub fn clock_anchors(&self) -> u64 {
        self.clock.anchors_taken()
    }

    fn forward_device(&mut self, batch: &[BatchItem<'_>]) -> Result<StepOutput, DriverError> {
        self.clock.maybe_reanchor(&self.stream)?;
        self.scratch.layout.build(batch, self.block_size);
        let nl = self.scratch.layout.logit_rows.len();
        let vocab = self.weights.lm_head().rows;
        self.ev_start.record(&self.stream)?;
        let mut step = Step {
            stream: &self.stream,
            kernels: &self.kernels,
            config: &self.model.config,
            weights: &self.weights,
            inv_freq: &self.inv_freq,
            k_cache: &mut self.k_cache,
            v_cache: &mut self.v_cache,
            block_size: self.block_size,
        };
        step.run(&mut self.scratch)?;
        self.ev_end.record(&self.stream)?;
        let logits = forward::fetch_logits(&self.stream, &mut self.scratch, nl, vocab)?;
        self.ev_end.synchronize()?;
        let (device_start_ns, device_end_ns) = self.clock.host_interval(&self.ev_start, &self.ev_end)?;
        Ok(StepOutput {
            logits,
            device_start_ns,
            device_end_ns,
        })
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_clock(&self) -> DeviceClock {
        DeviceClock::CudaEvents
    }

    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn forward(&mut self, batch: &[BatchItem<'_>]) -> Result<StepOutput, BackendError> {
        super::validate_batch(&self.model.config, self.num_blocks, self.block_size, batch)?;
        if batch.is_empty() {
            let now = llmprof_probes::boottime_ns();
            return Ok(StepOutput {
                logits: Vec::new(),
                device_start_ns: now,
                device_end_ns: now,
            });
        }
        self.forward_device(batch).map_err(dev("forward pass"))
    }

    fn swap_weights(&mut self, model: Arc<Model>) -> Result<(), BackendError> {
        let (a, b) = (&self.model.config, &model.config);
        if a.n_layers != b.n_layers || a.n_kv_heads != b.n_kv_heads || a.head_dim != b.head_dim {
            return Err(BackendError::IncompatibleWeights(format!(
                "KV geometry {} layers × {} KV heads × {} differs from the running {} × {} × {}",
                b.n_layers, b.n_kv_heads, b.head_dim, a.n_layers, a.n_kv_heads, a.head_dim
            )));
        }
        check_geometry(b, self.num_blocks, self.block_size)?;
        let weights =
            DeviceWeights::upload(&self.stream, &model).map_err(dev("uploading the new weights"))?;
        let inv_freq = self
            .stream
            .clone_htod(&super::cpu::rope_inv_freq(b))
            .map_err(dev("uploading RoPE frequencies"))?;
        self.stream
            .synchronize()
            .map_err(dev("uploading the new weights"))?;
        self.weights = weights;
        self.inv_freq = inv_freq;
        self.model = model;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(head_dim: usize, n_heads: usize, n_kv: usize) -> ModelConfig {
        ModelConfig {
            vocab_size: 10,
            n_layers: 1,
            n_heads,
            n_kv_heads: n_kv,
            head_dim,
            dim: head_dim * n_heads,
            ffn_dim: 32,
            context_len: 64,
            rope_base: 1e4,
            rms_eps: 1e-5,
            bos_token_id: None,
            eos_token_ids: vec![],
            name: "t".into(),
        }
    }

    #[test]
    fn geometry_limits_of_the_kernels() {
        assert!(check_geometry(&cfg(64, 9, 3), 1024, 16).is_ok());
        assert!(
            check_geometry(&cfg(512, 1, 1), 16, 16).is_err(),
            "head_dim over MAX_HEAD_DIM"
        );
        assert!(
            check_geometry(&cfg(64, 9, 2), 16, 16).is_err(),
            "heads not a multiple of KV heads"
        );
        assert!(
            check_geometry(&cfg(64, 9, 3), 1 << 28, 16).is_err(),
            "more than 2^31 slots"
        );
        assert!(check_geometry(&cfg(64, 9, 3), 0, 16).is_err());
    }
}
