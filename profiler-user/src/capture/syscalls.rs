//! The syscalls family's user half: the `raw_syscalls` enter/exit programs (`profiler-ebpf/src/syscalls.rs`),
//! their links and the in-kernel syscall aggregates (`SYSCALLS`).
//!
//! Owns loading and attaching the pair as raw tracepoints (`BPF_PROG_TYPE_RAW_TRACEPOINT`: the program gets
//! the tracepoint's own arguments, `pt_regs` and the number or return value, without the perf record a
//! classic tracepoint program builds first, which cost more than the programs themselves; see
//! docs/performance.md), detaching them for the overhead budget, and reading the aggregates. The exit program
//! also decodes the `files` and `egress` calls and hands followed connections to the wire decoders; slow
//! syscalls are decoded by `llmprof_trace::decode::syscalls`. Never writes the aggregates: the kernel owns them.

use std::time::Instant;

use aya::Ebpf;
use aya::maps::HashMap;
use aya::programs::RawTracePoint;
use aya::programs::raw_trace_point::RawTracePointLinkId;
use llmprof_abi::{SYSCALLS_MAP, SYSENT_PROGRAM, SYSEXIT_PROGRAM, SyscallKey, SyscallStats};
use llmprof_trace::event::SyscallAggregate;

use super::error::CaptureError;
use super::object::program;

/// The syscall numbers whose exit the raw_syscalls programs decode (owned by `llmprof_abi::syscalls`, which
/// the eBPF programs test against too).
pub use llmprof_abi::syscalls::DECODED_SYSCALLS;

/// The syscall tracepoints: (category, name, program), attached as raw tracepoints.
pub const TRACEPOINTS: [(&str, &str, &str); 2] = [
    ("raw_syscalls", "sys_enter", SYSENT_PROGRAM),
    ("raw_syscalls", "sys_exit", SYSEXIT_PROGRAM),
];

/// The attached syscall programs.
#[derive(Default)]
pub(super) struct Syscalls {
    /// (program, link), detachable by [`Syscalls::detach`].
    links: Vec<(&'static str, RawTracePointLinkId)>,
}

impl Syscalls {
    /// Loads and attaches [`TRACEPOINTS`].
    pub(super) fn attach(ebpf: &mut Ebpf) -> Result<Self, CaptureError> {
        Ok(Syscalls {
            links: attach_raw(ebpf, &TRACEPOINTS)?,
        })
    }

    /// Detaches the programs: syscall aggregates, slow syscalls, model-file I/O, connects and sent bytes
    /// stop (what was aggregated stays readable). Returns false when they were not attached.
    pub(super) fn detach(&mut self, ebpf: &mut Ebpf) -> Result<bool, CaptureError> {
        let links = std::mem::take(&mut self.links);
        let any = !links.is_empty();
        for (prog, link) in links {
            let p: &mut RawTracePoint = program(ebpf, prog)?;
            p.detach(link).map_err(|source| CaptureError::Program {
                program: prog.to_string(),
                source,
            })?;
        }
        Ok(any)
    }
}

/// Loads and attaches `tps` (of [`TRACEPOINTS`]) as raw tracepoints; returns their links.
fn attach_raw(
    ebpf: &mut Ebpf,
    tps: &[(&'static str, &'static str, &'static str)],
) -> Result<Vec<(&'static str, RawTracePointLinkId)>, CaptureError> {
    let mut links = Vec::new();
    for &(_, name, prog) in tps {
        let perr = |source| CaptureError::Program {
            program: prog.to_string(),
            source,
        };
        let t = Instant::now();
        let p: &mut RawTracePoint = program(ebpf, prog)?;
        p.load().map_err(perr)?;
        let loaded = t.elapsed();
        links.push((prog, p.attach(name).map_err(perr)?));
        log::debug!(
            "capture: {prog}: verified in {loaded:?}, attached in {:?}",
            t.elapsed() - loaded
        );
    }
    Ok(links)
}

/// Completed syscalls of the traced processes so far (sum of the in-kernel aggregates).
pub(super) fn total(ebpf: &Ebpf) -> u64 {
    with_aggregates(ebpf, |_, s| s.count).sum()
}

/// Completed syscalls whose number is one of [`DECODED_SYSCALLS`] (from the in-kernel aggregates: a call whose
/// aggregate did not fit the map is counted by the `syscalls` counter only, i.e. charged as a plain call).
/// Reads every key of the map but only the decoded numbers' values.
pub(super) fn decoded(ebpf: &Ebpf) -> u64 {
    let Some(m) = ebpf
        .map(SYSCALLS_MAP)
        .and_then(|m| HashMap::<_, SyscallKey, SyscallStats>::try_from(m).ok())
    else {
        return 0;
    };
    m.keys()
        .filter_map(Result::ok)
        .filter(|k| DECODED_SYSCALLS.contains(&k.nr))
        .filter_map(|k| m.get(&k, 0).ok())
        .map(|s| s.count)
        .sum()
}

/// The in-kernel syscall aggregates per (pid, tid, syscall).
pub(super) fn aggregates(ebpf: &Ebpf) -> Vec<SyscallAggregate> {
    with_aggregates(ebpf, |k, s| SyscallAggregate {
        pid: k.pid,
        tid: k.tid,
        nr: k.nr,
        count: s.count,
        total_ns: s.total_ns,
        hist: s.hist.to_vec(),
    })
    .collect()
}

fn with_aggregates<'a, T: 'a>(
    ebpf: &'a Ebpf,
    f: impl Fn(&SyscallKey, &SyscallStats) -> T + 'a,
) -> impl Iterator<Item = T> + 'a {
    let map = ebpf
        .map(SYSCALLS_MAP)
        .and_then(|m| HashMap::<_, SyscallKey, SyscallStats>::try_from(m).ok());
    map.into_iter().flat_map(move |m| {
        let items: Vec<T> = m.iter().filter_map(Result::ok).map(|(k, s)| f(&k, &s)).collect();
        items
    })
}
