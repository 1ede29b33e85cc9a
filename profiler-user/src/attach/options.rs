//! What an attach session is given and what it returns: [`AttachOptions`], the trace's metadata and prelude,
//! how a session ended ([`StopReason`], the `END_*` reasons), [`AttachError`] and [`AttachReport`].

use super::*;

/// What to trace and where to write it.
#[derive(Clone, Debug)]
pub struct AttachOptions {
    /// Target process (the first `--pid`: it names the trace, the OTel resource and NVML's process).
    pub pid: u32,
    /// Further targets (`--pid` repeated).
    pub more_pids: Vec<u32>,
    /// Trace the targets' descendants too: those alive at attach and every process started while the session
    /// runs, from its first instruction (off: `--no-children`). See [`crate::proctree`].
    pub follow_children: bool,
    /// Which listening ports the HTTP wire probe follows (`--http-port`, `--no-http`).
    pub http: crate::capture::wire::HttpPorts,
    /// Stop after this long (None: until stopped or the target exits).
    pub duration: Option<Duration>,
    /// Trace file.
    pub output: PathBuf,
    /// Threshold for individual syscall events.
    pub slow_syscall: Duration,
    /// Model-file patterns (empty: capture's defaults).
    pub model_patterns: Vec<String>,
    /// Allowed egress networks (empty: capture's defaults).
    pub egress_allow: Vec<Cidr>,
    /// /metrics URL (None: discover).
    pub metrics_url: Option<String>,
    /// Ring-buffer bytes.
    pub ring_bytes: usize,
    /// Print more.
    pub verbose: bool,
    /// OTLP export of request spans (no endpoint: no export).
    pub otel: OtelOptions,
    /// Stack samples per second and CPU (`--sample-rate`; 0: `--no-sample`).
    pub sample_hz: u64,
    /// `--overhead-budget`, % of the target's CPU time (None: never degrade). See [`crate::budget`].
    pub overhead_budget: Option<f64>,
    /// Record thread states (`--no-thread-states` turns them off). See [`crate::capture::sched`].
    pub thread_states: bool,
    /// `--max-trace-size`, bytes (None: no cap). See [`llmprof_trace::sizecap`].
    pub max_trace_size: Option<u64>,
    /// NVML counters and CUDA driver probes.
    pub gpu: GpuOptions,
    /// The Python hooks (`--python-hooks`, `--py-range`). See [`crate::pyhooks`].
    pub python_hooks: crate::pyhooks::PyHooksOptions,
    /// Show the live status line when stderr is a terminal (off for `llmprof serve`'s concurrent sessions).
    pub live_status: bool,
    /// An instant with string args on the llmprof track at the moment the probes are live (`llmprof serve`: the
    /// alert that triggered the session, with its labels, annotations and fingerprint).
    pub metadata: Option<TraceMetadata>,
    /// History written before the live capture (`llmprof serve`'s flight recorder).
    pub prelude: Option<Prelude>,
    /// Why `stop` was set, when its setter says so (`llmprof serve`: alert resolved, disk quota, shutdown); the
    /// trace's `end_reason` then names it instead of [`END_INTERRUPTED`].
    pub stop_reason: StopReason,
    /// The `llmprof` binary, run as a child (`calibrate-probes`) once the probes are live to measure what a
    /// probe hit costs here ([`crate::capture::calibrate_child::Background`]); None: no calibration, the overhead
    /// estimate stays at 0 (a library user without the binary).
    pub calibrator: Option<PathBuf>,
}

/// Why a session's stop flag was set, shared between whoever stops it and the session. The first reason set
/// wins; unset (Ctrl-C/SIGTERM/SIGHUP of `llmprof attach`), the session ends [`END_INTERRUPTED`].
#[derive(Clone, Debug, Default)]
pub struct StopReason(Arc<OnceLock<&'static str>>);

impl StopReason {
    /// Records `reason` unless one was recorded before (set it before the stop flag). True when it was recorded.
    pub fn set(&self, reason: &'static str) -> bool {
        self.0.set(reason).is_ok()
    }

    /// The recorded reason.
    pub fn get(&self) -> Option<&'static str> {
        self.0.get().copied()
    }
}

/// Session metadata recorded in the trace as one instant on the llmprof track.
#[derive(Clone, Debug, Default)]
pub struct TraceMetadata {
    /// Name of the instant, e.g. `alert fired: LLMQueueBacklog`.
    pub event: String,
    /// Its args (`debug.<name>` in the trace processor).
    pub args: Vec<(&'static str, String)>,
}

/// Events that happened before the session: called once, when the session's own probes are live, with that
/// moment (BOOTTIME ns); returns the events older than it, in timestamp order. They are written first, so the
/// trace shows what led up to the session; the live capture continues from that moment.
#[derive(Clone)]
pub struct Prelude(pub Arc<dyn Fn(u64) -> Vec<Event> + Send + Sync>);

impl std::fmt::Debug for Prelude {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Prelude(..)")
    }
}

/// `end_reason` when the stop flag was set without a [`StopReason`] (Ctrl-C, SIGTERM, SIGHUP).
pub const END_INTERRUPTED: &str = "interrupted";

/// `end_reason` when `--max-trace-size` ended the session (the size marker's beginning too).
pub const END_SIZE_LIMIT: &str = marker::SIZE_LIMIT_REACHED;

/// `end_reason` when the traced process exited (the exit marker too).
pub const END_TARGET_EXITED: &str = marker::TARGET_EXITED;

/// Why a session could not run. Messages say what to do next.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// Not root.
    #[error("llmprof attach needs root to load eBPF programs: run it with sudo")]
    NotRoot,
    /// No such process.
    #[error("no process with pid {0}: check the pid (e.g. `pgrep llmserve`)")]
    NoProcess(u32),
    /// An option's value cannot work (e.g. a trace size cap smaller than the end of a trace).
    #[error("{0}")]
    InvalidOption(String),
    /// Capture failed to start or to poll.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// The OTLP export is misconfigured.
    #[error(transparent)]
    Otel(#[from] OtelError),
    /// `--gpu-kernels on` and the kernels cannot be recorded.
    #[error("--gpu-kernels on")]
    GpuKernels(#[source] crate::cupti::CuptiError),
    /// `--py-range`: no process of the tree took the Python hooks (the reasons, one per process).
    #[error("--py-range: no traced process took the Python hooks: {0}")]
    PythonHooks(String),
    /// The trace file could not be created or written.
    #[error("cannot write the trace {path}")]
    Output {
        /// Trace path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// What a finished session reports.
#[derive(Debug)]
pub struct AttachReport {
    /// The trace file.
    pub trace: PathBuf,
    /// Trace size, bytes.
    pub trace_bytes: u64,
    /// Statistics written into the trace's summary.
    pub stats: SessionStats,
    /// Events written, per kind.
    pub counts: EventCounts,
    /// Events that arrived after newer ones had been written (merge window too small).
    pub late_events: u64,
    /// Command start → probes live.
    pub attach_latency: Duration,
    /// Session length.
    pub elapsed: Duration,
    /// Engine probes of the target (the first process of the tree that has them).
    pub engine_probes: EngineProbes,
    /// Processes traced during the session (the targets, their descendants, the processes they started).
    pub processes: usize,
    /// The /metrics URL scraped, if any.
    pub metrics_url: Option<String>,
    /// OTLP export statistics, when spans were exported.
    pub otel: Option<OtelStats>,
    /// What the GPU layer did (NVML counters, CUDA driver probes).
    pub gpu: GpuReport,
    /// CUDA driver calls seen and how they were shown.
    pub cuda: llmprof_trace::perfetto::sink::cuda::agg::AggStats,
    /// The first target: its pid and name.
    pub target: (u32, String),
    /// Requests the wire probe saw (and how many carried an engine request).
    pub wire: llmprof_trace::decode::wire::requests::WireStats,
    /// Stack symbolization, when stacks were sampled.
    pub symbolize: Option<crate::symbolize::SymbolizeStats>,
    /// Python processes whose frames were sampled.
    pub python_processes: usize,
}
