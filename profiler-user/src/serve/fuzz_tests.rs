//! Property test of the webhook's input handling: thousands of generated bodies (valid JSON with odd values,
//! wrong types, huge numbers, long, unicode and hostile labels, truncated or corrupted bytes) go through the
//! payload parser, the annotation check and the manager's admission rules; every one must be answered 200 or
//! 400 (with a reason), none may panic.
//!
//! The manager runs with `max_sessions = 0`: admission goes through dedupe, target resolution, the duration
//! and the cooldown, then stops at the cap, so no capture is ever started on a generated pid.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::http::{App, handle_body};
use super::manager::Manager;
use super::metrics::Metrics;
use super::{ServeOptions, tests::config};

/// Bodies generated per run (deterministic: the same seed every run, so a failure reproduces).
const CASES: usize = 4000;

/// xorshift64*: small, deterministic, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Strings a label, annotation or fingerprint may hold, odd ones first.
fn odd_string(r: &mut Rng) -> String {
    const FIXED: &[&str] = &[
        "",
        " ",
        "0",
        "1",
        "-1",
        "4294967295",
        "4294967296",
        "18446744073709551616",
        "100000000000000000000",
        "1e9",
        "NaN",
        "inf",
        " 12 ",
        "\u{0}",
        "\u{202e}gnp.exe",
        "ñ😀\u{fffd}",
        "../../etc/passwd",
        "/proc/self/mem",
        ":::",
        "[::1]:",
        "[::1]",
        "host:65536",
        "host:0",
        "host:-1",
        "http://x:8000/metrics",
        "localhost:1",
        "%s%n%x",
        "'; DROP TABLE alerts; --",
        "\r\nSet-Cookie: x",
    ];
    match r.below(4) {
        0 => "A".repeat(r.below(20_000)),
        1 => (0..r.below(64))
            .map(|_| char::from_u32(r.below(0x11_0000) as u32).unwrap_or('\u{fffd}'))
            .collect(),
        _ => (*r.pick(FIXED)).to_owned(),
    }
}

fn odd_duration(r: &mut Rng) -> String {
    const FIXED: &[&str] = &[
        "30s",
        "100000000000000000000",
        "18446744073709551615s",
        "18446744073709551616s",
        "9999999999999999h",
        "1e400",
        "NaN",
        "-5s",
        "0",
        "0s",
        "1.5h",
        ".5",
        "0.00000000000000000000000001s",
        "5 parsecs",
        "1.2.3s",
        "+5s",
        "250 µs",
    ];
    if r.chance(4) {
        odd_string(r)
    } else {
        (*r.pick(FIXED)).to_owned()
    }
}

/// A JSON value of any type, for fields given the wrong one.
fn wrong_type(r: &mut Rng) -> Value {
    match r.below(7) {
        0 => Value::Null,
        1 => json!(true),
        2 => json!(u64::MAX),
        3 => json!(-1.5e300),
        4 => json!([1, "two", null]),
        5 => json!({"nested": {"deeper": [odd_string(r)]}}),
        _ => json!(odd_string(r)),
    }
}

fn map(r: &mut Rng, keys: &[&str], duration: bool) -> Value {
    let mut m = serde_json::Map::new();
    for _ in 0..r.below(6) {
        let key = if r.chance(3) {
            odd_string(r)
        } else {
            (*r.pick(keys)).to_owned()
        };
        let value = if duration && key == "llmprof_duration" {
            json!(odd_duration(r))
        } else if r.chance(20) {
            wrong_type(r)
        } else {
            json!(odd_string(r))
        };
        m.insert(key, value);
    }
    Value::Object(m)
}

fn alert(r: &mut Rng) -> Value {
    let mut a = json!({
        "status": *r.pick(&["firing", "firing", "resolved"]),
        "labels": map(r, &["alertname", "pid", "job", "severity"], false),
        "annotations": map(r, &["llmprof_duration", "summary"], true),
        "startsAt": "2026-11-26T01:00:00.000Z",
        "fingerprint": format!("{:x}", r.next() % 64),
    });
    // `instance` makes the manager walk /proc: rare, to keep the run short.
    if r.chance(40)
        && let Some(l) = a["labels"].as_object_mut()
    {
        l.insert("instance".into(), json!(odd_string(r)));
    }
    if r.chance(10) {
        let field = *r.pick(&[
            "status",
            "labels",
            "annotations",
            "fingerprint",
            "startsAt",
            "generatorURL",
        ]);
        a[field] = wrong_type(r);
    }
    a
}

fn payload(r: &mut Rng) -> Value {
    let alerts: Vec<Value> = (0..r.below(5)).map(|_| alert(r)).collect();
    let mut p = json!({
        "version": "4",
        "receiver": "llmprof",
        "status": "firing",
        "groupKey": odd_string(r),
        "truncatedAlerts": 0,
        "externalURL": "http://am:9093",
        "alerts": alerts,
    });
    if r.chance(15) {
        let field = *r.pick(&["version", "alerts", "truncatedAlerts", "receiver", "status"]);
        p[field] = wrong_type(r);
    }
    p
}

/// A body: the payload's JSON, sometimes cut or corrupted.
fn body(r: &mut Rng) -> Vec<u8> {
    let mut b = serde_json::to_vec(&payload(r)).unwrap_or_default();
    match r.below(8) {
        0 => b.truncate(r.below(b.len() + 1)),
        1 => {
            for _ in 0..=r.below(4) {
                let i = r.below(b.len());
                if let Some(x) = b.get_mut(i) {
                    *x = r.next() as u8;
                }
            }
        }
        2 => {
            let i = r.below(b.len() + 1);
            let junk: Vec<u8> = (0..r.below(16)).map(|_| r.next() as u8).collect();
            b.splice(i..i, junk);
        }
        _ => {}
    }
    b
}

/// serve's app with its output in `dir` and a session cap of 0: every alert goes through the rules, none is traced.
fn app_that_traces_nothing(dir: &std::path::Path) -> Arc<App> {
    let mut opts = ServeOptions::from_config(super::ServeConfig {
        out_dir: dir.to_path_buf(),
        ..config()
    })
    .unwrap_or_else(|e| panic!("config: {e}"));
    opts.manager.max_sessions = 0;
    let metrics = Arc::new(Metrics::default());
    Arc::new(App {
        manager: Arc::new(Manager::new(opts.manager, Vec::new(), metrics.clone())),
        metrics,
        token: None,
        max_body: 1 << 20,
    })
}

#[test]
fn no_webhook_body_makes_serve_panic_or_answer_other_than_2xx_or_4xx() {
    let dir = std::env::temp_dir().join(format!("llmprof-fuzz-{}", std::process::id()));
    let app = app_that_traces_nothing(&dir);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut ok, mut bad) = (0, 0);
    for case in 0..CASES {
        let b = body(&mut r);
        let resp = rt.block_on(handle_body(&app, &b));
        let status = resp.status();
        let text = rt
            .block_on(axum::body::to_bytes(resp.into_body(), usize::MAX))
            .unwrap_or_else(|e| panic!("case {case}: body: {e}"));
        let v: Value = serde_json::from_slice(&text)
            .unwrap_or_else(|e| panic!("case {case}: answer is not JSON ({e}): {text:?}"));
        match status {
            StatusCode::OK => {
                ok += 1;
                assert!(v["alerts"].is_array(), "case {case}: {v}");
            }
            StatusCode::BAD_REQUEST => {
                bad += 1;
                let reason = v["error"].as_str().unwrap_or_default();
                assert!(!reason.is_empty(), "case {case}: a 400 without a reason: {v}");
            }
            other => panic!(
                "case {case}: {other} for {:?}: {v}",
                String::from_utf8_lossy(&b[..b.len().min(300)])
            ),
        }
    }
    // The generator reaches both answers, and the manager's paths (it records failed sessions).
    assert!(ok > CASES / 10 && bad > CASES / 10, "200: {ok}, 400: {bad}");
    assert!(!app.manager.sessions().is_empty());
    assert_eq!(app.manager.running(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_huge_duration_is_a_400_with_the_reason_and_the_other_alerts_are_handled() {
    let dir = std::env::temp_dir().join(format!("llmprof-huge-{}", std::process::id()));
    let app = app_that_traces_nothing(&dir);
    let body = r#"{"version":"4","alerts":[
        {"status":"firing","fingerprint":"huge","labels":{"alertname":"Big","pid":"1"},
         "annotations":{"llmprof_duration":"100000000000000000000"}},
        {"status":"firing","fingerprint":"other","labels":{"alertname":"NoSuchPid","pid":"1073741823"}}]}"#;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let resp = rt.block_on(handle_body(&app, body.as_bytes()));
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let bytes = rt
        .block_on(axum::body::to_bytes(resp.into_body(), usize::MAX))
        .unwrap_or_else(|e| panic!("body: {e}"));
    let v: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("JSON: {e}"));
    let reason = v["error"].as_str().unwrap_or_default();
    assert!(
        reason.contains("alert 0 (Big, fingerprint huge)")
            && reason.contains("annotation llmprof_duration: duration too large"),
        "{reason}"
    );
    assert_eq!(v["alerts"][0]["outcome"], "rejected", "{v}");
    // The other alert of the payload was handled (a failed session: no such process).
    assert_eq!(v["alerts"][1]["outcome"], "failed", "{v}");
    let sessions = app.manager.sessions();
    assert_eq!(sessions.len(), 1, "the rejected alert leaves no session");
    assert_eq!(sessions[0].fingerprint, "other");
    let _ = std::fs::remove_dir_all(&dir);
}
