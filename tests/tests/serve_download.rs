//! `llmprof serve`'s resources under load, against the real binary as root:
//! `/healthz` keeps answering while a webhook's alerts walk /proc, and four concurrent downloads of a 256 MiB
//! trace keep serve's resident memory under 200 MiB (downloads are streamed from disk). One test in its own
//! binary, so no other test of this crate competes for the two CPUs while it measures.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use e2e::serve::{Serve, TOKEN};
use e2e::testee::Reaped;
use e2e::{is_root, require};

/// Size the finished trace is grown to before the downloads.
const TRACE_BYTES: u64 = 256 << 20;
/// serve's resident memory must stay under this while the downloads run.
const RSS_LIMIT: u64 = 200 << 20;
/// How fast /healthz must answer while alerts are being resolved.
const HEALTHZ_LIMIT: Duration = Duration::from_millis(100);

fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb << 10)
}

#[test]
fn healthz_stays_fast_and_downloads_stay_small() {
    if !require(is_root(), "not root: llmprof serve loads eBPF programs")
        || !require(
            e2e::serve::have("curl"),
            "curl is needed (`cargo xtask setup-tools`)",
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
    let dir = std::env::temp_dir().join(format!("llmprof-serve-download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let allow = format!("pid:{pid}");
    let srv = Serve::spawn(&dir, &["--allow-target", &allow, "--max-disk", "2GiB"]);

    // 1. A webhook of 60 alerts naming instances: each is resolved by a /proc walk over every network namespace
    // on serve's blocking pool, while /healthz (with the token: it reads the manager) is polled.
    let alerts: Vec<String> = (0..60)
        .map(|i| {
            format!(
                r#"{{"status":"firing","labels":{{"alertname":"Walk","instance":"127.0.0.1:{}"}},"fingerprint":"walk-{i}"}}"#,
                1 + i
            )
        })
        .collect();
    let body = format!(
        r#"{{"version":"4","status":"firing","alerts":[{}]}}"#,
        alerts.join(",")
    );
    let port = srv.port;
    let poster = std::thread::spawn(move || {
        let h = format!("Bearer {TOKEN}");
        e2e::http::post_json(port, "/v1/alerts", &[("Authorization", &h)], &body).expect("POST")
    });
    let mut latencies = Vec::new();
    while !poster.is_finished() || latencies.is_empty() {
        let t = Instant::now();
        let h = srv.healthz();
        latencies.push(t.elapsed());
        assert_eq!(h["status"], "ok");
        std::thread::sleep(Duration::from_millis(5));
    }
    let posted = poster.join().expect("poster");
    assert_eq!(posted.status, 200, "{}", posted.text());
    latencies.sort();
    let max = latencies[latencies.len() - 1];
    eprintln!(
        "healthz during the walks: {} polls, median {:?}, max {max:?}",
        latencies.len(),
        latencies[latencies.len() / 2]
    );
    assert!(
        max < HEALTHZ_LIMIT,
        "/healthz took {max:?} while alerts were resolved"
    );

    // 2. A finished session, its trace grown to 256 MiB, downloaded four times at once.
    let alert = format!(
        r#"{{"version":"4","status":"firing","alerts":[{{"status":"firing","labels":{{"alertname":"Big","pid":"{pid}"}},"annotations":{{"llmprof_duration":"2s"}},"fingerprint":"big"}}]}}"#
    );
    assert_eq!(srv.post_alerts(&alert, Some(TOKEN)).status, 200);
    let done = srv.wait_session(Duration::from_secs(60), "finished", |s| {
        s["fingerprint"] == "big" && s["state"] == "finished"
    });
    let id = done["id"].as_u64().expect("id");
    let trace = done["trace"].as_str().expect("trace path").to_owned();
    // The content does not matter to the download path: a sparse tail avoids writing 256 MiB here.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&trace)
        .and_then(|f| f.set_len(TRACE_BYTES))
        .expect("grow the trace");
    let before = rss_bytes(srv.pid());
    let url = format!("http://127.0.0.1:{}/v1/sessions/{id}/trace", srv.port);
    let curls: Vec<Child> = (0..4)
        .map(|_| {
            Command::new("curl")
                .args([
                    "-sS",
                    "--limit-rate",
                    "200M",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code} %{size_download}",
                ])
                .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
                .arg(&url)
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn curl")
        })
        .collect();
    let mut peak = before;
    let serve_pid = srv.pid();
    let sampler_stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = sampler_stop.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_bytes(serve_pid));
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        })
    };
    for c in curls {
        let out = c.wait_with_output().expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(text, format!("200 {TRACE_BYTES}"), "each download is whole");
    }
    sampler_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    peak = peak.max(sampler.join().expect("sampler"));
    eprintln!(
        "serve RSS: {} MiB before the downloads, peak {} MiB during 4 × {} MiB",
        before >> 20,
        peak >> 20,
        TRACE_BYTES >> 20
    );
    assert!(peak < RSS_LIMIT, "serve's RSS reached {} MiB", peak >> 20);
    drop(srv);
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
}
