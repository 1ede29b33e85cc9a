//! `llmprof serve` under a burst of 1,000 webhook posts, as a misbehaving network or Alertmanager storm would
//! send: duplicates of a few alerts, malformed bodies, an oversized one and posts without (or with a wrong)
//! token, from 8 concurrent clients. serve must answer each with the right status, stay healthy, start exactly
//! the sessions the rules allow (dedupe by fingerprint, the cap on concurrent sessions, one failed session for
//! an alert naming no process) and finish every trace cleanly on SIGTERM.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use e2e::serve::{Serve, TOKEN, counter};
use e2e::testee::Reaped;
use e2e::{is_root, require, trace_processor};
use llmprof_trace::names::{arg, marker, tp_arg};
use serde_json::Value;

/// The summary's end reason.
fn end_reason_sql() -> String {
    format!(
        "select extract_arg(arg_set_id, '{}') as r from slice where name = '{}'",
        tp_arg(arg::END_REASON),
        marker::SUMMARY
    )
}

/// Posts in the burst.
const POSTS: usize = 1000;
/// `--max-sessions` of this serve.
const CAP: usize = 3;
/// Distinct alerts naming a live target (one more than the cap).
const TARGETS: usize = CAP + 1;
/// A pid above Linux's pid_max: never a process.
const NO_PID: u32 = 1_073_741_823;

fn alert(fingerprint: &str, pid: u32) -> String {
    format!(
        r#"{{"version":"4","groupKey":"{{}}:{{alertname=\"Burst\"}}","truncatedAlerts":0,"status":"firing","receiver":"llmprof","groupLabels":{{}},"commonLabels":{{}},"commonAnnotations":{{}},"externalURL":"http://am","alerts":[{{"status":"firing","labels":{{"alertname":"Burst","pid":"{pid}"}},"annotations":{{"llmprof_duration":"60s"}},"startsAt":"2026-11-26T00:00:00Z","endsAt":"0001-01-01T00:00:00Z","generatorURL":"http://prom","fingerprint":"{fingerprint}"}}]}}"#
    )
}

/// Malformed bodies, each a different mistake.
fn malformed(i: usize) -> String {
    let cases = [
        "".to_owned(),
        "{not json".to_owned(),
        r#"{"version":"4","alerts":[{"status":"firing""#.to_owned(),
        r#"{"version":"3","alerts":[]}"#.to_owned(),
        r#"{"version":4,"alerts":[]}"#.to_owned(),
        r#"{"alerts":[]}"#.to_owned(),
        r#"{"version":"4"}"#.to_owned(),
        r#"{"version":"4","alerts":[{"status":"firing","labels":{"pid":"1"}}]}"#.to_owned(),
        r#"{"version":"4","alerts":[{"status":"exploding","fingerprint":"x"}]}"#.to_owned(),
        r#"{"version":"4","alerts":[{"status":"firing","labels":{"pid":7},"fingerprint":"x"}]}"#.to_owned(),
        "[1,2,3]".to_owned(),
        "\u{0}\u{1}binary".to_owned(),
    ];
    cases[i % cases.len()].clone()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Valid,
    NoToken,
    WrongToken,
    Malformed,
    Oversized,
}

#[test]
fn a_burst_of_1000_posts_leaves_serve_healthy_with_the_right_sessions() {
    if !require(is_root(), "not root: llmprof serve loads eBPF programs")
        || !require(
            trace_processor::available(),
            "Perfetto's trace processor is missing (`cargo xtask setup-tools`)",
        )
    {
        return;
    }
    let targets: Vec<Reaped> = (0..TARGETS)
        .map(|_| {
            Reaped(
                Command::new("sleep")
                    .arg("600")
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("spawn sleep"),
            )
        })
        .collect();
    let pids: Vec<u32> = targets.iter().map(|t| t.0.id()).collect();
    let dir = std::env::temp_dir().join(format!("llmprof-serve-burst-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // The targets are allowed by their executable (exe:), the way an operator names a server binary.
    let sleep_exe = std::fs::read_link(format!("/proc/{}/exe", pids[0])).expect("exe of sleep");
    let allow = format!("exe:{}", sleep_exe.display());
    let srv = Serve::spawn(
        &dir,
        &[
            "--allow-target",
            &allow,
            "--max-sessions",
            &CAP.to_string(),
            "--cooldown",
            "10m",
            "--max-body",
            "64KiB",
        ],
    );

    // 1,000 posts: 100 without a valid token (carrying an alert that must never start), 99 malformed, 1 over
    // the body limit, 800 valid ones cycling over TARGETS live targets and one alert naming no process.
    let mut posts: Vec<(Kind, String)> = Vec::with_capacity(POSTS);
    for i in 0..POSTS {
        let p = match i % 10 {
            0 if i % 20 == 0 => (Kind::NoToken, alert("fp-unauthenticated", pids[0])),
            0 => (Kind::WrongToken, alert("fp-unauthenticated", pids[0])),
            1 if i == 1 => (Kind::Oversized, alert(&"x".repeat(100 << 10), pids[0])),
            1 => (Kind::Malformed, malformed(i / 10)),
            _ => {
                let k = (i / 10 * 8 + i % 10 - 2) % (TARGETS + 1);
                if k == TARGETS {
                    (Kind::Valid, alert("fp-nowhere", NO_PID))
                } else {
                    (Kind::Valid, alert(&format!("fp-{k}"), pids[k]))
                }
            }
        };
        posts.push(p);
    }
    let count = |k: Kind| posts.iter().filter(|p| p.0 == k).count();
    assert_eq!(count(Kind::Valid), 800);
    assert_eq!(count(Kind::NoToken) + count(Kind::WrongToken), 100);
    assert_eq!(count(Kind::Malformed) + count(Kind::Oversized), 100);

    let posts = Arc::new(posts);
    let port = srv.port;
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let posts = posts.clone();
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                for (i, (kind, body)) in posts.iter().enumerate().skip(c).step_by(8) {
                    let auth = match kind {
                        Kind::NoToken => None,
                        Kind::WrongToken => Some("Bearer wrong-token".to_owned()),
                        _ => Some(format!("Bearer {TOKEN}")),
                    };
                    let headers: Vec<(&str, &str)> =
                        auth.iter().map(|a| ("Authorization", a.as_str())).collect();
                    let r = e2e::http::post_json(port, "/v1/alerts", &headers, body)
                        .unwrap_or_else(|e| panic!("post {i} ({kind:?}) got no answer: {e}"));
                    answers.push((i, *kind, r.status, r.text()));
                }
                answers
            })
        })
        .collect();
    let mut answers = Vec::new();
    for c in clients {
        answers.extend(c.join().expect("client thread"));
    }
    assert_eq!(answers.len(), POSTS);
    for (i, kind, status, body) in &answers {
        let want = match kind {
            Kind::Valid => 200,
            Kind::NoToken | Kind::WrongToken => 401,
            Kind::Malformed => 400,
            Kind::Oversized => 413,
        };
        assert_eq!(*status, want, "post {i} ({kind:?}): {body}");
        if *kind == Kind::Malformed {
            let v: Value = serde_json::from_str(body).expect("400 bodies are JSON");
            assert!(
                !v["error"].as_str().unwrap_or("").is_empty(),
                "400 without a reason: {body}"
            );
        }
    }

    // Healthy, and the sessions are exactly what the rules allow. Without the token /healthz says only that.
    let h = srv.healthz();
    assert_eq!(h["status"], "ok");
    assert_eq!(h["sessions_running"], CAP as u64, "{h}");
    let open = e2e::http::get(srv.port, "/healthz").expect("GET /healthz").json();
    assert_eq!(
        open,
        serde_json::json!({"status": "ok"}),
        "no targets or pids without the token"
    );
    let sessions = srv.sessions();
    let running: Vec<&Value> = sessions.iter().filter(|s| s["state"] == "running").collect();
    let failed: Vec<&Value> = sessions.iter().filter(|s| s["state"] == "failed").collect();
    assert_eq!(sessions.len(), CAP + 1, "{sessions:#?}");
    assert_eq!(running.len(), CAP, "the cap holds: {sessions:#?}");
    let mut traced: Vec<u64> = running.iter().filter_map(|s| s["target_pid"].as_u64()).collect();
    traced.sort_unstable();
    traced.dedup();
    assert_eq!(traced.len(), CAP, "one session per target: {sessions:#?}");
    assert_eq!(failed.len(), 1, "{sessions:#?}");
    assert_eq!(failed[0]["fingerprint"], "fp-nowhere");
    assert!(
        failed[0]["reason"]
            .as_str()
            .unwrap_or("")
            .contains(&NO_PID.to_string()),
        "the failure says why: {:#}",
        failed[0]
    );
    assert!(
        sessions.iter().all(|s| s["fingerprint"] != "fp-unauthenticated"),
        "an unauthenticated post started a session"
    );

    // The counters agree: each valid alert was started once, failed once, deduped or capped.
    let m = srv.metrics();
    let per_alert = 800.0 / (TARGETS + 1) as f64;
    assert_eq!(
        counter(&m, "llmprof_serve_webhooks_total{code=\"200\"}"),
        800.0,
        "{m}"
    );
    assert_eq!(
        counter(&m, "llmprof_serve_webhooks_total{code=\"401\"}"),
        100.0,
        "{m}"
    );
    assert_eq!(
        counter(&m, "llmprof_serve_webhooks_total{code=\"400\"}"),
        99.0,
        "{m}"
    );
    assert_eq!(
        counter(&m, "llmprof_serve_webhooks_total{code=\"413\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(
        counter(&m, "llmprof_serve_sessions_started_total"),
        CAP as f64,
        "{m}"
    );
    assert_eq!(counter(&m, "llmprof_serve_sessions_failed_total"), 1.0, "{m}");
    assert_eq!(
        counter(&m, "llmprof_serve_alerts_skipped_total{reason=\"cap\"}"),
        per_alert,
        "the alert over the cap, on each of its posts: {m}"
    );
    assert_eq!(
        counter(&m, "llmprof_serve_sessions_deduped_total"),
        800.0 - CAP as f64 - 1.0 - per_alert,
        "{m}"
    );
    assert_eq!(counter(&m, "llmprof_serve_sessions_running"), CAP as f64, "{m}");

    // SIGTERM: the running sessions stop and their traces are finished, not cut.
    assert!(srv.stop().success(), "llmprof serve exits cleanly on SIGTERM");
    let traces: Vec<_> = std::fs::read_dir(dir.join("traces"))
        .expect("traces dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(traces.len(), CAP, "{traces:?}");
    for t in &traces {
        let mut tp = trace_processor::load(t).expect("trace processor loads the trace");
        assert_eq!(
            tp.import_errors().expect("stats"),
            Vec::<Value>::new(),
            "{}",
            t.display()
        );
        let summary = tp.query(&end_reason_sql()).expect("summary");
        assert_eq!(
            summary.len(),
            1,
            "finished trace has its summary: {}",
            t.display()
        );
        assert_eq!(summary[0]["r"], "llmprof serve stopped", "{}", t.display());
        let alerts = tp
            .query_i64(&format!(
                "select count(*) from slice where name = '{}'",
                marker::alert_fired("Burst")
            ))
            .expect("alert instant");
        assert_eq!(alerts, 1, "{}", t.display());
    }
    drop(targets);
    std::thread::sleep(Duration::from_millis(10));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_resolved_alert_ends_its_session_early_with_a_finished_trace() {
    if !require(is_root(), "not root: llmprof serve loads eBPF programs")
        || !require(
            trace_processor::available(),
            "Perfetto's trace processor is missing (`cargo xtask setup-tools`)",
        )
    {
        return;
    }
    let target = Reaped(
        Command::new("sleep")
            .arg("600")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn sleep"),
    );
    let pid = target.0.id();
    let dir = std::env::temp_dir().join(format!("llmprof-serve-resolved-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let srv = Serve::spawn(&dir, &["--allow-target", &format!("pid:{pid}")]);
    let body = |status: &str| {
        format!(
            r#"{{"version":"4","status":"{status}","alerts":[{{"status":"{status}","labels":{{"alertname":"Flap","pid":"{pid}"}},"annotations":{{"llmprof_duration":"5m"}},"fingerprint":"fp-flap"}}]}}"#
        )
    };
    let r = srv.post_alerts(&body("firing"), Some(TOKEN));
    assert_eq!(r.status, 200, "{}", r.text());
    let running = srv.wait_session(Duration::from_secs(30), "running", |s| s["state"] == "running");
    // While it runs, the trace cannot be downloaded yet.
    let id = running["id"].as_u64().expect("id");
    assert_eq!(srv.download(&format!("/v1/sessions/{id}/trace")).0, 409);
    std::thread::sleep(Duration::from_secs(1));
    let r = srv.post_alerts(&body("resolved"), Some(TOKEN));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("\"stopped\""), "{}", r.text());
    let done = srv.wait_session(Duration::from_secs(30), "ended by the resolved alert", |s| {
        s["state"] != "running"
    });
    assert_eq!(done["state"], "finished", "{done:#}");
    assert_eq!(done["end_reason"], "alert resolved", "{done:#}");
    let (status, bytes) = srv.download(&format!("/v1/sessions/{id}/trace"));
    assert_eq!(status, 200);
    assert!(!bytes.is_empty());
    // The trace says the same as the API: what stopped it, not a bare "interrupted".
    let mut tp = trace_processor::load(done["trace"].as_str().expect("trace path")).expect("trace loads");
    let summary = tp.query(&end_reason_sql()).expect("summary");
    assert_eq!(summary.len(), 1, "{summary:?}");
    assert_eq!(summary[0]["r"], "alert resolved", "{summary:?}");
    let m = srv.metrics();
    assert_eq!(
        counter(&m, "llmprof_serve_sessions_resolved_early_total"),
        1.0,
        "{m}"
    );
    assert!(srv.stop().success());
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
}
