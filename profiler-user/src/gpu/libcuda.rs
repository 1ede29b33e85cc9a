//! Finding the CUDA driver library in a target process and the functions llmprof attaches to in it.
//!
//! Owns: the lookup of libcuda in `/proc/PID/maps` (any mapped file whose basename starts with `libcuda.so`,
//! so the driver's `libcuda.so.1`, `libcuda.so.580.65.06` and a test's stand-in all count), and the
//! resolution of the [`CudaFunc`] entry points from the library's `.dynsym` into file offsets (the `object`
//! crate, read once), deduplicated by offset so an aliased symbol is probed once. It never attaches anything:
//! `capture` does, with the cookies computed here.
//!
//! PyTorch and other cudart users reach the driver through `cuGetProcAddress`; the pointers it hands out
//! that are not exported symbols are added too ([`super::procaddr`]), so those calls are seen either way.

use std::collections::HashSet;
use std::path::PathBuf;

use llmprof_abi::{CudaFunc, CudaVariant};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, ReadRef};

use crate::procfs::MapsLine;
use crate::sys::target_file::{self, Limits, Source, TargetFileError};

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
    #[error("cannot use the CUDA driver library")]
    Read(#[source] TargetFileError),
    /// None of the CUDA driver functions is exported.
    #[error(
        "{path} exports none of the CUDA driver functions llmprof probes (cuLaunchKernel, cuMemcpy*, ...)"
    )]
    NoFunctions {
        /// The file.
        path: String,
    },
}

/// A library mapped into a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedLib {
    /// Its path as the process sees it (what llmprof shows).
    pub path: PathBuf,
    /// The same file from llmprof's side, whatever the process's mount namespace or root, even deleted:
    /// `/proc/PID/map_files/START-END` (what a uprobe attaches to).
    pub probe_path: PathBuf,
    /// The mapping, for [`crate::sys::target_file`].
    pub source: Source,
}

/// The libcuda mapped into `pid`. `None` when none is mapped.
pub fn find_in_process(pid: u32) -> Option<MappedLib> {
    find_mapped(pid, |base| base.starts_with(LIBCUDA_PREFIX))
}

/// The first file mapped into `pid` whose basename `wanted` accepts (see [`find_in_process`]).
pub fn find_mapped(pid: u32, wanted: impl Fn(&str) -> bool) -> Option<MappedLib> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let m = maps
        .lines()
        .filter_map(MapsLine::parse)
        .find(|m| m.is_file() && m.path.rsplit('/').next().is_some_and(&wanted))?;
    Some(MappedLib {
        path: PathBuf::from(m.path),
        probe_path: PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end)),
        source: Source::Mapping {
            pid,
            start: m.start,
            end: m.end,
            path: m.path.to_owned(),
        },
    })
}

/// The first mapped file of a `/proc/PID/maps` text whose basename starts with [`LIBCUDA_PREFIX`].
pub fn find_in_maps(maps: &str) -> Option<String> {
    find_mapped_in_maps(maps, |base| base.starts_with(LIBCUDA_PREFIX))
}

/// The first mapped file of a `/proc/PID/maps` text whose basename `wanted` accepts.
pub fn find_mapped_in_maps(maps: &str, wanted: impl Fn(&str) -> bool) -> Option<String> {
    maps.lines().find_map(|line| {
        let m = MapsLine::parse(line)?;
        let base = m.path.rsplit('/').next()?;
        (m.is_file() && wanted(base)).then(|| m.path.to_owned())
    })
}

/// The address range of `mapped`'s executable mappings in a `/proc/PID/maps` text: (lowest start, highest
/// end), or None when it has none. The counting CUDA probe uses it to leave out a call made from inside the
/// driver (an exported wrapper calling the implementation `cuGetProcAddress` hands out, both probed).
pub fn text_range(maps: &str, mapped: &str) -> Option<(u64, u64)> {
    maps.lines()
        .filter_map(MapsLine::parse)
        .filter(|m| m.path == mapped && m.perms.contains('x'))
        .map(|m| (m.start, m.end))
        .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)))
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
pub fn resolve(lib: &MappedLib) -> Result<Vec<CudaEntry>, LibcudaError> {
    let shown = lib.path.display().to_string();
    // Asked first (it opens the library itself); an untrusted library gives none.
    let via_proc = super::procaddr::entry_points(&lib.source);
    let wanted = wanted_symbols();
    let out = target_file::with_elf(&lib.source, Limits::ELF, move |file| {
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
            let Some(offset) = file_offset(file, &sym) else {
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
            let first_load = file.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
            for (func, base_off) in via_proc {
                let Some(offset) = vaddr_file_offset(file, first_load + base_off) else {
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
    })
    .map_err(LibcudaError::Read)?;
    let mut out = out;
    if out.is_empty() {
        return Err(LibcudaError::NoFunctions { path: shown });
    }
    out.sort_by_key(|e| (e.func, e.variant as u32));
    Ok(out)
}

/// File offset of an ELF virtual address inside an executable section.
fn vaddr_file_offset<'d, R: ReadRef<'d>>(file: &object::File<'d, R>, vaddr: u64) -> Option<u64> {
    file.sections().find_map(|s| {
        let (off, _) = s.file_range()?;
        let inside = vaddr >= s.address() && vaddr < s.address() + s.size();
        let code = s.kind() == object::SectionKind::Text;
        (inside && code).then(|| vaddr - s.address() + off)
    })
}

/// File offset of a symbol's address: `st_value - sh_addr + sh_offset` of the section holding it.
pub(crate) fn file_offset<'d, R: ReadRef<'d>>(
    file: &object::File<'d, R>,
    sym: &object::Symbol<'d, '_, R>,
) -> Option<u64> {
    let section = file.section_by_index(sym.section_index()?).ok()?;
    let (sec_off, _) = section.file_range()?;
    sym.address().checked_sub(section.address())?.checked_add(sec_off)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use super::*;

    #[test]
    fn the_text_range_spans_the_executable_mappings_of_that_file_only() {
        let maps = "\
7f20000000-7f20010000 r--p 00000000 08:01 44 /opt/cuda/libcuda.so.1
7f20010000-7f20100000 r-xp 00010000 08:01 44 /opt/cuda/libcuda.so.1
7f20100000-7f20200000 r-xp 00100000 08:01 44 /opt/cuda/libcuda.so.1
7f20200000-7f20300000 rw-p 00200000 08:01 44 /opt/cuda/libcuda.so.1
7f30000000-7f30100000 r-xp 00000000 08:01 45 /opt/cuda/libcuda.so.1.bak
";
        assert_eq!(
            text_range(maps, "/opt/cuda/libcuda.so.1"),
            Some((0x7f20010000, 0x7f20200000))
        );
        assert_eq!(text_range(maps, "/opt/cuda/libnvml.so"), None);
    }

    #[test]
    fn finds_the_gpu_helper_by_its_exact_basename() {
        let maps = "\
7f00000000-7f00001000 r-xp 00000000 08:01 42 /opt/x/libllmprof_cupti.so.bak
7f10000000-7f10100000 r-xp 00000000 08:01 43 /opt/llmprof/libllmprof_cupti.so
";
        let helper = |b: &str| b == llmprof_abi::gpu::GPU_HELPER_LIB;
        assert_eq!(
            find_mapped_in_maps(maps, helper).as_deref(),
            Some("/opt/llmprof/libllmprof_cupti.so")
        );
        assert_eq!(
            find_mapped_in_maps(maps, |b: &str| b.starts_with(LIBCUDA_PREFIX)),
            None
        );
    }

    #[test]
    fn finds_libcuda_by_basename_in_maps() {
        let maps = "\
7f00000000-7f00001000 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libc.so.6
7f10000000-7f10100000 r-xp 00000000 08:01 43 /usr/lib/x86_64-linux-gnu/libcudart.so.12
7f20000000-7f20100000 r-xp 00010000 08:01 44 /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06
7f30000000-7f30001000 rw-p 00000000 00:00 0 [heap]
";
        assert_eq!(
            find_in_maps(maps).as_deref(),
            Some("/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06")
        );
        let spaced = "7f-80 r-xp 0 08:01 44 /tmp/my dir/libcuda.so.1 (deleted)\n";
        assert_eq!(find_in_maps(spaced).as_deref(), Some("/tmp/my dir/libcuda.so.1"));
        assert_eq!(
            find_in_maps("7f-80 r-xp 0 08:01 44 /usr/lib/libcudnn.so.9\n"),
            None
        );
    }

    #[test]
    fn this_test_process_has_no_libcuda_and_libc_exports_no_cuda() {
        let me = std::process::id();
        assert_eq!(find_in_process(me), None);
        let libc = find_mapped(me, |b| b.starts_with("libc.so")).unwrap();
        assert!(libc.probe_path.starts_with(format!("/proc/{me}/map_files/")));
        assert!(matches!(resolve(&libc), Err(LibcudaError::NoFunctions { .. })));
        let hostname = MappedLib {
            path: "/etc/hostname".into(),
            probe_path: "/etc/hostname".into(),
            source: Source::Path("/etc/hostname".into()),
        };
        assert!(matches!(
            resolve(&hostname),
            Err(LibcudaError::Read(TargetFileError::Parse { .. }))
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
