//! The `engine` family: what an instrumented engine (`llmserve`, or any engine exporting the same probes)
//! tells llmprof, and the records the eBPF uprobes make of it.
//!
//! The engine calls exported probe functions ([`PROBE_STEP`], [`PROBE_REQUEST`], [`PROBE_RANGE`], and
//! [`PROBE_CONTENT`] under `--capture-content`) with a pointer to a `#[repr(C)]` record ([`StepRecord`],
//! [`RequestRecord`], [`RangeRecord`], [`ContentRecord`]); a uprobe at the function's leading 5-byte NOP
//! ([`crate::PROBE_NOP5`]) copies the record with `bpf_probe_read_user` behind an [`EventHeader`]. These records
//! are the engine ABI: each starts with [`ABI_VERSION`], and any change of their layout bumps it.

use crate::{fill_str, EventHeader, Family, ABI_VERSION};

/// Uprobe at [`PROBE_STEP`]: copies the [`StepRecord`] into a [`StepEvent`].
pub const STEP_PROGRAM: &str = "llmprof_step";
/// Uprobe at [`PROBE_REQUEST`]: copies the [`RequestRecord`] into a [`RequestEvent`].
pub const REQUEST_PROGRAM: &str = "llmprof_request";
/// Uprobe at [`PROBE_RANGE`]: copies the [`RangeRecord`] into a [`RangeEvent`] (`Knob::RangeSampleEvery`).
pub const RANGE_PROGRAM: &str = "llmprof_range";
/// Uprobe at [`PROBE_CONTENT`] (only with `--capture-content`): the [`ContentRecord`] and its text.
pub const CONTENT_PROGRAM: &str = "llmprof_content";
/// The record uprobes, in [`ENGINE_PROBES`] order.
pub const RECORD_PROGRAMS: [&str; 3] = [STEP_PROGRAM, REQUEST_PROGRAM, RANGE_PROGRAM];
/// Every program of the family.
pub const PROGRAMS: [&str; 4] = [STEP_PROGRAM, REQUEST_PROGRAM, RANGE_PROGRAM, CONTENT_PROGRAM];
/// The family's own maps: none (its records go to the shared ring).
pub const MAPS: [&str; 0] = [];
/// The family's kernel names.
pub const FAMILY: Family = Family {
    name: "engine",
    programs: &PROGRAMS,
    maps: &MAPS,
};

/// Probe called once per engine step with `*const StepRecord`.
pub const PROBE_STEP: &str = "llmprof_probe_step";
/// Probe called once per request lifecycle event with `*const RequestRecord`.
pub const PROBE_REQUEST: &str = "llmprof_probe_request";
/// Probe called for NVTX-style push/pop/mark with `*const RangeRecord`.
pub const PROBE_RANGE: &str = "llmprof_probe_range";
/// All probe symbols, in [`crate::ProbeId`] order of the engine probes.
pub const ENGINE_PROBES: [&str; 3] = [PROBE_STEP, PROBE_REQUEST, PROBE_RANGE];
/// Engine probe: prompt or completion text of a request (`*const ContentRecord`). Attached only with
/// `--capture-content`; the engine renders the text only while it is attached (`llmprof_probes::content_attached`).
pub const PROBE_CONTENT: &str = "llmprof_probe_content";

/// Most request ids one [`StepRecord`] carries; larger batches set [`StepRecord::req_ids_truncated`].
pub const MAX_STEP_REQS: usize = 64;
/// Bytes of `x-request-id` kept (NUL padded, truncated).
pub const REQUEST_ID_LEN: usize = 48;
/// Bytes of a range domain name (NUL padded).
pub const RANGE_DOMAIN_LEN: usize = 16;
/// Bytes of a range name (NUL padded).
pub const RANGE_NAME_LEN: usize = 48;
/// Bytes of the model name in a request record.
pub const MODEL_LEN: usize = 48;

/// What kind of work an engine step did.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Only prompt (prefill) tokens.
    Prefill = 0,
    /// Only decode tokens (one per running sequence).
    Decode = 1,
    /// Prefill chunks and decode tokens in one batch.
    Mixed = 2,
}

impl StepKind {
    /// Decodes the raw value of [`StepRecord::kind`].
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Prefill),
            1 => Some(Self::Decode),
            2 => Some(Self::Mixed),
            _ => None,
        }
    }
    /// Lower-case name used as slice name in traces.
    pub fn name(self) -> &'static str {
        match self {
            Self::Prefill => "prefill",
            Self::Decode => "decode",
            Self::Mixed => "mixed",
        }
    }
}

/// Where a step's device interval comes from.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceClock {
    /// CPU backend: the device interval is the host compute interval.
    HostCompute = 0,
    /// CUDA backend: CUDA events mapped onto BOOTTIME through a reference event.
    CudaEvents = 1,
}

/// One engine step (a forward pass over a batch). Passed to [`PROBE_STEP`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StepRecord {
    /// [`ABI_VERSION`] of the engine that wrote this record.
    pub abi_version: u32,
    /// [`StepKind`] as u32.
    pub kind: u32,
    /// Monotonic step counter of the engine (starts at 1).
    pub step_id: u64,
    /// Host start of the step (schedule decided), BOOTTIME ns.
    pub host_start_ns: u64,
    /// Host end of the step (tokens sampled), BOOTTIME ns.
    pub host_end_ns: u64,
    /// Device start, BOOTTIME ns (see [`StepRecord::device_clock`]).
    pub device_start_ns: u64,
    /// Device end, BOOTTIME ns.
    pub device_end_ns: u64,
    /// [`DeviceClock`] as u32.
    pub device_clock: u32,
    /// Sequences in the batch.
    pub num_seqs: u32,
    /// Prompt tokens computed in this step.
    pub prefill_tokens: u32,
    /// Decode tokens computed in this step.
    pub decode_tokens: u32,
    /// KV-cache blocks in use after scheduling.
    pub kv_blocks_used: u32,
    /// KV-cache blocks in the pool.
    pub kv_blocks_total: u32,
    /// Requests waiting after scheduling.
    pub num_waiting: u32,
    /// Sequences preempted while scheduling this step.
    pub num_preempted: u32,
    /// Number of valid entries in `req_ids`.
    pub num_req_ids: u32,
    /// 1 when the batch had more than [`MAX_STEP_REQS`] requests.
    pub req_ids_truncated: u32,
    /// Engine request ids served by this step.
    pub req_ids: [u64; MAX_STEP_REQS],
    /// Tokens computed for `req_ids[i]` in this step (its prompt or recompute chunk, or 1 for a decode); added in
    /// ABI version 2 so a request's share of a batched prefill is known.
    pub req_tokens: [u32; MAX_STEP_REQS],
    /// The batch size of the CUDA graph the step replayed (its sequences padded up to it); 0: the step's kernels
    /// were launched one by one (or it ran on the CPU). Added in ABI version 3.
    pub graph_batch: u32,
    /// Zero; keeps the record a multiple of 8 bytes.
    pub reserved: u32,
}

impl StepRecord {
    /// A record of this ABI version for step `step_id` serving `req_ids` (at most [`MAX_STEP_REQS`] kept, the rest
    /// flagged as truncated; `num_seqs` is the full count). Every other field is zero: set what the step knows.
    pub fn new(kind: StepKind, step_id: u64, req_ids: &[u64]) -> Self {
        let n = req_ids.len().min(MAX_STEP_REQS);
        let mut ids = [0u64; MAX_STEP_REQS];
        ids[..n].copy_from_slice(&req_ids[..n]);
        Self {
            abi_version: ABI_VERSION,
            kind: kind as u32,
            step_id,
            host_start_ns: 0,
            host_end_ns: 0,
            device_start_ns: 0,
            device_end_ns: 0,
            device_clock: DeviceClock::HostCompute as u32,
            num_seqs: req_ids.len() as u32,
            prefill_tokens: 0,
            decode_tokens: 0,
            kv_blocks_used: 0,
            kv_blocks_total: 0,
            num_waiting: 0,
            num_preempted: 0,
            num_req_ids: n as u32,
            req_ids_truncated: u32::from(req_ids.len() > MAX_STEP_REQS),
            req_ids: ids,
            req_tokens: [0; MAX_STEP_REQS],
            graph_batch: 0,
            reserved: 0,
        }
    }

    /// Sets the tokens each request of [`StepRecord::req_ids`] computed in this step, in the same order
    /// (entries past [`MAX_STEP_REQS`] are dropped like their ids).
    pub fn with_req_tokens(mut self, tokens: impl IntoIterator<Item = u32>) -> Self {
        for (slot, t) in self.req_tokens.iter_mut().zip(tokens) {
            *slot = t;
        }
        self
    }

    /// Tokens request `req` computed in this step, when it is among the recorded ids.
    pub fn tokens_of(&self, req: u64) -> Option<u32> {
        let n = (self.num_req_ids as usize).min(MAX_STEP_REQS);
        self.req_ids[..n]
            .iter()
            .position(|&r| r == req)
            .map(|i| self.req_tokens[i])
    }
}

/// A request lifecycle transition.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestEventKind {
    /// Accepted by the HTTP layer and queued (carries trace context, prompt size, sampling parameters).
    Arrived = 0,
    /// First scheduled into a batch (queue time ends).
    Scheduled = 1,
    /// First output token sampled (TTFT).
    FirstToken = 2,
    /// Preempted (blocks freed; will be recomputed).
    Preempted = 3,
    /// Finished; see [`RequestRecord::finish_reason`].
    Finished = 4,
}

impl RequestEventKind {
    /// Decodes the raw value of [`RequestRecord::kind`].
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Arrived),
            1 => Some(Self::Scheduled),
            2 => Some(Self::FirstToken),
            3 => Some(Self::Preempted),
            4 => Some(Self::Finished),
            _ => None,
        }
    }
}

/// Why a request finished.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// Not finished (other event kinds).
    None = 0,
    /// EOS token or a stop string.
    Stop = 1,
    /// `max_tokens` or the context length reached.
    Length = 2,
    /// Client went away.
    Abort = 3,
    /// Engine-side error.
    Error = 4,
}

impl FinishReason {
    /// Decodes the raw value of [`RequestRecord::finish_reason`].
    pub fn from_raw(v: u32) -> Self {
        match v {
            1 => Self::Stop,
            2 => Self::Length,
            3 => Self::Abort,
            4 => Self::Error,
            _ => Self::None,
        }
    }
    /// The OpenAI / vLLM spelling (`stop`, `length`, `abort`, `error`).
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "",
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
            Self::Error => "error",
        }
    }
}

/// One request lifecycle event. Passed to [`PROBE_REQUEST`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RequestRecord {
    /// [`ABI_VERSION`] of the engine that wrote this record.
    pub abi_version: u32,
    /// [`RequestEventKind`] as u32.
    pub kind: u32,
    /// Engine request id (unique per engine process).
    pub req_id: u64,
    /// When the transition happened, BOOTTIME ns.
    pub ts_ns: u64,
    /// W3C trace id from `traceparent` (all zero when absent).
    pub trace_id: [u8; 16],
    /// W3C parent span id from `traceparent`.
    pub parent_span_id: [u8; 8],
    /// 1 when `trace_id`/`parent_span_id` are valid.
    pub has_trace_context: u8,
    /// W3C trace flags.
    pub trace_flags: u8,
    /// 1 for `/v1/chat/completions`, 0 for `/v1/completions`.
    pub is_chat: u8,
    /// Reserved, zero.
    pub _pad: u8,
    /// [`FinishReason`] as u32 (Finished only).
    pub finish_reason: u32,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens generated so far.
    pub output_tokens: u32,
    /// `max_tokens` requested.
    pub max_tokens: u32,
    /// Sampling temperature.
    pub temperature: f32,
    /// Nucleus sampling `top_p`.
    pub top_p: f32,
    /// Times preempted so far.
    pub num_preemptions: u32,
    /// `x-request-id` header, NUL padded.
    pub x_request_id: [u8; REQUEST_ID_LEN],
    /// Served model name, NUL padded.
    pub model: [u8; MODEL_LEN],
}

impl RequestRecord {
    /// A record of this ABI version for a `kind` transition of request `req_id` at `ts_ns`. Every other field is
    /// zero (no trace context, no tokens, empty strings): set what the transition carries.
    pub fn new(kind: RequestEventKind, req_id: u64, ts_ns: u64) -> Self {
        Self {
            abi_version: ABI_VERSION,
            kind: kind as u32,
            req_id,
            ts_ns,
            trace_id: [0; 16],
            parent_span_id: [0; 8],
            has_trace_context: 0,
            trace_flags: 0,
            is_chat: 0,
            _pad: 0,
            finish_reason: FinishReason::None as u32,
            prompt_tokens: 0,
            output_tokens: 0,
            max_tokens: 0,
            temperature: 0.0,
            top_p: 0.0,
            num_preemptions: 0,
            x_request_id: [0; REQUEST_ID_LEN],
            model: [0; MODEL_LEN],
        }
    }
}

/// NVTX-style range operation.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeOp {
    /// Open a range on the calling thread.
    Push = 0,
    /// Close the innermost open range on the calling thread.
    Pop = 1,
    /// An instant marker.
    Mark = 2,
}

impl RangeOp {
    /// Decodes the raw value of [`RangeRecord::op`].
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Push),
            1 => Some(Self::Pop),
            2 => Some(Self::Mark),
            _ => None,
        }
    }
}

/// An NVTX-style named range event on the calling thread. Passed to [`PROBE_RANGE`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RangeRecord {
    /// [`ABI_VERSION`] of the engine that wrote this record.
    pub abi_version: u32,
    /// [`RangeOp`] as u32.
    pub op: u32,
    /// BOOTTIME ns.
    pub ts_ns: u64,
    /// Engine step this range belongs to (0 if none).
    pub step_id: u64,
    /// Domain (e.g. `llmserve`), NUL padded.
    pub domain: [u8; RANGE_DOMAIN_LEN],
    /// Range name (e.g. `forward`), NUL padded.
    pub name: [u8; RANGE_NAME_LEN],
}

impl RangeRecord {
    /// A record of this ABI version: `op` on range `domain::name` at `ts_ns`, within step `step_id` (0: none).
    pub fn new(op: RangeOp, ts_ns: u64, step_id: u64, domain: &str, name: &str) -> Self {
        Self {
            abi_version: ABI_VERSION,
            op: op as u32,
            ts_ns,
            step_id,
            domain: fill_str(domain),
            name: fill_str(name),
        }
    }
}

/// Bytes of text one [`ContentEvent`] carries; longer texts are cut (and flagged).
pub const CONTENT_MAX: usize = 4096;

/// Which text a [`ContentRecord`] points to.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentKind {
    /// The prompt as the model saw it (the rendered chat template for chat requests).
    Prompt = 0,
    /// The completion text returned to the client.
    Completion = 1,
}

impl ContentKind {
    /// From the raw value of [`ContentRecord::kind`].
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Prompt),
            1 => Some(Self::Completion),
            _ => None,
        }
    }
}

/// A request's text, passed by pointer to [`PROBE_CONTENT`]; the eBPF program copies up to [`CONTENT_MAX`] bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ContentRecord {
    /// [`ABI_VERSION`].
    pub abi_version: u32,
    /// [`ContentKind`] as u32.
    pub kind: u32,
    /// Engine request id.
    pub req_id: u64,
    /// UTF-8 text in the engine's memory (valid for the duration of the call).
    pub ptr: u64,
    /// Its length in bytes.
    pub len: u64,
}

impl ContentRecord {
    /// A record pointing at `text` (which must outlive the probe call).
    pub fn new(kind: ContentKind, req_id: u64, text: &str) -> Self {
        Self {
            abi_version: ABI_VERSION,
            kind: kind as u32,
            req_id,
            ptr: text.as_ptr() as u64,
            len: text.len() as u64,
        }
    }
}

/// Engine step probe hit.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StepEvent {
    /// Header ([`crate::EventKind::Step`]).
    pub hdr: EventHeader,
    /// The engine's record, copied verbatim.
    pub rec: StepRecord,
}

/// Engine request probe hit.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RequestEvent {
    /// Header ([`crate::EventKind::Request`]).
    pub hdr: EventHeader,
    /// The engine's record, copied verbatim.
    pub rec: RequestRecord,
}

/// Engine range probe hit.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RangeEvent {
    /// Header ([`crate::EventKind::Range`]).
    pub hdr: EventHeader,
    /// The engine's record, copied verbatim.
    pub rec: RangeRecord,
}

/// A request's text (only written when `--capture-content` attached the content uprobe).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ContentEvent {
    /// Header ([`crate::EventKind::Content`]).
    pub hdr: EventHeader,
    /// The engine's record (its `ptr` is the engine's address, meaningless here).
    pub rec: ContentRecord,
    /// Bytes of `data` copied: `min(rec.len, CONTENT_MAX)`.
    pub copied: u32,
    /// Padding.
    pub _pad: u32,
    /// The first `copied` bytes of the text (a cut may split a UTF-8 character).
    pub data: [u8; CONTENT_MAX],
}

const _: () = {
    assert!(core::mem::size_of::<StepRecord>() == 96 + 12 * MAX_STEP_REQS);
    assert!(core::mem::size_of::<RequestRecord>() == 80 + REQUEST_ID_LEN + MODEL_LEN);
    assert!(core::mem::size_of::<RangeRecord>() == 24 + RANGE_DOMAIN_LEN + RANGE_NAME_LEN);
    assert!(core::mem::size_of::<ContentRecord>() == 32);
    assert!(core::mem::size_of::<ContentEvent>() == 64 + CONTENT_MAX);
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_str;

    #[test]
    fn step_record_keeps_at_most_max_ids_and_flags_the_rest() {
        let ids: [u64; MAX_STEP_REQS + 3] = core::array::from_fn(|i| i as u64 + 1);
        let r = StepRecord::new(StepKind::Decode, 9, &ids);
        assert_eq!(
            (r.num_seqs, r.num_req_ids, r.req_ids_truncated),
            (MAX_STEP_REQS as u32 + 3, MAX_STEP_REQS as u32, 1)
        );
        assert_eq!(r.req_ids[MAX_STEP_REQS - 1], MAX_STEP_REQS as u64);
        let r = StepRecord::new(StepKind::Prefill, 1, &[7]);
        assert_eq!(
            (r.num_req_ids, r.req_ids_truncated, r.req_ids[0], r.abi_version),
            (1, 0, 7, ABI_VERSION)
        );
        let r = StepRecord::new(StepKind::Mixed, 2, &[7, 8, 9]).with_req_tokens([128, 1, 64, 5]);
        assert_eq!(
            (r.tokens_of(7), r.tokens_of(8), r.tokens_of(9), r.tokens_of(10)),
            (Some(128), Some(1), Some(64), None)
        );
        assert_eq!(
            r.req_tokens[3], 5,
            "extra entries land past num_req_ids, never read"
        );
        let q = RequestRecord::new(RequestEventKind::Finished, 3, 42);
        assert_eq!((q.kind, q.req_id, q.ts_ns, q.has_trace_context), (4, 3, 42, 0));
        let g = RangeRecord::new(RangeOp::Push, 5, 1, "llmserve", "forward");
        assert_eq!((read_str(&g.domain), read_str(&g.name)), ("llmserve", "forward"));
    }

    #[test]
    fn kinds_decode() {
        assert_eq!(StepKind::from_raw(2), Some(StepKind::Mixed));
        assert_eq!(FinishReason::from_raw(2).name(), "length");
        assert_eq!(StepKind::from_raw(9), None);
    }
}
