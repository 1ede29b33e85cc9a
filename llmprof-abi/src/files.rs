//! The `files` family: opens, reads, mmaps and closes of model files, decoded at the exit of the `syscalls`
//! family's programs (no program of its own). User space writes the path patterns ([`FilePattern`]) into the
//! kernel's pattern array before attaching; an open whose path matches one is sent and its fd followed until
//! its close.

use crate::{EventHeader, Family, PATH_LEN};

/// Model-file fds being followed, by `SockKey` (tgid, fd).
pub const FILES_MAP: &str = "FILES";
/// The path patterns ([`FilePattern`]), an array of [`MAX_PATTERNS`].
pub const PATTERNS_MAP: &str = "PATTERNS";
/// Every program of the family.
pub const PROGRAMS: [&str; 0] = [];
/// Every map of the family.
pub const MAPS: [&str; 2] = [FILES_MAP, PATTERNS_MAP];
/// The family's kernel names.
pub const FAMILY: Family = Family {
    name: "files",
    programs: &PROGRAMS,
    maps: &MAPS,
};

/// An `openat` of a path that matched the model-file patterns.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FileOpenEvent {
    /// Header ([`crate::EventKind::FileOpen`]); `ts_ns` is the entry time.
    pub hdr: EventHeader,
    /// Returned fd (negative errno on failure).
    pub ret: i64,
    /// Duration of the open, ns.
    pub dur_ns: u64,
    /// Open flags.
    pub flags: u32,
    /// Reserved, zero.
    pub _pad: u32,
    /// Path as passed to openat, NUL terminated.
    pub path: [u8; PATH_LEN],
}

/// I/O operation on a tracked model-file fd.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileOp {
    /// read(2).
    Read = 0,
    /// pread64(2).
    Pread = 1,
    /// readv(2).
    Readv = 2,
    /// mmap(2) of the fd.
    Mmap = 3,
    /// close(2).
    Close = 4,
}

impl FileOp {
    /// Decodes [`FileIoEvent::op`].
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Read),
            1 => Some(Self::Pread),
            2 => Some(Self::Readv),
            3 => Some(Self::Mmap),
            4 => Some(Self::Close),
            _ => None,
        }
    }
    /// Name used in traces.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Pread => "pread64",
            Self::Readv => "readv",
            Self::Mmap => "mmap",
            Self::Close => "close",
        }
    }
}

/// I/O on a tracked model-file fd.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FileIoEvent {
    /// Header ([`crate::EventKind::FileIo`]); `ts_ns` is the entry time.
    pub hdr: EventHeader,
    /// [`FileOp`] as u32.
    pub op: u32,
    /// The fd.
    pub fd: i32,
    /// Return value: bytes for reads, address for mmap, 0/-errno for close.
    pub ret: i64,
    /// Bytes requested (reads: count; mmap: length).
    pub len: u64,
    /// Duration, ns.
    pub dur_ns: u64,
}

/// Most model-file path patterns the kernel matches (entries of the `PATTERNS` array map).
pub const MAX_PATTERNS: usize = 8;
/// Bytes of one model-file path pattern (without its `*`).
pub const PATTERN_LEN: usize = 32;

/// How a [`FilePattern`] matches a path.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatternKind {
    /// Unused slot.
    Unused = 0,
    /// The path ends with the bytes (`*.gguf`, or a pattern without `*`).
    Suffix = 1,
    /// The path starts with the bytes (`/models/*`).
    Prefix = 2,
}

/// One model-file path pattern, as user space writes it into the kernel's pattern map.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FilePattern {
    /// [`PatternKind`] as u32.
    pub kind: u32,
    /// Valid bytes in `bytes` (1..=[`PATTERN_LEN`]).
    pub len: u32,
    /// The literal part of the pattern.
    pub bytes: [u8; PATTERN_LEN],
}

const _: () = {
    assert!(core::mem::size_of::<FileOpenEvent>() == 48 + PATH_LEN);
    assert!(core::mem::size_of::<FileIoEvent>() == 56);
    assert!(core::mem::size_of::<FilePattern>() == 8 + PATTERN_LEN);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)], Copy, integers and arrays of integers only; every bit pattern is valid.
    unsafe impl aya::Pod for super::FilePattern {}
}
