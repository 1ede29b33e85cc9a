//! `libllmprof_cupti.so`: the helper library `llmprof attach --gpu-kernels` injects into a running CUDA process.
//!
//! Owns the three exported functions of `llmprof_abi::cupti` and the CUPTI session behind them:
//! - [`llmprof_gpu_start`] (called by llmprof through ptrace): finds and loads CUPTI ([`cupti`]), claims it
//!   with `cuptiSubscribe` (a subscriber already there — Kineto, Nsight — is left untouched and reported),
//!   sets CUPTI's thread ids to the system's, registers the buffer callbacks and enables kernels, copies,
//!   memsets and synchronizations (plus driver/runtime calls with `GPU_FLAG_API_CALLS`), flushed every 100 ms;
//!   without `GPU_FLAG_EVERY_RECORD` (the default mode) also CUPTI's graph-level records, one per CUDA graph
//!   launch in place of one per node (when that CUPTI refuses them next to kernels, it goes on without);
//! - the buffer-completed callback (CUPTI's thread): converts each record ([`convert`]); in the default mode
//!   sums them per window ([`summary`]: per kernel name count/total/min/max, busy intervals) and hands over
//!   the summaries and graph launches, with `GPU_FLAG_EVERY_RECORD` every record; in chunks of at most
//!   `GPU_CHUNK_MAX` bytes to [`llmprof_gpu_activity`], llmprof's uprobe site: one probe hit per chunk. It
//!   measures its own thread's CPU time (the helper's work, and CUPTI's buffer thread between callbacks: a
//!   thread the target had before the first start is the program's, not CUPTI's) for llmprof's estimate of
//!   what it costs the target;
//! - [`llmprof_gpu_stop`]: flush, disable every kind, unsubscribe. The library stays loaded and idle; the next
//!   attach starts it again.
//!
//! Bounded: a fixed pool of [`POOL_BUFFERS`] CUPTI buffers (when all are in flight CUPTI drops records and
//! counts them; the count reaches llmprof in the chunk headers), one chunk buffer, a name table of at most
//! `convert::MAX_NAMES` entries. It never blocks the target's threads: CUPTI calls the completion callback on
//! its own thread (or on the thread of `llmprof_gpu_stop`'s flush). Counters: [`llmprof_gpu_stats`].

pub mod convert;
pub mod cupti;
pub mod summary;

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use convert::{Converted, Names, Packer, Sink, Skip};
use llmprof_abi::cupti::{
    GPU_FLAG_API_CALLS, GPU_FLAG_EVERY_RECORD, GpuActivityKind, GpuHelperStats, GpuStartStatus,
    WINDOW_HINT_MS,
};
use summary::Summarizer;

/// CUPTI buffers in the pool.
pub const POOL_BUFFERS: usize = 16;
/// Bytes of each (about 2,500 kernel records; CUPTI's samples use 8 MiB buffers, Kineto 4 MiB).
pub const BUFFER_BYTES: usize = 512 * 1024;
/// `cuptiActivityFlushPeriod`, ms: the longest a record waits in a buffer before llmprof sees it.
pub const FLUSH_PERIOD_MS: u32 = WINDOW_HINT_MS;

/// The helper's counters, laid out as [`GpuHelperStats`] (llmprof reads them from the target's memory).
#[repr(C)]
pub struct Stats {
    pub chunks: AtomicU64,
    pub records: AtomicU64,
    pub names: AtomicU64,
    pub dropped: AtomicU64,
    pub buffers: AtomicU64,
    pub starts: AtomicU64,
    pub stops: AtomicU64,
    pub active: AtomicU64,
    pub cupti_records: AtomicU64,
    pub helper_cpu_ns: AtomicU64,
    pub cupti_thread_cpu_ns: AtomicU64,
    pub flags: AtomicU64,
    pub summaries: AtomicU64,
    pub busy: AtomicU64,
    pub graph_trace: AtomicU64,
}
const _: () = assert!(core::mem::size_of::<Stats>() == core::mem::size_of::<GpuHelperStats>());

/// Exported as `llmprof_abi::cupti::GPU_STATS`.
#[unsafe(no_mangle)]
#[used]
pub static llmprof_gpu_stats: Stats = Stats {
    chunks: AtomicU64::new(0),
    records: AtomicU64::new(0),
    names: AtomicU64::new(0),
    dropped: AtomicU64::new(0),
    buffers: AtomicU64::new(0),
    starts: AtomicU64::new(0),
    stops: AtomicU64::new(0),
    active: AtomicU64::new(0),
    cupti_records: AtomicU64::new(0),
    helper_cpu_ns: AtomicU64::new(0),
    cupti_thread_cpu_ns: AtomicU64::new(0),
    flags: AtomicU64::new(0),
    summaries: AtomicU64::new(0),
    busy: AtomicU64::new(0),
    graph_trace: AtomicU64::new(0),
};

impl Stats {
    /// A copy of the counters.
    pub fn snapshot(&self) -> GpuHelperStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        GpuHelperStats {
            chunks: l(&self.chunks),
            records: l(&self.records),
            names: l(&self.names),
            dropped: l(&self.dropped),
            buffers: l(&self.buffers),
            starts: l(&self.starts),
            stops: l(&self.stops),
            active: l(&self.active),
            cupti_records: l(&self.cupti_records),
            helper_cpu_ns: l(&self.helper_cpu_ns),
            cupti_thread_cpu_ns: l(&self.cupti_thread_cpu_ns),
            flags: l(&self.flags),
            summaries: l(&self.summaries),
            busy: l(&self.busy),
            graph_trace: l(&self.graph_trace),
        }
    }
}

/// The handoff (`llmprof_abi::cupti::GPU_HANDOFF`): the 5-byte NOP llmprof's uprobe sits on, then `ret`.
/// `chunk` points to `len` bytes of a chunk, valid for the duration of the call.
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn llmprof_gpu_activity(chunk: *const u8, len: u64) {
    core::arch::naked_asm!(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00", "ret")
}

/// What a start turned on, kept for the stop.
struct Running {
    subscriber: usize,
    enabled: Vec<u32>,
}

/// Start/stop state (taken by start and stop only, never by the buffer callbacks).
static STATE: Mutex<Option<Running>> = Mutex::new(None);
/// The loaded CUPTI and its API version (set once, on the first start that finds it).
static API: OnceLock<(cupti::Api, u32)> = OnceLock::new();
/// Free CUPTI buffers (addresses), allocated on the first start.
static POOL: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// The converter's state (taken by the completion callback).
static CONV: Mutex<Option<Conv>> = Mutex::new(None);
/// The flags of the running start (`GPU_FLAG_*`).
static FLAGS: AtomicU64 = AtomicU64::new(0);
/// Counts starts: a thread's CPU reading from an earlier session is not compared with this one's.
static SESSION: AtomicU64 = AtomicU64::new(0);
/// The target's threads when the helper first started (sorted): a buffer callback on one of them is not on
/// CUPTI's own thread, so that thread's CPU between callbacks is the program's, not CUPTI's.
static APP_THREADS: OnceLock<Vec<i32>> = OnceLock::new();

/// This process's thread ids, sorted (empty when /proc cannot be read).
fn threads_now() -> Vec<i32> {
    let mut v: Vec<i32> = std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// What the completion callback keeps between buffers.
struct Conv {
    packer: Packer,
    names: Names,
    summary: Summarizer,
    /// (session, thread, its CPU time at the end of its last callback): CUPTI's buffer thread's CPU between
    /// two of its callbacks is CUPTI's work on llmprof's behalf.
    last_thread: (u64, i32, u64),
}

impl Conv {
    fn new() -> Self {
        Self {
            packer: Packer::new(),
            names: Names::new(),
            summary: Summarizer::new(),
            last_thread: (0, 0, 0),
        }
    }
}

/// The calling thread's CPU time, ns (CLOCK_THREAD_CPUTIME_ID).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the valid `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn buffer_layout() -> std::alloc::Layout {
    // 8-byte alignment: what CUPTI requires of activity buffers (ACTIVITY_RECORD_ALIGNMENT).
    std::alloc::Layout::from_size_align(BUFFER_BYTES, 8).unwrap_or_else(|_| std::alloc::Layout::new::<u64>())
}

extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    let b = lock(&POOL).pop().unwrap_or(0);
    // SAFETY: CUPTI passes valid pointers to its out-parameters (cuptiActivityRegisterCallbacks contract).
    unsafe {
        *buffer = b as *mut u8;
        *size = if b == 0 { 0 } else { BUFFER_BYTES };
        *max_records = 0;
    }
}

/// Chunks go to the handoff; the clock pair from CUPTI and CLOCK_BOOTTIME.
struct Handoff<'a>(&'a cupti::Api);

impl Sink for Handoff<'_> {
    fn clock(&mut self) -> (u64, u64) {
        let mut c = 0u64;
        // SAFETY: cuptiGetTimestamp writes one u64.
        unsafe { (self.0.get_timestamp)(&mut c) };
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the valid `ts`.
        unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        (c, ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    }

    fn handoff(&mut self, chunk: &[u8]) {
        llmprof_gpu_activity(chunk.as_ptr(), chunk.len() as u64);
    }

    fn api_name(&mut self, runtime: bool, cbid: u32) -> Option<Vec<u8>> {
        let f = self.0.get_callback_name?;
        let domain = if runtime {
            cupti::DOMAIN_RUNTIME_API
        } else {
            cupti::DOMAIN_DRIVER_API
        };
        let mut name: *const std::ffi::c_char = core::ptr::null();
        // SAFETY: cuptiGetCallbackName writes a pointer to a NUL-terminated string CUPTI owns for its lifetime.
        if unsafe { f(domain, cbid, &mut name) } != cupti::SUCCESS || name.is_null() {
            return None;
        }
        // SAFETY: non-null and NUL-terminated (see above); copied at once.
        Some(unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes().to_vec())
    }
}

extern "C" fn buffer_completed(ctx: *mut c_void, stream: u32, buffer: *mut u8, _size: usize, valid: usize) {
    if buffer.is_null() {
        return;
    }
    let t0 = thread_cpu_ns();
    if let Some((api, version)) = API.get() {
        let mut guard = lock(&CONV);
        let conv = guard.get_or_insert_with(Conv::new);
        let every = FLAGS.load(Ordering::Relaxed) & GPU_FLAG_EVERY_RECORD != 0;
        let packer = &mut conv.packer;
        let before = (packer.chunks_out, packer.records_out, packer.names_out);
        let mut sink = Handoff(api);
        // SAFETY: CUPTI hands back a buffer of ours (BUFFER_BYTES long) with `valid` bytes of records.
        let bytes = unsafe { core::slice::from_raw_parts(buffer, valid.min(BUFFER_BYTES)) };
        let mut rec: *mut u32 = core::ptr::null_mut();
        let (mut dropped, mut seen) = (0u64, 0u64);
        // SAFETY: the buffer and its valid size as CUPTI gave them; `rec` is CUPTI's cursor.
        while unsafe { (api.get_next_record)(buffer, valid, &mut rec) } == cupti::SUCCESS {
            let Some(off) = (rec as usize)
                .checked_sub(buffer as usize)
                .filter(|&o| o < bytes.len())
            else {
                break;
            };
            seen += 1;
            match convert::convert(&bytes[off..], *version) {
                Ok(Converted::Activity { act, name }) if !every => {
                    let id = packer.name_id(name, &mut conv.names, &mut sink);
                    if act.kind == GpuActivityKind::Graph as u32 {
                        packer.add(Converted::Activity { act, name: 0 }, &mut conv.names, &mut sink);
                    }
                    conv.summary.add(&act, id, packer, &mut sink);
                }
                Ok(c) => packer.add(c, &mut conv.names, &mut sink),
                Err(Skip::Short) => dropped += 1,
                Err(Skip::OtherKind) => {}
            }
        }
        let mut lost = 0usize;
        // SAFETY: the context and stream CUPTI passed to this callback; `lost` is a valid out-parameter.
        if unsafe { (api.get_num_dropped)(ctx, stream, &mut lost) } == cupti::SUCCESS {
            dropped += lost as u64;
        }
        let s = &llmprof_gpu_stats;
        if !every {
            let (now, _) = sink.clock();
            let stopping = llmprof_gpu_stats.active.load(Ordering::Relaxed) == 0;
            let (rows, busy) = conv
                .summary
                .finish(if stopping { u64::MAX } else { now }, packer, &mut sink);
            dropped += std::mem::take(&mut conv.summary.unsummed);
            s.summaries.fetch_add(rows, Ordering::Relaxed);
            s.busy.fetch_add(busy, Ordering::Relaxed);
        }
        packer.add_dropped(dropped);
        packer.flush(&mut sink);
        s.chunks
            .fetch_add(packer.chunks_out - before.0, Ordering::Relaxed);
        s.records
            .fetch_add(packer.records_out - before.1, Ordering::Relaxed);
        s.names.fetch_add(packer.names_out - before.2, Ordering::Relaxed);
        s.dropped.fetch_add(dropped, Ordering::Relaxed);
        s.buffers.fetch_add(1, Ordering::Relaxed);
        s.cupti_records.fetch_add(seen, Ordering::Relaxed);
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let session = SESSION.load(Ordering::Relaxed);
        let t1 = thread_cpu_ns();
        let (last_session, last_tid, last_cpu) = conv.last_thread;
        let app_thread = APP_THREADS.get().is_some_and(|v| v.binary_search(&tid).is_ok());
        let between = if last_session == session && last_tid == tid && !app_thread {
            t0.saturating_sub(last_cpu)
        } else {
            0
        };
        conv.last_thread = (session, tid, t1);
        let own = t1.saturating_sub(t0);
        s.helper_cpu_ns.fetch_add(own, Ordering::Relaxed);
        s.cupti_thread_cpu_ns.fetch_add(between + own, Ordering::Relaxed);
    }
    lock(&POOL).push(buffer as usize);
}

/// The subscriber's callback: no callback domain is enabled, so CUPTI never calls it with work.
extern "C" fn on_callback(_: *mut c_void, _: u32, _: u32, _: *const c_void) {}

/// Fills the buffer pool once (allocation failures leave it smaller: CUPTI then drops, and counts).
fn fill_pool() {
    let mut pool = lock(&POOL);
    static FILLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if FILLED.swap(true, Ordering::Relaxed) {
        return;
    }
    for _ in 0..POOL_BUFFERS {
        // SAFETY: a non-zero-sized layout; the buffers live for the life of the process.
        let p = unsafe { std::alloc::alloc(buffer_layout()) };
        if !p.is_null() {
            pool.push(p as usize);
        }
    }
}

/// `llmprof_abi::cupti::GPU_START`: turns CUPTI activity recording on; a [`GpuStartStatus`].
#[unsafe(no_mangle)]
pub extern "C" fn llmprof_gpu_start(flags: u64) -> u32 {
    start(flags) as u32
}

fn start(flags: u64) -> GpuStartStatus {
    let mut state = lock(&STATE);
    if state.is_some() {
        return GpuStartStatus::AlreadyStarted;
    }
    if !cupti::libcuda_mapped() {
        return GpuStartStatus::NoLibcuda;
    }
    // Before CUPTI is loaded and enabled: the threads it starts are not among these.
    APP_THREADS.get_or_init(threads_now);
    if API.get().is_none() {
        let Some((api, path)) = cupti::load() else {
            return GpuStartStatus::NoCupti;
        };
        let mut version = 0u32;
        // SAFETY: cuptiGetVersion writes one u32.
        unsafe { (api.get_version)(&mut version) };
        let _ = API.set((api, version));
        note(&format!(
            "loaded {} (CUPTI API version {version})",
            path.display()
        ));
    }
    let Some((api, _)) = API.get() else {
        return GpuStartStatus::NoCupti;
    };
    let mut sub: *mut c_void = core::ptr::null_mut();
    // SAFETY: a valid out-pointer and a callback with CUpti_CallbackFunc's signature.
    match unsafe { (api.subscribe)(&mut sub, on_callback, core::ptr::null_mut()) } {
        cupti::SUCCESS => {}
        cupti::MULTIPLE_SUBSCRIBERS => return GpuStartStatus::SubscriberTaken,
        rc => {
            note(&format!("cuptiSubscribe failed: CUPTI error {rc}"));
            return GpuStartStatus::CuptiError;
        }
    }
    fill_pool();
    {
        let mut conv = lock(&CONV);
        let c = conv.get_or_insert_with(Conv::new);
        c.names.clear();
        c.summary.reset();
    }
    FLAGS.store(flags, Ordering::Relaxed);
    SESSION.fetch_add(1, Ordering::Relaxed);
    llmprof_gpu_stats.flags.store(flags, Ordering::Relaxed);
    // SAFETY: plain CUPTI calls with valid arguments.
    let rc = unsafe { (api.set_thread_id_type)(cupti::THREAD_ID_TYPE_SYSTEM) };
    if rc != cupti::SUCCESS {
        note(&format!(
            "cuptiSetThreadIdType failed: CUPTI error {rc} (thread ids are CUPTI's)"
        ));
    }
    // SAFETY: callbacks with CUPTI's buffer callback signatures.
    let rc = unsafe { (api.register_callbacks)(buffer_requested, buffer_completed) };
    if rc != cupti::SUCCESS {
        note(&format!(
            "cuptiActivityRegisterCallbacks failed: CUPTI error {rc}"
        ));
        // SAFETY: the subscriber just obtained.
        unsafe { (api.unsubscribe)(sub) };
        return GpuStartStatus::CuptiError;
    }
    let mut enabled = Vec::new();
    // Graph-level records first (the default mode): one per graph launch. A CUPTI that will not record them
    // next to kernels refuses the kernels then: graphs go back to node records.
    let graphs = flags & GPU_FLAG_EVERY_RECORD == 0
        // SAFETY: a plain CUPTI call.
        && match unsafe { (api.enable)(convert::KIND_GRAPH_TRACE) } {
            cupti::SUCCESS => true,
            rc => {
                note(&format!(
                    "cuptiActivityEnable(GRAPH_TRACE) failed: CUPTI error {rc}; CUDA graphs are recorded node by node"
                ));
                false
            }
        };
    if graphs {
        enabled.push(convert::KIND_GRAPH_TRACE);
    }
    let mut kinds = vec![
        convert::KIND_CONCURRENT_KERNEL,
        convert::KIND_MEMCPY,
        convert::KIND_MEMSET,
        convert::KIND_SYNCHRONIZATION,
    ];
    if flags & GPU_FLAG_API_CALLS != 0 {
        kinds.extend([convert::KIND_DRIVER, convert::KIND_RUNTIME]);
    }
    for k in kinds {
        // SAFETY: a plain CUPTI call.
        let mut rc = unsafe { (api.enable)(k) };
        if rc != cupti::SUCCESS
            && k == convert::KIND_CONCURRENT_KERNEL
            && enabled.contains(&convert::KIND_GRAPH_TRACE)
        {
            note(
                "this CUPTI records kernels only without graph-level records: CUDA graphs are recorded node by node",
            );
            // SAFETY: plain CUPTI calls: the kind enabled above off, the kernels again.
            unsafe { (api.disable)(convert::KIND_GRAPH_TRACE) };
            enabled.retain(|&e| e != convert::KIND_GRAPH_TRACE);
            // SAFETY: a plain CUPTI call.
            rc = unsafe { (api.enable)(k) };
        }
        match rc {
            cupti::SUCCESS => enabled.push(k),
            rc if k == convert::KIND_CONCURRENT_KERNEL => {
                note(&format!(
                    "cuptiActivityEnable(CONCURRENT_KERNEL) failed: CUPTI error {rc}"
                ));
                stop_running(
                    api,
                    Running {
                        subscriber: sub as usize,
                        enabled,
                    },
                );
                return GpuStartStatus::CuptiError;
            }
            rc => note(&format!(
                "cuptiActivityEnable({k}) failed: CUPTI error {rc}; going on without it"
            )),
        }
    }
    llmprof_gpu_stats.graph_trace.store(
        u64::from(enabled.contains(&convert::KIND_GRAPH_TRACE)),
        Ordering::Relaxed,
    );
    // SAFETY: a plain CUPTI call.
    unsafe { (api.flush_period)(FLUSH_PERIOD_MS) };
    *state = Some(Running {
        subscriber: sub as usize,
        enabled,
    });
    llmprof_gpu_stats.starts.fetch_add(1, Ordering::Relaxed);
    llmprof_gpu_stats.active.store(1, Ordering::Relaxed);
    GpuStartStatus::Started
}

/// Disables what `run` enabled, flushes what was recorded, unsubscribes.
fn stop_running(api: &cupti::Api, run: Running) {
    // SAFETY: plain CUPTI calls on the kinds and the subscriber this library enabled and obtained. The flush
    // runs the completion callback (which takes CONV, never STATE).
    unsafe {
        (api.flush_all)(cupti::FLUSH_FORCED);
        for &k in &run.enabled {
            (api.disable)(k);
        }
        (api.flush_period)(0);
        (api.flush_all)(cupti::FLUSH_FORCED);
        (api.unsubscribe)(run.subscriber as *mut c_void);
    }
}

/// The default mode's last window: the busy intervals still open and any rows left are handed over (the
/// flushes of the stop close them only when CUPTI completed a buffer then).
fn close_summaries(api: &cupti::Api) {
    if FLAGS.load(Ordering::Relaxed) & GPU_FLAG_EVERY_RECORD != 0 {
        return;
    }
    let mut guard = lock(&CONV);
    let Some(conv) = guard.as_mut() else { return };
    let mut sink = Handoff(api);
    let before = (conv.packer.chunks_out, conv.packer.records_out);
    let (rows, busy) = conv.summary.finish(u64::MAX, &mut conv.packer, &mut sink);
    conv.packer.flush(&mut sink);
    let s = &llmprof_gpu_stats;
    s.summaries.fetch_add(rows, Ordering::Relaxed);
    s.busy.fetch_add(busy, Ordering::Relaxed);
    s.chunks
        .fetch_add(conv.packer.chunks_out - before.0, Ordering::Relaxed);
    s.records
        .fetch_add(conv.packer.records_out - before.1, Ordering::Relaxed);
}

/// `llmprof_abi::cupti::GPU_STOP`: flushes, disables every activity kind, unsubscribes; 0. The library stays.
#[unsafe(no_mangle)]
pub extern "C" fn llmprof_gpu_stop() -> u32 {
    let mut state = lock(&STATE);
    if let (Some(run), Some((api, _))) = (state.take(), API.get()) {
        // Inactive first: the flushes below close every open busy interval.
        llmprof_gpu_stats.active.store(0, Ordering::Relaxed);
        stop_running(api, run);
        close_summaries(api);
        llmprof_gpu_stats.stops.fetch_add(1, Ordering::Relaxed);
    }
    0
}

/// One line on the target's stderr (what CUPTI refused; the helper has no other channel).
fn note(msg: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "llmprof-cupti: {msg}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handoff_begins_with_nop5_and_returns() {
        // SAFETY: the function is at least 6 bytes of readable code (NOP5 + ret).
        let bytes = unsafe { core::slice::from_raw_parts(llmprof_gpu_activity as *const u8, 6) };
        assert_eq!(&bytes[..5], &llmprof_abi::PROBE_NOP5);
        assert_eq!(bytes[5], 0xc3);
    }

    #[test]
    fn without_libcuda_start_says_so_and_stop_is_harmless() {
        assert_eq!(llmprof_gpu_start(0), GpuStartStatus::NoLibcuda as u32);
        assert_eq!(llmprof_gpu_stop(), 0);
        assert_eq!(llmprof_gpu_stats.snapshot().starts, 0);
    }
}
