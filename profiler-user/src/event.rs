//! The decoded event stream: what capture produces and every sink (Perfetto writer, OTel, flight recorder)
//! consumes.
//!
//! Owns the user-space event model only. It never touches the kernel: `capture` decodes ring-buffer records
//! (the `llmprof_abi` layouts) into [`Event`]s, samplers add their own, the merge orders them by
//! [`Event::ts_ns`] (CLOCK_BOOTTIME ns), and sinks are pure functions of the resulting stream, so they are tested
//! from fixtures built in code without root.

use std::net::IpAddr;

use llmprof_abi::{
    ContentKind, CudaFunc, CudaVariant, FileOp, NUM_PROBES, ProbeCounters, RangeRecord, RequestRecord,
    StepRecord,
};

/// One decoded event.
#[derive(Clone, Debug)]
pub struct Event {
    /// When it happened (BOOTTIME ns). For syscalls and file I/O: the entry time.
    pub ts_ns: u64,
    /// Process id (tgid) it belongs to; 0 for session-wide samples.
    pub pid: u32,
    /// Thread id; 0 when not thread-specific.
    pub tid: u32,
    /// What happened.
    pub body: EventBody,
}

/// The payload of an [`Event`].
#[derive(Clone, Debug)]
pub enum EventBody {
    /// An engine step (probe `llmprof_probe_step`).
    Step(Box<StepRecord>),
    /// A request lifecycle transition (probe `llmprof_probe_request`).
    Request(Box<RequestRecord>),
    /// An NVTX-style push/pop/mark (probe `llmprof_probe_range`).
    Range(RangeRecord),
    /// A request's prompt or completion text (probe `llmprof_probe_content`, only with `--capture-content`).
    Content {
        /// Prompt or completion.
        kind: ContentKind,
        /// Engine request id.
        req_id: u64,
        /// The text (its first `CONTENT_MAX` bytes; a cut character becomes U+FFFD).
        text: String,
        /// The text's full length in the engine, bytes (more than `text` when cut).
        len: u64,
    },
    /// A syscall slower than the threshold.
    SlowSyscall {
        /// Syscall number.
        nr: u64,
        /// Return value.
        ret: i64,
        /// Duration, ns.
        dur_ns: u64,
    },
    /// An open of a model file.
    FileOpen {
        /// Path as opened.
        path: String,
        /// fd or -errno.
        ret: i64,
        /// Duration, ns.
        dur_ns: u64,
    },
    /// Read / pread64 / readv / mmap / close on a model-file fd.
    FileIo {
        /// Operation.
        op: FileOp,
        /// fd.
        fd: i32,
        /// Path of the fd when its open was seen.
        path: Option<String>,
        /// Bytes read, mmap address, or close result.
        ret: i64,
        /// Bytes requested / mapped.
        len: u64,
        /// Duration, ns.
        dur_ns: u64,
    },
    /// A connect attempt.
    Connect {
        /// Destination address.
        addr: IpAddr,
        /// Destination port.
        port: u16,
        /// 0 or -errno.
        ret: i64,
        /// Duration, ns.
        dur_ns: u64,
        /// Inside the allowed CIDRs.
        allowed: bool,
    },
    /// The traced process exited.
    ProcessExit {
        /// Exit code as the kernel reports it.
        exit_code: i64,
    },
    /// A scrape of the engine's `/metrics`.
    Metrics(MetricsSample),
    /// Syscall rate over the last sampling interval, from the kernel aggregates.
    SyscallRate {
        /// Calls per second.
        per_sec: f64,
    },
    /// A CUDA driver API call (libcuda uprobes): host-side time in the call, not GPU execution.
    CudaCall {
        /// The function.
        func: CudaFunc,
        /// Which exported symbol of it (`_v2`, `_ptsz`, ...).
        variant: CudaVariant,
        /// Time the calling thread spent in the call, ns.
        dur_ns: u64,
        /// The argument [`CudaFunc::arg`] names (bytes, device pointer, stream), 0 if none.
        arg: u64,
        /// The returned `CUresult` (0 = success).
        result: u32,
    },
    /// One NVML sample of one GPU.
    GpuSample(Box<GpuSample>),
    /// Something llmprof itself wants on the timeline (e.g. "target exited", "probes not found").
    Marker {
        /// Short text.
        text: String,
    },
}

/// Values scraped from the engine's Prometheus endpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSample {
    /// `vllm:kv_cache_usage_perc` (0..1).
    pub kv_cache_usage: Option<f64>,
    /// `vllm:num_requests_running`.
    pub running: Option<f64>,
    /// `vllm:num_requests_waiting`.
    pub waiting: Option<f64>,
    /// `vllm:num_preemptions_total`.
    pub preemptions_total: Option<f64>,
}

/// One sample of one GPU's NVML counters. A counter the GPU or driver does not support stays `None`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSample {
    /// NVML device index.
    pub index: u32,
    /// Product name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Device UUID (`GPU-...`).
    pub uuid: String,
    /// Percent of time a kernel ran over the last sample period (NVML `utilization.gpu`).
    pub util_gpu_pct: Option<f64>,
    /// Percent of time device memory was read or written (NVML `utilization.memory`).
    pub util_mem_pct: Option<f64>,
    /// Device memory in use, bytes.
    pub mem_used_bytes: Option<u64>,
    /// Device memory, bytes.
    pub mem_total_bytes: Option<u64>,
    /// Board power draw, watts.
    pub power_w: Option<f64>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<f64>,
    /// GPU temperature, °C.
    pub temperature_c: Option<f64>,
    /// PCIe transmit throughput (device → host), bytes/s.
    pub pcie_tx_bytes_per_s: Option<f64>,
    /// PCIe receive throughput (host → device), bytes/s.
    pub pcie_rx_bytes_per_s: Option<f64>,
    /// Device memory used by the traced process (its compute contexts on this GPU), bytes; `None` when it has
    /// none there or the driver does not say.
    pub process_mem_bytes: Option<u64>,
}

/// A thread of a traced process, named from /proc.
#[derive(Clone, Debug)]
pub struct ThreadInfo {
    /// Thread id.
    pub tid: u32,
    /// `comm` of the thread.
    pub name: String,
}

/// A traced process, named from /proc.
#[derive(Clone, Debug)]
pub struct ProcessInfo {
    /// Process id.
    pub pid: u32,
    /// `comm` of the process.
    pub name: String,
    /// Command line, space separated.
    pub cmdline: String,
    /// Threads known at attach time (threads seen later get tracks on first use).
    pub threads: Vec<ThreadInfo>,
    /// Whether the engine's probe points were found and attached.
    pub engine_probes: bool,
}

/// Syscall aggregate of one thread and syscall, read from the kernel at the end of a session.
#[derive(Clone, Debug)]
pub struct SyscallAggregate {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Syscall number.
    pub nr: u64,
    /// Calls.
    pub count: u64,
    /// Total time, ns.
    pub total_ns: u64,
    /// Log2 latency histogram (bucket i: [2^i, 2^(i+1)) ns).
    pub hist: Vec<u64>,
}

/// What llmprof saw and lost during a session; written as the trace's final packet and printed at exit.
#[derive(Clone, Debug, Default)]
pub struct SessionStats {
    /// Per-probe counters summed over CPUs, indexed by `llmprof_abi::ProbeId`.
    pub probes: [ProbeCounters; NUM_PROBES],
    /// Records user space could not decode.
    pub decode_errors: u64,
    /// Events dropped in user space (bounded queues full).
    pub user_drops: u64,
    /// Bytes of the trace file.
    pub trace_bytes: u64,
    /// Why the session ended ("duration elapsed", "interrupted", "target exited", ...).
    pub end_reason: String,
    /// Syscall aggregates.
    pub syscalls: Vec<SyscallAggregate>,
}

impl SessionStats {
    /// Total records lost, kernel and user space.
    pub fn total_dropped(&self) -> u64 {
        self.probes.iter().map(|p| p.dropped).sum::<u64>() + self.user_drops
    }
}
