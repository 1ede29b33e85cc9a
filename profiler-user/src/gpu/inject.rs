//! `--gpu-kernels`: loading llmprof's CUPTI helper library into a running CUDA process and switching it on
//! and off.
//!
//! Owns the decisions and the addresses: where the helper is (next to the `llmprof` binary, or
//! `$LLMPROF_CUPTI_LIB`; either only when root owns it and every directory above it, and nobody else may write
//! them: the target loads that file, so whoever could swap it would run code in the target), whether the
//! target can take it (a dynamic loader to call, libcuda mapped, not traced by someone else), the path the
//! target sees (when the target lives in another mount namespace, as in a container, a copy in the target's
//! own `/tmp` or `/dev/shm`, created through [`crate::sys::in_root`] so that no symlink of the target's tree
//! leads the write out of its root, never with more permissions than the source, and removed as soon as the
//! target's `dlopen` returned: the mapping keeps the file alive; copies an earlier, killed llmprof left are
//! removed the same way), the target's functions (its libc's `.dynsym`, read through
//! [`crate::sys::target_file`]: `dlopen`, or `__libc_dlopen_mode`/libdl before glibc 2.34, `mmap`, `munmap`, and
//! `__restore_rt` found by its bytes) and the helper's functions (its `.dynsym` + its load base in the target's
//! maps). The calls themselves go through [`super::ptrace`]: one thread borrowed per call, every call returning
//! through `rt_sigreturn`, so a call that outlives its deadline, or an llmprof killed during it, leaves the
//! target running.
//!
//! The sequence `attach` runs: [`inject`] (dlopen only; a helper already mapped by an earlier attach is
//! reused) → the capture's uprobe on the handoff → [`Injected::start`] → … → [`Injected::stop`] before the
//! uprobes go. It never touches the target when `--gpu-kernels off`.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use llmprof_abi::gpu::{GPU_HELPER_LIB, GPU_START, GPU_STATS, GPU_STOP, GpuHelperStats, GpuStartStatus};
use object::{Object, ObjectSegment, ObjectSymbol};

use super::ptrace::{self, Arg, Deadlines, LibcFns, PtraceError};
use crate::sys::in_root;
use crate::sys::target_file::{self, Limits, Source};

/// Overrides where llmprof looks for the helper library (a path to the `.so`; used only when root owns it and
/// the directories above it, and nobody else may write any of them).
pub const HELPER_ENV: &str = "LLMPROF_CUPTI_LIB";
/// How long the target's `dlopen` of the helper, and `GPU_START` (which loads CUPTI), may take.
const LOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stop may take (a flush of the last buffers).
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
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
/// Name prefix of the helper's copies in a target's `/tmp` or `/dev/shm`.
const COPY_PREFIX: &str = "llmprof-cupti-";

/// `--gpu-kernels`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelsMode {
    /// Inject when the target maps libcuda and the helper library is found (else say why and go on); the
    /// helper hands over summaries: per 100 ms window and kernel name count/total/min/max, the GPU's busy
    /// intervals, CUDA graph launches as a whole.
    #[default]
    Auto,
    /// As `auto`, or refuse the session.
    On,
    /// Every kernel, copy, memset and wait as its own slice, CUDA graphs node by node, with the launching
    /// calls (flows): the deep mode, more cost; or refuse the session.
    All,
    /// Never touch the target.
    Off,
}

impl KernelsMode {
    /// A failure to record refuses the session.
    pub fn strict(self) -> bool {
        matches!(self, Self::On | Self::All)
    }

    /// The flags `attach` passes to `GPU_START`: the deep mode every record and the driver/runtime calls
    /// that issued them (`GPU_FLAG_API_CALLS`: launch → kernel flows); the default summaries alone (CUPTI's
    /// API records were most of its cost: 195k in 12 s on an H200 llmserve, 3.6 M in 6 s on a PyTorch loop).
    pub fn start_flags(self) -> u64 {
        use llmprof_abi::gpu::{GPU_FLAG_API_CALLS, GPU_FLAG_EVERY_RECORD};
        match self {
            Self::All => GPU_FLAG_API_CALLS | GPU_FLAG_EVERY_RECORD,
            _ => 0,
        }
    }
}

/// Why the helper could not be loaded or called.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// The helper library is not installed next to llmprof.
    #[error(
        "the CUPTI helper library {GPU_HELPER_LIB} is not next to llmprof (looked at {looked}); build it with \
         `cargo build -p llmprof-cupti` or set {HELPER_ENV}"
    )]
    HelperNotFound {
        /// The paths tried.
        looked: String,
    },
    /// The helper library could be swapped by someone other than root.
    #[error(
        "the CUPTI helper library {path} is not loaded into a target: {why} (the target would run whatever \
         is there; install it root-owned, not group/world-writable, in root-owned directories)"
    )]
    HelperUntrusted {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// No dynamic loader in the target.
    #[error("pid {pid} is statically linked (no dlopen in its maps): a library cannot be loaded into it")]
    Static {
        /// The target.
        pid: u32,
    },
    /// libcuda is not mapped.
    #[error("pid {pid} has no CUDA driver library (libcuda.so) loaded: no GPU work to record")]
    NoLibcuda {
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
    /// The helper could not start recording (`--gpu-kernels on`).
    #[error("pid {pid}: {why}")]
    Refused {
        /// The target.
        pid: u32,
        /// What the helper answered.
        why: &'static str,
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

/// Where the helper library is: `$LLMPROF_CUPTI_LIB`, else next to the running `llmprof`, else in
/// `../lib/llmprof/` from it (a packaged install). Tests find the `cargo build` output this way: cargo puts
/// `libllmprof_cupti.so` in `target/<profile>/`, next to the `llmprof` binary. The file found must pass
/// [`trusted_path`]: root's, for `$LLMPROF_CUPTI_LIB` (the environment of `sudo -E` is the invoking user's);
/// root's or the owner's of the running `llmprof` next to it (who can change llmprof itself gains nothing).
pub fn find_helper() -> Result<PathBuf, InjectError> {
    use std::os::unix::fs::MetadataExt;
    let mut looked = Vec::new();
    let mut owners = Vec::new();
    if let Some(p) = std::env::var_os(HELPER_ENV).filter(|v| !v.is_empty()) {
        looked.push(PathBuf::from(p));
    } else if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        owners.extend(std::fs::metadata(&exe).map(|m| m.uid()));
        looked.push(dir.join(GPU_HELPER_LIB));
        looked.push(dir.join("../lib/llmprof").join(GPU_HELPER_LIB));
    }
    // Canonical: the kernel's maps name the resolved path, which is how the loaded library is found again.
    let found = looked
        .iter()
        .find(|p| p.is_file())
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| InjectError::HelperNotFound {
            looked: looked
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    trusted_path(&found, &owners).map_err(|why| InjectError::HelperUntrusted {
        path: found.display().to_string(),
        why,
    })?;
    Ok(found)
}

/// One mapped file of a process: path as the process sees it, and its offset-0 mapping.
#[derive(Clone, Debug)]
struct Mapped {
    path: String,
    start: u64,
    end: u64,
}

impl Mapped {
    /// The file, for [`target_file`]: the mapped inode itself.
    fn source(&self, pid: u32) -> Source {
        Source::Mapping {
            pid,
            start: self.start,
            end: self.end,
            path: self.path.clone(),
        }
    }
}

fn maps(pid: u32) -> Result<Vec<Mapped>, InjectError> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|_| InjectError::Exited {
        pid,
        during: "the check of its libraries",
    })?;
    let mut out: Vec<Mapped> = Vec::new();
    for m in text.lines().filter_map(crate::procfs::MapsLine::parse) {
        if m.is_file() && m.offset == 0 && !out.iter().any(|o| o.path == m.path) {
            out.push(Mapped {
                path: m.path.to_owned(),
                start: m.start,
                end: m.end,
            });
        }
    }
    Ok(out)
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

fn same_mount_ns(pid: u32) -> bool {
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
    ns("self") == ns(&pid.to_string())
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

/// Reads `m` once (through [`target_file`]) for `symbols` and, when `restore_rt`, libc's `__restore_rt`.
fn lookup(pid: u32, m: &Mapped, symbols: &[&'static str], restore_rt: bool) -> Result<Found, InjectError> {
    let src = m.source(pid);
    let names = symbols.to_vec();
    let start = m.start;
    target_file::with_elf(&src, Limits::ELF, move |elf| {
        let first_load = elf.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
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
        path: m.path.clone(),
        detail: crate::causes::one_line(&e),
    })
}

/// The target's libc functions a call needs, and its dlopen: (address, extra mode bits).
#[derive(Clone, Copy, Debug)]
struct TargetLibc {
    fns: LibcFns,
    dlopen: (u64, u64),
}

/// Whether a mapped file is a C library with a dynamic loader's entry points (glibc, musl).
fn libc_like(m: &&Mapped) -> bool {
    let b = basename(&m.path);
    b.starts_with("libc.so")
        || b.starts_with("libc-2.")
        || b.starts_with("ld-musl")
        || b.starts_with("libc.musl")
}

fn find_libc(pid: u32, mapped: &[Mapped]) -> Result<TargetLibc, InjectError> {
    for m in mapped.iter().filter(libc_like) {
        let Ok(f) = lookup(pid, m, &["dlopen", "__libc_dlopen_mode", "mmap", "munmap"], true) else {
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
                .filter(|m| basename(&m.path).starts_with("libdl.so"))
                .find_map(|m| lookup(pid, m, &["dlopen"], false).ok()?.addr(0))
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
    let mapped = maps(pid)?;
    let m = mapped
        .iter()
        .find(|m| wanted(basename(&m.path)))
        .ok_or(InjectError::Symbol {
            path: format!("pid {pid}'s maps"),
            symbol,
        })?;
    lookup(pid, m, &[symbol], false)?
        .addr(0)
        .ok_or_else(|| InjectError::Symbol {
            path: m.path.clone(),
            symbol,
        })
}

/// Calls `func(args…)` in a thread of `pid` (`data` copied to its stack for [`Arg::Data`]), waiting at most
/// `timeout` for the function: what [`inject`] and [`Injected::start`]/[`Injected::stop`] do, for any function
/// (tests, tools).
pub fn call_function(
    pid: u32,
    func: u64,
    data: &[u8],
    args: &[Arg],
    timeout: Duration,
) -> Result<u64, InjectError> {
    let libc = find_libc(pid, &maps(pid)?)?;
    call(pid, libc.fns, "the call", func, data, args, timeout)
}

/// The helper library loaded in a target.
#[derive(Clone, Debug)]
pub struct Injected {
    /// The target.
    pub pid: u32,
    /// The library's path as the target sees it.
    pub target_path: String,
    /// The same file from llmprof's side, even once its copy was removed: `/proc/PID/map_files/START-END`
    /// (what a uprobe attaches to).
    pub host_path: PathBuf,
    /// It was already loaded (an earlier attach): not loaded again.
    pub reused: bool,
    libc: Option<LibcFns>,
    start_fn: u64,
    stop_fn: u64,
    stats: u64,
    /// Bytes of the helper's counters (their symbol's size, at most [`GpuHelperStats`]'s): a helper an earlier
    /// llmprof loaded has fewer; the rest read as 0.
    stats_len: usize,
}

impl Injected {
    /// The helper records summaries when asked to (a helper of the oldest chunk version, loaded by an earlier
    /// llmprof, records every kernel whatever the flags).
    pub fn summarizes(&self) -> bool {
        self.stats_len == 0 || self.stats_len >= core::mem::size_of::<GpuHelperStats>()
    }
}

/// Loads the helper into `pid` (dlopen in one of its threads), or finds it there from an earlier attach.
/// The checks come in the order a user can act on, and a target that is simply not a CUDA process (no
/// libcuda, statically linked) is told so before a missing helper is.
pub fn inject(pid: u32) -> Result<Injected, InjectError> {
    let mapped = maps(pid)?;
    if let Some(m) = mapped.iter().find(|m| basename(&m.path) == GPU_HELPER_LIB) {
        return resolve(pid, m, true);
    }
    // Cheap checks first: most processes of a tree are not CUDA processes.
    if !mapped.iter().any(|m| libc_like(&m)) {
        return Err(InjectError::Static { pid });
    }
    if !mapped
        .iter()
        .any(|m| basename(&m.path).starts_with(super::libcuda::LIBCUDA_PREFIX))
    {
        return Err(InjectError::NoLibcuda { pid });
    }
    let libc = find_libc(pid, &mapped)?;
    let helper = find_helper()?;
    if let Some(tracer) = ptrace::tracer_of(pid) {
        return Err(InjectError::AlreadyTraced { pid, tracer });
    }
    let copy = reachable_path(pid, &helper)?;
    let target_path = copy
        .as_ref()
        .map_or_else(|| helper.display().to_string(), |c| c.target_path());
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
        LOAD_TIMEOUT,
    );
    // Mapped (or failed): the copy's name is not needed any more. After a timeout the loader may not have
    // opened it yet; the next injection removes it (see [`remove_stale_copies`]).
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
    let mapped = maps(pid)?;
    let m = mapped
        .iter()
        .find(|m| m.path == target_path)
        .or_else(|| mapped.iter().find(|m| basename(&m.path) == GPU_HELPER_LIB))
        .ok_or_else(|| InjectError::DlopenFailed {
            path: target_path.clone(),
        })?;
    let mut i = resolve(pid, m, false)?;
    i.libc = Some(libc.fns);
    Ok(i)
}

/// The helper already loaded in `pid` (by an earlier attach), if any; nothing is called in the target.
pub fn find_loaded(pid: u32) -> Result<Option<Injected>, InjectError> {
    let mapped = maps(pid)?;
    mapped
        .iter()
        .find(|m| basename(&m.path) == GPU_HELPER_LIB)
        .map(|m| resolve(pid, m, true))
        .transpose()
}

fn resolve(pid: u32, m: &Mapped, reused: bool) -> Result<Injected, InjectError> {
    let names = [GPU_START, GPU_STOP, GPU_STATS];
    let f = lookup(pid, m, &names, false)?;
    let at = |i: usize| {
        f.symbols[i].ok_or(InjectError::Symbol {
            path: m.path.clone(),
            symbol: names[i],
        })
    };
    let (stats, stats_len) = at(2)?;
    Ok(Injected {
        pid,
        target_path: m.path.clone(),
        start_fn: at(0)?.0,
        stop_fn: at(1)?.0,
        stats,
        stats_len: stats_len.min(core::mem::size_of::<GpuHelperStats>() as u64) as usize,
        host_path: PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end)),
        reused,
        libc: None,
    })
}

/// A copy of the helper in a target's own root, removed once loaded.
#[derive(Debug)]
struct HelperCopy {
    pid: u32,
    /// `/tmp` or `/dev/shm`, in the target's root.
    parent: &'static str,
    /// The directory made there.
    dir: String,
}

impl HelperCopy {
    fn target_path(&self) -> String {
        format!("{}/{}/{GPU_HELPER_LIB}", self.parent, self.dir)
    }

    /// Removes the file and its directory (resolved inside the target's root; never through a link).
    fn remove(&self) {
        if let Err(e) = remove_copy(self.pid, self.parent, &self.dir) {
            say(&format!(
                "could not remove the helper's copy {} in pid {}'s root: {e}",
                self.target_path(),
                self.pid
            ));
        }
    }
}

fn remove_copy(pid: u32, parent: &str, dir: &str) -> std::io::Result<()> {
    let root = in_root::open_root(pid)?;
    let parent_fd = in_root::openat(root.as_fd(), parent, libc::O_PATH | libc::O_DIRECTORY, 0)?;
    let dir_fd = in_root::openat(
        parent_fd.as_fd(),
        dir,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )?;
    match in_root::unlinkat(dir_fd.as_fd(), GPU_HELPER_LIB, 0) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    in_root::unlinkat(parent_fd.as_fd(), dir, libc::AT_REMOVEDIR)
}

/// Removes the copies of the helper left in `parent` (`/tmp`, `/dev/shm` of the target's root) by an llmprof
/// that is gone (killed before it could remove them) or by this one: only root's directories named
/// `llmprof-cupti-PID-…`, whose PID is not another running llmprof. A target that still maps such a copy
/// keeps it mapped.
fn remove_stale_copies(pid: u32, root: &OwnedFd, parent: &'static str) {
    let Ok(dir) = in_root::openat(root.as_fd(), parent, libc::O_RDONLY | libc::O_DIRECTORY, 0) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) else {
        return;
    };
    let me = std::process::id();
    for e in entries.flatten().take(10_000) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(owner) = name
            .strip_prefix(COPY_PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive_llmprof = owner != me
            && std::fs::read_to_string(format!("/proc/{owner}/comm")).is_ok_and(|c| c.trim() == "llmprof");
        if alive_llmprof {
            continue;
        }
        let Ok(d) = in_root::openat(
            dir.as_fd(),
            &name,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        ) else {
            continue;
        };
        if in_root::fstat(d.as_fd()).is_ok_and(|st| st.st_uid == 0) && remove_copy(pid, parent, &name).is_ok()
        {
            say(&format!(
                "removed {parent}/{name} in pid {pid}'s root, a copy an earlier llmprof left"
            ));
        }
    }
}

/// The path the target can open: the helper itself when the target shares llmprof's mount namespace, else a
/// copy in the target's own /tmp (or /dev/shm): a new root-owned directory and file, created inside the
/// target's root ([`in_root`]), with the source's permissions at most (and never more than 0755).
fn reachable_path(pid: u32, helper: &Path) -> Result<Option<HelperCopy>, InjectError> {
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt;
    if same_mount_ns(pid) {
        return Ok(None);
    }
    let file_err = |what: &'static str, path: String, e: &dyn std::fmt::Display| InjectError::File {
        what,
        path,
        detail: e.to_string(),
    };
    let bytes =
        std::fs::read(helper).map_err(|e| file_err("cannot read", helper.display().to_string(), &e))?;
    let mode = std::fs::metadata(helper)
        .map(|m| m.permissions().mode() & 0o755)
        .map_err(|e| file_err("cannot read", helper.display().to_string(), &e))?;
    let root =
        in_root::open_root(pid).map_err(|e| file_err("cannot open the root of", format!("pid {pid}"), &e))?;
    let dir = format!(
        "{COPY_PREFIX}{}-{}",
        std::process::id(),
        llmprof_trace::clock::boottime_ns()
    );
    let mut last = String::new();
    for parent in ["/tmp", "/dev/shm"] {
        remove_stale_copies(pid, &root, parent);
        let made = (|| -> std::io::Result<()> {
            let parent_fd = in_root::openat(root.as_fd(), parent, libc::O_PATH | libc::O_DIRECTORY, 0)?;
            in_root::mkdirat(parent_fd.as_fd(), &dir, mode | 0o700)?;
            let dir_fd = in_root::openat(
                parent_fd.as_fd(),
                &dir,
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
            )?;
            let fd = in_root::openat(
                dir_fd.as_fd(),
                GPU_HELPER_LIB,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                mode,
            )?;
            let mut f = std::fs::File::from(fd);
            f.write_all(&bytes)?;
            // The umask may have removed bits; the target's user must still read (and map) it.
            f.set_permissions(std::fs::Permissions::from_mode(mode))
        })();
        match made {
            Ok(()) => {
                return Ok(Some(HelperCopy {
                    pid,
                    parent,
                    dir: dir.clone(),
                }));
            }
            Err(e) => {
                let _ = remove_copy(pid, parent, &dir);
                last = format!("{parent}: {e}");
            }
        }
    }
    Err(InjectError::File {
        what: "cannot copy the helper into the target's mount namespace at",
        path: format!("pid {pid}'s /tmp or /dev/shm"),
        detail: last,
    })
}

/// One call in the target (see [`super::ptrace`]): a thread borrowed (one in a syscall preferred), the call,
/// the thread given back.
fn call(
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

impl Injected {
    /// The target's libc functions (found again for a helper an earlier attach loaded).
    fn libc(&self) -> Result<LibcFns, InjectError> {
        match self.libc {
            Some(l) => Ok(l),
            None => Ok(find_libc(self.pid, &maps(self.pid)?)?.fns),
        }
    }

    /// Calls `GPU_START(flags)` in the target.
    pub fn start(&self, flags: u64) -> Result<Option<GpuStartStatus>, InjectError> {
        let v = call(
            self.pid,
            self.libc()?,
            GPU_START,
            self.start_fn,
            &[],
            &[Arg::Val(flags)],
            LOAD_TIMEOUT,
        )?;
        Ok(GpuStartStatus::from_raw(v as u32))
    }

    /// Calls `GPU_STOP()` in the target (flush, disable, unsubscribe; the library stays).
    pub fn stop(&self) -> Result<(), InjectError> {
        call(
            self.pid,
            self.libc()?,
            GPU_STOP,
            self.stop_fn,
            &[],
            &[],
            STOP_TIMEOUT,
        )
        .map(|_| ())
    }

    /// The helper's counters, read from the target's memory.
    pub fn stats(&self) -> Result<GpuHelperStats, InjectError> {
        use std::os::unix::fs::FileExt as _;
        let mut buf = [0u8; core::mem::size_of::<GpuHelperStats>()];
        let len = if self.stats_len == 0 {
            buf.len()
        } else {
            self.stats_len
        };
        std::fs::File::open(format!("/proc/{}/mem", self.pid))
            .and_then(|f| f.read_exact_at(&mut buf[..len], self.stats))
            .map_err(|_| InjectError::Exited {
                pid: self.pid,
                during: "the read of the helper's counters",
            })?;
        let w = |i: usize| u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        Ok(GpuHelperStats {
            chunks: w(0),
            records: w(1),
            names: w(2),
            dropped: w(3),
            buffers: w(4),
            starts: w(5),
            stops: w(6),
            active: w(7),
            cupti_records: w(8),
            helper_cpu_ns: w(9),
            cupti_thread_cpu_ns: w(10),
            flags: w(11),
            summaries: w(12),
            busy: w(13),
            graph_trace: w(14),
        })
    }
}

/// `--gpu-kernels` in one session: the helper injected into each process of the traced tree that uses CUDA
/// (the `--pid` process and its children at attach, and any process of the tree that loads libcuda later, e.g.
/// vLLM's engine core), and whether each records.
#[derive(Debug, Default)]
pub struct GpuKernels {
    mode: KernelsMode,
    /// The processes the helper is loaded in, and whether `GPU_START` succeeded there.
    procs: Vec<(Injected, bool)>,
    /// Processes already looked at (injected, refused, or without CUDA when looked at).
    tried: std::collections::HashSet<u32>,
    /// Per recording process: its helper's counters when this session started it (a helper reused from an
    /// earlier session counts from there).
    base: std::collections::HashMap<u32, GpuHelperStats>,
    /// What the processes stopped so far used during this session.
    stopped: crate::selfacct::CuptiCounters,
}

/// One line on stderr, ignoring a closed stderr.
fn say(msg: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "llmprof: GPU kernels: {msg}");
}

impl GpuKernels {
    /// Step 1 (before capture): loads the helper into each of `pids` that uses CUDA (`off`: nothing). `on`
    /// refuses with the reason when a process with libcuda cannot be injected or when none has libcuda; `auto`
    /// says it in one line (nothing for a process that simply does not use CUDA) and goes on.
    pub fn prepare(mode: KernelsMode, pids: &[u32]) -> Result<Self, InjectError> {
        let mut k = Self {
            mode,
            procs: Vec::new(),
            tried: std::collections::HashSet::new(),
            base: std::collections::HashMap::new(),
            stopped: crate::selfacct::CuptiCounters::default(),
        };
        if mode == KernelsMode::Off {
            return Ok(k);
        }
        let mut no_cuda = None;
        for &pid in pids {
            // A process without libcuda yet is looked at again on later ticks ([`GpuKernels::adopt`]).
            let r = k.load(pid);
            if !matches!(r, Err(InjectError::NoLibcuda { .. })) {
                k.tried.insert(pid);
            }
            match r {
                Ok(()) => {}
                Err(e @ (InjectError::NoLibcuda { .. } | InjectError::Static { .. })) => {
                    no_cuda.get_or_insert(e);
                }
                Err(e) if mode.strict() => return Err(e),
                Err(e) => say(&format!("not recorded in pid {pid}: {e}")),
            }
        }
        match no_cuda {
            Some(e) if mode.strict() && k.procs.is_empty() => Err(e),
            _ => Ok(k),
        }
    }

    /// Loads the helper into `pid` (dlopen only).
    fn load(&mut self, pid: u32) -> Result<(), InjectError> {
        let t0 = std::time::Instant::now();
        let i = inject(pid)?;
        say(&format!(
            "{} {} in pid {pid} ({:.1} ms)",
            if i.reused { "reusing" } else { "loaded" },
            i.target_path,
            t0.elapsed().as_secs_f64() * 1e3
        ));
        self.procs.push((i, false));
        Ok(())
    }

    /// The helpers loaded and not started yet (the capture's handoff uprobe goes on each `host_path`, then
    /// [`GpuKernels::start`]).
    pub fn pending(&self) -> Vec<Injected> {
        self.procs
            .iter()
            .filter(|(_, s)| !s)
            .map(|(i, _)| i.clone())
            .collect()
    }

    /// A process of the tree seen on a later tick: when it has libcuda now and was not looked at with it, the
    /// helper is loaded into it (`auto` and `on`; a failure is said in one line, the session goes on). True
    /// when it was loaded: the caller attaches the handoff and calls [`GpuKernels::start`].
    pub fn adopt(&mut self, pid: u32) -> bool {
        if self.mode == KernelsMode::Off || self.tried.contains(&pid) {
            return false;
        }
        if crate::gpu::libcuda::find_in_process(pid).is_none() {
            // Looked at again on the next tick: CUDA may be initialised later (PyTorch does it lazily).
            return false;
        }
        self.tried.insert(pid);
        match self.load(pid) {
            Ok(()) => true,
            Err(InjectError::NoLibcuda { .. } | InjectError::Static { .. }) => false,
            Err(e) => {
                say(&format!("not recorded in pid {pid}: {e}"));
                false
            }
        }
    }

    /// Step 2 (after `pid`'s handoff uprobe is live): `GPU_START` there. A subscriber already in the target is
    /// said in one line and the session goes on without its kernels; other refusals fail `on` sessions. True
    /// when the helper records.
    pub fn start(&mut self, pid: u32) -> Result<bool, InjectError> {
        let mode = self.mode;
        let Some((inj, started)) = self.procs.iter_mut().find(|(i, _)| i.pid == pid) else {
            return Ok(false);
        };
        let t0 = std::time::Instant::now();
        let status = match inj.start(mode.start_flags()) {
            Ok(s) => s,
            Err(e) if mode.strict() => return Err(e),
            Err(e) => {
                say(&format!("not recorded in pid {pid}: {e}"));
                return Ok(false);
            }
        };
        if matches!(
            status,
            Some(GpuStartStatus::Started | GpuStartStatus::AlreadyStarted)
        ) && let Ok(b) = inj.stats()
        {
            self.base.insert(pid, b);
        }
        let why = match status {
            Some(GpuStartStatus::Started) => {
                *started = true;
                say(&format!(
                    "recording {} in pid {pid} (started in {:.1} ms)",
                    if mode == KernelsMode::All {
                        "every kernel"
                    } else if inj.summarizes() {
                        "kernel summaries"
                    } else {
                        "every kernel (the helper an earlier llmprof loaded there does not summarize; \
                         restart the process for summaries)"
                    },
                    t0.elapsed().as_secs_f64() * 1e3
                ));
                return Ok(true);
            }
            Some(GpuStartStatus::AlreadyStarted) => {
                // An earlier session ended without stopping it: it records; this session stops it.
                *started = true;
                return Ok(true);
            }
            Some(GpuStartStatus::SubscriberTaken) => {
                say(&format!(
                    "CUPTI already has a subscriber in pid {pid} (Kineto, Nsight or another tool): going on without its kernels"
                ));
                return Ok(false);
            }
            Some(GpuStartStatus::NoCupti) => {
                "no CUPTI library (libcupti.so) found in or next to the target's CUDA libraries"
            }
            Some(GpuStartStatus::NoLibcuda) => "the target has no libcuda loaded",
            Some(GpuStartStatus::CuptiError) => "CUPTI refused to record (see the target's stderr)",
            None => "the helper answered an unknown status",
        };
        if mode.strict() {
            return Err(InjectError::Refused { pid, why });
        }
        say(&format!("not recorded in pid {pid}: {why}"));
        Ok(false)
    }

    /// The end (before the uprobes go): `GPU_STOP` (flush, disable, unsubscribe) in every process that
    /// records, and the helpers' counters summed.
    pub fn stop(&mut self) -> Option<GpuHelperStats> {
        let mut total: Option<GpuHelperStats> = None;
        for (inj, started) in &mut self.procs {
            if !std::mem::take(started) {
                continue;
            }
            let t0 = std::time::Instant::now();
            if let Err(e) = inj.stop() {
                say(&format!("stopping the helper in pid {} failed: {e}", inj.pid));
            }
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            let Ok(s) = inj.stats() else { continue };
            let used = since(&s, self.base.get(&inj.pid));
            self.stopped.records += used.records;
            self.stopped.thread_cpu_ns += used.thread_cpu_ns;
            say(&format!(
                "stopped in pid {} in {ms:.1} ms; the helper handed over {} chunks ({} records, {} names, {} dropped; {} summary rows, {} busy intervals, from {} CUPTI records; graph-level records {}) since it was loaded",
                inj.pid,
                s.chunks,
                s.records,
                s.names,
                s.dropped,
                s.summaries,
                s.busy,
                s.cupti_records,
                if s.graph_trace != 0 { "on" } else { "off" }
            ));
            let t = total.get_or_insert_with(GpuHelperStats::default);
            t.chunks += s.chunks;
            t.records += s.records;
            t.names += s.names;
            t.dropped += s.dropped;
            t.cupti_records += s.cupti_records;
            t.summaries += s.summaries;
            t.busy += s.busy;
            t.helper_cpu_ns += s.helper_cpu_ns;
            t.cupti_thread_cpu_ns += s.cupti_thread_cpu_ns;
            t.graph_trace |= s.graph_trace;
        }
        total
    }
}

/// What a helper used since `base` (its counters when this session started it).
fn since(now: &GpuHelperStats, base: Option<&GpuHelperStats>) -> crate::selfacct::CuptiCounters {
    let b = base.copied().unwrap_or_default();
    crate::selfacct::CuptiCounters {
        records: now.cupti_records.saturating_sub(b.cupti_records),
        thread_cpu_ns: now.cupti_thread_cpu_ns.saturating_sub(b.cupti_thread_cpu_ns),
    }
}

impl GpuKernels {
    /// What the helpers used during this session so far (the recording ones read from their targets'
    /// memory now, the stopped ones as they were at their stop), for the self-accounting
    /// ([`crate::selfacct::CuptiCost`]).
    pub fn counters(&self) -> crate::selfacct::CuptiCounters {
        let mut total = self.stopped;
        for (inj, started) in &self.procs {
            if !started {
                continue;
            }
            let Ok(s) = inj.stats() else { continue };
            let used = since(&s, self.base.get(&inj.pid));
            total.records += used.records;
            total.thread_cpu_ns += used.thread_cpu_ns;
        }
        total
    }
}

impl Drop for GpuKernels {
    /// A session that ends early (an error) still turns CUPTI off in the target.
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_dlopen_and_no_libcuda() {
        let pid = std::process::id();
        let m = maps(pid).unwrap();
        let libc = find_libc(pid, &m).unwrap();
        // The addresses are libc's as this process's loader resolves them.
        for (name, addr) in [
            (c"dlopen", libc.dlopen.0),
            (c"mmap", libc.fns.mmap),
            (c"munmap", libc.fns.munmap),
        ] {
            // SAFETY: dlsym with a valid handle constant and a NUL-terminated name.
            let here = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as u64;
            assert_eq!(addr, here, "{name:?}");
        }
        // __restore_rt is what sigaction installs as the return path of a signal handler.
        extern "C" fn nothing(_: libc::c_int) {}
        // SAFETY: an all-zero sigaction is valid; installing a handler for SIGUSR2, which this test owns, and
        // reading it back.
        let restorer = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = nothing as *const () as usize;
            libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut());
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGUSR2, std::ptr::null(), &mut old);
            old.sa_restorer
        };
        if let Some(r) = restorer {
            assert_eq!(libc.fns.restore_rt, r as usize as u64);
        }
        assert!(!m.iter().any(|m| basename(&m.path).starts_with("libcuda.so")));
        assert!(same_mount_ns(pid));
    }

    /// `cat` reading a pipe, and a way to check it still echoes.
    struct Cat {
        child: std::process::Child,
    }

    impl Cat {
        fn spawn() -> Cat {
            let child = std::process::Command::new("cat")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            // Until it blocks in its read.
            let pid = child.id();
            for _ in 0..200 {
                let sc = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
                if sc.starts_with("0 ") {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Cat { child }
        }

        fn echoes(&mut self, line: &str) -> bool {
            use std::io::{BufRead, Write};
            let stdin = self.child.stdin.as_mut().unwrap();
            writeln!(stdin, "{line}").unwrap();
            stdin.flush().unwrap();
            let mut out = String::new();
            std::io::BufReader::new(self.child.stdout.as_mut().unwrap())
                .read_line(&mut out)
                .unwrap();
            out.trim_end() == line
        }
    }

    impl Drop for Cat {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    #[test]
    fn a_call_returns_its_value_and_the_thread_goes_back_to_its_read() {
        let mut cat = Cat::spawn();
        let pid = cat.child.id();
        let getpid = symbol_in(pid, |b| b.starts_with("libc.so"), "getpid").unwrap();
        assert_eq!(
            call_function(pid, getpid, &[], &[], Duration::from_secs(10)).unwrap(),
            u64::from(pid)
        );
        // Data on its stack, read back by the target: atoi("12345").
        let atoi = symbol_in(pid, |b| b.starts_with("libc.so"), "atoi").unwrap();
        let n = call_function(pid, atoi, b"12345\0", &[Arg::Data], Duration::from_secs(10)).unwrap();
        assert_eq!(n, 12345);
        assert!(cat.echoes("still reading"));
        // No stub page left behind: the call's page was unmapped.
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let stub = maps
            .lines()
            .filter_map(crate::procfs::MapsLine::parse)
            .any(|m| m.perms == "r-xp" && m.path.is_empty());
        assert!(!stub, "{maps}");
    }

    #[test]
    fn a_crashing_call_is_undone_without_the_signal() {
        let mut cat = Cat::spawn();
        let pid = cat.child.id();
        let e = call_function(pid, 0x10, &[], &[], Duration::from_secs(10)).unwrap_err();
        assert!(
            matches!(
                e,
                InjectError::Call {
                    source: PtraceError::Crashed {
                        signal: libc::SIGSEGV,
                        ..
                    },
                    ..
                }
            ),
            "{e}"
        );
        assert!(cat.echoes("survived"));
    }

    #[test]
    fn a_call_past_its_deadline_is_left_to_finish_and_the_thread_comes_back() {
        let mut cat = Cat::spawn();
        let pid = cat.child.id();
        let sleep = symbol_in(pid, |b| b.starts_with("libc.so"), "sleep").unwrap();
        let t0 = std::time::Instant::now();
        let e = call_function(pid, sleep, &[], &[Arg::Val(2)], Duration::from_millis(300)).unwrap_err();
        assert!(
            matches!(
                e,
                InjectError::Call {
                    source: PtraceError::Timeout { .. },
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "the caller was not held by the call"
        );
        // The thread is not traced any more and finishes the sleep on its own, then reads again.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while ptrace::tracer_of(pid).is_some() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(ptrace::tracer_of(pid), None);
        assert!(cat.echoes("after the sleep"));
        assert!(t0.elapsed() >= Duration::from_secs(2));
    }

    #[test]
    fn the_thread_picked_is_one_of_the_targets_and_nothing_is_loaded_here() {
        let pid = std::process::id();
        let tid = ptrace::pick_thread(pid);
        assert!(std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists());
        assert!(find_loaded(pid).unwrap().is_none());
        assert!(matches!(inject(pid), Err(InjectError::NoLibcuda { .. })));
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    /// A process in its own mount namespace whose root is `root` (a static `pause` made by gcc).
    fn rooted_pause(root: &Path) -> std::process::Child {
        let src = root.join("pause.c");
        std::fs::write(
            &src,
            "#include <unistd.h>\nint main(void) { for (;;) pause(); }\n",
        )
        .unwrap();
        std::fs::create_dir_all(root.join("bin")).unwrap();
        let o = std::process::Command::new("gcc")
            .args(["-static", "-O1", "-o"])
            .arg(root.join("bin/pause"))
            .arg(&src)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let child = std::process::Command::new("unshare")
            .arg("-m")
            .arg(format!("--root={}", root.display()))
            .arg("/bin/pause")
            .spawn()
            .unwrap();
        let pid = child.id();
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::read_link(format!("/proc/{pid}/exe")).map_or(true, |e| !e.ends_with("bin/pause")) {
            assert!(std::time::Instant::now() < until, "unshare --root did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        child
    }

    #[test]
    fn the_helpers_copy_stays_inside_the_targets_root_and_is_removed() {
        if !is_root() {
            return;
        }
        let have = |p: &str| {
            std::process::Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !have("gcc") || !have("unshare") {
            return;
        }
        let base = std::env::temp_dir().join(format!("llmprof-inject-root-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("root");
        let victim = base.join("victim");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&victim).unwrap();
        // The target's /tmp is an absolute symlink to a directory of the host; it has no /dev/shm.
        std::os::unix::fs::symlink(&victim, root.join("tmp")).unwrap();
        let helper = base.join("libhelper.so");
        std::fs::write(&helper, b"not really a library").unwrap();
        let mut child = rooted_pause(&root);
        let pid = child.id();
        assert!(!same_mount_ns(pid));
        let e = reachable_path(pid, &helper).unwrap_err();
        assert!(e.to_string().contains("cannot copy"), "{e}");
        assert_eq!(
            std::fs::read_dir(&victim).unwrap().count(),
            0,
            "nothing written through the symlink"
        );
        // With a /dev/shm of its own, the copy goes there, with the source's mode at most, and goes away.
        std::fs::create_dir_all(root.join("dev/shm")).unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o640)).unwrap();
        }
        let copy = reachable_path(pid, &helper).unwrap().unwrap();
        let inside = root.join(copy.target_path().trim_start_matches('/'));
        assert!(
            copy.target_path().starts_with("/dev/shm/llmprof-cupti-"),
            "{}",
            copy.target_path()
        );
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&inside).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o640, "never wider than the source");
        }
        copy.remove();
        assert_eq!(std::fs::read_dir(root.join("dev/shm")).unwrap().count(), 0);
        // A copy a killed llmprof left (a pid that is not a running llmprof) is removed by the next one.
        let stale = root.join("dev/shm/llmprof-cupti-999999999-1");
        std::fs::create_dir_all(&stale).unwrap();
        std::fs::write(stale.join(GPU_HELPER_LIB), b"old").unwrap();
        let copy = reachable_path(pid, &helper).unwrap().unwrap();
        assert!(!stale.exists(), "the stale copy was removed");
        copy.remove();
        let _ = child.kill();
        let _ = child.wait();
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_thread_that_does_not_stop_in_time_is_let_go_when_it_does() {
        // A parent waiting for its vfork child is in an uninterruptible wait: a ptrace stop waits for the child.
        let have_gcc = std::process::Command::new("gcc")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !is_root() || !have_gcc {
            return;
        }
        let base = std::env::temp_dir().join(format!("llmprof-inject-vfork-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let src = base.join("vfork.c");
        std::fs::write(
            &src,
            "#define _GNU_SOURCE\n#include <sched.h>\n#include <sys/syscall.h>\n#include <time.h>\n\
             #include <unistd.h>\nint main(void) { sleep(1); if (vfork() == 0) { struct timespec t = {3, 0}; \
             syscall(SYS_nanosleep, &t, 0); _exit(0); } return 7; }\n",
        )
        .unwrap();
        let bin = base.join("vfork");
        let o = std::process::Command::new("gcc")
            .args(["-O1", "-o"])
            .arg(&bin)
            .arg(&src)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let child = std::process::Command::new(&bin).spawn().unwrap();
        let pid = child.id();
        let state = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit(')').next()?.split_whitespace().next().map(str::to_owned))
        };
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while state().as_deref() != Some("D") {
            assert!(
                std::time::Instant::now() < until,
                "never waited for its vfork child"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let libc = find_libc(pid, &maps(pid).unwrap()).unwrap();
        let getpid = lookup(
            pid,
            maps(pid).unwrap().iter().find(libc_like).unwrap(),
            &["getpid"],
            false,
        )
        .unwrap()
        .addr(0)
        .unwrap();
        let deadlines = Deadlines {
            stop: Duration::from_millis(300),
            call: Duration::from_secs(5),
        };
        let e = ptrace::call(pid, pid as i32, libc.fns, getpid, &[], &[], deadlines).unwrap_err();
        assert!(
            matches!(
                e,
                PtraceError::Timeout {
                    what: "the thread did not stop",
                    ..
                }
            ),
            "{e}"
        );
        // When its child exits, the parent stops for the tracer, is let go untouched, and exits as it would.
        // (Its exit only: this test thread's wait must not take the stop meant for the tracing thread.)
        // SAFETY: an all-zero siginfo_t is a valid value; waitid writes one into it.
        let (r, code) = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::__WNOTHREAD);
            (r, info.si_status())
        };
        assert_eq!((r, code), (0, 7));
        drop(child);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_helper_others_could_swap_is_not_trusted() {
        let base = std::env::temp_dir().join(format!("llmprof-inject-trust-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let lib = base.join("lib.so");
        std::fs::write(&lib, b"x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = trusted_path(&lib, &[]).unwrap_err();
        assert!(e.contains("writable by its group or others"), "{e}");
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o644)).unwrap();
        // The system's temporary directory is writable by everyone: nothing under it is trusted.
        let tmp_world_writable = std::env::temp_dir() == Path::new("/tmp");
        if is_root() && tmp_world_writable {
            assert!(trusted_path(&lib, &[]).is_err());
        }
        assert!(trusted_path(Path::new("/usr/bin/env"), &[]).is_ok() || !is_root());
        // Another owner is trusted only when named (the owner of the running llmprof, for files next to it).
        if is_root() {
            let dir = base.join("user");
            std::fs::create_dir_all(&dir).unwrap();
            let lib = dir.join("lib.so");
            std::fs::write(&lib, b"x").unwrap();
            std::os::unix::fs::chown(&lib, Some(65534), None).unwrap();
            let e = trusted_path(&lib, &[]).unwrap_err();
            assert!(e.contains("uid 65534"), "{e}");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_missing_helper_names_where_it_looked() {
        let err = InjectError::HelperNotFound {
            looked: "/x/libllmprof_cupti.so".into(),
        };
        assert!(err.to_string().contains("cargo build -p llmprof-cupti"), "{err}");
    }
}
