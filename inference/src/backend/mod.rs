//! The backend trait: one forward pass over a batch of sequence chunks against a paged KV cache.
//!
//! Owns the contract between the scheduler/engine loop (which decides *what* to run: which sequences, which
//! token chunks, which KV blocks) and the compute (which decides *how*). The backend owns the KV-cache memory
//! (`num_blocks` blocks of `block_size` token slots, per layer, for K and V); the KV-cache manager owns the
//! allocation of those blocks and passes each sequence's block table. The CPU backend is the default; a CUDA
//! backend (feature `cuda`) implements the same trait and fills device timings from CUDA events.
//! A backend must never block on anything but its own compute.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod pool;

use std::sync::Arc;

use crate::model::{Model, ModelConfig};
use crate::sampling::{SampleSpec, TokenLogprobs};

/// One sequence's part of a batch.
#[derive(Debug, Clone, Copy)]
pub struct BatchItem<'a> {
    /// Tokens to compute in this step (a prefill chunk, or the one token to decode).
    pub tokens: &'a [u32],
    /// Position of `tokens[0]` in the sequence (tokens before it are already in the KV cache).
    pub start_pos: usize,
    /// KV-cache blocks of the sequence, in order; must cover positions `0..start_pos + tokens.len()`.
    pub block_table: &'a [u32],
    /// What the step returns for the item's last token (nothing for non-final prefill chunks).
    pub logits: Logits<'a>,
}

/// What a batch item needs from the logits of its last token.
#[derive(Debug, Clone, Copy)]
pub enum Logits<'a> {
    /// Nothing (a prefill chunk that is not the prompt's last).
    None,
    /// Only the most likely token ([`StepOutput::tokens`]): greedy sampling. The logits stay where they were
    /// computed (on the GPU, the vocabulary-sized rows are never copied to the host).
    Argmax,
    /// A token drawn as [`crate::sampling`]'s rule says ([`StepOutput::tokens`]), and its log-probabilities when
    /// the spec asks ([`StepOutput::logprobs`]). The logits stay where they were computed.
    Sample(SampleSpec<'a>),
    /// The logits themselves ([`StepOutput::logits`]), and the argmax.
    Full,
}

impl Logits<'_> {
    /// Whether the step computes logits for this item at all.
    pub fn wanted(&self) -> bool {
        !matches!(self, Logits::None)
    }

    /// Whether the item wants its logits copied out ([`Logits::Full`]).
    pub fn is_full(&self) -> bool {
        matches!(self, Logits::Full)
    }

    /// Whether the item asks for log-probabilities.
    pub fn wants_logprobs(&self) -> bool {
        matches!(self, Logits::Sample(s) if s.logprobs.is_some())
    }
}

/// [`StepOutput::logits`] from a step's logit rows (`rows`: `vocab` floats for each item whose logits are wanted,
/// in batch order; rows past the last such item, a graph's padding, are ignored): copies of the rows of the
/// [`Logits::Full`] items only (a vocabulary-sized vector is an allocation and its page faults; greedy items need
/// none).
pub(crate) fn full_logits(rows: &[f32], vocab: usize, batch: &[BatchItem<'_>]) -> Vec<Vec<f32>> {
    let wanting = batch.iter().filter(|it| it.logits.wanted());
    rows.chunks_exact(vocab.max(1))
        .zip(wanting)
        .filter(|(_, it)| it.logits.is_full())
        .map(|(row, _)| row.to_vec())
        .collect()
}

/// How the backend measured the device interval of a step.
pub use llmprof_abi::DeviceClock;

/// Result of one forward pass.
#[derive(Debug, Default)]
pub struct StepOutput {
    /// The next token of each item whose [`Logits`] are wanted, in batch order: for [`Logits::Argmax`] and
    /// [`Logits::Full`] the most likely one as [`crate::sampling::argmax`] defines it (NaN ignored, ties to the
    /// lowest index), for [`Logits::Sample`] the one drawn.
    pub tokens: Vec<u32>,
    /// Log-probabilities of each [`Logits::Sample`] item that asks for them, in batch order.
    pub logprobs: Vec<TokenLogprobs>,
    /// Logits (vocab-sized) of the last token of each item with [`Logits::Full`], in batch order.
    pub logits: Vec<Vec<f32>>,
    /// Device start of the step, BOOTTIME ns.
    pub device_start_ns: u64,
    /// Device end of the step, BOOTTIME ns.
    pub device_end_ns: u64,
    /// The batch size of the CUDA graph the step replayed (its real rows padded up to it); 0: launched eagerly.
    pub graph_batch: u32,
}

/// Most sequences a backend is set up to run in one step unless told otherwise: `llmserve`'s `--max-num-seqs`
/// default (vLLM V1 defaults to 256 on GPUs; a 2-core CPU gains nothing past ~32), and the largest decode batch
/// the CUDA backend captures as a graph.
pub const DEFAULT_MAX_BATCH: usize = 32;

/// `--kv-cache-dtype`: the element type of the KV cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KvCacheDtype {
    /// f16 (on the GPU and the CPU).
    #[default]
    Auto,
    /// IEEE half precision.
    F16,
    /// 32-bit floats.
    F32,
}

/// Errors of a backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A batch item referenced a block outside the pool or positions beyond the context.
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// The new weights do not match the KV-cache geometry of the running backend.
    #[error("incompatible weights: {0}")]
    IncompatibleWeights(String),
    /// Device failure (CUDA backend).
    #[error("device error: {0}")]
    Device(String),
}

/// A compute backend.
pub trait Backend: Send {
    /// Short name (`cpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// Which clock fills [`StepOutput::device_start_ns`].
    fn device_clock(&self) -> DeviceClock;
    /// The model's configuration.
    fn config(&self) -> &ModelConfig;
    /// Runs one forward pass over `batch`, writing K/V of all tokens into the cache.
    fn forward(&mut self, batch: &[BatchItem<'_>]) -> Result<StepOutput, BackendError>;
    /// Swaps in new weights (same architecture and KV geometry) between steps. The KV cache contents
    /// become stale; the engine recomputes running sequences after a swap.
    fn swap_weights(&mut self, model: Arc<Model>) -> Result<(), BackendError>;
}

/// Checks a batch against the model and a KV cache of `num_blocks` blocks of `block_size` slots: every item has
/// tokens inside the vocabulary, and a block table of valid blocks covering its positions. Backends call this
/// before touching memory (the CUDA backend's kernels index the cache through these tables unchecked).
pub fn validate_batch(
    c: &ModelConfig,
    num_blocks: usize,
    block_size: usize,
    batch: &[BatchItem<'_>],
) -> Result<(), BackendError> {
    for (i, it) in batch.iter().enumerate() {
        if it.tokens.is_empty() {
            return Err(BackendError::InvalidBatch(format!("item {i} has no tokens")));
        }
        if let Some(t) = it.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(BackendError::InvalidBatch(format!(
                "item {i}: token {t} outside the vocabulary"
            )));
        }
        let end = it.start_pos + it.tokens.len();
        if it.block_table.len() * block_size < end {
            return Err(BackendError::InvalidBatch(format!(
                "item {i}: {} blocks of {} slots do not cover {end} positions",
                it.block_table.len(),
                block_size
            )));
        }
        if let Some(b) = it.block_table.iter().find(|&&b| b as usize >= num_blocks) {
            return Err(BackendError::InvalidBatch(format!(
                "item {i}: block {b} outside the pool of {num_blocks}"
            )));
        }
    }
    Ok(())
}
