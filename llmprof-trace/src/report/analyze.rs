//! The analysis of `llmprof report`: the decoded tracks ([`super::read`]) in, the [`Report`] out — TTFT
//! decomposition and inter-token latency per request, step durations by kind and batch size, the counter
//! tracks, slow syscalls and the kernel aggregates, model-file reads, egress, drops, llmprof's overhead and the
//! GPU layer.
//!
//! Pure: no I/O and no formatting ([`super::json`] and [`super::text`] print the result).

use std::collections::BTreeMap;
use std::path::Path;

use super::read::{Decoded, Val, arg_f, arg_s};
use super::requests;
use super::{
    BATCH_BUCKETS, BucketRow, CounterSummary, CudaCallsSummary, CudaFnRow, DegradationRow, EgressRow,
    GpuCounterRow, GpuRow, GpuSection, ModelFileRow, OverheadReport, ProbeRow, Report, Stats, SyscallRow,
};
use crate::names::track::GpuTrack;
use crate::names::{arg, counter, marker, slice, track, value};
use llmprof_abi::{CudaClass, CudaFunc, FileOp};

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

pub(super) fn analyze(path: &Path, d: &Decoded) -> Report {
    let mut r = Report {
        trace: path.display().to_string(),
        truncated: d.truncated,
        drops_source: "drop_counters",
        ..Default::default()
    };
    // Steps, by kind and batch size.
    let steps = requests::steps(d);
    let mut by_kind: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut by_bucket: Vec<Vec<f64>> = vec![Vec::new(); BATCH_BUCKETS.len()];
    let mut replayed = Vec::new();
    for s in &steps {
        let dur = ms(s.info.host_ns());
        if s.graph_batch > 0 {
            replayed.push(dur);
        }
        by_kind.entry(s.name.clone()).or_default().push(dur);
        r.steps_prefill_tokens += u64::from(s.info.prefill_tokens);
        r.steps_decode_tokens += u64::from(s.info.decode_tokens);
        let n = s.num_seqs;
        if let Some(i) = BATCH_BUCKETS.iter().position(|&(lo, hi)| n >= lo && n <= hi) {
            by_bucket[i].push(dur);
        }
    }
    r.steps_by_kind = by_kind.into_iter().map(|(k, v)| (k, Stats::of(&v))).collect();
    r.steps_graph_replayed = Stats::of(&replayed);
    for (i, v) in by_bucket.iter().enumerate() {
        if v.is_empty() {
            continue;
        }
        let (lo, hi) = BATCH_BUCKETS[i];
        let bucket = match (lo, hi) {
            (_, u64::MAX) => format!("{lo}+"),
            (0, 1) => "1".to_owned(),
            (a, b) if a == b => a.to_string(),
            (a, b) => format!("{a}-{b}"),
        };
        r.steps_by_batch.push(BucketRow {
            bucket,
            min_seqs: lo,
            max_seqs: hi,
            stats: Stats::of(v),
        });
    }

    // Requests: each one's timeline, rebuilt from its track and the steps that name it, each request once.
    (r.requests, r.joined_views, r.itl_ms) = requests::requests(d, &steps);
    r.trace_start_ns = d
        .tracks
        .values()
        .flat_map(|t| {
            t.slices
                .iter()
                .map(|s| s.ts)
                .chain(t.instants.iter().map(|i| i.ts))
        })
        .min()
        .unwrap_or(0);
    // A request that arrived before the trace's view began was in flight when llmprof attached.
    let started = llmprof_instants(d)
        .find(|i| i.name == marker::TRACING_STARTED)
        .map(|i| i.ts);
    if let Some(started) = started {
        for q in r
            .requests
            .iter_mut()
            .chain(r.joined_views.iter_mut())
            .filter(|q| q.arrival_ns < started)
        {
            q.attached_mid_request = true;
        }
    }

    // Counters (pooled over processes).
    let pooled = |name: &str| -> Vec<f64> {
        d.tracks
            .values()
            .filter(|t| t.name.as_deref() == Some(name))
            .flat_map(|t| t.counter.iter().copied())
            .collect()
    };
    for (key, (name, _)) in [
        ("kv_cache_usage", counter::KV_USAGE),
        ("requests_waiting", counter::WAITING),
        ("requests_running", counter::RUNNING),
    ] {
        r.counters.insert(key, CounterSummary::of(&pooled(name)));
    }
    r.preemptions_total = pooled(counter::PREEMPTIONS.0).last().copied();

    // Thread tracks: slow syscalls, model files, egress.
    let mut sys: BTreeMap<String, SyscallRow> = BTreeMap::new();
    let mut files: BTreeMap<String, ModelFileRow> = BTreeMap::new();
    let mut egress: BTreeMap<(String, u64), EgressRow> = BTreeMap::new();
    for t in d.tracks.values() {
        for s in &t.slices {
            if let Some(name) = s.name.strip_prefix(slice::SYSCALL_PREFIX) {
                let row = sys.entry(name.to_owned()).or_insert_with(|| SyscallRow {
                    name: name.to_owned(),
                    ..Default::default()
                });
                row.count += 1;
                row.total_ms += ms(s.dur);
                row.max_ms = Some(row.max_ms.unwrap_or(0.0).max(ms(s.dur)));
            } else if let Some(op) = s.name.strip_prefix(slice::MODEL_FILE_PREFIX) {
                let path = arg_s(&s.args, arg::PATH).unwrap_or("(unknown fd)").to_owned();
                let row = files.entry(path.clone()).or_insert_with(|| ModelFileRow {
                    path,
                    ..Default::default()
                });
                let is = |o: FileOp| o.name() == op;
                if is(FileOp::Read) || is(FileOp::Pread) || is(FileOp::Readv) {
                    row.reads += 1;
                    row.bytes += arg_f(&s.args, arg::BYTES).unwrap_or(0.0).max(0.0) as u64;
                    row.read_ms += ms(s.dur);
                } else if op == slice::FILE_OPEN {
                    row.opens += 1;
                } else if is(FileOp::Mmap) {
                    row.mmaps += 1;
                }
            }
        }
        for i in &t.instants {
            if i.name == slice::CONNECT || i.name == slice::CONNECT_FLAGGED {
                let address = arg_s(&i.args, arg::ADDRESS).unwrap_or("?").to_owned();
                let port = arg_f(&i.args, arg::PORT).unwrap_or(0.0) as u64;
                let allowed = match i.args.get(arg::ALLOWED) {
                    Some(Val::B(b)) => *b,
                    _ => i.name == slice::CONNECT,
                };
                let row = egress
                    .entry((address.clone(), port))
                    .or_insert_with(|| EgressRow {
                        address,
                        port,
                        allowed,
                        ..Default::default()
                    });
                row.connects += 1;
                if arg_f(&i.args, arg::RET).is_some_and(|v| v < 0.0) {
                    row.failed += 1;
                }
            }
        }
    }
    r.slow_syscalls = sys.into_values().collect();
    r.slow_syscalls.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
    r.model_files = files
        .into_values()
        .map(|mut f| {
            f.mb_per_s = (f.read_ms > 0.0).then(|| f.bytes as f64 / 1e6 / (f.read_ms / 1e3));
            f
        })
        .collect();
    r.egress = egress.into_values().collect();

    // Summary and drops.
    let summary = d
        .tracks
        .values()
        .filter(|t| t.name.as_deref() == Some(track::LLMPROF))
        .flat_map(|t| t.instants.iter())
        .find(|i| i.name == marker::SUMMARY);
    if let Some(s) = summary {
        r.has_summary = true;
        r.drops_source = "summary";
        r.end_reason = arg_s(&s.args, arg::END_REASON).map(str::to_owned);
        r.total_dropped = arg_f(&s.args, arg::TOTAL_DROPPED).unwrap_or(0.0) as u64;
        r.user_drops = arg_f(&s.args, arg::USER_DROPS).unwrap_or(0.0) as u64;
        r.decode_errors = arg_f(&s.args, arg::DECODE_ERRORS).unwrap_or(0.0) as u64;
        r.offcpu_not_taken = arg_f(&s.args, arg::OFFCPU_NOT_TAKEN).map(|v| v as u64);
        for probe in llmprof_abi::PROBE_NAMES {
            let Some(v) = arg_s(&s.args, probe) else { continue };
            r.probes.push(ProbeRow {
                probe: probe.to_owned(),
                hits: value::field(v, value::HITS),
                emitted: value::field(v, value::EMITTED),
                dropped: value::field(v, value::DROPPED).unwrap_or(0),
            });
        }
        let mut agg: BTreeMap<String, SyscallRow> = BTreeMap::new();
        for item in arg_s(&s.args, arg::TOP_SYSCALLS)
            .unwrap_or("")
            .split(value::ITEM_SEPARATOR.trim())
        {
            let mut words = item.split_whitespace();
            let Some(name) = words.next() else { continue };
            let kv = |k: &str| -> Option<f64> { value::field(item, k) };
            let row = agg.entry(name.to_owned()).or_insert_with(|| SyscallRow {
                name: name.to_owned(),
                ..Default::default()
            });
            row.count += kv(value::COUNT).unwrap_or(0.0) as u64;
            row.total_ms += kv(value::TOTAL_MS).unwrap_or(0.0);
        }
        r.syscall_aggregates = agg.into_values().collect();
        r.syscall_aggregates
            .sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
        if arg_f(&s.args, arg::COST_NS_SYSCALL).is_some() || arg_f(&s.args, arg::LLMPROF_CPU_MS).is_some() {
            let f = |k: &str| arg_f(&s.args, k);
            r.overhead = Some(OverheadReport {
                est_target_cpu_ms: f(arg::OVERHEAD_EST_TARGET_CPU_MS),
                est_cupti_ms: f(arg::OVERHEAD_EST_CUPTI_MS),
                cupti_thread_cpu_ms: f(arg::CUPTI_THREAD_CPU_MS),
                cupti_records: f(arg::CUPTI_RECORDS).map(|v| v as u64),
                cost_ns_cupti_record: f(arg::COST_NS_CUPTI_RECORD),
                est_target_pct: f(arg::OVERHEAD_EST_TARGET_PCT),
                target_cpu_ms: f(arg::TARGET_CPU_MS),
                by_probe_ms: value::pairs(arg_s(&s.args, arg::OVERHEAD_BY_PROBE_MS).unwrap_or(""))
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect(),
                llmprof_cpu_ms: f(arg::LLMPROF_CPU_MS),
                llmprof_cpu_pct: f(arg::LLMPROF_CPU_PCT),
                llmprof_max_rss_mib: f(arg::LLMPROF_MAX_RSS_MIB),
                cost_ns_syscall: f(arg::COST_NS_SYSCALL),
                cost_ns_syscall_decoded: f(arg::COST_NS_SYSCALL_DECODED),
                cost_ns_engine_probe: f(arg::COST_NS_ENGINE_PROBE),
                cost_ns_engine_probe_sampled_out: f(arg::COST_NS_ENGINE_PROBE_SAMPLED_OUT),
                cost_ns_cuda_call: f(arg::COST_NS_CUDA_CALL),
                cost_ns_sched_event: f(arg::COST_NS_SCHED_EVENT),
                cost_ns_sample: f(arg::COST_NS_SAMPLE),
                cost_ns_offcpu_stack: f(arg::COST_NS_OFFCPU_STACK),
                cost_ns_sample_live: f(arg::COST_NS_SAMPLE_LIVE),
                cost_ns_http_request: f(arg::COST_NS_HTTP_REQUEST),
                cost_ns_http_sse_write: f(arg::COST_NS_HTTP_SSE_WRITE),
                symbolized_stacks: f(arg::SYMBOLIZED_STACKS).map(|v| v as u64),
                symbolize_ms: f(arg::SYMBOLIZE_MS),
                symbolize_addresses: f(arg::SYMBOLIZE_ADDRESSES).map(|v| v as u64),
                symbolize_unknown: f(arg::SYMBOLIZE_UNKNOWN).map(|v| v as u64),
                symbolize_unmapped: f(arg::SYMBOLIZE_UNMAPPED).map(|v| v as u64),
                symbolize_resolve_ms: f(arg::SYMBOLIZE_RESOLVE_MS),
                llmprof_cpu_charged_ms: f(arg::LLMPROF_CPU_CHARGED_MS),
                shared_cpus: f(arg::SHARED_CPUS).map(|v| v as u64),
                shared_idle_pct: f(arg::SHARED_IDLE_PCT),
                probe_entry: arg_s(&s.args, arg::PROBE_ENTRY).map(str::to_owned),
                budget_pct: f(arg::OVERHEAD_BUDGET_PCT),
                size_limit_bytes: f(arg::TRACE_SIZE_LIMIT_BYTES).map(|v| v as u64),
                events_not_written: f(arg::EVENTS_NOT_WRITTEN).map(|v| v as u64),
                ..OverheadReport::default()
            });
        }
    } else {
        for t in d.tracks.values() {
            let Some(probe) = t
                .name
                .as_deref()
                .and_then(|n| n.strip_prefix(track::DROPS_PREFIX))
            else {
                continue;
            };
            let dropped = t.counter.iter().copied().fold(0.0, f64::max) as u64;
            r.total_dropped += dropped;
            r.probes.push(ProbeRow {
                probe: probe.to_owned(),
                dropped,
                ..Default::default()
            });
        }
    }
    overhead_events(d, &mut r);
    r.thread_states = super::threads::analyze(&d.sched);
    r.gpu = gpu_section(d, &r);
    r.cpu_samples = d.samples.section();
    r.kernels = super::kernels::section(d, &steps);
    r
}

/// The GPU section: NVML counter tracks, CUDA driver call slices, GPU markers, the `cuda` summary values.
fn gpu_section(d: &Decoded, r: &Report) -> Option<GpuSection> {
    let mut g = GpuSection::default();
    let mut gpus: BTreeMap<u64, GpuRow> = BTreeMap::new();
    let mut metric_order: BTreeMap<(u64, usize), GpuCounterRow> = BTreeMap::new();
    let mut fns: BTreeMap<String, (u64, f64, Vec<f64>)> = BTreeMap::new();
    let mut launches: BTreeMap<(Option<u64>, u64), f64> = BTreeMap::new();
    for t in d.tracks.values() {
        let name = t.name.as_deref().unwrap_or("");
        match track::parse_gpu(name) {
            Some(GpuTrack::Group(i, rest)) => gpus.entry(i).or_default().name = rest.to_owned(),
            Some(GpuTrack::ProcessMemory(i, pid)) => gpus
                .entry(i)
                .or_default()
                .process_memory
                .push((pid, CounterSummary::of(&t.counter))),
            Some(GpuTrack::Counter(i, metric)) => {
                if let Some(m) = counter::GPU.iter().position(|(n, _)| *n == metric)
                    && !t.counter.is_empty()
                {
                    gpus.entry(i).or_default();
                    metric_order.insert(
                        (i, m),
                        GpuCounterRow {
                            metric: metric.to_owned(),
                            unit: counter::GPU[m].1.to_owned(),
                            summary: CounterSummary::of(&t.counter),
                        },
                    );
                }
            }
            None => {}
        }
        if name != track::CUDA {
            continue;
        }
        // The process of the thread whose CUDA track this is (step ids are per process).
        let process = t.parent.and_then(|p| d.tracks.get(&p)).and_then(|th| th.parent);
        for s in t.slices.iter().filter(|s| s.name.ends_with(slice::CUDA_SUFFIX)) {
            if let Some(calls) = arg_f(&s.args, arg::CALLS) {
                let listed = value::cuda_functions(arg_s(&s.args, arg::FUNCTIONS).unwrap_or(""));
                for (f, n, ms) in &listed {
                    let e = fns.entry(f.clone()).or_default();
                    e.0 += n;
                    e.1 += ms;
                }
                if listed.is_empty() {
                    let e = fns.entry("(unknown)".to_owned()).or_default();
                    e.0 += calls as u64;
                    e.1 += ms(s.dur);
                }
                if let Some(step) = arg_f(&s.args, arg::STEP_ID) {
                    *launches.entry((process, step as u64)).or_default() +=
                        arg_f(&s.args, arg::LAUNCHES).unwrap_or(0.0);
                }
            } else {
                let f = s.name.trim_end_matches(slice::CUDA_SUFFIX).to_owned();
                let sync = CudaFunc::ALL
                    .iter()
                    .any(|c| c.name() == f && c.class() == CudaClass::Sync);
                if sync {
                    g.synchronize_calls += 1;
                    g.synchronize_ms += ms(s.dur);
                }
                let e = fns.entry(f).or_default();
                e.0 += 1;
                e.1 += ms(s.dur);
                e.2.push(ms(s.dur));
            }
        }
    }
    for ((i, _), row) in metric_order {
        gpus.entry(i).or_default().counters.push(row);
    }
    g.gpus = gpus
        .into_iter()
        .map(|(index, mut row)| {
            row.index = index;
            row
        })
        .collect();
    g.cuda_functions = fns
        .into_iter()
        .map(|(function, (calls, total_ms, v))| CudaFnRow {
            function,
            calls,
            total_ms,
            individual: Stats::of(&v),
        })
        .collect();
    g.cuda_functions.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
    g.cuda_host_total_ms = g.cuda_functions.iter().map(|f| f.total_ms).sum();
    g.launches_per_step = Stats::of(&launches.into_values().collect::<Vec<_>>());
    let llmprof = d
        .tracks
        .values()
        .filter(|t| t.name.as_deref() == Some(track::LLMPROF))
        .flat_map(|t| t.instants.iter());
    let mut markers: Vec<(u64, String)> = Vec::new();
    for i in llmprof {
        if i.name == marker::SUMMARY {
            if let Some(c) = arg_s(&i.args, arg::CUDA_CALLS) {
                let kv = |k: &str| -> u64 { value::field(c, k).unwrap_or(0) };
                g.summary = Some(CudaCallsSummary {
                    calls: kv(value::CALLS),
                    individual: kv(value::INDIVIDUAL),
                    batches: kv(value::BATCHES),
                    batched: kv(value::BATCHED),
                    over_budget: kv(value::OVER_BUDGET),
                });
            }
        } else if marker::GPU_PREFIXES.iter().any(|m| i.name.starts_with(m)) {
            markers.push((i.ts, i.name.clone()));
        }
    }
    markers.sort();
    g.markers = markers.into_iter().map(|(_, m)| m).collect();
    let has_cuda = !g.cuda_functions.is_empty() || g.summary.is_some();
    g.probe = r
        .probes
        .iter()
        .find(|p| p.probe == llmprof_abi::PROBE_NAMES[llmprof_abi::ProbeId::Cuda as usize])
        .filter(|p| has_cuda || p.dropped > 0 || p.hits.unwrap_or(0) > 0)
        .cloned();
    (!g.gpus.is_empty() || has_cuda || !g.markers.is_empty()).then_some(g)
}

/// The instants of the llmprof track (markers, the budget's steps, the summary).
fn llmprof_instants(d: &Decoded) -> impl Iterator<Item = &super::read::Instant> {
    d.tracks
        .values()
        .filter(|t| t.name.as_deref() == Some(track::LLMPROF))
        .flat_map(|t| t.instants.iter())
}

/// The budget's instants and the size marker on the llmprof track (present even without a summary).
fn overhead_events(d: &Decoded, r: &mut Report) {
    let first = r.trace_start_ns;
    let llmprof = llmprof_instants(d);
    let mut steps = Vec::new();
    let mut size_reached = false;
    for i in llmprof {
        if let Some(step) = i.name.strip_prefix(marker::DEGRADATION_PREFIX) {
            steps.push(DegradationRow {
                at_s: i.ts.saturating_sub(first) as f64 / 1e9,
                level: arg_f(&i.args, arg::LEVEL).unwrap_or(0.0) as u64,
                step: step.to_owned(),
                change: arg_s(&i.args, arg::CHANGE).unwrap_or("").to_owned(),
                est_overhead_pct: arg_f(&i.args, arg::EST_OVERHEAD_PCT),
                syscalls_counted: arg_f(&i.args, arg::SYSCALLS_COUNTED).map(|v| v as u64),
            });
        }
        size_reached |= i.name.starts_with(marker::SIZE_LIMIT_REACHED);
    }
    if steps.is_empty() && !size_reached {
        return;
    }
    steps.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let o = r.overhead.get_or_insert_with(OverheadReport::default);
    o.degradations = steps;
    o.size_limit_reached = size_reached;
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly")]
mod tests {
    use llmprof_abi::{FinishReason, RequestEventKind};

    use crate::event::SessionStats;
    use crate::names::marker;
    use crate::perfetto::sink::TraceSink;
    use crate::testing;

    const MS: u64 = 1_000_000;
    const T0: u64 = 5_000 * MS;

    #[test]
    fn a_request_that_arrived_before_tracing_started_was_in_flight_at_attach() {
        let procs = [testing::process(10, "llmserve", "llmserve", [(11, "engine")])];
        let mut sink = TraceSink::new(Vec::new(), &procs, Some((T0, 0))).unwrap();
        // Request 1 arrived 5 ms before the probes were live (its arrival is in its record), request 2 after.
        let req = |k, id, ts| testing::request(10, k, id, ts).chat("m", "");
        sink.push(&req(RequestEventKind::Arrived, 1, T0).build()).unwrap();
        sink.marker(T0 + 5 * MS, marker::TRACING_STARTED).unwrap();
        sink.push(&req(RequestEventKind::Arrived, 2, T0 + 6 * MS).build())
            .unwrap();
        for (id, at) in [(1, 20), (2, 25)] {
            sink.push(&req(RequestEventKind::Scheduled, id, T0 + at * MS).build())
                .unwrap();
            sink.push(&req(RequestEventKind::FirstToken, id, T0 + (at + 5) * MS).build())
                .unwrap();
            let fin = req(RequestEventKind::Finished, id, T0 + (at + 10) * MS).output(3, FinishReason::Stop);
            sink.push(&fin.build()).unwrap();
        }
        let bytes = sink.finish(&SessionStats::default(), Some(T0 + 50 * MS)).unwrap();
        let r = crate::report::from_bytes(std::path::Path::new("t"), &bytes).unwrap();
        let mid: Vec<(u64, bool)> = r
            .requests
            .iter()
            .map(|q| (q.req_id, q.attached_mid_request))
            .collect();
        assert_eq!(mid, [(1, true), (2, false)]);
    }
}
