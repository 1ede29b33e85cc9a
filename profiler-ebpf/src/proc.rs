//! The `proc` family (`llmprof_abi::proc`): the process tree in the kernel. New processes of a traced tree
//! enter the `TRACED` map before they run, and the end of every traced process is its last record.
//!
//! Owns three programs:
//! - `llmprof_fork` (task:task_newtask, run by the parent while it creates the child, before the child can
//!   run): when the parent's tgid is traced with [`TRACED_CHILDREN`] and the new task is a process (no
//!   `CLONE_THREAD`), inserts the child's tgid with the parent's flags and writes a `ProcessStartEvent`. The
//!   child's first syscall is therefore traced: no event is lost between its fork and user space noticing it.
//! - `llmprof_exec` (sched:sched_process_exec, run by the process after the new image is in place): writes a
//!   `ProcessExecEvent` with the file name, so user space names the process and attaches engine probes to
//!   the new image.
//!
//! - `llmprof_pexit` (sched:sched_process_exit): every exiting thread of a traced process frees its syscall slot
//!   (`syscalls`); the last one ends the process: a `ProcessExitEvent` with the status its exit_group (or its
//!   main thread's exit) passed, kept in `EXIT_CODES` by the `syscalls` entry, and its removal from `TRACED`.
//!
//! Fork and exec hits, records and drops (a full `TRACED` map, a full ring) are counted under
//! `ProbeId::ProcTree`, the exits under `ProbeId::ProcessExit`. This
//! code must never follow threads (they are traced through their tgid already) or processes of an entry
//! without [`TRACED_CHILDREN`] (`--no-children`).

use aya_ebpf::{
    EbpfContext, bindings::BPF_RB_NO_WAKEUP, helpers::bpf_get_current_pid_tgid,
    helpers::bpf_probe_read_kernel_str_bytes, macros::map, macros::tracepoint, maps::HashMap,
    programs::TracePointContext,
};
use llmprof_abi::{
    COMM_LEN, EventHeader, EventKind, ProbeId, ProcessExecEvent, ProcessExitEvent, ProcessStartEvent,
    TRACED_CHILDREN,
};

use crate::{EVENTS, TRACED, count, header, is_self, now, sched, syscalls, tp_field, traced};

/// Status passed to exit_group (or to exit by the main thread), by tgid, reported at sched_process_exit.
#[map]
pub(crate) static EXIT_CODES: HashMap<u32, i64> = HashMap::with_max_entries(1024, 0);

// Tracepoint field offsets (/sys/kernel/tracing/events/{task/task_newtask,sched/sched_process_exec}/format).
const NEWTASK_PID: usize = 8;
const NEWTASK_COMM: usize = 12;
const NEWTASK_CLONE_FLAGS: usize = 32;
const EXEC_FILENAME: usize = 8;
const SCHED_EXIT_GROUP_DEAD: usize = 32;
/// include/uapi/linux/sched.h: the new task shares the thread group (a thread, not a process).
const CLONE_THREAD: u64 = 0x0001_0000;

/// task:task_newtask — a traced process (with [`TRACED_CHILDREN`]) creates a new process: trace it.
#[tracepoint]
pub fn llmprof_fork(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let ptgid = (pid_tgid >> 32) as u32;
    if is_self(ptgid) {
        return 0;
    }
    // SAFETY: the value is copied out at once.
    let Some(flags) = unsafe { TRACED.get(&ptgid) }.copied() else {
        return 0;
    };
    if flags & TRACED_CHILDREN == 0 {
        return 0;
    }
    // SAFETY: offsets from the tracepoint's format file.
    let clone_flags = unsafe { ctx.read_at::<u64>(NEWTASK_CLONE_FLAGS) }.unwrap_or(CLONE_THREAD);
    if clone_flags & CLONE_THREAD != 0 {
        return 0;
    }
    // SAFETY: see above.
    let child = unsafe { ctx.read_at::<i32>(NEWTASK_PID) }.unwrap_or(0);
    if child <= 0 {
        return 0;
    }
    let child = child as u32;
    if TRACED.insert(&child, &flags, 0).is_err() {
        count(ProbeId::ProcTree, 1, 0, 1);
        return 0;
    }
    // SAFETY: see above.
    let comm = unsafe { ctx.read_at::<[u8; COMM_LEN]>(NEWTASK_COMM) }.unwrap_or([0; COMM_LEN]);
    let Some(mut e) = EVENTS.reserve::<ProcessStartEvent>(0) else {
        count(ProbeId::ProcTree, 1, 0, 1);
        return 0;
    };
    let mut hdr: EventHeader = header(EventKind::ProcessStart, now(), pid_tgid);
    hdr.pid = child;
    hdr.tid = child;
    e.write(ProcessStartEvent {
        hdr,
        ppid: ptgid,
        parent_tid: pid_tgid as u32,
        clone_flags,
        comm,
    });
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::ProcTree, 1, 1, 0);
    0
}

/// sched:sched_process_exec — a traced process executed a program: report the file.
#[tracepoint]
pub fn llmprof_exec(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: presence test only.
    if is_self(tgid) || unsafe { TRACED.get(&tgid) }.is_none() {
        return 0;
    }
    // SAFETY: offset from the format file: a `__data_loc` word, (length << 16) | offset in the record.
    let loc = unsafe { ctx.read_at::<u32>(EXEC_FILENAME) }.unwrap_or(0);
    let Some(mut e) = EVENTS.reserve::<ProcessExecEvent>(0) else {
        count(ProbeId::ProcTree, 1, 0, 1);
        return 0;
    };
    let p = e.as_mut_ptr();
    // SAFETY: `p` is a reserved ProcessExecEvent and every write stays inside it; the file name is read from
    // the tracepoint's own record by a helper that fails cleanly (then the name is empty).
    unsafe {
        (&raw mut (*p).hdr).write(header(EventKind::ProcessExec, now(), pid_tgid));
        let dst = &mut (*p).filename;
        let src = (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize);
        if loc == 0 || bpf_probe_read_kernel_str_bytes(src, dst).is_err() {
            dst[0] = 0;
        }
    }
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::ProcTree, 1, 1, 0);
    0
}

/// sched:sched_process_exit — a thread of a traced process exits (its syscall slot is freed); for the
/// last one, the process's end.
#[tracepoint]
pub fn llmprof_pexit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !traced(tgid) {
        // An untraced child of a traced process leaves the thread map here; a traced thread leaves it at
        // its last context switch (`sched::llmprof_sswitch`), which comes after this tracepoint.
        sched::forget_thread(pid_tgid as u32);
        return 0;
    }
    // Every exiting thread frees its syscall slot.
    syscalls::free_slot(pid_tgid as u32);
    let group_dead: u8 = tp_field(&ctx, SCHED_EXIT_GROUP_DEAD);
    if group_dead == 0 {
        return 0;
    }
    // SAFETY: copied out before removal.
    let exit_code = unsafe { EXIT_CODES.get(&tgid) }.copied().unwrap_or(-1);
    let _ = EXIT_CODES.remove(&tgid);
    // The pid may be reused by an unrelated process.
    let _ = TRACED.remove(&tgid);
    let Some(mut e) = EVENTS.reserve::<ProcessExitEvent>(0) else {
        count(ProbeId::ProcessExit, 1, 0, 1);
        return 0;
    };
    e.write(ProcessExitEvent {
        hdr: header(EventKind::ProcessExit, now(), pid_tgid),
        exit_code,
    });
    // The last record of a process: wake the reader.
    e.submit(0);
    count(ProbeId::ProcessExit, 1, 1, 0);
    0
}
