//! The `llmprof` binary: parses the command line, installs the Ctrl-C/SIGTERM/SIGHUP handler, runs a subcommand and
//! maps its errors to the exit codes documented in `--help` ([`llmprof::exit`]). Errors are printed with their
//! causes, each once ([`llmprof::causes`]).

use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;
use llmprof::attach::{self, AttachError, AttachOptions};
use llmprof::capture::wire::HttpPorts;
use llmprof::capture::{CaptureError, Cidr};
use llmprof::causes;
use llmprof::cli::{AttachArgs, CalibrateArgs, Cli, Command, DoctorArgs, OpenArgs, ReportArgs, ServeArgs};
use llmprof::doctor::{self, DoctorOptions};
use llmprof::exit;
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
    llmprof::logging::init_from_env();
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
        Command::CalibrateProbes(c) => run_calibrate(&c),
    };
    std::process::exit(code);
}

/// `calibrate-probes`: one JSON line on stdout, the costs or the error (exit code as `attach`'s).
fn run_calibrate(c: &CalibrateArgs) -> i32 {
    use llmprof::capture::calibrate::{self, CalibrationConfig, Untraced};
    use llmprof::capture::calibrate_child::ChildReport;
    let cfg = CalibrationConfig {
        engine: c.engine,
        cuda: c.cuda,
        thread_states: c.thread_states,
        sample: c.sample,
        http: c.http,
        untraced: c
            .untraced_ns
            .zip(c.untraced_decoded_ns)
            .map(|(plain_ns, decoded_ns)| Untraced { plain_ns, decoded_ns }),
    };
    let mut code = exit::OK;
    calibrate::run_reporting(&cfg, |r| {
        println!("{}", ChildReport::line(r));
        if let Err(e) = r {
            code = calibrate_exit_code(e);
        }
    });
    code
}

/// The exit code of a failed `calibrate-probes` (as `attach`'s for the same causes).
fn calibrate_exit_code(e: &CaptureError) -> i32 {
    match e {
        CaptureError::NotRoot => exit::NOT_ROOT,
        CaptureError::MissingTracepoint { .. }
        | CaptureError::Tracefs(_)
        | CaptureError::Load(_)
        | CaptureError::Program { .. } => exit::KERNEL,
        _ => exit::FAILURE,
    }
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
            .unwrap_or(if a.gpu_kernels == llmprof::cupti::KernelsMode::All {
                llmprof::capture::DEEP_RING_BYTES
            } else {
                llmprof::capture::DEFAULT_RING_BYTES
            }),
        verbose: a.verbose,
        otel: a.otel,
        gpu: llmprof::attach::gpu::GpuOptions {
            sample_interval: (!a.gpu_sample_interval.is_zero()).then_some(a.gpu_sample_interval),
            cuda: !a.no_cuda,
            cuda_calls: a.cuda_calls,
            kernels: a.gpu_kernels,
        },
        python_hooks: llmprof::pyhooks::PyHooksOptions {
            mode: a.python_hooks,
            ranges: a.py_ranges,
        },
        live_status: true,
        metadata: None,
        prelude: None,
        stop_reason: attach::StopReason::default(),
        calibrator: std::env::current_exe().ok(),
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
    let verbose = opts.verbose;
    llmprof::watchdog::arm(opts.duration, &STOP, exit::STUCK);
    match attach::run(&opts, &STOP) {
        Ok(r) => {
            print!("{}", attach::summary::render(&r, verbose));
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
                AttachError::PythonHooks(_) => exit::PYTHON_HOOKS,
                AttachError::Otel(_) => exit::USAGE,
                AttachError::Capture(_) => exit::FAILURE,
            }
        }
    }
}

fn run_serve(s: ServeArgs) -> i32 {
    use llmprof::serve::{self, ServeError, ServeOptions};
    let check_only = s.check_config;
    let mut cfg: serve::ServeConfig = s.into();
    cfg.calibrator = std::env::current_exe().ok();
    let opts = match ServeOptions::from_config(cfg) {
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
