//! The span builder: turns the event stream into one OTel span tree per engine request.
//!
//! Owns the spans: a request span (GenAI attributes, the caller's trace context, the kernel events seen on the
//! engine's threads as span events) and its children, the segments of the request's
//! [`RequestTimeline`] (`queue`, `prefill` per chunk, `decode`, `preempted`; see [`crate::event::engine`] for how they
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

use std::collections::HashMap;

use llmprof_abi::{ContentKind, MAX_STEP_REQS, RequestRecord};
use opentelemetry::trace::{Event as SpanEvent, SpanId, TraceFlags, TraceId};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SpanData};

use super::semconv as sc;
use crate::clock::WallClock;
use crate::event::engine::{RequestTimeline, StepInfo, Transition};
use crate::event::{Event, EventBody, OverheadSample};

mod cupti;
mod spans;

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
    /// The steps that served it, with its share of each one's tokens (for its GPU time).
    gpu_steps: Vec<(u64, f64)>,
    /// Its GPU kernel time, ns, filled in when it closes (`None` without GPU activity).
    gpu_kernel_ns: Option<f64>,
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
            gpu_steps: Vec::new(),
            gpu_kernel_ns: None,
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
    /// Kernel time per engine step (CUPTI).
    gpu: cupti::GpuTime,
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
            gpu: cupti::GpuTime::default(),
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
                self.gpu.step(ev.pid, step);
                for (id, share) in cupti::shares(step) {
                    if let Some(st) = self.open.get_mut(&(ev.pid, id))
                        && st.gpu_steps.len() < cupti::STEPS_PER_REQUEST
                    {
                        st.gpu_steps.push((step.step_id, share));
                    }
                }
            }
            EventBody::GpuApi(c) => self.gpu.api(ev.pid, ev.tid, c),
            EventBody::GpuWork(w) => self.gpu.work(ev.pid, w),
            EventBody::GpuBusy(b) => self.gpu.busy(ev.pid, b),
            EventBody::SlowSyscall { nr, ret, dur_ns } => {
                let attrs = vec![
                    KeyValue::new(sc::LLMPROF_SYSCALL_NR, *nr as i64),
                    KeyValue::new(sc::LLMPROF_SYSCALL_NAME, crate::names::syscalls::name(*nr)),
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
            EventBody::WireEnd {
                req_id,
                engine_req: Some(_),
                ..
            } => {
                // The wire view of a request the engine's probes reported: one request, one span (the
                // engine's, with its phases), not a second one for its HTTP exchange.
                self.open.remove(&(ev.pid, *req_id));
            }
            _ => {}
        }
    }

    /// Emits every request still open as unfinished, ending at `end_ns` or, when `None`, at the last event seen.
    pub fn finish_open(&mut self, end_ns: Option<u64>, out: &mut Vec<SpanData>) {
        let end = end_ns.unwrap_or(self.last_ts);
        let mut open: Vec<_> = self.open.drain().collect();
        open.sort_by_key(|(_, st)| st.timeline.start_ns());
        for ((pid, _), mut st) in open {
            st.gpu_kernel_ns = self.gpu.request_ns(pid, &st.gpu_steps);
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
            && let Some(mut st) = self.open.remove(&key)
        {
            st.gpu_kernel_ns = self.gpu.request_ns(ev.pid, &st.gpu_steps);
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
}

/// ns → seconds.
fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;
    use crate::testing;
    use std::time::Duration;

    use llmprof_abi::{FinishReason, RequestEventKind, StepKind};
    use opentelemetry::trace::{SpanKind, Status};
    use opentelemetry::{Array, StringValue, Value};

    const PID: u32 = 4242;
    const MS: u64 = 1_000_000;
    /// Some BOOTTIME origin (ns).
    const T0: u64 = 5_000 * MS;
    const TRACE: [u8; 16] = [
        0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36,
    ];
    const PARENT: [u8; 8] = [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7];

    /// A chat request of the fixture's model and sampling parameters.
    fn req(kind: RequestEventKind, id: u64, ts: u64) -> testing::Request {
        testing::request(PID, kind, id, ts)
            .chat("smollm2-135m", "req-abc")
            .prompt(12, 64)
            .sampling(0.7, 0.9)
    }

    fn rec(kind: RequestEventKind, id: u64, ts: u64) -> RequestRecord {
        *req(kind, id, ts).record()
    }

    fn req_ev(r: RequestRecord) -> Event {
        testing::request_event(PID, r)
    }

    fn arrived(id: u64, ts: u64, traced: bool) -> Event {
        let r = req(RequestEventKind::Arrived, id, ts);
        if traced { r.traced(TRACE, PARENT) } else { r }.build()
    }

    fn simple(kind: RequestEventKind, id: u64, ts: u64) -> Event {
        req(kind, id, ts).build()
    }

    fn finished(id: u64, ts: u64, reason: FinishReason, out_tokens: u32) -> Event {
        req(RequestEventKind::Finished, id, ts)
            .output(out_tokens, reason)
            .build()
    }

    fn step(id: u64, kind: StepKind, start: u64, end: u64, reqs: &[u64]) -> Event {
        let prefill = if kind == StepKind::Decode { 0 } else { 12 };
        let decode = if kind == StepKind::Prefill {
            0
        } else {
            reqs.len() as u32
        };
        testing::step(PID, PID, kind, id, start, end, reqs)
            .device(start, end)
            .tokens(prefill, decode)
            .kv_blocks(1, 100)
            // Each request's share: the first of a prefill batch 8 tokens, the others 4 (12 in all for two).
            .req_tokens((0..reqs.len()).map(|i| match (kind, i) {
                (StepKind::Decode, _) => 1,
                (_, 0) => 8,
                _ => 4,
            }))
            .build()
    }

    fn run(events: &[Event]) -> (SpanBuilder, Vec<SpanData>) {
        let mut b = SpanBuilder::new(WallClock::with_offset(1_700_000_000_000_000_000));
        let mut out = Vec::new();
        for e in events {
            b.on_event(e, &mut out);
        }
        (b, out)
    }

    fn attr<'a>(s: &'a SpanData, key: &str) -> Option<&'a Value> {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| &kv.value)
    }

    fn dur(s: &SpanData) -> Duration {
        s.end_time.duration_since(s.start_time).expect("end before start")
    }

    fn names(spans: &[SpanData]) -> Vec<&str> {
        spans.iter().map(|s| s.name.as_ref()).collect()
    }

    /// Children tile the request span: each starts where the previous ended, first at the request's start,
    /// last at its end.
    fn assert_tiled(spans: &[SpanData]) {
        let req = &spans[0];
        let kids = &spans[1..];
        assert_eq!(
            kids[0].start_time, req.start_time,
            "first child starts with the request"
        );
        assert_eq!(
            kids[kids.len() - 1].end_time,
            req.end_time,
            "last child ends with the request"
        );
        for w in kids.windows(2) {
            assert_eq!(
                w[0].end_time, w[1].start_time,
                "{} → {} leave a gap",
                w[0].name, w[1].name
            );
        }
        let sum: Duration = kids.iter().map(dur).sum();
        assert_eq!(sum, dur(req));
    }

    #[test]
    fn request_span_gets_the_gpu_kernel_time_of_its_steps() {
        // Request 1 alone in the fixture's two steps (6 ms of kernels), finished after the chunk came.
        let (gpu, _) = testing::cupti::engine_fixture(PID, PID, T0);
        let mut events = vec![
            arrived(1, T0 - MS, false),
            simple(RequestEventKind::Scheduled, 1, T0),
        ];
        events.extend(gpu);
        events.push(finished(1, T0 + 35 * MS, FinishReason::Stop, 2));
        let (_, spans) = run(&events);
        let span = spans
            .iter()
            .find(|s| s.parent_span_id == SpanId::INVALID)
            .unwrap();
        assert_eq!(attr(span, sc::LLMPROF_GPU_KERNEL_TIME), Some(&Value::F64(0.006)));
        // Without GPU activity, no attribute.
        let (_, spans) = run(&[arrived(2, T0, false), finished(2, T0 + MS, FinishReason::Stop, 1)]);
        assert!(
            spans
                .iter()
                .all(|s| attr(s, sc::LLMPROF_GPU_KERNEL_TIME).is_none())
        );
    }

    #[test]
    fn unsampled_caller_gets_no_spans() {
        let Event {
            body: EventBody::Request(mut r),
            ..
        } = arrived(7, T0, true)
        else {
            unreachable!("arrived() builds a request event")
        };
        r.trace_flags = 0;
        let (b, spans) = run(&[
            req_ev(*r),
            simple(RequestEventKind::Scheduled, 7, T0 + 10 * MS),
            finished(7, T0 + 20 * MS, FinishReason::Stop, 1),
        ]);
        assert!(spans.is_empty(), "{} spans for an unsampled caller", spans.len());
        assert_eq!(b.stats().requests_unsampled, 1);
    }

    #[test]
    fn request_spans_carry_the_latest_self_accounting() {
        let overhead = testing::event(
            0,
            0,
            T0 + 5 * MS,
            EventBody::Overhead(Box::new(OverheadSample {
                est_overhead_pct: Some(0.4),
                cost_syscall_ns: 700.0,
                cost_syscall_decoded_ns: Some(900.0),
                cost_probe_ns: Some(1_800.0),
                cost_cuda_ns: Some(4_500.0),
                level: 1,
                ..OverheadSample::default()
            })),
        );
        let (_, spans) = run(&[
            arrived(7, T0, true),
            overhead,
            simple(RequestEventKind::Scheduled, 7, T0 + 10 * MS),
            finished(7, T0 + 20 * MS, FinishReason::Stop, 1),
        ]);
        let req = &spans[0];
        assert_eq!(attr(req, sc::LLMPROF_OVERHEAD_PCT), Some(&Value::F64(0.4)));
        assert_eq!(attr(req, sc::LLMPROF_COST_SYSCALL_NS), Some(&Value::F64(700.0)));
        assert_eq!(attr(req, sc::LLMPROF_COST_PROBE_NS), Some(&Value::F64(1_800.0)));
        assert_eq!(attr(req, sc::LLMPROF_COST_CUDA_NS), Some(&Value::F64(4_500.0)));
        assert_eq!(attr(req, sc::LLMPROF_DEGRADATION_LEVEL), Some(&Value::I64(1)));
        assert_eq!(
            attr(&spans[1], sc::LLMPROF_OVERHEAD_PCT),
            None,
            "only on the request span"
        );
    }

    #[test]
    fn request_with_traceparent_becomes_child_of_callers_span() {
        let (b, spans) = run(&[
            arrived(7, T0, true),
            simple(RequestEventKind::Scheduled, 7, T0 + 10 * MS),
            simple(RequestEventKind::FirstToken, 7, T0 + 29 * MS),
            step(1, StepKind::Prefill, T0 + 10 * MS, T0 + 30 * MS, &[7]),
            step(2, StepKind::Decode, T0 + 30 * MS, T0 + 40 * MS, &[7]),
            step(3, StepKind::Decode, T0 + 40 * MS, T0 + 50 * MS, &[7]),
            finished(7, T0 + 51 * MS, FinishReason::Stop, 3),
        ]);
        assert_eq!(names(&spans), ["chat smollm2-135m", "queue", "prefill", "decode"]);
        let req = &spans[0];
        assert_eq!(req.span_context.trace_id(), TraceId::from_bytes(TRACE));
        assert_eq!(req.parent_span_id, SpanId::from_bytes(PARENT));
        assert!(req.parent_span_is_remote);
        assert!(req.span_context.trace_flags().is_sampled());
        assert_eq!(req.span_kind, SpanKind::Server);
        assert_eq!(dur(req), Duration::from_millis(51));
        for kid in &spans[1..] {
            assert_eq!(kid.span_context.trace_id(), TraceId::from_bytes(TRACE));
            assert_eq!(kid.parent_span_id, req.span_context.span_id());
            assert_ne!(kid.span_context.span_id(), req.span_context.span_id());
        }
        assert_tiled(&spans);
        assert_eq!(dur(&spans[1]), Duration::from_millis(10));
        assert_eq!(dur(&spans[2]), Duration::from_millis(20));
        assert_eq!(dur(&spans[3]), Duration::from_millis(21));
        assert_eq!(attr(req, "gen_ai.operation.name"), Some(&Value::from("chat")));
        assert_eq!(attr(req, "gen_ai.provider.name"), Some(&Value::from("llmserve")));
        assert_eq!(
            attr(req, "gen_ai.request.model"),
            Some(&Value::from("smollm2-135m"))
        );
        assert_eq!(attr(req, "gen_ai.request.max_tokens"), Some(&Value::I64(64)));
        assert_eq!(
            attr(req, "gen_ai.request.temperature"),
            Some(&Value::F64(f64::from(0.7f32)))
        );
        assert_eq!(
            attr(req, "gen_ai.request.top_p"),
            Some(&Value::F64(f64::from(0.9f32)))
        );
        assert_eq!(
            attr(req, "gen_ai.response.finish_reasons"),
            Some(&Value::Array(Array::String(vec![StringValue::from("stop")])))
        );
        assert_eq!(attr(req, "gen_ai.usage.input_tokens"), Some(&Value::I64(12)));
        assert_eq!(attr(req, "gen_ai.usage.output_tokens"), Some(&Value::I64(3)));
        assert_eq!(
            attr(req, "gen_ai.response.time_to_first_chunk"),
            Some(&Value::F64(0.029))
        );
        assert_eq!(
            attr(req, "http.request.header.x-request-id"),
            Some(&Value::Array(Array::String(vec![StringValue::from("req-abc")])))
        );
        assert_eq!(attr(req, "llmprof.request_id"), Some(&Value::I64(7)));
        assert_eq!(attr(req, "llmprof.queue_time"), Some(&Value::F64(0.010)));
        assert_eq!(attr(req, "llmprof.prefill_time"), Some(&Value::F64(0.020)));
        assert_eq!(attr(req, "llmprof.decode_time"), Some(&Value::F64(0.021)));
        assert_eq!(attr(req, "llmprof.steps"), Some(&Value::I64(3)));
        assert_eq!(attr(req, "llmprof.preemptions"), Some(&Value::I64(0)));
        assert_eq!(attr(&spans[3], "llmprof.decode.steps"), Some(&Value::I64(2)));
        assert_eq!(attr(&spans[2], "llmprof.step.id"), Some(&Value::I64(1)));
        assert_eq!(req.status, Status::Unset);
        assert_eq!(b.open_requests(), 0);
        assert_eq!(b.stats().spans_built, 4);
    }

    #[test]
    fn chunked_prefill_with_first_token_recorded_after_its_step() {
        let (_, spans) = run(&[
            arrived(1, T0, false),
            simple(RequestEventKind::Scheduled, 1, T0 + MS),
            step(1, StepKind::Prefill, T0 + MS, T0 + 11 * MS, &[1]),
            step(2, StepKind::Mixed, T0 + 12 * MS, T0 + 22 * MS, &[1]),
            simple(RequestEventKind::FirstToken, 1, T0 + 23 * MS),
            step(3, StepKind::Mixed, T0 + 24 * MS, T0 + 30 * MS, &[1]),
            finished(1, T0 + 31 * MS, FinishReason::Length, 2),
        ]);
        assert_eq!(
            names(&spans),
            ["chat smollm2-135m", "queue", "prefill", "prefill", "decode"]
        );
        assert_tiled(&spans);
        assert_eq!(dur(&spans[2]), Duration::from_millis(10));
        assert_eq!(
            dur(&spans[3]),
            Duration::from_millis(11),
            "second chunk holds the 1 ms scheduling gap"
        );
        assert_eq!(
            attr(&spans[3], "llmprof.step.host_duration"),
            Some(&Value::F64(0.010))
        );
        assert_eq!(attr(&spans[3], "llmprof.chunk.index"), Some(&Value::I64(1)));
        assert_eq!(attr(&spans[4], "llmprof.decode.steps"), Some(&Value::I64(1)));
        assert_eq!(attr(&spans[0], "llmprof.prefill_chunks"), Some(&Value::I64(2)));
        // A new trace: no parent.
        assert_eq!(spans[0].parent_span_id, SpanId::INVALID);
        assert!(!spans[0].parent_span_is_remote);
        assert_ne!(spans[0].span_context.trace_id(), TraceId::INVALID);
    }

    #[test]
    fn batched_prefill_chunk_carries_the_request_share_and_the_batch_totals() {
        let (_, spans) = run(&[
            arrived(1, T0, false),
            arrived(2, T0, false),
            step(1, StepKind::Prefill, T0 + MS, T0 + 5 * MS, &[1, 2]),
            simple(RequestEventKind::FirstToken, 1, T0 + 5 * MS),
            simple(RequestEventKind::FirstToken, 2, T0 + 5 * MS),
            finished(1, T0 + 6 * MS, FinishReason::Length, 1),
            finished(2, T0 + 6 * MS, FinishReason::Length, 1),
        ]);
        let prefills: Vec<&SpanData> = spans.iter().filter(|s| s.name == "prefill").collect();
        assert_eq!(prefills.len(), 2, "{:?}", names(&spans));
        let shares: Vec<_> = prefills
            .iter()
            .map(|s| attr(s, "llmprof.prefill.tokens").cloned())
            .collect();
        assert_eq!(shares, [Some(Value::I64(8)), Some(Value::I64(4))]);
        for s in prefills {
            assert_eq!(attr(s, "llmprof.step.prefill_tokens"), Some(&Value::I64(12)));
            assert_eq!(attr(s, "llmprof.step.num_seqs"), Some(&Value::I64(2)));
        }
    }

    #[test]
    fn preemption_then_recompute_then_decode() {
        let (_, spans) = run(&[
            arrived(3, T0, true),
            simple(RequestEventKind::Scheduled, 3, T0 + 2 * MS),
            simple(RequestEventKind::FirstToken, 3, T0 + 9 * MS),
            step(1, StepKind::Prefill, T0 + 2 * MS, T0 + 10 * MS, &[3]),
            step(2, StepKind::Decode, T0 + 10 * MS, T0 + 15 * MS, &[3]),
            simple(RequestEventKind::Preempted, 3, T0 + 15 * MS),
            step(3, StepKind::Prefill, T0 + 40 * MS, T0 + 48 * MS, &[3]),
            step(4, StepKind::Decode, T0 + 48 * MS, T0 + 52 * MS, &[3]),
            finished(3, T0 + 53 * MS, FinishReason::Stop, 4),
        ]);
        assert_eq!(
            names(&spans),
            [
                "chat smollm2-135m",
                "queue",
                "prefill",
                "decode",
                "preempted",
                "prefill",
                "decode"
            ]
        );
        assert_tiled(&spans);
        assert_eq!(dur(&spans[4]), Duration::from_millis(25));
        assert_eq!(attr(&spans[5], "llmprof.recompute"), Some(&Value::Bool(true)));
        assert_eq!(attr(&spans[0], "llmprof.preemptions"), Some(&Value::I64(1)));
        assert_eq!(
            attr(&spans[0], "llmprof.preempted_time"),
            Some(&Value::F64(0.025))
        );
    }

    #[test]
    fn kernel_events_of_the_engine_become_span_events() {
        let mut other = step(9, StepKind::Decode, 0, 0, &[]);
        other.pid = 1;
        let (_, spans) = run(&[
            arrived(5, T0, false),
            testing::slow_syscall(PID, PID + 1, T0 + MS, 17, 4096, 3 * MS),
            testing::slow_syscall(1, 1, T0 + MS, 0, 1, MS),
            testing::event(
                PID,
                PID,
                T0 + 2 * MS,
                EventBody::FileIo {
                    op: llmprof_abi::FileOp::Pread,
                    fd: 9,
                    path: Some("/models/smollm2.gguf".into()),
                    ret: 1 << 20,
                    len: 1 << 20,
                    dur_ns: 4 * MS,
                },
            ),
            testing::connect(PID, PID, T0 + 3 * MS, ([127, 0, 0, 1], 9000), 0, true),
            testing::connect(PID, PID, T0 + 4 * MS, ([203, 0, 113, 9], 443), -115, false),
            other,
            finished(5, T0 + 5 * MS, FinishReason::Abort, 0),
        ]);
        let ev = &spans[0].events.events;
        let names: Vec<&str> = ev.iter().map(|e| e.name.as_ref()).collect();
        assert_eq!(names, ["slow_syscall", "model_file_io", "flagged_egress"]);
        let get = |e: &SpanEvent, k: &str| {
            e.attributes
                .iter()
                .find(|kv| kv.key.as_str() == k)
                .map(|kv| kv.value.clone())
        };
        assert_eq!(get(&ev[0], "llmprof.syscall.name"), Some(Value::from("pread64")));
        assert_eq!(get(&ev[0], "thread.id"), Some(Value::I64(i64::from(PID + 1))));
        assert_eq!(get(&ev[0], "llmprof.duration"), Some(Value::F64(0.003)));
        assert_eq!(
            get(&ev[1], "file.path"),
            Some(Value::from("/models/smollm2.gguf"))
        );
        assert_eq!(get(&ev[1], "llmprof.file.op"), Some(Value::from("pread64")));
        assert_eq!(
            get(&ev[2], "network.peer.address"),
            Some(Value::from("203.0.113.9"))
        );
        assert_eq!(get(&ev[2], "network.peer.port"), Some(Value::I64(443)));
        // Aborted while queued: only the queue child.
        assert_eq!(names_of(&spans), ["chat smollm2-135m", "queue"]);
        assert_eq!(
            attr(&spans[0], "gen_ai.response.finish_reasons"),
            Some(&Value::Array(Array::String(vec![StringValue::from("abort")])))
        );
    }

    fn names_of(spans: &[SpanData]) -> Vec<&str> {
        names(spans)
    }

    #[test]
    fn partial_and_unfinished_requests_are_marked() {
        let (mut b, mut spans) = run(&[
            // Arrived before the session: first seen at its first token.
            simple(RequestEventKind::FirstToken, 1, T0 + 5 * MS),
            arrived(2, T0 + 6 * MS, false),
            simple(RequestEventKind::Scheduled, 2, T0 + 7 * MS),
            step(1, StepKind::Mixed, T0 + 7 * MS, T0 + 9 * MS, &[1, 2]),
            finished(1, T0 + 10 * MS, FinishReason::Stop, 8),
        ]);
        assert_eq!(attr(&spans[0], "llmprof.partial"), Some(&Value::Bool(true)));
        assert_eq!(
            attr(&spans[0], "gen_ai.response.time_to_first_chunk"),
            None,
            "TTFT unknown without arrival"
        );
        let n = spans.len();
        b.finish_open(None, &mut spans);
        let req2 = &spans[n];
        assert_eq!(attr(req2, "llmprof.unfinished"), Some(&Value::Bool(true)));
        assert_eq!(dur(req2), Duration::from_millis(4), "ends at the last event seen");
        assert_eq!(attr(req2, "gen_ai.response.finish_reasons"), None);
        assert_tiled(&spans[n..]);
        assert_eq!(b.open_requests(), 0);
    }

    #[test]
    fn engine_error_sets_error_status() {
        let (_, spans) = run(&[
            arrived(1, T0, false),
            finished(1, T0 + MS, FinishReason::Error, 0),
        ]);
        assert!(matches!(spans[0].status, Status::Error { .. }));
        assert_eq!(attr(&spans[0], "error.type"), Some(&Value::from("error")));
    }

    #[test]
    fn text_completion_without_model_is_named_by_operation() {
        let mut r = rec(RequestEventKind::Arrived, 1, T0);
        r.is_chat = 0;
        r.model = [0; llmprof_abi::MODEL_LEN];
        let mut f = r;
        f.kind = RequestEventKind::Finished as u32;
        f.ts_ns = T0 + MS;
        f.finish_reason = FinishReason::Stop as u32;
        let (_, spans) = run(&[req_ev(r), req_ev(f)]);
        assert_eq!(spans[0].name, "text_completion");
    }
}
