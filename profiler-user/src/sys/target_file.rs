//! The one way llmprof reads a file that a traced process names: a library or executable from its
//! `/proc/PID/maps`, its `/proc/PID/exe`, its JIT perf map.
//!
//! A traced process is untrusted input and so is every path it names: at that path there may be a FIFO (an
//! `open` that never returns), a device, a 2 GiB sparse "libc.so.6", a file on a FUSE filesystem whose server
//! never answers, or a symlink out of its root. So every read here:
//! - is looked up without llmprof's privileges steering it: a mapped file through `/proc/PID/map_files`
//!   (exactly the inode the process maps, even deleted or replaced since), a path of the target through its
//!   root with [`super::in_root`] (`RESOLVE_IN_ROOT`);
//! - opens the path `O_PATH` first (no FIFO, device or FUSE `open` runs), then checks with `fstat` that it is
//!   a regular file no bigger than the caller's cap, and that it is not on a FUSE filesystem (by its device,
//!   read with `statx(AT_STATX_DONT_SYNC)`, which asks no FUSE server), before it reopens it
//!   `O_RDONLY | O_NONBLOCK | O_NOCTTY`;
//! - reads at most the caller's byte budget (an ELF file is parsed by `object` over a budgeted
//!   [`object::read::ReadCache`], so only the headers and symbol tables are read, never the whole file);
//! - runs on a worker thread with a deadline: what is stuck past it (a lookup through a hung FUSE directory) is
//!   abandoned and the caller gets [`TargetFileError::Timeout`]; at most [`MAX_IN_FLIGHT`] workers may run
//!   (or be stuck) at once, then reads fail at once ([`TargetFileError::Busy`]) instead of piling up threads.
//!
//! Must never follow a target's path through the host's root, open a non-regular file for reading, or block
//! its caller past the deadline.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use object::read::ReadCache;

use super::in_root;

/// Most reads of targets' files in progress at once, stuck ones included (see the module doc).
pub const MAX_IN_FLIGHT: usize = 16;

/// Workers started and not finished yet.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Where the file is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The file a mapping of `pid` maps (`start`..`end` as `/proc/PID/maps` shows it; `path` as the process
    /// sees it, used when `/proc/PID/map_files` cannot be opened and in messages).
    Mapping {
        /// The process.
        pid: u32,
        /// First address of the mapping.
        start: u64,
        /// One past its last address.
        end: u64,
        /// The mapped path, as the process sees it.
        path: String,
    },
    /// A path as `pid` sees it, resolved inside its root.
    InRoot {
        /// The process.
        pid: u32,
        /// The absolute path in its root.
        path: String,
    },
    /// A path of llmprof's own mount namespace that a target chose (`/proc/PID/exe`).
    Path(PathBuf),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Mapping { pid, path, .. } | Source::InRoot { pid, path } => {
                write!(f, "{path} (of pid {pid})")
            }
            Source::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

/// How much of a file may be touched, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest file accepted (its `st_size`).
    pub max_size: u64,
    /// Most bytes read from it.
    pub max_read: u64,
    /// Longest the open and the read together may take.
    pub timeout: Duration,
}

impl Limits {
    /// An ELF library or executable whose symbol tables are read: any size on disk (a driver or a CUDA
    /// library is hundreds of MiB), at most 256 MiB read (the dynamic symbols of the largest CUDA libraries
    /// are tens of MiB), 10 s.
    pub const ELF: Limits = Limits {
        max_size: 16 << 30,
        max_read: 256 << 20,
        timeout: Duration::from_secs(10),
    };
    /// A text file read whole (a JIT's perf map): 64 MiB, 5 s.
    pub const TEXT: Limits = Limits {
        max_size: 64 << 20,
        max_read: 64 << 20,
        timeout: Duration::from_secs(5),
    };
}

/// Why a target's file was not read. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum TargetFileError {
    /// Not a regular file.
    #[error("{file} is a {kind}, not a regular file: not read")]
    NotRegular {
        /// The file.
        file: String,
        /// What it is.
        kind: &'static str,
    },
    /// Larger than the cap.
    #[error("{file} is {size} bytes, over the {max} bytes llmprof reads of a traced process's file")]
    TooLarge {
        /// The file.
        file: String,
        /// Its size.
        size: u64,
        /// The cap.
        max: u64,
    },
    /// Parsing it wanted more bytes than the budget.
    #[error("{file}: reading it took more than the {max} bytes allowed; not read further")]
    OverBudget {
        /// The file.
        file: String,
        /// The budget.
        max: u64,
    },
    /// On a FUSE filesystem (a user-space server may never answer).
    #[error("{file} is on a FUSE filesystem: llmprof does not read a traced process's files from FUSE")]
    Fuse {
        /// The file.
        file: String,
    },
    /// Not done within the deadline (the worker is abandoned).
    #[error("{file}: no answer within {after:?} (a hung filesystem?); given up")]
    Timeout {
        /// The file.
        file: String,
        /// The deadline.
        after: Duration,
    },
    /// Too many reads are still in progress.
    #[error(
        "{file}: {MAX_IN_FLIGHT} reads of traced processes' files are still in progress (stuck?); not trying another"
    )]
    Busy {
        /// The file.
        file: String,
    },
    /// The OS refused.
    #[error("cannot read {file}")]
    Io {
        /// The file.
        file: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Not an ELF file `object` can parse.
    #[error("{file} is not an ELF file llmprof can read")]
    Parse {
        /// The file.
        file: String,
        /// The parser's error.
        #[source]
        source: object::Error,
    },
}

impl TargetFileError {
    /// Whether the file (or the process) is simply not there.
    pub fn is_not_found(&self) -> bool {
        matches!(self, TargetFileError::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)))
    }
}

/// The type of a `st_mode`, in words.
fn kind(mode: libc::mode_t) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "regular file",
        libc::S_IFDIR => "directory",
        libc::S_IFIFO => "FIFO",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFLNK => "symlink",
        _ => "special file",
    }
}

fn os_path(p: &str) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(p).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// `open(path, O_PATH)`, following symlinks (and `/proc` magic links).
fn open_path(path: &Path) -> io::Result<OwnedFd> {
    let c = os_path(&path.to_string_lossy())?;
    // SAFETY: a valid NUL-terminated path; O_PATH takes no mode.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just returned by open, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `statx` of a descriptor from the cached attributes (`AT_STATX_DONT_SYNC`: no FUSE or NFS round trip).
fn statx_cached(fd: BorrowedFd<'_>) -> io::Result<libc::statx> {
    // SAFETY: an all-zero `statx` is a valid value of this plain C struct.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx writes one `statx` into valid memory; the empty path with AT_EMPTY_PATH means `fd` itself.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE | libc::STATX_SIZE | libc::STATX_INO,
            &mut st,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// The devices (`major:minor`) of the FUSE filesystems mounted where `pid` and llmprof look.
fn fuse_devices(pid: Option<u32>) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let tables = [Some("self".to_owned()), pid.map(|p| p.to_string())];
    for who in tables.into_iter().flatten() {
        // mountinfo is a procfs file: it cannot block and is bounded by the number of mounts.
        let Ok(text) = std::fs::read_to_string(format!("/proc/{who}/mountinfo")) else {
            continue;
        };
        out.extend(fuse_devices_in(&text));
    }
    out
}

/// The devices of the FUSE mounts of a `/proc/PID/mountinfo` text (`ID PARENT MAJ:MIN ROOT POINT OPTS ... -
/// FSTYPE SOURCE SUPEROPTS`).
pub fn fuse_devices_in(mountinfo: &str) -> Vec<(u32, u32)> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (fields, rest) = l.split_once(" - ")?;
            let fstype = rest.split_whitespace().next()?;
            if fstype != "fuse" && fstype != "fuseblk" && !fstype.starts_with("fuse.") {
                return None;
            }
            let (maj, min) = fields.split_whitespace().nth(2)?.split_once(':')?;
            Some((maj.parse().ok()?, min.parse().ok()?))
        })
        .collect()
}

/// Opens `src` for reading after the checks of the module doc; its size.
fn open_checked(src: &Source, max_size: u64) -> Result<(File, u64), TargetFileError> {
    let file = src.to_string();
    let io_err = |source: io::Error| TargetFileError::Io {
        file: file.clone(),
        source,
    };
    let (opath, pid) = match src {
        Source::Mapping {
            pid,
            start,
            end,
            path,
        } => {
            match open_path(Path::new(&format!("/proc/{pid}/map_files/{start:x}-{end:x}"))) {
                Ok(fd) => (fd, Some(*pid)),
                // Without CAP_SYS_ADMIN map_files cannot be opened: the path inside the target's root.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => {
                    let root = in_root::open_root(*pid).map_err(io_err)?;
                    (
                        in_root::openat(root.as_fd(), path, libc::O_PATH, 0).map_err(io_err)?,
                        Some(*pid),
                    )
                }
                Err(e) => return Err(io_err(e)),
            }
        }
        Source::InRoot { pid, path } => {
            let root = in_root::open_root(*pid).map_err(io_err)?;
            (
                in_root::openat(root.as_fd(), path, libc::O_PATH, 0).map_err(io_err)?,
                Some(*pid),
            )
        }
        Source::Path(p) => (open_path(p).map_err(io_err)?, None),
    };
    let st = statx_cached(opath.as_fd()).map_err(io_err)?;
    let mode = libc::mode_t::from(st.stx_mode);
    if mode & libc::S_IFMT != libc::S_IFREG {
        return Err(TargetFileError::NotRegular {
            file,
            kind: kind(mode),
        });
    }
    if fuse_devices(pid).contains(&(st.stx_dev_major, st.stx_dev_minor)) {
        return Err(TargetFileError::Fuse { file });
    }
    if st.stx_size > max_size {
        return Err(TargetFileError::TooLarge {
            file,
            size: st.stx_size,
            max: max_size,
        });
    }
    // Reopened through the descriptor: the same inode, now with an open that cannot block.
    let c = os_path(&format!("/proc/self/fd/{}", opath.as_raw_fd())).map_err(io_err)?;
    // SAFETY: a valid NUL-terminated path; no O_CREAT, so no mode.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io_err(io::Error::last_os_error()));
    }
    // SAFETY: just returned by open, owned by nobody else.
    let f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let again = in_root::fstat(f.as_fd()).map_err(io_err)?;
    if again.st_ino != st.stx_ino || again.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(TargetFileError::NotRegular {
            file,
            kind: "file replaced while opened",
        });
    }
    Ok((f, st.stx_size))
}

/// Runs `f` on a worker thread, giving up after `timeout` (the worker is then left to finish on its own, and
/// counts as stuck until it does).
fn bounded<T: Send + 'static>(
    file: String,
    timeout: Duration,
    f: impl FnOnce() -> Result<T, TargetFileError> + Send + 'static,
) -> Result<T, TargetFileError> {
    if IN_FLIGHT.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        return Err(TargetFileError::Busy { file });
    }
    let (tx, rx) = mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("llmprof-target-file".into())
        .spawn(move || {
            let r = f();
            IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
            let _ = tx.send(r);
        });
    if let Err(source) = spawned {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        return Err(TargetFileError::Io { file, source });
    }
    match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => Err(TargetFileError::Timeout { file, after: timeout }),
    }
}

/// Reads the whole file (at most `limits.max_read` bytes: a larger file is [`TargetFileError::TooLarge`]).
pub fn read(src: &Source, limits: Limits) -> Result<Vec<u8>, TargetFileError> {
    let src = src.clone();
    bounded(src.to_string(), limits.timeout, move || {
        let max = limits.max_size.min(limits.max_read);
        let (f, size) = open_checked(&src, max)?;
        let mut out = Vec::with_capacity(size as usize);
        // The size may grow after the check: never more than the cap.
        f.take(max + 1)
            .read_to_end(&mut out)
            .map_err(|source| TargetFileError::Io {
                file: src.to_string(),
                source,
            })?;
        if out.len() as u64 > max {
            return Err(TargetFileError::TooLarge {
                file: src.to_string(),
                size: out.len() as u64,
                max,
            });
        }
        Ok(out)
    })
}

/// A file read through a byte budget and a deadline (what `object`'s [`ReadCache`] reads from).
#[derive(Debug)]
pub struct Budgeted {
    file: File,
    left: u64,
    deadline: Instant,
    exceeded: bool,
}

impl Read for Budgeted {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 || Instant::now() > self.deadline {
            self.exceeded = true;
            return Err(io::Error::other(
                "read budget of a traced process's file exhausted",
            ));
        }
        let want = buf.len().min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.file.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

impl Seek for Budgeted {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.file.seek(pos)
    }
}

/// The ELF file as `object` parses it over a [`Budgeted`] read cache.
pub type Elf<'a> = object::File<'a, &'a ReadCache<Budgeted>>;

/// Parses the ELF file at `src` and hands it to `f` (on the worker thread, within the deadline); what `f`
/// returns. Only the parts `f` looks at are read.
pub fn with_elf<T: Send + 'static>(
    src: &Source,
    limits: Limits,
    f: impl for<'a> FnOnce(&Elf<'a>) -> T + Send + 'static,
) -> Result<T, TargetFileError> {
    let src = src.clone();
    bounded(src.to_string(), limits.timeout, move || {
        let (file, _) = open_checked(&src, limits.max_size)?;
        let cache = ReadCache::new(Budgeted {
            file,
            left: limits.max_read,
            deadline: Instant::now() + limits.timeout,
            exceeded: false,
        });
        let parsed = object::File::parse(&cache).map(|elf| f(&elf));
        let exceeded = cache.into_inner().exceeded;
        match parsed {
            _ if exceeded => Err(TargetFileError::OverBudget {
                file: src.to_string(),
                max: limits.max_read,
            }),
            Ok(v) => Ok(v),
            Err(source) => Err(TargetFileError::Parse {
                file: src.to_string(),
                source,
            }),
        }
    })
}

/// Opens `src` after the checks of the module doc and returns the descriptor (for a library that opens the
/// file by path itself: give it `/proc/self/fd/N` of this descriptor, never the target's path).
pub fn open(src: &Source, limits: Limits) -> Result<File, TargetFileError> {
    let src = src.clone();
    bounded(src.to_string(), limits.timeout, move || {
        open_checked(&src, limits.max_size).map(|(f, _)| f)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests {
    use super::*;
    use object::{Object, ObjectSymbol};

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("llmprof-target-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_fifo_a_directory_and_a_device_are_refused_at_once() {
        let d = tmp("fifo");
        let fifo = d.join("libc.so.6");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let t0 = Instant::now();
        for (p, what) in [
            (fifo.clone(), "FIFO"),
            (d.clone(), "directory"),
            (PathBuf::from("/dev/zero"), "character device"),
        ] {
            let e = read(&Source::Path(p.clone()), Limits::TEXT).unwrap_err();
            assert!(
                matches!(&e, TargetFileError::NotRegular { kind, .. } if *kind == what),
                "{}: {e}",
                p.display()
            );
            let e = with_elf(&Source::Path(p), Limits::ELF, |_| ()).unwrap_err();
            assert!(matches!(e, TargetFileError::NotRegular { .. }), "{e}");
        }
        // Nobody opened the FIFO for writing: an open for reading would have blocked.
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_sparse_giant_is_refused_by_its_size_and_an_elf_is_read_in_part() {
        let d = tmp("sparse");
        let giant = d.join("giant");
        let f = File::create(&giant).unwrap();
        f.set_len(2 << 30).unwrap();
        let e = read(&Source::Path(giant.clone()), Limits::TEXT).unwrap_err();
        assert!(
            matches!(e, TargetFileError::TooLarge { size, .. } if size == 2 << 30),
            "{e}"
        );
        // An ELF file is parsed from its headers and symbol tables: a tight budget still finds a symbol of
        // this test binary, a budget below the ELF header fails as such.
        let me = Source::Path(PathBuf::from("/proc/self/exe"));
        let found = with_elf(&me, Limits::ELF, |elf| {
            elf.symbols().any(|s| s.name() == Ok("main")) || elf.dynamic_symbols().count() > 0
        })
        .unwrap();
        assert!(found);
        let tiny = Limits {
            max_read: 16,
            ..Limits::ELF
        };
        let e = with_elf(&me, tiny, |elf| elf.symbols().count()).unwrap_err();
        assert!(matches!(e, TargetFileError::OverBudget { .. }), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_mapping_is_read_through_map_files_and_a_path_in_a_root_stays_in_it() {
        let me = std::process::id();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc_line = maps
            .lines()
            .filter_map(crate::sys::maps::MapsLine::parse)
            .find(|m| m.path.contains("libc.so") && m.offset == 0)
            .unwrap();
        let src = Source::Mapping {
            pid: me,
            start: libc_line.start,
            end: libc_line.end,
            path: "/nonexistent/because/map_files/is/used".into(),
        };
        let has = with_elf(&src, Limits::ELF, |elf| {
            elf.dynamic_symbols().any(|s| s.name() == Ok("dlopen"))
        })
        .unwrap();
        assert!(has);
        let hostname = read(
            &Source::InRoot {
                pid: me,
                path: "/etc/hostname".into(),
            },
            Limits::TEXT,
        )
        .unwrap();
        assert_eq!(hostname, std::fs::read("/etc/hostname").unwrap());
    }

    #[test]
    fn fuse_mounts_are_found_by_their_device() {
        let text = "36 35 0:45 / /mnt/x rw - fuse.sshfs host: rw\n37 35 8:1 / / rw - ext4 /dev/sda1 rw\n\
                    38 35 0:50 / /mnt/y rw shared:2 - fuse /dev/fuse rw\n";
        assert_eq!(fuse_devices_in(text), vec![(0, 45), (0, 50)]);
    }
}
