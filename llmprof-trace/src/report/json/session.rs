//! `drops` and `overhead` of the `--json` document: what the session lost and what it cost.

use serde::{Serialize, Serializer};

use super::{Num, opt};
use crate::report::{DegradationRow, OverheadReport, ProbeRow, Report};

/// `drops`.
#[derive(Serialize)]
pub(super) struct Drops<'a> {
    total_dropped: u64,
    user_drops: u64,
    decode_errors: u64,
    source: &'static str,
    probes: Vec<Probe<'a>>,
    /// Off-CPU stacks the kernel's rate bound did not take (by design; not in `total_dropped`).
    offcpu_not_taken: Option<u64>,
}

impl<'a> Drops<'a> {
    pub(super) fn of(r: &'a Report) -> Self {
        Self {
            total_dropped: r.total_dropped,
            user_drops: r.user_drops,
            decode_errors: r.decode_errors,
            source: r.drops_source,
            probes: r.probes.iter().map(Probe::of).collect(),
            offcpu_not_taken: r.offcpu_not_taken,
        }
    }
}

/// One `drops.probes` entry.
#[derive(Serialize)]
pub(super) struct Probe<'a> {
    probe: &'a str,
    hits: Option<u64>,
    emitted: Option<u64>,
    dropped: u64,
}

impl<'a> Probe<'a> {
    pub(super) fn of(p: &'a ProbeRow) -> Self {
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
pub(super) struct Overhead<'a> {
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
    llmprof_max_private_mib: Option<Num>,
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
    pub(super) fn of(o: &'a OverheadReport) -> Self {
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
            llmprof_max_private_mib: opt(o.llmprof_max_private_mib),
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
pub(super) struct ByProbe(Vec<(&'static str, Num)>);

impl ByProbe {
    pub(super) fn of(by_probe_ms: &[(String, f64)]) -> Self {
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
pub(super) struct CostNs {
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
pub(super) struct Degradation<'a> {
    at_s: Num,
    level: u64,
    step: &'a str,
    change: &'a str,
    est_overhead_pct: Option<Num>,
    syscalls_counted: Option<u64>,
}

impl<'a> Degradation<'a> {
    pub(super) fn of(d: &'a DegradationRow) -> Self {
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
