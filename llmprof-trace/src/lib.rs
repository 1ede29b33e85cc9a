//! llmprof's trace side: everything that turns events into outputs, testable without root.
//!
//! The flow is capture → decode → merge → sinks. Capture (in `llmprof`, the only part that touches the
//! kernel) hands over the ring-buffer records; [`decode`] turns them into [`event::Event`]s (what only the
//! machine can add, symbols and Python frames, comes in through [`decode::Resolve`]); [`merge`] orders the
//! streams by timestamp; the sinks are pure consumers of the ordered stream: [`perfetto`] (the trace file:
//! the format in `schema`, `writer`, `compact`, the layout in `sink`), [`otel`] (GenAI spans; exported by
//! `llmprof`). [`report`] reads a finished trace back. [`clock`] owns the timebase; [`calibration`] the
//! measured per-hit costs every trace carries; [`names`] every name written into a trace (the sink writes and
//! the report reads with it). `testing` (feature `testing`, and this crate's own tests) holds the event and
//! record builders every test fixture shares.
//!
//! Each probe family (syscalls, files, egress, engine, cuda, cupti, wire, stacks, sched, python, proc) has
//! one name in every layer: its decoder `decode/FAMILY.rs`, its model beyond the shared [`event::Event`]
//! `event/FAMILY.rs` (where it has one), its part of the Perfetto sink `perfetto/sink/FAMILY.rs`, its
//! section of the report `report/FAMILY.rs` (where it has one); `docs/architecture.md` has the table.
//!
//! This crate has no aya, no clap and needs no privileges: the compiler keeps the pure half pure.

pub mod calibration;
pub mod clock;
pub mod decode;
pub mod event;
pub mod merge;
pub mod names;
pub mod otel;
pub mod perfetto;
pub mod report;
pub mod sizecap;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
