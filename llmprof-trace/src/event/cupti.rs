//! GPU activity recorded by CUPTI in the traced processes: the events the chunks of the injected helper become
//! (kernels, copies, API calls, window summaries, busy intervals; decoded by [`crate::decode::cupti`]), the
//! chunks' loss counts, and what links GPU work to its launch and its engine step ([`LaunchLinks`]).
//!
//! Owns the model only: no bytes are read here.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use llmprof_abi::StepRecord;
use llmprof_abi::cupti::{GpuActivity, GpuActivityKind, GpuApiCall, GpuBusy, GpuSummary};

/// Kernel names kept per process; a name beyond is not stored (its kernels show as unnamed) and is counted.
pub const NAMES_PER_PROCESS: usize = 65_536;

/// A kernel, copy, memset or host wait recorded by CUPTI in a traced process, times mapped to BOOTTIME.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuWork {
    /// What it is.
    pub kind: GpuActivityKind,
    /// The record, `start_ns` / `end_ns` on CLOCK_BOOTTIME (`end_ns` ≥ `start_ns`).
    pub rec: GpuActivity,
    /// Kernels: the demangled name (None: not sent, or not kept).
    pub name: Option<Arc<str>>,
    /// Kernels: the name as CUPTI gave it, when demangling changed it.
    pub mangled: Option<Arc<str>>,
}

/// A CUDA API call CUPTI recorded (the launch or wait that links a thread to GPU work by correlation id), times
/// mapped to BOOTTIME; the event's tid is the calling thread.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuApi {
    /// The record, `start_ns` / `end_ns` on CLOCK_BOOTTIME.
    pub rec: GpuApiCall,
    /// The function's name (`cuLaunchKernel`), when the helper sent it.
    pub name: Option<Arc<str>>,
}

/// One row of a window's summary ([`GpuSummary`], times mapped to BOOTTIME): a kernel name's (or copy kind's,
/// or wait type's) count and GPU time in the window.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryRow {
    /// What was summed (kernel, memcpy, memset, sync).
    pub kind: GpuActivityKind,
    /// The record, `first_ns` / `last_ns` on CLOCK_BOOTTIME.
    pub rec: GpuSummary,
    /// Kernels: the demangled name (None: unnamed, not sent, or the window's rest).
    pub name: Option<Arc<str>>,
}

/// The summary of one window of a process: its rows, in the helper's order (one event per run of rows of
/// the same window in a chunk).
#[derive(Clone, Debug, PartialEq)]
pub struct GpuWindow {
    /// The helper's window number.
    pub window: u32,
    /// The rows.
    pub rows: Vec<SummaryRow>,
}

impl GpuWindow {
    /// Earliest start and latest end of its rows (BOOTTIME).
    pub fn span(&self) -> (u64, u64) {
        let first = self.rows.iter().map(|r| r.rec.first_ns).min().unwrap_or(0);
        let last = self.rows.iter().map(|r| r.rec.last_ns).max().unwrap_or(first);
        (first, last.max(first))
    }
}

/// A compacted interval of GPU work on one device ([`GpuBusy`], times mapped to BOOTTIME).
#[derive(Clone, Debug, PartialEq)]
pub struct GpuBusyInterval {
    /// The record, `start_ns` / `end_ns` on CLOCK_BOOTTIME (`busy_ns` ≤ their distance).
    pub rec: GpuBusy,
    /// Its top kernel's demangled name (None: unnamed, or a graph launch).
    pub top: Option<Arc<str>>,
}

/// What the chunks of a session held and lost (shown in the trace summary with the other losses).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuStats {
    /// Chunks read.
    pub chunks: u64,
    /// Chunks refused whole: wrong magic or version, shorter than their header or than they say.
    pub bad_chunks: u64,
    /// Chunks llmprof missed (gaps in the helper's sequence numbers).
    pub missed_chunks: u64,
    /// Activity records the helper or CUPTI lost (the chunks' `dropped`).
    pub helper_dropped: u64,
    /// Records skipped: unknown kind, size not a multiple of 8, shorter than their layout, past the chunk.
    pub skipped_records: u64,
    /// Names skipped: longer than `GPU_NAME_MAX`, not UTF-8, or over [`NAMES_PER_PROCESS`].
    pub skipped_names: u64,
    /// Kernels, copies, memsets and waits decoded.
    pub activities: u64,
    /// API calls decoded.
    pub api_calls: u64,
    /// Summary rows decoded.
    pub summaries: u64,
    /// Busy intervals decoded.
    pub busy: u64,
}

impl GpuStats {
    /// Records and chunks lost or refused here or in the helper. Not [`GpuStats::missed_chunks`]: a chunk the ring
    /// could not take is already a drop of the `cuda` probe (and a gap may also be a chunk handed over while no
    /// session was attached), so it is shown, not added.
    pub fn lost(&self) -> u64 {
        [self.helper_dropped, self.skipped_records, self.skipped_names]
            .iter()
            .fold(self.bad_chunks, |a, &b| a.saturating_add(b))
    }
}

/// Steps kept per process to find the one a launch was in.
pub const STEPS_KEPT: usize = 4096;
/// API calls kept per process for the flows to the work they launched.
pub const CALLS_KEPT: usize = 65_536;

/// One process's API calls: correlation id → (tid, start), and the ids in arrival order (oldest evicted).
type Calls = (HashMap<u32, (u32, u64)>, VecDeque<u32>);

/// What links GPU work to its launch and its engine step, kept per process from the event stream (bounded:
/// the last [`STEPS_KEPT`] steps and [`CALLS_KEPT`] API calls); used by the Perfetto sink and the OTel builder.
#[derive(Debug, Default)]
pub struct LaunchLinks {
    /// Per process: (host start, host end, step id) of its last steps, in arrival order.
    steps: HashMap<u32, VecDeque<(u64, u64, u64)>>,
    /// Per process: correlation id → (tid, start) of its API calls, and their order for eviction.
    calls: HashMap<u32, Calls>,
}

impl LaunchLinks {
    /// Remembers a step's host range.
    pub fn step(&mut self, pid: u32, r: &StepRecord) {
        let q = self.steps.entry(pid).or_default();
        if q.len() == STEPS_KEPT {
            q.pop_front();
        }
        q.push_back((r.host_start_ns, r.host_end_ns, r.step_id));
    }

    /// The step of `pid` whose host time range holds `t`.
    pub fn step_at(&self, pid: u32, t: u64) -> Option<u64> {
        let q = self.steps.get(&pid)?;
        q.iter()
            .rev()
            .find(|(s, e, _)| *s <= t && t <= *e)
            .map(|&(_, _, id)| id)
    }

    /// Remembers an API call (its thread and start) by correlation id.
    pub fn call(&mut self, pid: u32, correlation: u32, tid: u32, start: u64) {
        let (map, order) = self.calls.entry(pid).or_default();
        if map.len() == CALLS_KEPT
            && let Some(old) = order.pop_front()
        {
            map.remove(&old);
        }
        if map.insert(correlation, (tid, start)).is_none() {
            order.push_back(correlation);
        }
    }

    /// The thread and start of the API call `correlation` of `pid`, when seen.
    pub fn launch(&self, pid: u32, correlation: u32) -> Option<(u32, u64)> {
        self.calls.get(&pid)?.0.get(&correlation).copied()
    }

    /// A process left the session.
    pub fn forget(&mut self, pid: u32) {
        self.steps.remove(&pid);
        self.calls.remove(&pid);
    }
}

impl GpuWork {
    /// The engine step of `pid` this work belongs to: the step whose host time held its launch (its API call's
    /// start when `links` saw it, else the work's own start).
    pub fn step(&self, pid: u32, links: &LaunchLinks) -> Option<u64> {
        let launch = (self.rec.correlation != 0)
            .then(|| links.launch(pid, self.rec.correlation))
            .flatten();
        links.step_at(pid, launch.map_or(self.rec.start_ns, |l| l.1))
    }
}
