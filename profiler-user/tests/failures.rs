//! How `llmprof attach` fails, as an operator would check it: `kill -9` of llmprof mid-trace leaves nothing
//! loaded in the kernel and a file that still loads; SIGHUP ends a session like SIGTERM; the traced process
//! killed mid-trace still gives a complete trace. The real binary, real eBPF, `llmprof-testee` as the target,
//! Perfetto's trace processor and `llmprof report` as the readers.
//!
//! Needs root and the trace processor: skips loudly without them, fails under CI (see [`e2e::require`]).
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use std::collections::BTreeSet;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::time::{Duration, Instant};

use e2e::attach::{report_json, report_text};
use e2e::testee::Testee;
use e2e::trace_processor::Trace;
use llmprof::attach::{END_INTERRUPTED, END_TARGET_EXITED};
use llmprof_trace::names::{marker, slice};
use serde_json::Value;

const LLMPROF: &str = env!("CARGO_BIN_EXE_llmprof");
/// Points NVML at a library that does not exist, so every host takes the same "NVML absent" path.
const NO_NVML: &str = "/nonexistent/libnvidia-ml.so.1";
/// Prefix of every eBPF program llmprof loads (`profiler-ebpf/src/main.rs`), as the kernel lists it.
const PROG_PREFIX: &str = "llmprof_";
/// How long a program may stay in the kernel's listing after its last holder went: a raw-tracepoint link
/// releases its program after an RCU grace period (kernel 6.9+ defers the link's dealloc).
const RELEASE_WAIT: Duration = Duration::from_secs(5);
/// The slow-syscall threshold of these sessions: the testee's `go` sleeps 20 ms, well above it.
const SLOW: &str = "10ms";
/// The tracefs files where probes created through the text interface would be listed (aya's fallback before
/// kernel 4.17 names them `aya_<pid>_…`; on newer kernels its perf-event probes live only as long as the fd).
const PROBE_EVENT_FILES: [&str; 4] = [
    "/sys/kernel/tracing/uprobe_events",
    "/sys/kernel/debug/tracing/uprobe_events",
    "/sys/kernel/tracing/kprobe_events",
    "/sys/kernel/debug/tracing/kprobe_events",
];
/// The tests compare the kernel's program listing before and after: one at a time in this binary.
static KERNEL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn preconditions() -> bool {
    e2e::require(e2e::is_root(), "not root: cannot load eBPF programs")
        && e2e::require(
            e2e::trace_processor::available(),
            "Perfetto trace processor not installed (cargo xtask setup-tools)",
        )
}

fn serial() -> std::sync::MutexGuard<'static, ()> {
    KERNEL.lock().unwrap_or_else(|e| e.into_inner())
}

fn temp_dir(name: &str) -> PathBuf {
    e2e::fixtures::scratch_dir(&format!("llmprof-failures-{name}"))
}

/// A running `llmprof attach`, returned once it says its probes are live.
struct Attach {
    child: Child,
    stderr: BufReader<ChildStderr>,
    seen: String,
}

impl Attach {
    fn start(pid: u32, trace: &Path) -> Attach {
        Self::start_with(pid, trace, &[])
    }

    fn start_with(pid: u32, trace: &Path, extra: &[&str]) -> Attach {
        let mut child = Command::new(LLMPROF)
            .args([
                "attach",
                "--pid",
                &pid.to_string(),
                "-d",
                "60s",
                "--slow-syscall",
                SLOW,
            ])
            .args(extra)
            .arg("-o")
            .arg(trace)
            .env(llmprof::nvml::NVML_LIB_ENV, NO_NVML)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (stderr, seen) = e2e::attach::wait_probes_live(&mut child);
        Attach { child, stderr, seen }
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill has no memory preconditions; the pid is our own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
    }

    /// Waits (at most 30 s) for the exit: the status with all of stdout and stderr.
    fn wait(mut self) -> Output {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("llmprof attach still running 30 s later:\n{}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut rest = String::new();
        self.stderr.read_to_string(&mut rest).unwrap();
        let mut out = self.child.wait_with_output().unwrap();
        out.stderr = (self.seen + &rest).into_bytes();
        out
    }
}

/// The eBPF objects a process holds, by the kernel's own account (`/proc/PID/fdinfo`).
#[derive(Debug, Default)]
struct Held {
    progs: BTreeSet<u32>,
    links: BTreeSet<u32>,
    perf_events: usize,
}

fn held_by(pid: u32) -> Held {
    let mut h = Held::default();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return h;
    };
    for fd in fds.filter_map(Result::ok) {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        let info =
            std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy()))
                .unwrap_or_default();
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u32>().ok())
        };
        match target.as_str() {
            "anon_inode:bpf-prog" => h.progs.extend(field("prog_id:")),
            "anon_inode:bpf_link" => h.links.extend(field("link_id:")),
            "anon_inode:[perf_event]" => h.perf_events += 1,
            _ => {}
        }
    }
    h
}

/// Ids of the loaded programs whose name starts with [`PROG_PREFIX`] (the kernel's listing).
fn llmprof_programs() -> BTreeSet<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str().is_some_and(|n| n.starts_with(PROG_PREFIX)))
        .map(|p| p.id())
        .collect()
}

/// Ids of the loaded links.
fn loaded_links() -> BTreeSet<u32> {
    aya::programs::loaded_links()
        .filter_map(Result::ok)
        .map(|l| l.id())
        .collect()
}

/// Program ids some live process holds an fd of (another llmprof on the same kernel: not ours to judge).
fn held_by_anyone() -> BTreeSet<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .flat_map(|pid| held_by(pid).progs)
        .collect()
}

/// Probe events in tracefs created by process `pid` through aya's text interface.
fn probe_events_of(pid: u32) -> Vec<String> {
    let tag = format!("aya_{pid}_");
    PROBE_EVENT_FILES
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|s| s.lines().map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| l.contains(&tag))
        .collect()
}

fn count_named(tp: &mut Trace, name: &str) -> i64 {
    tp.int(&format!("select count(*) from slice where name = '{name}'"))
}

/// The testee's 20 ms sleeps that made it into the trace as slow-syscall slices.
fn slow_sleeps(tp: &mut Trace) -> i64 {
    tp.int(&format!(
        "select count(*) from slice where name like '{}%sleep%' and dur >= 10000000",
        slice::SYSCALL_PREFIX
    ))
}

/// A finished trace as a person checks it: the report says the session ended for `end_reason` with its
/// summary, the file is whole, and Perfetto loads it without an import error or an open slice.
fn assert_complete(trace: &Path, end_reason: &str) {
    let r = report_json(trace);
    assert_eq!(r["has_summary"], true, "{r}");
    assert_eq!(r["truncated"], false, "{r}");
    assert_eq!(r["end_reason"], end_reason, "{r}");
    let mut tp = e2e::trace_processor::load(trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<Value>::new());
    assert_eq!(tp.unterminated_slices().unwrap(), Vec::<Value>::new());
    assert_eq!(count_named(&mut tp, marker::SUMMARY), 1);
    assert!(slow_sleeps(&mut tp) >= 1, "the testee's sleep is in the trace");
}

/// `kill -9` of `llmprof attach` mid-trace: the kernel drops every program, link and probe it held, and the
/// file written so far (the writer flushes whole packets every 500 ms) loads in Perfetto with no import error
/// and holds what happened before the kill; `llmprof report` reads it and says the session was cut short.
#[test]
fn sigkill_of_attach_leaves_nothing_loaded_and_a_file_that_loads() {
    if !preconditions() {
        return;
    }
    let _kernel = serial();
    let dir = temp_dir("sigkill");
    let trace = dir.join("killed.perfetto-trace");
    let before = llmprof_programs();
    let mut t = Testee::spawn(&[]);
    let attach = Attach::start(t.pid(), &trace);
    let attach_pid = attach.child.id();
    // Two sequences 1.2 s apart: the writer's 500 ms flush has run at least once after the first.
    t.cmd("go", "done");
    std::thread::sleep(Duration::from_millis(1200));
    t.cmd("go", "done");
    std::thread::sleep(Duration::from_millis(1200));
    let held = held_by(attach_pid);
    assert!(!held.progs.is_empty(), "attach holds its programs: {held:?}");
    assert!(!held.links.is_empty(), "attach holds its links: {held:?}");
    let loaded = llmprof_programs();
    assert!(held.progs.is_subset(&loaded), "{held:?} vs listing {loaded:?}");
    let size_at_kill = std::fs::metadata(&trace).unwrap().len();

    attach.signal(libc::SIGKILL);
    let out = attach.wait();
    assert_eq!(out.status.code(), None, "killed by a signal");

    // The kernel's listing: none of its programs or links stays (polled: RCU-deferred release).
    let deadline = Instant::now() + RELEASE_WAIT;
    let (progs_left, links_left) = loop {
        let progs: BTreeSet<u32> = llmprof_programs().intersection(&held.progs).copied().collect();
        let links: BTreeSet<u32> = loaded_links().intersection(&held.links).copied().collect();
        if (progs.is_empty() && links.is_empty()) || Instant::now() > deadline {
            break (progs, links);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        progs_left.is_empty(),
        "programs {progs_left:?} still loaded {RELEASE_WAIT:?} after kill -9"
    );
    assert!(
        links_left.is_empty(),
        "links {links_left:?} still loaded {RELEASE_WAIT:?} after kill -9"
    );
    // By name, before and after: no llmprof program is loaded that was not before, unless a live process
    // (another llmprof on this kernel) holds it.
    let others = held_by_anyone();
    let new: Vec<u32> = llmprof_programs()
        .into_iter()
        .filter(|id| !before.contains(id) && !others.contains(id))
        .collect();
    assert!(
        new.is_empty(),
        "llmprof programs {new:?} loaded, held by no process"
    );
    assert_eq!(
        probe_events_of(attach_pid),
        Vec::<String>::new(),
        "probe events left in tracefs"
    );

    // The file up to the kill.
    let size = std::fs::metadata(&trace).unwrap().len();
    assert!(
        size > 0 && size >= size_at_kill,
        "{size} bytes after the kill, {size_at_kill} before"
    );
    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<Value>::new());
    assert_eq!(
        count_named(&mut tp, marker::SUMMARY),
        0,
        "no summary in a killed session"
    );
    assert!(
        slow_sleeps(&mut tp) >= 1,
        "the sleep before the last flush is in the file"
    );
    drop(tp);
    let r = report_json(&trace);
    assert_eq!(r["has_summary"], false, "{r}");
    assert_eq!(r["end_reason"], Value::Null, "{r}");
    // `truncated` says the file ended mid-packet; the writer flushes whole packets, so a kill between two
    // flushes leaves a file that ends on a packet boundary: either value reads as a cut session.
    assert!(r["truncated"].is_boolean(), "{r}");
    let text = report_text(&trace);
    assert!(text.contains("the session was cut short"), "{text}");
    drop(t);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// SIGHUP (the terminal or ssh session closed) ends the session as SIGTERM does: exit 0, a finished trace
/// with its summary, the same `end_reason`.
#[test]
fn sighup_ends_a_session_like_sigterm() {
    if !preconditions() {
        return;
    }
    let _kernel = serial();
    let dir = temp_dir("sighup");
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP")] {
        let trace = dir.join(format!("{name}.perfetto-trace"));
        let mut t = Testee::spawn(&[]);
        let attach = Attach::start(t.pid(), &trace);
        t.cmd("go", "done");
        attach.signal(sig);
        let out = attach.wait();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{name}: {stdout}\n{stderr}");
        assert!(
            stdout.starts_with(&format!("llmprof: {END_INTERRUPTED} after")),
            "{name}: {stdout}"
        );
        assert_complete(&trace, END_INTERRUPTED);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The traced process killed mid-trace (`kill -9`): llmprof sees it go, ends the session with `target
/// exited` and a complete trace.
#[test]
fn target_killed_mid_trace_gives_a_complete_trace() {
    if !preconditions() {
        return;
    }
    let _kernel = serial();
    let dir = temp_dir("target");
    let trace = dir.join("target.perfetto-trace");
    let mut t = Testee::spawn(&[]);
    let attach = Attach::start(t.pid(), &trace);
    t.cmd("go", "done");
    t.child().kill().unwrap();
    t.child().wait().unwrap();
    let out = attach.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with(&format!("llmprof: {END_TARGET_EXITED} after")),
        "{stdout}"
    );
    assert_complete(&trace, END_TARGET_EXITED);
    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(count_named(&mut tp, marker::TARGET_EXITED), 1);
    drop(tp);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A forced ring overflow: `--ring-size` at its minimum (one page) and a burst of 200,000 range marks. The
/// kernel drops what does not fit and counts it; the summary's per-probe counts are exact: every mark is a
/// hit, each hit was either emitted or dropped, and exactly the emitted ones are in the trace.
#[test]
fn a_forced_ring_overflow_is_counted_exactly_per_probe() {
    if !preconditions() {
        return;
    }
    const N: u64 = 200_000;
    let _kernel = serial();
    let dir = temp_dir("overflow");
    let trace = dir.join("overflow.perfetto-trace");
    let mut t = Testee::spawn(&[]);
    // `-v`: the summary's per-probe counters.
    let attach = Attach::start_with(t.pid(), &trace, &["--ring-size", "4KiB", "-v"]);
    let burst = t.ask(&format!("burst {N}"));
    assert!(
        burst.starts_with("burst done"),
        "testee answer to burst: {burst:?}"
    );
    attach.signal(libc::SIGTERM);
    let out = attach.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `  probe engine_range: hits H, emitted E, dropped D`
    let counts: Vec<u64> = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("probe engine_range: "))
        .unwrap_or_else(|| panic!("no engine_range line in the summary:\n{stdout}"))
        .split(", ")
        .map(|kv| {
            kv.rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX)
        })
        .collect();
    let [hits, emitted, dropped] = counts[..] else {
        panic!("summary line: {counts:?}\n{stdout}")
    };
    assert_eq!(hits, N, "every mark is counted as a hit:\n{stdout}");
    assert!(
        dropped > 0,
        "a one-page ring must overflow under 200,000 marks:\n{stdout}"
    );
    assert_eq!(
        emitted + dropped,
        hits,
        "each hit was emitted or dropped:\n{stdout}"
    );
    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<Value>::new());
    let arrived = tp.int(&format!(
        "select count(*) from slice join thread_track tt on slice.track_id = tt.id join thread using (utid) \
             where thread.tid = {} and slice.dur = 0 and slice.name like '%mark%'",
        t.pid()
    ));
    assert_eq!(
        u64::try_from(arrived).unwrap(),
        emitted,
        "the trace holds exactly the marks that were emitted: sent {N}, dropped {dropped}"
    );
    // The trace itself says what it lost, per probe, and `llmprof report` reads it back.
    let r = report_json(&trace);
    let probe = r["drops"]["probes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["probe"] == "engine_range"))
        .unwrap_or_else(|| panic!("no engine_range in the report's drops: {r}"));
    assert_eq!(probe["hits"].as_u64(), Some(hits), "{r}");
    assert_eq!(probe["emitted"].as_u64(), Some(emitted), "{r}");
    assert_eq!(probe["dropped"].as_u64(), Some(dropped), "{r}");
    drop(tp);
    std::fs::remove_dir_all(&dir).unwrap();
}
