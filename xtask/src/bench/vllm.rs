//! `cargo xtask bench vllm` (owner: the Python hooks): what llmprof costs vLLM's CPU build (`vllm serve` from
//! the vLLM venv of `cargo xtask setup`, on the converted default model) under sampled streaming chat requests
//! (temperature 0.8) at concurrency 1 unless `--levels` says otherwise. Modes, interleaved round by round on one
//! server: detached, `llmprof attach` with its defaults (the Python hooks in the engine core included),
//! `--python-hooks off` (the hooks' share) and a minimal attach (no samples, thread states, wire or hooks: what
//! the always-on families cost). The figure is vLLM's CPU time per generated token, its API server
//! and engine core together (a cpuacct group the server enters before it starts its engine core), medians and
//! ranges over the rounds; each attached session's summary lines (the hooks' own measured cost, llmprof's own
//! CPU and memory) are echoed.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::common::{AB_ROUNDS, CpuMeter, Mode, build_release, interleaved, print_modes};
use super::load::{EngineArgs, level_at, one_request};

/// Concurrency without `--levels`.
const CONCURRENCY: usize = 1;
/// Sampling temperature of the load (users sample).
const TEMPERATURE: f64 = 0.8;
/// Longest vLLM's CPU build may take to listen (minutes on a loaded 2-core machine).
const START_WAIT: Duration = Duration::from_secs(600);

/// The modes of a round, in the order of even rounds (odd rounds run them reversed).
const MODES: [Mode<'static>; 4] = [
    ("detached", None),
    ("attached, default (Python hooks)", Some(&[])),
    ("attached, --python-hooks off", Some(&["--python-hooks", "off"])),
    (
        "attached, minimal (syscalls, files, egress, processes)",
        Some(&[
            "--no-sample",
            "--no-thread-states",
            "--no-http",
            "--python-hooks",
            "off",
        ]),
    ),
];

/// `vllm serve` and its engine core, killed on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        // The whole process group (the server leads one: `process_group(0)`): its engine core too.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.wait();
    }
}

/// Starts `vllm serve` on a free port in a process group of its own, its CPU metered from its first instruction
/// (so its engine core is in the same cpuacct group), and waits until it answers a chat request.
fn start() -> Result<(Server, CpuMeter, u16)> {
    use std::os::unix::process::CommandExt;
    let vllm = crate::vllm::venv().join("bin/vllm");
    if !vllm.exists() {
        bail!(
            "vLLM is not installed ({}): run `cargo xtask setup`",
            vllm.display()
        );
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new(&vllm)
        .arg("serve")
        .arg(crate::vllm::model_dir())
        .args(["--served-model-name", "smollm2", "--dtype", "bfloat16"])
        .args([
            "--max-model-len",
            "2048",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .env("HF_HUB_OFFLINE", "1")
        .env("VLLM_CPU_KVCACHE_SPACE", "1")
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("DO_NOT_TRACK", "1")
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting vllm serve")?;
    let meter = CpuMeter::new(child.id());
    let server = Server(child);
    let deadline = Instant::now() + START_WAIT;
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() && one_request(port, "Warm up.", 8).is_ok() {
            break;
        }
        if Instant::now() > deadline {
            bail!("vllm serve did not answer on port {port} within {START_WAIT:?}");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok((server, meter, port))
}

/// `cargo xtask bench vllm`.
pub(super) fn run(o: &EngineArgs) -> Result<()> {
    if !crate::util::is_root() {
        bail!("bench vllm loads eBPF programs and the Python hooks: run it as root");
    }
    let release = build_release(&["llmprof", "llmprof-pyhooks"])?;
    let (server, meter, port) = start()?;
    let c = o.first_level(CONCURRENCY);
    let n_req = c.max(3);
    let mut runs = interleaved(
        &release,
        server.0.id(),
        &MODES,
        &["Python hooks", "overhead", "llmprof itself"],
        || level_at(port, c, n_req, o.max_tokens, TEMPERATURE),
    )?;
    drop(meter);
    drop(server);
    println!();
    println!(
        "vLLM's CPU build (vllm serve, API server + engine core) at concurrency {c}, {n_req} sampled requests \
         (temperature {TEMPERATURE}) x {} tokens per round, {AB_ROUNDS} rounds, modes interleaved",
        o.max_tokens
    );
    print_modes(&MODES, &mut runs);
    Ok(())
}
