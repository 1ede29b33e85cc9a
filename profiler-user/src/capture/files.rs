//! The files family's user half: the model-file patterns (`--model-path`, parsed by [`super::patterns`])
//! written into the kernel's `PATTERNS` table.
//!
//! The family has no program of its own: the syscalls exit program matches opened paths against the table
//! and follows the matching fds (`FILES`); its records are decoded by `llmprof_trace::decode::files`. Owns
//! filling the table before any program is attached; never changes it while the programs run.

use aya::Ebpf;
use aya::maps::Array;
use llmprof_abi::{FilePattern, PATTERNS_MAP};

use super::error::CaptureError;
use super::object::{map_err, map_mut};

/// Writes `patterns` into the kernel's `PATTERNS` table, in order.
pub(super) fn fill_patterns(ebpf: &mut Ebpf, patterns: &[FilePattern]) -> Result<(), CaptureError> {
    let mut pats: Array<_, FilePattern> = map_mut(ebpf, PATTERNS_MAP)?;
    for (i, p) in patterns.iter().enumerate() {
        pats.set(i as u32, p, 0).map_err(map_err(PATTERNS_MAP))?;
    }
    Ok(())
}
