//! What the symbolizer may open of a traced process, and how: the files blazesym would open on its own are
//! vetted here first, and the JIT perf map is read here instead of by blazesym.
//!
//! blazesym opens files with a plain `open` (no deadline, no `O_NONBLOCK`) and follows what the ELF names
//! (`.gnu_debuglink`, `.gnu_debugaltlink`, `.debug_sup`) to paths of llmprof's own mount namespace, where a
//! user may have planted a FIFO. So:
//! - the perf map (`/tmp/perf-PID.map` as the process sees it) is read by [`PerfMaps`] through
//!   [`crate::sys::target_file`] (inside the target's root, regular file only, 64 MiB, 5 s) and blazesym's own
//!   perf-map support stays off;
//! - every file member of a process goes through [`elf_dispatcher`] (ELF names) or [`dwarf_dispatcher`] (DWARF
//!   lines), which first open that exact mapped inode with [`crate::sys::target_file::open`] (regular, not
//!   FUSE, within the caps and the deadline). A member that fails is not symbolized at all. For DWARF, llmprof
//!   hands blazesym the descriptor it checked (`/proc/self/fd/N`), so the file blazesym reads is the one
//!   checked, and a member that names other files (debug links, supplementary files) gets no DWARF lookup:
//!   its ELF names remain.
//!
//! What is left (docs/deployment.md, threat model): for ELF names blazesym still opens the member by its
//! `/proc/PID/map_files` entry itself, after the check; a process that swaps the mapping at that address for a
//! FUSE-backed file in between could stall the symbolizer (the session's watchdog then ends the session).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blazesym::symbolize::{
    FindSymOpts, ProcessMemberInfo, ProcessMemberType, Reason, Resolve, ResolvedSym, Symbolize,
    TranslateFileOffset,
};
use blazesym::{Addr, helper::ElfResolver};
use object::{Object, ObjectSection};

use crate::sys::target_file::{self, Limits, Source};

/// How often a process's perf map is read again (JITs append to it while they run).
const PERF_MAP_RELOAD: Duration = Duration::from_secs(1);
/// ELF sections through which a file names other files blazesym would open.
const LINK_SECTIONS: [&str; 3] = [".gnu_debuglink", ".gnu_debugaltlink", ".debug_sup"];

/// The mapping a member stands for, from its `/proc/PID/map_files/START-END` path.
fn member_source(info: &ProcessMemberInfo<'_>) -> Option<(Source, OsString)> {
    let ProcessMemberType::Path(entry) = info.member_entry else {
        return None;
    };
    let maps_file = entry.maps_file.to_str()?;
    let rest = maps_file.strip_prefix("/proc/")?;
    let (pid, range) = rest.split_once("/map_files/")?;
    let (start, end) = range.split_once('-')?;
    Some((
        Source::Mapping {
            pid: pid.parse().ok()?,
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            path: entry.symbolic_path.display().to_string(),
        },
        entry.symbolic_path.clone().into_os_string(),
    ))
}

/// A member that is not symbolized (its file failed the checks): every address in it is unknown.
#[derive(Debug)]
struct Refused;

impl Symbolize for Refused {
    fn find_sym(
        &self,
        _addr: Addr,
        _opts: &FindSymOpts,
    ) -> blazesym::Result<Result<ResolvedSym<'_>, Reason>> {
        Ok(Err(Reason::Unsupported))
    }
}

impl TranslateFileOffset for Refused {
    fn file_offset_to_virt_offset(&self, _file_offset: u64) -> blazesym::Result<Option<Addr>> {
        Ok(None)
    }
}

/// The DWARF resolver of a checked file: blazesym reads the descriptor llmprof opened.
#[derive(Debug)]
struct Checked {
    /// Kept open for as long as blazesym reads it through `/proc/self/fd/N`.
    _file: File,
    inner: ElfResolver,
    /// The member's path, reported as its module.
    module: OsString,
}

impl Symbolize for Checked {
    fn find_sym(&self, addr: Addr, opts: &FindSymOpts) -> blazesym::Result<Result<ResolvedSym<'_>, Reason>> {
        Ok(self.inner.find_sym(addr, opts)?.map(|mut s| {
            s.module = Some(self.module.as_os_str());
            s
        }))
    }
}

impl TranslateFileOffset for Checked {
    fn file_offset_to_virt_offset(&self, file_offset: u64) -> blazesym::Result<Option<Addr>> {
        self.inner.file_offset_to_virt_offset(file_offset)
    }
}

fn refused(src: &Source, why: &dyn std::fmt::Display) -> blazesym::Result<Option<Box<dyn Resolve>>> {
    log::debug!("symbolize: {src} not read: {why}");
    Ok(Some(Box::new(Refused)))
}

/// The member dispatcher of the ELF-names symbolizer: a member whose file passes the checks is left to
/// blazesym's own handling (`Ok(None)`), any other is not symbolized.
pub fn elf_dispatcher(info: ProcessMemberInfo<'_>) -> blazesym::Result<Option<Box<dyn Resolve>>> {
    let Some((src, _)) = member_source(&info) else {
        return Ok(None);
    };
    match target_file::open(&src, Limits::ELF) {
        Ok(_) => Ok(None),
        Err(e) => refused(&src, &e),
    }
}

/// The member dispatcher of the DWARF symbolizer: blazesym reads the checked descriptor; a member that names
/// other files (see the module doc) or fails the checks gets no DWARF lookup.
pub fn dwarf_dispatcher(info: ProcessMemberInfo<'_>) -> blazesym::Result<Option<Box<dyn Resolve>>> {
    let Some((src, module)) = member_source(&info) else {
        return Ok(None);
    };
    let file = match target_file::open(&src, Limits::ELF) {
        Ok(f) => f,
        Err(e) => return refused(&src, &e),
    };
    // Everything below reads this descriptor: the file checked is the file read.
    let own = format!("/proc/self/fd/{}", file.as_raw_fd());
    let links = target_file::with_elf(&Source::Path(own.clone().into()), Limits::ELF, |elf| {
        elf.sections()
            .any(|s| s.name().is_ok_and(|n| LINK_SECTIONS.contains(&n)))
    });
    match links {
        Ok(false) => {}
        Ok(true) => return refused(&src, &"it names other files (debug link or supplementary file)"),
        Err(e) => return refused(&src, &e),
    }
    let inner = ElfResolver::open(own)?;
    Ok(Some(Box::new(Checked {
        _file: file,
        inner,
        module,
    })))
}

/// A process's perf map: `START SIZE NAME` lines (hex), sorted by start.
#[derive(Debug, Default)]
struct PerfMap {
    entries: Vec<(u64, u64, Arc<str>)>,
    read_at: Option<Instant>,
}

/// Parses a perf map (tools/perf/Documentation/jit-interface.txt): one `START SIZE symbolname` per line,
/// START and SIZE in hex (with or without `0x`). Lines that do not parse are skipped.
pub fn parse_perf_map(text: &str) -> Vec<(u64, u64, Arc<str>)> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut out: Vec<(u64, u64, Arc<str>)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ' ');
            let start = hex(f.next()?)?;
            let size = hex(f.next()?)?;
            let name = f.next()?.trim();
            (size > 0 && !name.is_empty()).then(|| (start, start.saturating_add(size), Arc::from(name)))
        })
        .collect();
    out.sort_by_key(|e| e.0);
    out
}

/// The perf maps of the traced processes, read through [`target_file`] and again at most every
/// [`PERF_MAP_RELOAD`].
#[derive(Debug, Default)]
pub struct PerfMaps {
    by_pid: HashMap<u32, PerfMap>,
}

impl PerfMaps {
    /// The JIT function `pid`'s perf map names at `addr`: (name, its start).
    pub fn lookup(&mut self, pid: u32, addr: u64) -> Option<(Arc<str>, u64)> {
        let m = self.by_pid.entry(pid).or_default();
        if m.read_at.is_none_or(|t| t.elapsed() >= PERF_MAP_RELOAD) {
            m.read_at = Some(Instant::now());
            m.entries = read_perf_map(pid).unwrap_or_default();
        }
        let i = m.entries.partition_point(|e| e.0 <= addr);
        let (start, end, name) = m.entries.get(i.checked_sub(1)?)?;
        (addr < *end).then(|| (name.clone(), *start))
    }

    /// Forgets an exited process.
    pub fn forget(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
    }
}

/// Reads `pid`'s perf map: `/tmp/perf-N.map` inside its root, N its pid as it sees itself (`NStgid`).
fn read_perf_map(pid: u32) -> Option<Vec<(u64, u64, Arc<str>)>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ns_pid = status
        .lines()
        .find_map(|l| l.strip_prefix("NStgid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(pid);
    let src = Source::InRoot {
        pid,
        path: format!("/tmp/perf-{ns_pid}.map"),
    };
    match target_file::read(&src, Limits::TEXT) {
        Ok(bytes) => Some(parse_perf_map(&String::from_utf8_lossy(&bytes))),
        Err(e) => {
            if !e.is_not_found() {
                log::debug!("symbolize: {e}");
            }
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn perf_map_lines_parse_and_look_up() {
        let m = parse_perf_map(
            "7f0000001000 20 jitted_add\n0x7f0000000000 0x100 py::f (a.py)\nbad line\n10 0 empty\n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].0, m[0].1, &*m[0].2),
            (0x7f0000000000, 0x7f0000000100, "py::f (a.py)")
        );
        let mut maps = PerfMaps::default();
        maps.by_pid.insert(
            1,
            PerfMap {
                entries: m,
                read_at: Some(Instant::now()),
            },
        );
        assert_eq!(
            maps.lookup(1, 0x7f0000001010).map(|(n, s)| (n.to_string(), s)),
            Some(("jitted_add".into(), 0x7f0000001000))
        );
        assert_eq!(maps.lookup(1, 0x7f0000001020), None);
        assert_eq!(maps.lookup(1, 0x10), None);
    }

    #[test]
    fn a_fifo_as_perf_map_is_not_waited_for() {
        let me = std::process::id();
        let path = format!("/tmp/perf-{me}.map");
        let _ = std::fs::remove_file(&path);
        let c = std::ffi::CString::new(path.clone()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let t0 = Instant::now();
        let mut maps = PerfMaps::default();
        assert_eq!(maps.lookup(me, 0x1234), None);
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::fs::remove_file(&path).unwrap();
        // A real one is read (after the reload period).
        std::fs::write(&path, "1000 10 jit_fn\n").unwrap();
        maps.forget(me);
        assert_eq!(
            maps.lookup(me, 0x1004).map(|(n, _)| n.to_string()),
            Some("jit_fn".into())
        );
        std::fs::remove_file(&path).unwrap();
    }
}
