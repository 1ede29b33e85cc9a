//! On-CPU stack samples: the record the eBPF sampler (`profiler-ebpf/src/sample.rs`, a perf_event program on
//! the software CPU clock) writes for every sample of a traced thread.
//!
//! One record per sample: the header (time, CPU, pid, tid) and the raw return addresses of the kernel and
//! user stacks as `bpf_get_stack` walked them (frame pointers; innermost first). Symbolization happens in
//! user space. The layout is pinned by a size assertion below; it does not cross the engine boundary, so it
//! does not change [`crate::ABI_VERSION`].

use crate::EventHeader;

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
