//! CUPTI activity records → the records of `llmprof_abi::gpu`, packed into chunks.
//!
//! Owns the only reading of CUPTI's struct layouts in the workspace (so llmprof never depends on a CUPTI
//! version) and the chunk packing. Pure: records come in as byte slices of a completed CUPTI buffer, chunks
//! go out through a [`Sink`]; no CUPTI call, no allocation after [`Packer::new`] and [`Names::new`] (but one
//! per API function the first time it is seen: its name, asked of the [`Sink`]).
//!
//! Layouts (`cupti_activity.h`, `PACKED_ALIGNMENT`: packed, 8-byte aligned). The fields read here sit at the
//! same offsets in every record version CUPTI has written since CUDA 11.0 (CUPTI API version 13:
//! `CUpti_ActivityKernel5` … `CUpti_ActivityKernel10` of CUDA 13, `CUpti_ActivityMemcpy4` … `Memcpy6`,
//! `CUpti_ActivityMemset3` … `Memset4`, `CUpti_ActivitySynchronization`/`Synchronization2`,
//! `CUpti_ActivityAPI`, `CUpti_ActivityGraphTrace`/`GraphTrace2`); later versions only append fields. Older
//! CUPTIs (API version < 13) have no graph fields: they are left 0 there ([`GRAPH_FIELDS_SINCE`]).

use std::collections::HashMap;
use std::ffi::{CStr, c_char};

use llmprof_abi::gpu::{
    GPU_ABI_VERSION, GPU_CHUNK_MAGIC, GPU_CHUNK_MAX, GPU_NAME_MAX, GpuActivity, GpuActivityKind, GpuApiCall,
    GpuBusy, GpuChunkHeader, GpuName, GpuRecordHeader, GpuRecordKind, GpuSummary, NO_GRAPH,
};

/// `CUPTI_ACTIVITY_KIND_MEMCPY` (cupti_activity.h `CUpti_ActivityKind`).
pub const KIND_MEMCPY: u32 = 1;
/// `CUPTI_ACTIVITY_KIND_MEMSET`.
pub const KIND_MEMSET: u32 = 2;
/// `CUPTI_ACTIVITY_KIND_DRIVER`.
pub const KIND_DRIVER: u32 = 4;
/// `CUPTI_ACTIVITY_KIND_RUNTIME`.
pub const KIND_RUNTIME: u32 = 5;
/// `CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`.
pub const KIND_CONCURRENT_KERNEL: u32 = 10;
/// `CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`.
pub const KIND_SYNCHRONIZATION: u32 = 38;
/// `CUPTI_ACTIVITY_KIND_GRAPH_TRACE`: one record per CUDA graph launch, instead of one per node.
pub const KIND_GRAPH_TRACE: u32 = 51;
/// CUPTI API version (`cuptiGetVersion`) of CUDA 11.0, the first whose records carry graph ids.
pub const GRAPH_FIELDS_SINCE: u32 = 13;

/// Byte offsets of `CUpti_ActivityKernel5`…`10` (identical prefix).
mod kernel {
    pub const REGISTERS: usize = 6; // uint16_t registersPerThread
    pub const START: usize = 16;
    pub const END: usize = 24;
    pub const DEVICE: usize = 40;
    pub const CONTEXT: usize = 44;
    pub const STREAM: usize = 48;
    pub const GRID: usize = 52; // int32_t gridX, gridY, gridZ, blockX, blockY, blockZ
    pub const STATIC_SHARED: usize = 76;
    pub const DYNAMIC_SHARED: usize = 80;
    pub const CORRELATION: usize = 92;
    pub const NAME: usize = 104; // const char *name
    pub const GRAPH_NODE: usize = 144; // uint64_t graphNodeId (Kernel5+)
    pub const GRAPH_ID: usize = 156; // uint32_t graphId (Kernel5+)
    /// Bytes read without graph fields (through `name`) and with them.
    pub const MIN: usize = 112;
    pub const MIN_GRAPH: usize = 160;
}

/// Offsets of `CUpti_ActivityMemcpy4`…`6` and `CUpti_ActivityMemset3`…`4` (same positions for the shared fields).
mod copy {
    pub const DETAIL: usize = 4; // memcpy: uint8_t copyKind; memset: uint32_t value (not sent)
    pub const BYTES: usize = 8;
    pub const START: usize = 16;
    pub const END: usize = 24;
    pub const DEVICE: usize = 32;
    pub const CONTEXT: usize = 36;
    pub const STREAM: usize = 40;
    pub const CORRELATION: usize = 44;
    pub const GRAPH_NODE: usize = 64;
    pub const GRAPH_ID: usize = 72;
    pub const MIN: usize = 48;
    pub const MIN_GRAPH: usize = 76;
}

/// Offsets of `CUpti_ActivitySynchronization` (and `Synchronization2`).
mod sync {
    pub const TYPE: usize = 4;
    pub const START: usize = 8;
    pub const END: usize = 16;
    pub const CORRELATION: usize = 24;
    pub const CONTEXT: usize = 28;
    pub const STREAM: usize = 32;
    pub const MIN: usize = 40;
}

/// Offsets of `CUpti_ActivityGraphTrace` and `CUpti_ActivityGraphTrace2` (which appends end device/context).
mod graph {
    pub const CORRELATION: usize = 4;
    pub const START: usize = 8;
    pub const END: usize = 16;
    pub const DEVICE: usize = 24;
    pub const GRAPH_ID: usize = 28;
    pub const CONTEXT: usize = 32;
    pub const STREAM: usize = 36;
    pub const MIN: usize = 40;
}

/// Offsets of `CUpti_ActivityAPI`.
mod api {
    pub const CBID: usize = 4;
    pub const START: usize = 8;
    pub const END: usize = 16;
    pub const PID: usize = 24;
    pub const TID: usize = 28;
    pub const CORRELATION: usize = 32;
    pub const MIN: usize = 40;
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    b.get(off..off + 2)
        .map_or(0, |s| u16::from_le_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// A CUPTI record turned into a gpu.rs record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Converted {
    /// A kernel, copy, memset or wait; `name` is the kernel's `const char *name` (0: none), resolved to
    /// [`GpuActivity::name_id`] by [`Names`].
    Activity {
        /// The record (name_id still 0).
        act: GpuActivity,
        /// CUPTI's name pointer.
        name: usize,
    },
    /// A driver or runtime API call.
    Api(GpuApiCall),
}

/// Why a record was not converted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// A kind the helper does not send (counted nowhere: not enabled by it).
    OtherKind,
    /// Shorter than its layout: counted as dropped.
    Short,
}

/// An activity record of `kind` with every other field zero (no graph).
pub(crate) fn activity(kind: GpuActivityKind) -> GpuActivity {
    GpuActivity {
        hdr: GpuRecordHeader::new(GpuRecordKind::Activity, core::mem::size_of::<GpuActivity>()),
        kind: kind as u32,
        device: 0,
        context: 0,
        stream: 0,
        correlation: 0,
        name_id: 0,
        start_ns: 0,
        end_ns: 0,
        graph_id: NO_GRAPH,
        detail: 0,
        graph_node: 0,
        bytes: 0,
        grid: [0; 3],
        block: [0; 3],
        registers: 0,
        shared_static: 0,
        shared_dynamic: 0,
        pad: 0,
    }
}

/// Converts one record: `rec` is the record's bytes (from its start to the end of the buffer's valid part),
/// `version` the CUPTI API version of the library that wrote it.
pub fn convert(rec: &[u8], version: u32) -> Result<Converted, Skip> {
    let graphs = version >= GRAPH_FIELDS_SINCE;
    match u32_at(rec, 0) {
        KIND_CONCURRENT_KERNEL => {
            if rec.len() < if graphs { kernel::MIN_GRAPH } else { kernel::MIN } {
                return Err(Skip::Short);
            }
            let mut a = activity(GpuActivityKind::Kernel);
            a.start_ns = u64_at(rec, kernel::START);
            a.end_ns = u64_at(rec, kernel::END);
            a.device = u32_at(rec, kernel::DEVICE);
            a.context = u32_at(rec, kernel::CONTEXT);
            a.stream = u32_at(rec, kernel::STREAM);
            for i in 0..3 {
                a.grid[i] = u32_at(rec, kernel::GRID + 4 * i);
                a.block[i] = u32_at(rec, kernel::GRID + 12 + 4 * i);
            }
            a.registers = u32::from(u16_at(rec, kernel::REGISTERS));
            a.shared_static = u32_at(rec, kernel::STATIC_SHARED);
            a.shared_dynamic = u32_at(rec, kernel::DYNAMIC_SHARED);
            a.correlation = u32_at(rec, kernel::CORRELATION);
            if graphs {
                a.graph_node = u64_at(rec, kernel::GRAPH_NODE);
                a.graph_id = u32_at(rec, kernel::GRAPH_ID);
            }
            Ok(Converted::Activity {
                act: a,
                name: u64_at(rec, kernel::NAME) as usize,
            })
        }
        k @ (KIND_MEMCPY | KIND_MEMSET) => {
            if rec.len() < if graphs { copy::MIN_GRAPH } else { copy::MIN } {
                return Err(Skip::Short);
            }
            let memcpy = k == KIND_MEMCPY;
            let mut a = activity(if memcpy {
                GpuActivityKind::Memcpy
            } else {
                GpuActivityKind::Memset
            });
            if memcpy {
                a.detail = u32::from(rec[copy::DETAIL]);
            }
            a.bytes = u64_at(rec, copy::BYTES);
            a.start_ns = u64_at(rec, copy::START);
            a.end_ns = u64_at(rec, copy::END);
            a.device = u32_at(rec, copy::DEVICE);
            a.context = u32_at(rec, copy::CONTEXT);
            a.stream = u32_at(rec, copy::STREAM);
            a.correlation = u32_at(rec, copy::CORRELATION);
            if graphs {
                a.graph_node = u64_at(rec, copy::GRAPH_NODE);
                a.graph_id = u32_at(rec, copy::GRAPH_ID);
            }
            Ok(Converted::Activity { act: a, name: 0 })
        }
        KIND_GRAPH_TRACE => {
            if rec.len() < graph::MIN {
                return Err(Skip::Short);
            }
            let mut a = activity(GpuActivityKind::Graph);
            a.correlation = u32_at(rec, graph::CORRELATION);
            a.start_ns = u64_at(rec, graph::START);
            a.end_ns = u64_at(rec, graph::END);
            // INT_MAX: the graph started on the host (a host node first); its device is not known.
            a.device = match u32_at(rec, graph::DEVICE) {
                0x7fff_ffff => 0,
                d => d,
            };
            a.graph_id = u32_at(rec, graph::GRAPH_ID);
            a.context = u32_at(rec, graph::CONTEXT);
            a.stream = u32_at(rec, graph::STREAM);
            Ok(Converted::Activity { act: a, name: 0 })
        }
        KIND_SYNCHRONIZATION => {
            if rec.len() < sync::MIN {
                return Err(Skip::Short);
            }
            let mut a = activity(GpuActivityKind::Sync);
            a.detail = u32_at(rec, sync::TYPE);
            a.start_ns = u64_at(rec, sync::START);
            a.end_ns = u64_at(rec, sync::END);
            a.correlation = u32_at(rec, sync::CORRELATION);
            a.context = u32_at(rec, sync::CONTEXT);
            a.stream = u32_at(rec, sync::STREAM);
            Ok(Converted::Activity { act: a, name: 0 })
        }
        k @ (KIND_DRIVER | KIND_RUNTIME) => {
            if rec.len() < api::MIN {
                return Err(Skip::Short);
            }
            Ok(Converted::Api(GpuApiCall {
                hdr: GpuRecordHeader::new(GpuRecordKind::ApiCall, core::mem::size_of::<GpuApiCall>()),
                correlation: u32_at(rec, api::CORRELATION),
                cbid: u32_at(rec, api::CBID),
                pid: u32_at(rec, api::PID),
                tid: u32_at(rec, api::TID),
                start_ns: u64_at(rec, api::START),
                end_ns: u64_at(rec, api::END),
                runtime: u32::from(k == KIND_RUNTIME),
                name_id: 0,
            }))
        }
        _ => Err(Skip::OtherKind),
    }
}

/// Most distinct kernel names remembered per start (beyond: activities get name id 0, the name is not sent).
pub const MAX_NAMES: usize = 1 << 16;

/// Kernel and API function names sent so far (by a 64-bit FNV-1a hash of the bytes, so CUPTI's pointers need
/// not be stable), and the name id of each API function seen (by (runtime, callback id); 0: no name).
#[derive(Debug)]
pub struct Names {
    ids: HashMap<u64, u32>,
    next: u32,
    api: HashMap<(bool, u32), u32>,
}

impl Default for Names {
    fn default() -> Self {
        Self::new()
    }
}

impl Names {
    /// An empty table (its memory is reserved once).
    pub fn new() -> Self {
        Self {
            ids: HashMap::with_capacity(1024),
            next: 1,
            api: HashMap::with_capacity(256),
        }
    }

    /// Forgets every name: the next session gets each name again.
    pub fn clear(&mut self) {
        self.ids.clear();
        self.next = 1;
        self.api.clear();
    }

    /// The id of `name`, and whether it is new (to be sent before the activity). `(0, false)` when full.
    pub fn id(&mut self, name: &[u8]) -> (u32, bool) {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in name {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        if let Some(&id) = self.ids.get(&h) {
            return (id, false);
        }
        if self.ids.len() >= MAX_NAMES {
            return (0, false);
        }
        let id = self.next;
        self.next += 1;
        self.ids.insert(h, id);
        (id, true)
    }
}

/// Where chunks go, the clock pair each chunk header carries, and the names of CUDA API functions.
pub trait Sink {
    /// (CUPTI timestamp, CLOCK_BOOTTIME) read together.
    fn clock(&mut self) -> (u64, u64);
    /// One finished chunk.
    fn handoff(&mut self, chunk: &[u8]);
    /// The name of the driver (`runtime` false) or runtime API function with callback id `cbid`
    /// (`cuptiGetCallbackName`); asked once per function and session. `None`: not known.
    fn api_name(&mut self, runtime: bool, cbid: u32) -> Option<Vec<u8>>;
}

/// What a timeline shows of CUPTI's name for an API function: runtime names lose CUPTI's version suffix
/// (`cudaLaunchKernel_v7000` → `cudaLaunchKernel`); driver names are the exported symbols and stay
/// (`cuMemcpyHtoDAsync_v2`).
pub fn api_display_name(runtime: bool, raw: &[u8]) -> &[u8] {
    if !runtime {
        return raw;
    }
    match raw.iter().rposition(|&b| b == b'_') {
        Some(i)
            if raw.len() - i >= 6 && raw[i + 1] == b'v' && raw[i + 2..].iter().all(u8::is_ascii_digit) =>
        {
            &raw[..i]
        }
        _ => raw,
    }
}

/// Types written into chunks as raw bytes.
///
/// # Safety
/// Implementors are `repr(C)` and have no padding bytes (their sizes are asserted in `llmprof_abi::gpu`).
pub(crate) unsafe trait Plain: Copy {}
// SAFETY: repr(C), fields sum to the asserted 112 bytes: no padding.
unsafe impl Plain for GpuActivity {}
// SAFETY: repr(C), 48 bytes of fields, no padding.
unsafe impl Plain for GpuApiCall {}
// SAFETY: repr(C), 16 bytes of fields, no padding.
unsafe impl Plain for GpuName {}
// SAFETY: repr(C), 48 bytes of fields, no padding.
unsafe impl Plain for GpuChunkHeader {}
// SAFETY: repr(C), 88 bytes of fields (u32s in pairs before the u64s), no padding.
unsafe impl Plain for GpuSummary {}
// SAFETY: repr(C), 56 bytes of fields (u32s in pairs before the u64s), no padding.
unsafe impl Plain for GpuBusy {}

fn bytes_of<T: Plain>(v: &T) -> &[u8] {
    // SAFETY: `T: Plain` has no padding, so every byte of `*v` is initialized; the slice borrows `v`.
    unsafe { core::slice::from_raw_parts((v as *const T).cast::<u8>(), core::mem::size_of::<T>()) }
}

const HDR: usize = core::mem::size_of::<GpuChunkHeader>();

/// Builds chunks of at most [`GPU_CHUNK_MAX`] bytes.
#[derive(Debug)]
pub struct Packer {
    buf: Vec<u8>,
    records: u32,
    seq: u64,
    dropped: u64,
    /// Chunks and records handed over (for the stats).
    pub chunks_out: u64,
    /// Activity/API records handed over.
    pub records_out: u64,
    /// Name records handed over.
    pub names_out: u64,
}

impl Default for Packer {
    fn default() -> Self {
        Self::new()
    }
}

impl Packer {
    /// An empty packer (its one buffer is allocated here).
    pub fn new() -> Self {
        let mut buf = Vec::with_capacity(GPU_CHUNK_MAX);
        buf.resize(HDR, 0);
        Self {
            buf,
            records: 0,
            seq: 0,
            dropped: 0,
            chunks_out: 0,
            records_out: 0,
            names_out: 0,
        }
    }

    /// Adds `n` lost records to the next chunk's header.
    pub fn add_dropped(&mut self, n: u64) {
        self.dropped += n;
    }

    fn push(&mut self, rec: &[u8], sink: &mut impl Sink) {
        if self.buf.len() + rec.len() > GPU_CHUNK_MAX {
            self.flush(sink);
        }
        self.buf.extend_from_slice(rec);
        self.records += 1;
    }

    /// Adds a converted record (and, first, its kernel's or API function's name when new).
    pub fn add(&mut self, conv: Converted, names: &mut Names, sink: &mut impl Sink) {
        match conv {
            Converted::Api(mut call) => {
                let runtime = call.runtime != 0;
                call.name_id = match names.api.get(&(runtime, call.cbid)) {
                    Some(&id) => id,
                    None => {
                        let id = match sink.api_name(runtime, call.cbid) {
                            Some(raw) => {
                                let shown = api_display_name(runtime, &raw);
                                let (id, new) = names.id(shown);
                                if new {
                                    self.push_name(id, shown, sink);
                                }
                                id
                            }
                            None => 0,
                        };
                        names.api.insert((runtime, call.cbid), id);
                        id
                    }
                };
                self.push(bytes_of(&call), sink);
                self.records_out += 1;
            }
            Converted::Activity { mut act, name } => {
                act.name_id = self.name_id(name, names, sink);
                self.push(bytes_of(&act), sink);
                self.records_out += 1;
            }
        }
    }

    /// The name id of CUPTI's kernel name pointer `name` (0: none), its [`GpuName`] record pushed first when
    /// the name is new.
    pub fn name_id(&mut self, name: usize, names: &mut Names, sink: &mut impl Sink) -> u32 {
        if name == 0 {
            return 0;
        }
        // SAFETY: CUPTI's kernel records point `name` at a NUL-terminated string it keeps alive at least
        // until the buffer is returned (cupti_activity.h); the tests pass CStrings.
        let bytes = unsafe { CStr::from_ptr(name as *const c_char) }.to_bytes();
        let (id, new) = names.id(bytes);
        if new {
            self.push_name(id, bytes, sink);
        }
        id
    }

    /// Adds a record of a summary kind ([`GpuSummary`], [`GpuBusy`]) as it is.
    pub(crate) fn add_plain<T: Plain>(&mut self, rec: &T, sink: &mut impl Sink) {
        self.push(bytes_of(rec), sink);
        self.records_out += 1;
    }

    fn push_name(&mut self, id: u32, name: &[u8], sink: &mut impl Sink) {
        let cut = name.len() > GPU_NAME_MAX;
        let name = &name[..name.len().min(GPU_NAME_MAX)];
        let size = (core::mem::size_of::<GpuName>() + name.len()).div_ceil(8) * 8;
        let hdr = GpuName {
            hdr: GpuRecordHeader::new(GpuRecordKind::Name, size),
            name_id: id,
            len: name.len() as u16,
            truncated: u16::from(cut),
        };
        if self.buf.len() + size > GPU_CHUNK_MAX {
            self.flush(sink);
        }
        self.buf.extend_from_slice(bytes_of(&hdr));
        self.buf.extend_from_slice(name);
        let pad = size - core::mem::size_of::<GpuName>() - name.len();
        self.buf.extend(core::iter::repeat_n(0u8, pad));
        self.records += 1;
        self.names_out += 1;
    }

    /// Hands the current chunk over (nothing when it holds no record and no drop to report).
    pub fn flush(&mut self, sink: &mut impl Sink) {
        if self.records == 0 && self.dropped == 0 {
            return;
        }
        let (cupti_ns, boottime_ns) = sink.clock();
        let hdr = GpuChunkHeader {
            magic: GPU_CHUNK_MAGIC,
            version: GPU_ABI_VERSION,
            len: self.buf.len() as u32,
            records: self.records,
            dropped: self.dropped,
            cupti_ns,
            boottime_ns,
            seq: self.seq,
        };
        self.buf[..HDR].copy_from_slice(bytes_of(&hdr));
        sink.handoff(&self.buf);
        self.seq += 1;
        self.chunks_out += 1;
        self.dropped = 0;
        self.records = 0;
        self.buf.truncate(HDR);
    }
}

/// What the tests of this crate share.
#[cfg(test)]
pub(crate) mod test_sink {
    /// A sink that keeps every chunk handed over (its clock reads (10, 20); it knows two API names).
    #[derive(Default)]
    pub(crate) struct Collect(pub(crate) Vec<Vec<u8>>);
    impl super::Sink for Collect {
        fn clock(&mut self) -> (u64, u64) {
            (10, 20)
        }
        fn handoff(&mut self, chunk: &[u8]) {
            self.0.push(chunk.to_vec());
        }
        fn api_name(&mut self, runtime: bool, cbid: u32) -> Option<Vec<u8>> {
            match (runtime, cbid) {
                (false, 307) => Some(b"cuLaunchKernel".to_vec()),
                (true, 211) => Some(b"cudaLaunchKernel_v7000".to_vec()),
                _ => None,
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests panic with the error")]
mod tests {
    use super::test_sink::Collect;
    use super::*;
    use std::ffi::CString;

    /// A `CUpti_ActivityKernel9` as CUDA 12 writes it (field offsets from cupti_activity.h).
    fn kernel9(name: &CString) -> Vec<u8> {
        let mut r = vec![0u8; 200];
        let put32 = |r: &mut Vec<u8>, off: usize, v: u32| r[off..off + 4].copy_from_slice(&v.to_le_bytes());
        let put64 = |r: &mut Vec<u8>, off: usize, v: u64| r[off..off + 8].copy_from_slice(&v.to_le_bytes());
        put32(&mut r, 0, KIND_CONCURRENT_KERNEL);
        r[6..8].copy_from_slice(&40u16.to_le_bytes());
        put64(&mut r, 16, 1_000);
        put64(&mut r, 24, 3_500);
        put32(&mut r, 40, 1);
        put32(&mut r, 44, 7);
        put32(&mut r, 48, 13);
        for (i, v) in [128u32, 2, 1, 256, 1, 1].into_iter().enumerate() {
            put32(&mut r, 52 + 4 * i, v);
        }
        put32(&mut r, 76, 1024);
        put32(&mut r, 80, 4096);
        put32(&mut r, 92, 99);
        put64(&mut r, 104, name.as_ptr() as u64);
        put64(&mut r, 144, 0xabcd);
        put32(&mut r, 156, 5);
        r
    }

    /// An API record of CUPTI (driver or runtime) with callback id `cbid`.
    fn api_rec(runtime: bool, cbid: u32) -> Vec<u8> {
        let mut a = vec![0u8; 40];
        let kind = if runtime { KIND_RUNTIME } else { KIND_DRIVER };
        a[0..4].copy_from_slice(&kind.to_le_bytes());
        a[4..8].copy_from_slice(&cbid.to_le_bytes());
        a
    }

    #[test]
    fn api_functions_are_named_once_per_session_and_runtime_suffixes_go() {
        let (mut names, mut p, mut sink) = (Names::new(), Packer::new(), Collect::default());
        for (runtime, cbid) in [(false, 307), (false, 307), (true, 211), (false, 99), (false, 307)] {
            p.add(
                convert(&api_rec(runtime, cbid), 28).unwrap(),
                &mut names,
                &mut sink,
            );
        }
        p.flush(&mut sink);
        let c = &sink.0[0];
        let mut off = HDR;
        let mut got = Vec::new();
        while off < c.len() {
            let size = u32_at(c, off + 4) as usize;
            if u16_at(c, off) == GpuRecordKind::Name as u16 {
                let n = usize::from(u16_at(c, off + 12));
                got.push(format!(
                    "name {} {}",
                    u32_at(c, off + 8),
                    String::from_utf8_lossy(&c[off + 16..off + 16 + n])
                ));
            } else {
                got.push(format!("call {} -> {}", u32_at(c, off + 12), u32_at(c, off + 44)));
            }
            off += size;
        }
        assert_eq!(
            got,
            [
                "name 1 cuLaunchKernel",
                "call 307 -> 1",
                "call 307 -> 1",
                "name 2 cudaLaunchKernel",
                "call 211 -> 2",
                "call 99 -> 0",
                "call 307 -> 1"
            ]
        );
        assert_eq!(
            api_display_name(false, b"cuMemcpyHtoDAsync_v2"),
            b"cuMemcpyHtoDAsync_v2"
        );
        assert_eq!(api_display_name(true, b"cudaMemcpy_v3020"), b"cudaMemcpy");
        assert_eq!(api_display_name(true, b"cudaFoo_v2"), b"cudaFoo_v2");
    }

    #[test]
    fn kernel_record_fields_land_in_the_activity() {
        let name = CString::new("_Z4gemmPfS_").unwrap();
        let Converted::Activity { act, name: p } = convert(&kernel9(&name), 28).unwrap() else {
            panic!("not an activity")
        };
        assert_eq!(p, name.as_ptr() as usize);
        assert_eq!(act.kind, GpuActivityKind::Kernel as u32);
        assert_eq!((act.start_ns, act.end_ns), (1_000, 3_500));
        assert_eq!(
            (act.device, act.context, act.stream, act.correlation),
            (1, 7, 13, 99)
        );
        assert_eq!((act.grid, act.block), ([128, 2, 1], [256, 1, 1]));
        assert_eq!(
            (act.registers, act.shared_static, act.shared_dynamic),
            (40, 1024, 4096)
        );
        assert_eq!((act.graph_id, act.graph_node), (5, 0xabcd));
        // A CUPTI of CUDA 10 (API version 12) has no graph fields: not read.
        let Converted::Activity { act, .. } = convert(&kernel9(&name), 12).unwrap() else {
            panic!()
        };
        assert_eq!((act.graph_id, act.graph_node), (NO_GRAPH, 0));
        assert_eq!(convert(&kernel9(&name)[..120], 28), Err(Skip::Short));
    }

    #[test]
    fn memcpy_memset_sync_and_api_records() {
        let mut m = vec![0u8; 88];
        m[0..4].copy_from_slice(&KIND_MEMCPY.to_le_bytes());
        m[4] = 2; // CUPTI_ACTIVITY_MEMCPY_KIND_DTOH
        m[8..16].copy_from_slice(&4096u64.to_le_bytes());
        m[16..24].copy_from_slice(&5u64.to_le_bytes());
        m[24..32].copy_from_slice(&9u64.to_le_bytes());
        m[40..44].copy_from_slice(&3u32.to_le_bytes());
        m[44..48].copy_from_slice(&42u32.to_le_bytes());
        m[64..72].copy_from_slice(&77u64.to_le_bytes());
        m[72..76].copy_from_slice(&8u32.to_le_bytes());
        let Converted::Activity { act, name } = convert(&m, 130001).unwrap() else {
            panic!()
        };
        assert_eq!(name, 0);
        assert_eq!(act.kind, GpuActivityKind::Memcpy as u32);
        assert_eq!((act.detail, act.bytes, act.start_ns, act.end_ns), (2, 4096, 5, 9));
        assert_eq!(
            (act.stream, act.correlation, act.graph_node, act.graph_id),
            (3, 42, 77, 8)
        );
        m[0..4].copy_from_slice(&KIND_MEMSET.to_le_bytes());
        let Converted::Activity { act, .. } = convert(&m, 130001).unwrap() else {
            panic!()
        };
        assert_eq!(
            (act.kind, act.detail, act.bytes),
            (GpuActivityKind::Memset as u32, 0, 4096)
        );

        let mut s = vec![0u8; 40];
        s[0..4].copy_from_slice(&KIND_SYNCHRONIZATION.to_le_bytes());
        s[4..8].copy_from_slice(&3u32.to_le_bytes()); // STREAM_SYNCHRONIZE
        s[8..16].copy_from_slice(&100u64.to_le_bytes());
        s[16..24].copy_from_slice(&200u64.to_le_bytes());
        s[32..36].copy_from_slice(&6u32.to_le_bytes());
        let Converted::Activity { act, .. } = convert(&s, 130001).unwrap() else {
            panic!()
        };
        assert_eq!(
            (act.kind, act.detail, act.start_ns, act.end_ns, act.stream),
            (3, 3, 100, 200, 6)
        );

        let mut a = vec![0u8; 40];
        a[0..4].copy_from_slice(&KIND_RUNTIME.to_le_bytes());
        a[4..8].copy_from_slice(&211u32.to_le_bytes());
        a[24..28].copy_from_slice(&1234u32.to_le_bytes());
        a[28..32].copy_from_slice(&1240u32.to_le_bytes());
        a[32..36].copy_from_slice(&42u32.to_le_bytes());
        let Converted::Api(c) = convert(&a, 130001).unwrap() else {
            panic!()
        };
        assert_eq!(
            (c.cbid, c.pid, c.tid, c.correlation, c.runtime),
            (211, 1234, 1240, 42, 1)
        );
        a[0..4].copy_from_slice(&99u32.to_le_bytes());
        assert_eq!(convert(&a, 130001), Err(Skip::OtherKind));
    }

    /// Walks a chunk: (kind, size) of each record, checking sizes and the header.
    fn walk(chunk: &[u8]) -> Vec<(u16, u32)> {
        assert!(chunk.len() <= GPU_CHUNK_MAX);
        assert_eq!(u32_at(chunk, 0), GPU_CHUNK_MAGIC);
        assert_eq!(u32_at(chunk, 8) as usize, chunk.len());
        let mut out = Vec::new();
        let mut off = HDR;
        while off < chunk.len() {
            let (kind, size) = (u16_at(chunk, off), u32_at(chunk, off + 4));
            assert!(size % 8 == 0 && size > 0);
            out.push((kind, size));
            off += size as usize;
        }
        assert_eq!(off, chunk.len());
        assert_eq!(out.len() as u32, u32_at(chunk, 12));
        out
    }

    #[test]
    fn names_go_once_before_their_first_activity_and_chunks_stay_under_the_max() {
        let a = CString::new("_Z1aPf").unwrap();
        let b = CString::new("b".repeat(GPU_NAME_MAX + 10)).unwrap();
        let mut names = Names::new();
        let mut p = Packer::new();
        let mut sink = Collect::default();
        for i in 0..1000 {
            let n = if i % 2 == 0 { &a } else { &b };
            p.add(convert(&kernel9(n), 28).unwrap(), &mut names, &mut sink);
        }
        p.add_dropped(3);
        p.flush(&mut sink);
        assert!(sink.0.len() > 1, "1000 kernels need several chunks");
        let kinds: Vec<(u16, u32)> = sink.0.iter().flat_map(|c| walk(c)).collect();
        let name_recs: Vec<_> = kinds
            .iter()
            .filter(|(k, _)| *k == GpuRecordKind::Name as u16)
            .collect();
        assert_eq!(name_recs.len(), 2);
        assert_eq!(kinds[0].0, GpuRecordKind::Name as u16, "the name comes first");
        assert_eq!(kinds.len(), 1002);
        assert_eq!(
            (p.records_out, p.names_out, p.chunks_out),
            (1000, 2, sink.0.len() as u64)
        );
        // The long name is cut and flagged.
        let first_b = sink.0.iter().flat_map(|c| {
            let mut v = Vec::new();
            let mut off = HDR;
            while off < c.len() {
                let size = u32_at(c, off + 4) as usize;
                if u16_at(c, off) == GpuRecordKind::Name as u16 {
                    v.push((u32_at(c, off + 8), u16_at(c, off + 12), u16_at(c, off + 14)));
                }
                off += size;
            }
            v
        });
        let got: Vec<_> = first_b.collect();
        assert_eq!(got, vec![(1, 6, 0), (2, GPU_NAME_MAX as u16, 1)]);
        // Sequence numbers count up from 0; the drop is in the last header; the clock pair is in each.
        for (i, c) in sink.0.iter().enumerate() {
            assert_eq!(u64_at(c, 40), i as u64);
            assert_eq!((u64_at(c, 24), u64_at(c, 32)), (10, 20));
        }
        assert_eq!(u64_at(sink.0.last().unwrap(), 16), 3);
        // A new session forgets the names: sent again.
        names.clear();
        let mut sink2 = Collect::default();
        p.add(convert(&kernel9(&a), 28).unwrap(), &mut names, &mut sink2);
        p.flush(&mut sink2);
        assert_eq!(walk(&sink2.0[0])[0].0, GpuRecordKind::Name as u16);
        // Nothing to say: no chunk.
        p.flush(&mut sink2);
        assert_eq!(sink2.0.len(), 1);
    }
}
