//! `llmprof serve` end to end, as on-call would meet it: the real engine overloaded, the real Prometheus
//! evaluating deploy/'s rules, the real Alertmanager routing the alert with deploy/'s config (bearer token
//! included) to the real `llmprof serve` running as root with its flight recorder on. The trace it leaves is
//! loaded into Perfetto's trace processor and must show the overload (engine steps, a high waiting-requests
//! counter), the alert that triggered it, and what happened before the alert.
//!
//! Shortened for the test (documented in docs/serve.md): every rule's `for:` is 1 s, `llmprof_duration` 8 s,
//! Alertmanager's group_wait 1 s and group_interval 2 s; Prometheus scrapes and evaluates every second.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use e2e::engine::Engine;
use e2e::serve::{self, ALERTMANAGER, Serve, counter};
use e2e::{default_model, http, is_root, require, trace_processor};
use llmprof_abi::StepKind;
use llmprof_trace::names::{arg, counter, marker, tp_arg, track};
use serde_json::Value;

/// The deployed rules this overload trips, whichever fires first: the queue backlog
/// (`sum by (instance, model_name) (vllm:num_requests_waiting) > 10`) or, as requests queue, p95 TTFT above 3 s.
/// The first one takes the session; the other finds the engine in its cooldown (one trace per incident).
const ALERTS: [&str; 2] = ["LLMQueueBacklog", "LLMTimeToFirstTokenHigh"];
/// The backlog rule's threshold, from deploy/prometheus/llmprof-alerts.rules.yml.
const BACKLOG_THRESHOLD: f64 = 10.0;
/// Concurrent clients against `--max-num-seqs 2`: about 30 wait at any time.
const CLIENTS: usize = 32;

fn chat_body(i: usize, max_tokens: u32) -> String {
    format!(
        r#"{{"model":"smollm2","messages":[{{"role":"user","content":"Tell me a story about robot number {i}."}}],"max_tokens":{max_tokens},"temperature":0}}"#
    )
}

#[test]
fn an_alert_from_alertmanager_leaves_a_trace_with_the_overload_and_what_led_to_it() {
    let model = default_model();
    if !require(is_root(), "not root: llmprof serve loads eBPF programs")
        || !require(
            model.exists(),
            "the default model is missing (run `cargo xtask fetch-model`)",
        )
        || !require(
            trace_processor::available(),
            "Perfetto's trace processor is missing (`cargo xtask setup-tools`)",
        )
        || !require(
            serve::have("prometheus"),
            "prometheus is missing (`cargo xtask setup-tools`)",
        )
        || !require(
            serve::have(ALERTMANAGER),
            "Alertmanager is missing (`cargo xtask setup-tools`)",
        )
        || !require(
            serve::have("curl") && serve::have("openssl"),
            "curl and openssl are missing (`cargo xtask setup-tools`)",
        )
    {
        return;
    }
    let dir = std::env::temp_dir().join(format!("llmprof-serve-alerts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let engine = Engine::spawn(&model, &["--max-num-seqs", "2", "--max-queue", "1024"]);
    let watch = format!("port:{}", engine.port);
    // Over HTTPS, as deploy/ runs it: Alertmanager trusts serve's certificate through `tls_config.ca_file`.
    let srv = Serve::spawn_tls(
        &dir,
        &["--watch", &watch, "--flight-recorder", "30s", "--cooldown", "10m"],
    );
    // The flight recorder follows the engine (found from its port) before anything happens.
    let mut recording = false;
    for _ in 0..150 {
        let h = srv.healthz();
        if h["flight_recorders"][0]["state"] == "recording" && h["flight_recorders"][0]["pid"] == engine.pid {
            recording = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        recording,
        "flight recorder not recording the engine: {}",
        srv.healthz()
    );

    // Before the alert: a little normal traffic, which only the flight recorder sees.
    for i in 0..2 {
        let r = http::post_json(engine.port, "/v1/chat/completions", &[], &chat_body(i, 8)).expect("chat");
        assert_eq!(r.status, 200, "{}", r.text());
    }

    let rules = serve::fast_rules("1s", "8s");
    let (_am, am_port) = serve::alertmanager(
        &dir,
        &serve::test_alertmanager_config(
            srv.port,
            &srv.token_file,
            srv.tls_cert.as_deref().expect("serve runs over HTTPS"),
        ),
    );
    let (_prom, _prom_port) = serve::prometheus(&dir, engine.port, &rules, am_port);

    // Overload: many clients against two sequence slots, until the session has finished.
    let stop = Arc::new(AtomicBool::new(false));
    let port = engine.port;
    for c in 0..CLIENTS {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut i = c;
            while !stop.load(Ordering::Relaxed) {
                // Errors (the engine is killed at the end) just end the client.
                if http::post_json(port, "/v1/chat/completions", &[], &chat_body(i, 32)).is_err() {
                    return;
                }
                i += CLIENTS;
            }
        });
    }

    let session = srv.wait_session(Duration::from_secs(240), "for an overload alert to finish", |s| {
        ALERTS.iter().any(|a| s["alert"] == *a) && s["state"] != "running"
    });
    let alert = session["alert"].as_str().expect("alert name").to_owned();
    stop.store(true, Ordering::Relaxed);
    assert_eq!(session["state"], "finished", "the session failed: {session:#}");
    assert_eq!(
        session["target_pid"], engine.pid,
        "resolved from the instance label: {session:#}"
    );
    assert!(
        session["target"].as_str().unwrap_or("").contains("instance"),
        "resolved from the instance label: {session:#}"
    );
    assert!(
        session["labels"]["instance"]
            .as_str()
            .unwrap_or("")
            .ends_with(&format!(":{}", engine.port)),
        "{session:#}"
    );
    let prelude = session["prelude_events"].as_u64().unwrap_or(0);
    // The recorder keeps running within its memory bound.
    let rec = &srv.healthz()["flight_recorders"][0];
    assert_eq!(rec["state"], "recording", "{rec}");
    assert!(rec["events"].as_u64().unwrap_or(0) > 0, "{rec}");
    assert!(rec["bytes"].as_u64() <= rec["max_bytes"].as_u64(), "{rec}");
    assert!(
        prelude > 0,
        "no flight-recorder events before the alert: {session:#}"
    );

    // Alertmanager reached serve through the token; serve counts what it did.
    let m = srv.metrics();
    assert!(
        counter(&m, "llmprof_serve_webhooks_total{code=\"200\"}") >= 1.0,
        "{m}"
    );
    assert!(counter(&m, "llmprof_serve_sessions_started_total") >= 1.0, "{m}");
    assert_eq!(
        counter(&m, "llmprof_serve_webhooks_total{code=\"401\"}"),
        0.0,
        "{m}"
    );

    // The trace, downloaded through the API, is the file on disk.
    let id = session["id"].as_u64().expect("id");
    let (status, bytes) = srv.download(&format!("/v1/sessions/{id}/trace"));
    assert_eq!(status, 200);
    let path = session["trace"].as_str().expect("trace path").to_owned();
    assert!(path.contains(&alert), "trace named after the alert: {path}");
    assert_eq!(
        bytes,
        std::fs::read(&path).expect("trace on disk"),
        "downloaded trace = file"
    );
    let local = dir.join("downloaded.perfetto-trace");
    std::fs::write(&local, &bytes).expect("write download");

    let mut tp = trace_processor::load(&local).expect("trace processor loads the trace");
    assert_eq!(
        tp.import_errors().expect("stats"),
        Vec::<Value>::new(),
        "import errors"
    );
    assert_eq!(
        tp.unterminated_slices().expect("slices"),
        Vec::<Value>::new(),
        "unterminated slices"
    );

    // The alert is in the trace, with its fingerprint and labels.
    let rows = tp
        .query(&format!(
            "select ts, extract_arg(arg_set_id, '{}') as fp, extract_arg(arg_set_id, '{}') as labels, \
                    extract_arg(arg_set_id, '{}') as annotations from slice where name = '{}'",
            tp_arg(arg::FINGERPRINT),
            tp_arg(arg::LABELS),
            tp_arg(arg::ANNOTATIONS),
            marker::alert_fired(&alert)
        ))
        .expect("alert query");
    assert_eq!(rows.len(), 1, "one alert instant: {rows:?}");
    let alert_ts = rows[0]["ts"].as_i64().expect("ts");
    assert_eq!(rows[0]["fp"], session["fingerprint"]);
    let labels: Value =
        serde_json::from_str(rows[0]["labels"].as_str().unwrap_or("{}")).expect("labels JSON");
    assert_eq!(labels["alertname"], alert.as_str());
    assert_eq!(labels["llmprof"], "trace");
    assert!(
        rows[0]["annotations"]
            .as_str()
            .unwrap_or("")
            .contains("llmprof_duration")
    );

    // The overload: engine steps, and a waiting-requests counter above the rule's threshold.
    let [p, d, m] = [StepKind::Prefill, StepKind::Decode, StepKind::Mixed].map(StepKind::name);
    let mut steps = |cond: &str| {
        tp.query_i64(&format!(
            "select count(*) from slice s join track t on s.track_id = t.id \
             where t.name = '{}' and s.name in ('{p}', '{d}', '{m}') and {cond}",
            track::STEPS
        ))
        .expect("steps query")
    };
    let (before, after) = (
        steps(&format!("s.ts < {alert_ts}")),
        steps(&format!("s.ts >= {alert_ts}")),
    );
    assert!(after > 0, "no engine step after the alert");
    assert!(
        before > 0,
        "no engine step from the flight recorder before the alert"
    );
    let max_waiting = tp
        .query(&format!(
            "select max(c.value) as v from counter c join counter_track t on c.track_id = t.id where t.name = '{}'",
            counter::WAITING.0
        ))
        .expect("counter query");
    let max_waiting = max_waiting[0]["v"].as_f64().unwrap_or(0.0);
    assert!(
        max_waiting > BACKLOG_THRESHOLD,
        "requests waiting peaked at {max_waiting}, not above the alert's {BACKLOG_THRESHOLD}"
    );
    drop(tp);
    assert!(srv.stop().success(), "llmprof serve exits cleanly on SIGTERM");
    drop(engine);
    let _ = std::fs::remove_dir_all(&dir);
}
