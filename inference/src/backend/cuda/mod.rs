//! The CUDA backend (feature `cuda`): the same Llama forward pass as the CPU backend, on an NVIDIA GPU, with a
//! paged KV cache (f16 by default, f32 selectable) in device memory, decode steps replayed as CUDA graphs, and
//! step times from CUDA events.
//!
//! Modules: [`libs`] (finding and loading libcuda and NVRTC before cudarc may panic on them), [`kernels`]
//! (CUDA C source, NVRTC compilation), [`sample`] (sampling on the device), [`weights`] (upload of the quantized weights), [`layout`] (per-step
//! index arrays for the paged cache, and the padded shape of a graph step), [`forward`] (the launch sequence),
//! [`clock`] (CUDA events on the host's BOOTTIME clock).
//!
//! Owns one CUDA context on one device, one stream (everything of a step is queued on it in order), the device
//! weights, the KV cache (`num_blocks × block_size` slots per layer for K and V, addressed through the same
//! block tables the KV-cache manager hands the CPU backend, plus one pad block that only graph padding touches)
//! and the scratch buffers. Decode steps (one token per sequence) run as CUDA graphs captured at start-up for
//! the batch sizes of [`layout::capture_sizes`] (vLLM's way: a batch is padded up to the next captured size);
//! before each replay only the packed index arrays (tokens, positions, slots, block tables) are copied into the
//! graph's fixed device buffers. Prefill and mixed steps run eagerly. Each step records a CUDA event before its
//! first upload and after its last kernel; both are mapped onto BOOTTIME and returned as the step's device
//! interval ([`DeviceClock::CudaEvents`]), and the step says which graph it replayed
//! ([`StepOutput::graph_batch`]). Every step ends with each logit row's next token chosen on the device
//! ([`sample`]: the argmax for greedy rows, a seeded draw with the row's temperature, truncations and penalties for
//! the others, inside the graphs too); the tokens, the log-probabilities of the rows that ask, and the logits only
//! when an item wants them ([`super::Logits::Full`]) are copied into pinned host memory asynchronously, and the
//! host waits on an event recorded after the copy. Never blocks on anything but its own stream.

pub mod clock;
pub mod forward;
pub mod kernels;
pub mod layout;
pub mod libs;
pub mod mma;
pub mod sample;
pub mod weights;

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaGraph, CudaSlice, CudaStream, DevicePtr, DriverError, PinnedHostSlice, sys,
};
use cudarc::nvrtc::Ptx;

use super::{Backend, BackendError, BatchItem, DeviceClock, KvCacheDtype, StepOutput};
use crate::model::{Model, ModelConfig};

use clock::EventClock;
use forward::{Kernels, KvCache, Scratch, Step};
use layout::{GraphShape, Packed, StepLayout};
use weights::DeviceWeights;

/// Element type of the KV cache on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// 32-bit floats (the CPU backend's precision).
    F32,
    /// IEEE half precision: half the memory and bandwidth; attention still computes in f32.
    F16,
}

impl KvDtype {
    /// The CUDA backend's element type for `--kv-cache-dtype` (`auto`: f16).
    pub fn from_choice(c: KvCacheDtype) -> Self {
        match c {
            KvCacheDtype::F32 => KvDtype::F32,
            KvCacheDtype::Auto | KvCacheDtype::F16 => KvDtype::F16,
        }
    }

    /// Index into [`kernels::KV_TYPES`].
    pub fn index(self) -> usize {
        match self {
            KvDtype::F32 => 0,
            KvDtype::F16 => 1,
        }
    }

    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }

    /// `f32` or `f16`.
    pub fn name(self) -> &'static str {
        kernels::KV_TYPES[self.index()]
    }
}

/// How to set the backend up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaOptions {
    /// GPU ordinal.
    pub ordinal: usize,
    /// KV-cache element type.
    pub kv_dtype: KvDtype,
    /// Replay decode steps as CUDA graphs (`--enforce-eager` turns this off).
    pub graphs: bool,
    /// Largest decode batch captured as a graph (the engine's `--max-num-seqs`); larger batches run eagerly.
    pub max_graph_batch: usize,
    /// Most tokens a step may have for the fused RMSNorm launches ([`forward::FUSE_MAX_TOKENS`] by default;
    /// [`FUSE_ENV`] overrides it, for measuring the choice on a GPU).
    pub fuse_max_tokens: usize,
    /// Fewest tokens in a step for the tensor-core products ([`mma::MMA_MIN_TOKENS`] by default; 0: never;
    /// [`mma::MMA_ENV`] overrides it). Devices before sm_80 never use them.
    pub mma_min_tokens: usize,
}

/// Environment variable that sets [`CudaOptions::fuse_max_tokens`] (a number of tokens).
pub const FUSE_ENV: &str = "LLMSERVE_CUDA_FUSE_MAX_TOKENS";

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            ordinal: 0,
            kv_dtype: KvDtype::F16,
            graphs: true,
            max_graph_batch: super::DEFAULT_MAX_BATCH,
            fuse_max_tokens: forward::FUSE_MAX_TOKENS,
            mma_min_tokens: mma::MMA_MIN_TOKENS,
        }
    }
}

impl CudaOptions {
    /// These options with [`FUSE_ENV`] and [`mma::MMA_ENV`] applied when they are set; an error names a value
    /// that is not a number.
    pub fn with_env(self) -> Result<Self, BackendError> {
        let env = |name: &str| match std::env::var(name) {
            Err(std::env::VarError::NotPresent) => Ok(None),
            Ok(v) => Ok(Some(v)),
            Err(e) => Err(BackendError::Device(format!("{name}: {e}"))),
        };
        let mut o = self;
        if let Some(v) = env(FUSE_ENV)? {
            o = o.with_fuse_setting(&v)?;
        }
        if let Some(v) = env(mma::MMA_ENV)? {
            o.mma_min_tokens = tokens_setting(mma::MMA_ENV, &v)?;
        }
        Ok(o)
    }

    /// The start-up log's words for `fuse_max_tokens` and `mma_min_tokens` (`tensor_cores`: whether the device
    /// has them).
    fn fuse_note(&self, tensor_cores: bool) -> String {
        let fused = match self.fuse_max_tokens {
            0 => "no fused launches".to_string(),
            n => format!("fused launches up to {n} tokens"),
        };
        let mma = match (tensor_cores, self.mma_min_tokens) {
            (false, _) => "no tensor cores (before sm_80)".to_string(),
            (true, 0) => "tensor cores off".to_string(),
            (true, n) => format!("tensor-core products from {n} tokens"),
        };
        format!("{fused}, {mma}")
    }

    /// These options with `fuse_max_tokens` set from `value` (a [`FUSE_ENV`] setting).
    pub fn with_fuse_setting(self, value: &str) -> Result<Self, BackendError> {
        Ok(CudaOptions {
            fuse_max_tokens: tokens_setting(FUSE_ENV, value)?,
            ..self
        })
    }
}

/// The number of tokens an environment variable `name` sets to `value`.
fn tokens_setting(name: &str, value: &str) -> Result<usize, BackendError> {
    value
        .trim()
        .parse::<usize>()
        .map_err(|e| BackendError::Device(format!("{name}={value:?} is not a number of tokens: {e}")))
}

/// A captured graph. CUDA graph objects are not internally synchronized; the backend owns them and uses them
/// from one thread at a time (`&mut self`), which is what moving them between threads needs.
struct OwnedGraph(CudaGraph);

// SAFETY: the graph (and its executable) is only touched through `&mut CudaBackend` (replay, drop), so calls
// on it are serialized, as the CUDA driver requires of graph objects used from several threads.
unsafe impl Send for OwnedGraph {}

/// The decode graphs: one per captured batch size, all recorded on one set of buffers that never moves.
struct Graphs {
    /// Captured batch sizes, ascending ([`layout::capture_sizes`]).
    sizes: Vec<usize>,
    /// Block-table entries per row ([`layout::table_stride`]).
    stride: usize,
    /// The buffers the graphs read and write (sized for the largest batch before capture).
    scratch: Scratch,
    /// `graphs[i]` replays a step of `sizes[i]` rows.
    graphs: Vec<OwnedGraph>,
    /// Sampling-history entries the buffers hold after the largest shape's arrays (a step with more runs eagerly).
    hist_cap: usize,
}

/// The CUDA backend.
pub struct CudaBackend {
    model: Arc<Model>,
    num_blocks: usize,
    block_size: usize,
    options: CudaOptions,
    stream: Arc<CudaStream>,
    kernels: Kernels,
    weights: DeviceWeights,
    inv_freq: CudaSlice<f32>,
    kv: KvCache,
    scratch: Scratch,
    graphs: Option<Graphs>,
    layout: StepLayout,
    packed: Vec<i32>,
    /// Pinned staging of the packed index arrays (copied up asynchronously).
    host_idx: PinnedHostSlice<i32>,
    /// Pinned landing place of the logits (copied down asynchronously, for steps with a [`super::Logits::Full`]
    /// item).
    host_logits: PinnedHostSlice<f32>,
    /// Pinned landing place of the rows' next tokens.
    host_tokens: PinnedHostSlice<i32>,
    /// Pinned landing place of the rows' log-probability words (steps with an item that asks for them).
    host_logprobs: PinnedHostSlice<i32>,
    clock: EventClock,
    ev_start: CudaEvent,
    ev_end: CudaEvent,
    ev_copied: CudaEvent,
    device_name: String,
    compute_capability: (i32, i32),
    compiled: String,
    graph_note: String,
    // Last: dropped after everything allocated in it.
    ctx: Arc<CudaContext>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("model", &self.model.config.name)
            .field("device", &self.device_name)
            .field("num_blocks", &self.num_blocks)
            .field("block_size", &self.block_size)
            .field("options", &self.options)
            .finish()
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Copies from and into the pinned buffers may still be queued after a failed step: let them finish
        // before the buffers are freed.
        let _ = self.stream.synchronize();
    }
}

/// `context: error` as a backend error.
fn dev(context: &str) -> impl FnOnce(DriverError) -> BackendError + '_ {
    move |e| BackendError::Device(format!("{context}: {e}"))
}

/// Checks that the kernels can run `c` with a cache of `num_blocks × block_size` slots (and the pad block).
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
    let slots = (num_blocks + 1).checked_mul(block_size);
    let elems = slots.and_then(|s| s.checked_mul(c.kv_dim()));
    if slots.is_none_or(|s| s > i32::MAX as usize) || elems.is_none() {
        return Err(BackendError::InvalidBatch(format!(
            "KV cache of {num_blocks} blocks x {block_size} slots is too large for the CUDA kernels (2^31 slots)"
        )));
    }
    Ok(())
}

/// Pinned host memory for `len` elements; `write_combined` for buffers the host only writes.
fn pinned<T: cudarc::driver::DeviceRepr>(
    ctx: &Arc<CudaContext>,
    len: usize,
    write_combined: bool,
) -> Result<PinnedHostSlice<T>, DriverError> {
    let flags = if write_combined {
        sys::CU_MEMHOSTALLOC_WRITECOMBINED
    } else {
        0
    };
    // SAFETY: the contents start uninitialized; every reader reads only elements written before (the packed
    // index arrays, the logits copied down), and `T` is a plain number type.
    unsafe { ctx.alloc_pinned_with_flags::<T>(len.max(1), flags) }
}

impl CudaBackend {
    /// A backend for `model` on GPU `ordinal` with a KV cache of `num_blocks` blocks of `block_size` tokens and
    /// the default options (f16 KV cache, decode graphs up to the default `--max-num-seqs`).
    pub fn new(
        model: Arc<Model>,
        num_blocks: usize,
        block_size: usize,
        ordinal: usize,
    ) -> Result<Self, BackendError> {
        let options = CudaOptions {
            ordinal,
            ..CudaOptions::default()
        };
        Self::with_options(model, num_blocks, block_size, options)
    }

    /// A backend for `model` with a KV cache of `num_blocks` blocks of `block_size` tokens, set up as `options`
    /// say. Loads the CUDA libraries first ([`libs::load`]), so a missing driver is an error, not a panic. When
    /// graphs cannot be captured, decode runs eagerly and [`CudaBackend::describe`] says why.
    pub fn with_options(
        model: Arc<Model>,
        num_blocks: usize,
        block_size: usize,
        options: CudaOptions,
    ) -> Result<Self, BackendError> {
        libs::load().map_err(|e| BackendError::Device(e.to_string()))?;
        let c = &model.config;
        check_geometry(c, num_blocks, block_size)?;
        let t0 = Instant::now();
        let ctx = CudaContext::new(options.ordinal).map_err(dev("creating the CUDA context"))?;
        // SAFETY: called right after creating the context, before any allocation or stream exists; this backend
        // uses one stream, so cudarc's cross-stream event tracking is not needed (and a graph capture must not
        // record cudarc's events).
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
        // One more block than the pool: the pad block graph padding rows write into.
        let per_layer = (num_blocks + 1) * block_size * c.kv_dim() * options.kv_dtype.bytes();
        let alloc = |what: &str| {
            (0..c.n_layers)
                .map(|_| stream.alloc_zeros::<u8>(per_layer))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    BackendError::Device(format!(
                        "allocating the {what} cache ({} MiB per layer): {e}",
                        per_layer >> 20
                    ))
                })
        };
        let kv = KvCache {
            dtype: options.kv_dtype,
            k: alloc("K")?,
            v: alloc("V")?,
        };
        let scratch = Scratch::new(&stream).map_err(dev("allocating scratch buffers"))?;
        stream.synchronize().map_err(dev("uploading the weights"))?;
        let kv_bytes = 2 * c.n_layers * per_layer;
        eprintln!(
            "llmserve: CUDA device {}: {device_name} (sm_{}{}, {} MiB); weights {} MiB on the device ({}) \
             in {:.2}s; KV cache {} MiB {} ({num_blocks} blocks x {block_size} tokens); setup {:.2}s",
            options.ordinal,
            cc.0,
            cc.1,
            total_mem >> 20,
            weights.bytes() >> 20,
            weights.kinds_summary(),
            tw.elapsed().as_secs_f64(),
            kv_bytes >> 20,
            options.kv_dtype.name(),
            t0.elapsed().as_secs_f64()
        );
        let clock = EventClock::new(&ctx).map_err(dev("creating the reference event"))?;
        let ev_start = clock::timing_event(&ctx).map_err(dev("creating step events"))?;
        let ev_end = clock::timing_event(&ctx).map_err(dev("creating step events"))?;
        let ev_copied = ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(dev("creating step events"))?;
        let vocab = model.config.vocab_size;
        let rows = options.max_graph_batch.max(1);
        let host_logits = pinned(&ctx, rows * vocab, false).map_err(dev("allocating pinned logits"))?;
        let host_tokens = pinned(&ctx, rows, false).map_err(dev("allocating pinned tokens"))?;
        let host_logprobs =
            pinned(&ctx, rows * sample::LOGPROB_WORDS, false).map_err(dev("allocating pinned logprobs"))?;
        let host_idx = pinned(&ctx, 4096, true).map_err(dev("allocating pinned index arrays"))?;
        let mut b = CudaBackend {
            model,
            num_blocks,
            block_size,
            options,
            stream,
            kernels,
            weights,
            inv_freq,
            kv,
            scratch,
            graphs: None,
            layout: StepLayout::default(),
            packed: Vec::new(),
            host_idx,
            host_logits,
            host_tokens,
            host_logprobs,
            clock,
            ev_start,
            ev_end,
            ev_copied,
            device_name,
            compute_capability: cc,
            compiled: compiled.kind.clone(),
            graph_note: "decode eager (--enforce-eager)".into(),
            ctx,
        };
        if options.graphs {
            b.recapture();
        }
        Ok(b)
    }

    /// (Re)captures the decode graphs on the current weights; on failure decode runs eagerly and
    /// [`CudaBackend::describe`] says why.
    fn recapture(&mut self) {
        self.graphs = None;
        let t = Instant::now();
        match self.capture_graphs() {
            Ok(g) => {
                self.graph_note = format!(
                    "decode as CUDA graphs for batch sizes {} (captured in {:.0} ms)",
                    g.sizes
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                    t.elapsed().as_secs_f64() * 1e3
                );
                self.graphs = Some(g);
            }
            Err(e) => {
                // A failed capture leaves the stream capturing: end it (the partial graph is discarded).
                if self
                    .stream
                    .capture_status()
                    .is_ok_and(|st| st != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
                {
                    let _ = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
                }
                self.graph_note = format!("decode eager: CUDA graph capture failed ({e})");
            }
        }
        eprintln!("llmserve: {}", self.graph_note);
    }

    fn capture_graphs(&mut self) -> Result<Graphs, DriverError> {
        let c = &self.model.config;
        let sizes = layout::capture_sizes(self.options.max_graph_batch);
        let stride = layout::table_stride(c.context_len, self.block_size, self.num_blocks);
        let vocab = self.weights.lm_head().rows;
        let mut scratch = Scratch::new(&self.stream)?;
        let largest = sizes.last().copied().unwrap_or(1);
        let p_largest = Packed::of_graph(self.shape(largest, stride));
        scratch.ensure(&self.stream, c, vocab, &p_largest)?;
        // Room for every row's history: a sequence has at most min(context, vocabulary) distinct tokens.
        let hist_cap = largest * c.context_len.min(c.vocab_size);
        scratch.ensure_history(&self.stream, &p_largest, hist_cap)?;
        self.stream.synchronize()?;
        let mut graphs = Vec::with_capacity(sizes.len());
        for &batch in &sizes {
            let p = Packed::of_graph(self.shape(batch, stride));
            self.stream
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
            self.launch(Some(&mut scratch), &p)?;
            let graph = self
                .stream
                .end_capture(sys::CUgraphInstantiate_flags(0))?
                .ok_or(DriverError(
                    sys::cudaError_enum::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                ))?;
            graph.upload()?;
            graphs.push(OwnedGraph(graph));
        }
        self.stream.synchronize()?;
        Ok(Graphs {
            sizes,
            stride,
            scratch,
            graphs,
            hist_cap,
        })
    }

    /// Queues the kernels of a step laid out as `p` on `scratch` (`None`: the eager buffers).
    fn launch(&mut self, scratch: Option<&mut Scratch>, p: &Packed) -> Result<(), DriverError> {
        let scratch = scratch.unwrap_or(&mut self.scratch);
        let mut step = Step {
            stream: &self.stream,
            kernels: &self.kernels,
            config: &self.model.config,
            weights: &self.weights,
            inv_freq: &self.inv_freq,
            kv: &mut self.kv,
            block_size: self.block_size,
            fuse_max_tokens: self.options.fuse_max_tokens,
            mma_min_tokens: if mma::supported(self.compute_capability) {
                self.options.mma_min_tokens
            } else {
                0
            },
        };
        step.launch(scratch, p)
    }

    fn shape(&self, batch: usize, stride: usize) -> GraphShape {
        GraphShape {
            batch,
            stride,
            pad_block: self.num_blocks as u32,
        }
    }

    /// One line for the startup log.
    pub fn describe(&self) -> String {
        format!(
            "cuda on {} (sm_{}{}, kernels {}, KV cache {}, {}, {})",
            self.device_name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.compiled,
            self.options.kv_dtype.name(),
            self.options.fuse_note(mma::supported(self.compute_capability)),
            self.graph_note
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

    /// The batch sizes decode graphs were captured for (empty: decode runs eagerly).
    pub fn graph_sizes(&self) -> &[usize] {
        self.graphs.as_ref().map_or(&[], |g| &g.sizes)
    }

    /// How many times the event clock was anchored to the host clock.
    pub fn clock_anchors(&self) -> u64 {
        self.clock.anchors_taken()
    }

    fn forward_device(&mut self, batch: &[BatchItem<'_>]) -> Result<StepOutput, DriverError> {
        self.clock.maybe_reanchor(&self.stream)?;
        let bs = self.block_size;
        let vocab = self.weights.lm_head().rows;
        let mut graph = self.graphs.as_ref().and_then(|g| {
            let b = layout::graph_batch(batch, &g.sizes, bs, g.stride)?;
            let i = g.sizes.iter().position(|&s| s == b)?;
            Some((i, self.shape(b, g.stride)))
        });
        // The arrays of the step, packed into one upload; the logit rows wanted are the first `wanted`. A graph
        // step whose histories outgrow the graph's buffers runs eagerly.
        let mut packed = None;
        if let (Some((_, shape)), Some(g)) = (graph, self.graphs.as_ref()) {
            self.layout.build_graph(batch, bs, shape);
            let p = self.layout.pack(&mut self.packed);
            // The graph reads its arrays at the offsets it was captured with.
            debug_assert!(p.same_offsets(&Packed::of_graph(shape)));
            if p.history_entries() <= g.hist_cap {
                packed = Some((p, batch.len()));
            } else {
                graph = None;
            }
        }
        let (p, wanted) = match packed {
            Some(pw) => pw,
            None => {
                self.layout.build(batch, bs);
                let p = self.layout.pack(&mut self.packed);
                (p, p.nl)
            }
        };
        if self.host_idx.len() < p.len {
            self.host_idx = pinned(&self.ctx, p.len.next_power_of_two(), true)?;
        }
        // The logits come down only when an item wants them, the log-probability words when an item asks for
        // them; the tokens always.
        let full = batch.iter().any(|it| it.logits.is_full());
        let with_logprobs = batch.iter().any(|it| it.logits.wants_logprobs());
        if full && self.host_logits.len() < wanted * vocab {
            self.host_logits = pinned(&self.ctx, wanted * vocab, false)?;
        }
        if self.host_tokens.len() < wanted {
            self.host_tokens = pinned(&self.ctx, wanted, false)?;
        }
        if with_logprobs && self.host_logprobs.len() < wanted * sample::LOGPROB_WORDS {
            self.host_logprobs = pinned(&self.ctx, wanted * sample::LOGPROB_WORDS, false)?;
        }
        self.host_idx.as_mut_slice()?[..p.len].copy_from_slice(&self.packed);
        let replay = graph.map(|(i, _)| i);
        if replay.is_none() {
            self.scratch.ensure(&self.stream, &self.model.config, vocab, &p)?;
        }

        self.ev_start.record(&self.stream)?;
        let graphs = self.graphs.as_ref().filter(|_| replay.is_some());
        {
            let idx = graphs.map_or(&self.scratch.idx, |g| &g.scratch.idx);
            let (dst, _sync) = idx.dev.device_ptr(&self.stream);
            let src = &self.host_idx.as_slice()?[..p.len];
            // SAFETY: `dst` holds at least p.len + 1 elements (Scratch::ensure; a graph's scratch was sized for
            // its largest shape); `src` is pinned memory this backend owns and does not touch again until the
            // step's last event has completed (below), so it outlives the asynchronous copy.
            unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }?;
        }
        match (graphs, replay) {
            (Some(g), Some(i)) => g.graphs[i].0.launch()?,
            _ => self.launch(None, &p)?,
        }
        self.ev_end.record(&self.stream)?;
        let scratch = match self.graphs.as_ref().filter(|_| replay.is_some()) {
            Some(g) => &g.scratch,
            None => &self.scratch,
        };
        if wanted > 0 {
            let (src, _sync) = scratch.tokens.dev.device_ptr(&self.stream);
            let dst = &mut self.host_tokens.as_mut_slice()?[..wanted];
            // SAFETY: the token buffer holds at least p.nl ≥ wanted ints; `dst` is pinned memory this backend
            // owns, read only after `ev_copied` completed (below), and kept alive until then.
            unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }?;
        }
        if wanted > 0 && with_logprobs {
            let (src, _sync) = scratch.logprobs.dev.device_ptr(&self.stream);
            let dst = &mut self.host_logprobs.as_mut_slice()?[..wanted * sample::LOGPROB_WORDS];
            // SAFETY: the log-probability buffer holds p.nl ≥ wanted rows of LOGPROB_WORDS ints; `dst` is pinned
            // memory this backend owns, read only after `ev_copied` completed (below), and kept alive until then.
            unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }?;
        }
        if wanted > 0 && full {
            let (src, _sync) = scratch.logits.dev.device_ptr(&self.stream);
            let dst = &mut self.host_logits.as_mut_slice()?[..wanted * vocab];
            // SAFETY: the logits buffer holds at least p.nl ≥ wanted rows of `vocab`; `dst` is pinned memory this
            // backend owns, read only after `ev_copied` completed (below), and kept alive until then.
            unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }?;
        }
        self.ev_copied.record(&self.stream)?;
        self.ev_copied.synchronize()?;
        let (device_start_ns, device_end_ns) = self.clock.host_interval(&self.ev_start, &self.ev_end)?;
        // Row i of the copies is the i-th item that wants logits (graph steps: every item, padding rows after).
        let tokens = self.host_tokens.as_slice()?[..wanted]
            .iter()
            .map(|&i| i as u32)
            .collect();
        let logits = if full {
            super::full_logits(&self.host_logits.as_slice()?[..wanted * vocab], vocab, batch)
        } else {
            Vec::new()
        };
        let logprobs = if with_logprobs {
            let words = &self.host_logprobs.as_slice()?[..wanted * sample::LOGPROB_WORDS];
            words
                .chunks_exact(sample::LOGPROB_WORDS)
                .zip(batch.iter().filter(|it| it.logits.wanted()))
                .filter(|(_, it)| it.logits.wants_logprobs())
                .map(|(w, _)| sample::read_logprobs(w))
                .collect()
        } else {
            Vec::new()
        };
        Ok(StepOutput {
            tokens,
            logprobs,
            logits,
            device_start_ns,
            device_end_ns,
            graph_batch: graph.map_or(0, |(_, shape)| shape.batch as u32),
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
                device_start_ns: now,
                device_end_ns: now,
                ..StepOutput::default()
            });
        }
        self.forward_device(batch).map_err(|e| {
            // Copies of this step may still be queued on the pinned buffers the next step rewrites.
            let _ = self.stream.synchronize();
            BackendError::Device(format!("forward pass: {e}"))
        })
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
        // The graphs hold the old weights' addresses: drop them before the weights, then capture anew.
        self.graphs = None;
        self.weights = weights;
        self.inv_freq = inv_freq;
        self.model = model;
        if self.options.graphs {
            self.recapture();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
