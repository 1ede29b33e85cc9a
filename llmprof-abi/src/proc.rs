//! The `proc` family: the process tree. New processes of a traced tree enter the kernel's `TRACED` map before
//! they run (fork), executed programs are reported (exec), and the end of every traced process is its last
//! record (exit). The value flags of `TRACED` ([`crate::TRACED_CHILDREN`]) say whether a process's children
//! follow it.

use crate::{EventHeader, Family, COMM_LEN, PATH_LEN};

/// task:task_newtask: a new process of a traced tree enters `TRACED` ([`ProcessStartEvent`]).
pub const FORK_PROGRAM: &str = "llmprof_fork";
/// sched:sched_process_exec: a traced process executed a program ([`ProcessExecEvent`]).
pub const EXEC_PROGRAM: &str = "llmprof_exec";
/// sched:sched_process_exit: a traced thread exits (its syscall slot is freed); for the last one,
/// [`ProcessExitEvent`].
pub const PEXIT_PROGRAM: &str = "llmprof_pexit";
/// The status passed to exit_group (or to exit by the main thread), by tgid, until the process ends.
pub const EXIT_CODES_MAP: &str = "EXIT_CODES";
/// Every program of the family.
pub const PROGRAMS: [&str; 3] = [FORK_PROGRAM, EXEC_PROGRAM, PEXIT_PROGRAM];
/// Every map of the family.
pub const MAPS: [&str; 1] = [EXIT_CODES_MAP];
/// The family's kernel names.
pub const FAMILY: Family = Family {
    name: "proc",
    programs: &PROGRAMS,
    maps: &MAPS,
};

/// A traced process exited (sched_process_exit of its main thread).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessExitEvent {
    /// Header ([`crate::EventKind::ProcessExit`]).
    pub hdr: EventHeader,
    /// Exit code as the kernel reports it.
    pub exit_code: i64,
}

/// A traced process (with [`crate::TRACED_CHILDREN`]) started a new process, which the kernel put in the `TRACED`
/// map before it ran (task:task_newtask, run by the parent; threads are not processes and not reported).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessStartEvent {
    /// Header ([`crate::EventKind::ProcessStart`]); `pid` and `tid` are the new process's.
    pub hdr: EventHeader,
    /// The parent's tgid.
    pub ppid: u32,
    /// The parent's thread that called fork/clone.
    pub parent_tid: u32,
    /// The clone flags (`CLONE_*`, include/uapi/linux/sched.h).
    pub clone_flags: u64,
    /// The new process's `comm` (its parent's until it executes a program), NUL padded.
    pub comm: [u8; COMM_LEN],
}

/// A traced process executed a program (sched:sched_process_exec): its image, hence its probes, changed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessExecEvent {
    /// Header ([`crate::EventKind::ProcessExec`]).
    pub hdr: EventHeader,
    /// The executed file as passed to execve, NUL terminated (truncated).
    pub filename: [u8; PATH_LEN],
}

const _: () = {
    assert!(core::mem::size_of::<ProcessExitEvent>() == 32);
    assert!(core::mem::size_of::<ProcessStartEvent>() == 40 + COMM_LEN);
    assert!(core::mem::size_of::<ProcessExecEvent>() == 24 + PATH_LEN);
};
