//! The [`Report`] data: what [`super::analyze`] produces from a trace and both outputs ([`super::json`],
//! [`super::text`]) print, with the nearest-rank [`Stats`] every latency table uses.
//!
//! Plain data and the summaries of sample sets; it never reads a trace and never formats anything.

use std::collections::BTreeMap;

/// Nearest-rank percentile summary of a sample set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Largest sample.
    pub max: Option<f64>,
    /// Arithmetic mean.
    pub mean: Option<f64>,
}

impl Stats {
    /// Summarizes `v` (any order; NaNs are ignored).
    pub fn of(v: &[f64]) -> Self {
        let mut s: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let pct = |p: f64| -> Option<f64> {
            let rank = ((p / 100.0) * n as f64).ceil().max(1.0) as usize;
            s.get(rank.min(n).checked_sub(1)?).copied()
        };
        Self {
            count: n,
            p50: pct(50.0),
            p95: pct(95.0),
            p99: pct(99.0),
            max: s.last().copied(),
            mean: (n > 0).then(|| s.iter().sum::<f64>() / n as f64),
        }
    }
}

/// One request's TTFT decomposition.
#[derive(Clone, Debug, Default)]
pub struct RequestRow {
    /// Engine request id.
    pub req_id: u64,
    /// `x-request-id` header.
    pub x_request_id: String,
    /// Queue time before the first token, ms.
    pub queue_ms: Option<f64>,
    /// Prefill time before the first token, ms.
    pub prefill_ms: Option<f64>,
    /// Arrival → first token, ms.
    pub ttft_ms: Option<f64>,
    /// The first decode/mixed step after the first token, ms.
    pub first_decode_step_ms: Option<f64>,
    /// Output tokens.
    pub output_tokens: u64,
    /// `stop` / `length` / `abort` / `error` / `unfinished`.
    pub finish_reason: String,
    /// Times preempted.
    pub preemptions: u64,
    /// llmprof attached after the request arrived: queue, prefill and TTFT are unknown (`null`).
    pub attached_mid_request: bool,
    /// Arrival → finish, ms (`None`: unfinished or attached mid-request).
    pub e2e_ms: Option<f64>,
    /// Median of the request's own inter-token gaps, ms.
    pub itl_p50_ms: Option<f64>,
    /// Seen on the wire (the HTTP probe) rather than reported by the engine: queue and prefill are unknown.
    pub wire: bool,
    /// The process the request belongs to (0: unknown).
    pub pid: u32,
    /// When it arrived (trace clock, ns).
    pub arrival_ns: u64,
    /// An engine request also seen on the wire (same `x-request-id`): the TTFT of its outermost wire view (the
    /// earliest to arrive: the API tier in front of the engine, as the client sees it), ms.
    pub wire_ttft_ms: Option<f64>,
    /// That wire TTFT minus the engine's own: the time before the first token spent outside the engine
    /// (HTTP, proxies, tokenization in the API tier, streaming back), ms.
    pub outside_engine_ttft_ms: Option<f64>,
    /// A wire request: how long its first bytes waited in the server's socket before the server read them
    /// (part of its TTFT; a busy event loop or a full accept queue), ms (`None`: arrival not seen).
    pub socket_wait_ms: Option<f64>,
    /// Its path: the request line's target (wire), else the engine's endpoint (`/v1/chat/completions`).
    pub path: String,
    /// HTTP status of its response, as the wire probe saw it (`None`: no wire view, or no status line yet).
    pub http_status: Option<u32>,
    /// Its response was a stream of server-sent events (`None`: no wire view).
    pub streamed: Option<bool>,
    /// Bytes of its response (`None`: no wire view, or its end was not seen).
    pub response_bytes: Option<u64>,
    /// An engine request joined to its wire view (one request, two views): the wire request's id.
    pub wire_req_id: Option<u64>,
    /// Its own inter-token gaps, ms (the engine's when it has them, else the wire's).
    pub itl_ms: Vec<f64>,
    /// A wire view folded into an engine request ([`Report::joined_views`]): that request's id.
    pub joined_to: Option<u64>,
}

impl RequestRow {
    /// Failed: a 4xx/5xx response, or the engine's `error`. Never counted as finished, and kept out of the
    /// latency percentiles of the successful requests.
    pub fn failed(&self) -> bool {
        self.finish_reason == "error" || self.http_status.is_some_and(|s| s >= 400)
    }

    /// The name of its outer slice in the trace (`request N`, `http request N`): what to search for in
    /// Perfetto.
    pub fn slice_name(&self) -> String {
        crate::names::slice::request(self.req_id)
    }
}

/// A step kind's or batch bucket's duration statistics.
#[derive(Clone, Debug, Default)]
pub struct BucketRow {
    /// Label (`1`, `3-4`, `65+`).
    pub bucket: String,
    /// Smallest `num_seqs`.
    pub min_seqs: u64,
    /// Largest `num_seqs` (`u64::MAX` = open).
    pub max_seqs: u64,
    /// Step durations, ms.
    pub stats: Stats,
}

/// A counter track's summary.
#[derive(Clone, Debug, Default)]
pub struct CounterSummary {
    /// Samples.
    pub samples: usize,
    /// Largest value.
    pub max: Option<f64>,
    /// Mean of the samples.
    pub mean: Option<f64>,
    /// Last value.
    pub last: Option<f64>,
}

impl CounterSummary {
    pub(super) fn of(v: &[f64]) -> Self {
        let s = Stats::of(v);
        Self {
            samples: s.count,
            max: s.max,
            mean: s.mean,
            last: v.last().copied(),
        }
    }
}

/// Time spent in one syscall (by name).
#[derive(Clone, Debug, Default)]
pub struct SyscallRow {
    /// Syscall name.
    pub name: String,
    /// Calls.
    pub count: u64,
    /// Total time, ms.
    pub total_ms: f64,
    /// Slowest call, ms (slices only).
    pub max_ms: Option<f64>,
}

/// Reads of one model file.
#[derive(Clone, Debug, Default)]
pub struct ModelFileRow {
    /// Path.
    pub path: String,
    /// read/pread64/readv calls.
    pub reads: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Time in those calls, ms.
    pub read_ms: f64,
    /// bytes / read time, MB/s (10^6 bytes).
    pub mb_per_s: Option<f64>,
    /// Opens.
    pub opens: u64,
    /// mmaps.
    pub mmaps: u64,
}

/// Connects to one destination.
#[derive(Clone, Debug, Default)]
pub struct EgressRow {
    /// Address.
    pub address: String,
    /// Port.
    pub port: u64,
    /// Attempts.
    pub connects: u64,
    /// Attempts that returned an error.
    pub failed: u64,
    /// Inside the allowed CIDRs.
    pub allowed: bool,
}

/// One probe's counters.
#[derive(Clone, Debug, Default)]
pub struct ProbeRow {
    /// Probe name (`llmprof_abi::PROBE_NAMES`).
    pub probe: String,
    /// Hits (`None` from drop counters).
    pub hits: Option<u64>,
    /// Records emitted (`None` from drop counters).
    pub emitted: Option<u64>,
    /// Records dropped.
    pub dropped: u64,
}

/// One NVML counter track of a GPU, summarized.
#[derive(Clone, Debug, Default)]
pub struct GpuCounterRow {
    /// Track name after `GPU N ` (`utilization`, `memory used`, ...).
    pub metric: String,
    /// Its unit (`%`, `MiB`, `W`, `MHz`, `°C`, `MB/s`).
    pub unit: String,
    /// The samples.
    pub summary: CounterSummary,
}

/// One GPU's counters.
#[derive(Clone, Debug, Default)]
pub struct GpuRow {
    /// NVML index.
    pub index: u64,
    /// Name and UUID as the group track shows them (empty when the group track is missing).
    pub name: String,
    /// Counter tracks, in the sink's order.
    pub counters: Vec<GpuCounterRow>,
    /// The traced processes' device memory on this GPU, MiB: `(pid, samples)`.
    pub process_memory: Vec<(u64, CounterSummary)>,
}

/// CUDA driver host time of one function.
#[derive(Clone, Debug, Default)]
pub struct CudaFnRow {
    /// Function name without its variant suffix (`cuStreamSynchronize`, `cuLaunchKernel`).
    pub function: String,
    /// Calls: individual slices plus the calls counted inside batches.
    pub calls: u64,
    /// Host time of all of them, ms.
    pub total_ms: f64,
    /// Durations of the individual slices, ms.
    pub individual: Stats,
}

/// The summary's `cuda_calls`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CudaCallsSummary {
    /// Calls seen.
    pub calls: u64,
    /// Calls shown one by one.
    pub individual: u64,
    /// Batch slices.
    pub batches: u64,
    /// Calls inside batches.
    pub batched: u64,
    /// Calls batched because their thread was over the individual-slice budget.
    pub over_budget: u64,
}

/// The GPU layer of the trace.
#[derive(Clone, Debug, Default)]
pub struct GpuSection {
    /// Per GPU, by index.
    pub gpus: Vec<GpuRow>,
    /// CUDA driver host time by function, by total time descending.
    pub cuda_functions: Vec<CudaFnRow>,
    /// All CUDA driver host time, ms.
    pub cuda_host_total_ms: f64,
    /// `cu*Synchronize` slices: where the host waited for the GPU.
    pub synchronize_calls: u64,
    /// Their total, ms.
    pub synchronize_ms: f64,
    /// Kernel/graph launches per engine step (batches with a `step_id`).
    pub launches_per_step: Stats,
    /// The summary's `cuda_calls`.
    pub summary: Option<CudaCallsSummary>,
    /// The `cuda` probe's counters.
    pub probe: Option<ProbeRow>,
    /// The GPU layer's markers, in time order.
    pub markers: Vec<String>,
}

/// Everything `llmprof report` prints.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The trace file.
    pub trace: String,
    /// The file ended mid-packet.
    pub truncated: bool,
    /// The `llmprof summary` packet is present.
    pub has_summary: bool,
    /// Why the session ended.
    pub end_reason: Option<String>,
    /// Per request, in request id order (a request seen by the engine and on the wire is one row).
    pub requests: Vec<RequestRow>,
    /// Wire views folded into the engine request they carried (same process, by timing or `x-request-id`;
    /// or an outer tier's view with the engine request's `x-request-id`), each with `joined_to` set.
    pub joined_views: Vec<RequestRow>,
    /// The first timestamp of the trace (ns): request start offsets count from it.
    pub trace_start_ns: u64,
    /// Inter-token latencies of the successful requests, ms (each request counted once: a request seen by
    /// the engine and on the wire gives the engine's).
    pub itl_ms: Vec<f64>,
    /// Step durations by kind, ms.
    pub steps_by_kind: BTreeMap<String, Stats>,
    /// Prompt tokens the steps computed (cached prefixes are not computed), summed over the steps.
    pub steps_prefill_tokens: u64,
    /// Decode tokens of the steps (one per sequence that was past its prompt), summed.
    pub steps_decode_tokens: u64,
    /// Step durations by batch-size bucket (non-empty buckets).
    pub steps_by_batch: Vec<BucketRow>,
    /// Step durations of the steps that replayed a CUDA graph, ms (the engine's `graph_batch` arg).
    pub steps_graph_replayed: Stats,
    /// Counter summaries by JSON key.
    pub counters: BTreeMap<&'static str, CounterSummary>,
    /// Last `preemptions` counter value.
    pub preemptions_total: Option<f64>,
    /// Slow-syscall slices by name.
    pub slow_syscalls: Vec<SyscallRow>,
    /// The summary's kernel aggregates by name.
    pub syscall_aggregates: Vec<SyscallRow>,
    /// Model files.
    pub model_files: Vec<ModelFileRow>,
    /// Egress destinations.
    pub egress: Vec<EgressRow>,
    /// Drops: total, user, decode errors.
    pub total_dropped: u64,
    /// Drops in user space.
    pub user_drops: u64,
    /// Undecodable records.
    pub decode_errors: u64,
    /// `summary` or `drop_counters`.
    pub drops_source: &'static str,
    /// Per probe.
    pub probes: Vec<ProbeRow>,
    /// Off-CPU stacks not taken by design (the kernel's per-CPU rate bound): not a loss, not in the drops.
    pub offcpu_not_taken: Option<u64>,
    /// llmprof's self-accounting (None: a trace without it).
    pub overhead: Option<OverheadReport>,
    /// Thread states per thread name (None: a trace without scheduler events).
    pub thread_states: Option<super::ThreadStates>,
    /// The GPU layer (None: a trace without any of it).
    pub gpu: Option<GpuSection>,
    /// CPU stack samples per thread group (None: a trace without samples).
    pub cpu_samples: Option<super::CpuSamplesSection>,
    /// GPU kernels from CUPTI (`None` without kernel slices).
    pub kernels: Option<super::KernelsSection>,
}

/// One step the overhead budget took.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DegradationRow {
    /// Seconds from the first event of the trace.
    pub at_s: f64,
    /// Level entered.
    pub level: u64,
    /// Step name (`llmprof::budget::LEVELS`).
    pub step: String,
    /// What changed.
    pub change: String,
    /// The estimate that exceeded the budget, %.
    pub est_overhead_pct: Option<f64>,
    /// Syscalls the kernel aggregates had counted then.
    pub syscalls_counted: Option<u64>,
}

/// llmprof's own cost as the trace records it (summary args, budget instants, size marker).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OverheadReport {
    /// Estimated CPU added to the target, ms.
    pub est_target_cpu_ms: Option<f64>,
    /// Of it, the injected CUPTI helper's: CUPTI's buffer thread and the helper's callbacks (measured in the
    /// target) + records × an assumed per-record cost in the launching threads, ms.
    pub est_cupti_ms: Option<f64>,
    /// The measured part of [`OverheadReport::est_cupti_ms`], ms.
    pub cupti_thread_cpu_ms: Option<f64>,
    /// CUPTI records written.
    pub cupti_records: Option<u64>,
    /// The assumed per-record cost, ns.
    pub cost_ns_cupti_record: Option<f64>,
    /// The same as a % of the target's own CPU time.
    pub est_target_pct: Option<f64>,
    /// The target's CPU time during the session, ms.
    pub target_cpu_ms: Option<f64>,
    /// Estimated CPU added per probe, ms.
    pub by_probe_ms: Vec<(String, f64)>,
    /// llmprof's CPU, ms and % of one core.
    pub llmprof_cpu_ms: Option<f64>,
    /// See [`OverheadReport::llmprof_cpu_ms`].
    pub llmprof_cpu_pct: Option<f64>,
    /// llmprof's peak RSS, MiB.
    pub llmprof_max_rss_mib: Option<f64>,
    /// The most of it no other process mapped, MiB (older traces: none).
    pub llmprof_max_private_mib: Option<f64>,
    /// Calibrated cost per hit, ns: syscall, engine probe, engine probe sampled out.
    pub cost_ns_syscall: Option<f64>,
    /// See [`OverheadReport::cost_ns_syscall`]: a syscall whose exit llmprof decodes (read, write, close, ...).
    pub cost_ns_syscall_decoded: Option<f64>,
    /// See [`OverheadReport::cost_ns_syscall`].
    pub cost_ns_engine_probe: Option<f64>,
    /// See [`OverheadReport::cost_ns_syscall`].
    pub cost_ns_engine_probe_sampled_out: Option<f64>,
    /// See [`OverheadReport::cost_ns_syscall`]: a CUDA driver call (entry + return probe).
    pub cost_ns_cuda_call: Option<f64>,
    /// See [`OverheadReport::cost_ns_syscall`]: a thread-state record.
    pub cost_ns_sched_event: Option<f64>,
    /// See [`OverheadReport::cost_ns_syscall`]: a stack sample (eBPF; off-CPU stacks cost the same).
    pub cost_ns_sample: Option<f64>,
    /// See [`OverheadReport::cost_ns_syscall`]: an off-CPU stack at a blocking switch (eBPF).
    pub cost_ns_offcpu_stack: Option<f64>,
    /// A stack sample measured on the targets during the session (charged in place of `cost_ns_sample`).
    pub cost_ns_sample_live: Option<f64>,
    /// See [`OverheadReport::cost_ns_syscall`]: a request the wire probe followed.
    pub cost_ns_http_request: Option<f64>,
    /// See [`OverheadReport::cost_ns_syscall`]: a followed SSE write.
    pub cost_ns_http_sse_write: Option<f64>,
    /// Stacks llmprof symbolized.
    pub symbolized_stacks: Option<u64>,
    /// llmprof's CPU time symbolizing them, ms (part of `llmprof_cpu_ms`).
    pub symbolize_ms: Option<f64>,
    /// Distinct addresses symbolized, those no symbol named, and those in no mapping.
    pub symbolize_addresses: Option<u64>,
    /// See [`OverheadReport::symbolize_addresses`].
    pub symbolize_unknown: Option<u64>,
    /// See [`OverheadReport::symbolize_addresses`].
    pub symbolize_unmapped: Option<u64>,
    /// Of `symbolize_ms`, the time resolving addresses not seen before, ms.
    pub symbolize_resolve_ms: Option<f64>,
    /// llmprof's own CPU charged to the target on the CPUs they share, ms (part of `est_target_cpu_ms`).
    pub llmprof_cpu_charged_ms: Option<f64>,
    /// CPUs the target and llmprof share.
    pub shared_cpus: Option<u64>,
    /// Idle share of those CPUs during the session, %.
    pub shared_idle_pct: Option<f64>,
    /// How the engine probe is entered (optimized call or int3).
    pub probe_entry: Option<String>,
    /// `--overhead-budget`, %.
    pub budget_pct: Option<f64>,
    /// The budget's steps in order.
    pub degradations: Vec<DegradationRow>,
    /// `--max-trace-size`, bytes.
    pub size_limit_bytes: Option<u64>,
    /// The size limit ended the trace.
    pub size_limit_reached: bool,
    /// Events not written because of it.
    pub events_not_written: Option<u64>,
}

impl Report {
    pub(super) fn col(&self, f: impl Fn(&RequestRow) -> Option<f64>) -> Stats {
        Stats::of(&self.requests.iter().filter_map(f).collect::<Vec<_>>())
    }

    /// A column over the requests that did not fail ([`RequestRow::failed`]).
    pub fn ok_col(&self, f: impl Fn(&RequestRow) -> Option<f64>) -> Stats {
        self.col(|q| if q.failed() { None } else { f(q) })
    }

    /// TTFT over the successful requests that got a first token (an engine request, or a streamed response
    /// on the wire: a response sent whole has no first token).
    pub fn ttft(&self) -> Stats {
        self.ok_col(|q| q.ttft_ms)
    }

    /// Requests by outcome: (finished, failed, cancelled, still running).
    pub fn outcomes(&self) -> (usize, usize, usize, usize) {
        let mut o = (0, 0, 0, 0);
        for q in &self.requests {
            if q.failed() {
                o.1 += 1;
            } else if q.finish_reason == "abort" {
                o.2 += 1;
            } else if q.finish_reason == crate::names::arg::UNFINISHED {
                o.3 += 1;
            } else {
                o.0 += 1;
            }
        }
        o
    }

    /// Responses by HTTP status, ascending; requests without a status are not counted.
    pub fn status_counts(&self) -> Vec<(u32, u64)> {
        let mut m: BTreeMap<u32, u64> = BTreeMap::new();
        for s in self.requests.iter().filter_map(|q| q.http_status) {
            *m.entry(s).or_default() += 1;
        }
        m.into_iter().collect()
    }

    /// Failed requests as a share of those that ended with an outcome (finished or failed), %.
    pub fn error_rate_pct(&self) -> Option<f64> {
        let (ok, failed, _, _) = self.outcomes();
        (ok + failed > 0).then(|| failed as f64 * 100.0 / (ok + failed) as f64)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Stats::of(&v);
        assert_eq!(
            (s.p50, s.p95, s.p99, s.max),
            (Some(50.0), Some(95.0), Some(99.0), Some(100.0))
        );
        assert_eq!(Stats::of(&[]).p50, None);
        assert_eq!(Stats::of(&[7.0]).p99, Some(7.0));
    }
}
