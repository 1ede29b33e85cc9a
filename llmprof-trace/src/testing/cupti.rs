//! Builders of GPU activity chunks (the `llmprof_abi::cupti` layouts, byte for byte) for tests: what the injected
//! helper hands over, so the reader ([`crate::event::cupti`]), the sink and the report are tested from real layouts.

use llmprof_abi::cupti::{
    GPU_ABI_VERSION, GPU_CHUNK_MAGIC, GpuActivity, GpuActivityKind, GpuApiCall, GpuBusy, GpuChunkHeader,
    GpuName, GpuRecordHeader, GpuRecordKind, GpuSummary, NO_GRAPH,
};

const MS: u64 = 1_000_000;

/// The bytes of a `#[repr(C)]` layout of `llmprof_abi::cupti` (integers only, no implicit padding).
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
        hdr: GpuRecordHeader::new(GpuRecordKind::Activity, core::mem::size_of::<GpuActivity>()),
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
        hdr: GpuRecordHeader::new(GpuRecordKind::ApiCall, core::mem::size_of::<GpuApiCall>()),
        correlation,
        cbid,
        pid,
        tid,
        start_ns,
        end_ns,
        runtime: 0,
        name_id: 0,
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

    /// Appends a summary row.
    pub fn summary(mut self, r: GpuSummary) -> Self {
        self.records += 1;
        self.raw(bytes(&r))
    }

    /// Appends a busy interval.
    pub fn busy(mut self, b: GpuBusy) -> Self {
        self.records += 1;
        self.raw(bytes(&b))
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
            hdr: GpuRecordHeader::new(GpuRecordKind::Name, std::mem::size_of::<GpuName>() + padded),
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

/// A traced engine with two steps and the GPU work they launched, decoded from one chunk (CUPTI clock =
/// BOOTTIME − 1 s): the events of a trace, in time order, and what the decoder counted. Times from `t0`, ms:
/// - step 1 (decode) host 0–10, step 2 (decode) host 10–20 (thread `tid`);
/// - API calls (cbid 307, thread `tid`) at 1, 3, 11, 12 launching, on stream 7: `gemm<128>` 2–4 (grid 64,2,1),
///   `softmax` 5–6, `gemm<128>` 12–14, `softmax` 14–15; a 4096-byte HtoD copy 16–16.5 (no API call);
/// - the chunk handed over at 30.
///
/// So step 1 has 3 ms of GPU busy time over a 4 ms span (1 ms idle between kernels), step 2 3 ms busy, none
/// idle; `gemm<128>` is 4 ms of 6 ms kernel time (2 launches).
pub fn engine_fixture(
    pid: u32,
    tid: u32,
    t0: u64,
) -> (Vec<crate::event::Event>, crate::event::cupti::GpuStats) {
    let cupti = |ms_x10: u64| t0 - 1_000 * MS + ms_x10 * MS / 10;
    let gemm = |corr, s, e| {
        let mut k = kernel(7, corr, 1, cupti(s), cupti(e));
        k.grid = [64, 2, 1];
        k.block = [128, 1, 1];
        k.registers = 40;
        k
    };
    let (g1, g2) = (gemm(1, 20, 40), gemm(3, 120, 140));
    let mut copy = kernel(7, 0, 0, cupti(160), cupti(165));
    copy.kind = GpuActivityKind::Memcpy as u32;
    copy.detail = 1;
    copy.bytes = 4096;
    let chunk = Chunk::new(0, cupti(0), t0)
        .name(1, "_Z4gemmILi128EEvPKfPfi")
        .name(2, "_Z7softmaxPf")
        .api(api_call(pid, tid, 1, 307, cupti(10), cupti(12)))
        .api(api_call(pid, tid, 2, 307, cupti(30), cupti(32)))
        .api(api_call(pid, tid, 3, 307, cupti(110), cupti(112)))
        .api(api_call(pid, tid, 4, 307, cupti(120), cupti(122)))
        .activity(g1)
        .activity(kernel(7, 2, 2, cupti(50), cupti(60)))
        .activity(g2)
        .activity(kernel(7, 4, 2, cupti(140), cupti(150)))
        .activity(copy);
    two_steps_and(pid, tid, t0, &chunk)
}

/// A summary row of `window` (times on the CUPTI clock).
#[allow(clippy::too_many_arguments, reason = "a record's fields")]
pub fn summary_row(
    window: u32,
    kind: GpuActivityKind,
    name_id: u32,
    detail: u32,
    count: u64,
    (total_ns, min_ns, max_ns): (u64, u64, u64),
    (first_ns, last_ns): (u64, u64),
    bytes: u64,
) -> GpuSummary {
    GpuSummary {
        hdr: GpuRecordHeader::new(GpuRecordKind::Summary, core::mem::size_of::<GpuSummary>()),
        window,
        kind: kind as u32,
        device: 0,
        name_id,
        detail,
        pad: 0,
        count,
        total_ns,
        min_ns,
        max_ns,
        first_ns,
        last_ns,
        bytes,
    }
}

/// A busy interval of device 0 (times on the CUPTI clock): (start, end, busy), kernels, (top name, count, ns).
pub fn busy_interval(
    (start_ns, end_ns, busy_ns): (u64, u64, u64),
    kernels: u32,
    (top_name_id, top_count, top_ns): (u32, u32, u64),
) -> GpuBusy {
    GpuBusy {
        hdr: GpuRecordHeader::new(GpuRecordKind::Busy, core::mem::size_of::<GpuBusy>()),
        device: 0,
        kernels,
        start_ns,
        end_ns,
        busy_ns,
        top_name_id,
        top_count,
        top_ns,
    }
}

/// The default mode's view of an engine with two steps (CUPTI clock = BOOTTIME − 1 s), one chunk handed over
/// at 30 ms. Times from `t0`, ms:
/// - step 1 (decode) host 0–10, step 2 (decode) host 10–20 (thread `tid`);
/// - step 1's eager kernels, summed: `gemm<128>` 2–4, `softmax` 5–6 → a busy interval 2–6, 3 ms busy (1 ms
///   idle), 2 kernels, top `gemm<128>` (1 launch, 2 ms);
/// - step 2 replays CUDA graph 5 on stream 7, 12–15 (one graph record, correlation 9) → a busy interval 12–15,
///   3 ms busy, 1 kernel, no top name;
/// - window 0's rows: `gemm<128>` 1 × 2 ms, `softmax` 1 × 1 ms, a 4096-byte HtoD copy 0.5 ms, an event
///   synchronize wait of 1 ms.
///
/// So: 3 kernels (the graph counts one) with 6 ms GPU time, the graph first; step 1 3 ms busy and 1 ms idle,
/// step 2 3 ms busy.
pub fn summary_fixture(
    pid: u32,
    tid: u32,
    t0: u64,
) -> (Vec<crate::event::Event>, crate::event::cupti::GpuStats) {
    let cupti = |ms_x10: u64| t0 - 1_000 * MS + ms_x10 * MS / 10;
    let mut graph = kernel(7, 9, 0, cupti(120), cupti(150));
    graph.kind = GpuActivityKind::Graph as u32;
    graph.graph_id = 5;
    let chunk = Chunk::new(0, cupti(0), t0)
        .name(1, "_Z4gemmILi128EEvPKfPfi")
        .name(2, "_Z7softmaxPf")
        .activity(graph)
        .busy(busy_interval((cupti(20), cupti(60), 3 * MS), 2, (1, 1, 2 * MS)))
        .busy(busy_interval((cupti(120), cupti(150), 3 * MS), 1, (0, 1, 3 * MS)))
        .summary(summary_row(
            0,
            GpuActivityKind::Kernel,
            1,
            0,
            1,
            (2 * MS, 2 * MS, 2 * MS),
            (cupti(20), cupti(40)),
            0,
        ))
        .summary(summary_row(
            0,
            GpuActivityKind::Kernel,
            2,
            0,
            1,
            (MS, MS, MS),
            (cupti(50), cupti(60)),
            0,
        ))
        .summary(summary_row(
            0,
            GpuActivityKind::Memcpy,
            0,
            1,
            1,
            (MS / 2, MS / 2, MS / 2),
            (cupti(160), cupti(165)),
            4096,
        ))
        .summary(summary_row(
            0,
            GpuActivityKind::Sync,
            0,
            1,
            1,
            (MS, MS, MS),
            (cupti(150), cupti(160)),
            0,
        ));
    two_steps_and(pid, tid, t0, &chunk)
}

/// Two decode steps of thread `tid` (host 0–10 and 10–20 ms from `t0`), then `chunk` handed over at 30 ms:
/// the events and what the decoder counted.
fn two_steps_and(
    pid: u32,
    tid: u32,
    t0: u64,
    chunk: &Chunk,
) -> (Vec<crate::event::Event>, crate::event::cupti::GpuStats) {
    let mut events = vec![
        crate::testing::step(pid, tid, llmprof_abi::StepKind::Decode, 1, t0, t0 + 10 * MS, &[1]).build(),
        crate::testing::step(
            pid,
            tid,
            llmprof_abi::StepKind::Decode,
            2,
            t0 + 10 * MS,
            t0 + 20 * MS,
            &[1],
        )
        .build(),
    ];
    let mut d = crate::decode::cupti::GpuDecoder::default();
    d.chunk(pid, tid, t0 + 30 * MS, &chunk.build(), &mut events);
    (events, d.stats().clone())
}
