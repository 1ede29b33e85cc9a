//! The global `llmprof` track and the end of the session: markers, annotations, the target's exit, the overhead
//! budget's steps; at [`TraceSink::finish`] what is still open is closed, the per-probe drop counters and the
//! `llmprof summary` instant are written.

use std::io::{self, Write};

use llmprof_abi::PROBE_NAMES;

use super::{SUMMARY_TOP_SYSCALLS, TraceSink};
use crate::event::{Degradation, Event, OverheadSummary, SessionStats};
use crate::names::cupti::{arg as gpu_arg, value as gpu_value};
use crate::names::syscalls;
use crate::names::{arg, marker, track, value};
use crate::perfetto::writer::{Arg, arg_f, arg_i, arg_s, arg_u};

impl<W: Write> TraceSink<W> {
    /// An instant on the llmprof track.
    pub fn marker(&mut self, ts: u64, text: &str) -> io::Result<()> {
        let t = self.llmprof_track()?;
        self.instant(ts, t, text, vec![arg_s(arg::MARKER, text)], Vec::new())
    }

    /// An instant on the llmprof track with string args (session metadata, e.g. the alert behind a trace).
    pub fn annotation(&mut self, ts: u64, name: &str, args: &[(&'static str, String)]) -> io::Result<()> {
        let t = self.llmprof_track()?;
        let args = args.iter().map(|(k, v)| arg_s(k, v.clone())).collect();
        self.instant(ts, t, name, args, Vec::new())
    }

    /// The traced process exited.
    pub(super) fn process_exit(&mut self, ev: &Event, exit_code: i64) -> io::Result<()> {
        let t = self.llmprof_track()?;
        let args = vec![
            arg_s(arg::MARKER, marker::TARGET_EXITED),
            arg_u(arg::PID, ev.pid),
            arg_i(arg::EXIT_CODE, exit_code),
        ];
        self.instant(ev.ts_ns, t, marker::TARGET_EXITED, args, Vec::new())
    }

    /// A step of the overhead budget.
    pub(super) fn degraded(&mut self, ts: u64, d: &Degradation) -> io::Result<()> {
        let t = self.llmprof_track()?;
        let args = vec![
            arg_u(arg::LEVEL, d.level),
            arg_s(arg::STEP, d.name),
            arg_s(arg::CHANGE, d.change.clone()),
            arg_f(arg::EST_OVERHEAD_PCT, d.overhead_pct),
            arg_f(arg::BUDGET_PCT, d.budget_pct),
            arg_u(arg::SYSCALLS_COUNTED, d.syscalls_counted),
        ];
        self.instant(ts, t, &marker::degradation(d.name), args, Vec::new())
    }

    /// Closes what is still open (requests, ranges) at the last timestamp seen with `closed_by` = `reason`,
    /// writes the summary, flushes, and returns the sink.
    pub fn finish(mut self, stats: &SessionStats, end_ts: Option<u64>) -> io::Result<W> {
        let ts = end_ts.unwrap_or(self.last_ts).max(self.last_ts);
        let reason = if stats.end_reason.is_empty() {
            arg::END_OF_TRACE
        } else {
            stats.end_reason.as_str()
        };
        self.close_requests(ts, reason)?;
        self.name_all()?;
        self.flush_cuda()?;
        self.flush_sched()?;
        let ranges: Vec<_> = std::mem::take(&mut self.ranges).into_iter().collect();
        for ((pid, tid), stack) in ranges {
            let track = self.thread_track(pid, tid)?;
            for _ in stack {
                self.end(ts, track, vec![arg_s(arg::CLOSED_BY, reason)])?;
            }
        }
        // Per-probe drop counters: 0 at the start, the total at the end.
        let start = self.first_ts.unwrap_or(ts).min(ts);
        for (i, name) in PROBE_NAMES.iter().enumerate() {
            if *name == "reserved" {
                continue;
            }
            let t = self.global_track(1 + i as u64, track::drops(name), true)?;
            self.counter(start, t, 0.0)?;
            self.counter(ts, t, stats.probes[i].dropped as f64)?;
        }
        let args = self.summary_args(stats, reason);
        let t = self.llmprof_track()?;
        self.instant(ts, t, marker::SUMMARY, args, Vec::new())?;
        self.w.finish()
    }

    /// The summary's args: drops, syscall aggregates, CUDA aggregation, events written, self-accounting.
    fn summary_args(&self, stats: &SessionStats, reason: &str) -> Vec<Arg> {
        let mut args = vec![
            arg_s(arg::END_REASON, reason),
            arg_u(arg::TOTAL_DROPPED, stats.total_dropped()),
            arg_u(arg::USER_DROPS, stats.user_drops),
            arg_u(arg::DECODE_ERRORS, stats.decode_errors),
        ];
        for (i, name) in PROBE_NAMES.iter().enumerate() {
            let c = stats.probes[i];
            args.push(arg_s(name, value::probe_counters(c.hits, c.emitted, c.dropped)));
        }
        let mut sys = stats.syscalls.clone();
        sys.sort_by_key(|a| std::cmp::Reverse(a.total_ns));
        let top: Vec<String> = sys
            .iter()
            .take(SUMMARY_TOP_SYSCALLS)
            .map(|a| value::top_syscall(&syscalls::name(a.nr), a.tid, a.count, a.total_ns as f64 / 1e6))
            .collect();
        args.push(arg_s(arg::TOP_SYSCALLS, top.join(value::ITEM_SEPARATOR)));
        let g = &stats.gpu;
        if g.chunks + g.bad_chunks > 0 {
            args.push(arg_s(gpu_arg::SUMMARY, gpu_value::gpu_activity(g)));
            args.push(arg_u(gpu_arg::LOST, g.lost()));
        }
        let c = self.cuda.stats();
        if c.calls > 0 {
            let v = value::cuda_calls(c.calls, c.individual, c.batches, c.batched_calls, c.over_budget);
            args.push(arg_s(arg::CUDA_CALLS, v));
        }
        let events: Vec<String> = self
            .counts
            .by_kind
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        args.push(arg_s(arg::EVENTS, events.join(" ")));
        if stats.offcpu_not_taken > 0 {
            args.push(arg_u(arg::OFFCPU_NOT_TAKEN, stats.offcpu_not_taken));
        }
        if let Some(o) = &stats.overhead {
            args.extend(overhead_args(o));
        }
        args
    }
}

/// The self-accounting part of the summary (documented in docs/perfetto-trace.md; read by `llmprof report`).
fn overhead_args(o: &OverheadSummary) -> Vec<Arg> {
    let mut args = vec![
        arg_f(arg::OVERHEAD_EST_TARGET_CPU_MS, o.est_added_ns / 1e6),
        arg_f(arg::LLMPROF_CPU_MS, o.llmprof_cpu_ns / 1e6),
        arg_u(arg::SYMBOLIZED_STACKS, o.symbolized_stacks),
        arg_f(arg::SYMBOLIZE_MS, o.symbolize_ns / 1e6),
        arg_f(
            arg::LLMPROF_CPU_PCT,
            o.llmprof_cpu_ns / (o.elapsed_ns.max(1) as f64) * 100.0,
        ),
        arg_f(
            arg::LLMPROF_MAX_RSS_MIB,
            o.llmprof_max_rss_bytes as f64 / (1u64 << 20) as f64,
        ),
        arg_f(
            arg::LLMPROF_MAX_PRIVATE_MIB,
            o.llmprof_max_private_bytes as f64 / (1u64 << 20) as f64,
        ),
    ];
    if let Some(t) = o.target_cpu_ns {
        args.push(arg_f(arg::TARGET_CPU_MS, t / 1e6));
    }
    if o.symbolize_addresses > 0 {
        args.push(arg_u(arg::SYMBOLIZE_ADDRESSES, o.symbolize_addresses));
        args.push(arg_u(arg::SYMBOLIZE_UNKNOWN, o.symbolize_unknown));
        args.push(arg_u(arg::SYMBOLIZE_UNMAPPED, o.symbolize_unmapped));
        args.push(arg_f(arg::SYMBOLIZE_RESOLVE_MS, o.symbolize_resolve_ns / 1e6));
    }
    if let Some(c) = o.contention_ns {
        args.push(arg_f(arg::LLMPROF_CPU_CHARGED_MS, c / 1e6));
        args.push(arg_u(arg::SHARED_CPUS, o.shared_cpus));
        if let Some(p) = o.shared_idle_pct {
            args.push(arg_f(arg::SHARED_IDLE_PCT, p));
        }
    }
    if let Some(c) = &o.cupti {
        args.push(arg_f(arg::OVERHEAD_EST_CUPTI_MS, c.added_ns / 1e6));
        args.push(arg_f(arg::CUPTI_THREAD_CPU_MS, c.thread_cpu_ns / 1e6));
        args.push(arg_u(arg::CUPTI_RECORDS, c.records));
        args.push(arg_f(arg::COST_NS_CUPTI_RECORD, c.per_record_ns));
    }
    if let Some(p) = o.est_overhead_pct {
        args.push(arg_f(arg::OVERHEAD_EST_TARGET_PCT, p));
    }
    if let Some(c) = &o.calibration {
        args.push(arg_f(arg::COST_NS_SYSCALL, c.syscall_ns));
        if let Some(p) = c.syscall_decoded_ns {
            args.push(arg_f(arg::COST_NS_SYSCALL_DECODED, p));
        }
        if let Some(p) = c.probe_ns {
            args.push(arg_f(arg::COST_NS_ENGINE_PROBE, p));
        }
        if let Some(p) = c.probe_sampled_out_ns {
            args.push(arg_f(arg::COST_NS_ENGINE_PROBE_SAMPLED_OUT, p));
        }
        if let Some(p) = c.cuda_call_ns {
            args.push(arg_f(arg::COST_NS_CUDA_CALL, p));
        }
        if let Some(p) = c.cuda_count_ns {
            args.push(arg_f(arg::COST_NS_CUDA_COUNTED, p));
        }
        if let Some(p) = c.sched_event_ns {
            args.push(arg_f(arg::COST_NS_SCHED_EVENT, p));
        }
        if let Some(p) = c.sample_ns {
            args.push(arg_f(arg::COST_NS_SAMPLE, p));
        }
        if let Some(p) = c.sample_live_ns {
            args.push(arg_f(arg::COST_NS_SAMPLE_LIVE, p));
        }
        if let Some(p) = c.offcpu_stack_ns {
            args.push(arg_f(arg::COST_NS_OFFCPU_STACK, p));
        }
        if let Some(p) = c.http_request_ns {
            args.push(arg_f(arg::COST_NS_HTTP_REQUEST, p));
        }
        if let Some(p) = c.http_sse_write_ns {
            args.push(arg_f(arg::COST_NS_HTTP_SSE_WRITE, p));
        }
        if let (Some(ns), Some(per_s)) = (c.http_arrival_ns, c.http_arrival_runs_per_s) {
            args.push(arg_f(arg::COST_NS_HTTP_ARRIVAL, ns));
            args.push(arg_f(arg::HTTP_ARRIVAL_RUNS_PER_S, per_s));
        }
        args.push(arg_f(arg::SYSCALLS_PER_PROBE_HIT, c.syscalls_per_probe_hit));
        args.push(arg_s(arg::PROBE_ENTRY, c.entry_name()));
        args.push(arg_f(arg::CALIBRATION_MS, c.took_ms));
    }
    let by_probe: Vec<String> = PROBE_NAMES
        .iter()
        .zip(&o.est_added_by_probe_ns)
        .filter(|(_, ns)| **ns > 0.0)
        .map(|(name, ns)| format!("{name}={:.3}", ns / 1e6))
        .collect();
    args.push(arg_s(arg::OVERHEAD_BY_PROBE_MS, by_probe.join(" ")));
    if let Some(b) = o.budget_pct {
        args.push(arg_f(arg::OVERHEAD_BUDGET_PCT, b));
    }
    let steps: Vec<&str> = o.degradations.iter().map(|d| d.name).collect();
    args.push(arg_s(arg::DEGRADATIONS, steps.join(" ")));
    if let Some(l) = o.size_limit {
        args.push(arg_u(arg::TRACE_SIZE_LIMIT_BYTES, l));
        args.push(arg_u(arg::EVENTS_NOT_WRITTEN, o.events_not_written));
    }
    args
}
