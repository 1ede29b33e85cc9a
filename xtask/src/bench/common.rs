//! What several benches share: the release build, the traced test process (`llmprof-testee`), llmprof attach
//! sessions, and the setup of the attached/detached A/B benches. Imports no bench kind.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::load::{EngineArgs, ServerProc, one_request, start_server};

/// Builds `packages` in release; returns the release directory. llmprof comes with its test process
/// `llmprof-testee` (its `testee` feature, which changes nothing in llmprof itself: one build for every bench).
pub(super) fn build_release(packages: &[&str]) -> Result<PathBuf> {
    let root = crate::util::repo_root();
    eprintln!("bench: building {} (release)...", packages.join(", "));
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["build", "--release"]).current_dir(&root);
    for p in packages {
        cmd.args(["-p", p]);
    }
    if packages.contains(&"llmprof") {
        cmd.args(["--features", "llmprof/testee"]);
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

/// `llmprof-testee` (from the release directory of [`build_release`]), driven line by line; killed on drop.
pub(super) struct Testee {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pid: u32,
}

impl Testee {
    /// Starts `release/llmprof-testee ARGS` with `env` set and reads its `ready PID` line.
    pub(super) fn spawn(release: &Path, args: &[&std::ffi::OsStr], env: &[(&str, String)]) -> Result<Self> {
        let bin = release.join("llmprof-testee");
        let mut child = Command::new(&bin)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdin = child.stdin.take().context("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        let mut t = Testee {
            child,
            stdin,
            stdout,
            pid: 0,
        };
        let ready = t.line()?;
        t.pid = ready
            .strip_prefix("ready ")
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("the testee said {ready:?}"))?;
        Ok(t)
    }

    /// Its process id.
    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    /// Its next line, trimmed.
    pub(super) fn line(&mut self) -> Result<String> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line).context("reading the testee")? == 0 {
            bail!("the testee exited");
        }
        Ok(line.trim().to_owned())
    }

    /// Sends `c` and returns the answer line.
    pub(super) fn ask(&mut self, c: &str) -> Result<String> {
        writeln!(self.stdin, "{c}")
            .and_then(|()| self.stdin.flush())
            .context("writing to the testee")?;
        self.line()
    }

    /// Sends `c` and reads lines until `want`.
    pub(super) fn cmd(&mut self, c: &str, want: &str) -> Result<()> {
        let mut line = self.ask(c)?;
        while line != want {
            line = self.line().with_context(|| format!("waiting for `{want}`"))?;
        }
        Ok(())
    }
}

impl Drop for Testee {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
        // -v: the exit summary's internals (per-probe counters, costs) that the benches read.
        .args(["attach", "--pid", &pid.to_string(), "-v", "-o"])
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
    let c = o.first_level(AB_CONCURRENCY);
    let n_req = c.max(3);
    Ok(AbSetup {
        release,
        server,
        port,
        c,
        n_req,
    })
}

/// One mode of an interleaved bench: its label and llmprof's options (`None`: detached).
pub(super) type Mode<'a> = (&'a str, Option<&'a [&'a str]>);

/// What each mode of [`interleaved`] measured, one entry per round.
#[derive(Default)]
pub(super) struct ModeRuns {
    /// The target's CPU time per generated token, ms.
    pub(super) cpu_ms_per_token: Vec<f64>,
    /// Output tokens per second.
    pub(super) tok_s: Vec<f64>,
    /// Trace MB per minute (attached modes).
    pub(super) mb_per_min: Vec<f64>,
}

/// The target's CPU time, every thread it ever had included (a server's short-lived worker threads take their
/// CPU with them from `/proc/PID/task`): a cgroup v1 `cpuacct` group of its own when this machine has one (ns
/// resolution), else `/proc/PID/stat` (user + system, 10 ms ticks).
pub(super) enum CpuMeter {
    /// The target moved into this cpuacct group (removed on drop).
    Cgroup(PathBuf),
    /// The target's pid.
    Stat(u32),
}

/// Where cgroup v1's cpuacct hierarchy is mounted.
const CPUACCT: &str = "/sys/fs/cgroup/cpuacct";

impl CpuMeter {
    /// Moves `pid` (all its threads) into a fresh cpuacct group, or falls back to `/proc/PID/stat`.
    pub(super) fn new(pid: u32) -> Self {
        let dir = Path::new(CPUACCT).join(format!("llmprof-bench-{pid}"));
        let moved = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(dir.join("cgroup.procs"), pid.to_string()))
            .and_then(|()| std::fs::read_to_string(dir.join("cpuacct.usage")).map(|_| ()));
        match moved {
            Ok(()) => CpuMeter::Cgroup(dir),
            Err(e) => {
                eprintln!("bench: no cpuacct group ({e}); target CPU from /proc/{pid}/stat (10 ms ticks)");
                let _ = std::fs::remove_dir(&dir);
                CpuMeter::Stat(pid)
            }
        }
    }

    /// The target's CPU time so far, s.
    pub(super) fn cpu_s(&self) -> Result<f64> {
        match self {
            CpuMeter::Cgroup(dir) => {
                let ns: u64 = std::fs::read_to_string(dir.join("cpuacct.usage"))
                    .context("reading cpuacct.usage")?
                    .trim()
                    .parse()
                    .context("parsing cpuacct.usage")?;
                Ok(ns as f64 / 1e9)
            }
            CpuMeter::Stat(pid) => {
                let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .context("reading the target's stat")?;
                // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
                let rest = s.rfind(')').map_or("", |i| &s[i + 1..]);
                let f: Vec<u64> = rest.split_whitespace().filter_map(|v| v.parse().ok()).collect();
                // utime and stime are fields 14 and 15 (11 and 12 after the state field, which is not a number).
                let ticks = f.get(10).copied().unwrap_or(0) + f.get(11).copied().unwrap_or(0);
                Ok(ticks as f64 / 100.0)
            }
        }
    }
}

impl Drop for CpuMeter {
    fn drop(&mut self) {
        if let CpuMeter::Cgroup(dir) = self {
            // Whatever is still in the group goes back to the root group, then the group goes.
            if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                for p in procs.split_whitespace() {
                    let _ = std::fs::write(Path::new(CPUACCT).join("cgroup.procs"), p);
                }
            }
            let _ = std::fs::remove_dir(&*dir);
        }
    }
}

/// Runs `load` once per mode per round ([`AB_ROUNDS`]; odd rounds in reverse order) on the target `pid`, with
/// llmprof (`release`) attached as each mode says; returns each mode's runs. `log` picks summary lines of an
/// attached session to echo (e.g. `probe sched:`).
pub(super) fn interleaved(
    release: &Path,
    pid: u32,
    modes: &[Mode<'_>],
    log: &[&str],
    mut load: impl FnMut() -> Result<super::load::Row>,
) -> Result<Vec<ModeRuns>> {
    let trace = std::env::temp_dir().join(format!("llmprof-bench-{pid}.perfetto-trace"));
    let meter = CpuMeter::new(pid);
    let mut runs: Vec<ModeRuns> = modes.iter().map(|_| ModeRuns::default()).collect();
    for round in 0..AB_ROUNDS {
        let mut order: Vec<usize> = (0..modes.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for m in order {
            let (name, extra) = modes[m];
            let session = match extra {
                Some(args) => Some(start_attach(&release.join("llmprof"), pid, &trace, args)?),
                None => None,
            };
            let cpu0 = meter.cpu_s()?;
            let t0 = std::time::Instant::now();
            let row = load()?;
            let secs = t0.elapsed().as_secs_f64();
            let per_token_ms = (meter.cpu_s()? - cpu0) * 1e3 / row.tokens.max(1) as f64;
            eprintln!(
                "bench: round {round} {name}: {per_token_ms:.3} ms target CPU per token, {:.1} tok/s",
                row.tokens_per_s
            );
            runs[m].cpu_ms_per_token.push(per_token_ms);
            runs[m].tok_s.push(row.tokens_per_s);
            if let Some(child) = session {
                let summary = stop_llmprof(child)?;
                for l in summary.lines().filter(|l| log.iter().any(|k| l.contains(k))) {
                    eprintln!("bench:   {}", l.trim());
                }
                let bytes = std::fs::metadata(&trace).map(|m| m.len()).unwrap_or(0);
                runs[m].mb_per_min.push(bytes as f64 / 1e6 / (secs / 60.0));
                let _ = std::fs::remove_file(&trace);
            }
        }
    }
    Ok(runs)
}

/// Prints each mode's target CPU per token (median, range, change vs the first mode), throughput and trace size.
pub(super) fn print_modes(modes: &[Mode<'_>], runs: &mut [ModeRuns]) {
    let (base, _, _) = super::stats::median_range(&mut runs[0].cpu_ms_per_token.clone());
    for ((name, _), r) in modes.iter().zip(runs.iter_mut()) {
        let (cm, cl, ch) = super::stats::median_range(&mut r.cpu_ms_per_token);
        let (tm, _, _) = super::stats::median_range(&mut r.tok_s);
        let size = if r.mb_per_min.is_empty() {
            String::new()
        } else {
            let (sm, sl, sh) = super::stats::median_range(&mut r.mb_per_min);
            format!(", trace {sm:.2} MB/min (range {sl:.2}-{sh:.2})")
        };
        println!(
            "  {name:<40} target CPU {cm:.3} ms/token (range {cl:.3}-{ch:.3}) = {:+.2}% vs {}, {tm:.1} tok/s{size}",
            (cm / base - 1.0) * 100.0,
            modes[0].0
        );
    }
}
