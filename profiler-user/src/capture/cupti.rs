//! GPU activity from the injected CUPTI helper (`llmprof_abi::gpu`): the uprobe at its handoff function and the
//! decoding of the chunks it copies.
//!
//! Owns: the lookup of [`GPU_HANDOFF`] in the helper library's `.dynsym` (file offset, the `object` crate over
//! [`crate::sys::target_file`], as for libcuda), the attachment of `llmprof_gpu` there for one process ([`Capture::attach_handoff`], called by
//! the injection once the helper is loaded, or by [`Capture::attach_loaded_helper`] for a process that mapped
//! [`GPU_HELPER_LIB`] itself). The `GpuChunkEvent` records are decoded by `llmprof_trace::decode::cupti`, the
//! one reader of the chunk format (versions, clock mapping, names, losses).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use aya::programs::UProbe;
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope};
use llmprof_abi::gpu::{GPU_HANDOFF, GPU_HELPER_LIB};
use llmprof_trace::gpu::GpuStats;
use object::{Object, ObjectSymbol};

use super::{Capture, CaptureError, program};
use crate::sys::target_file::{self, Limits, TargetFileError};

/// The handoff uprobe program.
pub const HANDOFF_PROGRAM: &str = "llmprof_gpu";

/// Why the helper library's handoff function cannot be probed.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    /// The process maps no helper library (any more).
    #[error("pid {pid} has no {GPU_HELPER_LIB} mapped")]
    NotMapped {
        /// The process.
        pid: u32,
    },
    /// The library file could not be read or parsed (see [`crate::sys::target_file`]).
    #[error("cannot read the GPU helper library")]
    Read(#[source] TargetFileError),
    /// The library does not export the handoff function.
    #[error("{path} does not export {GPU_HANDOFF}: not llmprof's GPU helper library")]
    NoHandoff {
        /// The file.
        path: String,
    },
}

/// What the capture keeps for the GPU activity handoff.
#[derive(Default)]
pub(super) struct GpuCapture {
    loaded: bool,
    /// Per process: the library the handoff probe is attached in.
    attached: HashMap<u32, PathBuf>,
    /// Processes whose loaded helper could not be probed (said once, not retried).
    failed: std::collections::HashSet<u32>,
    links: Vec<UProbeLink>,
}

/// The helper library as `pid` maps it.
fn helper_mapped(pid: u32) -> Option<crate::sys::maps::MappedFile> {
    crate::sys::maps::Maps::of(pid)
        .ok()?
        .find_file(|base| base == GPU_HELPER_LIB)
}

/// File offset of [`GPU_HANDOFF`] in the helper library `pid` maps (its `.dynsym`, read through
/// [`crate::sys::target_file`]: the mapped inode, even if its file was removed since).
pub fn handoff_offset(pid: u32) -> Result<u64, HandoffError> {
    let lib = helper_mapped(pid).ok_or(HandoffError::NotMapped { pid })?;
    target_file::with_elf(&lib.source, Limits::ELF, |file| {
        file.dynamic_symbols()
            .filter(|s| s.is_definition() && s.kind() == object::SymbolKind::Text)
            .find(|s| s.name() == Ok(GPU_HANDOFF))
            .and_then(|s| crate::sys::elf::symbol_file_offset(file, &s))
    })
    .map_err(HandoffError::Read)?
    .ok_or_else(|| HandoffError::NoHandoff {
        path: lib.path.display().to_string(),
    })
}

impl Capture {
    /// Attaches the handoff uprobe in `pid`'s copy of the helper library `lib` (a path this process can open:
    /// under `/proc/PID/root` for a target in another mount namespace). Attaching a process twice is a no-op.
    pub fn attach_handoff(&mut self, pid: u32, lib: &Path) -> Result<(), CaptureError> {
        if self.gpu.attached.contains_key(&pid) {
            return Ok(());
        }
        let nz = NonZeroU32::new(pid).ok_or(CaptureError::PidNotFound(pid))?;
        let offset = handoff_offset(pid)?;
        let p: &mut UProbe = program(&mut self.ebpf, HANDOFF_PROGRAM)?;
        if !self.gpu.loaded {
            p.load().map_err(|source| CaptureError::Program {
                program: HANDOFF_PROGRAM.to_owned(),
                source,
            })?;
            self.gpu.loaded = true;
        }
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie: None,
        };
        let id = p
            .attach(point, lib, UProbeScope::OneProcess(nz))
            .map_err(|source| CaptureError::Program {
                program: format!(
                    "{HANDOFF_PROGRAM} at {GPU_HANDOFF} of {} (pid {pid})",
                    lib.display()
                ),
                source,
            })?;
        if let Ok(link) = p.take_link(id) {
            self.gpu.links.push(link);
        }
        self.gpu.attached.insert(pid, lib.to_owned());
        Ok(())
    }

    /// Attaches the handoff probe of `pid` if it has [`GPU_HELPER_LIB`] mapped and is not attached yet (a
    /// process that loaded the helper itself, or one injected by an earlier session). `None`: nothing to do.
    pub fn attach_loaded_helper(&mut self, pid: u32) -> Option<Result<PathBuf, CaptureError>> {
        if self.gpu.attached.contains_key(&pid) || self.gpu.failed.contains(&pid) {
            return None;
        }
        let lib = helper_mapped(pid)?;
        let r = self.attach_handoff(pid, &lib.probe_path).map(|()| lib.path);
        if r.is_err() {
            self.gpu.failed.insert(pid);
        }
        Some(r)
    }

    /// Processes whose handoff probe is attached.
    pub fn handoff_pids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.gpu.attached.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// What the GPU activity chunks held and lost so far.
    pub fn gpu_stats(&self) -> GpuStats {
        self.decoder.cupti_stats().clone()
    }
}

impl GpuCapture {
    /// A process left the session (the decoder forgets its kernel names itself).
    pub(super) fn forget(&mut self, pid: u32) {
        self.attached.remove(&pid);
    }
}
