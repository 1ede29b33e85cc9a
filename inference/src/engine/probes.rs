//! The engine's NVTX-style ranges: the [`Range`] guard and [`emit_range`], in domain [`RANGE_DOMAIN`].
//!
//! Owns the ranges' domain and their push/pop pairing on the calling thread: a [`Range`] pushes when created and
//! pops when dropped, so every early return of a phase still closes it. Used by the step loop (`schedule`,
//! `forward`, `sample`, `detokenize`, `reload`) and the HTTP layer (`tokenize`). The step and request records are
//! built by the loop, which holds the state they report.
//!
//! It must never block or allocate: a range is one fixed-size [`RangeRecord`] on the stack handed to
//! `llmprof_probes` (a ~2 ns call while llmprof is detached), so it may wrap the hottest phases of a step.

use llmprof_abi::{RangeOp, RangeRecord};

/// Domain of the engine's NVTX-style ranges.
pub const RANGE_DOMAIN: &str = "llmserve";

/// An NVTX-style range on the calling thread: pushes on creation, pops on drop.
pub struct Range {
    name: &'static str,
    step_id: u64,
}

impl Range {
    /// Pushes range `name` (domain [`RANGE_DOMAIN`]).
    pub fn push(name: &'static str, step_id: u64) -> Self {
        emit_range(RangeOp::Push, name, step_id);
        Self { name, step_id }
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        emit_range(RangeOp::Pop, self.name, self.step_id);
    }
}

/// Emits one range record.
pub fn emit_range(op: RangeOp, name: &str, step_id: u64) {
    let rec = RangeRecord::new(op, llmprof_probes::boottime_ns(), step_id, RANGE_DOMAIN, name);
    llmprof_probes::range(&rec);
}
