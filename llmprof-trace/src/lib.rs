//! llmprof's trace side: everything that turns events into outputs, testable without root.
//!
//! The flow is capture → decode → merge → sinks. Capture (in `llmprof`, the only part that touches the
//! kernel) hands over the ring-buffer records; [`decode`] turns them into [`event::Event`]s (what only the
//! machine can add, symbols and Python frames, comes in through [`decode::Resolve`]); [`merge`] orders the
//! streams by timestamp; the sinks are pure consumers of the ordered stream: [`perfetto`] (the trace file),
//! [`otel`] (GenAI spans; exported by `llmprof`), [`cuda_agg`] (CUDA driver calls batched per step).
//! [`report`] reads a finished trace back. [`clock`] owns the timebase; [`calibration`] the measured per-hit
//! costs every trace carries; [`names`] every name written into a trace (the sink writes and the report reads
//! with it); [`timeline`] the one model of a request's phases, shared by the Perfetto sink, the OTel builder
//! and the report. `testing` (feature `testing`, and this crate's own tests) holds the event and record
//! builders every test fixture shares.
//!
//! This crate has no aya, no clap and needs no privileges: the compiler keeps the pure half pure.

pub mod calibration;
pub mod clock;
pub mod cuda_agg;
pub mod decode;
pub mod event;
pub mod gpu;
pub mod merge;
pub mod names;
pub mod offcpu;
pub mod otel;
pub mod perfetto;
pub mod pystack;
pub mod report;
pub mod sizecap;
pub mod stack;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod thread_state;
pub mod timeline;
pub mod wire;
