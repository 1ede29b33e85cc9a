//! Attribute and span names the OTel sink writes: the OpenTelemetry semantic conventions it follows (GenAI,
//! resource, HTTP, thread, file, network) and llmprof's own `llmprof.*` names.
//!
//! Owns names only, so every exported key is spelled once and the tests assert on the same constants.
//! GenAI names come from the OpenTelemetry GenAI semantic conventions (registry `gen_ai.*`, development status;
//! now maintained in the semantic-conventions-genai repository); the other standard names from the general
//! semantic-conventions registry. Durations follow the conventions' unit: seconds, as doubles.

// --- GenAI (semconv registry, `gen_ai.*`) ---

/// `gen_ai.operation.name`: `chat` or `text_completion` (well-known values of the registry).
pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
/// `gen_ai.provider.name`. The registry lists hosted providers (openai, aws.bedrock, ...); a provider not in
/// the list reports a custom value, so a self-hosted llmserve reports [`PROVIDER_LLMSERVE`].
pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
/// `gen_ai.request.model`.
pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
/// `gen_ai.response.model` (llmserve serves the model it was asked for).
pub const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
/// `gen_ai.request.max_tokens`.
pub const GEN_AI_REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
/// `gen_ai.request.temperature`.
pub const GEN_AI_REQUEST_TEMPERATURE: &str = "gen_ai.request.temperature";
/// `gen_ai.request.top_p`.
pub const GEN_AI_REQUEST_TOP_P: &str = "gen_ai.request.top_p";
/// `gen_ai.response.finish_reasons` (string array).
pub const GEN_AI_RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
/// `gen_ai.usage.input_tokens`.
pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
/// `gen_ai.usage.output_tokens`.
pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// `gen_ai.response.time_to_first_chunk`, seconds from the request's arrival to its first output token.
pub const GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: &str = "gen_ai.response.time_to_first_chunk";

/// Operation of `/v1/chat/completions` (registry value `chat`).
pub const OPERATION_CHAT: &str = "chat";
/// Operation of `/v1/completions` (registry value `text_completion`).
pub const OPERATION_TEXT_COMPLETION: &str = "text_completion";
/// Our `gen_ai.provider.name`: the engine's name (custom value; see [`GEN_AI_PROVIDER_NAME`]).
pub const PROVIDER_LLMSERVE: &str = "llmserve";

// --- General semconv ---

/// `error.type`: set to the finish reason when a request ended in an engine error.
pub const ERROR_TYPE: &str = "error.type";
/// `http.request.header.<key>`, a string array, for the caller's `x-request-id`.
pub const HTTP_REQUEST_HEADER_X_REQUEST_ID: &str = "http.request.header.x-request-id";
/// `thread.id` of the engine thread a kernel event came from.
pub const THREAD_ID: &str = "thread.id";
/// `file.path` of a model file.
pub const FILE_PATH: &str = "file.path";
/// `network.peer.address` of a flagged connection.
pub const NETWORK_PEER_ADDRESS: &str = "network.peer.address";
/// `network.peer.port` of a flagged connection.
pub const NETWORK_PEER_PORT: &str = "network.peer.port";

// --- Resource (semconv resource registry) ---

/// `service.name`.
pub const SERVICE_NAME: &str = "service.name";
/// `host.name`.
pub const HOST_NAME: &str = "host.name";
/// `process.pid`.
pub const PROCESS_PID: &str = "process.pid";
/// `process.executable.name`.
pub const PROCESS_EXECUTABLE_NAME: &str = "process.executable.name";
/// `process.executable.path`.
pub const PROCESS_EXECUTABLE_PATH: &str = "process.executable.path";
/// Default `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names one: the engine.
pub const DEFAULT_SERVICE_NAME: &str = "llmserve";

// --- llmprof's own ---

/// Version of llmprof that built the spans (resource attribute; also the instrumentation scope's version).
pub const LLMPROF_VERSION: &str = "llmprof.version";
/// GPU UUID of the traced engine, when known (resource attribute; semconv has no GPU resource attribute).
pub const LLMPROF_GPU_UUID: &str = "llmprof.gpu.uuid";
/// Engine request id (unique per engine process).
pub const LLMPROF_REQUEST_ID: &str = "llmprof.request_id";
/// Seconds from arrival to first scheduling.
pub const LLMPROF_QUEUE_TIME: &str = "llmprof.queue_time";
/// Seconds in prefill (prompt and recompute chunks).
pub const LLMPROF_PREFILL_TIME: &str = "llmprof.prefill_time";
/// Seconds in decode.
pub const LLMPROF_DECODE_TIME: &str = "llmprof.decode_time";
/// Seconds spent preempted (waiting to be recomputed).
pub const LLMPROF_PREEMPTED_TIME: &str = "llmprof.preempted_time";
/// Times the request was preempted.
pub const LLMPROF_PREEMPTIONS: &str = "llmprof.preemptions";
/// Seconds of GPU kernel time of the steps that served the request, each step's split by the request's share of
/// its tokens (CUPTI kernels; only in sessions with GPU activity).
pub const LLMPROF_GPU_KERNEL_TIME: &str = "llmprof.gpu.kernel_time";
/// Engine steps that served the request.
pub const LLMPROF_STEPS: &str = "llmprof.steps";
/// Prefill chunks (steps that computed prompt or recompute tokens for the request).
pub const LLMPROF_PREFILL_CHUNKS: &str = "llmprof.prefill_chunks";
/// True when the session began after the request arrived: its start is when llmprof first saw it.
pub const LLMPROF_PARTIAL: &str = "llmprof.partial";
/// True when the session ended before the request finished: its end is the session's last event.
pub const LLMPROF_UNFINISHED: &str = "llmprof.unfinished";
/// Engine step id (on prefill chunk spans).
pub const LLMPROF_STEP_ID: &str = "llmprof.step.id";
/// Kind of the engine step (`prefill`, `decode`, `mixed`).
pub const LLMPROF_STEP_KIND: &str = "llmprof.step.kind";
/// Sequences in the step's batch.
pub const LLMPROF_STEP_NUM_SEQS: &str = "llmprof.step.num_seqs";
/// Prefill tokens of the whole batch (this request's share is [`LLMPROF_PREFILL_CHUNK_TOKENS`]).
pub const LLMPROF_STEP_PREFILL_TOKENS: &str = "llmprof.step.prefill_tokens";
/// Decode tokens of the whole batch.
pub const LLMPROF_STEP_DECODE_TOKENS: &str = "llmprof.step.decode_tokens";
/// Seconds the step itself ran on the host (a chunk span also covers the scheduling gap before its step).
pub const LLMPROF_STEP_HOST_DURATION: &str = "llmprof.step.host_duration";
/// This request's own tokens computed in the chunk (its share of the batch; ABI v2 `req_tokens`).
pub const LLMPROF_PREFILL_CHUNK_TOKENS: &str = "llmprof.prefill.tokens";
/// The prompt (only with `--capture-content`): a JSON array of messages, GenAI semantic conventions.
pub const GEN_AI_INPUT_MESSAGES: &str = "gen_ai.input.messages";
/// The completion (only with `--capture-content`): a JSON array of messages.
pub const GEN_AI_OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
/// True when captured text was cut at the probe's limit (4 KiB per text).
pub const LLMPROF_CONTENT_TRUNCATED: &str = "llmprof.content.truncated";
/// Index of a prefill chunk within the request (0-based).
pub const LLMPROF_CHUNK_INDEX: &str = "llmprof.chunk.index";
/// True on prefill chunks that recompute a preempted request.
pub const LLMPROF_RECOMPUTE: &str = "llmprof.recompute";
/// Decode steps within a decode span.
pub const LLMPROF_DECODE_STEPS: &str = "llmprof.decode.steps";
/// Syscall number (x86-64) of a slow syscall event.
pub const LLMPROF_SYSCALL_NR: &str = "llmprof.syscall.nr";
/// Syscall name (`syscall_<nr>` when llmprof's table does not know it).
pub const LLMPROF_SYSCALL_NAME: &str = "llmprof.syscall.name";
/// Return value of a syscall / file operation / connect.
pub const LLMPROF_RET: &str = "llmprof.ret";
/// Duration of a kernel-observed operation, seconds.
pub const LLMPROF_DURATION: &str = "llmprof.duration";
/// Model-file operation (`open`, `read`, `pread64`, `readv`, `mmap`, `close`).
pub const LLMPROF_FILE_OP: &str = "llmprof.file.op";
/// Bytes requested by a model-file operation.
pub const LLMPROF_FILE_LEN: &str = "llmprof.file.len";
/// llmprof's estimated overhead on the target when the request span was built, % of the target's CPU time
/// (self-accounting of the last tick; `profiler-user/src/selfacct.rs`).
pub const LLMPROF_OVERHEAD_PCT: &str = "llmprof.overhead.est_target_cpu_pct";
/// Extra ns per traced syscall, calibrated at attach start-up.
pub const LLMPROF_COST_SYSCALL_NS: &str = "llmprof.overhead.cost_per_syscall_ns";
/// Extra ns per engine probe hit, calibrated at attach start-up.
pub const LLMPROF_COST_PROBE_NS: &str = "llmprof.overhead.cost_per_probe_hit_ns";
/// Extra ns per CUDA driver call (entry + return uprobe pair), calibrated at attach start-up.
pub const LLMPROF_COST_CUDA_NS: &str = "llmprof.overhead.cost_per_cuda_call_ns";
/// The overhead budget's degradation level in force (0: full tracing; `profiler-user/src/budget.rs`).
pub const LLMPROF_DEGRADATION_LEVEL: &str = "llmprof.overhead.degradation_level";

// --- Span and span-event names ---

/// Child span: arrival → first scheduled.
pub const SPAN_QUEUE: &str = "queue";
/// Child span: one prefill chunk.
pub const SPAN_PREFILL: &str = "prefill";
/// Child span: a stretch of decode steps.
pub const SPAN_DECODE: &str = "decode";
/// Child span: preempted → resumed.
pub const SPAN_PREEMPTED: &str = "preempted";
/// Span event: a syscall slower than the session's threshold on an engine thread.
pub const EVENT_SLOW_SYSCALL: &str = "slow_syscall";
/// Span event: an open or I/O of a model file.
pub const EVENT_MODEL_FILE: &str = "model_file_io";
/// Span event: a connection to an address outside the allowed networks.
pub const EVENT_FLAGGED_EGRESS: &str = "flagged_egress";
