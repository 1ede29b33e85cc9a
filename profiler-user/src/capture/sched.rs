//! Capture of thread states: attaches the scheduler programs of `profiler-ebpf/src/sched.rs`, fills their
//! tid → tgid map from `/proc/PID/task`, and decodes their records.
//!
//! Owns the kernel side of thread states in user space (the trace side is `llmprof_trace::thread_state`).
//! Order at start: the programs are attached with the others; after the targets enter `TRACED`, every thread
//! listed in `/proc/PID/task` enters `THREADS` (threads created from then on are added by the kernel's
//! `task_newtask` program, which runs in the traced parent), so no thread falls between the two.

use aya::Ebpf;
use aya::maps::HashMap;
use aya::programs::TracePoint;
use llmprof_abi::sched::{SchedSwitchEvent, SchedWakeEvent, TRACE_FLAG_HARDIRQ, TRACE_FLAG_SOFTIRQ, WAKE_NEW};
use llmprof_abi::EventHeader;

use super::{CaptureError, map_err, program};
use llmprof_trace::event::{EventBody, SchedSwitch, SchedWake};
use llmprof_trace::thread_state::comm_str;

/// The thread-state tracepoints: (category, name, program). `task_newtask` first, so a thread created while
/// the others attach is already in the map.
pub const SCHED_TRACEPOINTS: [(&str, &str, &str); 4] = [
    ("task", "task_newtask", "llmprof_tnew"),
    ("sched", "sched_switch", "llmprof_sswitch"),
    ("sched", "sched_waking", "llmprof_swaking"),
    ("sched", "sched_wakeup_new", "llmprof_swnew"),
];

/// Loads and attaches [`SCHED_TRACEPOINTS`].
pub(super) fn attach(ebpf: &mut Ebpf) -> Result<(), CaptureError> {
    for (category, name, prog) in SCHED_TRACEPOINTS {
        let perr = |source| CaptureError::Program {
            program: prog.to_string(),
            source,
        };
        let p: &mut TracePoint = program(ebpf, prog)?;
        p.load().map_err(perr)?;
        p.attach(category, name).map_err(perr)?;
    }
    Ok(())
}

/// Puts every thread of `pids` now listed in `/proc/PID/task` into the kernel's `THREADS` map. Returns how
/// many it put; a full map is an error here (the kernel program counts its own failed inserts as drops).
pub(super) fn fill_threads(ebpf: &mut Ebpf, pids: &[u32]) -> Result<usize, CaptureError> {
    let map = ebpf
        .map_mut("THREADS")
        .ok_or_else(|| CaptureError::MissingInObject("map THREADS".into()))?;
    let mut threads = HashMap::<_, u32, u32>::try_from(map).map_err(map_err("THREADS"))?;
    let mut n = 0;
    for &pid in pids {
        for tid in crate::procfs::thread_ids(pid) {
            threads.insert(tid, pid, 0).map_err(map_err("THREADS"))?;
            n += 1;
        }
    }
    Ok(n)
}

/// Removes `pid`'s threads from `THREADS` (the calibration's own threads).
pub(super) fn forget_threads(ebpf: &mut Ebpf, pid: u32) -> Result<(), CaptureError> {
    let map = ebpf
        .map_mut("THREADS")
        .ok_or_else(|| CaptureError::MissingInObject("map THREADS".into()))?;
    let mut threads = HashMap::<_, u32, u32>::try_from(map).map_err(map_err("THREADS"))?;
    let mine: Vec<u32> = threads
        .iter()
        .filter_map(Result::ok)
        .filter(|(_, p)| *p == pid)
        .map(|(t, _)| t)
        .collect();
    for tid in mine {
        let _ = threads.remove(&tid);
    }
    Ok(())
}

/// The event of a switch record: pid/tid are the traced process and the thread going off the CPU.
pub(super) fn switch_event(e: &SchedSwitchEvent) -> (u32, EventBody) {
    let hdr: &EventHeader = &e.hdr;
    let prev_traced = e.prev_traced != 0;
    let pid = if prev_traced { hdr.pid } else { e.next_pid };
    let body = EventBody::SchedSwitch(Box::new(SchedSwitch {
        cpu: hdr.cpu,
        prev_tid: hdr.tid,
        prev_pid: hdr.pid,
        prev_traced,
        prev_comm: comm_str(&e.prev_comm),
        prev_prio: e.prev_prio,
        prev_state: e.prev_state,
        next_tid: e.next_tid,
        next_pid: e.next_pid,
        next_comm: comm_str(&e.next_comm),
        next_prio: e.next_prio,
        stack_id: (e.stack_id >= 0).then_some(e.stack_id),
    }));
    (pid, body)
}

/// The event of a wakeup record: pid/tid are the waker's.
pub(super) fn wake_event(e: &SchedWakeEvent) -> EventBody {
    EventBody::SchedWake(Box::new(SchedWake {
        cpu: e.hdr.cpu,
        tid: e.tid,
        pid: e.pid,
        comm: comm_str(&e.comm),
        prio: e.prio,
        target_cpu: e.target_cpu,
        new_task: e.flags & WAKE_NEW != 0,
        in_interrupt: e.common_flags & (TRACE_FLAG_HARDIRQ | TRACE_FLAG_SOFTIRQ) != 0,
        common_flags: e.common_flags,
    }))
}
