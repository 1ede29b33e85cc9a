//! `llmprof report`: reads an llmprof Perfetto trace back and summarizes it for a terminal or a script.
//!
//! Owns the reading side of the trace layout written by [`crate::perfetto::sink`]: it decodes the file with the
//! same prost schema ([`crate::perfetto::schema`]) packet by packet, rebuilds slices, instants and counters per
//! track, and computes the numbers of issue 6 ("llmprof report"). It never runs Perfetto's trace processor and
//! never writes anything; a file that is not an llmprof trace is a [`ReportError`], not an empty report.
//!
//! # `--json` output (stable; fields are only ever added)
//! All durations are milliseconds (`*_ms`), all percentiles are nearest-rank over the samples named in the
//! section (`{"count", "p50", "p95", "p99", "max", "mean"}`, values `null` when there are no samples).
//! - `format`: `"llmprof-report/1"`; `trace`: the path; `truncated`: the file ended mid-packet (crash);
//!   `has_summary`: the final `llmprof summary` packet is present; `end_reason`: from it (`null` without).
//! - `requests`: `{count, finished, unfinished, failed, cancelled, joined, status_counts, error_rate_pct,
//!   ttft_ms, queue_ms, prefill_ms, first_decode_step_ms, itl_ms, e2e_ms, outside_engine_ttft_ms,
//!   socket_wait_ms, failed_e2e_ms, per_request: [{req_id, x_request_id, queue_ms, prefill_ms, ttft_ms,
//!   first_decode_step_ms, output_tokens, finish_reason, preemptions, attached_mid_request, e2e_ms, itl_p50_ms,
//!   wire, pid, wire_ttft_ms, outside_engine_ttft_ms, socket_wait_ms, start_s, path, http_status, failed,
//!   streamed, response_bytes, wire_req_id, perfetto_slice, joined_to}], joined_views: [same]}`. One request
//!   is one `per_request` entry (`joined_to` `null`); the wire views folded into one are kept whole in
//!   `joined_views`, each with `joined_to` = its engine entry's `req_id`. An engine request
//!   seen on the wire too (by llmserve's own HTTP server, joined by the capture by timing or `x-request-id`;
//!   or by a gateway in another process with its `x-request-id`) is its engine entry, with the wire's
//!   `http_status`, `path`, `streamed`, `response_bytes`, `wire_req_id` and `wire_ttft_ms`; `joined` counts
//!   the wire views folded so (`joined_views`). `wire`: a request seen only by the HTTP wire probe (`http request N` tracks;
//!   queue and prefill `null`). `failed`: a 4xx/5xx status or an engine `error` — never counted in `finished`
//!   (which counts the requests that ended otherwise, `cancelled` ones included: the client went away), and
//!   left out of every latency percentile here but `failed_e2e_ms`; `error_rate_pct` = failed / (finished −
//!   cancelled + failed). `attached_mid_request`: in flight when tracing started (its arrival precedes the
//!   trace's `tracing started` marker, or was not seen: then its queue/prefill/TTFT are `null` and it is left
//!   out of those percentiles). `start_s`: arrival, seconds from the first timestamp of the trace;
//!   `perfetto_slice`: its outer slice's name (`request N`, `http request N`), to search in Perfetto UI.
//!   `queue_ms` = time in `queued` / `queued (preempted)` phases before the first
//!   token (arrival → scheduled), `prefill_ms` = time in `prefill` phases before it (scheduled → first token),
//!   `ttft_ms` = arrival → first token (= queue + prefill; on the wire only a streamed response has a first
//!   token), `first_decode_step_ms` = duration of the first
//!   `decode`/`mixed` engine step that serves the request after its first token. `itl_ms`: inter-token latency
//!   samples = gaps between consecutive token times of a request, token times being its first token and the
//!   ends of the `decode`/`mixed` steps that served it afterwards (one token per step per request; a request
//!   seen only on the wire: its SSE content events); a request
//!   no step names falls back to one sample, (finish − first token) / (output tokens − 1).
//! - `steps`: `{count, by_kind: {prefill|decode|mixed: stats}, by_batch_size: [{bucket, min_seqs, max_seqs,
//!   stats}], graph_replayed: stats}`, step durations (host) by kind, by `num_seqs` bucket ([`BATCH_BUCKETS`]),
//!   and of the steps that replayed a CUDA graph (the step's `graph_batch` arg).
//! - `counters`: `{kv_cache_usage, requests_waiting, requests_running}` each `{samples, max, mean, last}`
//!   (mean of the samples, taken every scrape interval) and `preemptions_total` (last value).
//! - `syscalls`: `{slow_syscall_slices: [{name, count, total_ms, max_ms}], kernel_aggregates: [{name, count,
//!   total_ms}]}`, both by total time, descending. Slices are the calls slower than `--slow-syscall`; the
//!   aggregates are the summary's `top_syscalls` (all calls, top [`crate::perfetto::sink::SUMMARY_TOP_SYSCALLS`]
//!   per thread and syscall, summed by name here).
//! - `model_files`: `[{path, reads, bytes, read_ms, mb_per_s, opens, mmaps}]` (read/pread64/readv slices).
//! - `egress`: `[{address, port, connects, failed, allowed, verdict}]` (`verdict`: `allowed` / `flagged`).
//! - `drops`: `{total_dropped, user_drops, decode_errors, source, probes: [{probe, hits, emitted, dropped}],
//!   offcpu_not_taken}`; `source` is `summary` or `drop_counters` (the per-probe counter tracks, when the
//!   summary is missing); `offcpu_not_taken`: off-CPU stacks the kernel's per-CPU rate bound did not take, by
//!   design (not a loss, not in `total_dropped`; `null` when none or an older trace).
//! - `overhead`: llmprof's self-accounting, `null` for traces without it: `{est_target_cpu_ms,
//!   est_target_pct, target_cpu_ms, by_probe_ms: {probe: ms}, est_cupti_ms, cupti_thread_cpu_ms, cupti_records,
//!   llmprof_cpu_ms, llmprof_cpu_pct, llmprof_max_rss_mib, llmprof_max_private_mib, cost_ns: {syscall, syscall_decoded, engine_probe,
//!   engine_probe_sampled_out, cuda_call, ..., cupti_record}, probe_entry, budget_pct, degradations: [{at_s, level, step, change, est_overhead_pct,
//!   syscalls_counted}],
//!   size_limit_bytes, size_limit_reached, events_not_written, symbolize_addresses, symbolize_unknown,
//!   symbolize_unmapped, symbolize_resolve_ms, llmprof_cpu_charged_ms, shared_cpus, shared_idle_pct}`; `est_target_pct` is the
//!   estimated CPU llmprof added as a % of the target's own CPU time (the `--overhead-budget` measure):
//!   the probes' cost per hit, plus `llmprof_cpu_charged_ms`, llmprof's own CPU that the target lost because
//!   they share CPUs it keeps busy (`shared_idle_pct`: idle share of those `shared_cpus`), and
//!   `est_cupti_ms`, the injected CUPTI helper's part (`cupti_thread_cpu_ms` measured in the target +
//!   `cupti_records` × `cost_ns.cupti_record`); `at_s` seconds from the first slice or instant of the trace.
//!   `symbolize_*`: distinct addresses llmprof symbolized, those no symbol named, and of those the ones in no
//!   mapping (a frame-pointer walk gone astray in code without frame pointers); `symbolize_resolve_ms`: the
//!   part of `symbolize_ms` spent on addresses not seen before (each library's symbols read once), the rest is
//!   the per-stack cost of the cache. Missing values are `null`.
//! - `gpu`: the GPU layer, `null` when the trace has none of it (no NVML counter, no CUDA driver call slice,
//!   no GPU marker): `{gpus: [{index, name, counters: [{metric, unit, samples, mean, max, last}],
//!   process_memory_mib: [{pid, samples, mean, max, last}]}], cuda: {functions: [{function, calls, total_ms,
//!   individual}], host_total_ms, synchronize_calls, synchronize_ms, launches_per_step, summary, probe},
//!   markers: [text]}`. `counters` are the NVML counter tracks of the GPU in the sink's order (`metric` =
//!   the track name after `GPU N `, e.g. `utilization`, `memory used`, `power`; `unit` `%`, `MiB`, `W`, `MHz`,
//!   `°C`, `MB/s`), `process_memory_mib` the target's own device memory on it (`GPU N memory (pid P)`).
//!   `functions`: CUDA driver host time by function (the name without the `_v2`/`_ptsz` variant), by
//!   `total_ms` descending: `calls` and `total_ms` count the individual slices and the calls inside batches
//!   (their `functions` arg), `individual` is the stats of the individual slices (synchronize calls always,
//!   copies/allocations ≥ 50 µs). `synchronize_*`: the `cu*Synchronize` slices, where the host waited for the
//!   GPU. `launches_per_step`: stats of the kernel/graph launches per engine step (summed over the batches
//!   with one `step_id` in one process; `count` 0 without engine probes). `summary`: the summary's
//!   `cuda_calls` `{calls, individual, batches, batched, over_budget}` or `null`; `probe`: the `cuda` probe's
//!   `{hits, emitted, dropped}` or `null`. `markers`: the GPU layer's markers on the `llmprof` track
//!   (`GPU counters unavailable: ...`, `libcuda not loaded ...`, `CUDA driver probes attached/failed ...`).
//! - `cpu_samples`: on-CPU stack samples, `null` without any: `{samples, threads: [{name, tids, samples,
//!   top_self: [{function, samples, pct}], top_total: [...]}]}` (see `stacks`: threads grouped by name).
//!
//! - `thread_states`: `null` without scheduler events (`--no-thread-states`, older traces): `{events,
//!   groups: [{name, threads, cpu_ms, runnable_ms, sleeping_ms, uninterruptible_ms, idle_ms, switches,
//!   runnable_wait_ms: stats, wakers: [{waker, wakeups}], per_thread: [{tid, pid, cpu_ms, runnable_ms,
//!   sleeping_ms, uninterruptible_ms, idle_ms, switches}]}]}`, one group per thread name, by `cpu_ms`
//!   descending. `runnable_ms` is time runnable but not running (waiting for a CPU); `runnable_wait_ms` the
//!   stats of each such wait; `wakers` the top [`sched::TOP_WAKERS`] wakers of the group's threads as
//!   `name (tid)`, `(interrupt)` for wakeups from interrupt context (timers, devices).
//!
//! - `kernels`: GPU kernels from CUPTI (top kernels by GPU time, GPU busy and idle time inside engine steps),
//!   `null` without kernel slices; see `cupti`.
//!
//! # Layout
//! `read` decodes the file into tracks of slices, instants and counters; `analyze` turns them into the
//! [`Report`] (its types live in `data`), one section per probe family in a file named after it: `engine`
//! (steps and each request's [`crate::event::engine::RequestTimeline`] rebuilt from its track and the steps'
//! typed args; wire requests are read the same way), `syscalls`, `files`, `egress`, `cuda` (the `gpu` section:
//! driver calls, NVML counters, GPU markers), `cupti` (`kernels`), `sched` (`thread_states`), `stacks`
//! (`cpu_samples`); `json` writes the `--json` document, `text` the terminal report. Every name is read with
//! [`crate::names`]. A new family's section is one more file here.

// What every section shares: reading the trace, the analysis that calls each section, the report data and its
// two outputs.
mod analyze;
mod data;
mod json;
mod read;
mod text;
mod verdict;

// One section per probe family (the report has none for proc and python: processes are the tracks it reads,
// Python frames are inside the stack samples).
mod cuda;
mod cupti;
mod egress;
mod engine;
mod files;
mod sched;
mod stacks;
mod syscalls;

use std::path::{Path, PathBuf};

pub use sched::{ThreadGroup, ThreadRow, ThreadStates};

pub use cupti::{KernelRow, KernelsSection, StepGpuRow, StepsGpu};
pub use data::{
    BucketRow, CounterSummary, CudaCallsSummary, CudaFnRow, DegradationRow, EgressRow, GpuCounterRow, GpuRow,
    GpuSection, ModelFileRow, OverheadReport, ProbeRow, Report, RequestRow, Stats, SyscallRow,
};
pub use stacks::{CpuSamplesSection, FunctionRow, ThreadSamples};

/// Version tag of the `--json` layout (bumped only on an incompatible change).
pub const JSON_FORMAT: &str = "llmprof-report/1";

/// Batch-size buckets of the step table, `(min_seqs, max_seqs)` inclusive: powers of two, the shape of the
/// batch sizes engines capture CUDA graphs for (vLLM's `cudagraph_capture_sizes` 1, 2, 4, 8, ...).
pub const BATCH_BUCKETS: [(u64, u64); 8] = [
    (0, 1),
    (2, 2),
    (3, 4),
    (5, 8),
    (9, 16),
    (17, 32),
    (33, 64),
    (65, u64::MAX),
];

/// Why a trace could not be reported on.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is empty.
    #[error(
        "{path} is empty: not a Perfetto trace (was the attach session killed before it wrote anything?)"
    )]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The first packet does not decode: not a Perfetto trace at all.
    #[error("{path} is not a Perfetto trace ({reason}); give a file written by `llmprof attach -o FILE`")]
    NotPerfetto {
        /// The file.
        path: PathBuf,
        /// What did not decode.
        reason: String,
    },
    /// A Perfetto trace, but without any track llmprof writes.
    #[error(
        "{path} is a Perfetto trace but not one llmprof wrote (no `llmprof`, `engine steps`, request, syscall or \
         counter tracks); `llmprof report` reads the files of `llmprof attach -o FILE`"
    )]
    NotLlmprof {
        /// The file.
        path: PathBuf,
    },
}

/// Reads and summarizes the trace at `path`.
pub fn load(path: &Path) -> Result<Report, ReportError> {
    let bytes = std::fs::read(path).map_err(|source| ReportError::Io {
        path: path.to_owned(),
        source,
    })?;
    from_bytes(path, &bytes)
}

/// Summarizes trace bytes (`path` only names the file in errors and output).
pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Report, ReportError> {
    let d = read::decode(path, bytes)?;
    Ok(analyze::analyze(path, &d))
}
