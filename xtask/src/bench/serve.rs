//! `cargo xtask bench serve` (owner: engine serving): the engine's decode throughput with `llmprof serve
//! --flight-recorder 30s` recording it vs without, A/B interleaved on one engine process, and the recorder's
//! ring (events, bytes) after each round.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::common::{AB_ROUNDS, AbSetup, ab_setup, stop_llmprof};
use super::load::{EngineArgs, level};
use super::stats::pct;

/// `cargo xtask bench serve`.
pub(super) fn run(o: &EngineArgs) -> Result<()> {
    let AbSetup {
        release,
        mut server,
        port,
        c,
        n_req,
    } = ab_setup(o, "serve")?;
    let out = std::env::temp_dir().join("llmprof-bench-serve");
    let (mut off, mut on, mut ring_events, mut ring_bytes) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..AB_ROUNDS {
        for recording in if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        } {
            let daemon = if recording {
                Some(start_serve(&release.join("llmprof"), server.child.id(), &out)?)
            } else {
                None
            };
            let row = level(port, c, n_req, o.max_tokens)?;
            eprintln!(
                "bench: round {round} flight recorder {}: {:.1} tok/s",
                if recording { "on" } else { "off" },
                row.tokens_per_s
            );
            if let Some((child, api)) = daemon {
                let health = http_get(api, "/healthz").unwrap_or_default();
                let field = |name: &str| -> f64 {
                    health
                        .split(&format!("\"{name}\":"))
                        .nth(1)
                        .and_then(|r| r.split([',', '}']).next())
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0.0)
                };
                ring_events.push(field("events"));
                ring_bytes.push(field("bytes"));
                stop_llmprof(child)?;
                on.push(row.tokens_per_s);
            } else {
                off.push(row.tokens_per_s);
            }
        }
    }
    let _ = server.child.kill();
    let _ = server.child.wait();
    let _ = std::fs::remove_dir_all(&out);
    let (m_off, m_on) = (pct(&mut off, 0.5), pct(&mut on, 0.5));
    println!();
    println!(
        "llmserve at concurrency {c}, {n_req} requests x {} tokens per round, {AB_ROUNDS} rounds A/B interleaved",
        o.max_tokens
    );
    println!("  recorder off: decode {m_off:.1} tok/s (rounds {off:.1?})");
    println!("  recorder on:  decode {m_on:.1} tok/s (rounds {on:.1?})");
    println!(
        "  on / off (medians): {:.4} ({:+.2}%)",
        m_on / m_off,
        (m_on / m_off - 1.0) * 100.0
    );
    println!(
        "  ring after a round: {:.0} events, {:.2} MiB (median)",
        pct(&mut ring_events, 0.5),
        pct(&mut ring_bytes, 0.5) / (1 << 20) as f64
    );
    Ok(())
}

/// The bench's serve token (serve needs one; `http_get` sends it).
const TOKEN: &str = "bench-0123456789abcdef";

/// Starts `llmprof serve --watch pid:PID --flight-recorder 30s` and waits until its recorder records.
fn start_serve(llmprof: &Path, pid: u32, out: &Path) -> Result<(Child, u16)> {
    use std::os::unix::fs::PermissionsExt;
    let token = std::env::temp_dir().join("llmprof-bench-serve.token");
    std::fs::write(&token, TOKEN)?;
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600))?;
    let mut child = Command::new(llmprof)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--flight-recorder",
            "30s",
            "--watch",
        ])
        .arg(format!("pid:{pid}"))
        .arg("--token-file")
        .arg(&token)
        .arg("--out-dir")
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting llmprof serve")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(p) = line.split("listening on http://127.0.0.1:").nth(1) {
                let _ = tx.send(
                    p.split(' ')
                        .next()
                        .and_then(|p| p.parse::<u16>().ok())
                        .unwrap_or(0),
                );
            }
        }
    });
    let Ok(api) = rx.recv_timeout(Duration::from_secs(60)) else {
        let _ = child.kill();
        bail!("llmprof serve did not report `listening on` within 60 s");
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !http_get(api, "/healthz").is_some_and(|h| h.contains("\"recording\"")) {
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("the flight recorder did not start within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok((child, api))
}

/// One GET on loopback; the body.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n").as_bytes(),
    )
    .ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut s, &mut text).ok()?;
    text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
}
