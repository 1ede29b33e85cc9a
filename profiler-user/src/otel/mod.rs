//! OTel sink: one OpenTelemetry span per engine request, joined to the caller's trace, exported over OTLP.
//!
//! Owns the conversion of the decoded event stream into spans following the GenAI semantic conventions and their
//! export; it is a pure consumer of [`Event`]s and never touches the kernel or the trace file. Parts:
//! - [`options`]: `--otlp-endpoint` / `--otlp-protocol` / `--capture-content` and the standard `OTEL_*` variables.
//! - [`builder`] (`llmprof_trace::otel`, pure, tested from fixtures): a `{operation} {model}` span per request from
//!   its `RequestTimeline`, children `queue`, `prefill` (one per chunk), `decode`, `preempted`, and span events
//!   for slow syscalls, model-file I/O and flagged egress on the engine's threads.
//! - [`WallClock`] (`llmprof_trace::clock`): BOOTTIME → wall clock, one offset sampled at start.
//! - [`resource`]: service, host, process and GPU attributes.
//! - `export`: the export thread (bounded queue, batches, opentelemetry-otlp over gRPC or HTTP).
//!
//! [`OtelSink::push`] runs on the capture thread: it updates the state machine and, when a request finishes,
//! hands its spans to the export thread with a non-blocking `try_send`; if the queue is full they are dropped and
//! counted. It never waits on the network. [`OtelSink::finish`] ends still-open requests (marked
//! `llmprof.unfinished`), flushes, and waits at most [`FINISH_TIMEOUT`] for the receiver.
//!
//! Parenting: a request that arrived with a W3C `traceparent` becomes a child (kind SERVER) of the caller's span,
//! in the caller's trace, with the caller's trace flags; without one it starts a new trace. Spans are exported
//! whatever the caller's sampled flag says: the user asked llmprof to trace.
//!
//! Content: spans carry token counts and timings, never prompt or completion text unless `--capture-content` is
//! given (then the engine's content probe is attached and spans get `gen_ai.input/output.messages`).

mod export;
pub mod options;
pub mod resource;
pub mod tls;

use std::time::{Duration, Instant};

use opentelemetry_sdk::trace::SpanData;

pub use llmprof_trace::clock::WallClock;
pub use llmprof_trace::otel::{SpanBuilder, builder, semconv};
pub use options::{ExportConfig, OtelOptions, OtlpProtocol};
pub use resource::ResourceInfo;

use export::ExportThread;
use llmprof_trace::event::Event;

/// Longest [`OtelSink::finish`] waits for the last spans to be exported; past it, what is not exported is
/// counted as dropped and the session ends anyway (a collector that does not answer must not hold up a trace).
pub const FINISH_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the OTel sink could not start.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    /// The endpoint is not an `http://` or `https://` URL with a valid port.
    #[error("invalid OTLP endpoint {url:?}: {reason} (example: http://127.0.0.1:4317)")]
    InvalidEndpoint {
        /// The endpoint as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` names a protocol llmprof does not speak.
    #[error("unsupported OTLP protocol {0:?}: use grpc or http/protobuf")]
    InvalidProtocol(String),
    /// A TLS file (CA, client certificate or key) is missing or malformed.
    #[error("OTLP TLS file {path}: {reason}")]
    Tls {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// rustls refused the TLS configuration.
    #[error("cannot set up TLS to the OTLP endpoint: {0}")]
    TlsSetup(String),
    /// opentelemetry-otlp refused the configuration.
    #[error("cannot set up the OTLP exporter for {endpoint}")]
    Exporter {
        /// The endpoint.
        endpoint: String,
        /// The exporter's error.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// The export thread or its runtime could not be started.
    #[error("cannot start the OTLP export thread")]
    Runtime(#[source] std::io::Error),
    /// The export thread ended before it was ready.
    #[error("the OTLP export thread ended unexpectedly")]
    ExportThreadDied,
    /// The clocks could not be read.
    #[error("cannot read CLOCK_REALTIME/CLOCK_BOOTTIME")]
    Clock(#[source] std::io::Error),
}

/// What the OTel sink did in a session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OtelStats {
    /// Spans built (requests and their children).
    pub spans_built: u64,
    /// Spans the receiver accepted.
    pub spans_exported: u64,
    /// Spans not exported: queue full, export failed, or still pending when [`FINISH_TIMEOUT`] ran out.
    pub spans_dropped: u64,
    /// Of the dropped spans, those dropped because the export queue was full.
    pub spans_dropped_queue_full: u64,
    /// Failed export requests (each dropped a batch).
    pub export_errors: u64,
    /// Requests not tracked because too many were open at once (see [`builder::MAX_OPEN_REQUESTS`]).
    pub requests_skipped: u64,
    /// Requests not exported because the caller's trace context was not sampled.
    pub requests_unsampled: u64,
    /// True when the receiver did not finish the last export within [`FINISH_TIMEOUT`].
    pub flush_timed_out: bool,
}

/// Builds spans from the event stream and exports them over OTLP.
#[derive(Debug)]
pub struct OtelSink {
    builder: SpanBuilder,
    export: ExportThread,
    out: Vec<SpanData>,
    queue_drops: u64,
    warned_full: bool,
}

impl OtelSink {
    /// Starts the sink when an endpoint is configured (flag or `OTEL_EXPORTER_OTLP_*ENDPOINT`); `Ok(None)` when
    /// none is. Fails on an invalid configuration; an unreachable receiver is not an error here (spans are then
    /// dropped and counted, with one warning).
    pub fn new(opts: &OtelOptions, info: ResourceInfo) -> Result<Option<Self>, OtelError> {
        match opts.resolve()? {
            Some(cfg) => Self::with_config(&cfg, info, WallClock::now().map_err(OtelError::Clock)?).map(Some),
            None => Ok(None),
        }
    }

    /// Starts the sink with a resolved configuration and a given clock conversion.
    pub fn with_config(cfg: &ExportConfig, info: ResourceInfo, clock: WallClock) -> Result<Self, OtelError> {
        let export = ExportThread::start(cfg, resource::build_resource(cfg, &info))?;
        Ok(Self {
            builder: SpanBuilder::new(clock),
            export,
            out: Vec::new(),
            queue_drops: 0,
            warned_full: false,
        })
    }

    /// Consumes one event (cheap, never blocks).
    pub fn push(&mut self, ev: &Event) {
        self.builder.on_event(ev, &mut self.out);
        if self.out.is_empty() {
            return;
        }
        let spans = std::mem::take(&mut self.out);
        if let Err(spans) = self.export.try_send(spans) {
            self.queue_drops += spans.len() as u64;
            if !self.warned_full {
                eprintln!(
                    "llmprof: warning: the OTLP export queue is full (the receiver is slower than the engine); \
                     dropping spans, see the session's OTel counters"
                );
                self.warned_full = true;
            }
        }
    }

    /// Ends the session: requests still open become unfinished spans ending at the last event, everything is
    /// flushed, and the export thread gets at most [`FINISH_TIMEOUT`].
    pub fn finish(self) -> OtelStats {
        self.finish_within(FINISH_TIMEOUT)
    }

    /// [`OtelSink::finish`] with another deadline.
    pub fn finish_within(mut self, timeout: Duration) -> OtelStats {
        let deadline = Instant::now() + timeout;
        let mut rest = Vec::new();
        self.builder.finish_open(None, &mut rest);
        if !rest.is_empty()
            && let Err(spans) = self.export.send_until(rest, deadline)
        {
            self.queue_drops += spans.len() as u64;
        }
        let b = self.builder.stats();
        let counts = self.export.finish(deadline);
        OtelStats {
            spans_built: b.spans_built,
            spans_exported: counts.exported,
            spans_dropped: b.spans_built.saturating_sub(counts.exported),
            spans_dropped_queue_full: self.queue_drops,
            export_errors: counts.export_errors,
            requests_skipped: b.requests_skipped,
            requests_unsampled: b.requests_unsampled,
            flush_timed_out: !counts.completed,
        }
    }
}
