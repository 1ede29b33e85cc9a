//! Benchmark (not a timed assertion): how many events per second the merge + Perfetto sink sustain.
//! Run with `cargo test --release -p llmprof --test perfetto_throughput -- --ignored --nocapture`.
#![allow(clippy::unwrap_used, reason = "benchmark fails loudly on any error")]

use std::time::Instant;

use llmprof_trace::event::{Event, EventBody, ProcessInfo, SessionStats, ThreadInfo};
use llmprof_trace::merge::{DEFAULT_WINDOW_NS, Merger};
use llmprof_trace::perfetto::TraceSink;

#[test]
#[ignore = "benchmark: run explicitly with --ignored --nocapture"]
fn merge_and_sink_throughput() {
    const N: u64 = 1_000_000;
    let info = ProcessInfo {
        pid: 1,
        name: "bench".into(),
        cmdline: String::new(),
        threads: (1..=8)
            .map(|tid| ThreadInfo {
                tid,
                name: format!("t{tid}"),
            })
            .collect(),
        engine_probes: true,
    };
    let path = std::env::temp_dir().join(format!("llmprof-bench-{}.perfetto-trace", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    let mut sink = TraceSink::new(file, &[info], None).unwrap();
    let mut merger = Merger::new(DEFAULT_WINDOW_NS);
    let mut ready = Vec::new();
    let t0 = Instant::now();
    for i in 0..N {
        // Two interleaved sources, slightly out of order; slow-syscall events (a slice each).
        let ts = 1_000_000_000 + i * 1000 + (i % 2) * 500;
        let ev = Event {
            ts_ns: ts,
            pid: 1,
            tid: 1 + (i % 8) as u32,
            body: EventBody::SlowSyscall {
                nr: 202,
                ret: 0,
                dur_ns: 400,
            },
        };
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
