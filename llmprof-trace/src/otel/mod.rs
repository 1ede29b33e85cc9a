//! OTel span building: one OpenTelemetry span tree per engine request, after the GenAI semantic conventions.
//!
//! Owns the pure half of llmprof's OTel sink: [`builder`] turns the ordered event stream into `SpanData` and
//! [`semconv`] names every attribute. Export (OTLP over gRPC or HTTP, TLS, queues) lives in `llmprof`'s `otel`
//! module; this module never touches the network.

pub mod builder;
pub mod semconv;

pub use builder::SpanBuilder;
