//! `cargo xtask bench cuda` (owner: GPU layer, issue 15 item 1): what one CUDA driver call costs the target
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
//! `--cupti`: the CPU twin of `tools/gpu/bench_attach.py`. The stand-in CUPTI
//! (`profiler-user/tests/fixtures/fake_libcupti.c`) sits next to the stand-in libcuda, so llmprof injects its
//! helper and each launch produces CUPTI's records (a kernel and its input copy; their driver calls in the
//! deep mode) at the loop's rate, hundreds of thousands per second. Modes: detached, the default (kernel
//! summaries), `--gpu-kernels all`, `--gpu-kernels off`; besides the target's CPU per launch, the trace
//! MB per minute and llmprof's own CPU and peak RSS (from its exit summary). The stand-in CUPTI's work per
//! record is a memcpy, not CUPTI's: what this measures is the helper's and llmprof's side.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, Result, bail};

use super::common::{CpuMeter, build_release, start_attach, stop_llmprof};
use super::stats::median_range;

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
}

/// The `--cupti` modes.
const CUPTI_MODES: [(&str, Option<&[&str]>); 4] = [
    ("detached", None),
    ("default (kernel summaries)", Some(&["--gpu-kernels", "on"])),
    ("--gpu-kernels all", Some(&["--gpu-kernels", "all"])),
    ("--gpu-kernels off", Some(&["--gpu-kernels", "off"])),
];

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

struct Testee {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Testee {
    fn cmd(&mut self, c: &str, want: &str) -> Result<()> {
        writeln!(self.stdin, "{c}").context("writing to the testee")?;
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line).context("reading the testee")? == 0 {
                bail!("the testee exited while waiting for `{want}`");
            }
            if line.trim() == want {
                return Ok(());
            }
        }
    }
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

/// From an exit summary: (llmprof's CPU ms, peak RSS MiB).
fn own_cost(summary: &str) -> Option<(f64, f64)> {
    let l = summary.lines().find(|l| l.contains("llmprof itself"))?;
    let num_before = |marker: &str| -> Option<f64> {
        let i = l.find(marker)?;
        l[..i].split_whitespace().last()?.parse().ok()
    };
    Some((num_before(" ms CPU (")?, num_before(" MiB")?))
}

/// `cargo xtask bench cuda`.
pub fn run(o: &Args) -> Result<()> {
    let modes: &[(&str, Option<&[&str]>)] = if o.cupti { &CUPTI_MODES } else { &MODES };
    let release = if o.cupti {
        build_release(&["llmprof", "llmprof-cupti"])?
    } else {
        build_release(&["llmprof"])?
    };
    let dir = std::env::temp_dir().join(format!("llmprof-bench-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let lib = build_stand_in(&dir)?;
    if o.cupti {
        gcc(&dir, "fake_libcupti.c", "libcupti.so")?;
    }
    let mut child = Command::new(release.join("llmprof-testee"))
        .arg("--libcuda")
        .arg(&lib)
        .env("FAKE_CUDA_SYNC_US", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting llmprof-testee")?;
    let stdin = child.stdin.take().context("no stdin")?;
    let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
    let mut t = Testee { child, stdin, stdout };
    let pid = t.child.id();
    let meter = CpuMeter::new(pid);
    let trace = dir.join("bench.perfetto-trace");
    let launches = o.launches.max(1);
    // ns per launch: [mode][round]; trace MB/min, llmprof CPU % of a core and peak RSS MiB per round.
    let mut per_call: Vec<Vec<f64>> = modes.iter().map(|_| Vec::new()).collect();
    let mut own: Vec<Vec<(f64, f64, f64)>> = modes.iter().map(|_| Vec::new()).collect();
    // Warm-up: page in the stand-in and the testee's loop.
    t.cmd(&format!("launches {launches}"), "launches done")?;
    for round in 0..o.rounds.max(1) {
        let n = modes.len();
        for k in 0..n {
            let m = (k + round) % n;
            let (name, extra) = modes[m];
            let session = match extra {
                Some(args) => {
                    let args: Vec<&str> = args.iter().chain(QUIET.iter()).copied().collect();
                    Some(start_attach(&release.join("llmprof"), pid, &trace, &args)?)
                }
                None => None,
            };
            let cpu0 = meter.cpu_s()?;
            let t0 = std::time::Instant::now();
            t.cmd(&format!("launches {launches}"), "launches done")?;
            let secs = t0.elapsed().as_secs_f64();
            let ns = (meter.cpu_s()? - cpu0) * 1e9 / launches as f64;
            eprintln!("bench: round {round} {name}: {ns:.0} ns target CPU per launch");
            per_call[m].push(ns);
            if let Some(s) = session {
                let summary = stop_llmprof(s)?;
                for l in summary.lines().filter(|l| {
                    l.contains("CUDA driver calls:")
                        || l.contains("CUPTI helper")
                        || l.contains("gpu_activity")
                }) {
                    eprintln!("bench:   {}", l.trim());
                }
                let mb = std::fs::metadata(&trace).map(|m| m.len()).unwrap_or(0) as f64 / 1e6;
                if let Some((cpu_ms, rss)) = own_cost(&summary) {
                    own[m].push((mb / (secs / 60.0), cpu_ms / 10.0 / secs, rss));
                }
            }
        }
    }
    let _ = writeln!(t.stdin, "exit");
    let _ = t.child.wait();
    drop(meter);
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "bench cuda{}: {launches} launches per mode and round, {} rounds, target CPU per launch (stand-in libcuda{})",
        if o.cupti { " --cupti" } else { "" },
        o.rounds.max(1),
        if o.cupti { " and CUPTI" } else { "" }
    );
    let added: Vec<Vec<f64>> = per_call
        .iter()
        .map(|v| v.iter().zip(&per_call[0]).map(|(a, d)| a - d).collect())
        .collect();
    for (m, (name, _)) in modes.iter().enumerate() {
        let (cm, cl, ch) = median_range(&mut per_call[m].clone());
        let extra = if m == 0 {
            String::new()
        } else {
            let (am, al, ah) = median_range(&mut added[m].clone());
            format!(", added {am:.0} ns per launch (range {al:.0}-{ah:.0})")
        };
        let own = if own[m].is_empty() {
            String::new()
        } else {
            let (mb, _, _) = median_range(&mut own[m].iter().map(|o| o.0).collect::<Vec<_>>());
            let (cpu, _, _) = median_range(&mut own[m].iter().map(|o| o.1).collect::<Vec<_>>());
            let rss = own[m].iter().map(|o| o.2).fold(0.0, f64::max);
            format!("; trace {mb:.1} MB/min, llmprof {cpu:.1}% of a core, peak RSS {rss:.0} MiB")
        };
        println!("  {name:<32} {cm:.0} ns (range {cl:.0}-{ch:.0}){extra}{own}");
    }
    if o.cupti {
        return Ok(());
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
