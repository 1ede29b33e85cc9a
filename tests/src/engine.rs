//! Spawning the real engine (`llmserve`) for a test and stopping it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The name the tests serve the model under (requests must name it).
pub const SERVED_NAME: &str = "smollm2";

/// A running `llmserve`; killed on drop.
pub struct Engine {
    /// The process.
    pub child: Child,
    /// Its pid.
    pub pid: u32,
    /// The port it listens on (loopback).
    pub port: u16,
}

impl Engine {
    /// Starts `llmserve --model MODEL --port 0 --served-model-name smollm2 EXTRA...` and waits (up to 120 s) for its `listening on` line.
    pub fn spawn(model: &Path, extra: &[&str]) -> Engine {
        let mut child = Command::new(crate::bin_path("llmserve"))
            .arg("--model")
            .arg(model)
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--served-model-name",
                SERVED_NAME,
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn llmserve");
        let pid = child.id();
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("[llmserve] {line}");
                if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
                    let port: u16 = rest.trim().trim_end_matches('/').parse().unwrap_or(0);
                    let _ = tx.send(port);
                }
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("llmserve did not print `listening on http://127.0.0.1:PORT` within 120 s");
        Engine { child, pid, port }
    }

    /// Scrapes `/metrics`.
    pub fn metrics(&self) -> String {
        crate::http::get(self.port, "/metrics")
            .expect("GET /metrics")
            .text()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
