//! What several benches share (owner: engine serving): the release build, llmprof attach sessions, and the
//! setup of the attached/detached A/B benches. Imports no bench kind.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::load::{EngineArgs, ServerProc, one_request, start_server};

/// Builds `packages` in release; returns the release directory.
pub(super) fn build_release(packages: &[&str]) -> Result<PathBuf> {
    let root = crate::util::repo_root();
    eprintln!("bench: building {} (release)...", packages.join(", "));
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["build", "--release"]).current_dir(&root);
    for p in packages {
        cmd.args(["-p", p]);
    }
    if !cmd.status().context("running cargo build")?.success() {
        bail!("building {} failed", packages.join(", "));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let target = if target.is_absolute() {
        target
    } else {
        root.join(target)
    };
    Ok(target.join("release"))
}

/// Starts `llmprof attach` on `pid` (with `extra` options) and waits for "probes live". Its stdout (the exit
/// summary, a few KiB) is piped for the caller to read after stopping it.
pub(super) fn start_attach(llmprof: &Path, pid: u32, trace: &Path, extra: &[&str]) -> Result<Child> {
    // attach never overwrites a file (a planted one must not be followed): each round starts from no file.
    match std::fs::remove_file(trace) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing the previous trace {}", trace.display())),
    }
    let mut child = Command::new(llmprof)
        .args(["attach", "--pid", &pid.to_string(), "-o"])
        .arg(trace)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting llmprof attach")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("probes live") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = child.kill();
        bail!("llmprof attach did not report `probes live` within 60 s");
    }
    Ok(child)
}

/// Ends an llmprof session (attach, or serve) like Ctrl-C and waits for it to finish its trace; its stdout
/// (for attach, the exit summary) when that was piped and not taken.
pub(super) fn stop_llmprof(child: Child) -> Result<String> {
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let out = child.wait_with_output().context("waiting for llmprof")?;
    if !out.status.success() {
        bail!("llmprof exited with {}", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Rounds of the attached/detached A/B comparison (order alternates each round).
pub(super) const AB_ROUNDS: usize = 5;
/// Client concurrency of the A/B benches without `--levels`: the engine's batch fills (8 of the default
/// 32 sequences) without the per-request rate of concurrency 32.
const AB_CONCURRENCY: usize = 8;

/// What both A/B benches (attach, serve) start with: root check, release build, one warmed-up engine, and the
/// load of a round (concurrency: the first of `--levels`, else 8).
pub(super) struct AbSetup {
    pub(super) release: PathBuf,
    pub(super) server: ServerProc,
    pub(super) port: u16,
    /// Concurrent clients.
    pub(super) c: usize,
    /// Requests per round.
    pub(super) n_req: usize,
}

/// The A/B setup of `bench what`.
pub(super) fn ab_setup(o: &EngineArgs, what: &str) -> Result<AbSetup> {
    if !crate::util::is_root() {
        bail!("bench {what} loads eBPF programs: run it as root");
    }
    let release = build_release(&["inference", "llmprof"])?;
    let server = start_server(&release.join("llmserve"), o)?;
    let port = server.port;
    let _ = one_request(port, "Warm up.", 8);
    let c = o
        .levels
        .as_ref()
        .and_then(|l| l.first())
        .copied()
        .unwrap_or(AB_CONCURRENCY);
    let n_req = c.max(3);
    Ok(AbSetup {
        release,
        server,
        port,
        c,
        n_req,
    })
}
