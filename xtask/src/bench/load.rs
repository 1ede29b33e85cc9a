//! llmserve under load (owner: engine serving): starting the release engine, and a real HTTP load generator
//! for it.
//!
//! The load generator runs one thread per concurrent client, blocking HTTP/1.1 over std `TcpStream`, streaming
//! chat completions, and measures TTFT and ITL from the SSE stream on the client side. Shared by the benches
//! that load the engine (`engine`, `attach`, `serve`), with their options ([`EngineArgs`]); never starts
//! llmprof.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::stats::pct;

/// Output tokens per request (the issue's reference: 128 greedy tokens).
const MAX_TOKENS: usize = 128;

/// Options of the benches that load llmserve.
#[derive(clap::Args, Debug)]
pub struct EngineArgs {
    /// GGUF model llmserve serves.
    #[arg(long, value_name = "PATH", default_value_os_t = crate::model::default_model_path())]
    pub model: PathBuf,
    /// llmserve's compute threads.
    #[arg(long, value_name = "N", default_value_t = cores())]
    pub threads: usize,
    /// Output tokens per request.
    #[arg(long, value_name = "N", default_value_t = MAX_TOKENS)]
    pub max_tokens: usize,
    /// Client concurrency levels: engine runs each (default 1,8,32), attach and serve the first (default 8).
    #[arg(long, value_name = "N,...", value_delimiter = ',')]
    pub levels: Option<Vec<usize>>,
    /// Rounds of `bench engine` (each runs every level and the llama.cpp reference once, interleaved).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub rounds: usize,
}

impl EngineArgs {
    /// The first `--levels` value, else `default`: the one concurrency of the A/B benches.
    pub(super) fn first_level(&self, default: usize) -> usize {
        self.levels
            .as_ref()
            .and_then(|l| l.first())
            .copied()
            .unwrap_or(default)
    }
}

/// The machine's cores, the engine's default thread count.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A running llmserve.
pub(super) struct ServerProc {
    pub(super) child: Child,
    /// Its HTTP port on 127.0.0.1.
    pub(super) port: u16,
}

/// Starts llmserve (`bin`) on `o`'s model and threads, on a free port; waits until it listens.
pub(super) fn start_server(bin: &Path, o: &EngineArgs) -> Result<ServerProc> {
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

/// What one concurrency level measured (times in seconds).
pub(super) struct Row {
    pub(super) concurrency: usize,
    pub(super) requests: usize,
    /// Output tokens of the round.
    pub(super) tokens: usize,
    /// Aggregate output tokens per second of wall time.
    pub(super) tokens_per_s: f64,
    /// Mean over requests of their own decode rate.
    pub(super) per_request_tps: f64,
    pub(super) ttft_p50: f64,
    pub(super) ttft_p95: f64,
    pub(super) itl_p50: f64,
    pub(super) itl_p95: f64,
}

/// One streamed request as the client saw it.
pub(super) struct Sample {
    ttft: f64,
    itls: Vec<f64>,
    tokens: usize,
    decode_s: f64,
}

/// `n_req` greedy streaming requests of `max_tokens` tokens by `c` concurrent clients on the OpenAI-compatible
/// server (llmserve, llama.cpp's) at `port`.
pub(super) fn level(port: u16, c: usize, n_req: usize, max_tokens: usize) -> Result<Row> {
    level_at(port, c, n_req, max_tokens, 0.0)
}

/// [`level`] with the requests sampled at `temperature` (0: greedy).
pub(super) fn level_at(
    port: u16,
    c: usize,
    n_req: usize,
    max_tokens: usize,
    temperature: f64,
) -> Result<Row> {
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
                    out.push(one_request_at(port, &prompt, max_tokens, temperature)?);
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
        tokens,
        tokens_per_s: tokens as f64 / wall,
        per_request_tps: per_req.iter().sum::<f64>() / per_req.len().max(1) as f64,
        ttft_p50: pct(&mut ttft, 0.50),
        ttft_p95: pct(&mut ttft, 0.95),
        itl_p50: pct(&mut itl, 0.50),
        itl_p95: pct(&mut itl, 0.95),
    })
}

/// Sends one greedy streaming chat completion and times its SSE events.
pub(super) fn one_request(port: u16, prompt: &str, max_tokens: usize) -> Result<Sample> {
    one_request_at(port, prompt, max_tokens, 0.0)
}

/// [`one_request`] sampled at `temperature`.
pub(super) fn one_request_at(port: u16, prompt: &str, max_tokens: usize, temperature: f64) -> Result<Sample> {
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":{}}}],"max_tokens":{max_tokens},"temperature":{temperature},"stream":true,"stream_options":{{"include_usage":true}}}}"#,
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
    let mut usage: Option<usize> = None;
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
            usage = n.parse().ok().or(usage);
            continue;
        }
        if !carries_content(data) {
            continue;
        }
        let now = Instant::now();
        match last {
            None => first = Some(now),
            Some(prev) => itls.push(now.duration_since(prev).as_secs_f64()),
        }
        last = Some(now);
    }
    // A server that reports no usage in the stream (llama.cpp's): one token per content event.
    let tokens = usage.unwrap_or(itls.len() + usize::from(first.is_some()));
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

/// Whether an SSE event's JSON has a non-empty `"content"` string (llmserve writes `"content":"x"`, Python
/// servers `"content": "x"`).
fn carries_content(data: &str) -> bool {
    data.match_indices("\"content\":").any(|(i, m)| {
        let rest = data[i + m.len()..].trim_start();
        rest.starts_with('"') && !rest.starts_with("\"\"")
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

#[cfg(test)]
mod tests {
    use super::carries_content;

    #[test]
    fn content_events_with_and_without_a_space_and_role_only_chunks() {
        assert!(carries_content(r#"{"choices":[{"delta":{"content":"Hi"}}]}"#));
        assert!(carries_content(
            r#"{"choices": [{"delta": {"content": " the"}}]}"#
        ));
        assert!(!carries_content(
            r#"{"choices": [{"delta": {"role": "assistant", "content": ""}}]}"#
        ));
        assert!(!carries_content(r#"{"choices":[{"delta":{"content":null}}]}"#));
        assert!(!carries_content(r#"{"usage":{"completion_tokens":3}}"#));
    }
}
