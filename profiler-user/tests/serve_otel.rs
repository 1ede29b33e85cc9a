//! `llmprof serve --otlp-endpoint`: a session started by an alert exports the traced engine's requests as OTel
//! spans, like `llmprof attach --otlp-endpoint` does. The real engine serves three chat requests (one carrying
//! a W3C `traceparent`) while a session traces it; the alert then resolves, which ends the session early. The
//! check is what a user looks at: the receiver holds one span per request by the time the API says the session
//! finished (nothing left unflushed by the early end), the traced request's span sits in the caller's trace
//! under the caller's span, and the session's trace loads cleanly and says why it ended.
#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{hex, received_spans, start_grpc_receiver};
use e2e::serve::{Serve, TOKEN};
use llmprof_trace::names::{arg, marker, slice, tp_arg};
use llmprof_trace::otel::semconv;
use opentelemetry_proto::tonic::trace::v1::Span;

const TRACE_ID: [u8; 16] = [
    0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36,
];
const PARENT_SPAN_ID: [u8; 8] = [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7];
/// Chat requests served during the session.
const REQUESTS: usize = 3;

fn alert(status: &str, pid: u32) -> String {
    format!(
        r#"{{"version":"4","status":"{status}","alerts":[{{"status":"{status}","labels":{{"alertname":"LLMQueueBacklog","pid":"{pid}"}},"annotations":{{"llmprof_duration":"5m"}},"fingerprint":"fp-otel"}}]}}"#
    )
}

#[test]
fn a_serve_session_exports_the_engines_requests_as_spans() {
    let model = e2e::default_model();
    if !e2e::require(e2e::is_root(), "not root: llmprof serve loads eBPF programs")
        || !e2e::require(
            model.exists(),
            "the default model is missing (run `cargo xtask fetch-model`)",
        )
        || !e2e::require(
            e2e::trace_processor::available(),
            "Perfetto's trace processor is missing (`cargo xtask setup-tools`)",
        )
    {
        return;
    }
    let (addr, got, _rt) = start_grpc_receiver();
    let engine = e2e::engine::Engine::spawn(&model, &[]);
    let dir = std::env::temp_dir().join(format!("llmprof-serve-otel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let endpoint = format!("http://{addr}");
    let allow = format!("pid:{}", engine.pid);
    let srv = Serve::spawn(
        &dir,
        &[
            "--allow-target",
            &allow,
            "--otlp-protocol",
            "grpc",
            "--otlp-endpoint",
            &endpoint,
        ],
    );

    let r = srv.post_alerts(&alert("firing", engine.pid), Some(TOKEN));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("\"started\""), "{}", r.text());
    let session = srv.wait_session(Duration::from_secs(30), "running", |s| s["state"] == "running");
    let id = session["id"].as_u64().unwrap();
    // The session creates its trace file once its probes are live.
    let trace = session["trace"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !Path::new(&trace).exists() {
        assert!(
            Instant::now() < deadline,
            "session {id} never went live: {trace} missing"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let traceparent = format!("00-{}-{}-01", hex(&TRACE_ID), hex(&PARENT_SPAN_ID));
    for i in 0..REQUESTS {
        let body = format!(
            r#"{{"model":"{}","messages":[{{"role":"user","content":"Name a colour, please ({i})."}}],"max_tokens":6,"temperature":0}}"#,
            e2e::engine::SERVED_NAME
        );
        let headers: &[(&str, &str)] = if i == 0 {
            &[("traceparent", traceparent.as_str())]
        } else {
            &[]
        };
        let r = e2e::http::post_json(engine.port, "/v1/chat/completions", headers, &body).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // Let the last finish event reach the session, then resolve the alert: the session ends early.
    std::thread::sleep(Duration::from_millis(500));
    let r = srv.post_alerts(&alert("resolved", engine.pid), Some(TOKEN));
    assert!(r.text().contains("\"stopped\""), "{}", r.text());
    let done = srv.wait_session(Duration::from_secs(30), "finished", |s| {
        s["id"] == id && s["state"] != "running"
    });
    assert_eq!(done["state"], "finished", "{done:#}");
    assert_eq!(done["end_reason"], "alert resolved", "{done:#}");

    // Finished means flushed: every request's span is at the receiver now.
    let spans = received_spans(&got);
    let name = format!("chat {}", e2e::engine::SERVED_NAME);
    let requests: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == name && (s.parent_span_id.is_empty() || s.parent_span_id == PARENT_SPAN_ID))
        .collect();
    assert_eq!(
        requests.len(),
        REQUESTS,
        "one span per request among {} spans: {:?}",
        spans.len(),
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let traced: Vec<&&Span> = requests.iter().filter(|s| s.trace_id == TRACE_ID).collect();
    assert_eq!(
        traced.len(),
        1,
        "the traceparent's request is in the caller's trace"
    );
    assert_eq!(
        traced[0].parent_span_id, PARENT_SPAN_ID,
        "under the caller's span"
    );
    assert!(
        spans
            .iter()
            .any(|s| s.parent_span_id == traced[0].span_id && s.name == semconv::SPAN_PREFILL),
        "the request span has its phases as children"
    );

    // The trace still loads, holds the requests, and ends with the real reason.
    let mut tp = e2e::trace_processor::load(&trace).expect("trace processor loads the trace");
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    let in_trace = tp
        .query_i64(&format!(
            "select count(*) from slice where name like '{}%' and depth = 0",
            slice::REQUEST_PREFIX
        ))
        .unwrap();
    assert_eq!(in_trace, REQUESTS as i64, "the requests are in the trace too");
    let reason = tp
        .query(&format!(
            "select extract_arg(arg_set_id, '{}') as r from slice where name = '{}'",
            tp_arg(arg::END_REASON),
            marker::SUMMARY
        ))
        .unwrap();
    assert_eq!(reason.len(), 1, "{reason:?}");
    assert_eq!(reason[0]["r"], "alert resolved", "{reason:?}");
    // Sessions sample stacks and record thread states like `llmprof attach` does by default: the engine's
    // threads have stack samples and Running rows.
    for (table, cond) in [("perf_sample", ""), ("thread_state", "and x.state = 'Running'")] {
        let n = tp
            .query_i64(&format!(
                "select count(*) from {table} x join thread using(utid) join process using(upid) \
                 where process.pid = {} {cond}",
                engine.pid
            ))
            .unwrap();
        assert!(n > 0, "no {table} rows of the engine in the session's trace");
    }

    assert!(srv.stop().success(), "llmprof serve exits cleanly on SIGTERM");
    drop(engine);
    let _ = std::fs::remove_dir_all(&dir);
}
