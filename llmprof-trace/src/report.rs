//! `llmprof report`: reads an llmprof Perfetto trace back and summarizes it for a terminal or a script.
//!
//! Owns the reading side of the trace layout written by [`crate::perfetto::sink`]: it decodes the file with the
//! same prost schema ([`crate::perfetto::schema`]) packet by packet, rebuilds slices, instants and counters per
//! track, and computes the numbers of issue 6 ("llmprof report"). It never runs Perfetto's trace processor and
//! never writes anything; a file that is not an llmprof trace is a [`ReportError`], not an empty report.
//!
//! # `--json` output (stable; fields are only ever added)
//! All durations are milliseconds (`*_ms`), all percentiles are nearest-rank over the samples named in the
//! section (`{"count", "p50", "p95", "p99", "max", "mean"}`, values `null` when there are no samples).
//! - `format`: `"llmprof-report/1"`; `trace`: the path; `truncated`: the file ended mid-packet (crash);
//!   `has_summary`: the final `llmprof summary` packet is present; `end_reason`: from it (`null` without).
//! - `requests`: `{count, finished, unfinished, ttft_ms, queue_ms, prefill_ms, first_decode_step_ms, itl_ms,
//!   per_request: [{req_id, x_request_id, queue_ms, prefill_ms, ttft_ms, first_decode_step_ms, output_tokens,
//!   finish_reason, preemptions, attached_mid_request}]}`; a request already running when llmprof attached
//!   has `null` queue/prefill/TTFT (its arrival was not seen) and is left out of those percentiles. `queue_ms` = time in `queued` / `queued (preempted)` phases before the first
//!   token (arrival → scheduled), `prefill_ms` = time in `prefill` phases before it (scheduled → first token),
//!   `ttft_ms` = arrival → first token (= queue + prefill), `first_decode_step_ms` = duration of the first
//!   `decode`/`mixed` engine step that serves the request after its first token. `itl_ms`: inter-token latency
//!   samples = gaps between consecutive token times of a request, token times being its first token and the
//!   ends of the `decode`/`mixed` steps that served it afterwards (one token per step per request); a request
//!   no step names falls back to one sample, (finish − first token) / (output tokens − 1).
//! - `steps`: `{count, by_kind: {prefill|decode|mixed: stats}, by_batch_size: [{bucket, min_seqs, max_seqs,
//!   stats}]}`, step durations (host) by kind and by `num_seqs` bucket ([`BATCH_BUCKETS`]).
//! - `counters`: `{kv_cache_usage, requests_waiting, requests_running}` each `{samples, max, mean, last}`
//!   (mean of the samples, taken every scrape interval) and `preemptions_total` (last value).
//! - `syscalls`: `{slow_syscall_slices: [{name, count, total_ms, max_ms}], kernel_aggregates: [{name, count,
//!   total_ms}]}`, both by total time, descending. Slices are the calls slower than `--slow-syscall`; the
//!   aggregates are the summary's `top_syscalls` (all calls, top [`crate::perfetto::sink::SUMMARY_TOP_SYSCALLS`]
//!   per thread and syscall, summed by name here).
//! - `model_files`: `[{path, reads, bytes, read_ms, mb_per_s, opens, mmaps}]` (read/pread64/readv slices).
//! - `egress`: `[{address, port, connects, failed, allowed, verdict}]` (`verdict`: `allowed` / `flagged`).
//! - `drops`: `{total_dropped, user_drops, decode_errors, source, probes: [{probe, hits, emitted, dropped}]}`;
//!   `source` is `summary` or `drop_counters` (the per-probe counter tracks, when the summary is missing).
//! - `overhead`: llmprof's self-accounting, `null` for traces without it: `{est_target_cpu_ms,
//!   est_target_pct, target_cpu_ms, by_probe_ms: {probe: ms}, llmprof_cpu_ms, llmprof_cpu_pct,
//!   llmprof_max_rss_mib, cost_ns: {syscall, engine_probe, engine_probe_sampled_out}, probe_entry,
//!   budget_pct, degradations: [{at_s, level, step, change, est_overhead_pct, syscalls_counted}],
//!   size_limit_bytes, size_limit_reached, events_not_written}`; `est_target_pct` is the estimated CPU llmprof
//!   added as a % of the target's own CPU time (the `--overhead-budget` measure), `at_s` seconds from the
//!   first slice or instant of the trace. Missing values are `null`.
//! - `gpu`: the GPU layer, `null` when the trace has none of it (no NVML counter, no CUDA driver call slice,
//!   no GPU marker): `{gpus: [{index, name, counters: [{metric, unit, samples, mean, max, last}],
//!   process_memory_mib: [{pid, samples, mean, max, last}]}], cuda: {functions: [{function, calls, total_ms,
//!   individual}], host_total_ms, synchronize_calls, synchronize_ms, launches_per_step, summary, probe},
//!   markers: [text]}`. `counters` are the NVML counter tracks of the GPU in the sink's order (`metric` =
//!   the track name after `GPU N `, e.g. `utilization`, `memory used`, `power`; `unit` `%`, `MiB`, `W`, `MHz`,
//!   `°C`, `MB/s`), `process_memory_mib` the target's own device memory on it (`GPU N memory (pid P)`).
//!   `functions`: CUDA driver host time by function (the name without the `_v2`/`_ptsz` variant), by
//!   `total_ms` descending: `calls` and `total_ms` count the individual slices and the calls inside batches
//!   (their `functions` arg), `individual` is the stats of the individual slices (synchronize calls always,
//!   copies/allocations ≥ 50 µs). `synchronize_*`: the `cu*Synchronize` slices, where the host waited for the
//!   GPU. `launches_per_step`: stats of the kernel/graph launches per engine step (summed over the batches
//!   with one `step_id` in one process; `count` 0 without engine probes). `summary`: the summary's
//!   `cuda_calls` `{calls, individual, batches, batched, over_budget}` or `null`; `probe`: the `cuda` probe's
//!   `{hits, emitted, dropped}` or `null`. `markers`: the GPU layer's markers on the `llmprof` track
//!   (`GPU counters unavailable: ...`, `libcuda not loaded ...`, `CUDA driver probes attached/failed ...`).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use prost::Message;

use crate::perfetto::schema::{
    SEQ_INCREMENTAL_STATE_CLEARED, TRACE_PACKET_TAG, TYPE_COUNTER, TYPE_INSTANT, TYPE_SLICE_BEGIN,
    TYPE_SLICE_END, TracePacket,
};
use crate::perfetto::sink::{
    CUDA_TRACK, DEGRADATION_PREFIX, GPU_COUNTERS, LLMPROF_TRACK, STEPS_TRACK, SUMMARY_EVENT,
};

/// Version tag of the `--json` layout (bumped only on an incompatible change).
pub const JSON_FORMAT: &str = "llmprof-report/1";

/// Batch-size buckets of the step table, `(min_seqs, max_seqs)` inclusive: powers of two, the shape of the
/// batch sizes engines capture CUDA graphs for (vLLM's `cudagraph_capture_sizes` 1, 2, 4, 8, ...).
pub const BATCH_BUCKETS: [(u64, u64); 8] = [
    (0, 1),
    (2, 2),
    (3, 4),
    (5, 8),
    (9, 16),
    (17, 32),
    (33, 64),
    (65, u64::MAX),
];

/// How many rows the terminal tables show (the JSON has them all).
const TEXT_ROWS: usize = 10;

/// Names of the counter tracks the sink writes (`perfetto/sink.rs` `COUNTERS`).
const KV_USAGE: &str = "KV cache usage";
const WAITING: &str = "requests waiting";
const RUNNING: &str = "requests running";
const PREEMPTIONS: &str = "preemptions";
/// Prefix of the per-probe drop counter tracks.
const DROPS_PREFIX: &str = "llmprof drops: ";
/// Beginnings of the GPU layer's markers on the `llmprof` track (`gpu/mod.rs`).
const GPU_MARKERS: [&str; 4] = [
    "GPU counters unavailable",
    "NVML",
    "libcuda not loaded",
    "CUDA driver probes",
];
/// Suffix of every CUDA driver call slice name (`cuStreamSynchronize (host)`, `cuLaunchKernel ×N (host)`).
const CUDA_SUFFIX: &str = " (host)";

/// Why a trace could not be reported on.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is empty.
    #[error(
        "{path} is empty: not a Perfetto trace (was the attach session killed before it wrote anything?)"
    )]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The first packet does not decode: not a Perfetto trace at all.
    #[error("{path} is not a Perfetto trace ({reason}); give a file written by `llmprof attach -o FILE`")]
    NotPerfetto {
        /// The file.
        path: PathBuf,
        /// What did not decode.
        reason: String,
    },
    /// A Perfetto trace, but without any track llmprof writes.
    #[error(
        "{path} is a Perfetto trace but not one llmprof wrote (no `llmprof`, `engine steps`, request, syscall or \
         counter tracks); `llmprof report` reads the files of `llmprof attach -o FILE`"
    )]
    NotLlmprof {
        /// The file.
        path: PathBuf,
    },
}

/// A decoded debug annotation value.
#[derive(Clone, Debug, PartialEq)]
enum Val {
    U(u64),
    I(i64),
    F(f64),
    B(bool),
    S(String),
}

impl Val {
    fn f64(&self) -> Option<f64> {
        match self {
            Self::U(v) => Some(*v as f64),
            Self::I(v) => Some(*v as f64),
            Self::F(v) => Some(*v),
            Self::B(_) | Self::S(_) => None,
        }
    }
    fn str(&self) -> Option<&str> {
        match self {
            Self::S(s) => Some(s),
            _ => None,
        }
    }
}

type Args = BTreeMap<String, Val>;

fn arg_f(a: &Args, k: &str) -> Option<f64> {
    a.get(k).and_then(Val::f64)
}
fn arg_s<'a>(a: &'a Args, k: &str) -> Option<&'a str> {
    a.get(k).and_then(Val::str)
}

/// A rebuilt slice (begin and end args merged, end wins).
#[derive(Clone, Debug)]
struct Slice {
    name: String,
    ts: u64,
    dur: u64,
    args: Args,
}

/// A rebuilt instant.
#[derive(Clone, Debug)]
struct Instant {
    name: String,
    ts: u64,
    args: Args,
}

#[derive(Debug, Default)]
struct Track {
    name: Option<String>,
    /// The process track a child track hangs under (steps and requests of one process share it).
    parent: Option<u64>,
    slices: Vec<Slice>,
    instants: Vec<Instant>,
    counter: Vec<f64>,
    open: Vec<(String, u64, Args)>,
}

/// The trace, decoded into tracks.
#[derive(Debug, Default)]
struct Decoded {
    tracks: BTreeMap<u64, Track>,
    truncated: bool,
}

fn decode_varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let x = *b.get(*pos)?;
        *pos += 1;
        v |= u64::from(x & 0x7f) << shift;
        if x & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn decode(path: &Path, bytes: &[u8]) -> Result<Decoded, ReportError> {
    if bytes.is_empty() {
        return Err(ReportError::Empty {
            path: path.to_owned(),
        });
    }
    let mut d = Decoded::default();
    let mut event_names: HashMap<u64, String> = HashMap::new();
    let mut arg_names: HashMap<u64, String> = HashMap::new();
    let mut pos = 0usize;
    let mut packets = 0u64;
    let mut last_ts = 0u64;
    while pos < bytes.len() {
        let start = pos;
        let packet = (|| {
            if bytes[pos] != TRACE_PACKET_TAG {
                return Err(format!(
                    "byte {start}: {:#04x} is not a Trace.packet field",
                    bytes[pos]
                ));
            }
            pos += 1;
            let len = decode_varint(bytes, &mut pos).ok_or("bad packet length")? as usize;
            let end = pos
                .checked_add(len)
                .filter(|&e| e <= bytes.len())
                .ok_or("packet runs past the end")?;
            let p = TracePacket::decode(&bytes[pos..end]).map_err(|e| e.to_string())?;
            pos = end;
            Ok(p)
        })();
        let p = match packet {
            Ok(p) => p,
            Err(reason) if packets == 0 => {
                return Err(ReportError::NotPerfetto {
                    path: path.to_owned(),
                    reason,
                });
            }
            Err(_) => {
                // What a crash leaves: the valid prefix is reported, the tail is flagged.
                d.truncated = true;
                break;
            }
        };
        packets += 1;
        if p.sequence_flags.unwrap_or(0) & SEQ_INCREMENTAL_STATE_CLEARED != 0 {
            event_names.clear();
            arg_names.clear();
        }
        if let Some(i) = &p.interned_data {
            for n in &i.event_names {
                event_names.insert(n.iid.unwrap_or(0), n.name.clone().unwrap_or_default());
            }
            for n in &i.debug_annotation_names {
                arg_names.insert(n.iid.unwrap_or(0), n.name.clone().unwrap_or_default());
            }
        }
        if let Some(td) = &p.track_descriptor {
            let t = d.tracks.entry(td.uuid.unwrap_or(0)).or_default();
            t.name = td.name.clone().or_else(|| {
                td.thread
                    .as_ref()
                    .and_then(|th| th.thread_name.clone())
                    .or_else(|| td.process.as_ref().and_then(|pr| pr.process_name.clone()))
            });
            t.parent = td.parent_uuid;
        }
        let Some(ev) = &p.track_event else { continue };
        let ts = p.timestamp.unwrap_or(last_ts);
        last_ts = last_ts.max(ts);
        let name = ev
            .name
            .clone()
            .or_else(|| ev.name_iid.and_then(|i| event_names.get(&i).cloned()))
            .unwrap_or_default();
        let args: Args = ev
            .debug_annotations
            .iter()
            .filter_map(|a| {
                let k = a
                    .name
                    .clone()
                    .or_else(|| a.name_iid.and_then(|i| arg_names.get(&i).cloned()))?;
                let v = if let Some(v) = a.uint_value {
                    Val::U(v)
                } else if let Some(v) = a.int_value {
                    Val::I(v)
                } else if let Some(v) = a.double_value {
                    Val::F(v)
                } else if let Some(v) = a.bool_value {
                    Val::B(v)
                } else {
                    Val::S(a.string_value.clone()?)
                };
                Some((k, v))
            })
            .collect();
        let t = d.tracks.entry(ev.track_uuid.unwrap_or(0)).or_default();
        match ev.r#type {
            Some(TYPE_SLICE_BEGIN) => t.open.push((name, ts, args)),
            Some(TYPE_SLICE_END) => {
                if let Some((n, b, mut a)) = t.open.pop() {
                    a.extend(args);
                    t.slices.push(Slice {
                        name: n,
                        ts: b,
                        dur: ts.saturating_sub(b),
                        args: a,
                    });
                }
            }
            Some(TYPE_INSTANT) => t.instants.push(Instant { name, ts, args }),
            Some(TYPE_COUNTER) => {
                if let Some(v) = ev.double_counter_value.or(ev.counter_value.map(|v| v as f64)) {
                    t.counter.push(v);
                }
            }
            _ => {}
        }
    }
    // Slices a cut-short file leaves open end at the last timestamp seen.
    for t in d.tracks.values_mut() {
        while let Some((n, b, a)) = t.open.pop() {
            t.slices.push(Slice {
                name: n,
                ts: b,
                dur: last_ts.saturating_sub(b),
                args: a,
            });
        }
    }
    let ours = d.tracks.values().any(|t| {
        let n = t.name.as_deref().unwrap_or("");
        n == LLMPROF_TRACK
            || n == STEPS_TRACK
            || n.starts_with(DROPS_PREFIX)
            || n.starts_with("request ")
            || n == CUDA_TRACK
            || [KV_USAGE, WAITING, RUNNING, PREEMPTIONS].contains(&n)
            || t.slices
                .iter()
                .any(|s| s.name.starts_with("syscall ") || s.name.starts_with("model file "))
            || t.instants.iter().any(|i| i.name.starts_with("connect"))
    });
    if !ours {
        return Err(ReportError::NotLlmprof {
            path: path.to_owned(),
        });
    }
    Ok(d)
}

/// Nearest-rank percentile summary of a sample set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Largest sample.
    pub max: Option<f64>,
    /// Arithmetic mean.
    pub mean: Option<f64>,
}

impl Stats {
    /// Summarizes `v` (any order; NaNs are ignored).
    pub fn of(v: &[f64]) -> Self {
        let mut s: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let pct = |p: f64| -> Option<f64> {
            let rank = ((p / 100.0) * n as f64).ceil().max(1.0) as usize;
            s.get(rank.min(n).checked_sub(1)?).copied()
        };
        Self {
            count: n,
            p50: pct(50.0),
            p95: pct(95.0),
            p99: pct(99.0),
            max: s.last().copied(),
            mean: (n > 0).then(|| s.iter().sum::<f64>() / n as f64),
        }
    }
}

/// One request's TTFT decomposition.
#[derive(Clone, Debug, Default)]
pub struct RequestRow {
    /// Engine request id.
    pub req_id: u64,
    /// `x-request-id` header.
    pub x_request_id: String,
    /// Queue time before the first token, ms.
    pub queue_ms: Option<f64>,
    /// Prefill time before the first token, ms.
    pub prefill_ms: Option<f64>,
    /// Arrival → first token, ms.
    pub ttft_ms: Option<f64>,
    /// The first decode/mixed step after the first token, ms.
    pub first_decode_step_ms: Option<f64>,
    /// Output tokens.
    pub output_tokens: u64,
    /// `stop` / `length` / `abort` / `error` / `unfinished`.
    pub finish_reason: String,
    /// Times preempted.
    pub preemptions: u64,
    /// llmprof attached after the request arrived: queue, prefill and TTFT are unknown (`null`).
    pub attached_mid_request: bool,
}

/// A step kind's or batch bucket's duration statistics.
#[derive(Clone, Debug, Default)]
pub struct BucketRow {
    /// Label (`1`, `3-4`, `65+`).
    pub bucket: String,
    /// Smallest `num_seqs`.
    pub min_seqs: u64,
    /// Largest `num_seqs` (`u64::MAX` = open).
    pub max_seqs: u64,
    /// Step durations, ms.
    pub stats: Stats,
}

/// A counter track's summary.
#[derive(Clone, Debug, Default)]
pub struct CounterSummary {
    /// Samples.
    pub samples: usize,
    /// Largest value.
    pub max: Option<f64>,
    /// Mean of the samples.
    pub mean: Option<f64>,
    /// Last value.
    pub last: Option<f64>,
}

impl CounterSummary {
    fn of(v: &[f64]) -> Self {
        let s = Stats::of(v);
        Self {
            samples: s.count,
            max: s.max,
            mean: s.mean,
            last: v.last().copied(),
        }
    }
}

/// Time spent in one syscall (by name).
#[derive(Clone, Debug, Default)]
pub struct SyscallRow {
    /// Syscall name.
    pub name: String,
    /// Calls.
    pub count: u64,
    /// Total time, ms.
    pub total_ms: f64,
    /// Slowest call, ms (slices only).
    pub max_ms: Option<f64>,
}

/// Reads of one model file.
#[derive(Clone, Debug, Default)]
pub struct ModelFileRow {
    /// Path.
    pub path: String,
    /// read/pread64/readv calls.
    pub reads: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Time in those calls, ms.
    pub read_ms: f64,
    /// bytes / read time, MB/s (10^6 bytes).
    pub mb_per_s: Option<f64>,
    /// Opens.
    pub opens: u64,
    /// mmaps.
    pub mmaps: u64,
}

/// Connects to one destination.
#[derive(Clone, Debug, Default)]
pub struct EgressRow {
    /// Address.
    pub address: String,
    /// Port.
    pub port: u64,
    /// Attempts.
    pub connects: u64,
    /// Attempts that returned an error.
    pub failed: u64,
    /// Inside the allowed CIDRs.
    pub allowed: bool,
}

/// One probe's counters.
#[derive(Clone, Debug, Default)]
pub struct ProbeRow {
    /// Probe name (`llmprof_abi::PROBE_NAMES`).
    pub probe: String,
    /// Hits (`None` from drop counters).
    pub hits: Option<u64>,
    /// Records emitted (`None` from drop counters).
    pub emitted: Option<u64>,
    /// Records dropped.
    pub dropped: u64,
}

/// One NVML counter track of a GPU, summarized.
#[derive(Clone, Debug, Default)]
pub struct GpuCounterRow {
    /// Track name after `GPU N ` (`utilization`, `memory used`, ...).
    pub metric: String,
    /// Its unit (`%`, `MiB`, `W`, `MHz`, `°C`, `MB/s`).
    pub unit: String,
    /// The samples.
    pub summary: CounterSummary,
}

/// One GPU's counters.
#[derive(Clone, Debug, Default)]
pub struct GpuRow {
    /// NVML index.
    pub index: u64,
    /// Name and UUID as the group track shows them (empty when the group track is missing).
    pub name: String,
    /// Counter tracks, in the sink's order.
    pub counters: Vec<GpuCounterRow>,
    /// The traced processes' device memory on this GPU, MiB: `(pid, samples)`.
    pub process_memory: Vec<(u64, CounterSummary)>,
}

/// CUDA driver host time of one function.
#[derive(Clone, Debug, Default)]
pub struct CudaFnRow {
    /// Function name without its variant suffix (`cuStreamSynchronize`, `cuLaunchKernel`).
    pub function: String,
    /// Calls: individual slices plus the calls counted inside batches.
    pub calls: u64,
    /// Host time of all of them, ms.
    pub total_ms: f64,
    /// Durations of the individual slices, ms.
    pub individual: Stats,
}

/// The summary's `cuda_calls`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CudaCallsSummary {
    /// Calls seen.
    pub calls: u64,
    /// Calls shown one by one.
    pub individual: u64,
    /// Batch slices.
    pub batches: u64,
    /// Calls inside batches.
    pub batched: u64,
    /// Calls batched because their thread was over the individual-slice budget.
    pub over_budget: u64,
}

/// The GPU layer of the trace.
#[derive(Clone, Debug, Default)]
pub struct GpuSection {
    /// Per GPU, by index.
    pub gpus: Vec<GpuRow>,
    /// CUDA driver host time by function, by total time descending.
    pub cuda_functions: Vec<CudaFnRow>,
    /// All CUDA driver host time, ms.
    pub cuda_host_total_ms: f64,
    /// `cu*Synchronize` slices: where the host waited for the GPU.
    pub synchronize_calls: u64,
    /// Their total, ms.
    pub synchronize_ms: f64,
    /// Kernel/graph launches per engine step (batches with a `step_id`).
    pub launches_per_step: Stats,
    /// The summary's `cuda_calls`.
    pub summary: Option<CudaCallsSummary>,
    /// The `cuda` probe's counters.
    pub probe: Option<ProbeRow>,
    /// The GPU layer's markers, in time order.
    pub markers: Vec<String>,
}

/// Everything `llmprof report` prints.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The trace file.
    pub trace: String,
    /// The file ended mid-packet.
    pub truncated: bool,
    /// The `llmprof summary` packet is present.
    pub has_summary: bool,
    /// Why the session ended.
    pub end_reason: Option<String>,
    /// Per request, in request id order.
    pub requests: Vec<RequestRow>,
    /// Inter-token latencies, ms.
    pub itl_ms: Vec<f64>,
    /// Step durations by kind, ms.
    pub steps_by_kind: BTreeMap<String, Stats>,
    /// Step durations by batch-size bucket (non-empty buckets).
    pub steps_by_batch: Vec<BucketRow>,
    /// Counter summaries by JSON key.
    pub counters: BTreeMap<&'static str, CounterSummary>,
    /// Last `preemptions` counter value.
    pub preemptions_total: Option<f64>,
    /// Slow-syscall slices by name.
    pub slow_syscalls: Vec<SyscallRow>,
    /// The summary's kernel aggregates by name.
    pub syscall_aggregates: Vec<SyscallRow>,
    /// Model files.
    pub model_files: Vec<ModelFileRow>,
    /// Egress destinations.
    pub egress: Vec<EgressRow>,
    /// Drops: total, user, decode errors.
    pub total_dropped: u64,
    /// Drops in user space.
    pub user_drops: u64,
    /// Undecodable records.
    pub decode_errors: u64,
    /// `summary` or `drop_counters`.
    pub drops_source: &'static str,
    /// Per probe.
    pub probes: Vec<ProbeRow>,
    /// llmprof's self-accounting (None: a trace without it).
    pub overhead: Option<OverheadReport>,
    /// The GPU layer (None: a trace without any of it).
    pub gpu: Option<GpuSection>,
}

/// One step the overhead budget took.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DegradationRow {
    /// Seconds from the first event of the trace.
    pub at_s: f64,
    /// Level entered.
    pub level: u64,
    /// Step name (`llmprof::budget::LEVELS`).
    pub step: String,
    /// What changed.
    pub change: String,
    /// The estimate that exceeded the budget, %.
    pub est_overhead_pct: Option<f64>,
    /// Syscalls the kernel aggregates had counted then.
    pub syscalls_counted: Option<u64>,
}

/// llmprof's own cost as the trace records it (summary args, budget instants, size marker).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OverheadReport {
    /// Estimated CPU added to the target, ms.
    pub est_target_cpu_ms: Option<f64>,
    /// The same as a % of the target's own CPU time.
    pub est_target_pct: Option<f64>,
    /// The target's CPU time during the session, ms.
    pub target_cpu_ms: Option<f64>,
    /// Estimated CPU added per probe, ms.
    pub by_probe_ms: Vec<(String, f64)>,
    /// llmprof's CPU, ms and % of one core.
    pub llmprof_cpu_ms: Option<f64>,
    /// See [`OverheadReport::llmprof_cpu_ms`].
    pub llmprof_cpu_pct: Option<f64>,
    /// llmprof's peak RSS, MiB.
    pub llmprof_max_rss_mib: Option<f64>,
    /// Calibrated cost per hit, ns: syscall, engine probe, engine probe sampled out.
    pub cost_ns_syscall: Option<f64>,
    /// See [`OverheadReport::cost_ns_syscall`].
    pub cost_ns_engine_probe: Option<f64>,
    /// See [`OverheadReport::cost_ns_syscall`].
    pub cost_ns_engine_probe_sampled_out: Option<f64>,
    /// See [`OverheadReport::cost_ns_syscall`]: a CUDA driver call (entry + return probe).
    pub cost_ns_cuda_call: Option<f64>,
    /// How the engine probe is entered (optimized call or int3).
    pub probe_entry: Option<String>,
    /// `--overhead-budget`, %.
    pub budget_pct: Option<f64>,
    /// The budget's steps in order.
    pub degradations: Vec<DegradationRow>,
    /// `--max-trace-size`, bytes.
    pub size_limit_bytes: Option<u64>,
    /// The size limit ended the trace.
    pub size_limit_reached: bool,
    /// Events not written because of it.
    pub events_not_written: Option<u64>,
}

/// Reads and summarizes the trace at `path`.
pub fn load(path: &Path) -> Result<Report, ReportError> {
    let bytes = std::fs::read(path).map_err(|source| ReportError::Io {
        path: path.to_owned(),
        source,
    })?;
    from_bytes(path, &bytes)
}

/// Summarizes trace bytes (`path` only names the file in errors and output).
pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Report, ReportError> {
    let d = decode(path, bytes)?;
    Ok(analyze(path, &d))
}

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

fn analyze(path: &Path, d: &Decoded) -> Report {
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

// ---- output ----

/// A JSON value with ordered object keys (the `--json` layout is written field by field, so it is stable).
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Int(u64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(&'static str, Json)>),
}

impl Json {
    /// The serde_json value (object keys keep their order: serde_json's `preserve_order`); numbers rounded to
    /// 1e-6, non-finite numbers as null.
    fn into_value(self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Self::Null => Value::Null,
            Self::Bool(b) => Value::Bool(b),
            Self::Num(v) => {
                serde_json::Number::from_f64((v * 1e6).round() / 1e6).map_or(Value::Null, Value::Number)
            }
            Self::Int(v) => Value::from(v),
            Self::Str(s) => Value::String(s),
            Self::Arr(v) => Value::Array(v.into_iter().map(Self::into_value).collect()),
            Self::Obj(v) => Value::Object(
                v.into_iter()
                    .map(|(k, x)| (k.to_string(), x.into_value()))
                    .collect(),
            ),
        }
    }
}

fn opt(v: Option<f64>) -> Json {
    v.map_or(Json::Null, Json::Num)
}

fn stats_json(s: &Stats) -> Json {
    Json::Obj(vec![
        ("count", Json::Int(s.count as u64)),
        ("p50", opt(s.p50)),
        ("p95", opt(s.p95)),
        ("p99", opt(s.p99)),
        ("max", opt(s.max)),
        ("mean", opt(s.mean)),
    ])
}

fn syscalls_json(v: &[SyscallRow], with_max: bool) -> Json {
    Json::Arr(
        v.iter()
            .map(|s| {
                let mut o = vec![
                    ("name", Json::Str(s.name.clone())),
                    ("count", Json::Int(s.count)),
                    ("total_ms", Json::Num(s.total_ms)),
                ];
                if with_max {
                    o.push(("max_ms", opt(s.max_ms)));
                }
                Json::Obj(o)
            })
            .collect(),
    )
}

impl Report {
    fn col(&self, f: impl Fn(&RequestRow) -> Option<f64>) -> Stats {
        Stats::of(&self.requests.iter().filter_map(f).collect::<Vec<_>>())
    }

    /// TTFT over requests that got a first token.
    pub fn ttft(&self) -> Stats {
        self.col(|q| q.ttft_ms)
    }

    /// The `--json` document (layout in the module docs).
    pub fn to_json(&self) -> String {
        let finished = self
            .requests
            .iter()
            .filter(|q| q.finish_reason != "unfinished")
            .count();
        let requests = Json::Obj(vec![
            ("count", Json::Int(self.requests.len() as u64)),
            ("finished", Json::Int(finished as u64)),
            ("unfinished", Json::Int((self.requests.len() - finished) as u64)),
            ("ttft_ms", stats_json(&self.ttft())),
            ("queue_ms", stats_json(&self.col(|q| q.queue_ms))),
            ("prefill_ms", stats_json(&self.col(|q| q.prefill_ms))),
            (
                "first_decode_step_ms",
                stats_json(&self.col(|q| q.first_decode_step_ms)),
            ),
            ("itl_ms", stats_json(&Stats::of(&self.itl_ms))),
            (
                "per_request",
                Json::Arr(
                    self.requests
                        .iter()
                        .map(|q| {
                            Json::Obj(vec![
                                ("req_id", Json::Int(q.req_id)),
                                ("x_request_id", Json::Str(q.x_request_id.clone())),
                                ("queue_ms", opt(q.queue_ms)),
                                ("prefill_ms", opt(q.prefill_ms)),
                                ("ttft_ms", opt(q.ttft_ms)),
                                ("first_decode_step_ms", opt(q.first_decode_step_ms)),
                                ("output_tokens", Json::Int(q.output_tokens)),
                                ("finish_reason", Json::Str(q.finish_reason.clone())),
                                ("preemptions", Json::Int(q.preemptions)),
                                ("attached_mid_request", Json::Bool(q.attached_mid_request)),
                            ])
                        })
                        .collect(),
                ),
            ),
        ]);
        let steps = Json::Obj(vec![
            (
                "count",
                Json::Int(self.steps_by_kind.values().map(|s| s.count as u64).sum()),
            ),
            (
                "by_kind",
                Json::Obj(
                    ["prefill", "decode", "mixed"]
                        .into_iter()
                        .map(|k| {
                            (
                                k,
                                stats_json(&self.steps_by_kind.get(k).cloned().unwrap_or_default()),
                            )
                        })
                        .collect(),
                ),
            ),
            (
                "by_batch_size",
                Json::Arr(
                    self.steps_by_batch
                        .iter()
                        .map(|b| {
                            Json::Obj(vec![
                                ("bucket", Json::Str(b.bucket.clone())),
                                ("min_seqs", Json::Int(b.min_seqs)),
                                (
                                    "max_seqs",
                                    if b.max_seqs == u64::MAX {
                                        Json::Null
                                    } else {
                                        Json::Int(b.max_seqs)
                                    },
                                ),
                                ("stats", stats_json(&b.stats)),
                            ])
                        })
                        .collect(),
                ),
            ),
        ]);
        let mut counters: Vec<(&'static str, Json)> = self
            .counters
            .iter()
            .map(|(k, c)| {
                (
                    *k,
                    Json::Obj(vec![
                        ("samples", Json::Int(c.samples as u64)),
                        ("max", opt(c.max)),
                        ("mean", opt(c.mean)),
                        ("last", opt(c.last)),
                    ]),
                )
            })
            .collect();
        counters.push(("preemptions_total", opt(self.preemptions_total)));
        let doc = Json::Obj(vec![
            ("format", Json::Str(JSON_FORMAT.to_owned())),
            ("trace", Json::Str(self.trace.clone())),
            ("truncated", Json::Bool(self.truncated)),
            ("has_summary", Json::Bool(self.has_summary)),
            (
                "end_reason",
                self.end_reason.clone().map_or(Json::Null, Json::Str),
            ),
            ("requests", requests),
            ("steps", steps),
            ("counters", Json::Obj(counters)),
            (
                "syscalls",
                Json::Obj(vec![
                    ("slow_syscall_slices", syscalls_json(&self.slow_syscalls, true)),
                    (
                        "kernel_aggregates",
                        syscalls_json(&self.syscall_aggregates, false),
                    ),
                ]),
            ),
            (
                "model_files",
                Json::Arr(
                    self.model_files
                        .iter()
                        .map(|f| {
                            Json::Obj(vec![
                                ("path", Json::Str(f.path.clone())),
                                ("reads", Json::Int(f.reads)),
                                ("bytes", Json::Int(f.bytes)),
                                ("read_ms", Json::Num(f.read_ms)),
                                ("mb_per_s", opt(f.mb_per_s)),
                                ("opens", Json::Int(f.opens)),
                                ("mmaps", Json::Int(f.mmaps)),
                            ])
                        })
                        .collect(),
                ),
            ),
            (
                "egress",
                Json::Arr(
                    self.egress
                        .iter()
                        .map(|e| {
                            Json::Obj(vec![
                                ("address", Json::Str(e.address.clone())),
                                ("port", Json::Int(e.port)),
                                ("connects", Json::Int(e.connects)),
                                ("failed", Json::Int(e.failed)),
                                ("allowed", Json::Bool(e.allowed)),
                                (
                                    "verdict",
                                    Json::Str(if e.allowed { "allowed" } else { "flagged" }.to_owned()),
                                ),
                            ])
                        })
                        .collect(),
                ),
            ),
            (
                "drops",
                Json::Obj(vec![
                    ("total_dropped", Json::Int(self.total_dropped)),
                    ("user_drops", Json::Int(self.user_drops)),
                    ("decode_errors", Json::Int(self.decode_errors)),
                    ("source", Json::Str(self.drops_source.to_owned())),
                    (
                        "probes",
                        Json::Arr(
                            self.probes
                                .iter()
                                .map(|p| {
                                    Json::Obj(vec![
                                        ("probe", Json::Str(p.probe.clone())),
                                        ("hits", p.hits.map_or(Json::Null, Json::Int)),
                                        ("emitted", p.emitted.map_or(Json::Null, Json::Int)),
                                        ("dropped", Json::Int(p.dropped)),
                                    ])
                                })
                                .collect(),
                        ),
                    ),
                ]),
            ),
            (
                "overhead",
                self.overhead.as_ref().map_or(Json::Null, overhead_json),
            ),
            ("gpu", self.gpu.as_ref().map_or(Json::Null, gpu_json)),
        ]);
        let mut out = serde_json::to_string_pretty(&doc.into_value()).unwrap_or_default();
        out.push('\n');
        out
    }

    /// The terminal report.
    pub fn to_text(&self) -> String {
        let mut o = self.to_text_main();
        gpu_text(&mut o, self.gpu.as_ref());
        if let Some(v) = &self.overhead {
            overhead_text(&mut o, v);
        }
        o
    }

    fn to_text_main(&self) -> String {
        let mut o = String::new();
        let f = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.2}"));
        let row = |o: &mut String, label: &str, s: &Stats| {
            let _ = writeln!(
                o,
                "  {label:<22} {:>6} {:>10} {:>10} {:>10} {:>10}",
                s.count,
                f(s.p50),
                f(s.p95),
                f(s.p99),
                f(s.max)
            );
        };
        let header = |o: &mut String, title: &str| {
            let _ = writeln!(
                o,
                "\n{title}\n  {:<22} {:>6} {:>10} {:>10} {:>10} {:>10}",
                "", "n", "p50 ms", "p95 ms", "p99 ms", "max ms"
            );
        };
        let _ = writeln!(o, "llmprof report: {}", self.trace);
        let _ = writeln!(
            o,
            "  session end: {}{}",
            self.end_reason
                .as_deref()
                .unwrap_or("unknown (no summary: the session was cut short)"),
            if self.truncated {
                "; file truncated mid-packet (valid prefix reported)"
            } else {
                ""
            }
        );
        let finished = self
            .requests
            .iter()
            .filter(|q| q.finish_reason != "unfinished")
            .count();
        let _ = writeln!(
            o,
            "\nRequests: {} ({} finished, {} still running at the end)",
            self.requests.len(),
            finished,
            self.requests.len() - finished
        );
        header(&mut o, "TTFT decomposition (over requests)");
        row(&mut o, "queue", &self.col(|q| q.queue_ms));
        row(&mut o, "prefill", &self.col(|q| q.prefill_ms));
        row(&mut o, "TTFT (queue+prefill)", &self.ttft());
        row(&mut o, "first decode step", &self.col(|q| q.first_decode_step_ms));
        row(&mut o, "inter-token latency", &Stats::of(&self.itl_ms));
        header(&mut o, "Engine steps (host duration)");
        for (k, s) in &self.steps_by_kind {
            row(&mut o, k, s);
        }
        for b in &self.steps_by_batch {
            row(&mut o, &format!("batch {}", b.bucket), &b.stats);
        }
        let _ = writeln!(o, "\nKV cache and queue (engine /metrics samples)");
        for (k, c) in &self.counters {
            let _ = writeln!(
                o,
                "  {k:<22} samples {:>5}  max {:>8}  mean {:>8}",
                c.samples,
                f(c.max),
                f(c.mean)
            );
        }
        if let Some(p) = self.preemptions_total {
            let _ = writeln!(o, "  preemptions total      {p:.0}");
        }
        let _ = writeln!(o, "\nTop syscalls by total time");
        let _ = writeln!(o, "  slower than --slow-syscall (individual slices):");
        if self.slow_syscalls.is_empty() {
            let _ = writeln!(o, "    none");
        }
        for s in self.slow_syscalls.iter().take(TEXT_ROWS) {
            let _ = writeln!(
                o,
                "    {:<20} {:>8} calls {:>12.3} ms total, max {} ms",
                s.name,
                s.count,
                s.total_ms,
                f(s.max_ms)
            );
        }
        let _ = writeln!(
            o,
            "  all calls (kernel aggregates: the summary's top thread/syscall pairs):"
        );
        if self.syscall_aggregates.is_empty() {
            let _ = writeln!(o, "    none");
        }
        for s in self.syscall_aggregates.iter().take(TEXT_ROWS) {
            let _ = writeln!(
                o,
                "    {:<20} {:>8} calls {:>12.3} ms total",
                s.name, s.count, s.total_ms
            );
        }
        let _ = writeln!(o, "\nModel-file reads");
        if self.model_files.is_empty() {
            let _ = writeln!(o, "  none");
        }
        for m in &self.model_files {
            let _ = writeln!(
                o,
                "  {}: {} reads, {} bytes in {:.3} ms ({} MB/s), {} opens, {} mmaps",
                m.path,
                m.reads,
                m.bytes,
                m.read_ms,
                f(m.mb_per_s),
                m.opens,
                m.mmaps
            );
        }
        let _ = writeln!(o, "\nEgress");
        if self.egress.is_empty() {
            let _ = writeln!(o, "  none");
        }
        for e in &self.egress {
            let _ = writeln!(
                o,
                "  {:<8} {}:{}  {} connects ({} failed)",
                if e.allowed { "allowed" } else { "FLAGGED" },
                e.address,
                e.port,
                e.connects,
                e.failed
            );
        }
        let _ = writeln!(
            o,
            "\nDropped: {} total (user space {}), decode errors {} [from {}]",
            self.total_dropped,
            self.user_drops,
            self.decode_errors,
            self.drops_source.replace('_', " ")
        );
        for p in self.probes.iter().filter(|p| {
            p.dropped > 0
                || p.hits.unwrap_or(0) > 0
                || (p.probe == "cuda" && self.gpu.as_ref().is_some_and(|g| g.probe.is_some()))
        }) {
            let _ = writeln!(
                o,
                "  {:<16} hits {:>10}  emitted {:>10}  dropped {:>8}",
                p.probe,
                p.hits.map_or("-".to_owned(), |v| v.to_string()),
                p.emitted.map_or("-".to_owned(), |v| v.to_string()),
                p.dropped
            );
        }
        o
    }
}

fn counter_json(c: &CounterSummary) -> Vec<(&'static str, Json)> {
    vec![
        ("samples", Json::Int(c.samples as u64)),
        ("mean", opt(c.mean)),
        ("max", opt(c.max)),
        ("last", opt(c.last)),
    ]
}

fn gpu_json(g: &GpuSection) -> Json {
    let gpus = g
        .gpus
        .iter()
        .map(|row| {
            Json::Obj(vec![
                ("index", Json::Int(row.index)),
                ("name", Json::Str(row.name.clone())),
                (
                    "counters",
                    Json::Arr(
                        row.counters
                            .iter()
                            .map(|c| {
                                let mut o = vec![
                                    ("metric", Json::Str(c.metric.clone())),
                                    ("unit", Json::Str(c.unit.clone())),
                                ];
                                o.extend(counter_json(&c.summary));
                                Json::Obj(o)
                            })
                            .collect(),
                    ),
                ),
                (
                    "process_memory_mib",
                    Json::Arr(
                        row.process_memory
                            .iter()
                            .map(|(pid, c)| {
                                let mut o = vec![("pid", Json::Int(*pid))];
                                o.extend(counter_json(c));
                                Json::Obj(o)
                            })
                            .collect(),
                    ),
                ),
            ])
        })
        .collect();
    let functions = g
        .cuda_functions
        .iter()
        .map(|f| {
            Json::Obj(vec![
                ("function", Json::Str(f.function.clone())),
                ("calls", Json::Int(f.calls)),
                ("total_ms", Json::Num(f.total_ms)),
                ("individual", stats_json(&f.individual)),
            ])
        })
        .collect();
    let summary = g.summary.as_ref().map_or(Json::Null, |s| {
        Json::Obj(vec![
            ("calls", Json::Int(s.calls)),
            ("individual", Json::Int(s.individual)),
            ("batches", Json::Int(s.batches)),
            ("batched", Json::Int(s.batched)),
            ("over_budget", Json::Int(s.over_budget)),
        ])
    });
    let probe = g.probe.as_ref().map_or(Json::Null, |p| {
        Json::Obj(vec![
            ("hits", p.hits.map_or(Json::Null, Json::Int)),
            ("emitted", p.emitted.map_or(Json::Null, Json::Int)),
            ("dropped", Json::Int(p.dropped)),
        ])
    });
    Json::Obj(vec![
        ("gpus", Json::Arr(gpus)),
        (
            "cuda",
            Json::Obj(vec![
                ("functions", Json::Arr(functions)),
                ("host_total_ms", Json::Num(g.cuda_host_total_ms)),
                ("synchronize_calls", Json::Int(g.synchronize_calls)),
                ("synchronize_ms", Json::Num(g.synchronize_ms)),
                ("launches_per_step", stats_json(&g.launches_per_step)),
                ("summary", summary),
                ("probe", probe),
            ]),
        ),
        (
            "markers",
            Json::Arr(g.markers.iter().cloned().map(Json::Str).collect()),
        ),
    ])
}

fn gpu_text(out: &mut String, g: Option<&GpuSection>) {
    let f = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.2}"));
    // CUDA calls are µs-scale: three decimals of a millisecond.
    let f3 = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.3}"));
    let Some(g) = g else {
        let _ = writeln!(
            out,
            "\nGPU: no GPU data in this trace (no NVML counters, CUDA driver calls or GPU markers)"
        );
        return;
    };
    let _ = writeln!(out, "\nGPU");
    if g.gpus.is_empty() {
        let _ = writeln!(out, "  no NVML counters");
    }
    for row in &g.gpus {
        let _ = writeln!(out, "  GPU {}: {}", row.index, row.name);
        for c in &row.counters {
            let _ = writeln!(
                out,
                "    {:<26} samples {:>6}  mean {:>10}  max {:>10} {}",
                c.metric,
                c.summary.samples,
                f(c.summary.mean),
                f(c.summary.max),
                c.unit
            );
        }
        for (pid, c) in &row.process_memory {
            let _ = writeln!(
                out,
                "    {:<26} samples {:>6}  mean {:>10}  max {:>10} MiB",
                format!("memory of pid {pid}"),
                c.samples,
                f(c.mean),
                f(c.max)
            );
        }
    }
    if g.cuda_functions.is_empty() {
        let _ = writeln!(out, "  CUDA driver calls: none");
    } else {
        let _ = writeln!(
            out,
            "  CUDA driver calls, host time: {:.3} ms; the host waited for the GPU in {} synchronize calls, \
             {:.3} ms",
            g.cuda_host_total_ms, g.synchronize_calls, g.synchronize_ms
        );
        let _ = writeln!(
            out,
            "    {:<24} {:>9} {:>12} {:>7} {:>10} {:>10} {:>10}",
            "function", "calls", "total ms", "slices", "p50 ms", "p99 ms", "max ms"
        );
        for c in g.cuda_functions.iter().take(TEXT_ROWS) {
            let _ = writeln!(
                out,
                "    {:<24} {:>9} {:>12.3} {:>7} {:>10} {:>10} {:>10}",
                c.function,
                c.calls,
                c.total_ms,
                c.individual.count,
                f3(c.individual.p50),
                f3(c.individual.p99),
                f3(c.individual.max)
            );
        }
    }
    let l = &g.launches_per_step;
    if l.count > 0 {
        let _ = writeln!(
            out,
            "  launches per engine step: {} steps, p50 {:.0}, max {:.0}",
            l.count,
            l.p50.unwrap_or(0.0),
            l.max.unwrap_or(0.0)
        );
    } else if !g.cuda_functions.is_empty() {
        let _ = writeln!(
            out,
            "  launches per engine step: - (no engine step ids: batches are per 10 ms window)"
        );
    }
    if let Some(s) = &g.summary {
        let _ = writeln!(
            out,
            "  calls {}: {} individual, {} in {} batches, {} batched over the individual-slice budget",
            s.calls, s.individual, s.batched, s.batches, s.over_budget
        );
    }
    for m in &g.markers {
        let _ = writeln!(out, "  marker: {m}");
    }
}

fn overhead_json(o: &OverheadReport) -> Json {
    let int = |v: Option<u64>| v.map_or(Json::Null, Json::Int);
    Json::Obj(vec![
        ("est_target_cpu_ms", opt(o.est_target_cpu_ms)),
        ("est_target_pct", opt(o.est_target_pct)),
        ("target_cpu_ms", opt(o.target_cpu_ms)),
        (
            "by_probe_ms",
            Json::Obj(
                o.by_probe_ms
                    .iter()
                    .map(|(k, v)| {
                        let name = llmprof_abi::PROBE_NAMES
                            .iter()
                            .find(|n| **n == k.as_str())
                            .copied()
                            .unwrap_or("other");
                        (name, Json::Num(*v))
                    })
                    .collect(),
            ),
        ),
        ("llmprof_cpu_ms", opt(o.llmprof_cpu_ms)),
        ("llmprof_cpu_pct", opt(o.llmprof_cpu_pct)),
        ("llmprof_max_rss_mib", opt(o.llmprof_max_rss_mib)),
        (
            "cost_ns",
            Json::Obj(vec![
                ("syscall", opt(o.cost_ns_syscall)),
                ("engine_probe", opt(o.cost_ns_engine_probe)),
                (
                    "engine_probe_sampled_out",
                    opt(o.cost_ns_engine_probe_sampled_out),
                ),
                ("cuda_call", opt(o.cost_ns_cuda_call)),
            ]),
        ),
        ("probe_entry", o.probe_entry.clone().map_or(Json::Null, Json::Str)),
        ("budget_pct", opt(o.budget_pct)),
        (
            "degradations",
            Json::Arr(
                o.degradations
                    .iter()
                    .map(|d| {
                        Json::Obj(vec![
                            ("at_s", Json::Num(d.at_s)),
                            ("level", Json::Int(d.level)),
                            ("step", Json::Str(d.step.clone())),
                            ("change", Json::Str(d.change.clone())),
                            ("est_overhead_pct", opt(d.est_overhead_pct)),
                            ("syscalls_counted", int(d.syscalls_counted)),
                        ])
                    })
                    .collect(),
            ),
        ),
        ("size_limit_bytes", int(o.size_limit_bytes)),
        ("size_limit_reached", Json::Bool(o.size_limit_reached)),
        ("events_not_written", int(o.events_not_written)),
    ])
}

fn overhead_text(out: &mut String, o: &OverheadReport) {
    let f = |v: Option<f64>, d: usize| v.map_or("-".to_owned(), |x| format!("{x:.d$}"));
    let _ = writeln!(out, "\nllmprof overhead (self-accounting):");
    let _ = writeln!(
        out,
        "  est. CPU added to the target {} ms = {} % of its own CPU ({} ms); cost per hit: syscall {} ns, engine probe {} ns, CUDA call {} ns ({})",
        f(o.est_target_cpu_ms, 1),
        f(o.est_target_pct, 2),
        f(o.target_cpu_ms, 1),
        f(o.cost_ns_syscall, 0),
        f(o.cost_ns_engine_probe, 0),
        f(o.cost_ns_cuda_call, 0),
        o.probe_entry.as_deref().unwrap_or("entry not measured")
    );
    if !o.by_probe_ms.is_empty() {
        let parts: Vec<String> = o
            .by_probe_ms
            .iter()
            .map(|(k, v)| format!("{k} {v:.1} ms"))
            .collect();
        let _ = writeln!(out, "  by probe: {}", parts.join(", "));
    }
    let _ = writeln!(
        out,
        "  llmprof itself: {} ms CPU ({} % of one core), peak RSS {} MiB",
        f(o.llmprof_cpu_ms, 1),
        f(o.llmprof_cpu_pct, 2),
        f(o.llmprof_max_rss_mib, 1)
    );
    if let Some(b) = o.budget_pct {
        let _ = writeln!(
            out,
            "  overhead budget {b} %: {}",
            if o.degradations.is_empty() {
                "met, nothing degraded"
            } else {
                "exceeded; degraded:"
            }
        );
    }
    for d in &o.degradations {
        let _ = writeln!(
            out,
            "    +{:.2} s  level {} {:<18} (est. {} %; {} syscalls counted): {}",
            d.at_s,
            d.level,
            d.step,
            f(d.est_overhead_pct, 1),
            d.syscalls_counted.map_or("-".to_owned(), |v| v.to_string()),
            d.change
        );
    }
    if o.size_limit_reached || o.size_limit_bytes.is_some() {
        let _ = writeln!(
            out,
            "  trace size limit {}: {}",
            o.size_limit_bytes
                .map_or("-".to_owned(), |b| format!("{b} bytes")),
            if o.size_limit_reached {
                format!(
                    "reached, the trace ended early ({} events not written)",
                    o.events_not_written.map_or("?".to_owned(), |v| v.to_string())
                )
            } else {
                "not reached".to_owned()
            }
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Stats::of(&v);
        assert_eq!(
            (s.p50, s.p95, s.p99, s.max),
            (Some(50.0), Some(95.0), Some(99.0), Some(100.0))
        );
        assert_eq!(Stats::of(&[]).p50, None);
        assert_eq!(Stats::of(&[7.0]).p99, Some(7.0));
    }

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

    #[test]
    fn garbage_is_not_a_trace() {
        let p = Path::new("x");
        assert!(matches!(from_bytes(p, &[]), Err(ReportError::Empty { .. })));
        assert!(matches!(
            from_bytes(p, b"hello world"),
            Err(ReportError::NotPerfetto { .. })
        ));
        // A valid Trace with one empty packet: Perfetto, but not llmprof.
        let mut b = vec![TRACE_PACKET_TAG];
        TracePacket::default().encode_length_delimited(&mut b).unwrap();
        assert!(matches!(from_bytes(p, &b), Err(ReportError::NotLlmprof { .. })));
    }
}
