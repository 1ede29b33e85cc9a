//! The exit summary of `llmprof attach`: what a person reads when the session ends.
//!
//! Owns its wording. By default it fits a screen: what was traced and from where (engine probes or the
//! wire), what was recorded, what was lost, what it cost the target, the trace, and the two commands that
//! read it (`llmprof report`, `llmprof open`). `-v`/`--verbose` adds the internals: per-probe counters, the
//! calibrated costs, the GPU layer, symbolization, the OTLP export. Formatting only: every number comes from
//! the [`AttachReport`].

use std::fmt::Write as _;

use llmprof_trace::event::OverheadSummary;

use super::AttachReport;
use crate::capture::EngineProbes;
use crate::cuda::CudaState;

/// The summary, lines ending with a newline.
pub fn render(r: &AttachReport, verbose: bool) -> String {
    let mut o = String::new();
    let (pid, name) = &r.target;
    let more = if r.processes > 1 {
        format!(" and {} more process(es) of its tree", r.processes - 1)
    } else {
        String::new()
    };
    let _ = writeln!(
        o,
        "llmprof: {} after {:.1} s; traced pid {pid} ({name}){more}",
        r.stats.end_reason,
        r.elapsed.as_secs_f64()
    );
    let w = &r.wire;
    let requests = if w.requests > 0 {
        let joined = if w.joined > 0 {
            format!(
                ", {} of them also seen by the engine's probes and joined",
                w.joined
            )
        } else {
            String::new()
        };
        format!(
            "; {} HTTP requests on the wire ({} failed with 4xx/5xx, {} cancelled by the client{joined})",
            w.requests, w.failed, w.cancelled
        )
    } else {
        String::new()
    };
    let engine = match &r.engine_probes {
        EngineProbes::Attached { .. } => "engine probes attached (steps, requests, phases)".to_owned(),
        _ => "no engine probes (requests come from the wire)".to_owned(),
    };
    let _ = writeln!(o, "  sources: {engine}{requests}");
    let _ = writeln!(o, "  recorded: {}", recorded(r));
    let lost = r.stats.total_dropped();
    if lost == 0 {
        let _ = writeln!(o, "  lost: nothing");
    } else {
        let g = r.stats.gpu.lost();
        let _ = writeln!(
            o,
            "  lost: {lost} records (kernel ring {}, user space {}, GPU activity {g}); per probe: llmprof report",
            lost - r.stats.user_drops - g,
            r.stats.user_drops
        );
    }
    if let Some(ov) = &r.stats.overhead {
        let [estimate, own] = overhead(ov, r.symbolize.as_ref());
        let _ = writeln!(o, "  overhead: {estimate}");
        let _ = writeln!(o, "  {own}");
        budget_and_size(&mut o, ov, r);
    }
    if let CudaState::Attached { .. } = &r.gpu.cuda {
        let _ = writeln!(
            o,
            "  CUDA driver calls: {} ({} shown individually, {} in {} batches)",
            r.cuda.calls, r.cuda.individual, r.cuda.batched_calls, r.cuda.batches
        );
    }
    if let Some(ot) = &r.otel {
        let _ = writeln!(
            o,
            "  otel: {} spans exported, {} dropped, {} export errors",
            ot.spans_exported, ot.spans_dropped, ot.export_errors
        );
    }
    if verbose {
        details(&mut o, r);
    }
    let trace = r.trace.display();
    let _ = writeln!(o, "  trace: {trace} ({:.1} KiB)", r.trace_bytes as f64 / 1024.0);
    let _ = writeln!(o, "\nnext:");
    let _ = writeln!(
        o,
        "  llmprof report {trace}   # where the time went: verdict, slowest requests, syscalls, cost"
    );
    let _ = writeln!(o, "  llmprof open {trace}     # the timeline in Perfetto UI");
    o
}

/// The main kinds of events written, most telling first (the verbose summary lists every kind).
fn recorded(r: &AttachReport) -> String {
    let n = |k: &str| r.counts.by_kind.get(k).copied().unwrap_or(0);
    let parts: Vec<String> = [
        ("engine steps", n("step")),
        ("stack samples", n("cpu_sample")),
        ("off-CPU stacks", n("offcpu_stack")),
        ("Python stacks", n("py_stack")),
        ("thread-state events", n("sched_switch") + n("sched_wake")),
        ("slow syscalls", n("slow_syscall")),
        ("model-file operations", n("file_open") + n("file_io")),
        ("connects", n("connect")),
        ("CUDA kernels/copies", n("gpu_work")),
    ]
    .into_iter()
    .filter(|(_, v)| *v > 0)
    .map(|(k, v)| format!("{v} {k}"))
    .collect();
    if parts.is_empty() {
        "no events (the target was idle)".to_owned()
    } else {
        parts.join(", ")
    }
}

/// The cost lines: the estimate and what it is made of; llmprof's own CPU and memory.
fn overhead(ov: &OverheadSummary, symbolize: Option<&crate::symbolize::SymbolizeStats>) -> [String; 2] {
    let pct = ov.est_overhead_pct.map_or("est.".to_owned(), |p| {
        format!("est. {p:.2} % of the target's CPU,")
    });
    let shared = match ov.contention_ns {
        Some(c) if c > 0.0 => format!(
            " + llmprof's own CPU on {} shared busy CPU(s) ({:.0} % idle) {:.1} ms",
            ov.shared_cpus,
            ov.shared_idle_pct.unwrap_or(0.0),
            c / 1e6
        ),
        _ => String::new(),
    };
    let cupti = ov.cupti.as_ref().map_or(0.0, |c| c.added_ns);
    let cupti_part = if cupti > 0.0 {
        format!(", CUPTI helper {:.1} ms", cupti / 1e6)
    } else {
        String::new()
    };
    let hooks = ov.python_hooks.as_ref().map_or(0.0, |h| h.added_ns);
    let hooks_part = match &ov.python_hooks {
        Some(h) => format!(
            ", Python hooks {:.1} ms ({} records)",
            h.added_ns / 1e6,
            h.records
        ),
        None => String::new(),
    };
    let probes = ov.est_added_ns - ov.contention_ns.unwrap_or(0.0) - cupti - hooks;
    let per_stack = symbolize.filter(|s| s.samples > 0).map_or(String::new(), |s| {
        format!(
            ", symbolizing {:.0} µs per stack (+ {:.0} ms reading {} new addresses' symbols)",
            s.time.saturating_sub(s.resolve_time).as_secs_f64() * 1e6 / s.samples as f64,
            s.resolve_time.as_secs_f64() * 1e3,
            s.resolved
        )
    });
    [
        format!(
            "{pct} {:.1} ms: probes {:.1} ms{cupti_part}{hooks_part}{shared}",
            ov.est_added_ns / 1e6,
            probes / 1e6
        ),
        format!(
            "llmprof itself: {:.1} % of a core{per_stack}, peak RSS {:.1} MiB ({:.1} MiB its own, the rest \
             shared with the target)",
            ov.llmprof_cpu_ns / ov.elapsed_ns.max(1) as f64 * 100.0,
            ov.llmprof_max_rss_bytes as f64 / f64::from(1u32 << 20),
            ov.llmprof_max_private_bytes as f64 / f64::from(1u32 << 20)
        ),
    ]
}

fn budget_and_size(o: &mut String, ov: &OverheadSummary, r: &AttachReport) {
    if let Some(b) = ov.budget_pct {
        if ov.degradations.is_empty() {
            let _ = writeln!(o, "  overhead budget {b}%: met, nothing degraded");
        } else {
            let steps: Vec<String> = ov
                .degradations
                .iter()
                .map(|d| format!("{} (at est. {:.1}%)", d.name, d.overhead_pct))
                .collect();
            let _ = writeln!(o, "  overhead budget {b}%: degraded: {}", steps.join(", "));
        }
    }
    if let Some(l) = ov.size_limit
        && r.stats.end_reason == super::END_SIZE_LIMIT
    {
        let _ = writeln!(
            o,
            "  trace size limit {:.1} MiB reached: the trace ended early and cleanly; {} events not written",
            l as f64 / f64::from(1u32 << 20),
            ov.events_not_written
        );
    }
}

/// `--verbose`: the internals.
fn details(o: &mut String, r: &AttachReport) {
    let _ = writeln!(o, "  details:");
    match &r.engine_probes {
        EngineProbes::Attached { abi_version } => {
            let _ = writeln!(o, "    engine probes: attached (ABI {abi_version})");
        }
        other => {
            let _ = writeln!(o, "    engine probes: {other:?}");
        }
    }
    let _ = writeln!(
        o,
        "    probes live after {:.1} ms",
        r.attach_latency.as_secs_f64() * 1e3
    );
    if let Some(u) = &r.metrics_url {
        let _ = writeln!(o, "    metrics: {u}");
    }
    let _ = writeln!(o, "    GPU counters: {}", r.gpu.counters);
    match &r.gpu.cuda {
        CudaState::Disabled => {
            let _ = writeln!(o, "    CUDA driver calls: off (--no-cuda)");
        }
        CudaState::Waiting => {
            let _ = writeln!(o, "    CUDA driver calls: none (libcuda was never loaded)");
        }
        CudaState::Failed(e) => {
            let _ = writeln!(o, "    CUDA driver calls: probes failed: {e}");
        }
        CudaState::Attached { lib, functions } => {
            let _ = writeln!(
                o,
                "    CUDA driver calls: from {functions} entry points of {}",
                lib.display()
            );
        }
    }
    let events: Vec<String> = r.counts.by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let _ = writeln!(
        o,
        "    events: {}",
        if events.is_empty() {
            "none".to_owned()
        } else {
            events.join(", ")
        }
    );
    let g = &r.stats.gpu;
    if g.chunks + g.bad_chunks > 0 {
        let _ = writeln!(
            o,
            "    GPU activity (CUPTI helper): {} chunks, {} kernels/copies/waits/graph launches, {} API calls, {} \
             summary rows, {} busy intervals; lost: {} (CUPTI/helper dropped {}, chunks refused {}, records skipped \
             {}, names skipped {}; chunks missed {})",
            g.chunks,
            g.activities,
            g.api_calls,
            g.summaries,
            g.busy,
            g.lost(),
            g.helper_dropped,
            g.bad_chunks,
            g.skipped_records,
            g.skipped_names,
            g.missed_chunks
        );
    }
    let _ = writeln!(
        o,
        "    decode errors {}, written out of order {} (the trace processor sorts them)",
        r.stats.decode_errors, r.late_events
    );
    if r.stats.offcpu_not_taken > 0 {
        let _ = writeln!(
            o,
            "    off-CPU stacks not taken by design: {} (a per-CPU rate bound; not a loss)",
            r.stats.offcpu_not_taken
        );
    }
    for (name, c) in llmprof_abi::PROBE_NAMES.iter().zip(&r.stats.probes) {
        if c.hits + c.dropped > 0 {
            let _ = writeln!(
                o,
                "    probe {name}: hits {}, emitted {}, dropped {}",
                c.hits, c.emitted, c.dropped
            );
        }
    }
    if let Some(s) = r.symbolize.as_ref().filter(|s| s.samples > 0) {
        let _ = writeln!(
            o,
            "    stacks: {} symbolized in {:.1} ms ({:.1} µs each from the cache; {:.1} ms resolving new addresses); \
             {} addresses resolved, {} unknown ({} in no mapping), memory maps read {} times",
            s.samples,
            s.time.as_secs_f64() * 1e3,
            s.time.saturating_sub(s.resolve_time).as_secs_f64() * 1e6 / s.samples as f64,
            s.resolve_time.as_secs_f64() * 1e3,
            s.resolved,
            s.unknown,
            s.unmapped,
            s.maps_reads
        );
    }
    if let Some(c) = r.stats.overhead.as_ref().and_then(|ov| ov.calibration.as_ref()) {
        costs(o, c);
    }
    if let Some(c) = r.stats.overhead.as_ref().and_then(|ov| ov.cupti.as_ref()) {
        let _ = writeln!(
            o,
            "    CUPTI helper in the target: est. {:.1} ms CPU = CUPTI's buffer thread and the helper's callbacks, \
             {:.1} ms (measured there) + {} CUPTI records × {:.0} ns in the launching threads (an assumed figure: \
             not measurable from outside the CUDA calls)",
            c.added_ns / 1e6,
            c.thread_cpu_ns / 1e6,
            c.records,
            c.per_record_ns
        );
    }
    if let Some(ot) = &r.otel {
        let _ = writeln!(
            o,
            "    otel: {} spans built, {} unsampled requests",
            ot.spans_built, ot.requests_unsampled
        );
    }
}

/// The calibrated costs per hit.
fn costs(o: &mut String, c: &llmprof_trace::calibration::Calibration) {
    let probe = c.probe_ns.map_or("no engine probe attached".to_owned(), |p| {
        format!(
            "{p:.0} ns per engine probe hit (+ {:.2} traced syscalls each)",
            c.syscalls_per_probe_hit
        )
    });
    let cuda = c.cuda_call_ns.map_or("CUDA probes not measured".to_owned(), |p| {
        let counted = c.cuda_count_ns.map_or(String::new(), |n| {
            format!(", {n:.0} ns per counted launch (entry probe only)")
        });
        format!("{p:.0} ns per timed CUDA driver call (entry + return probe){counted}")
    });
    let sched = c
        .sched_event_ns
        .map_or("thread states not measured".to_owned(), |p| {
            format!("{p:.0} ns per thread-state record")
        });
    let _ = writeln!(
        o,
        "    cost per hit (measured beside the session in {:.0} ms): {:.0} ns per traced syscall, {probe}, {cuda}, {sched}, \
         probe entry {}",
        c.took_ms,
        c.syscall_ns,
        c.entry_name()
    );
    if let (Some(rq), Some(w)) = (c.http_request_ns, c.http_sse_write_ns) {
        let arrival = match (c.http_arrival_ns, c.http_arrival_runs_per_s) {
            (Some(ns), Some(per_s)) => format!(
                "; arrival stamps {ns:.0} ns per run, {per_s:.0} runs/s host-wide (not charged: softirq and senders)"
            ),
            _ => String::new(),
        };
        let _ = writeln!(
            o,
            "    wire probe: {rq:.0} ns per followed request, {w:.0} ns per followed SSE write (a chat chunk){arrival}"
        );
    }
    if let Some(ns) = c.sample_ns {
        let offcpu = c.offcpu_stack_ns.map_or(String::new(), |x| {
            format!(", {x:.0} ns per off-CPU stack (ping-pong)")
        });
        let live = c.sample_live_ns.map_or(String::new(), |l| {
            format!("; {l:.0} ns per sample measured on the targets (charged)")
        });
        let _ = writeln!(
            o,
            "    stack sampler: {ns:.0} ns of eBPF per traced sample (kernel BPF run-time statistics){offcpu}{live}"
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::Duration;

    fn report() -> AttachReport {
        let mut counts = llmprof_trace::perfetto::EventCounts::default();
        counts.by_kind.insert("cpu_sample", 1200);
        counts.by_kind.insert("sched_switch", 300);
        AttachReport {
            trace: PathBuf::from("t.perfetto-trace"),
            trace_bytes: 4096,
            stats: llmprof_trace::event::SessionStats {
                end_reason: "duration elapsed".into(),
                overhead: Some(OverheadSummary {
                    elapsed_ns: 10_000_000_000,
                    est_added_ns: 1_060e6,
                    est_overhead_pct: Some(11.2),
                    llmprof_cpu_ns: 2_000e6,
                    contention_ns: Some(1_000e6),
                    shared_cpus: 2,
                    shared_idle_pct: Some(0.5),
                    ..OverheadSummary::default()
                }),
                ..Default::default()
            },
            counts,
            late_events: 0,
            attach_latency: Duration::from_millis(90),
            elapsed: Duration::from_secs(10),
            engine_probes: EngineProbes::NotFound,
            processes: 1,
            metrics_url: None,
            otel: None,
            gpu: crate::attach::gpu::GpuReport {
                counters: "off".into(),
                cuda: CudaState::Waiting,
                dropped: 0,
            },
            cuda: Default::default(),
            target: (42, "python3".into()),
            wire: llmprof_trace::decode::wire::requests::WireStats {
                requests: 39,
                failed: 1,
                ..Default::default()
            },
            symbolize: None,
            python_processes: 1,
        }
    }

    #[test]
    fn the_summary_fits_a_screen_and_ends_with_the_commands_that_read_the_trace() {
        let s = render(&report(), false);
        let lines: Vec<&str> = s.lines().collect();
        assert!(lines.len() <= 12, "{s}");
        assert!(lines.iter().all(|l| l.chars().count() <= 160), "{s}");
        assert_eq!(
            lines[lines.len() - 2],
            "  llmprof report t.perfetto-trace   # where the time went: verdict, slowest requests, syscalls, cost"
        );
        assert!(
            lines[lines.len() - 1].starts_with("  llmprof open t.perfetto-trace"),
            "{s}"
        );
        assert!(s.contains(
            "no engine probes (requests come from the wire); 39 HTTP requests on the wire (1 failed"
        ));
        assert!(
            s.contains(
                "11.20 % of the target's CPU, 1060.0 ms: probes 60.0 ms + llmprof's own CPU on 2 shared busy \
                 CPU(s) (0 % idle) 1000.0 ms"
            ),
            "{s}"
        );
        assert!(s.contains("lost: nothing"), "{s}");
        assert!(!s.contains("NotFound"), "internals only with --verbose: {s}");
        let v = render(&report(), true);
        assert!(v.contains("engine probes: NotFound"), "{v}");
        assert!(v.lines().count() > lines.len());
    }
}
