//! vLLM's engine attached live, as a user does it: `vllm serve` (the CPU build from PyPI, its engine core a
//! child process) already running under a launcher, `sudo llmprof attach --pid <launcher>` with no flag, the
//! OpenAI Python client sending sampled streaming chat requests meanwhile.
//!
//! Checked against what vLLM and the client say themselves: the engine steps and the prompt and generated
//! tokens of the steps against vLLM's own `/metrics` counters over the same requests; one request row per
//! client request, its engine view joined to its wire view by `X-Request-Id`, with the engine's TTFT
//! decomposed (queue, prefill) and no later than what the client saw; the hooks removed at the end.
//!
//! Slow (vLLM starts in minutes on a loaded 2-core machine). Needs root, vLLM's venv and the converted model
//! (`cargo xtask setup`), the servers venv's OpenAI client: skips loudly without, fails under `CI=true`.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use e2e::attach::Attached;
use e2e::vllm;
use e2e::wire::{Load, run_client};
use serde_json::Value;

/// Requests the client sends while the session runs.
const REQUESTS: usize = 6;

#[test]
fn a_live_attach_gives_vllms_engine_steps_and_request_phases() {
    let python = e2e::servers_python();
    if !e2e::wire::third_party_ready(&python)
        || !e2e::require(
            vllm::available(),
            "vLLM's CPU build or its converted model is missing (`cargo xtask setup`)",
        )
    {
        return;
    }
    let dir = std::env::temp_dir().join(format!("llmprof-vllm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let server = vllm::start(e2e::serve::free_port());
    let trace = dir.join("vllm.perfetto-trace");
    let a = Attached::start(server.launcher.id(), &["-v", "--no-sample"], &trace);
    let log = a.log();
    assert!(
        log.contains(&format!("Python hooks: pid {}", server.engine)) && log.contains("vLLM "),
        "the engine core got the vLLM preset: {log}"
    );
    let vllm::Counters {
        steps: steps0,
        prompt: prompt0,
        generated: gen0,
        cached: cached0,
    } = vllm::counters(server.port);
    let client = run_client(
        &python,
        server.port,
        &Load {
            model: vllm::SERVED_NAME,
            requests: REQUESTS,
            cancel: usize::MAX,
            json_every: 0,
            temperature: 0.8,
        },
        &dir.join("client.json"),
    );
    let vllm::Counters {
        steps: steps1,
        prompt: prompt1,
        generated: gen1,
        cached: cached1,
    } = vllm::counters(server.port);
    let out = a.stop();
    assert!(!out.contains("not removed"), "{out}");
    assert!(
        out.contains("Python hooks"),
        "the estimate charges the hooks: {out}"
    );

    let report = e2e::attach::report_json(&trace);
    // The client's warm-up request is vLLM's too (not in the rows' comparison, in the counters' deltas).
    let steps = report["steps"]["count"].as_f64().unwrap_or(0.0);
    let vllm_steps = steps1 - steps0;
    assert!(vllm_steps > 0.0, "vLLM counted steps");
    assert!(
        (steps - vllm_steps).abs() <= 1.0,
        "engine steps: llmprof {steps}, vLLM's /metrics {vllm_steps}: {}",
        report["steps"]
    );
    let tokens = |k: &str| report["steps"][k].as_f64().unwrap_or(-1.0);
    // vLLM counts a prompt's tokens whole, its cached prefix included; the steps compute the rest.
    assert_eq!(
        tokens("prefill_tokens") + (cached1 - cached0),
        prompt1 - prompt0,
        "prompt tokens of the steps (+ vLLM's prefix-cache hits) against vLLM's: {}",
        report["steps"]
    );
    // Each request's first token comes from its last prompt step; each decode token is one more.
    let requests = (REQUESTS + 1) as f64;
    assert_eq!(
        tokens("decode_tokens") + requests,
        gen1 - gen0,
        "generated tokens of the steps against vLLM's ({REQUESTS} requests and the client's warm-up): {}",
        report["steps"]
    );

    let rows: Vec<Value> = report["requests"]["per_request"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for c in &client {
        let xid = c["x_request_id"].as_str().unwrap();
        let mine: Vec<&Value> = rows.iter().filter(|r| r["x_request_id"] == xid).collect();
        assert_eq!(mine.len(), 1, "request {xid} once: {rows:#?}");
        let r = mine[0];
        assert_eq!(r["wire"], false, "the engine's view, its wire view joined: {r}");
        assert!(r["wire_req_id"].is_u64(), "{r}");
        assert!(
            r["finish_reason"] == "stop" || r["finish_reason"] == "length",
            "{r}"
        );
        let (queue, prefill, ttft) = (
            r["queue_ms"].as_f64().expect("queue"),
            r["prefill_ms"].as_f64().expect("prefill"),
            r["ttft_ms"].as_f64().expect("engine TTFT"),
        );
        assert!(queue >= 0.0 && prefill > 0.0 && ttft >= prefill, "{r}");
        let client_ttft = c["ttft_ms"].as_f64().unwrap();
        assert!(
            ttft <= client_ttft,
            "the engine's first token comes before the client's: engine {ttft:.1} ms, client {client_ttft:.1} ms: {r}"
        );
        assert!(
            r["outside_engine_ttft_ms"].as_f64().is_some(),
            "TTFT outside the engine: {r}"
        );
        // A token that ends inside a character (a sampled emoji) streams as a chunk without content.
        assert!(
            r["output_tokens"].as_u64().unwrap() >= c["chunks"].as_u64().unwrap(),
            "every content chunk is a token: {r}"
        );
        assert_eq!(r["http_status"], 200, "the API server's status: {r}");
    }
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}
