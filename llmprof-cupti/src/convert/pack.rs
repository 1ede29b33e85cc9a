//! Packing converted records into chunks: the chunk header, the records as their raw bytes ([`Plain`]), a
//! kernel or API function's name record before the first activity that names it, and the loss count when
//! a chunk cannot be handed over.

use std::ffi::{CStr, c_char};

use llmprof_abi::cupti::{
    GPU_ABI_VERSION, GPU_CHUNK_MAGIC, GPU_CHUNK_MAX, GPU_NAME_MAX, GpuActivity, GpuApiCall, GpuBusy,
    GpuChunkHeader, GpuName, GpuRecordHeader, GpuRecordKind, GpuSummary,
};

use super::{Converted, Names, Sink, api_display_name};

/// Types written into chunks as raw bytes.
///
/// # Safety
/// Implementors are `repr(C)` and have no padding bytes (their sizes are asserted in `llmprof_abi::cupti`).
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

pub(super) const HDR: usize = core::mem::size_of::<GpuChunkHeader>();

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
