//! Shared helpers of the `serve_*` end-to-end tests: spawn the real `llmserve` binary on a free port, and a tiny
//! blocking HTTP/1.1 client (std only) that speaks enough HTTP for JSON, chunked transfer and SSE.
#![allow(
    dead_code,
    clippy::unwrap_used,
    reason = "shared test helpers; tests unwrap to fail loudly"
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running `llmserve`, killed on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub stderr_path: PathBuf,
}

impl Server {
    /// Starts `llmserve --model MODEL --port 0 ARGS...` and waits for its `listening on` line.
    pub fn start(model: &Path, args: &[&str]) -> Server {
        let dir = std::env::temp_dir().join(format!("llmserve-test-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&dir).unwrap();
        let stderr_path = dir.join("stderr.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_llmserve"))
            .arg("--model")
            .arg(model)
            .args(["--port", "0", "--host", "127.0.0.1"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .spawn()
            .expect("spawn llmserve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("listening on http://") {
                    let port: u16 = rest.rsplit(':').next().unwrap().trim().parse().unwrap();
                    let _ = tx.send(port);
                }
            }
        });
        let port = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(p) => p,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "llmserve did not print its address; stderr:\n{}",
                    std::fs::read_to_string(&stderr_path).unwrap_or_default()
                );
            }
        };
        Server {
            child,
            port,
            stderr_path,
        }
    }

    pub fn get(&self, path: &str) -> Response {
        request(self.port, "GET", path, &[], None)
    }

    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> Response {
        request(
            self.port,
            "POST",
            path,
            &[("content-type", "application/json")],
            Some(body.to_string().as_bytes()),
        )
    }

    pub fn post_raw(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        request(self.port, "POST", path, headers, Some(body))
    }

    /// The value of a metric series (first line starting with `prefix`).
    pub fn metric(&self, prefix: &str) -> f64 {
        let m = self.get("/metrics").text();
        m.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("metric {prefix} not found in\n{m}"))
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// An HTTP response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// The `data:` payloads of an SSE body.
    pub fn sse_events(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

/// Sends one request with `Connection: close` and reads the whole response.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Response {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!("content-length: {}\r\n", b.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    if let Some(b) = body {
        s.write_all(b).unwrap();
    }
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read response");
    parse_response(&raw)
}

pub fn parse_response(raw: &[u8]) -> Response {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("header end");
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Response {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(p) = b.windows(2).position(|w| w == b"\r\n") {
        let size_s = String::from_utf8_lossy(&b[..p]);
        let size = usize::from_str_radix(size_s.split(';').next().unwrap().trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = p + 2;
        out.extend_from_slice(&b[start..(start + size).min(b.len())]);
        b = &b[(start + size + 2).min(b.len())..];
    }
    out
}

/// Opens a streaming request and returns the socket after `min_bytes` of the response arrived (or the response
/// ended); dropping it disconnects the client mid-stream.
pub fn open_stream(port: u16, path: &str, body: &serde_json::Value, min_bytes: usize) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let b = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{b}",
        b.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut got = 0;
    let mut buf = [0u8; 4096];
    while got < min_bytes {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    s
}

/// Polls `f` until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// A tiny random model (seed 1) written once per test process.
pub fn tiny_model() -> PathBuf {
    static P: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    P.get_or_init(|| tiny_model_seeded(1)).clone()
}

/// A tiny random model with the given weight seed.
pub fn tiny_model_seeded(seed: u64) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("llmserve-tiny-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("tiny-{seed}.gguf"));
    let spec = inference::tiny_gguf::TinyModelSpec {
        seed,
        ..Default::default()
    };
    inference::tiny_gguf::write_tiny_gguf(&path, &spec).unwrap();
    path
}
