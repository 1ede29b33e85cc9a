//! The engine step loop: scheduler → backend forward (which picks each sequence's next token) → detokenization →
//! streaming, on its own thread.
//!
//! Owns the lifecycle of every request after the HTTP layer accepted it: queueing (the [`Scheduler`]), the
//! per-step batch handed to the [`Backend`] with what each sequence's token needs (the argmax, or a
//! [`SampleSpec`]: the request's parameters and seed, the token's output index, the token history its penalties
//! need, kept here per request), incremental UTF-8-safe detokenization with stop strings,
//! finish conditions (EOS, stop string → `stop`; `max_tokens`, context or KV capacity → `length`), delivery of
//! output through a bounded channel per request, cancellation when the client goes away, weight swaps between
//! steps, metrics and the llmprof probe records (one [`StepRecord`] per step, one [`RequestRecord`] per lifecycle
//! event, NVTX-style ranges `schedule`, `forward`, `sample`, `detokenize` in domain `llmserve`).
//!
//! It must never block on a client: output goes out with `try_send`; when a client's channel is full the text is
//! held back and coalesced into the next message (counted in `llmserve:stream_stalls_total`), and a closed channel
//! aborts the request and frees its KV blocks. The engine never touches model files itself: reloads arrive as a
//! ready-made swap closure built by a loader thread.
//!
//! This file holds the loop; the rest of the engine is in
//! - `handle.rs`: [`EngineHandle`] and the request/output types the HTTP layer uses, admission control;
//! - `model_handle.rs`: [`ModelHandle`], the engine's view of a model, and [`Reloaded`];
//! - `detokenizer.rs`: [`Detokenizer`];
//! - `probes.rs`: the NVTX-style [`Range`] guard and [`emit_range`].
//! - `fakes.rs` (tests only): a fake model and backend the unit tests drive the engine with.
//!
//! Every public item is re-exported here: callers name `engine::X`, never a submodule.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use llmprof_abi::{
    ABI_VERSION, ContentKind, ContentRecord, FinishReason, RequestEventKind, RequestRecord, StepKind,
    StepRecord,
};
use tokio::sync::mpsc as tmpsc;

use crate::backend::{Backend, BatchItem, Logits};
use crate::metrics::{FinishedRequestStats, Metrics};
use crate::sampling::{SampleSpec, TokenHistory, TokenLogprobs};
use crate::scheduler::{Scheduler, Sequence};

mod detokenizer;
#[cfg(test)]
mod fakes;
mod handle;
mod model_handle;
mod probes;

pub use detokenizer::Detokenizer;
pub use handle::{
    Chunk, EngineConfig, EngineHandle, Finish, GenRequest, LogprobEntry, SubmitError, Submitted,
};
pub use model_handle::{ModelHandle, Reloaded, SwapFn};
pub use probes::{RANGE_DOMAIN, Range, emit_range};

use handle::Command;

struct Live {
    tx: tmpsc::Sender<Chunk>,
    req: GenRequest,
    prompt_len: usize,
    arrival_ns: u64,
    /// The seed of the request's draws ([`crate::sampling::uniform`]'s key).
    seed: u64,
    /// The tokens seen, for the penalties (only when the request has penalties).
    history: Option<TokenHistory>,
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
            seed,
            history: req
                .sampling
                .has_penalties()
                .then(|| TokenHistory::new(&req.prompt)),
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
                logprobs: Vec::new(),
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
        // What each item wants back, in batch order: greedy sequences only the argmax, the others a token drawn
        // by the backend (on a GPU the logits stay on the device either way), with log-probabilities if asked.
        // (sequence, whether it gets a token, whether with log-probabilities)
        let mut wants: Vec<(u64, bool, bool)> = Vec::with_capacity(out.seqs.len());
        let result = {
            let mut items = Vec::with_capacity(out.seqs.len());
            for sc in &out.seqs {
                let Some(seq) = self.sched.get(sc.id) else {
                    continue;
                };
                let logits = match (sc.need_logits, self.live.get(&sc.id)) {
                    (false, _) => Logits::None,
                    (true, Some(l)) if !l.req.sampling.is_greedy() || l.req.logprobs.is_some() => {
                        Logits::Sample(SampleSpec {
                            params: l.req.sampling,
                            seed: l.seed,
                            index: u64::from(l.output_tokens),
                            history: l.history.as_ref().map_or(&[], |h| h.entries()),
                            logprobs: l.req.logprobs,
                        })
                    }
                    (true, _) => Logits::Argmax,
                };
                wants.push((sc.id, logits.wanted(), logits.wants_logprobs()));
                items.push(BatchItem {
                    tokens: &seq.tokens[sc.start_pos..sc.start_pos + sc.num_tokens],
                    start_pos: sc.start_pos,
                    block_table: self.sched.kv().block_table(sc.id),
                    logits,
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

        // The backend chose the tokens (and computed the log-probabilities asked for): collect them.
        let mut sampled: Vec<(u64, u32, Option<TokenLogprobs>)> = Vec::with_capacity(out.seqs.len());
        {
            let _r = Range::push("sample", step_id);
            let mut tokens = step_out.tokens.into_iter();
            let mut logprobs = step_out.logprobs.into_iter();
            for &(id, _, wants_lp) in wants.iter().filter(|w| w.1) {
                let Some(tok) = tokens.next() else { break };
                let lp = if wants_lp { logprobs.next() } else { None };
                sampled.push((id, tok, lp));
            }
        }

        // Detokenize, check finish conditions, queue output.
        {
            let _r = Range::push("detokenize", step_id);
            let now = Instant::now();
            let max_total = self.model.context_len().min(self.sched.max_tokens_per_seq());
            for (id, tok, lp) in sampled {
                self.sched.append_token(id, tok);
                let total = self.sched.get(id).map_or(usize::MAX, |s| s.tokens.len());
                let Some(l) = self.live.get_mut(&id) else { continue };
                l.output_tokens += 1;
                if let Some(h) = &mut l.history {
                    h.push(tok);
                }
                let logprobs: Vec<LogprobEntry> = lp
                    .map(|lp| LogprobEntry::new(&*self.model, tok, &lp))
                    .into_iter()
                    .collect();
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
                let text = if reason.is_none() {
                    l.detok.take(false)
                } else {
                    String::new()
                };
                self.queue_out(
                    id,
                    Chunk {
                        text,
                        num_tokens: 1,
                        logprobs,
                        finish: None,
                    },
                );
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
            graph_batch: step_out.graph_batch,
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

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;
    use crate::engine::fakes::{drain, engine, req};

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
}
