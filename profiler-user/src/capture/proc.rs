//! Which processes the probes record (the shared `TRACED` map) and the process-tree programs
//! (`profiler-ebpf/src/proc.rs`: `task_newtask` and `sched_process_exec` add the children of traced processes
//! and say when one executes a program, `sched_process_exit` says when one exits).
//!
//! Owns the targets and their `TRACED` flags ([`Traced`]), putting processes in the map and taking them out,
//! and lifting llmprof's own refusal of itself (`Knob::SelfTraced`) for as long as llmprof is in it (the
//! calibration and the sampler's own measurement). The records are decoded by `llmprof_trace::decode::proc`.
//! Never decides who is traced (the session and the calibration do) and never puts a target in the map
//! before every program is attached (the start order in `capture/mod.rs`).

use aya::Ebpf;
use aya::maps::HashMap;
use llmprof_abi::{
    EXEC_PROGRAM, FORK_PROGRAM, Knob, PEXIT_PROGRAM, TRACED_CHILDREN, TRACED_MAP, TRACED_SELF,
};

use super::error::CaptureError;
use super::object::{map_err, map_mut, write_knob};

/// The process-tree tracepoints: (category, name, program). Attached for every session (a process traced
/// without `--no-children` costs them one map lookup per fork/exec).
pub const TRACEPOINTS: [(&str, &str, &str); 3] = [
    ("sched", "sched_process_exit", PEXIT_PROGRAM),
    ("task", "task_newtask", FORK_PROGRAM),
    ("sched", "sched_process_exec", EXEC_PROGRAM),
];

/// The traced processes of a capture: the targets and the flags every process put in `TRACED` gets.
#[derive(Debug)]
pub(super) struct Traced {
    /// The targets given at start.
    pub(super) pids: Vec<u32>,
    /// `TRACED_SELF`, plus `TRACED_CHILDREN` for trees.
    flags: u8,
}

impl Traced {
    /// The targets `pids`; with `follow_children` the kernel adds their children too.
    pub(super) fn new(pids: &[u32], follow_children: bool) -> Self {
        Traced {
            pids: pids.to_vec(),
            flags: TRACED_SELF | if follow_children { TRACED_CHILDREN } else { 0 },
        }
    }

    /// Puts the targets in `TRACED`: from here on the probes record them.
    pub(super) fn start(&self, ebpf: &mut Ebpf) -> Result<(), CaptureError> {
        self.add(ebpf, &self.pids)
    }

    /// Puts `pids` in `TRACED` with the targets' flags.
    pub(super) fn add(&self, ebpf: &mut Ebpf, pids: &[u32]) -> Result<(), CaptureError> {
        let mut traced = traced_map(ebpf)?;
        for &pid in pids {
            traced.insert(pid, self.flags, 0).map_err(map_err(TRACED_MAP))?;
        }
        Ok(())
    }

    /// Takes the targets and every process the kernel added for them out of `TRACED` (recording stops).
    pub(super) fn stop(&self, ebpf: &mut Ebpf) {
        if let Ok(mut traced) = traced_map(ebpf) {
            let all: Vec<u32> = traced.keys().filter_map(Result::ok).collect();
            for pid in self.pids.iter().chain(&all) {
                let _ = traced.remove(pid);
            }
        }
    }
}

fn traced_map(ebpf: &mut Ebpf) -> Result<HashMap<&mut aya::maps::MapData, u32, u8>, CaptureError> {
    map_mut(ebpf, TRACED_MAP)
}

/// Puts `pid` in (or takes it out of) the `TRACED` map. For llmprof itself this also lifts (or restores) the
/// kernel's refusal of its own process (`Knob::SelfTraced`): outside these windows nothing llmprof does is
/// traced, whatever is left in the maps.
pub(super) fn set_traced(ebpf: &mut Ebpf, pid: u32, on: bool) -> Result<(), CaptureError> {
    if pid == std::process::id() && on {
        write_knob(ebpf, Knob::SelfTraced, 1)?;
    }
    let done = set_traced_entry(ebpf, pid, on);
    if pid == std::process::id() && !on {
        write_knob(ebpf, Knob::SelfTraced, 0)?;
    }
    done
}

fn set_traced_entry(ebpf: &mut Ebpf, pid: u32, on: bool) -> Result<(), CaptureError> {
    let mut traced = traced_map(ebpf)?;
    if on {
        traced.insert(pid, 1, 0).map_err(map_err(TRACED_MAP))
    } else {
        traced.remove(&pid).map_err(map_err(TRACED_MAP))
    }
}
