//! `--gpu-kernels` end to end without a GPU: `llmprof attach` (the real binary, real ptrace, real eBPF) injects
//! its CUPTI helper (`libllmprof_cupti.so`, built next to `llmprof` by `cargo build -p llmprof-cupti`) into a
//! running, multi-threaded `llmprof-testee` that launches kernels through the stand-in libcuda
//! (`tests/fixtures/fake_libcuda.c`), next to which sits the stand-in CUPTI (`tests/fixtures/fake_libcupti.c`,
//! CUPTI 13's record layouts) the helper finds by its directory search. Checked as a user would: the
//! library is mapped once (and reused by a second attach), CUPTI was subscribed, enabled, then disabled and
//! unsubscribed at detach, the helper handed over exactly the records the stand-in produced, and the target
//! kept running and checking its own results throughout. Then the refusals of `--gpu-kernels on` (exit code
//! 8 and one clear message): no libcuda, a statically linked target, a target already traced, a target that
//! exits during the injection (a bystander process unharmed); and a CUPTI subscriber already present (one
//! line, the session goes on without kernels).
//!
//! Needs root and gcc: skips loudly without them, fails under `CI=true`.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e::attach::Attached;
use e2e::fixtures::{have_gcc, scratch_dir, stand_in_libcuda, stand_in_libcupti};
use e2e::testee::Testee;
use llmprof::{cupti, inject};
use llmprof_abi::cupti::GPU_HELPER_LIB;

mod attach;
mod ptrace;

const LLMPROF: &str = env!("CARGO_BIN_EXE_llmprof");

fn helper() -> PathBuf {
    Path::new(LLMPROF).with_file_name(GPU_HELPER_LIB)
}

fn preconditions() -> bool {
    e2e::require(e2e::is_root(), "not root: cannot ptrace or load eBPF programs")
        && e2e::require(
            have_gcc(),
            "gcc not installed (apt-get install gcc): cannot build the stand-in libcuda/libcupti",
        )
        && e2e::require(
            helper().is_file(),
            "the CUPTI helper is not built next to llmprof (cargo build -p llmprof-cupti)",
        )
}

/// A fresh temporary directory for one test.
fn scratch(tag: &str) -> PathBuf {
    scratch_dir(&format!("llmprof-inject-{tag}"))
}

/// A scratch folder with the stand-in `libcuda.so.1` and, next to it, the stand-in `libcupti.so`.
fn fixtures(tag: &str) -> PathBuf {
    let dir = scratch(tag);
    stand_in_libcuda(&dir);
    stand_in_libcupti(&dir);
    dir
}

/// `llmprof-testee ARGS` with `env` set.
fn spawn(args: &[&str], env: &[(&str, &str)]) -> Testee {
    Testee::start(
        Command::new(e2e::testee::path())
            .args(args)
            .envs(env.iter().copied()),
    )
}

/// The mappings of `pid` whose file is the helper: (distinct paths, executable mappings).
fn helper_mappings(pid: u32) -> (usize, usize) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    // A copy llmprof made for a target in another mount namespace is removed once loaded: " (deleted)".
    let lines: Vec<&str> = maps
        .lines()
        .map(|l| l.strip_suffix(" (deleted)").unwrap_or(l))
        .filter(|l| l.ends_with(GPU_HELPER_LIB))
        .collect();
    let mut paths: Vec<&str> = lines.iter().filter_map(|l| l.split_whitespace().nth(5)).collect();
    paths.dedup();
    (
        paths.len(),
        lines
            .iter()
            .filter(|l| l.split_whitespace().nth(1) == Some("r-xp"))
            .count(),
    )
}

/// The stand-in CUPTI's log: how many lines are exactly `what`, and the records of its completed buffers.
fn log_count(log: &Path, what: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == what)
        .count()
}

fn records_produced(log: &Path) -> u64 {
    logged_sum(log, "complete ")
}

/// The kernel records among them.
fn kernels_produced(log: &Path) -> u64 {
    logged_sum(log, "kernels ")
}

/// The kernel records among them whose launch's driver record was recorded too.
fn linked_produced(log: &Path) -> u64 {
    logged_sum(log, "linked ")
}

/// The driver records of copies among them.
fn copy_calls_produced(log: &Path) -> u64 {
    logged_sum(log, "copy-calls ")
}

fn logged_sum(log: &Path, prefix: &str) -> u64 {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix(prefix)?.parse::<u64>().ok())
        .sum()
}

/// The synchronization records among the completed buffers.
fn syncs_produced(log: &Path) -> u64 {
    logged_sum(log, "syncs ")
}

/// The graph-level records among them.
fn graphs_produced(log: &Path) -> u64 {
    logged_sum(log, "graphs ")
}
