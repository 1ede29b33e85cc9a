//! The `gpu` section of `llmprof report`: the cuda family's driver calls (the libcuda uprobes' slices, per
//! function and per step) with the `cuda` summary values, and beside them the NVML counter tracks and the GPU
//! markers.

use std::collections::BTreeMap;

use super::analyze::ms;
use super::read::{Decoded, arg_f, arg_s};
use super::{CounterSummary, CudaCallsSummary, CudaFnRow, GpuCounterRow, GpuRow, GpuSection, Report, Stats};
use crate::names::track::GpuTrack;
use crate::names::{arg, counter, marker, slice, track, value};
use llmprof_abi::{CudaClass, CudaFunc};

/// The GPU section: NVML counter tracks, CUDA driver call slices, GPU markers, the `cuda` summary values.
pub(super) fn section(d: &Decoded, r: &Report) -> Option<GpuSection> {
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
