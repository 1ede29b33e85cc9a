//! `requests`, `steps` and `counters` of the `--json` document: the engine family's section (wire requests
//! are requests like the engine's) and the engine's `/metrics` counters.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Num, StatsJson, opt};
use crate::report::{Report, RequestRow, Stats};

/// `requests`.
#[derive(Serialize)]
pub(super) struct Requests<'a> {
    count: usize,
    finished: usize,
    unfinished: usize,
    /// 4xx/5xx responses or engine errors: not finished, not in the latencies below.
    failed: usize,
    /// Ended by the client going away (part of `finished`).
    cancelled: usize,
    /// Wire views folded into the engine request they carried.
    joined: usize,
    /// Responses by HTTP status (`{"200": n}`).
    status_counts: BTreeMap<String, u64>,
    /// `failed` / (`finished` − `cancelled` + `failed`), %; `null` without any.
    error_rate_pct: Option<Num>,
    ttft_ms: StatsJson,
    queue_ms: StatsJson,
    prefill_ms: StatsJson,
    first_decode_step_ms: StatsJson,
    itl_ms: StatsJson,
    e2e_ms: StatsJson,
    /// Engine requests also seen on the wire: their TTFT spent outside the engine.
    outside_engine_ttft_ms: StatsJson,
    /// Wire requests: how long their first bytes waited in the server's socket.
    socket_wait_ms: StatsJson,
    /// End-to-end time of the failed requests.
    failed_e2e_ms: StatsJson,
    per_request: Vec<Request<'a>>,
    /// The wire views folded into `per_request` entries (`joined_to`: that entry's `req_id`).
    joined_views: Vec<Request<'a>>,
}

impl<'a> Requests<'a> {
    pub(super) fn of(r: &'a Report) -> Self {
        let (ok, failed, cancelled, running) = r.outcomes();
        Self {
            count: r.requests.len(),
            finished: ok + cancelled,
            unfinished: running,
            failed,
            cancelled,
            joined: r.joined_views.len(),
            status_counts: r
                .status_counts()
                .into_iter()
                .map(|(s, n)| (s.to_string(), n))
                .collect(),
            error_rate_pct: opt(r.error_rate_pct()),
            ttft_ms: StatsJson::of(&r.ttft()),
            queue_ms: StatsJson::of(&r.ok_col(|q| q.queue_ms)),
            prefill_ms: StatsJson::of(&r.ok_col(|q| q.prefill_ms)),
            first_decode_step_ms: StatsJson::of(&r.ok_col(|q| q.first_decode_step_ms)),
            itl_ms: StatsJson::of(&Stats::of(&r.itl_ms)),
            e2e_ms: StatsJson::of(&r.ok_col(|q| q.e2e_ms)),
            outside_engine_ttft_ms: StatsJson::of(&r.ok_col(|q| q.outside_engine_ttft_ms)),
            socket_wait_ms: StatsJson::of(&r.ok_col(|q| q.socket_wait_ms)),
            failed_e2e_ms: StatsJson::of(&r.col(|q| q.e2e_ms.filter(|_| q.failed()))),
            per_request: r
                .requests
                .iter()
                .map(|q| Request::of(q, r.trace_start_ns))
                .collect(),
            joined_views: r
                .joined_views
                .iter()
                .map(|q| Request::of(q, r.trace_start_ns))
                .collect(),
        }
    }
}

/// One `requests.per_request` entry.
#[derive(Serialize)]
pub(super) struct Request<'a> {
    req_id: u64,
    x_request_id: &'a str,
    queue_ms: Option<Num>,
    prefill_ms: Option<Num>,
    ttft_ms: Option<Num>,
    first_decode_step_ms: Option<Num>,
    output_tokens: u64,
    finish_reason: &'a str,
    preemptions: u64,
    attached_mid_request: bool,
    e2e_ms: Option<Num>,
    itl_p50_ms: Option<Num>,
    wire: bool,
    pid: u32,
    wire_ttft_ms: Option<Num>,
    outside_engine_ttft_ms: Option<Num>,
    socket_wait_ms: Option<Num>,
    start_s: Num,
    path: &'a str,
    http_status: Option<u32>,
    failed: bool,
    streamed: Option<bool>,
    response_bytes: Option<u64>,
    wire_req_id: Option<u64>,
    perfetto_slice: String,
    joined_to: Option<u64>,
}

impl<'a> Request<'a> {
    pub(super) fn of(q: &'a RequestRow, trace_start_ns: u64) -> Self {
        Self {
            req_id: q.req_id,
            x_request_id: &q.x_request_id,
            queue_ms: opt(q.queue_ms),
            prefill_ms: opt(q.prefill_ms),
            ttft_ms: opt(q.ttft_ms),
            first_decode_step_ms: opt(q.first_decode_step_ms),
            output_tokens: q.output_tokens,
            finish_reason: &q.finish_reason,
            preemptions: q.preemptions,
            attached_mid_request: q.attached_mid_request,
            e2e_ms: opt(q.e2e_ms),
            itl_p50_ms: opt(q.itl_p50_ms),
            wire: q.wire,
            pid: q.pid,
            wire_ttft_ms: opt(q.wire_ttft_ms),
            outside_engine_ttft_ms: opt(q.outside_engine_ttft_ms),
            socket_wait_ms: opt(q.socket_wait_ms),
            start_s: Num(q.arrival_ns as f64 / 1e9 - trace_start_ns as f64 / 1e9),
            path: &q.path,
            http_status: q.http_status,
            failed: q.failed(),
            streamed: q.streamed,
            response_bytes: q.response_bytes,
            wire_req_id: q.wire_req_id,
            perfetto_slice: q.slice_name(),
            joined_to: q.joined_to,
        }
    }
}

/// `steps`.
#[derive(Serialize)]
pub(super) struct Steps<'a> {
    count: u64,
    /// Prompt tokens the steps computed.
    prefill_tokens: u64,
    /// Decode tokens of the steps.
    decode_tokens: u64,
    by_kind: ByKind,
    by_batch_size: Vec<BatchBucket<'a>>,
    /// The steps that replayed a CUDA graph.
    graph_replayed: StatsJson,
}

/// `steps.by_kind`: always the three kinds, empty stats for a kind the trace has no step of.
#[derive(Serialize)]
pub(super) struct ByKind {
    prefill: StatsJson,
    decode: StatsJson,
    mixed: StatsJson,
}

impl<'a> Steps<'a> {
    pub(super) fn of(r: &'a Report) -> Self {
        let kind = |k: &str| StatsJson::of(&r.steps_by_kind.get(k).cloned().unwrap_or_default());
        Self {
            count: r.steps_by_kind.values().map(|s| s.count as u64).sum(),
            prefill_tokens: r.steps_prefill_tokens,
            decode_tokens: r.steps_decode_tokens,
            by_kind: ByKind {
                prefill: kind("prefill"),
                decode: kind("decode"),
                mixed: kind("mixed"),
            },
            by_batch_size: r
                .steps_by_batch
                .iter()
                .map(|b| BatchBucket {
                    bucket: &b.bucket,
                    min_seqs: b.min_seqs,
                    max_seqs: (b.max_seqs != u64::MAX).then_some(b.max_seqs),
                    stats: StatsJson::of(&b.stats),
                })
                .collect(),
            graph_replayed: StatsJson::of(&r.steps_graph_replayed),
        }
    }
}

/// One `steps.by_batch_size` entry (`max_seqs` `null`: the open last bucket).
#[derive(Serialize)]
pub(super) struct BatchBucket<'a> {
    bucket: &'a str,
    min_seqs: u64,
    max_seqs: Option<u64>,
    stats: StatsJson,
}

/// `counters`: one object per counter track (by key), then `preemptions_total`.
#[derive(Serialize)]
pub(super) struct Counters {
    #[serde(flatten)]
    tracks: BTreeMap<&'static str, Counter>,
    preemptions_total: Option<Num>,
}

impl Counters {
    pub(super) fn of(r: &Report) -> Self {
        Self {
            tracks: r
                .counters
                .iter()
                .map(|(k, c)| {
                    let c = Counter {
                        samples: c.samples,
                        max: opt(c.max),
                        mean: opt(c.mean),
                        last: opt(c.last),
                    };
                    (*k, c)
                })
                .collect(),
            preemptions_total: opt(r.preemptions_total),
        }
    }
}

/// One engine counter track: `{samples, max, mean, last}` (the GPU's are [`GpuSamples`], in another order).
#[derive(Serialize)]
pub(super) struct Counter {
    samples: usize,
    max: Option<Num>,
    mean: Option<Num>,
    last: Option<Num>,
}
