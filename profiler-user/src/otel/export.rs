//! The export thread: batches finished spans and sends them with opentelemetry-otlp, over gRPC or HTTP.
//!
//! Owns the only blocking work of the OTel sink, on its own thread with a small current-thread tokio runtime. The
//! capture side hands over one request's spans at a time with a non-blocking `try_send` into a bounded channel
//! ([`QUEUE_REQUESTS`]); when it is full the spans are dropped and counted. Spans go out in batches of at most
//! [`MAX_BATCH_SPANS`], at the latest [`BATCH_DELAY`] after the first span of a batch arrived. Spans carry their
//! own ids and times, so they go straight to the exporter's `SpanExporter::export` as `SpanData` (no tracer, no
//! sampler). A failed export drops its batch (opentelemetry-otlp already retried it: 3 retries with backoff),
//! counts it, and prints one warning until an export succeeds again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry_http::hyper::HyperClient;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};

use super::OtelError;
use super::options::{ExportConfig, OtlpProtocol};
use super::tls::TlsMaterial;

/// Requests (each one's spans are one message) the queue between capture and export holds. At ~6 spans a request
/// this is ~6000 spans, three times the OTel batch processor's default queue (`OTEL_BSP_MAX_QUEUE_SIZE` = 2048).
pub const QUEUE_REQUESTS: usize = 1024;
/// Most spans per export request (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE` default of the OTel specification).
pub const MAX_BATCH_SPANS: usize = 512;
/// Longest a span waits for its batch to fill. Shorter than the OTel batch processor's 5 s default
/// (`OTEL_BSP_SCHEDULE_DELAY`) so spans of a live incident show up while someone is looking.
pub const BATCH_DELAY: Duration = Duration::from_secs(1);

/// Counters shared with the export thread.
#[derive(Debug, Default)]
struct Shared {
    exported: AtomicU64,
    failed: AtomicU64,
    export_errors: AtomicU64,
}

/// What the export thread did, read at the end of the session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportCounts {
    /// Spans the receiver accepted.
    pub exported: u64,
    /// Spans of failed export requests.
    pub failed: u64,
    /// Failed export requests.
    pub export_errors: u64,
    /// Whether the thread finished its last export before the deadline.
    pub completed: bool,
}

/// Handle of the export thread.
#[derive(Debug)]
pub struct ExportThread {
    tx: SyncSender<Vec<SpanData>>,
    shared: Arc<Shared>,
    done: Receiver<()>,
    thread: JoinHandle<()>,
}

impl ExportThread {
    /// Starts the thread and builds the exporter on it; returns once the exporter is ready (or failed to build).
    pub fn start(cfg: &ExportConfig, resource: Resource) -> Result<Self, OtelError> {
        let (tx, rx) = mpsc::sync_channel::<Vec<SpanData>>(QUEUE_REQUESTS);
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), OtelError>>();
        let (done_tx, done) = mpsc::channel::<()>();
        let shared = Arc::new(Shared::default());
        let cfg = cfg.clone();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("llmprof-otlp".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(OtelError::Runtime(e)));
                        return;
                    }
                };
                // tonic's lazy channel spawns its worker on the current runtime: build inside it.
                let exporter = runtime.block_on(async { build_exporter(&cfg) });
                let mut exporter = match exporter {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                exporter.set_resource(&resource);
                let _ = ready_tx.send(Ok(()));
                run(&runtime, &exporter, &rx, &thread_shared, &cfg.endpoint);
                let _ = exporter.shutdown_with_timeout(Duration::from_millis(100));
                let _ = done_tx.send(());
            })
            .map_err(OtelError::Runtime)?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                tx,
                shared,
                done,
                thread,
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(OtelError::ExportThreadDied),
        }
    }

    /// Hands one request's spans to the thread without blocking; gives them back when the queue is full.
    pub fn try_send(&self, spans: Vec<SpanData>) -> Result<(), Vec<SpanData>> {
        match self.tx.try_send(spans) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(v) | TrySendError::Disconnected(v)) => Err(v),
        }
    }

    /// Sends spans, waiting for queue room until `deadline` (used only at the end of the session).
    pub fn send_until(&self, mut spans: Vec<SpanData>, deadline: Instant) -> Result<(), Vec<SpanData>> {
        loop {
            match self.tx.try_send(spans) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Disconnected(v)) => return Err(v),
                Err(TrySendError::Full(v)) => {
                    if Instant::now() >= deadline {
                        return Err(v);
                    }
                    spans = v;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }

    /// Closes the queue, lets the thread export what it holds, and waits for it until `deadline`. A thread still
    /// exporting then is left behind (it ends with the process); what it had not exported counts as not exported.
    pub fn finish(self, deadline: Instant) -> ExportCounts {
        let Self {
            tx,
            shared,
            done,
            thread,
        } = self;
        drop(tx);
        let wait = deadline.saturating_duration_since(Instant::now());
        let completed = done.recv_timeout(wait).is_ok();
        if completed {
            let _ = thread.join();
        }
        ExportCounts {
            exported: shared.exported.load(Ordering::Relaxed),
            failed: shared.failed.load(Ordering::Relaxed),
            export_errors: shared.export_errors.load(Ordering::Relaxed),
            completed,
        }
    }
}

/// Builds the OTLP span exporter for the configured transport. Endpoint and protocol are always given
/// explicitly, so the `OTEL_EXPORTER_OTLP_*ENDPOINT`/`PROTOCOL` variables (already resolved by `options`) cannot
/// contradict them; headers, timeout and compression variables still apply.
fn build_exporter(cfg: &ExportConfig) -> Result<opentelemetry_otlp::SpanExporter, OtelError> {
    let builder = opentelemetry_otlp::SpanExporter::builder();
    // TLS material only for https: the files are read and checked here, before anything is attached.
    let tls = if cfg.endpoint.starts_with("https://") {
        Some(TlsMaterial::load(&cfg.tls)?)
    } else {
        None
    };
    let exporter = match cfg.protocol {
        OtlpProtocol::Grpc => {
            let b = builder
                .with_tonic()
                .with_endpoint(cfg.endpoint.clone())
                .with_protocol(Protocol::Grpc);
            match &tls {
                Some(t) => b.with_tls_config(t.grpc()).build(),
                None => b.build(),
            }
        }
        OtlpProtocol::Http => {
            let b = builder
                .with_http()
                .with_endpoint(cfg.endpoint.clone())
                .with_protocol(Protocol::HttpBinary);
            match &tls {
                Some(t) => b
                    .with_http_client(HyperClient::new(t.http_connector()?, export_timeout(), None))
                    .build(),
                None => b.build(),
            }
        }
    };
    exporter.map_err(|source| OtelError::Exporter {
        endpoint: cfg.endpoint.clone(),
        source,
    })
}

/// The exporter's request timeout: `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, `OTEL_EXPORTER_OTLP_TIMEOUT` (ms), else
/// the specification's 10 s (opentelemetry-otlp applies the same to the clients it builds itself).
fn export_timeout() -> Duration {
    ["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis)
}

/// The thread's loop: batch, export, count, until the queue is closed and drained.
fn run(
    runtime: &tokio::runtime::Runtime,
    exporter: &opentelemetry_otlp::SpanExporter,
    rx: &Receiver<Vec<SpanData>>,
    shared: &Shared,
    endpoint: &str,
) {
    let mut batch: Vec<SpanData> = Vec::new();
    let mut batch_deadline = Instant::now();
    let mut failing = false;
    let mut open = true;
    while open || !batch.is_empty() {
        let msg = if !open {
            Err(RecvTimeoutError::Disconnected)
        } else if batch.is_empty() {
            rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            rx.recv_timeout(batch_deadline.saturating_duration_since(Instant::now()))
        };
        match msg {
            Ok(spans) => {
                if batch.is_empty() {
                    batch_deadline = Instant::now() + BATCH_DELAY;
                }
                batch.extend(spans);
                if batch.len() < MAX_BATCH_SPANS {
                    continue;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => open = false,
        }
        while !batch.is_empty() {
            let take = batch.len().min(MAX_BATCH_SPANS);
            let rest = batch.split_off(take);
            let n = batch.len() as u64;
            let out = std::mem::replace(&mut batch, rest);
            match runtime.block_on(exporter.export(out)) {
                Ok(()) => {
                    shared.exported.fetch_add(n, Ordering::Relaxed);
                    if failing {
                        eprintln!("llmprof: OTLP export to {endpoint} works again");
                        failing = false;
                    }
                }
                Err(e) => {
                    shared.failed.fetch_add(n, Ordering::Relaxed);
                    shared.export_errors.fetch_add(1, Ordering::Relaxed);
                    if !failing {
                        eprintln!(
                            "llmprof: warning: OTLP export to {endpoint} failed ({e}); dropping spans until it \
                             answers (the trace file is not affected). Is the collector running there?"
                        );
                        failing = true;
                    }
                }
            }
            // Under MAX_BATCH_SPANS left and the queue still open: wait for more before the next export.
            if open && batch.len() < MAX_BATCH_SPANS {
                batch_deadline = Instant::now() + BATCH_DELAY;
                break;
            }
        }
    }
}
