//! What an alert may trace, against a real `llmprof serve` as root: only what the
//! operator allowed; pid 1, serve itself, a process outside the allow-list and an `instance` on another host
//! are refused with the reason in the sessions list, and nothing is traced for them.

use std::process::{Command, Stdio};
use std::time::Duration;

use e2e::serve::{Serve, TOKEN, counter};
use e2e::testee::Reaped;
use e2e::{is_root, require};
use serde_json::Value;

fn sleeper() -> Reaped {
    Reaped(
        Command::new("sleep")
            .arg("600")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn sleep"),
    )
}

fn alert(fingerprint: &str, label: &str, value: &str) -> String {
    format!(
        r#"{{"version":"4","status":"firing","alerts":[{{"status":"firing","labels":{{"alertname":"Allow","{label}":"{value}"}},"annotations":{{"llmprof_duration":"3s"}},"fingerprint":"{fingerprint}"}}]}}"#
    )
}

fn session_of<'a>(sessions: &'a [Value], fingerprint: &str) -> &'a Value {
    sessions
        .iter()
        .find(|s| s["fingerprint"] == fingerprint)
        .unwrap_or_else(|| panic!("no session for {fingerprint}: {sessions:#?}"))
}

#[test]
fn alerts_trace_only_what_the_operator_allowed() {
    if !require(is_root(), "not root: llmprof serve loads eBPF programs") {
        return;
    }
    let allowed = sleeper();
    let other = sleeper();
    let dir = std::env::temp_dir().join(format!("llmprof-serve-allow-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rule = format!("pid:{}", allowed.0.id());
    let srv = Serve::spawn(&dir, &["--allow-target", &rule, "--cooldown", "0s"]);
    let cases = [
        ("fp-allowed", "pid", allowed.0.id().to_string()),
        ("fp-init", "pid", "1".to_owned()),
        ("fp-serve", "pid", srv.pid().to_string()),
        ("fp-other", "pid", other.0.id().to_string()),
        // serve's own port, on loopback: it resolves to serve itself, which is never traced.
        ("fp-own-port", "instance", format!("127.0.0.1:{}", srv.port)),
        // The same port on another host (TEST-NET-3) is not a local process at all.
        ("fp-remote", "instance", format!("203.0.113.7:{}", srv.port)),
    ];
    for (fp, label, value) in &cases {
        let r = srv.post_alerts(&alert(fp, label, value), Some(TOKEN));
        assert_eq!(r.status, 200, "{fp}: {}", r.text());
    }
    let sessions = srv.wait_session(Duration::from_secs(30), "the allowed session ends", |s| {
        s["fingerprint"] == "fp-allowed" && s["state"] == "finished"
    });
    assert_eq!(sessions["target_pid"], allowed.0.id(), "{sessions:#}");
    let all = srv.sessions();
    let reason = |fp: &str| {
        let s = session_of(&all, fp);
        assert_eq!(s["state"], "failed", "{fp} must not be traced: {s:#}");
        assert!(s["trace"].is_null(), "{fp}: no trace for a refused alert: {s:#}");
        s["reason"].as_str().unwrap_or_default().to_owned()
    };
    assert!(
        reason("fp-init").contains("pid 1 (init)"),
        "{}",
        reason("fp-init")
    );
    assert!(
        reason("fp-serve").contains("llmprof serve itself"),
        "{}",
        reason("fp-serve")
    );
    let r = reason("fp-other");
    assert!(
        r.contains("not allowed") && r.contains(&other.0.id().to_string()) && r.contains(&rule),
        "the reason names the process and the rules: {r}"
    );
    assert!(
        reason("fp-own-port").contains("llmprof serve itself"),
        "{}",
        reason("fp-own-port")
    );
    let r = reason("fp-remote");
    assert!(
        r.contains("203.0.113.7") && r.contains("not an address of this host"),
        "{r}"
    );
    // The refusals are counted.
    let metrics = srv.metrics();
    let refused = counter(&metrics, "llmprof_serve_sessions_refused_total");
    assert_eq!(refused, 4.0, "{metrics}");
    // Only the allowed session wrote a trace.
    let traces: Vec<_> = std::fs::read_dir(&srv.out_dir)
        .expect("out dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".perfetto-trace"))
        .collect();
    assert_eq!(traces.len(), 1, "{traces:?}");
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}
