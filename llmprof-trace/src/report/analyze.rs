//! The analysis of `llmprof report`: the decoded tracks ([`super::read`]) in, the [`Report`] out — TTFT
//! decomposition and inter-token latency per request, step durations by kind and batch size, the counter
//! tracks, slow syscalls and the kernel aggregates, model-file reads, egress, drops, llmprof's overhead and the
//! GPU layer.
//!
//! Pure: no I/O and no formatting ([`super::json`] and [`super::text`] print the result).

use std::collections::BTreeMap;
use std::path::Path;

use super::read::{Decoded, Val, arg_f, arg_s};
use super::{
    BATCH_BUCKETS, BucketRow, CUDA_SUFFIX, CounterSummary, CudaCallsSummary, CudaFnRow, DROPS_PREFIX,
    DegradationRow, EgressRow, GPU_MARKERS, GpuCounterRow, GpuRow, GpuSection, KV_USAGE, ModelFileRow,
    OverheadReport, PREEMPTIONS, ProbeRow, RUNNING, Report, RequestRow, Stats, SyscallRow, WAITING,
};
use crate::perfetto::sink::{
    CUDA_TRACK, DEGRADATION_PREFIX, GPU_COUNTERS, LLMPROF_TRACK, STEPS_TRACK, SUMMARY_EVENT,
};

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

struct StepInfo {
    process: Option<u64>,
    kind: String,
    start: u64,
    end: u64,
    reqs: Vec<u64>,
}

pub(super) fn analyze(path: &Path, d: &Decoded) -> Report {
    let mut r = Report {
        trace: path.display().to_string(),
        truncated: d.truncated,
        drops_source: "drop_counters",
        ..Default::default()
    };
    // Steps.
    let mut steps: Vec<StepInfo> = Vec::new();
    for t in d
        .tracks
        .values()
        .filter(|t| t.name.as_deref() == Some(STEPS_TRACK))
    {
        for s in &t.slices {
            let reqs = arg_s(&s.args, "req_ids")
                .unwrap_or("")
                .split(',')
                .filter_map(|x| x.trim().parse().ok())
                .collect();
            steps.push(StepInfo {
                process: t.parent,
                kind: s.name.clone(),
                start: s.ts,
                end: s.ts + s.dur,
                reqs,
            });
        }
    }
    steps.sort_by_key(|s| s.start);
    let mut by_kind: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut by_bucket: Vec<Vec<f64>> = vec![Vec::new(); BATCH_BUCKETS.len()];
    for t in d
        .tracks
        .values()
        .filter(|t| t.name.as_deref() == Some(STEPS_TRACK))
    {
        for s in &t.slices {
            by_kind.entry(s.name.clone()).or_default().push(ms(s.dur));
            let n = arg_f(&s.args, "num_seqs").unwrap_or(0.0) as u64;
            if let Some(i) = BATCH_BUCKETS.iter().position(|&(lo, hi)| n >= lo && n <= hi) {
                by_bucket[i].push(ms(s.dur));
            }
        }
    }
    r.steps_by_kind = by_kind.into_iter().map(|(k, v)| (k, Stats::of(&v))).collect();
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

    // Requests: a track whose outer slice is "request N".
    for t in d.tracks.values() {
        let Some(outer) = t.slices.iter().find(|s| {
            s.name
                .strip_prefix("request ")
                .is_some_and(|n| n.parse::<u64>().is_ok())
        }) else {
            continue;
        };
        let req_id = outer.name["request ".len()..].parse().unwrap_or(0);
        // Steps of this request's process that served it after its first token (one token each).
        let served_after = |ft: u64| {
            steps
                .iter()
                .filter(move |s| s.process == t.parent && s.start >= ft && s.kind != "prefill")
                .filter(move |s| s.reqs.contains(&req_id))
        };
        // Attached after it arrived: its arrival (and so queue time and TTFT) is unknown.
        let mid = matches!(outer.args.get("attached_mid_request"), Some(Val::B(true)));
        let first_token = t
            .instants
            .iter()
            .filter(|i| i.name == "first token")
            .map(|i| i.ts)
            .min()
            .or_else(|| arg_f(&outer.args, "ttft_ms").map(|v| outer.ts + (v * 1e6).round() as u64));
        let phase_before = |name: &str| -> Option<f64> {
            let ft = first_token?;
            let ns: u64 = t
                .slices
                .iter()
                .filter(|s| s.name == name || (name == "queued" && s.name == "queued (preempted)"))
                .filter(|s| s.ts < ft)
                .map(|s| (s.ts + s.dur).min(ft) - s.ts)
                .sum();
            Some(ms(ns))
        };
        let first_decode = first_token.and_then(|ft| served_after(ft).next().map(|s| ms(s.end - s.start)));
        let output_tokens = arg_f(&outer.args, "output_tokens").unwrap_or(0.0) as u64;
        let finish_reason = arg_s(&outer.args, "finish_reason")
            .unwrap_or("unfinished")
            .to_owned();
        // ITL: token times = first token, then the ends of the decode/mixed steps that served the request.
        if let Some(ft) = first_token {
            let mut times = vec![ft];
            times.extend(served_after(ft).map(|s| s.end));
            if times.len() > 1 {
                r.itl_ms
                    .extend(times.windows(2).map(|w| ms(w[1].saturating_sub(w[0]))));
            } else if finish_reason != "unfinished" && output_tokens >= 2 {
                let end = outer.ts + outer.dur;
                r.itl_ms
                    .push(ms(end.saturating_sub(ft)) / (output_tokens - 1) as f64);
            }
        }
        r.requests.push(RequestRow {
            req_id,
            x_request_id: arg_s(&outer.args, "x_request_id").unwrap_or("").to_owned(),
            queue_ms: phase_before("queued").filter(|_| !mid),
            prefill_ms: phase_before("prefill").filter(|_| !mid),
            ttft_ms: first_token
                .map(|ft| ms(ft.saturating_sub(outer.ts)))
                .filter(|_| !mid),
            attached_mid_request: mid,
            first_decode_step_ms: first_decode,
            output_tokens,
            finish_reason,
            preemptions: arg_f(&outer.args, "num_preemptions").unwrap_or(0.0) as u64,
        });
    }
    r.requests.sort_by_key(|q| q.req_id);

    // Counters (pooled over processes).
    let pooled = |name: &str| -> Vec<f64> {
        d.tracks
            .values()
            .filter(|t| t.name.as_deref() == Some(name))
            .flat_map(|t| t.counter.iter().copied())
            .collect()
    };
    for (key, name) in [
        ("kv_cache_usage", KV_USAGE),
        ("requests_waiting", WAITING),
        ("requests_running", RUNNING),
    ] {
        r.counters.insert(key, CounterSummary::of(&pooled(name)));
    }
    r.preemptions_total = pooled(PREEMPTIONS).last().copied();

    // Thread tracks: slow syscalls, model files, egress.
    let mut sys: BTreeMap<String, SyscallRow> = BTreeMap::new();
    let mut files: BTreeMap<String, ModelFileRow> = BTreeMap::new();
    let mut egress: BTreeMap<(String, u64), EgressRow> = BTreeMap::new();
    for t in d.tracks.values() {
        for s in &t.slices {
            if let Some(name) = s.name.strip_prefix("syscall ") {
                let row = sys.entry(name.to_owned()).or_insert_with(|| SyscallRow {
                    name: name.to_owned(),
                    ..Default::default()
                });
                row.count += 1;
                row.total_ms += ms(s.dur);
                row.max_ms = Some(row.max_ms.unwrap_or(0.0).max(ms(s.dur)));
            } else if let Some(op) = s.name.strip_prefix("model file ") {
                let path = arg_s(&s.args, "path").unwrap_or("(unknown fd)").to_owned();
                let row = files.entry(path.clone()).or_insert_with(|| ModelFileRow {
                    path,
                    ..Default::default()
                });
                match op {
                    "read" | "pread64" | "readv" => {
                        row.reads += 1;
                        row.bytes += arg_f(&s.args, "bytes").unwrap_or(0.0).max(0.0) as u64;
                        row.read_ms += ms(s.dur);
                    }
                    "open" => row.opens += 1,
                    "mmap" => row.mmaps += 1,
                    _ => {}
                }
            }
        }
        for i in &t.instants {
            if i.name == "connect" || i.name == "connect (flagged egress)" {
                let address = arg_s(&i.args, "address").unwrap_or("?").to_owned();
                let port = arg_f(&i.args, "port").unwrap_or(0.0) as u64;
                let allowed = match i.args.get("allowed") {
                    Some(Val::B(b)) => *b,
                    _ => i.name == "connect",
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
                if arg_f(&i.args, "ret").is_some_and(|v| v < 0.0) {
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
        .filter(|t| t.name.as_deref() == Some(LLMPROF_TRACK))
        .flat_map(|t| t.instants.iter())
        .find(|i| i.name == SUMMARY_EVENT);
    if let Some(s) = summary {
        r.has_summary = true;
        r.drops_source = "summary";
        r.end_reason = arg_s(&s.args, "end_reason").map(str::to_owned);
        r.total_dropped = arg_f(&s.args, "total_dropped").unwrap_or(0.0) as u64;
        r.user_drops = arg_f(&s.args, "user_drops").unwrap_or(0.0) as u64;
        r.decode_errors = arg_f(&s.args, "decode_errors").unwrap_or(0.0) as u64;
        for probe in llmprof_abi::PROBE_NAMES {
            let Some(v) = arg_s(&s.args, probe) else { continue };
            let field = |k: &str| -> Option<u64> {
                v.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('=')?.parse().ok())
            };
            r.probes.push(ProbeRow {
                probe: probe.to_owned(),
                hits: field("hits"),
                emitted: field("emitted"),
                dropped: field("dropped").unwrap_or(0),
            });
        }
        let mut agg: BTreeMap<String, SyscallRow> = BTreeMap::new();
        for item in arg_s(&s.args, "top_syscalls").unwrap_or("").split(';') {
            let mut words = item.split_whitespace();
            let Some(name) = words.next() else { continue };
            let kv = |k: &str| -> Option<f64> {
                item.split_whitespace()
                    .find_map(|w| w.strip_prefix(k)?.strip_prefix('=')?.parse().ok())
            };
            let row = agg.entry(name.to_owned()).or_insert_with(|| SyscallRow {
                name: name.to_owned(),
                ..Default::default()
            });
            row.count += kv("count").unwrap_or(0.0) as u64;
            row.total_ms += kv("total_ms").unwrap_or(0.0);
        }
        r.syscall_aggregates = agg.into_values().collect();
        r.syscall_aggregates
            .sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
        if arg_f(&s.args, "cost_ns_syscall").is_some() || arg_f(&s.args, "llmprof_cpu_ms").is_some() {
            let f = |k: &str| arg_f(&s.args, k);
            r.overhead = Some(OverheadReport {
                est_target_cpu_ms: f("overhead_est_target_cpu_ms"),
                est_target_pct: f("overhead_est_target_pct"),
                target_cpu_ms: f("target_cpu_ms"),
                by_probe_ms: arg_s(&s.args, "overhead_by_probe_ms")
                    .unwrap_or("")
                    .split_whitespace()
                    .filter_map(|kv| {
                        let (k, v) = kv.split_once('=')?;
                        Some((k.to_owned(), v.parse().ok()?))
                    })
                    .collect(),
                llmprof_cpu_ms: f("llmprof_cpu_ms"),
                llmprof_cpu_pct: f("llmprof_cpu_pct"),
                llmprof_max_rss_mib: f("llmprof_max_rss_mib"),
                cost_ns_syscall: f("cost_ns_syscall"),
                cost_ns_engine_probe: f("cost_ns_engine_probe"),
                cost_ns_engine_probe_sampled_out: f("cost_ns_engine_probe_sampled_out"),
                cost_ns_cuda_call: f("cost_ns_cuda_call"),
                probe_entry: arg_s(&s.args, "probe_entry").map(str::to_owned),
                budget_pct: f("overhead_budget_pct"),
                size_limit_bytes: f("trace_size_limit_bytes").map(|v| v as u64),
                events_not_written: f("events_not_written").map(|v| v as u64),
                ..OverheadReport::default()
            });
        }
    } else {
        for t in d.tracks.values() {
            let Some(probe) = t.name.as_deref().and_then(|n| n.strip_prefix(DROPS_PREFIX)) else {
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
    r.gpu = gpu_section(d, &r);
    r
}

/// `cuLaunchKernel=50 (0.200 ms) cuMemcpyDtoH=3 (0.010 ms)` (a batch's `functions` arg) → (name, calls, ms).
fn batch_functions(s: &str) -> Vec<(String, u64, f64)> {
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

/// The GPU section: NVML counter tracks, CUDA driver call slices, GPU markers, the `cuda` summary values.
fn gpu_section(d: &Decoded, r: &Report) -> Option<GpuSection> {
    let mut g = GpuSection::default();
    let mut gpus: BTreeMap<u64, GpuRow> = BTreeMap::new();
    let mut metric_order: BTreeMap<(u64, usize), GpuCounterRow> = BTreeMap::new();
    let mut fns: BTreeMap<String, (u64, f64, Vec<f64>)> = BTreeMap::new();
    let mut launches: BTreeMap<(Option<u64>, u64), f64> = BTreeMap::new();
    for t in d.tracks.values() {
        let name = t.name.as_deref().unwrap_or("");
        if let Some((idx, rest)) = name.strip_prefix("GPU ").and_then(|n| n.split_once(' ')) {
            if let Some(i) = idx.strip_suffix(':').and_then(|i| i.parse::<u64>().ok()) {
                gpus.entry(i).or_default().name = rest.to_owned();
            } else if let Ok(i) = idx.parse::<u64>() {
                let pid = rest
                    .strip_prefix("memory (pid ")
                    .and_then(|p| p.strip_suffix(')'))
                    .and_then(|p| p.parse::<u64>().ok());
                if let Some(pid) = pid {
                    gpus.entry(i)
                        .or_default()
                        .process_memory
                        .push((pid, CounterSummary::of(&t.counter)));
                } else if let Some(m) = GPU_COUNTERS.iter().position(|(n, _)| *n == rest)
                    && !t.counter.is_empty()
                {
                    gpus.entry(i).or_default();
                    metric_order.insert(
                        (i, m),
                        GpuCounterRow {
                            metric: rest.to_owned(),
                            unit: GPU_COUNTERS[m].1.to_owned(),
                            summary: CounterSummary::of(&t.counter),
                        },
                    );
                }
            }
        }
        if name != CUDA_TRACK {
            continue;
        }
        // The process of the thread whose CUDA track this is (step ids are per process).
        let process = t.parent.and_then(|p| d.tracks.get(&p)).and_then(|th| th.parent);
        for s in t.slices.iter().filter(|s| s.name.ends_with(CUDA_SUFFIX)) {
            if let Some(calls) = arg_f(&s.args, "calls") {
                let listed = batch_functions(arg_s(&s.args, "functions").unwrap_or(""));
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
                if let Some(step) = arg_f(&s.args, "step_id") {
                    *launches.entry((process, step as u64)).or_default() +=
                        arg_f(&s.args, "launches").unwrap_or(0.0);
                }
            } else {
                let f = s.name.trim_end_matches(CUDA_SUFFIX).to_owned();
                if f.ends_with("Synchronize") {
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
        .filter(|t| t.name.as_deref() == Some(LLMPROF_TRACK))
        .flat_map(|t| t.instants.iter());
    let mut markers: Vec<(u64, String)> = Vec::new();
    for i in llmprof {
        if i.name == SUMMARY_EVENT {
            if let Some(c) = arg_s(&i.args, "cuda_calls") {
                let kv = |k: &str| -> u64 {
                    c.split_whitespace()
                        .find_map(|w| w.strip_prefix(k)?.strip_prefix('=')?.parse().ok())
                        .unwrap_or(0)
                };
                g.summary = Some(CudaCallsSummary {
                    calls: kv("calls"),
                    individual: kv("individual"),
                    batches: kv("batches"),
                    batched: kv("batched"),
                    over_budget: kv("over_budget"),
                });
            }
        } else if GPU_MARKERS.iter().any(|m| i.name.starts_with(m)) {
            markers.push((i.ts, i.name.clone()));
        }
    }
    markers.sort();
    g.markers = markers.into_iter().map(|(_, m)| m).collect();
    let has_cuda = !g.cuda_functions.is_empty() || g.summary.is_some();
    g.probe = r
        .probes
        .iter()
        .find(|p| p.probe == "cuda")
        .filter(|p| has_cuda || p.dropped > 0 || p.hits.unwrap_or(0) > 0)
        .cloned();
    (!g.gpus.is_empty() || has_cuda || !g.markers.is_empty()).then_some(g)
}

/// The budget's instants and the size marker on the llmprof track (present even without a summary).
fn overhead_events(d: &Decoded, r: &mut Report) {
    let first = d
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
    let llmprof = d
        .tracks
        .values()
        .filter(|t| t.name.as_deref() == Some(LLMPROF_TRACK))
        .flat_map(|t| t.instants.iter());
    let mut steps = Vec::new();
    let mut size_reached = false;
    for i in llmprof {
        if let Some(step) = i.name.strip_prefix(DEGRADATION_PREFIX) {
            steps.push(DegradationRow {
                at_s: i.ts.saturating_sub(first) as f64 / 1e9,
                level: arg_f(&i.args, "level").unwrap_or(0.0) as u64,
                step: step.to_owned(),
                change: arg_s(&i.args, "change").unwrap_or("").to_owned(),
                est_overhead_pct: arg_f(&i.args, "est_overhead_pct"),
                syscalls_counted: arg_f(&i.args, "syscalls_counted").map(|v| v as u64),
            });
        }
        size_reached |= i.name.starts_with("trace size limit reached");
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
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn batch_functions_arg_is_split_per_function() {
        assert_eq!(
            batch_functions("cuLaunchKernel=50 (0.200 ms) cuMemcpyHtoDAsync=3 (0.012 ms)"),
            vec![
                ("cuLaunchKernel".to_owned(), 50, 0.2),
                ("cuMemcpyHtoDAsync".to_owned(), 3, 0.012)
            ]
        );
        assert!(batch_functions("").is_empty());
    }
}
