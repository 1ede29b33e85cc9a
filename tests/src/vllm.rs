//! vLLM's OpenAI server (the CPU build in the vLLM venv, `cargo xtask setup`) started as users run it:
//! `vllm serve` under a launcher process, its engine core a child process (`VLLM::EngineCore`), serving the
//! default model converted once for it. Its own `/metrics` counters are what the Python-hooks test checks
//! llmprof's engine steps against.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::http;
use crate::wire::children;

/// The vLLM venv's directory (`$XDG_CACHE_HOME/llmprof/venvs/vllm`, or under `~/.cache`).
pub fn venv() -> PathBuf {
    crate::llmprof_cache().join("venvs/vllm")
}

/// The converted model (`cargo xtask setup` writes it from the default GGUF).
pub fn model_dir() -> PathBuf {
    crate::llmprof_cache().join("models/smollm2-hf")
}

/// Whether vLLM and its model are installed.
pub fn available() -> bool {
    venv().join("bin/vllm").exists() && model_dir().join("config.json").exists()
}

/// The name the model is served under.
pub const SERVED_NAME: &str = "smollm2";

/// Longest vLLM's CPU build takes to answer `/health` (~40 s on an idle 2-core VM, minutes on a loaded one).
const HEALTH_WAIT: Duration = Duration::from_secs(420);

/// Kills the launcher, the API server and its engine core when the test ends, whatever happens.
pub struct Server {
    /// The launcher (`python -c ...`): the pid a user would attach to with its tree.
    pub launcher: Child,
    /// The API server (`vllm serve`, the launcher's child).
    pub api: u32,
    /// The engine core (`VLLM::EngineCore`, the API server's child).
    pub engine: u32,
    /// The port it serves on.
    pub port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        for pid in [self.engine, self.api] {
            if pid != 0 {
                // SAFETY: kill(2) on pids this test started; no memory-safety preconditions.
                unsafe {
                    libc::kill(pid as i32, libc::SIGKILL);
                }
            }
        }
        let _ = self.launcher.kill();
        let _ = self.launcher.wait();
    }
}

/// Starts `vllm serve` on 127.0.0.1:`port` as the child of a launcher and waits until it answers `/health`
/// and one chat completion (the first batches compile).
pub fn start(port: u16) -> Server {
    let launcher_src = "import subprocess, sys\n\
                        p = subprocess.Popen(sys.argv[1:])\n\
                        sys.exit(p.wait())\n";
    let python = venv().join("bin/python");
    let launcher = Command::new(&python)
        .args(["-c", launcher_src])
        .arg(venv().join("bin/vllm"))
        .arg("serve")
        .arg(model_dir())
        .args([
            "--served-model-name",
            SERVED_NAME,
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "2048",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .env("HF_HUB_OFFLINE", "1")
        .env("VLLM_CPU_KVCACHE_SPACE", "1")
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("DO_NOT_TRACK", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the vllm serve launcher");
    let launcher_pid = launcher.id();
    let mut server = Server {
        launcher,
        api: 0,
        engine: 0,
        port,
    };
    let deadline = Instant::now() + HEALTH_WAIT;
    loop {
        if server.api == 0 {
            server.api = children(launcher_pid).first().copied().unwrap_or(0);
        }
        if server.api != 0 && server.engine == 0 {
            server.engine = children(server.api)
                .into_iter()
                .find(|&p| {
                    std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                        .is_ok_and(|c| c.contains("EngineCore"))
                })
                .unwrap_or(0);
        }
        if server.engine != 0 && http::get(port, "/health").is_ok_and(|r| r.status == 200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "vllm serve did not answer /health within {HEALTH_WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let warm = chat_body("Say hello.", 8, 0.0);
    let r = http::post_json(port, "/v1/chat/completions", &[], &warm).expect("vLLM's warm-up request");
    assert_eq!(
        r.status,
        200,
        "vLLM's warm-up request: {}",
        String::from_utf8_lossy(&r.body)
    );
    server
}

/// A chat completion request body for the served model.
pub fn chat_body(prompt: &str, max_tokens: u32, temperature: f64) -> String {
    serde_json::json!({
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": true,
    })
    .to_string()
}

/// vLLM's own counters, from `/metrics`.
#[derive(Clone, Copy, Debug)]
pub struct Counters {
    /// Engine steps: `vllm:iteration_tokens_total` is a histogram observed once per step, its `_count`.
    pub steps: f64,
    /// Prompt tokens of the requests (cached prefixes included).
    pub prompt: f64,
    /// Tokens generated.
    pub generated: f64,
    /// Prompt tokens found in the prefix cache (`vllm:prefix_cache_hits_total`).
    pub cached: f64,
}

/// vLLM's own counters now.
pub fn counters(port: u16) -> Counters {
    let r = http::get(port, "/metrics").expect("vLLM /metrics");
    let body = String::from_utf8_lossy(&r.body);
    let value = |name: &str| {
        body.lines()
            .filter(|l| {
                l.starts_with(name) && (l[name.len()..].starts_with('{') || l[name.len()..].starts_with(' '))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    Counters {
        steps: value("vllm:iteration_tokens_total_count"),
        prompt: value("vllm:prompt_tokens_total"),
        generated: value("vllm:generation_tokens_total"),
        cached: value("vllm:prefix_cache_hits_total"),
    }
}
