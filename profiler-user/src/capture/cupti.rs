//! GPU activity from the injected CUPTI helper (`llmprof_abi::cupti`): the uprobe at its handoff function and the
//! decoding of the chunks it copies.
//!
//! Owns: the lookup of [`GPU_HANDOFF`] in the helper library's `.dynsym` (file offset, the `object` crate over
//! [`crate::sys::target_file`], as for libcuda), the attachment of `llmprof_gpu` there for one process
//! ([`super::Capture::attach_handoff`], called by the injection once the helper is loaded, or by
//! [`super::Capture::attach_loaded_helper`] for a process that mapped [`GPU_HELPER_LIB`] itself). The
//! `GpuChunkEvent` records are decoded by `llmprof_trace::decode::cupti`, the one reader of the chunk format
//! (versions, clock mapping, names, losses). Never records the GPU itself: the helper in the target does.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use aya::Ebpf;
use aya::programs::UProbe;
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope};
use llmprof_abi::cupti::{GPU_HANDOFF, GPU_HELPER_LIB};
use object::{Object, ObjectSymbol};

use super::error::CaptureError;
pub use super::error::HandoffError;
use super::object::program;
use crate::sys::maps::{MappedFile, Maps};
use crate::sys::target_file::{self, Limits};

/// The handoff uprobe program.
pub use llmprof_abi::cupti::HANDOFF_PROGRAM;

/// The cupti family of a capture: the GPU activity handoff probe per process.
#[derive(Default)]
pub(super) struct Cupti {
    loaded: bool,
    /// Per process: the library the handoff probe is attached in.
    attached: HashMap<u32, PathBuf>,
    /// Processes whose loaded helper could not be probed (said once, not retried).
    failed: std::collections::HashSet<u32>,
    links: Vec<UProbeLink>,
}

/// The helper library in a process's map.
fn helper_in(maps: &Maps) -> Option<MappedFile> {
    maps.find_file(|base| base == GPU_HELPER_LIB)
}

/// File offset of [`GPU_HANDOFF`] in the helper library `pid` maps (its `.dynsym`, read through
/// [`crate::sys::target_file`]: the mapped inode, even if its file was removed since).
pub fn handoff_offset(pid: u32) -> Result<u64, HandoffError> {
    let lib = Maps::of(pid)
        .ok()
        .as_ref()
        .and_then(helper_in)
        .ok_or(HandoffError::NotMapped { pid })?;
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

impl Cupti {
    /// Attaches the handoff uprobe in `pid`'s copy of the helper library `lib` (a path this process can open:
    /// under `/proc/PID/root` for a target in another mount namespace). Attaching a process twice is a no-op.
    pub(super) fn attach_handoff(
        &mut self,
        ebpf: &mut Ebpf,
        pid: u32,
        lib: &Path,
    ) -> Result<(), CaptureError> {
        if self.attached.contains_key(&pid) {
            return Ok(());
        }
        let nz = NonZeroU32::new(pid).ok_or(CaptureError::PidNotFound(pid))?;
        let offset = handoff_offset(pid)?;
        let p: &mut UProbe = program(ebpf, HANDOFF_PROGRAM)?;
        if !self.loaded {
            p.load().map_err(|source| CaptureError::Program {
                program: HANDOFF_PROGRAM.to_owned(),
                source,
            })?;
            self.loaded = true;
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
            self.links.push(link);
        }
        self.attached.insert(pid, lib.to_owned());
        Ok(())
    }

    /// Attaches the handoff probe of `pid` if it has [`GPU_HELPER_LIB`] mapped and is not attached yet (a
    /// process that loaded the helper itself, or one injected by an earlier session). `None`: nothing to do.
    pub(super) fn attach_loaded_helper(
        &mut self,
        ebpf: &mut Ebpf,
        pid: u32,
    ) -> Option<Result<PathBuf, CaptureError>> {
        if self.attached.contains_key(&pid) || self.failed.contains(&pid) {
            return None;
        }
        // Asked every tick: a map read at most `maps::RECENT` ago answers.
        let lib = helper_in(&*Maps::recent(pid).ok()?)?;
        let r = self.attach_handoff(ebpf, pid, &lib.probe_path).map(|()| lib.path);
        if r.is_err() {
            self.failed.insert(pid);
        }
        Some(r)
    }

    /// Processes whose handoff probe is attached.
    pub(super) fn handoff_pids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.attached.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// A process left the session (the decoder forgets its kernel names itself).
    pub(super) fn forget(&mut self, pid: u32) {
        self.attached.remove(&pid);
    }
}
