//! `syscalls` of the `--json` document: the slow syscall slices and the kernel's aggregates.

use serde::Serialize;

use super::{Num, opt};
use crate::report::{Report, SyscallRow};

/// `syscalls`.
#[derive(Serialize)]
pub(super) struct Syscalls<'a> {
    slow_syscall_slices: Vec<SlowSyscall<'a>>,
    kernel_aggregates: Vec<AggregateSyscall<'a>>,
}

impl<'a> Syscalls<'a> {
    pub(super) fn of(r: &'a Report) -> Self {
        Self {
            slow_syscall_slices: r.slow_syscalls.iter().map(SlowSyscall::of).collect(),
            kernel_aggregates: r.syscall_aggregates.iter().map(AggregateSyscall::of).collect(),
        }
    }
}

/// One `syscalls.slow_syscall_slices` entry.
#[derive(Serialize)]
pub(super) struct SlowSyscall<'a> {
    name: &'a str,
    count: u64,
    total_ms: Num,
    max_ms: Option<Num>,
}

impl<'a> SlowSyscall<'a> {
    pub(super) fn of(s: &'a SyscallRow) -> Self {
        Self {
            name: &s.name,
            count: s.count,
            total_ms: Num(s.total_ms),
            max_ms: opt(s.max_ms),
        }
    }
}

/// One `syscalls.kernel_aggregates` entry (no `max_ms`: the aggregates have no per-call durations).
#[derive(Serialize)]
pub(super) struct AggregateSyscall<'a> {
    name: &'a str,
    count: u64,
    total_ms: Num,
}

impl<'a> AggregateSyscall<'a> {
    pub(super) fn of(s: &'a SyscallRow) -> Self {
        Self {
            name: &s.name,
            count: s.count,
            total_ms: Num(s.total_ms),
        }
    }
}
