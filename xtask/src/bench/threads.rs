//! `cargo xtask bench threads` (owner: thread states and stack samples): what recording thread states and
//! sampling stacks cost the target. llmserve under a streaming load (concurrency 4 unless `--levels` says
//! otherwise) in four modes, interleaved round by round on one engine process: detached, `llmprof attach
//! --no-sample --no-thread-states`, `--no-sample` (thread states on), and `llmprof attach` (the default:
//! both on). The figure is the target's CPU time per generated token (all its threads, the exited
//! ones too: a cpuacct group of its own), medians and ranges over the rounds, plus the trace size per minute and the
//! thread-state and sample records.

use anyhow::Result;

use super::common::{AbSetup, Mode, ab_setup, interleaved, print_modes};
use super::load::{EngineArgs, level};

/// Concurrency without `--levels` (the issues' reference load).
const CONCURRENCY: usize = 4;

/// The modes of a round, in the order of even rounds (odd rounds run them reversed).
const MODES: [Mode<'static>; 4] = [
    ("detached", None),
    (
        "attached, --no-sample --no-thread-states",
        Some(&["--no-sample", "--no-thread-states"]),
    ),
    ("attached, --no-sample", Some(&["--no-sample"])),
    ("attached, default (samples + states)", Some(&[])),
];

/// `cargo xtask bench threads`.
pub(super) fn run(o: &EngineArgs) -> Result<()> {
    let with_default = EngineArgs {
        model: o.model.clone(),
        threads: o.threads,
        max_tokens: o.max_tokens,
        levels: Some(o.levels.clone().unwrap_or_else(|| vec![CONCURRENCY])),
    };
    let AbSetup {
        release,
        mut server,
        port,
        c,
        n_req,
    } = ab_setup(&with_default, "threads")?;
    let pid = server.child.id();
    let mut runs = interleaved(
        &release,
        pid,
        &MODES,
        &["probe sched:", "probe cpu_sample:"],
        || level(port, c, n_req, o.max_tokens),
    )?;
    let _ = server.child.kill();
    let _ = server.child.wait();
    println!();
    println!(
        "llmserve at concurrency {c}, {n_req} requests x {} tokens per round, {} rounds, modes interleaved",
        o.max_tokens,
        super::common::AB_ROUNDS
    );
    print_modes(&MODES, &mut runs);
    Ok(())
}
