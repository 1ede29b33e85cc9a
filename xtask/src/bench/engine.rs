//! `cargo xtask bench engine` (owner: engine serving): builds `llmserve` in release, starts it on the default
//! model (or `--model`), drives it with the load generator of [`super::load`] at concurrency 1, 8 and 32, and
//! reports aggregate decode tokens/s, TTFT and ITL p50/p95 (measured from the SSE stream on the client side)
//! and the server's peak RSS (`VmHWM`). When the `llama_cpp` Python module (PyPI `llama-cpp-python`) is
//! importable, llama.cpp runs the same GGUF as the reference (batch 1, greedy, same thread count).

use std::process::Command;

use anyhow::{Context, Result, bail};

use super::common::build_release;
use super::load::{EngineArgs, level, one_request, start_server};

/// Concurrency levels of the issue.
const LEVELS: [usize; 3] = [1, 8, 32];

/// `cargo xtask bench engine`.
pub(super) fn run(o: &EngineArgs) -> Result<()> {
    if !o.model.exists() {
        bail!(
            "model {} not found: run `cargo xtask fetch-model` or pass --model",
            o.model.display()
        );
    }
    let bin = build_release(&["inference"])?.join("llmserve");

    let mut server = start_server(&bin, o)?;
    let port = server.port;
    let mut rows = Vec::new();
    // Warm-up: first-touch of the weights and the KV cache.
    let _ = one_request(port, "Warm up.", 8);
    for &c in o.levels.as_deref().unwrap_or(&LEVELS) {
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
    match llama_cpp_reference(o) {
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

/// Peak resident set of `pid` (`VmHWM`), KiB.
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
fn llama_cpp_reference(o: &EngineArgs) -> Result<Option<f64>> {
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
