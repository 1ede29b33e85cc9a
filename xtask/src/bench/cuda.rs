//! `cargo xtask bench cuda` (owner: GPU layer): what one CUDA driver call costs the target
//! under each way llmprof probes libcuda, without a GPU.
//!
//! The target is `llmprof-testee --libcuda` with the stand-in driver library of the tests
//! (`profiler-user/tests/fixtures/fake_libcuda.c`, compiled here with gcc): its `launches N` command makes N
//! kernel launches through the three entry points a real process uses (the exported `cuLaunchKernel`, which
//! calls the implementation `cuGetProcAddress` hands out, `_ptsz`, and that pointer itself). Modes,
//! interleaved with a rotating order on one target process: detached, `--cuda-calls counted` (the default:
//! entry-only counting uprobe) and `--cuda-calls all` (entry + return pair per call). Each round gives the
//! target's CPU time per launch (a cpuacct group of its own); the figure of merit is the CPU each mode adds
//! per launch over the same round's detached run, median and range over the rounds, and the ratio of the two
//! modes. The stand-in's launch is a few ns of work, so what is added is the probe path alone; on a GPU the
//! driver's own launch cost (µs) comes on top in every mode.
//!
//! `--cupti`: the CPU twin of `tools/gpu/bench_attach.py`, engine steps with the stand-in CUPTI ([`cupti`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::common::{CpuMeter, Testee, build_release, start_attach, stop_llmprof};
use super::stats::median_range;

mod cupti;

/// Rounds (each runs every mode once).
const ROUNDS: usize = 5;
/// Launches per mode and round.
const LAUNCHES: u64 = 200_000;

/// Options of `bench cuda`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Rounds; each runs every mode once.
    #[arg(long, value_name = "N", default_value_t = ROUNDS)]
    rounds: usize,
    /// Launches per mode and round.
    #[arg(long, value_name = "N", default_value_t = LAUNCHES)]
    launches: u64,
    /// The CUPTI modes with the stand-in CUPTI (default summaries, --gpu-kernels all, off) instead of the
    /// driver-probe modes.
    #[arg(long)]
    cupti: bool,
    /// `--cupti`: engine steps per mode and round.
    #[arg(long, value_name = "N", default_value_t = cupti::STEPS)]
    steps: u64,
    /// `--cupti`: kernel launches per step (each also a copy: two GPU records).
    #[arg(long, value_name = "N", default_value_t = cupti::KERNELS_PER_STEP)]
    kernels_per_step: u64,
    /// `--cupti`: each of the step's two waits for the GPU (the stand-in's blocking copy and stream
    /// synchronize), µs: sets the step rate.
    #[arg(long, value_name = "US", default_value_t = cupti::STEP_WAIT_US)]
    step_wait_us: u64,
}

/// The modes: name and llmprof's options (None: detached).
const MODES: [(&str, Option<&[&str]>); 3] = [
    ("detached", None),
    (
        "--cuda-calls counted (default)",
        Some(&["--cuda-calls", "counted"]),
    ),
    ("--cuda-calls all", Some(&["--cuda-calls", "all"])),
];

/// Options every attached mode adds: only the CUDA probes' cost is measured.
const QUIET: [&str; 5] = [
    "--no-sample",
    "--no-thread-states",
    "--no-http",
    "--gpu-sample-interval",
    "0",
];

/// `llmprof-testee --libcuda LIB` from the release directory, with `env` set.
fn spawn_on(release: &Path, lib: &Path, env: &[(&str, String)]) -> Result<Testee> {
    Testee::spawn(release, &["--libcuda".as_ref(), lib.as_os_str()], env)
}

fn build_stand_in(dir: &Path) -> Result<PathBuf> {
    gcc(dir, "fake_libcuda.c", "libcuda.so.1")
}

fn gcc(dir: &Path, src: &str, lib: &str) -> Result<PathBuf> {
    let src = crate::util::repo_root()
        .join("profiler-user/tests/fixtures")
        .join(src);
    let out = dir.join(lib);
    let st = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O1", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .context("running gcc (apt install gcc)")?;
    if !st.success() {
        bail!("compiling {} failed", src.display());
    }
    Ok(out)
}

/// `cargo xtask bench cuda`.
pub fn run(o: &Args) -> Result<()> {
    if o.cupti {
        return cupti::run(o);
    }
    let release = build_release(&["llmprof"])?;
    let dir = std::env::temp_dir().join(format!("llmprof-bench-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let lib = build_stand_in(&dir)?;
    let mut t = spawn_on(&release, &lib, &[])?;
    let pid = t.pid();
    let meter = CpuMeter::new(pid);
    let trace = dir.join("bench.perfetto-trace");
    let launches = o.launches.max(1);
    // ns per launch: [mode][round].
    let mut per_call: Vec<Vec<f64>> = MODES.iter().map(|_| Vec::new()).collect();
    // Warm-up: page in the stand-in and the testee's loop.
    t.cmd(&format!("launches {launches}"), "launches done")?;
    for round in 0..o.rounds.max(1) {
        let n = MODES.len();
        for k in 0..n {
            let m = (k + round) % n;
            let (name, extra) = MODES[m];
            let session = match extra {
                Some(args) => {
                    let args: Vec<&str> = args.iter().chain(QUIET.iter()).copied().collect();
                    Some(start_attach(&release.join("llmprof"), pid, &trace, &args)?)
                }
                None => None,
            };
            let cpu0 = meter.cpu_s()?;
            t.cmd(&format!("launches {launches}"), "launches done")?;
            let ns = (meter.cpu_s()? - cpu0) * 1e9 / launches as f64;
            eprintln!("bench: round {round} {name}: {ns:.0} ns target CPU per launch");
            per_call[m].push(ns);
            if let Some(s) = session {
                let summary = stop_llmprof(s)?;
                for l in summary.lines().filter(|l| l.contains("CUDA driver calls:")) {
                    eprintln!("bench:   {}", l.trim());
                }
            }
        }
    }
    drop(t);
    drop(meter);
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "bench cuda: {launches} launches per mode and round, {} rounds, target CPU per launch (stand-in libcuda)",
        o.rounds.max(1)
    );
    let added: Vec<Vec<f64>> = per_call
        .iter()
        .map(|v| v.iter().zip(&per_call[0]).map(|(a, d)| a - d).collect())
        .collect();
    for (m, (name, _)) in MODES.iter().enumerate() {
        let (cm, cl, ch) = median_range(&mut per_call[m].clone());
        let extra = if m == 0 {
            String::new()
        } else {
            let (am, al, ah) = median_range(&mut added[m].clone());
            format!(", added {am:.0} ns per launch (range {al:.0}-{ah:.0})")
        };
        println!("  {name:<32} {cm:.0} ns (range {cl:.0}-{ch:.0}){extra}");
    }
    let mut ratio: Vec<f64> = added[2]
        .iter()
        .zip(&added[1])
        .map(|(a, c)| a / c.max(1.0))
        .collect();
    let (rm, rl, rh) = median_range(&mut ratio);
    println!("  all / counted (added per launch): {rm:.2}x (range {rl:.2}-{rh:.2})");
    Ok(())
}
