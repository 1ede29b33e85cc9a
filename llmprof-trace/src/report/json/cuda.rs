//! `gpu` of the `--json` document: the cuda family's driver calls, NVML counters and GPU markers.

use serde::Serialize;

use super::{Num, StatsJson, opt};
use crate::report::{CounterSummary, CudaCallsSummary, CudaFnRow, GpuCounterRow, GpuRow, GpuSection};

/// `gpu`.
#[derive(Serialize)]
pub(super) struct Gpu<'a> {
    gpus: Vec<GpuJson<'a>>,
    cuda: Cuda<'a>,
    markers: &'a [String],
}

impl<'a> Gpu<'a> {
    pub(super) fn of(g: &'a GpuSection) -> Self {
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
pub(super) struct GpuJson<'a> {
    index: u64,
    name: &'a str,
    counters: Vec<GpuCounter<'a>>,
    process_memory_mib: Vec<ProcessMemory>,
}

impl<'a> GpuJson<'a> {
    pub(super) fn of(row: &'a GpuRow) -> Self {
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
pub(super) struct GpuSamples {
    samples: usize,
    mean: Option<Num>,
    max: Option<Num>,
    last: Option<Num>,
}

impl GpuSamples {
    pub(super) fn of(c: &CounterSummary) -> Self {
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
pub(super) struct GpuCounter<'a> {
    metric: &'a str,
    unit: &'a str,
    #[serde(flatten)]
    samples: GpuSamples,
}

impl<'a> GpuCounter<'a> {
    pub(super) fn of(c: &'a GpuCounterRow) -> Self {
        Self {
            metric: &c.metric,
            unit: &c.unit,
            samples: GpuSamples::of(&c.summary),
        }
    }
}

/// One `gpu.gpus[].process_memory_mib` entry.
#[derive(Serialize)]
pub(super) struct ProcessMemory {
    pid: u64,
    #[serde(flatten)]
    samples: GpuSamples,
}

/// `gpu.cuda`.
#[derive(Serialize)]
pub(super) struct Cuda<'a> {
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
pub(super) struct CudaFn<'a> {
    function: &'a str,
    calls: u64,
    total_ms: Num,
    individual: StatsJson,
}

impl<'a> CudaFn<'a> {
    pub(super) fn of(f: &'a CudaFnRow) -> Self {
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
pub(super) struct CudaSummary {
    calls: u64,
    individual: u64,
    batches: u64,
    batched: u64,
    over_budget: u64,
}

impl CudaSummary {
    pub(super) fn of(s: &CudaCallsSummary) -> Self {
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
pub(super) struct CudaProbe {
    hits: Option<u64>,
    emitted: Option<u64>,
    dropped: u64,
}
