//! The two top-level flows README.md promises: `cargo xtask demo` (the main job on a fresh machine) and
//! `cargo xtask test` (every test, as CI runs them).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::util::{repo_root, run};

/// `cargo xtask test [ARGS]`: installs what the tests need, proves the committed eBPF object matches its source, checks
/// rustfmt and clippy (warnings are errors), builds every binary and runs every test (eBPF tests need root; under `CI=true` they fail instead of skipping).
/// `args` go to `cargo test --workspace --no-fail-fast` as they are.
pub fn test(args: &[String]) -> Result<()> {
    let root = repo_root();
    crate::model::fetch(false)?;
    crate::tools::setup()?;
    // llama.cpp's OpenAI server and the OpenAI client for the wire-probe tests (tests/tests/wire_llama.rs).
    crate::servers::setup()?;
    // vLLM's CPU build and the model converted for it (tests/tests/vllm_hooks.rs).
    crate::vllm::setup(&crate::model::default_model_path())?;
    crate::ebpf::setup()?;
    crate::ebpf::build(true)?;
    run(Command::new("cargo")
        .current_dir(&root)
        .args(["fmt", "--all", "--check"]))?;
    run(Command::new("cargo").current_dir(&root).args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(Command::new("cargo")
        .current_dir(&root)
        .args(["build", "--workspace", "--bins"]))?;
    // The helpers llmprof injects (cdylibs no binary depends on): the CUPTI one (`--gpu-kernels`) and the
    // Python hooks, next to `llmprof` in the profile's directory, where llmprof and the tests look for them.
    run(Command::new("cargo").current_dir(&root).args([
        "build",
        "-p",
        "llmprof-cupti",
        "-p",
        "llmprof-pyhooks",
        "--lib",
    ]))?;
    // llmprof alone, as a user installs and ships it: `cargo install` into a temporary root from the
    // build above (dev profile, nothing compiled again), the release artefacts and the .deb installed and purged.
    crate::release::install_check(true)?;
    let dist = crate::release::dist(true)?;
    crate::release::check_artefacts(&dist)?;
    crate::release::deb_check(&dist.deb)?;
    // The DaemonSet's image (buildah, FROM scratch), checked by chroot; deploy/kubernetes against the schemas.
    crate::image::build_from(&dist, true)?;
    let mut cmd = Command::new("cargo");
    cmd.current_dir(&root)
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(args);
    run(&mut cmd)?;
    // The engine's `cuda` feature (cudarc loads libcuda at run time, so it builds anywhere): lint it and run
    // what runs without a GPU (device selection and failover, the kernels under the CPU emulator, unit tests).
    run(Command::new("cargo").current_dir(&root).args([
        "clippy",
        "-p",
        "inference",
        "--features",
        "cuda",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // NVRTC from the project cache (setup-tools), found through the linker's search like a system install.
    let nvrtc = crate::tools::nvrtc_lib_dir();
    let ld_path = match std::env::var_os("LD_LIBRARY_PATH") {
        Some(p) if !p.is_empty() => {
            let mut v = nvrtc.into_os_string();
            v.push(":");
            v.push(p);
            v
        }
        _ => nvrtc.into_os_string(),
    };
    run(Command::new("cargo")
        .current_dir(&root)
        .env("LD_LIBRARY_PATH", ld_path)
        .args([
            "test",
            "-p",
            "inference",
            "--features",
            "cuda",
            "--lib",
            "--test",
            "cuda_kernels_emulated",
            "--test",
            "cuda_device_select",
            "--test",
            "cuda_nvrtc",
        ]))
}

/// `cargo xtask demo [SECONDS]`: starts the engine on the default model, drives concurrent chat requests, attaches
/// llmprof for `secs` seconds, and prints where the trace is and how to open it.
pub fn demo(secs: u64) -> Result<()> {
    let root = repo_root();
    if !crate::util::is_root() {
        bail!("the demo attaches eBPF probes and needs root: run `sudo -E cargo xtask demo`");
    }
    crate::model::fetch(false)?;
    run(Command::new("cargo").current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "inference",
        "-p",
        "llmprof",
    ]))?;
    let bin = root.join("target/release");
    let (mut engine, port) = start_engine(&bin.join("llmserve"))?;
    let pid = engine.id();
    println!("engine llmserve pid {pid} on http://127.0.0.1:{port}");

    let stop = Instant::now() + Duration::from_secs(secs + 2);
    let load: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let prompts = [
                    "What is the capital of France?",
                    "Write a haiku about GPUs.",
                    "Explain continuous batching in one paragraph.",
                    "List three prime numbers.",
                ];
                let mut n = 0u32;
                while Instant::now() < stop {
                    let body = format!(
                        r#"{{"model":"smollm2","messages":[{{"role":"user","content":"{}"}}],"max_tokens":48,"temperature":0.7,"seed":{n}}}"#,
                        prompts[(i + n as usize) % prompts.len()]
                    );
                    let _ = post(port, "/v1/chat/completions", &body);
                    n += 1;
                }
                n
            })
        })
        .collect();

    let out = root.join("llmprof-demo.perfetto-trace");
    // attach never overwrites a trace: the previous demo's goes.
    let _ = std::fs::remove_file(&out);
    let status = Command::new(bin.join("llmprof"))
        .args([
            "attach",
            "--pid",
            &pid.to_string(),
            "-d",
            &format!("{secs}s"),
            "-o",
        ])
        .arg(&out)
        .status()
        .context("running llmprof attach")?;
    let requests: u32 = load.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    let _ = engine.kill();
    let _ = engine.wait();
    if !status.success() {
        bail!("llmprof attach failed ({status})");
    }
    println!("\n{requests} chat requests served during the demo.");
    println!("Trace: {}", out.display());
    println!(
        "Open it in Perfetto UI: {} open {}",
        bin.join("llmprof").display(),
        out.display()
    );
    println!("(or drag the file onto https://ui.perfetto.dev)");
    Ok(())
}

fn start_engine(bin: &Path) -> Result<(std::process::Child, u16)> {
    let mut child = Command::new(bin)
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--served-model-name",
            "smollm2",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let stdout = child.stdout.take().context("engine stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let Some(line) = lines.next() else { break };
        let line = line?;
        println!("[llmserve] {line}");
        if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
            let port: u16 = rest
                .trim()
                .trim_end_matches('/')
                .parse()
                .context("port in the listening line")?;
            std::thread::spawn(move || lines.for_each(drop));
            return Ok((child, port));
        }
    }
    let _ = child.kill();
    bail!("llmserve did not start listening within 120 s")
}

/// POSTs JSON to 127.0.0.1:`port` and returns the raw response.
pub fn post(port: u16, path: &str, body: &str) -> Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out)?;
    Ok(out)
}
