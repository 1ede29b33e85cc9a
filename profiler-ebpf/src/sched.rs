//! The `sched` family (`llmprof_abi::sched`): thread states, from the scheduler tracepoints of the traced
//! threads.
//!
//! Owns `THREADS` (tid → tgid of the threads of traced processes: the scheduler tracepoints name the next
//! and the woken task by tid only) and four programs:
//! - `llmprof_tnew` (task:task_newtask, in the parent's context): a thread or child created by a traced
//!   process enters `THREADS` (a thread under its parent's tgid, a new process under its own pid; whether
//!   that process is traced is `TRACED`'s business, decided elsewhere);
//! - `llmprof_sswitch` (sched:sched_switch): one `SchedSwitchEvent` when the thread going off the CPU (the
//!   current task) or the one coming on is traced; when the one going off is traced and blocks, its
//!   off-CPU stack follows (`stacks::take_offcpu`);
//! - `llmprof_swaking` (sched:sched_waking) / `llmprof_swnew` (sched:sched_wakeup_new): one
//!   `SchedWakeEvent` when the woken thread is traced, with the waker (the current task).
//!
//! Classic tracepoints (field offsets from `/sys/kernel/tracing/events/sched/*/format`, a stable ABI): the
//! raw variants pass `task_struct` pointers whose layout needs BTF relocations. Every program reads the
//! `ThreadStatesOff` knob first, and costs an untraced switch two hash lookups. Bounded: one record per
//! event, no loop; a full ring or a full `THREADS` map is counted as a drop of [`ProbeId::Sched`].

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::bpf_get_current_pid_tgid,
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use llmprof_abi::{
    EventKind, Knob, ProbeId,
    sched::{COMM_LEN, MAX_THREADS, NO_STACK, SchedSwitchEvent, SchedWakeEvent, WAKE_NEW},
    stacks::is_blocking,
};

use crate::{EVENTS, count, header, knob, now, traced};

/// tid → tgid of the threads of traced processes (and of processes they created).
#[map]
pub(crate) static THREADS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_THREADS, 0);

// /sys/kernel/tracing/events/sched/sched_switch/format
const SW_PREV_COMM: usize = 8;
const SW_PREV_PRIO: usize = 28;
const SW_PREV_STATE: usize = 32;
const SW_NEXT_COMM: usize = 40;
const SW_NEXT_PID: usize = 56;
const SW_NEXT_PRIO: usize = 60;
// sched_waking and sched_wakeup_new share this layout.
const WK_COMMON_FLAGS: usize = 2;
const WK_COMM: usize = 8;
const WK_PID: usize = 24;
const WK_PRIO: usize = 28;
const WK_TARGET_CPU: usize = 32;
// /sys/kernel/tracing/events/task/task_newtask/format
const NT_PID: usize = 8;
const NT_CLONE_FLAGS: usize = 32;
/// `EXIT_DEAD | EXIT_ZOMBIE` (include/linux/sched.h) in `prev_state`: the task's last switch.
const EXITED: i64 = 0x10 | 0x20;
/// include/uapi/linux/sched.h
const CLONE_THREAD: u64 = 0x0001_0000;

use crate::tp_field as read;

#[inline(always)]
fn comm(ctx: &TracePointContext, off: usize) -> [u8; COMM_LEN] {
    // SAFETY: as in `read`: a fixed char array of the format at `off`.
    unsafe { ctx.read_at::<[u8; COMM_LEN]>(off) }.unwrap_or([0; COMM_LEN])
}

/// The tgid of `tid` when it is a thread of a traced process.
#[inline(always)]
fn traced_tgid(tid: u32) -> Option<u32> {
    // SAFETY: the value is copied out at once.
    let tgid = unsafe { THREADS.get(&tid) }.copied()?;
    traced(tgid).then_some(tgid)
}

/// A thread leaves the map (at its last switch, or at exit when its process is not traced).
#[inline(always)]
pub(crate) fn forget_thread(tid: u32) {
    let _ = THREADS.remove(&tid);
}

/// task:task_newtask — runs in the parent: a thread (CLONE_THREAD) of a traced process enters `THREADS`
/// under the parent's tgid, a new process under its own pid.
#[tracepoint]
pub fn llmprof_tnew(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !traced(tgid) {
        return 0;
    }
    let child: i32 = read(&ctx, NT_PID);
    let flags: u64 = read(&ctx, NT_CLONE_FLAGS);
    if child <= 0 {
        return 0;
    }
    let child = child as u32;
    let owner = if flags & CLONE_THREAD != 0 { tgid } else { child };
    let failed = THREADS.insert(&child, &owner, 0).is_err();
    count(ProbeId::Sched, 0, 0, u64::from(failed));
    0
}

/// sched:sched_switch — the current task is the thread going off the CPU.
#[tracepoint]
pub fn llmprof_sswitch(ctx: TracePointContext) -> u32 {
    if knob(Knob::ThreadStatesOff) != 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let prev_traced = traced((pid_tgid >> 32) as u32);
    let next_tid = read::<i32>(&ctx, SW_NEXT_PID) as u32;
    let next_pid = if next_tid == 0 {
        None
    } else {
        traced_tgid(next_tid)
    };
    if !prev_traced && next_pid.is_none() {
        return 0;
    }
    let prev_state: i64 = read(&ctx, SW_PREV_STATE);
    if prev_traced && prev_state & EXITED != 0 {
        // The thread's last switch: it never runs again (leaving the map earlier, at sched_process_exit,
        // would lose a switch-in that still comes after it and leave its switch-out unpaired).
        forget_thread(pid_tgid as u32);
    }
    let Some(mut e) = EVENTS.reserve::<SchedSwitchEvent>(0) else {
        count(ProbeId::Sched, 1, 0, 1);
        return 0;
    };
    let ts = now();
    e.write(SchedSwitchEvent {
        // The current task is `prev` (the tracepoint fires before the switch): its tgid and tid.
        hdr: header(EventKind::SchedSwitch, ts, pid_tgid),
        prev_state,
        next_tid,
        next_pid: next_pid.unwrap_or(0),
        prev_prio: read(&ctx, SW_PREV_PRIO),
        next_prio: read(&ctx, SW_NEXT_PRIO),
        prev_comm: comm(&ctx, SW_PREV_COMM),
        next_comm: comm(&ctx, SW_NEXT_COMM),
        stack_id: NO_STACK,
        prev_traced: u32::from(prev_traced),
        _pad: 0,
    });
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::Sched, 1, 1, 0);
    if prev_traced && is_blocking(prev_state) {
        crate::stacks::take_offcpu(&ctx, pid_tgid, ts);
    }
    0
}

#[inline(always)]
fn wake(ctx: &TracePointContext, flags: u32) -> u32 {
    if knob(Knob::ThreadStatesOff) != 0 {
        return 0;
    }
    let tid = read::<i32>(ctx, WK_PID) as u32;
    let Some(pid) = traced_tgid(tid) else { return 0 };
    let Some(mut e) = EVENTS.reserve::<SchedWakeEvent>(0) else {
        count(ProbeId::Sched, 1, 0, 1);
        return 0;
    };
    e.write(SchedWakeEvent {
        hdr: header(EventKind::SchedWake, now(), bpf_get_current_pid_tgid()),
        tid,
        pid,
        prio: read(ctx, WK_PRIO),
        target_cpu: read(ctx, WK_TARGET_CPU),
        comm: comm(ctx, WK_COMM),
        flags,
        common_flags: u32::from(read::<u8>(ctx, WK_COMMON_FLAGS)),
    });
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::Sched, 1, 1, 0);
    0
}

/// sched:sched_waking — runs in the waker's context (or an interrupt's).
#[tracepoint]
pub fn llmprof_swaking(ctx: TracePointContext) -> u32 {
    wake(&ctx, 0)
}

/// sched:sched_wakeup_new — the first wakeup of a new thread (no sched_waking precedes it).
#[tracepoint]
pub fn llmprof_swnew(ctx: TracePointContext) -> u32 {
    wake(&ctx, WAKE_NEW)
}
