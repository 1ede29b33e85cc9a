//! The `stacks` family (`llmprof_abi::stacks`): native stacks of the traced threads.
//!
//! On-CPU: `llmprof_sample`, a perf_event program attached by user space to one software CPU-clock event per
//! online CPU (`PERF_COUNT_SW_CPU_CLOCK`, frequency mode, `--sample-rate`), so it needs no hardware PMU. Each
//! tick it checks the interrupted thread's tgid against `TRACED` (one hash lookup for untraced work), applies
//! the budget's rate divider (`Knob::SampleEvery`) and writes one `CpuSampleEvent`: kernel and user return
//! addresses walked by `bpf_get_stack` (frame pointers).
//!
//! Off-CPU: [`take_offcpu`], called by the `sched_switch` program (`sched`) in the context of a traced thread
//! that blocks (S or D, not preempted), after its switch record, writes the thread's kernel + user stack as
//! an `OffCpuStack` record of the same instant. Bounded: `Knob::OffCpuStacksOff` (set by user space when stack
//! sampling is off or stopped) and a per-CPU rate bound of `OFFCPU_STACKS_PER_WINDOW` stacks per
//! `OFFCPU_WINDOW_NS`; a stack the rate bound does not take is counted apart (`OFFCPU_RATE`'s third word: not
//! taken by design, not a loss), a stack a full ring loses as a drop of `ProbeId::CpuSample`.
//!
//! Both records are built in one place, [`fill`], and both are followed, for a sampled Python process, by its
//! interpreter stack (`python::emit`). Never loops: `bpf_get_stack` bounds its own walk by the buffer size.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_USER_STACK, BPF_RB_NO_WAKEUP},
    cty::c_void,
    helpers::{bpf_get_current_pid_tgid, generated::bpf_get_stack},
    macros::{map, perf_event},
    maps::PerCpuArray,
    programs::{PerfEventContext, TracePointContext},
};
use llmprof_abi::{
    CpuSampleEvent, EventKind, KERNEL_STACK_MAX, Knob, ProbeId, USER_STACK_MAX,
    stacks::{OFFCPU_RATE_NOT_TAKEN, OFFCPU_STACKS_PER_WINDOW, OFFCPU_UNBOUNDED, OFFCPU_WINDOW_NS},
};

use crate::{EVENTS, count, header, knob, now, traced};

/// Samples of traced threads seen on this CPU, for the rate divider (`Knob::SampleEvery`).
#[map]
static SAMPLE_TICKS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Whether the budget's divider drops this sample: with `Knob::SampleEvery` = N > 1 one traced sample in
/// N per CPU is kept; `u64::MAX` stops sampling.
#[inline(always)]
fn skipped() -> bool {
    let every = knob(Knob::SampleEvery);
    if every <= 1 {
        return false;
    }
    if every == u64::MAX {
        return true;
    }
    let Some(t) = SAMPLE_TICKS.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's slot of a per-CPU array; the perf-event program does not nest on a CPU.
    let n = unsafe {
        *t += 1;
        *t
    };
    n % every != 0
}

/// Fills the reserved record `e` (of `kind`: an on-CPU sample, or an off-CPU stack from [`take_offcpu`]) for the
/// current thread `pid_tgid` at the program context `ctx`: header, kernel stack, user stack. The one place a
/// stack record's content is decided.
///
/// # Safety
/// `e` points to a reserved, writable `CpuSampleEvent`; `ctx` is the running program's context.
#[inline(always)]
pub(crate) unsafe fn fill(ctx: *mut c_void, e: *mut CpuSampleEvent, kind: EventKind, pid_tgid: u64, ts: u64) {
    // SAFETY: every write stays inside the reservation (the caller's contract); `bpf_get_stack` writes at
    // most the given size (the arrays' sizes) and returns the bytes written or a negative error.
    unsafe {
        (&raw mut (*e).hdr).write(header(kind, ts, pid_tgid));
        let k = bpf_get_stack(
            ctx,
            (&raw mut (*e).kernel).cast::<c_void>(),
            (KERNEL_STACK_MAX * 8) as u32,
            0,
        );
        (&raw mut (*e).kernel_len).write(if k > 0 { (k / 8) as u32 } else { 0 });
        let u = bpf_get_stack(
            ctx,
            (&raw mut (*e).user).cast::<c_void>(),
            (USER_STACK_MAX * 8) as u32,
            BPF_F_USER_STACK as u64,
        );
        (&raw mut (*e).user_len).write(if u > 0 { (u / 8) as u32 } else { 0 });
    }
}

/// Software CPU-clock tick on some CPU: one sample of the running thread if it belongs to a traced process.
#[perf_event]
pub fn llmprof_sample(ctx: PerfEventContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // tgid 0: the idle task (the CPU was idle when the clock fired).
    if tgid == 0 || !traced(tgid) || skipped() {
        return 0;
    }
    let ts = now();
    let Some(mut e) = EVENTS.reserve::<CpuSampleEvent>(0) else {
        count(ProbeId::CpuSample, 1, 0, 1);
        return 0;
    };
    // SAFETY: `e` is a fresh reservation of a CpuSampleEvent.
    unsafe { fill(ctx.as_ptr(), e.as_mut_ptr(), EventKind::CpuSample, pid_tgid, ts) };
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::CpuSample, 1, 1, 0);
    // The Python frames of the same instant, when the process is a sampled CPython (joined by (tid, ts)).
    crate::python::emit(pid_tgid, ts);
    0
}

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
pub(crate) fn take_offcpu(ctx: &TracePointContext, pid_tgid: u64, ts: u64) {
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
    unsafe { fill(ctx.as_ptr(), e.as_mut_ptr(), EventKind::OffCpuStack, pid_tgid, ts) };
    e.submit(BPF_RB_NO_WAKEUP as u64);
    count(ProbeId::CpuSample, 1, 1, 0);
    crate::python::emit(pid_tgid, ts);
}
