//! The span builder: turns the event stream into one OTel span tree per engine request.
//!
//! Owns the spans: a request span (GenAI attributes, the caller's trace context, the kernel events seen on the
//! engine's threads as span events) and its children, the segments of the request's
//! [`RequestTimeline`] (`queue`, `prefill` per chunk, `decode`, `preempted`; see [`crate::timeline`] for how they
//! tile the request and how prefill is told from decode). A prefill chunk's step is in its attributes (the step's
//! own host time is `llmprof.step.host_duration`; the chunk span also holds the scheduling gap before the step). It
//! is a pure function of the stream (no I/O, no clock reads, ids from an injected generator), so it is unit-tested
//! from fixtures built in code; it never blocks and never exports (see `export` for that).
//!
//! # What is not tracked
//! Requests that arrived before the session get `llmprof.partial = true` and start when first seen; requests
//! still running when the session ends get `llmprof.unfinished = true` and end at the session's last event. At
//! most [`MAX_OPEN_REQUESTS`] are tracked at once (more are counted and skipped), and at most
//! [`MAX_SPAN_EVENTS`] kernel events are kept per request (more are counted in the span's dropped-events count).

use std::borrow::Cow;
use std::collections::HashMap;

use llmprof_abi::{ContentKind, FinishReason, MAX_STEP_REQS, RequestRecord};
use opentelemetry::trace::{
    Event as SpanEvent, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SpanData, SpanEvents, SpanLinks};

use super::semconv as sc;
use crate::clock::WallClock;
use crate::event::{Event, EventBody, OverheadSample};
use crate::timeline::{RequestTimeline, Segment, SegmentKind, StepInfo, Transition};

/// Most requests tracked at once: bounds memory when `Finished` records are lost (a lost one would otherwise keep
/// its state forever). 64 Ki requests × ~1 KiB of state is 64 MiB at worst; an engine serves far fewer at once.
pub const MAX_OPEN_REQUESTS: usize = 65_536;
/// Most kernel events kept as span events of one request (OTel SDK default span limit: 128 events per span).
pub const MAX_SPAN_EVENTS: usize = 128;

/// Counters of the builder itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuilderStats {
    /// Spans built (requests and their children).
    pub spans_built: u64,
    /// Requests not tracked because [`MAX_OPEN_REQUESTS`] were open.
    pub requests_skipped: u64,
    /// Request records with an unknown kind.
    pub bad_records: u64,
    /// Requests whose caller's `traceparent` had the sampled flag off: not exported (parent-based sampling, as the
    /// OTel SDK's default `ParentBased(AlwaysOn)` sampler does).
    pub requests_unsampled: u64,
}

/// A request being tracked: its timeline and what only its spans need.
#[derive(Debug)]
struct OpenRequest {
    timeline: RequestTimeline,
    trace_id: TraceId,
    span_id: SpanId,
    /// The caller's span (`traceparent`), when valid.
    parent: Option<SpanId>,
    flags: TraceFlags,
    /// Prompt text (`--capture-content` only).
    prompt_text: Option<String>,
    /// Completion text (`--capture-content` only).
    completion_text: Option<String>,
    /// A captured text was cut at the probe's limit.
    content_truncated: bool,
    events: Vec<SpanEvent>,
    dropped_events: u32,
}

impl OpenRequest {
    /// Joins the caller's trace when the record carries a valid `traceparent`, else starts a trace (sampled).
    fn new(timeline: RequestTimeline, ids: &dyn IdGenerator) -> Self {
        let caller = timeline.info().trace_context.and_then(|c| {
            let t = TraceId::from_bytes(c.trace_id);
            let p = SpanId::from_bytes(c.parent_span_id);
            (t != TraceId::INVALID && p != SpanId::INVALID).then_some((t, p, TraceFlags::new(c.flags)))
        });
        let (trace_id, parent, flags) = match caller {
            Some((t, p, f)) => (t, Some(p), f),
            None => (ids.new_trace_id(), None, TraceFlags::SAMPLED),
        };
        Self {
            timeline,
            trace_id,
            span_id: ids.new_span_id(),
            parent,
            flags,
            prompt_text: None,
            completion_text: None,
            content_truncated: false,
            events: Vec::new(),
            dropped_events: 0,
        }
    }
}

/// Builds OTel spans from the event stream. Feed every event in stream order to [`SpanBuilder::on_event`];
/// at the end of the session call [`SpanBuilder::finish_open`].
#[derive(Debug)]
pub struct SpanBuilder {
    clock: WallClock,
    ids: Box<dyn IdGenerator>,
    scope: InstrumentationScope,
    open: HashMap<(u32, u64), OpenRequest>,
    last_ts: u64,
    stats: BuilderStats,
    /// llmprof's self-accounting of the last tick: a summary on each request span.
    overhead: Option<OverheadSample>,
}

impl SpanBuilder {
    /// A builder converting times with `clock` and drawing new trace/span ids at random.
    pub fn new(clock: WallClock) -> Self {
        Self::with_id_generator(clock, Box::new(RandomIdGenerator::default()))
    }

    /// A builder with a given id generator.
    pub fn with_id_generator(clock: WallClock, ids: Box<dyn IdGenerator>) -> Self {
        Self {
            clock,
            ids,
            scope: InstrumentationScope::builder("llmprof")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            open: HashMap::new(),
            last_ts: 0,
            stats: BuilderStats::default(),
            overhead: None,
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> BuilderStats {
        self.stats
    }

    /// Requests being tracked.
    pub fn open_requests(&self) -> usize {
        self.open.len()
    }

    /// Consumes one event; spans of requests that finished are appended to `out` (the request span first).
    pub fn on_event(&mut self, ev: &Event, out: &mut Vec<SpanData>) {
        self.last_ts = self.last_ts.max(ev.ts_ns);
        match &ev.body {
            EventBody::Request(rec) => self.on_request(ev, rec, out),
            EventBody::Step(step) => {
                let n = (step.num_req_ids as usize).min(MAX_STEP_REQS);
                for id in &step.req_ids[..n] {
                    if let Some(st) = self.open.get_mut(&(ev.pid, *id)) {
                        st.timeline.on_step(&StepInfo::of(step, *id));
                    }
                }
            }
            EventBody::SlowSyscall { nr, ret, dur_ns } => {
                let attrs = vec![
                    KeyValue::new(sc::LLMPROF_SYSCALL_NR, *nr as i64),
                    KeyValue::new(sc::LLMPROF_SYSCALL_NAME, crate::syscall_names::name(*nr)),
                    KeyValue::new(sc::LLMPROF_RET, *ret),
                ];
                self.attach(ev, sc::EVENT_SLOW_SYSCALL, *dur_ns, attrs);
            }
            EventBody::FileOpen { path, ret, dur_ns } => {
                let attrs = vec![
                    KeyValue::new(sc::LLMPROF_FILE_OP, "open"),
                    KeyValue::new(sc::FILE_PATH, path.clone()),
                    KeyValue::new(sc::LLMPROF_RET, *ret),
                ];
                self.attach(ev, sc::EVENT_MODEL_FILE, *dur_ns, attrs);
            }
            EventBody::FileIo {
                op,
                fd: _,
                path,
                ret,
                len,
                dur_ns,
            } => {
                let mut attrs = vec![KeyValue::new(sc::LLMPROF_FILE_OP, op.name())];
                if let Some(p) = path {
                    attrs.push(KeyValue::new(sc::FILE_PATH, p.clone()));
                }
                attrs.push(KeyValue::new(sc::LLMPROF_FILE_LEN, *len as i64));
                attrs.push(KeyValue::new(sc::LLMPROF_RET, *ret));
                self.attach(ev, sc::EVENT_MODEL_FILE, *dur_ns, attrs);
            }
            EventBody::Connect {
                addr,
                port,
                ret,
                dur_ns,
                allowed: false,
            } => {
                let attrs = vec![
                    KeyValue::new(sc::NETWORK_PEER_ADDRESS, addr.to_string()),
                    KeyValue::new(sc::NETWORK_PEER_PORT, i64::from(*port)),
                    KeyValue::new(sc::LLMPROF_RET, *ret),
                ];
                self.attach(ev, sc::EVENT_FLAGGED_EGRESS, *dur_ns, attrs);
            }
            EventBody::Content {
                kind,
                req_id,
                text,
                len,
            } => {
                if let Some(st) = self.open.get_mut(&(ev.pid, *req_id)) {
                    st.content_truncated |= *len > text.len() as u64;
                    match kind {
                        ContentKind::Prompt => st.prompt_text = Some(text.clone()),
                        ContentKind::Completion => st.completion_text = Some(text.clone()),
                    }
                }
            }
            EventBody::Overhead(o) => self.overhead = Some((**o).clone()),
            _ => {}
        }
    }

    /// Emits every request still open as unfinished, ending at `end_ns` or, when `None`, at the last event seen.
    pub fn finish_open(&mut self, end_ns: Option<u64>, out: &mut Vec<SpanData>) {
        let end = end_ns.unwrap_or(self.last_ts);
        let mut open: Vec<_> = self.open.drain().collect();
        open.sort_by_key(|(_, st)| st.timeline.start_ns());
        for (_, mut st) in open {
            let (t, _) = st.timeline.close_unfinished(end);
            self.emit(st, t, true, out);
        }
    }

    fn on_request(&mut self, ev: &Event, rec: &RequestRecord, out: &mut Vec<SpanData>) {
        let Some(transition) = Transition::of(rec) else {
            self.stats.bad_records += 1;
            return;
        };
        let ts = if rec.ts_ns != 0 { rec.ts_ns } else { ev.ts_ns };
        let key = (ev.pid, rec.req_id);
        if !self.open.contains_key(&key) {
            if self.open.len() >= MAX_OPEN_REQUESTS {
                if transition == Transition::Arrived {
                    self.stats.requests_skipped += 1;
                }
                return;
            }
            // Arrived before the session: the timeline starts in the phase the record shows.
            let Some(timeline) = RequestTimeline::from_record(rec, ts) else {
                return;
            };
            self.open
                .insert(key, OpenRequest::new(timeline, self.ids.as_ref()));
        }
        let Some(st) = self.open.get_mut(&key) else { return };
        st.timeline.on_record(rec, ts);
        if let Transition::Finished(_) = transition
            && let Some(st) = self.open.remove(&key)
        {
            self.emit(st, ts, false, out);
        }
    }

    /// Adds a kernel event to every open request of the same process that had arrived by then.
    fn attach(&mut self, ev: &Event, name: &'static str, dur_ns: u64, mut attrs: Vec<KeyValue>) {
        if ev.tid != 0 {
            attrs.push(KeyValue::new(sc::THREAD_ID, i64::from(ev.tid)));
        }
        attrs.push(KeyValue::new(sc::LLMPROF_DURATION, secs(dur_ns)));
        let at = self.clock.to_system_time(ev.ts_ns);
        for ((pid, _), st) in self.open.iter_mut() {
            if *pid != ev.pid || st.timeline.start_ns() > ev.ts_ns {
                continue;
            }
            if st.events.len() >= MAX_SPAN_EVENTS {
                st.dropped_events += 1;
                continue;
            }
            st.events.push(SpanEvent::new(name, at, attrs.clone(), 0));
        }
    }

    /// Turns a closed request into its span and its children's.
    fn emit(&mut self, mut st: OpenRequest, end_ns: u64, unfinished: bool, out: &mut Vec<SpanData>) {
        if !st.flags.is_sampled() {
            self.stats.requests_unsampled += 1;
            return;
        }
        let tl = &st.timeline;
        let info = tl.info();
        let start_ns = tl.start_ns();
        let partial = tl.attached_mid_request();
        let operation = if info.is_chat {
            sc::OPERATION_CHAT
        } else {
            sc::OPERATION_TEXT_COMPLETION
        };
        let name = if info.model.is_empty() {
            operation.to_string()
        } else {
            format!("{operation} {}", info.model)
        };

        let (mut queue, mut prefill, mut decode, mut preempted) = (0u64, 0u64, 0u64, 0u64);
        for s in tl.segments() {
            let d = s.end - s.start;
            match s.kind {
                SegmentKind::Queue => queue += d,
                SegmentKind::Prefill { .. } => prefill += d,
                SegmentKind::Decode { .. } => decode += d,
                SegmentKind::Preempted { .. } => preempted += d,
            }
        }

        let mut attrs = vec![
            KeyValue::new(sc::GEN_AI_OPERATION_NAME, operation),
            KeyValue::new(sc::GEN_AI_PROVIDER_NAME, sc::PROVIDER_LLMSERVE),
        ];
        if !info.model.is_empty() {
            attrs.push(KeyValue::new(sc::GEN_AI_REQUEST_MODEL, info.model.clone()));
            attrs.push(KeyValue::new(sc::GEN_AI_RESPONSE_MODEL, info.model.clone()));
        }
        if info.max_tokens != 0 {
            attrs.push(KeyValue::new(
                sc::GEN_AI_REQUEST_MAX_TOKENS,
                i64::from(info.max_tokens),
            ));
        }
        if info.temperature.is_finite() {
            attrs.push(KeyValue::new(
                sc::GEN_AI_REQUEST_TEMPERATURE,
                f64::from(info.temperature),
            ));
        }
        if info.top_p.is_finite() && info.top_p > 0.0 {
            attrs.push(KeyValue::new(sc::GEN_AI_REQUEST_TOP_P, f64::from(info.top_p)));
        }
        let finish = info.finish_reason.filter(|r| *r != FinishReason::None);
        if let Some(r) = finish {
            attrs.push(KeyValue::new(
                sc::GEN_AI_RESPONSE_FINISH_REASONS,
                Value::Array(Array::String(vec![StringValue::from(r.name())])),
            ));
        }
        attrs.push(KeyValue::new(
            sc::GEN_AI_USAGE_INPUT_TOKENS,
            i64::from(info.prompt_tokens),
        ));
        attrs.push(KeyValue::new(
            sc::GEN_AI_USAGE_OUTPUT_TOKENS,
            i64::from(info.output_tokens),
        ));
        if let (Some(ttft), false) = (tl.ttft_ns(), partial) {
            attrs.push(KeyValue::new(sc::GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, secs(ttft)));
        }
        if let Some(t) = &st.prompt_text {
            let m = serde_json::json!([{"role": "user", "parts": [{"type": "text", "content": t}]}]);
            attrs.push(KeyValue::new(sc::GEN_AI_INPUT_MESSAGES, m.to_string()));
        }
        if let Some(t) = &st.completion_text {
            let mut m = serde_json::json!({"role": "assistant", "parts": [{"type": "text", "content": t}]});
            if let Some(r) = finish {
                m["finish_reason"] = serde_json::Value::from(r.name());
            }
            attrs.push(KeyValue::new(
                sc::GEN_AI_OUTPUT_MESSAGES,
                serde_json::json!([m]).to_string(),
            ));
        }
        if st.content_truncated {
            attrs.push(KeyValue::new(sc::LLMPROF_CONTENT_TRUNCATED, true));
        }
        if !info.x_request_id.is_empty() {
            attrs.push(KeyValue::new(
                sc::HTTP_REQUEST_HEADER_X_REQUEST_ID,
                Value::Array(Array::String(vec![StringValue::from(info.x_request_id.clone())])),
            ));
        }
        attrs.extend([
            KeyValue::new(sc::LLMPROF_QUEUE_TIME, secs(queue)),
            KeyValue::new(sc::LLMPROF_PREFILL_TIME, secs(prefill)),
            KeyValue::new(sc::LLMPROF_DECODE_TIME, secs(decode)),
            KeyValue::new(sc::LLMPROF_PREEMPTED_TIME, secs(preempted)),
            KeyValue::new(
                sc::LLMPROF_PREEMPTIONS,
                i64::from(tl.preemptions_seen().max(info.num_preemptions)),
            ),
            KeyValue::new(sc::LLMPROF_STEPS, i64::from(tl.steps())),
            KeyValue::new(sc::LLMPROF_PREFILL_CHUNKS, i64::from(tl.prefill_chunks())),
        ]);
        if partial {
            attrs.push(KeyValue::new(sc::LLMPROF_PARTIAL, true));
        }
        if unfinished {
            attrs.push(KeyValue::new(sc::LLMPROF_UNFINISHED, true));
        }
        let status = if finish == Some(FinishReason::Error) {
            attrs.push(KeyValue::new(sc::ERROR_TYPE, FinishReason::Error.name()));
            Status::Error {
                description: Cow::Borrowed("the engine ended the request with an error"),
            }
        } else {
            Status::Unset
        };
        attrs.push(KeyValue::new(
            sc::LLMPROF_REQUEST_ID,
            request_id_value(tl.req_id()),
        ));
        if let Some(o) = &self.overhead {
            if let Some(p) = o.est_overhead_pct {
                attrs.push(KeyValue::new(sc::LLMPROF_OVERHEAD_PCT, p));
            }
            attrs.push(KeyValue::new(sc::LLMPROF_COST_SYSCALL_NS, o.cost_syscall_ns));
            if let Some(p) = o.cost_probe_ns {
                attrs.push(KeyValue::new(sc::LLMPROF_COST_PROBE_NS, p));
            }
            if let Some(c) = o.cost_cuda_ns {
                attrs.push(KeyValue::new(sc::LLMPROF_COST_CUDA_NS, c));
            }
            attrs.push(KeyValue::new(sc::LLMPROF_DEGRADATION_LEVEL, i64::from(o.level)));
        }

        let request_ctx = SpanContext::new(st.trace_id, st.span_id, st.flags, false, TraceState::NONE);
        out.push(SpanData {
            span_context: request_ctx,
            parent_span_id: st.parent.unwrap_or(SpanId::INVALID),
            parent_span_is_remote: st.parent.is_some(),
            span_kind: SpanKind::Server,
            name: Cow::Owned(name),
            start_time: self.clock.to_system_time(start_ns),
            end_time: self.clock.to_system_time(end_ns.max(start_ns)),
            attributes: attrs,
            dropped_attributes_count: 0,
            events: span_events(std::mem::take(&mut st.events), st.dropped_events),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.scope.clone(),
        });
        self.stats.spans_built += 1;

        // A request seen only at its finish has no timeline to show.
        let segments = st.timeline.segments();
        let children = if partial && segments.iter().all(|s| s.end == s.start) {
            &[][..]
        } else {
            segments
        };
        for seg in children {
            let (name, attrs) = segment_attrs(seg);
            out.push(SpanData {
                span_context: SpanContext::new(
                    st.trace_id,
                    self.ids.new_span_id(),
                    st.flags,
                    false,
                    TraceState::NONE,
                ),
                parent_span_id: st.span_id,
                parent_span_is_remote: false,
                span_kind: SpanKind::Internal,
                name: Cow::Borrowed(name),
                start_time: self.clock.to_system_time(seg.start),
                end_time: self.clock.to_system_time(seg.end),
                attributes: attrs,
                dropped_attributes_count: 0,
                events: SpanEvents::default(),
                links: SpanLinks::default(),
                status: Status::Unset,
                instrumentation_scope: self.scope.clone(),
            });
            self.stats.spans_built += 1;
        }
    }
}

/// The engine request id as an attribute value (an int when it fits, so backends can filter numerically).
fn request_id_value(id: u64) -> Value {
    match i64::try_from(id) {
        Ok(v) => Value::I64(v),
        Err(_) => Value::String(StringValue::from(id.to_string())),
    }
}

fn segment_attrs(seg: &Segment) -> (&'static str, Vec<KeyValue>) {
    match seg.kind {
        SegmentKind::Queue => (sc::SPAN_QUEUE, Vec::new()),
        SegmentKind::Prefill {
            index,
            recompute,
            step,
        } => {
            let mut a = vec![KeyValue::new(sc::LLMPROF_CHUNK_INDEX, i64::from(index))];
            if recompute {
                a.push(KeyValue::new(sc::LLMPROF_RECOMPUTE, true));
            }
            if let Some(s) = step {
                a.push(KeyValue::new(sc::LLMPROF_STEP_ID, s.step_id as i64));
                if let Some(k) = s.kind {
                    a.push(KeyValue::new(sc::LLMPROF_STEP_KIND, k.name()));
                }
                a.push(KeyValue::new(sc::LLMPROF_STEP_NUM_SEQS, i64::from(s.num_seqs)));
                if let Some(t) = s.request_tokens {
                    a.push(KeyValue::new(sc::LLMPROF_PREFILL_CHUNK_TOKENS, i64::from(t)));
                }
                a.push(KeyValue::new(
                    sc::LLMPROF_STEP_PREFILL_TOKENS,
                    i64::from(s.prefill_tokens),
                ));
                a.push(KeyValue::new(
                    sc::LLMPROF_STEP_DECODE_TOKENS,
                    i64::from(s.decode_tokens),
                ));
                a.push(KeyValue::new(sc::LLMPROF_STEP_HOST_DURATION, secs(s.host_ns())));
            }
            (sc::SPAN_PREFILL, a)
        }
        SegmentKind::Decode { steps } => (
            sc::SPAN_DECODE,
            vec![KeyValue::new(sc::LLMPROF_DECODE_STEPS, i64::from(steps))],
        ),
        SegmentKind::Preempted { index } => (
            sc::SPAN_PREEMPTED,
            vec![KeyValue::new(sc::LLMPROF_PREEMPTIONS, i64::from(index + 1))],
        ),
    }
}

/// `SpanEvents` is non-exhaustive: fill a default one.
fn span_events(events: Vec<SpanEvent>, dropped: u32) -> SpanEvents {
    let mut e = SpanEvents::default();
    e.events = events;
    e.dropped_count = dropped;
    e
}

/// ns → seconds.
fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests;
