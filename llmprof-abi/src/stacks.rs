//! The `stacks` family: where the traced threads spend their time, as native stacks — on-CPU samples of a
//! perf_event program on the software CPU clock, and off-CPU stacks taken when a traced thread blocks.
//!
//! On-CPU: the eBPF sampler (`profiler-ebpf/src/stacks.rs`, one perf event per CPU) writes one
//! [`CpuSampleEvent`] for every sample of a traced thread: the header (time, CPU, pid, tid) and the raw return
//! addresses of the kernel and user stacks as `bpf_get_stack` walked them (frame pointers; innermost first).
//! Symbolization happens in user space.
//!
//! Off-CPU: where a traced thread was when it went to sleep. When stack sampling is on, the `sched_switch`
//! program takes the kernel and user stack of a traced thread that leaves the CPU blocked (prev_state S or D,
//! not preempted) and writes it as a [`CpuSampleEvent`] of kind [`crate::EventKind::OffCpuStack`] right after
//! the switch record, with the same time and thread (user space joins them by (tid, ts)); a Python thread's
//! interpreter stack follows as a `PyStackEvent` of the same instant. Bounded per CPU by
//! [`OFFCPU_STACKS_PER_WINDOW`] per [`OFFCPU_WINDOW_NS`]: a stack the rate bound does not take is counted
//! apart (the kernel's `OFFCPU_RATE` map, [`OFFCPU_RATE_NOT_TAKEN`]: not taken by design, not a loss), a
//! stack a full ring loses is a drop of the `cpu_sample` probe, a stack taken is one of its hits (charged at
//! the sampler's calibrated per-sample cost: the same two stack walks and one ring record).
//!
//! These records do not cross the engine boundary: no [`crate::ABI_VERSION`] change.

use crate::{EventHeader, Family};

/// perf_event (software CPU clock, one event per CPU): one [`CpuSampleEvent`] per sample of a traced thread.
pub const SAMPLE_PROGRAM: &str = "llmprof_sample";
/// Per CPU: samples of traced threads seen, for the rate divider (`Knob::SampleEvery`).
pub const SAMPLE_TICKS_MAP: &str = "SAMPLE_TICKS";
/// Per CPU: the off-CPU rate bound's window, the stacks taken in it, and the stacks not taken
/// ([`OFFCPU_RATE_NOT_TAKEN`]).
pub const OFFCPU_RATE_MAP: &str = "OFFCPU_RATE";
/// Every program of the family.
pub const PROGRAMS: [&str; 1] = [SAMPLE_PROGRAM];
/// Every map of the family.
pub const MAPS: [&str; 2] = [SAMPLE_TICKS_MAP, OFFCPU_RATE_MAP];
/// The family's kernel names.
pub const FAMILY: Family = Family {
    name: "stacks",
    programs: &PROGRAMS,
    maps: &MAPS,
};

/// Most user frames kept per sample (`bpf_get_stack` with `BPF_F_USER_STACK`; deeper stacks are cut at the
/// outermost end). 64 covers llmserve's deepest stacks (rayon worker → matmul kernel: ~20) with room for
/// interpreters; the kernel's own limit is `kernel.perf_event_max_stack` (127 by default).
pub const USER_STACK_MAX: usize = 64;
/// Most kernel frames kept per sample: a syscall path from entry to the scheduler is ~15–25 frames.
pub const KERNEL_STACK_MAX: usize = 32;
/// Default sampling frequency (`--sample-rate`): 99 Hz, off the 100 Hz tick so samples do not beat with
/// timer-driven work (the usual profiler default: perf, bpftrace `profile:hz:99`, Parca).
pub const DEFAULT_SAMPLE_HZ: u64 = 99;

/// One on-CPU stack sample of a traced thread.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CpuSampleEvent {
    /// Header ([`crate::EventKind::CpuSample`]); `ts_ns` is the sample's time.
    pub hdr: EventHeader,
    /// Valid entries of `user` (0: no user stack, e.g. the walk faulted at once).
    pub user_len: u32,
    /// Valid entries of `kernel` (0: the thread was in user mode when the clock fired).
    pub kernel_len: u32,
    /// User return addresses, innermost (the interrupted instruction) first.
    pub user: [u64; USER_STACK_MAX],
    /// Kernel return addresses, innermost first.
    pub kernel: [u64; KERNEL_STACK_MAX],
}

impl CpuSampleEvent {
    /// The valid user addresses, innermost first.
    pub fn user_stack(&self) -> &[u64] {
        &self.user[..(self.user_len as usize).min(USER_STACK_MAX)]
    }

    /// The valid kernel addresses, innermost first.
    pub fn kernel_stack(&self) -> &[u64] {
        &self.kernel[..(self.kernel_len as usize).min(KERNEL_STACK_MAX)]
    }
}

const _: () = {
    assert!(core::mem::size_of::<CpuSampleEvent>() == 32 + 8 * (USER_STACK_MAX + KERNEL_STACK_MAX));
};

/// Window of the per-CPU rate bound, ns.
pub const OFFCPU_WINDOW_NS: u64 = 10_000_000;
/// Most off-CPU stacks taken per CPU in one [`OFFCPU_WINDOW_NS`]: 8 per 10 ms is 800/s per CPU, which keeps
/// the worst case (a thread blocking and waking as fast as it can) near 1 % of a CPU at ~1.5 µs a native
/// stack pair (docs/performance.md, "Off-CPU stacks"); a server thread that blocks a few hundred times a
/// second keeps every stack.
pub const OFFCPU_STACKS_PER_WINDOW: u64 = 8;

/// Index, in each CPU's value of the kernel's `OFFCPU_RATE` map (`[u64; 3]`), of the stacks the rate bound
/// did not take.
pub const OFFCPU_RATE_NOT_TAKEN: usize = 2;

/// `Knob::OffCpuStacksOff` value that takes every off-CPU stack, without the rate bound: only while llmprof
/// calibrates the cost of one on its own threads at start-up.
pub const OFFCPU_UNBOUNDED: u64 = 2;

/// `TASK_INTERRUPTIBLE | TASK_UNINTERRUPTIBLE` (include/linux/sched.h) in `sched_switch`'s `prev_state`: the
/// thread blocks (Sleeping or Uninterruptible) rather than being preempted or exiting.
pub const BLOCKED_STATES: i64 = 0x1 | 0x2;
/// `TASK_REPORT_MAX` (0x100 since 4.14) in `prev_state`: the thread was preempted while still runnable.
pub const PREEMPTED_STATE: i64 = 0x100;

/// Whether a `sched_switch` `prev_state` is a sleep worth a stack (S or D, not preempted).
pub const fn is_blocking(prev_state: i64) -> bool {
    prev_state & PREEMPTED_STATE == 0 && prev_state & BLOCKED_STATES != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_block_and_preemptions_do_not() {
        assert!(is_blocking(1), "S");
        assert!(is_blocking(2), "D");
        assert!(!is_blocking(0), "runnable");
        assert!(!is_blocking(0x100), "preempted");
        assert!(!is_blocking(0x101), "preempted while setting S");
        assert!(!is_blocking(0x10 | 0x20), "exit");
        assert!(!is_blocking(0x80), "idle (I) is not a sleep of the program's");
    }
}
