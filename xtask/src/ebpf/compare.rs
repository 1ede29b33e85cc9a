//! What `build-ebpf --check` compares: the parts of the eBPF object that the kernel runs and llmprof loads, not
//! its line info, so that moving code between lines or files leaves the check green while the programs are the
//! same.
//!
//! Compared ([`parts`]): the bytes of every section the loader takes (`SHF_ALLOC`: the program sections'
//! instructions, the map definitions in `maps`, `.rodata*`, `license`) and their relocations (offset, type and
//! target: a global symbol by name, anything else by section and offset); the global symbols (programs, maps,
//! globals: section, offset, size, kind); the BTF types, each with the names it refers to resolved, so the order
//! of the BTF string table does not matter. Not compared: `.debug_*`, `.BTF.ext` (function and line info), the
//! symbol and string tables beyond the global symbols (local names carry module paths and hashes).
//!
//! Line numbers reach instructions in one place only: aya-log sends the source line of each `warn!` as data
//! written by the program, which is why every `warn!` lives in `profiler-ebpf/src/log.rs` alone.
//!
//! [`kernel_names`] checks, beside, that the object's programs and maps are the ones `llmprof_abi`'s families
//! name (the names llmprof finds them by).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, bail, ensure};
use object::{
    Object, ObjectSection, ObjectSymbol, RelocationFlags, RelocationTarget, SectionFlags, SectionKind,
    SymbolKind, SymbolSection,
};

/// `SHF_ALLOC` (elf.h): the section is loaded.
const SHF_ALLOC: u64 = 0x2;
/// The maps aya-log's kernel half defines (not llmprof's names).
const AYA_LOG_MAPS: [&str; 1] = ["AYA_LOGS"];
/// BTF kinds (include/uapi/linux/btf.h), by value.
const BTF_KINDS: [&str; 20] = [
    "UNKN",
    "INT",
    "PTR",
    "ARRAY",
    "STRUCT",
    "UNION",
    "ENUM",
    "FWD",
    "TYPEDEF",
    "VOLATILE",
    "CONST",
    "RESTRICT",
    "FUNC",
    "FUNC_PROTO",
    "VAR",
    "DATASEC",
    "FLOAT",
    "DECL_TAG",
    "TYPE_TAG",
    "ENUM64",
];

/// The compared parts of an object, by name (`section uprobe`, `relocations uprobe`, `symbol EVENTS`,
/// `btf [12]`, ...).
pub type Parts = BTreeMap<String, Vec<u8>>;

/// The compared parts of the object `data` (see the module docs).
pub fn parts(data: &[u8]) -> Result<Parts> {
    let obj = object::File::parse(data).context("parsing the eBPF object")?;
    let mut out = Parts::new();
    for section in obj.sections() {
        let name = section.name().context("section name")?;
        let loaded = matches!(section.flags(), SectionFlags::Elf { sh_flags } if sh_flags & SHF_ALLOC != 0);
        if name == ".BTF" {
            for (i, ty) in btf_types(section.data()?)?.into_iter().enumerate() {
                out.insert(format!("btf [{}]", i + 1), ty.into_bytes());
            }
        } else if !loaded {
            continue;
        } else if section.kind() == SectionKind::UninitializedData {
            out.insert(
                format!("section {name}"),
                format!("{} zero bytes", section.size()).into_bytes(),
            );
        } else {
            out.insert(format!("section {name}"), section.data()?.to_vec());
        }
        let mut relocs = String::new();
        for (offset, r) in section.relocations() {
            let r_type = match r.flags() {
                RelocationFlags::Elf { r_type } => r_type,
                other => bail!("{name}: a relocation that is not ELF's: {other:?}"),
            };
            let target = match r.target() {
                RelocationTarget::Symbol(i) => symbol_ref(&obj, &obj.symbol_by_index(i)?)?,
                RelocationTarget::Section(i) => obj.section_by_index(i)?.name()?.to_string(),
                other => format!("{other:?}"),
            };
            relocs += &format!("{offset:#x} type {r_type} {target} {:+}\n", r.addend());
        }
        if !relocs.is_empty() {
            out.insert(format!("relocations {name}"), relocs.into_bytes());
        }
    }
    for sym in obj.symbols().filter(|s| s.is_global()) {
        let section = match sym.section() {
            SymbolSection::Section(i) => obj.section_by_index(i)?.name()?.to_string(),
            other => format!("{other:?}"),
        };
        let desc = format!(
            "{section} {:#x} size {} {:?}",
            sym.address(),
            sym.size(),
            sym.kind()
        );
        out.insert(format!("symbol {}", sym.name()?), desc.into_bytes());
    }
    Ok(out)
}

/// How a relocation target is compared: a global symbol by its name, a section symbol by the section's
/// name, any other symbol (local functions and data, whose names carry module paths and hashes) by section
/// and offset.
fn symbol_ref(obj: &object::File<'_>, sym: &object::Symbol<'_, '_>) -> Result<String> {
    let section = match sym.section() {
        SymbolSection::Section(i) => obj.section_by_index(i)?.name()?.to_string(),
        other => format!("{other:?}"),
    };
    Ok(if sym.is_global() {
        sym.name()?.to_string()
    } else if sym.kind() == SymbolKind::Section {
        section
    } else {
        format!("{section}+{:#x}", sym.address())
    })
}

/// The differences between two objects' parts, one line each (at most `max` lines, then a count), naming
/// for a section the first differing instruction and the program or function it is in.
pub fn differences(committed: &[u8], fresh: &[u8], max: usize) -> Result<Vec<String>> {
    let (old, new) = (parts(committed)?, parts(fresh)?);
    let obj = object::File::parse(fresh)?;
    let keys: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    let mut out = Vec::new();
    let mut differing = 0;
    for key in keys {
        let (a, b) = (old.get(key), new.get(key));
        if a == b {
            continue;
        }
        differing += 1;
        if out.len() >= max {
            continue;
        }
        out.push(match (a, b) {
            (None, _) => format!("{key}: new"),
            (_, None) => format!("{key}: gone"),
            (Some(a), Some(b)) => match key.strip_prefix("section ") {
                Some(section) => section_difference(&obj, section, a, b),
                None => format!(
                    "{key}: {} -> {}",
                    String::from_utf8_lossy(first_line(a)),
                    String::from_utf8_lossy(first_line(b))
                ),
            },
        });
    }
    if differing > out.len() {
        out.push(format!("... {} more", differing - out.len()));
    }
    Ok(out)
}

fn first_line(b: &[u8]) -> &[u8] {
    let b = &b[..b.len().min(200)];
    b.split(|&c| c == b'\n').next().unwrap_or(b)
}

/// `section uprobe: 19864 -> 19912 bytes, first difference at instruction 22 of llmprof_step`.
fn section_difference(obj: &object::File<'_>, section: &str, a: &[u8], b: &[u8]) -> String {
    let at = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let index = obj.section_by_name(section).map(|s| s.index());
    let owner = obj
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && Some(s.section()) == index.map(SymbolSection::Section))
        .find(|s| (s.address()..s.address() + s.size()).contains(&(at as u64)));
    let place = match owner {
        Some(s) => format!(
            "instruction {} of {}",
            (at as u64 - s.address()) / 8,
            s.name().unwrap_or("?")
        ),
        None => format!("byte {at:#x}"),
    };
    format!(
        "section {section}: {} -> {} bytes, first difference at {place}",
        a.len(),
        b.len()
    )
}

/// The types of a `.BTF` section (`include/uapi/linux/btf.h`), one line each, names resolved.
fn btf_types(btf: &[u8]) -> Result<Vec<String>> {
    let u16_at = |o: usize| -> Result<u16> {
        Ok(u16::from_le_bytes(
            btf.get(o..o + 2).context("BTF cut short")?.try_into()?,
        ))
    };
    let u32_at = |o: usize| -> Result<u32> {
        Ok(u32::from_le_bytes(
            btf.get(o..o + 4).context("BTF cut short")?.try_into()?,
        ))
    };
    ensure!(u16_at(0)? == 0xeb9f, "not little-endian BTF");
    let hdr_len = u32_at(4)? as usize;
    let (type_off, type_len) = (hdr_len + u32_at(8)? as usize, u32_at(12)? as usize);
    let (str_off, str_len) = (hdr_len + u32_at(16)? as usize, u32_at(20)? as usize);
    let strings = btf
        .get(str_off..str_off + str_len)
        .context("BTF strings cut short")?;
    let name = |off: u32| -> Result<String> {
        let s = strings
            .get(off as usize..)
            .context("BTF name offset past the strings")?;
        let end = s.iter().position(|&c| c == 0).context("BTF name without NUL")?;
        Ok(format!("'{}'", String::from_utf8_lossy(&s[..end])))
    };
    let mut out = Vec::new();
    let mut o = type_off;
    while o < type_off + type_len {
        let (name_off, info, size_or_type) = (u32_at(o)?, u32_at(o + 4)?, u32_at(o + 8)?);
        let (vlen, kind, kind_flag) = ((info & 0xffff) as usize, (info >> 24) & 0x1f, info >> 31);
        let kind_name = BTF_KINDS
            .get(kind as usize)
            .with_context(|| format!("BTF kind {kind}"))?;
        let mut line = format!(
            "{kind_name} {} vlen {vlen} flag {kind_flag} {size_or_type}",
            name(name_off)?
        );
        o += 12;
        // Kind-specific data: (entry size, which of its u32 words are name offsets).
        let (count, words, names): (usize, usize, &[usize]) = match kind {
            1 | 14 | 17 => (1, 1, &[]),
            3 => (1, 3, &[]),
            4 | 5 => (vlen, 3, &[0]),
            6 | 13 => (vlen, 2, &[0]),
            15 => (vlen, 3, &[]),
            19 => (vlen, 3, &[0]),
            _ => (0, 0, &[]),
        };
        for _ in 0..count {
            line.push_str(" |");
            for w in 0..words {
                let v = u32_at(o + 4 * w)?;
                if names.contains(&w) {
                    line += &format!(" {}", name(v)?);
                } else {
                    line += &format!(" {v}");
                }
            }
            o += 4 * words;
        }
        out.push(line);
    }
    Ok(out)
}

/// Checks that the object's programs and maps are exactly the ones `llmprof_abi`'s families and shared maps
/// name, and that it holds the load-time configuration global.
pub fn kernel_names(data: &[u8]) -> Result<()> {
    let obj = object::File::parse(data).context("parsing the eBPF object")?;
    let mut programs = BTreeSet::new();
    let mut maps = BTreeSet::new();
    let mut globals = BTreeSet::new();
    for sym in obj.symbols().filter(|s| s.is_global()) {
        let SymbolSection::Section(i) = sym.section() else {
            continue;
        };
        let section = obj.section_by_index(i)?.name()?.to_string();
        let name = sym.name()?.to_string();
        match (sym.kind(), section.as_str()) {
            (SymbolKind::Text, ".text") => {}
            (SymbolKind::Text, _) => {
                programs.insert(name);
            }
            (_, "maps" | ".maps") if !AYA_LOG_MAPS.contains(&name.as_str()) => {
                maps.insert(name);
            }
            (_, s) if s.starts_with(".rodata") || s.starts_with(".data") || s.starts_with(".bss") => {
                globals.insert(name);
            }
            _ => {}
        }
    }
    let families = llmprof_abi::FAMILIES;
    let named_programs: BTreeSet<String> = families
        .iter()
        .flat_map(|f| f.programs)
        .map(|p| p.to_string())
        .collect();
    let named_maps: BTreeSet<String> = families
        .iter()
        .flat_map(|f| f.maps)
        .chain(&llmprof_abi::SHARED_MAPS)
        .map(|m| m.to_string())
        .collect();
    let mut problems = Vec::new();
    for (what, found, named) in [
        ("program", &programs, &named_programs),
        ("map", &maps, &named_maps),
    ] {
        for n in found.difference(named) {
            problems.push(format!(
                "{what} {n} is in the object but no family of llmprof_abi names it"
            ));
        }
        for n in named.difference(found) {
            problems.push(format!(
                "{what} {n} is named by llmprof_abi but not in the object"
            ));
        }
    }
    if !globals.contains(llmprof_abi::CONFIG_GLOBAL) {
        problems.push(format!("the object has no global {}", llmprof_abi::CONFIG_GLOBAL));
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    fn committed() -> Vec<u8> {
        let path = crate::util::repo_root().join(super::super::OBJECT);
        std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    }

    /// The file offset and size of section `name` of `data`.
    fn section(data: &[u8], name: &str) -> (usize, usize) {
        let obj = object::File::parse(data).unwrap();
        let s = obj
            .section_by_name(name)
            .unwrap_or_else(|| panic!("no section {name}"));
        let (off, size) = s.file_range().unwrap();
        (off as usize, size as usize)
    }

    #[test]
    fn the_committed_object_has_the_names_the_abi_gives() {
        kernel_names(&committed()).unwrap();
    }

    #[test]
    fn a_map_the_abi_does_not_name_fails_the_name_check() {
        // The `proc` family's map renamed in every string table of the object.
        let mut data = committed();
        let (from, to) = (b"EXIT_CODES\0", b"EXIT_CODEZ\0");
        let at: Vec<usize> = data
            .windows(from.len())
            .enumerate()
            .filter(|(_, w)| w == from)
            .map(|(i, _)| i)
            .collect();
        assert!(!at.is_empty());
        for i in at {
            data[i..i + to.len()].copy_from_slice(to);
        }
        let err = format!("{:#}", kernel_names(&data).unwrap_err());
        assert!(
            err.contains("map EXIT_CODEZ is in the object but no family of llmprof_abi names it")
                && err.contains("map EXIT_CODES is named by llmprof_abi but not in the object"),
            "{err}"
        );
    }

    #[test]
    fn line_info_is_not_compared_but_instructions_maps_and_btf_types_are() {
        let data = committed();
        // Line info: every `.debug_*` byte, and every line number of `.BTF.ext` (the line records' last word:
        // line << 10 | column) moved down a line.
        let mut moved = data.clone();
        let obj = object::File::parse(&data[..]).unwrap();
        for s in obj.sections() {
            if s.name().unwrap().starts_with(".debug_") {
                let (off, size) = s.file_range().unwrap();
                moved[off as usize..(off + size) as usize]
                    .iter_mut()
                    .for_each(|b| *b ^= 0x5a);
            }
        }
        let (ext, _) = section(&data, ".BTF.ext");
        let u32_at = |o: usize| u32::from_le_bytes(data[o..o + 4].try_into().unwrap()) as usize;
        let hdr_len = u32_at(ext + 4);
        let (line_off, line_len) = (ext + hdr_len + u32_at(ext + 16), u32_at(ext + 20));
        let rec_size = u32_at(line_off);
        let mut o = line_off + 4;
        let mut lines_moved = 0;
        while o < line_off + line_len {
            let n = u32_at(o + 4);
            for r in 0..n {
                let at = o + 8 + r * rec_size + 12;
                let moved_line = u32_at(at) as u32 + (1 << 10);
                moved[at..at + 4].copy_from_slice(&moved_line.to_le_bytes());
                lines_moved += 1;
            }
            o += 8 + n * rec_size;
        }
        assert!(lines_moved > 1000, "{lines_moved} line records");
        assert_ne!(moved, data);
        assert_eq!(differences(&data, &moved, 10).unwrap(), Vec::<String>::new());

        // An instruction: the immediate of llmprof_step's first instruction.
        let mut changed = data.clone();
        let (uprobe, _) = section(&data, "uprobe");
        let step = obj
            .symbols()
            .find(|s| s.name() == Ok("llmprof_step"))
            .unwrap()
            .address() as usize;
        changed[uprobe + step + 4] ^= 1;
        let d = differences(&data, &changed, 10).unwrap();
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(
            d[0].starts_with("section uprobe:") && d[0].ends_with("instruction 0 of llmprof_step"),
            "{d:?}"
        );

        // A map definition: the first map's max_entries (bpf_map_def: type, key, value, max_entries, ...).
        let mut changed = data.clone();
        let (maps, _) = section(&data, "maps");
        changed[maps + 12] ^= 1;
        let d = differences(&data, &changed, 10).unwrap();
        assert!(d.len() == 1 && d[0].starts_with("section maps:"), "{d:?}");

        // A BTF type: the size of the first sized one changes.
        let mut changed = data.clone();
        let (btf, _) = section(&data, ".BTF");
        let types = btf + u32_at(btf + 4) + u32_at(btf + 8);
        changed[types + 8] ^= 1;
        let d = differences(&data, &changed, 10).unwrap();
        assert!(d.len() == 1 && d[0].starts_with("btf [1]:"), "{d:?}");
    }

    #[test]
    fn btf_types_compare_by_name_not_by_string_offset() {
        // One STRUCT 'a' (size 4, one member 'x' of type 0 at offset 0), with its strings in either order.
        let blob = |strings: &[u8], a: u32, x: u32| {
            let mut types = Vec::new();
            for w in [a, 4 << 24 | 1, 4, x, 0, 0] {
                types.extend_from_slice(&u32::to_le_bytes(w));
            }
            let mut b = vec![0x9f, 0xeb, 1, 0];
            for w in [
                24,
                0,
                types.len() as u32,
                types.len() as u32,
                strings.len() as u32,
            ] {
                b.extend_from_slice(&u32::to_le_bytes(w));
            }
            b.extend(types);
            b.extend_from_slice(strings);
            b
        };
        let one = btf_types(&blob(b"\0a\0x\0", 1, 3)).unwrap();
        let other = btf_types(&blob(b"\0x\0a\0", 3, 1)).unwrap();
        assert_eq!(one, other);
        assert_eq!(one, ["STRUCT 'a' vlen 1 flag 0 4 | 'x' 0 0"]);
        assert_ne!(one, btf_types(&blob(b"\0a\0y\0", 1, 3)).unwrap());
    }
}
