//! `cargo xtask bench llama` (owner: the wire probe, stack samples and thread states on third-party servers):
//! what llmprof costs llama.cpp's OpenAI server (`python -m llama_cpp.server` from the servers venv of
//! `cargo xtask setup`, on the default GGUF) under a streaming load at concurrency 4 (unless `--levels` says
//! otherwise). Modes, interleaved round by round on one server process: detached, `llmprof attach` with its
//! defaults (wire probe, stack samples with Python frames, thread states, syscalls), `--no-http` (the wire
//! probe's share), and `--no-sample --no-thread-states` (the share of samples and thread states). The figure is
//! the server's CPU time per generated token (all its threads, the exited ones too: a cpuacct group
//! of its own), medians and
//! ranges over the rounds.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::common::{AB_ROUNDS, Mode, build_release, interleaved, print_modes};
use super::load::{EngineArgs, level, one_request};

/// Concurrency without `--levels` (the issues' reference load).
const CONCURRENCY: usize = 4;

/// The modes of a round, in the order of even rounds (odd rounds run them reversed).
const MODES: [Mode<'static>; 4] = [
    ("detached", None),
    ("attached, default", Some(&[])),
    ("attached, --no-http", Some(&["--no-http"])),
    (
        "attached, --no-sample --no-thread-states",
        Some(&["--no-sample", "--no-thread-states"]),
    ),
];

/// llama.cpp's server, killed on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `llama_cpp.server` on `model` on a free port and waits (up to 120 s) until it accepts connections.
fn start(o: &EngineArgs) -> Result<(Server, u16)> {
    let python = crate::servers::python();
    if !python.exists() {
        bail!(
            "the servers venv is missing ({}): run `cargo xtask setup`",
            python.display()
        );
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new(&python)
        .args(["-m", "llama_cpp.server", "--model"])
        .arg(&o.model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--n_ctx", "4096", "--n_threads", &o.threads.to_string()])
        .args(["--verbose", "false"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting llama_cpp.server")?;
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(120);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("llama_cpp.server did not listen on port {port} within 120 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok((server, port))
}

/// `cargo xtask bench llama`.
pub(super) fn run(o: &EngineArgs) -> Result<()> {
    if !crate::util::is_root() {
        bail!("bench llama loads eBPF programs: run it as root");
    }
    let release = build_release(&["llmprof"])?;
    let (server, port) = start(o)?;
    let _ = one_request(port, "Warm up.", 8).context("warm-up request")?;
    let c = o.first_level(CONCURRENCY);
    let n_req = c.max(3);
    let mut runs = interleaved(
        &release,
        server.0.id(),
        &MODES,
        &["probe http:", "probe cpu_sample:", "wire probe:", "overhead"],
        || level(port, c, n_req, o.max_tokens),
    )?;
    drop(server);
    println!();
    println!(
        "llama.cpp's server (llama_cpp.server) at concurrency {c}, {n_req} requests x {} tokens per round, \
         {AB_ROUNDS} rounds, modes interleaved",
        o.max_tokens
    );
    print_modes(&MODES, &mut runs);
    Ok(())
}
