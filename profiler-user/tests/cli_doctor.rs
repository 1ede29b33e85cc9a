//! `llmprof doctor` as a user runs it: as root on this host everything attach needs passes (exit 0), the JSON
//! parses and carries the measured uprobe cost; `--pid` of a plain `sleep` reports the engine probes absent
//! (a warning, not a failure); a pid that does not exist fails with exit code 4.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use std::process::{Command, Output};

use e2e::testee::Reaped;
use serde_json::Value;

const LLMPROF: &str = env!("CARGO_BIN_EXE_llmprof");

/// Checks that must pass for attach to work (others, e.g. the GPU libraries, may warn).
const NEEDED: [&str; 7] = [
    "privileges",
    "kernel",
    "tracefs",
    "tracepoint:raw_syscalls:sys_enter",
    "tracepoint:raw_syscalls:sys_exit",
    "tracepoint:sched:sched_process_exit",
    "ringbuf",
];

fn doctor(args: &[&str]) -> (Output, Vec<Value>) {
    let out = Command::new(LLMPROF)
        .arg("doctor")
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "doctor --json is not JSON ({e}):\n{text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let checks = v
        .as_array()
        .unwrap_or_else(|| panic!("not an array:\n{text}"))
        .clone();
    for c in &checks {
        for key in ["check", "status", "detail", "fix", "measured"] {
            assert!(c.get(key).is_some(), "entry lacks {key:?}: {c}");
        }
        let status = c["status"].as_str().unwrap();
        assert!(["ok", "warn", "FAIL"].contains(&status), "{c}");
        assert_eq!(
            c["fix"].is_null(),
            status == "ok",
            "fix is null exactly when ok: {c}"
        );
    }
    (out, checks)
}

fn find<'a>(checks: &'a [Value], id: &str) -> &'a Value {
    checks
        .iter()
        .find(|c| c["check"] == id)
        .unwrap_or_else(|| panic!("no check {id:?} in {checks:#?}"))
}

#[test]
fn help_documents_examples_and_exit_codes() {
    let out = Command::new(LLMPROF).args(["doctor", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "--pid",
        "--json",
        "Examples:",
        "sudo llmprof doctor",
        "Exit codes",
    ] {
        assert!(help.contains(want), "doctor --help lacks {want:?}:\n{help}");
    }
}

#[test]
fn as_root_this_host_is_ready_and_the_uprobe_cost_is_measured() {
    if !e2e::require(
        e2e::is_root(),
        "llmprof doctor measures a real uprobe: needs root",
    ) {
        return;
    }
    let (out, checks) = doctor(&[]);
    for id in NEEDED {
        let c = find(&checks, id);
        assert_eq!(c["status"], "ok", "{id} must pass on this host: {c}");
    }
    let cost = find(&checks, "uprobe_cost");
    assert_ne!(cost["status"], "FAIL", "{cost}");
    let m = &cost["measured"];
    let attached = m["attached_ns_per_call"].as_f64().unwrap();
    let detached = m["detached_ns_per_call"].as_f64().unwrap();
    eprintln!("measured uprobe cost: {attached:.0} ns/call attached, {detached:.1} ns/call detached");
    assert!(detached > 0.0 && attached > detached, "{cost}");
    assert_eq!(
        m["hits"], m["calls"],
        "every timed call must hit the uprobe: {cost}"
    );
    assert_eq!(
        m["records_delivered"], m["calls"],
        "every hit must reach the ring: {cost}"
    );
    let fails: Vec<&Value> = checks.iter().filter(|c| c["status"] == "FAIL").collect();
    assert!(fails.is_empty(), "{fails:#?}");
    assert_eq!(out.status.code(), Some(0));

    // The human form says the same, one line per check.
    let out = Command::new(LLMPROF).arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("ready to attach"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("ok") && l.contains("uprobe_cost")
                || l.starts_with("warn") && l.contains("uprobe_cost")),
        "{text}"
    );
}

#[test]
fn a_server_without_probes_is_told_what_it_gets_not_to_rebuild_itself() {
    let sleep = Reaped(Command::new("sleep").arg("30").spawn().unwrap());
    let pid = sleep.0.id().to_string();
    let (out, checks) = doctor(&["--pid", &pid]);
    let target = find(&checks, "target");
    assert_eq!(target["status"], "ok", "{target}");
    let abi = find(&checks, "probe_abi");
    assert_eq!(
        abi["status"], "ok",
        "nothing to fix for llama.cpp's server or vLLM: {abi}"
    );
    let detail = abi["detail"].as_str().unwrap();
    assert!(detail.contains("requests from the wire"), "{abi}");
    assert!(
        abi["fix"].is_null(),
        "no advice to build it with llmprof-probes: {abi}"
    );
    assert!(
        !checks.iter().any(|c| c["check"] == "engine_probes"),
        "no per-probe warning for a server that has none: {checks:#?}"
    );
    if e2e::is_root() {
        assert_eq!(out.status.code(), Some(0), "{checks:#?}");
    }
}

#[test]
fn a_missing_pid_fails_with_exit_code_4() {
    let (out, checks) = doctor(&["--pid", "999999999"]);
    let target = find(&checks, "target");
    assert_eq!(target["status"], "FAIL", "{target}");
    assert!(target["fix"].as_str().unwrap().contains("pid"), "{target}");
    assert_ne!(out.status.code(), Some(0));
    if e2e::is_root() {
        assert_eq!(out.status.code(), Some(4), "{checks:#?}");
    } else {
        // Not root fails first on privileges.
        assert_eq!(out.status.code(), Some(3), "{checks:#?}");
    }
}
