//! `cargo xtask bench engine` (owner: engine serving): builds `llmserve` in release, starts it on the default
//! model (or `--model`), drives it with the load generator of [`super::load`] at concurrency 1, 8 and 32, and
//! reports aggregate decode tokens/s, TTFT and ITL p50/p95 (measured from the SSE stream on the client side),
//! the engine's voluntary context switches per generated token (each is a blocking system call: futex wait,
//! epoll wait) and the server's peak RSS (`VmHWM`). llama.cpp (llama-cpp-python from the servers venv that
//! `cargo xtask setup` builds) runs the same GGUF as the reference (batch 1, greedy, same thread count). Every
//! round runs each level and llama.cpp once, interleaved, so the ratios compare runs under the same load of
//! the machine; the report gives medians and ranges over `--rounds`.

use std::process::Command;

use anyhow::{Context, Result, bail};

use super::common::build_release;
use super::load::{EngineArgs, Row, level, one_request, start_server};
use super::stats::median_range;

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
    let levels = o.levels.clone().unwrap_or(LEVELS.to_vec());
    let rounds = o.rounds.max(1);

    let mut server = start_server(&bin, o)?;
    let port = server.port;
    let pid = server.child.id();
    let mut rows: Vec<Vec<Row>> = levels.iter().map(|_| Vec::new()).collect();
    let mut switches: Vec<Vec<f64>> = levels.iter().map(|_| Vec::new()).collect();
    let mut reference = Vec::new();
    let mut reference_err = None;
    // Warm-up: first-touch of the weights and the KV cache.
    let _ = one_request(port, "Warm up.", 8);
    for round in 1..=rounds {
        for (k, &c) in levels.iter().enumerate() {
            let n_req = c.max(3);
            eprintln!(
                "bench: round {round}/{rounds}: concurrency {c}: {n_req} streaming requests of {} tokens...",
                o.max_tokens
            );
            let before = voluntary_switches(pid);
            let row = level(port, c, n_req, o.max_tokens)?;
            if let (Some(a), Some(b)) = (before, voluntary_switches(pid)) {
                switches[k].push(b.saturating_sub(a) as f64 / row.tokens.max(1) as f64);
            }
            rows[k].push(row);
        }
        eprintln!("bench: round {round}/{rounds}: llama.cpp batch 1...");
        match llama_cpp_reference(o) {
            Ok(t) => reference.push(t),
            Err(e) => {
                reference_err = Some(e);
                break;
            }
        }
    }
    let rss = peak_rss_kib(pid);
    let _ = server.child.kill();
    let _ = server.child.wait();

    println!();
    println!(
        "llmserve on {} ({} threads), {} output tokens per request, streaming chat completions; \
         medians over {rounds} rounds [min-max]",
        o.model.display(),
        o.threads,
        o.max_tokens
    );
    println!(
        "{:>5} {:>5} {:>24} {:>12} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "conc",
        "reqs",
        "decode tok/s",
        "per-req t/s",
        "TTFT p50",
        "TTFT p95",
        "ITL p50",
        "ITL p95",
        "vcsw/token"
    );
    let mut med_tps = Vec::new();
    for (k, rs) in rows.iter().enumerate() {
        let Some(first) = rs.first() else { continue };
        let m = |f: &dyn Fn(&Row) -> f64| median_range(&mut rs.iter().map(f).collect::<Vec<_>>());
        let (tps, lo, hi) = m(&|r| r.tokens_per_s);
        med_tps.push((first.concurrency, tps));
        println!(
            "{:>5} {:>5} {:>24} {:>12.1} {:>8.1}ms {:>8.1}ms {:>8.1}ms {:>8.1}ms {:>12.2}",
            first.concurrency,
            first.requests,
            format!("{tps:.1} [{lo:.1}-{hi:.1}]"),
            m(&|r| r.per_request_tps).0,
            m(&|r| r.ttft_p50).0 * 1e3,
            m(&|r| r.ttft_p95).0 * 1e3,
            m(&|r| r.itl_p50).0 * 1e3,
            m(&|r| r.itl_p95).0 * 1e3,
            median_range(&mut switches[k]).0,
        );
    }
    match rss {
        Some(k) => println!("peak RSS (VmHWM) of llmserve: {:.1} MiB", k as f64 / 1024.0),
        None => println!("peak RSS: unavailable"),
    }
    let c1 = med_tps.iter().find(|(c, _)| *c == 1).map(|&(_, t)| t);
    if let (Some(c1), Some(&(_, c8))) = (c1, med_tps.iter().find(|(c, _)| *c == 8)) {
        println!("concurrency 8 / concurrency 1: {:.2}x (goal >= 3x)", c8 / c1);
    }
    if !reference.is_empty() {
        let per_round: Vec<f64> = rows
            .iter()
            .find(|rs| rs.first().is_some_and(|r| r.concurrency == 1))
            .map(|rs| {
                rs.iter()
                    .zip(&reference)
                    .map(|(r, l)| r.tokens_per_s / l)
                    .collect()
            })
            .unwrap_or_default();
        let (t, lo, hi) = median_range(&mut reference.clone());
        println!(
            "reference llama.cpp (llama-cpp-python), batch 1, {} threads: {t:.1} [{lo:.1}-{hi:.1}] tokens/s",
            o.threads
        );
        if !per_round.is_empty() {
            let (r, lo, hi) = median_range(&mut per_round.clone());
            println!("llmserve batch 1 / llama.cpp, same round: {r:.2}x [{lo:.2}-{hi:.2}] (goal >= 0.8x)");
        }
    }
    if let Some(e) = reference_err {
        println!("reference llama.cpp failed: {e:#}");
    }
    Ok(())
}

/// Voluntary context switches of every thread of `pid` so far (each is a blocking system call).
fn voluntary_switches(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut n = 0;
    for t in tasks.flatten() {
        let s = std::fs::read_to_string(t.path().join("status")).ok()?;
        n += s
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
            .trim()
            .parse::<u64>()
            .ok()?;
    }
    Some(n)
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

/// llama.cpp's end-to-end tokens/s for one greedy request, with the servers venv's llama-cpp-python.
fn llama_cpp_reference(o: &EngineArgs) -> Result<f64> {
    let python = crate::servers::python();
    let ok = Command::new(&python)
        .args(["-c", "import llama_cpp"])
        .output()
        .is_ok_and(|x| x.status.success());
    if !ok {
        bail!(
            "{} cannot import llama_cpp: run `cargo xtask setup` (it builds llama-cpp-python for this CPU)",
            python.display()
        );
    }
    let out = Command::new(&python)
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
        Some(t) => Ok(t),
        None => bail!(
            "llama-cpp-python printed no result: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}
