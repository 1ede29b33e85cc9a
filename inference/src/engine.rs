//! The engine step loop: scheduler → backend forward → sampling → detokenization → streaming, on its own thread.
//!
//! Owns the lifecycle of every request after the HTTP layer accepted it: queueing (the [`Scheduler`]), the
//! per-step batch handed to the [`Backend`], sampling, incremental UTF-8-safe detokenization with stop strings,
//! finish conditions (EOS, stop string → `stop`; `max_tokens`, context or KV capacity → `length`), delivery of
//! output through a bounded channel per request, cancellation when the client goes away, weight swaps between
//! steps, metrics and the llmprof probe records (one [`StepRecord`] per step, one [`RequestRecord`] per lifecycle
//! event, NVTX-style ranges `schedule`, `forward`, `sample`, `detokenize` in domain `llmserve`).
//!
//! It must never block on a client: output goes out with `try_send`; when a client's channel is full the text is
//! held back and coalesced into the next message (counted in `llmserve:stream_stalls_total`), and a closed channel
//! aborts the request and frees its KV blocks. The engine never touches model files itself: reloads arrive as a
//! ready-made swap closure built by a loader thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use llmprof_abi::{
    ABI_VERSION, ContentKind, ContentRecord, FinishReason, RangeOp, RangeRecord, RequestEventKind,
    RequestRecord, StepKind, StepRecord,
};
use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::backend::{Backend, BackendError, BatchItem};
use crate::metrics::{FinishedRequestStats, Metrics};
use crate::sampling::{self, Rng, SamplingParams};
use crate::scheduler::{Scheduler, SchedulerConfig, Sequence};
use crate::trace_context::TraceContext;

/// Domain of the engine's NVTX-style ranges.
pub const RANGE_DOMAIN: &str = "llmserve";

/// What the engine needs to know about the loaded model (implemented for [`crate::model::Model`] in `main`'s
/// wiring, and by fakes in tests).
pub trait ModelHandle: Send + Sync {
    /// Model name from its metadata.
    fn name(&self) -> &str;
    /// Context length (max positions).
    fn context_len(&self) -> usize;
    /// End-of-sequence token ids.
    fn eos_token_ids(&self) -> &[u32];
    /// Raw bytes of a token (byte-level BPE decoded); empty for unknown ids.
    fn token_bytes(&self, id: u32) -> &[u8];
    /// Whether a token is a special/control token (not rendered in output text).
    fn is_special(&self, id: u32) -> bool;
    /// Tokenizes a completion prompt (adds BOS when the model wants it).
    fn encode_prompt(&self, text: &str) -> Vec<u32>;
    /// Tokenizes an already rendered chat prompt (the template carries the special tokens).
    fn encode_chat(&self, text: &str) -> Vec<u32>;
    /// Renders a chat with the model's template and the generation prompt appended.
    fn render_chat(&self, messages: &[(String, String)]) -> Result<String, String>;
}

/// Applies new weights to the backend (built by the loader thread; runs on the engine thread between steps).
pub type SwapFn = Box<dyn FnOnce(&mut dyn Backend) -> Result<(), BackendError> + Send>;

/// A model loaded off the engine thread, ready to be swapped in.
pub struct Reloaded {
    /// Swaps the weights into the backend.
    pub swap: SwapFn,
    /// Tokenizer/config view of the new model.
    pub handle: Arc<dyn ModelHandle>,
    /// Where it was loaded from.
    pub path: String,
}

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
    /// Temperature / top-p.
    pub sampling: SamplingParams,
    /// RNG seed (random when absent).
    pub seed: Option<u64>,
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
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chunk {
    /// New text.
    pub text: String,
    /// Tokens this text came from.
    pub num_tokens: u32,
    /// Set on the last chunk.
    pub finish: Option<Finish>,
}

impl Chunk {
    fn merge(&mut self, other: Chunk) {
        self.text.push_str(&other.text);
        self.num_tokens += other.num_tokens;
        if other.finish.is_some() {
            self.finish = other.finish;
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

enum Command {
    Submit(u64, Box<GenRequest>, tmpsc::Sender<Chunk>),
    Reload(Box<Reloaded>, oneshot::Sender<Result<String, String>>),
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

/// An NVTX-style range on the calling thread: pushes on creation, pops on drop.
pub struct Range {
    name: &'static str,
    step_id: u64,
}

impl Range {
    /// Pushes range `name` (domain [`RANGE_DOMAIN`]).
    pub fn push(name: &'static str, step_id: u64) -> Self {
        emit_range(RangeOp::Push, name, step_id);
        Self { name, step_id }
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        emit_range(RangeOp::Pop, self.name, self.step_id);
    }
}

/// Emits one range record.
pub fn emit_range(op: RangeOp, name: &str, step_id: u64) {
    let rec = RangeRecord::new(op, llmprof_probes::boottime_ns(), step_id, RANGE_DOMAIN, name);
    llmprof_probes::range(&rec);
}

/// Incremental, UTF-8-safe detokenization with stop strings.
///
/// Token bytes accumulate until they form complete UTF-8 characters (invalid bytes become U+FFFD). Text that could
/// be the start of a stop string is held back until it is known not to be one.
#[derive(Debug, Default)]
pub struct Detokenizer {
    pending: Vec<u8>,
    text: String,
    sent: usize,
    stop: Vec<String>,
    hold: usize,
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl Detokenizer {
    /// A detokenizer stopping at any of `stop` (empty strings ignored).
    pub fn new(stop: Vec<String>) -> Self {
        let stop: Vec<String> = stop.into_iter().filter(|s| !s.is_empty()).collect();
        let hold = stop.iter().map(|s| s.len()).max().unwrap_or(1).saturating_sub(1);
        Self {
            stop,
            hold,
            ..Default::default()
        }
    }

    fn decode_pending(&mut self, flush: bool) {
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    self.text.push_str(s);
                    self.pending.clear();
                    return;
                }
                Err(e) => {
                    let v = e.valid_up_to();
                    self.text.push_str(&String::from_utf8_lossy(&self.pending[..v]));
                    match e.error_len() {
                        Some(n) => {
                            self.text.push('\u{FFFD}');
                            self.pending.drain(..v + n);
                        }
                        None if flush => {
                            self.text.push('\u{FFFD}');
                            self.pending.clear();
                            return;
                        }
                        None => {
                            self.pending.drain(..v);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Adds a token's bytes. Returns true when a stop string appeared (the text is cut before it).
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        self.pending.extend_from_slice(bytes);
        self.decode_pending(false);
        self.check_stop()
    }

    fn check_stop(&mut self) -> bool {
        if self.stop.is_empty() {
            return false;
        }
        let from = floor_boundary(&self.text, self.sent.saturating_sub(self.hold));
        let hay = &self.text[from..];
        let hit = self.stop.iter().filter_map(|s| hay.find(s.as_str())).min();
        if let Some(p) = hit {
            self.text.truncate(from + p);
            self.pending.clear();
            return true;
        }
        false
    }

    /// Text that is safe to send now (`last`: everything, flushing incomplete bytes).
    /// Everything released to the client so far (after `take(true)`: the whole completion).
    pub fn released(&self) -> &str {
        &self.text[..self.sent]
    }

    pub fn take(&mut self, last: bool) -> String {
        if last {
            self.decode_pending(true);
            if self.check_stop() {
                // The flush completed a stop string: the text is already cut.
            }
        }
        let end = if last {
            self.text.len()
        } else {
            floor_boundary(&self.text, self.text.len().saturating_sub(self.hold))
        };
        if end <= self.sent {
            return String::new();
        }
        let s = self.text[self.sent..end].to_string();
        self.sent = end;
        s
    }
}

struct Live {
    tx: tmpsc::Sender<Chunk>,
    req: GenRequest,
    prompt_len: usize,
    arrival_ns: u64,
    rng: Rng,
    detok: Detokenizer,
    pending: Option<Chunk>,
    finished: bool,
    counted_queued: bool,
    scheduled_at: Option<Instant>,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
    output_tokens: u32,
    num_preemptions: u32,
}

struct EngineLoop {
    backend: Box<dyn Backend>,
    model: Arc<dyn ModelHandle>,
    shared_model: Arc<RwLock<Arc<dyn ModelHandle>>>,
    sched: Scheduler,
    live: HashMap<u64, Live>,
    cmd_rx: mpsc::Receiver<Command>,
    queued: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    model_name: [u8; llmprof_abi::MODEL_LEN],
    step_id: u64,
}

/// Polling interval while the engine is idle but a slow client still has undelivered output.
const IDLE_FLUSH_INTERVAL: Duration = Duration::from_millis(2);

impl EngineLoop {
    fn run(&mut self) {
        loop {
            // 1. Commands: block when there is nothing else to do.
            let has_pending = self.live.values().any(|l| l.pending.is_some());
            let first = if self.sched.is_idle() && !has_pending {
                match self.cmd_rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => break,
                }
            } else if self.sched.is_idle() {
                match self.cmd_rx.recv_timeout(IDLE_FLUSH_INTERVAL) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                None
            };
            let mut stop = false;
            if let Some(c) = first {
                stop |= self.handle(c);
            }
            loop {
                match self.cmd_rx.try_recv() {
                    Ok(c) => stop |= self.handle(c),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        stop = true;
                        break;
                    }
                }
            }
            if stop {
                break;
            }
            // 2. Cancellations and delivery of held-back output.
            self.reap_closed();
            self.flush();
            // 3. One step.
            if !self.sched.is_idle() {
                self.step();
                self.flush();
            }
            self.publish_gauges();
        }
        let ids: Vec<u64> = self.live.keys().copied().collect();
        for id in ids {
            self.finish(id, FinishReason::Abort);
        }
        self.flush();
        self.publish_gauges();
    }

    /// Returns true on shutdown.
    fn handle(&mut self, c: Command) -> bool {
        match c {
            Command::Submit(id, req, tx) => self.admit(id, *req, tx),
            Command::Reload(r, reply) => {
                let res = self.reload(*r);
                let _ = reply.send(res);
            }
            Command::Shutdown => return true,
        }
        false
    }

    fn admit(&mut self, id: u64, req: GenRequest, tx: tmpsc::Sender<Chunk>) {
        let seed = req
            .seed
            .unwrap_or_else(|| llmprof_probes::boottime_ns() ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let prompt_len = req.prompt.len();
        let live = Live {
            tx,
            prompt_len,
            arrival_ns: llmprof_probes::boottime_ns()
                .saturating_sub(req.arrival.elapsed().as_nanos().min(u64::MAX as u128) as u64),
            rng: Rng::new(seed),
            detok: Detokenizer::new(req.stop.clone()),
            pending: None,
            finished: false,
            counted_queued: true,
            scheduled_at: None,
            first_token_at: None,
            last_token_at: None,
            output_tokens: 0,
            num_preemptions: 0,
            req,
        };
        self.sched.add(Sequence::new(id, live.req.prompt.clone()));
        let prompt_text = llmprof_probes::content_attached().then(|| {
            // Only while `llmprof attach --capture-content` is attached: the prompt as the model sees it.
            let bytes: Vec<u8> = live
                .req
                .prompt
                .iter()
                .flat_map(|&t| self.model.token_bytes(t).iter().copied())
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        });
        self.live.insert(id, live);
        self.probe_request(id, RequestEventKind::Arrived, FinishReason::None);
        if let Some(text) = prompt_text {
            llmprof_probes::content(&ContentRecord::new(ContentKind::Prompt, id, &text));
        }
    }

    fn reload(&mut self, r: Reloaded) -> Result<String, String> {
        let _range = Range::push("reload", self.step_id);
        (r.swap)(self.backend.as_mut())
            .map_err(|e| format!("swapping the weights of {} failed: {e}", r.path))?;
        self.sched.invalidate_kv();
        let name = r.handle.name().to_string();
        self.model = r.handle.clone();
        *self.shared_model.write().unwrap_or_else(|e| e.into_inner()) = r.handle;
        Ok(name)
    }

    fn reap_closed(&mut self) {
        let closed: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, l)| !l.finished && l.tx.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in closed {
            self.finish(id, FinishReason::Abort);
        }
    }

    fn flush(&mut self) {
        let mut done = Vec::new();
        for (&id, l) in self.live.iter_mut() {
            if let Some(chunk) = l.pending.take() {
                match l.tx.try_send(chunk) {
                    Ok(()) => {}
                    Err(tmpsc::error::TrySendError::Full(c)) => {
                        l.pending = Some(c);
                        self.metrics.add_stream_stall();
                    }
                    Err(tmpsc::error::TrySendError::Closed(_)) => {}
                }
            }
            if l.finished && (l.pending.is_none() || l.tx.is_closed()) {
                done.push(id);
            }
        }
        for id in done {
            self.live.remove(&id);
        }
    }

    fn queue_out(&mut self, id: u64, chunk: Chunk) {
        let Some(l) = self.live.get_mut(&id) else { return };
        match &mut l.pending {
            Some(p) => p.merge(chunk),
            None => l.pending = Some(chunk),
        }
    }

    fn publish_gauges(&self) {
        self.metrics.set_scheduler_state(
            self.sched.num_running(),
            self.sched.num_waiting(),
            self.sched.kv().usage(),
        );
    }

    fn uncount_queued(&mut self, id: u64) {
        if let Some(l) = self.live.get_mut(&id)
            && l.counted_queued
        {
            l.counted_queued = false;
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Ends a request: frees its blocks, records metrics and the probe, queues the final chunk.
    fn finish(&mut self, id: u64, reason: FinishReason) {
        let Some(l) = self.live.get(&id) else { return };
        if l.finished {
            return;
        }
        self.sched.remove(id);
        self.uncount_queued(id);
        let Some(l) = self.live.get_mut(&id) else { return };
        l.finished = true;
        let text = if reason == FinishReason::Abort {
            String::new()
        } else {
            l.detok.take(true)
        };
        let now = Instant::now();
        let stats = FinishedRequestStats {
            reason: match reason {
                FinishReason::Stop => 0,
                FinishReason::Length => 1,
                _ => 2,
            },
            e2e_s: now.duration_since(l.req.arrival).as_secs_f64(),
            queue_s: l
                .scheduled_at
                .map(|t| t.duration_since(l.req.arrival).as_secs_f64()),
            prefill_s: match (l.scheduled_at, l.first_token_at) {
                (Some(s), Some(f)) => Some(f.duration_since(s).as_secs_f64()),
                _ => None,
            },
            decode_s: l.first_token_at.map(|f| now.duration_since(f).as_secs_f64()),
            prompt_tokens: l.prompt_len as u64,
            generation_tokens: l.output_tokens as u64,
        };
        let fin = Finish {
            reason,
            prompt_tokens: l.prompt_len as u32,
            completion_tokens: l.output_tokens,
        };
        if llmprof_probes::content_attached() {
            llmprof_probes::content(&ContentRecord::new(
                ContentKind::Completion,
                id,
                l.detok.released(),
            ));
        }
        self.metrics.observe_finished(&stats);
        self.probe_request(id, RequestEventKind::Finished, reason);
        self.queue_out(
            id,
            Chunk {
                text,
                num_tokens: 0,
                finish: Some(fin),
            },
        );
    }

    fn probe_request(&self, id: u64, kind: RequestEventKind, reason: FinishReason) {
        let Some(l) = self.live.get(&id) else { return };
        let tc = l.req.trace.unwrap_or_default();
        let rec = RequestRecord {
            abi_version: ABI_VERSION,
            kind: kind as u32,
            req_id: id,
            ts_ns: if kind == RequestEventKind::Arrived {
                l.arrival_ns
            } else {
                llmprof_probes::boottime_ns()
            },
            trace_id: tc.trace_id,
            parent_span_id: tc.parent_span_id,
            has_trace_context: u8::from(l.req.trace.is_some()),
            trace_flags: tc.flags,
            is_chat: u8::from(l.req.is_chat),
            _pad: 0,
            finish_reason: reason as u32,
            prompt_tokens: l.prompt_len as u32,
            output_tokens: l.output_tokens,
            max_tokens: l.req.max_tokens.min(u32::MAX as usize) as u32,
            temperature: l.req.sampling.temperature,
            top_p: l.req.sampling.top_p,
            num_preemptions: l.num_preemptions,
            x_request_id: llmprof_abi::fill_str(l.req.x_request_id.as_deref().unwrap_or("")),
            model: self.model_name,
        };
        llmprof_probes::request(&rec);
    }

    fn step(&mut self) {
        self.step_id += 1;
        let step_id = self.step_id;
        let host_start_ns = llmprof_probes::boottime_ns();

        let out = {
            let _r = Range::push("schedule", step_id);
            self.sched.schedule()
        };
        // The step record reports the cache and queue as the scheduler left them.
        let kv_blocks_used = self.sched.kv().num_used_blocks() as u32;
        let num_waiting = self.sched.num_waiting() as u32;
        let now = Instant::now();
        for &id in &out.first_scheduled {
            self.uncount_queued(id);
            if let Some(l) = self.live.get_mut(&id) {
                l.scheduled_at = Some(now);
            }
            self.probe_request(id, RequestEventKind::Scheduled, FinishReason::None);
        }
        for &id in &out.preempted {
            if let Some(l) = self.live.get_mut(&id) {
                l.num_preemptions += 1;
            }
            self.probe_request(id, RequestEventKind::Preempted, FinishReason::None);
        }
        self.metrics.add_preemptions(out.preempted.len() as u64);
        if out.seqs.is_empty() {
            // Nothing fits (every running sequence was preempted); the next step admits again.
            return;
        }

        // Forward.
        let result = {
            let mut items = Vec::with_capacity(out.seqs.len());
            for sc in &out.seqs {
                let Some(seq) = self.sched.get(sc.id) else {
                    continue;
                };
                items.push(BatchItem {
                    tokens: &seq.tokens[sc.start_pos..sc.start_pos + sc.num_tokens],
                    start_pos: sc.start_pos,
                    block_table: self.sched.kv().block_table(sc.id),
                    need_logits: sc.need_logits,
                });
            }
            let _r = Range::push("forward", step_id);
            self.backend.forward(&items)
        };
        let step_out = match result {
            Ok(o) => o,
            Err(e) => {
                eprintln!("llmserve: forward pass of step {step_id} failed: {e}; failing its requests");
                for sc in &out.seqs {
                    self.finish(sc.id, FinishReason::Error);
                }
                return;
            }
        };
        self.sched.mark_computed(&out);

        // Sample.
        let mut sampled: Vec<(u64, u32)> = Vec::with_capacity(out.seqs.len());
        {
            let _r = Range::push("sample", step_id);
            let mut logits = step_out.logits.iter();
            for sc in out.seqs.iter().filter(|s| s.need_logits) {
                let Some(lg) = logits.next() else { break };
                let Some(l) = self.live.get_mut(&sc.id) else {
                    continue;
                };
                let tok = sampling::sample(lg, l.req.sampling, &mut l.rng);
                sampled.push((sc.id, tok));
            }
        }

        // Detokenize, check finish conditions, queue output.
        {
            let _r = Range::push("detokenize", step_id);
            let now = Instant::now();
            let max_total = self.model.context_len().min(self.sched.max_tokens_per_seq());
            for (id, tok) in sampled {
                self.sched.append_token(id, tok);
                let total = self.sched.get(id).map_or(usize::MAX, |s| s.tokens.len());
                let Some(l) = self.live.get_mut(&id) else { continue };
                l.output_tokens += 1;
                self.metrics.add_generation_tokens(1);
                let first = l.first_token_at.is_none();
                if first {
                    l.first_token_at = Some(now);
                    self.metrics
                        .observe_ttft(now.duration_since(l.req.arrival).as_secs_f64());
                    self.metrics.add_prompt_tokens(l.prompt_len as u64);
                } else if let Some(prev) = l.last_token_at {
                    self.metrics.observe_itl(now.duration_since(prev).as_secs_f64());
                }
                l.last_token_at = Some(now);
                let is_eos = self.model.eos_token_ids().contains(&tok);
                let hit_stop = if is_eos || self.model.is_special(tok) {
                    false
                } else {
                    l.detok.push(self.model.token_bytes(tok))
                };
                let reason = if is_eos || hit_stop {
                    Some(FinishReason::Stop)
                } else if l.output_tokens as usize >= l.req.max_tokens || total >= max_total {
                    Some(FinishReason::Length)
                } else {
                    None
                };
                if reason.is_none() {
                    let text = l.detok.take(false);
                    self.queue_out(
                        id,
                        Chunk {
                            text,
                            num_tokens: 1,
                            finish: None,
                        },
                    );
                } else {
                    self.queue_out(
                        id,
                        Chunk {
                            text: String::new(),
                            num_tokens: 1,
                            finish: None,
                        },
                    );
                }
                if first {
                    self.probe_request(id, RequestEventKind::FirstToken, FinishReason::None);
                }
                if let Some(r) = reason {
                    self.finish(id, r);
                }
            }
        }

        // Step record.
        let host_end_ns = llmprof_probes::boottime_ns();
        let kind = match (out.prefill_tokens > 0, out.decode_tokens > 0) {
            (true, true) => StepKind::Mixed,
            (false, true) => StepKind::Decode,
            _ => StepKind::Prefill,
        };
        let ids: Vec<u64> = out.seqs.iter().map(|sc| sc.id).collect();
        let rec = StepRecord {
            host_start_ns,
            host_end_ns,
            device_start_ns: step_out.device_start_ns,
            device_end_ns: step_out.device_end_ns,
            device_clock: self.backend.device_clock() as u32,
            prefill_tokens: out.prefill_tokens as u32,
            decode_tokens: out.decode_tokens as u32,
            kv_blocks_used,
            kv_blocks_total: self.sched.kv().num_blocks() as u32,
            num_waiting,
            num_preempted: out.preempted.len() as u32,
            ..StepRecord::new(kind, step_id, &ids)
        }
        .with_req_tokens(out.seqs.iter().map(|sc| sc.num_tokens as u32));
        self.metrics.add_step(kind);
        self.metrics.add_step_time(
            host_end_ns.saturating_sub(host_start_ns),
            step_out.device_end_ns.saturating_sub(step_out.device_start_ns),
        );
        llmprof_probes::step(&rec);
    }
}

/// The real model behind the engine.
impl ModelHandle for crate::model::Model {
    fn name(&self) -> &str {
        &self.config.name
    }
    fn context_len(&self) -> usize {
        self.config.context_len
    }
    fn eos_token_ids(&self) -> &[u32] {
        &self.config.eos_token_ids
    }
    fn token_bytes(&self, id: u32) -> &[u8] {
        self.tokenizer.token_bytes(id)
    }
    fn is_special(&self, id: u32) -> bool {
        self.tokenizer.is_special(id)
    }
    fn encode_prompt(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        if self.tokenizer.add_bos()
            && let Some(b) = self.config.bos_token_id
        {
            ids.push(b);
        }
        ids.extend(self.tokenizer.encode(text));
        ids
    }
    fn encode_chat(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text)
    }
    fn render_chat(&self, messages: &[(String, String)]) -> Result<String, String> {
        let Some(t) = &self.chat_template else {
            return Err(format!(
                "model {:?} has no chat template in its GGUF metadata; use /v1/completions",
                self.config.name
            ));
        };
        let msgs: Vec<crate::chat_template::ChatMessage> = messages
            .iter()
            .map(|(r, c)| crate::chat_template::ChatMessage::new(r.as_str(), c.as_str()))
            .collect();
        t.render(&msgs, true).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;

    use crate::model::ModelConfig;

    /// A fake model: token 3 is "a", token 0 is EOS; context 1000.
    struct FakeModel;

    impl ModelHandle for FakeModel {
        fn name(&self) -> &str {
            "fake"
        }
        fn context_len(&self) -> usize {
            1000
        }
        fn eos_token_ids(&self) -> &[u32] {
            &[0]
        }
        fn token_bytes(&self, id: u32) -> &[u8] {
            if id == 3 { b"a" } else { b"?" }
        }
        fn is_special(&self, id: u32) -> bool {
            id == 0
        }
        fn encode_prompt(&self, text: &str) -> Vec<u32> {
            text.bytes().map(|_| 5).collect()
        }
        fn encode_chat(&self, text: &str) -> Vec<u32> {
            self.encode_prompt(text)
        }
        fn render_chat(&self, _m: &[(String, String)]) -> Result<String, String> {
            Err("none".into())
        }
    }

    /// A fake backend whose logits always favour token 3.
    struct FakeBackend(ModelConfig);

    impl Backend for FakeBackend {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn device_clock(&self) -> llmprof_abi::DeviceClock {
            llmprof_abi::DeviceClock::HostCompute
        }
        fn config(&self) -> &ModelConfig {
            &self.0
        }
        fn forward(&mut self, batch: &[BatchItem<'_>]) -> Result<crate::backend::StepOutput, BackendError> {
            // Some compute time, so requests live long enough to be cancelled.
            std::thread::sleep(Duration::from_millis(1));
            let mut logits = vec![0.0f32; 8];
            logits[3] = 10.0;
            let n = batch.iter().filter(|b| b.need_logits).count();
            Ok(crate::backend::StepOutput {
                logits: vec![logits; n],
                device_start_ns: 1,
                device_end_ns: 2,
            })
        }
        fn swap_weights(&mut self, _model: Arc<crate::model::Model>) -> Result<(), BackendError> {
            Ok(())
        }
    }

    fn engine(stream_capacity: usize) -> Arc<EngineHandle> {
        let cfg = ModelConfig {
            vocab_size: 8,
            n_layers: 1,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 2,
            dim: 2,
            ffn_dim: 2,
            context_len: 1000,
            rope_base: 1e4,
            rms_eps: 1e-5,
            bos_token_id: None,
            eos_token_ids: vec![0],
            name: "fake".into(),
        };
        let ecfg = EngineConfig {
            scheduler: SchedulerConfig {
                max_num_seqs: 4,
                max_num_batched_tokens: 64,
            },
            num_blocks: 64,
            block_size: 4,
            max_queue: 8,
            stream_capacity,
            served_model_name: "fake".into(),
        };
        let metrics = Arc::new(Metrics::new("fake", 1000));
        EngineHandle::start(Box::new(FakeBackend(cfg)), Arc::new(FakeModel), ecfg, metrics).unwrap()
    }

    fn req(max_tokens: usize) -> GenRequest {
        GenRequest {
            prompt: vec![5, 5, 5],
            max_tokens,
            sampling: SamplingParams {
                temperature: 0.0,
                top_p: 1.0,
            },
            seed: None,
            stop: vec![],
            trace: None,
            x_request_id: None,
            is_chat: false,
            arrival: Instant::now(),
        }
    }

    fn drain(rx: &mut tmpsc::Receiver<Chunk>) -> (String, usize, Finish) {
        let mut text = String::new();
        let mut msgs = 0;
        loop {
            let c = rx.blocking_recv().expect("stream ends with a finish");
            msgs += 1;
            text.push_str(&c.text);
            if let Some(f) = c.finish {
                return (text, msgs, f);
            }
        }
    }

    #[test]
    fn a_slow_client_never_blocks_the_loop_and_gets_coalesced_output() {
        let e = engine(2);
        // The slow client reads nothing while its 200 tokens are generated.
        let mut slow = e.submit(req(200)).unwrap();
        let mut fast = e.submit(req(5)).unwrap();
        let (t, _, f) = drain(&mut fast.rx);
        assert_eq!((t.as_str(), f.reason), ("aaaaa", FinishReason::Length));
        let (t, msgs, f) = drain(&mut slow.rx);
        assert_eq!(t, "a".repeat(200), "nothing is lost");
        assert_eq!(f.completion_tokens, 200);
        assert!(msgs < 200, "output was coalesced into {msgs} messages");
        assert!(
            e.metrics()
                .render()
                .contains("llmserve:stream_stalls_total{model_name=\"fake\"} ")
        );
        e.shutdown();
    }

    #[test]
    fn dropping_the_stream_cancels_and_frees_blocks() {
        let e = engine(1);
        let s = e.submit(req(100_000)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        drop(s);
        let freed = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            let m = e.metrics().render();
            m.contains("vllm:kv_cache_usage_perc{model_name=\"fake\"} 0.0")
                && m.contains("finished_reason=\"abort\"} 1")
        });
        assert!(freed, "{}", e.metrics().render());
        e.shutdown();
    }

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

    #[test]
    fn detokenizer_waits_for_complete_utf8() {
        let mut d = Detokenizer::new(vec![]);
        let e = "é".as_bytes();
        assert!(!d.push(&e[..1]));
        assert_eq!(d.take(false), "");
        d.push(&e[1..]);
        assert_eq!(d.take(false), "é");
        d.push(&[0xff]);
        d.push(b"a");
        assert_eq!(d.take(false), "\u{FFFD}a");
        d.push(&[0xe2, 0x82]);
        assert_eq!(d.take(true), "\u{FFFD}");
    }

    #[test]
    fn detokenizer_stops_across_tokens_and_never_leaks_a_partial_stop() {
        let mut d = Detokenizer::new(vec!["STOP".into()]);
        assert!(!d.push(b"hello S"));
        let a = d.take(false);
        assert!(!d.push(b"TO"));
        let b = d.take(false);
        assert!(d.push(b"P and more"));
        let c = d.take(true);
        assert_eq!(format!("{a}{b}{c}"), "hello ");
        assert!(!a.contains('S') && !b.contains('S'));
    }
}
