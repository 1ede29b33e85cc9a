//! Benchmark (not a timed assertion): how many events per second the merge + Perfetto sink sustain.
//! Run with `cargo test --release -p llmprof --test perfetto_throughput -- --ignored --nocapture`.
#![allow(clippy::unwrap_used, reason = "benchmark fails loudly on any error")]

use std::time::Instant;

use llmprof_trace::event::SessionStats;
use llmprof_trace::merge::{DEFAULT_WINDOW_NS, Merger};
use llmprof_trace::perfetto::TraceSink;
use llmprof_trace::testing;

#[test]
#[ignore = "benchmark: run explicitly with --ignored --nocapture"]
fn merge_and_sink_throughput() {
    const N: u64 = 1_000_000;
    let info = testing::process(1, "bench", "", (1..=8).map(|tid| (tid, format!("t{tid}"))));
    let path = std::env::temp_dir().join(format!("llmprof-bench-{}.perfetto-trace", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    let mut sink = TraceSink::new(file, &[info], None).unwrap();
    let mut merger = Merger::new(DEFAULT_WINDOW_NS);
    let mut ready = Vec::new();
    let t0 = Instant::now();
    for i in 0..N {
        // Two interleaved sources, slightly out of order; slow-syscall events (a slice each).
        let ts = 1_000_000_000 + i * 1000 + (i % 2) * 500;
        let ev = testing::slow_syscall(1, 1 + (i % 8) as u32, ts, 202, 0, 400);
        merger.push(ev);
        if i % 1024 == 0 {
            merger.drain_ready(&mut ready);
            for e in ready.drain(..) {
                sink.push(&e).unwrap();
            }
        }
    }
    merger.finish(&mut ready);
    for e in ready.drain(..) {
        sink.push(&e).unwrap();
    }
    let bytes = sink.bytes();
    sink.finish(&SessionStats::default(), None).unwrap();
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "merge + sink: {N} events in {dt:.2} s = {:.0} events/s, {:.1} bytes/event",
        N as f64 / dt,
        bytes as f64 / N as f64
    );
    std::fs::remove_file(&path).unwrap();
}
