//! Argument keys (debug annotations; `debug.<key>` in the trace processor, see [`crate::names::tp_arg`]) and the
//! fixed values some of them take.

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
/// The most of llmprof's RSS that no other process maps, MiB.
pub const LLMPROF_MAX_PRIVATE_MIB: &str = "llmprof_max_private_mib";
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
