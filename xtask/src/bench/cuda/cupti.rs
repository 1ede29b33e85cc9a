//! `cargo xtask bench cuda --cupti`: the CPU twin of `tools/gpu/bench_attach.py`. What attaching costs a CUDA
//! server's host side when llmprof injects its CUPTI helper, against the stand-in libcuda and CUPTI
//! (`profiler-user/tests/fixtures/fake_libcuda.c`, `fake_libcupti.c`), at a GPU server's record rate.
//!
//! The load: `llmprof-testee`'s `cuda STEPS K`, engine steps each of K kernel launches (each a kernel and an
//! input copy to CUPTI: 2K GPU records, 2K more API records in the deep mode), a device-to-host copy and a
//! stream synchronize that each wait `--step-wait-us` (the step's waits for the GPU), inside a `llmserve::forward`
//! range and ended by a step record (the engine probes). Defaults: 40 kernels, 500 µs: ~800 steps/s and ~65,000
//! GPU records/s, the rate measured on an H200 under llmserve (832,794 kernel/copy/wait records in 12 s).
//!
//! Modes, rotating each round: detached, the default attach (kernel summaries), `--gpu-kernels all` (every
//! record), `--gpu-kernels off`; llmprof's other defaults stay (stack samples, thread states). Per mode, median
//! and range over the rounds: the target's CPU per step (its whole process: the launching thread, the stand-in
//! CUPTI's thread and the helper's callbacks) and what it adds over the same round's detached run; steps per
//! second; llmprof's own estimate of what it added; trace MB per minute of steps; llmprof's CPU (% of one core)
//! and RSS while the steps ran (its peak RSS, start-up included, beside). The stand-in CUPTI's work per record
//! is a lock and a memcpy, not CUPTI's: what this measures is the helper's and llmprof's side; what CUPTI
//! itself spends per record in the launching threads only the GPU bench measures.

use std::time::Instant;

use anyhow::{Context, Result};

use super::super::common::{CpuMeter, build_release, start_attach, stop_llmprof};
use super::super::stats::median_range;
use super::{Args, build_stand_in, gcc, spawn_on};

/// Steps per mode and round (about 20 s at the default rate).
pub const STEPS: u64 = 16_000;
/// Kernel launches per step.
pub const KERNELS_PER_STEP: u64 = 40;
/// The step's wait for the GPU, µs.
pub const STEP_WAIT_US: u64 = 500;

/// The modes: name and llmprof's options (None: detached).
const MODES: [(&str, Option<&[&str]>); 4] = [
    ("detached", None),
    ("default (kernel summaries)", Some(&["--gpu-kernels", "on"])),
    ("--gpu-kernels all", Some(&["--gpu-kernels", "all"])),
    ("--gpu-kernels off", Some(&["--gpu-kernels", "off"])),
];

/// One attached run's figures.
#[derive(Clone, Copy, Debug, Default)]
struct Own {
    /// Trace MB per minute of steps.
    trace_mb_min: f64,
    /// llmprof's CPU while the steps ran, % of one core.
    cpu_pct: f64,
    /// llmprof's RSS at the end of the steps, MiB.
    rss_mib: f64,
    /// Its peak RSS over the session (start-up included), MiB.
    hwm_mib: f64,
    /// Its estimate of the CPU it added to the target, µs per step.
    est_us_step: f64,
    /// The CUPTI helper's measured thread CPU, ns per CUPTI record.
    helper_ns_record: f64,
    /// CUPTI records per second of steps.
    records_s: f64,
}

/// Per mode: where llmprof's memory was at the end of its last run ([`rss_breakdown`]).
type Breakdowns = Vec<Option<String>>;

/// `VmRSS` and `VmHWM` of `pid`, MiB.
fn rss_mib(pid: u32) -> (f64, f64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

/// Where `pid`'s resident memory is, MiB by mapping kind from `/proc/PID/smaps`: anonymous (heap, thread
/// stacks, malloc arenas), BPF maps mapped in (the ring buffer), and files (binaries, libraries, files a
/// symbolizer maps), the largest three named.
fn rss_breakdown(pid: u32) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut by: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    let mut current = String::new();
    for l in s.lines() {
        let mut f = l.split_whitespace();
        let first = f.next().unwrap_or("");
        if first.contains('-') && first.chars().next().is_some_and(|c| c.is_ascii_hexdigit()) {
            let path = l.split_whitespace().nth(5).unwrap_or("");
            current = if path.is_empty() || path.starts_with("[heap]") || path.starts_with("[stack") {
                "anonymous".to_owned()
            } else if path.starts_with("anon_inode:bpf") {
                "bpf maps".to_owned()
            } else if path.starts_with('[') {
                "other".to_owned()
            } else {
                path.rsplit('/').next().unwrap_or(path).to_owned()
            };
        } else if first == "Rss:" {
            let kb: f64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
            *by.entry(current.clone()).or_default() += kb / 1024.0;
        }
    }
    let anon = by.remove("anonymous").unwrap_or(0.0);
    let bpf = by.remove("bpf maps").unwrap_or(0.0);
    let other = by.remove("other").unwrap_or(0.0);
    let mut files: Vec<(String, f64)> = by.into_iter().collect();
    files.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total_files: f64 = files.iter().map(|f| f.1).sum();
    let top: Vec<String> = files.iter().take(3).map(|(n, m)| format!("{n} {m:.0}")).collect();
    format!(
        "anonymous {anon:.0}, BPF maps {bpf:.0}, files {total_files:.0} ({}), other {other:.0}",
        top.join(", ")
    )
}

/// The number before `marker` in `line`.
fn num_before(line: &str, marker: &str) -> Option<f64> {
    let i = line.find(marker)?;
    line[..i].split_whitespace().last()?.parse().ok()
}

/// From the exit summary: (estimated ms added to the target, the CUPTI helper's measured thread ms, CUPTI
/// records).
fn estimates(summary: &str) -> (Option<f64>, Option<(f64, f64)>) {
    let est = summary
        .lines()
        .find(|l| l.contains("overhead: est."))
        .and_then(|l| num_before(l, " ms CPU added to the target"));
    let cupti = summary
        .lines()
        .find(|l| l.contains("CUPTI helper in the target"))
        .and_then(|l| {
            Some((
                num_before(l, " ms (measured there)")?,
                num_before(l, " CUPTI records")?,
            ))
        });
    (est, cupti)
}

/// `cargo xtask bench cuda --cupti`.
pub fn run(o: &Args) -> Result<()> {
    let release = build_release(&["llmprof", "llmprof-cupti"])?;
    let dir = std::env::temp_dir().join(format!("llmprof-bench-cupti-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let lib = build_stand_in(&dir)?;
    gcc(&dir, "fake_libcupti.c", "libcupti.so")?;
    let mut t = spawn_on(
        &release,
        &lib,
        &[("FAKE_CUDA_SYNC_US", o.step_wait_us.to_string())],
    )?;
    let pid = t.pid();
    let meter = CpuMeter::new(pid);
    let trace = dir.join("bench.perfetto-trace");
    let (steps, k) = (o.steps.max(1), o.kernels_per_step.max(1));
    let cmd = format!("cuda {steps} {k}");
    // Per mode, per round: target CPU µs per step, steps/s, and the attached runs' figures.
    let mut cpu: Vec<Vec<f64>> = MODES.iter().map(|_| Vec::new()).collect();
    let mut rate: Vec<Vec<f64>> = MODES.iter().map(|_| Vec::new()).collect();
    let mut own: Vec<Vec<Own>> = MODES.iter().map(|_| Vec::new()).collect();
    let mut memory: Breakdowns = MODES.iter().map(|_| None).collect();
    // Warm-up: page in the stand-ins and the testee's loop.
    t.cmd(&format!("cuda 200 {k}"), "cuda done")?;
    for round in 0..o.rounds.max(1) {
        let n = MODES.len();
        for i in 0..n {
            let m = (i + round) % n;
            let (name, extra) = MODES[m];
            let session = match extra {
                Some(args) => Some(start_attach(&release.join("llmprof"), pid, &trace, args)?),
                None => None,
            };
            let lmeter = session.as_ref().map(|s| CpuMeter::Stat(s.id()));
            let l0 = lmeter.as_ref().map(CpuMeter::cpu_s).transpose()?;
            let cpu0 = meter.cpu_s()?;
            let t0 = Instant::now();
            t.cmd(&cmd, "cuda done")?;
            let secs = t0.elapsed().as_secs_f64();
            let us = (meter.cpu_s()? - cpu0) * 1e6 / steps as f64;
            cpu[m].push(us);
            rate[m].push(steps as f64 / secs);
            eprintln!(
                "bench: round {round} {name}: {us:.1} µs target CPU per step, {:.0} steps/s",
                steps as f64 / secs
            );
            let Some(s) = session else { continue };
            let lcpu = match (lmeter.as_ref().map(CpuMeter::cpu_s).transpose()?, l0) {
                (Some(b), Some(a)) => (b - a) / secs * 100.0,
                _ => f64::NAN,
            };
            let (rss, hwm) = rss_mib(s.id());
            memory[m] = Some(rss_breakdown(s.id()));
            let summary = stop_llmprof(s)?;
            for l in summary
                .lines()
                .filter(|l| l.contains("CUPTI helper") || l.contains("overhead: est."))
            {
                eprintln!("bench:   {}", l.trim());
            }
            let mb = std::fs::metadata(&trace).map(|m| m.len()).unwrap_or(0) as f64 / 1e6;
            let (est, cupti) = estimates(&summary);
            let (helper_ms, records) = cupti.unwrap_or((0.0, 0.0));
            own[m].push(Own {
                trace_mb_min: mb / (secs / 60.0),
                cpu_pct: lcpu,
                rss_mib: rss,
                hwm_mib: hwm,
                est_us_step: est.map_or(f64::NAN, |e| e * 1e3 / steps as f64),
                helper_ns_record: if records > 0.0 {
                    helper_ms * 1e6 / records
                } else {
                    f64::NAN
                },
                records_s: records / secs,
            });
        }
    }
    drop(t);
    drop(meter);
    let _ = std::fs::remove_dir_all(&dir);
    report(o, steps, k, &cpu, &rate, &own, &memory);
    Ok(())
}

/// Median and range of one figure of the attached runs, `fmt` with `digits` decimals.
fn figure(own: &[Own], f: impl Fn(&Own) -> f64, digits: usize) -> String {
    let mut v: Vec<f64> = own.iter().map(f).filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return "-".to_owned();
    }
    let (m, l, h) = median_range(&mut v);
    format!("{m:.digits$} ({l:.digits$}-{h:.digits$})")
}

fn report(
    o: &Args,
    steps: u64,
    k: u64,
    cpu: &[Vec<f64>],
    rate: &[Vec<f64>],
    own: &[Vec<Own>],
    memory: &Breakdowns,
) {
    println!(
        "bench cuda --cupti: {steps} steps of {k} kernels ({} µs wait each) per mode and round, {} rounds; \
         stand-in libcuda and CUPTI; medians (ranges)",
        o.step_wait_us,
        o.rounds.max(1)
    );
    for (m, (name, _)) in MODES.iter().enumerate() {
        let (cm, cl, ch) = median_range(&mut cpu[m].clone());
        let (rm, rl, rh) = median_range(&mut rate[m].clone());
        println!("  {name}");
        println!("    target CPU {cm:.1} µs per step ({cl:.1}-{ch:.1}); {rm:.0} steps/s ({rl:.0}-{rh:.0})");
        if m == 0 {
            continue;
        }
        let mut added: Vec<f64> = cpu[m].iter().zip(&cpu[0]).map(|(a, d)| a - d).collect();
        let mut pct: Vec<f64> = cpu[m]
            .iter()
            .zip(&cpu[0])
            .map(|(a, d)| (a - d) / d * 100.0)
            .collect();
        let (am, al, ah) = median_range(&mut added);
        let (pm, pl, ph) = median_range(&mut pct);
        let runs = &own[m];
        println!(
            "    added {am:.1} µs per step ({al:.1}-{ah:.1}) = {pm:+.1}% ({pl:+.1}-{ph:+.1}); llmprof's estimate {} µs per step",
            figure(runs, |x| x.est_us_step, 1)
        );
        println!(
            "    trace {} MB/min; llmprof {} % of a core, RSS {} MiB while the steps ran, peak {} MiB",
            figure(runs, |x| x.trace_mb_min, 1),
            figure(runs, |x| x.cpu_pct, 1),
            figure(runs, |x| x.rss_mib, 0),
            figure(runs, |x| x.hwm_mib, 0),
        );
        if let Some(b) = &memory[m] {
            println!("    llmprof's RSS by mapping, MiB: {b}");
        }
        if runs.iter().any(|x| x.records_s > 0.0) {
            println!(
                "    CUPTI records {} /s; the helper's thread {} ns per record (measured in the target)",
                figure(runs, |x| x.records_s, 0),
                figure(runs, |x| x.helper_ns_record, 0)
            );
        }
    }
}
