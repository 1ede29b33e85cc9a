//! Benchmarks (owner: engine serving).
//!
//! `cargo xtask bench engine`: builds `llmserve` in release, starts it on the default model (or `--model`), drives
//! it with a real HTTP load generator (one thread per concurrent client, blocking HTTP/1.1 over std `TcpStream`,
//! streaming chat completions) at concurrency 1, 8 and 32, and reports aggregate decode tokens/s, TTFT and ITL
//! p50/p95 (measured from the SSE stream on the client side) and the server's peak RSS (`VmHWM`). When the
//! `llama_cpp` Python module (PyPI `llama-cpp-python`) is importable, llama.cpp runs the same GGUF as the reference
//! (batch 1, greedy, same thread count).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Output tokens per request (the issue's reference: 128 greedy tokens).
const MAX_TOKENS: usize = 128;
/// Concurrency levels of the issue.
const LEVELS: [usize; 3] = [1, 8, 32];

/// `cargo xtask bench <what>`.
pub fn run(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("engine") => engine(&args[1..]),
        Some("attach") => attach(&args[1..]),
        Some("serve") => serve(&args[1..]),
        Some("syscalls") => crate::bench_syscalls::run(&args[1..]),
        _ => bail!(
            "usage: cargo xtask bench engine|attach|serve|syscalls [--model PATH] [--threads N] [--max-tokens N] [--levels 1,8,32]\n\
             engine: drives llmserve over HTTP and prints decode tokens/s, TTFT/ITL p50/p95 and peak RSS\n\
             attach: decode tokens/s and TTFT with llmprof attached vs detached, A/B interleaved (root)\n\
             serve: decode tokens/s with `llmprof serve`'s flight recorder on vs off, A/B interleaved (root)\n\
             syscalls: a ~500k syscalls/s target detached / attached / attached with --overhead-budget (root;\n\
             [--rounds N] [--rate CALLS_PER_S] [--budget 1%] [--seconds S])"
        ),
    }
}

struct Opts {
    model: PathBuf,
    threads: usize,
    max_tokens: usize,
    levels: Vec<usize>,
}

fn parse(args: &[String]) -> Result<Opts> {
    let mut o = Opts {
        model: crate::model::default_model_path(),
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        max_tokens: MAX_TOKENS,
        levels: LEVELS.to_vec(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--model" => o.model = PathBuf::from(val()?),
            "--threads" => o.threads = val()?.parse()?,
            "--max-tokens" => o.max_tokens = val()?.parse()?,
            "--levels" => o.levels = val()?.split(',').map(str::parse).collect::<Result<_, _>>()?,
            other => bail!("unknown option {other}"),
        }
    }
    Ok(o)
}

fn engine(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    if !o.model.exists() {
        bail!(
            "model {} not found: run `cargo xtask fetch-model` or pass --model",
            o.model.display()
        );
    }
    let bin = build_release(&["inference"])?.join("llmserve");

    let mut server = start_server(&bin, &o)?;
    let port = server.port;
    let mut rows = Vec::new();
    // Warm-up: first-touch of the weights and the KV cache.
    let _ = one_request(port, "Warm up.", 8);
    for &c in &o.levels {
        let n_req = c.max(3);
        eprintln!(
            "bench: concurrency {c}: {n_req} streaming requests of {} tokens...",
            o.max_tokens
        );
        rows.push(level(port, c, n_req, o.max_tokens)?);
    }
    let rss = peak_rss_kib(server.child.id());
    let _ = server.child.kill();
    let _ = server.child.wait();

    println!();
    println!(
        "llmserve on {} ({} threads), {} output tokens per request, streaming chat completions",
        o.model.display(),
        o.threads,
        o.max_tokens
    );
    println!(
        "{:>5} {:>5} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10}",
        "conc", "reqs", "decode tok/s", "per-req t/s", "TTFT p50", "TTFT p95", "ITL p50", "ITL p95"
    );
    for r in &rows {
        println!(
            "{:>5} {:>5} {:>12.1} {:>12.1} {:>8.1}ms {:>8.1}ms {:>8.1}ms {:>8.1}ms",
            r.concurrency,
            r.requests,
            r.tokens_per_s,
            r.per_request_tps,
            r.ttft_p50 * 1e3,
            r.ttft_p95 * 1e3,
            r.itl_p50 * 1e3,
            r.itl_p95 * 1e3
        );
    }
    match rss {
        Some(k) => println!("peak RSS (VmHWM) of llmserve: {:.1} MiB", k as f64 / 1024.0),
        None => println!("peak RSS: unavailable"),
    }
    match llama_cpp_reference(&o) {
        Ok(Some(tps)) => println!(
            "reference llama.cpp (llama-cpp-python), batch 1, {} threads: {tps:.1} tokens/s",
            o.threads
        ),
        Ok(None) => {
            println!("reference llama.cpp: llama_cpp not importable (pip install llama-cpp-python); skipped")
        }
        Err(e) => println!("reference llama.cpp failed: {e:#}"),
    }
    Ok(())
}

/// Builds `packages` in release; returns the release directory.
pub(crate) fn build_release(packages: &[&str]) -> Result<PathBuf> {
    let root = crate::util::repo_root();
    eprintln!("bench: building {} (release)...", packages.join(", "));
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["build", "--release"]).current_dir(&root);
    for p in packages {
        cmd.args(["-p", p]);
    }
    if !cmd.status().context("running cargo build")?.success() {
        bail!("building {} failed", packages.join(", "));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let target = if target.is_absolute() {
        target
    } else {
        root.join(target)
    };
    Ok(target.join("release"))
}

/// Rounds of the attached/detached A/B comparison (order alternates each round).
const AB_ROUNDS: usize = 5;

/// What both A/B benches start with: options (concurrency 8 unless `--levels`), root check, release build,
/// one warmed-up engine.
struct AbSetup {
    o: Opts,
    release: PathBuf,
    server: ServerProc,
    port: u16,
    c: usize,
    n_req: usize,
}

fn ab_setup(args: &[String], what: &str) -> Result<AbSetup> {
    let mut o = parse(args)?;
    if !args.iter().any(|a| a == "--levels") {
        o.levels = vec![8];
    }
    if !crate::util::is_root() {
        bail!("bench {what} loads eBPF programs: run it as root");
    }
    let release = build_release(&["inference", "llmprof"])?;
    let server = start_server(&release.join("llmserve"), &o)?;
    let port = server.port;
    let _ = one_request(port, "Warm up.", 8);
    let c = o.levels.first().copied().unwrap_or(8);
    let n_req = c.max(3);
    Ok(AbSetup {
        o,
        release,
        server,
        port,
        c,
        n_req,
    })
}

/// `cargo xtask bench attach`: the engine's decode throughput and TTFT with llmprof attached (default mode) vs
/// detached, A/B interleaved in one run on one engine process, plus the trace size per minute of the attached rounds.
fn attach(args: &[String]) -> Result<()> {
    let AbSetup {
        o,
        release,
        mut server,
        port,
        c,
        n_req,
    } = ab_setup(args, "attach")?;
    let trace = std::env::temp_dir().join("llmprof-bench-attach.perfetto-trace");
    let (mut detached, mut attached, mut ttft_d, mut ttft_a) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut trace_mb_per_min = Vec::new();
    for round in 0..AB_ROUNDS {
        for with_probe in if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        } {
            let session = if with_probe {
                Some(start_attach(
                    &release.join("llmprof"),
                    server.child.id(),
                    &trace,
                    &[],
                )?)
            } else {
                None
            };
            let t0 = Instant::now();
            let row = level(port, c, n_req, o.max_tokens)?;
            let secs = t0.elapsed().as_secs_f64();
            eprintln!(
                "bench: round {round} {}: {:.1} tok/s, TTFT p50 {:.0} ms",
                if with_probe { "attached" } else { "detached" },
                row.tokens_per_s,
                row.ttft_p50 * 1e3
            );
            if let Some(child) = session {
                stop_attach(child)?;
                let bytes = std::fs::metadata(&trace).map(|m| m.len()).unwrap_or(0);
                trace_mb_per_min.push(bytes as f64 / 1e6 / (secs / 60.0));
                attached.push(row.tokens_per_s);
                ttft_a.push(row.ttft_p50);
            } else {
                detached.push(row.tokens_per_s);
                ttft_d.push(row.ttft_p50);
            }
        }
    }
    let _ = server.child.kill();
    let _ = server.child.wait();
    let _ = std::fs::remove_file(&trace);
    let stat = |v: &mut Vec<f64>| {
        let med = pct(v, 0.5);
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
        (med, lo, hi)
    };
    let (dm, dl, dh) = stat(&mut detached);
    let (am, al, ah) = stat(&mut attached);
    let (tdm, _, _) = stat(&mut ttft_d);
    let (tam, _, _) = stat(&mut ttft_a);
    let (mm, ml, mh) = stat(&mut trace_mb_per_min);
    println!();
    println!(
        "llmserve at concurrency {c}, {n_req} requests x {} tokens per round, {AB_ROUNDS} rounds A/B interleaved",
        o.max_tokens
    );
    println!(
        "  detached: decode {dm:.1} tok/s (range {dl:.1}-{dh:.1}), TTFT p50 median {:.0} ms",
        tdm * 1e3
    );
    println!(
        "  attached: decode {am:.1} tok/s (range {al:.1}-{ah:.1}), TTFT p50 median {:.0} ms",
        tam * 1e3
    );
    println!(
        "  attached / detached throughput (medians): {:.4} ({:+.2}%)",
        am / dm,
        (am / dm - 1.0) * 100.0
    );
    println!("  trace size: {mm:.2} MB/min (range {ml:.2}-{mh:.2})");
    Ok(())
}

/// Starts `llmprof attach` on `pid` (with `extra` options) and waits for "probes live". Its stdout (the exit
/// summary, a few KiB) is piped for the caller to read after stopping it.
pub(crate) fn start_attach(llmprof: &Path, pid: u32, trace: &Path, extra: &[&str]) -> Result<Child> {
    let mut child = Command::new(llmprof)
        .args(["attach", "--pid", &pid.to_string(), "-o"])
        .arg(trace)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting llmprof attach")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("probes live") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = child.kill();
        bail!("llmprof attach did not report `probes live` within 60 s");
    }
    Ok(child)
}

/// Ends an attach session like Ctrl-C and waits for the trace to be finished.
fn stop_attach(mut child: Child) -> Result<()> {
    let pid = child.id().to_string();
    let _ = Command::new("kill").args(["-INT", &pid]).status();
    let st = child.wait().context("waiting for llmprof")?;
    if !st.success() {
        bail!("llmprof attach exited with {st}");
    }
    Ok(())
}

/// `cargo xtask bench serve`: the engine's decode throughput with `llmprof serve --flight-recorder 30s` recording it
/// vs without, A/B interleaved on one engine process, and the recorder's ring (events, bytes) after each round.
fn serve(args: &[String]) -> Result<()> {
    let AbSetup {
        o,
        release,
        mut server,
        port,
        c,
        n_req,
    } = ab_setup(args, "serve")?;
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
                stop_attach(child)?;
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

/// Starts `llmprof serve --watch pid:PID --flight-recorder 30s` and waits until its recorder records.
fn start_serve(llmprof: &Path, pid: u32, out: &Path) -> Result<(Child, u16)> {
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
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut s, &mut text).ok()?;
    text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
}

struct ServerProc {
    child: Child,
    port: u16,
}

fn start_server(bin: &Path, o: &Opts) -> Result<ServerProc> {
    let mut child = Command::new(bin)
        .arg("--model")
        .arg(&o.model)
        .args([
            "--port",
            "0",
            "--threads",
            &o.threads.to_string(),
            "--max-num-seqs",
            "32",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(p) = line
                .strip_prefix("listening on http://")
                .and_then(|r| r.rsplit(':').next())
            {
                let _ = tx.send(p.trim().parse::<u16>().ok());
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(Some(port)) => Ok(ServerProc { child, port }),
        _ => {
            let _ = child.kill();
            bail!("llmserve did not start")
        }
    }
}

struct Row {
    concurrency: usize,
    requests: usize,
    tokens_per_s: f64,
    per_request_tps: f64,
    ttft_p50: f64,
    ttft_p95: f64,
    itl_p50: f64,
    itl_p95: f64,
}

/// One streamed request as the client saw it.
struct Sample {
    ttft: f64,
    itls: Vec<f64>,
    tokens: usize,
    decode_s: f64,
}

fn level(port: u16, c: usize, n_req: usize, max_tokens: usize) -> Result<Row> {
    let (tx, rx) = mpsc::channel::<usize>();
    for i in 0..n_req {
        tx.send(i)?;
    }
    drop(tx);
    let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
    let t0 = Instant::now();
    let handles: Vec<_> = (0..c)
        .map(|_| {
            let rx = rx.clone();
            std::thread::spawn(move || -> Result<Vec<Sample>> {
                let mut out = Vec::new();
                loop {
                    let next = rx.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.recv();
                    let Ok(i) = next else { break };
                    let prompt = format!("Write a long story about a robot number {i} who learns to paint.");
                    out.push(one_request(port, &prompt, max_tokens)?);
                }
                Ok(out)
            })
        })
        .collect();
    let mut samples = Vec::new();
    for h in handles {
        samples.extend(
            h.join()
                .map_err(|_| anyhow::anyhow!("client thread panicked"))??,
        );
    }
    let wall = t0.elapsed().as_secs_f64();
    let tokens: usize = samples.iter().map(|s| s.tokens).sum();
    let mut ttft: Vec<f64> = samples.iter().map(|s| s.ttft).collect();
    let mut itl: Vec<f64> = samples.iter().flat_map(|s| s.itls.iter().copied()).collect();
    let per_req: Vec<f64> = samples
        .iter()
        .filter(|s| s.decode_s > 0.0 && s.tokens > 1)
        .map(|s| (s.tokens - 1) as f64 / s.decode_s)
        .collect();
    Ok(Row {
        concurrency: c,
        requests: samples.len(),
        tokens_per_s: tokens as f64 / wall,
        per_request_tps: per_req.iter().sum::<f64>() / per_req.len().max(1) as f64,
        ttft_p50: pct(&mut ttft, 0.50),
        ttft_p95: pct(&mut ttft, 0.95),
        itl_p50: pct(&mut itl, 0.50),
        itl_p95: pct(&mut itl, 0.95),
    })
}

pub(crate) fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Sends one streaming chat completion and times its SSE events.
fn one_request(port: u16, prompt: &str, max_tokens: usize) -> Result<Sample> {
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":{}}}],"max_tokens":{max_tokens},"temperature":0,"stream":true,"stream_options":{{"include_usage":true}}}}"#,
        json_str(prompt)
    );
    let mut s = TcpStream::connect(("127.0.0.1", port)).context("connecting to llmserve")?;
    s.set_nodelay(true)?;
    let t0 = Instant::now();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut r = BufReader::new(s);
    // Status line and headers.
    let mut line = String::new();
    r.read_line(&mut line)?;
    if !line.contains(" 200 ") {
        bail!("llmserve answered {}", line.trim());
    }
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
    }
    let mut body = ChunkedLines::new(r);
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    let mut itls = Vec::new();
    let mut tokens = 0usize;
    while let Some(l) = body.next_line()? {
        let Some(data) = l.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        if let Some(p) = data.find("\"completion_tokens\":") {
            let rest = &data[p + 20..];
            let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
            tokens = n.parse().unwrap_or(tokens);
            continue;
        }
        if !data.contains("\"content\":\"") || data.contains("\"content\":\"\"") {
            continue;
        }
        let now = Instant::now();
        match last {
            None => first = Some(now),
            Some(prev) => itls.push(now.duration_since(prev).as_secs_f64()),
        }
        last = Some(now);
    }
    let ttft = first.map_or(f64::NAN, |f| f.duration_since(t0).as_secs_f64());
    let decode_s = match (first, last) {
        (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    Ok(Sample {
        ttft,
        itls,
        tokens,
        decode_s,
    })
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Lines of an HTTP/1.1 chunked body, read incrementally.
struct ChunkedLines<R> {
    r: R,
    buf: Vec<u8>,
    done: bool,
}

impl<R: BufRead> ChunkedLines<R> {
    fn new(r: R) -> Self {
        Self {
            r,
            buf: Vec::new(),
            done: false,
        }
    }

    fn fill(&mut self) -> Result<bool> {
        if self.done {
            return Ok(false);
        }
        let mut size = String::new();
        if self.r.read_line(&mut size)? == 0 {
            self.done = true;
            return Ok(false);
        }
        let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16).unwrap_or(0);
        if n == 0 {
            self.done = true;
            return Ok(false);
        }
        let mut chunk = vec![0u8; n + 2];
        self.r.read_exact(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(true)
    }

    fn next_line(&mut self) -> Result<Option<String>> {
        loop {
            if let Some(p) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=p).collect();
                return Ok(Some(String::from_utf8_lossy(&line).trim_end().to_string()));
            }
            if !self.fill()? {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                let line = String::from_utf8_lossy(&self.buf).trim_end().to_string();
                self.buf.clear();
                return Ok(Some(line));
            }
        }
    }
}

fn peak_rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    l.split_whitespace().nth(1)?.parse().ok()
}

const LLAMA_CPP_SCRIPT: &str = r#"
import sys, time
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_threads=int(sys.argv[2]), n_ctx=2048, verbose=False)
msgs = [{"role": "user", "content": "Write a long story about a robot who learns to paint."}]
llm.create_chat_completion(messages=msgs, max_tokens=8, temperature=0)
t = time.time()
r = llm.create_chat_completion(messages=msgs, max_tokens=int(sys.argv[3]), temperature=0)
dt = time.time() - t
print("TPS", r["usage"]["completion_tokens"] / dt)
"#;

/// llama.cpp's end-to-end tokens/s for one greedy request, when `llama_cpp` is importable.
fn llama_cpp_reference(o: &Opts) -> Result<Option<f64>> {
    let ok = Command::new("python3")
        .args(["-c", "import llama_cpp"])
        .output()
        .is_ok_and(|x| x.status.success());
    if !ok {
        return Ok(None);
    }
    let out = Command::new("python3")
        .args(["-c", LLAMA_CPP_SCRIPT])
        .arg(&o.model)
        .arg(o.threads.to_string())
        .arg(o.max_tokens.to_string())
        .output()
        .context("running llama-cpp-python")?;
    let s = String::from_utf8_lossy(&out.stdout);
    let tps = s
        .lines()
        .find_map(|l| l.strip_prefix("TPS "))
        .and_then(|v| v.trim().parse().ok());
    match tps {
        Some(t) => Ok(Some(t)),
        None => bail!(
            "llama-cpp-python printed no result: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}
