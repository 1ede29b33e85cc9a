//! The terminal output of `llmprof report`: the tables a person reads (TTFT decomposition, steps, counters,
//! syscalls, model files, egress, drops, GPU, overhead), each at most [`TEXT_ROWS`] rows long.
//!
//! Formatting only: every number comes from the [`Report`]; the JSON has all the rows.

use std::fmt::Write as _;

use super::{GpuSection, OverheadReport, Report, Stats};

/// How many rows the terminal tables show (the JSON has them all).
const TEXT_ROWS: usize = 10;

impl Report {
    /// The terminal report.
    pub fn to_text(&self) -> String {
        let mut o = self.to_text_main();
        gpu_text(&mut o, self.gpu.as_ref());
        if let Some(t) = &self.thread_states {
            super::threads::text(&mut o, t, TEXT_ROWS);
        }
        super::samples::text(&mut o, self.cpu_samples.as_ref());
        super::kernels::text(&mut o, self.kernels.as_ref(), TEXT_ROWS);
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
        row(&mut o, "end-to-end", &self.col(|q| q.e2e_ms));
        let outside = self.col(|q| q.outside_engine_ttft_ms);
        if outside.count > 0 {
            row(&mut o, "TTFT outside the engine", &outside);
        }
        let waited = self.col(|q| q.socket_wait_ms);
        if waited.count > 0 {
            row(&mut o, "wait in server socket", &waited);
        }
        header(&mut o, "Engine steps (host duration)");
        for (k, s) in &self.steps_by_kind {
            row(&mut o, k, s);
        }
        for b in &self.steps_by_batch {
            row(&mut o, &format!("batch {}", b.bucket), &b.stats);
        }
        if self.steps_graph_replayed.count > 0 {
            row(&mut o, "CUDA graph replays", &self.steps_graph_replayed);
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
                || (p.probe == llmprof_abi::PROBE_NAMES[llmprof_abi::ProbeId::Cuda as usize]
                    && self.gpu.as_ref().is_some_and(|g| g.probe.is_some()))
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

fn overhead_text(out: &mut String, o: &OverheadReport) {
    let f = |v: Option<f64>, d: usize| v.map_or("-".to_owned(), |x| format!("{x:.d$}"));
    let _ = writeln!(out, "\nllmprof overhead (self-accounting):");
    let _ = writeln!(
        out,
        "  est. CPU added to the target {} ms = {} % of its own CPU ({} ms); cost per hit: syscall {} ns (decoded {} ns), engine probe {} ns, CUDA call {} ns ({})",
        f(o.est_target_cpu_ms, 1),
        f(o.est_target_pct, 2),
        f(o.target_cpu_ms, 1),
        f(o.cost_ns_syscall, 0),
        f(o.cost_ns_syscall_decoded, 0),
        f(o.cost_ns_engine_probe, 0),
        f(o.cost_ns_cuda_call, 0),
        o.probe_entry.as_deref().unwrap_or("entry not measured")
    );
    if let Some(c) = o.est_cupti_ms {
        let _ = writeln!(
            out,
            "  of it, the CUPTI helper in the target: {c:.1} ms = its threads {} ms (measured there) + {} CUPTI records × {} ns (assumed: CUPTI's work inside the CUDA calls)",
            f(o.cupti_thread_cpu_ms, 1),
            o.cupti_records.unwrap_or(0),
            f(o.cost_ns_cupti_record, 0)
        );
    }
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
    if let Some(n) = o.symbolized_stacks.filter(|n| *n > 0) {
        let ms = o.symbolize_ms.unwrap_or(0.0);
        let _ = writeln!(
            out,
            "  of which symbolizing {n} stacks: {ms:.1} ms ({:.1} µs each); eBPF per stack sample: {} ns \
             (measured on the targets: {} ns), per off-CPU stack: {} ns",
            ms * 1e3 / n as f64,
            f(o.cost_ns_sample, 0),
            f(o.cost_ns_sample_live, 0),
            f(o.cost_ns_offcpu_stack, 0)
        );
    }
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
