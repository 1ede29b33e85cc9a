//! Operating the server: `/metrics` under vLLM's names (checked by promtool), a weight reload while serving,
//! a graceful SIGTERM.

use super::*;

#[test]
fn metrics_follow_vllm_names_and_pass_promtool() {
    let s = start(&[]);
    for _ in 0..3 {
        s.post_json(
            "/v1/chat/completions",
            &chat_body("count", json!({"max_tokens": 5})),
        );
    }
    let text = s.get("/metrics").text();
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
    ] {
        assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
    }
    assert_eq!(s.metric("vllm:e2e_request_latency_seconds_count{"), 3.0);
    assert!(s.metric("vllm:generation_tokens_total{") >= 3.0);
    assert_eq!(
        s.metric("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"}")
            + s.metric("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"stop\"}"),
        3.0
    );

    let promtool = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok();
    if !e2e::require(promtool, "promtool not installed (apt-get install prometheus)") {
        return;
    }
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // promtool's linter flags every ':' in a metric name ("metric names should not contain ':'"), which vLLM's
    // `vllm:` names (required here) always have. Anything else is a real problem.
    let other: Vec<&str> = report
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.ends_with("metric names should not contain ':'"))
        .collect();
    assert!(other.is_empty(), "promtool found problems:\n{report}");
    assert!(
        out.status.success() || out.status.code() == Some(3),
        "promtool failed to parse the exposition:\n{report}"
    );
}

#[test]
fn reload_swaps_weights_while_serving() {
    let s = start(&[]);
    let other = serve_common::tiny_model_seeded(7);
    let before = s
        .post_json(
            "/v1/completions",
            &completion_body("abc", json!({"max_tokens": 16})),
        )
        .json();
    let r = s.post_json("/admin/reload", &json!({"path": other}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "ok");
    let after = s
        .post_json(
            "/v1/completions",
            &completion_body("abc", json!({"max_tokens": 16})),
        )
        .json();
    assert_ne!(
        before["choices"][0]["text"], after["choices"][0]["text"],
        "other weights give another answer"
    );
    // Reload of a missing file is refused and the server keeps serving the current weights.
    let r = s.post_json("/admin/reload", &json!({"path": "/nonexistent/model.gguf"}));
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nonexistent")
    );
    // So is a model whose KV-cache geometry differs (3 layers instead of 2).
    let dir = std::env::temp_dir().join(format!("llmserve-geom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let odd = dir.join("tiny-3-layers.gguf");
    let spec = e2e::gguf::TinyModelSpec {
        n_layers: 3,
        ..Default::default()
    };
    e2e::gguf::write_tiny_gguf(&odd, &spec).unwrap();
    let r = s.post_json("/admin/reload", &json!({"path": odd}));
    assert_eq!(r.status, 400, "{}", r.text());
    let again = s
        .post_json(
            "/v1/completions",
            &completion_body("abc", json!({"max_tokens": 16})),
        )
        .json();
    assert_eq!(again["choices"][0]["text"], after["choices"][0]["text"]);
}

#[test]
fn sigterm_shuts_down_gracefully() {
    let mut s = start(&[]);
    assert_eq!(s.get("/health").status, 200);
    let st = std::process::Command::new("kill")
        .args(["-TERM", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let exited = wait_until(Duration::from_secs(15), || s.child.try_wait().unwrap().is_some());
    assert!(exited, "llmserve did not exit after SIGTERM");
    let status = s.child.wait().unwrap();
    assert!(status.success(), "exit status {status}; stderr:\n{}", s.stderr());
}
