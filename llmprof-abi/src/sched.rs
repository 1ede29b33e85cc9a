//! The `sched` family: thread states, what the scheduler tracepoints (`sched:sched_switch`,
//! `sched:sched_waking`, `sched:sched_wakeup_new`) saw of the traced threads, and the tid → tgid map the kernel
//! programs keep.
//!
//! Written by `profiler-ebpf/src/sched.rs`, decoded by llmprof. Like every kernel → user record they are not
//! part of the engine ABI and do not bump [`crate::ABI_VERSION`]. The tracepoints give thread ids, not
//! process ids: the current task of `sched_switch` is the thread going off the CPU (its tgid is known), but
//! the next and the woken task are only tids, resolved through the kernel's `THREADS` map (filled from
//! `/proc/PID/task` at attach and by `task:task_newtask` after).

use crate::{EventHeader, Family};

pub use crate::COMM_LEN;

/// task:task_newtask: a thread or child of a traced process enters the thread map.
pub const TNEW_PROGRAM: &str = "llmprof_tnew";
/// sched:sched_switch: [`SchedSwitchEvent`] (and the off-CPU stack of a blocking traced thread).
pub const SSWITCH_PROGRAM: &str = "llmprof_sswitch";
/// sched:sched_waking: [`SchedWakeEvent`].
pub const SWAKING_PROGRAM: &str = "llmprof_swaking";
/// sched:sched_wakeup_new: [`SchedWakeEvent`] with [`WAKE_NEW`].
pub const SWNEW_PROGRAM: &str = "llmprof_swnew";
/// tid → tgid of the threads of traced processes ([`MAX_THREADS`]); user space fills it at attach.
pub const THREADS_MAP: &str = "THREADS";
/// Every program of the family.
pub const PROGRAMS: [&str; 4] = [TNEW_PROGRAM, SSWITCH_PROGRAM, SWAKING_PROGRAM, SWNEW_PROGRAM];
/// Every map of the family.
pub const MAPS: [&str; 1] = [THREADS_MAP];
/// The family's kernel names.
pub const FAMILY: Family = Family {
    name: "sched",
    programs: &PROGRAMS,
    maps: &MAPS,
};

/// Most threads the kernel's `THREADS` map (tid → tgid) holds; a thread past it is not resolved (its
/// switch-ins are missed, counted as drops of the `sched` probe).
pub const MAX_THREADS: u32 = 16384;

/// [`SchedSwitchEvent::stack_id`] (always: see that field).
pub const NO_STACK: i64 = -1;

/// [`SchedWakeEvent::flags`]: the wakeup of a task that never ran (`sched_wakeup_new`).
pub const WAKE_NEW: u32 = 1;

/// A context switch on a CPU where the thread going off or the one coming on is traced.
///
/// Header: `kind` [`crate::EventKind::SchedSwitch`], `cpu` the CPU, `ts_ns` the switch, `pid`/`tid` the
/// thread going off the CPU (the tracepoint's current task; `pid` is its tgid, traced or not).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SchedSwitchEvent {
    /// Header ([`crate::EventKind::SchedSwitch`]).
    pub hdr: EventHeader,
    /// The tracepoint's `prev_state` as the kernel reports it (TASK_REPORT bits: 0 runnable, 1 S, 2 D, ...;
    /// `TASK_REPORT_MAX` (0x100 since 4.14) set when the thread was preempted).
    pub prev_state: i64,
    /// Thread coming on the CPU (0: the idle task).
    pub next_tid: u32,
    /// Its tgid when it is a thread the kernel map knows (a traced process's), else 0.
    pub next_pid: u32,
    /// Priority of the thread going off (kernel scale: 120 = nice 0).
    pub prev_prio: i32,
    /// Priority of the thread coming on.
    pub next_prio: i32,
    /// `comm` of the thread going off.
    pub prev_comm: [u8; COMM_LEN],
    /// `comm` of the thread coming on.
    pub next_comm: [u8; COMM_LEN],
    /// Always [`NO_STACK`]: the off-CPU stack of a blocking traced thread is not a stack-map id but a record
    /// of its own that follows this one ([`crate::stacks`], kind [`crate::EventKind::OffCpuStack`], same
    /// tid and time). Kept for the layout.
    pub stack_id: i64,
    /// 1 when the thread going off the CPU belongs to a traced process, else 0 (then the next one does).
    pub prev_traced: u32,
    /// Reserved, zero.
    pub _pad: u32,
}

/// A traced thread made runnable (`sched_waking`, or `sched_wakeup_new` for a new thread).
///
/// Header: `kind` [`crate::EventKind::SchedWake`], `cpu` the CPU the waker runs on, `ts_ns` the wakeup,
/// `pid`/`tid` the waker (the tracepoint's current task, traced or not; in interrupt context the task the
/// interrupt happened to interrupt, see `common_flags`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SchedWakeEvent {
    /// Header ([`crate::EventKind::SchedWake`]).
    pub hdr: EventHeader,
    /// The woken thread.
    pub tid: u32,
    /// Its tgid (from the kernel map).
    pub pid: u32,
    /// Its priority.
    pub prio: i32,
    /// The CPU it was queued on.
    pub target_cpu: i32,
    /// Its `comm`.
    pub comm: [u8; COMM_LEN],
    /// [`WAKE_NEW`] or 0.
    pub flags: u32,
    /// The tracepoint's `common_flags` (`TRACE_FLAG_HARDIRQ` 0x08, `TRACE_FLAG_SOFTIRQ` 0x10: the waker is an
    /// interrupt, not the task in the header).
    pub common_flags: u32,
}

/// `TRACE_FLAG_HARDIRQ` (kernel/trace/trace.h): the event was recorded in hard-interrupt context.
pub const TRACE_FLAG_HARDIRQ: u32 = 0x08;
/// `TRACE_FLAG_SOFTIRQ` (kernel/trace/trace.h): the event was recorded in soft-interrupt context.
pub const TRACE_FLAG_SOFTIRQ: u32 = 0x10;

const _: () = {
    assert!(core::mem::size_of::<SchedSwitchEvent>() == 24 + 24 + 2 * COMM_LEN + 16);
    assert!(core::mem::size_of::<SchedWakeEvent>() == 24 + 16 + COMM_LEN + 8);
};
