//! A process's memory map (`/proc/PID/maps`): the one reader and the one parser of it.
//!
//! Owns reading the file (bounded: [`MAX_BYTES`]), parsing its lines ([`MapsLine`]) and the lookups every part
//! of llmprof makes in it: the first mapped file whose name a caller wants ([`Maps::find_file`], with the
//! paths llmprof reads or probes it through, [`MappedFile`]), each file once with its load base
//! ([`Maps::files`]), the executable range of one file ([`Maps::exec_range`]) and the mapping holding an
//! address ([`Maps::holding`]). The text is the kernel's, but the paths in it are the target's choice (spaces,
//! ` (deleted)`, any name): a file found here is read only through [`super::target_file`]. Never writes.

use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::target_file::Source;

/// Most bytes of a maps file read: a process at the kernel's default `vm.max_map_count` (65,530 mappings)
/// has ~8 MiB of it; what lies past this cap is not looked at.
pub const MAX_BYTES: u64 = 32 << 20;

/// How old a map [`Maps::recent`] may hand out: under a session's tick, so that the parts asking every tick
/// whether a library was loaded (the CUDA driver, the CUPTI helper) read a process's map once between them.
pub const RECENT: Duration = Duration::from_millis(500);

/// One line of `/proc/PID/maps` (`start-end perms offset dev inode pathname`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapsLine<'a> {
    /// First address of the mapping.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
    /// `r-xp` and the like.
    pub perms: &'a str,
    /// File offset of `start`.
    pub offset: u64,
    /// The mapped file as the process sees it (may contain spaces; a trailing ` (deleted)` removed), or a
    /// pseudo name (`[heap]`) or "" for an anonymous mapping.
    pub path: &'a str,
}

impl<'a> MapsLine<'a> {
    /// Parses one line; None when it is not a maps line.
    pub fn parse(line: &'a str) -> Option<Self> {
        let mut f = line.splitn(6, char::is_whitespace);
        let (range, perms, offset) = (f.next()?, f.next()?, f.next()?);
        let path = f.nth(2).unwrap_or("").trim_start();
        let (a, b) = range.split_once('-')?;
        Some(Self {
            start: u64::from_str_radix(a, 16).ok()?,
            end: u64::from_str_radix(b, 16).ok()?,
            perms,
            offset: u64::from_str_radix(offset, 16).ok()?,
            path: path.strip_suffix(" (deleted)").unwrap_or(path),
        })
    }

    /// Whether it maps a file (an absolute path).
    pub fn is_file(&self) -> bool {
        self.path.starts_with('/')
    }

    /// The file's base name (the whole path when it has no `/`).
    pub fn basename(&self) -> &'a str {
        self.path.rsplit('/').next().unwrap_or(self.path)
    }
}

/// A file mapped into a process, and how llmprof reaches it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedFile {
    /// Its path as the process sees it (what llmprof shows).
    pub path: PathBuf,
    /// The same file from llmprof's side, whatever the process's mount namespace or root, even deleted:
    /// `/proc/PID/map_files/START-END` of its first mapping (what a uprobe attaches to).
    pub probe_path: PathBuf,
    /// That mapping, for [`super::target_file`].
    pub source: Source,
    /// First address of that mapping.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
    /// The lowest `start - offset` of the file's mappings: where the file's offset 0 would be.
    pub base: u64,
}

/// The text of one process's maps file.
#[derive(Clone, Debug)]
pub struct Maps {
    pid: u32,
    text: String,
}

impl Maps {
    /// Reads `/proc/PID/maps` (at most [`MAX_BYTES`]).
    pub fn of(pid: u32) -> std::io::Result<Maps> {
        Self::read(pid, &format!("/proc/{pid}/maps"))
    }

    /// `pid`'s map as read at most [`RECENT`] ago (read now when there is none that fresh). For the questions
    /// asked every tick: a 1,300-line map of a PyTorch process costs ~1.7 ms of llmprof's CPU to read, and
    /// three parts asking separately made that 5 ms per process per second. Anything that must see a mapping
    /// made just now (after an injection) uses [`Maps::of`].
    pub fn recent(pid: u32) -> std::io::Result<Arc<Maps>> {
        static READ: Mutex<Vec<(u32, Instant, Arc<Maps>)>> = Mutex::new(Vec::new());
        let now = Instant::now();
        {
            let mut read = READ.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            read.retain(|(_, at, _)| now.duration_since(*at) < RECENT);
            if let Some((_, _, m)) = read.iter().find(|(p, _, _)| *p == pid) {
                return Ok(m.clone());
            }
        }
        let m = Arc::new(Self::of(pid)?);
        let mut read = READ.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        read.push((pid, now, m.clone()));
        Ok(m)
    }

    /// Reads llmprof's own maps.
    pub fn own() -> std::io::Result<Maps> {
        Self::read(std::process::id(), "/proc/self/maps")
    }

    fn read(pid: u32, path: &str) -> std::io::Result<Maps> {
        let mut bytes = Vec::new();
        std::fs::File::open(path)?
            .take(MAX_BYTES)
            .read_to_end(&mut bytes)?;
        Ok(Self::from_text(pid, String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// A maps text of process `pid` read elsewhere (tests).
    pub fn from_text(pid: u32, text: String) -> Maps {
        Maps { pid, text }
    }

    /// Every mapping.
    pub fn lines(&self) -> impl Iterator<Item = MapsLine<'_>> {
        self.text.lines().filter_map(MapsLine::parse)
    }

    /// The first mapped file whose base name `wanted` accepts.
    pub fn find_file(&self, wanted: impl Fn(&str) -> bool) -> Option<MappedFile> {
        let m = self.lines().find(|m| m.is_file() && wanted(m.basename()))?;
        Some(self.file(&m))
    }

    /// Each mapped file once, in the order of its first mapping, its [`MappedFile::base`] over all of its
    /// mappings.
    pub fn files(&self) -> Vec<MappedFile> {
        let mut out: Vec<MappedFile> = Vec::new();
        for m in self.lines().filter(MapsLine::is_file) {
            let base = m.start.saturating_sub(m.offset);
            match out.iter_mut().find(|f| f.path.as_os_str() == m.path) {
                Some(f) => f.base = f.base.min(base),
                None => out.push(self.file(&m)),
            }
        }
        out
    }

    /// The address range of `path`'s executable mappings: (lowest start, highest end), or None when it has
    /// none.
    pub fn exec_range(&self, path: &str) -> Option<(u64, u64)> {
        self.lines()
            .filter(|m| m.path == path && m.perms.contains('x'))
            .map(|m| (m.start, m.end))
            .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)))
    }

    /// The mapping holding `addr`.
    pub fn holding(&self, addr: u64) -> Option<MapsLine<'_>> {
        self.lines().find(|m| m.start <= addr && addr < m.end)
    }

    /// The file of mapping `m` (one of [`Maps::lines`]), reached through that mapping.
    pub fn file(&self, m: &MapsLine<'_>) -> MappedFile {
        let pid = self.pid;
        MappedFile {
            path: PathBuf::from(m.path),
            probe_path: PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end)),
            source: Source::Mapping {
                pid,
                start: m.start,
                end: m.end,
                path: m.path.to_owned(),
            },
            start: m.start,
            end: m.end,
            base: m.start.saturating_sub(m.offset),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;

    #[test]
    fn parses_files_with_spaces_deleted_ones_and_anonymous_mappings() {
        let l = MapsLine::parse(
            "7f10000000-7f10100000 r-xp 00010000 08:01 43 /opt/my lib/libcuda.so.1 (deleted)",
        )
        .unwrap();
        assert_eq!(
            (l.start, l.end, l.perms, l.offset, l.path),
            (
                0x7f10000000,
                0x7f10100000,
                "r-xp",
                0x10000,
                "/opt/my lib/libcuda.so.1"
            )
        );
        assert!(l.is_file());
        assert_eq!(l.basename(), "libcuda.so.1");
        let anon = MapsLine::parse("7f20000000-7f20001000 rw-p 00000000 00:00 0").unwrap();
        assert!(!anon.is_file());
        assert_eq!(MapsLine::parse("not a maps line"), None);
    }

    #[test]
    fn the_exec_range_spans_the_executable_mappings_of_that_file_only() {
        let maps = Maps::from_text(
            7,
            "\
7f20000000-7f20010000 r--p 00000000 08:01 44 /opt/cuda/libcuda.so.1
7f20010000-7f20100000 r-xp 00010000 08:01 44 /opt/cuda/libcuda.so.1
7f20100000-7f20200000 r-xp 00100000 08:01 44 /opt/cuda/libcuda.so.1
7f20200000-7f20300000 rw-p 00200000 08:01 44 /opt/cuda/libcuda.so.1
7f30000000-7f30100000 r-xp 00000000 08:01 45 /opt/cuda/libcuda.so.1.bak
"
            .into(),
        );
        assert_eq!(
            maps.exec_range("/opt/cuda/libcuda.so.1"),
            Some((0x7f20010000, 0x7f20200000))
        );
        assert_eq!(maps.exec_range("/opt/cuda/libnvml.so"), None);
        let files = maps.files();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].base, 0x7f20000000);
        assert_eq!(
            files[0].probe_path,
            PathBuf::from("/proc/7/map_files/7f20000000-7f20010000")
        );
        assert_eq!(maps.holding(0x7f20100010).map(|m| m.offset), Some(0x100000));
        assert_eq!(maps.holding(0x10), None);
    }

    #[test]
    fn finds_a_file_by_its_base_name() {
        let maps = Maps::from_text(
            1,
            "\
7f00000000-7f00001000 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libc.so.6
7f10000000-7f10100000 r-xp 00000000 08:01 43 /usr/lib/x86_64-linux-gnu/libcudart.so.12
7f20000000-7f20100000 r-xp 00010000 08:01 44 /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06
7f30000000-7f30001000 rw-p 00000000 00:00 0 [heap]
"
            .into(),
        );
        let found = maps.find_file(|b| b.starts_with("libcuda.so")).unwrap();
        assert_eq!(
            found.path,
            PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06")
        );
        assert_eq!(found.base, 0x7f20000000 - 0x10000);
        assert!(maps.find_file(|b| b == "libcudnn.so.9").is_none());
    }

    #[test]
    fn reads_our_own_maps() {
        let maps = Maps::own().unwrap();
        let here = maps
            .holding(reads_our_own_maps as *const () as usize as u64)
            .unwrap();
        assert!(here.perms.contains('x'), "{here:?}");
        assert!(maps.find_file(|b| b.starts_with("libc.so")).is_some());
    }
}
