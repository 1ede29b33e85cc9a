//! The `--json` document of `llmprof report` (layout and stability rules in the [module docs](super)).
//!
//! Owns the mapping from the [`Report`] to that layout: one `#[derive(Serialize)]` struct per JSON object,
//! its fields in the documented key order (serde writes struct fields in declaration order), every float
//! through [`Num`] (rounded to 1e-6, `null` when not finite). Formatting only: every number comes from the
//! [`Report`]; a field added here is a field added to the module docs.

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};

use super::{
    CounterSummary, CudaCallsSummary, CudaFnRow, DegradationRow, EgressRow, GpuCounterRow, GpuRow,
    GpuSection, JSON_FORMAT, ModelFileRow, OverheadReport, ProbeRow, Report, RequestRow, Stats, SyscallRow,
};

mod threads;

impl Report {
    /// The `--json` document (layout in the module docs).
    pub fn to_json(&self) -> String {
        let mut out = serde_json::to_string_pretty(&Doc::of(self)).unwrap_or_default();
        out.push('\n');
        out
    }
}

/// A float as the layout writes it: rounded to 1e-6 (`0.266667`), `null` when not finite.
#[derive(Clone, Copy, Debug)]
struct Num(f64);

impl Serialize for Num {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = (self.0 * 1e6).round() / 1e6;
        if v.is_finite() {
            s.serialize_f64(v)
        } else {
            s.serialize_none()
        }
    }
}

fn opt(v: Option<f64>) -> Option<Num> {
    v.map(Num)
}

/// The whole document.
#[derive(Serialize)]
struct Doc<'a> {
    format: &'static str,
    trace: &'a str,
    truncated: bool,
    has_summary: bool,
    end_reason: Option<&'a str>,
    requests: Requests<'a>,
    steps: Steps<'a>,
    counters: Counters,
    syscalls: Syscalls<'a>,
    model_files: Vec<ModelFile<'a>>,
    egress: Vec<Egress<'a>>,
    drops: Drops<'a>,
    overhead: Option<Overhead<'a>>,
    gpu: Option<Gpu<'a>>,
    thread_states: Option<threads::ThreadStatesJson<'a>>,
    cpu_samples: Option<&'a super::CpuSamplesSection>,
    kernels: Option<&'a super::KernelsSection>,
}

impl<'a> Doc<'a> {
    fn of(r: &'a Report) -> Self {
        Self {
            format: JSON_FORMAT,
            trace: &r.trace,
            truncated: r.truncated,
            has_summary: r.has_summary,
            end_reason: r.end_reason.as_deref(),
            requests: Requests::of(r),
            steps: Steps::of(r),
            counters: Counters::of(r),
            syscalls: Syscalls {
                slow_syscall_slices: r.slow_syscalls.iter().map(SlowSyscall::of).collect(),
                kernel_aggregates: r.syscall_aggregates.iter().map(AggregateSyscall::of).collect(),
            },
            model_files: r.model_files.iter().map(ModelFile::of).collect(),
            egress: r.egress.iter().map(Egress::of).collect(),
            drops: Drops {
                total_dropped: r.total_dropped,
                user_drops: r.user_drops,
                decode_errors: r.decode_errors,
                source: r.drops_source,
                probes: r.probes.iter().map(Probe::of).collect(),
                offcpu_not_taken: r.offcpu_not_taken,
            },
            overhead: r.overhead.as_ref().map(Overhead::of),
            gpu: r.gpu.as_ref().map(Gpu::of),
            thread_states: r.thread_states.as_ref().map(threads::ThreadStatesJson::of),
            cpu_samples: r.cpu_samples.as_ref(),
            kernels: r.kernels.as_ref(),
        }
    }
}

/// `{count, p50, p95, p99, max, mean}`.
#[derive(Serialize)]
pub(super) struct StatsJson {
    count: usize,
    p50: Option<Num>,
    p95: Option<Num>,
    p99: Option<Num>,
    max: Option<Num>,
    mean: Option<Num>,
}

impl StatsJson {
    pub(super) fn of(s: &Stats) -> Self {
        Self {
            count: s.count,
            p50: opt(s.p50),
            p95: opt(s.p95),
            p99: opt(s.p99),
            max: opt(s.max),
            mean: opt(s.mean),
        }
    }
}

/// `requests`.
#[derive(Serialize)]
struct Requests<'a> {
    count: usize,
    finished: usize,
    unfinished: usize,
    /// 4xx/5xx responses or engine errors: not finished, not in the latencies below.
    failed: usize,
    /// Ended by the client going away (part of `finished`).
    cancelled: usize,
    /// Wire views folded into the engine request they carried.
    joined: usize,
    /// Responses by HTTP status (`{"200": n}`).
    status_counts: BTreeMap<String, u64>,
    /// `failed` / (`finished` − `cancelled` + `failed`), %; `null` without any.
    error_rate_pct: Option<Num>,
    ttft_ms: StatsJson,
    queue_ms: StatsJson,
    prefill_ms: StatsJson,
    first_decode_step_ms: StatsJson,
    itl_ms: StatsJson,
    e2e_ms: StatsJson,
    /// Engine requests also seen on the wire: their TTFT spent outside the engine.
    outside_engine_ttft_ms: StatsJson,
    /// Wire requests: how long their first bytes waited in the server's socket.
    socket_wait_ms: StatsJson,
    /// End-to-end time of the failed requests.
    failed_e2e_ms: StatsJson,
    per_request: Vec<Request<'a>>,
    /// The wire views folded into `per_request` entries (`joined_to`: that entry's `req_id`).
    joined_views: Vec<Request<'a>>,
}

impl<'a> Requests<'a> {
    fn of(r: &'a Report) -> Self {
        let (ok, failed, cancelled, running) = r.outcomes();
        Self {
            count: r.requests.len(),
            finished: ok + cancelled,
            unfinished: running,
            failed,
            cancelled,
            joined: r.joined_views.len(),
            status_counts: r
                .status_counts()
                .into_iter()
                .map(|(s, n)| (s.to_string(), n))
                .collect(),
            error_rate_pct: opt(r.error_rate_pct()),
            ttft_ms: StatsJson::of(&r.ttft()),
            queue_ms: StatsJson::of(&r.ok_col(|q| q.queue_ms)),
            prefill_ms: StatsJson::of(&r.ok_col(|q| q.prefill_ms)),
            first_decode_step_ms: StatsJson::of(&r.ok_col(|q| q.first_decode_step_ms)),
            itl_ms: StatsJson::of(&Stats::of(&r.itl_ms)),
            e2e_ms: StatsJson::of(&r.ok_col(|q| q.e2e_ms)),
            outside_engine_ttft_ms: StatsJson::of(&r.ok_col(|q| q.outside_engine_ttft_ms)),
            socket_wait_ms: StatsJson::of(&r.ok_col(|q| q.socket_wait_ms)),
            failed_e2e_ms: StatsJson::of(&r.col(|q| q.e2e_ms.filter(|_| q.failed()))),
            per_request: r
                .requests
                .iter()
                .map(|q| Request::of(q, r.trace_start_ns))
                .collect(),
            joined_views: r
                .joined_views
                .iter()
                .map(|q| Request::of(q, r.trace_start_ns))
                .collect(),
        }
    }
}

/// One `requests.per_request` entry.
#[derive(Serialize)]
struct Request<'a> {
    req_id: u64,
    x_request_id: &'a str,
    queue_ms: Option<Num>,
    prefill_ms: Option<Num>,
    ttft_ms: Option<Num>,
    first_decode_step_ms: Option<Num>,
    output_tokens: u64,
    finish_reason: &'a str,
    preemptions: u64,
    attached_mid_request: bool,
    e2e_ms: Option<Num>,
    itl_p50_ms: Option<Num>,
    wire: bool,
    pid: u32,
    wire_ttft_ms: Option<Num>,
    outside_engine_ttft_ms: Option<Num>,
    socket_wait_ms: Option<Num>,
    start_s: Num,
    path: &'a str,
    http_status: Option<u32>,
    failed: bool,
    streamed: Option<bool>,
    response_bytes: Option<u64>,
    wire_req_id: Option<u64>,
    perfetto_slice: String,
    joined_to: Option<u64>,
}

impl<'a> Request<'a> {
    fn of(q: &'a RequestRow, trace_start_ns: u64) -> Self {
        Self {
            req_id: q.req_id,
            x_request_id: &q.x_request_id,
            queue_ms: opt(q.queue_ms),
            prefill_ms: opt(q.prefill_ms),
            ttft_ms: opt(q.ttft_ms),
            first_decode_step_ms: opt(q.first_decode_step_ms),
            output_tokens: q.output_tokens,
            finish_reason: &q.finish_reason,
            preemptions: q.preemptions,
            attached_mid_request: q.attached_mid_request,
            e2e_ms: opt(q.e2e_ms),
            itl_p50_ms: opt(q.itl_p50_ms),
            wire: q.wire,
            pid: q.pid,
            wire_ttft_ms: opt(q.wire_ttft_ms),
            outside_engine_ttft_ms: opt(q.outside_engine_ttft_ms),
            socket_wait_ms: opt(q.socket_wait_ms),
            start_s: Num(q.arrival_ns as f64 / 1e9 - trace_start_ns as f64 / 1e9),
            path: &q.path,
            http_status: q.http_status,
            failed: q.failed(),
            streamed: q.streamed,
            response_bytes: q.response_bytes,
            wire_req_id: q.wire_req_id,
            perfetto_slice: q.slice_name(),
            joined_to: q.joined_to,
        }
    }
}

/// `steps`.
#[derive(Serialize)]
struct Steps<'a> {
    count: u64,
    /// Prompt tokens the steps computed.
    prefill_tokens: u64,
    /// Decode tokens of the steps.
    decode_tokens: u64,
    by_kind: ByKind,
    by_batch_size: Vec<BatchBucket<'a>>,
    /// The steps that replayed a CUDA graph.
    graph_replayed: StatsJson,
}

/// `steps.by_kind`: always the three kinds, empty stats for a kind the trace has no step of.
#[derive(Serialize)]
struct ByKind {
    prefill: StatsJson,
    decode: StatsJson,
    mixed: StatsJson,
}

impl<'a> Steps<'a> {
    fn of(r: &'a Report) -> Self {
        let kind = |k: &str| StatsJson::of(&r.steps_by_kind.get(k).cloned().unwrap_or_default());
        Self {
            count: r.steps_by_kind.values().map(|s| s.count as u64).sum(),
            prefill_tokens: r.steps_prefill_tokens,
            decode_tokens: r.steps_decode_tokens,
            by_kind: ByKind {
                prefill: kind("prefill"),
                decode: kind("decode"),
                mixed: kind("mixed"),
            },
            by_batch_size: r
                .steps_by_batch
                .iter()
                .map(|b| BatchBucket {
                    bucket: &b.bucket,
                    min_seqs: b.min_seqs,
                    max_seqs: (b.max_seqs != u64::MAX).then_some(b.max_seqs),
                    stats: StatsJson::of(&b.stats),
                })
                .collect(),
            graph_replayed: StatsJson::of(&r.steps_graph_replayed),
        }
    }
}

/// One `steps.by_batch_size` entry (`max_seqs` `null`: the open last bucket).
#[derive(Serialize)]
struct BatchBucket<'a> {
    bucket: &'a str,
    min_seqs: u64,
    max_seqs: Option<u64>,
    stats: StatsJson,
}

/// `counters`: one object per counter track (by key), then `preemptions_total`.
#[derive(Serialize)]
struct Counters {
    #[serde(flatten)]
    tracks: BTreeMap<&'static str, Counter>,
    preemptions_total: Option<Num>,
}

impl Counters {
    fn of(r: &Report) -> Self {
        Self {
            tracks: r
                .counters
                .iter()
                .map(|(k, c)| {
                    let c = Counter {
                        samples: c.samples,
                        max: opt(c.max),
                        mean: opt(c.mean),
                        last: opt(c.last),
                    };
                    (*k, c)
                })
                .collect(),
            preemptions_total: opt(r.preemptions_total),
        }
    }
}

/// One engine counter track: `{samples, max, mean, last}` (the GPU's are [`GpuSamples`], in another order).
#[derive(Serialize)]
struct Counter {
    samples: usize,
    max: Option<Num>,
    mean: Option<Num>,
    last: Option<Num>,
}

/// `syscalls`.
#[derive(Serialize)]
struct Syscalls<'a> {
    slow_syscall_slices: Vec<SlowSyscall<'a>>,
    kernel_aggregates: Vec<AggregateSyscall<'a>>,
}

/// One `syscalls.slow_syscall_slices` entry.
#[derive(Serialize)]
struct SlowSyscall<'a> {
    name: &'a str,
    count: u64,
    total_ms: Num,
    max_ms: Option<Num>,
}

impl<'a> SlowSyscall<'a> {
    fn of(s: &'a SyscallRow) -> Self {
        Self {
            name: &s.name,
            count: s.count,
            total_ms: Num(s.total_ms),
            max_ms: opt(s.max_ms),
        }
    }
}

/// One `syscalls.kernel_aggregates` entry (no `max_ms`: the aggregates have no per-call durations).
#[derive(Serialize)]
struct AggregateSyscall<'a> {
    name: &'a str,
    count: u64,
    total_ms: Num,
}

impl<'a> AggregateSyscall<'a> {
    fn of(s: &'a SyscallRow) -> Self {
        Self {
            name: &s.name,
            count: s.count,
            total_ms: Num(s.total_ms),
        }
    }
}

/// One `model_files` entry.
#[derive(Serialize)]
struct ModelFile<'a> {
    path: &'a str,
    reads: u64,
    bytes: u64,
    read_ms: Num,
    mb_per_s: Option<Num>,
    opens: u64,
    mmaps: u64,
}

impl<'a> ModelFile<'a> {
    fn of(f: &'a ModelFileRow) -> Self {
        Self {
            path: &f.path,
            reads: f.reads,
            bytes: f.bytes,
            read_ms: Num(f.read_ms),
            mb_per_s: opt(f.mb_per_s),
            opens: f.opens,
            mmaps: f.mmaps,
        }
    }
}

/// One `egress` entry.
#[derive(Serialize)]
struct Egress<'a> {
    address: &'a str,
    port: u64,
    connects: u64,
    failed: u64,
    allowed: bool,
    verdict: &'static str,
}

impl<'a> Egress<'a> {
    fn of(e: &'a EgressRow) -> Self {
        Self {
            address: &e.address,
            port: e.port,
            connects: e.connects,
            failed: e.failed,
            allowed: e.allowed,
            verdict: if e.allowed { "allowed" } else { "flagged" },
        }
    }
}

/// `drops`.
#[derive(Serialize)]
struct Drops<'a> {
    total_dropped: u64,
    user_drops: u64,
    decode_errors: u64,
    source: &'static str,
    probes: Vec<Probe<'a>>,
    /// Off-CPU stacks the kernel's rate bound did not take (by design; not in `total_dropped`).
    offcpu_not_taken: Option<u64>,
}

/// One `drops.probes` entry.
#[derive(Serialize)]
struct Probe<'a> {
    probe: &'a str,
    hits: Option<u64>,
    emitted: Option<u64>,
    dropped: u64,
}

impl<'a> Probe<'a> {
    fn of(p: &'a ProbeRow) -> Self {
        Self {
            probe: &p.probe,
            hits: p.hits,
            emitted: p.emitted,
            dropped: p.dropped,
        }
    }
}

/// `overhead`.
#[derive(Serialize)]
struct Overhead<'a> {
    est_target_cpu_ms: Option<Num>,
    est_target_pct: Option<Num>,
    target_cpu_ms: Option<Num>,
    by_probe_ms: ByProbe,
    est_cupti_ms: Option<Num>,
    cupti_thread_cpu_ms: Option<Num>,
    cupti_records: Option<u64>,
    llmprof_cpu_ms: Option<Num>,
    llmprof_cpu_pct: Option<Num>,
    llmprof_max_rss_mib: Option<Num>,
    symbolized_stacks: Option<u64>,
    symbolize_ms: Option<Num>,
    cost_ns: CostNs,
    probe_entry: Option<&'a str>,
    budget_pct: Option<Num>,
    degradations: Vec<Degradation<'a>>,
    size_limit_bytes: Option<u64>,
    size_limit_reached: bool,
    events_not_written: Option<u64>,
    symbolize_addresses: Option<u64>,
    symbolize_unknown: Option<u64>,
    symbolize_unmapped: Option<u64>,
    symbolize_resolve_ms: Option<Num>,
    llmprof_cpu_charged_ms: Option<Num>,
    shared_cpus: Option<u64>,
    shared_idle_pct: Option<Num>,
}

impl<'a> Overhead<'a> {
    fn of(o: &'a OverheadReport) -> Self {
        Self {
            est_target_cpu_ms: opt(o.est_target_cpu_ms),
            est_target_pct: opt(o.est_target_pct),
            target_cpu_ms: opt(o.target_cpu_ms),
            by_probe_ms: ByProbe::of(&o.by_probe_ms),
            est_cupti_ms: opt(o.est_cupti_ms),
            cupti_thread_cpu_ms: opt(o.cupti_thread_cpu_ms),
            cupti_records: o.cupti_records,
            llmprof_cpu_ms: opt(o.llmprof_cpu_ms),
            llmprof_cpu_pct: opt(o.llmprof_cpu_pct),
            llmprof_max_rss_mib: opt(o.llmprof_max_rss_mib),
            cost_ns: CostNs {
                syscall: opt(o.cost_ns_syscall),
                syscall_decoded: opt(o.cost_ns_syscall_decoded),
                engine_probe: opt(o.cost_ns_engine_probe),
                engine_probe_sampled_out: opt(o.cost_ns_engine_probe_sampled_out),
                cuda_call: opt(o.cost_ns_cuda_call),
                sched_event: opt(o.cost_ns_sched_event),
                sample: opt(o.cost_ns_sample),
                sample_live: opt(o.cost_ns_sample_live),
                offcpu_stack: opt(o.cost_ns_offcpu_stack),
                http_request: opt(o.cost_ns_http_request),
                http_sse_write: opt(o.cost_ns_http_sse_write),
                cupti_record: opt(o.cost_ns_cupti_record),
            },
            symbolized_stacks: o.symbolized_stacks,
            symbolize_ms: opt(o.symbolize_ms),
            probe_entry: o.probe_entry.as_deref(),
            budget_pct: opt(o.budget_pct),
            degradations: o.degradations.iter().map(Degradation::of).collect(),
            size_limit_bytes: o.size_limit_bytes,
            size_limit_reached: o.size_limit_reached,
            events_not_written: o.events_not_written,
            symbolize_addresses: o.symbolize_addresses,
            symbolize_unknown: o.symbolize_unknown,
            symbolize_unmapped: o.symbolize_unmapped,
            symbolize_resolve_ms: opt(o.symbolize_resolve_ms),
            llmprof_cpu_charged_ms: opt(o.llmprof_cpu_charged_ms),
            shared_cpus: o.shared_cpus,
            shared_idle_pct: opt(o.shared_idle_pct),
        }
    }
}

/// `overhead.by_probe_ms`: `{probe: ms}` in the summary's order, a name that is not one of
/// `llmprof_abi::PROBE_NAMES` as `other`. A key seen again keeps its first place and takes the later value
/// (a JSON object has each key once).
struct ByProbe(Vec<(&'static str, Num)>);

impl ByProbe {
    fn of(by_probe_ms: &[(String, f64)]) -> Self {
        let mut out: Vec<(&'static str, Num)> = Vec::new();
        for (k, v) in by_probe_ms {
            let name = llmprof_abi::PROBE_NAMES
                .iter()
                .find(|n| **n == k.as_str())
                .copied()
                .unwrap_or("other");
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some(e) => e.1 = Num(*v),
                None => out.push((name, Num(*v))),
            }
        }
        Self(out)
    }
}

impl Serialize for ByProbe {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// `overhead.cost_ns`.
#[derive(Serialize)]
struct CostNs {
    syscall: Option<Num>,
    syscall_decoded: Option<Num>,
    engine_probe: Option<Num>,
    engine_probe_sampled_out: Option<Num>,
    cuda_call: Option<Num>,
    sched_event: Option<Num>,
    sample: Option<Num>,
    sample_live: Option<Num>,
    offcpu_stack: Option<Num>,
    http_request: Option<Num>,
    http_sse_write: Option<Num>,
    cupti_record: Option<Num>,
}

/// One `overhead.degradations` entry.
#[derive(Serialize)]
struct Degradation<'a> {
    at_s: Num,
    level: u64,
    step: &'a str,
    change: &'a str,
    est_overhead_pct: Option<Num>,
    syscalls_counted: Option<u64>,
}

impl<'a> Degradation<'a> {
    fn of(d: &'a DegradationRow) -> Self {
        Self {
            at_s: Num(d.at_s),
            level: d.level,
            step: &d.step,
            change: &d.change,
            est_overhead_pct: opt(d.est_overhead_pct),
            syscalls_counted: d.syscalls_counted,
        }
    }
}

/// `gpu`.
#[derive(Serialize)]
struct Gpu<'a> {
    gpus: Vec<GpuJson<'a>>,
    cuda: Cuda<'a>,
    markers: &'a [String],
}

impl<'a> Gpu<'a> {
    fn of(g: &'a GpuSection) -> Self {
        Self {
            gpus: g.gpus.iter().map(GpuJson::of).collect(),
            cuda: Cuda {
                functions: g.cuda_functions.iter().map(CudaFn::of).collect(),
                host_total_ms: Num(g.cuda_host_total_ms),
                synchronize_calls: g.synchronize_calls,
                synchronize_ms: Num(g.synchronize_ms),
                launches_per_step: StatsJson::of(&g.launches_per_step),
                summary: g.summary.as_ref().map(CudaSummary::of),
                probe: g.probe.as_ref().map(|p| CudaProbe {
                    hits: p.hits,
                    emitted: p.emitted,
                    dropped: p.dropped,
                }),
            },
            markers: &g.markers,
        }
    }
}

/// One `gpu.gpus` entry.
#[derive(Serialize)]
struct GpuJson<'a> {
    index: u64,
    name: &'a str,
    counters: Vec<GpuCounter<'a>>,
    process_memory_mib: Vec<ProcessMemory>,
}

impl<'a> GpuJson<'a> {
    fn of(row: &'a GpuRow) -> Self {
        Self {
            index: row.index,
            name: &row.name,
            counters: row.counters.iter().map(GpuCounter::of).collect(),
            process_memory_mib: row
                .process_memory
                .iter()
                .map(|(pid, c)| ProcessMemory {
                    pid: *pid,
                    samples: GpuSamples::of(c),
                })
                .collect(),
        }
    }
}

/// `{samples, mean, max, last}` of a GPU counter track.
#[derive(Serialize)]
struct GpuSamples {
    samples: usize,
    mean: Option<Num>,
    max: Option<Num>,
    last: Option<Num>,
}

impl GpuSamples {
    fn of(c: &CounterSummary) -> Self {
        Self {
            samples: c.samples,
            mean: opt(c.mean),
            max: opt(c.max),
            last: opt(c.last),
        }
    }
}

/// One `gpu.gpus[].counters` entry.
#[derive(Serialize)]
struct GpuCounter<'a> {
    metric: &'a str,
    unit: &'a str,
    #[serde(flatten)]
    samples: GpuSamples,
}

impl<'a> GpuCounter<'a> {
    fn of(c: &'a GpuCounterRow) -> Self {
        Self {
            metric: &c.metric,
            unit: &c.unit,
            samples: GpuSamples::of(&c.summary),
        }
    }
}

/// One `gpu.gpus[].process_memory_mib` entry.
#[derive(Serialize)]
struct ProcessMemory {
    pid: u64,
    #[serde(flatten)]
    samples: GpuSamples,
}

/// `gpu.cuda`.
#[derive(Serialize)]
struct Cuda<'a> {
    functions: Vec<CudaFn<'a>>,
    host_total_ms: Num,
    synchronize_calls: u64,
    synchronize_ms: Num,
    launches_per_step: StatsJson,
    summary: Option<CudaSummary>,
    probe: Option<CudaProbe>,
}

/// One `gpu.cuda.functions` entry.
#[derive(Serialize)]
struct CudaFn<'a> {
    function: &'a str,
    calls: u64,
    total_ms: Num,
    individual: StatsJson,
}

impl<'a> CudaFn<'a> {
    fn of(f: &'a CudaFnRow) -> Self {
        Self {
            function: &f.function,
            calls: f.calls,
            total_ms: Num(f.total_ms),
            individual: StatsJson::of(&f.individual),
        }
    }
}

/// `gpu.cuda.summary`: the summary's `cuda_calls`.
#[derive(Serialize)]
struct CudaSummary {
    calls: u64,
    individual: u64,
    batches: u64,
    batched: u64,
    over_budget: u64,
}

impl CudaSummary {
    fn of(s: &CudaCallsSummary) -> Self {
        Self {
            calls: s.calls,
            individual: s.individual,
            batches: s.batches,
            batched: s.batched,
            over_budget: s.over_budget,
        }
    }
}

/// `gpu.cuda.probe`: the `cuda` probe's counters.
#[derive(Serialize)]
struct CudaProbe {
    hits: Option<u64>,
    emitted: Option<u64>,
    dropped: u64,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_rounded_to_six_decimals_and_non_finite_is_null() {
        let j = |v: f64| serde_json::to_string(&Num(v)).unwrap();
        assert_eq!(j(0.8 / 3.0), "0.266667");
        assert_eq!(j(1.0), "1.0");
        assert_eq!(j(1e-7), "0.0");
        assert_eq!(j(f64::NAN), "null");
        assert_eq!(j(f64::INFINITY), "null");
    }

    #[test]
    fn by_probe_keys_are_unique_in_first_seen_order() {
        let known = llmprof_abi::PROBE_NAMES[0];
        let v = [
            ("not-a-probe".to_owned(), 1.0),
            (known.to_owned(), 2.0),
            ("also-not".to_owned(), 3.0),
        ];
        let got = serde_json::to_string(&ByProbe::of(&v)).unwrap();
        assert_eq!(got, format!(r#"{{"other":3.0,"{known}":2.0}}"#));
    }

    #[test]
    fn keys_follow_the_documented_order() {
        let r = Report {
            trace: "t".into(),
            drops_source: "summary",
            ..Default::default()
        };
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "format",
                "trace",
                "truncated",
                "has_summary",
                "end_reason",
                "requests",
                "steps",
                "counters",
                "syscalls",
                "model_files",
                "egress",
                "drops",
                "overhead",
                "gpu",
                "thread_states",
                "cpu_samples",
                "kernels"
            ]
        );
        assert_eq!(v["format"], JSON_FORMAT);
        assert_eq!(v["steps"]["by_kind"]["decode"]["p50"], serde_json::Value::Null);
    }
}
