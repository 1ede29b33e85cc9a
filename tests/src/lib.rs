//! Helpers for the end-to-end tests: locating the workspace's binaries, spawning the real engine, a tiny HTTP
//! client for loopback, `llmprof serve` with real Prometheus and Alertmanager around it, and the root / CI
//! policy (eBPF tests skip loudly when not root, but fail under `CI=true`).
//!
//! The tests here drive the real `llmserve` and the real `llmprof` binaries; `cargo xtask test` builds them first.

pub mod engine;
pub mod http;
pub mod serve;
pub mod trace_processor;

use std::path::PathBuf;

/// True when running under CI (`CI=true`): tests that need root, the model or a tool must fail, not skip.
pub fn in_ci() -> bool {
    std::env::var("CI")
        .map(|v| v == "true" || v == "1")
        .unwrap_or(false)
}

/// Returns false (after a loud message) when a precondition is missing outside CI; panics under CI.
pub fn require(cond: bool, what: &str) -> bool {
    if cond {
        return true;
    }
    if in_ci() {
        panic!("CI=true and {what}: this test must run in CI");
    }
    eprintln!("\n!!! SKIPPED: {what} (set CI=true to make this a failure)\n");
    false
}

/// True when the effective uid is 0.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// Path of a binary built from this workspace (same profile as the running test).
pub fn bin_path(name: &str) -> PathBuf {
    // The test executable lives in <target>/<profile>/deps/; binaries in <target>/<profile>/.
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("test binary is in <target>/<profile>/deps");
    let p = profile_dir.join(name);
    assert!(
        p.exists(),
        "{} not found: build the workspace's binaries first (`cargo build --workspace --bins`, or run `cargo xtask test`)",
        p.display()
    );
    p
}

/// Path of the default model: the engine's own default (`$LLMSERVE_MODEL`, or the cache written by
/// `cargo xtask fetch-model`).
pub fn default_model() -> PathBuf {
    inference::model::default_model_path()
}
