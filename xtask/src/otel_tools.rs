//! OTel test tools (owner: otel): the `rotel` OpenTelemetry collector, for the end-to-end test that sends
//! llmprof's spans through a real collector (`profiler-user/tests/otel_export/`).
//!
//! The PyPI package `rotel` ships the collector as a self-contained binary (`rotel/rotel-agent`). This task
//! installs the wheel's files into the project cache (`~/.cache/llmprof/tools/rotel`, pip `--target`, nothing in
//! the system site; the test looks there, or at `$LLMPROF_ROTEL`), then proves the binary runs.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util::{cache_dir, pip_target};

/// Pinned `rotel` release (a pre-release: the only kind PyPI has); verified here with its OTLP gRPC and HTTP
/// receivers and its OTLP exporter.
const ROTEL: &str = "rotel==0.0.1a15";

/// `$XDG_CACHE_HOME/llmprof/tools/rotel` (or `~/.cache/llmprof/tools/rotel`).
fn rotel_dir() -> PathBuf {
    cache_dir().join("tools").join("rotel")
}

/// `cargo xtask setup-otel-tools`.
pub fn setup() -> Result<()> {
    let dir = rotel_dir();
    let agent = dir.join("rotel").join("rotel-agent");
    if !agent.exists() {
        eprintln!(
            "setup-otel-tools: installing {ROTEL} (OpenTelemetry collector) into {}",
            dir.display()
        );
        pip_target(ROTEL, &dir)?;
    }
    let out = Command::new(&agent)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", agent.display()))?;
    let version = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !version.contains("rotel") {
        bail!(
            "{} did not run: {}{}",
            agent.display(),
            version,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!("setup-otel-tools: {} ready ({})", version.trim(), agent.display());
    Ok(())
}
