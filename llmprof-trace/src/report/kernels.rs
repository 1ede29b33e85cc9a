//! `llmprof report`'s GPU kernel section (CUPTI activity through the injected helper): the top kernels by GPU
//! time, and per engine step the GPU busy time against the step's wall time and the GPU idle gaps between its
//! kernels (a step whose kernels leave the GPU idle between them is launch-bound: the host does not enqueue
//! work fast enough). `--json` key `kernels`, `null` when the trace has no kernel slice:
//! `{kernels, gpu_ms, copies, copy_ms, lost, top: [{name, count, total_ms, mean_ms, share_pct}], steps:
//! {steps, wall_ms, gpu_busy_ms, gpu_busy_pct, span_ms, idle_ms, idle_pct, per_step: [{pid_track, step_id,
//! wall_ms, gpu_busy_ms, idle_ms, kernels}]}}`.
//! - `gpu_ms`: sum of kernel durations; `share_pct` a kernel name's share of it; `lost` the summary's
//!   `gpu_activity_lost` (`null` without it).
//! - per step: the kernels whose `step_id` arg names it (the step whose host time range held the launch).
//!   `gpu_busy_ms` is the union of its kernels' intervals (overlapping streams counted once), `span_ms` first
//!   kernel start → last kernel end, `idle_ms` = span − busy (the gaps between kernels), `gpu_busy_pct` =
//!   busy / wall, `idle_pct` = idle / span, summed over steps.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::read::{Decoded, arg_f, arg_s};
use super::requests::Step;
use crate::names::gpu::{arg as gpu_arg, track as gpu_track};
use crate::names::{arg, marker};

/// Rows of the top-kernels table kept in the JSON (the text shows 10).
pub const TOP_KERNELS: usize = 50;

/// The section.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KernelsSection {
    /// Kernel slices.
    pub kernels: u64,
    /// Their summed GPU time, ms.
    pub gpu_ms: f64,
    /// Copy slices.
    pub copies: u64,
    /// Their summed time, ms.
    pub copy_ms: f64,
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

/// The section, from the stream tracks' slices and the steps.
pub(super) fn section(d: &Decoded, steps: &[Step]) -> Option<KernelsSection> {
    let mut s = KernelsSection::default();
    let mut by_name: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut in_step: BTreeMap<(u64, u64), Vec<(u64, u64)>> = BTreeMap::new();
    for t in d.tracks.values() {
        if t.name.as_deref().and_then(gpu_track::parse_stream).is_none() {
            continue;
        }
        for sl in &t.slices {
            match arg_s(&sl.args, gpu_arg::KIND) {
                Some(gpu_arg::KIND_KERNEL) => {
                    s.kernels += 1;
                    let e = by_name.entry(sl.name.as_str()).or_default();
                    e.0 += 1;
                    e.1 += sl.dur;
                    if let Some(id) = arg_f(&sl.args, arg::STEP_ID) {
                        let key = (t.parent.unwrap_or(0), id as u64);
                        in_step.entry(key).or_default().push((sl.ts, sl.ts + sl.dur));
                    }
                }
                Some(gpu_arg::KIND_MEMCPY) => {
                    s.copies += 1;
                    s.copy_ms += ms(sl.dur);
                }
                _ => {}
            }
        }
    }
    if s.kernels == 0 {
        return None;
    }
    let total: u64 = by_name.values().map(|v| v.1).sum();
    s.gpu_ms = ms(total);
    let mut top: Vec<KernelRow> = by_name
        .into_iter()
        .map(|(name, (count, ns))| KernelRow {
            name: name.to_owned(),
            count,
            total_ms: ms(ns),
            mean_ms: ms(ns) / count as f64,
            share_pct: if total > 0 {
                100.0 * ns as f64 / total as f64
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
        let Some(v) = in_step.remove(&key) else { continue };
        let n = v.len() as u64;
        let (busy, span) = busy_and_span(v);
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
    let _ = writeln!(
        out,
        "\nGPU kernels (CUPTI): {} kernels, {:.3} ms GPU time; {} copies, {:.3} ms{lost}",
        s.kernels, s.gpu_ms, s.copies, s.copy_ms
    );
    let _ = writeln!(
        out,
        "  {:>6} {:>11} {:>10} {:>6}  kernel",
        "count", "total ms", "mean ms", "share"
    );
    for k in s.top.iter().take(rows) {
        let _ = writeln!(
            out,
            "  {:>6} {:>11.3} {:>10.4} {:>5.1}%  {}",
            k.count, k.total_ms, k.mean_ms, k.share_pct, k.name
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

    #[test]
    fn report_has_top_kernels_and_gpu_time_inside_steps() {
        let (events, gpu) = testing::gpu::engine_fixture(10, 11, T0);
        let procs = [testing::process(10, "llmserve", "llmserve", [(11, "engine")])];
        let mut sink = TraceSink::new(Vec::new(), &procs, Some((T0, 0))).unwrap();
        for e in &events {
            sink.push(e).unwrap();
        }
        let stats = SessionStats {
            gpu,
            ..Default::default()
        };
        let bytes = sink.finish(&stats, Some(T0 + 40 * MS)).unwrap();
        let r = crate::report::from_bytes(std::path::Path::new("t"), &bytes).unwrap();
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
            text.contains("GPU kernels (CUPTI): 4 kernels, 6.000 ms GPU time"),
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
