//! `llmprof attach --otlp-endpoint` on a real engine: spans in the caller's trace, `--capture-content`, a
//! receiver that is down.

use super::*;

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
