//! What one probe hit costs the traced process, as measured by `llmprof`'s calibration beside each session.
//!
//! Owns the data only (the measurement lives in the capture, which needs root): the figures every trace carries
//! in its summary and the self-accounting charges per hit. Pure: no clock reads, no kernel.

/// First byte of an attached probe on the optimized path: `call rel32` to the kernel's uprobe trampoline.
pub const ENTRY_CALL: u8 = 0xe8;
/// First byte of an attached probe on the trap path: `int3`.
pub const ENTRY_INT3: u8 = 0xcc;

/// What one probe hit costs the traced process on this machine, measured by a calibration run beside the
/// session (serialized as JSON between the calibrating process and the session).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    /// Extra ns per syscall of a traced process (raw_syscalls enter + exit programs, aggregates).
    pub syscall_ns: f64,
    /// `getppid` untraced, ns (the reference the extra is measured against).
    pub syscall_untraced_ns: f64,
    /// Extra ns per traced syscall whose exit llmprof decodes (read, write, close, ...: the entry copies
    /// its arguments, the exit emits or updates records), measured on `close(-1)` untraced vs traced.
    /// A hit of this class is charged this cost *instead of* `syscall_ns`. `None` when not measured
    /// (a trace from before this figure existed): such hits are charged `syscall_ns`.
    pub syscall_decoded_ns: Option<f64>,
    /// `close(-1)` untraced, ns (the reference of `syscall_decoded_ns`); `None` when not measured.
    pub syscall_decoded_untraced_ns: Option<f64>,
    /// Extra ns per engine probe hit, excluding the syscalls the hit itself makes (counted by `syscall_ns`).
    /// `None` when no engine probe is attached (nothing to measure, nothing to charge).
    pub probe_ns: Option<f64>,
    /// Extra ns per range probe hit that the `RangeSampleEvery` knob sampled out (same exclusion).
    pub probe_sampled_out_ns: Option<f64>,
    /// Syscall hits the raw_syscalls programs counted per probe call (≈1 on the optimized path, 0 with int3).
    pub syscalls_per_probe_hit: f64,
    /// First byte of the attached probe ([`ENTRY_CALL`]: optimized NOP5 path, [`ENTRY_INT3`]: trap).
    pub probe_entry: Option<u8>,
    /// Extra ns per CUDA driver call traced by the entry uprobe + return uprobe pair, excluding the
    /// syscalls the pair makes (counted by `syscall_ns`). `None` when not measured (CUDA probes off).
    pub cuda_call_ns: Option<f64>,
    /// Extra ns per CUDA driver call counted by the entry-only uprobe (launch-type calls in the default
    /// `--cuda-calls counted` mode, `llmprof_abi::cuda`), same exclusion. `None` when not measured.
    pub cuda_count_ns: Option<f64>,
    /// Extra ns per thread-state record (a sched_switch or sched_waking of a traced thread: the program's
    /// lookups and the ring-buffer record), from a pipe ping-pong of two llmprof threads on one CPU, traced vs
    /// untraced, minus the syscalls it makes. `None` when not measured (thread states off).
    pub sched_event_ns: Option<f64>,
    /// ns of the stack sampler's eBPF program per traced sample (kernel + user stack walk, ring record),
    /// from the kernel's BPF run-time statistics during the calibration; the timer interrupt itself is not included.
    /// `None` when not sampling or not measured.
    pub sample_ns: Option<f64>,
    /// ns of the sampler per sample measured on the traced processes during the session (its kernel run time
    /// over a few seconds divided by the targets' samples in them: deep native stacks and Python frames
    /// included, and the early exits on other tasks charged to the samples); replaces `sample_ns` in the
    /// self-accounting once known. `None` when not measured (short session, statistics unavailable).
    pub sample_live_ns: Option<f64>,
    /// ns of the `sched_switch` program per off-CPU stack (kernel + user stack walk and ring record at a
    /// blocking switch), from the traced pipe ping-pong with a stack at every block minus without. `None`
    /// when not sampling or not measured. The Python walk at the block point is not in it (llmprof is not
    /// Python; docs/performance.md has its figure).
    pub offcpu_stack_ns: Option<f64>,
    /// Extra ns per request the HTTP wire probe follows (head read, copy and record, and a small response),
    /// measured on a socket pair followed vs not. `None` when not measured (`--no-http`).
    pub http_request_ns: Option<f64>,
    /// Extra ns per followed response write of a typical SSE chat chunk (~230 bytes through the in-kernel
    /// scanner, and its record); what the wire probe costs per generated token. `None` when not measured.
    pub http_sse_write_ns: Option<f64>,
    /// ns per run of the wire probe's arrival-stamp programs (sock:sk_data_ready, sock:sock_recv_length,
    /// tcp:tcp_destroy_sock), from the kernel's BPF run-time statistics in the session's live window, and
    /// their runs per second host-wide. Reported, not charged to the targets (most runs are in softirq or in
    /// the process that sent the bytes). `None` when not measured.
    pub http_arrival_ns: Option<f64>,
    /// See [`Calibration::http_arrival_ns`].
    pub http_arrival_runs_per_s: Option<f64>,
    /// Wall time the calibration took, ms.
    pub took_ms: f64,
}

impl Calibration {
    /// Cost charged per traced syscall of the decoded class ([`Calibration::syscall_decoded_ns`], or
    /// [`Calibration::syscall_ns`] when that was not measured).
    pub fn decoded_ns(&self) -> f64 {
        self.syscall_decoded_ns.unwrap_or(self.syscall_ns)
    }

    /// Whether the engine probes take the optimized (call) path; `None` when not measured.
    pub fn optimized(&self) -> Option<bool> {
        self.probe_entry.map(|b| b == ENTRY_CALL)
    }

    /// "call (optimized)", "int3 (trap)", ... for the probe entry byte.
    pub fn entry_name(&self) -> String {
        self.probe_entry
            .map_or_else(|| "not measured".to_owned(), entry_name)
    }
}

/// What the first byte of an attached probe means.
pub fn entry_name(b: u8) -> String {
    match b {
        ENTRY_CALL => "call (optimized)".to_owned(),
        ENTRY_INT3 => "int3 (trap)".to_owned(),
        0x0f => "NOP5 (unpatched)".to_owned(),
        b => format!("0x{b:02x}"),
    }
}
