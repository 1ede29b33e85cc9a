//! Every name llmprof writes into a Perfetto trace: track names, slice and instant names, marker texts, argument
//! keys, counter tracks and categories.
//!
//! Owns the trace's vocabulary, nothing else: the writer ([`crate::perfetto::sink`], and the markers `llmprof`
//! puts on the timeline) writes with these constants and builders, and every reader ([`crate::report`], the tests
//! that query Perfetto's trace processor) reads with them, so a reader never retypes a literal the writer chose.
//! A formatted name has its builder and, where a reader needs it, its parser side by side. The values are what
//! users see in the Perfetto UI and query in SQL (documented in `docs/perfetto-trace.md`): changing one is a
//! change to the trace format. This module never decides where an event goes; that is the sink's job.

/// How Perfetto's trace processor names a debug annotation in its `args` table (`extract_arg(arg_set_id,
/// 'debug.num_seqs')`): `debug.` + the key. An element of an array arg is `debug.<key>[<index>]`.
pub fn tp_arg(key: &str) -> String {
    format!("debug.{key}")
}

// What every family shares, one file per kind of name.
pub mod arg;
/// Slice categories (`slice.category`).
pub mod category {
    /// CUDA driver call slices.
    pub const CUDA_HOST: &str = "cuda-host";
}
pub mod counter;
pub mod marker;
pub mod slice;
pub mod track;
pub mod value;

// The families whose vocabulary is large enough for a file of its own.
pub mod cupti;
pub mod syscalls;

#[cfg(test)]
mod tests;
