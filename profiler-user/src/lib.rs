//! llmprof: attach to an LLM inference server and merge eBPF and engine probes into a Perfetto trace.
//!
//! Capture (`capture`, the only part that touches the kernel) produces [`event::Event`]s; [`merge`] orders
//! the streams by timestamp; sinks ([`perfetto`], otel) are pure consumers of the ordered stream. Front ends:
//! [`attach`] (the `llmprof attach` session), [`serve`] (alert-triggered sessions for Alertmanager) and [`open`]
//! (serving a trace to Perfetto UI).

pub mod attach;
pub mod budget;
pub mod capture;
pub mod cli;
pub mod clock;
pub mod doctor;
pub mod event;
pub mod gpu;
pub mod merge;
pub mod metrics_scrape;
pub mod open;
pub mod otel;
pub mod perfetto;
pub mod procfs;
pub mod report;
pub mod selfacct;
pub mod serve;
pub mod sizecap;
pub mod syscall_names;
