//! `--gpu-kernels`: loading llmprof's CUPTI helper library into a running CUDA process and switching it on
//! and off.
//!
//! Owns the decisions and the addresses: where the helper is (next to the `llmprof` binary), whether the
//! target can take it (a dynamic loader to call, libcuda mapped, not traced by someone else), the path the
//! target sees (the library is copied under `/proc/PID/root/tmp` when the target lives in another mount
//! namespace, as in a container), the target's `dlopen` (its libc's `.dynsym`; `__libc_dlopen_mode` or
//! libdl before glibc 2.34) and the helper's functions (its `.dynsym` + its load base in the target's maps).
//! The calls themselves go through [`super::ptrace`]: one thread stopped per call, everything restored.
//!
//! The sequence `attach` runs: [`inject`] (dlopen only; a helper already mapped by an earlier attach is
//! reused) → the capture's uprobe on the handoff → [`Injected::start`] → … → [`Injected::stop`] before the
//! uprobes go. It never touches the target when `--gpu-kernels off`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use llmprof_abi::gpu::{GPU_HELPER_LIB, GPU_START, GPU_STATS, GPU_STOP, GpuHelperStats, GpuStartStatus};
use object::{Object, ObjectSegment, ObjectSymbol};

use super::ptrace::{self, Arg, PtraceError};

/// Overrides where llmprof looks for the helper library (a path to the `.so`).
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

/// Where the helper library is: `$LLMPROF_CUPTI_LIB`, else next to the running `llmprof`, else in
/// `../lib/llmprof/` from it (a packaged install). Tests find the `cargo build` output this way: cargo puts
/// `libllmprof_cupti.so` in `target/<profile>/`, next to the `llmprof` binary.
pub fn find_helper() -> Result<PathBuf, InjectError> {
    let mut looked = Vec::new();
    if let Some(p) = std::env::var_os(HELPER_ENV).filter(|v| !v.is_empty()) {
        looked.push(PathBuf::from(p));
    } else if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        looked.push(dir.join(GPU_HELPER_LIB));
        looked.push(dir.join("../lib/llmprof").join(GPU_HELPER_LIB));
    }
    // Canonical: the kernel's maps name the resolved path, which is how the loaded library is found again.
    looked
        .iter()
        .find(|p| p.is_file())
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| InjectError::HelperNotFound {
            looked: looked
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// One mapped file of a process: path as the process sees it, and the start of its offset-0 mapping.
#[derive(Clone, Debug)]
struct Mapped {
    path: String,
    start: u64,
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
            });
        }
    }
    Ok(out)
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// The target's file at `path` (as the target sees it), from llmprof's side.
fn host_path(pid: u32, path: &str) -> PathBuf {
    if same_mount_ns(pid) {
        PathBuf::from(path)
    } else {
        PathBuf::from(format!("/proc/{pid}/root{path}"))
    }
}

fn same_mount_ns(pid: u32) -> bool {
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
    ns("self") == ns(&pid.to_string())
}

/// The run-time addresses of `symbols` in the mapped file `m` (read once from `file`, llmprof's view of it).
fn symbol_addrs<const N: usize>(
    file: &Path,
    m: &Mapped,
    symbols: [&'static str; N],
) -> Result<[u64; N], InjectError> {
    symbols_at(file, m, symbols).map(|v| v.map(|(a, _)| a))
}

/// The run-time addresses and sizes (`st_size`) of `symbols` in the mapped file `m`.
fn symbols_at<const N: usize>(
    file: &Path,
    m: &Mapped,
    symbols: [&'static str; N],
) -> Result<[(u64, u64); N], InjectError> {
    let shown = file.display().to_string();
    let data = std::fs::read(file).map_err(|e| InjectError::File {
        what: "cannot read",
        path: shown.clone(),
        detail: e.to_string(),
    })?;
    let obj = object::File::parse(&*data).map_err(|e| InjectError::File {
        what: "cannot parse",
        path: shown.clone(),
        detail: e.to_string(),
    })?;
    let first_load = obj.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
    let mut out = [(0u64, 0u64); N];
    for (i, symbol) in symbols.into_iter().enumerate() {
        out[i] = obj
            .dynamic_symbols()
            .find(|s| s.is_definition() && s.name() == Ok(symbol))
            .map(|s| (m.start - first_load + s.address(), s.size()))
            .ok_or_else(|| InjectError::Symbol {
                path: shown.clone(),
                symbol,
            })?;
    }
    Ok(out)
}

/// The run-time address of `symbol` in the mapped file `m`.
fn symbol_addr(file: &Path, m: &Mapped, symbol: &'static str) -> Result<u64, InjectError> {
    symbol_addrs(file, m, [symbol]).map(|[a]| a)
}

/// The target's dlopen: (address, extra mode bits).
fn find_dlopen(pid: u32, mapped: &[Mapped]) -> Result<(u64, u64), InjectError> {
    let libc_like = |m: &&Mapped| {
        let b = basename(&m.path);
        b.starts_with("libc.so")
            || b.starts_with("libc-2.")
            || b.starts_with("ld-musl")
            || b.starts_with("libc.musl")
    };
    let libdl = |m: &&Mapped| basename(&m.path).starts_with("libdl.so");
    for m in mapped.iter().filter(libc_like) {
        let file = host_path(pid, &m.path);
        if let Ok(a) = symbol_addr(&file, m, "dlopen") {
            return Ok((a, 0));
        }
        if let Ok(a) = symbol_addr(&file, m, "__libc_dlopen_mode") {
            return Ok((a, RTLD_DLOPEN_INTERNAL));
        }
    }
    for m in mapped.iter().filter(libdl) {
        if let Ok(a) = symbol_addr(&host_path(pid, &m.path), m, "dlopen") {
            return Ok((a, 0));
        }
    }
    Err(InjectError::Static { pid })
}

/// The helper library loaded in a target.
#[derive(Clone, Debug)]
pub struct Injected {
    /// The target.
    pub pid: u32,
    /// The library's path as the target sees it.
    pub target_path: String,
    /// The same file from llmprof's side (what a uprobe attaches to).
    pub host_path: PathBuf,
    /// It was already loaded (an earlier attach): not loaded again.
    pub reused: bool,
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
    let (dlopen, mode_bits) = find_dlopen(pid, &mapped)?;
    if !mapped
        .iter()
        .any(|m| basename(&m.path).starts_with(super::libcuda::LIBCUDA_PREFIX))
    {
        return Err(InjectError::NoLibcuda { pid });
    }
    let helper = find_helper()?;
    if let Some(tracer) = ptrace::tracer_of(pid) {
        return Err(InjectError::AlreadyTraced { pid, tracer });
    }
    let target_path = reachable_path(pid, &helper)?;
    let mut path = target_path.clone().into_bytes();
    path.push(0);
    let handle = call(
        pid,
        "dlopen",
        dlopen,
        &path,
        &[Arg::Data, Arg::Val(RTLD_NOW | mode_bits)],
        LOAD_TIMEOUT,
    )?;
    if handle == 0 {
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
    resolve(pid, m, false)
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
    let host = host_path(pid, &m.path);
    let [(start_fn, _), (stop_fn, _), (stats, stats_len)] =
        symbols_at(&host, m, [GPU_START, GPU_STOP, GPU_STATS])?;
    Ok(Injected {
        pid,
        target_path: m.path.clone(),
        start_fn,
        stop_fn,
        stats,
        stats_len: stats_len.min(core::mem::size_of::<GpuHelperStats>() as u64) as usize,
        host_path: host,
        reused,
    })
}

/// The path the target can open: the helper itself when the target shares llmprof's mount namespace, else a
/// copy in the target's own /tmp (or /dev/shm): a new 0755 directory, the file created exclusively.
fn reachable_path(pid: u32, helper: &Path) -> Result<String, InjectError> {
    if same_mount_ns(pid) {
        return Ok(helper.display().to_string());
    }
    let bytes = std::fs::read(helper).map_err(|e| InjectError::File {
        what: "cannot read",
        path: helper.display().to_string(),
        detail: e.to_string(),
    })?;
    let tag = format!(
        "llmprof-cupti-{}-{}",
        std::process::id(),
        llmprof_trace::clock::boottime_ns()
    );
    let mut last = String::new();
    for dir in ["/tmp", "/dev/shm"] {
        let inside = format!("{dir}/{tag}");
        let outside = PathBuf::from(format!("/proc/{pid}/root{inside}"));
        let made = std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&outside)
            .and_then(|()| {
                use std::io::Write as _;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o755)
                    .open(outside.join(GPU_HELPER_LIB))?;
                f.write_all(&bytes)
            });
        match made {
            Ok(()) => return Ok(format!("{inside}/{GPU_HELPER_LIB}")),
            Err(e) => last = format!("{}: {e}", outside.display()),
        }
    }
    Err(InjectError::File {
        what: "cannot copy the helper into the target's mount namespace at",
        path: format!("/proc/{pid}/root/tmp"),
        detail: last,
    })
}

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};

/// One call in the target: a thread stopped (one in a syscall preferred), the call, everything restored.
fn call(
    pid: u32,
    what: &'static str,
    func: u64,
    data: &[u8],
    args: &[Arg],
    timeout: Duration,
) -> Result<u64, InjectError> {
    let map = |source: PtraceError| match source {
        PtraceError::Exited => InjectError::Exited { pid, during: what },
        source => InjectError::Ptrace { pid, source },
    };
    let tid = ptrace::pick_thread(pid);
    let mut stopped = ptrace::seize(pid, tid, SEIZE_TIMEOUT).map_err(map)?;
    let r = stopped.call(func, data, args, timeout).map_err(map);
    let detached = stopped.detach().map_err(map);
    let v = r?;
    detached?;
    Ok(v)
}

impl Injected {
    /// Calls `GPU_START(flags)` in the target.
    pub fn start(&self, flags: u64) -> Result<Option<GpuStartStatus>, InjectError> {
        let v = call(
            self.pid,
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
        call(self.pid, GPU_STOP, self.stop_fn, &[], &[], STOP_TIMEOUT).map(|_| ())
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
        let (addr, _) = find_dlopen(pid, &m).unwrap();
        // The address is libc's dlopen as this process's loader resolves it.
        // SAFETY: dlsym with a valid handle constant and a NUL-terminated name.
        let here = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"dlopen".as_ptr()) } as u64;
        if here != 0 {
            assert_eq!(addr, here);
        }
        assert!(!m.iter().any(|m| basename(&m.path).starts_with("libcuda.so")));
        assert!(same_mount_ns(pid));
    }

    #[test]
    fn the_thread_picked_is_one_of_the_targets_and_nothing_is_loaded_here() {
        let pid = std::process::id();
        let tid = ptrace::pick_thread(pid);
        assert!(std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists());
        assert!(find_loaded(pid).unwrap().is_none());
        assert!(matches!(inject(pid), Err(InjectError::NoLibcuda { .. })));
    }

    #[test]
    fn a_missing_helper_names_where_it_looked() {
        let err = InjectError::HelperNotFound {
            looked: "/x/libllmprof_cupti.so".into(),
        };
        assert!(err.to_string().contains("cargo build -p llmprof-cupti"), "{err}");
    }
}
