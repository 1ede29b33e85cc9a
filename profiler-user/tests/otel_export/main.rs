//! End-to-end checks of the OTel sink against real OTLP receivers on loopback: a gRPC receiver built on
//! opentelemetry-proto's generated tonic service, and an HTTP/1.1 receiver that decodes the protobuf body. A fixture
//! event stream (two requests: one with a W3C traceparent, one without; chunked prefill; a preemption) goes into
//! `OtelSink`; the checks are what a user looks at in Jaeger or Tempo: the request span sits under the caller's
//! span in the caller's trace, carries the GenAI attributes, and its children add up to its duration. Also: a
//! receiver that is down costs a bounded wait and shows up in the counters, never a panic or a hang.
//!
//! Each case is a whole export scenario (receiver, fixture, assertions on the received spans); the fixture, the
//! receivers and the checks are here, the cases in `sink`, `collector`, `attach` and `tls`; what other test
//! binaries share is `common/` and `llmprof_trace::testing`.
#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

#[path = "../common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llmprof::otel::tls::TlsFiles;
use llmprof::otel::{self, ExportConfig, OtelOptions, OtelSink, OtlpProtocol, ResourceInfo, WallClock};
use llmprof_abi::{FinishReason, RequestEventKind, StepKind};
use llmprof_trace::event::Event;
use llmprof_trace::names::slice;
use llmprof_trace::otel::semconv::{SPAN_DECODE, SPAN_PREEMPTED, SPAN_PREFILL, SPAN_QUEUE};
use llmprof_trace::testing;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind};
use prost::Message;

use common::{Received, hex, received_spans, start_grpc_receiver};
use e2e::testee::Reaped;

mod attach;
mod collector;
mod sink;
mod tls;

const PID: u32 = 31337;
const MS: u64 = 1_000_000;
const TRACE_ID: [u8; 16] = [
    0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c,
];
const PARENT_SPAN_ID: [u8; 8] = [0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31];

// ---------------------------------------------------------------- fixture

/// A transition of one of the fixture's chat requests (24 prompt tokens, `max_tokens` 32).
fn req(kind: RequestEventKind, id: u64, ts: u64) -> testing::Request {
    testing::request(PID, kind, id, ts)
        .chat("SmolLM2-135M-Instruct", &format!("xr-{id}"))
        .prompt(24, 32)
        .sampling(0.0, 1.0)
}

/// A step of the engine: device time as host time, 16 prompt tokens (prefill and mixed), 1 decode token
/// (decode and mixed), 4 of 64 KV blocks.
fn step(id: u64, kind: StepKind, start: u64, end: u64, reqs: &[u64]) -> Event {
    let prefill = if kind == StepKind::Decode { 0 } else { 16 };
    let decode = if kind == StepKind::Prefill { 0 } else { 1 };
    testing::step(PID, PID, kind, id, start, end, reqs)
        .device(start, end)
        .tokens(prefill, decode)
        .kv_blocks(4, 64)
        .build()
}

/// Two requests on one engine, starting at BOOTTIME `t0`:
/// - 1: traced by the caller, prompt in two chunks, preempted once while decoding, recomputed, finished `stop`.
/// - 2: no traceparent, one chunk, finished `length`.
fn fixture(t0: u64) -> Vec<Event> {
    use RequestEventKind::*;
    let a1 = req(Arrived, 1, t0).traced(TRACE_ID, PARENT_SPAN_ID);
    let f1 = req(Finished, 1, t0 + 80 * MS)
        .output(5, FinishReason::Stop)
        .preemptions(1);
    let f2 = req(Finished, 2, t0 + 60 * MS).output(32, FinishReason::Length);
    vec![
        a1.build(),
        req(Arrived, 2, t0 + MS).build(),
        req(Scheduled, 1, t0 + 3 * MS).build(),
        step(1, StepKind::Prefill, t0 + 3 * MS, t0 + 10 * MS, &[1]),
        req(Scheduled, 2, t0 + 10 * MS).build(),
        req(FirstToken, 1, t0 + 19 * MS).build(),
        req(FirstToken, 2, t0 + 19 * MS + MS / 2).build(),
        step(2, StepKind::Mixed, t0 + 10 * MS, t0 + 20 * MS, &[1, 2]),
        testing::slow_syscall(PID, PID + 1, t0 + 21 * MS, 202, 0, 12 * MS),
        step(3, StepKind::Mixed, t0 + 20 * MS, t0 + 30 * MS, &[1, 2]),
        req(Preempted, 1, t0 + 30 * MS).build(),
        step(4, StepKind::Decode, t0 + 30 * MS, t0 + 40 * MS, &[2]),
        step(5, StepKind::Prefill, t0 + 41 * MS, t0 + 50 * MS, &[1]),
        step(6, StepKind::Decode, t0 + 50 * MS, t0 + 59 * MS, &[1, 2]),
        f2.build(),
        step(7, StepKind::Decode, t0 + 60 * MS, t0 + 79 * MS, &[1]),
        f1.build(),
    ]
}

fn resource_info() -> ResourceInfo {
    ResourceInfo {
        pid: PID,
        executable: "/usr/local/bin/llmserve".into(),
        host: "llm-7".into(),
        gpu_uuid: Some("GPU-00000000-1111-2222-3333-444444444444".into()),
    }
}

fn config(endpoint: String, protocol: OtlpProtocol) -> ExportConfig {
    ExportConfig {
        endpoint,
        protocol,
        service_name: "llmserve".into(),
        resource_attributes: vec![("deployment.environment.name".into(), "test".into())],
        capture_content: false,
        tls: TlsFiles::default(),
    }
}

fn boottime_ns() -> u64 {
    llmprof_trace::clock::boottime_ns()
}

// ---------------------------------------------------------------- receivers

/// What the HTTP receiver saw besides the bodies.
#[derive(Clone, Debug, Default)]
struct HttpSeen {
    paths: Vec<String>,
    content_types: Vec<String>,
}

/// Serves OTLP/HTTP (protobuf) on 127.0.0.1 with a plain HTTP/1.1 loop on std threads.
fn start_http_receiver() -> (SocketAddr, Received, Arc<Mutex<HttpSeen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let got = Received::default();
    let seen = Arc::new(Mutex::new(HttpSeen::default()));
    let (got2, seen2) = (got.clone(), seen.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let (got, seen) = (got2.clone(), seen2.clone());
            std::thread::spawn(move || serve_http_conn(conn, &got, &seen));
        }
    });
    (addr, got, seen)
}

fn serve_http_conn(conn: impl Read + Write, got: &Received, seen: &Mutex<HttpSeen>) {
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let len: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        reader.read_exact(&mut body).unwrap();
        {
            let mut s = seen.lock().unwrap();
            s.paths.push(path);
            s.content_types
                .push(headers.get("content-type").cloned().unwrap_or_default());
        }
        got.lock()
            .unwrap()
            .push(ExportTraceServiceRequest::decode(&body[..]).expect("OTLP protobuf body"));
        let resp = ExportTraceServiceResponse {
            partial_success: None,
        }
        .encode_to_vec();
        // Requests and responses alternate: writing past the reader's buffer is safe.
        let writer = reader.get_mut();
        write!(
            writer,
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\r\n",
            resp.len()
        )
        .unwrap();
        writer.write_all(&resp).unwrap();
        writer.flush().unwrap();
    }
}

// ---------------------------------------------------------------- checks

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn s(v: &str) -> any_value::Value {
    any_value::Value::StringValue(v.to_string())
}

fn str_array(vals: &[&str]) -> any_value::Value {
    any_value::Value::ArrayValue(opentelemetry_proto::tonic::common::v1::ArrayValue {
        values: vals.iter().map(|v| AnyValue { value: Some(s(v)) }).collect(),
    })
}

fn dur_ns(span: &Span) -> u64 {
    span.end_time_unix_nano - span.start_time_unix_nano
}

/// Everything a user checks in the tracing backend, on what the receiver got.
fn check_received(got: &[ExportTraceServiceRequest], t0_wall_ns: u64) {
    let mut spans: Vec<Span> = Vec::new();
    for req in got {
        for rs in &req.resource_spans {
            let res = rs.resource.as_ref().expect("resource");
            assert_eq!(attr(&res.attributes, "service.name"), Some(&s("llmserve")));
            assert_eq!(attr(&res.attributes, "host.name"), Some(&s("llm-7")));
            assert_eq!(
                attr(&res.attributes, "process.pid"),
                Some(&any_value::Value::IntValue(i64::from(PID)))
            );
            assert_eq!(
                attr(&res.attributes, "process.executable.name"),
                Some(&s("llmserve"))
            );
            assert_eq!(
                attr(&res.attributes, "deployment.environment.name"),
                Some(&s("test"))
            );
            assert_eq!(
                attr(&res.attributes, "llmprof.gpu.uuid"),
                Some(&s("GPU-00000000-1111-2222-3333-444444444444"))
            );
            for ss in &rs.scope_spans {
                assert_eq!(ss.scope.as_ref().map(|s| s.name.as_str()), Some("llmprof"));
                spans.extend(ss.spans.iter().cloned());
            }
        }
    }
    // Request 1: 1 request + queue + 2 prefill + decode + preempted + recompute prefill + decode = 8 spans.
    // Request 2: 1 request + queue + 1 prefill + decode = 4 spans.
    assert_eq!(
        spans.len(),
        12,
        "spans: {:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );

    let by_id: HashMap<Vec<u8>, &Span> = spans.iter().map(|s| (s.span_id.clone(), s)).collect();
    let requests: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Server as i32)
        .collect();
    assert_eq!(requests.len(), 2);

    // The traced request joins the caller's trace under the caller's span.
    let r1 = requests
        .iter()
        .find(|s| s.trace_id == TRACE_ID)
        .expect("request span in the caller's trace");
    assert_eq!(r1.parent_span_id, PARENT_SPAN_ID.to_vec());
    assert_eq!(r1.name, "chat SmolLM2-135M-Instruct");
    assert_eq!(
        r1.start_time_unix_nano, t0_wall_ns,
        "starts at the engine's arrival time"
    );
    assert_eq!(dur_ns(r1), 80 * MS);
    let a = &r1.attributes;
    assert_eq!(attr(a, "gen_ai.operation.name"), Some(&s("chat")));
    assert_eq!(attr(a, "gen_ai.provider.name"), Some(&s("llmserve")));
    assert_eq!(attr(a, "gen_ai.request.model"), Some(&s("SmolLM2-135M-Instruct")));
    assert_eq!(
        attr(a, "gen_ai.request.max_tokens"),
        Some(&any_value::Value::IntValue(32))
    );
    assert_eq!(
        attr(a, "gen_ai.request.temperature"),
        Some(&any_value::Value::DoubleValue(0.0))
    );
    assert_eq!(
        attr(a, "gen_ai.request.top_p"),
        Some(&any_value::Value::DoubleValue(1.0))
    );
    assert_eq!(
        attr(a, "gen_ai.response.finish_reasons"),
        Some(&str_array(&["stop"]))
    );
    assert_eq!(
        attr(a, "gen_ai.usage.input_tokens"),
        Some(&any_value::Value::IntValue(24))
    );
    assert_eq!(
        attr(a, "gen_ai.usage.output_tokens"),
        Some(&any_value::Value::IntValue(5))
    );
    assert_eq!(
        attr(a, "gen_ai.response.time_to_first_chunk"),
        Some(&any_value::Value::DoubleValue(0.019))
    );
    assert_eq!(
        attr(a, "http.request.header.x-request-id"),
        Some(&str_array(&["xr-1"]))
    );
    assert_eq!(
        attr(a, "llmprof.preemptions"),
        Some(&any_value::Value::IntValue(1))
    );
    assert_eq!(attr(a, "llmprof.steps"), Some(&any_value::Value::IntValue(6)));
    assert_eq!(
        attr(a, "llmprof.prefill_chunks"),
        Some(&any_value::Value::IntValue(3))
    );
    let ev = &r1.events;
    assert_eq!(ev.len(), 1, "the slow futex on an engine thread");
    assert_eq!(ev[0].name, "slow_syscall");
    assert_eq!(attr(&ev[0].attributes, "llmprof.syscall.name"), Some(&s("futex")));

    // The untraced request starts a trace of its own.
    let r2 = requests
        .iter()
        .find(|s| s.trace_id != TRACE_ID)
        .expect("second request");
    assert!(
        r2.parent_span_id.is_empty() || r2.parent_span_id == vec![0; 8],
        "root span"
    );
    assert_eq!(
        attr(&r2.attributes, "gen_ai.response.finish_reasons"),
        Some(&str_array(&["length"]))
    );

    for r in [r1, r2] {
        let mut kids: Vec<&Span> = spans.iter().filter(|s| s.parent_span_id == r.span_id).collect();
        kids.sort_by_key(|s| s.start_time_unix_nano);
        for k in &kids {
            assert_eq!(k.trace_id, r.trace_id, "child {} in its request's trace", k.name);
            assert!(by_id.contains_key(&k.parent_span_id));
        }
        let sum: u64 = kids.iter().map(|k| dur_ns(k)).sum();
        // Tolerance: 1 µs per child for the ns → wall-clock conversion (exact here, but the contract is "within").
        let tol = 1_000 * kids.len() as u64;
        assert!(
            sum.abs_diff(dur_ns(r)) <= tol,
            "children add up to {sum} ns, request lasted {} ns",
            dur_ns(r)
        );
        let names: Vec<&str> = kids.iter().map(|k| k.name.as_str()).collect();
        if r.trace_id == TRACE_ID {
            assert_eq!(
                names,
                [
                    SPAN_QUEUE,
                    SPAN_PREFILL,
                    SPAN_PREFILL,
                    SPAN_DECODE,
                    SPAN_PREEMPTED,
                    SPAN_PREFILL,
                    SPAN_DECODE
                ]
            );
        } else {
            assert_eq!(names, [SPAN_QUEUE, SPAN_PREFILL, SPAN_DECODE]);
        }
    }
}

fn push_fixture(sink: &mut OtelSink, clock: WallClock) -> u64 {
    let t0 = boottime_ns();
    for ev in fixture(t0) {
        sink.push(&ev);
    }
    clock
        .to_system_time(t0)
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

// ---------------------------------------------------------------- tests

/// A port nobody listens on (bound, then released).
fn dead_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// ---------------------------------------------------------------- through a real collector

// ---------------------------------------------------------------- the real thing: engine + llmprof attach

// ---------------------------------------------------------------- TLS
