//! llmprof: attach to an LLM inference server and merge eBPF and engine probes into a Perfetto trace.
//!
//! Capture (`capture`, the only part that touches the kernel) produces `llmprof_trace::event::Event`s; everything
//! that turns events into outputs (merge, the Perfetto sink, the OTel span builder, CUDA aggregation, report) is the
//! pure crate `llmprof_trace`, testable without root. This crate keeps what needs the machine: capture, the GPU
//! samplers and probes, self-accounting, the OTel exporter, and the front ends:
//! [`attach`] (the `llmprof attach` session), [`serve`] (alert-triggered sessions for Alertmanager) and [`open`]
//! (serving a trace to Perfetto UI).
//!
//! Layers: [`cli`] (clap) is the top layer, used by the binary only; the library modules take
//! plain option structs ([`attach::AttachOptions`], [`serve::ServeConfig`], [`doctor::DoctorOptions`]) and never
//! import [`cli`]. [`exit`] holds the exit codes and [`causes`] the one way an error is shown with its causes.

pub mod attach;
pub mod budget;
pub mod capture;
pub mod causes;
pub mod cli;
pub mod cpushare;
pub mod cuda;
pub mod cupti;
pub mod doctor;
pub mod exit;
pub mod files;
pub mod inject;
pub mod logging;
pub mod metrics_scrape;
pub mod nvml;
pub mod open;
pub mod otel;
pub mod packaging;
pub mod proctree;
pub mod pyhooks;
pub mod python;
pub mod selfacct;
pub mod serve;
pub mod symbol_files;
pub mod symbolize;
pub mod sys;
pub mod watchdog;
