//! The `--json` document of `llmprof report` (layout and stability rules in the [module docs](super)).
//!
//! Owns the mapping from the [`Report`] to that layout: one `#[derive(Serialize)]` struct per JSON object,
//! its fields in the documented key order (serde writes struct fields in declaration order), every float
//! through [`Num`] (rounded to 1e-6, `null` when not finite). Formatting only: every number comes from the
//! [`Report`]; a field added here is a field added to the module docs. Each section's objects are in the file
//! of its probe family (`engine`, `syscalls`, `files`, `egress`, `cuda`, `sched`), `session` has `drops` and
//! `overhead`; `cpu_samples` and `kernels` serialize their report types directly.

use serde::{Serialize, Serializer};

use super::{JSON_FORMAT, Report, Stats};
use cuda::Gpu;
use egress::Egress;
use engine::{Counters, Requests, Steps};
use files::ModelFile;
use session::{Drops, Overhead};
use syscalls::Syscalls;

mod cuda;
mod egress;
mod engine;
mod files;
mod sched;
mod session;
mod syscalls;

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests;

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
    thread_states: Option<sched::ThreadStatesJson<'a>>,
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
            syscalls: Syscalls::of(r),
            model_files: r.model_files.iter().map(ModelFile::of).collect(),
            egress: r.egress.iter().map(Egress::of).collect(),
            drops: Drops::of(r),
            overhead: r.overhead.as_ref().map(Overhead::of),
            gpu: r.gpu.as_ref().map(Gpu::of),
            thread_states: r.thread_states.as_ref().map(sched::ThreadStatesJson::of),
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
