//! `llmprof report` on a trace written by the real sink from a fixture session: the real binary, `--json`
//! parsed like a script would, the numbers a user checks against what the fixture did; and files that are not
//! llmprof traces fail with a clear message and a non-zero exit.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use llmprof_abi::{CudaFunc, FileOp, RequestEventKind, StepKind};
use llmprof_trace::calibration::Calibration;
use llmprof_trace::event::{
    Degradation, Event, EventBody, GpuSample, OverheadSample, OverheadSummary, SessionStats, SyscallAggregate,
};
use llmprof_trace::names::{arg, category, counter, marker, slice, tp_arg, track};
use llmprof_trace::perfetto::TraceSink;
use llmprof_trace::perfetto::schema::{ProcessDescriptor, TRACE_PACKET_TAG, TracePacket, TrackDescriptor};
use llmprof_trace::testing;
use prost::Message;
use serde_json::Value;

mod gpu;
mod session;

const PID: u32 = 4242;
const MAIN: u32 = 4242;
const SCHED: u32 = 4243;
/// 0.1 ms: the fixture's time unit.
const U: u64 = 100_000;
const T0: u64 = 1_000_000_000_000;

/// `ts` units of [`U`] after [`T0`] (BOOTTIME ns).
fn at(ts: u64) -> u64 {
    T0 + ts * U
}

/// A step of the fixture on the scheduler thread: one decode token per request, 3 of 64 KV blocks; a decode
/// step of one request replays the CUDA graph of batch size 1.
fn step(id: u64, kind: StepKind, start: u64, end: u64, reqs: &[u64]) -> Event {
    let graph = u32::from(kind == StepKind::Decode && reqs.len() == 1);
    testing::step(PID, SCHED, kind, id, at(start), at(end), reqs)
        .tokens(0, reqs.len() as u32)
        .kv_blocks(3, 64)
        .graph(graph)
        .build()
}

/// A transition of one of the fixture's chat requests (12 prompt tokens, `max_tokens` 16).
fn req(ts: u64, id: u64, kind: RequestEventKind, output: u32, finish: u32) -> Event {
    testing::request(PID, kind, id, at(ts))
        .chat("smollm2", &format!("xr-{id}"))
        .prompt(12, 16)
        .sampling(0.0, 1.0)
        .output_raw(output, finish)
        .preemptions(u32::from(kind == RequestEventKind::Preempted))
        .build()
}

/// A `/metrics` scrape: one request running; the preemption at 2.9 ms counted from 3.0 ms on.
fn metrics(ts: u64, kv: f64, waiting: f64) -> Event {
    testing::metrics(PID, at(ts), kv, 1.0, waiting, if ts > 29 { 1.0 } else { 0.0 })
}

/// Three requests (times in units of 0.1 ms):
/// - 1: arrives 10, scheduled 12, first token 22, finished 36 with 3 tokens → queue 0.2, prefill 1.0 ms;
/// - 2: arrives 11, scheduled 12, first token 22, preempted 29, rescheduled 30, running at the end → queue 0.1;
/// - 3: arrives 40, scheduled 45, first token 50, finished 60 with 3 tokens → queue 0.5, prefill 0.5 ms;
/// - 4: already running when llmprof attached (first seen at its first token, 55), finished 65 with 2 tokens
///   and no step naming it: TTFT unknown, one ITL sample (65 − 55) / (2 − 1) = 1.0 ms.
///
/// Steps: prefill 12-22 [1,2], decode 23-28 [1,2], mixed 30-35 [1,2], prefill 45-50 [3], decode 51-54 [3],
/// decode 55-59 [3]. First decode step: 0.5, 0.5, 0.3 ms. ITL: 0.6, 0.7 (req 1 and 2), 0.4, 0.5 (req 3).
fn fixture() -> Vec<Event> {
    use RequestEventKind::*;
    let mut v = vec![
        metrics(0, 0.0, 0.0),
        req(10, 1, Arrived, 0, 0),
        req(11, 2, Arrived, 0, 0),
        req(12, 1, Scheduled, 0, 0),
        req(12, 2, Scheduled, 0, 0),
        step(1, StepKind::Prefill, 12, 22, &[1, 2]),
        req(22, 1, FirstToken, 1, 0),
        req(22, 2, FirstToken, 1, 0),
        step(2, StepKind::Decode, 23, 28, &[1, 2]),
        req(29, 2, Preempted, 2, 0),
        metrics(30, 0.05, 1.0),
        req(30, 2, Scheduled, 2, 0),
        step(3, StepKind::Mixed, 30, 35, &[1, 2]),
        req(36, 1, Finished, 3, 1),
        req(40, 3, Arrived, 0, 0),
        req(45, 3, Scheduled, 0, 0),
        step(4, StepKind::Prefill, 45, 50, &[3]),
        req(50, 3, FirstToken, 1, 0),
        step(5, StepKind::Decode, 51, 54, &[3]),
        step(6, StepKind::Decode, 55, 59, &[3]),
        req(60, 3, Finished, 3, 1),
        req(55, 4, FirstToken, 1, 0),
        req(65, 4, Finished, 2, 1),
        metrics(60, 0.1, 2.0),
        testing::slow_syscall(PID, SCHED, at(40), 35, 0, 20 * U),
        testing::slow_syscall(PID, SCHED, at(62), 35, 0, 40 * U),
        testing::event(
            PID,
            MAIN,
            at(50),
            EventBody::FileOpen {
                path: "/models/m.gguf".into(),
                ret: 7,
                dur_ns: U / 10,
            },
        ),
        testing::event(
            PID,
            MAIN,
            at(51),
            EventBody::FileIo {
                op: FileOp::Read,
                fd: 7,
                path: Some("/models/m.gguf".into()),
                ret: 1000,
                len: 1000,
                dur_ns: U,
            },
        ),
        testing::connect(PID, MAIN, at(61), ([10, 0, 0, 1], 80), 0, true),
        testing::connect(PID, MAIN, at(62), ([203, 0, 113, 7], 443), -111, false),
        testing::connect(PID, MAIN, at(63), ([203, 0, 113, 7], 443), -111, false),
    ];
    v.sort_by_key(|e| e.ts_ns);
    v
}

fn stats() -> SessionStats {
    let mut s = SessionStats {
        end_reason: "duration elapsed".into(),
        user_drops: 2,
        ..Default::default()
    };
    s.probes[0].hits = 6;
    s.probes[0].emitted = 6;
    s.probes[3].hits = 100;
    s.probes[3].emitted = 95;
    s.probes[3].dropped = 5;
    for (tid, count, total_ns) in [(SCHED, 4, 80 * U), (MAIN, 1, 10 * U)] {
        s.syscalls.push(SyscallAggregate {
            pid: PID,
            tid,
            nr: 35,
            count,
            total_ns,
            hist: vec![0; 32],
        });
    }
    s.syscalls.push(SyscallAggregate {
        pid: PID,
        tid: MAIN,
        nr: 0,
        count: 50,
        total_ns: 5 * U,
        hist: vec![0; 32],
    });
    s
}

fn write_trace(name: &str) -> PathBuf {
    write_trace_with(name, &[], &stats())
}

fn write_trace_with(name: &str, extra: &[Event], stats: &SessionStats) -> PathBuf {
    let process = testing::process(
        PID,
        "llmserve",
        "llmserve --model m.gguf",
        [(MAIN, "llmserve"), (SCHED, "scheduler")],
    );
    let mut sink = TraceSink::new(Vec::new(), &[process], Some((T0, 1_700_000_000_000_000_000))).unwrap();
    let mut events = fixture();
    events.extend(extra.iter().cloned());
    events.sort_by_key(|e| e.ts_ns);
    for e in events {
        sink.push(&e).unwrap();
    }
    let bytes = sink.finish(stats, Some(T0 + 70 * U)).unwrap();
    write_file(name, &bytes)
}

fn write_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("llmprof-report-{}-{name}", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

fn llmprof(args: &[&str], trace: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_llmprof"))
        .args(args)
        .arg(trace)
        .output()
        .unwrap()
}

fn report_json(trace: &Path) -> Value {
    let out = llmprof(&["report", "--json"], trace);
    assert!(
        out.status.success(),
        "report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "--json is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn close(v: &Value, want: f64) -> bool {
    v.as_f64().is_some_and(|x| (x - want).abs() < 1e-6)
}

#[track_caller]
fn assert_ms(v: &Value, want: f64) {
    assert!(close(v, want), "got {v}, want {want}");
}
