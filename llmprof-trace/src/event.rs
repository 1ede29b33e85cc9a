//! The decoded event stream: what capture produces and every sink (Perfetto writer, OTel, flight recorder)
//! consumes.
//!
//! Owns the user-space event model only. It never touches the kernel: `capture` decodes ring-buffer records
//! (the `llmprof_abi` layouts) into [`Event`]s, samplers add their own, the merge orders them by
//! [`Event::ts_ns`] (CLOCK_BOOTTIME ns), and sinks are pure functions of the resulting stream, so they are tested
//! from fixtures built in code without root.
//!
//! What a probe family adds beyond its variants of [`Event`] is its own file, named after the family:
//! [`cupti`] (GPU activity and what links it to launches and steps), [`engine`] (the request timeline every
//! consumer shares), [`python`] (resolved Python frames and their merge into native stacks), [`sched`]
//! (thread states), [`stacks`] (symbolized stack samples, off-CPU labels).

use std::net::IpAddr;

pub mod cupti;
pub mod engine;
pub mod python;
pub mod sched;
pub mod stacks;

pub use sched::{SchedSwitch, SchedWake};

use llmprof_abi::{
    ContentKind, CudaFunc, CudaVariant, FileOp, NUM_PROBES, ProbeCounters, RangeRecord, RequestRecord,
    StepRecord,
};
use stacks::CpuSample;

/// First request id of the requests seen on the wire ([`crate::decode::wire::requests`]); an engine's own ids are per-process
/// counters far below it, so the two never meet in [`EventBody::Request`] and the trace's request names.
pub const WIRE_REQ_BASE: u64 = 1 << 40;

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
    /// A traced process started this new process (`pid`; process trees): traced from its first instruction.
    ProcessStart {
        /// The parent's pid.
        ppid: u32,
        /// Its `comm`.
        name: String,
        /// Its command line, space separated (from /proc when it was still there, else empty).
        cmdline: String,
    },
    /// A traced process executed a program: new name, command line and probes.
    ProcessExec {
        /// The executed file as passed to execve.
        filename: String,
        /// Its new `comm`.
        name: String,
        /// Its new command line, space separated (from /proc when it was still there, else empty).
        cmdline: String,
    },
    /// A traced process exited.
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
    /// A window of one thread's counted CUDA driver calls (launch-type calls, entry-only probe: how many, no
    /// host times; `llmprof_abi::cuda`). Event time: the entry of the window's first call.
    CudaCount {
        /// Entry of the window's last call, BOOTTIME ns.
        last_ns: u64,
        /// Calls per function, in `llmprof_abi::cuda::COUNTED` order.
        calls: [u32; 8],
        /// Bytes of the counted (asynchronous) copies.
        bytes: u64,
    },
    /// One NVML sample of one GPU.
    GpuSample(Box<GpuSample>),
    /// Something llmprof itself wants on the timeline (e.g. "target exited", "probes not found").
    Marker {
        /// Short text.
        text: String,
    },
    /// llmprof's own cost over the last interval (`llmprof::selfacct`), on global counter tracks.
    Overhead(Box<OverheadSample>),
    /// The overhead budget switched something off (`llmprof::budget`): an instant on the llmprof track.
    Degraded(Degradation),
    /// A Python stack sample of a thread (perf_event CPU clock), resolved ([`crate::event::python`]).
    PyStack(Box<python::PyStackSample>),
    /// A request seen on the wire (`crate::decode::wire::requests`): its method and path (its lifecycle comes as `Request`
    /// records of the same `req_id`).
    WireRequest {
        /// Wire request id (from [`WIRE_REQ_BASE`] up).
        req_id: u64,
        /// `POST`, ...
        method: String,
        /// Request target.
        path: String,
        /// How long the request's first bytes waited in the server's socket before the server read them (the
        /// request starts at their arrival); `None` when the arrival was not seen.
        socket_wait_ns: Option<u64>,
    },
    /// A wire request's response status line was written.
    WireResponse {
        /// Wire request id.
        req_id: u64,
        /// HTTP status code.
        status: u32,
    },
    /// A wire request's exchange ended (its response's end, or its connection closed first), just before its
    /// `Finished` record.
    WireEnd {
        /// Wire request id.
        req_id: u64,
        /// HTTP status code of its response (0: no status line was written: the client went away first).
        status: u32,
        /// Bytes of the response's writes that left a record (its status line, its SSE events, its end: all of
        /// a response sent whole, or streamed an event per write); `None` when its end was not seen.
        bytes: Option<u64>,
        /// The response was a stream of server-sent events.
        streamed: bool,
        /// The engine request this exchange carried, seen by the engine's own probes in the same process
        /// (one request, two views: `crate::decode::wire::requests::join`).
        engine_req: Option<u64>,
    },
    /// SSE events with generated content after a wire request's first one (one write may carry several).
    WireToken {
        /// Wire request id.
        req_id: u64,
        /// Content events in the write.
        count: u32,
    },
    /// A context switch involving a traced thread ([`crate::event::sched`]); the event's pid/tid are the
    /// traced process and its thread (the one going off the CPU when it is traced, else the one coming on).
    SchedSwitch(Box<SchedSwitch>),
    /// A traced thread made runnable; the event's pid/tid are the woken thread's, the waker is in the body.
    SchedWake(Box<SchedWake>),
    /// An on-CPU stack sample of the thread (perf_event sampler), symbolized ([`crate::event::stacks`]).
    CpuSample(Box<CpuSample>),
    /// The stack of a traced thread blocking at a context switch (it follows that `SchedSwitch`, same time
    /// and thread; [`stacks::offcpu`]), symbolized, Python frames spliced in like an on-CPU sample's.
    OffCpuStack(Box<CpuSample>),
    /// GPU work CUPTI recorded in the target (injected helper, [`crate::event::cupti`]): a kernel, copy, memset or host
    /// wait. The event's time is when its chunk was handed over; the work's own times (BOOTTIME) are in it.
    GpuWork(Box<cupti::GpuWork>),
    /// A CUDA API call CUPTI recorded (links the calling thread to GPU work by correlation id); event time as
    /// for [`EventBody::GpuWork`].
    GpuApi(Box<cupti::GpuApi>),
    /// A window's summary of GPU work (the helper's default mode): per kernel name, copy kind and wait type,
    /// count and GPU time; event time as for [`EventBody::GpuWork`].
    GpuSummary(Box<cupti::GpuWindow>),
    /// A compacted interval of GPU work on one device (the helper's default mode); event time as for
    /// [`EventBody::GpuWork`].
    GpuBusy(Box<cupti::GpuBusyInterval>),
}

impl EventBody {
    /// The kind's name, as counted in the trace summary's `events` arg and the exit summary.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Self::Step(_) => "step",
            Self::Request(_) => "request",
            Self::Range(_) => "range",
            Self::Content { .. } => "content",
            Self::SlowSyscall { .. } => "slow_syscall",
            Self::FileOpen { .. } => "file_open",
            Self::FileIo { .. } => "file_io",
            Self::Connect { .. } => "connect",
            Self::ProcessStart { .. } => "process_start",
            Self::ProcessExec { .. } => "process_exec",
            Self::ProcessExit { .. } => "process_exit",
            Self::Metrics(_) => "metrics",
            Self::SyscallRate { .. } => "syscall_rate",
            Self::CudaCall { .. } => "cuda_call",
            Self::CudaCount { .. } => "cuda_count",
            Self::GpuSample(_) => "gpu_sample",
            Self::Marker { .. } => "marker",
            Self::Overhead(_) => "overhead",
            Self::Degraded(_) => "degradation",
            Self::PyStack(_) => "py_stack",
            Self::WireRequest { .. } => "wire_request",
            Self::WireResponse { .. } => "wire_response",
            Self::WireEnd { .. } => "wire_end",
            Self::WireToken { .. } => "wire_token",
            Self::SchedSwitch(_) => "sched_switch",
            Self::SchedWake(_) => "sched_wake",
            Self::CpuSample(_) => "cpu_sample",
            Self::OffCpuStack(_) => "offcpu_stack",
            Self::GpuWork(_) => "gpu_work",
            Self::GpuApi(_) => "gpu_api",
            Self::GpuSummary(_) => "gpu_summary",
            Self::GpuBusy(_) => "gpu_busy",
        }
    }
}

/// llmprof's self-accounting over one interval (every status tick).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OverheadSample {
    /// Length of the interval, ns.
    pub interval_ns: u64,
    /// Estimated CPU time the probes added to the target in the interval (hits × calibrated cost), ns.
    pub est_added_ns: f64,
    /// The target's CPU time in the interval (all threads, from /proc; includes what the probes added), ns.
    pub target_cpu_ns: Option<f64>,
    /// `est_added_ns` as a percentage of the target's CPU time without it (the budget's measure).
    pub est_overhead_pct: Option<f64>,
    /// llmprof's own CPU time in the interval (user + system), ns.
    pub llmprof_cpu_ns: f64,
    /// llmprof's resident memory, bytes.
    pub llmprof_rss_bytes: u64,
    /// Calibrated extra ns per traced syscall.
    pub cost_syscall_ns: f64,
    /// Calibrated extra ns per traced syscall whose exit llmprof decodes (read, write, close, ...; None:
    /// not measured, charged `cost_syscall_ns`).
    pub cost_syscall_decoded_ns: Option<f64>,
    /// Calibrated extra ns per engine probe hit (None: no engine probe attached).
    pub cost_probe_ns: Option<f64>,
    /// Calibrated extra ns per CUDA driver call (entry + return uprobe; None: not measured).
    pub cost_cuda_ns: Option<f64>,
    /// Degradation level in force (0: full tracing; see `llmprof::budget::LEVELS`).
    pub level: u32,
}

/// One step of the overhead budget's degradation.
#[derive(Clone, Debug, PartialEq)]
pub struct Degradation {
    /// The level now in force (1 = first step).
    pub level: u32,
    /// Stable name of the step, e.g. `syscall_events_off`.
    pub name: &'static str,
    /// What changed, in words.
    pub change: String,
    /// The estimate that exceeded the budget, % of target CPU.
    pub overhead_pct: f64,
    /// The budget, %.
    pub budget_pct: f64,
    /// Syscalls counted by the kernel aggregates when the step was taken.
    pub syscalls_counted: u64,
}

/// What the injected CUPTI helper added to the target over a session (part of [`OverheadSummary`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CuptiEstimate {
    /// Estimated CPU added, ns: `thread_cpu_ns` + `records` × `per_record_ns`.
    pub added_ns: f64,
    /// CPU of CUPTI's buffer thread and the helper's callbacks, measured in the target, ns.
    pub thread_cpu_ns: f64,
    /// CUPTI records written.
    pub records: u64,
    /// Assumed CUPTI work per record in the launching threads, ns.
    pub per_record_ns: f64,
}

/// What the Python hooks added to the targets over a session (part of [`OverheadSummary`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PyHooksEstimate {
    /// Estimated CPU added, ns: each record at its process's calibrated cost.
    pub added_ns: f64,
    /// Records the hooks wrote.
    pub records: u64,
}

/// Self-accounting of a whole session (the trace's summary and attach's exit summary).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OverheadSummary {
    /// The injected CUPTI helper's part of `est_added_ns` (None: no helper recorded).
    pub cupti: Option<CuptiEstimate>,
    /// The Python hooks' part of `est_added_ns` (None: no hooks recorded).
    pub python_hooks: Option<PyHooksEstimate>,
    /// Session length, ns.
    pub elapsed_ns: u64,
    /// Estimated CPU time the probes added to the target, ns, and per probe (indexed by `ProbeId`).
    pub est_added_ns: f64,
    /// See [`OverheadSummary::est_added_ns`].
    pub est_added_by_probe_ns: Vec<f64>,
    /// The target's CPU time during the session, ns.
    pub target_cpu_ns: Option<f64>,
    /// `est_added_ns` as a percentage of the target's CPU time without it.
    pub est_overhead_pct: Option<f64>,
    /// llmprof's CPU time (user + system, all threads), ns.
    pub llmprof_cpu_ns: f64,
    /// llmprof's peak resident memory, bytes.
    pub llmprof_max_rss_bytes: u64,
    /// The most of it that was llmprof's alone (pages no other process maps: its heap, the ring, the parts of
    /// the target's files only it reads), bytes; the rest of the RSS is pages of files the target maps too
    /// (its libraries, mapped to read their symbols), which cost the machine nothing more.
    pub llmprof_max_private_bytes: u64,
    /// The start-up calibration.
    pub calibration: Option<crate::calibration::Calibration>,
    /// `--overhead-budget`, %.
    pub budget_pct: Option<f64>,
    /// Steps the budget took, in order.
    pub degradations: Vec<Degradation>,
    /// `--max-trace-size`, bytes.
    pub size_limit: Option<u64>,
    /// Events not written because the size limit was reached.
    pub events_not_written: u64,
    /// Stacks (on-CPU samples and off-CPU stacks) llmprof symbolized.
    pub symbolized_stacks: u64,
    /// llmprof's time symbolizing them (blazesym, in llmprof's own thread), ns.
    pub symbolize_ns: f64,
    /// Distinct addresses symbolized, and of those the ones no symbol named, and of those the ones in no
    /// mapping of the process (a frame-pointer walk gone astray in code without frame pointers).
    pub symbolize_addresses: u64,
    /// See [`OverheadSummary::symbolize_addresses`].
    pub symbolize_unknown: u64,
    /// See [`OverheadSummary::symbolize_addresses`].
    pub symbolize_unmapped: u64,
    /// Of `symbolize_ns`, the time resolving addresses not seen before (each library's symbols read once):
    /// the rest is the per-stack cost of the cache.
    pub symbolize_resolve_ns: f64,
    /// llmprof's own CPU charged to the target because they share CPUs the target keeps busy, ns (part of
    /// `est_added_ns`; `llmprof::cpushare`). `None`: not measured.
    pub contention_ns: Option<f64>,
    /// CPUs the target and llmprof share (with `contention_ns`).
    pub shared_cpus: u32,
    /// Idle share of those CPUs during the session, % (with `contention_ns`).
    pub shared_idle_pct: Option<f64>,
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

/// Longest process track name: a longer command line is cut (with `…`); the full one is in the descriptor.
pub const PROCESS_NAME_MAX: usize = 160;

impl ProcessInfo {
    /// The name of the process's track: its command line with the program's directory left out (cut at
    /// [`PROCESS_NAME_MAX`] bytes), else `comm`.
    pub fn display_name(&self) -> String {
        let c = self.cmdline.trim();
        if c.is_empty() {
            return self.name.clone();
        }
        let (prog, rest) = c.split_once(' ').unwrap_or((c, ""));
        let prog = prog.rsplit('/').next().unwrap_or(prog);
        let full = if rest.is_empty() {
            prog.to_owned()
        } else {
            format!("{prog} {rest}")
        };
        let c = full.as_str();
        if c.len() <= PROCESS_NAME_MAX {
            return c.to_owned();
        }
        let mut n = PROCESS_NAME_MAX;
        while !c.is_char_boundary(n) {
            n -= 1;
        }
        format!("{}…", &c[..n])
    }
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
    /// llmprof's own cost, the budget's steps and the size limit (None when not accounted, e.g. fixtures).
    pub overhead: Option<OverheadSummary>,
    /// GPU activity chunks read and lost (CUPTI helper; all zero without it).
    pub gpu: cupti::GpuStats,
    /// Off-CPU stacks not taken by design: the kernel's per-CPU rate bound (not a loss, not in the drops).
    pub offcpu_not_taken: u64,
}

impl SessionStats {
    /// Total records lost, kernel and user space.
    pub fn total_dropped(&self) -> u64 {
        self.probes.iter().map(|p| p.dropped).sum::<u64>() + self.user_drops + self.gpu.lost()
    }
}
