//! The disk quota of `llmprof serve --max-disk`: sessions one after another on a busy process fill the output
//! directory past the quota; after every session the traces fit it, the oldest were removed first (a trace left
//! by an earlier run included), the one being written never was, a non-trace file is never touched, and the
//! API says which traces are gone (410 on download).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::serve::{Serve, TOKEN, counter};
use e2e::testee::Reaped;
use e2e::{is_root, require};
use serde_json::Value;

/// `--max-disk`: two to four traces of [`SESSION`] on the busy target (~210 KB each here: its ~1,000 context
/// switches a second are in them as thread states), so that five never fit whatever the size in 150–300 KB.
const QUOTA: u64 = 600 << 10;
/// Sessions in a row.
const SESSIONS: usize = 5;
/// Each session's `llmprof_duration`.
const SESSION: &str = "2s";

fn trace_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("traces dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".perfetto-trace"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

#[test]
fn the_disk_quota_removes_the_oldest_finished_traces_first() {
    if !require(is_root(), "not root: llmprof serve loads eBPF programs") {
        return;
    }
    // A busy target: ~500 sleeps of 2 ms per second, each a slow syscall in the trace.
    let target = Reaped(
        Command::new(e2e::python3())
            .args(["-c", "import time\nwhile True: time.sleep(0.002)"])
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn python3"),
    );
    let pid = target.0.id();
    let dir = std::env::temp_dir().join(format!("llmprof-serve-quota-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let traces = dir.join("traces");
    std::fs::create_dir_all(&traces).expect("traces dir");
    // Left by an earlier run: an old trace (oldest of all) and a file that is not a trace.
    let old = traces.join("Old-20260101-000000-1.perfetto-trace");
    std::fs::write(&old, vec![0u8; 400 << 10]).expect("old trace");
    let notes = traces.join("notes.txt");
    std::fs::write(&notes, "not a trace").expect("notes");
    std::thread::sleep(Duration::from_millis(20));
    let quota = QUOTA.to_string();
    let allow = format!("pid:{pid}");
    let srv = Serve::spawn(
        &dir,
        &["--allow-target", &allow, "--max-disk", &quota, "--cooldown", "0s"],
    );
    assert_eq!(srv.out_dir, traces);

    let mut paths: Vec<String> = Vec::new();
    for i in 0..SESSIONS {
        let body = format!(
            r#"{{"version":"4","status":"firing","alerts":[{{"status":"firing","labels":{{"alertname":"DiskQuota","pid":"{pid}"}},"annotations":{{"llmprof_duration":"{SESSION}"}},"fingerprint":"quota-{i}"}}]}}"#
        );
        let r = srv.post_alerts(&body, Some(TOKEN));
        assert_eq!(r.status, 200, "{}", r.text());
        let v: Value = serde_json::from_slice(&r.body).expect("JSON");
        assert_eq!(v["alerts"][0]["outcome"], "started", "{v}");
        let id = v["alerts"][0]["session"].as_u64().expect("id");
        let path = v["alerts"][0]["trace"].as_str().expect("trace").to_owned();
        // While it runs, its trace is never the one removed, whatever the total.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = srv.get(&format!("/v1/sessions/{id}"));
            let s: Value = serde_json::from_slice(&s.body).expect("session JSON");
            if s["state"] != "running" {
                assert_eq!(s["state"], "finished", "{s:#}");
                break;
            }
            if std::path::Path::new(&path).exists() {
                assert!(!s["trace_removed"].as_bool().unwrap_or(true), "{s:#}");
            }
            assert!(Instant::now() < deadline, "session {id} still running after 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        // The quota is applied when a session ends.
        let total = trace_bytes(&traces);
        assert!(
            total <= QUOTA,
            "after session {i}: {total} bytes of traces > quota {QUOTA}"
        );
        assert!(
            std::path::Path::new(&path).exists(),
            "the newest trace was removed: {path}"
        );
        paths.push(path);
        // Oldest first: the traces still there are the newest ones.
        let kept: Vec<bool> = paths.iter().map(|p| std::path::Path::new(p).exists()).collect();
        let first_kept = kept.iter().position(|k| *k).unwrap_or(kept.len());
        assert!(
            kept[first_kept..].iter().all(|k| *k),
            "a newer trace went before an older one: {kept:?}"
        );
    }
    assert!(!old.exists(), "the oldest trace (from an earlier run) goes first");
    assert!(notes.exists(), "files that are not traces are never removed");
    let removed: Vec<usize> = (0..SESSIONS)
        .filter(|&i| !std::path::Path::new(&paths[i]).exists())
        .collect();
    assert!(
        !removed.is_empty(),
        "{SESSIONS} sessions should not fit in {QUOTA} bytes"
    );

    // The API says which are gone, and serves the rest.
    let sessions = srv.sessions();
    for (i, s) in sessions.iter().enumerate() {
        let id = s["id"].as_u64().expect("id");
        let gone = removed.contains(&i);
        assert_eq!(s["trace_removed"], gone, "{s:#}");
        let (status, body) = srv.download(&format!("/v1/sessions/{id}/trace"));
        if gone {
            assert_eq!(status, 410, "{}", String::from_utf8_lossy(&body));
        } else {
            assert_eq!(status, 200);
            assert_eq!(body.len() as u64, s["bytes"].as_u64().unwrap_or(0), "{s:#}");
        }
    }
    let m = srv.metrics();
    assert_eq!(
        counter(&m, "llmprof_serve_traces_removed_total"),
        (removed.len() + 1) as f64,
        "{m}"
    );
    assert!(counter(&m, "llmprof_serve_disk_bytes") <= QUOTA as f64, "{m}");
    assert!(srv.stop().success());
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
}
