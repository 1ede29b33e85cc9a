//! STUB on branch `inject` (issue 15): the `kernels` branch owns this module and replaces this file — the
//! uprobe on the CUPTI helper's handoff function (`llmprof_abi::gpu::GPU_HANDOFF`) that copies each chunk into
//! the ring buffer, and the decoding of the chunks. `attach` calls [`attach_handoff`] once the helper is loaded
//! in the target and before it calls `GPU_START`, so no chunk is handed over before the uprobe is live.

use std::path::Path;

use super::{Capture, CaptureError};

/// Attaches the handoff uprobe in `lib` (the helper library as llmprof sees it) for process `pid`.
/// The stub attaches nothing: the helper's chunks then reach no one (its counters still count them).
pub fn attach_handoff(capture: &mut Capture, pid: u32, lib: &Path) -> Result<(), CaptureError> {
    let _ = (capture, pid, lib);
    Ok(())
}
