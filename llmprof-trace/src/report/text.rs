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
            super::sched::text(&mut o, t, TEXT_ROWS);
        }
        super::stacks::text(&mut o, self.cpu_samples.as_ref());
        super::cupti::text(&mut o, self.kernels.as_ref(), TEXT_ROWS);
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
                "  {label:<26} {:>6} {:>10} {:>10} {:>10} {:>10}",
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
                "\n{title}\n  {:<26} {:>6} {:>10} {:>10} {:>10} {:>10}",
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
        let verdict = super::verdict::lines(self);
        if !verdict.is_empty() {
            let _ = writeln!(o, "\nVerdict");
            for l in &verdict {
                let _ = writeln!(o, "  {l}");
            }
        }
        self.requests_text(&mut o, &row, &header);
        if !self.steps_by_kind.is_empty() {
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
        }
        let sampled: Vec<_> = self.counters.iter().filter(|(_, c)| c.samples > 0).collect();
        if !sampled.is_empty() || self.preemptions_total.is_some() {
            let _ = writeln!(o, "\nKV cache and queue (engine /metrics samples)");
            for (k, c) in sampled {
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
        }
        self.syscalls_text(&mut o);
        if !self.model_files.is_empty() {
            let _ = writeln!(o, "\nModel-file reads");
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
        if !self.egress.is_empty() {
            let _ = writeln!(o, "\nEgress (connects made by the traced processes)");
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
        if let Some(n) = self.offcpu_not_taken {
            let _ = writeln!(
                o,
                "  off-CPU stacks not taken by design: {n} (a rate bound of {} per {} ms per CPU; not a loss)",
                llmprof_abi::stacks::OFFCPU_STACKS_PER_WINDOW,
                llmprof_abi::stacks::OFFCPU_WINDOW_NS / 1_000_000
            );
        }
        for p in self.probes.iter().filter(|p| p.dropped > 0) {
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

    /// Requests: counts by outcome and status, latencies of the successful ones, the failed ones apart, and
    /// the slowest requests with the name that finds each in Perfetto. Nothing without requests.
    fn requests_text(
        &self,
        o: &mut String,
        row: &dyn Fn(&mut String, &str, &Stats),
        header: &dyn Fn(&mut String, &str),
    ) {
        if self.requests.is_empty() {
            return;
        }
        let (ok, failed, cancelled, running) = self.outcomes();
        let joined = if !self.joined_views.is_empty() {
            format!(
                "; {} wire views of engine requests joined to them (counted once)",
                self.joined_views.len()
            )
        } else {
            String::new()
        };
        let parts: Vec<String> = [
            (ok, "finished"),
            (failed, "failed"),
            (cancelled, "cancelled by the client"),
            (running, "still running at the end"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        let _ = writeln!(
            o,
            "\nRequests: {} ({}){joined}",
            self.requests.len(),
            parts.join(", ")
        );
        let statuses = self.status_counts();
        if !statuses.is_empty() {
            let s: Vec<String> = statuses.iter().map(|(s, n)| format!("{s} ×{n}")).collect();
            let _ = writeln!(
                o,
                "  HTTP status: {}; error rate {:.1} % (4xx/5xx are failed requests, kept out of the latencies below)",
                s.join(", "),
                self.error_rate_pct().unwrap_or(0.0)
            );
        }
        header(o, "Latency of the successful requests");
        let queue = self.ok_col(|q| q.queue_ms);
        if queue.count > 0 {
            row(o, "queue", &queue);
            row(o, "prefill", &self.ok_col(|q| q.prefill_ms));
        }
        let ttft = self.ttft();
        row(o, "TTFT", &ttft);
        let with_e2e = self.ok_col(|q| q.e2e_ms).count;
        if ttft.count < with_e2e {
            let _ = writeln!(
                o,
                "    (TTFT: {} of {with_e2e} requests have one: engine requests and streamed responses; a response \
                 sent whole has no first token on the wire)",
                ttft.count
            );
        }
        let first_decode = self.ok_col(|q| q.first_decode_step_ms);
        if first_decode.count > 0 {
            row(o, "first decode step", &first_decode);
        }
        let itl = Stats::of(&self.itl_ms);
        if itl.count > 0 {
            row(o, "inter-token latency", &itl);
        }
        row(o, "end-to-end", &self.ok_col(|q| q.e2e_ms));
        let outside = self.ok_col(|q| q.outside_engine_ttft_ms);
        if outside.count > 0 {
            row(o, "TTFT outside the engine", &outside);
        }
        let waited = self.ok_col(|q| q.socket_wait_ms);
        if waited.count > 0 {
            row(o, "wait in server socket", &waited);
        }
        let failed_e2e = self.col(|q| q.e2e_ms.filter(|_| q.failed()));
        if failed_e2e.count > 0 {
            row(o, "failed requests, end-to-end", &failed_e2e);
        }
        self.slowest_text(o);
    }

    /// The slowest requests by end-to-end time, with what finds each in Perfetto.
    fn slowest_text(&self, o: &mut String) {
        let mut slow: Vec<&super::RequestRow> = self.requests.iter().filter(|q| q.e2e_ms.is_some()).collect();
        if slow.is_empty() {
            return;
        }
        slow.sort_by(|a, b| b.e2e_ms.unwrap_or(0.0).total_cmp(&a.e2e_ms.unwrap_or(0.0)));
        let _ = writeln!(
            o,
            "\nSlowest requests (by end-to-end; search the last column in Perfetto UI to find each)\n  {:>9} {:<24} {:>6} {:>6} {:>9} {:>9} {:>10}  find in Perfetto",
            "start s", "path", "status", "stream", "bytes", "TTFT ms", "e2e ms"
        );
        let f = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.1}"));
        for q in slow.iter().take(TEXT_ROWS) {
            let start = q.arrival_ns.saturating_sub(self.trace_start_ns) as f64 / 1e9;
            let mut path = if q.path.is_empty() {
                "-".to_owned()
            } else {
                q.path.clone()
            };
            if path.chars().count() > 24 {
                path = format!("{}…", path.chars().take(23).collect::<String>());
            }
            let mut find = q.slice_name();
            if let Some(w) = q.wire_req_id {
                find.push_str(&format!(" / {}", crate::names::slice::request(w)));
            }
            if !q.x_request_id.is_empty() {
                find.push_str(&format!(" (x-request-id {})", q.x_request_id));
            }
            let _ = writeln!(
                o,
                "  {:>+9.3} {:<24} {:>6} {:>6} {:>9} {:>9} {:>10}  {find}",
                start,
                path,
                q.http_status.map_or("-".to_owned(), |s| s.to_string()),
                q.streamed.map_or("-", |s| if s { "yes" } else { "no" }),
                q.response_bytes.map_or("-".to_owned(), |b| b.to_string()),
                f(q.ttft_ms),
                f(q.e2e_ms),
            );
        }
    }

    /// Syscalls by total time: the calls that work, then the idle waits apart; nothing when none were seen.
    fn syscalls_text(&self, o: &mut String) {
        if self.slow_syscalls.is_empty() && self.syscall_aggregates.is_empty() {
            return;
        }
        let line = |o: &mut String, s: &super::SyscallRow, max: bool| {
            let max = if max {
                format!(
                    ", max {} ms",
                    s.max_ms.map_or("-".to_owned(), |m| format!("{m:.3}"))
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                o,
                "    {:<20} {:>8} calls {:>12.3} ms total{max}",
                s.name, s.count, s.total_ms
            );
        };
        let _ = writeln!(o, "\nSyscalls by total time (kernel aggregates of every call)");
        let (idle, work): (Vec<_>, Vec<_>) = self
            .syscall_aggregates
            .iter()
            .partition(|s| crate::names::syscalls::is_idle_wait(&s.name));
        if !work.is_empty() {
            let _ = writeln!(o, "  work:");
        }
        for s in work.iter().take(TEXT_ROWS) {
            line(o, s, false);
        }
        if !idle.is_empty() {
            let _ = writeln!(
                o,
                "  idle waits (threads waiting for work or a wakeup: epoll_wait, futex, poll, nanosleep, ...):"
            );
        }
        for s in idle.iter().take(TEXT_ROWS) {
            line(o, s, false);
        }
        let (slow_idle, slow): (Vec<_>, Vec<_>) = self
            .slow_syscalls
            .iter()
            .partition(|s| crate::names::syscalls::is_idle_wait(&s.name));
        if !slow.is_empty() {
            let _ = writeln!(
                o,
                "  work slower than --slow-syscall (individual slices in the trace):"
            );
        }
        for s in slow.iter().take(TEXT_ROWS) {
            line(o, s, true);
        }
        if !slow_idle.is_empty() {
            let n: u64 = slow_idle.iter().map(|s| s.count).sum();
            let _ = writeln!(
                o,
                "  (and {n} idle waits slower than --slow-syscall, as slices in the trace)"
            );
        }
    }
}

fn gpu_text(out: &mut String, g: Option<&GpuSection>) {
    let f = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.2}"));
    // CUDA calls are µs-scale: three decimals of a millisecond.
    let f3 = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.3}"));
    // A host without a GPU: the markers saying so stay in the JSON.
    let Some(g) = g.filter(|g| !g.gpus.is_empty() || !g.cuda_functions.is_empty() || g.summary.is_some())
    else {
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
    let private = o
        .llmprof_max_private_mib
        .map_or(String::new(), |p| format!(" ({} MiB its own)", f(Some(p), 1)));
    let _ = writeln!(
        out,
        "  llmprof itself: {} ms CPU ({} % of one core), peak RSS {} MiB{private}",
        f(o.llmprof_cpu_ms, 1),
        f(o.llmprof_cpu_pct, 2),
        f(o.llmprof_max_rss_mib, 1)
    );
    if let Some(c) = o.llmprof_cpu_charged_ms {
        let _ = writeln!(
            out,
            "  of which charged to the target: {c:.1} ms (llmprof shares {} CPU(s) with it, {} % idle: time llmprof ran there is time the target waited)",
            o.shared_cpus.unwrap_or(0),
            f(o.shared_idle_pct, 1)
        );
    }
    if let (Some(a), Some(u)) = (o.symbolize_addresses.filter(|a| *a > 0), o.symbolize_unknown) {
        let _ = writeln!(
            out,
            "  symbolized {a} addresses: {u} unknown ({:.1} %; {} in no mapping: a frame-pointer walk through code without frame pointers)",
            100.0 * u as f64 / a as f64,
            o.symbolize_unmapped.unwrap_or(0)
        );
    }
    if let Some(n) = o.symbolized_stacks.filter(|n| *n > 0) {
        let ms = o.symbolize_ms.unwrap_or(0.0);
        let _ = writeln!(
            out,
            "  of which symbolizing {n} stacks: {ms:.1} ms ({:.1} µs each from the cache, {:.1} ms resolving new \
             addresses); eBPF per stack sample: {} ns (measured on the targets: {} ns), per off-CPU stack: {} ns",
            (ms - o.symbolize_resolve_ms.unwrap_or(0.0)).max(0.0) * 1e3 / n as f64,
            o.symbolize_resolve_ms.unwrap_or(0.0),
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
