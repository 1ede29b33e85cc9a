//! Every error capture returns ([`CaptureError`]), and the errors of the parts it wraps that need no kernel
//! (a model-path pattern, the GPU helper's handoff lookup).
//!
//! Owns the messages, which tell the user what to do next. Never depends on a family part: the parts depend
//! on it.

use llmprof_abi::cupti::{GPU_HANDOFF, GPU_HELPER_LIB};

use super::patterns::PatternError;
use super::tracefs::TRACEFS;
use crate::sys::target_file::TargetFileError;

/// Why capture could not start or continue. Messages say what to do next.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Loading eBPF programs needs root (or CAP_BPF + CAP_PERFMON).
    #[error("llmprof needs root to load eBPF programs: run it with sudo (or grant CAP_BPF and CAP_PERFMON)")]
    NotRoot,
    /// No such process.
    #[error("no process with pid {0}: check the pid (e.g. `pgrep llmserve`)")]
    PidNotFound(u32),
    /// The kernel lacks a tracepoint the programs need.
    #[error(
        "this kernel has no tracepoint {category}:{name} (looked in {TRACEFS}/events): llmprof needs a kernel with tracepoints and tracefs"
    )]
    MissingTracepoint {
        /// Tracepoint category, e.g. `raw_syscalls`.
        category: String,
        /// Tracepoint name, e.g. `sys_enter`.
        name: String,
    },
    /// tracefs is not mounted and could not be mounted.
    #[error(
        "tracefs is not mounted at {TRACEFS} and mounting it failed: run `mount -t tracefs nodev {TRACEFS}`"
    )]
    Tracefs(#[source] std::io::Error),
    /// The wire probe's start-up calibration could not make its socket pairs.
    #[error("the wire probe's calibration could not create a socket pair")]
    CalibrationSocket(#[source] std::io::Error),
    /// The engine speaks another probe ABI version.
    #[error(
        "the engine (pid {pid}) uses llmprof probe ABI {found}, this llmprof speaks {expected}: use the llmprof built with that engine version"
    )]
    AbiMismatch {
        /// The traced process.
        pid: u32,
        /// The engine's version.
        found: u32,
        /// This llmprof's version.
        expected: u32,
    },
    /// A `--model-path` pattern is not supported.
    #[error(transparent)]
    Pattern(#[from] PatternError),
    /// The target's binary could not be inspected.
    #[error(transparent)]
    Elf(#[from] crate::sys::elf::ElfError),
    /// The kernel refused to load the programs (the verifier log is in the source chain).
    #[error(
        "the kernel refused llmprof's eBPF programs (see the verifier log below); please report it with `uname -r`"
    )]
    Load(#[source] aya::EbpfError),
    /// A program could not be loaded or attached.
    #[error("could not load or attach eBPF program {program}")]
    Program {
        /// The program's name.
        program: String,
        /// aya's error (includes the verifier log for load failures).
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A map was missing or could not be read or written.
    #[error("eBPF map {map} cannot be used")]
    Map {
        /// The map's name.
        map: String,
        /// aya's error.
        #[source]
        source: aya::maps::MapError,
    },
    /// The GPU helper library's handoff function cannot be probed.
    #[error(transparent)]
    GpuHandoff(#[from] HandoffError),
    /// The object lacks a program or map this llmprof expects (object and source out of sync).
    #[error("the embedded eBPF object has no {0}: rebuild it with `cargo xtask build-ebpf`")]
    MissingInObject(String),
    /// Polling the ring buffer failed.
    #[error("polling the ring buffer failed")]
    Poll(#[source] std::io::Error),
}

/// Why the helper library's handoff function cannot be probed.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    /// The process maps no helper library (any more).
    #[error("pid {pid} has no {GPU_HELPER_LIB} mapped")]
    NotMapped {
        /// The process.
        pid: u32,
    },
    /// The library file could not be read or parsed (see [`crate::sys::target_file`]).
    #[error("cannot read the GPU helper library")]
    Read(#[source] TargetFileError),
    /// The library does not export the handoff function.
    #[error("{path} does not export {GPU_HANDOFF}: not llmprof's GPU helper library")]
    NoHandoff {
        /// The file.
        path: String,
    },
}
