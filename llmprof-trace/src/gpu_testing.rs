//! Builders of GPU activity chunks (the `llmprof_abi::gpu` layouts, byte for byte) for tests: what the injected
//! helper hands over, so the reader ([`crate::gpu`]), the sink and the report are tested from real layouts.

use llmprof_abi::gpu::{
    GPU_ABI_VERSION, GPU_CHUNK_MAGIC, GpuActivity, GpuActivityKind, GpuApiCall, GpuChunkHeader, GpuName,
    GpuRecordHeader, GpuRecordKind, NO_GRAPH,
};

/// The bytes of a `#[repr(C)]` layout of `llmprof_abi::gpu` (integers only, no implicit padding).
fn bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: `v` is a live value of a plain-data layout without implicit padding (size asserted in the ABI);
    // the slice covers exactly its bytes and lives as long as the borrow.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// A chunk being built: records appended in order, then [`Chunk::build`].
#[derive(Clone, Debug)]
pub struct Chunk {
    /// The header (`len` and `records` are set by [`Chunk::build`]).
    pub hdr: GpuChunkHeader,
    body: Vec<u8>,
    records: u32,
}

/// A kernel record on `stream` of device 0, times on the CUPTI clock.
pub fn kernel(stream: u32, correlation: u32, name_id: u32, start_ns: u64, end_ns: u64) -> GpuActivity {
    GpuActivity {
        hdr: GpuRecordHeader {
            kind: GpuRecordKind::Activity as u16,
            flags: 0,
            size: std::mem::size_of::<GpuActivity>() as u32,
        },
        kind: GpuActivityKind::Kernel as u32,
        device: 0,
        context: 1,
        stream,
        correlation,
        name_id,
        start_ns,
        end_ns,
        graph_id: NO_GRAPH,
        detail: 0,
        graph_node: 0,
        bytes: 0,
        grid: [1, 1, 1],
        block: [1, 1, 1],
        registers: 0,
        shared_static: 0,
        shared_dynamic: 0,
        pad: 0,
    }
}

/// An API call record of thread `tid` of `pid`, times on the CUPTI clock.
pub fn api_call(pid: u32, tid: u32, correlation: u32, cbid: u32, start_ns: u64, end_ns: u64) -> GpuApiCall {
    GpuApiCall {
        hdr: GpuRecordHeader {
            kind: GpuRecordKind::ApiCall as u16,
            flags: 0,
            size: std::mem::size_of::<GpuApiCall>() as u32,
        },
        correlation,
        cbid,
        pid,
        tid,
        start_ns,
        end_ns,
        runtime: 0,
        pad: 0,
    }
}

impl Chunk {
    /// An empty chunk with sequence number `seq` and the clock pair (`cupti_ns`, `boottime_ns`).
    pub fn new(seq: u64, cupti_ns: u64, boottime_ns: u64) -> Self {
        Self {
            hdr: GpuChunkHeader {
                magic: GPU_CHUNK_MAGIC,
                version: GPU_ABI_VERSION,
                len: 0,
                records: 0,
                dropped: 0,
                cupti_ns,
                boottime_ns,
                seq,
            },
            body: Vec::new(),
            records: 0,
        }
    }

    /// Appends raw bytes as they are (hostile input).
    pub fn raw(mut self, b: &[u8]) -> Self {
        self.body.extend_from_slice(b);
        self
    }

    /// Appends an activity record.
    pub fn activity(mut self, a: GpuActivity) -> Self {
        self.records += 1;
        self.raw(bytes(&a))
    }

    /// Appends an API call record.
    pub fn api(mut self, c: GpuApiCall) -> Self {
        self.records += 1;
        self.raw(bytes(&c))
    }

    /// Appends a name record (`name` padded to 8 bytes; `len` says how many bytes are the name).
    pub fn name(mut self, id: u32, name: &str) -> Self {
        let padded = name.len().div_ceil(8) * 8;
        let n = GpuName {
            hdr: GpuRecordHeader {
                kind: GpuRecordKind::Name as u16,
                flags: 0,
                size: (std::mem::size_of::<GpuName>() + padded) as u32,
            },
            name_id: id,
            len: u16::try_from(name.len()).unwrap_or(u16::MAX),
            truncated: 0,
        };
        self.records += 1;
        let mut s = self.raw(bytes(&n)).raw(name.as_bytes());
        s.body.resize(s.body.len() + padded - name.len(), 0);
        s
    }

    /// The chunk's bytes (header `len` and `records` filled in).
    pub fn build(&self) -> Vec<u8> {
        let mut h = self.hdr;
        h.len = (std::mem::size_of::<GpuChunkHeader>() + self.body.len()) as u32;
        h.records = self.records;
        let mut out = bytes(&h).to_vec();
        out.extend_from_slice(&self.body);
        out
    }
}
