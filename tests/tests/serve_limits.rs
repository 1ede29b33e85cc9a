//! `llmprof serve` against clients that hold connections or flood it, without the token (any pod can reach the
//! DaemonSet's node address): the real binary on loopback, the "attackers" on another loopback address
//! (127.0.0.2), Alertmanager's and the liveness probe's side on 127.0.0.1.
//! - hundreds of half-open connections and unfinished request heads: `/healthz` still answers; a head never
//!   finished is cut at serve's header deadline; connections over the per-address cap are closed at once;
//! - dozens of TLS connections that never start their handshake: HTTPS still answers;
//! - a webhook of 9,000 alerts: answered, at most 500 handled, the rest counted and reported, a handful of log
//!   lines instead of one per alert.
//!
//! The waits below are hang detectors (a minute or two on a 10 s deadline), not timing assertions.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::FromRawFd;
use std::time::{Duration, Instant};

use e2e::serve::{Serve, TOKEN};
use e2e::{is_root, require};

/// A TCP connection to 127.0.0.1:`port` from 127.0.0.2 (another client address on the same host).
fn connect_from_other_address(port: u16) -> std::io::Result<TcpStream> {
    let addr = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: socket/bind/connect with valid sockaddr_in values and their length; the descriptor is handed
    // to a TcpStream that owns it from then on (or closed on error).
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        let local = addr([127, 0, 0, 2], 0);
        if libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let remote = addr([127, 0, 0, 1], port);
        if libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}

fn preconditions() -> bool {
    require(is_root(), "not root: llmprof serve needs root")
}

fn metric(srv: &Serve, name: &str) -> u64 {
    srv.metrics()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn half_open_connections_and_unfinished_heads_cannot_starve_healthz() {
    if !preconditions() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("llmprof-serve-limits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let srv = Serve::spawn(&dir, &[]);
    // 300 connections from one address: half send an unfinished head, half nothing at all.
    let mut held = Vec::new();
    for i in 0..300 {
        let Ok(mut c) = connect_from_other_address(srv.port) else {
            continue;
        };
        if i % 2 == 0 {
            let _ = c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n");
        }
        held.push(c);
    }
    // The probe's side still gets its answer.
    let t0 = Instant::now();
    let r = e2e::http::request(srv.port, "GET", "/healthz", &[], None).expect("/healthz answers");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(t0.elapsed() < Duration::from_secs(60), "healthz hung");
    // Over the per-address cap: closed at once, counted.
    assert!(metric(&srv, "llmprof_serve_connections_refused_total") >= 200);
    // An unfinished head is cut at the header deadline: the held connections all end.
    let t0 = Instant::now();
    for c in &mut held {
        c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut buf = [0u8; 256];
        loop {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }
    assert!(
        t0.elapsed() < Duration::from_secs(120),
        "connections held past the deadlines"
    );
    assert!(metric(&srv, "llmprof_serve_connections_timed_out_total") >= 32);
    let r = srv.get("/v1/sessions");
    assert_eq!(r.status, 200);
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tls_connections_that_never_handshake_cannot_starve_https() {
    if !preconditions() || !e2e::serve::tls_tools() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("llmprof-serve-limits-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let srv = Serve::spawn_tls(&dir, &[]);
    let held: Vec<TcpStream> = (0..100)
        .filter_map(|_| connect_from_other_address(srv.port).ok())
        .collect();
    assert!(held.len() >= 64);
    let r = srv.get("/healthz");
    assert_eq!(r.status, 200, "{}", r.text());
    drop(held);
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_webhook_of_9000_alerts_is_capped_counted_and_quiet() {
    if !preconditions() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("llmprof-serve-limits-storm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let srv = Serve::spawn(&dir, &["--max-body", "4MiB"]);
    let alerts: Vec<String> = (0..9000)
        .map(|i| {
            format!(
                r#"{{"status":"firing","labels":{{"alertname":"Storm","instance":"203.0.113.{}:{}"}},"annotations":{{}},"startsAt":"2026-01-01T00:00:00Z","endsAt":"0001-01-01T00:00:00Z","generatorURL":"","fingerprint":"fp{i}"}}"#,
                i % 250,
                8000 + i / 250
            )
        })
        .collect();
    let body = format!(
        r#"{{"version":"4","groupKey":"g","truncatedAlerts":0,"status":"firing","receiver":"llmprof","groupLabels":{{}},"commonLabels":{{}},"commonAnnotations":{{}},"externalURL":"","alerts":[{}]}}"#,
        alerts.join(",")
    );
    let before = srv.stderr_lines().len();
    let t0 = Instant::now();
    let r = srv.post_alerts(&body, Some(TOKEN));
    assert!(
        t0.elapsed() < Duration::from_secs(100),
        "a storm took {:?}",
        t0.elapsed()
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["alerts"].as_array().map(Vec::len), Some(500));
    assert_eq!(v["not_handled"], 8500);
    assert_eq!(metric(&srv, "llmprof_serve_alerts_over_cap_total"), 8500);
    // Every handled alert names a remote host: a failed session each, said in a few lines.
    std::thread::sleep(Duration::from_millis(500));
    let lines = srv.stderr_lines().len() - before;
    assert!(lines <= 40, "{lines} log lines for one webhook");
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}
