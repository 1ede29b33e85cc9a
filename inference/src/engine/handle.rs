//! The engine's front door: [`EngineHandle`] (start, submit, reload, shutdown) and the vocabulary it speaks
//! with the HTTP layer ([`GenRequest`] in; [`Chunk`]s ending in a [`Finish`] out; [`SubmitError`] when refused).
//!
//! Owns admission control on the caller's thread (empty prompt, prompt past the context or KV capacity, queue
//! full) and the command channel to the engine thread; everything after admission happens in the step loop.
//!
//! It must never block the caller on the engine: [`EngineHandle::submit`] refuses or queues at once, and the only
//! waits are a reload's answer (async) and [`EngineHandle::shutdown`]'s join.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Instant;

use llmprof_abi::FinishReason;
use tokio::sync::{mpsc as tmpsc, oneshot};

use super::EngineLoop;
use super::model_handle::{ModelHandle, Reloaded};
use crate::backend::Backend;
use crate::metrics::Metrics;
use crate::sampling::{SamplingParams, TokenLogprobs};
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::trace_context::TraceContext;

/// Engine limits.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Scheduler limits.
    pub scheduler: SchedulerConfig,
    /// KV-cache blocks (must match the backend's).
    pub num_blocks: usize,
    /// Token slots per block (must match the backend's).
    pub block_size: usize,
    /// Requests accepted but not yet scheduled before new ones get 429.
    pub max_queue: usize,
    /// Messages buffered per client stream before output is held back and coalesced.
    pub stream_capacity: usize,
    /// Name reported in probe records and metrics.
    pub served_model_name: String,
}

/// A generation request, tokenized.
#[derive(Debug, Clone)]
pub struct GenRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most output tokens.
    pub max_tokens: usize,
    /// Temperature, truncations, penalties.
    pub sampling: SamplingParams,
    /// RNG seed (random when absent).
    pub seed: Option<u64>,
    /// `None`: no log-probabilities; `Some(n)`: each output token's and the `n` most likely alternatives'.
    pub logprobs: Option<u8>,
    /// Stop strings (not included in the output).
    pub stop: Vec<String>,
    /// Caller's W3C trace context.
    pub trace: Option<TraceContext>,
    /// Caller's `x-request-id`.
    pub x_request_id: Option<String>,
    /// Chat (true) or completions (false) API.
    pub is_chat: bool,
    /// When the HTTP layer received it.
    pub arrival: Instant,
}

/// How and when a request finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finish {
    /// `stop` / `length` / `abort` / `error`.
    pub reason: FinishReason,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens.
    pub completion_tokens: u32,
}

/// A piece of output. Consecutive pieces may be coalesced when the client is slow.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Chunk {
    /// New text.
    pub text: String,
    /// Tokens this text came from.
    pub num_tokens: u32,
    /// The log-probabilities of those tokens, when the request asked for them.
    pub logprobs: Vec<LogprobEntry>,
    /// Set on the last chunk.
    pub finish: Option<Finish>,
}

impl Chunk {
    /// Appends a later chunk (output held back for a slow client is coalesced).
    pub(super) fn merge(&mut self, other: Chunk) {
        self.text.push_str(&other.text);
        self.num_tokens += other.num_tokens;
        self.logprobs.extend(other.logprobs);
        if other.finish.is_some() {
            self.finish = other.finish;
        }
    }
}

/// One output token's log-probability and the most likely alternatives', with their bytes (what OpenAI's
/// `logprobs` objects report).
#[derive(Debug, Clone, PartialEq)]
pub struct LogprobEntry {
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens' bytes and log-probabilities, most likely first.
    pub top: Vec<(Vec<u8>, f32)>,
}

impl LogprobEntry {
    /// The entry of token `tok` with log-probabilities `lp`, spelled by `model`.
    pub(super) fn new(model: &dyn ModelHandle, tok: u32, lp: &TokenLogprobs) -> Self {
        LogprobEntry {
            bytes: model.token_bytes(tok).to_vec(),
            logprob: lp.logprob,
            top: lp
                .top
                .iter()
                .map(|&(t, v)| (model.token_bytes(t).to_vec(), v))
                .collect(),
        }
    }
}

/// Why a request was refused at submission.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    /// Too many requests waiting (answer 429).
    #[error("the server is overloaded: {0} requests are already waiting; retry later")]
    QueueFull(usize),
    /// The prompt does not fit the context or the KV cache (answer 400).
    #[error("the prompt has {prompt} tokens, but at most {max} fit ({what}); shorten the prompt")]
    PromptTooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Limit.
        max: usize,
        /// Which limit.
        what: &'static str,
    },
    /// The prompt is empty (answer 400).
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The engine thread is gone (answer 503).
    #[error("the engine is shutting down")]
    ShuttingDown,
}

/// A submitted request: its engine id and its output stream.
#[derive(Debug)]
pub struct Submitted {
    /// Engine request id.
    pub id: u64,
    /// Output; closing it (dropping) cancels the request.
    pub rx: tmpsc::Receiver<Chunk>,
}

/// What the handle asks of the engine thread.
pub(super) enum Command {
    /// Admit a request whose output goes to the sender.
    Submit(u64, Box<GenRequest>, tmpsc::Sender<Chunk>),
    /// Swap in a loaded model; answer with its name.
    Reload(Box<Reloaded>, oneshot::Sender<Result<String, String>>),
    /// Abort everything and stop the thread.
    Shutdown,
}

/// The handle the HTTP layer uses to talk to the engine thread.
pub struct EngineHandle {
    cmd_tx: Mutex<mpsc::Sender<Command>>,
    queued: Arc<AtomicUsize>,
    next_id: AtomicU64,
    model: Arc<RwLock<Arc<dyn ModelHandle>>>,
    metrics: Arc<Metrics>,
    cfg: EngineConfig,
    max_seq_tokens: usize,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl EngineHandle {
    /// Starts the engine thread.
    pub fn start(
        backend: Box<dyn Backend>,
        model: Arc<dyn ModelHandle>,
        cfg: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Arc<Self>> {
        let (cmd_tx, cmd_rx) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let sched = Scheduler::new(cfg.scheduler, cfg.num_blocks, cfg.block_size);
        let max_seq_tokens = model.context_len().min(sched.max_tokens_per_seq());
        let shared_model = Arc::new(RwLock::new(model.clone()));
        let mut lp = EngineLoop {
            backend,
            model,
            shared_model: shared_model.clone(),
            sched,
            live: HashMap::new(),
            cmd_rx,
            queued: queued.clone(),
            metrics: metrics.clone(),
            model_name: llmprof_abi::fill_str(&cfg.served_model_name),
            step_id: 0,
        };
        let thread = std::thread::Builder::new()
            .name("llmserve-engine".into())
            .spawn(move || lp.run())?;
        Ok(Arc::new(Self {
            cmd_tx: Mutex::new(cmd_tx),
            queued,
            next_id: AtomicU64::new(1),
            model: shared_model,
            metrics,
            cfg,
            max_seq_tokens,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// The current model (changes on reload).
    pub fn model(&self) -> Arc<dyn ModelHandle> {
        self.model.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Most tokens (prompt + output) one sequence can hold: min(context length, KV-cache capacity).
    pub fn max_seq_tokens(&self) -> usize {
        self.max_seq_tokens
    }

    fn send(&self, c: Command) -> bool {
        self.cmd_tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(c)
            .is_ok()
    }

    /// Queues a request, or refuses it (queue full, prompt too long).
    pub fn submit(&self, req: GenRequest) -> Result<Submitted, SubmitError> {
        if req.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if req.prompt.len() >= self.max_seq_tokens {
            let what = if self.max_seq_tokens < self.model().context_len() {
                "KV-cache capacity, leaving room for one output token"
            } else {
                "context length, leaving room for one output token"
            };
            return Err(SubmitError::PromptTooLong {
                prompt: req.prompt.len(),
                max: self.max_seq_tokens - 1,
                what,
            });
        }
        let max_q = self.cfg.max_queue;
        if self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < max_q).then_some(q + 1)
            })
            .is_err()
        {
            return Err(SubmitError::QueueFull(max_q));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tmpsc::channel(self.cfg.stream_capacity.max(1));
        if !self.send(Command::Submit(id, Box::new(req), tx)) {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::ShuttingDown);
        }
        Ok(Submitted { id, rx })
    }

    /// Swaps in a model loaded elsewhere, between steps; running sequences are recomputed. Returns the new
    /// model's name.
    pub async fn reload(&self, r: Reloaded) -> Result<String, String> {
        let (tx, rx) = oneshot::channel();
        if !self.send(Command::Reload(Box::new(r), tx)) {
            return Err("the engine is shutting down".into());
        }
        rx.await
            .map_err(|_| "the engine stopped during the reload".to_string())?
    }

    /// Stops the engine thread (running requests are aborted) and waits for it.
    pub fn shutdown(&self) {
        self.send(Command::Shutdown);
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;
    use crate::engine::fakes::{engine, req};

    #[test]
    fn queue_limit_and_prompt_limits_are_enforced_at_submit() {
        let e = engine(1);
        let mut r = req(1);
        r.prompt = vec![5; 256];
        assert!(
            matches!(e.submit(r), Err(SubmitError::PromptTooLong { .. })),
            "64 blocks x 4 = 256 slots"
        );
        let mut r = req(1);
        r.prompt.clear();
        assert_eq!(e.submit(r).unwrap_err(), SubmitError::EmptyPrompt);
        e.shutdown();
        assert_eq!(e.submit(req(1)).unwrap_err(), SubmitError::ShuttingDown);
    }
}
