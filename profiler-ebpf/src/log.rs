//! The messages the programs send through aya-log (user space prints them in its log, `LLMPROF_LOG=warn`).
//!
//! aya-log stamps every record with the source line of its `warn!`, and it writes that line with instructions
//! (immediates in the program), not through debug info: a line added above a `warn!` would change the
//! program, which `cargo xtask build-ebpf --check` compares. So every `warn!` lives here, in a file that holds
//! nothing else, behind a function the families call.

use aya_ebpf::programs::ProbeContext;
use aya_log_ebpf::warn;

/// An engine record `T` that could not be read or is of another ABI version (`rc`: the read's result,
/// `version`: the record's first word); the caller drops it and counts the drop. Generic over the record only
/// so that each engine uprobe keeps its own inlined copy of the message code (one shared copy would be a
/// subprogram call that LLVM keeps out of line).
#[inline(always)]
pub(crate) fn engine_record_rejected<T>(ctx: &ProbeContext, rc: i64, version: u32) {
    warn!(
        ctx,
        target: "llmprof_ebpf",
        "llmprof: engine record rejected (read rc {}, abi {})", rc, version
    );
}
