//! Names of slices and instants on the engine and request tracks.

use llmprof_abi::StepKind;

/// An engine step whose kind the record does not name (known kinds: [`StepKind::name`], `prefill` /
/// `decode` / `mixed`).
pub const STEP_UNKNOWN: &str = "step";
/// A request's phase slice: waiting to be scheduled for the first time (`Arrived` record).
pub const QUEUED: &str = "queued";
/// A request's phase slice: scheduled, computing its prompt (`Scheduled` before the first token).
pub const PREFILL: &str = "prefill";
/// A request's phase slice: generating tokens (`FirstToken`, or `Scheduled` after it).
pub const DECODE: &str = "decode";
/// A request's phase slice: preempted, waiting to be recomputed (`Preempted` record).
pub const REQUEUED: &str = "queued (preempted)";
/// Instant on a request track: its first output token (arg [`super::arg::TTFT_MS`]).
pub const FIRST_TOKEN: &str = "first token";
/// Instant on a request track: the engine preempted it.
pub const PREEMPTED: &str = "preempted";
/// Instant on a request track: it finished (arg [`super::arg::FINISH_REASON`]).
pub const FINISHED: &str = "finished";
/// Beginning of a request's outer slice (see [`request`]).
pub const REQUEST_PREFIX: &str = "request ";
/// Beginning of the outer slice of a request seen on the wire (see [`request`]).
pub const WIRE_REQUEST_PREFIX: &str = "http request ";
/// Instant on a wire request's track: its response's status line (args [`super::arg::HTTP_STATUS`]).
pub const HTTP_RESPONSE: &str = "http response";
/// Instant on a wire request's track: its exchange ended (args [`super::arg::HTTP_STATUS`],
/// [`super::arg::RESPONSE_BYTES`] when the response's end was seen, [`super::arg::STREAMED`], and
/// [`super::arg::ENGINE_REQUEST`] when the engine's own probes saw the request it carried).
pub const HTTP_RESPONSE_END: &str = "http response end";
/// Instant on a wire request's track: the request line (args [`super::arg::HTTP_METHOD`],
/// [`super::arg::HTTP_PATH`], [`super::arg::SOCKET_WAIT_NS`] when the arrival was seen).
pub const HTTP_REQUEST_LINE: &str = "http request line";
/// Instant on a wire request's track: SSE events with generated content after the first (arg
/// [`super::arg::COUNT`]: events in the write).
pub const WIRE_TOKEN: &str = "sse content";
/// Instant on a thread track: an NVTX-style pop whose push happened before llmprof attached.
pub const UNMATCHED_RANGE_POP: &str = "unmatched range pop";
/// Instant on a process track: a traced process started it (args [`super::arg::PPID`],
/// [`super::arg::CMDLINE`]).
pub const PROCESS_START: &str = "process start";
/// Instant on a process track: it executed a program (args [`super::arg::FILENAME`],
/// [`super::arg::CMDLINE`]); the track is renamed after the new command line.
pub const PROCESS_EXEC: &str = "process exec";
/// Instant on a process track: it exited (arg [`super::arg::EXIT_CODE`]).
pub const PROCESS_EXIT: &str = "process exit";
/// Beginning of a slow syscall's slice (see [`syscall`]).
pub const SYSCALL_PREFIX: &str = "syscall ";
/// Beginning of a model-file operation's slice (see [`model_file`]).
pub const MODEL_FILE_PREFIX: &str = "model file ";
/// The operation name of an open in a [`model_file`] slice (the other operations are
/// `llmprof_abi::FileOp::name`: `read`, `pread64`, `readv`, `mmap`, `close`).
pub const FILE_OPEN: &str = "open";
/// Instant on a thread track: a connect to an allowed destination.
pub const CONNECT: &str = "connect";
/// Instant on a thread track: a connect outside the allowed CIDRs.
pub const CONNECT_FLAGGED: &str = "connect (flagged egress)";
/// End of every CUDA driver call slice's name (`cuStreamSynchronize (host)`, `cuLaunchKernel ×N (host)`).
pub const CUDA_SUFFIX: &str = " (host)";
/// Instant on a thread track: one Python stack sample (args [`super::arg::PY_STACK`],
/// [`super::arg::PY_LEAF`], [`super::arg::PY_DEPTH`], [`super::arg::PY_STATUS`]). Until the native stack
/// samples carry them as Perfetto callstack frames.
pub const PY_SAMPLE: &str = "python sample";

/// An engine step's slice: the step kind's name, [`STEP_UNKNOWN`] for a kind the record does not name.
pub fn step(kind: Option<StepKind>) -> &'static str {
    kind.map(StepKind::name).unwrap_or(STEP_UNKNOWN)
}

/// The step kind a step slice's name says (`None` for [`STEP_UNKNOWN`] or any other name).
pub fn parse_step(name: &str) -> Option<StepKind> {
    [StepKind::Prefill, StepKind::Decode, StepKind::Mixed]
        .into_iter()
        .find(|k| k.name() == name)
}

/// A request's outer slice on its track: `request N`; a request seen on the wire: `http request N`
/// (its id is [`crate::event::WIRE_REQ_BASE`] + N).
pub fn request(req_id: u64) -> String {
    match req_id.checked_sub(crate::event::WIRE_REQ_BASE) {
        Some(n) if n > 0 => format!("{WIRE_REQUEST_PREFIX}{n}"),
        _ => format!("{REQUEST_PREFIX}{req_id}"),
    }
}

/// The request id of an outer request slice's name (`None` for any other slice).
pub fn parse_request(name: &str) -> Option<u64> {
    if let Some(n) = name.strip_prefix(WIRE_REQUEST_PREFIX) {
        return Some(crate::event::WIRE_REQ_BASE + n.parse::<u64>().ok()?);
    }
    name.strip_prefix(REQUEST_PREFIX)?.parse().ok()
}

/// Whether a request id is one seen on the wire (the HTTP probe) rather than an engine's.
pub fn is_wire_request(req_id: u64) -> bool {
    req_id > crate::event::WIRE_REQ_BASE
}

/// An NVTX-style range: `domain::name`.
pub fn range(domain: &str, name: &str) -> String {
    format!("{domain}::{name}")
}

/// A slow syscall: `syscall <name>` (names from [`crate::names::syscalls`]).
pub fn syscall(name: &str) -> String {
    format!("{SYSCALL_PREFIX}{name}")
}

/// A model-file operation: `model file <op>` (`op`: [`FILE_OPEN`] or `llmprof_abi::FileOp::name`).
pub fn model_file(op: &str) -> String {
    format!("{MODEL_FILE_PREFIX}{op}")
}

/// An individual CUDA driver call: `<function> (host)` (the function without its `_v2`/`_ptsz` variant).
pub fn cuda_call(function: &str) -> String {
    format!("{function}{CUDA_SUFFIX}")
}

/// A batch of CUDA driver calls: `<function> ×N (host)` when all are one function, else `CUDA calls ×N
/// (host)`.
pub fn cuda_batch(only_function: Option<&str>, calls: u64) -> String {
    match only_function {
        Some(f) => format!("{f} ×{calls}{CUDA_SUFFIX}"),
        None => format!("CUDA calls ×{calls}{CUDA_SUFFIX}"),
    }
}
