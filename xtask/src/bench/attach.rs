//! `cargo xtask bench attach` (owner: engine serving): the engine's decode throughput and TTFT with llmprof
//! attached (default mode) vs detached, A/B interleaved in one run on one engine process, plus the trace size
//! per minute of the attached rounds, and the engine's CPU time (user + system, /proc/PID/stat) per generated
//! token in each mode: the cost a CPU-bound server pays, whatever the machine's load does to throughput.

use std::time::Instant;

use anyhow::Result;

use super::common::{AB_ROUNDS, AbSetup, ab_setup, start_attach, stop_llmprof};
use super::load::{EngineArgs, level};
use super::stats::median_range;

/// `cargo xtask bench attach`.
pub(super) fn run(o: &EngineArgs) -> Result<()> {
    let AbSetup {
        release,
        mut server,
        port,
        c,
        n_req,
    } = ab_setup(o, "attach")?;
    let trace = std::env::temp_dir().join("llmprof-bench-attach.perfetto-trace");
    let (mut detached, mut attached, mut ttft_d, mut ttft_a) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut trace_mb_per_min = Vec::new();
    let (mut cpu_tok_d, mut cpu_tok_a) = (Vec::new(), Vec::new());
    let pid = server.child.id();
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
            let cpu0 = cpu_ns(pid);
            let row = level(port, c, n_req, o.max_tokens)?;
            let cpu_per_tok = match (cpu0, cpu_ns(pid)) {
                (Some(a), Some(b)) if row.tokens > 0 => Some((b - a) as f64 / 1e3 / row.tokens as f64),
                _ => None,
            };
            let secs = t0.elapsed().as_secs_f64();
            eprintln!(
                "bench: round {round} {}: {:.1} tok/s, TTFT p50 {:.0} ms",
                if with_probe { "attached" } else { "detached" },
                row.tokens_per_s,
                row.ttft_p50 * 1e3
            );
            if let Some(child) = session {
                stop_llmprof(child)?;
                let bytes = std::fs::metadata(&trace).map(|m| m.len()).unwrap_or(0);
                trace_mb_per_min.push(bytes as f64 / 1e6 / (secs / 60.0));
                attached.push(row.tokens_per_s);
                ttft_a.push(row.ttft_p50);
                cpu_tok_a.extend(cpu_per_tok);
            } else {
                detached.push(row.tokens_per_s);
                ttft_d.push(row.ttft_p50);
                cpu_tok_d.extend(cpu_per_tok);
            }
        }
    }
    let _ = server.child.kill();
    let _ = server.child.wait();
    let _ = std::fs::remove_file(&trace);
    let (dm, dl, dh) = median_range(&mut detached);
    let (am, al, ah) = median_range(&mut attached);
    let (tdm, _, _) = median_range(&mut ttft_d);
    let (tam, _, _) = median_range(&mut ttft_a);
    let (mm, ml, mh) = median_range(&mut trace_mb_per_min);
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
    if !cpu_tok_d.is_empty() && !cpu_tok_a.is_empty() {
        let (cdm, cdl, cdh) = median_range(&mut cpu_tok_d);
        let (cam, cal, cah) = median_range(&mut cpu_tok_a);
        println!(
            "  engine CPU per generated token: detached {cdm:.0} us (range {cdl:.0}-{cdh:.0}), attached {cam:.0} us \
             (range {cal:.0}-{cah:.0}); attached / detached {:.4} ({:+.2}%)",
            cam / cdm,
            (cam / cdm - 1.0) * 100.0
        );
    }
    Ok(())
}

/// CPU time (user + system) of `pid` so far, ns, from `/proc/PID/stat` (fields 14 and 15, clock ticks).
fn cpu_ns(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ: 100 on Linux x86-64 (the unit of /proc times is ABI, whatever the kernel's HZ).
    Some(ticks * 10_000_000)
}
