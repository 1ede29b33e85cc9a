//! Small helpers shared by the tasks: running commands with context, locating the repository.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The repository root (the parent of xtask/).
pub fn repo_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}

/// Runs `cmd`, failing with its command line when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<()> {
    let desc = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("could not start {desc}"))?;
    if !status.success() {
        bail!("{desc} failed with {status}");
    }
    Ok(())
}

/// True when `prog` is on PATH.
pub fn have(prog: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {prog} >/dev/null 2>&1"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
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

/// The project's cache: `$XDG_CACHE_HOME/llmprof` or `~/.cache/llmprof` (models, tools, the eBPF build's target
/// dir). Kept outside the checkout so fresh clones (CI) reuse what an earlier run built.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"))
        .join("llmprof")
}

/// `python3 -m pip install --no-deps --target DIR SPEC`: a tool's wheel files in the project cache, nothing in
/// the system site.
pub fn pip_target(spec: &str, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    run(Command::new(python())
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--upgrade",
            "--target",
        ])
        .arg(dir)
        .arg(spec))
}

/// The Python interpreter to use for pip.
pub fn python() -> &'static str {
    if have("python3") { "python3" } else { "python" }
}

/// Installs Debian packages (root only) unless `probe` (a command) is already on PATH.
pub fn apt_install(probe: &str, pkgs: &[&str]) -> Result<()> {
    if have(probe) {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "{probe} is missing: install {} (as root: apt-get install -y {})",
            pkgs.join(" "),
            pkgs.join(" ")
        );
    }
    eprintln!("xtask: apt-get install {}", pkgs.join(" "));
    let _ = Command::new("apt-get").args(["update", "-qq"]).status();
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(pkgs))
}
