//! The report's CPU-sample section: top functions by self and total samples, per thread, threads grouped by
//! name (the engine loop, the HTTP workers, the compute pool: a pool's threads share a name).
//!
//! Reads the trace's own callstack encoding back (`InternedData` function names, frames and callstacks, and
//! the `PerfSample` packets, [`crate::perfetto::sink`]'s `samples` step). `--json` key `cpu_samples`, `null`
//! when the trace has no sample: `{samples, threads: [{name, tids, samples, top_self: [{function, samples,
//! pct}], top_total: [...]}]}`, threads by samples descending; `top_self` counts the samples whose innermost
//! frame is the function, `top_total` the samples with the function anywhere in the stack (once per sample);
//! `pct` is of the group's samples; at most [`TOP_FUNCTIONS`] rows each.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use serde::Serialize;

use crate::perfetto::schema::{SEQ_INCREMENTAL_STATE_CLEARED, TracePacket};

/// Rows of each top-functions list in `--json` (the terminal shows 5): by total samples the outermost
/// frames of every stack (`main`, the runtime's start-up chain: ~15 for a Rust binary) all come first at 100 %.
pub const TOP_FUNCTIONS: usize = 50;

/// What the reader keeps from the packets.
#[derive(Debug, Default)]
pub(super) struct SampleReader {
    names: HashMap<u64, String>,
    /// Frame iid → function name iid.
    frames: HashMap<u64, u64>,
    /// Callstack iid → frame iids, outermost first; stored resolved to names once complete.
    stacks: HashMap<u64, Vec<u64>>,
    thread_names: HashMap<u32, String>,
    /// Per (tid, callstack iid resolved to function names, innermost first): samples.
    samples: HashMap<(u32, Vec<String>), u64>,
}

impl SampleReader {
    /// Takes what a packet holds for samples (interned frames, samples, thread names).
    pub(super) fn packet(&mut self, p: &TracePacket) {
        if p.sequence_flags.unwrap_or(0) & SEQ_INCREMENTAL_STATE_CLEARED != 0 {
            self.names.clear();
            self.frames.clear();
            self.stacks.clear();
        }
        if let Some(th) = p.track_descriptor.as_ref().and_then(|t| t.thread.as_ref())
            && let (Some(tid), Some(name)) = (th.tid, th.thread_name.as_ref())
        {
            self.thread_names.insert(tid as u32, name.clone());
        }
        if let Some(i) = &p.interned_data {
            for n in &i.function_names {
                self.names
                    .insert(n.iid.unwrap_or(0), n.name.clone().unwrap_or_default());
            }
            for f in &i.frames {
                self.frames
                    .insert(f.iid.unwrap_or(0), f.function_name_id.unwrap_or(0));
            }
            for c in &i.callstacks {
                self.stacks.insert(c.iid.unwrap_or(0), c.frame_ids.clone());
            }
        }
        let Some(s) = &p.perf_sample else { return };
        let (Some(tid), Some(cs)) = (s.tid, s.callstack_iid) else {
            return;
        };
        let Some(frames) = self.stacks.get(&cs) else {
            return;
        };
        let names: Vec<String> = frames
            .iter()
            .rev()
            .map(|f| {
                self.frames
                    .get(f)
                    .and_then(|n| self.names.get(n))
                    .cloned()
                    .unwrap_or_else(|| "[unknown]".to_owned())
            })
            .collect();
        *self.samples.entry((tid, names)).or_default() += 1;
    }

    /// The section, `None` without samples.
    pub(super) fn section(&self) -> Option<CpuSamplesSection> {
        if self.samples.is_empty() {
            return None;
        }
        #[derive(Default)]
        struct Group {
            tids: Vec<u32>,
            samples: u64,
            self_: HashMap<String, u64>,
            total: HashMap<String, u64>,
        }
        let mut groups: BTreeMap<String, Group> = BTreeMap::new();
        for ((tid, stack), n) in &self.samples {
            let name = self
                .thread_names
                .get(tid)
                .cloned()
                .unwrap_or_else(|| format!("thread {tid}"));
            let g = groups.entry(name).or_default();
            if !g.tids.contains(tid) {
                g.tids.push(*tid);
            }
            g.samples += n;
            if let Some(leaf) = stack.first() {
                *g.self_.entry(leaf.clone()).or_default() += n;
            }
            let mut seen = HashSet::new();
            for f in stack {
                if seen.insert(f) {
                    *g.total.entry(f.clone()).or_default() += n;
                }
            }
        }
        let top = |m: HashMap<String, u64>, of: u64| -> Vec<FunctionRow> {
            let mut v: Vec<(String, u64)> = m.into_iter().collect();
            v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            v.into_iter()
                .take(TOP_FUNCTIONS)
                .map(|(function, samples)| FunctionRow {
                    function,
                    samples,
                    pct: 100.0 * samples as f64 / of.max(1) as f64,
                })
                .collect()
        };
        let mut threads: Vec<ThreadSamples> = groups
            .into_iter()
            .map(|(name, mut g)| {
                g.tids.sort_unstable();
                ThreadSamples {
                    name,
                    tids: g.tids,
                    samples: g.samples,
                    top_self: top(g.self_, g.samples),
                    top_total: top(g.total, g.samples),
                }
            })
            .collect();
        threads.sort_by(|a, b| b.samples.cmp(&a.samples).then_with(|| a.name.cmp(&b.name)));
        Some(CpuSamplesSection {
            samples: threads.iter().map(|t| t.samples).sum(),
            threads,
        })
    }
}

/// `cpu_samples`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CpuSamplesSection {
    /// Samples in the trace.
    pub samples: u64,
    /// Per thread name, by samples descending.
    pub threads: Vec<ThreadSamples>,
}

/// The samples of the threads sharing one name.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ThreadSamples {
    /// Thread name (`thread TID` when the trace does not name it).
    pub name: String,
    /// The thread ids of that name.
    pub tids: Vec<u32>,
    /// Their samples.
    pub samples: u64,
    /// Functions by samples where they are the innermost frame.
    pub top_self: Vec<FunctionRow>,
    /// Functions by samples where they are anywhere on the stack.
    pub top_total: Vec<FunctionRow>,
}

/// One function of a top list.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FunctionRow {
    /// Demangled name.
    pub function: String,
    /// Samples.
    pub samples: u64,
    /// % of the thread group's samples.
    #[serde(serialize_with = "round6")]
    pub pct: f64,
}

fn round6<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((v * 1e6).round() / 1e6)
}

/// The terminal section: per thread group, its 5 top functions by self and total samples.
pub(super) fn text(out: &mut String, s: Option<&CpuSamplesSection>) {
    let Some(s) = s else { return };
    let _ = writeln!(
        out,
        "\nCPU samples: {} (top functions per thread, self | total)",
        s.samples
    );
    for t in s.threads.iter().take(10) {
        let _ = writeln!(
            out,
            "  {} ({} thread(s), {} samples)",
            t.name,
            t.tids.len(),
            t.samples
        );
        for i in 0..5.min(t.top_self.len().max(t.top_total.len())) {
            let cell = |r: Option<&FunctionRow>| {
                r.map(|r| format!("{:5.1}% {}", r.pct, r.function))
                    .unwrap_or_default()
            };
            let _ = writeln!(
                out,
                "    {:<60} | {}",
                cell(t.top_self.get(i)),
                cell(t.top_total.get(i))
            );
        }
    }
}
