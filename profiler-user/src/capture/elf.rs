//! Reading an engine binary before attaching: its probe ABI version and which probe symbols it exports.
//!
//! Owns ELF inspection only (the `object` crate over [`crate::sys::target_file`]'s bounded reads); never
//! attaches anything.

use std::path::Path;

use llmprof_abi::{ABI_VERSION_SYMBOL, ENGINE_PROBES};
use object::{Object, ObjectSection, ObjectSymbol, ReadRef};

use crate::sys::target_file::{self, Limits, Source, TargetFileError};

/// What an engine binary offers to llmprof.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineElf {
    /// Value of the exported `llmprof_abi_version` (None: not an instrumented engine).
    pub abi_version: Option<u32>,
    /// Which of [`ENGINE_PROBES`] are present, in that order.
    pub probes: [bool; ENGINE_PROBES.len()],
}

/// Why an ELF file could not be inspected.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// The file could not be read or parsed (see [`crate::sys::target_file`]).
    #[error("cannot inspect the engine binary")]
    File(#[source] TargetFileError),
}

/// Inspects the binary at `path` (for a running process: `/proc/PID/exe`), through
/// [`crate::sys::target_file`]: a traced process chose that file.
pub fn inspect(path: &Path) -> Result<EngineElf, ElfError> {
    target_file::with_elf(&Source::Path(path.to_owned()), Limits::ELF, |file| {
        let mut out = EngineElf {
            abi_version: None,
            probes: [false; ENGINE_PROBES.len()],
        };
        for sym in file.dynamic_symbols().chain(file.symbols()) {
            let Ok(name) = sym.name() else { continue };
            if let Some(i) = ENGINE_PROBES.iter().position(|p| *p == name) {
                out.probes[i] |= sym.is_definition();
            } else if name == ABI_VERSION_SYMBOL && out.abi_version.is_none() {
                out.abi_version = read_u32(file, &sym);
            }
        }
        out
    })
    .map_err(ElfError::File)
}

fn read_u32<'d, R: ReadRef<'d>>(file: &object::File<'d, R>, sym: &object::Symbol<'d, '_, R>) -> Option<u32> {
    let index = sym.section_index()?;
    let section = file.section_by_index(index).ok()?;
    let bytes = section.data_range(sym.address(), 4).ok()??;
    let arr: [u8; 4] = bytes.try_into().ok()?;
    Some(if file.is_little_endian() {
        u32::from_le_bytes(arr)
    } else {
        u32::from_be_bytes(arr)
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
            matches!(e, Some(ElfError::File(TargetFileError::Parse { .. }))),
            "{e:?}"
        );
    }
}
