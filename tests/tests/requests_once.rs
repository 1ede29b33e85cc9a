//! Each request counted once, with its HTTP status, as a user of llmserve would check `llmprof report`:
//! llmserve's probes report every request and its HTTP server's socket shows the same request on the wire.
//! Clients that send no `x-request-id` (the common case) and clients that do both get one row per request,
//! joined by the capture; the report says how many were joined. Requests that fail (a 404 for an unknown
//! model, a 400 for a body that is not JSON) are counted as failed with their status — never as finished —
//! and stay out of the latency percentiles of the successful ones.

use e2e::attach::Attached;
use e2e::engine::{Engine, SERVED_NAME};
use e2e::{bin_path, default_model, http, is_root, require};
use serde_json::Value;

const CHAT: &str = "/v1/chat/completions";

fn chat(model: &str, stream: bool) -> String {
    format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"Say hi"}}],"max_tokens":6,"temperature":0,"stream":{stream}}}"#
    )
}

#[test]
fn each_request_is_one_row_with_its_status_and_failures_apart() {
    let model = default_model();
    if !require(is_root(), "attaching needs root")
        || !require(model.exists(), "model missing (cargo xtask fetch-model)")
    {
        return;
    }
    let engine = Engine::spawn(&model, &[]);
    let trace = std::env::temp_dir().join(format!("llmprof-once-{}.perfetto-trace", std::process::id()));
    let _ = std::fs::remove_file(&trace);
    let llmprof = Attached::start(engine.pid, &[], &trace);
    // 6 requests without x-request-id (3 streamed, 3 not), 2 with one; then 2 unknown models and a bad body.
    let mut ok = 0;
    for i in 0..6 {
        let r = http::post_json(engine.port, CHAT, &[], &chat(SERVED_NAME, i % 2 == 0)).expect("chat");
        assert_eq!(r.status, 200, "{}", r.text());
        ok += 1;
    }
    for id in ["once-a", "once-b"] {
        let r = http::post_json(
            engine.port,
            CHAT,
            &[("x-request-id", id)],
            &chat(SERVED_NAME, true),
        )
        .expect("chat");
        assert_eq!(r.status, 200, "{}", r.text());
        ok += 1;
    }
    for _ in 0..2 {
        let r = http::post_json(engine.port, CHAT, &[], &chat("no-such-model", false)).expect("chat");
        assert_eq!(r.status, 404, "{}", r.text());
    }
    let r = http::post_json(engine.port, CHAT, &[], "{not json").expect("chat");
    assert_eq!(r.status, 400, "{}", r.text());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let summary = llmprof.stop();
    assert!(
        summary.contains(&format!(
            "{ok} of them also seen by the engine's probes and joined"
        )),
        "{summary}"
    );

    let out = std::process::Command::new(bin_path("llmprof"))
        .args(["report", "--json"])
        .arg(&trace)
        .output()
        .expect("report");
    assert!(out.status.success());
    let j: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let r = &j["requests"];
    let rows = r["per_request"].as_array().expect("rows");
    assert_eq!(
        r["count"],
        ok + 3,
        "each request once (llmprof's own /metrics scrapes aside): {rows:#?}"
    );
    assert_eq!(
        r["joined"], ok,
        "every engine request joined its wire view: {r:#}"
    );
    assert_eq!(
        r["joined_views"].as_array().map(Vec::len),
        Some(ok),
        "the views are kept"
    );
    assert_eq!(r["failed"], 3);
    assert_eq!(r["finished"], ok, "a failed request is never a finished one");
    let statuses: Value = serde_json::json!({"200": ok, "400": 1, "404": 2});
    assert_eq!(r["status_counts"], statuses);
    let rate = r["error_rate_pct"].as_f64().expect("error rate");
    assert!((rate - 300.0 / (ok as f64 + 3.0)).abs() < 1e-3, "{rate}");
    assert_eq!(
        r["e2e_ms"]["count"], ok,
        "the failed requests are kept out of the latencies"
    );
    assert_eq!(r["failed_e2e_ms"]["count"], 3);
    let engine_rows: Vec<&Value> = rows.iter().filter(|q| q["wire"] == false).collect();
    assert_eq!(engine_rows.len(), ok);
    for q in &engine_rows {
        assert_eq!(q["http_status"], 200, "{q}");
        assert_eq!(q["path"], CHAT, "{q}");
        assert!(q["wire_req_id"].is_u64(), "{q}");
        assert!(q["response_bytes"].as_u64().is_some_and(|b| b > 0), "{q}");
        assert!(q["streamed"].is_boolean(), "{q}");
        assert!(
            q["perfetto_slice"]
                .as_str()
                .is_some_and(|s| s.starts_with("request ")),
            "{q}"
        );
    }
    let streamed = engine_rows.iter().filter(|q| q["streamed"] == true).count();
    assert_eq!(streamed, 5, "3 of the 6 without an id, and both with one");
    for id in ["once-a", "once-b"] {
        assert!(engine_rows.iter().any(|q| q["x_request_id"] == id), "{id}");
    }
    let failed: Vec<&Value> = rows.iter().filter(|q| q["failed"] == true).collect();
    assert_eq!(failed.len(), 3);
    assert!(
        failed
            .iter()
            .all(|q| q["finish_reason"] == "error" && q["wire"] == true),
        "{failed:#?}"
    );

    let out = std::process::Command::new(bin_path("llmprof"))
        .arg("report")
        .arg(&trace)
        .output()
        .expect("report");
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        format!(
            "Requests: {} ({ok} finished, 3 failed); {ok} wire views of engine requests joined",
            ok + 3
        ),
        "HTTP status: 200 ×8, 400 ×1, 404 ×2; error rate 27.3 %".to_owned(),
        "Slowest requests".to_owned(),
        "Verdict".to_owned(),
    ] {
        assert!(text.contains(&want), "{want:?} missing:\n{text}");
    }
    let _ = std::fs::remove_file(&trace);
}
