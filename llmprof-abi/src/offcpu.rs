//! Off-CPU stacks: where a traced thread was when it went to sleep.
//!
//! When stack sampling is on, the `sched_switch` program takes the kernel and user stack of a traced thread
//! that leaves the CPU blocked (prev_state S or D, not preempted) and writes it as a
//! [`crate::CpuSampleEvent`] of kind [`crate::EventKind::OffCpuStack`] right after the switch record, with
//! the same time and thread (user space joins them by (tid, ts)); a Python thread's interpreter stack
//! follows as a `PyStackEvent` of the same instant. Bounded per CPU by [`OFFCPU_STACKS_PER_WINDOW`] per
//! [`OFFCPU_WINDOW_NS`]: a stack the rate bound does not take is counted apart (the kernel's `OFFCPU_RATE` map,
//! [`OFFCPU_RATE_NOT_TAKEN`]: not taken by design, not a loss), a stack a full ring loses is a drop of the
//! `cpu_sample` probe, a stack taken is one of its hits (charged at the sampler's calibrated per-sample cost: the same two
//! stack walks and one ring record). Not part of the engine ABI: no [`crate::ABI_VERSION`] change.

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
