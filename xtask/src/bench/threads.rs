//! `cargo xtask bench threads` (owner: thread states): what recording thread states costs the target. llmserve
//! under a streaming load (concurrency 4 unless `--levels` says otherwise) in three modes, interleaved round by
//! round on one engine process: detached, `llmprof attach --no-thread-states`, and `llmprof attach` (thread
//! states on, the default). The figure is the target's CPU time per generated token (all its threads,
//! `/proc/PID/task/*/schedstat`: the eBPF programs run in the target's context and are charged to it), medians
//! and ranges over the rounds, plus the trace size per minute and the thread-state records per second.

use std::time::Instant;

use anyhow::{Context, Result};

use super::common::{AB_ROUNDS, AbSetup, ab_setup, start_attach, stop_llmprof};
use super::load::{EngineArgs, level};
use super::stats::median_range;

/// Concurrency without `--levels` (the reference load).
const CONCURRENCY: usize = 4;

/// The modes of a round, in the order of even rounds (odd rounds run them reversed).
const MODES: [(&str, Option<&[&str]>); 3] = [
    ("detached", None),
    ("attached, --no-thread-states", Some(&["--no-thread-states"])),
    ("attached, thread states", Some(&[])),
];

/// CPU time of every live thread of `pid` so far, s (the first field of each thread's schedstat, ns).
fn process_cpu_s(pid: u32) -> Result<f64> {
    let mut ns = 0u64;
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).context("reading the target's threads")? {
        let path = e?.path().join("schedstat");
        if let Ok(s) = std::fs::read_to_string(&path) {
            ns += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        }
    }
    Ok(ns as f64 / 1e9)
}

/// `cargo xtask bench threads`.
pub(super) fn run(o: &EngineArgs) -> Result<()> {
    let with_default = EngineArgs {
        model: o.model.clone(),
        threads: o.threads,
        max_tokens: o.max_tokens,
        levels: Some(o.levels.clone().unwrap_or_else(|| vec![CONCURRENCY])),
        rounds: o.rounds,
    };
    let AbSetup {
        release,
        mut server,
        port,
        c,
        n_req,
    } = ab_setup(&with_default, "threads")?;
    let pid = server.child.id();
    let trace = std::env::temp_dir().join("llmprof-bench-threads.perfetto-trace");
    let mut cpu_per_token: [Vec<f64>; 3] = Default::default();
    let mut tok_s: [Vec<f64>; 3] = Default::default();
    let mut mb_per_min: [Vec<f64>; 3] = Default::default();
    for round in 0..AB_ROUNDS {
        let order: Vec<usize> = if round % 2 == 0 {
            vec![0, 1, 2]
        } else {
            vec![2, 1, 0]
        };
        for m in order {
            let (name, extra) = MODES[m];
            let session = match extra {
                Some(args) => Some(start_attach(&release.join("llmprof"), pid, &trace, args)?),
                None => None,
            };
            let cpu0 = process_cpu_s(pid)?;
            let t0 = Instant::now();
            let row = level(port, c, n_req, o.max_tokens)?;
            let secs = t0.elapsed().as_secs_f64();
            let cpu = process_cpu_s(pid)? - cpu0;
            let per_token_ms = cpu * 1e3 / row.tokens.max(1) as f64;
            eprintln!(
                "bench: round {round} {name}: {per_token_ms:.3} ms target CPU per token, {:.1} tok/s",
                row.tokens_per_s
            );
            cpu_per_token[m].push(per_token_ms);
            tok_s[m].push(row.tokens_per_s);
            if let Some(child) = session {
                let summary = stop_llmprof(child)?;
                if let Some(l) = summary.lines().find(|l| l.contains("probe sched:")) {
                    eprintln!("bench:   {}", l.trim());
                }
                let bytes = std::fs::metadata(&trace).map(|m| m.len()).unwrap_or(0);
                mb_per_min[m].push(bytes as f64 / 1e6 / (secs / 60.0));
                let _ = std::fs::remove_file(&trace);
            }
        }
    }
    let _ = server.child.kill();
    let _ = server.child.wait();
    println!();
    println!(
        "llmserve at concurrency {c}, {n_req} requests x {} tokens per round, {AB_ROUNDS} rounds, modes interleaved",
        o.max_tokens
    );
    let (base, _, _) = median_range(&mut cpu_per_token[0].clone());
    for (m, (name, _)) in MODES.iter().enumerate() {
        let (cm, cl, ch) = median_range(&mut cpu_per_token[m]);
        let (tm, _, _) = median_range(&mut tok_s[m]);
        let size = if mb_per_min[m].is_empty() {
            String::new()
        } else {
            let (sm, sl, sh) = median_range(&mut mb_per_min[m]);
            format!(", trace {sm:.2} MB/min (range {sl:.2}-{sh:.2})")
        };
        println!(
            "  {name:<30} target CPU {cm:.3} ms/token (range {cl:.3}-{ch:.3}) = {:+.2}% vs detached, {tm:.1} tok/s{size}",
            (cm / base - 1.0) * 100.0
        );
    }
    Ok(())
}
