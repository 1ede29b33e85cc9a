//! Symbolization of stack samples: raw addresses from the eBPF sampler → [`CpuSample`] frames (function,
//! module, file and line when DWARF has them), with blazesym (the libbpf project's symbolizer).
//!
//! User addresses go through blazesym's process source: `/proc/PID/maps` (through `/proc/PID/map_files`, so
//! a deleted or replaced binary still resolves), ELF symbols, DWARF line tables and inlined functions where
//! present, and the vDSO; Rust and C++ names are demangled. Every file blazesym opens of a process is vetted
//! by [`crate::symbol_files`] first, which also reads the perf map files of JITs (`/tmp/perf-PID.map`) for the
//! addresses blazesym cannot name.
//! Kernel addresses go through `/proc/kallsyms`. Every address is resolved once per process: a cache maps
//! (pid, address) to its frames (bounded in bytes: it starts over past [`USER_CACHE_BYTES`]), blazesym itself
//! keeps each ELF/DWARF file parsed once (by path, shared by all processes mapping it), so a hot loop costs one
//! hash lookup per frame. A process's memory map is read once and kept (blazesym's VMA cache): without it
//! blazesym re-reads `/proc/PID/maps` for every lookup, and a stack with a new address (a Python process's
//! native walk meets new ones all the time) cost two reads of a map of hundreds of libraries, ~1 ms. The map
//! is read again, at most every [`VMA_REFRESH`], when an address falls outside every mapping (a library loaded
//! since, or a walk gone astray); addresses found in no mapping are retried after such a refresh. Samples are
//! symbolized when capture drains the ring (every 20 ms), while the process is alive;
//! [`Symbolizer::forget`] drops a process's cache at its exit.
//!
//! What a binary without frame pointers gives: the eBPF walk follows `rbp`, so the innermost frame (the
//! sampled instruction) is always right and its caller chain stops (or, rarely, wanders into one wrong
//! frame) at the first function that does not keep a frame pointer. Such samples show the leaf function and
//! a short or cut stack; llmserve and llmprof's own test target are built with `-C force-frame-pointers=yes`
//! (`.cargo/config.toml`). Python interpreters without frame pointers are the pyframes walker's job.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blazesym::symbolize::cache::{Cache, Process as CacheProcess};
use blazesym::symbolize::evict::{Evict, Process as EvictProcess};
use blazesym::symbolize::source::{Kernel, Process, Source};

use crate::symbol_files::{self, PerfMaps};
use blazesym::symbolize::{Input, Reason, Symbolized, Symbolizer as Blaze};
use blazesym::{MaybeDefault, Pid};
use llmprof_abi::{CpuSampleEvent, USER_STACK_MAX};
use llmprof_trace::event::stacks::{CpuSample, Frame, FrameKind, KERNEL_MODULE, UNKNOWN};

/// Frames of one address: the function it is in, preceded by the functions inlined into it at that
/// address (innermost first).
type Frames = Arc<[Arc<Frame>]>;

/// Memory the per-(pid, address) cache may hold (names and file paths come from the target's files); past
/// it the cache starts over.
pub const USER_CACHE_BYTES: usize = 64 << 20;

/// Approximate bytes one cache entry holds.
fn frames_bytes(f: &Frames) -> usize {
    f.iter()
        .map(|fr| 96 + fr.function.len() + fr.module.len() + fr.file.as_ref().map_or(0, |x| x.len()))
        .sum::<usize>()
        + 48
}

/// What symbolization did so far (shown in the exit summary and in docs/performance.md's figures).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SymbolizeStats {
    /// Samples symbolized.
    pub samples: u64,
    /// Addresses looked up in the cache.
    pub lookups: u64,
    /// Addresses resolved by blazesym (cache misses).
    pub resolved: u64,
    /// Addresses blazesym could not name.
    pub unknown: u64,
    /// Of those, addresses in no mapping of the process: return addresses a frame-pointer walk read from a
    /// frame that keeps no frame pointer (Python without frame pointers), not symbols missing.
    pub unmapped: u64,
    /// Times a process's memory map was read (once per process, then after a library was loaded).
    pub maps_reads: u64,
    /// Wall time spent symbolizing (llmprof's own CPU, not the target's).
    pub time: Duration,
    /// Of it, the time blazesym spent resolving addresses not seen before (reading each library's symbols and
    /// line tables once, the process's memory map): the rest is the per-stack cost of the cache.
    pub resolve_time: Duration,
}

/// Turns raw sample records into symbolized samples; see the module doc.
pub struct Symbolizer {
    blaze: Blaze,
    /// DWARF lines (a blazesym of its own: its file members are vetted differently, see `symbol_files`).
    dwarf: Blaze,
    perf_maps: PerfMaps,
    user: HashMap<(u32, u64), Frames>,
    /// [`frames_bytes`] of `user`.
    user_bytes: usize,
    kernel: HashMap<u64, Frames>,
    /// When each process's memory map was last read into blazesym's VMA cache.
    maps_read: HashMap<u32, Instant>,
    /// Per process, the cached addresses that were in no mapping (retried after the next read of the map).
    unmapped: HashMap<u32, Vec<u64>>,
    stats: SymbolizeStats,
}

/// Shortest time between two reads of one process's memory map (see the module docs).
pub const VMA_REFRESH: Duration = Duration::from_secs(1);
/// Most unmapped addresses remembered per process for a retry (more are still cached as unknown).
const UNMAPPED_KEPT: usize = 4096;

impl std::fmt::Debug for Symbolizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Symbolizer").field("stats", &self.stats).finish()
    }
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

/// The address to look up for the `i`-th entry of a stack: the sampled instruction itself for the innermost
/// one, the byte before the return address for the others (the call instruction: a call that ends a
/// function returns into the next one).
fn lookup_addr(i: usize, addr: u64) -> u64 {
    if i == 0 { addr } else { addr.saturating_sub(1) }
}

fn frames_of(
    res: Symbolized<'_>,
    kind: FrameKind,
    default_module: &str,
    addr: u64,
) -> (Frames, Option<Reason>) {
    let sym = match res {
        Symbolized::Sym(sym) => sym,
        Symbolized::Unknown(reason) => {
            let f = Frame {
                function: Arc::from(format!("{UNKNOWN} {addr:#x}")),
                module: Arc::from(default_module),
                file: None,
                line: None,
                kind,
                rel_pc: addr,
            };
            return (Arc::from(vec![Arc::new(f)]), Some(reason));
        }
    };
    let module: Arc<str> = match &sym.module {
        Some(m) if kind != FrameKind::Kernel => Arc::from(m.to_string_lossy().as_ref()),
        _ => Arc::from(default_module),
    };
    let kind = if kind == FrameKind::Native
        && sym
            .module
            .as_ref()
            .is_some_and(|m| m.to_string_lossy().contains("perf-"))
    {
        FrameKind::Jit
    } else {
        kind
    };
    let rel_pc = sym.addr + sym.offset as u64;
    let loc = |ci: Option<&blazesym::symbolize::CodeInfo<'_>>| -> (Option<Arc<str>>, Option<u32>) {
        match ci {
            Some(c) => (Some(Arc::from(c.to_path().to_string_lossy().as_ref())), c.line),
            None => (None, None),
        }
    };
    let mut out = Vec::with_capacity(1 + sym.inlined.len());
    // blazesym lists the functions inlined at this address outermost first, each with its own location.
    let (file, line) = loc(sym.code_info.as_deref());
    let outer = Frame {
        function: Arc::from(sym.name.as_ref()),
        module: module.clone(),
        file,
        line,
        kind,
        rel_pc,
    };
    let mut chain = Vec::with_capacity(sym.inlined.len());
    for inl in sym.inlined.iter() {
        let (file, line) = loc(inl.code_info.as_ref());
        chain.push(Frame {
            function: Arc::from(inl.name.as_ref()),
            module: module.clone(),
            file,
            line,
            kind,
            rel_pc,
        });
    }
    for f in chain.into_iter().rev() {
        out.push(Arc::new(f));
    }
    out.push(Arc::new(outer));
    (Arc::from(out), None)
}

impl Symbolizer {
    /// A symbolizer with code locations, inlined functions and demangling on.
    pub fn new() -> Self {
        let builder = || {
            Blaze::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .enable_demangling(true)
        };
        Self {
            blaze: builder()
                .set_process_dispatcher(symbol_files::elf_dispatcher)
                .build(),
            dwarf: builder()
                .set_process_dispatcher(symbol_files::dwarf_dispatcher)
                .build(),
            perf_maps: PerfMaps::default(),
            user: HashMap::new(),
            user_bytes: 0,
            kernel: HashMap::new(),
            maps_read: HashMap::new(),
            unmapped: HashMap::new(),
            stats: SymbolizeStats::default(),
        }
    }

    /// What was done so far.
    pub fn stats(&self) -> SymbolizeStats {
        self.stats
    }

    /// Drops the cache of an exited process (its addresses may be reused by the next one with its pid).
    pub fn forget(&mut self, pid: u32) {
        self.user.retain(|(p, _), _| *p != pid);
        self.user_bytes = self.user.values().map(frames_bytes).sum();
        self.perf_maps.forget(pid);
        self.unmapped.remove(&pid);
        if self.maps_read.remove(&pid).is_some()
            && let Some(nz) = NonZeroU32::new(pid)
        {
            for b in [&mut self.blaze, &mut self.dwarf] {
                let _ = b.evict(&Evict::Process(EvictProcess::new(Pid::Pid(nz))));
            }
        }
    }

    /// Symbolizes one sample record (kernel frames first, then user frames; innermost first).
    pub fn sample(&mut self, e: &CpuSampleEvent) -> CpuSample {
        let t0 = Instant::now();
        let pid = e.hdr.pid;
        let kaddrs: Vec<u64> = e
            .kernel_stack()
            .iter()
            .enumerate()
            .map(|(i, &a)| lookup_addr(i, a))
            .collect();
        let uaddrs: Vec<u64> = e
            .user_stack()
            .iter()
            .enumerate()
            .map(|(i, &a)| lookup_addr(i, a))
            .collect();
        self.resolve_kernel(&kaddrs);
        self.resolve_user(pid, &uaddrs);
        let mut frames = Vec::with_capacity(kaddrs.len() + uaddrs.len());
        for a in &kaddrs {
            if let Some(fs) = self.kernel.get(a) {
                frames.extend(fs.iter().cloned());
            }
        }
        for a in &uaddrs {
            if let Some(fs) = self.user.get(&(pid, *a)) {
                frames.extend(fs.iter().cloned());
            }
        }
        self.stats.samples += 1;
        self.stats.lookups += (kaddrs.len() + uaddrs.len()) as u64;
        self.stats.time += t0.elapsed();
        CpuSample {
            cpu: e.hdr.cpu,
            frames,
            truncated: e.user_len as usize >= USER_STACK_MAX,
        }
    }

    fn resolve_kernel(&mut self, addrs: &[u64]) {
        let mut missing: Vec<u64> = addrs
            .iter()
            .copied()
            .filter(|a| !self.kernel.contains_key(a))
            .collect();
        if missing.is_empty() {
            return;
        }
        missing.sort_unstable();
        missing.dedup();
        let src = Source::Kernel(Kernel {
            kallsyms: MaybeDefault::Default,
            // kallsyms names every kernel function; a vmlinux with DWARF is rarely installed and slow to read.
            vmlinux: MaybeDefault::None,
            kaslr_offset: None,
            debug_syms: false,
            ..Kernel::default()
        });
        let t0 = Instant::now();
        let res = self.blaze.symbolize(&src, Input::AbsAddr(&missing));
        self.stats.resolve_time += t0.elapsed();
        for (a, f, why) in convert(res, &missing, FrameKind::Kernel, KERNEL_MODULE) {
            self.stats.resolved += 1;
            self.stats.unknown += u64::from(why.is_some());
            self.kernel.insert(a, f);
        }
    }

    /// Reads `pid`'s memory map into blazesym's VMA cache now (the first time, or to see new mappings).
    fn read_maps(&mut self, pid: u32, nz: NonZeroU32) {
        // Both symbolizers (ELF names, DWARF lines) keep the same map.
        for b in [&self.blaze, &self.dwarf] {
            let mut c = CacheProcess::new(Pid::Pid(nz));
            c.cache_perf_map = false;
            if let Err(e) = b.cache(&Cache::Process(c)) {
                log::debug!("symbolize: pid {pid}: reading its memory map: {e}");
            }
        }
        self.stats.maps_reads += 1;
        self.maps_read.insert(pid, Instant::now());
        // Addresses that were in no mapping may be in one now.
        for a in self.unmapped.remove(&pid).unwrap_or_default() {
            self.user.remove(&(pid, a));
        }
    }

    fn resolve_user(&mut self, pid: u32, addrs: &[u64]) {
        let mut missing: Vec<u64> = addrs
            .iter()
            .copied()
            .filter(|a| !self.user.contains_key(&(pid, *a)))
            .collect();
        if missing.is_empty() {
            return;
        }
        missing.sort_unstable();
        missing.dedup();
        let Some(nz) = NonZeroU32::new(pid) else { return };
        let t0 = Instant::now();
        if !self.maps_read.contains_key(&pid) {
            self.read_maps(pid, nz);
        }
        let mut found = self.lookup_user(pid, nz, &missing);
        let stale = self
            .maps_read
            .get(&pid)
            .is_none_or(|t| t.elapsed() >= VMA_REFRESH);
        if stale && found.iter().any(|(_, _, why)| *why == Some(Reason::Unmapped)) {
            self.read_maps(pid, nz);
            let again: Vec<u64> = found
                .iter()
                .filter(|(_, _, why)| *why == Some(Reason::Unmapped))
                .map(|(a, _, _)| *a)
                .collect();
            found.retain(|(_, _, why)| *why != Some(Reason::Unmapped));
            found.extend(self.lookup_user(pid, nz, &again));
        }
        self.stats.resolve_time += t0.elapsed();
        for (a, f, why) in found {
            // Code no file names: a JIT's, when its perf map says so (read by `symbol_files`, bounded).
            let (f, why) = match (why, self.perf_maps.lookup(pid, a)) {
                (Some(_), Some((name, start))) => (jit_frame(pid, name, a - start), None),
                _ => (f, why),
            };
            self.stats.resolved += 1;
            self.stats.unknown += u64::from(why.is_some());
            if why == Some(Reason::Unmapped) {
                self.stats.unmapped += 1;
                let kept = self.unmapped.entry(pid).or_default();
                if kept.len() < UNMAPPED_KEPT {
                    kept.push(a);
                }
            }
            if self.user_bytes > USER_CACHE_BYTES {
                self.user.clear();
                self.user_bytes = 0;
            }
            self.user_bytes += frames_bytes(&f);
            self.user.insert((pid, a), f);
        }
    }

    /// blazesym's frames for `addrs` (sorted, unique) of `pid`, through its cached memory map.
    fn lookup_user(&mut self, pid: u32, nz: NonZeroU32, addrs: &[u64]) -> Vec<(u64, Frames, Option<Reason>)> {
        // Names from the ELF symbol tables (full demangled paths: `inference::quant::QMatrix::matmul_rows`);
        // file, line and inlined functions from DWARF, where present (DWARF names are short: `matmul_rows`).
        let mut proc = Process::new(Pid::Pid(nz));
        proc.debug_syms = false;
        // Perf maps are read by `symbol_files` (bounded), never by blazesym.
        proc.perf_map = false;
        let elf = self
            .blaze
            .symbolize(&Source::Process(proc.clone()), Input::AbsAddr(addrs));
        proc.debug_syms = true;
        let dwarf = self
            .dwarf
            .symbolize(&Source::Process(proc), Input::AbsAddr(addrs));
        let res = match (elf, dwarf) {
            (Ok(e), Ok(d)) => Ok(e
                .into_iter()
                .zip(d)
                .map(|(e, d)| match (e, d) {
                    (Symbolized::Sym(mut e), Symbolized::Sym(d)) => {
                        e.code_info = d.code_info;
                        e.inlined = d.inlined;
                        Symbolized::Sym(e)
                    }
                    (Symbolized::Unknown(_), d) => d,
                    (e, Symbolized::Unknown(_)) => e,
                })
                .collect()),
            (Ok(e), Err(err)) => {
                // One unreadable debug section fails a whole DWARF batch: ELF names alone.
                log::debug!("symbolize: pid {pid}: DWARF: {err}");
                Ok(e)
            }
            (Err(_), d) => d,
        };
        convert(res, addrs, FrameKind::Native, UNKNOWN)
    }
}

/// The frame of a JIT function a perf map names.
fn jit_frame(pid: u32, name: Arc<str>, rel_pc: u64) -> Frames {
    Arc::from(vec![Arc::new(Frame {
        function: name,
        module: Arc::from(format!("perf-{pid}.map")),
        file: None,
        line: None,
        kind: FrameKind::Jit,
        rel_pc,
    })])
}

/// blazesym's answers for `addrs` as frames, with whether each was named.
fn convert(
    res: Result<Vec<Symbolized<'_>>, blazesym::Error>,
    addrs: &[u64],
    kind: FrameKind,
    default_module: &str,
) -> Vec<(u64, Frames, Option<Reason>)> {
    match res {
        Ok(syms) => syms
            .into_iter()
            .zip(addrs)
            .map(|(s, &a)| {
                let (f, why) = frames_of(s, kind, default_module, a);
                (a, f, why)
            })
            .collect(),
        Err(err) => {
            // The process exited, or its maps could not be read: every address stays unknown (and is not
            // retried: the cache answers the next sample of it).
            log::debug!("symbolize: {err}");
            addrs
                .iter()
                .map(|&a| {
                    let (f, why) =
                        frames_of(Symbolized::Unknown(Reason::IgnoredError), kind, default_module, a);
                    (a, f, why)
                })
                .collect()
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly")]
mod tests {
    use super::*;
    use llmprof_abi::{EventHeader, EventKind, KERNEL_STACK_MAX};

    #[inline(never)]
    #[unsafe(no_mangle)]
    extern "C" fn llmprof_symbolize_test_target() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn own_function_resolves_by_name_and_unknown_addresses_say_so() {
        let mut user = [0u64; USER_STACK_MAX];
        user[0] = llmprof_symbolize_test_target as *const () as u64 + 1;
        user[1] = 0x10;
        user[2] = libc::getpid as *const () as u64 + 1;
        user[3] = Symbolizer::new as *const () as u64 + 1;
        let e = CpuSampleEvent {
            hdr: EventHeader {
                kind: EventKind::CpuSample as u32,
                cpu: 3,
                ts_ns: 1,
                pid: std::process::id(),
                tid: std::process::id(),
            },
            user_len: 4,
            kernel_len: 0,
            user,
            kernel: [0; KERNEL_STACK_MAX],
        };
        let mut s = Symbolizer::new();
        let sample = s.sample(&e);
        assert_eq!(sample.cpu, 3);
        let leaf = sample.leaf().unwrap();
        assert_eq!(&*leaf.function, "llmprof_symbolize_test_target", "{sample:?}");
        assert!(leaf.module.contains("llmprof"), "{}", leaf.module);
        // DWARF of this test binary (checked by `symbol_files`, read through its descriptor): file and line.
        assert!(
            leaf.file.as_deref().is_some_and(|f| f.ends_with("symbolize.rs")) && leaf.line.is_some(),
            "{leaf:?}"
        );
        assert!(sample.frames[1].function.starts_with(UNKNOWN));
        // libc's getpid by its ELF name, and a Rust function by its full demangled path (not DWARF's short name).
        assert!(
            sample.frames[2].function.contains("getpid"),
            "{:?}",
            sample.frames[2]
        );
        assert!(sample.frames[2].module.contains("libc"), "{:?}", sample.frames[2]);
        assert_eq!(&*sample.frames[3].function, "llmprof::symbolize::Symbolizer::new");
        // The second time is a cache hit: same frames, nothing resolved again.
        let resolved = s.stats().resolved;
        assert_eq!(s.sample(&e).frames, sample.frames);
        assert_eq!(s.stats().resolved, resolved);
        // Past its byte bound the cache starts over at the next miss.
        assert!(s.user_bytes > 0 && s.user_bytes == s.user.values().map(frames_bytes).sum::<usize>());
        s.user_bytes = USER_CACHE_BYTES + 1;
        let mut other = e;
        other.user[0] = llmprof_symbolize_test_target as *const () as u64 + 2;
        other.user_len = 1;
        s.sample(&other);
        assert_eq!(s.user.len(), 1, "only the new address is cached");
    }
}
