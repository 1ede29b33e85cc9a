//! `cargo xtask bench attach` (owner: engine serving): the engine's decode throughput and TTFT with llmprof
//! attached (default mode) vs detached, A/B interleaved in one run on one engine process, plus the trace size
//! per minute of the attached rounds.

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
                stop_llmprof(child)?;
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
    Ok(())
}
