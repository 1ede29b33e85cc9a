//! Every name llmprof writes into a Perfetto trace: track names, slice and instant names, marker texts, argument
//! keys, counter tracks and categories.
//!
//! Owns the trace's vocabulary, nothing else: the writer ([`crate::perfetto::sink`], and the markers `llmprof`
//! puts on the timeline) writes with these constants and builders, and every reader ([`crate::report`], the tests
//! that query Perfetto's trace processor) reads with them, so a reader never retypes a literal the writer chose.
//! A formatted name has its builder and, where a reader needs it, its parser side by side. The values are what
//! users see in the Perfetto UI and query in SQL (documented in `docs/perfetto-trace.md`): changing one is a
//! change to the trace format. This module never decides where an event goes; that is the sink's job.

/// How Perfetto's trace processor names a debug annotation in its `args` table (`extract_arg(arg_set_id,
/// 'debug.num_seqs')`): `debug.` + the key. An element of an array arg is `debug.<key>[<index>]`.
pub fn tp_arg(key: &str) -> String {
    format!("debug.{key}")
}

pub mod gpu;
pub mod syscalls;

/// Names of tracks (`track.name` in the trace processor).
pub mod track {
    /// The global track of llmprof's own markers, the overhead budget's steps and the summary.
    pub const LLMPROF: &str = "llmprof";
    /// A traced process's child track with one slice per engine step.
    pub const STEPS: &str = "engine steps";
    /// A process's child track of the device interval of each step, timed with CUDA events.
    pub const DEVICE_CUDA: &str = "device (CUDA)";
    /// A process's child track of the device interval of each step, timed on the host (CPU engine).
    pub const DEVICE_HOST: &str = "device (host compute)";
    /// Each calling thread's child track of CUDA driver calls.
    pub const CUDA: &str = "CUDA driver calls (host time)";
    /// Beginning of every request track's name (see [`request`]).
    pub const REQUEST_PREFIX: &str = "request ";
    /// Beginning of every GPU track's name: groups, NVML counters, process memory (see [`gpu_group`]).
    pub const GPU_PREFIX: &str = "GPU ";
    /// Beginning of the per-probe drop counter tracks (see [`drops`]).
    pub const DROPS_PREFIX: &str = "llmprof drops: ";

    /// A request's track: `request N`, or `request N (x-request-id)` when the header was set; a request seen
    /// on the wire (id from [`crate::event::WIRE_REQ_BASE`]): `http request N (x-request-id)`.
    pub fn request(req_id: u64, x_request_id: &str) -> String {
        let name = super::slice::request(req_id);
        if x_request_id.is_empty() {
            name
        } else {
            format!("{name} ({x_request_id})")
        }
    }

    /// A GPU's group track: `GPU N: <product name>`, with ` (<uuid>)` when NVML gave one.
    pub fn gpu_group(index: u32, name: &str, uuid: &str) -> String {
        if uuid.is_empty() {
            format!("{GPU_PREFIX}{index}: {name}")
        } else {
            format!("{GPU_PREFIX}{index}: {name} ({uuid})")
        }
    }

    /// A GPU's NVML counter track: `GPU N <metric>` (`metric` from [`super::counter::GPU`]).
    pub fn gpu_counter(index: u32, metric: &str) -> String {
        format!("{GPU_PREFIX}{index} {metric}")
    }

    /// The counter track of a traced process's device memory on a GPU: `GPU N memory (pid P)`.
    pub fn gpu_process_memory(index: u32, pid: u32) -> String {
        format!("{GPU_PREFIX}{index} memory (pid {pid})")
    }

    /// A probe's drop counter track: `llmprof drops: <probe>` (probe names: `llmprof_abi::PROBE_NAMES`).
    pub fn drops(probe: &str) -> String {
        format!("{DROPS_PREFIX}{probe}")
    }

    /// What a GPU track's name says (the reader's side of [`gpu_group`], [`gpu_counter`],
    /// [`gpu_process_memory`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum GpuTrack<'a> {
        /// A group track: GPU index and `<product name> (<uuid>)`.
        Group(u64, &'a str),
        /// The device memory of a process: GPU index and pid.
        ProcessMemory(u64, u64),
        /// An NVML counter: GPU index and the metric (the name after `GPU N `).
        Counter(u64, &'a str),
    }

    /// Parses a GPU track's name; `None` for any other track.
    pub fn parse_gpu(name: &str) -> Option<GpuTrack<'_>> {
        let (idx, rest) = name.strip_prefix(GPU_PREFIX)?.split_once(' ')?;
        if let Some(i) = idx.strip_suffix(':') {
            return Some(GpuTrack::Group(i.parse().ok()?, rest));
        }
        let i = idx.parse().ok()?;
        let pid = rest
            .strip_prefix("memory (pid ")
            .and_then(|p| p.strip_suffix(')'))
            .and_then(|p| p.parse().ok());
        Some(match pid {
            Some(pid) => GpuTrack::ProcessMemory(i, pid),
            None => GpuTrack::Counter(i, rest),
        })
    }
}

/// Names of slices and instants on the engine and request tracks.
pub mod slice {
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
}

/// Instants on the [`track::LLMPROF`] track: markers, the budget's steps, alerts, the summary.
pub mod marker {
    /// The final instant with the session statistics and self-accounting.
    pub const SUMMARY: &str = "llmprof summary";
    /// Where the trace's view begins (the probes went live, or the flight recorder's history starts): a request
    /// that arrived before it was in flight when llmprof attached.
    pub const TRACING_STARTED: &str = "tracing started";
    /// The traced process exited (also the session's end reason then).
    pub const TARGET_EXITED: &str = "target exited";
    /// Beginning of the marker written when a process's engine probes were not found.
    pub const ENGINE_PROBES_NOT_FOUND: &str = "engine probes not found";
    /// Beginning of the marker written when `--max-trace-size` ended the trace (also the session's end reason).
    pub const SIZE_LIMIT_REACHED: &str = "trace size limit reached";
    /// Beginning of an overhead budget step's instant (followed by the step's name).
    pub const DEGRADATION_PREFIX: &str = "overhead budget: ";
    /// Beginning of the instant `llmprof serve` writes for the alert behind a trace.
    pub const ALERT_FIRED_PREFIX: &str = "alert fired: ";
    /// Beginning of the GPU layer's marker when NVML cannot be used.
    pub const GPU_COUNTERS_UNAVAILABLE: &str = "GPU counters unavailable";
    /// Beginning of the GPU layer's marker when the target has not loaded libcuda (yet).
    pub const LIBCUDA_NOT_LOADED: &str = "libcuda not loaded";
    /// Beginning of the GPU layer's markers about the CUDA driver probes (attached or failed).
    pub const CUDA_PROBES: &str = "CUDA driver probes";
    /// Beginnings of the markers `llmprof report` lists as the GPU layer's (`NVML`: read for traces of earlier
    /// versions; nothing writes it today).
    pub const GPU_PREFIXES: [&str; 4] = [GPU_COUNTERS_UNAVAILABLE, "NVML", LIBCUDA_NOT_LOADED, CUDA_PROBES];

    /// Beginning of the marker written when a traced process's port speaks TLS or HTTP/2.
    pub const WIRE_NOT_DECODED: &str = "wire probe: not decoded";

    /// `wire probe: not decoded: pid P fd F speaks <what>`.
    pub fn wire_not_decoded(pid: u32, fd: i32, what: &str) -> String {
        format!("{WIRE_NOT_DECODED}: pid {pid} fd {fd} speaks {what}")
    }

    /// `engine probes not found in pid P: engine tracks are empty`.
    pub fn engine_probes_not_found(pid: u32) -> String {
        format!("{ENGINE_PROBES_NOT_FOUND} in pid {pid}: engine tracks are empty")
    }

    /// `trace size limit reached (--max-trace-size N bytes): trace ended early, M events not written`.
    pub fn size_limit_reached(limit: u64, not_written: u64) -> String {
        format!(
            "{SIZE_LIMIT_REACHED} (--max-trace-size {limit} bytes): trace ended early, {not_written} events not written"
        )
    }

    /// `overhead budget: <step>` (step names: `llmprof::budget::LEVELS`).
    pub fn degradation(step: &str) -> String {
        format!("{DEGRADATION_PREFIX}{step}")
    }

    /// `overhead budget P% still exceeded (est. E%) with engine steps and requests only: kept`.
    pub fn budget_exhausted(budget_pct: f64, overhead_pct: f64) -> String {
        format!(
            "overhead budget {budget_pct}% still exceeded (est. {overhead_pct:.1}%) with engine steps and requests only: kept"
        )
    }

    /// `alert fired: <alertname>`.
    pub fn alert_fired(alertname: &str) -> String {
        format!("{ALERT_FIRED_PREFIX}{alertname}")
    }

    /// `flight recorder history incomplete for the last N ms before the alert`.
    pub fn flight_recorder_incomplete(ms: f64) -> String {
        format!("flight recorder history incomplete for the last {ms:.0} ms before the alert")
    }

    /// `GPU counters unavailable: <why>`.
    pub fn gpu_counters_unavailable(why: &str) -> String {
        format!("{GPU_COUNTERS_UNAVAILABLE}: {why}")
    }

    /// `libcuda not loaded in pid P: no CUDA driver calls yet (probes attach when it loads)`.
    pub fn libcuda_not_loaded(pid: u32) -> String {
        format!("{LIBCUDA_NOT_LOADED} in pid {pid}: no CUDA driver calls yet (probes attach when it loads)")
    }

    /// `CUDA driver probes attached: N entry points of LIB (M of them only reachable through
    /// cuGetProcAddress)`.
    pub fn cuda_probes_attached(entry_points: usize, lib: &str, via_proc_address: usize) -> String {
        format!(
            "{CUDA_PROBES} attached: {entry_points} entry points of {lib} ({via_proc_address} of them only \
             reachable through cuGetProcAddress)"
        )
    }

    /// `CUDA driver probes failed: <why>`.
    pub fn cuda_probes_failed(why: &str) -> String {
        format!("{CUDA_PROBES} failed: {why}")
    }
}

/// Counter tracks: `(name, unit)`.
pub mod counter {
    /// A process's engine KV-cache usage (`vllm:kv_cache_usage_perc`, 0..1).
    pub const KV_USAGE: (&str, &str) = ("KV cache usage", "fraction");
    /// A process's running requests (`vllm:num_requests_running`).
    pub const RUNNING: (&str, &str) = ("requests running", "requests");
    /// A process's waiting requests (`vllm:num_requests_waiting`).
    pub const WAITING: (&str, &str) = ("requests waiting", "requests");
    /// A process's preemptions so far (`vllm:num_preemptions_total`).
    pub const PREEMPTIONS: (&str, &str) = ("preemptions", "preemptions");
    /// A process's syscall rate over the last sampling interval (kernel aggregates).
    pub const SYSCALL_RATE: (&str, &str) = ("syscalls/s", "calls/s");
    /// Unit of the `GPU N memory (pid P)` tracks ([`super::track::gpu_process_memory`]).
    pub const GPU_PROCESS_MEMORY_UNIT: &str = "MiB";
    /// NVML `utilization.gpu`: percent of time a kernel ran.
    pub const GPU_UTILIZATION: (&str, &str) = ("utilization", "%");
    /// NVML `utilization.memory`: percent of time device memory was read or written.
    pub const GPU_MEMORY_UTILIZATION: (&str, &str) = ("memory utilization", "%");
    /// Device memory in use.
    pub const GPU_MEMORY_USED: (&str, &str) = ("memory used", "MiB");
    /// Board power draw.
    pub const GPU_POWER: (&str, &str) = ("power", "W");
    /// SM clock.
    pub const GPU_SM_CLOCK: (&str, &str) = ("SM clock", "MHz");
    /// GPU temperature.
    pub const GPU_TEMPERATURE: (&str, &str) = ("temperature", "°C");
    /// PCIe transmit throughput.
    pub const GPU_PCIE_TX: (&str, &str) = ("PCIe TX (device to host)", "MB/s");
    /// PCIe receive throughput.
    pub const GPU_PCIE_RX: (&str, &str) = ("PCIe RX (host to device)", "MB/s");
    /// NVML counters of each GPU: (metric, unit), the metric being the track name after `GPU N `
    /// ([`super::track::gpu_counter`]). The index is the metric's id in the track uuid.
    pub const GPU: [(&str, &str); 8] = [
        GPU_UTILIZATION,
        GPU_MEMORY_UTILIZATION,
        GPU_MEMORY_USED,
        GPU_POWER,
        GPU_SM_CLOCK,
        GPU_TEMPERATURE,
        GPU_PCIE_TX,
        GPU_PCIE_RX,
    ];
    /// Estimated CPU the probes added to the target, % of its own CPU (the `--overhead-budget` measure).
    pub const OVERHEAD_TARGET_PCT: (&str, &str) = ("llmprof overhead: est. target CPU added", "%");
    /// Estimated CPU the probes added, ms per second.
    pub const OVERHEAD_ADDED_CPU: (&str, &str) = ("llmprof overhead: est. added CPU", "ms/s");
    /// llmprof's own CPU, % of one core.
    pub const LLMPROF_CPU: (&str, &str) = ("llmprof CPU", "%");
    /// llmprof's resident memory.
    pub const LLMPROF_RSS: (&str, &str) = ("llmprof RSS", "MiB");
    /// Calibrated cost per traced syscall.
    pub const COST_SYSCALL: (&str, &str) = ("llmprof cost per hit: syscall", "ns");
    /// Calibrated cost per engine probe hit.
    pub const COST_ENGINE_PROBE: (&str, &str) = ("llmprof cost per hit: engine probe", "ns");
    /// The overhead budget's degradation level in force.
    pub const DEGRADATION_LEVEL: (&str, &str) = ("llmprof degradation level", "level");
    /// Calibrated cost per traced syscall whose exit llmprof decodes (read, write, close, ...).
    pub const COST_SYSCALL_DECODED: (&str, &str) = ("llmprof cost per hit: decoded syscall", "ns");
    /// Calibrated cost per CUDA driver call.
    pub const COST_CUDA_CALL: (&str, &str) = ("llmprof cost per hit: CUDA call (entry + return probe)", "ns");
    /// Global counter tracks of llmprof's self-accounting, written every tick (`llmprof::selfacct`); the index
    /// is the track's key.
    pub const OVERHEAD: [(&str, &str); 9] = [
        OVERHEAD_TARGET_PCT,
        OVERHEAD_ADDED_CPU,
        LLMPROF_CPU,
        LLMPROF_RSS,
        COST_SYSCALL,
        COST_ENGINE_PROBE,
        DEGRADATION_LEVEL,
        COST_CUDA_CALL,
        COST_SYSCALL_DECODED,
    ];
}

/// Slice categories (`slice.category`).
pub mod category {
    /// CUDA driver call slices.
    pub const CUDA_HOST: &str = "cuda-host";
}

/// Argument keys (debug annotations; `debug.<key>` in the trace processor, see [`crate::names::tp_arg`]) and the
/// fixed values some of them take.
pub mod arg {
    // Python stack samples.
    /// The sample's Python frames, innermost first: `h (burn.py:16) ← g (burn.py:21) ← f (burn.py:26)`.
    pub const PY_STACK: &str = "py_stack";
    /// The innermost Python frame's function (qualified name in 3.11+).
    pub const PY_LEAF: &str = "py_leaf";
    /// Python frames in the sample.
    pub const PY_DEPTH: &str = "py_depth";
    /// How the walk ended: `complete`, `truncated`, `no_thread`, `read_failed`.
    pub const PY_STATUS: &str = "py_status";
    /// Each frame's function, innermost first: an array of strings (`debug.py_functions[0]`, ...).
    pub const PY_FUNCTIONS: &str = "py_functions";
    /// Each frame's file (`co_filename`), in [`PY_FUNCTIONS`]'s order: an array of strings.
    pub const PY_FILES: &str = "py_files";
    /// Each frame's line, in [`PY_FUNCTIONS`]'s order: an array of uint (0: no line).
    pub const PY_LINES: &str = "py_lines";

    // Engine steps (and the device slices, CUDA slices and ranges that name their step).
    /// The engine's step counter.
    pub const STEP_ID: &str = "step_id";
    /// Sequences in the batch.
    pub const NUM_SEQS: &str = "num_seqs";
    /// Prompt tokens computed in the step (a request slice: the prompt's tokens).
    pub const PREFILL_TOKENS: &str = "prefill_tokens";
    /// Decode tokens computed in the step.
    pub const DECODE_TOKENS: &str = "decode_tokens";
    /// KV-cache blocks in use after scheduling.
    pub const KV_BLOCKS_USED: &str = "kv_blocks_used";
    /// KV-cache blocks in the pool.
    pub const KV_BLOCKS_TOTAL: &str = "kv_blocks_total";
    /// Requests waiting after scheduling.
    pub const NUM_WAITING: &str = "num_waiting";
    /// Requests preempted by the step's scheduling.
    pub const NUM_PREEMPTED: &str = "num_preempted";
    /// The step's requests: an array of uint (`debug.req_ids[0]`, `debug.req_ids[1]`, ...).
    pub const REQ_IDS: &str = "req_ids";
    /// Each request's tokens in the step, in [`REQ_IDS`]'s order: an array of uint.
    pub const REQ_TOKENS: &str = "req_tokens";
    /// The step served more requests than its record lists.
    pub const REQ_IDS_TRUNCATED: &str = "req_ids_truncated";
    /// The batch size of the CUDA graph the step replayed; absent when its kernels were launched one by one.
    pub const GRAPH_BATCH: &str = "graph_batch";

    // Requests.
    /// Engine request id.
    pub const REQ_ID: &str = "req_id";
    /// Prompt tokens.
    pub const PROMPT_TOKENS: &str = "prompt_tokens";
    /// Output tokens so far (at the end: in all).
    pub const OUTPUT_TOKENS: &str = "output_tokens";
    /// `max_tokens` requested.
    pub const MAX_TOKENS: &str = "max_tokens";
    /// Sampling temperature.
    pub const TEMPERATURE: &str = "temperature";
    /// Nucleus sampling `top_p`.
    pub const TOP_P: &str = "top_p";
    /// Served model name.
    pub const MODEL: &str = "model";
    /// The `x-request-id` header.
    pub const X_REQUEST_ID: &str = "x_request_id";
    /// The API endpoint ([`ENDPOINT_CHAT`] or [`ENDPOINT_COMPLETIONS`]).
    pub const ENDPOINT: &str = "endpoint";
    /// W3C trace id of the caller's `traceparent`, hex.
    pub const TRACE_ID: &str = "trace_id";
    /// W3C parent span id of the caller's `traceparent`, hex.
    pub const PARENT_SPAN_ID: &str = "parent_span_id";
    /// `true` on a request first seen after its arrival (llmprof attached while it ran).
    pub const ATTACHED_MID_REQUEST: &str = "attached_mid_request";
    /// `stop` / `length` / `abort` / `error` (`llmprof_abi::FinishReason::name`), or [`UNFINISHED`].
    pub const FINISH_REASON: &str = "finish_reason";
    /// Times preempted (as the engine counts them).
    pub const NUM_PREEMPTIONS: &str = "num_preemptions";
    /// Arrival (first sight) → first token, ms.
    pub const TTFT_MS: &str = "ttft_ms";
    /// What closed a slice: [`CLOSED_BY_FINISHED`] or the session's end reason.
    pub const CLOSED_BY: &str = "closed_by";
    /// Summary: off-CPU stacks the kernel's per-CPU rate bound did not take (by design, not a loss).
    pub const OFFCPU_NOT_TAKEN: &str = "offcpu_not_taken";
    /// HTTP status code of a wire response.
    pub const HTTP_STATUS: &str = "http_status";
    /// HTTP method of a wire request.
    pub const HTTP_METHOD: &str = "http_method";
    /// Bytes of a wire response (status line, headers and body as written).
    pub const RESPONSE_BYTES: &str = "response_bytes";
    /// Whether a wire response was a stream of server-sent events.
    pub const STREAMED: &str = "streamed";
    /// The engine request a wire request carried: the name of its outer slice (`request N`), the one to search
    /// for in Perfetto.
    pub const ENGINE_REQUEST: &str = "engine_request";
    /// Request target (path) of a wire request.
    pub const HTTP_PATH: &str = "http_path";
    /// How long a wire request's first bytes waited in the server's socket before the server read them, ns
    /// (on its request line instant, which is at their arrival).
    pub const SOCKET_WAIT_NS: &str = "socket_wait_ns";
    /// How many of something an instant stands for (SSE content events of one write).
    pub const COUNT: &str = "count";
    /// Value of [`ENDPOINT`]: a chat completion.
    pub const ENDPOINT_CHAT: &str = "/v1/chat/completions";
    /// Value of [`ENDPOINT`]: a text completion.
    pub const ENDPOINT_COMPLETIONS: &str = "/v1/completions";
    /// Value of [`FINISH_REASON`] on a request still running when the trace ended.
    pub const UNFINISHED: &str = "unfinished";
    /// Value of [`CLOSED_BY`] on a request the engine finished.
    pub const CLOSED_BY_FINISHED: &str = "finished";

    /// The finish reason a [`FINISH_REASON`] value names (the reader's side of `FinishReason::name`; `None` for
    /// [`UNFINISHED`] and anything else).
    pub fn parse_finish_reason(v: &str) -> Option<llmprof_abi::FinishReason> {
        use llmprof_abi::FinishReason as F;
        [F::Stop, F::Length, F::Abort, F::Error]
            .into_iter()
            .find(|r| r.name() == v)
    }

    // Thread tracks: ranges, syscalls, model files, connects.
    /// The range an unmatched pop names.
    pub const RANGE: &str = "range";
    /// Syscall number.
    pub const NR: &str = "nr";
    /// Return value.
    pub const RET: &str = "ret";
    /// Duration, ms.
    pub const LATENCY_MS: &str = "latency_ms";
    /// File path.
    pub const PATH: &str = "path";
    /// File descriptor.
    pub const FD: &str = "fd";
    /// Bytes asked for.
    pub const REQUESTED_BYTES: &str = "requested_bytes";
    /// Bytes read (a CUDA call: bytes copied or allocated).
    pub const BYTES: &str = "bytes";
    /// An mmap's address (hex); a connect's destination address.
    pub const ADDRESS: &str = "address";
    /// Destination port.
    pub const PORT: &str = "port";
    /// Inside the allowed CIDRs.
    pub const ALLOWED: &str = "allowed";
    /// [`VERDICT_ALLOWED`] or [`VERDICT_FLAGGED`].
    pub const VERDICT: &str = "verdict";
    /// Value of [`VERDICT`]: inside the allowed CIDRs.
    pub const VERDICT_ALLOWED: &str = "allowed";
    /// Value of [`VERDICT`]: outside them.
    pub const VERDICT_FLAGGED: &str = "flagged";

    // The llmprof track: markers, exits, the budget's steps.
    /// A marker's text.
    pub const MARKER: &str = "marker";
    /// Process id.
    pub const PID: &str = "pid";
    /// Exit code.
    pub const EXIT_CODE: &str = "exit_code";
    /// Parent process id (process start instants).
    pub const PPID: &str = "ppid";
    /// Command line, space separated (process start and exec instants).
    pub const CMDLINE: &str = "cmdline";
    /// The executed file as passed to execve (process exec instants).
    pub const FILENAME: &str = "filename";
    /// Degradation level entered.
    pub const LEVEL: &str = "level";
    /// Degradation step's name.
    pub const STEP: &str = "step";
    /// What the step changed.
    pub const CHANGE: &str = "change";
    /// The estimate that exceeded the budget, %.
    pub const EST_OVERHEAD_PCT: &str = "est_overhead_pct";
    /// The budget, %.
    pub const BUDGET_PCT: &str = "budget_pct";
    /// Syscalls the kernel aggregates had counted.
    pub const SYSCALLS_COUNTED: &str = "syscalls_counted";
    /// The alert's name (`alert fired: ...`, `llmprof serve`).
    pub const ALERTNAME: &str = "alertname";
    /// The alert's fingerprint.
    pub const FINGERPRINT: &str = "fingerprint";
    /// The alert's status (`firing`).
    pub const STATUS: &str = "status";
    /// When the alert started.
    pub const STARTS_AT: &str = "starts_at";
    /// The alert's labels, JSON.
    pub const LABELS: &str = "labels";
    /// The alert's annotations, JSON.
    pub const ANNOTATIONS: &str = "annotations";
    /// The alert's generator URL.
    pub const GENERATOR_URL: &str = "generator_url";
    /// `llmprof serve`'s session id.
    pub const SESSION_ID: &str = "session_id";
    /// How `llmprof serve` found the target.
    pub const TARGET: &str = "target";
    /// The flight recorder's history in the trace.
    pub const FLIGHT_RECORDER: &str = "flight_recorder";
    /// What started the session.
    pub const TRIGGER: &str = "trigger";

    // CUDA driver call slices.
    /// The exact symbol called (`cuMemcpyDtoH_v2`).
    pub const FUNCTION: &str = "function";
    /// Host time in the call, ms.
    pub const HOST_MS: &str = "host_ms";
    /// The returned `CUresult`.
    pub const RESULT: &str = "result";
    /// A device pointer (hex).
    pub const DPTR: &str = "dptr";
    /// A stream (hex).
    pub const STREAM: &str = "stream";
    /// Calls in a batch.
    pub const CALLS: &str = "calls";
    /// Kernel/graph launches in a batch.
    pub const LAUNCHES: &str = "launches";
    /// Host time of a batch's calls, ms.
    pub const HOST_TOTAL_MS: &str = "host_total_ms";
    /// A batch's longest call, ms.
    pub const HOST_MAX_MS: &str = "host_max_ms";
    /// A batch's calls per function: `cuLaunchKernel=50 (0.200 ms) ...`.
    pub const FUNCTIONS: &str = "functions";
    /// What a batch gathers: [`AGGREGATED_PER_STEP`] or [`AGGREGATED_PER_WINDOW`].
    pub const AGGREGATED_PER: &str = "aggregated_per";
    /// Value of [`AGGREGATED_PER`] with engine probes.
    pub const AGGREGATED_PER_STEP: &str = "engine step";
    /// Value of [`AGGREGATED_PER`] without.
    pub const AGGREGATED_PER_WINDOW: &str = "10 ms window";
    /// Calls of a batch that returned an error.
    pub const ERRORS: &str = "errors";
    /// Why a batch ended ([`ENDED_BY_STEP`], [`ENDED_BY_WINDOW`], [`ENDED_BY_CALL`], [`ENDED_BY_END`]).
    pub const ENDED_BY: &str = "ended_by";
    /// Value of [`ENDED_BY`]: the engine step ended.
    pub const ENDED_BY_STEP: &str = "step end";
    /// Value of [`ENDED_BY`]: the time window elapsed.
    pub const ENDED_BY_WINDOW: &str = "window";
    /// Value of [`ENDED_BY`]: an individually shown call on the same thread.
    pub const ENDED_BY_CALL: &str = "next individual call";
    /// Value of [`ENDED_BY`]: the end of the trace.
    pub const ENDED_BY_END: &str = "end of trace";
    /// Calls of a batch that were counted in the kernel, not timed (launch-type calls in the default
    /// `--cuda-calls counted` mode): included in [`CALLS`] and [`FUNCTIONS`], with no host time.
    pub const COUNTED_CALLS: &str = "counted_calls";
    /// Bytes of a batch's counted (asynchronous) copies.
    pub const COUNTED_BYTES: &str = "counted_bytes";
    /// The note of the first slice of each CUDA track ([`CUDA_NOTE`]).
    pub const NOTE: &str = "note";
    /// The value of [`NOTE`]: what a CUDA slice's duration means.
    pub const CUDA_NOTE: &str = "host-side time in the CUDA driver call (enqueue, or waiting for the GPU in synchronize calls); not GPU kernel execution";

    // The summary (`llmprof summary`); per-probe counters are keyed by the probe's name
    // (`llmprof_abi::PROBE_NAMES`), `hits=H emitted=E dropped=D`.
    /// Why the session ended (`duration elapsed`, `interrupted`, `target exited`, ...; [`END_OF_TRACE`] when the
    /// session did not say).
    pub const END_REASON: &str = "end_reason";
    /// The end reason of a session that did not give one.
    pub const END_OF_TRACE: &str = "end of trace";
    /// Records lost in all.
    pub const TOTAL_DROPPED: &str = "total_dropped";
    /// Events dropped in user space.
    pub const USER_DROPS: &str = "user_drops";
    /// Records user space could not decode.
    pub const DECODE_ERRORS: &str = "decode_errors";
    /// The top kernel syscall aggregates: `name tid=T count=N total_ms=M; ...`.
    pub const TOP_SYSCALLS: &str = "top_syscalls";
    /// The CUDA aggregation's counts: `calls=N individual=I batches=B batched=C over_budget=O`.
    pub const CUDA_CALLS: &str = "cuda_calls";
    /// Events written per kind: `kind=N ...`.
    pub const EVENTS: &str = "events";
    /// Estimated CPU the probes (and the injected CUPTI helper) added to the target, ms.
    pub const OVERHEAD_EST_TARGET_CPU_MS: &str = "overhead_est_target_cpu_ms";
    /// Of it, the CUPTI helper's part, ms: [`CUPTI_THREAD_CPU_MS`] + [`CUPTI_RECORDS`] ×
    /// [`COST_NS_CUPTI_RECORD`].
    pub const OVERHEAD_EST_CUPTI_MS: &str = "overhead_est_cupti_ms";
    /// CPU of CUPTI's buffer thread and the helper's callbacks, measured in the target, ms.
    pub const CUPTI_THREAD_CPU_MS: &str = "cupti_thread_cpu_ms";
    /// CUPTI records written during the session.
    pub const CUPTI_RECORDS: &str = "cupti_records";
    /// Assumed CUPTI work per record in the launching threads, ns (not measurable from outside).
    pub const COST_NS_CUPTI_RECORD: &str = "cost_ns_cupti_record";
    /// The same, % of the target's own CPU.
    pub const OVERHEAD_EST_TARGET_PCT: &str = "overhead_est_target_pct";
    /// The target's CPU time, ms.
    pub const TARGET_CPU_MS: &str = "target_cpu_ms";
    /// Estimated CPU added per probe: `probe=ms ...`.
    pub const OVERHEAD_BY_PROBE_MS: &str = "overhead_by_probe_ms";
    /// llmprof's CPU time, ms.
    pub const LLMPROF_CPU_MS: &str = "llmprof_cpu_ms";
    /// llmprof's CPU, % of one core.
    pub const LLMPROF_CPU_PCT: &str = "llmprof_cpu_pct";
    /// llmprof's peak RSS, MiB.
    pub const LLMPROF_MAX_RSS_MIB: &str = "llmprof_max_rss_mib";
    /// Calibrated cost per traced syscall, ns.
    pub const COST_NS_SYSCALL: &str = "cost_ns_syscall";
    /// Calibrated cost per traced syscall whose exit llmprof decodes, ns.
    pub const COST_NS_SYSCALL_DECODED: &str = "cost_ns_syscall_decoded";
    /// Calibrated cost per engine probe hit, ns.
    pub const COST_NS_ENGINE_PROBE: &str = "cost_ns_engine_probe";
    /// Calibrated cost per engine probe hit sampled out, ns.
    pub const COST_NS_ENGINE_PROBE_SAMPLED_OUT: &str = "cost_ns_engine_probe_sampled_out";
    /// Calibrated cost per CUDA driver call (entry + return probe), ns.
    pub const COST_NS_CUDA_CALL: &str = "cost_ns_cuda_call";
    /// Calibrated cost per counted CUDA driver call (entry-only counting probe), ns.
    pub const COST_NS_CUDA_COUNTED: &str = "cost_ns_cuda_counted";
    /// Calibrated cost per thread-state record (sched_switch / sched_waking of a traced thread), ns.
    pub const COST_NS_SCHED_EVENT: &str = "cost_ns_sched_event";
    /// Calibrated eBPF cost per stack sample (kernel + user stack walk and record; off-CPU stacks are
    /// charged the same), ns.
    pub const COST_NS_SAMPLE: &str = "cost_ns_sample";
    /// The sampler's cost per sample measured on the targets during the session, ns.
    pub const COST_NS_SAMPLE_LIVE: &str = "cost_ns_sample_live";
    /// Calibrated eBPF cost per off-CPU stack taken at a blocking switch (without the Python walk), ns.
    pub const COST_NS_OFFCPU_STACK: &str = "cost_ns_offcpu_stack";
    /// Stacks llmprof symbolized (on-CPU samples and off-CPU stacks).
    pub const SYMBOLIZED_STACKS: &str = "symbolized_stacks";
    /// llmprof's own CPU time spent symbolizing them (part of `llmprof_cpu_ms`), ms.
    pub const SYMBOLIZE_MS: &str = "llmprof_symbolize_ms";
    /// Distinct addresses llmprof symbolized.
    pub const SYMBOLIZE_ADDRESSES: &str = "symbolize_addresses";
    /// Of those, addresses no symbol named.
    pub const SYMBOLIZE_UNKNOWN: &str = "symbolize_unknown";
    /// Of those, addresses in no mapping (a frame-pointer walk gone astray).
    pub const SYMBOLIZE_UNMAPPED: &str = "symbolize_unmapped";
    /// Of `llmprof_symbolize_ms`, the time resolving addresses not seen before, ms.
    pub const SYMBOLIZE_RESOLVE_MS: &str = "llmprof_symbolize_resolve_ms";
    /// llmprof's own CPU charged to the target on the CPUs they share (part of the estimate), ms.
    pub const LLMPROF_CPU_CHARGED_MS: &str = "llmprof_cpu_charged_ms";
    /// CPUs the target and llmprof share.
    pub const SHARED_CPUS: &str = "shared_cpus";
    /// Idle share of those CPUs during the session, %.
    pub const SHARED_IDLE_PCT: &str = "shared_idle_pct";
    /// Calibrated cost per request the wire probe follows (head read and a small response), ns.
    pub const COST_NS_HTTP_REQUEST: &str = "cost_ns_http_request";
    /// Calibrated cost per followed SSE write of a typical chat chunk, ns.
    pub const COST_NS_HTTP_SSE_WRITE: &str = "cost_ns_http_sse_write";
    /// [`crate::calibration::Calibration::http_arrival_ns`] (ns per run of the arrival-stamp programs).
    pub const COST_NS_HTTP_ARRIVAL: &str = "cost_ns_http_arrival";
    /// [`crate::calibration::Calibration::http_arrival_runs_per_s`].
    pub const HTTP_ARRIVAL_RUNS_PER_S: &str = "http_arrival_runs_per_s";
    /// Syscalls per engine probe hit in the calibration.
    pub const SYSCALLS_PER_PROBE_HIT: &str = "syscalls_per_probe_hit";
    /// How the engine probe is entered.
    pub const PROBE_ENTRY: &str = "probe_entry";
    /// How long the calibration took, ms.
    pub const CALIBRATION_MS: &str = "calibration_ms";
    /// `--overhead-budget`, %.
    pub const OVERHEAD_BUDGET_PCT: &str = "overhead_budget_pct";
    /// The budget's steps, space separated.
    pub const DEGRADATIONS: &str = "degradations";
    /// `--max-trace-size`, bytes.
    pub const TRACE_SIZE_LIMIT_BYTES: &str = "trace_size_limit_bytes";
    /// Events not written because of the size limit.
    pub const EVENTS_NOT_WRITTEN: &str = "events_not_written";
}

/// The string values made of `key=value` words (the summary's per-probe counters, `top_syscalls`, `cuda_calls`,
/// `overhead_by_probe_ms`; a CUDA batch's `functions`): how the sink writes them and how a reader takes them apart.
pub mod value {
    /// Per-probe counter: records the probe's hits.
    pub const HITS: &str = "hits";
    /// Per-probe counter: records written to the ring buffer.
    pub const EMITTED: &str = "emitted";
    /// Per-probe counter: records lost.
    pub const DROPPED: &str = "dropped";
    /// `top_syscalls` item: the thread.
    pub const TID: &str = "tid";
    /// `top_syscalls` item: calls.
    pub const COUNT: &str = "count";
    /// `top_syscalls` item: total time, ms.
    pub const TOTAL_MS: &str = "total_ms";
    /// Separator of the `top_syscalls` items.
    pub const ITEM_SEPARATOR: &str = "; ";
    /// `cuda_calls`: calls seen.
    pub const CALLS: &str = "calls";
    /// `cuda_calls`: calls shown one by one.
    pub const INDIVIDUAL: &str = "individual";
    /// `cuda_calls`: batch slices.
    pub const BATCHES: &str = "batches";
    /// `cuda_calls`: calls inside batches.
    pub const BATCHED: &str = "batched";
    /// `cuda_calls`: calls batched over the individual-slice budget.
    pub const OVER_BUDGET: &str = "over_budget";

    /// A probe's summary value: `hits=H emitted=E dropped=D`.
    pub fn probe_counters(hits: u64, emitted: u64, dropped: u64) -> String {
        format!("{HITS}={hits} {EMITTED}={emitted} {DROPPED}={dropped}")
    }

    /// A `top_syscalls` item: `<name> tid=T count=N total_ms=M`.
    pub fn top_syscall(name: &str, tid: u32, count: u64, total_ms: f64) -> String {
        format!("{name} {TID}={tid} {COUNT}={count} {TOTAL_MS}={total_ms:.3}")
    }

    /// The summary's `cuda_calls`: `calls=N individual=I batches=B batched=C over_budget=O`.
    pub fn cuda_calls(calls: u64, individual: u64, batches: u64, batched: u64, over_budget: u64) -> String {
        format!(
            "{CALLS}={calls} {INDIVIDUAL}={individual} {BATCHES}={batches} {BATCHED}={batched} \
             {OVER_BUDGET}={over_budget}"
        )
    }

    /// One function of a CUDA batch's `functions`: `<function>=N (M ms)`.
    pub fn cuda_function(function: &str, calls: u64, ms: f64) -> String {
        format!("{function}={calls} ({ms:.3} ms)")
    }

    /// The value of the `key=value` word of `s` (`None`: no such word, or it does not parse).
    pub fn field<T: std::str::FromStr>(s: &str, key: &str) -> Option<T> {
        s.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
    }

    /// Every `key=value` word of `s`, in order (`overhead_by_probe_ms`, `events`).
    pub fn pairs<T: std::str::FromStr>(s: &str) -> impl Iterator<Item = (&str, T)> {
        s.split_whitespace().filter_map(|w| {
            let (k, v) = w.split_once('=')?;
            Some((k, v.parse().ok()?))
        })
    }

    /// A CUDA batch's `functions` taken apart: `(function, calls, ms)`.
    pub fn cuda_functions(s: &str) -> Vec<(String, u64, f64)> {
        let mut out: Vec<(String, u64, f64)> = Vec::new();
        for w in s.split_whitespace() {
            if let Some((name, n)) = w.split_once('=') {
                out.push((name.to_owned(), n.parse().unwrap_or(0), 0.0));
            } else if let Some(v) = w.strip_prefix('(').and_then(|v| v.parse::<f64>().ok())
                && let Some(last) = out.last_mut()
            {
                last.2 = v;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmprof_abi::StepKind;

    #[test]
    fn formatted_names_parse_back() {
        assert_eq!(slice::parse_request(&slice::request(42)), Some(42));
        assert_eq!(slice::parse_request("request 4 (x)"), None);
        assert_eq!(track::request(4, "xr-4"), "request 4 (xr-4)");
        for k in [StepKind::Prefill, StepKind::Decode, StepKind::Mixed] {
            assert_eq!(slice::parse_step(slice::step(Some(k))), Some(k));
        }
        assert_eq!(slice::parse_step(slice::step(None)), None);
        use track::GpuTrack;
        assert_eq!(
            track::parse_gpu(&track::gpu_group(1, "H100", "GPU-9")),
            Some(GpuTrack::Group(1, "H100 (GPU-9)"))
        );
        assert_eq!(
            track::parse_gpu(&track::gpu_counter(0, counter::GPU[0].0)),
            Some(GpuTrack::Counter(0, "utilization"))
        );
        assert_eq!(
            track::parse_gpu(&track::gpu_process_memory(2, 77)),
            Some(GpuTrack::ProcessMemory(2, 77))
        );
        assert_eq!(track::parse_gpu(track::LLMPROF), None);
        assert_eq!(tp_arg(arg::NUM_SEQS), "debug.num_seqs");
        let stop = llmprof_abi::FinishReason::Stop;
        assert_eq!(arg::parse_finish_reason(stop.name()), Some(stop));
        assert_eq!(arg::parse_finish_reason(arg::UNFINISHED), None);
    }

    #[test]
    fn string_values_read_back() {
        let p = value::probe_counters(3, 2, 1);
        assert_eq!(p, "hits=3 emitted=2 dropped=1");
        assert_eq!(value::field::<u64>(&p, value::DROPPED), Some(1));
        let t = value::top_syscall("read", 7, 4, 1.5);
        assert_eq!(value::field::<f64>(&t, value::TOTAL_MS), Some(1.5));
        let c = value::cuda_calls(1, 2, 3, 4, 5);
        assert_eq!(value::field::<u64>(&c, value::OVER_BUDGET), Some(5));
        let f = [
            value::cuda_function("cuLaunchKernel", 50, 0.2),
            value::cuda_function("cuMemcpyHtoDAsync", 3, 0.012),
        ];
        assert_eq!(
            value::cuda_functions(&f.join(" ")),
            vec![
                ("cuLaunchKernel".to_owned(), 50, 0.2),
                ("cuMemcpyHtoDAsync".to_owned(), 3, 0.012)
            ]
        );
        assert!(value::cuda_functions("").is_empty());
        let pairs: Vec<(&str, f64)> = value::pairs("syscalls=1.500 x=y").collect();
        assert_eq!(pairs, [("syscalls", 1.5)]);
    }
}
