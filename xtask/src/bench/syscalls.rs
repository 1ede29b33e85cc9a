//! `cargo xtask bench syscalls` (owner: overhead): what llmprof costs a syscall-heavy target, and whether
//! `--overhead-budget` keeps that cost under the budget.
//!
//! The target is `llmprof-testee`'s `syscalls N WORK` mode: `getppid` after WORK rounds of busy work, WORK
//! chosen at start so the untraced target makes ~500k syscalls/s. Three modes, interleaved in every round
//! with a rotating order (A/B/C, B/C/A, C/A/B, ...) on one target process: detached, attached with default
//! settings, attached with `--overhead-budget`. Each round runs a short settling phase (the budget needs a
//! few 100 ms windows to act) and a measured phase; both are reported, as wall time and as the target's own
//! CPU time (`/proc/PID/schedstat`: the probes run in the target's context and are charged to it, and CPU
//! time is far less disturbed than wall time by other work on a shared machine). For the attached modes it parses
//! llmprof's exit summary: syscalls the kernel aggregates counted against the calls the target made,
//! records dropped, llmprof's own CPU, the estimated overhead, and the budget's steps.
//!
//! `--anchor` compares llmprof's default syscall path with bpftrace's count-only program
//! ([`ANCHOR_PROGRAM`], bpftrace from apt, installed by `tools::bpftrace`) in the same run on the same target:
//! the target makes bare `getppid` calls (WORK = 0, the syscall path is all there is), modes detached /
//! llmprof attached / bpftrace attached interleaved with a rotating order, and each round gives the CPU each
//! tracer adds per call over that round's detached run; the figure of merit is llmprof's added ns per call
//! divided by bpftrace's, per round, median and range over the rounds.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};

use super::common::{Testee, build_release, start_attach, stop_llmprof};
use super::stats::{median_range, pct};

/// Rounds (each runs every mode once).
const ROUNDS: usize = 5;
/// Target syscall rate of the untraced testee: a small program making ~500k syscalls/s.
const RATE: f64 = 500_000.0;
/// Seconds of the measured phase at the untraced rate.
const SECONDS: f64 = 3.0;
/// Seconds of the settling phase before it.
const SETTLE_SECONDS: f64 = 0.5;
/// `--overhead-budget` of the budget mode: the goal, 1 % of the target's CPU.
const BUDGET: &str = "1%";
/// Calls per mode and round of `--anchor` (as many as the reference run, dd making 4 M syscalls).
const ANCHOR_CALLS: u64 = 4_000_000;
/// bpftrace's count-only program, the anchor (bpftrace counting syscalls per id); `PID` is
/// replaced by the target's pid.
const ANCHOR_PROGRAM: &str = "tracepoint:raw_syscalls:sys_enter /pid == PID/ { @[args->id] = count(); }";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Detached,
    Attached,
    Budget,
    Bpftrace,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Detached => "detached",
            Mode::Attached => "attached",
            Mode::Budget => "attached + budget",
            Mode::Bpftrace => "bpftrace count-only",
        }
    }
}

/// The testee's CPU time so far, s (`/proc/PID/schedstat`, first field, ns on CPU).
fn cpu_s(t: &Testee) -> Result<f64> {
    let s = std::fs::read_to_string(format!("/proc/{}/schedstat", t.pid()))?;
    let ns: f64 = s
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .context("unreadable schedstat")?;
    Ok(ns / 1e9)
}

/// Runs `syscalls n work 0`; (wall seconds it took, CPU seconds the testee used).
fn timed(t: &mut Testee, n: u64, work: u64) -> Result<(f64, f64)> {
    let c0 = cpu_s(t)?;
    let line = t.ask(&format!("syscalls {n} {work} 0"))?;
    let ns: f64 = line
        .strip_prefix("syscalls done ")
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("testee said {line:?}"))?;
    Ok((ns / 1e9, cpu_s(t)? - c0))
}

/// What one round of one mode measured.
#[derive(Default)]
struct Sample {
    settle_s: f64,
    measured_s: f64,
    settle_cpu_s: f64,
    measured_cpu_s: f64,
    calls: u64,
    kernel_counted: Option<u64>,
    dropped: Option<u64>,
    llmprof_cpu_pct: Option<f64>,
    est_overhead_pct: Option<f64>,
    steps: Option<String>,
    events: Option<String>,
}

/// Options of `bench syscalls`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Rounds; each runs every mode once.
    #[arg(long, value_name = "N", default_value_t = ROUNDS)]
    rounds: usize,
    /// Syscall rate of the untraced target, calls/s.
    #[arg(long, value_name = "CALLS_PER_S", default_value_t = RATE)]
    rate: f64,
    /// Seconds of the measured phase at the untraced rate.
    #[arg(long, value_name = "S", default_value_t = SECONDS)]
    seconds: f64,
    /// `--overhead-budget` of the budget mode.
    #[arg(long, value_name = "PERCENT", default_value = BUDGET)]
    budget: String,
    /// Compare llmprof's default syscall path with bpftrace's count-only program instead (bare getppid
    /// calls; detached / llmprof / bpftrace; installs bpftrace from apt when missing).
    #[arg(long)]
    anchor: bool,
    /// Calls per mode and round with `--anchor`.
    #[arg(long, value_name = "N", default_value_t = ANCHOR_CALLS)]
    calls: u64,
}

/// `cargo xtask bench syscalls`.
pub(super) fn run(o: &Args) -> Result<()> {
    if !crate::util::is_root() {
        bail!("bench syscalls loads eBPF programs: run it as root");
    }
    let release = build_release(&["llmprof"])?;
    let llmprof = release.join("llmprof");
    let mut t = Testee::spawn(&release, &[], &[])?;
    if o.anchor {
        return anchor(o, &llmprof, &mut t);
    }
    let work = pick_work(&mut t, o.rate)?;
    let n = (o.rate * o.seconds) as u64;
    let n_settle = (o.rate * SETTLE_SECONDS) as u64;
    eprintln!(
        "bench: testee pid {} at WORK={work} (~{:.0}k syscalls/s untraced); {} rounds of {n_settle} + {n} calls",
        t.pid(),
        o.rate / 1e3,
        o.rounds
    );
    let trace = std::env::temp_dir().join("llmprof-bench-syscalls.perfetto-trace");
    let modes = [Mode::Detached, Mode::Attached, Mode::Budget];
    let mut samples: Vec<(Mode, Sample)> = Vec::new();
    for round in 0..o.rounds {
        for k in 0..modes.len() {
            let mode = modes[(round + k) % modes.len()];
            let session = match mode {
                Mode::Detached => None,
                Mode::Attached => Some(start_attach(&llmprof, t.pid(), &trace, &[])?),
                Mode::Budget | Mode::Bpftrace => Some(start_attach(
                    &llmprof,
                    t.pid(),
                    &trace,
                    &["--overhead-budget", &o.budget],
                )?),
            };
            let (settle_s, settle_cpu_s) = timed(&mut t, n_settle, work)?;
            let (measured_s, measured_cpu_s) = timed(&mut t, n, work)?;
            let mut s = Sample {
                settle_s,
                measured_s,
                settle_cpu_s,
                measured_cpu_s,
                calls: n_settle + n,
                ..Sample::default()
            };
            if let Some(child) = session {
                let out = stop_llmprof(child)?;
                parse_summary(&out, &mut s);
            }
            eprintln!(
                "bench: round {round} {:<18} {:>8.0} calls/s settled, {:>8.0} calls/s in the first {SETTLE_SECONDS} s",
                mode.name(),
                n as f64 / s.measured_s,
                n_settle as f64 / s.settle_s
            );
            samples.push((mode, s));
        }
    }
    let _ = std::fs::remove_file(&trace);
    report(o, work, n, n_settle, &samples);
    Ok(())
}

/// `bench syscalls --anchor`: llmprof's default syscall path against bpftrace's count-only program.
fn anchor(o: &Args, llmprof: &Path, t: &mut Testee) -> Result<()> {
    let bpftrace = crate::tools::bpftrace()?;
    let n = o.calls;
    eprintln!(
        "bench: testee pid {}, {} rounds of {n} bare getppid calls per mode",
        t.pid(),
        o.rounds
    );
    let trace = std::env::temp_dir().join("llmprof-bench-anchor.perfetto-trace");
    let modes = [Mode::Detached, Mode::Attached, Mode::Bpftrace];
    // Per round: ns of target CPU per call in each mode.
    let mut rounds: Vec<[f64; 3]> = Vec::new();
    let mut counted: Vec<(Mode, f64)> = Vec::new();
    for round in 0..o.rounds {
        let mut ns = [0.0; 3];
        for k in 0..modes.len() {
            let i = (round + k) % modes.len();
            let mode = modes[i];
            let cpu = match mode {
                Mode::Attached => {
                    let child = start_attach(llmprof, t.pid(), &trace, &[])?;
                    let cpu = timed(t, n, 0)?.1;
                    let mut s = Sample::default();
                    parse_summary(&stop_llmprof(child)?, &mut s);
                    if let Some(k) = s.kernel_counted {
                        counted.push((mode, k as f64 / n as f64 * 100.0));
                    }
                    cpu
                }
                Mode::Bpftrace => {
                    let bt = Bpftrace::start(bpftrace, t.pid())?;
                    let cpu = timed(t, n, 0)?.1;
                    counted.push((mode, bt.stop()? as f64 / n as f64 * 100.0));
                    cpu
                }
                _ => timed(t, n, 0)?.1,
            };
            ns[i] = cpu / n as f64 * 1e9;
            eprintln!(
                "bench: round {round} {:<20} {:>7.1} ns of target CPU per call",
                mode.name(),
                ns[i]
            );
        }
        rounds.push(ns);
    }
    let _ = std::fs::remove_file(&trace);
    let col = |i: usize| -> Vec<f64> { rounds.iter().map(|r| r[i]).collect() };
    let added = |i: usize| -> Vec<f64> { rounds.iter().map(|r| r[i] - r[0]).collect() };
    let mut ratio: Vec<f64> = rounds.iter().map(|r| (r[1] - r[0]) / (r[2] - r[0])).collect();
    println!();
    println!(
        "llmprof-testee: bare getppid, {n} calls per mode and round, {} rounds, modes interleaved with rotating order",
        o.rounds
    );
    println!("  target CPU per call, ns, median (min–max):");
    for (i, m) in modes.iter().enumerate() {
        println!("    {:<22} {}", m.name(), stat(&mut col(i)));
    }
    println!("  CPU added per call vs the same round's detached run, ns:");
    for (i, m) in modes.iter().enumerate().skip(1) {
        println!("    {:<22} {}", m.name(), stat(&mut added(i)));
    }
    let (med, lo, hi) = median_range(&mut ratio);
    println!(
        "  llmprof / bpftrace count-only, per round: median {med:.2} (range {lo:.2}–{hi:.2}); goal ≤ 1.20"
    );
    for m in [Mode::Attached, Mode::Bpftrace] {
        let mut c: Vec<f64> = counted.iter().filter(|(k, _)| *k == m).map(|(_, v)| *v).collect();
        println!(
            "  calls counted by {}, % of calls made: {}",
            m.name(),
            stat(&mut c)
        );
    }
    Ok(())
}

/// bpftrace running [`ANCHOR_PROGRAM`] on one pid.
struct Bpftrace {
    child: Child,
    out: std::sync::mpsc::Receiver<String>,
}

impl Bpftrace {
    /// Starts it and waits until its probe is attached (it prints `Attaching 1 probe...`).
    fn start(bin: &str, pid: u32) -> Result<Self> {
        let mut child = Command::new(bin)
            .args(["-e", &ANCHOR_PROGRAM.replace("PID", &pid.to_string())])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {bin}"))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, out) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let attached = out
            .recv_timeout(std::time::Duration::from_secs(60))
            .is_ok_and(|l| l.starts_with("Attaching"));
        if !attached {
            let _ = child.kill();
            let _ = child.wait();
            bail!("bpftrace did not attach its probe within 60 s");
        }
        Ok(Bpftrace { child, out })
    }

    /// Stops it (SIGINT, as a user would) and returns the calls its map counted for getppid.
    fn stop(mut self) -> Result<u64> {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        self.child.wait().context("waiting for bpftrace")?;
        // @[110]: N — getppid is syscall 110 on x86-64.
        Ok(self
            .out
            .try_iter()
            .find_map(|l| l.trim().strip_prefix("@[110]: ").and_then(|v| v.parse().ok()))
            .unwrap_or(0))
    }
}

/// WORK such that one iteration (busy work + untraced getppid) takes 1/rate s of the target's CPU: two
/// points of the line cpu = a + b·WORK (CPU time, not wall time: robust to other work on the machine),
/// then solve.
fn pick_work(t: &mut Testee, rate: f64) -> Result<u64> {
    let per_call = |t: &mut Testee, w: u64| -> Result<f64> {
        let n = 200_000;
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(timed(t, n, w)?.1 / n as f64);
        }
        Ok(pct(&mut v, 0.5))
    };
    for _ in 0..3 {
        let a = per_call(t, 0)?;
        let b = (per_call(t, 1_000)? - a) / 1_000.0;
        if b > 0.0 {
            return Ok(((1.0 / rate - a) / b).max(0.0).round() as u64);
        }
    }
    bail!("the busy work did not measurably take CPU time: is the testee running?")
}

/// The number after `key` in `s` (digits, dots).
fn number_after(s: &str, key: &str) -> Option<f64> {
    let rest = &s[s.find(key)? + key.len()..];
    let num: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    num.parse().ok()
}

fn parse_summary(out: &str, s: &mut Sample) {
    for l in out.lines() {
        let l = l.trim();
        if l.starts_with("probe syscalls:") {
            s.kernel_counted = number_after(l, "hits").map(|v| v as u64);
        } else if l.starts_with("lost:") {
            s.dropped = if l.contains("nothing") {
                Some(0)
            } else {
                number_after(l, "lost:").map(|v| v as u64)
            };
        } else if l.starts_with("overhead: est.") {
            s.est_overhead_pct = number_after(l, "est.");
        } else if l.starts_with("llmprof itself:") {
            s.llmprof_cpu_pct = number_after(l, "llmprof itself:");
        } else if l.starts_with("overhead budget") {
            s.steps = Some(l.split_once(": ").map_or(l, |(_, r)| r).to_owned());
        } else if l.starts_with("events:") {
            s.events = Some(l.trim_start_matches("events: ").to_owned());
        }
    }
}

/// "median (min–max)" of `v`, or "n/a".
fn stat(v: &mut [f64]) -> String {
    if v.is_empty() {
        return "n/a".into();
    }
    let (med, lo, hi) = median_range(v);
    format!("{med:.1} ({lo:.1}–{hi:.1})")
}

fn report(o: &Args, work: u64, n: u64, n_settle: u64, samples: &[(Mode, Sample)]) {
    let of = |m: Mode| samples.iter().filter(move |(k, _)| *k == m).map(|(_, s)| s);
    let mut det_measured: Vec<f64> = of(Mode::Detached).map(|s| s.measured_s).collect();
    let mut det_settle: Vec<f64> = of(Mode::Detached).map(|s| s.settle_s).collect();
    let base = pct(&mut det_measured, 0.5);
    let base_settle = pct(&mut det_settle, 0.5);
    let mut det_cpu: Vec<f64> = of(Mode::Detached).map(|s| s.measured_cpu_s).collect();
    let mut det_cpu_settle: Vec<f64> = of(Mode::Detached).map(|s| s.settle_cpu_s).collect();
    let base_cpu = pct(&mut det_cpu, 0.5);
    let base_cpu_settle = pct(&mut det_cpu_settle, 0.5);
    println!();
    println!(
        "llmprof-testee syscalls (getppid after WORK={work} busy rounds), {} rounds, modes interleaved with rotating order;",
        o.rounds
    );
    println!(
        "per round: {n_settle} calls right after attach (first {SETTLE_SECONDS} s), then {n} calls measured; budget {}",
        o.budget
    );
    for m in [Mode::Detached, Mode::Attached, Mode::Budget] {
        let mut rate: Vec<f64> = of(m).map(|s| n as f64 / s.measured_s / 1e3).collect();
        let mut slow: Vec<f64> = of(m).map(|s| (s.measured_s / base - 1.0) * 100.0).collect();
        let mut slow_settle: Vec<f64> = of(m).map(|s| (s.settle_s / base_settle - 1.0) * 100.0).collect();
        let mut whole: Vec<f64> = of(m)
            .map(|s| ((s.settle_s + s.measured_s) / (base + base_settle) - 1.0) * 100.0)
            .collect();
        println!("\n  {}:", m.name());
        let mut cpu_per_call: Vec<f64> = of(m).map(|s| s.measured_cpu_s / n as f64 * 1e9).collect();
        println!("    rate, k syscalls/s (measured phase): {}", stat(&mut rate));
        println!(
            "    target CPU per call, ns (measured phase): {}",
            stat(&mut cpu_per_call)
        );
        if m != Mode::Detached {
            let mut cpu_slow: Vec<f64> = of(m)
                .map(|s| (s.measured_cpu_s / base_cpu - 1.0) * 100.0)
                .collect();
            let mut cpu_slow_settle: Vec<f64> = of(m)
                .map(|s| (s.settle_cpu_s / base_cpu_settle - 1.0) * 100.0)
                .collect();
            let mut cpu_whole: Vec<f64> = of(m)
                .map(|s| ((s.settle_cpu_s + s.measured_cpu_s) / (base_cpu + base_cpu_settle) - 1.0) * 100.0)
                .collect();
            println!(
                "    target CPU added vs detached median, %: measured phase {}, first {SETTLE_SECONDS} s {}, whole round {}",
                stat(&mut cpu_slow),
                stat(&mut cpu_slow_settle),
                stat(&mut cpu_whole)
            );
            println!(
                "    wall-time slowdown vs detached median, %: measured phase {}",
                stat(&mut slow)
            );
            println!(
                "                                     first {SETTLE_SECONDS} s {}, whole round {}",
                stat(&mut slow_settle),
                stat(&mut whole)
            );
            let mut counted: Vec<f64> = of(m)
                .filter_map(|s| s.kernel_counted.map(|k| k as f64 / s.calls as f64 * 100.0))
                .collect();
            let mut dropped: Vec<f64> = of(m).filter_map(|s| s.dropped.map(|d| d as f64)).collect();
            let mut cpu: Vec<f64> = of(m).filter_map(|s| s.llmprof_cpu_pct).collect();
            let mut est: Vec<f64> = of(m).filter_map(|s| s.est_overhead_pct).collect();
            println!(
                "    syscalls counted by the kernel aggregates, % of calls made: {}",
                stat(&mut counted)
            );
            println!("    records dropped: {}", stat(&mut dropped));
            println!("    llmprof CPU, % of one core: {}", stat(&mut cpu));
            println!(
                "    llmprof's estimate of the overhead, % of target CPU: {}",
                stat(&mut est)
            );
            if let Some(s) = of(m).next_back() {
                if let Some(e) = &s.events {
                    println!("    events written (last round): {e}");
                }
                if let Some(st) = &s.steps {
                    println!("    budget (last round): {st}");
                }
            }
        }
    }
}
