//! ELF images of files a traced process runs or maps: the one way llmprof reads their symbol tables, with one
//! error type.
//!
//! Owns parsing through [`super::target_file`] (the `object` crate over a budgeted, deadlined read of the
//! checked file; only the headers and tables looked at are read) and the address arithmetic every reader
//! needs: a symbol's file offset (what a uprobe takes), a virtual address's file offset, the link-time address
//! of the first loaded page, a symbol's 4-byte value. What to look for is the caller's (engine probes, CUDA
//! entry points, the CUPTI helper's functions, libc for the injector, CPython's runtime). Never attaches,
//! never runs anything of the file.

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, ReadRef};

use super::target_file::{self, Limits, Source, TargetFileError};

pub use super::target_file::Elf;

/// Why an ELF image could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {what}")]
pub struct ElfError {
    /// What the file is to llmprof ("the engine binary", "the CUDA driver library", ...).
    pub what: &'static str,
    /// Why (it names the file).
    #[source]
    pub source: TargetFileError,
}

/// Parses the ELF file at `src` ([`Limits::ELF`]) and hands it to `f` (on a worker thread, within the
/// deadline); `what` names the file in the error.
pub fn read<T: Send + 'static>(
    src: &Source,
    what: &'static str,
    f: impl for<'a> FnOnce(&Elf<'a>) -> T + Send + 'static,
) -> Result<T, ElfError> {
    target_file::with_elf(src, Limits::ELF, f).map_err(|source| ElfError { what, source })
}

/// The link-time address of the first loaded page (the lowest segment address, page-aligned): a file loaded
/// at `base` has its virtual address `v` at `base + v - first_load`. 0 for shared libraries and PIEs.
pub fn first_load<'d, R: ReadRef<'d>>(file: &object::File<'d, R>) -> u64 {
    file.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff
}

/// File offset of a symbol's address: `st_value - sh_addr + sh_offset` of the section holding it.
pub fn symbol_file_offset<'d, R: ReadRef<'d>>(
    file: &object::File<'d, R>,
    sym: &object::Symbol<'d, '_, R>,
) -> Option<u64> {
    let section = file.section_by_index(sym.section_index()?).ok()?;
    let (sec_off, _) = section.file_range()?;
    sym.address().checked_sub(section.address())?.checked_add(sec_off)
}

/// File offset of a virtual address inside an executable section.
pub fn code_file_offset<'d, R: ReadRef<'d>>(file: &object::File<'d, R>, vaddr: u64) -> Option<u64> {
    file.sections().find_map(|s| {
        let (off, _) = s.file_range()?;
        let inside = vaddr >= s.address() && vaddr < s.address() + s.size();
        let code = s.kind() == object::SectionKind::Text;
        (inside && code).then(|| vaddr - s.address() + off)
    })
}

/// The defined function of `.dynsym` named `name`.
pub fn dynamic_function<'d, 'f, R: ReadRef<'d>>(
    file: &'f object::File<'d, R>,
    name: &str,
) -> Option<object::Symbol<'d, 'f, R>> {
    file.dynamic_symbols()
        .filter(|s| s.is_definition() && s.kind() == object::SymbolKind::Text)
        .find(|s| s.name() == Ok(name))
}

/// The 4-byte value a data symbol holds in the file, in the file's byte order.
pub fn symbol_u32<'d, R: ReadRef<'d>>(
    file: &object::File<'d, R>,
    sym: &object::Symbol<'d, '_, R>,
) -> Option<u32> {
    let section = file.section_by_index(sym.section_index()?).ok()?;
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
    fn a_function_of_libc_has_a_file_offset_inside_its_code() {
        let maps = super::super::maps::Maps::own().unwrap();
        let libc = maps.find_file(|b| b.starts_with("libc.so")).unwrap();
        let (off, code) = read(&libc.source, "libc", |elf| {
            let sym = dynamic_function(elf, "getpid").unwrap();
            let off = symbol_file_offset(elf, &sym).unwrap();
            (off, code_file_offset(elf, sym.address()))
        })
        .unwrap();
        assert_eq!(code, Some(off));
    }

    #[test]
    fn non_elf_is_an_error_naming_what_it_was() {
        let e = read(&Source::Path("/etc/hostname".into()), "the test file", |_| ()).unwrap_err();
        assert!(matches!(e.source, TargetFileError::Parse { .. }), "{e:?}");
        assert_eq!(e.to_string(), "cannot read the test file");
    }
}
