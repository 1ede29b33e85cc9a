//! Shared helpers of the `serve_*` end-to-end tests: spawn the real `llmserve` binary on a free port and talk to
//! it with the workspace's one test HTTP client (`e2e::http`: JSON, chunked transfer, SSE).
#![allow(
    dead_code,
    clippy::unwrap_used,
    reason = "shared test helpers; tests unwrap to fail loudly"
)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use e2e::http::{self, Response};

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
        http::get(self.port, path).unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> Response {
        http::post_json(self.port, path, &[], &body.to_string())
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
    }

    pub fn post_raw(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        http::request(self.port, "POST", path, headers, Some(body))
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
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
    let spec = e2e::gguf::TinyModelSpec {
        seed,
        ..Default::default()
    };
    e2e::gguf::write_tiny_gguf(&path, &spec).unwrap();
    path
}
