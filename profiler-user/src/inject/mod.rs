//! Loading a library into a running process and calling functions in it, through ptrace ([`ptrace`]):
//! the injector every family that needs code in a target uses (the CUPTI helper, [`crate::cupti`]).
//!
//! Owns the decisions and the addresses: whether a library may be loaded into a target ([`trusted_path`]:
//! root owns it and every directory above it, and nobody else may write them: the target loads that file, so
//! whoever could swap it would run code in the target), whether the target can take it (a dynamic loader to
//! call, not traced by someone else), the path the target sees (when the target lives in another mount
//! namespace, as in a container, a copy in the target's own `/tmp` or `/dev/shm` made by [`copy`], removed as
//! soon as the target's `dlopen` returned: the mapping keeps the file alive), and the target's functions (its
//! libc's `.dynsym` read through [`crate::sys::elf`]: `dlopen`, or `__libc_dlopen_mode`/libdl before glibc
//! 2.34, `mmap`, `munmap`, and `__restore_rt` found by its bytes; a loaded library's functions from its
//! `.dynsym` and its load base in the target's maps). The calls go through [`ptrace`]: one thread borrowed per
//! call, every call returning through `rt_sigreturn`, so a call that outlives its deadline, or an llmprof
//! killed during it, leaves the target running. What to load and which functions to call is the caller's.

mod copy;
pub mod ptrace;

use std::path::{Path, PathBuf};
use std::time::Duration;

use object::{Object, ObjectSegment, ObjectSymbol};

pub use ptrace::Arg;
use ptrace::{Deadlines, LibcFns, PtraceError};

use crate::sys::elf;
use crate::sys::maps::{MappedFile, Maps};

/// How long stopping a thread may take.
const SEIZE_TIMEOUT: Duration = Duration::from_secs(5);
/// `RTLD_NOW`.
const RTLD_NOW: u64 = 2;
/// glibc's `__RTLD_DLOPEN`, which `__libc_dlopen_mode` callers add (dlfcn/dlfcn.h of glibc).
const RTLD_DLOPEN_INTERNAL: u64 = 0x8000_0000;
/// `__restore_rt` of glibc and musl: `mov $15, %rax; syscall` (`rt_sigreturn`), and the shorter encoding of
/// the same `mov` an assembler may choose.
const RESTORE_RT: [&[u8]; 2] = [
    &[0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05],
    &[0xb8, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05],
];

/// Why a library could not be loaded into a target, or a function called there.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// No dynamic loader in the target.
    #[error("pid {pid} is statically linked (no dlopen in its maps): a library cannot be loaded into it")]
    Static {
        /// The target.
        pid: u32,
    },
    /// Another process traces the target.
    #[error("pid {pid} is already traced by pid {tracer} (a debugger or tracer): ptrace is taken")]
    AlreadyTraced {
        /// The target.
        pid: u32,
        /// Its tracer.
        tracer: u32,
    },
    /// The kernel refused ptrace.
    #[error("cannot ptrace pid {pid}")]
    Ptrace {
        /// The target.
        pid: u32,
        /// What ptrace said.
        #[source]
        source: PtraceError,
    },
    /// The call could not be made or did not complete.
    #[error("pid {pid}: {during}")]
    Call {
        /// The target.
        pid: u32,
        /// Which call.
        during: &'static str,
        /// What happened.
        #[source]
        source: PtraceError,
    },
    /// The target exited while llmprof was calling into it.
    #[error("pid {pid} exited during {during}; nothing else was touched")]
    Exited {
        /// The target.
        pid: u32,
        /// Which call.
        during: &'static str,
    },
    /// `dlopen` returned NULL.
    #[error(
        "the target's dlopen(\"{path}\") failed: the path is not reachable from its mount namespace, not \
         readable by its user, or a dependency of the library is missing there"
    )]
    DlopenFailed {
        /// The path the target was given.
        path: String,
    },
    /// A file could not be read, written or parsed.
    #[error("{what} {path}: {detail}")]
    File {
        /// What was done.
        what: &'static str,
        /// The file.
        path: String,
        /// The error.
        detail: String,
    },
    /// A symbol is missing.
    #[error("{path} exports no {symbol}")]
    Symbol {
        /// The file.
        path: String,
        /// The symbol.
        symbol: &'static str,
    },
}

/// Where a helper library llmprof ships is not, or cannot be trusted ([`find_helper`]).
#[derive(Debug)]
pub enum HelperMissing {
    /// Not found: the paths looked at, comma-separated.
    NotFound(String),
    /// Found at `path` but not [`trusted_path`]: why.
    Untrusted {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
}

/// Finds the helper library `file` llmprof ships: `$ENV` when set, else next to the running `llmprof`, else in
/// `../lib/llmprof/` from it (a packaged install; tests find the `cargo build` output next to the binary). The
/// file found must pass [`trusted_path`]: root's, for `$ENV` (the environment of `sudo -E` is the invoking
/// user's); root's or the owner's of the running `llmprof` next to it (who can change llmprof itself gains
/// nothing). The canonical path: the kernel's maps name the resolved path, which is how the loaded library is
/// found again.
pub fn find_helper(file: &str, env: &str) -> Result<PathBuf, HelperMissing> {
    use std::os::unix::fs::MetadataExt;
    let mut looked = Vec::new();
    let mut owners = Vec::new();
    if let Some(p) = std::env::var_os(env).filter(|v| !v.is_empty()) {
        looked.push(PathBuf::from(p));
    } else if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        owners.extend(std::fs::metadata(&exe).map(|m| m.uid()));
        looked.push(dir.join(file));
        looked.push(dir.join("../lib/llmprof").join(file));
    }
    let found = looked
        .iter()
        .find(|p| p.is_file())
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| {
            HelperMissing::NotFound(
                looked
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        })?;
    trusted_path(&found, &owners).map_err(|why| HelperMissing::Untrusted {
        path: found.display().to_string(),
        why,
    })?;
    Ok(found)
}

/// Whether `path` and every directory above it belong to root (or to one of `also`) and nobody else may write
/// them: what llmprof checks before it has a target load a file by that path.
pub fn trusted_path(path: &Path, also: &[u32]) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let real = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut p = Some(real.as_path());
    while let Some(cur) = p {
        let m = std::fs::symlink_metadata(cur).map_err(|e| format!("{}: {e}", cur.display()))?;
        if m.uid() != 0 && !also.contains(&m.uid()) {
            return Err(format!("{} belongs to uid {}", cur.display(), m.uid()));
        }
        if m.mode() & 0o022 != 0 {
            return Err(format!(
                "{} is writable by its group or others (mode {:o})",
                cur.display(),
                m.mode() & 0o7777
            ));
        }
        p = cur.parent();
    }
    Ok(())
}

/// Each file `pid` maps from its start (offset 0), once, with that mapping (what a loaded library's addresses
/// are relative to).
pub fn loaded_files(pid: u32) -> Result<Vec<MappedFile>, InjectError> {
    let maps = Maps::of(pid).map_err(|_| InjectError::Exited {
        pid,
        during: "the check of its libraries",
    })?;
    let mut out: Vec<MappedFile> = Vec::new();
    for m in maps.lines() {
        if m.is_file() && m.offset == 0 && !out.iter().any(|o| o.path.as_os_str() == m.path) {
            out.push(maps.file(&m));
        }
    }
    Ok(out)
}

/// The base name of a mapped file.
pub fn basename(m: &MappedFile) -> &str {
    m.path.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// What a mapped ELF file holds for the injection: the run-time addresses and sizes (`st_size`) of the
/// `.dynsym` definitions asked for (None when missing) and the address of `__restore_rt` (found by its bytes in
/// an executable segment).
struct Found {
    symbols: Vec<Option<(u64, u64)>>,
    restore_rt: Option<u64>,
}

impl Found {
    /// The address of the `i`-th symbol asked for.
    fn addr(&self, i: usize) -> Option<u64> {
        self.symbols.get(i).copied().flatten().map(|(a, _)| a)
    }
}

/// Reads `m` once (through [`crate::sys::elf`]) for `symbols` and, when `restore_rt`, libc's `__restore_rt`.
fn lookup(m: &MappedFile, symbols: &[&'static str], restore_rt: bool) -> Result<Found, InjectError> {
    let names = symbols.to_vec();
    let start = m.start;
    elf::read(&m.source, "a library of the target", move |elf| {
        let first_load = elf::first_load(elf);
        let at = |vaddr: u64| start.wrapping_add(vaddr.wrapping_sub(first_load));
        let symbols = names
            .iter()
            .map(|n| {
                elf.dynamic_symbols()
                    .find(|s| s.is_definition() && s.name() == Ok(n))
                    .map(|s| (at(s.address()), s.size()))
            })
            .collect();
        let restore_rt = restore_rt
            .then(|| {
                elf.segments()
                    .filter(|s| matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
                    .find_map(|s| {
                        let data = s.data().ok()?;
                        RESTORE_RT.iter().find_map(|pat| {
                            data.windows(pat.len())
                                .position(|w| w == *pat)
                                .map(|i| at(s.address() + i as u64))
                        })
                    })
            })
            .flatten();
        Found { symbols, restore_rt }
    })
    .map_err(|e| InjectError::File {
        what: "cannot read",
        path: m.path.display().to_string(),
        detail: crate::causes::one_line(&e.source),
    })
}

/// The run-time addresses and sizes (`st_size`) of the `.dynsym` definitions `symbols` of the file `m` (one of
/// [`loaded_files`]), None for each one missing.
pub fn symbols_of(m: &MappedFile, symbols: &[&'static str]) -> Result<Vec<Option<(u64, u64)>>, InjectError> {
    Ok(lookup(m, symbols, false)?.symbols)
}

/// The target's libc functions a call needs, and its dlopen: (address, extra mode bits).
#[derive(Clone, Copy, Debug)]
struct TargetLibc {
    fns: LibcFns,
    dlopen: (u64, u64),
}

/// Whether a mapped file is a C library with a dynamic loader's entry points (glibc, musl).
fn libc_like(m: &&MappedFile) -> bool {
    let b = basename(m);
    b.starts_with("libc.so")
        || b.starts_with("libc-2.")
        || b.starts_with("ld-musl")
        || b.starts_with("libc.musl")
}

fn find_libc(pid: u32, mapped: &[MappedFile]) -> Result<TargetLibc, InjectError> {
    for m in mapped.iter().filter(libc_like) {
        let Ok(f) = lookup(m, &["dlopen", "__libc_dlopen_mode", "mmap", "munmap"], true) else {
            continue;
        };
        let (Some(mmap), Some(munmap), Some(restore_rt)) = (f.addr(2), f.addr(3), f.restore_rt) else {
            continue;
        };
        let fns = LibcFns {
            mmap,
            munmap,
            restore_rt,
        };
        let dlopen = match (f.addr(0), f.addr(1)) {
            (Some(a), _) => Some((a, 0)),
            (None, Some(a)) => Some((a, RTLD_DLOPEN_INTERNAL)),
            (None, None) => mapped
                .iter()
                .filter(|m| basename(m).starts_with("libdl.so"))
                .find_map(|m| lookup(m, &["dlopen"], false).ok()?.addr(0))
                .map(|a| (a, 0)),
        };
        if let Some(dlopen) = dlopen {
            return Ok(TargetLibc { fns, dlopen });
        }
    }
    Err(InjectError::Static { pid })
}

/// The run-time address of `symbol` in the first file `pid` maps whose basename `wanted` accepts (tests and
/// tools: a function to call with [`call_function`]).
pub fn symbol_in(pid: u32, wanted: impl Fn(&str) -> bool, symbol: &'static str) -> Result<u64, InjectError> {
    let mapped = loaded_files(pid)?;
    let m = mapped
        .iter()
        .find(|m| wanted(basename(m)))
        .ok_or(InjectError::Symbol {
            path: format!("pid {pid}'s maps"),
            symbol,
        })?;
    lookup(m, &[symbol], false)?
        .addr(0)
        .ok_or_else(|| InjectError::Symbol {
            path: m.path.display().to_string(),
            symbol,
        })
}

/// Whether `pid` maps a C library with a dynamic loader's entry points (a statically linked process cannot
/// load a library).
pub fn has_loader(mapped: &[MappedFile]) -> bool {
    mapped.iter().any(|m| libc_like(&m))
}

/// The target's libc functions a call needs (found again for a library an earlier llmprof loaded).
pub fn libc_of(pid: u32) -> Result<LibcFns, InjectError> {
    Ok(find_libc(pid, &loaded_files(pid)?)?.fns)
}

/// Calls `func(args…)` in a thread of `pid` (`data` copied to its stack for [`Arg::Data`]), waiting at most
/// `timeout` for the function: what [`load`] does with `dlopen`, for any function (the loaded
/// library's own, tests, tools).
pub fn call_function(
    pid: u32,
    func: u64,
    data: &[u8],
    args: &[Arg],
    timeout: Duration,
) -> Result<u64, InjectError> {
    let libc = find_libc(pid, &loaded_files(pid)?)?;
    call(pid, libc.fns, "the call", func, data, args, timeout)
}

/// A library loaded into a target by [`load`].
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The target.
    pub pid: u32,
    /// The library's path as the target sees it.
    pub target_path: String,
    /// Its mapping in the target (`probe_path`: the same file from llmprof's side, even once its copy was
    /// removed).
    pub mapping: MappedFile,
    /// The target's libc functions (for later calls).
    pub libc: LibcFns,
}

/// Loads `lib` (a file [`trusted_path`] accepted) into `pid` with `dlopen` in one of its threads, waiting at
/// most `timeout` for it: through a copy named `copy_prefix…` in the target's own root when it lives in
/// another mount namespace (removed once loaded). `mapped` is the target's [`loaded_files`].
pub fn load(
    pid: u32,
    mapped: &[MappedFile],
    lib: &Path,
    copy_prefix: &'static str,
    timeout: Duration,
) -> Result<Loaded, InjectError> {
    let libc = find_libc(pid, mapped)?;
    if let Some(tracer) = ptrace::tracer_of(pid) {
        return Err(InjectError::AlreadyTraced { pid, tracer });
    }
    let copy = copy::reachable_path(pid, lib, copy_prefix)?;
    let target_path = copy
        .as_ref()
        .map_or_else(|| lib.display().to_string(), |c| c.target_path());
    let mut path = target_path.clone().into_bytes();
    path.push(0);
    let (dlopen, mode_bits) = libc.dlopen;
    let r = call(
        pid,
        libc.fns,
        "dlopen",
        dlopen,
        &path,
        &[Arg::Data, Arg::Val(RTLD_NOW | mode_bits)],
        timeout,
    );
    // Mapped (or failed): the copy's name is not needed any more. After a timeout the loader may not have
    // opened it yet; the next injection removes it (see [`copy`]).
    let timed_out = matches!(
        &r,
        Err(InjectError::Call {
            source: PtraceError::Timeout { .. },
            ..
        })
    );
    if let Some(c) = &copy
        && !timed_out
    {
        c.remove();
    }
    if r? == 0 {
        return Err(InjectError::DlopenFailed { path: target_path });
    }
    let name = lib.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let mapped = loaded_files(pid)?;
    let mapping = mapped
        .iter()
        .find(|m| m.path.as_os_str() == target_path.as_str())
        .or_else(|| mapped.iter().find(|m| basename(m) == name))
        .cloned()
        .ok_or_else(|| InjectError::DlopenFailed {
            path: target_path.clone(),
        })?;
    Ok(Loaded {
        pid,
        target_path,
        mapping,
        libc: libc.fns,
    })
}

/// The library whose file is named `name` when `pid` maps it already (`mapped`: its [`loaded_files`]), as
/// [`load`] would have returned it: a helper an earlier session loaded is used again, never loaded twice.
pub fn already_loaded(pid: u32, mapped: &[MappedFile], name: &str) -> Result<Option<Loaded>, InjectError> {
    let Some(m) = mapped.iter().find(|m| basename(m) == name) else {
        return Ok(None);
    };
    Ok(Some(Loaded {
        pid,
        target_path: m.path.display().to_string(),
        mapping: m.clone(),
        libc: libc_of(pid)?,
    }))
}

/// Loads the library at `lib` (a file [`trusted_path`] accepted) into `pid`: [`load`] with the target's maps
/// read now.
pub fn inject(
    pid: u32,
    lib: &Path,
    copy_prefix: &'static str,
    timeout: Duration,
) -> Result<Loaded, InjectError> {
    load(pid, &loaded_files(pid)?, lib, copy_prefix, timeout)
}

impl Loaded {
    /// The run-time address and size of the library's exported `symbol`.
    pub fn export(&self, symbol: &'static str) -> Result<(u64, u64), InjectError> {
        symbols_of(&self.mapping, &[symbol])?
            .first()
            .copied()
            .flatten()
            .ok_or_else(|| InjectError::Symbol {
                path: self.target_path.clone(),
                symbol,
            })
    }

    /// Calls the library's exported function `name` with integer `args` (at most six) in a thread of the
    /// target, waiting at most `timeout`, and returns what it returned.
    pub fn call_export(
        &self,
        name: &'static str,
        args: &[u64],
        timeout: Duration,
    ) -> Result<u64, InjectError> {
        let (func, _) = self.export(name)?;
        let args: Vec<Arg> = args.iter().map(|&v| Arg::Val(v)).collect();
        call(self.pid, self.libc, name, func, &[], &args, timeout)
    }

    /// Writes `bytes` at the library's exported `symbol` in the target's memory (no more than the symbol's
    /// size, when it has one).
    pub fn write_export(&self, symbol: &'static str, bytes: &[u8]) -> Result<(), InjectError> {
        use std::os::unix::fs::FileExt as _;
        let (addr, size) = self.export(symbol)?;
        if size != 0 && bytes.len() as u64 > size {
            return Err(InjectError::File {
                what: "cannot write",
                path: format!("{symbol} in pid {}", self.pid),
                detail: format!("{} bytes into a symbol of {size}", bytes.len()),
            });
        }
        std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{}/mem", self.pid))
            .and_then(|f| f.write_all_at(bytes, addr))
            .map_err(|_| InjectError::Exited {
                pid: self.pid,
                during: "the write of an exported symbol",
            })
    }

    /// Reads `buf.len()` bytes at the library's exported `symbol` in the target's memory.
    pub fn read_export(&self, symbol: &'static str, buf: &mut [u8]) -> Result<(), InjectError> {
        use std::os::unix::fs::FileExt as _;
        let (addr, _) = self.export(symbol)?;
        std::fs::File::open(format!("/proc/{}/mem", self.pid))
            .and_then(|f| f.read_exact_at(buf, addr))
            .map_err(|_| InjectError::Exited {
                pid: self.pid,
                during: "the read of an exported symbol",
            })
    }
}

/// One call in the target (see [`ptrace`]): a thread borrowed (one in a syscall preferred), the call,
/// the thread given back.
pub fn call(
    pid: u32,
    libc_fns: LibcFns,
    what: &'static str,
    func: u64,
    data: &[u8],
    args: &[Arg],
    timeout: Duration,
) -> Result<u64, InjectError> {
    let tid = ptrace::pick_thread(pid);
    let deadlines = Deadlines {
        stop: SEIZE_TIMEOUT,
        call: timeout,
    };
    ptrace::call(pid, tid, libc_fns, func, data, args, deadlines).map_err(|source| match source {
        PtraceError::Exited => InjectError::Exited { pid, during: what },
        source @ PtraceError::Denied { .. } => InjectError::Ptrace { pid, source },
        source => InjectError::Call {
            pid,
            during: what,
            source,
        },
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests;
