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

#[test]
fn report_json_has_the_numbers_of_the_session() {
    let path = write_trace("ok.perfetto-trace");
    let j = report_json(&path);
    assert_eq!(j["format"], "llmprof-report/1");
    // The documented top-level layout (profiler-user/src/report.rs), in order.
    let keys: Vec<&str> = j.as_object().unwrap().keys().map(String::as_str).collect();
    let mut want_keys = [
        "format",
        "trace",
        "truncated",
        "has_summary",
        "end_reason",
        "requests",
        "steps",
        "counters",
        "syscalls",
        "model_files",
        "egress",
        "drops",
        "overhead",
        "gpu",
        "thread_states",
        "cpu_samples",
        "kernels",
    ];
    want_keys.sort_unstable();
    let mut keys_sorted = keys.clone();
    keys_sorted.sort_unstable();
    assert_eq!(keys_sorted, want_keys);
    assert_eq!(j["truncated"], false);
    assert_eq!(j["has_summary"], true);
    assert_eq!(j["end_reason"], "duration elapsed");

    // Requests and their TTFT decomposition.
    let r = &j["requests"];
    assert_eq!(r["count"], 4);
    assert_eq!(r["finished"], 3);
    assert_eq!(r["unfinished"], 1);
    let per: Vec<&Value> = r["per_request"].as_array().unwrap().iter().collect();
    let want = [
        // (id, queue, prefill, ttft, first decode step, finish)
        (1, 0.2, 1.0, 1.2, 0.5, "stop"),
        (2, 0.1, 1.0, 1.1, 0.5, "unfinished"),
        (3, 0.5, 0.5, 1.0, 0.3, "stop"),
    ];
    assert_eq!(per.len(), want.len() + 1);
    for (q, (id, queue, prefill, ttft, first, finish)) in per.iter().zip(want) {
        assert_eq!(q["req_id"], id);
        assert_eq!(q["x_request_id"], format!("xr-{id}"));
        assert_ms(&q["queue_ms"], queue);
        assert_ms(&q["prefill_ms"], prefill);
        assert_ms(&q["ttft_ms"], ttft);
        assert_ms(&q["first_decode_step_ms"], first);
        assert_eq!(q["finish_reason"], finish, "request {id}");
    }
    assert_eq!(per[1]["preemptions"], 1);
    assert_eq!(per[3]["attached_mid_request"], true);
    assert_eq!(per[3]["ttft_ms"], Value::Null, "arrival not seen");
    assert_eq!(per[3]["queue_ms"], Value::Null);
    assert_eq!(r["ttft_ms"]["count"], 3);
    assert_ms(&r["ttft_ms"]["p50"], 1.1);
    assert_ms(&r["ttft_ms"]["max"], 1.2);
    assert_ms(&r["queue_ms"]["p99"], 0.5);
    // ITL: 0.6, 0.7 for requests 1 and 2, 0.4, 0.5 for request 3, 1.0 for request 4.
    assert_eq!(r["itl_ms"]["count"], 7);
    assert_ms(&r["itl_ms"]["p50"], 0.6);
    assert_ms(&r["itl_ms"]["p95"], 1.0);

    // Steps by kind and batch size.
    let s = &j["steps"];
    assert_eq!(s["count"], 6);
    assert_eq!(s["by_kind"]["prefill"]["count"], 2);
    assert_eq!(s["by_kind"]["decode"]["count"], 3);
    assert_eq!(s["by_kind"]["mixed"]["count"], 1);
    assert_ms(&s["by_kind"]["prefill"]["max"], 1.0);
    let buckets = s["by_batch_size"].as_array().unwrap();
    assert_eq!(buckets.len(), 2);
    assert_eq!(buckets[0]["bucket"], "1");
    assert_eq!(buckets[0]["stats"]["count"], 3);
    assert_eq!(buckets[1]["bucket"], "2");
    assert_eq!(buckets[1]["stats"]["count"], 3);
    // Steps 5 and 6 replayed a graph (0.3 and 0.4 ms); step 2 (two requests) was launched eagerly.
    assert_eq!(s["graph_replayed"]["count"], 2);
    assert_ms(&s["graph_replayed"]["max"], 0.4);

    // KV cache and queue.
    let c = &j["counters"];
    assert_eq!(c["kv_cache_usage"]["samples"], 3);
    assert_ms(&c["kv_cache_usage"]["max"], 0.1);
    assert_ms(&c["kv_cache_usage"]["mean"], 0.05);
    assert_ms(&c["requests_waiting"]["max"], 2.0);
    assert_ms(&c["requests_waiting"]["mean"], 1.0);
    assert_ms(&c["preemptions_total"], 1.0);

    // Syscalls: the slow slices and the kernel aggregates (summed over threads), by total time.
    let slow = &j["syscalls"]["slow_syscall_slices"][0];
    assert_eq!(slow["name"], "nanosleep");
    assert_eq!(slow["count"], 2);
    assert_ms(&slow["total_ms"], 6.0);
    assert_ms(&slow["max_ms"], 4.0);
    let agg = j["syscalls"]["kernel_aggregates"].as_array().unwrap();
    assert_eq!(agg[0]["name"], "nanosleep");
    assert_eq!(agg[0]["count"], 5);
    assert_ms(&agg[0]["total_ms"], 9.0);
    assert_eq!(agg[1]["name"], "read");
    assert_eq!(agg[1]["count"], 50);

    // Model file: 1000 bytes in 0.1 ms = 10 MB/s.
    let m = &j["model_files"][0];
    assert_eq!(m["path"], "/models/m.gguf");
    assert_eq!(m["reads"], 1);
    assert_eq!(m["bytes"], 1000);
    assert_eq!(m["opens"], 1);
    assert_ms(&m["mb_per_s"], 10.0);

    // Egress: one allowed destination, one flagged (twice, both refused).
    let e = j["egress"].as_array().unwrap();
    assert_eq!(e.len(), 2);
    let flagged: Vec<&Value> = e.iter().filter(|d| d["verdict"] == "flagged").collect();
    assert_eq!(flagged.len(), 1);
    assert_eq!(flagged[0]["address"], "203.0.113.7");
    assert_eq!(flagged[0]["port"], 443);
    assert_eq!(flagged[0]["connects"], 2);
    assert_eq!(flagged[0]["failed"], 2);
    assert_eq!(flagged[0]["allowed"], false);

    // Drops, from the summary.
    let d = &j["drops"];
    assert_eq!(d["source"], "summary");
    assert_eq!(d["total_dropped"], 7);
    assert_eq!(d["user_drops"], 2);
    let sys = d["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["probe"] == "syscalls")
        .unwrap();
    assert_eq!(
        (&sys["hits"], &sys["emitted"], &sys["dropped"]),
        (&100.into(), &95.into(), &5.into())
    );

    // The terminal report says the same things in words.
    let out = llmprof(&["report"], &path);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "Requests: 4 (3 finished, 1 still running at the end)",
        "FLAGGED  203.0.113.7:443",
        "nanosleep",
        "/models/m.gguf",
        "Dropped: 7 total",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_trace_cut_mid_packet_is_reported_from_its_valid_prefix() {
    let full_path = write_trace("full.perfetto-trace");
    let full = std::fs::read(&full_path).unwrap();
    let _ = std::fs::remove_file(&full_path);
    let path = write_file("cut.perfetto-trace", &full[..full.len() - 7]);
    let j = report_json(&path);
    assert_eq!(j["truncated"], true);
    assert_eq!(j["has_summary"], false, "the summary is the last packet");
    assert_eq!(j["drops"]["source"], "drop_counters");
    assert_eq!(j["requests"]["count"], 4);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn files_that_are_not_llmprof_traces_fail_clearly() {
    // A Perfetto trace with only a process descriptor: valid protobuf, no llmprof tracks.
    let mut foreign = vec![TRACE_PACKET_TAG];
    TracePacket {
        track_descriptor: Some(TrackDescriptor {
            uuid: Some(1),
            process: Some(ProcessDescriptor {
                pid: Some(1),
                process_name: Some("init".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_length_delimited(&mut foreign)
    .unwrap();
    let random: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let cases: [(&str, &[u8], &str); 3] = [
        ("empty", &[], "is empty"),
        ("random", &random, "is not a Perfetto trace"),
        ("foreign", &foreign, "not one llmprof wrote"),
    ];
    for (name, bytes, msg) in cases {
        let path = write_file(name, bytes);
        for args in [&["report"][..], &["report", "--json"][..]] {
            let out = llmprof(args, &path);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{name} {args:?}: {err}");
            assert!(err.contains(msg), "{name}: stderr {err:?} lacks {msg:?}");
            assert!(out.stdout.is_empty(), "{name}: nothing on stdout");
        }
        let _ = std::fs::remove_file(&path);
    }
    let out = llmprof(&["report"], Path::new("/nonexistent/x.perfetto-trace"));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

#[test]
fn report_agrees_with_perfetto_trace_processor() {
    if !e2e::require(
        e2e::trace_processor::available(),
        "Perfetto trace processor not installed (cargo xtask setup-tools)",
    ) {
        return;
    }
    let path = write_trace("tp.perfetto-trace");
    let j = report_json(&path);
    let mut tp = e2e::trace_processor::load(&path).expect("trace loads");
    // TTFT: the sink's own `ttft_ms` on each `first token` instant, in request order.
    let rows = tp
        .query(&format!(
            "select cast(substr(t.name, {}) as int) as id, extract_arg(s.arg_set_id, '{}') as v \
             from slice s join track t on s.track_id = t.id where s.name = '{}' order by id",
            track::REQUEST_PREFIX.len() + 1,
            tp_arg(arg::TTFT_MS),
            slice::FIRST_TOKEN
        ))
        .unwrap();
    let ours: Vec<&Value> = j["requests"]["per_request"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| !q["ttft_ms"].is_null())
        .collect();
    let theirs: Vec<&Value> = rows.iter().filter(|r| r["id"] != 4).collect();
    assert_eq!(ours.len(), theirs.len());
    for (q, r) in ours.iter().zip(theirs) {
        assert_eq!(q["req_id"], r["id"]);
        assert!(close(&q["ttft_ms"], r["v"].as_f64().unwrap()), "{q} vs {r}");
    }
    // Steps by kind, and the slow syscall total.
    for kind in [StepKind::Prefill, StepKind::Decode, StepKind::Mixed].map(StepKind::name) {
        let n = tp
            .query_i64(&format!(
                "select count(*) from slice s join track t on s.track_id = t.id \
                 where t.name = '{}' and s.name = '{kind}'",
                track::STEPS
            ))
            .unwrap();
        assert_eq!(j["steps"]["by_kind"][kind]["count"], n, "{kind}");
    }
    let total = tp
        .query(&format!(
            "select sum(dur) / 1e6 as v from slice where name = '{}'",
            slice::syscall("nanosleep")
        ))
        .unwrap();
    assert!(close(
        &j["syscalls"]["slow_syscall_slices"][0]["total_ms"],
        total[0]["v"].as_f64().unwrap()
    ));
    drop(tp);
    let _ = std::fs::remove_file(&path);
}

/// Self-accounting and the overhead budget's steps, as `attach` writes them, come back out of `report`.
#[test]
fn report_shows_self_accounting_and_the_budget_steps() {
    let sample = OverheadSample {
        interval_ns: 1_000_000_000,
        est_added_ns: 30e6,
        target_cpu_ns: Some(530e6),
        est_overhead_pct: Some(6.0),
        llmprof_cpu_ns: 12e6,
        llmprof_rss_bytes: 20 << 20,
        cost_syscall_ns: 700.0,
        cost_syscall_decoded_ns: Some(900.0),
        cost_probe_ns: Some(1_800.0),
        cost_cuda_ns: Some(4_500.0),
        level: 0,
    };
    let step = Degradation {
        level: 1,
        name: "syscall_events_off",
        change: "individual syscall events off".into(),
        overhead_pct: 6.0,
        budget_pct: 1.0,
        syscalls_counted: 4_000,
    };
    let extra = [
        testing::event(PID, 0, at(10), EventBody::Overhead(Box::new(sample))),
        testing::event(PID, 0, at(20), EventBody::Degraded(step.clone())),
    ];
    let mut st = stats();
    st.overhead = Some(OverheadSummary {
        elapsed_ns: 2_000_000_000,
        est_added_ns: 40e6,
        est_added_by_probe_ns: vec![0.0, 0.0, 0.0, 40e6, 0.0, 0.0, 0.0, 0.0, 0.0],
        target_cpu_ns: Some(1_040e6),
        est_overhead_pct: Some(4.0),
        llmprof_cpu_ns: 20e6,
        llmprof_max_rss_bytes: 24 << 20,
        calibration: Some(Calibration {
            syscall_ns: 700.0,
            syscall_decoded_ns: Some(900.0),
            probe_ns: Some(1_800.0),
            probe_entry: Some(0xe8),
            cuda_call_ns: Some(4_500.0),
            sample_ns: Some(1_500.0),
            ..Calibration::default()
        }),
        budget_pct: Some(1.0),
        degradations: vec![step],
        size_limit: None,
        events_not_written: 0,
        symbolized_stacks: 120,
        symbolize_ns: 6e6,
        ..Default::default()
    });
    let trace = write_trace_with("overhead.perfetto-trace", &extra, &st);
    let j = report_json(&trace);
    let o = &j["overhead"];
    assert_ms(&o["est_target_cpu_ms"], 40.0);
    assert_ms(&o["est_target_pct"], 4.0);
    assert_ms(&o["cost_ns"]["syscall"], 700.0);
    assert_ms(&o["cost_ns"]["syscall_decoded"], 900.0);
    assert_ms(&o["cost_ns"]["engine_probe"], 1_800.0);
    assert_ms(&o["cost_ns"]["cuda_call"], 4_500.0);
    assert_ms(&o["cost_ns"]["sample"], 1_500.0);
    assert_eq!(o["symbolized_stacks"], 120, "{o}");
    assert_ms(&o["symbolize_ms"], 6.0);
    assert_ms(&o["llmprof_max_rss_mib"], 24.0);
    assert_ms(&o["by_probe_ms"]["syscalls"], 40.0);
    assert_eq!(o["probe_entry"], "call (optimized)");
    assert_ms(&o["budget_pct"], 1.0);
    assert_eq!(o["degradations"][0]["step"], "syscall_events_off");
    assert_eq!(o["degradations"][0]["syscalls_counted"], 4_000);
    assert_ms(&o["degradations"][0]["at_s"], 0.001);
    assert_eq!(o["size_limit_reached"], false);
    let out = llmprof(&["report"], &trace);
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "llmprof overhead",
        "cost per hit: syscall 700 ns (decoded 900 ns)",
        "CUDA call 4500 ns",
        "syscall_events_off",
        "peak RSS 24.0 MiB",
    ] {
        assert!(text.contains(want), "report lacks {want:?}:\n{text}");
    }
    // A trace without self-accounting says nothing about it.
    assert_eq!(
        report_json(&write_trace("plain.perfetto-trace"))["overhead"],
        Value::Null
    );
}

/// A CUDA driver call (argument 4096) on the scheduler thread at `ts` units + `off_ns`, lasting `dur_ns`.
fn cuda(ts: u64, off_ns: u64, func: CudaFunc, dur_ns: u64) -> Event {
    testing::cuda(PID, SCHED, at(ts) + off_ns, func, dur_ns, 4096)
}

/// One NVML sample of GPU 0 (no PCIe RX: unsupported counters stay absent).
fn gpu(ts: u64, util: f64, power: f64, proc_mib: Option<u64>) -> Event {
    let sample = GpuSample {
        util_mem_pct: Some(10.0),
        power_w: Some(power),
        process_mem_bytes: proc_mib.map(|m| m << 20),
        ..testing::h100(util)
    };
    testing::gpu(PID, at(ts), sample)
}

const CUDA_MARKER: &str = "CUDA driver probes attached: 41 entry points of /usr/lib/libcuda.so.1 (0 of them only reachable through \
     cuGetProcAddress)";

/// The GPU layer on top of the fixture:
/// - NVML samples at 0, 3 and 6 ms: utilization 20/50/80 % (mean 50, max 80), power 100/200/300 W, the
///   target's memory absent, then 256 and 512 MiB (2 samples, mean 384, max 512);
/// - decode step 2 (2.3-2.8 ms): 3 kernel launches of 4 µs, then a 0.2 ms `cuStreamSynchronize`;
/// - mixed step 3 (3.0-3.5 ms): 5 launches, a 0.1 ms synchronize and a 0.1 ms `cuMemcpyDtoH` (≥ 50 µs: its
///   own slice). Launches per step 3 and 5; synchronize 2 calls, 0.3 ms; all host time 0.432 ms.
fn gpu_events() -> Vec<Event> {
    let mut v = vec![
        gpu(0, 20.0, 100.0, None),
        gpu(30, 50.0, 200.0, Some(256)),
        gpu(60, 80.0, 300.0, Some(512)),
        testing::marker(PID, 0, at(1), CUDA_MARKER),
    ];
    for i in 0..3 {
        v.push(cuda(23, 10_000 * (i + 1), CudaFunc::LaunchKernel, 4_000));
    }
    v.push(cuda(24, 0, CudaFunc::StreamSynchronize, 2 * U));
    for i in 0..5 {
        v.push(cuda(30, 10_000 * (i + 1), CudaFunc::LaunchKernel, 4_000));
    }
    v.push(cuda(32, 0, CudaFunc::StreamSynchronize, U));
    v.push(cuda(33, 0, CudaFunc::MemcpyDtoH, U));
    v
}

fn cuda_probe() -> usize {
    llmprof_abi::PROBE_NAMES
        .iter()
        .position(|n| *n == "cuda")
        .unwrap()
}

#[test]
fn report_has_a_gpu_section_with_counters_cuda_time_and_markers() {
    let mut st = stats();
    st.probes[cuda_probe()].hits = 12;
    st.probes[cuda_probe()].emitted = 11;
    st.probes[cuda_probe()].dropped = 1;
    let path = write_trace_with("gpu.perfetto-trace", &gpu_events(), &st);
    let j = report_json(&path);
    let g = &j["gpu"];
    assert_eq!(g["gpus"].as_array().unwrap().len(), 1, "{g:#}");
    let gpu0 = &g["gpus"][0];
    assert_eq!(gpu0["index"], 0);
    assert_eq!(gpu0["name"], "NVIDIA H100 80GB HBM3 (GPU-0123)");
    let counter = |metric: &str| -> &Value {
        gpu0["counters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["metric"] == metric)
            .unwrap_or_else(|| panic!("no {metric} in {gpu0:#}"))
    };
    let util = counter(counter::GPU_UTILIZATION.0);
    assert_eq!(
        (util["unit"].as_str(), &util["samples"]),
        (Some("%"), &Value::from(3))
    );
    assert_ms(&util["mean"], 50.0);
    assert_ms(&util["max"], 80.0);
    assert_ms(&counter(counter::GPU_POWER.0)["mean"], 200.0);
    assert_ms(&counter(counter::GPU_MEMORY_USED.0)["max"], 1024.0);
    assert!(
        gpu0["counters"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["metric"] != counter::GPU_PCIE_RX.0),
        "an unsupported counter is not reported"
    );
    let mem = &gpu0["process_memory_mib"][0];
    assert_eq!(
        (&mem["pid"], &mem["samples"]),
        (&Value::from(PID), &Value::from(2))
    );
    assert_ms(&mem["mean"], 384.0);
    assert_ms(&mem["max"], 512.0);

    let c = &g["cuda"];
    let f = |name: &str| -> &Value {
        c["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["function"] == name)
            .unwrap_or_else(|| panic!("no {name} in {c:#}"))
    };
    let sync = f("cuStreamSynchronize");
    assert_eq!(sync["calls"], 2);
    assert_ms(&sync["total_ms"], 0.3);
    assert_eq!(sync["individual"]["count"], 2);
    assert_ms(&sync["individual"]["p50"], 0.1);
    assert_ms(&sync["individual"]["p99"], 0.2);
    assert_ms(&sync["individual"]["max"], 0.2);
    let launch = f("cuLaunchKernel");
    assert_eq!(
        (&launch["calls"], &launch["individual"]["count"]),
        (&Value::from(8), &Value::from(0))
    );
    assert_ms(&launch["total_ms"], 0.032);
    assert_eq!(f("cuMemcpyDtoH")["calls"], 1);
    assert_eq!(
        c["functions"][0]["function"], "cuStreamSynchronize",
        "by total time"
    );
    assert_ms(&c["host_total_ms"], 0.432);
    assert_eq!(c["synchronize_calls"], 2);
    assert_ms(&c["synchronize_ms"], 0.3);
    let lps = &c["launches_per_step"];
    assert_eq!(lps["count"], 2);
    assert_ms(&lps["p50"], 3.0);
    assert_ms(&lps["max"], 5.0);
    assert_eq!(
        c["summary"],
        serde_json::json!({"calls": 11, "individual": 3, "batches": 2, "batched": 8, "over_budget": 0})
    );
    assert_eq!(
        c["probe"],
        serde_json::json!({"hits": 12, "emitted": 11, "dropped": 1})
    );
    assert_eq!(
        CUDA_MARKER,
        marker::cuda_probes_attached(41, "/usr/lib/libcuda.so.1", 0),
        "the fixture's marker is the one llmprof writes"
    );
    assert_eq!(g["markers"], serde_json::json!([CUDA_MARKER]));
    assert_eq!(
        j["drops"]["total_dropped"], 8,
        "5 syscalls + 1 cuda probe drops + 2 in user space"
    );

    let out = llmprof(&["report"], &path);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "GPU 0: NVIDIA H100 80GB HBM3 (GPU-0123)",
        "utilization                samples      3  mean      50.00  max      80.00 %",
        "memory of pid 4242         samples      2  mean     384.00  max     512.00 MiB",
        "the host waited for the GPU in 2 synchronize calls, 0.300 ms",
        "cuStreamSynchronize              2        0.300       2      0.100      0.200      0.200",
        "cuLaunchKernel                   8        0.032       0          -          -          -",
        "launches per engine step: 2 steps, p50 3, max 5",
        "calls 11: 3 individual, 8 in 2 batches",
        "marker: CUDA driver probes attached: 41 entry points",
        "cuda             hits         12  emitted         11  dropped        1",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_trace_without_gpu_data_leaves_the_section_out() {
    let path = write_trace("nogpu.perfetto-trace");
    assert_eq!(report_json(&path)["gpu"], Value::Null);
    let out = llmprof(&["report"], &path);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("\nGPU"), "nothing to say, no section: {text}");
    let _ = std::fs::remove_file(&path);
}

/// The GPU numbers of the report against Perfetto's trace processor on the same file.
#[test]
fn gpu_section_agrees_with_perfetto_trace_processor() {
    if !e2e::require(
        e2e::trace_processor::available(),
        "Perfetto trace processor not installed (cargo xtask setup-tools)",
    ) {
        return;
    }
    let path = write_trace_with("gpu-tp.perfetto-trace", &gpu_events(), &stats());
    let j = report_json(&path);
    let mut tp = e2e::trace_processor::load(&path).expect("trace loads");
    let row = tp
        .query(&format!(
            "select avg(c.value) as mean, max(c.value) as max, count(*) as n from counter c \
             join counter_track t on c.track_id = t.id where t.name = '{}'",
            track::gpu_counter(0, counter::GPU_UTILIZATION.0)
        ))
        .unwrap();
    let util = &j["gpu"]["gpus"][0]["counters"][0];
    assert_eq!(util["metric"], counter::GPU_UTILIZATION.0);
    assert_eq!(util["samples"], row[0]["n"]);
    assert!(
        close(&util["mean"], row[0]["mean"].as_f64().unwrap()),
        "{util} vs {row:?}"
    );
    assert!(
        close(&util["max"], row[0]["max"].as_f64().unwrap()),
        "{util} vs {row:?}"
    );
    let sync = tp
        .query(&format!(
            "select sum(dur) / 1e6 as v from slice where category = '{}' and name like '%{}'",
            category::CUDA_HOST,
            slice::cuda_call("Synchronize")
        ))
        .unwrap();
    assert!(close(
        &j["gpu"]["cuda"]["synchronize_ms"],
        sync[0]["v"].as_f64().unwrap()
    ));
    let (launches, step_id) = (tp_arg(arg::LAUNCHES), tp_arg(arg::STEP_ID));
    let most = tp
        .query_i64(&format!(
            "select max(n) from (select sum(extract_arg(arg_set_id, '{launches}')) as n from slice \
             where category = '{}' and extract_arg(arg_set_id, '{step_id}') is not null \
             group by extract_arg(arg_set_id, '{step_id}'))",
            category::CUDA_HOST
        ))
        .unwrap();
    assert!(close(&j["gpu"]["cuda"]["launches_per_step"]["max"], most as f64));
    drop(tp);
    let _ = std::fs::remove_file(&path);
}
