//! CUPTI activity records → the records of `llmprof_abi::cupti`, packed into chunks.
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
//!
//! The chunks themselves are built by `pack` ([`Packer`]).

use std::collections::HashMap;

use llmprof_abi::cupti::{
    GpuActivity, GpuActivityKind, GpuApiCall, GpuRecordHeader, GpuRecordKind, NO_GRAPH,
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

mod pack;

pub use pack::Packer;

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
mod tests;
