//! Python frames in stack samples, against real CPython processes (pyenv 3.10, 3.11, 3.12, 3.13) attached by
//! pid: the samples of `fixtures/python/burn.py` must read `h` (in its loop) ← `g` ← `f` ← `<module>` with the
//! right file and lines; threads running different functions must keep their own stacks; an unsupported
//! version (3.9) must give a clear message and no frames; and `llmprof attach` must write the samples into a
//! trace that Perfetto's trace processor loads without errors.
//!
//! Needs root (eBPF), the pyenv Pythons under `/root/.pyenv/versions` and, for the trace test, the trace
//! processor: skips loudly without them, fails under CI (see [`e2e::require`]).
#![allow(clippy::unwrap_used, reason = "tests panic with the error")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::testee::Testee;
use llmprof::capture::{Capture, CaptureConfig};
use llmprof_trace::event::EventBody;
use llmprof_trace::event::python::{PyStackSample, PyStackStatus};
use llmprof_trace::names::slice;

/// Where pyenv keeps its Pythons on the test machines (3.10 to 3.13, and 3.9 for the unsupported case).
const PYENV: &str = "/root/.pyenv/versions";
/// How long each capture samples.
const SAMPLE_FOR: Duration = Duration::from_secs(3);
/// Samples of the burning chain each test needs at least (99 Hz × 3 s on a busy 2-core machine gives ~100).
const MIN_SAMPLES: usize = 10;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/python/burn.py")
}

/// The lines of the fixture carrying `# mark: <name>`.
fn marked(name: &str) -> Vec<u32> {
    let src = std::fs::read_to_string(fixture()).unwrap();
    let tag = format!("# mark: {name}");
    let lines: Vec<u32> = src
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim_end().ends_with(&tag))
        .map(|(i, _)| i as u32 + 1)
        .collect();
    assert!(!lines.is_empty(), "burn.py has no `{tag}`");
    lines
}

/// The pyenv interpreter of `3.minor`, if installed.
fn python(minor: u32) -> Option<PathBuf> {
    let prefix = format!("3.{minor}.");
    std::fs::read_dir(PYENV)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path().join(format!("bin/python3.{minor}")))
        .find(|p| p.exists())
}

fn preconditions(minor: u32) -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !e2e::require(root, "not root: Python sampling loads eBPF programs") {
        return None;
    }
    let py = python(minor);
    if !e2e::require(
        py.is_some(),
        &format!("pyenv Python 3.{minor} not installed under {PYENV}"),
    ) {
        return None;
    }
    py
}

/// `burn.py MODE` under `python`, running (killed when the test ends).
fn burn(python: &Path, mode: &str) -> Testee {
    Testee::start(Command::new(python).arg(fixture()).arg(mode))
}

/// Samples `pid` for [`SAMPLE_FOR`]: `(tid, sample)` of every Python stack sample, and the capture's
/// Python problems.
fn sample(pid: u32) -> (Vec<(u32, PyStackSample)>, Vec<String>) {
    let cfg = CaptureConfig {
        pids: vec![pid],
        ..CaptureConfig::default()
    };
    let mut cap = Capture::start(&cfg).unwrap_or_else(|e| panic!("Capture::start: {e:?}"));
    let problems = cap.python().problems().to_vec();
    let t0 = Instant::now();
    let mut events = Vec::new();
    while t0.elapsed() < SAMPLE_FOR {
        cap.poll(&mut events, Duration::from_millis(50)).unwrap();
    }
    let samples = events
        .into_iter()
        .filter_map(|e| match e.body {
            EventBody::PyStack(s) => Some((e.tid, *s)),
            _ => None,
        })
        .collect();
    (samples, problems)
}

fn functions(s: &PyStackSample) -> Vec<&str> {
    s.frames.iter().map(|f| f.function.as_str()).collect()
}

/// The check of every version: the chain, its file and lines, and which frames start a C eval call.
fn chain_resolves(minor: u32) {
    let Some(py) = preconditions(minor) else { return };
    let target = burn(&py, "chain");
    let (samples, problems) = sample(target.pid());
    assert!(problems.is_empty(), "3.{minor}: {problems:?}");
    let file = fixture().display().to_string();
    let (h_loop, g_call, f_call, module_call) = (
        marked("h-loop"),
        marked("g-call")[0],
        marked("f-call")[0],
        marked("module-call")[0],
    );
    let complete: Vec<&PyStackSample> = samples
        .iter()
        .filter(|(tid, s)| *tid == target.pid() && s.status == PyStackStatus::Complete)
        .map(|(_, s)| s)
        .collect();
    let in_h: Vec<&&PyStackSample> = complete
        .iter()
        .filter(|s| functions(s).first() == Some(&"h"))
        .collect();
    assert!(
        in_h.len() >= MIN_SAMPLES && in_h.len() * 10 >= complete.len() * 8,
        "3.{minor}: {} of {} complete samples ({} in all) are in h: {:?}",
        in_h.len(),
        complete.len(),
        samples.len(),
        complete.iter().take(3).map(|s| s.render()).collect::<Vec<_>>()
    );
    // h spends all but ~100 ns of each ~10 ms call in its loop; a sample may still land on its first or last line.
    let h_body: Vec<u32> = h_loop.iter().chain(&marked("h-body")).copied().collect();
    let in_loop = in_h
        .iter()
        .filter(|s| s.frames[0].line.is_some_and(|l| h_loop.contains(&l)))
        .count();
    assert!(
        in_loop * 10 >= in_h.len() * 9,
        "3.{minor}: {in_loop} of {} samples in h are in its loop {h_loop:?}",
        in_h.len()
    );
    for s in in_h {
        assert_eq!(
            functions(s),
            ["h", "g", "f", "<module>"],
            "3.{minor}: {}",
            s.render()
        );
        assert!(
            s.frames.iter().all(|f| f.file == file),
            "3.{minor}: files of {:?}",
            s.frames
        );
        let lines: Vec<Option<u32>> = s.frames.iter().map(|f| f.line).collect();
        let h_line = lines[0].unwrap_or(0);
        assert!(
            h_body.contains(&h_line),
            "3.{minor}: h at line {h_line}, its body is {h_body:?}"
        );
        assert_eq!(
            lines[1..],
            [Some(g_call), Some(f_call), Some(module_call)],
            "3.{minor}: {}",
            s.render()
        );
        // 3.10: one C eval call per frame; 3.11+: Python calls Python without a C frame, so only the
        // module's frame (run by PyEval_EvalCode) starts one.
        let entries: Vec<bool> = s.frames.iter().map(|f| f.entry).collect();
        let expected = if minor == 10 {
            [true, true, true, true]
        } else {
            [false, false, false, true]
        };
        assert_eq!(entries, expected, "3.{minor}: entry frames of {}", s.render());
    }
}

#[test]
fn python_3_10_chain_resolves() {
    chain_resolves(10);
}

#[test]
fn python_3_11_chain_resolves() {
    chain_resolves(11);
}

#[test]
fn python_3_12_chain_resolves() {
    chain_resolves(12);
}

#[test]
fn python_3_13_chain_resolves() {
    chain_resolves(13);
}

#[test]
fn threads_running_different_functions_keep_their_own_stacks() {
    let Some(py) = preconditions(11) else { return };
    let target = burn(&py, "threads");
    // "ready alpha=TID beta=TID"
    let tid_of = |name: &str| -> u32 {
        let key = format!("{name}=");
        let word = target.ready().split(' ').find(|w| w.starts_with(&key)).unwrap();
        word[key.len()..].parse().unwrap()
    };
    let (alpha, beta) = (tid_of("alpha"), tid_of("beta"));
    let (samples, _) = sample(target.pid());
    let leaves = |tid: u32| -> Vec<String> {
        samples
            .iter()
            .filter(|(t, s)| *t == tid && !s.frames.is_empty())
            .map(|(_, s)| s.frames[0].function.clone())
            .collect()
    };
    let (a, b) = (leaves(alpha), leaves(beta));
    assert!(
        a.len() >= 3 && b.len() >= 3,
        "alpha {} samples, beta {}",
        a.len(),
        b.len()
    );
    assert!(a.iter().all(|f| f == "alpha"), "alpha thread's leaves: {a:?}");
    assert!(b.iter().all(|f| f == "beta"), "beta thread's leaves: {b:?}");
    // Every sample of a thread is on a line of its own loop (`while True:` or the statement in it).
    for (tid, name) in [(alpha, "alpha"), (beta, "beta")] {
        let lines = marked(&format!("{name}-loop"));
        for (_, s) in samples.iter().filter(|(t, s)| *t == tid && !s.frames.is_empty()) {
            let line = s.frames[0].line.unwrap_or(0);
            assert!(
                lines.contains(&line),
                "{name} at line {line}, its loop is {lines:?}"
            );
        }
    }
}

/// While the thread runs native code (here hashlib's C SHA-256, GIL released; in a server `llama_decode` or a
/// torch kernel), its samples still carry the Python frames that called it, down to the calling line. (A sample
/// that lands on the loop's jump back between two calls, a few bytecodes every ~100 ms, is on the `while` line:
/// right too, and rare; the calling line must be nearly all.)
#[test]
fn samples_in_native_code_keep_the_calling_python_frames() {
    let Some(py) = preconditions(12) else { return };
    let target = burn(&py, "native");
    let (samples, problems) = sample(target.pid());
    assert!(problems.is_empty(), "{problems:?}");
    let (call, module_call) = (marked("native-call")[0], marked("native-module-call")[0]);
    let loop_line = marked("native-loop")[0];
    let complete: Vec<&PyStackSample> = samples
        .iter()
        .filter(|(tid, s)| *tid == target.pid() && s.status == PyStackStatus::Complete)
        .map(|(_, s)| s)
        .collect();
    assert!(
        complete.len() >= MIN_SAMPLES,
        "{} complete samples",
        complete.len()
    );
    let mut at_call = 0;
    for s in &complete {
        assert_eq!(functions(s), ["native", "<module>"], "{}", s.render());
        let lines: Vec<Option<u32>> = s.frames.iter().map(|f| f.line).collect();
        assert!(
            lines == [Some(call), Some(module_call)] || lines == [Some(loop_line), Some(module_call)],
            "{}",
            s.render()
        );
        at_call += usize::from(lines[0] == Some(call));
    }
    assert!(
        at_call * 10 >= complete.len() * 9,
        "{at_call} of {} samples at the calling line",
        complete.len()
    );
}

#[test]
fn an_unsupported_python_gets_a_clear_message_and_no_frames() {
    let Some(py) = preconditions(9) else { return };
    let target = burn(&py, "chain");
    let (samples, problems) = sample(target.pid());
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("Python 3.9") && problems[0].contains("3.10–3.13"),
        "{}",
        problems[0]
    );
    assert!(
        samples.is_empty(),
        "{} samples of an unsupported Python",
        samples.len()
    );

    // The same through `llmprof attach`: a warning on stderr and a marker on the timeline.
    if !e2e::require(
        e2e::trace_processor::available(),
        "Perfetto trace processor not installed (cargo xtask setup-tools)",
    ) {
        return;
    }
    let trace = temp_trace("py39.pftrace");
    let out = attach(target.pid(), "1s", &trace);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("warning: {}", problems[0])), "{stderr}");
    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    let markers = tp
        .query_i64(&format!(
            "select count(*) from slice where name = '{}'",
            problems[0].replace('\'', "''")
        ))
        .unwrap();
    assert_eq!(markers, 1, "the problem as a marker on the timeline");
    let samples = format!("select count(*) from slice where name = '{}'", slice::PY_SAMPLE);
    assert_eq!(tp.query_i64(&samples).unwrap(), 0);
}

fn temp_trace(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("llmprof-pyframes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join(name);
    let _ = std::fs::remove_file(&trace);
    trace
}

/// `llmprof attach --pid PID -d DURATION -o TRACE`, to the end.
fn attach(pid: u32, duration: &str, trace: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_llmprof"))
        .args(["attach", "--pid", &pid.to_string(), "-d", duration, "-o"])
        .arg(trace)
        .env(llmprof::nvml::NVML_LIB_ENV, "/nonexistent/libnvidia-ml.so.1")
        .output()
        .unwrap()
}

#[test]
fn attach_writes_python_frames_into_the_stack_samples_perfetto_loads() {
    let Some(py) = preconditions(11) else { return };
    if !e2e::require(
        e2e::trace_processor::available(),
        "Perfetto trace processor not installed (cargo xtask setup-tools)",
    ) {
        return;
    }
    let target = burn(&py, "chain");
    let trace = temp_trace("py.pftrace");
    let out = attach(target.pid(), "3s", &trace);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    // The Python frames are spliced into the native stack samples (one timer, the same instant): a sample of
    // the main thread holds the interpreted frames h ← g ← f as adjacent callsites.
    let tid = target.pid();
    let all = tp
        .query_i64(&format!(
            "select count(*) from perf_sample s join thread t using(utid) where t.tid = {tid}"
        ))
        .unwrap();
    let chain = |inner: &str, outer: &str| {
        format!(
            "with recursive anc(sid, cs) as ( \
               select s.id, s.callsite_id from perf_sample s join thread t using(utid) where t.tid = {tid} \
               union all \
               select anc.sid, c.parent_id from anc join stack_profile_callsite c on c.id = anc.cs \
                 where c.parent_id is not null) \
             select count(distinct anc.sid) from anc \
               join stack_profile_callsite c on c.id = anc.cs join stack_profile_frame f on f.id = c.frame_id \
               join stack_profile_callsite p on p.id = c.parent_id join stack_profile_frame pf on pf.id = p.frame_id \
             where f.name = '{inner}' and pf.name = '{outer}'"
        )
    };
    let in_h = tp.query_i64(&chain("h", "g")).unwrap();
    let g_in_f = tp.query_i64(&chain("g", "f")).unwrap();
    assert!(
        in_h >= MIN_SAMPLES as i64 && in_h * 10 >= all * 8,
        "{in_h} of {all} stack samples of the main thread hold h ← g"
    );
    assert!(
        g_in_f >= in_h,
        "every h ← g sample also holds g ← f: {g_in_f} < {in_h}"
    );
    // Spliced samples leave no separate `python sample` instant behind.
    let instants = tp
        .query_i64(&format!(
            "select count(*) from slice where name = '{}'",
            slice::PY_SAMPLE
        ))
        .unwrap();
    assert_eq!(instants, 0, "python samples are in the callstacks, not instants");
}

#[test]
fn the_py_samples_off_knob_stops_the_samples() {
    let Some(py) = preconditions(11) else { return };
    let target = burn(&py, "chain");
    let cfg = CaptureConfig {
        pids: vec![target.pid()],
        ..CaptureConfig::default()
    };
    let mut cap = Capture::start(&cfg).unwrap_or_else(|e| panic!("Capture::start: {e:?}"));
    let is_py = |e: &llmprof_trace::event::Event| matches!(e.body, EventBody::PyStack(_));
    let mut before = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) && before.iter().filter(|e| is_py(e)).count() < 5 {
        cap.poll(&mut before, Duration::from_millis(50)).unwrap();
    }
    assert!(
        before.iter().filter(|e| is_py(e)).count() >= 5,
        "no Python samples before the knob"
    );
    cap.set_knob(llmprof_abi::Knob::PySamplesOff, 1).unwrap();
    // Samples already in the ring are drained first; the knob applies to the next sample.
    cap.poll(&mut Vec::new(), Duration::from_millis(50)).unwrap();
    let id = llmprof_abi::ProbeId::PyStack as usize;
    let hits0 = cap.counters()[id].hits;
    let mut after = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        cap.poll(&mut after, Duration::from_millis(50)).unwrap();
    }
    assert!(
        cap.counters()[id].hits > hits0,
        "the target was not sampled at all after the knob"
    );
    assert_eq!(
        after.iter().filter(|e| is_py(e)).count(),
        0,
        "Python samples written with the knob set"
    );
}
