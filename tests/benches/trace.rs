//! `cargo xtask bench trace`: how many events per second the pure trace side sustains, the merge and the
//! Perfetto writer together (two interleaved sources slightly out of order, one slow-syscall slice per event,
//! eight threads), and the bytes each event costs in the trace. Per round: 1,000,000 events.

use std::time::Instant;

use llmprof_trace::event::SessionStats;
use llmprof_trace::merge::{DEFAULT_WINDOW_NS, Merger};
use llmprof_trace::perfetto::TraceSink;
use llmprof_trace::testing;

/// Events per round.
const N: u64 = 1_000_000;

/// Rounds asked for with `--rounds N` (cargo's own `--bench` flag is ignored); 5 by default.
fn rounds() -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(5)
}

/// One round: (events per second, bytes per event).
fn round(path: &std::path::Path) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let info = testing::process(1, "bench", "", (1..=8).map(|tid| (tid, format!("t{tid}"))));
    let mut sink = TraceSink::new(std::fs::File::create(path)?, &[info], None)?;
    let mut merger = Merger::new(DEFAULT_WINDOW_NS);
    let mut ready = Vec::new();
    let t0 = Instant::now();
    for i in 0..N {
        let ts = 1_000_000_000 + i * 1000 + (i % 2) * 500;
        merger.push(testing::slow_syscall(1, 1 + (i % 8) as u32, ts, 202, 0, 400));
        if i % 1024 == 0 {
            merger.drain_ready(&mut ready);
            for e in ready.drain(..) {
                sink.push(&e)?;
            }
        }
    }
    merger.finish(&mut ready);
    for e in ready.drain(..) {
        sink.push(&e)?;
    }
    let bytes = sink.bytes();
    sink.finish(&SessionStats::default(), None)?;
    let dt = t0.elapsed().as_secs_f64();
    Ok((N as f64 / dt, bytes as f64 / N as f64))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("llmprof-bench-{}.perfetto-trace", std::process::id()));
    for _ in 0..rounds() {
        let (rate, per_event) = round(&path)?;
        println!("bench\tmerge + Perfetto writer\tevents/s\t{rate}");
        println!("bench\ttrace bytes per slow-syscall event\tbytes\t{per_event}");
    }
    std::fs::remove_file(&path)?;
    Ok(())
}
