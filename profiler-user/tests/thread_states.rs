//! Thread states end to end, as a user would check them: the real `llmprof attach` (real eBPF on the
//! scheduler tracepoints) on `llmprof-testee` threads with known behaviour, the trace loaded into Perfetto's own
//! trace processor (its `thread_state` table is what Perfetto UI draws the thread-state rows from) and read by
//! `llmprof report --json`.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use e2e::attach::report_json as report;
use e2e::testee::Testee;

const LLMPROF: &str = env!("CARGO_BIN_EXE_llmprof");

/// `llmprof attach` on `pid` until it exits, probes live when this returns.
fn attach(pid: u32, trace: &Path) -> Child {
    let mut child = Command::new(LLMPROF)
        .args(["attach", "--pid", &pid.to_string(), "-d", "60s", "-o"])
        .arg(trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = e2e::attach::wait_probes_live(&mut child);
    child
}

/// Waits for `llmprof attach` to end; its summary (what it recorded, lost and cost).
fn finish(llmprof: Child) -> String {
    let out = llmprof.wait_with_output().unwrap();
    let summary = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "attach failed: {summary}");
    summary
}

/// The report's row of thread `tid` in group `name`.
fn report_thread(r: &serde_json::Value, name: &str, tid: u32) -> serde_json::Value {
    let groups = r["thread_states"]["groups"].as_array().unwrap();
    let g = groups
        .iter()
        .find(|g| g["name"] == name)
        .unwrap_or_else(|| panic!("no group {name:?} in {}", r["thread_states"]));
    g["per_thread"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == tid)
        .cloned()
        .unwrap_or_else(|| panic!("no thread {tid} in {g}"))
}

fn ready() -> bool {
    e2e::require(e2e::is_root(), "not root: cannot load eBPF programs")
        && e2e::require(
            e2e::trace_processor::available(),
            "Perfetto trace processor not installed (cargo xtask setup-tools)",
        )
}

fn tmp(name: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("llmprof-sched-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.perfetto-trace");
    (dir, trace)
}

/// The two tests do not overlap: the competitor's spinning core would preempt the sleeper between arming its
/// timer and leaving the CPU (its Sleeping row then starts late, or, when the timer fires first, the sleep is
/// spent Runnable with no Sleeping row at all: right, but not what the sleeper test checks).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A thread that sleeps 10 × 20 ms in nanosleep: ten Sleeping (S) rows of at least 19 ms each for that tid (a
/// row starts when the thread leaves the CPU, a few µs after its timer was armed), one `thread` row for it
/// under the testee's process, a waker on the Runnable row after each sleep, and the report's sleeping time
/// equal to the trace processor's.
#[test]
fn a_thread_sleeping_in_nanosleep_shows_sleeping_rows_of_its_sleeps() {
    if !ready() {
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, trace) = tmp("sleep");
    let mut t = Testee::spawn(&[]);
    let llmprof = attach(t.pid(), &trace);
    t.send("sleeper 10 20");
    let tid: u32 = t.expect("sleeper ").parse().unwrap();
    t.expect("sleeper done");
    let pid = t.pid();
    // The session ends (Ctrl-C) while the testee still runs: llmprof symbolizes a stack when it drains it,
    // from the live process's maps, and a loaded machine may drain the last ones after a quick exit.
    // SAFETY: kill(2) on our own child's pid with SIGINT has no memory-safety preconditions.
    unsafe { libc::kill(llmprof.id() as i32, libc::SIGINT) };
    let summary = finish(llmprof);
    t.exit();

    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    let rows = tp
        .query(&format!(
            "select s.ts, s.dur, s.state from thread_state s join thread t using(utid) where t.tid = {tid} order by s.ts"
        ))
        .unwrap_or_default();
    let q =
        |tp: &mut e2e::trace_processor::Trace, sql: &str| tp.query_i64(sql).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        q(
            &mut tp,
            &format!(
                "select count(*) from thread t join process p using(upid) where t.tid = {tid} and p.pid = {pid}"
            )
        ),
        1,
        "the sleeper is one thread of the testee's process"
    );
    assert_eq!(
        q(&mut tp, &format!("select count(*) from thread where tid = {tid}")),
        1,
        "no second thread row for the same tid"
    );
    let sleeps = format!(
        "from thread_state s join thread t using(utid) where t.tid = {tid} and s.state = 'S' and s.dur >= 19000000"
    );
    assert_eq!(
        q(&mut tp, &format!("select count(*) {sleeps}")),
        10,
        "one S row per sleep; the sleeper's rows: {rows:?}; llmprof: {summary}"
    );
    assert!(
        q(
            &mut tp,
            &format!(
                "select count(*) from thread_state s join thread t using(utid) where t.tid = {tid} and s.state = 'Running'"
            )
        ) >= 10,
        "it ran between its sleeps"
    );
    assert!(
        q(
            &mut tp,
            &format!(
                "select count(*) from thread_state s join thread t using(utid) where t.tid = {tid} and s.state = 'R' and s.waker_utid is not null"
            )
        ) >= 10,
        "each wakeup names its waker"
    );
    let tp_sleep_ms = tp
        .query_f64(&format!(
            "select sum(s.dur) / 1e6 from thread_state s join thread t using(utid) where t.tid = {tid} and s.state = 'S'"
        ))
        .unwrap();
    assert!(tp_sleep_ms >= 190.0, "{tp_sleep_ms} ms asleep");
    // Off-CPU stacks (sampling is on by default): each sleep's row names where the thread blocked — the
    // kernel's nanosleep, the libc call and the testee's own function — as Perfetto UI's "Blocked function".
    let blocked_in_nap =
        format!("{sleeps} and s.blocked_function like '%nanosleep%clock_nanosleep%llmprof_testee_nap%'");
    assert_eq!(
        q(&mut tp, &format!("select count(*) {blocked_in_nap}")),
        10,
        "every sleep's blocked_function: {:?}",
        tp.query(&format!("select s.blocked_function {sleeps}")).unwrap()
    );
    assert!(
        q(
            &mut tp,
            &format!(
                "select count(*) {sleeps} and s.blocked_function like 'do_nanosleep ← hrtimer_nanosleep%'"
            )
        ) == 10,
        "the label starts at the kernel's block point (the scheduler's own frames left out)"
    );
    drop(tp);

    let r = report(&trace);
    let row = report_thread(&r, "sleeper", tid);
    let sleeping = row["sleeping_ms"].as_f64().unwrap();
    assert!(
        (sleeping - tp_sleep_ms).abs() < 0.001,
        "report {sleeping} ms vs trace processor {tp_sleep_ms} ms"
    );
    // "Time blocked and on what": the group's top off-CPU stack is the nap, with (nearly) all its sleep.
    let group = r["thread_states"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "sleeper")
        .unwrap();
    let top = &group["blocked_on"][0];
    let stack = top["stack"].as_str().unwrap();
    assert!(
        stack.contains("clock_nanosleep") && stack.contains("llmprof_testee_nap"),
        "top off-CPU stack of the sleeper: {}",
        group["blocked_on"]
    );
    assert!(top["count"].as_u64().unwrap() >= 10, "{top}");
    let blocked = top["blocked_ms"].as_f64().unwrap();
    assert!(
        blocked >= 200.0 && blocked <= sleeping + 0.001,
        "{blocked} ms blocked in the nap, {sleeping} ms asleep"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A CPU-bound competitor (another process) pinned to the same core as the target's thread: the target waits
/// for the CPU. Runnable (R) rows in `thread_state`, and the report's runnable time and wait count equal them.
#[test]
fn a_competitor_on_the_same_core_makes_the_targets_runnable_time_visible() {
    if !ready() {
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, trace) = tmp("contend");
    let cpu = 0;
    let mut target = Testee::spawn(&[]);
    let mut competitor = Testee::spawn(&[]);
    let llmprof = attach(target.pid(), &trace);
    competitor.send(&format!("spin {cpu} 2000"));
    target.send(&format!("contend {cpu} 1000"));
    let tid: u32 = target.expect("contend ").parse().unwrap();
    target.expect("contend done");
    competitor.expect("spin done");
    target.exit();
    competitor.exit();
    finish(llmprof);

    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    let runnable = format!(
        "from thread_state s join thread t using(utid) where t.tid = {tid} and s.state in ('R', 'R+') and s.dur > 0"
    );
    let waits = tp.query_i64(&format!("select count(*) {runnable}")).unwrap();
    let tp_runnable_ms = tp
        .query_f64(&format!("select sum(s.dur) / 1e6 {runnable}"))
        .unwrap();
    let tp_running_ms = tp
        .query_f64(&format!(
            "select sum(s.dur) / 1e6 from thread_state s join thread t using(utid) where t.tid = {tid} and s.state = 'Running'"
        ))
        .unwrap();
    assert!(
        waits > 1,
        "the contended thread waited for its core more than once: {waits}"
    );
    // Sharing one core with a thread that never sleeps: a large part of its second of wall time is spent
    // waiting (the scheduler splits the core; 10 % is far below any fair share).
    assert!(
        tp_runnable_ms > 0.1 * (tp_runnable_ms + tp_running_ms),
        "runnable {tp_runnable_ms} ms, running {tp_running_ms} ms"
    );
    drop(tp);

    let r = report(&trace);
    let row = report_thread(&r, "contended", tid);
    let runnable_ms = row["runnable_ms"].as_f64().unwrap();
    assert!(
        (runnable_ms - tp_runnable_ms).abs() < 0.01,
        "report {runnable_ms} ms vs trace processor {tp_runnable_ms} ms"
    );
    let g = r["thread_states"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "contended")
        .unwrap()
        .clone();
    assert_eq!(g["runnable_wait_ms"]["count"].as_i64(), Some(waits), "{g}");
    assert!(g["runnable_wait_ms"]["p99"].as_f64().unwrap() > 0.0, "{g}");
    std::fs::remove_dir_all(&dir).unwrap();
}
