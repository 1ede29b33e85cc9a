//! One request's life, rebuilt from the engine's lifecycle transitions and the steps that served it.
//!
//! Owns the request-phase model every consumer shares: the Perfetto sink draws its phase slices from it, the OTel
//! builder ([`crate::otel::builder`]) its child spans, and `llmprof report` its per-request numbers (rebuilt from
//! the trace's typed args). It is fed, in stream order, by [`RequestTimeline::on_record`] (or
//! [`RequestTimeline::transition`] when the transitions come from somewhere other than the engine's records)
//! and [`RequestTimeline::on_step`]; it never writes anything and never reads a clock.
//!
//! # Two views of one life
//! - **Phases as the engine reports them** ([`Phase`]): each transition ends the current phase and starts the
//!   next one: `Arrived` → queued, `Scheduled` → prefill (decode once the first token was seen), `FirstToken`
//!   → decode, `Preempted` → queued again, `Finished` → nothing. These are the Perfetto sink's slices (the engine's
//!   own words, streamable) and `llmprof report`'s queue and prefill times (time in queued / prefill phases before
//!   the first token).
//! - **Segments that tile the request** ([`Segment`]), using the steps too. Back to back, their durations add up
//!   to the request's:
//!   - `Queue`: arrival → first scheduled.
//!   - `Prefill`, one per chunk: one per engine step that computed prompt tokens for the request. A chunk runs
//!     from the end of the previous segment to the end of its step, so it also holds the short scheduling gap
//!     before the step.
//!   - `Decode`: from the end of the last prefill chunk to the finish (or to a preemption), with the number of
//!     decode steps.
//!   - `Preempted`: preemption → resumed (the first step that serves the request again); it is followed by
//!     `Prefill` chunks with `recompute` (vLLM-style preemption by recompute), then `Decode` again.
//!
//!   These are the OTel builder's child spans.
//!
//! # How segments tell prefill from decode
//! The step record lists the requests of a batch but not each one's phase, so the phase comes from the request:
//! before its `FirstToken` a request is in prefill, after it in decode (the step that *started* before the first
//! token is the last prefill chunk, whichever of the two records comes first in the stream). After a preemption
//! there is no per-request signal for the end of the recompute, so: the first step that serves the request again
//! is a recompute chunk, further steps are recompute chunks while they are pure prefill steps, and the first
//! `decode` or `mixed` step ends the recompute. A `decode` step always means the request decodes.
//!
//! # Tokens
//! A step that is not a pure prefill step and started at or after the request's first token produced one of
//! its tokens (one per step per request): [`RequestTimeline::on_step`] returns the gap since the previous token
//! (the first token, or the previous such step's end) and the first such step is the request's first decode
//! step. These are `llmprof report`'s inter-token latencies. The engine records a step after the transitions it
//! caused, so the step that produced a request's last token comes after its `Finished`: it still counts here.
//!
//! # Requests not seen whole
//! A request first seen after its arrival ([`RequestTimeline::attached_mid_request`]) starts when first seen, in
//! the phase its first record shows; one still running at the end of the session is closed by
//! [`RequestTimeline::close_unfinished`].

use llmprof_abi::{FinishReason, RequestEventKind, RequestRecord, StepKind, StepRecord, read_str};

/// A lifecycle transition, as the engine's request records say it or as a reader rebuilds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Accepted and queued.
    Arrived,
    /// Scheduled into a batch (first time, or after a preemption).
    Scheduled,
    /// First output token sampled.
    FirstToken,
    /// Preempted: waits to be recomputed.
    Preempted,
    /// Finished, for this reason.
    Finished(FinishReason),
}

impl Transition {
    /// The transition a request record describes (`None` for an unknown kind).
    pub fn of(rec: &RequestRecord) -> Option<Self> {
        Some(match RequestEventKind::from_raw(rec.kind)? {
            RequestEventKind::Arrived => Self::Arrived,
            RequestEventKind::Scheduled => Self::Scheduled,
            RequestEventKind::FirstToken => Self::FirstToken,
            RequestEventKind::Preempted => Self::Preempted,
            RequestEventKind::Finished => Self::Finished(FinishReason::from_raw(rec.finish_reason)),
        })
    }
}

/// A caller's W3C trace context (`traceparent`), as the request's first record carried it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceContext {
    /// Trace id.
    pub trace_id: [u8; 16],
    /// The caller's span id.
    pub parent_span_id: [u8; 8],
    /// Trace flags (bit 0: sampled).
    pub flags: u8,
}

/// What a request asked for and got, as its lifecycle records say it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestInfo {
    /// Served model name.
    pub model: String,
    /// A chat completion (else a text completion).
    pub is_chat: bool,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens (the most any record said).
    pub output_tokens: u32,
    /// `max_tokens` requested.
    pub max_tokens: u32,
    /// Sampling temperature.
    pub temperature: f32,
    /// Nucleus sampling `top_p`.
    pub top_p: f32,
    /// The `x-request-id` header.
    pub x_request_id: String,
    /// The caller's `traceparent` (from the first record seen).
    pub trace_context: Option<TraceContext>,
    /// Why it finished (`None` while running).
    pub finish_reason: Option<FinishReason>,
    /// Preemptions as the engine counts them (covers those before the session).
    pub num_preemptions: u32,
}

impl RequestInfo {
    /// What `rec` says.
    pub fn from_record(rec: &RequestRecord) -> Self {
        Self {
            model: read_str(&rec.model).to_owned(),
            is_chat: rec.is_chat != 0,
            prompt_tokens: rec.prompt_tokens,
            output_tokens: rec.output_tokens,
            max_tokens: rec.max_tokens,
            temperature: rec.temperature,
            top_p: rec.top_p,
            x_request_id: read_str(&rec.x_request_id).to_owned(),
            trace_context: (rec.has_trace_context != 0).then_some(TraceContext {
                trace_id: rec.trace_id,
                parent_span_id: rec.parent_span_id,
                flags: rec.trace_flags,
            }),
            finish_reason: None,
            num_preemptions: rec.num_preemptions,
        }
    }

    /// Takes what a later record knows better: names when still unknown, the largest token and preemption
    /// counts.
    fn update(&mut self, rec: &RequestRecord) {
        if self.model.is_empty() {
            self.model = read_str(&rec.model).to_owned();
        }
        if self.x_request_id.is_empty() {
            self.x_request_id = read_str(&rec.x_request_id).to_owned();
        }
        self.prompt_tokens = self.prompt_tokens.max(rec.prompt_tokens);
        self.output_tokens = self.output_tokens.max(rec.output_tokens);
        self.num_preemptions = self.num_preemptions.max(rec.num_preemptions);
    }
}

/// One engine step as a request sees it (from a [`StepRecord`], or a step slice's args).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepInfo {
    /// The engine's step counter.
    pub step_id: u64,
    /// Its kind (`None`: a kind the record does not name).
    pub kind: Option<StepKind>,
    /// Host start, ns.
    pub start_ns: u64,
    /// Host end, ns (not before the start).
    pub end_ns: u64,
    /// Sequences in the batch.
    pub num_seqs: u32,
    /// Prompt tokens of the whole batch.
    pub prefill_tokens: u32,
    /// Decode tokens of the whole batch.
    pub decode_tokens: u32,
    /// This request's own tokens in the step (its share); `None` when the record's id list did not name it.
    pub request_tokens: Option<u32>,
}

impl StepInfo {
    /// Step `rec` as request `req` sees it.
    pub fn of(rec: &StepRecord, req: u64) -> Self {
        Self {
            step_id: rec.step_id,
            kind: StepKind::from_raw(rec.kind),
            start_ns: rec.host_start_ns,
            end_ns: rec.host_end_ns.max(rec.host_start_ns),
            num_seqs: rec.num_seqs,
            prefill_tokens: rec.prefill_tokens,
            decode_tokens: rec.decode_tokens,
            request_tokens: rec.tokens_of(req),
        }
    }

    /// Host time of the step, ns.
    pub fn host_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }
}

/// A phase as the engine's transitions report it (the Perfetto sink's phase slices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting to be scheduled for the first time.
    Queued,
    /// Scheduled, before the first token.
    Prefill,
    /// After the first token.
    Decode,
    /// Preempted, waiting to be scheduled again.
    Requeued,
}

impl Phase {
    /// The phase slice's name in the trace.
    pub fn name(self) -> &'static str {
        use crate::names::slice;
        match self {
            Self::Queued => slice::QUEUED,
            Self::Prefill => slice::PREFILL,
            Self::Decode => slice::DECODE,
            Self::Requeued => slice::REQUEUED,
        }
    }
}

/// What a transition did to the engine-reported phase: the one it ended and the one it started (at the
/// transition's time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseChange {
    /// The phase that ended.
    pub closed: Option<Phase>,
    /// The phase that started (`None` at the finish).
    pub opened: Option<Phase>,
}

/// What a [`Segment`] covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentKind {
    /// Arrival → first scheduled.
    Queue,
    /// One prefill chunk.
    Prefill {
        /// Chunk number over the request's life, from 0.
        index: u32,
        /// A chunk recomputing the request after a preemption.
        recompute: bool,
        /// The step that computed it (`None` when no step named the request).
        step: Option<StepInfo>,
    },
    /// Decoding.
    Decode {
        /// Decode steps that served the request in this segment.
        steps: u32,
    },
    /// Preempted → resumed.
    Preempted {
        /// Which preemption (from 0).
        index: u32,
    },
}

/// One piece of the tiling of a request's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// What it covers.
    pub kind: SegmentKind,
    /// Start, ns.
    pub start: u64,
    /// End, ns.
    pub end: u64,
}

/// Where the tiling is (segments use the steps, so this is not [`Phase`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Queued,
    Prefill { recompute: bool },
    Decode,
    Preempted,
}

/// One request's timeline. Create it at the request's first record ([`RequestTimeline::new`]), then feed that
/// record and every later one to [`RequestTimeline::on_record`] and the steps that name it to
/// [`RequestTimeline::on_step`], in stream order.
#[derive(Clone, Debug)]
pub struct RequestTimeline {
    req_id: u64,
    start_ns: u64,
    attached_mid_request: bool,
    info: RequestInfo,
    first_token_ns: Option<u64>,
    finished_ns: Option<u64>,
    /// The open engine-reported phase and its start.
    phase: Option<(Phase, u64)>,
    queued_before_first_token_ns: u64,
    prefill_before_first_token_ns: u64,
    // The tiling.
    stage: Stage,
    /// End of the last closed segment (start of the next one).
    cursor: u64,
    segments: Vec<Segment>,
    /// Prefill chunks in the current prefill stage.
    stage_chunks: u32,
    /// Prefill chunks over the request's life.
    chunks: u32,
    decode_steps: u32,
    steps: u32,
    preemptions_seen: u32,
    // Tokens.
    last_token_ns: Option<u64>,
    token_steps: u32,
    first_decode_step_ns: Option<u64>,
}

impl RequestTimeline {
    /// A request first seen at `ts` through `first` (anything but `Arrived`: it arrived before the session, and
    /// starts in the phase `first` shows). Feed `first` itself to [`RequestTimeline::on_record`] next.
    pub fn new(req_id: u64, ts: u64, first: Transition, info: RequestInfo) -> Self {
        let mut t = Self {
            req_id,
            start_ns: ts,
            attached_mid_request: first != Transition::Arrived,
            info,
            first_token_ns: None,
            finished_ns: None,
            phase: None,
            queued_before_first_token_ns: 0,
            prefill_before_first_token_ns: 0,
            stage: Stage::Queued,
            cursor: ts,
            segments: Vec::new(),
            stage_chunks: 0,
            chunks: 0,
            decode_steps: 0,
            steps: 0,
            preemptions_seen: 0,
            last_token_ns: None,
            token_steps: 0,
            first_decode_step_ns: None,
        };
        match first {
            Transition::Arrived | Transition::Finished(_) => {}
            Transition::Scheduled => t.enter_prefill(false),
            Transition::FirstToken => {
                t.first_token_ns = Some(ts);
                t.last_token_ns = Some(ts);
                t.enter_decode();
            }
            Transition::Preempted => {
                t.preemptions_seen = 1;
                t.stage = Stage::Preempted;
            }
        }
        t
    }

    /// A request first seen through record `rec` at `ts` (`None` for a record of unknown kind).
    pub fn from_record(rec: &RequestRecord, ts: u64) -> Option<Self> {
        Some(Self::new(
            rec.req_id,
            ts,
            Transition::of(rec)?,
            RequestInfo::from_record(rec),
        ))
    }

    /// Applies record `rec` at `ts`: its transition and what it says about the request (tokens, preemptions).
    /// `None` for a record of unknown kind (nothing changes).
    pub fn on_record(&mut self, rec: &RequestRecord, ts: u64) -> Option<PhaseChange> {
        let t = Transition::of(rec)?;
        self.info.update(rec);
        Some(self.transition(t, ts))
    }

    /// Applies transition `t` at `ts`.
    pub fn transition(&mut self, t: Transition, ts: u64) -> PhaseChange {
        let opened = match t {
            Transition::Arrived => Some(Phase::Queued),
            Transition::Scheduled if self.first_token_ns.is_some() => Some(Phase::Decode),
            Transition::Scheduled => Some(Phase::Prefill),
            Transition::FirstToken => Some(Phase::Decode),
            Transition::Preempted => Some(Phase::Requeued),
            Transition::Finished(_) => None,
        };
        let closed = self.close_phase(ts);
        match t {
            Transition::Arrived => {}
            Transition::Scheduled => self.on_scheduled(ts),
            Transition::FirstToken => {
                if self.first_token_ns.is_none() {
                    self.first_token_ns = Some(ts);
                    self.last_token_ns = Some(ts);
                }
            }
            Transition::Preempted => self.on_preempted(ts),
            Transition::Finished(reason) => {
                self.info.finish_reason = Some(reason);
                self.finished_ns = Some(ts);
                self.close_segments(ts);
            }
        }
        self.phase = opened.map(|p| (p, ts));
        PhaseChange { closed, opened }
    }

    /// Ends the request at the end of the session, `end_ns` (or the end of its last segment, if later); returns
    /// that end and the phase it closed.
    pub fn close_unfinished(&mut self, end_ns: u64) -> (u64, Option<Phase>) {
        let end = end_ns.max(self.cursor);
        let closed = self.close_phase(end);
        self.close_segments(end);
        (end, closed)
    }

    /// Applies a step that names the request. Returns the inter-token gap it closes (ns), when it produced one of
    /// the request's tokens (see the module docs). After the finish a step still counts for the tokens (the engine
    /// writes a step's record after the `Finished` of the requests the step completed), not for the segments.
    pub fn on_step(&mut self, step: &StepInfo) -> Option<u64> {
        if self.finished_ns.is_none() {
            self.tile_step(step);
        }
        let ft = self.first_token_ns?;
        if step.start_ns < ft || step.kind == Some(StepKind::Prefill) {
            return None;
        }
        self.token_steps += 1;
        self.first_decode_step_ns.get_or_insert(step.host_ns());
        let gap = step.end_ns.saturating_sub(self.last_token_ns.unwrap_or(ft));
        self.last_token_ns = Some(step.end_ns);
        Some(gap)
    }

    fn close_phase(&mut self, ts: u64) -> Option<Phase> {
        let (p, since) = self.phase.take()?;
        if self.first_token_ns.is_none() {
            let d = ts.saturating_sub(since);
            match p {
                Phase::Queued | Phase::Requeued => self.queued_before_first_token_ns += d,
                Phase::Prefill => self.prefill_before_first_token_ns += d,
                Phase::Decode => {}
            }
        }
        Some(p)
    }

    // ---- the tiling ----

    fn push(&mut self, kind: SegmentKind, end: u64) {
        let end = end.max(self.cursor);
        self.segments.push(Segment {
            kind,
            start: self.cursor,
            end,
        });
        self.cursor = end;
    }

    fn enter_prefill(&mut self, recompute: bool) {
        self.stage = Stage::Prefill { recompute };
        self.stage_chunks = 0;
    }

    fn enter_decode(&mut self) {
        self.stage = Stage::Decode;
        self.decode_steps = 0;
    }

    fn preempted_segment(&self) -> SegmentKind {
        SegmentKind::Preempted {
            index: self.preemptions_seen.saturating_sub(1),
        }
    }

    /// Ends the next prefill chunk (numbered in the request's order) at `end`.
    fn push_chunk(&mut self, recompute: bool, step: Option<StepInfo>, end: u64) {
        let index = self.chunks;
        self.chunks += 1;
        self.push(
            SegmentKind::Prefill {
                index,
                recompute,
                step,
            },
            end,
        );
    }

    /// A first token was seen while in the initial prefill: the chunks so far produced it (when no step record
    /// listed the request, prefill is taken to end at the first token).
    fn settle_first_token(&mut self) {
        if self.stage != (Stage::Prefill { recompute: false }) {
            return;
        }
        let Some(ft) = self.first_token_ns else { return };
        if self.stage_chunks == 0 {
            self.push_chunk(false, None, ft);
        }
        self.enter_decode();
    }

    fn on_scheduled(&mut self, t: u64) {
        match self.stage {
            Stage::Queued => {
                self.push(SegmentKind::Queue, t);
                self.enter_prefill(false);
            }
            Stage::Preempted => {
                self.push(self.preempted_segment(), t);
                self.enter_prefill(true);
            }
            Stage::Prefill { .. } | Stage::Decode => {}
        }
    }

    fn tile_step(&mut self, step: &StepInfo) {
        self.steps += 1;
        let (hs, he) = (step.start_ns, step.end_ns);
        // `Scheduled` not seen: the first step that serves the request ends its queueing (or preemption).
        self.on_scheduled(hs);
        if let Stage::Prefill { recompute } = self.stage {
            let ends_prefill = match (recompute, self.first_token_ns) {
                // A step that starts at or after the first token is past the prefill.
                (false, Some(ft)) => hs >= ft,
                (true, _) => self.stage_chunks > 0 && step.kind != Some(StepKind::Prefill),
                (false, None) => false,
            } || step.kind == Some(StepKind::Decode);
            if ends_prefill {
                if recompute {
                    self.enter_decode();
                } else {
                    self.settle_first_token();
                    if self.stage != Stage::Decode {
                        self.enter_decode();
                    }
                }
            }
        }
        match self.stage {
            Stage::Prefill { recompute } => {
                self.stage_chunks += 1;
                self.push_chunk(recompute, Some(*step), he);
                if !recompute && self.first_token_ns.is_some() {
                    // It started before the first token (else prefill had ended above): it produced it.
                    self.enter_decode();
                }
            }
            Stage::Decode => self.decode_steps += 1,
            Stage::Queued | Stage::Preempted => {}
        }
    }

    fn on_preempted(&mut self, t: u64) {
        self.settle_first_token();
        match self.stage {
            Stage::Decode => self.push(
                SegmentKind::Decode {
                    steps: self.decode_steps,
                },
                t,
            ),
            Stage::Queued => self.push(SegmentKind::Queue, t),
            // The preemption segment starts where the request stopped progressing (its last chunk's end).
            Stage::Prefill { .. } => {}
            Stage::Preempted => return,
        }
        self.preemptions_seen += 1;
        self.stage = Stage::Preempted;
    }

    /// Closes the current segment at `t` (finish, or the end of the session).
    fn close_segments(&mut self, t: u64) {
        self.settle_first_token();
        match self.stage {
            Stage::Queued => self.push(SegmentKind::Queue, t),
            Stage::Prefill { recompute } => {
                if self.stage_chunks == 0 {
                    self.push_chunk(recompute, None, t);
                } else if let Some(last) = self.segments.last_mut() {
                    // Ended (aborted) between chunks: the wait belongs to the last chunk.
                    last.end = last.end.max(t);
                    self.cursor = last.end;
                }
            }
            Stage::Decode => self.push(
                SegmentKind::Decode {
                    steps: self.decode_steps,
                },
                t,
            ),
            Stage::Preempted => self.push(self.preempted_segment(), t),
        }
    }

    // ---- what the consumers read ----

    /// The engine's request id.
    pub fn req_id(&self) -> u64 {
        self.req_id
    }

    /// Arrival (or first sight), ns.
    pub fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// First seen after its arrival: queue time and TTFT are unknown.
    pub fn attached_mid_request(&self) -> bool {
        self.attached_mid_request
    }

    /// What the records said about the request.
    pub fn info(&self) -> &RequestInfo {
        &self.info
    }

    /// When its first token was sampled.
    pub fn first_token_ns(&self) -> Option<u64> {
        self.first_token_ns
    }

    /// Start (arrival, or first sight) → first token, ns.
    pub fn ttft_ns(&self) -> Option<u64> {
        Some(self.first_token_ns?.saturating_sub(self.start_ns))
    }

    /// When it finished (`None`: still running, or closed unfinished).
    pub fn finished_ns(&self) -> Option<u64> {
        self.finished_ns
    }

    /// The engine-reported phase now, and since when.
    pub fn phase(&self) -> Option<(Phase, u64)> {
        self.phase
    }

    /// Time in queued phases (first queueing and after preemptions) before the first token; `None` without one.
    pub fn queued_before_first_token_ns(&self) -> Option<u64> {
        self.first_token_ns.map(|_| self.queued_before_first_token_ns)
    }

    /// Time in prefill phases before the first token; `None` without one.
    pub fn prefill_before_first_token_ns(&self) -> Option<u64> {
        self.first_token_ns.map(|_| self.prefill_before_first_token_ns)
    }

    /// Host time of the first step that produced a token after the first one.
    pub fn first_decode_step_ns(&self) -> Option<u64> {
        self.first_decode_step_ns
    }

    /// Steps that produced a token after the first one.
    pub fn token_steps(&self) -> u32 {
        self.token_steps
    }

    /// The segments closed so far, back to back.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// End of the last closed segment.
    pub fn cursor_ns(&self) -> u64 {
        self.cursor
    }

    /// Steps that named the request.
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// Prefill chunks over the request's life.
    pub fn prefill_chunks(&self) -> u32 {
        self.chunks
    }

    /// Preemptions seen during the session.
    pub fn preemptions_seen(&self) -> u32 {
        self.preemptions_seen
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests;
