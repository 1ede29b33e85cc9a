//! Finding the CUDA driver library in a target process and the functions llmprof attaches to in it.
//!
//! Owns: which mapped file is libcuda (any whose basename starts with `libcuda.so`, so the driver's
//! `libcuda.so.1`, `libcuda.so.580.65.06` and a test's stand-in all count; the maps are read by
//! [`crate::sys::maps`]), and the resolution of the [`CudaFunc`] entry points from the library's `.dynsym` into
//! file offsets ([`crate::sys::elf`], read once), deduplicated by offset so an aliased symbol is probed once. It
//! never attaches anything: `capture` does, with the cookies computed here.
//!
//! PyTorch and other cudart users reach the driver through `cuGetProcAddress`; the pointers it hands out
//! that are not exported symbols are added too ([`super::procaddr`]), so those calls are seen either way.

use std::collections::HashSet;

use llmprof_abi::{CudaFunc, CudaVariant};
use object::{Object, ObjectSymbol};

use crate::sys::elf::{self, ElfError};
use crate::sys::maps::{MappedFile, Maps};

/// Basename prefix of the CUDA driver library.
pub const LIBCUDA_PREFIX: &str = "libcuda.so";

/// One entry point to probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaEntry {
    /// The exported symbol (`cuMemcpyHtoDAsync_v2_ptsz`).
    pub symbol: String,
    /// The function it implements.
    pub func: CudaFunc,
    /// Which of its symbols.
    pub variant: CudaVariant,
    /// File offset of the symbol's first instruction (what the kernel's uprobe API takes).
    pub file_offset: u64,
}

impl CudaEntry {
    /// The uprobe cookie of this entry ([`CudaFunc::cookie`]).
    pub fn cookie(&self) -> u64 {
        self.func.cookie(self.variant)
    }
}

/// Why libcuda could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LibcudaError {
    /// The library file could not be read (see [`crate::sys::target_file`]: a FIFO, a device, a file over
    /// the caps or on FUSE, a hung filesystem, or a file that is not ELF).
    #[error(transparent)]
    Read(#[from] ElfError),
    /// None of the CUDA driver functions is exported.
    #[error(
        "{path} exports none of the CUDA driver functions llmprof probes (cuLaunchKernel, cuMemcpy*, ...)"
    )]
    NoFunctions {
        /// The file.
        path: String,
    },
}

/// The libcuda mapped into `pid` (by its map as read at most [`crate::sys::maps::RECENT`] ago: asked every
/// tick). `None` when none is mapped.
pub fn find_in_process(pid: u32) -> Option<MappedFile> {
    Maps::recent(pid).ok()?.find_file(is_libcuda)
}

/// Whether a mapped file's base name is libcuda's.
pub fn is_libcuda(basename: &str) -> bool {
    basename.starts_with(LIBCUDA_PREFIX)
}

/// Every symbol name llmprof looks for, with the function and variant it stands for.
pub fn wanted_symbols() -> Vec<(String, CudaFunc, CudaVariant)> {
    let mut out = Vec::new();
    for f in CudaFunc::ALL {
        for v in CudaVariant::SYMBOLS {
            out.push((format!("{}{}", f.name(), v.suffix()), f, v));
        }
    }
    out
}

/// Resolves the CUDA driver entry points exported by `lib` (read through [`crate::sys::target_file`]), plus
/// the ones only `cuGetProcAddress` hands out when the library may be loaded into llmprof ([`super::procaddr`]).
pub fn resolve(lib: &MappedFile) -> Result<Vec<CudaEntry>, LibcudaError> {
    let shown = lib.path.display().to_string();
    // Asked first (it opens the library itself); an untrusted library gives none.
    let via_proc = super::procaddr::entry_points(&lib.source);
    let wanted = wanted_symbols();
    let out = elf::read(&lib.source, "the CUDA driver library", move |file| {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for sym in file.dynamic_symbols() {
            if !sym.is_definition() || sym.kind() != object::SymbolKind::Text {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            let Some((_, func, variant)) = wanted.iter().find(|(n, _, _)| n == name) else {
                continue;
            };
            let Some(offset) = elf::symbol_file_offset(file, &sym) else {
                continue;
            };
            if seen.insert(offset) {
                out.push(CudaEntry {
                    symbol: name.to_owned(),
                    func: *func,
                    variant: *variant,
                    file_offset: offset,
                });
            }
        }
        // Entry points cuGetProcAddress hands out that no exported symbol names (cudart's way to the driver).
        if !out.is_empty() {
            let first_load = elf::first_load(file);
            for (func, base_off) in via_proc {
                let Some(offset) = elf::code_file_offset(file, first_load + base_off) else {
                    continue;
                };
                if seen.insert(offset) {
                    out.push(CudaEntry {
                        symbol: format!("{}{}", func.name(), CudaVariant::ProcAddress.suffix()),
                        func,
                        variant: CudaVariant::ProcAddress,
                        file_offset: offset,
                    });
                }
            }
        }
        out
    })?;
    let mut out = out;
    if out.is_empty() {
        return Err(LibcudaError::NoFunctions { path: shown });
    }
    out.sort_by_key(|e| (e.func, e.variant as u32));
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use super::*;

    #[test]
    fn libcuda_is_known_by_its_basename() {
        for b in ["libcuda.so", "libcuda.so.1", "libcuda.so.580.65.06"] {
            assert!(is_libcuda(b), "{b}");
        }
        for b in ["libcudart.so.12", "libcudnn.so.9", "libcuda_stub.a"] {
            assert!(!is_libcuda(b), "{b}");
        }
    }

    #[test]
    fn this_test_process_has_no_libcuda_and_libc_exports_no_cuda() {
        let me = std::process::id();
        assert_eq!(find_in_process(me), None);
        let libc = Maps::of(me)
            .unwrap()
            .find_file(|b| b.starts_with("libc.so"))
            .unwrap();
        assert!(libc.probe_path.starts_with(format!("/proc/{me}/map_files/")));
        assert!(matches!(resolve(&libc), Err(LibcudaError::NoFunctions { .. })));
        let hostname = MappedFile {
            path: "/etc/hostname".into(),
            probe_path: "/etc/hostname".into(),
            source: crate::sys::target_file::Source::Path("/etc/hostname".into()),
            start: 0,
            end: 0,
            base: 0,
        };
        assert!(matches!(
            resolve(&hostname),
            Err(LibcudaError::Read(ElfError {
                source: crate::sys::target_file::TargetFileError::Parse { .. },
                ..
            }))
        ));
    }

    #[test]
    fn every_function_has_its_plain_and_versioned_names() {
        let names: Vec<String> = wanted_symbols().into_iter().map(|(n, _, _)| n).collect();
        for n in [
            "cuLaunchKernel",
            "cuLaunchKernel_ptsz",
            "cuMemcpyHtoDAsync_v2_ptsz",
            "cuMemcpyDtoH_v2",
            "cuMemAlloc_v2",
            "cuStreamSynchronize_ptsz",
            "cuGraphLaunch_ptsz",
        ] {
            assert!(names.iter().any(|x| x == n), "{n}");
        }
    }
}
