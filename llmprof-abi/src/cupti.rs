//! The `cupti` family: GPU activity handed from the injected CUPTI helper library to llmprof, the one layout both
//! sides agree on, and the record the eBPF uprobe at the handoff makes of each chunk ([`GpuChunkEvent`]).
//!
//! `llmprof attach` injects a helper library (`libllmprof_cupti.so`, crate `llmprof-cupti`) into a running
//! CUDA process (ptrace + `dlopen`) and calls [`GPU_START`] in it; the helper turns on CUPTI's activity API,
//! converts each completed CUPTI buffer into records of this module (so llmprof never depends on a CUPTI
//! version's struct layout) and hands them over in chunks of at most [`GPU_CHUNK_MAX`] bytes by calling
//! [`GPU_HANDOFF`] — a function that begins with [`crate::PROBE_NOP5`] and does nothing else. llmprof's
//! uprobe on it copies the chunk into the ring buffer: one probe hit per chunk, never one per kernel. On
//! detach llmprof calls [`GPU_STOP`] (flush, disable every activity kind, unsubscribe); the library stays
//! loaded and idle, and the next attach calls [`GPU_START`] again.
//!
//! A chunk is a [`GpuChunkHeader`] followed by records. Each record starts with a [`GpuRecordHeader`]
//! (kind + size, size a multiple of 8 including the header), so a reader skips kinds it does not know:
//! - [`GpuRecordKind::Activity`]: a [`GpuActivity`] (kernel, memcpy, memset, synchronization);
//! - [`GpuRecordKind::ApiCall`]: a [`GpuApiCall`] (a driver/runtime call that launched or waited: links a
//!   kernel to the thread that launched it through the correlation id);
//! - [`GpuRecordKind::Name`]: a [`GpuName`] header followed by `len` bytes of a (mangled) kernel name, sent
//!   once per name before the first activity that refers to its `name_id`;
//! - [`GpuRecordKind::Summary`]: a [`GpuSummary`] (per window and device: count, total, min, max GPU time of
//!   one kernel name, copy kind or wait type);
//! - [`GpuRecordKind::Busy`]: a [`GpuBusy`] (a compacted interval of GPU work on one device: its span, the
//!   kernel time inside it and its top kernel).
//!
//! Two modes, chosen by [`GPU_START`]'s flags. Without [`GPU_FLAG_EVERY_RECORD`] (llmprof's default) the helper
//! sends summaries: per window (one completed CUPTI buffer, at most [`WINDOW_HINT_MS`] apart) a
//! [`GpuSummary`] per kernel name, copy kind and wait type, [`GpuBusy`] intervals, and one [`GpuActivity`] per
//! CUDA graph launch (CUPTI's graph-level records: the graph's span, not its nodes). With it, every kernel,
//! copy, memset and wait is its own [`GpuActivity`] and graph launches come node by node.
//!
//! Timestamps in records are CUPTI's clock ([`GpuChunkHeader::cupti_ns`] and
//! [`GpuChunkHeader::boottime_ns`] are one pair of readings taken together: llmprof maps every timestamp of
//! the chunk with that pair to CLOCK_BOOTTIME). Not part of the engine ABI: versioned by [`GPU_ABI_VERSION`].

use crate::{EventHeader, Family};

/// Uprobe at [`GPU_HANDOFF`] in the helper: one [`GpuChunkEvent`] per chunk (counted under `ProbeId::Cuda`).
pub const HANDOFF_PROGRAM: &str = "llmprof_gpu";
/// Every program of the family.
pub const PROGRAMS: [&str; 1] = [HANDOFF_PROGRAM];
/// Every map of the family.
pub const MAPS: [&str; 0] = [];
/// The family's kernel names.
pub const FAMILY: Family = Family {
    name: "cupti",
    programs: &PROGRAMS,
    maps: &MAPS,
};

/// Exported by the helper: `extern "C" fn(chunk: *const u8, len: u64)`; starts with the 5-byte NOP llmprof's
/// uprobe sits on.
pub const GPU_HANDOFF: &str = "llmprof_gpu_activity";
/// Exported by the helper: `extern "C" fn(flags: u64) -> u32` ([`GpuStartStatus`]); flags `GPU_FLAG_*`.
pub const GPU_START: &str = "llmprof_gpu_start";
/// Exported by the helper: `extern "C" fn() -> u32` (0: stopped; flushes first).
pub const GPU_STOP: &str = "llmprof_gpu_stop";
/// File name of the helper library (found next to the `llmprof` binary).
pub const GPU_HELPER_LIB: &str = "libllmprof_cupti.so";

/// Version of this module's layouts; a chunk of a version outside [`GPU_ABI_OLDEST`]..=this is refused by
/// llmprof (counted, not read).
pub const GPU_ABI_VERSION: u32 = 2;
/// The oldest chunk version llmprof reads: version 1 (a helper loaded by an earlier llmprof, still in a
/// long-running target) has the same layouts without [`GpuSummary`], [`GpuBusy`] and graph launches, and a
/// [`GpuHelperStats`] of its first 8 counters.
pub const GPU_ABI_OLDEST: u32 = 1;
/// [`GpuChunkHeader::magic`]: "LGPU".
pub const GPU_CHUNK_MAGIC: u32 = u32::from_le_bytes(*b"LGPU");
/// Largest chunk the helper hands over (header included); the uprobe copies at most this many bytes.
pub const GPU_CHUNK_MAX: usize = 16 * 1024;
/// Longest kernel name sent; a longer one is cut and flagged ([`GpuName::truncated`]).
pub const GPU_NAME_MAX: usize = 4000;

/// [`GPU_START`] flag: also record the driver calls that launch work ([`GpuApiCall`]), for launch → kernel
/// flows. Without it only GPU-side records are sent.
pub const GPU_FLAG_API_CALLS: u64 = 1;
/// [`GPU_START`] flag: every kernel, copy, memset and wait as its own [`GpuActivity`], CUDA graphs node by
/// node (the deep mode). Without it: [`GpuSummary`] and [`GpuBusy`] records per window, graphs per launch.
pub const GPU_FLAG_EVERY_RECORD: u64 = 2;
/// How often (ms) the helper asks CUPTI to complete its buffers: the longest a window of summaries lasts
/// (a buffer that fills up ends its window earlier).
pub const WINDOW_HINT_MS: u32 = 100;

/// What [`GPU_START`] returns.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuStartStatus {
    /// Activity recording is on.
    Started = 0,
    /// No CUPTI library could be loaded in the target.
    NoCupti = 1,
    /// CUPTI already has a subscriber in this process (Kineto, Nsight, another tool).
    SubscriberTaken = 2,
    /// CUPTI refused an activity kind or the buffer callbacks (the CUPTI result code is lost; see the
    /// helper's stderr).
    CuptiError = 3,
    /// Already started by an earlier attach that did not stop it (the helper keeps running).
    AlreadyStarted = 4,
    /// The process has no CUDA driver library loaded.
    NoLibcuda = 5,
}

impl GpuStartStatus {
    /// Decodes the returned value.
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Started),
            1 => Some(Self::NoCupti),
            2 => Some(Self::SubscriberTaken),
            3 => Some(Self::CuptiError),
            4 => Some(Self::AlreadyStarted),
            5 => Some(Self::NoLibcuda),
            _ => None,
        }
    }
}

/// Start of every chunk.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuChunkHeader {
    /// [`GPU_CHUNK_MAGIC`].
    pub magic: u32,
    /// [`GPU_ABI_VERSION`].
    pub version: u32,
    /// Bytes of the chunk, this header included (≤ [`GPU_CHUNK_MAX`]).
    pub len: u32,
    /// Records that follow.
    pub records: u32,
    /// Activity records lost since the previous chunk (CUPTI's dropped count plus the helper's own).
    pub dropped: u64,
    /// CUPTI's timestamp (`cuptiGetTimestamp`) ...
    pub cupti_ns: u64,
    /// ... and CLOCK_BOOTTIME read right after it.
    pub boottime_ns: u64,
    /// Sequence number of the chunk in this process since the helper was loaded (gaps: chunks llmprof missed).
    pub seq: u64,
}

/// Kinds of records in a chunk.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuRecordKind {
    /// [`GpuActivity`].
    Activity = 1,
    /// [`GpuApiCall`].
    ApiCall = 2,
    /// [`GpuName`] + name bytes.
    Name = 3,
    /// [`GpuSummary`].
    Summary = 4,
    /// [`GpuBusy`].
    Busy = 5,
}

/// Start of every record in a chunk.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuRecordHeader {
    /// [`GpuRecordKind`] as u16.
    pub kind: u16,
    /// Always 0.
    pub flags: u16,
    /// Bytes of the record including this header, a multiple of 8.
    pub size: u32,
}

impl GpuRecordHeader {
    /// The header of a record of `kind` that is `size` bytes long (header included).
    pub const fn new(kind: GpuRecordKind, size: usize) -> Self {
        Self {
            kind: kind as u16,
            flags: 0,
            size: size as u32,
        }
    }
}

/// What a [`GpuActivity`] is.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuActivityKind {
    /// A kernel (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL).
    Kernel = 0,
    /// A copy (CUPTI_ACTIVITY_KIND_MEMCPY); `detail` is CUPTI's `CUpti_ActivityMemcpyKind`.
    Memcpy = 1,
    /// A memset (CUPTI_ACTIVITY_KIND_MEMSET).
    Memset = 2,
    /// A host wait (CUPTI_ACTIVITY_KIND_SYNCHRONIZATION); `detail` is `CUpti_ActivitySynchronizationType`.
    Sync = 3,
    /// A CUDA graph launch as a whole (CUPTI_ACTIVITY_KIND_GRAPH_TRACE): its span on the GPU, `graph_id`.
    Graph = 4,
}

impl GpuActivityKind {
    /// Decodes [`GpuActivity::kind`].
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Kernel),
            1 => Some(Self::Memcpy),
            2 => Some(Self::Memset),
            3 => Some(Self::Sync),
            4 => Some(Self::Graph),
            _ => None,
        }
    }
}

/// No graph: [`GpuActivity::graph_id`] of work not launched from a CUDA graph.
pub const NO_GRAPH: u32 = 0;

/// One piece of GPU work (or a host wait on it), times on CUPTI's clock.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuActivity {
    /// Header ([`GpuRecordKind::Activity`], size `size_of::<GpuActivity>()`).
    pub hdr: GpuRecordHeader,
    /// [`GpuActivityKind`] as u32.
    pub kind: u32,
    /// CUDA device ordinal.
    pub device: u32,
    /// CUDA context id.
    pub context: u32,
    /// Stream id (CUPTI's); for [`GpuActivityKind::Sync`] the stream waited on, if any.
    pub stream: u32,
    /// Correlation id of the API call that issued it (0: none).
    pub correlation: u32,
    /// Kernels: id of the [`GpuName`] sent earlier in this process; else 0.
    pub name_id: u32,
    /// Start, CUPTI ns.
    pub start_ns: u64,
    /// End, CUPTI ns.
    pub end_ns: u64,
    /// Graph this work was launched from ([`NO_GRAPH`] when none).
    pub graph_id: u32,
    /// Memcpy: copy kind; Sync: synchronization type; else 0.
    pub detail: u32,
    /// Graph node id (0 outside graphs).
    pub graph_node: u64,
    /// Memcpy/memset: bytes.
    pub bytes: u64,
    /// Kernels: grid x, y, z.
    pub grid: [u32; 3],
    /// Kernels: block x, y, z.
    pub block: [u32; 3],
    /// Kernels: registers per thread.
    pub registers: u32,
    /// Kernels: static shared memory per block, bytes.
    pub shared_static: u32,
    /// Kernels: dynamic shared memory per block, bytes.
    pub shared_dynamic: u32,
    /// Always 0.
    pub pad: u32,
}

/// A driver or runtime API call CUPTI recorded (launch-type calls and waits), times on CUPTI's clock.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuApiCall {
    /// Header ([`GpuRecordKind::ApiCall`]).
    pub hdr: GpuRecordHeader,
    /// Correlation id (matches [`GpuActivity::correlation`]).
    pub correlation: u32,
    /// CUPTI callback id of the function (driver API `CUpti_driver_api_trace_cbid`).
    pub cbid: u32,
    /// Process id.
    pub pid: u32,
    /// Thread id as the kernel knows it (the helper sets CUPTI's thread id type to the system's).
    pub tid: u32,
    /// Start, CUPTI ns.
    pub start_ns: u64,
    /// End, CUPTI ns.
    pub end_ns: u64,
    /// 1: a runtime API call (`CUpti_runtime_api_trace_cbid`), 0: driver API.
    pub runtime: u32,
    /// Id of the function's name (`cuptiGetCallbackName`, sent once per process as a [`GpuName`] before the
    /// first call that uses it, in the kernel names' id space); 0: not known (a CUPTI without that function).
    pub name_id: u32,
}

/// A kernel's or a CUDA API function's name: this header, then `len` bytes (not NUL terminated), padded with
/// zeros to a multiple of 8.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuName {
    /// Header ([`GpuRecordKind::Name`], size = 16 + len rounded up to 8).
    pub hdr: GpuRecordHeader,
    /// Id the activities refer to (unique per process, from 1).
    pub name_id: u32,
    /// Bytes of the name that follow (≤ [`GPU_NAME_MAX`]).
    pub len: u16,
    /// 1 when the name was cut at [`GPU_NAME_MAX`] bytes.
    pub truncated: u16,
}

/// Per window, device and kernel name (or copy kind, or wait type): what CUPTI recorded, summed. Times on
/// CUPTI's clock.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuSummary {
    /// Header ([`GpuRecordKind::Summary`]).
    pub hdr: GpuRecordHeader,
    /// Window number (counts up from 0 per start of the helper); the summaries of one window share it.
    pub window: u32,
    /// [`GpuActivityKind`] as u32 (kernel, memcpy, memset, sync).
    pub kind: u32,
    /// CUDA device ordinal (0 for waits).
    pub device: u32,
    /// Kernels: the [`GpuName`] id (0: unnamed, or the rest beyond the names kept per window); else 0.
    pub name_id: u32,
    /// Memcpy: copy kind; Sync: synchronization type; else 0.
    pub detail: u32,
    /// Always 0.
    pub pad: u32,
    /// Records summed.
    pub count: u64,
    /// Sum of their durations, ns.
    pub total_ns: u64,
    /// Shortest, ns.
    pub min_ns: u64,
    /// Longest, ns.
    pub max_ns: u64,
    /// Earliest start, CUPTI ns.
    pub first_ns: u64,
    /// Latest end, CUPTI ns.
    pub last_ns: u64,
    /// Memcpy/memset: bytes summed.
    pub bytes: u64,
}

/// An interval of GPU work on one device, compacted: kernels (and graph launches) whose idle gaps are shorter
/// than the helper's gap threshold are one interval; `end − start − busy_ns` is the idle time inside it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuBusy {
    /// Header ([`GpuRecordKind::Busy`]).
    pub hdr: GpuRecordHeader,
    /// CUDA device ordinal.
    pub device: u32,
    /// Kernels (a graph launch counts one) inside it.
    pub kernels: u32,
    /// First start, CUPTI ns.
    pub start_ns: u64,
    /// Last end, CUPTI ns.
    pub end_ns: u64,
    /// Union of the kernels' intervals inside it, ns.
    pub busy_ns: u64,
    /// The kernel name with the most GPU time inside it ([`GpuName`] id; 0: unnamed or a graph).
    pub top_name_id: u32,
    /// Launches of that kernel inside it.
    pub top_count: u32,
    /// GPU time of that kernel inside it, ns.
    pub top_ns: u64,
}

/// Exported by the helper: a [`GpuHelperStats`] static (its counters since the library was loaded), read by
/// llmprof from the target's memory (`/proc/PID/mem` at the symbol's address) for the attach summary and tests.
pub const GPU_STATS: &str = "llmprof_gpu_stats";

/// The helper's own counters (each an atomic u64 in the helper; plain u64 as llmprof reads them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuHelperStats {
    /// Chunks handed over ([`GPU_HANDOFF`] calls).
    pub chunks: u64,
    /// Activity and API-call records handed over (names not counted).
    pub records: u64,
    /// Name records handed over.
    pub names: u64,
    /// Activity records lost (CUPTI's dropped count plus the helper's own: no buffer free, record too short).
    pub dropped: u64,
    /// CUPTI buffers completed.
    pub buffers: u64,
    /// Successful [`GPU_START`] calls.
    pub starts: u64,
    /// [`GPU_STOP`] calls that stopped a started recording.
    pub stops: u64,
    /// 1 while started.
    pub active: u64,
    /// CUPTI records read from completed buffers since the library was loaded (every kind).
    pub cupti_records: u64,
    /// CPU time of the helper's own work (the buffer callback, CLOCK_THREAD_CPUTIME_ID), ns.
    pub helper_cpu_ns: u64,
    /// CPU time of CUPTI's buffer thread between and inside the callbacks while recording (the thread's
    /// CLOCK_THREAD_CPUTIME_ID, from its first callback of each start; includes `helper_cpu_ns` spent there), ns.
    pub cupti_thread_cpu_ns: u64,
    /// The flags of the last [`GPU_START`].
    pub flags: u64,
    /// [`GpuSummary`] records handed over.
    pub summaries: u64,
    /// [`GpuBusy`] records handed over.
    pub busy: u64,
    /// 1 when CUPTI accepted graph-level records (`CUPTI_ACTIVITY_KIND_GRAPH_TRACE`) at the last start.
    pub graph_trace: u64,
}

const _: () = assert!(core::mem::size_of::<GpuChunkHeader>() == 48);
const _: () = assert!(core::mem::size_of::<GpuRecordHeader>() == 8);
const _: () = assert!(core::mem::size_of::<GpuActivity>() == 112);
const _: () = assert!(core::mem::size_of::<GpuApiCall>() == 48);
const _: () = assert!(core::mem::size_of::<GpuName>() == 16);
const _: () = assert!(core::mem::size_of::<GpuSummary>() == 88);
const _: () = assert!(core::mem::size_of::<GpuBusy>() == 56);
const _: () = assert!(core::mem::size_of::<GpuHelperStats>() == 120);

/// A chunk of GPU activity ([`GpuChunkHeader`] + records) copied by the uprobe at [`GPU_HANDOFF`]:
/// one record per handed-over chunk. Its records are read by llmprof's one reader of this module's layouts.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GpuChunkEvent {
    /// Header ([`crate::EventKind::GpuChunk`]); `ts_ns` is when the helper handed the chunk over.
    pub hdr: EventHeader,
    /// The `len` argument the helper passed.
    pub len: u64,
    /// Bytes of `data` copied: `len` (a longer chunk is not copied: counted as a drop).
    pub copied: u32,
    /// Padding.
    pub _pad: u32,
    /// The chunk.
    pub data: [u8; GPU_CHUNK_MAX],
}

const _: () = assert!(core::mem::size_of::<GpuChunkEvent>() == 40 + GPU_CHUNK_MAX);
