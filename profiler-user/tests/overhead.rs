//! Overhead you can prove, as a user checks it: real `llmprof attach` (real eBPF, as root) on the
//! syscall-heavy mode of `llmprof-testee`, the trace read back by Perfetto's trace processor.
//! - every trace accounts for llmprof itself (counter tracks, summary, exit summary);
//! - `--overhead-budget` degrades in the documented order, each step an instant, and the per-syscall events
//!   stop at the first step while the kernel aggregates go on;
//! - `--max-trace-size` ends the trace cleanly at the cap.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use e2e::testee::Testee;
use e2e::trace_processor::{self, Trace, load_clean};
use llmprof_trace::names::{arg, counter, marker, slice, tp_arg};

const LLMPROF: &str = env!("CARGO_BIN_EXE_llmprof");

fn ready() -> bool {
    e2e::require(e2e::is_root(), "not root: cannot load eBPF programs")
        && e2e::require(
            trace_processor::available(),
            "Perfetto trace processor not installed (cargo xtask setup-tools)",
        )
}

/// Runs `llmprof attach` on `pid` with `args`; once its probes are live, `then()` runs. Returns (exit code,
/// stdout, stderr).
fn attach(pid: u32, trace: &Path, args: &[&str], then: impl FnOnce()) -> (Option<i32>, String, String) {
    let mut child = Command::new(LLMPROF)
        .args(["attach", "--pid", &pid.to_string(), "-o"])
        .arg(trace)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let err_thread = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("probes live") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("llmprof attach never said `probes live`");
    then();
    let out = child.wait_with_output().unwrap();
    let stderr = err_thread.join().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llmprof-overhead-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn every_trace_accounts_for_llmprof_itself() {
    if !ready() {
        return;
    }
    let d = dir("selfacct");
    let trace = d.join("t.perfetto-trace");
    let mut t = Testee::spawn(&[]);
    t.discard_output();
    let (code, stdout, stderr) = attach(t.pid(), &trace, &["-d", "2500ms", "-v"], || {
        t.send("syscalls 300000 50 0")
    });
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    for want in [
        "cost per hit (measured beside the session",
        "overhead: est.",
        "peak RSS",
        "probe syscalls: hits",
    ] {
        assert!(stdout.contains(want), "exit summary lacks {want:?}:\n{stdout}");
    }
    let mut tp = load_clean(&trace);
    assert!(tp.peak(counter::COST_SYSCALL.0) > 0.0);
    assert!(tp.peak(counter::COST_SYSCALL_DECODED.0) > 0.0);
    assert!(tp.peak(counter::COST_ENGINE_PROBE.0) > 0.0);
    assert!(tp.peak(counter::LLMPROF_RSS.0) > 1.0, "RSS in MiB");
    assert!(tp.peak(counter::OVERHEAD_ADDED_CPU.0) > 0.0);
    assert!(tp.peak(counter::OVERHEAD_TARGET_PCT.0) > 0.0);
    let cpu = tp.peak(counter::LLMPROF_CPU.0);
    assert!((0.0..=200.0).contains(&cpu), "llmprof CPU {cpu}% of one core");
    let summary = format!("from slice where name = '{}'", marker::SUMMARY);
    for key in [
        arg::COST_NS_SYSCALL,
        arg::COST_NS_SYSCALL_DECODED,
        arg::LLMPROF_MAX_RSS_MIB,
        arg::LLMPROF_MAX_PRIVATE_MIB,
        arg::OVERHEAD_EST_TARGET_CPU_MS,
    ] {
        let sql = format!("select extract_arg(arg_set_id, '{}') {summary}", tp_arg(key));
        assert!(tp.float(&sql) > 0.0, "{key}");
    }
    let mut mib = |key: &str| {
        tp.float(&format!(
            "select extract_arg(arg_set_id, '{}') {summary}",
            tp_arg(key)
        ))
    };
    let (private, rss) = (mib(arg::LLMPROF_MAX_PRIVATE_MIB), mib(arg::LLMPROF_MAX_RSS_MIB));
    assert!(
        private <= rss + 1.0,
        "its own {private} MiB of a peak RSS of {rss} MiB"
    );
    drop(tp);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn budget_exceeded_on_a_syscall_heavy_target_degrades_in_order() {
    if !ready() {
        return;
    }
    let d = dir("budget");
    let trace = d.join("t.perfetto-trace");
    let mut t = Testee::spawn(&[]);
    t.discard_output();
    // getppid in a tight loop, with a 2 ms sleep (a slow syscall) every 200 calls.
    let (code, stdout, stderr) = attach(t.pid(), &trace, &["-d", "3s", "--overhead-budget", "1%"], || {
        t.send("syscalls 600000 10 200")
    });
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("overhead budget 1%: degraded: syscall_events_off"),
        "{stdout}"
    );
    assert!(stderr.contains("overhead budget 1% exceeded"), "{stderr}");
    let mut tp = load_clean(&trace);
    let step = |tp: &mut Trace, name: &str, col: &str| {
        tp.query_i64(&format!(
            "select {col} from slice where name = '{}' order by ts limit 1",
            marker::degradation(name)
        ))
        .unwrap_or_else(|e| panic!("no step {name} in the trace: {e}"))
    };
    let off_ts = step(&mut tp, "syscall_events_off", "ts");
    let detached_ts = step(&mut tp, "syscalls_detached", "ts");
    assert!(off_ts < step(&mut tp, "ranges_sampled", "ts"));
    assert!(
        step(&mut tp, "ranges_sampled", "ts") < detached_ts,
        "documented order"
    );
    // Per-syscall events before the first step, none after it.
    let slow = format!(
        "select count(*) from slice where name like '{}%'",
        slice::SYSCALL_PREFIX
    );
    assert!(
        tp.int(&format!("{slow} and ts < {off_ts}")) > 0,
        "slow syscalls before the step"
    );
    assert_eq!(
        tp.int(&format!("{slow} and ts > {off_ts}")),
        0,
        "slow syscalls after the step"
    );
    // The kernel aggregates went on counting between the first step and the detach.
    let counted_col = format!("extract_arg(arg_set_id, '{}')", tp_arg(arg::SYSCALLS_COUNTED));
    let counted = |tp: &mut Trace, name: &str| step(tp, name, &counted_col);
    let at_off = counted(&mut tp, "syscall_events_off");
    let at_detach = counted(&mut tp, "syscalls_detached");
    assert!(at_detach > at_off, "aggregates continued: {at_off} → {at_detach}");
    let rows = tp
        .query(&format!(
            "select extract_arg(arg_set_id, '{}') as d from slice where name = '{}'",
            tp_arg(arg::DEGRADATIONS),
            marker::SUMMARY
        ))
        .unwrap();
    let steps = rows[0]["d"].as_str().unwrap_or_default().to_owned();
    assert!(
        // No CUDA probe on this target: the cuda_detached step is taken and says so, in its place.
        steps.starts_with(
            "syscall_events_off ranges_sampled thread_states_off cuda_detached http_sse_off syscalls_detached"
        ),
        "summary: {steps}"
    );
    drop(tp);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn max_trace_size_ends_the_trace_cleanly_at_the_cap() {
    if !ready() {
        return;
    }
    let d = dir("cap");
    let trace = d.join("t.perfetto-trace");
    let mut t = Testee::spawn(&[]);
    t.discard_output();
    const CAP: u64 = 256 << 10;
    // Every syscall is an event (--slow-syscall 0): the cap is reached in well under a second.
    let (code, stdout, stderr) = attach(
        t.pid(),
        &trace,
        &["-d", "30s", "--slow-syscall", "0", "--max-trace-size", "256KiB"],
        || t.send("syscalls 3000000 0 0"),
    );
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("trace size limit reached"), "{stdout}");
    let size = std::fs::metadata(&trace).unwrap().len();
    assert!(size <= CAP, "trace is {size} bytes, cap {CAP}");
    assert!(
        size > CAP / 2,
        "the cap, not something else, ended it: {size} bytes"
    );
    let mut tp = load_clean(&trace);
    assert_eq!(
        tp.int(&format!(
            "select count(*) from slice where name like '{}%'",
            marker::SIZE_LIMIT_REACHED
        )),
        1
    );
    assert_eq!(
        tp.int(&format!(
            "select count(*) from slice where name = '{}' and extract_arg(arg_set_id, '{}') = '{}'",
            marker::SUMMARY,
            tp_arg(arg::END_REASON),
            marker::SIZE_LIMIT_REACHED
        )),
        1
    );
    let slow = format!(
        "select count(*) from slice where name like '{}%'",
        slice::SYSCALL_PREFIX
    );
    assert!(tp.int(&slow) > 100);
    drop(tp);
    // Bad input: a cap too small to hold the end of a trace.
    let out = Command::new(LLMPROF)
        .args([
            "attach",
            "--pid",
            &t.pid().to_string(),
            "--max-trace-size",
            "1K",
            "-o",
        ])
        .arg(d.join("x.perfetto-trace"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("too small"));
    std::fs::remove_dir_all(&d).unwrap();
}
