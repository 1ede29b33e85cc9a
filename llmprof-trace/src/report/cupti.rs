//! `llmprof report`'s GPU kernel section (CUPTI activity through the injected helper): the top kernels by GPU
//! time, and per engine step the GPU busy time against the step's wall time and the GPU idle gaps between its
//! kernels (a step whose kernels leave the GPU idle between them is launch-bound: the host does not enqueue
//! work fast enough). Reads both kinds of traces: every kernel a slice (`--gpu-kernels all`), and the default
//! mode's summaries (window rows, busy intervals, CUDA graph launches as a whole). `--json` key `kernels`,
//! `null` when the trace has neither: `{mode, kernels, gpu_ms, copies, copy_ms, waits, wait_ms, lost, top:
//! [{name, count, total_ms, mean_ms, min_ms, max_ms, share_pct}], steps: {steps, wall_ms, gpu_busy_ms,
//! gpu_busy_pct, span_ms, idle_ms, idle_pct, per_step: [{pid_track, step_id, wall_ms, gpu_busy_ms, idle_ms,
//! kernels, top_kernel}]}}`.
//! - `mode`: `every kernel` or `summaries`. `gpu_ms`: sum of kernel (and graph launch) durations;
//!   `share_pct` a name's share of it; `lost` the summary's `gpu_activity_lost` (`null` without it).
//! - per step, every kernel: the kernels whose `step_id` arg names it (the step whose host time range held the
//!   launch); `gpu_busy_ms` is the union of their intervals (overlapping streams counted once), `span_ms`
//!   first kernel start → last kernel end, `idle_ms` = span − busy (the gaps between kernels).
//!   Summaries: the busy intervals whose `step_id` names the step (the step whose host time held the
//!   interval's start): their `busy_ns`, their spans, span − busy; `top_kernel` the top kernel of its
//!   longest interval. `gpu_busy_pct` = busy / wall, `idle_pct` = idle / span, summed over steps.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::engine::Step;
use super::read::{Decoded, arg_f, arg_s, arg_s_array, arg_u_array};
use crate::names::cupti::{arg as gpu_arg, slice as gpu_slice, track as gpu_track};
use crate::names::{arg, marker};

/// Rows of the top-kernels table kept in the JSON (the text shows 10).
pub const TOP_KERNELS: usize = 50;
/// [`KernelsSection::mode`] of a trace with every kernel a slice.
pub const MODE_EVERY: &str = "every kernel";
/// [`KernelsSection::mode`] of a trace with the default mode's summaries.
pub const MODE_SUMMARIES: &str = "summaries";

/// The section.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KernelsSection {
    /// How the trace recorded them: [`MODE_EVERY`] or [`MODE_SUMMARIES`].
    pub mode: &'static str,
    /// Kernels (and graph launches).
    pub kernels: u64,
    /// Their summed GPU time, ms.
    pub gpu_ms: f64,
    /// Copy slices.
    pub copies: u64,
    /// Their summed time, ms.
    pub copy_ms: f64,
    /// Host waits for the GPU CUPTI recorded (summaries only; every kernel: the wait slices).
    pub waits: u64,
    /// Their summed time, ms.
    pub wait_ms: f64,
    /// GPU activity records lost (the summary's count; `None` without it).
    pub lost: Option<u64>,
    /// Kernels by name, by total GPU time descending.
    pub top: Vec<KernelRow>,
    /// Per engine step (`None` without steps that launched kernels).
    pub steps: Option<StepsGpu>,
}

/// One kernel name.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KernelRow {
    /// Demangled name.
    pub name: String,
    /// Launches.
    pub count: u64,
    /// GPU time, ms.
    pub total_ms: f64,
    /// Mean per launch, ms.
    pub mean_ms: f64,
    /// Shortest, ms.
    pub min_ms: f64,
    /// Longest, ms.
    pub max_ms: f64,
    /// % of all kernels' GPU time.
    pub share_pct: f64,
}

/// GPU time inside engine steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepsGpu {
    /// Steps that launched kernels.
    pub steps: u64,
    /// Their wall (host) time, ms.
    pub wall_ms: f64,
    /// GPU busy time of their kernels, ms.
    pub gpu_busy_ms: f64,
    /// `gpu_busy_ms` / `wall_ms`, %.
    pub gpu_busy_pct: f64,
    /// First kernel start → last kernel end, summed, ms.
    pub span_ms: f64,
    /// GPU idle between kernels inside the steps, ms.
    pub idle_ms: f64,
    /// `idle_ms` / `span_ms`, %.
    pub idle_pct: f64,
    /// Each step, in step order.
    pub per_step: Vec<StepGpuRow>,
}

/// One step's GPU time.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepGpuRow {
    /// Process track id (steps of different processes have their own ids).
    pub pid_track: u64,
    /// The engine's step id.
    pub step_id: u64,
    /// Host wall time, ms.
    pub wall_ms: f64,
    /// GPU busy time, ms.
    pub gpu_busy_ms: f64,
    /// Idle between its kernels, ms.
    pub idle_ms: f64,
    /// Kernels.
    pub kernels: u64,
    /// Summaries: the top kernel of its longest busy interval (None: every kernel, or unnamed).
    pub top_kernel: Option<String>,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// (busy, span) of intervals: their union's length and first start → last end.
fn busy_and_span(mut v: Vec<(u64, u64)>) -> (u64, u64) {
    v.sort_unstable();
    let (Some(first), Some(last_end)) = (v.first().map(|x| x.0), v.iter().map(|x| x.1).max()) else {
        return (0, 0);
    };
    let mut busy = 0;
    let (mut s, mut e) = v[0];
    for &(a, b) in &v[1..] {
        if a > e {
            busy += e - s;
            (s, e) = (a, b);
        } else {
            e = e.max(b);
        }
    }
    busy += e - s;
    (busy, last_end - first)
}

/// A kernel name's count and time, ns: (count, total, min, max).
#[derive(Clone, Copy, Default)]
struct Sum {
    count: u64,
    total: u64,
    min: u64,
    max: u64,
}

impl Sum {
    fn add(&mut self, count: u64, total: u64, min: u64, max: u64) {
        self.min = if self.count == 0 { min } else { self.min.min(min) };
        self.max = self.max.max(max);
        self.count += count;
        self.total += total;
    }
}

/// A step's GPU time: every kernel's interval, or the summaries' (busy, span, kernels, longest interval's
/// top kernel).
#[derive(Default)]
struct InStep {
    intervals: Vec<(u64, u64)>,
    busy: u64,
    span: u64,
    kernels: u64,
    longest: Option<(u64, String)>,
}

/// The section, from the stream tracks' slices (every kernel), the busy and window slices (summaries) and the
/// steps.
pub(super) fn section(d: &Decoded, steps: &[Step]) -> Option<KernelsSection> {
    let mut s = KernelsSection::default();
    let mut by_name: BTreeMap<String, Sum> = BTreeMap::new();
    let mut in_step: BTreeMap<(u64, u64), InStep> = BTreeMap::new();
    let (mut every, mut summaries) = (false, false);
    for t in d.tracks.values() {
        let name = t.name.as_deref().unwrap_or("");
        if gpu_track::parse_stream(name).is_some() {
            for sl in &t.slices {
                match arg_s(&sl.args, gpu_arg::KIND) {
                    Some(k @ (gpu_arg::KIND_KERNEL | gpu_arg::KIND_GRAPH)) => {
                        s.kernels += 1;
                        by_name
                            .entry(sl.name.clone())
                            .or_default()
                            .add(1, sl.dur, sl.dur, sl.dur);
                        if k == gpu_arg::KIND_GRAPH {
                            summaries = true;
                            continue;
                        }
                        every = true;
                        if let Some(id) = arg_f(&sl.args, arg::STEP_ID) {
                            let key = (t.parent.unwrap_or(0), id as u64);
                            in_step
                                .entry(key)
                                .or_default()
                                .intervals
                                .push((sl.ts, sl.ts + sl.dur));
                        }
                    }
                    Some(gpu_arg::KIND_MEMCPY) => {
                        s.copies += 1;
                        s.copy_ms += ms(sl.dur);
                    }
                    _ => {}
                }
            }
        } else if gpu_track::parse_busy(name).is_some() {
            summaries = true;
            for sl in &t.slices {
                let Some(id) = arg_f(&sl.args, arg::STEP_ID) else {
                    continue;
                };
                let e = in_step.entry((t.parent.unwrap_or(0), id as u64)).or_default();
                let busy = arg_f(&sl.args, gpu_arg::BUSY_NS).unwrap_or(0.0) as u64;
                e.busy += busy.min(sl.dur);
                e.span += sl.dur;
                e.kernels += arg_f(&sl.args, gpu_arg::KERNELS).unwrap_or(0.0) as u64;
                if e.longest.as_ref().is_none_or(|l| sl.dur > l.0)
                    && let Some(top) = gpu_slice::parse_busy(&sl.name)
                {
                    e.longest = Some((sl.dur, top.to_owned()));
                }
            }
        } else if name == gpu_track::SUMMARY {
            summaries = true;
            for sl in &t.slices {
                let kinds = arg_s_array(&sl.args, gpu_arg::ROW_KIND);
                let names = arg_s_array(&sl.args, gpu_arg::ROW_NAME);
                let count = arg_u_array(&sl.args, gpu_arg::ROW_COUNT);
                let total = arg_u_array(&sl.args, gpu_arg::ROW_TOTAL_NS);
                let min = arg_u_array(&sl.args, gpu_arg::ROW_MIN_NS);
                let max = arg_u_array(&sl.args, gpu_arg::ROW_MAX_NS);
                let n = [names.len(), count.len(), total.len(), min.len(), max.len()]
                    .into_iter()
                    .fold(kinds.len(), usize::min);
                for i in 0..n {
                    match kinds[i] {
                        gpu_arg::KIND_KERNEL => {
                            s.kernels += count[i];
                            by_name
                                .entry(names[i].to_owned())
                                .or_default()
                                .add(count[i], total[i], min[i], max[i]);
                        }
                        gpu_arg::KIND_MEMCPY => {
                            s.copies += count[i];
                            s.copy_ms += ms(total[i]);
                        }
                        gpu_arg::KIND_WAIT => {
                            s.waits += count[i];
                            s.wait_ms += ms(total[i]);
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    if s.kernels == 0 && !summaries {
        return None;
    }
    s.mode = if every || !summaries {
        MODE_EVERY
    } else {
        MODE_SUMMARIES
    };
    let total: u64 = by_name.values().map(|v| v.total).sum();
    s.gpu_ms = ms(total);
    let mut top: Vec<KernelRow> = by_name
        .into_iter()
        .map(|(name, v)| KernelRow {
            name,
            count: v.count,
            total_ms: ms(v.total),
            mean_ms: ms(v.total) / v.count.max(1) as f64,
            min_ms: ms(v.min),
            max_ms: ms(v.max),
            share_pct: if total > 0 {
                100.0 * v.total as f64 / total as f64
            } else {
                0.0
            },
        })
        .collect();
    top.sort_by(|a, b| {
        b.total_ms
            .total_cmp(&a.total_ms)
            .then_with(|| a.name.cmp(&b.name))
    });
    top.truncate(TOP_KERNELS);
    s.top = top;
    s.lost = d
        .tracks
        .values()
        .flat_map(|t| &t.instants)
        .find(|i| i.name == marker::SUMMARY)
        .and_then(|i| arg_f(&i.args, gpu_arg::LOST))
        .map(|v| v as u64);
    let mut g = StepsGpu::default();
    for st in steps {
        let key = (st.process.unwrap_or(0), st.info.step_id);
        let Some(e) = in_step.remove(&key) else { continue };
        let (n, busy, span) = if e.intervals.is_empty() {
            (e.kernels, e.busy, e.span)
        } else {
            let n = e.intervals.len() as u64;
            let (busy, span) = busy_and_span(e.intervals);
            (n, busy, span)
        };
        let wall = st.info.end_ns.saturating_sub(st.info.start_ns);
        g.steps += 1;
        g.wall_ms += ms(wall);
        g.gpu_busy_ms += ms(busy);
        g.span_ms += ms(span);
        g.idle_ms += ms(span - busy);
        g.per_step.push(StepGpuRow {
            pid_track: key.0,
            step_id: key.1,
            wall_ms: ms(wall),
            gpu_busy_ms: ms(busy),
            idle_ms: ms(span - busy),
            kernels: n,
            top_kernel: e.longest.map(|l| l.1),
        });
    }
    if g.steps > 0 {
        g.gpu_busy_pct = if g.wall_ms > 0.0 {
            100.0 * g.gpu_busy_ms / g.wall_ms
        } else {
            0.0
        };
        g.idle_pct = if g.span_ms > 0.0 {
            100.0 * g.idle_ms / g.span_ms
        } else {
            0.0
        };
        s.steps = Some(g);
    }
    Some(s)
}

/// The terminal section.
pub(super) fn text(out: &mut String, s: Option<&KernelsSection>, rows: usize) {
    let Some(s) = s else { return };
    let lost = s.lost.map(|l| format!(", {l} records lost")).unwrap_or_default();
    let waits = if s.waits > 0 {
        format!("; {} host waits, {:.3} ms", s.waits, s.wait_ms)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "\nGPU kernels (CUPTI, {}): {} kernels, {:.3} ms GPU time; {} copies, {:.3} ms{waits}{lost}",
        s.mode, s.kernels, s.gpu_ms, s.copies, s.copy_ms
    );
    let _ = writeln!(
        out,
        "  {:>8} {:>11} {:>10} {:>10} {:>10} {:>6}  kernel",
        "count", "total ms", "mean ms", "min ms", "max ms", "share"
    );
    for k in s.top.iter().take(rows) {
        let _ = writeln!(
            out,
            "  {:>8} {:>11.3} {:>10.4} {:>10.4} {:>10.4} {:>5.1}%  {}",
            k.count, k.total_ms, k.mean_ms, k.min_ms, k.max_ms, k.share_pct, k.name
        );
    }
    if let Some(g) = &s.steps {
        let _ = writeln!(
            out,
            "  in {} engine steps: GPU busy {:.3} ms of {:.3} ms wall ({:.1}%); idle between kernels {:.3} ms \
             ({:.1}% of the kernels' span{})",
            g.steps,
            g.gpu_busy_ms,
            g.wall_ms,
            g.gpu_busy_pct,
            g.idle_ms,
            g.idle_pct,
            if g.idle_pct >= 20.0 { ": launch-bound" } else { "" }
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly")]
mod tests {
    use crate::event::SessionStats;
    use crate::perfetto::sink::TraceSink;
    use crate::testing;

    const MS: u64 = 1_000_000;
    const T0: u64 = 5_000 * MS;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    /// The report of a trace of `events` (process 10, thread 11) whose summary has `gpu`.
    fn report_of(
        events: &[crate::event::Event],
        gpu: crate::event::cupti::GpuStats,
    ) -> crate::report::Report {
        let procs = [testing::process(10, "llmserve", "llmserve", [(11, "engine")])];
        let mut sink = TraceSink::new(Vec::new(), &procs, Some((T0, 0))).unwrap();
        for e in events {
            sink.push(e).unwrap();
        }
        let stats = SessionStats {
            gpu,
            ..Default::default()
        };
        let bytes = sink.finish(&stats, Some(T0 + 40 * MS)).unwrap();
        crate::report::from_bytes(std::path::Path::new("t"), &bytes).unwrap()
    }

    #[test]
    fn report_has_top_kernels_and_gpu_time_inside_steps() {
        let (events, gpu) = testing::cupti::engine_fixture(10, 11, T0);
        let r = report_of(&events, gpu);
        let k = r.kernels.as_ref().unwrap();
        assert_eq!((k.kernels, k.copies, k.lost), (4, 1, Some(0)));
        assert!(close(k.gpu_ms, 6.0) && close(k.copy_ms, 0.5), "{k:?}");
        let top: Vec<(&str, u64, f64, f64)> = k
            .top
            .iter()
            .map(|t| (t.name.as_str(), t.count, t.total_ms, t.mean_ms))
            .collect();
        assert_eq!(top, vec![("gemm<128>", 2, 4.0, 2.0), ("softmax", 2, 2.0, 1.0)]);
        assert!(close(k.top[0].share_pct, 400.0 / 6.0));
        let s = k.steps.as_ref().unwrap();
        let per: Vec<(u64, f64, f64, f64, u64)> = s
            .per_step
            .iter()
            .map(|p| (p.step_id, p.wall_ms, p.gpu_busy_ms, p.idle_ms, p.kernels))
            .collect();
        assert_eq!(per, vec![(1, 10.0, 3.0, 1.0, 2), (2, 10.0, 3.0, 0.0, 2)]);
        assert!(
            close(s.gpu_busy_pct, 30.0) && close(s.idle_pct, 100.0 / 7.0),
            "{s:?}"
        );
        let text = r.to_text();
        assert!(
            text.contains("GPU kernels (CUPTI, every kernel): 4 kernels, 6.000 ms GPU time"),
            "{text}"
        );
        assert!(
            text.contains("gemm<128>") && text.contains("idle between kernels 1.000 ms"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["kernels"]["top"][0]["name"], "gemm<128>");
        assert_eq!(json["kernels"]["steps"]["per_step"][0]["idle_ms"], 1.0);
    }

    #[test]
    fn a_summarized_trace_has_top_kernels_graphs_waits_and_busy_time_per_step() {
        let (events, gpu) = testing::cupti::summary_fixture(10, 11, T0);
        assert_eq!((gpu.summaries, gpu.busy, gpu.activities), (4, 2, 1), "{gpu:?}");
        let r = report_of(&events, gpu);
        let k = r.kernels.as_ref().unwrap();
        assert_eq!(k.mode, super::MODE_SUMMARIES);
        assert_eq!((k.kernels, k.copies, k.waits), (3, 1, 1));
        assert!(
            close(k.gpu_ms, 6.0) && close(k.copy_ms, 0.5) && close(k.wait_ms, 1.0),
            "{k:?}"
        );
        let top: Vec<(&str, u64, f64)> = k
            .top
            .iter()
            .map(|t| (t.name.as_str(), t.count, t.total_ms))
            .collect();
        assert_eq!(
            top,
            vec![
                ("CUDA graph 5", 1, 3.0),
                ("gemm<128>", 1, 2.0),
                ("softmax", 1, 1.0)
            ]
        );
        let s = k.steps.as_ref().unwrap();
        let per: Vec<(u64, f64, f64, u64, Option<&str>)> = s
            .per_step
            .iter()
            .map(|p| {
                (
                    p.step_id,
                    p.gpu_busy_ms,
                    p.idle_ms,
                    p.kernels,
                    p.top_kernel.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            per,
            vec![(1, 3.0, 1.0, 2, Some("gemm<128>")), (2, 3.0, 0.0, 1, None)]
        );
        assert!(close(s.gpu_busy_pct, 30.0), "{s:?}");
        let text = r.to_text();
        assert!(
            text.contains("GPU kernels (CUPTI, summaries): 3 kernels, 6.000 ms GPU time; 1 copies, 0.500 ms; 1 host waits, 1.000 ms"),
            "{text}"
        );
    }

    #[test]
    fn a_trace_without_kernels_has_no_section() {
        let procs = [testing::process(10, "x", "x", [(11, "t")])];
        let mut sink = TraceSink::new(Vec::new(), &procs, Some((T0, 0))).unwrap();
        sink.push(&testing::step(10, 11, llmprof_abi::StepKind::Decode, 1, T0, T0 + MS, &[1]).build())
            .unwrap();
        let bytes = sink.finish(&SessionStats::default(), None).unwrap();
        let r = crate::report::from_bytes(std::path::Path::new("t"), &bytes).unwrap();
        assert_eq!(r.kernels, None);
    }
}
