//! The `llmprof` binary as a user runs it: help with examples, the exit codes of bad input, `open` serving a
//! trace, and (as root, with the eBPF object) a real attach to a process that is not an instrumented engine.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use llmprof_trace::names::{marker, slice};

const LLMPROF: &str = env!("CARGO_BIN_EXE_llmprof");

#[test]
fn help_shows_subcommands_examples_and_exit_codes() {
    let out = Command::new(LLMPROF).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for want in ["attach", "open", "sudo llmprof attach --pid", "Exit codes"] {
        assert!(help.contains(want), "--help lacks {want:?}:\n{help}");
    }
    let out = Command::new(LLMPROF).args(["attach", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "--slow-syscall",
        "--model-path",
        "--egress-allow",
        "--metrics-url",
        "--ring-size",
        "Examples:",
    ] {
        assert!(help.contains(want), "attach --help lacks {want:?}:\n{help}");
    }
}

#[test]
fn bad_input_gets_a_clear_error_and_its_exit_code() {
    // Unparsable duration: usage error.
    let out = Command::new(LLMPROF)
        .args(["attach", "--pid", "1", "-d", "soon"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid duration"));
    // A pid that does not exist: 4 as root, 3 (not root) otherwise.
    let out = Command::new(LLMPROF)
        .args(["attach", "--pid", "999999999", "-d", "1s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if e2e::is_root() {
        assert_eq!(out.status.code(), Some(4), "{err}");
        assert!(err.contains("no process with pid 999999999"), "{err}");
    } else {
        assert_eq!(out.status.code(), Some(3), "{err}");
        assert!(err.contains("root"), "{err}");
    }
}

#[test]
fn a_duration_past_the_largest_is_a_usage_error_not_a_crash() {
    let out = Command::new(LLMPROF)
        .args(["attach", "-d", "100000000000000000000", "--pid", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("duration too large"), "{err}");
    assert!(
        err.contains("at most 18446744073709551615s"),
        "the error says the limit: {err}"
    );
}

/// A symlink or a file planted at the trace path is neither followed nor overwritten: attach refuses before
/// loading anything, with exit code 7 (cannot write the trace) and what to do.
#[test]
fn a_planted_symlink_or_file_at_the_trace_path_is_refused() {
    let dir = std::env::temp_dir().join(format!("llmprof-cli-planted-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let link = dir.join("link.perfetto-trace");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let dangling = dir.join("dangling.perfetto-trace");
    std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
    let old = dir.join("old.perfetto-trace");
    std::fs::write(&old, "old trace").unwrap();
    let me = std::process::id().to_string();
    for (path, what) in [(&link, "a symlink"), (&dangling, "a symlink"), (&old, "a file")] {
        let out = Command::new(LLMPROF)
            .args(["attach", "--pid", &me, "-d", "1s", "-o"])
            .arg(path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(7), "{}: {err}", path.display());
        assert!(err.contains(&format!("{what} is already there")), "{err}");
        assert!(err.contains("choose another name"), "{err}");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert_eq!(std::fs::read_to_string(&old).unwrap(), "old trace");
    assert!(!dir.join("nowhere").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn open_serves_the_trace_to_the_ui_origin_and_exits() {
    let dir = std::env::temp_dir().join(format!("llmprof-cli-open-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("demo.perfetto-trace");
    std::fs::write(&trace, b"\x0a\x02\x40\x01").unwrap();
    let mut child = Command::new(LLMPROF)
        .arg("open")
        .arg(&trace)
        .args(["--port", "0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let link = lines
        .by_ref()
        .map(|l| l.unwrap())
        .find(|l| l.contains("ui.perfetto.dev"))
        .unwrap();
    let url = link.trim().split("?url=").nth(1).unwrap().to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/demo.perfetto-trace"),
        "{link}"
    );
    let (port, path) = url
        .trim_start_matches("http://127.0.0.1:")
        .split_once('/')
        .unwrap();
    // The name alone (visible in `ps`) is not enough: the path's secret is only in the printed link.
    let guess = e2e::http::request(port.parse().unwrap(), "GET", "/demo.perfetto-trace", &[], None).unwrap();
    assert_eq!(guess.status, 404);
    let r = e2e::http::request(
        port.parse().unwrap(),
        "GET",
        &format!("/{path}"),
        &[("Origin", "https://ui.perfetto.dev")],
        None,
    )
    .unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://ui.perfetto.dev")
    );
    assert!(r.body.ends_with(b"\x0a\x02\x40\x01"));
    let status = child.wait().unwrap();
    assert!(status.success(), "open exits after the fetch");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Real eBPF: attach to a plain process (no engine probes) that sleeps in a loop; the trace must say the
/// engine probes were not found, still have the slow syscalls, end with "target exited", and load cleanly.
/// The target starts its sleeps only once llmprof says its probes are live (a line on its stdin), so a slow
/// start-up on a loaded machine cannot make it miss them.
#[test]
fn attach_to_a_non_engine_process_traces_syscalls_and_ends_when_it_exits() {
    if !e2e::require(e2e::is_root(), "not root: cannot load eBPF programs") {
        return;
    }
    if !e2e::require(
        e2e::trace_processor::available(),
        "Perfetto trace processor not installed (cargo xtask setup-tools)",
    ) {
        return;
    }
    let mut target = Command::new(e2e::python3())
        .args([
            "-c",
            "import sys, time\nsys.stdin.readline()\nfor _ in range(15): time.sleep(0.1)",
        ])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let dir = std::env::temp_dir().join(format!("llmprof-cli-attach-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.perfetto-trace");
    let mut llmprof = Command::new(LLMPROF)
        .args([
            "attach",
            "--pid",
            &target.id().to_string(),
            "-d",
            "60s",
            "--slow-syscall",
            "50ms",
            "-o",
        ])
        .arg(&trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut rest, mut stderr) = e2e::attach::wait_probes_live(&mut llmprof);
    {
        use std::io::Write;
        let mut go = target.stdin.take().unwrap();
        go.write_all(b"go\n").unwrap();
    }
    std::io::Read::read_to_string(&mut rest, &mut stderr).unwrap();
    let out = llmprof.wait_with_output().unwrap();
    target.wait().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "attach failed: {stdout}\n{stderr}");
    assert!(stdout.contains("target exited"), "{stdout}");
    assert!(
        stderr.contains("has no llmprof probe points; recording"),
        "{stderr}"
    );
    assert!(stdout.contains("llmprof open"), "{stdout}");
    std::thread::sleep(Duration::from_millis(10));
    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    assert_eq!(tp.unterminated_slices().unwrap(), Vec::<serde_json::Value>::new());
    let q =
        |tp: &mut e2e::trace_processor::Trace, sql: &str| tp.query_i64(sql).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        q(
            &mut tp,
            &format!(
                "select count(*) from slice where name like '{}%sleep%' and dur >= 50000000",
                slice::SYSCALL_PREFIX
            )
        ) >= 5
    );
    assert_eq!(
        q(
            &mut tp,
            &format!(
                "select count(*) from slice where name like '{}%'",
                marker::ENGINE_PROBES_NOT_FOUND
            )
        ),
        1
    );
    assert_eq!(
        q(
            &mut tp,
            &format!(
                "select count(*) from slice where name = '{}'",
                marker::TARGET_EXITED
            )
        ),
        1
    );
    assert_eq!(
        q(
            &mut tp,
            &format!("select count(*) from slice where name = '{}'", marker::SUMMARY)
        ),
        1
    );
    drop(tp);
    std::fs::remove_dir_all(&dir).unwrap();
}
