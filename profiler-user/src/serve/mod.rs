//! `llmprof serve`: alert-triggered deep tracing. Alertmanager posts its webhook here; each firing alert is
//! resolved to a local process and traced like `llmprof attach` would, starting (with the flight recorder)
//! with the seconds before the alert.
//!
//! Modules, each owning one thing: [`webhook`] (the payload), [`target`] (alert → pid), [`manager`] (sessions,
//! dedupe, cooldown, cap, quota), [`quota`] (which traces to remove), [`flight`] (the flight recorder),
//! [`http`] (the API), [`auth`] (bearer token), [`metrics`] (serve's own counters). This file wires them: it
//! checks the options ([`ServeConfig`], what was asked, into [`ServeOptions`]), starts the recorders, the quota ticker and the HTTP server, and on Ctrl-C/SIGTERM/SIGHUP stops
//! the sessions (their traces are finished, not cut) before exiting. See docs/serve.md.

pub mod allow;
pub mod auth;
pub mod flight;
pub mod http;
pub mod listen;
pub mod manager;
pub mod metrics;
pub mod netns;
pub mod pull;
pub mod quota;
pub mod say;
pub mod target;
pub mod tls;
pub mod webhook;

#[cfg(test)]
mod fuzz_tests;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::attach::{AttachOptions, StopReason};
use crate::capture::Cidr;
use crate::otel::OtelOptions;
use allow::{AllowList, AllowRule};
use auth::Token;
use flight::FlightRecorder;
use manager::{Manager, ManagerConfig};
use metrics::Metrics;
use target::{ResolveConfig, TargetSpec};

/// Default listen address: loopback, port 9464 (next to the Prometheus exporter range).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";
/// Default `--max-trace-size` of each session: a long session of a busy server writes ~10 MiB/min
/// (docs/performance.md), so this holds tens of minutes while one session stays a fraction of a typical quota.
pub const DEFAULT_MAX_TRACE_SIZE: &str = "512MiB";
/// How long shutdown waits for running sessions to finish their traces.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(30);
/// Period of the quota check while sessions write.
const TICK: Duration = Duration::from_secs(1);

/// What `llmprof serve` was asked for, before any check: plain values (the binary builds it from the command
/// line; defaults are the command line's). [`ServeOptions::from_config`] checks it.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Address of the API.
    pub listen: SocketAddr,
    /// Directory for the traces.
    pub out_dir: PathBuf,
    /// File holding the bearer token (required: [`check`] refuses to run without one).
    pub token_file: Option<PathBuf>,
    /// Target of alerts without `pid` or `instance` labels.
    pub default_target: Option<TargetSpec>,
    /// Flight-recorder history (None: off).
    pub flight_recorder: Option<Duration>,
    /// Memory of all flight recorders together, bytes.
    pub flight_recorder_memory: usize,
    /// Targets the flight recorder keeps recording.
    pub watch: Vec<TargetSpec>,
    /// What else alerts may trace (`--allow-target`).
    pub allow_target: Vec<AllowRule>,
    /// HTTPS: the PEM certificate chain and key (both or neither).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// The pid namespace of `pid` labels, as a namespace file (None: serve's own).
    pub pid_namespace: Option<PathBuf>,
    /// Where `port:N` targets look for their listener.
    pub port_netns: target::PortNetns,
    /// Session length when the alert has no `llmprof_duration` annotation.
    pub duration: Duration,
    /// Longest session an annotation may ask for.
    pub max_duration: Duration,
    /// Most sessions at once (0 is taken as 1).
    pub max_sessions: usize,
    /// Quiet time per target after a session.
    pub cooldown: Duration,
    /// Disk quota of `out_dir`, bytes (None: unbounded).
    pub max_disk: Option<usize>,
    /// Largest webhook body, bytes.
    pub max_body: usize,
    /// Sessions record syscalls at least this slow individually.
    pub slow_syscall: Duration,
    /// Model-file patterns (empty: capture's defaults).
    pub model_paths: Vec<String>,
    /// Allowed egress networks as written (CIDR; empty: capture's defaults).
    pub egress_allow: Vec<String>,
    /// Kernel ring-buffer bytes of each session.
    pub ring_size: usize,
    /// Hard cap on each session's trace file, bytes.
    pub max_trace_size: usize,
    /// OpenTelemetry export of each session's request spans.
    pub otel: OtelOptions,
    /// Fleet mode: alerts pulled from Alertmanager (no URL: off).
    pub pull: pull::PullConfig,
    /// The `llmprof` binary that measures the probes' costs beside each session
    /// ([`AttachOptions::calibrator`]); None: no estimate.
    pub calibrator: Option<PathBuf>,
}

/// Everything `llmprof serve` is configured with, checked.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Listen address.
    pub listen: SocketAddr,
    /// The bearer token (None: [`check`] refuses to run).
    pub token: Option<Token>,
    /// HTTPS (None: plain HTTP).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Flight-recorder history (None: off).
    pub flight_recorder: Option<Duration>,
    /// Memory of all flight recorders together, bytes (split evenly between targets).
    pub flight_recorder_memory: usize,
    /// Targets the flight recorder keeps recording (the default target is added).
    pub watch: Vec<TargetSpec>,
    /// Largest webhook body, bytes.
    pub max_body: usize,
    /// Session rules and capture options.
    pub manager: ManagerConfig,
    /// Fleet mode: what to poll, checked (None: off).
    pub pull: Option<pull::Checked>,
}

/// Why serve cannot start. Messages say what to do next.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Not root.
    #[error(
        "llmprof serve needs root to load eBPF programs for its sessions: run it with sudo (or as the systemd unit in deploy/)"
    )]
    NotRoot,
    /// The output directory is unusable.
    #[error("cannot use the output directory {path}")]
    OutDir {
        /// The directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The token file is unusable.
    #[error(transparent)]
    Token(#[from] auth::TokenError),
    /// No token: on 127.0.0.1 too, any local user could download traces and start sessions.
    #[error(
        "refusing to listen on {0} without authentication: every local user can reach it (127.0.0.1 \
         included) and would download traces and start sessions. Create a token readable by root only \
         (`umask 077; openssl rand -hex 32 > /etc/llmprof/token`), pass --token-file /etc/llmprof/token, and \
         give Alertmanager the same token (http_config.authorization.credentials_file)"
    )]
    Insecure(SocketAddr),
    /// The address is taken or not local.
    #[error("cannot listen on {addr}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The options contradict each other.
    #[error("{0}")]
    Usage(String),
    /// The certificate or key is unusable.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The async runtime or a thread could not start.
    #[error("cannot start llmprof serve's runtime")]
    Runtime(#[source] std::io::Error),
}

impl ServeOptions {
    /// Checks what needs no privileges and reads the token file.
    pub fn from_config(s: ServeConfig) -> Result<ServeOptions, ServeError> {
        let egress = s
            .egress_allow
            .iter()
            .map(|c| {
                c.parse::<Cidr>()
                    .map_err(|e| ServeError::Usage(format!("--egress-allow {c}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let max_trace_size = s.max_trace_size as u64;
        llmprof_trace::sizecap::SizeCap::new(max_trace_size).map_err(ServeError::Usage)?;
        let token = s.token_file.as_deref().map(Token::from_file).transpose()?;
        let tls = s
            .tls
            .as_ref()
            .map(|(cert, key)| tls::server_config(cert, key))
            .transpose()?;
        // A bad endpoint or protocol would fail every session: refuse it now.
        s.otel
            .resolve()
            .map_err(|e| ServeError::Usage(crate::causes::one_line(&e)))?;
        let pull = if s.pull.urls.is_empty() {
            None
        } else {
            if !(pull::MIN_INTERVAL..=pull::MAX_INTERVAL).contains(&s.pull.interval) {
                return Err(ServeError::Usage(format!(
                    "--alertmanager-poll {:?}: between {:?} and {:?}",
                    s.pull.interval,
                    pull::MIN_INTERVAL,
                    pull::MAX_INTERVAL
                )));
            }
            Some(pull::Checked::new(&s.pull).map_err(ServeError::Usage)?)
        };
        let template = AttachOptions {
            pid: 0,
            // Sessions follow the target's process tree, like `llmprof attach` without `--no-children`.
            more_pids: Vec::new(),
            follow_children: true,
            duration: Some(s.duration),
            output: s.out_dir.clone(),
            slow_syscall: s.slow_syscall,
            model_patterns: s.model_paths,
            egress_allow: egress,
            metrics_url: None,
            ring_bytes: s.ring_size,
            verbose: false,
            otel: s.otel,
            // Sessions get the GPU layer's defaults (NVML every 100 ms, CUDA driver probes when libcuda is loaded).
            gpu: crate::attach::gpu::GpuOptions::default(),
            // The Python hooks' presets (vLLM's engine) in the targets the allow-list lets a session trace;
            // never a `--py-range`: nothing an alert says chooses what is hooked.
            python_hooks: crate::pyhooks::PyHooksOptions::default(),
            // Stack samples (with off-CPU stacks) and thread states as `llmprof attach` takes them by default.
            sample_hz: llmprof_abi::DEFAULT_SAMPLE_HZ,
            overhead_budget: None,
            thread_states: true,
            max_trace_size: Some(max_trace_size),
            live_status: false,
            metadata: None,
            prelude: None,
            stop_reason: StopReason::default(),
            http: crate::capture::wire::HttpPorts::All,
            calibrator: s.calibrator,
        };
        Ok(ServeOptions {
            listen: s.listen,
            token,
            tls,
            flight_recorder: s.flight_recorder,
            flight_recorder_memory: s.flight_recorder_memory,
            watch: s.watch.clone(),
            max_body: s.max_body,
            manager: ManagerConfig {
                out_dir: s.out_dir,
                resolve: ResolveConfig {
                    default: s.default_target,
                    pid_ns: s.pid_namespace.as_deref().map(pid_namespace_id).transpose()?,
                    port_netns: s.port_netns.clone(),
                },
                allow: AllowList::new(&s.allow_target, s.default_target, &s.watch),
                default_duration: s.duration,
                max_duration: s.max_duration,
                max_sessions: s.max_sessions.max(1),
                cooldown: s.cooldown,
                disk_quota: s.max_disk.map(|b| b as u64),
                template,
            },
            pull,
        })
    }
}

/// `pid:[INODE]` of a pid-namespace file (`/proc/N/ns/pid` or a bind mount of one).
fn pid_namespace_id(path: &Path) -> Result<String, ServeError> {
    use crate::sys::ns;
    ns::id_of_file(path, ns::Kind::Pid).map_err(|e| match e {
        ns::NsFileError::NotNamespace => ServeError::Usage(format!(
            "--pid-namespace {}: not a namespace file (use /proc/PID/ns/pid)",
            path.display()
        )),
        e => ServeError::Usage(format!("--pid-namespace {}: {e}", path.display())),
    })
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The flight recorder's targets: the default target and `--watch`, without repeats.
fn recorder_targets(opts: &ServeOptions) -> Vec<TargetSpec> {
    let mut out: Vec<TargetSpec> = Vec::new();
    for t in opts.manager.resolve.default.iter().chain(&opts.watch) {
        if !out.contains(t) {
            out.push(*t);
        }
    }
    out
}

/// The configuration mistakes [`run`] refuses before anything starts (the same with or without root):
/// what `llmprof serve --check-config` reports after [`ServeOptions::from_config`] (token file, certificate,
/// options) passed. Returns a one-line description of the configuration.
pub fn check(opts: &ServeOptions) -> Result<String, ServeError> {
    let targets = recorder_targets(opts);
    if opts.flight_recorder.is_some() && targets.is_empty() {
        return Err(ServeError::Usage(
            "--flight-recorder needs targets to record: add --watch port:N (or pid:N) or --default-target"
                .into(),
        ));
    }
    if opts.token.is_none() {
        return Err(ServeError::Insecure(opts.listen));
    }
    Ok(format!(
        "listen {}://{} ({}), traces in {}, {} allow rule(s){}{}",
        if opts.tls.is_some() { "https" } else { "http" },
        opts.listen,
        "bearer token",
        opts.manager.out_dir.display(),
        opts.manager.allow.len(),
        opts.flight_recorder.map_or(String::new(), |w| format!(
            ", flight recorder {w:?} on {} target(s)",
            targets.len()
        )),
        opts.pull.as_ref().map_or(String::new(), |p| format!(
            ", alerts pulled from {} every {:?}",
            p.cfg.urls.join(", "),
            p.cfg.interval
        ))
    ))
}

/// Runs serve until `stop` is set; running sessions are then stopped and their traces finished.
pub fn run(opts: ServeOptions, stop: &'static AtomicBool) -> Result<(), ServeError> {
    // Configuration mistakes first (the same with or without root), then privileges.
    check(&opts)?;
    let targets = recorder_targets(&opts);
    if !is_root() {
        return Err(ServeError::NotRoot);
    }
    let out = &opts.manager.out_dir;
    // Missing directories are created 0700; traces in it are 0600 whatever its mode (crate::files).
    crate::files::create_private_dir(out).map_err(|source| ServeError::OutDir {
        path: out.clone(),
        source,
    })?;
    let out = out.clone();
    let mut opts = opts;
    if opts.manager.disk_quota.is_none() {
        opts.manager.disk_quota = quota::default_quota(&out);
        if let Some(q) = opts.manager.disk_quota {
            eprintln!(
                "llmprof serve: disk quota of {} {} MiB (default: {} % of its filesystem, at most {} GiB; --max-disk to set)",
                out.display(),
                q >> 20,
                quota::DEFAULT_SHARE_PERCENT,
                quota::DEFAULT_CEILING >> 30
            );
        }
    }
    let out = &opts.manager.out_dir;
    let metrics = Arc::new(Metrics::default());
    let mut recorders = Vec::new();
    if let Some(window) = opts.flight_recorder {
        let per_target = opts.flight_recorder_memory / targets.len().max(1);
        for t in &targets {
            recorders.push(
                FlightRecorder::spawn(*t, window, per_target, &opts.manager.resolve.port_netns)
                    .map_err(ServeError::Runtime)?,
            );
            eprintln!(
                "llmprof serve: flight recorder on {t}: last {window:?}, at most {} KiB",
                per_target >> 10
            );
        }
    }
    if opts.manager.allow.is_empty() {
        eprintln!(
            "llmprof serve: no --default-target, --watch or --allow-target: every alert will be refused \
             (add --allow-target exe:/path/to/server, cgroup:/..., port:N or pid:N)"
        );
    }
    let manager = Arc::new(Manager::new(opts.manager.clone(), recorders, metrics.clone()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(opts.listen))
        .map_err(|source| ServeError::Bind {
            addr: opts.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(ServeError::Runtime)?;
    println!(
        "llmprof serve: listening on {}://{addr} (POST /v1/alerts, bearer token required); traces in {}",
        if opts.tls.is_some() { "https" } else { "http" },
        out.display()
    );
    let poller = match opts.pull.clone() {
        Some(p) => Some(pull::Poller::spawn(p, manager.clone(), out).map_err(ServeError::Runtime)?),
        None => None,
    };
    let ticker_stop = Arc::new(AtomicBool::new(false));
    let ticker = {
        let (m, s) = (manager.clone(), ticker_stop.clone());
        std::thread::Builder::new()
            .name("llmprof-serve-quota".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    m.enforce_quota();
                    m.reap();
                    std::thread::sleep(TICK);
                }
            })
            .map_err(ServeError::Runtime)?
    };
    let app = Arc::new(http::App {
        manager: manager.clone(),
        metrics: metrics.clone(),
        token: opts.token.clone(),
        max_body: opts.max_body,
    });
    let tls = opts.tls.clone();
    let served = rt.block_on(async move {
        let stopped = async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        listen::serve(
            listener,
            tls,
            http::router(app),
            listen::Limits::default(),
            metrics,
            stopped,
        )
        .await
    });
    eprintln!("llmprof serve: stopping; finishing the traces of running sessions");
    if let Some(p) = poller {
        p.stop();
    }
    manager.shutdown(SHUTDOWN_WAIT);
    ticker_stop.store(true, Ordering::Relaxed);
    let _ = ticker.join();
    manager.enforce_quota();
    served.map_err(ServeError::Runtime)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
pub(crate) mod tests {
    use super::*;

    /// A configuration with the command line's defaults.
    pub(super) fn config() -> ServeConfig {
        ServeConfig {
            listen: DEFAULT_LISTEN.parse().unwrap(),
            out_dir: "traces".into(),
            token_file: None,
            default_target: None,
            flight_recorder: None,
            flight_recorder_memory: 64 << 20,
            watch: Vec::new(),
            allow_target: Vec::new(),
            tls: None,
            pid_namespace: None,
            port_netns: target::PortNetns::Own,
            duration: Duration::from_secs(30),
            max_duration: Duration::from_secs(600),
            max_sessions: 2,
            cooldown: Duration::from_secs(300),
            max_disk: None,
            max_body: 1 << 20,
            slow_syscall: Duration::from_millis(1),
            model_paths: Vec::new(),
            egress_allow: Vec::new(),
            ring_size: 64 << 20,
            max_trace_size: 512 << 20,
            otel: OtelOptions::default(),
            pull: pull::PullConfig::default(),
            calibrator: None,
        }
    }

    #[test]
    fn every_session_gets_the_trace_size_cap() {
        let o = ServeOptions::from_config(ServeConfig {
            max_trace_size: 50 << 20,
            max_disk: Some(2 << 30),
            ..config()
        })
        .unwrap();
        assert_eq!(o.manager.template.max_trace_size, Some(50 << 20));
        assert_eq!(o.manager.disk_quota, Some(2 << 30));
        let Err(ServeError::Usage(e)) = ServeOptions::from_config(ServeConfig {
            max_trace_size: 1 << 10,
            ..config()
        }) else {
            panic!("a cap below the end of a trace is a usage error")
        };
        assert!(e.contains("too small"), "{e}");
    }

    #[test]
    fn session_options_come_from_the_config() {
        let mut c = config();
        c.otel.otlp_endpoint = Some("http://127.0.0.1:4317".into());
        c.egress_allow = vec!["10.0.0.0/8".into()];
        c.max_sessions = 0;
        let o = ServeOptions::from_config(c).unwrap();
        let t = &o.manager.template;
        assert_eq!(t.otel.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4317"));
        assert_eq!(t.egress_allow.len(), 1);
        assert!(!t.live_status);
        assert_eq!(o.manager.max_sessions, 1, "0 sessions is taken as 1");
        let bad_cidr = ServeConfig {
            egress_allow: vec!["nowhere".into()],
            ..config()
        };
        assert!(matches!(
            ServeOptions::from_config(bad_cidr),
            Err(ServeError::Usage(e)) if e.contains("--egress-allow")
        ));
        let mut bad_endpoint = config();
        bad_endpoint.otel.otlp_endpoint = Some("ftp://collector:4317".into());
        assert!(matches!(
            ServeOptions::from_config(bad_endpoint),
            Err(ServeError::Usage(e)) if e.contains("invalid OTLP endpoint")
        ));
    }
}
