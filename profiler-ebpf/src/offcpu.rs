//! Off-CPU stacks at the block point (`llmprof_abi::offcpu`): called by the `sched_switch` program in the
//! context of the thread going off the CPU, after its switch record, when that thread is traced and blocks
//! (S or D, not preempted). Writes the thread's kernel + user stack as an `OffCpuStack` record of the same
//! instant and, for a sampled Python process, its interpreter stack (`python::emit`).
//!
//! Bounded: `Knob::OffCpuStacksOff` (set by user space when stack sampling is off or stopped) and a per-CPU
//! rate bound of `OFFCPU_STACKS_PER_WINDOW` stacks per `OFFCPU_WINDOW_NS`; a stack the rate bound does not take
//! is counted apart (`OFFCPU_RATE`'s third word: not taken by design, not a loss), a stack a full ring loses
//! as a drop of `ProbeId::CpuSample`. No loop here (`bpf_get_stack` bounds its own walk).

use aya_ebpf::{
    EbpfContext, bindings::BPF_RB_NO_WAKEUP, macros::map, maps::PerCpuArray, programs::TracePointContext,
};
use llmprof_abi::{
    CpuSampleEvent, EventKind, Knob, ProbeId,
    offcpu::{OFFCPU_RATE_NOT_TAKEN, OFFCPU_STACKS_PER_WINDOW, OFFCPU_UNBOUNDED, OFFCPU_WINDOW_NS},
};

use crate::{EVENTS, count, knob};

/// Per CPU: [start of the current rate window (ns), stacks taken in it, stacks the rate bound did not take
/// (the session's total; user space sums the CPUs)].
#[map]
static OFFCPU_RATE: PerCpuArray<[u64; 3]> = PerCpuArray::with_max_entries(1, 0);

/// Whether this CPU may take one more stack at `ts` (and counts it).
#[inline(always)]
fn admitted(ts: u64) -> bool {
    let Some(w) = OFFCPU_RATE.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's slot of a per-CPU array; the sched_switch program runs with interrupts off and does
    // not nest on a CPU.
    unsafe {
        if ts.saturating_sub((*w)[0]) >= OFFCPU_WINDOW_NS {
            (*w)[0] = ts;
            (*w)[1] = 0;
        }
        if (*w)[1] >= OFFCPU_STACKS_PER_WINDOW {
            (*w)[OFFCPU_RATE_NOT_TAKEN] += 1;
            return false;
        }
        (*w)[1] += 1;
    }
    true
}

/// The blocking thread `pid_tgid` (the current task) leaves the CPU at `ts`: its stacks, when allowed.
#[inline(always)]
pub(crate) fn take(ctx: &TracePointContext, pid_tgid: u64, ts: u64) {
    let k = knob(Knob::OffCpuStacksOff);
    if k != 0 && k != OFFCPU_UNBOUNDED {
        return;
    }
    if k == 0 && !admitted(ts) {
        return;
    }
    let Some(mut e) = EVENTS.reserve::<CpuSampleEvent>(0) else {
        count(ProbeId::CpuSample, 0, 0, 1);
        return;
    };
    // SAFETY: `e` is a fresh reservation of a CpuSampleEvent; `ctx` is this program's context.
    unsafe { crate::sample::fill(ctx.as_ptr(), e.as_mut_ptr(), EventKind::OffCpuStack, pid_tgid, ts) };
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::CpuSample, 1, 1, 0);
    crate::python::emit(pid_tgid, ts);
}
