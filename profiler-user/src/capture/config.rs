//! What a capture is asked to record ([`CaptureConfig`]) and its defaults.
//!
//! Owns the options and their defaults; never touches the kernel.

use std::time::Duration;

use super::egress::Cidr;
use super::patterns::DEFAULT_MODEL_PATTERNS;
use super::{python, wire};

/// Default slow-syscall threshold (`--slow-syscall`), as documented in the CLI.
pub const DEFAULT_SLOW_SYSCALL: Duration = Duration::from_millis(1);
/// Default ring size. The kernel maps a ring's pages twice into llmprof (for records that wrap around), all
/// resident from the start: 16 MiB is 32 MiB of llmprof's RSS, and 0.5–1 s of events at the highest rates
/// measured (docs/performance.md, Capture).
pub const DEFAULT_RING_BYTES: usize = 16 << 20;
/// Ring size of the deep GPU mode (`--gpu-kernels all`): every CUPTI record in 16 KiB chunks.
pub const DEEP_RING_BYTES: usize = 64 << 20;

/// What to capture.
#[derive(Clone, Debug)]
pub struct CaptureConfig {
    /// Processes (tgids) to trace.
    pub pids: Vec<u32>,
    /// Trace the processes they start too, from their first instruction (the kernel adds them to the
    /// traced set at fork: process trees). Off: only `pids` (`--no-children`).
    pub follow_children: bool,
    /// Syscalls at least this long are recorded individually.
    pub slow_syscall: Duration,
    /// Model-file patterns (`*.gguf`, `/models/*`); see [`super::patterns`].
    pub model_patterns: Vec<String>,
    /// Connects outside these networks are flagged.
    pub egress_allow: Vec<Cidr>,
    /// Ring-buffer size in bytes (rounded up to a power of two, at least one page).
    pub ring_bytes: usize,
    /// Attach the engine's content probe: prompt and completion text leave the engine (opt-in).
    pub capture_content: bool,
    /// Time two cheap syscalls before any program is attached (~2 ms): the untraced reference a later
    /// [`super::calibrate::run`] measures the probes' cost against ([`super::Capture::untraced`]).
    pub measure_untraced: bool,
    /// Launch-type CUDA calls ([`llmprof_abi::cuda::COUNTED`]) get the entry-only counting uprobe
    /// instead of the timed entry + return pair (`--cuda-calls counted`, the default; off: `--cuda-calls all`).
    pub cuda_counted: bool,
    /// Python stack samples of CPython 3.10–3.13 targets, Hz (0: off; [`python::DEFAULT_HZ`]).
    pub python_hz: u64,
    /// Which listening ports the HTTP wire probe follows ([`wire`]).
    pub http: wire::HttpPorts,
    /// Record thread states (sched_switch / sched_waking of the traced threads, [`super::sched`]).
    pub thread_states: bool,
    /// On-CPU stack samples per second and CPU (`--sample-rate`); 0: no sampling (the default here;
    /// `llmprof attach` passes 99).
    pub sample_hz: u64,
    /// Threads with a tid below this keep their syscall slot in the kernel's tid-indexed array, the others
    /// in a hash ([`llmprof_abi::SYSCALL_SLOTS`], the default, is the most; lower it only to exercise the
    /// hash, as `tests/syscall_exact.rs` does).
    pub syscall_slot_tids: u32,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        Self {
            pids: Vec::new(),
            follow_children: false,
            slow_syscall: DEFAULT_SLOW_SYSCALL,
            model_patterns: DEFAULT_MODEL_PATTERNS.iter().map(|s| s.to_string()).collect(),
            egress_allow: Cidr::default_allow(),
            ring_bytes: DEFAULT_RING_BYTES,
            capture_content: false,
            measure_untraced: false,
            cuda_counted: true,
            python_hz: python::DEFAULT_HZ,
            http: wire::HttpPorts::All,
            thread_states: true,
            sample_hz: 0,
            syscall_slot_tids: llmprof_abi::SYSCALL_SLOTS,
        }
    }
}
