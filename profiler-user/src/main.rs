//! The `llmprof` binary: parses the command line, installs the Ctrl-C/SIGTERM/SIGHUP handler, runs a subcommand and
//! maps its errors to the exit codes documented in `--help` ([`llmprof::exit`]). Errors are printed with their
//! causes, each once ([`llmprof::causes`]).

use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;
use llmprof::attach::{self, AttachError, AttachOptions};
use llmprof::capture::http::HttpPorts;
use llmprof::capture::{CaptureError, Cidr, EngineProbes};
use llmprof::causes;
use llmprof::cli::{AttachArgs, Cli, Command, DoctorArgs, OpenArgs, ReportArgs, ServeArgs};
use llmprof::doctor::{self, DoctorOptions};
use llmprof::exit;
use llmprof::gpu::CudaState;
use llmprof::open::TraceServer;

/// Set by the SIGINT/SIGTERM/SIGHUP handler; polled by the session loops.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::Relaxed);
}

/// The signals that end a session cleanly (finished trace, exit 0): Ctrl-C, SIGTERM, and SIGHUP (a closed
/// terminal or ssh session), whose default action would kill llmprof and leave a trace without its summary.
const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn install_signal_handlers() {
    for sig in STOP_SIGNALS {
        // SAFETY: `on_signal` is an `extern "C" fn(c_int)` that only performs an atomic store, which is
        // async-signal-safe; `signal` has no other preconditions.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

fn main() {
    let cli = Cli::parse();
    install_signal_handlers();
    let code = match cli.command {
        Command::Attach(a) => run_attach(*a),
        Command::Open(o) => run_open(o),
        Command::Doctor(d) => run_doctor(&d),
        Command::Report(r) => run_report(&r),
        Command::Serve(s) => run_serve(*s),
        Command::Completions { shell } => llmprof::packaging::completions(shell),
        Command::Manpages { dir } => llmprof::packaging::manpages(&dir),
    };
    std::process::exit(code);
}

fn run_attach(a: AttachArgs) -> i32 {
    let mut egress = Vec::new();
    for c in &a.egress_allow {
        match c.parse::<Cidr>() {
            Ok(c) => egress.push(c),
            Err(e) => {
                eprintln!("error: --egress-allow {c}: {e}");
                return exit::USAGE;
            }
        }
    }
    let Some((&pid, more)) = a.pid.split_first() else {
        eprintln!("error: --pid is required");
        return exit::USAGE;
    };
    let opts = AttachOptions {
        pid,
        more_pids: more.to_vec(),
        follow_children: !a.no_children,
        duration: a.duration,
        output: a.output.unwrap_or_else(|| attach::default_output(pid)),
        slow_syscall: a.slow_syscall,
        model_patterns: a.model_paths,
        egress_allow: egress,
        metrics_url: a.metrics_url,
        ring_bytes: a
            .ring_size
            .unwrap_or(if a.gpu_kernels == llmprof::gpu::inject::KernelsMode::All {
                llmprof::capture::DEEP_RING_BYTES
            } else {
                llmprof::capture::DEFAULT_RING_BYTES
            }),
        verbose: a.verbose,
        otel: a.otel,
        gpu: llmprof::gpu::GpuOptions {
            sample_interval: (!a.gpu_sample_interval.is_zero()).then_some(a.gpu_sample_interval),
            cuda: !a.no_cuda,
            cuda_calls: a.cuda_calls,
            kernels: a.gpu_kernels,
        },
        live_status: true,
        metadata: None,
        prelude: None,
        stop_reason: attach::StopReason::default(),
        sample_hz: if a.no_sample { 0 } else { a.sample_rate },
        overhead_budget: a.overhead_budget,
        thread_states: !a.no_thread_states,
        max_trace_size: a.max_trace_size.map(|b| b as u64),
        http: if a.no_http {
            HttpPorts::Off
        } else if a.http_ports.is_empty() {
            HttpPorts::All
        } else {
            HttpPorts::Only(a.http_ports)
        },
    };
    let opts_pid = opts.pid;
    match attach::run(&opts, &STOP) {
        Ok(r) => {
            println!(
                "llmprof: {} after {:.1} s",
                r.stats.end_reason,
                r.elapsed.as_secs_f64()
            );
            if r.processes > 1 {
                println!("  processes traced: {}", r.processes);
            }
            match &r.engine_probes {
                EngineProbes::Attached { abi_version } => {
                    println!("  engine probes: attached (ABI {abi_version})")
                }
                other => println!("  engine probes: {other:?}"),
            }
            println!(
                "  probes live after {:.1} ms",
                r.attach_latency.as_secs_f64() * 1e3
            );
            if let Some(u) = &r.metrics_url {
                println!("  metrics: {u}");
            }
            println!("  GPU counters: {}", r.gpu.counters);
            match &r.gpu.cuda {
                CudaState::Disabled => println!("  CUDA driver calls: off (--no-cuda)"),
                CudaState::Waiting => println!(
                    "  CUDA driver calls: none (libcuda was never loaded in pid {})",
                    opts_pid
                ),
                CudaState::Failed(e) => println!("  CUDA driver calls: probes failed: {e}"),
                CudaState::Attached { lib, functions } => println!(
                    "  CUDA driver calls: {} calls ({} shown individually, {} in {} batches) from {functions} entry points of {}",
                    r.cuda.calls,
                    r.cuda.individual,
                    r.cuda.batched_calls,
                    r.cuda.batches,
                    lib.display()
                ),
            }
            let events: Vec<String> = r.counts.by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
            println!(
                "  events: {}",
                if events.is_empty() {
                    "none".to_owned()
                } else {
                    events.join(", ")
                }
            );
            let g = &r.stats.gpu;
            if g.chunks + g.bad_chunks > 0 {
                println!(
                    "  GPU activity (CUPTI helper): {} chunks, {} kernels/copies/waits/graph launches, {} API calls, \
                     {} summary rows, {} busy intervals; lost: {} \
                     (CUPTI/helper dropped {}, chunks refused {}, records skipped {}, names skipped {}; chunks missed {})",
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
            println!(
                "  dropped: {} (kernel {}, user {}, GPU activity {}), decode errors {}, written out of order {} (the trace processor sorts them)",
                r.stats.total_dropped(),
                r.stats.total_dropped() - r.stats.user_drops - g.lost(),
                r.stats.user_drops,
                g.lost(),
                r.stats.decode_errors,
                r.late_events
            );
            print_overhead(&r);
            if let Some(o) = &r.otel {
                println!(
                    "  otel: {} spans built, {} exported, {} dropped, {} export errors, {} unsampled requests",
                    o.spans_built, o.spans_exported, o.spans_dropped, o.export_errors, o.requests_unsampled
                );
            }
            println!(
                "  trace: {} ({:.1} KiB)",
                r.trace.display(),
                r.trace_bytes as f64 / 1024.0
            );
            println!("\nopen it in Perfetto UI:  llmprof open {}", r.trace.display());
            exit::OK
        }
        Err(e) => {
            eprintln!("error: {}", causes::lines(&e));
            match e {
                AttachError::NotRoot | AttachError::Capture(CaptureError::NotRoot) => exit::NOT_ROOT,
                AttachError::InvalidOption(_) => exit::USAGE,
                AttachError::NoProcess(_) | AttachError::Capture(CaptureError::PidNotFound(_)) => {
                    exit::NO_PROCESS
                }
                AttachError::Capture(CaptureError::AbiMismatch { .. }) => exit::ABI_MISMATCH,
                AttachError::Capture(
                    CaptureError::MissingTracepoint { .. }
                    | CaptureError::Tracefs(_)
                    | CaptureError::Load(_)
                    | CaptureError::Program { .. },
                ) => exit::KERNEL,
                AttachError::Capture(CaptureError::Pattern(_)) => exit::USAGE,
                AttachError::Output { .. } => exit::OUTPUT,
                AttachError::GpuKernels(_) => exit::GPU_KERNELS,
                AttachError::Otel(_) => exit::USAGE,
                AttachError::Capture(_) => exit::FAILURE,
            }
        }
    }
}

fn run_serve(s: ServeArgs) -> i32 {
    use llmprof::serve::{self, ServeError, ServeOptions};
    let check_only = s.check_config;
    let opts = match ServeOptions::from_config(s.into()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {}", causes::lines(&e));
            return exit::USAGE;
        }
    };
    if check_only {
        return match serve::check(&opts) {
            Ok(summary) => {
                println!("llmprof serve: configuration ok: {summary}");
                exit::OK
            }
            Err(e) => {
                eprintln!("error: {}", causes::lines(&e));
                exit::USAGE
            }
        };
    }
    match serve::run(opts, &STOP) {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("error: {}", causes::lines(&e));
            match e {
                ServeError::NotRoot => exit::NOT_ROOT,
                ServeError::Insecure(_)
                | ServeError::Usage(_)
                | ServeError::Token(_)
                | ServeError::Tls(_) => exit::USAGE,
                ServeError::OutDir { .. } => exit::OUTPUT,
                ServeError::Bind { .. } | ServeError::Runtime(_) => exit::FAILURE,
            }
        }
    }
}

/// The self-accounting part of attach's exit summary.
fn print_overhead(r: &attach::AttachReport) {
    for (name, c) in llmprof_abi::PROBE_NAMES.iter().zip(&r.stats.probes) {
        if c.hits + c.dropped > 0 {
            println!(
                "  probe {name}: hits {}, emitted {}, dropped {}",
                c.hits, c.emitted, c.dropped
            );
        }
    }
    let Some(o) = &r.stats.overhead else { return };
    if let Some(c) = &o.calibration {
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
        println!(
            "  cost per hit (measured at start-up in {:.0} ms): {:.0} ns per traced syscall, {probe}, {cuda}, {sched}, probe entry {}",
            c.took_ms,
            c.syscall_ns,
            c.entry_name()
        );
        if let (Some(r), Some(w)) = (c.http_request_ns, c.http_sse_write_ns) {
            let arrival = match (c.http_arrival_ns, c.http_arrival_runs_per_s) {
                (Some(ns), Some(per_s)) => format!(
                    "; arrival stamps {ns:.0} ns per run, {per_s:.0} runs/s host-wide (not charged: softirq and senders)"
                ),
                _ => String::new(),
            };
            println!(
                "  wire probe: {r:.0} ns per followed request, {w:.0} ns per followed SSE write (a chat chunk){arrival}"
            );
        }
        if let Some(ns) = c.sample_ns {
            let offcpu = c.offcpu_stack_ns.map_or(String::new(), |o| {
                format!(", {o:.0} ns per off-CPU stack (ping-pong)")
            });
            let live = c.sample_live_ns.map_or(String::new(), |l| {
                format!("; {l:.0} ns per sample measured on the targets (charged)")
            });
            println!(
                "  stack sampler: {ns:.0} ns of eBPF per traced sample (kernel BPF run-time statistics){offcpu}{live}"
            );
        }
    }
    let pct = o
        .est_overhead_pct
        .map_or(String::new(), |p| format!(" = {p:.2}% of its CPU"));
    println!(
        "  overhead: est. {:.1} ms CPU added to the target{pct}; llmprof itself {:.1} ms CPU ({:.1}% of one core), peak RSS {:.1} MiB",
        o.est_added_ns / 1e6,
        o.llmprof_cpu_ns / 1e6,
        o.llmprof_cpu_ns / o.elapsed_ns.max(1) as f64 * 100.0,
        o.llmprof_max_rss_bytes as f64 / (1u64 << 20) as f64
    );
    if let Some(c) = &o.cupti {
        println!(
            "  CUPTI helper in the target: est. {:.1} ms CPU of it = CUPTI's buffer thread and the helper's callbacks, {:.1} ms (measured there) + {} CUPTI records × {:.0} ns in the launching threads (an assumed figure: not measurable from outside the CUDA calls)",
            c.added_ns / 1e6,
            c.thread_cpu_ns / 1e6,
            c.records,
            c.per_record_ns
        );
    }
    if let Some(b) = o.budget_pct {
        if o.degradations.is_empty() {
            println!("  overhead budget {b}%: met, nothing degraded");
        } else {
            let steps: Vec<String> = o
                .degradations
                .iter()
                .map(|d| format!("{} (at est. {:.1}%)", d.name, d.overhead_pct))
                .collect();
            println!("  overhead budget {b}%: degraded: {}", steps.join(", "));
        }
    }
    if let Some(l) = o.size_limit
        && r.stats.end_reason == attach::END_SIZE_LIMIT
    {
        println!(
            "  trace size limit {:.1} MiB reached: the trace ended early and cleanly; {} events not written",
            l as f64 / (1u64 << 20) as f64,
            o.events_not_written
        );
    }
}

fn run_doctor(d: &DoctorArgs) -> i32 {
    let report = doctor::run(&DoctorOptions { pid: d.pid });
    if d.json {
        print!("{}", report.json());
    } else {
        print!("{}", report.human());
    }
    report.exit_code()
}

fn run_report(r: &ReportArgs) -> i32 {
    match llmprof_trace::report::load(&r.trace) {
        Ok(rep) => {
            print!("{}", if r.json { rep.to_json() } else { rep.to_text() });
            exit::OK
        }
        Err(e) => {
            eprintln!("error: {}", causes::lines(&e));
            exit::FAILURE
        }
    }
}

fn run_open(o: OpenArgs) -> i32 {
    let r = TraceServer::bind(&o.trace, o.port).and_then(|srv| {
        println!(
            "Open this link in a browser on this machine (Perfetto UI loads the trace from 127.0.0.1):\n"
        );
        println!("  {}\n", srv.ui_url());
        println!(
            "Serving {} at {} until it is fetched (Ctrl-C to stop).",
            o.trace.display(),
            srv.file_url()
        );
        srv.serve(&STOP)
    });
    match r {
        Ok(true) => {
            println!("Trace fetched by the UI.");
            exit::OK
        }
        Ok(false) => exit::OK,
        Err(e) => {
            eprintln!("error: {}", causes::lines(&e));
            exit::FAILURE
        }
    }
}
