//! The `llmprof` command line: subcommands and options (durations and sizes are parsed by `llmprof_units`).
//!
//! Owns the user-facing surface only (help texts with examples, defaults) and turns what it parsed into the plain
//! options of the library modules (e.g. [`crate::serve::ServeConfig`]); the work is in [`crate::attach`],
//! [`crate::serve`], [`crate::doctor`] and [`crate::open`], which never import this module (save
//! `serve::manager`'s use of [`parse_duration`] for alert annotations, until one shared duration parser replaces
//! it). Exit codes are in [`crate::exit`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

const ABOUT: &str = "Attach to an LLM inference server and record a Perfetto trace of its engine steps, requests, \
syscalls, model-file I/O and network egress (eBPF, no restart of the server).";

const AFTER_HELP: &str = "Examples:
  sudo llmprof attach --pid $(pgrep llmserve) -d 30s -o incident.perfetto-trace
  llmprof open incident.perfetto-trace
  sudo llmprof serve --out-dir traces --token-file /etc/llmprof/token --watch port:8000   # for Alertmanager

Exit codes: 0 ok, 1 failure, 2 usage, 3 not root, 4 no such process, 5 kernel lacks a needed feature,
6 engine probe ABI mismatch, 7 cannot write the trace, 8 --gpu-kernels on cannot record kernels,
9 the session did not end within its duration plus a grace (something it reads is stuck),
10 --py-range: no traced process took the Python hooks.";

/// A session length: a duration of more than zero (a zero-length session would record nothing and report an
/// overhead measured over no time).
fn parse_session_length(s: &str) -> Result<Duration, String> {
    let d = llmprof_units::parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err(
            "a session must last more than zero (e.g. 30s); leave -d out to trace until Ctrl-C".into(),
        );
    }
    Ok(d)
}

/// `llmprof`.
#[derive(Debug, Parser)]
#[command(name = "llmprof", version, about = ABOUT, after_help = AFTER_HELP)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Attach to a running server and write a Perfetto trace (needs root).
    #[command(after_help = "Examples:
  sudo llmprof attach --pid 1234                       # until Ctrl-C, llmprof-1234-<time>.perfetto-trace
  sudo llmprof attach --pid 1234 -d 30s -o incident.perfetto-trace
  sudo llmprof attach --pid 1234 --slow-syscall 500us --model-path '/models/*' --egress-allow 10.0.0.0/8
  sudo llmprof attach --pid 1234 --metrics-url http://127.0.0.1:8000/metrics
  sudo llmprof attach --pid $(pgrep -f vllm) --gpu-sample-interval 50ms    # any CUDA process: NVML + libcuda
  sudo llmprof attach --pid 1234 --overhead-budget 1% --max-trace-size 50M
  sudo llmprof attach --pid $(pgrep -of 'vllm serve')  # the API server, its engine core and TP workers
  sudo llmprof attach --pid 1234 --pid 5678 --no-children   # exactly these two processes

A --pid covers the process, its descendants and every process started while tracing (each with all its threads,
picked up in the kernel at fork, so a child is traced from its first instruction); each process is its own track,
named by its command line. Ends on Ctrl-C / SIGTERM / SIGHUP, when the duration elapsed, when every traced process
exited, or when --max-trace-size is reached; the trace is finished cleanly in every case. Open it with `llmprof open FILE`.
Every trace accounts for llmprof itself: per-probe hits, events and drops, the cost per hit measured at
start-up (CUDA driver calls included), the estimated CPU added to the target, llmprof's own CPU and memory (counter tracks and summary).")]
    Attach(Box<AttachArgs>),
    /// Serve a trace to Perfetto UI (https://ui.perfetto.dev) from 127.0.0.1 and print the link.
    #[command(after_help = "Examples:
  llmprof open incident.perfetto-trace
  llmprof open incident.perfetto-trace --port 9002

Serves the file once (exits after the UI fetched it, or on Ctrl-C). Open the printed link in a browser on
this machine (or forward the port: ssh -L 9001:127.0.0.1:9001 HOST).")]
    Open(OpenArgs),
    /// Check what this host allows: privileges, kernel, tracepoints, uprobes (measured), BTF, GPU libraries.
    #[command(after_help = "Examples:
  sudo llmprof doctor                  # one line per check: ok / warn / FAIL, with the fix
  sudo llmprof doctor --pid 1234       # also: the target exists, its probe ABI, its engine probes
  sudo llmprof doctor --json | jq '.[] | select(.status != \"ok\")'

As root it runs a short capture of llmprof itself: ns per engine probe call detached and attached (the
patched probe's first byte tells the optimized NOP5 path, a call, from the int3 trap) and ns per syscall.
Exit codes: 0 ready to attach (warnings allowed); otherwise the first failure's: 3 not root,
4 no such process, 5 kernel lacks a needed feature, 6 engine probe ABI mismatch.")]
    Doctor(DoctorArgs),
    /// Summarize a trace: TTFT decomposition, ITL, steps, KV cache, syscalls, model files, egress, drops, GPU.
    #[command(after_help = "Examples:
  llmprof report incident.perfetto-trace
  llmprof report incident.perfetto-trace --json | jq '.requests.ttft_ms'
  llmprof report incident.perfetto-trace --json | jq '.gpu.cuda.functions[:3]'

Reads the files `llmprof attach` writes (no trace processor needed); exits 1 with a clear message when the
file is not one. The --json fields are listed at the top of profiler-user/src/report.rs (`cargo doc`).")]
    Report(ReportArgs),
    /// Alert-triggered tracing: receive Alertmanager webhooks and trace the alerting process (needs root).
    #[command(after_help = "Examples:
  sudo llmprof serve --out-dir /var/lib/llmprof/traces --token-file /etc/llmprof/token
  sudo llmprof serve --out-dir traces --token-file /etc/llmprof/token --watch port:8000 --flight-recorder 30s --max-disk 2GiB
  curl -H \"Authorization: Bearer $(cat /etc/llmprof/token)\" 127.0.0.1:9464/v1/sessions

Each firing alert of POST /v1/alerts (Alertmanager webhook, payload version 4) is traced like `llmprof attach`:
the target is the alert's `pid` label, else the local process listening on its `instance` label's port, else
--default-target; the length is its `llmprof_duration` annotation, else --duration. With --flight-recorder
the trace starts with the seconds before the alert. Rules, routing and units for Prometheus, Alertmanager,
systemd and Kubernetes are in deploy/; the API is in docs/serve.md.")]
    Serve(Box<ServeArgs>),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    #[command(after_help = "Examples:
  llmprof completions bash > /usr/share/bash-completion/completions/llmprof
  llmprof completions zsh > /usr/share/zsh/vendor-completions/_llmprof
  llmprof completions fish > /usr/share/fish/vendor_completions.d/llmprof.fish")]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write the man pages (llmprof.1 and one per subcommand) into DIR (packaging: `cargo xtask dist`).
    #[command(hide = true)]
    Manpages {
        /// Directory to write the pages into (created if missing).
        dir: PathBuf,
    },
    /// Time llmprof's probes on this process with an instance of the programs of its own and print the
    /// costs as one JSON line (what `attach` runs beside a session once its probes are live; needs root).
    #[command(name = "calibrate-probes", hide = true)]
    CalibrateProbes(CalibrateArgs),
}

/// `llmprof calibrate-probes`: which probes to time (those the session attaches).
#[derive(Args, Debug, Clone, Default)]
pub struct CalibrateArgs {
    /// The engine's range probe.
    #[arg(long)]
    pub engine: bool,
    /// The CUDA driver probes.
    #[arg(long)]
    pub cuda: bool,
    /// Thread-state records.
    #[arg(long)]
    pub thread_states: bool,
    /// The stack sampler and off-CPU stacks.
    #[arg(long)]
    pub sample: bool,
    /// The HTTP wire probe.
    #[arg(long)]
    pub http: bool,
    /// `getppid` untraced, ns, as the session measured it before its programs were attached.
    #[arg(long, requires = "untraced_decoded_ns")]
    pub untraced_ns: Option<f64>,
    /// `close(-1)` untraced, ns (with --untraced-ns).
    #[arg(long, requires = "untraced_ns")]
    pub untraced_decoded_ns: Option<f64>,
}

/// `--sample-rate`: 1 to [`crate::capture::stacks::MAX_SAMPLE_HZ`] Hz.
fn parse_sample_rate(s: &str) -> Result<u64, String> {
    let max = crate::capture::stacks::MAX_SAMPLE_HZ;
    match s.parse::<u64>() {
        Ok(hz) if (1..=max).contains(&hz) => Ok(hz),
        _ => Err(format!(
            "expected a rate in Hz from 1 to {max} (e.g. 99); use --no-sample to turn sampling off"
        )),
    }
}

/// Options of `llmprof attach`.
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// Process id of the server to trace (repeatable). Its descendants are traced too: those alive at attach
    /// and every process started while tracing, from its first instruction (see --no-children).
    #[arg(short, long, required = true)]
    pub pid: Vec<u32>,
    /// Trace only the --pid processes themselves, not the processes they start.
    #[arg(long)]
    pub no_children: bool,
    /// Stop after this long (e.g. 30s, 500ms, 2m; more than zero); default: until Ctrl-C or the target exits.
    #[arg(short, long, value_parser = parse_session_length)]
    pub duration: Option<Duration>,
    /// Trace file to write (default: llmprof-<pid>-<timestamp>.perfetto-trace).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Record syscalls at least this slow individually (others are aggregated in the kernel).
    #[arg(long, default_value = "1ms", value_parser = llmprof_units::parse_duration)]
    pub slow_syscall: Duration,
    /// Model-file pattern to track (repeatable; default: *.gguf *.safetensors *.bin *.pt *.pth).
    #[arg(long = "model-path", value_name = "PATTERN")]
    pub model_paths: Vec<String>,
    /// Allowed egress network (repeatable; default: loopback and RFC 1918); other connects are flagged.
    #[arg(long = "egress-allow", value_name = "CIDR")]
    pub egress_allow: Vec<String>,
    /// Prometheus endpoint of the server (default: discover the target's listening port and try /metrics).
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// Ring-buffer size (default 16MiB, 64MiB with --gpu-kernels all): larger absorbs bigger bursts without
    /// drops, and adds twice its size to llmprof's RSS (the kernel maps the ring's pages twice).
    #[arg(long, value_parser = llmprof_units::parse_size_usize)]
    pub ring_size: Option<usize>,
    /// A longer exit summary: per-probe counters, the calibrated costs, the GPU layer, symbolization.
    #[arg(short, long)]
    pub verbose: bool,
    /// GPU counter sampling period through NVML (utilization, memory, power, SM clock, temperature, PCIe,
    /// the target's GPU memory); 0 turns the counters off.
    #[arg(long, default_value = "100ms", value_parser = llmprof_units::parse_duration)]
    pub gpu_sample_interval: Duration,
    /// Do not attach uprobes to the CUDA driver API in the target's libcuda (kernel launches, copies,
    /// allocations, synchronize calls).
    #[arg(long)]
    pub no_cuda: bool,
    /// How the CUDA driver calls are probed: `counted` counts kernel launches and asynchronous copies in the
    /// kernel (an entry-only uprobe: per thread, engine step or 10 ms window) and times only the calls that
    /// block the host (synchronize, blocking copies, alloc/free); `all` times every call (entry + return
    /// uprobe pair: several µs per launch).
    #[arg(long, value_enum, default_value_t = crate::cuda::CudaCalls::Counted, conflicts_with = "no_cuda")]
    pub cuda_calls: crate::cuda::CudaCalls,
    /// GPU kernels: load llmprof's CUPTI helper into each process of the traced tree that uses CUDA
    /// (ptrace + dlopen, one thread stopped for a moment; a process that loads CUDA later gets it then). auto
    /// and on record kernel summaries (per 100 ms window: count and GPU time per kernel name, copy and wait;
    /// the GPU's busy intervals with their top kernel; CUDA graph launches as a whole): auto when libcuda is
    /// loaded and the helper is installed, on or refuse (exit code 8). all: every kernel, copy and wait as its
    /// own slice, graphs node by node, with the launching calls (the deep mode: costs more). off: never touch
    /// the target.
    #[arg(long, value_enum, default_value_t = crate::cupti::KernelsMode::Auto, value_name = "MODE")]
    pub gpu_kernels: crate::cupti::KernelsMode,
    /// Python hooks: load llmprof's Python-hooks helper into the traced CPython processes that run vLLM (its
    /// engine steps, request phases, preemptions and KV-cache use become the tracks llmserve's probes give;
    /// ptrace + dlopen, then the helper installs wrappers from a thread of its own holding the interpreter's
    /// lock; every wrapper is removed at the end). With --py-range, every traced CPython process gets it.
    /// off: never touch the target.
    #[arg(long, value_enum, default_value_t = crate::pyhooks::PyHooksMode::Auto, value_name = "MODE")]
    pub python_hooks: crate::pyhooks::PyHooksMode,
    /// A range (a slice on the calling thread) around every call of a Python function, e.g.
    /// `vllm.v1.engine.core:EngineCore.step` (repeatable): MODULE as imported by the target, QUALNAME a
    /// function, method, static or class method in it. Coroutine and generator functions are refused.
    #[arg(long = "py-range", value_name = "MODULE:QUALNAME", value_parser = crate::pyhooks::parse_range)]
    pub py_ranges: Vec<String>,
    /// Follow HTTP/1.1 requests on this listening port of the target (repeatable; default: every TCP port it
    /// listens on). Requests become `http request N` tracks with wire TTFT and inter-token latency.
    #[arg(long = "http-port", value_name = "PORT")]
    pub http_ports: Vec<u16>,
    /// Do not follow HTTP requests on the target's listening sockets.
    #[arg(long, conflicts_with = "http_ports")]
    pub no_http: bool,
    /// Do not record thread states (sched_switch / sched_waking of the target's threads: the Running,
    /// Runnable, Sleeping rows in Perfetto and the thread-state section of `llmprof report`).
    #[arg(long)]
    pub no_thread_states: bool,
    /// On-CPU stack samples per second on each CPU (software CPU clock, so it works in VMs): kernel and user
    /// frames of the traced threads, symbolized, as Perfetto callstack samples (flame graphs). With thread
    /// states, each blocking sleep also gets the stack it blocked in (the state's "Blocked function").
    #[arg(long, value_name = "HZ", default_value_t = llmprof_abi::DEFAULT_SAMPLE_HZ, value_parser = parse_sample_rate)]
    pub sample_rate: u64,
    /// Take no stack samples (and no off-CPU stacks).
    #[arg(long)]
    pub no_sample: bool,
    /// Keep llmprof's estimated cost to the target under this share of the target's CPU time (e.g. 1%):
    /// when exceeded, trace less, in a documented order (syscall events, then ranges sampled, then thread
    /// states stopped, then CUDA driver probes detached, then per-SSE wire records, then syscall tracepoints
    /// detached, then ranges detached, then the stack sample rate halved, then sampling stopped; steps and
    /// requests are kept). Default: no budget.
    #[arg(long, value_name = "PERCENT", value_parser = crate::budget::parse_percent)]
    pub overhead_budget: Option<f64>,
    /// Hard cap on the trace file (e.g. 50M, 1GiB): when reached, the trace ends cleanly, with a marker
    /// saying so, and attach exits 0. Default: no cap.
    #[arg(long, value_name = "SIZE", value_parser = llmprof_units::parse_size_usize)]
    pub max_trace_size: Option<usize>,
    /// OpenTelemetry export of per-request spans (OTLP).
    #[command(flatten)]
    pub otel: crate::otel::OtelOptions,
}

/// Options of `llmprof serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the API (loopback by default; every address needs --token-file).
    #[arg(long, default_value = crate::serve::DEFAULT_LISTEN)]
    pub listen: std::net::SocketAddr,
    /// Directory for the traces (created if missing).
    #[arg(long)]
    pub out_dir: PathBuf,
    /// File holding the bearer token every /v1 request must carry (Alertmanager: http_config.authorization);
    /// required: on 127.0.0.1 too, every local user could otherwise use the API. Root's, mode 600.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Target of alerts without `pid` or `instance` labels: pid:N or port:N.
    #[arg(long, value_name = "TARGET")]
    pub default_target: Option<crate::serve::target::TargetSpec>,
    /// Keep this many seconds of history of the watched targets (e.g. 30s); alert traces start with it.
    #[arg(long, value_name = "DURATION", value_parser = llmprof_units::parse_duration)]
    pub flight_recorder: Option<Duration>,
    /// Memory of the flight recorder, all targets together (its ring evicts the oldest events beyond it).
    #[arg(long, default_value = "64MiB", value_parser = llmprof_units::parse_size_usize)]
    pub flight_recorder_memory: usize,
    /// A target the flight recorder keeps recording: pid:N or port:N (repeatable; the default target is too).
    #[arg(long, value_name = "TARGET")]
    pub watch: Vec<crate::serve::target::TargetSpec>,
    /// What else an alert may trace besides the default and watched targets (repeatable): exe:/path/to/binary,
    /// exe:/dir/ (anything under it), cgroup:/prefix (a container or pod), port:N or pid:N. Nothing else is
    /// ever traced; pid 1 and serve itself never.
    #[arg(long = "allow-target", value_name = "RULE")]
    pub allow_target: Vec<crate::serve::allow::AllowRule>,
    /// The pid namespace the alerts' `pid` labels are read in, as a namespace file (e.g. /proc/1/ns/pid for
    /// the host's; default: serve's own, which is the host's under the DaemonSet's hostPID).
    #[arg(long, value_name = "NSFILE")]
    pub pid_namespace: Option<PathBuf>,
    /// Where port:N targets (default target, --watch, --allow-target) look for their listener: `own` (serve's
    /// network namespace, the host's for the unit and the DaemonSet's hostNetwork), `root` (also every
    /// namespace root made: a container runtime's pods), or a namespace file (/run/netns/NAME). A namespace a
    /// user made inside a user namespace of their own is never looked in.
    #[arg(long, value_name = "own|root|NSFILE", default_value = "own")]
    pub port_netns: crate::serve::target::PortNetns,
    /// Serve the API over HTTPS with this PEM certificate chain (with --tls-key).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Session length when the alert has no `llmprof_duration` annotation.
    #[arg(long, default_value = "30s", value_parser = llmprof_units::parse_duration)]
    pub duration: Duration,
    /// Longest session an annotation may ask for.
    #[arg(long, default_value = "10m", value_parser = llmprof_units::parse_duration)]
    pub max_duration: Duration,
    /// Most sessions at once (alerts beyond it start nothing).
    #[arg(long, default_value_t = 2)]
    pub max_sessions: usize,
    /// Quiet time per target after a session (and per fingerprint after a failed one).
    #[arg(long, default_value = "5m", value_parser = llmprof_units::parse_duration)]
    pub cooldown: Duration,
    /// Disk quota of --out-dir (e.g. 2GiB): the oldest finished traces are removed first.
    #[arg(long, value_name = "SIZE", value_parser = llmprof_units::parse_size_usize)]
    pub max_disk: Option<usize>,
    /// Largest webhook body accepted.
    #[arg(long, default_value = "1MiB", value_parser = llmprof_units::parse_size_usize)]
    pub max_body: usize,
    /// Sessions record syscalls at least this slow individually.
    #[arg(long, default_value = "1ms", value_parser = llmprof_units::parse_duration)]
    pub slow_syscall: Duration,
    /// Model-file pattern to track (repeatable; default as `attach`).
    #[arg(long = "model-path", value_name = "PATTERN")]
    pub model_paths: Vec<String>,
    /// Allowed egress network (repeatable; default: loopback and RFC 1918).
    #[arg(long = "egress-allow", value_name = "CIDR")]
    pub egress_allow: Vec<String>,
    /// Kernel ring-buffer size of each session.
    #[arg(long, default_value = "64MiB", value_parser = llmprof_units::parse_size_usize)]
    pub ring_size: usize,
    /// Hard cap on each session's trace file (as `attach --max-trace-size`): the trace ends cleanly with a
    /// marker when reached, so one session cannot fill --max-disk on its own.
    #[arg(long, value_name = "SIZE", default_value = crate::serve::DEFAULT_MAX_TRACE_SIZE, value_parser = llmprof_units::parse_size_usize)]
    pub max_trace_size: usize,
    /// OpenTelemetry export of each session's request spans (OTLP).
    #[command(flatten)]
    pub otel: crate::otel::OtelOptions,
    /// Fleet mode: pull alerts from this Alertmanager (http[s]://HOST:PORT[/PREFIX]; repeatable for an HA
    /// cluster: the first that answers counts) and trace only those whose target is on this node and allowed.
    #[arg(long = "alertmanager-url", value_name = "URL")]
    pub alertmanager_urls: Vec<String>,
    /// How often to ask Alertmanager for its alerts (1s to 5m).
    #[arg(long, value_name = "DURATION", default_value = crate::serve::pull::DEFAULT_INTERVAL, value_parser = llmprof_units::parse_duration)]
    pub alertmanager_poll: Duration,
    /// File holding the Authorization header value for Alertmanager (a lone token is sent as `Bearer TOKEN`;
    /// root's, mode 600).
    #[arg(long, value_name = "FILE")]
    pub alertmanager_auth_file: Option<PathBuf>,
    /// PEM certificates trusted besides the system roots for https:// --alertmanager-url (a private CA).
    #[arg(long, value_name = "PEM")]
    pub alertmanager_ca_cert: Option<PathBuf>,
    /// Alertmanager matcher the pulled alerts must match (repeatable; default: llmprof="trace").
    #[arg(long = "alertmanager-filter", value_name = "MATCHER")]
    pub alertmanager_filters: Vec<String>,
    /// Check the configuration (options, token file, certificate) and exit: 0 when serve would start with
    /// it, 2 with the reason otherwise. Needs no root and starts nothing.
    #[arg(long)]
    pub check_config: bool,
}

/// Options of `llmprof doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Also check this target: it exists, its probe ABI version, whether it exports the engine probes.
    #[arg(short, long)]
    pub pid: Option<u32>,
    /// A JSON array of {check, status, detail, fix, measured} instead of text.
    #[arg(long)]
    pub json: bool,
}

impl From<ServeArgs> for crate::serve::ServeConfig {
    fn from(s: ServeArgs) -> Self {
        crate::serve::ServeConfig {
            listen: s.listen,
            out_dir: s.out_dir,
            token_file: s.token_file,
            default_target: s.default_target,
            flight_recorder: s.flight_recorder,
            flight_recorder_memory: s.flight_recorder_memory,
            watch: s.watch,
            allow_target: s.allow_target,
            tls: s.tls_cert.zip(s.tls_key),
            pid_namespace: s.pid_namespace,
            port_netns: s.port_netns,
            duration: s.duration,
            max_duration: s.max_duration,
            max_sessions: s.max_sessions,
            cooldown: s.cooldown,
            max_disk: s.max_disk,
            max_body: s.max_body,
            slow_syscall: s.slow_syscall,
            model_paths: s.model_paths,
            egress_allow: s.egress_allow,
            ring_size: s.ring_size,
            max_trace_size: s.max_trace_size,
            otel: s.otel,
            calibrator: None,
            pull: crate::serve::pull::PullConfig {
                urls: s.alertmanager_urls,
                interval: s.alertmanager_poll,
                auth_file: s.alertmanager_auth_file,
                ca_file: s.alertmanager_ca_cert,
                filters: if s.alertmanager_filters.is_empty() {
                    vec![crate::serve::pull::DEFAULT_FILTER.to_owned()]
                } else {
                    s.alertmanager_filters
                },
            },
        }
    }
}

/// Options of `llmprof report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The trace file (written by `llmprof attach`).
    pub trace: PathBuf,
    /// One JSON document (stable layout, "format": "llmprof-report/1") instead of the text report.
    #[arg(long)]
    pub json: bool,
}

/// Options of `llmprof open`.
#[derive(Debug, Args)]
pub struct OpenArgs {
    /// The trace file.
    pub trace: PathBuf,
    /// Port on 127.0.0.1 (Perfetto UI accepts 9001 by default).
    #[arg(long, default_value_t = crate::open::DEFAULT_PORT)]
    pub port: u16,
}

#[cfg(test)]
#[path = "cli_fuzz_tests.rs"]
mod fuzz_tests;

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_valid_and_parses_the_readme_example() {
        Cli::command().debug_assert();
        let c = Cli::try_parse_from(["llmprof", "attach", "--pid", "12", "-d", "30s", "-o", "x.pftrace"])
            .unwrap();
        let Command::Attach(a) = c.command else {
            panic!("attach")
        };
        assert_eq!(a.pid, vec![12]);
        assert_eq!(a.duration, Some(Duration::from_secs(30)));
        assert_eq!(a.slow_syscall, Duration::from_millis(1));
        assert_eq!(a.ring_size, None);
        assert_eq!(a.gpu_sample_interval, Duration::from_millis(100));
        assert!(!a.no_cuda);
    }

    #[test]
    fn a_zero_length_session_is_a_usage_error() {
        for d in ["0s", "0ms"] {
            let e = Cli::try_parse_from(["llmprof", "attach", "--pid", "12", "-d", d]).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{d}");
            assert!(e.to_string().contains("more than zero"), "{e}");
        }
    }

    #[test]
    fn serve_parses_the_help_example() {
        let c = Cli::try_parse_from([
            "llmprof",
            "serve",
            "--out-dir",
            "traces",
            "--watch",
            "port:8000",
            "--flight-recorder",
            "30s",
            "--max-disk",
            "2GiB",
        ])
        .unwrap();
        let Command::Serve(s) = c.command else {
            panic!("serve")
        };
        assert_eq!(s.listen.to_string(), "127.0.0.1:9464");
        assert_eq!(s.watch, vec![crate::serve::target::TargetSpec::Port(8000)]);
        assert_eq!(s.flight_recorder, Some(Duration::from_secs(30)));
        assert_eq!(s.max_disk, Some(2 << 30));
        assert_eq!(s.max_trace_size, 512 << 20, "the documented default");
        assert!(Cli::try_parse_from(["llmprof", "serve", "--out-dir", "t", "--watch", "8000"]).is_err());
    }

    #[test]
    fn serve_options_come_from_the_command_line() {
        use crate::serve::{ServeError, ServeOptions};
        let options = |args: &[&str]| {
            let cli =
                Cli::try_parse_from(["llmprof", "serve", "--out-dir", "traces"].iter().chain(args)).unwrap();
            let Command::Serve(s) = cli.command else {
                panic!("serve")
            };
            ServeOptions::from_config((*s).into())
        };
        let o = options(&[]).unwrap();
        assert_eq!(
            o.manager.template.max_trace_size,
            Some(512 << 20),
            "the documented default"
        );
        assert_eq!(o.manager.out_dir, PathBuf::from("traces"));
        let o = options(&[
            "--max-trace-size",
            "50M",
            "--max-disk",
            "2GiB",
            "--otlp-endpoint",
            "http://127.0.0.1:4317",
            "--egress-allow",
            "10.0.0.0/8",
            "--slow-syscall",
            "5ms",
            "--ring-size",
            "8MiB",
            "--model-path",
            "*.gguf",
            "--max-sessions",
            "3",
        ])
        .unwrap();
        let t = &o.manager.template;
        assert_eq!(t.max_trace_size, Some(50 << 20));
        assert_eq!(o.manager.disk_quota, Some(2 << 30));
        assert_eq!(t.otel.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4317"));
        assert_eq!(t.egress_allow.len(), 1);
        assert_eq!(t.slow_syscall, Duration::from_millis(5));
        assert_eq!(t.ring_bytes, 8 << 20);
        assert_eq!(t.model_patterns, ["*.gguf"]);
        assert_eq!(o.manager.max_sessions, 3);
        assert!(matches!(
            options(&["--egress-allow", "nowhere"]),
            Err(ServeError::Usage(e)) if e.contains("--egress-allow")
        ));
    }
}
