//! Reading an engine binary before attaching: its probe ABI version and which probe symbols it exports.
//!
//! Owns what llmprof looks for in an engine's ELF image (read by [`crate::sys::elf`]); never attaches
//! anything.

use std::path::Path;

use llmprof_abi::{ABI_VERSION_SYMBOL, ENGINE_PROBES};
use object::{Object, ObjectSymbol};

use crate::sys::elf::{self, ElfError};
use crate::sys::target_file::Source;

/// What an engine binary offers to llmprof.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineElf {
    /// Value of the exported `llmprof_abi_version` (None: not an instrumented engine).
    pub abi_version: Option<u32>,
    /// Which of [`ENGINE_PROBES`] are present, in that order.
    pub probes: [bool; ENGINE_PROBES.len()],
}

/// Inspects the binary at `path` (for a running process: `/proc/PID/exe`), through [`crate::sys::elf`]: a
/// traced process chose that file.
pub fn inspect(path: &Path) -> Result<EngineElf, ElfError> {
    elf::read(&Source::Path(path.to_owned()), "the engine binary", |file| {
        let mut out = EngineElf {
            abi_version: None,
            probes: [false; ENGINE_PROBES.len()],
        };
        for sym in file.dynamic_symbols().chain(file.symbols()) {
            let Ok(name) = sym.name() else { continue };
            if let Some(i) = ENGINE_PROBES.iter().position(|p| *p == name) {
                out.probes[i] |= sym.is_definition();
            } else if name == ABI_VERSION_SYMBOL && out.abi_version.is_none() {
                out.abi_version = elf::symbol_u32(file, &sym);
            }
        }
        out
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use super::*;

    #[test]
    fn a_binary_without_probes_has_no_version() {
        let elf = inspect(Path::new("/bin/sh")).unwrap();
        assert_eq!(elf.abi_version, None);
        assert_eq!(elf.probes, [false; 3]);
    }

    #[test]
    fn non_elf_is_an_error() {
        let e = inspect(Path::new("/etc/hostname")).err();
        assert!(
            matches!(
                e,
                Some(ElfError {
                    source: crate::sys::target_file::TargetFileError::Parse { .. },
                    ..
                })
            ),
            "{e:?}"
        );
    }
}
