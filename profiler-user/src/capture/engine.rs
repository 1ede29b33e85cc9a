//! The engine family's user half: the uprobes at the probe functions an llmprof-instrumented engine exports
//! (`llmprof_abi::engine`: steps, requests, ranges, and the content probe with `--capture-content`), in the
//! targets' executables, in executables a process of the tree starts later, and in helper libraries that
//! export the same ABI (the Python hooks).
//!
//! Owns inspecting a binary for the probe ABI ([`inspect_engine`], through [`super::elf`]), loading and
//! attaching the uprobes per (process, image), and the range links the overhead budget detaches. The records
//! are decoded by `llmprof_trace::decode::engine`. Never attaches to a binary of another ABI version, and never
//! attaches the content probe unless asked (`--capture-content`: prompt and completion text leave the engine).

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use aya::Ebpf;
use aya::programs::UProbe;
use aya::programs::uprobe::{UProbeLinkId, UProbeScope};
use llmprof_abi::{
    ABI_VERSION, CONTENT_PROGRAM, ENGINE_PROBES, PROBE_CONTENT, RANGE_PROGRAM, RECORD_PROGRAMS,
};

use super::elf;
use super::error::CaptureError;
use super::object::{load_uprobe, program};

/// Whether a target's engine probes are live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineProbes {
    /// The uprobes are attached.
    Attached {
        /// The engine's probe ABI version.
        abi_version: u32,
    },
    /// The binary does not export the probe ABI (not an llmprof-instrumented engine).
    NotFound,
    /// The binary's probe ABI differs from this llmprof's.
    AbiMismatch {
        /// The engine's version.
        found: u32,
        /// This llmprof's version.
        expected: u32,
    },
}

/// Inspects the binary of `pid` without attaching: whether its engine probes could be attached.
pub fn inspect_engine(pid: u32) -> Result<EngineProbes, CaptureError> {
    let exe = exe_of(pid)?;
    let elf = elf::inspect(&exe)?;
    Ok(match elf.abi_version {
        None => EngineProbes::NotFound,
        Some(_) if !elf.probes.iter().all(|p| *p) => EngineProbes::NotFound,
        Some(v) if v != ABI_VERSION => EngineProbes::AbiMismatch {
            found: v,
            expected: ABI_VERSION,
        },
        Some(v) => EngineProbes::Attached { abi_version: v },
    })
}

fn exe_of(pid: u32) -> Result<PathBuf, CaptureError> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    if pid == 0 || !proc_dir.join("exe").exists() {
        return Err(CaptureError::PidNotFound(pid));
    }
    Ok(proc_dir.join("exe"))
}

/// (device, inode) of `pid`'s executable: one image, whatever path it was started by.
fn image_of(pid: u32) -> Result<(u64, u64), CaptureError> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(exe_of(pid)?).map_err(|_| CaptureError::PidNotFound(pid))?;
    Ok((m.dev(), m.ino()))
}

/// What each target exports, checked before anything is loaded. The first pid is the user's target; with
/// trees (`follow_children`), the others may be descendants that exited since they were found, or run a
/// program that cannot be inspected: they are traced without engine probes. An engine of another ABI
/// version is an error for the user's target.
pub(super) fn inspect_targets(
    pids: &[u32],
    follow_children: bool,
) -> Result<HashMap<u32, EngineProbes>, CaptureError> {
    let mut engine = HashMap::new();
    for (i, &pid) in pids.iter().enumerate() {
        let tolerant = i > 0 && follow_children;
        let probes = match inspect_engine(pid) {
            Ok(p) => p,
            Err(e) if tolerant => {
                log::debug!("capture: pid {pid} not inspected: {e}");
                continue;
            }
            Err(e) => return Err(e),
        };
        if let EngineProbes::AbiMismatch { found, expected } = probes {
            if tolerant {
                log::warn!(
                    "pid {pid} uses llmprof probe ABI {found}, this llmprof speaks {expected}: no engine probes"
                );
                continue;
            }
            return Err(CaptureError::AbiMismatch { pid, found, expected });
        }
        engine.insert(pid, probes);
    }
    Ok(engine)
}

/// The engine probes of a capture: per process what it exports, and the links attached.
#[derive(Debug)]
pub(super) struct Engine {
    probes: HashMap<u32, EngineProbes>,
    /// The images whose engine probes are attached, by (pid, device, inode of the executable).
    images: HashSet<(u32, u64, u64)>,
    /// What each executable exports, by (device, inode): a tree that starts the same program many times
    /// (workers, shells) has its ELF read once.
    image_probes: HashMap<(u64, u64), EngineProbes>,
    /// The uprobe programs are loaded (at start when a target or a later child may need them).
    loaded: bool,
    /// Attach the content probe too (`--capture-content`).
    content: bool,
    /// The budget detached the range probes: new engines get none.
    ranges_detached: bool,
    /// Range uprobe attachments, detachable by [`Engine::detach_ranges`].
    range_links: Vec<UProbeLinkId>,
}

impl Engine {
    /// Loads the programs when a target exports the probe ABI or a tree may gain an engine later (so they
    /// are loaded, and calibrated, up front), and attaches them to the targets of `probes` that export it.
    /// A descendant whose probes cannot be attached (it exited, it executed another program) is traced
    /// without them; the user's target (`first`) is an error.
    pub(super) fn start(
        ebpf: &mut Ebpf,
        mut probes: HashMap<u32, EngineProbes>,
        content: bool,
        follow_children: bool,
        first: Option<u32>,
    ) -> Result<Self, CaptureError> {
        let want_uprobes = probes
            .values()
            .any(|e| matches!(e, EngineProbes::Attached { .. }));
        let loaded = want_uprobes || follow_children;
        if loaded {
            load_programs(ebpf, content)?;
        }
        let mut images = HashSet::new();
        let mut range_links = Vec::new();
        for (&pid, probes) in probes.iter_mut() {
            if !matches!(probes, EngineProbes::Attached { .. }) {
                continue;
            }
            let attached = image_of(pid).and_then(|image| {
                let links = attach_programs_at(ebpf, pid, &exe_of(pid)?, content, true)?;
                Ok((image, links))
            });
            match attached {
                Ok((image, links)) => {
                    range_links.extend(links);
                    images.insert((pid, image.0, image.1));
                }
                Err(e) if follow_children && first != Some(pid) => {
                    log::debug!("capture: engine probes of pid {pid}: {e}");
                    *probes = EngineProbes::NotFound;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Engine {
            probes,
            images,
            image_probes: HashMap::new(),
            loaded,
            content,
            ranges_detached: false,
            range_links,
        })
    }

    /// Whether the engine probes of `pid` are attached (NotFound for pids not traced).
    pub(super) fn probes(&self, pid: u32) -> EngineProbes {
        self.probes.get(&pid).cloned().unwrap_or(EngineProbes::NotFound)
    }

    /// The engine probes of the first process (by pid) whose probes were attached, if any.
    pub(super) fn any(&self) -> Option<EngineProbes> {
        let mut pids: Vec<&u32> = self.probes.keys().collect();
        pids.sort_unstable();
        pids.into_iter()
            .filter_map(|p| self.probes.get(p))
            .find(|e| matches!(e, EngineProbes::Attached { .. }))
            .cloned()
    }

    /// Whether the uprobe programs are loaded.
    pub(super) fn loaded(&self) -> bool {
        self.loaded
    }

    /// The targets as inspected (for the capture's debug output).
    pub(super) fn by_pid(&self) -> &HashMap<u32, EngineProbes> {
        &self.probes
    }

    /// Attaches the probes to `pid`'s current image when its binary exports the probe ABI; nothing when they
    /// are attached to that image already. What `pid` exports now.
    pub(super) fn attach(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<EngineProbes, CaptureError> {
        let image = image_of(pid)?;
        let probes = match self.image_probes.get(&image) {
            Some(p) => p.clone(),
            None => {
                let p = inspect_engine(pid)?;
                self.image_probes.insert(image, p.clone());
                p
            }
        };
        if matches!(probes, EngineProbes::Attached { .. }) && !self.images.contains(&(pid, image.0, image.1))
        {
            self.attach_image(ebpf, pid, &exe_of(pid)?)?;
            self.images.insert((pid, image.0, image.1));
        }
        self.probes.insert(pid, probes.clone());
        Ok(probes)
    }

    /// Attaches the probes to the helper library at `lib` (a path llmprof can open: the target's mapping of
    /// it, `/proc/PID/map_files/…`) in `pid`, when it exports the probe ABI. `pid`'s engine probes are then
    /// those of the library.
    pub(super) fn attach_library(
        &mut self,
        ebpf: &mut Ebpf,
        pid: u32,
        lib: &Path,
    ) -> Result<EngineProbes, CaptureError> {
        let probes = match elf::inspect(lib)? {
            i if i.abi_version.is_none() || !i.probes.iter().all(|p| *p) => EngineProbes::NotFound,
            i if i.abi_version != Some(ABI_VERSION) => EngineProbes::AbiMismatch {
                found: i.abi_version.unwrap_or(0),
                expected: ABI_VERSION,
            },
            _ => EngineProbes::Attached {
                abi_version: ABI_VERSION,
            },
        };
        if matches!(probes, EngineProbes::Attached { .. }) {
            self.attach_image(ebpf, pid, lib)?;
        }
        self.probes.insert(pid, probes.clone());
        Ok(probes)
    }

    /// Loads the programs if they are not yet, and attaches them to `image` in `pid`.
    fn attach_image(&mut self, ebpf: &mut Ebpf, pid: u32, image: &Path) -> Result<(), CaptureError> {
        if !self.loaded {
            load_programs(ebpf, self.content)?;
            self.loaded = true;
        }
        let links = attach_programs_at(ebpf, pid, image, self.content, !self.ranges_detached)?;
        self.range_links.extend(links);
        Ok(())
    }

    /// Detaches the range uprobes (steps and requests stay) and attaches none later. Returns false when none
    /// was attached.
    pub(super) fn detach_ranges(&mut self, ebpf: &mut Ebpf) -> Result<bool, CaptureError> {
        self.ranges_detached = true;
        let links = std::mem::take(&mut self.range_links);
        let any = !links.is_empty();
        for link in links {
            let p: &mut UProbe = program(ebpf, RANGE_PROGRAM)?;
            p.detach(link).map_err(|source| CaptureError::Program {
                program: RANGE_PROGRAM.to_owned(),
                source,
            })?;
        }
        Ok(any)
    }
}

/// Loads the engine uprobe programs (and the content one when asked).
pub(super) fn load_programs(ebpf: &mut Ebpf, content: bool) -> Result<(), CaptureError> {
    let content = content.then_some(CONTENT_PROGRAM);
    for prog in RECORD_PROGRAMS.into_iter().chain(content) {
        load_uprobe(ebpf, prog)?;
    }
    Ok(())
}

/// Attaches the (loaded) engine uprobes to the file `image` (an executable or a library exporting the probe
/// functions) in `pid`; returns the range links.
fn attach_programs_at(
    ebpf: &mut Ebpf,
    pid: u32,
    image: &Path,
    content: bool,
    ranges: bool,
) -> Result<Vec<UProbeLinkId>, CaptureError> {
    let Some(nz) = NonZeroU32::new(pid) else {
        return Err(CaptureError::PidNotFound(pid));
    };
    let content = content.then_some((&PROBE_CONTENT, CONTENT_PROGRAM));
    let mut range_links = Vec::new();
    for (sym, prog) in ENGINE_PROBES.iter().zip(RECORD_PROGRAMS).chain(content) {
        if prog == RANGE_PROGRAM && !ranges {
            continue;
        }
        let p: &mut UProbe = program(ebpf, prog)?;
        let link = p
            .attach(*sym, image, UProbeScope::OneProcess(nz))
            .map_err(|source| CaptureError::Program {
                program: format!("{prog} at {sym} of pid {pid}"),
                source,
            })?;
        if prog == RANGE_PROGRAM {
            range_links.push(link);
        }
    }
    Ok(range_links)
}
