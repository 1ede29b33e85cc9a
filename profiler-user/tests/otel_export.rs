//! End-to-end checks of the OTel sink against real OTLP receivers on loopback: a gRPC receiver built on
//! opentelemetry-proto's generated tonic service, and an HTTP/1.1 receiver that decodes the protobuf body. A fixture
//! event stream (two requests: one with a W3C traceparent, one without; chunked prefill; a preemption) goes into
//! `OtelSink`; the checks are what a user looks at in Jaeger or Tempo: the request span sits under the caller's
//! span in the caller's trace, carries the GenAI attributes, and its children add up to its duration. Also: a
//! receiver that is down costs a bounded wait and shows up in the counters, never a panic or a hang.
//!
//! Size: ~1,000 lines: each case is a whole export scenario (receiver, fixture, assertions on the received spans);
//! the receivers and builders are shared (`common/`, `llmprof_trace::testing`).
#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

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

#[test]
fn grpc_spans_arrive_in_the_callers_trace_with_genai_attributes() {
    let (addr, got, _rt) = start_grpc_receiver();
    let clock = WallClock::now().unwrap();
    let mut sink = OtelSink::with_config(
        &config(format!("http://{addr}"), OtlpProtocol::Grpc),
        resource_info(),
        clock,
    )
    .unwrap();
    let t0_wall = push_fixture(&mut sink, clock);
    let stats = sink.finish();
    assert_eq!(stats.spans_built, 12);
    assert_eq!(stats.spans_exported, 12, "{stats:?}");
    assert_eq!(stats.spans_dropped, 0);
    assert_eq!(stats.export_errors, 0);
    check_received(&got.lock().unwrap(), t0_wall);
}

#[test]
fn http_spans_arrive_at_v1_traces_as_protobuf() {
    let (addr, got, seen) = start_http_receiver();
    // Through the CLI options, as a user gives them: a base URL, completed with /v1/traces.
    let opts = OtelOptions {
        otlp_endpoint: Some(format!("http://{addr}")),
        otlp_protocol: Some(OtlpProtocol::Http),
        ..Default::default()
    };
    let mut cfg = opts.resolve_with(|_| None).unwrap().expect("endpoint configured");
    cfg.resource_attributes = config(String::new(), OtlpProtocol::Http).resource_attributes;
    let clock = WallClock::now().unwrap();
    let mut sink = OtelSink::with_config(&cfg, resource_info(), clock).unwrap();
    let t0_wall = push_fixture(&mut sink, clock);
    let stats = sink.finish();
    assert_eq!(stats.spans_exported, 12, "{stats:?}");
    assert_eq!(stats.spans_dropped, 0);
    let seen = seen.lock().unwrap().clone();
    assert!(seen.paths.iter().all(|p| p == "/v1/traces"), "{seen:?}");
    assert!(
        seen.content_types.iter().all(|c| c == "application/x-protobuf"),
        "{seen:?}"
    );
    check_received(&got.lock().unwrap(), t0_wall);
}

#[test]
fn no_endpoint_means_no_sink() {
    let opts = OtelOptions::default();
    assert!(opts.resolve_with(|_| None).unwrap().is_none());
}

/// A port nobody listens on (bound, then released).
fn dead_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn receiver_down(protocol: OtlpProtocol) {
    let endpoint = match protocol {
        OtlpProtocol::Grpc => format!("http://127.0.0.1:{}", dead_port()),
        OtlpProtocol::Http => format!("http://127.0.0.1:{}/v1/traces", dead_port()),
    };
    let clock = WallClock::now().unwrap();
    let mut sink = OtelSink::with_config(&config(endpoint, protocol), resource_info(), clock).unwrap();
    let started = Instant::now();
    push_fixture(&mut sink, clock);
    let pushed = started.elapsed();
    let stats = sink.finish();
    let total = started.elapsed();
    assert_eq!(stats.spans_built, 12);
    assert_eq!(stats.spans_exported, 0);
    assert_eq!(
        stats.spans_dropped, 12,
        "every span is counted as dropped: {stats:?}"
    );
    assert!(stats.export_errors >= 1 || stats.flush_timed_out, "{stats:?}");
    // Bounds, not performance: pushing never waits on the network, and finish gives up at its deadline.
    assert!(
        pushed < Duration::from_secs(1),
        "push waited on the dead receiver: {pushed:?}"
    );
    assert!(
        total < otel::FINISH_TIMEOUT + Duration::from_secs(2),
        "finish took {total:?}"
    );
}

#[test]
fn grpc_receiver_down_counts_drops_and_finishes() {
    receiver_down(OtlpProtocol::Grpc);
}

#[test]
fn http_receiver_down_counts_drops_and_finishes() {
    receiver_down(OtlpProtocol::Http);
}

// ---------------------------------------------------------------- through a real collector

/// `rotel-agent` as `cargo xtask setup-otel-tools` installs it (or `$LLMPROF_ROTEL`).
fn rotel_agent() -> Option<std::path::PathBuf> {
    if let Ok(p) = std::env::var("LLMPROF_ROTEL") {
        return Some(p.into());
    }
    let cache = std::env::var("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cache")
        });
    let p = cache.join("llmprof/tools/rotel/rotel/rotel-agent");
    p.exists().then_some(p)
}

fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "the collector did not listen on {addr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_spans(got: &Received, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let have: usize = got
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|rs| &rs.scope_spans)
            .map(|ss| ss.spans.len())
            .sum();
        if have >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the collector forwarded {have} of {n} spans"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// llmprof → rotel (a real OpenTelemetry collector, receiving OTLP over gRPC and over HTTP) → our gRPC receiver:
/// what a user's collector forwards to Tempo or Jaeger is still joined to the caller's trace.
#[test]
fn spans_pass_through_a_real_collector_over_grpc_and_http() {
    let rotel = rotel_agent();
    if !e2e::require(
        rotel.is_some(),
        "rotel-agent not installed (run `cargo xtask setup-otel-tools`)",
    ) {
        return;
    }
    let rotel = rotel.unwrap();
    let (sink_addr, got, _rt) = start_grpc_receiver();
    let (grpc_in, http_in) = (free_addr(), free_addr());
    let child = std::process::Command::new(&rotel)
        .args([
            "start",
            "--otlp-grpc-endpoint",
            &grpc_in.to_string(),
            "--otlp-http-endpoint",
        ])
        .arg(http_in.to_string())
        .args([
            "--exporter",
            "otlp",
            "--otlp-exporter-endpoint",
            &format!("http://{sink_addr}"),
        ])
        .args(["--otlp-exporter-protocol", "grpc"])
        .args(["--batch-timeout", "100ms"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", rotel.display()));
    let _collector = Reaped(child);
    wait_listening(grpc_in);
    wait_listening(http_in);

    for (endpoint, protocol) in [
        (format!("http://{grpc_in}"), OtlpProtocol::Grpc),
        (format!("http://{http_in}/v1/traces"), OtlpProtocol::Http),
    ] {
        got.lock().unwrap().clear();
        let clock = WallClock::now().unwrap();
        let mut sink = OtelSink::with_config(&config(endpoint, protocol), resource_info(), clock).unwrap();
        let t0_wall = push_fixture(&mut sink, clock);
        let stats = sink.finish();
        assert_eq!(stats.spans_exported, 12, "{protocol:?}: {stats:?}");
        wait_spans(&got, 12);
        check_received(&got.lock().unwrap(), t0_wall);
    }
}

/// A receiver that accepts connections and never answers (a hung collector): `finish` gives up at its deadline
/// and counts everything as dropped.
#[test]
fn hung_receiver_cannot_hold_up_the_end_of_a_session() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let held2 = held.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            held2.lock().unwrap().push(conn);
        }
    });
    let clock = WallClock::now().unwrap();
    let mut sink = OtelSink::with_config(
        &config(format!("http://{addr}"), OtlpProtocol::Grpc),
        resource_info(),
        clock,
    )
    .unwrap();
    push_fixture(&mut sink, clock);
    let started = Instant::now();
    let stats = sink.finish_within(Duration::from_millis(500));
    let took = started.elapsed();
    assert!(stats.flush_timed_out, "{stats:?}");
    assert_eq!(stats.spans_exported, 0);
    assert_eq!(stats.spans_dropped, 12);
    assert!(
        took < Duration::from_secs(3),
        "finish waited {took:?} past its 500 ms deadline"
    );
}

// ---------------------------------------------------------------- the real thing: engine + llmprof attach

/// One `llmprof attach --otlp-endpoint URL` session on a real engine serving one chat request with the fixture's
/// traceparent; returns the HTTP usage, llmprof's exit summary and the trace path.
struct AttachRun {
    usage: serde_json::Value,
    summary: String,
    trace: std::path::PathBuf,
}

/// None (after the CI policy's message) when this host cannot run the real thing.
fn attach_session(endpoint: &str, tag: &str, extra: &[&str]) -> Option<AttachRun> {
    let model = e2e::default_model();
    if !e2e::require(e2e::is_root(), "not root: eBPF probes need root")
        || !e2e::require(
            model.exists(),
            "the default model is missing (run `cargo xtask fetch-model`)",
        )
    {
        return None;
    }
    let engine = e2e::engine::Engine::spawn(&model, &[]);
    let trace = std::env::temp_dir().join(format!(
        "llmprof-otel-{tag}-{}.perfetto-trace",
        std::process::id()
    ));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_llmprof"))
        .args(["attach", "--pid", &engine.pid.to_string()])
        .args(["--otlp-protocol", "grpc", "--otlp-endpoint", endpoint])
        .args(extra)
        .arg("-o")
        .arg(&trace)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[llmprof] {line}");
            if line.contains("probes live") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("llmprof never reported `probes live`");

    let traceparent = format!("00-{}-{}-01", hex(&TRACE_ID), hex(&PARENT_SPAN_ID));
    let body = format!(
        r#"{{"model":"{}","messages":[{{"role":"user","content":"What is the capital of France?"}}],"max_tokens":8,"temperature":0}}"#,
        e2e::engine::SERVED_NAME
    );
    let r = e2e::http::post_json(
        engine.port,
        "/v1/chat/completions",
        &[("traceparent", &traceparent), ("x-request-id", "otel-e2e")],
        &body,
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let usage: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    // Let the finish event reach llmprof, then stop the session like a user (Ctrl-C).
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on our own child's pid with SIGINT has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let summary = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{summary}");
    assert!(out.status.success(), "llmprof attach failed");
    assert!(
        summary.contains("otel:"),
        "the exit summary reports the export: {summary}"
    );
    Some(AttachRun {
        usage,
        summary,
        trace,
    })
}

/// The request span: the one in the caller's trace under the caller's span.
fn caller_child(spans: &[Span]) -> &Span {
    spans
        .iter()
        .find(|s| s.trace_id == TRACE_ID && s.parent_span_id == PARENT_SPAN_ID)
        .unwrap_or_else(|| panic!("no span under the caller's span among {} spans", spans.len()))
}

/// The issue's end-to-end check: the real engine, `llmprof attach --otlp-endpoint` (real eBPF), a chat request with
/// a known traceparent; the receiver gets the request span in the caller's trace, under the caller's span, with the
/// token counts the engine reported and children that add up to the request.
#[test]
fn attach_exports_engine_requests_as_spans_in_the_callers_trace() {
    let (addr, got, _rt) = start_grpc_receiver();
    let Some(run) = attach_session(&format!("http://{addr}"), "up", &[]) else {
        return;
    };
    let spans = received_spans(&got);
    let root = caller_child(&spans);
    assert_eq!(root.name, format!("chat {}", e2e::engine::SERVED_NAME));
    let usage = &run.usage["usage"];
    assert_eq!(
        attr(&root.attributes, "gen_ai.usage.output_tokens"),
        Some(&any_value::Value::IntValue(
            usage["completion_tokens"].as_i64().unwrap()
        ))
    );
    assert_eq!(
        attr(&root.attributes, "gen_ai.usage.input_tokens"),
        Some(&any_value::Value::IntValue(
            usage["prompt_tokens"].as_i64().unwrap()
        ))
    );
    let children: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id == root.span_id)
        .collect();
    assert!(children.iter().any(|c| c.name == SPAN_QUEUE), "queue child");
    assert!(children.iter().any(|c| c.name == SPAN_PREFILL), "prefill child");
    let sum: u64 = children.iter().map(|c| dur_ns(c)).sum();
    let total = dur_ns(root);
    assert!(
        sum.abs_diff(total) <= total / 100 + 1_000_000,
        "children {sum} ns vs request {total} ns"
    );
    assert_eq!(
        attr(&root.attributes, "gen_ai.input.messages"),
        None,
        "no text without --capture-content"
    );
    let _ = std::fs::remove_file(&run.trace);
}

/// `--capture-content`: the prompt and the completion reach the request span as GenAI messages (the completion
/// exactly as the client got it); the trace file still holds no text.
#[test]
fn attach_with_capture_content_puts_the_text_in_the_span_only() {
    let (addr, got, _rt) = start_grpc_receiver();
    let Some(run) = attach_session(&format!("http://{addr}"), "content", &["--capture-content"]) else {
        return;
    };
    let spans = received_spans(&got);
    let root = caller_child(&spans);
    let json = |key: &str| -> serde_json::Value {
        match attr(&root.attributes, key) {
            Some(any_value::Value::StringValue(v)) => serde_json::from_str(v).unwrap(),
            other => panic!("{key}: {other:?}"),
        }
    };
    let input = json("gen_ai.input.messages");
    let prompt = input[0]["parts"][0]["content"].as_str().unwrap();
    assert!(prompt.contains("What is the capital of France?"), "{prompt}");
    assert_eq!(input[0]["role"], "user");
    let output = json("gen_ai.output.messages");
    let answer = run.usage["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!answer.is_empty());
    assert_eq!(output[0]["parts"][0]["content"], answer, "{output}");
    assert_eq!(output[0]["role"], "assistant");
    let bytes = std::fs::read(&run.trace).unwrap();
    let needle = b"capital of France";
    assert!(
        !bytes.windows(needle.len()).any(|w| w == needle),
        "the trace file must not hold prompt text"
    );
    let _ = std::fs::remove_file(&run.trace);
}

/// Receiver down: the session still completes, the trace file is valid and holds the request, and the exit summary
/// reports the spans as dropped.
#[test]
fn attach_with_the_receiver_down_still_writes_the_trace_and_counts_drops() {
    if !e2e::require(
        e2e::trace_processor::available(),
        "Perfetto's trace processor is missing (`cargo xtask setup-tools`)",
    ) {
        return;
    }
    let Some(run) = attach_session(&format!("http://127.0.0.1:{}", dead_port()), "down", &[]) else {
        return;
    };
    let line = run
        .summary
        .lines()
        .find(|l| l.contains("otel:"))
        .unwrap_or_default();
    assert!(line.contains(" 0 spans exported"), "nothing exported: {line}");
    assert!(!line.contains(" 0 dropped"), "drops reported: {line}");
    let mut tp = e2e::trace_processor::load(&run.trace).expect("trace processor loads the trace");
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    let requests = tp
        .query_i64(&format!(
            "select count(*) from slice where name like '{}%' and depth = 0",
            slice::REQUEST_PREFIX
        ))
        .unwrap();
    assert_eq!(requests, 1, "the request is in the trace");
    let _ = std::fs::remove_file(&run.trace);
}

// ---------------------------------------------------------------- TLS

fn tls_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

fn pem(name: &str) -> Vec<u8> {
    std::fs::read(tls_fixture(name)).unwrap()
}

/// The OTLP/gRPC receiver behind TLS with the fixture server certificate; with `client_ca`, it also demands a
/// client certificate signed by the fixture CA (mutual TLS).
fn start_grpc_tls_receiver(client_ca: bool) -> (SocketAddr, Received, tokio::runtime::Runtime) {
    let mut tls = tonic::transport::ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(
        pem("server.pem"),
        pem("server.key"),
    ));
    if client_ca {
        tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(pem("ca.pem")));
    }
    common::start_grpc_receiver_with(Some(tls))
}

/// The OTLP/HTTP receiver behind TLS (rustls on std threads) with the fixture server certificate.
fn start_http_tls_receiver() -> (SocketAddr, Received, Arc<Mutex<HttpSeen>>) {
    use rustls::pki_types::pem::PemObject;
    let chain = rustls::pki_types::CertificateDer::pem_slice_iter(&pem("server.pem"))
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(&pem("server.key")).unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let got = Received::default();
    let seen = Arc::new(Mutex::new(HttpSeen::default()));
    let (got2, seen2) = (got.clone(), seen.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let (got, seen, config) = (got2.clone(), seen2.clone(), config.clone());
            std::thread::spawn(move || {
                let tls = rustls::ServerConnection::new(config).unwrap();
                serve_http_conn(rustls::StreamOwned::new(tls, conn), &got, &seen);
            });
        }
    });
    (addr, got, seen)
}

fn tls_files(ca: bool, client: bool) -> TlsFiles {
    TlsFiles {
        ca: ca.then(|| tls_fixture("ca.pem")),
        client_cert: client.then(|| tls_fixture("client.pem")),
        client_key: client.then(|| tls_fixture("client.key")),
    }
}

#[test]
fn grpc_over_mutual_tls_with_a_private_ca() {
    let (addr, got, _rt) = start_grpc_tls_receiver(true);
    // As a user configures it: the standard variables name the CA and the client certificate.
    let env: HashMap<&str, String> = [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("https://localhost:{}", addr.port()),
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".into()),
        (
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            tls_fixture("ca.pem").display().to_string(),
        ),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            tls_fixture("client.pem").display().to_string(),
        ),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            tls_fixture("client.key").display().to_string(),
        ),
    ]
    .into_iter()
    .collect();
    let mut cfg = OtelOptions::default()
        .resolve_with(|k| env.get(k).cloned())
        .unwrap()
        .expect("endpoint configured");
    assert_eq!(cfg.tls, tls_files(true, true));
    cfg.resource_attributes = config(String::new(), OtlpProtocol::Grpc).resource_attributes;
    let clock = WallClock::now().unwrap();
    let mut sink = OtelSink::with_config(&cfg, resource_info(), clock).unwrap();
    let t0_wall = push_fixture(&mut sink, clock);
    let stats = sink.finish();
    assert_eq!(stats.spans_exported, 12, "{stats:?}");
    assert_eq!(stats.export_errors, 0, "{stats:?}");
    check_received(&got.lock().unwrap(), t0_wall);
}

#[test]
fn http_over_tls_with_a_private_ca() {
    let (addr, got, seen) = start_http_tls_receiver();
    let opts = OtelOptions {
        otlp_endpoint: Some(format!("https://localhost:{}", addr.port())),
        otlp_protocol: Some(OtlpProtocol::Http),
        otlp_ca_cert: Some(tls_fixture("ca.pem")),
        ..Default::default()
    };
    let mut cfg = opts.resolve_with(|_| None).unwrap().expect("endpoint configured");
    cfg.resource_attributes = config(String::new(), OtlpProtocol::Http).resource_attributes;
    let clock = WallClock::now().unwrap();
    let mut sink = OtelSink::with_config(&cfg, resource_info(), clock).unwrap();
    let t0_wall = push_fixture(&mut sink, clock);
    let stats = sink.finish();
    assert_eq!(stats.spans_exported, 12, "{stats:?}");
    assert!(seen.lock().unwrap().paths.iter().all(|p| p == "/v1/traces"));
    check_received(&got.lock().unwrap(), t0_wall);
}

#[test]
fn untrusted_collector_certificate_fails_the_export_not_the_session() {
    for protocol in [OtlpProtocol::Grpc, OtlpProtocol::Http] {
        // The fixture CA is not in the system store: without --otlp-ca-cert the handshake must fail.
        let (addr, got, _keep) = match protocol {
            OtlpProtocol::Grpc => {
                let (a, g, rt) = start_grpc_tls_receiver(false);
                (a, g, Some(rt))
            }
            OtlpProtocol::Http => {
                let (a, g, _) = start_http_tls_receiver();
                (a, g, None)
            }
        };
        let endpoint = match protocol {
            OtlpProtocol::Grpc => format!("https://localhost:{}", addr.port()),
            OtlpProtocol::Http => format!("https://localhost:{}/v1/traces", addr.port()),
        };
        let clock = WallClock::now().unwrap();
        let mut sink = OtelSink::with_config(&config(endpoint, protocol), resource_info(), clock).unwrap();
        push_fixture(&mut sink, clock);
        let stats = sink.finish();
        assert_eq!(stats.spans_exported, 0, "{protocol:?}: {stats:?}");
        assert_eq!(stats.spans_dropped, 12, "{protocol:?}: {stats:?}");
        assert!(got.lock().unwrap().is_empty(), "{protocol:?}");
    }
}

#[test]
fn unreadable_tls_file_is_a_clear_error_before_anything_starts() {
    let mut cfg = config("https://localhost:4318/v1/traces".into(), OtlpProtocol::Http);
    cfg.tls.ca = Some(tls_fixture("no-such-ca.pem"));
    let Err(err) = OtelSink::with_config(&cfg, resource_info(), WallClock::now().unwrap()) else {
        panic!("a missing CA file must be refused");
    };
    let err = err.to_string();
    assert!(err.contains("no-such-ca.pem"), "{err}");
}
