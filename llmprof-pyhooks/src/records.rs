//! The engine-probe records the Python hooks write, built from what they pass through `ctypes`: plain
//! `#[repr(C)]` structures of scalars ([`StepArgs`], [`RequestArgs`], mirrored by `ctypes.Structure`s in
//! `hooks.py`) and byte strings. Pure: no probe is called here.

use llmprof_abi::{
    FinishReason, MAX_STEP_REQS, MODEL_LEN, RANGE_DOMAIN_LEN, RANGE_NAME_LEN, REQUEST_ID_LEN, RangeOp,
    RangeRecord, RequestEventKind, RequestRecord, StepKind, StepRecord,
};

/// One engine step, as the hooks saw it (mirrored by `_StepArgs` in `hooks.py`; all fields 8 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StepArgs {
    /// The engine's step counter (from 1).
    pub step_id: u64,
    /// `llmprof_abi::StepKind` as an integer.
    pub kind: u64,
    /// When scheduling began, BOOTTIME ns.
    pub host_start_ns: u64,
    /// When the step's outputs were processed, BOOTTIME ns.
    pub host_end_ns: u64,
    /// Sequences in the batch.
    pub num_seqs: u64,
    /// Prompt tokens computed.
    pub prefill_tokens: u64,
    /// Decode tokens computed.
    pub decode_tokens: u64,
    /// KV-cache blocks in use / in the pool.
    pub kv_blocks_used: u64,
    /// See [`StepArgs::kv_blocks_used`].
    pub kv_blocks_total: u64,
    /// Requests waiting after scheduling.
    pub num_waiting: u64,
    /// Requests preempted while scheduling.
    pub num_preempted: u64,
}

/// One request transition (mirrored by `_RequestArgs` in `hooks.py`; all fields 8 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestArgs {
    /// `llmprof_abi::RequestEventKind` as an integer.
    pub kind: u64,
    /// The hooks' number for the engine's request id (unique per process).
    pub req_id: u64,
    /// When, BOOTTIME ns.
    pub ts_ns: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Output tokens so far.
    pub output_tokens: u64,
    /// `max_tokens` asked.
    pub max_tokens: u64,
    /// Sampling temperature and `top_p`, as `f64`.
    pub temperature: f64,
    /// See [`RequestArgs::temperature`].
    pub top_p: f64,
    /// Times preempted so far.
    pub num_preemptions: u64,
    /// `llmprof_abi::FinishReason` as an integer (Finished only).
    pub finish_reason: u64,
}

/// The step record of `s`: its requests are `ids` with `tokens` each (at most `MAX_STEP_REQS` kept, the rest
/// flagged as truncated). An unknown kind becomes `Mixed`.
pub fn step(s: &StepArgs, ids: &[u64], tokens: &[u32]) -> StepRecord {
    let kind = u32::try_from(s.kind)
        .ok()
        .and_then(StepKind::from_raw)
        .unwrap_or(StepKind::Mixed);
    let mut rec = StepRecord::new(kind, s.step_id, ids);
    let n = ids.len().min(tokens.len()).min(MAX_STEP_REQS);
    rec.req_tokens[..n].copy_from_slice(&tokens[..n]);
    let c = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    rec.host_start_ns = s.host_start_ns;
    rec.host_end_ns = s.host_end_ns;
    rec.num_seqs = c(s.num_seqs);
    rec.prefill_tokens = c(s.prefill_tokens);
    rec.decode_tokens = c(s.decode_tokens);
    rec.kv_blocks_used = c(s.kv_blocks_used);
    rec.kv_blocks_total = c(s.kv_blocks_total);
    rec.num_waiting = c(s.num_waiting);
    rec.num_preempted = c(s.num_preempted);
    rec
}

/// The request record of `r` with `x-request-id` `xid` and model name `model` (each cut to its field, on a
/// UTF-8 boundary). `None` for an unknown kind.
pub fn request(r: &RequestArgs, xid: &[u8], model: &[u8]) -> RequestRecord {
    let kind = u32::try_from(r.kind)
        .ok()
        .and_then(RequestEventKind::from_raw)
        .unwrap_or(RequestEventKind::Arrived);
    let mut rec = RequestRecord::new(kind, r.req_id, r.ts_ns);
    let c = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    rec.prompt_tokens = c(r.prompt_tokens);
    rec.output_tokens = c(r.output_tokens);
    rec.max_tokens = c(r.max_tokens);
    rec.temperature = r.temperature as f32;
    rec.top_p = r.top_p as f32;
    rec.num_preemptions = c(r.num_preemptions);
    rec.finish_reason =
        u32::try_from(r.finish_reason).map_or(FinishReason::None, FinishReason::from_raw) as u32;
    rec.is_chat = 1;
    rec.x_request_id = fill::<REQUEST_ID_LEN>(xid);
    rec.model = fill::<MODEL_LEN>(model);
    rec
}

/// The range record of `op` (0 push, 1 pop, 2 mark) on `domain::name`; `None` for another `op`.
pub fn range(op: u32, ts_ns: u64, step_id: u64, domain: &[u8], name: &[u8]) -> Option<RangeRecord> {
    let op = RangeOp::from_raw(op)?;
    let mut rec = RangeRecord::new(op, ts_ns, step_id, "", "");
    rec.domain = fill::<RANGE_DOMAIN_LEN>(domain);
    rec.name = fill::<RANGE_NAME_LEN>(name);
    Some(rec)
}

/// `s` in a NUL-padded array of `N` bytes, cut at `N - 1` bytes on a UTF-8 boundary (a NUL always ends it).
fn fill<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let mut n = s.len().min(N - 1);
    // Back off to a character boundary: never split a UTF-8 sequence.
    while n > 0 && n < s.len() && (s[n] & 0xC0) == 0x80 {
        n -= 1;
    }
    out[..n].copy_from_slice(&s[..n]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_keeps_its_requests_and_flags_a_batch_over_the_limit() {
        let ids: Vec<u64> = (1..=70).collect();
        let toks: Vec<u32> = vec![1; 70];
        let s = StepArgs {
            step_id: 7,
            kind: StepKind::Decode as u64,
            host_start_ns: 10,
            host_end_ns: 20,
            num_seqs: 70,
            decode_tokens: 70,
            kv_blocks_used: 3,
            kv_blocks_total: 100,
            ..StepArgs::default()
        };
        let r = step(&s, &ids, &toks);
        assert_eq!((r.step_id, r.kind, r.num_seqs), (7, StepKind::Decode as u32, 70));
        assert_eq!(r.num_req_ids as usize, MAX_STEP_REQS);
        assert_eq!(r.req_ids_truncated, 1);
        assert_eq!((r.req_ids[0], r.req_tokens[0]), (1, 1));
        assert_eq!((r.kv_blocks_used, r.kv_blocks_total), (3, 100));
        assert_eq!(
            step(&StepArgs { kind: 99, ..s }, &[], &[]).kind,
            StepKind::Mixed as u32
        );
    }

    #[test]
    fn request_strings_are_cut_on_a_character_boundary_and_nul_ended() {
        let long = "é".repeat(40);
        let r = request(
            &RequestArgs {
                kind: RequestEventKind::Finished as u64,
                finish_reason: FinishReason::Length as u64,
                ..RequestArgs::default()
            },
            long.as_bytes(),
            b"smollm2",
        );
        let end = r
            .x_request_id
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(REQUEST_ID_LEN);
        assert!(end < REQUEST_ID_LEN);
        assert!(std::str::from_utf8(&r.x_request_id[..end]).is_ok());
        assert_eq!(&r.model[..8], b"smollm2\0");
        assert_eq!(r.finish_reason, FinishReason::Length as u32);
    }

    #[test]
    fn ranges_take_push_pop_and_mark_only() {
        assert!(range(0, 1, 0, b"http.server", b"BaseHTTPRequestHandler.handle").is_some());
        assert!(range(2, 1, 0, b"", b"").is_some());
        assert!(range(9, 1, 0, b"", b"").is_none());
    }
}
