//! The llmprof probe ABI: the one definition of every record that crosses a boundary. One file of ~1,200 lines on purpose: every layout sits beside its size assertion and version note, and the committed eBPF object embeds this file's line numbers (moving code means rebuilding the object).
//!
//! Two boundaries use these types:
//! 1. engine → eBPF: the engine (`llmserve`) calls exported probe functions
//!    ([`PROBE_STEP`], [`PROBE_REQUEST`], [`PROBE_RANGE`]) with a pointer to a `#[repr(C)]` record
//!    ([`StepRecord`], [`RequestRecord`], [`RangeRecord`]); a uprobe at the function's leading 5-byte NOP
//!    copies the record with `bpf_probe_read_user`.
//! 2. eBPF → user space: the kernel programs write [`EventHeader`]-prefixed records into ring buffers
//!    and keep aggregates in maps ([`SyscallKey`]/[`SyscallStats`], [`ProbeCounters`], [`SockKey`]).
//!
//! This crate is `no_std`, has no dependencies (aya only behind the `user` feature, for `Pod`) and must
//! build with the eBPF toolchain. Every layout is pinned by a compile-time size assertion; any change to a
//! layout bumps [`ABI_VERSION`]. The engine exports [`ABI_VERSION`] as the dynamic symbol
//! [`ABI_VERSION_SYMBOL`] and also stamps it into every record, so an llmprof built for another version refuses
//! the engine with a clear message instead of misreading it. All timestamps are CLOCK_BOOTTIME nanoseconds.
#![no_std]

mod http;
pub mod python;
pub use http::*;
pub mod offcpu;
pub mod sample;
pub mod sched;
pub use sample::{CpuSampleEvent, DEFAULT_SAMPLE_HZ, KERNEL_STACK_MAX, USER_STACK_MAX};

/// Version of every layout in this crate. Bump on any change.
pub const ABI_VERSION: u32 = 3;

/// Name of the exported `u32` static holding the engine's [`ABI_VERSION`].
pub const ABI_VERSION_SYMBOL: &str = "llmprof_abi_version";
/// Probe called once per engine step with `*const StepRecord`.
pub const PROBE_STEP: &str = "llmprof_probe_step";
/// Probe called once per request lifecycle event with `*const RequestRecord`.
pub const PROBE_REQUEST: &str = "llmprof_probe_request";
/// Probe called for NVTX-style push/pop/mark with `*const RangeRecord`.
pub const PROBE_RANGE: &str = "llmprof_probe_range";
/// All probe symbols, in [`ProbeId`] order of the engine probes.
pub const ENGINE_PROBES: [&str; 3] = [PROBE_STEP, PROBE_REQUEST, PROBE_RANGE];
/// Engine probe: prompt or completion text of a request (`*const ContentRecord`). Attached only with
/// `--capture-content`; the engine renders the text only while it is attached (`llmprof_probes::content_attached`).
pub const PROBE_CONTENT: &str = "llmprof_probe_content";

/// The 5-byte NOP (`nopl 0x0(%rax,%rax,1)`) each probe function begins with; the uprobe sits on it, which
/// lets kernels with optimized uprobes (6.18 here) replace the int3 trap by a call.
pub const PROBE_NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];

/// Most request ids one [`StepRecord`] carries; larger batches set [`StepRecord::req_ids_truncated`].
pub const MAX_STEP_REQS: usize = 64;
/// Bytes of `x-request-id` kept (NUL padded, truncated).
pub const REQUEST_ID_LEN: usize = 48;
/// Bytes of a range domain name (NUL padded).
pub const RANGE_DOMAIN_LEN: usize = 16;
/// Bytes of a range name (NUL padded).
pub const RANGE_NAME_LEN: usize = 48;
/// Bytes of a file path captured at open (NUL terminated, truncated).
pub const PATH_LEN: usize = 256;
/// Bytes of the model name in a request record.
pub const MODEL_LEN: usize = 48;

/// What kind of work an engine step did.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Only prompt (prefill) tokens.
    Prefill = 0,
    /// Only decode tokens (one per running sequence).
    Decode = 1,
    /// Prefill chunks and decode tokens in one batch.
    Mixed = 2,
}

impl StepKind {
    /// Decodes the raw value of [`StepRecord::kind`].
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Prefill),
            1 => Some(Self::Decode),
            2 => Some(Self::Mixed),
            _ => None,
        }
    }
    /// Lower-case name used as slice name in traces.
    pub fn name(self) -> &'static str {
        match self {
            Self::Prefill => "prefill",
            Self::Decode => "decode",
            Self::Mixed => "mixed",
        }
    }
}

/// Where a step's device interval comes from.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceClock {
    /// CPU backend: the device interval is the host compute interval.
    HostCompute = 0,
    /// CUDA backend: CUDA events mapped onto BOOTTIME through a reference event.
    CudaEvents = 1,
}

/// One engine step (a forward pass over a batch). Passed to [`PROBE_STEP`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StepRecord {
    /// [`ABI_VERSION`] of the engine that wrote this record.
    pub abi_version: u32,
    /// [`StepKind`] as u32.
    pub kind: u32,
    /// Monotonic step counter of the engine (starts at 1).
    pub step_id: u64,
    /// Host start of the step (schedule decided), BOOTTIME ns.
    pub host_start_ns: u64,
    /// Host end of the step (tokens sampled), BOOTTIME ns.
    pub host_end_ns: u64,
    /// Device start, BOOTTIME ns (see [`StepRecord::device_clock`]).
    pub device_start_ns: u64,
    /// Device end, BOOTTIME ns.
    pub device_end_ns: u64,
    /// [`DeviceClock`] as u32.
    pub device_clock: u32,
    /// Sequences in the batch.
    pub num_seqs: u32,
    /// Prompt tokens computed in this step.
    pub prefill_tokens: u32,
    /// Decode tokens computed in this step.
    pub decode_tokens: u32,
    /// KV-cache blocks in use after scheduling.
    pub kv_blocks_used: u32,
    /// KV-cache blocks in the pool.
    pub kv_blocks_total: u32,
    /// Requests waiting after scheduling.
    pub num_waiting: u32,
    /// Sequences preempted while scheduling this step.
    pub num_preempted: u32,
    /// Number of valid entries in `req_ids`.
    pub num_req_ids: u32,
    /// 1 when the batch had more than [`MAX_STEP_REQS`] requests.
    pub req_ids_truncated: u32,
    /// Engine request ids served by this step.
    pub req_ids: [u64; MAX_STEP_REQS],
    /// Tokens computed for `req_ids[i]` in this step (its prompt or recompute chunk, or 1 for a decode); added in
    /// ABI version 2 so a request's share of a batched prefill is known.
    pub req_tokens: [u32; MAX_STEP_REQS],
    /// The batch size of the CUDA graph the step replayed (its sequences padded up to it); 0: the step's kernels
    /// were launched one by one (or it ran on the CPU). Added in ABI version 3.
    pub graph_batch: u32,
    /// Zero; keeps the record a multiple of 8 bytes.
    pub reserved: u32,
}

impl StepRecord {
    /// A record of this ABI version for step `step_id` serving `req_ids` (at most [`MAX_STEP_REQS`] kept, the rest
    /// flagged as truncated; `num_seqs` is the full count). Every other field is zero: set what the step knows.
    pub fn new(kind: StepKind, step_id: u64, req_ids: &[u64]) -> Self {
        let n = req_ids.len().min(MAX_STEP_REQS);
        let mut ids = [0u64; MAX_STEP_REQS];
        ids[..n].copy_from_slice(&req_ids[..n]);
        Self {
            abi_version: ABI_VERSION,
            kind: kind as u32,
            step_id,
            host_start_ns: 0,
            host_end_ns: 0,
            device_start_ns: 0,
            device_end_ns: 0,
            device_clock: DeviceClock::HostCompute as u32,
            num_seqs: req_ids.len() as u32,
            prefill_tokens: 0,
            decode_tokens: 0,
            kv_blocks_used: 0,
            kv_blocks_total: 0,
            num_waiting: 0,
            num_preempted: 0,
            num_req_ids: n as u32,
            req_ids_truncated: u32::from(req_ids.len() > MAX_STEP_REQS),
            req_ids: ids,
            req_tokens: [0; MAX_STEP_REQS],
            graph_batch: 0,
            reserved: 0,
        }
    }

    /// Sets the tokens each request of [`StepRecord::req_ids`] computed in this step, in the same order
    /// (entries past [`MAX_STEP_REQS`] are dropped like their ids).
    pub fn with_req_tokens(mut self, tokens: impl IntoIterator<Item = u32>) -> Self {
        for (slot, t) in self.req_tokens.iter_mut().zip(tokens) {
            *slot = t;
        }
        self
    }

    /// Tokens request `req` computed in this step, when it is among the recorded ids.
    pub fn tokens_of(&self, req: u64) -> Option<u32> {
        let n = (self.num_req_ids as usize).min(MAX_STEP_REQS);
        self.req_ids[..n]
            .iter()
            .position(|&r| r == req)
            .map(|i| self.req_tokens[i])
    }
}

/// A request lifecycle transition.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestEventKind {
    /// Accepted by the HTTP layer and queued (carries trace context, prompt size, sampling parameters).
    Arrived = 0,
    /// First scheduled into a batch (queue time ends).
    Scheduled = 1,
    /// First output token sampled (TTFT).
    FirstToken = 2,
    /// Preempted (blocks freed; will be recomputed).
    Preempted = 3,
    /// Finished; see [`RequestRecord::finish_reason`].
    Finished = 4,
}

impl RequestEventKind {
    /// Decodes the raw value of [`RequestRecord::kind`].
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Arrived),
            1 => Some(Self::Scheduled),
            2 => Some(Self::FirstToken),
            3 => Some(Self::Preempted),
            4 => Some(Self::Finished),
            _ => None,
        }
    }
}

/// Why a request finished.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// Not finished (other event kinds).
    None = 0,
    /// EOS token or a stop string.
    Stop = 1,
    /// `max_tokens` or the context length reached.
    Length = 2,
    /// Client went away.
    Abort = 3,
    /// Engine-side error.
    Error = 4,
}

impl FinishReason {
    /// Decodes the raw value of [`RequestRecord::finish_reason`].
    pub fn from_raw(v: u32) -> Self {
        match v {
            1 => Self::Stop,
            2 => Self::Length,
            3 => Self::Abort,
            4 => Self::Error,
            _ => Self::None,
        }
    }
    /// The OpenAI / vLLM spelling (`stop`, `length`, `abort`, `error`).
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "",
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
            Self::Error => "error",
        }
    }
}

/// One request lifecycle event. Passed to [`PROBE_REQUEST`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RequestRecord {
    /// [`ABI_VERSION`] of the engine that wrote this record.
    pub abi_version: u32,
    /// [`RequestEventKind`] as u32.
    pub kind: u32,
    /// Engine request id (unique per engine process).
    pub req_id: u64,
    /// When the transition happened, BOOTTIME ns.
    pub ts_ns: u64,
    /// W3C trace id from `traceparent` (all zero when absent).
    pub trace_id: [u8; 16],
    /// W3C parent span id from `traceparent`.
    pub parent_span_id: [u8; 8],
    /// 1 when `trace_id`/`parent_span_id` are valid.
    pub has_trace_context: u8,
    /// W3C trace flags.
    pub trace_flags: u8,
    /// 1 for `/v1/chat/completions`, 0 for `/v1/completions`.
    pub is_chat: u8,
    /// Reserved, zero.
    pub _pad: u8,
    /// [`FinishReason`] as u32 (Finished only).
    pub finish_reason: u32,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens generated so far.
    pub output_tokens: u32,
    /// `max_tokens` requested.
    pub max_tokens: u32,
    /// Sampling temperature.
    pub temperature: f32,
    /// Nucleus sampling `top_p`.
    pub top_p: f32,
    /// Times preempted so far.
    pub num_preemptions: u32,
    /// `x-request-id` header, NUL padded.
    pub x_request_id: [u8; REQUEST_ID_LEN],
    /// Served model name, NUL padded.
    pub model: [u8; MODEL_LEN],
}

impl RequestRecord {
    /// A record of this ABI version for a `kind` transition of request `req_id` at `ts_ns`. Every other field is
    /// zero (no trace context, no tokens, empty strings): set what the transition carries.
    pub fn new(kind: RequestEventKind, req_id: u64, ts_ns: u64) -> Self {
        Self {
            abi_version: ABI_VERSION,
            kind: kind as u32,
            req_id,
            ts_ns,
            trace_id: [0; 16],
            parent_span_id: [0; 8],
            has_trace_context: 0,
            trace_flags: 0,
            is_chat: 0,
            _pad: 0,
            finish_reason: FinishReason::None as u32,
            prompt_tokens: 0,
            output_tokens: 0,
            max_tokens: 0,
            temperature: 0.0,
            top_p: 0.0,
            num_preemptions: 0,
            x_request_id: [0; REQUEST_ID_LEN],
            model: [0; MODEL_LEN],
        }
    }
}

/// NVTX-style range operation.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeOp {
    /// Open a range on the calling thread.
    Push = 0,
    /// Close the innermost open range on the calling thread.
    Pop = 1,
    /// An instant marker.
    Mark = 2,
}

impl RangeOp {
    /// Decodes the raw value of [`RangeRecord::op`].
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Push),
            1 => Some(Self::Pop),
            2 => Some(Self::Mark),
            _ => None,
        }
    }
}

/// An NVTX-style named range event on the calling thread. Passed to [`PROBE_RANGE`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RangeRecord {
    /// [`ABI_VERSION`] of the engine that wrote this record.
    pub abi_version: u32,
    /// [`RangeOp`] as u32.
    pub op: u32,
    /// BOOTTIME ns.
    pub ts_ns: u64,
    /// Engine step this range belongs to (0 if none).
    pub step_id: u64,
    /// Domain (e.g. `llmserve`), NUL padded.
    pub domain: [u8; RANGE_DOMAIN_LEN],
    /// Range name (e.g. `forward`), NUL padded.
    pub name: [u8; RANGE_NAME_LEN],
}

impl RangeRecord {
    /// A record of this ABI version: `op` on range `domain::name` at `ts_ns`, within step `step_id` (0: none).
    pub fn new(op: RangeOp, ts_ns: u64, step_id: u64, domain: &str, name: &str) -> Self {
        Self {
            abi_version: ABI_VERSION,
            op: op as u32,
            ts_ns,
            step_id,
            domain: fill_str(domain),
            name: fill_str(name),
        }
    }
}

/// Bytes of text one [`ContentEvent`] carries; longer texts are cut (and flagged).
pub const CONTENT_MAX: usize = 4096;

/// Which text a [`ContentRecord`] points to.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentKind {
    /// The prompt as the model saw it (the rendered chat template for chat requests).
    Prompt = 0,
    /// The completion text returned to the client.
    Completion = 1,
}

impl ContentKind {
    /// From the raw value of [`ContentRecord::kind`].
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Prompt),
            1 => Some(Self::Completion),
            _ => None,
        }
    }
}

/// A request's text, passed by pointer to [`PROBE_CONTENT`]; the eBPF program copies up to [`CONTENT_MAX`] bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ContentRecord {
    /// [`ABI_VERSION`].
    pub abi_version: u32,
    /// [`ContentKind`] as u32.
    pub kind: u32,
    /// Engine request id.
    pub req_id: u64,
    /// UTF-8 text in the engine's memory (valid for the duration of the call).
    pub ptr: u64,
    /// Its length in bytes.
    pub len: u64,
}

impl ContentRecord {
    /// A record pointing at `text` (which must outlive the probe call).
    pub fn new(kind: ContentKind, req_id: u64, text: &str) -> Self {
        Self {
            abi_version: ABI_VERSION,
            kind: kind as u32,
            req_id,
            ptr: text.as_ptr() as u64,
            len: text.len() as u64,
        }
    }
}

/// Kinds of records the eBPF programs write into the ring buffer. Each record starts with an [`EventHeader`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// [`StepEvent`].
    Step = 1,
    /// [`RequestEvent`].
    Request = 2,
    /// [`RangeEvent`].
    Range = 3,
    /// [`SlowSyscallEvent`].
    SlowSyscall = 4,
    /// [`FileOpenEvent`].
    FileOpen = 5,
    /// [`FileIoEvent`].
    FileIo = 6,
    /// [`ConnectEvent`].
    Connect = 7,
    /// [`ProcessExitEvent`].
    ProcessExit = 8,
    /// [`ContentEvent`].
    Content = 10,
    /// [`CudaCallEvent`].
    CudaCall = 9,
    /// [`cudacount::CudaCountEvent`]: a window of a thread's counted (launch-type) CUDA calls.
    CudaCount = 13,
    /// [`python::PyStackEvent`].
    PyStack = 35,
    /// [`ProcessStartEvent`]: a traced process started a new process (not a thread).
    ProcessStart = 11,
    /// [`ProcessExecEvent`]: a traced process executed a new program.
    ProcessExec = 12,
    /// [`HttpEvent`] (the wire probe's response side, close, reset, TLS).
    Http = 20,
    /// [`HttpHeadEvent`] (a request's head bytes).
    HttpHead = 21,
    /// [`sched::SchedSwitchEvent`].
    SchedSwitch = 40,
    /// [`sched::SchedWakeEvent`].
    SchedWake = 41,
    /// [`CpuSampleEvent`] (stack sampler; kinds 30–34 belong to it).
    CpuSample = 30,
    /// [`CpuSampleEvent`] layout: the stack of a traced thread blocking at a context switch ([`offcpu`]).
    OffCpuStack = 42,
    /// [`GpuChunkEvent`]: a chunk of GPU activity handed over by the injected CUPTI helper ([`gpu`]).
    GpuChunk = 50,
}

impl EventKind {
    /// Decodes [`EventHeader::kind`].
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::Step),
            2 => Some(Self::Request),
            3 => Some(Self::Range),
            4 => Some(Self::SlowSyscall),
            5 => Some(Self::FileOpen),
            6 => Some(Self::FileIo),
            7 => Some(Self::Connect),
            8 => Some(Self::ProcessExit),
            10 => Some(Self::Content),
            9 => Some(Self::CudaCall),
            13 => Some(Self::CudaCount),
            35 => Some(Self::PyStack),
            11 => Some(Self::ProcessStart),
            12 => Some(Self::ProcessExec),
            20 => Some(Self::Http),
            21 => Some(Self::HttpHead),
            40 => Some(Self::SchedSwitch),
            41 => Some(Self::SchedWake),
            30 => Some(Self::CpuSample),
            42 => Some(Self::OffCpuStack),
            50 => Some(Self::GpuChunk),
            _ => None,
        }
    }
}

/// Common prefix of every ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EventHeader {
    /// [`EventKind`] as u32.
    pub kind: u32,
    /// CPU the event was recorded on.
    pub cpu: u32,
    /// BOOTTIME ns when the eBPF program ran (for syscalls: the syscall's entry).
    pub ts_ns: u64,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
}

/// Engine step probe hit.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StepEvent {
    /// Header ([`EventKind::Step`]).
    pub hdr: EventHeader,
    /// The engine's record, copied verbatim.
    pub rec: StepRecord,
}

/// Engine request probe hit.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RequestEvent {
    /// Header ([`EventKind::Request`]).
    pub hdr: EventHeader,
    /// The engine's record, copied verbatim.
    pub rec: RequestRecord,
}

/// Engine range probe hit.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RangeEvent {
    /// Header ([`EventKind::Range`]).
    pub hdr: EventHeader,
    /// The engine's record, copied verbatim.
    pub rec: RangeRecord,
}

/// A syscall slower than the configured threshold.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SlowSyscallEvent {
    /// Header ([`EventKind::SlowSyscall`]); `ts_ns` is the entry time.
    pub hdr: EventHeader,
    /// Syscall number (x86-64).
    pub nr: u64,
    /// Return value.
    pub ret: i64,
    /// Duration, ns.
    pub dur_ns: u64,
}

/// An `openat` of a path that matched the model-file patterns.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FileOpenEvent {
    /// Header ([`EventKind::FileOpen`]); `ts_ns` is the entry time.
    pub hdr: EventHeader,
    /// Returned fd (negative errno on failure).
    pub ret: i64,
    /// Duration of the open, ns.
    pub dur_ns: u64,
    /// Open flags.
    pub flags: u32,
    /// Reserved, zero.
    pub _pad: u32,
    /// Path as passed to openat, NUL terminated.
    pub path: [u8; PATH_LEN],
}

/// I/O operation on a tracked model-file fd.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileOp {
    /// read(2).
    Read = 0,
    /// pread64(2).
    Pread = 1,
    /// readv(2).
    Readv = 2,
    /// mmap(2) of the fd.
    Mmap = 3,
    /// close(2).
    Close = 4,
}

impl FileOp {
    /// Decodes [`FileIoEvent::op`].
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Read),
            1 => Some(Self::Pread),
            2 => Some(Self::Readv),
            3 => Some(Self::Mmap),
            4 => Some(Self::Close),
            _ => None,
        }
    }
    /// Name used in traces.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Pread => "pread64",
            Self::Readv => "readv",
            Self::Mmap => "mmap",
            Self::Close => "close",
        }
    }
}

/// I/O on a tracked model-file fd.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FileIoEvent {
    /// Header ([`EventKind::FileIo`]); `ts_ns` is the entry time.
    pub hdr: EventHeader,
    /// [`FileOp`] as u32.
    pub op: u32,
    /// The fd.
    pub fd: i32,
    /// Return value: bytes for reads, address for mmap, 0/-errno for close.
    pub ret: i64,
    /// Bytes requested (reads: count; mmap: length).
    pub len: u64,
    /// Duration, ns.
    pub dur_ns: u64,
}

/// A connect(2) attempt.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ConnectEvent {
    /// Header ([`EventKind::Connect`]); `ts_ns` is the entry time.
    pub hdr: EventHeader,
    /// Return value (0, or -errno such as -EINPROGRESS / -ECONNREFUSED).
    pub ret: i64,
    /// Duration, ns.
    pub dur_ns: u64,
    /// Socket fd.
    pub fd: i32,
    /// AF_INET (2) or AF_INET6 (10).
    pub family: u16,
    /// Destination port, host byte order.
    pub port: u16,
    /// Destination address: IPv4 in the first 4 bytes, or IPv6.
    pub addr: [u8; 16],
    /// 1 when the destination is inside an allowed CIDR. The kernel writes 0; llmprof decides it at
    /// decode time against `--egress-allow` (no kernel state to keep in sync).
    pub allowed: u8,
    /// Reserved, zero.
    pub _pad: [u8; 7],
}

/// A traced process exited (sched_process_exit of its main thread).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessExitEvent {
    /// Header ([`EventKind::ProcessExit`]).
    pub hdr: EventHeader,
    /// Exit code as the kernel reports it.
    pub exit_code: i64,
}

/// Bytes of a process's `comm` (TASK_COMM_LEN, include/linux/sched.h).
pub const COMM_LEN: usize = 16;

/// Value flag of the kernel's `TRACED` map (key: tgid): the process is traced. Every entry has it.
pub const TRACED_SELF: u8 = 1;
/// Value flag of the kernel's `TRACED` map: new processes this one starts are traced too, with the same
/// flags (so a whole tree follows); without it (`--no-children`) only the process itself is traced.
pub const TRACED_CHILDREN: u8 = 2;

/// A traced process (with [`TRACED_CHILDREN`]) started a new process, which the kernel put in the `TRACED`
/// map before it ran (task:task_newtask, run by the parent; threads are not processes and not reported).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessStartEvent {
    /// Header ([`EventKind::ProcessStart`]); `pid` and `tid` are the new process's.
    pub hdr: EventHeader,
    /// The parent's tgid.
    pub ppid: u32,
    /// The parent's thread that called fork/clone.
    pub parent_tid: u32,
    /// The clone flags (`CLONE_*`, include/uapi/linux/sched.h).
    pub clone_flags: u64,
    /// The new process's `comm` (its parent's until it executes a program), NUL padded.
    pub comm: [u8; COMM_LEN],
}

/// A traced process executed a program (sched:sched_process_exec): its image, hence its probes, changed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessExecEvent {
    /// Header ([`EventKind::ProcessExec`]).
    pub hdr: EventHeader,
    /// The executed file as passed to execve, NUL terminated (truncated).
    pub filename: [u8; PATH_LEN],
}

/// A request's text (only written when `--capture-content` attached the content uprobe).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ContentEvent {
    /// Header ([`EventKind::Content`]).
    pub hdr: EventHeader,
    /// The engine's record (its `ptr` is the engine's address, meaningless here).
    pub rec: ContentRecord,
    /// Bytes of `data` copied: `min(rec.len, CONTENT_MAX)`.
    pub copied: u32,
    /// Padding.
    pub _pad: u32,
    /// The first `copied` bytes of the text (a cut may split a UTF-8 character).
    pub data: [u8; CONTENT_MAX],
}

/// A chunk of GPU activity ([`gpu::GpuChunkHeader`] + records) copied by the uprobe at [`gpu::GPU_HANDOFF`]:
/// one record per handed-over chunk. Its records are read by llmprof's one reader of the [`gpu`] layouts.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GpuChunkEvent {
    /// Header ([`EventKind::GpuChunk`]); `ts_ns` is when the helper handed the chunk over.
    pub hdr: EventHeader,
    /// The `len` argument the helper passed.
    pub len: u64,
    /// Bytes of `data` copied: `len` (a longer chunk is not copied: counted as a drop).
    pub copied: u32,
    /// Padding.
    pub _pad: u32,
    /// The chunk.
    pub data: [u8; gpu::GPU_CHUNK_MAX],
}

/// A CUDA driver API call of a traced thread, recorded at its return (entry and return uprobes in libcuda,
/// paired per thread in the kernel). The times are the host thread's time inside the driver call (enqueue,
/// or waiting for the GPU in the synchronize calls), not kernel execution on the GPU.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CudaCallEvent {
    /// Header ([`EventKind::CudaCall`]); `ts_ns` is the call's entry time.
    pub hdr: EventHeader,
    /// [`CudaFunc`] as u32.
    pub func: u32,
    /// [`CudaVariant`] as u32: which exported symbol of the function was called.
    pub variant: u32,
    /// Time in the call (entry to return), ns.
    pub dur_ns: u64,
    /// The argument [`CudaFunc::arg`] names (bytes, device pointer or stream), 0 when it has none.
    pub arg: u64,
    /// The returned `CUresult` (0 = CUDA_SUCCESS).
    pub result: u32,
    /// Reserved, zero.
    pub _pad: u32,
}

/// CUDA driver API functions llmprof attaches to in libcuda (append only: the value is in records).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CudaFunc {
    /// `cuLaunchKernel`.
    LaunchKernel = 0,
    /// `cuLaunchKernelEx`.
    LaunchKernelEx = 1,
    /// `cuGraphLaunch`.
    GraphLaunch = 2,
    /// `cuMemcpy`.
    Memcpy = 3,
    /// `cuMemcpyAsync`.
    MemcpyAsync = 4,
    /// `cuMemcpyHtoD`.
    MemcpyHtoD = 5,
    /// `cuMemcpyHtoDAsync`.
    MemcpyHtoDAsync = 6,
    /// `cuMemcpyDtoH`.
    MemcpyDtoH = 7,
    /// `cuMemcpyDtoHAsync`.
    MemcpyDtoHAsync = 8,
    /// `cuMemcpyDtoD`.
    MemcpyDtoD = 9,
    /// `cuMemcpyDtoDAsync`.
    MemcpyDtoDAsync = 10,
    /// `cuMemcpyPeer`.
    MemcpyPeer = 11,
    /// `cuMemcpyPeerAsync`.
    MemcpyPeerAsync = 12,
    /// `cuMemAlloc`.
    MemAlloc = 13,
    /// `cuMemFree`.
    MemFree = 14,
    /// `cuStreamSynchronize`.
    StreamSynchronize = 15,
    /// `cuCtxSynchronize`.
    CtxSynchronize = 16,
    /// `cuEventSynchronize`.
    EventSynchronize = 17,
}

/// What the recorded argument of a [`CudaFunc`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaArg {
    /// A byte count (`ByteCount`, `bytesize`).
    Bytes,
    /// A device pointer (`cuMemFree`'s `dptr`).
    DevicePtr,
    /// A stream handle (`cuStreamSynchronize`'s `hStream`).
    Stream,
}

/// How llmprof shows a [`CudaFunc`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaClass {
    /// Kernel and graph launches: aggregated (per engine step, or per time window).
    Launch,
    /// Copies.
    Memcpy,
    /// Allocation and free.
    Alloc,
    /// Synchronize calls, where the host waits for the GPU: always shown one by one.
    Sync,
}

impl CudaFunc {
    /// Every function, in value order.
    pub const ALL: [CudaFunc; 18] = [
        Self::LaunchKernel,
        Self::LaunchKernelEx,
        Self::GraphLaunch,
        Self::Memcpy,
        Self::MemcpyAsync,
        Self::MemcpyHtoD,
        Self::MemcpyHtoDAsync,
        Self::MemcpyDtoH,
        Self::MemcpyDtoHAsync,
        Self::MemcpyDtoD,
        Self::MemcpyDtoDAsync,
        Self::MemcpyPeer,
        Self::MemcpyPeerAsync,
        Self::MemAlloc,
        Self::MemFree,
        Self::StreamSynchronize,
        Self::CtxSynchronize,
        Self::EventSynchronize,
    ];

    /// Decodes [`CudaCallEvent::func`].
    pub fn from_raw(v: u32) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }

    /// The driver API name without version suffix (`cuMemcpyHtoD`).
    pub fn name(self) -> &'static str {
        match self {
            Self::LaunchKernel => "cuLaunchKernel",
            Self::LaunchKernelEx => "cuLaunchKernelEx",
            Self::GraphLaunch => "cuGraphLaunch",
            Self::Memcpy => "cuMemcpy",
            Self::MemcpyAsync => "cuMemcpyAsync",
            Self::MemcpyHtoD => "cuMemcpyHtoD",
            Self::MemcpyHtoDAsync => "cuMemcpyHtoDAsync",
            Self::MemcpyDtoH => "cuMemcpyDtoH",
            Self::MemcpyDtoHAsync => "cuMemcpyDtoHAsync",
            Self::MemcpyDtoD => "cuMemcpyDtoD",
            Self::MemcpyDtoDAsync => "cuMemcpyDtoDAsync",
            Self::MemcpyPeer => "cuMemcpyPeer",
            Self::MemcpyPeerAsync => "cuMemcpyPeerAsync",
            Self::MemAlloc => "cuMemAlloc",
            Self::MemFree => "cuMemFree",
            Self::StreamSynchronize => "cuStreamSynchronize",
            Self::CtxSynchronize => "cuCtxSynchronize",
            Self::EventSynchronize => "cuEventSynchronize",
        }
    }

    /// The argument recorded at entry: its index in the C signature (x86-64 SysV: register) and meaning.
    pub fn arg(self) -> Option<(u8, CudaArg)> {
        match self {
            Self::Memcpy
            | Self::MemcpyAsync
            | Self::MemcpyHtoD
            | Self::MemcpyHtoDAsync
            | Self::MemcpyDtoH
            | Self::MemcpyDtoHAsync
            | Self::MemcpyDtoD
            | Self::MemcpyDtoDAsync => Some((2, CudaArg::Bytes)),
            // cuMemcpyPeer(dst, dstCtx, src, srcCtx, ByteCount[, hStream])
            Self::MemcpyPeer | Self::MemcpyPeerAsync => Some((4, CudaArg::Bytes)),
            // cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
            Self::MemAlloc => Some((1, CudaArg::Bytes)),
            Self::MemFree => Some((0, CudaArg::DevicePtr)),
            Self::StreamSynchronize => Some((0, CudaArg::Stream)),
            _ => None,
        }
    }

    /// How the call is shown.
    pub fn class(self) -> CudaClass {
        match self {
            Self::LaunchKernel | Self::LaunchKernelEx | Self::GraphLaunch => CudaClass::Launch,
            Self::MemAlloc | Self::MemFree => CudaClass::Alloc,
            Self::StreamSynchronize | Self::CtxSynchronize | Self::EventSynchronize => CudaClass::Sync,
            _ => CudaClass::Memcpy,
        }
    }

    /// Attach cookie of this function's uprobes: `func | variant << 8 | arg index << 16` (index
    /// [`CUDA_NO_ARG`] when the function has no recorded argument). The eBPF programs read the argument
    /// index from it and copy `func` and `variant` into the [`CudaCallEvent`].
    pub fn cookie(self, variant: CudaVariant) -> u64 {
        let idx = self.arg().map(|(i, _)| u64::from(i)).unwrap_or(CUDA_NO_ARG);
        self as u64 | (variant as u64) << 8 | idx << 16
    }
}

/// Argument index in a CUDA uprobe cookie meaning "record no argument".
pub const CUDA_NO_ARG: u64 = 0xff;

/// Which exported symbol of a [`CudaFunc`]: libcuda exports several per function (the `_v2` ABI revisions and
/// the per-thread default stream `_ptds`/`_ptsz` entry points), all attached.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CudaVariant {
    /// The plain name.
    Plain = 0,
    /// `_v2`.
    V2 = 1,
    /// `_ptds` (per-thread default stream, synchronous calls).
    Ptds = 2,
    /// `_ptsz` (per-thread default stream, asynchronous calls).
    Ptsz = 3,
    /// `_v2_ptds`.
    V2Ptds = 4,
    /// `_v2_ptsz`.
    V2Ptsz = 5,
    /// An entry point `cuGetProcAddress` hands out that no exported symbol names (how cudart, and so
    /// PyTorch, reaches the driver).
    ProcAddress = 6,
}

impl CudaVariant {
    /// Every variant, in value order.
    pub const ALL: [CudaVariant; 7] = [
        Self::Plain,
        Self::V2,
        Self::Ptds,
        Self::Ptsz,
        Self::V2Ptds,
        Self::V2Ptsz,
        Self::ProcAddress,
    ];
    /// The variants that are exported symbol names (all but [`CudaVariant::ProcAddress`]).
    pub const SYMBOLS: [CudaVariant; 6] = [
        Self::Plain,
        Self::V2,
        Self::Ptds,
        Self::Ptsz,
        Self::V2Ptds,
        Self::V2Ptsz,
    ];
    /// Decodes [`CudaCallEvent::variant`].
    pub fn from_raw(v: u32) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }
    /// The symbol suffix (`""`, `"_v2"`, `"_ptds"`, ...; for [`CudaVariant::ProcAddress`] a note).
    pub fn suffix(self) -> &'static str {
        match self {
            Self::Plain => "",
            Self::V2 => "_v2",
            Self::Ptds => "_ptds",
            Self::Ptsz => "_ptsz",
            Self::V2Ptds => "_v2_ptds",
            Self::V2Ptsz => "_v2_ptsz",
            Self::ProcAddress => " (via cuGetProcAddress)",
        }
    }
}

/// Key of the in-kernel syscall aggregate map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SyscallKey {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Syscall number.
    pub nr: u64,
}

/// Log2 latency buckets: bucket i counts calls with duration in [2^i, 2^(i+1)) ns.
pub const LAT_BUCKETS: usize = 32;

/// Value of the in-kernel syscall aggregate map.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SyscallStats {
    /// Completed calls.
    pub count: u64,
    /// Total time, ns.
    pub total_ns: u64,
    /// Log2 latency histogram.
    pub hist: [u64; LAT_BUCKETS],
}

/// `SyscallSlot::nr` of a thread that is not inside a traced syscall.
pub const NO_SYSCALL: u64 = u64::MAX;

/// Entries of the kernel's `SYSSLOTS` array: the syscall slot of a thread whose tid is below this is the
/// array entry at its tid (no hash lookup); threads with larger tids (`kernel.pid_max` above it) use the
/// `INFLIGHT` hash.
pub const SYSCALL_SLOTS: u32 = 1 << 16;

/// Value of the kernel's per-thread syscall slot (`SYSSLOTS[tid]`, or `INFLIGHT` keyed by tid for tids
/// from [`SYSCALL_SLOTS`] on): the syscall the thread is in, written in place at every traced entry and
/// marked consumed ([`NO_SYSCALL`]) at exit. `args` is filled only for the syscalls whose exit needs them
/// (model files, egress, exit status). An array entry belongs to a traced thread only while its `tid`
/// field equals its index (0: free).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SyscallSlot {
    /// Entry time, CLOCK_BOOTTIME ns.
    pub ts_ns: u64,
    /// Syscall number, or [`NO_SYSCALL`].
    pub nr: u64,
    /// The six syscall arguments (only for the numbers that need them; stale otherwise).
    pub args: [u64; 6],
    /// The traced thread the slot belongs to (0: free array entry).
    pub tid: u32,
    /// Zero.
    pub pad: u32,
}

/// Key of the per-socket sent-bytes map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SockKey {
    /// Process id.
    pub pid: u32,
    /// Socket fd.
    pub fd: i32,
}

/// Identifies an eBPF program for the per-probe counters (index into the counters array).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeId {
    /// Engine step uprobe.
    Step = 0,
    /// Engine request uprobe.
    Request = 1,
    /// Engine range uprobe.
    Range = 2,
    /// raw_syscalls:sys_enter/sys_exit.
    Syscalls = 3,
    /// Model-file opens.
    FileOpen = 4,
    /// Model-file read/pread64/readv/mmap/close.
    FileIo = 5,
    /// connect.
    Connect = 6,
    /// sendto/sendmsg/write on sockets.
    Send = 7,
    /// sched_process_exit.
    ProcessExit = 8,
    /// Engine content uprobe (only with `--capture-content`).
    Content = 10,
    /// CUDA driver API entry/return uprobes in libcuda.
    Cuda = 9,
    /// Process-tree tracepoints (task_newtask, sched_process_exec): new processes of a traced tree.
    ProcTree = 11,
    /// HTTP/1.1 wire probe (reads and writes on followed connections; hits = requests + SSE writes).
    Http = 12,
    /// On-CPU stack sampler (perf_event program on the software CPU clock).
    CpuSample = 13,
    /// Thread states: sched_switch / sched_waking / sched_wakeup_new of traced threads (and the
    /// task_newtask program that keeps the thread map).
    Sched = 14,
    /// Python stack samples (perf_event software CPU clock, `llmprof_pysample`).
    PyStack = 15,
}

/// Number of [`ProbeId`] values (size of the counters array).
pub const NUM_PROBES: usize = 16;

/// Names of the probes, indexed by [`ProbeId`].
pub const PROBE_NAMES: [&str; NUM_PROBES] = [
    "engine_step",
    "engine_request",
    "engine_range",
    "syscalls",
    "file_open",
    "file_io",
    "connect",
    "send",
    "process_exit",
    "cuda",
    "engine_content",
    "proc_tree",
    "http",
    "cpu_sample",
    "sched",
    "py_stack",
];

/// Per-probe counters (a per-CPU array indexed by [`ProbeId`]; user space sums the CPUs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProbeCounters {
    /// Times the program ran for a traced process.
    pub hits: u64,
    /// Records written to the ring buffer.
    pub emitted: u64,
    /// Records lost because the ring buffer was full (or a user read failed).
    pub dropped: u64,
}

/// Read-only configuration of the eBPF programs (set through globals at load time).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Syscalls at least this long (ns) are sent individually.
    pub slow_syscall_ns: u64,
    /// Threads whose tid is below this (at most [`SYSCALL_SLOTS`]) keep their syscall slot in the
    /// `SYSSLOTS` array, the others in the `INFLIGHT` hash; [`SYSCALL_SLOTS`] except in tests of the hash.
    pub slot_tids: u32,
    /// llmprof's own process: every program refuses it (its syscalls, thread states, samples, connections,
    /// probe hits and the processes it starts), whatever the `TRACED` map or a thread's syscall slot says,
    /// except while [`Knob::SelfTraced`] is set (the start-up calibration, which times llmprof traced).
    pub self_tgid: u32,
}

/// Runtime knobs of the eBPF programs: entries of the `KNOBS` array map (u64 each), written by user space
/// while attached (the overhead budget, `profiler-user/src/budget.rs`). Every knob's zero value means "full
/// tracing", so a freshly created map changes nothing. Append new knobs; never renumber.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knob {
    /// Non-zero: individual slow-syscall records are not sent (the kernel aggregates continue).
    SyscallEventsOff = 0,
    /// N > 1: only ranges whose `step_id % N == 0` are sent (push and pop of one range share their step,
    /// so pairs stay whole); 0 or 1: all ranges.
    RangeSampleEvery = 1,
    /// Non-zero: the wire probe sends no per-write SSE records after a response's first content event (TTFT,
    /// response end and request counts stay; inter-token gaps are lost).
    HttpSseOff = 2,
    /// Non-zero: the thread-state programs (sched_switch, sched_waking, sched_wakeup_new) write nothing
    /// (the `--overhead-budget` step "stop thread states"; the thread map is still kept).
    ThreadStatesOff = 4,
    /// Non-zero: `llmprof_pysample` writes no Python stack samples (hits still counted).
    PySamplesOff = 5,
    /// N > 1: the stack sampler keeps one sample in N per CPU (the budget's "halve the sample rate" step
    /// writes 2, then more); 0 or 1: every sample. [`u64::MAX`]: no sample is taken (sampling stopped).
    SampleEvery = 3,
    /// Non-zero: the `sched_switch` program takes no off-CPU stacks ([`offcpu`]); set when stack sampling is
    /// off or stopped by the budget. [`offcpu::OFFCPU_UNBOUNDED`]: every stack, without the per-CPU rate
    /// bound (the start-up calibration only).
    OffCpuStacksOff = 6,
    /// Non-zero: every connection a traced process accepts is followed provisionally, whatever its listening
    /// socket (a worker forked or spawned after attach, a unix socket behind a proxy): its first bytes decide
    /// — an HTTP/1.x request line is followed, TLS and HTTP/2 are reported, anything else is dropped without a
    /// record. Zero (`--http-port`): only the listening sockets user space wrote into `HTTP_LISTEN`.
    HttpAcceptAll = 7,
    /// Non-zero: llmprof's own process ([`Config::self_tgid`]) may be traced — set only while the start-up
    /// calibration times llmprof traced; zero (the default): the programs refuse it.
    SelfTraced = 8,
}

/// Entries of the `KNOBS` map (room for knobs appended later).
pub const NUM_KNOBS: usize = 16;

/// Most model-file path patterns the kernel matches (entries of the `PATTERNS` array map).
pub const MAX_PATTERNS: usize = 8;
/// Bytes of one model-file path pattern (without its `*`).
pub const PATTERN_LEN: usize = 32;

/// How a [`FilePattern`] matches a path.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatternKind {
    /// Unused slot.
    Unused = 0,
    /// The path ends with the bytes (`*.gguf`, or a pattern without `*`).
    Suffix = 1,
    /// The path starts with the bytes (`/models/*`).
    Prefix = 2,
}

/// One model-file path pattern, as user space writes it into the kernel's pattern map.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FilePattern {
    /// [`PatternKind`] as u32.
    pub kind: u32,
    /// Valid bytes in `bytes` (1..=[`PATTERN_LEN`]).
    pub len: u32,
    /// The literal part of the pattern.
    pub bytes: [u8; PATTERN_LEN],
}

const _: () = {
    assert!(core::mem::size_of::<StepRecord>() == 96 + 12 * MAX_STEP_REQS);
    assert!(core::mem::size_of::<RequestRecord>() == 80 + REQUEST_ID_LEN + MODEL_LEN);
    assert!(core::mem::size_of::<RangeRecord>() == 24 + RANGE_DOMAIN_LEN + RANGE_NAME_LEN);
    assert!(core::mem::size_of::<EventHeader>() == 24);
    assert!(core::mem::size_of::<SlowSyscallEvent>() == 48);
    assert!(core::mem::size_of::<FileOpenEvent>() == 48 + PATH_LEN);
    assert!(core::mem::size_of::<FileIoEvent>() == 56);
    assert!(core::mem::size_of::<ConnectEvent>() == 72);
    assert!(core::mem::size_of::<ProcessExitEvent>() == 32);
    assert!(core::mem::size_of::<ProcessStartEvent>() == 40 + COMM_LEN);
    assert!(core::mem::size_of::<ProcessExecEvent>() == 24 + PATH_LEN);
    assert!(core::mem::size_of::<ContentRecord>() == 32);
    assert!(core::mem::size_of::<ContentEvent>() == 64 + CONTENT_MAX);
    assert!(core::mem::size_of::<GpuChunkEvent>() == 40 + gpu::GPU_CHUNK_MAX);
    assert!(core::mem::size_of::<CudaCallEvent>() == 56);
    assert!(core::mem::size_of::<SyscallKey>() == 16);
    assert!(core::mem::size_of::<SyscallStats>() == 16 + 8 * LAT_BUCKETS);
    assert!(core::mem::size_of::<SyscallSlot>() == 72);
    assert!(core::mem::size_of::<ProbeCounters>() == 24);
    assert!(core::mem::size_of::<FilePattern>() == 8 + PATTERN_LEN);
    assert!(core::mem::size_of::<HttpEvent>() == 64);
    assert!(core::mem::size_of::<HttpHeadEvent>() == 64 + HTTP_HEAD_MAX);
    assert!(core::mem::size_of::<HttpConnState>() == 72);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all these types are #[repr(C)], Copy, contain only integers/arrays of integers/floats,
    // and every bit pattern is valid for them (enums are stored as raw u32, never as Rust enums).
    unsafe impl aya::Pod for super::SyscallKey {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::SyscallStats {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::SyscallSlot {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::SockKey {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::ProbeCounters {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::Config {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::FilePattern {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::HttpConnState {}
}

/// Copies `s` into a NUL-padded fixed array, truncating at a UTF-8 boundary.
pub fn fill_str<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let mut n = s.len().min(N);
    while n > 0 && !s.is_char_boundary(n) {
        n -= 1;
    }
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

/// Reads a NUL-padded fixed array back as a string slice (lossy: invalid UTF-8 ends the string).
pub fn read_str(b: &[u8]) -> &str {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    match core::str::from_utf8(&b[..end]) {
        Ok(s) => s,
        Err(e) => core::str::from_utf8(&b[..e.valid_up_to()]).unwrap_or(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_roundtrip_and_truncate_on_char_boundary() {
        let a: [u8; 8] = fill_str("abc");
        assert_eq!(read_str(&a), "abc");
        let b: [u8; 4] = fill_str("abcé");
        assert_eq!(read_str(&b), "abc");
    }

    #[test]
    fn step_record_keeps_at_most_max_ids_and_flags_the_rest() {
        let ids: [u64; MAX_STEP_REQS + 3] = core::array::from_fn(|i| i as u64 + 1);
        let r = StepRecord::new(StepKind::Decode, 9, &ids);
        assert_eq!(
            (r.num_seqs, r.num_req_ids, r.req_ids_truncated),
            (MAX_STEP_REQS as u32 + 3, MAX_STEP_REQS as u32, 1)
        );
        assert_eq!(r.req_ids[MAX_STEP_REQS - 1], MAX_STEP_REQS as u64);
        let r = StepRecord::new(StepKind::Prefill, 1, &[7]);
        assert_eq!(
            (r.num_req_ids, r.req_ids_truncated, r.req_ids[0], r.abi_version),
            (1, 0, 7, ABI_VERSION)
        );
        let r = StepRecord::new(StepKind::Mixed, 2, &[7, 8, 9]).with_req_tokens([128, 1, 64, 5]);
        assert_eq!(
            (r.tokens_of(7), r.tokens_of(8), r.tokens_of(9), r.tokens_of(10)),
            (Some(128), Some(1), Some(64), None)
        );
        assert_eq!(
            r.req_tokens[3], 5,
            "extra entries land past num_req_ids, never read"
        );
        let q = RequestRecord::new(RequestEventKind::Finished, 3, 42);
        assert_eq!((q.kind, q.req_id, q.ts_ns, q.has_trace_context), (4, 3, 42, 0));
        let g = RangeRecord::new(RangeOp::Push, 5, 1, "llmserve", "forward");
        assert_eq!((read_str(&g.domain), read_str(&g.name)), ("llmserve", "forward"));
    }

    #[test]
    fn kinds_decode() {
        assert_eq!(StepKind::from_raw(2), Some(StepKind::Mixed));
        assert_eq!(EventKind::from_raw(7), Some(EventKind::Connect));
        assert_eq!(FinishReason::from_raw(2).name(), "length");
        assert_eq!(StepKind::from_raw(9), None);
        assert_eq!(EventKind::from_raw(9), Some(EventKind::CudaCall));
    }

    #[test]
    fn cuda_functions_roundtrip_and_cookies_carry_the_argument_index() {
        for (i, f) in CudaFunc::ALL.iter().enumerate() {
            assert_eq!(CudaFunc::from_raw(i as u32), Some(*f));
        }
        for (i, v) in CudaVariant::ALL.iter().enumerate() {
            assert_eq!(CudaVariant::from_raw(i as u32), Some(*v));
        }
        let c = CudaFunc::MemcpyHtoDAsync.cookie(CudaVariant::V2Ptsz);
        assert_eq!((c & 0xff, (c >> 8) & 0xff, (c >> 16) & 0xff), (6, 5, 2));
        let c = CudaFunc::CtxSynchronize.cookie(CudaVariant::Plain);
        assert_eq!((c >> 16) & 0xff, CUDA_NO_ARG);
        assert_eq!(CudaFunc::MemAlloc.arg(), Some((1, CudaArg::Bytes)));
        assert_eq!(CudaFunc::EventSynchronize.class(), CudaClass::Sync);
    }
}

/// GPU activity handed over by the injected CUPTI helper (not part of the engine ABI).
pub mod gpu;

/// Counted launch-type CUDA driver calls (not part of the engine ABI).
pub mod cudacount;

/// The injected Python-hooks helper's configuration and status (not part of the engine ABI).
pub mod pyhooks;
