//! `llmprof_sample`: the on-CPU stack sampler. A perf_event program attached by user space to one software
//! CPU-clock event per online CPU (`PERF_COUNT_SW_CPU_CLOCK`, frequency mode, `--sample-rate`), so it needs
//! no hardware PMU. Each tick it checks the interrupted thread's tgid against `TRACED` (one hash lookup for
//! untraced work), applies the budget's rate divider (`Knob::SampleEvery`) and writes one
//! `CpuSampleEvent`: kernel and user return addresses walked by `bpf_get_stack` (frame pointers).
//!
//! The record is built in one place, [`fill`]: a later walker (Python frames) adds its part there. Never
//! loops: `bpf_get_stack` bounds its own walk by the buffer size.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_USER_STACK, BPF_RB_NO_WAKEUP},
    cty::c_void,
    helpers::{bpf_get_current_pid_tgid, generated::bpf_get_stack},
    macros::{map, perf_event},
    maps::PerCpuArray,
    programs::PerfEventContext,
};
use llmprof_abi::{CpuSampleEvent, EventKind, KERNEL_STACK_MAX, Knob, ProbeId, USER_STACK_MAX};

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

/// Fills the reserved record `e` (of `kind`: an on-CPU sample, or an off-CPU stack from `offcpu`) for the
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
