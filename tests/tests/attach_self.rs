//! llmprof never traces itself, as a newcomer would check it: attached for a few seconds to an idle `sleep`
//! (which makes no syscall), with everything on (stack samples, off-CPU stacks, thread states, the wire probe,
//! /metrics discovery), the trace and `llmprof report --json` hold no syscall, thread state, sample, request
//! or egress at all — llmprof's own calibration, ring draining, symbolization and /proc reads included. And
//! attached to the shell it was started from (the target is then an ancestor of llmprof, with a wrapper between
//! them, as `sudo` is), neither llmprof nor the wrapper is traced: only the waiting shell, which does nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::testee::Reaped;
use e2e::{bin_path, is_root, require, trace_processor};
use serde_json::Value;

fn trace_path(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "llmprof-self-{name}-{}.perfetto-trace",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&p);
    p
}

fn report_json(trace: &Path) -> Value {
    let out = Command::new(bin_path("llmprof"))
        .args(["report", "--json"])
        .arg(trace)
        .output()
        .expect("llmprof report");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("report JSON")
}

/// What an idle target's trace must hold: nothing anyone did, llmprof least of all.
fn assert_nothing_recorded(r: &Value, who: &str) {
    let sys = &r["syscalls"];
    assert_eq!(
        sys["kernel_aggregates"],
        Value::Array(vec![]),
        "{who}: syscalls {sys:#}"
    );
    assert_eq!(sys["slow_syscall_slices"], Value::Array(vec![]), "{who}: {sys:#}");
    assert!(
        r["thread_states"].is_null(),
        "{who}: thread states {:#}",
        r["thread_states"]
    );
    assert!(
        r["cpu_samples"].is_null(),
        "{who}: samples {:#}",
        r["cpu_samples"]
    );
    assert_eq!(
        r["egress"],
        Value::Array(vec![]),
        "{who}: egress (llmprof's /metrics probes)"
    );
    assert_eq!(r["requests"]["count"], 0, "{who}: requests");
    assert_eq!(r["model_files"], Value::Array(vec![]), "{who}: model files");
}

/// The pids and tids the trace has a track for.
fn trace_pids(trace: &Path) -> Option<Vec<i64>> {
    if !trace_processor::available() {
        return None;
    }
    let mut tp = trace_processor::load(trace).expect("trace processor");
    assert_eq!(tp.import_errors().expect("stats"), Vec::<Value>::new());
    let rows = tp
        .query("select distinct pid as id from process where pid is not null and pid > 0 union select distinct tid from thread where tid is not null and tid > 0")
        .expect("query");
    Some(rows.iter().filter_map(|r| r["id"].as_i64()).collect())
}

#[test]
fn attached_to_an_idle_sleep_llmprof_records_nothing_of_its_own() {
    if !require(is_root(), "attaching needs root") {
        return;
    }
    let sleep = Reaped(Command::new("sleep").arg("300").spawn().expect("sleep"));
    let trace = trace_path("sleep");
    let out = Command::new(bin_path("llmprof"))
        .args([
            "attach",
            "--pid",
            &sleep.0.id().to_string(),
            "-d",
            "4s",
            "--gpu-sample-interval",
            "0",
            "-o",
        ])
        .arg(&trace)
        .output()
        .expect("llmprof attach");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("recorded: no events (the target was idle)"),
        "{stdout}"
    );
    assert!(stdout.contains("lost: nothing"), "{stdout}");
    assert_nothing_recorded(&report_json(&trace), "idle sleep");
    if let Some(ids) = trace_pids(&trace) {
        let sleep_pid = i64::from(sleep.0.id());
        assert!(
            ids.iter().all(|&id| id == sleep_pid),
            "only the sleep has a track: {ids:?} (sleep {sleep_pid})"
        );
    }
    let text = Command::new(bin_path("llmprof"))
        .arg("report")
        .arg(&trace)
        .output()
        .expect("report");
    let text = String::from_utf8_lossy(&text.stdout);
    for absent in [
        "Syscalls",
        "Egress",
        "thread states",
        "CPU samples",
        "Requests",
        "GPU",
    ] {
        assert!(
            !text.contains(absent),
            "a section with nothing to say is left out: {absent}\n{text}"
        );
    }
    let _ = std::fs::remove_file(&trace);
}

#[test]
fn attached_to_the_shell_it_runs_in_llmprof_and_its_wrapper_are_left_out() {
    if !require(is_root(), "attaching needs root") {
        return;
    }
    let trace = trace_path("shell");
    let pids = std::env::temp_dir().join(format!("llmprof-self-pids-{}", std::process::id()));
    // The outer shell (the target) runs a wrapper shell (as sudo runs llmprof), which runs llmprof in the
    // background and waits for it; both shells then sit in wait4 for the whole session.
    let inner = format!(
        r#"echo "wrapper $$" > {pids}; "$LLMPROF" attach --pid $PPID -d 4s --gpu-sample-interval 0 -o {trace} > {pids}.out 2>&1 & echo "llmprof $!" >> {pids}; wait $!"#,
        pids = pids.display(),
        trace = trace.display()
    );
    let mut shell = Reaped(
        Command::new("sh")
            .args(["-c", r#"sh -c "$INNER"; true"#])
            .env("INNER", &inner)
            .env("LLMPROF", bin_path("llmprof"))
            .stdout(Stdio::null())
            .spawn()
            .expect("sh"),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while shell.0.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "the session did not end");
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = std::fs::read_to_string(format!("{}.out", pids.display())).unwrap_or_default();
    let ids: Vec<i64> = std::fs::read_to_string(&pids)
        .expect("pids")
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    assert_eq!(ids.len(), 2, "{log}");
    assert!(log.contains("traced pid"), "{log}");
    assert!(
        !log.contains("more process"),
        "only the target shell is traced:\n{log}"
    );
    assert_nothing_recorded(&report_json(&trace), "the waiting shell");
    if let Some(tracks) = trace_pids(&trace) {
        for id in &ids {
            assert!(
                !tracks.contains(id),
                "pid {id} (llmprof or its wrapper) is in the trace: {tracks:?}\n{log}"
            );
        }
    }
    let _ = std::fs::remove_file(&trace);
    let _ = std::fs::remove_file(&pids);
    let _ = std::fs::remove_file(format!("{}.out", pids.display()));
}
