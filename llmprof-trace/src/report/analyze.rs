//! The analysis of `llmprof report`: the decoded tracks ([`super::read`]) in, the [`Report`] out — TTFT
//! decomposition and inter-token latency per request, step durations by kind and batch size, the counter
//! tracks, the summary's kernel aggregates, drops and llmprof's overhead here; each probe family's own section
//! (slow syscalls, model files, egress, the GPU layer, kernels, thread states, samples) from its file.
//!
//! Pure: no I/O and no formatting ([`super::json`] and [`super::text`] print the result).

use std::collections::BTreeMap;
use std::path::Path;

use super::engine;
use super::read::{Decoded, arg_f, arg_s};
use super::{
    BATCH_BUCKETS, BucketRow, CounterSummary, DegradationRow, OverheadReport, ProbeRow, Report, Stats,
    SyscallRow,
};
use crate::names::{arg, counter, marker, track, value};

/// Nanoseconds as milliseconds.
pub(super) fn ms(ns: u64) -> f64 {
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
    let steps = engine::steps(d);
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
    (r.requests, r.joined_views, r.itl_ms) = engine::requests(d, &steps);
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

    // Thread tracks: one section per probe family.
    r.slow_syscalls = super::syscalls::section(d);
    r.model_files = super::files::section(d);
    r.egress = super::egress::section(d);

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
                llmprof_max_private_mib: f(arg::LLMPROF_MAX_PRIVATE_MIB),
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
    r.thread_states = super::sched::analyze(&d.sched);
    r.gpu = super::cuda::section(d, &r);
    r.cpu_samples = d.samples.section();
    r.kernels = super::cupti::section(d, &steps);
    r
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
