//! Each request's [`RequestTimeline`], rebuilt from the trace: the type the sink drew the request's track from,
//! fed the same way, gives `llmprof report` its per-request numbers and inter-token latencies.
//!
//! Owns reading a request back. Its lifecycle transitions come from its track: a `queued` phase slice starts at
//! `Arrived`, a `prefill` or `decode` slice at `Scheduled`, the `first token`, `preempted` and `finished`
//! instants are those transitions (the `decode` slice that starts with the first token and the `queued
//! (preempted)` slice belong to the instant beside them). The steps that served it are the `engine steps` slices
//! of its process whose typed `req_ids` arg names it (its share of tokens from `req_tokens`, same order). All are
//! fed in the order the sink wrote them, which is the order of the events behind them. What the request asked
//! for and got (x-request-id, tokens, preemptions) comes from its `request N` slice's args.

use std::collections::HashMap;

use super::RequestRow;
use super::read::{Args, Decoded, Track, Val, arg_f, arg_s, arg_u_array};
use crate::names::{arg, slice, track};
use crate::timeline::{RequestInfo, RequestTimeline, StepInfo, Transition};

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// A step slice of an `engine steps` track.
pub(super) struct Step {
    /// Write order (see [`super::read::Slice::seq`]).
    seq: u64,
    /// The process track the steps track hangs under.
    pub(super) process: Option<u64>,
    /// Its kind (from the slice name), times and batch totals; `request_tokens` unset.
    pub(super) info: StepInfo,
    /// Its `num_seqs` arg.
    pub(super) num_seqs: u64,
    /// The step slice's name (the kind, or `step` for an unknown one).
    pub(super) name: String,
    /// The batch size of the CUDA graph it replayed (0: launched eagerly; [`arg::GRAPH_BATCH`]).
    pub(super) graph_batch: u64,
    /// The requests it served and each one's tokens ([`arg::REQ_IDS`], [`arg::REQ_TOKENS`]).
    reqs: Vec<u64>,
    tokens: Vec<u64>,
}

/// Every step slice of every `engine steps` track, in write order.
pub(super) fn steps(d: &Decoded) -> Vec<Step> {
    let mut steps: Vec<Step> = d
        .tracks
        .values()
        .filter(|t| t.name.as_deref() == Some(track::STEPS))
        .flat_map(|t| t.slices.iter().map(move |s| (t.parent, s)))
        .map(|(process, s)| {
            let u = |k| arg_f(&s.args, k).unwrap_or(0.0) as u64;
            Step {
                seq: s.seq,
                process,
                info: StepInfo {
                    step_id: u(arg::STEP_ID),
                    kind: slice::parse_step(&s.name),
                    start_ns: s.ts,
                    end_ns: s.ts + s.dur,
                    num_seqs: u(arg::NUM_SEQS) as u32,
                    prefill_tokens: u(arg::PREFILL_TOKENS) as u32,
                    decode_tokens: u(arg::DECODE_TOKENS) as u32,
                    request_tokens: None,
                },
                num_seqs: u(arg::NUM_SEQS),
                graph_batch: u(arg::GRAPH_BATCH),
                name: s.name.clone(),
                reqs: arg_u_array(&s.args, arg::REQ_IDS),
                tokens: arg_u_array(&s.args, arg::REQ_TOKENS),
            }
        })
        .collect();
    steps.sort_by_key(|s| s.seq);
    steps
}

/// The steps naming each request, by (process track, request id): (write order, the step as it sees it).
type Served = HashMap<(Option<u64>, u64), Vec<(u64, StepInfo)>>;

/// What is fed to a request's timeline, in write order.
enum Item {
    Transition(u64, Transition),
    Step(StepInfo),
}

/// Every request with a track, in request id order, and the inter-token latencies of all of them (ms).
pub(super) fn requests(d: &Decoded, steps: &[Step]) -> (Vec<RequestRow>, Vec<f64>) {
    // The steps naming each (process, request), with the request's share.
    let mut served = Served::new();
    for s in steps {
        for (i, &req) in s.reqs.iter().enumerate() {
            let info = StepInfo {
                request_tokens: s.tokens.get(i).map(|&t| t as u32),
                ..s.info
            };
            served.entry((s.process, req)).or_default().push((s.seq, info));
        }
    }
    let mut rows = Vec::new();
    let mut itl = Vec::new();
    for t in d.tracks.values() {
        let Some((req_id, outer)) = t
            .slices
            .iter()
            .find_map(|s| Some((slice::parse_request(&s.name)?, s)))
        else {
            continue;
        };
        let mid = matches!(outer.args.get(arg::ATTACHED_MID_REQUEST), Some(Val::B(true)));
        let mut items = transitions(t, outer.ts, &outer.args);
        let first = match items.first() {
            Some((_, Item::Transition(_, tr))) if mid => *tr,
            _ if mid => Transition::Scheduled,
            _ => Transition::Arrived,
        };
        items.extend(
            served
                .remove(&(t.parent, req_id))
                .unwrap_or_default()
                .into_iter()
                .map(|(seq, s)| (seq, Item::Step(s))),
        );
        items.sort_by_key(|(seq, _)| *seq);
        let mut tl = RequestTimeline::new(req_id, outer.ts, first, info_of(&outer.args));
        for (_, item) in items {
            match item {
                Item::Transition(ts, tr) => {
                    tl.transition(tr, ts);
                }
                Item::Step(s) => itl.extend(tl.on_step(&s).map(ms)),
            }
        }
        // A request seen on the wire: one sample per SSE content event after the first token.
        let itl_before = itl.len();
        let wire = wire_itl(t, tl.first_token_ns());
        let wire_seen = !wire.is_empty();
        itl.extend(wire);
        // A request no step names: one sample, (finish − first token) / (output tokens − 1).
        let info = tl.info();
        if let (false, 0, Some(ft), Some(end), n @ 2..) = (
            wire_seen,
            tl.token_steps(),
            tl.first_token_ns(),
            tl.finished_ns(),
            info.output_tokens,
        ) {
            itl.push(ms(end.saturating_sub(ft)) / f64::from(n - 1));
        }
        // Attached after it arrived: its arrival (and so queue time and TTFT) is unknown.
        let known = |v: Option<u64>| v.map(ms).filter(|_| !mid);
        let on_wire = slice::is_wire_request(req_id);
        let engine_only = |v: Option<f64>| v.filter(|_| !on_wire);
        let mut own: Vec<f64> = itl[itl_before..].to_vec();
        own.sort_by(f64::total_cmp);
        let itl_p50_ms = (!own.is_empty()).then(|| own[(own.len() - 1) / 2]);
        rows.push(RequestRow {
            req_id,
            x_request_id: info.x_request_id.clone(),
            queue_ms: engine_only(known(tl.queued_before_first_token_ns())),
            prefill_ms: engine_only(known(tl.prefill_before_first_token_ns())),
            ttft_ms: known(tl.ttft_ns()),
            first_decode_step_ms: tl.first_decode_step_ns().map(ms),
            output_tokens: u64::from(info.output_tokens),
            finish_reason: info
                .finish_reason
                .map_or(arg::UNFINISHED, |r| r.name())
                .to_owned(),
            preemptions: u64::from(info.num_preemptions),
            attached_mid_request: mid,
            e2e_ms: known(tl.finished_ns().map(|f| f.saturating_sub(tl.start_ns()))),
            itl_p50_ms,
            wire: on_wire,
            pid: t
                .parent
                .and_then(|p| d.tracks.get(&p))
                .and_then(|p| p.pid)
                .unwrap_or(0),
            arrival_ns: outer.ts,
            wire_ttft_ms: None,
            outside_engine_ttft_ms: None,
            socket_wait_ms: t
                .instants
                .iter()
                .find(|i| i.name == slice::HTTP_REQUEST_LINE)
                .and_then(|i| arg_f(&i.args, arg::SOCKET_WAIT_NS))
                .map(|ns| ns / 1e6),
        });
    }
    rows.sort_by_key(|q| q.req_id);
    join_wire(&mut rows);
    (rows, itl)
}

/// Joins each engine request to its wire views by `x-request-id`: the outermost view (the first to arrive:
/// what the client sees) gives its wire TTFT, and the difference to the engine's TTFT is the time spent outside
/// the engine.
fn join_wire(rows: &mut [RequestRow]) {
    let mut outer: HashMap<String, (u64, Option<f64>)> = HashMap::new();
    for r in rows.iter().filter(|r| r.wire && !r.x_request_id.is_empty()) {
        let e = outer
            .entry(r.x_request_id.clone())
            .or_insert((r.arrival_ns, r.ttft_ms));
        if r.arrival_ns < e.0 {
            *e = (r.arrival_ns, r.ttft_ms);
        }
    }
    for r in rows.iter_mut().filter(|r| !r.wire) {
        if let Some(&(_, Some(w))) = outer.get(&r.x_request_id) {
            r.wire_ttft_ms = Some(w);
            r.outside_engine_ttft_ms = r.ttft_ms.map(|e| w - e);
        }
    }
}

/// The inter-token gaps (ms) of a wire request: its first token, then every SSE content event (an instant
/// stands for `count` events of one write: the first closes the gap since the previous event, the others are
/// 0 ms apart, as a client reading the write sees them).
fn wire_itl(t: &Track, first_token: Option<u64>) -> Vec<f64> {
    let Some(mut last) = first_token else {
        return Vec::new();
    };
    let mut tokens: Vec<(u64, u64, u64)> = t
        .instants
        .iter()
        .filter(|i| i.name == slice::WIRE_TOKEN)
        .map(|i| (i.seq, i.ts, arg_f(&i.args, arg::COUNT).unwrap_or(1.0) as u64))
        .collect();
    tokens.sort_by_key(|(seq, _, _)| *seq);
    let mut out = Vec::new();
    for (_, ts, count) in tokens {
        for _ in 0..count.max(1) {
            out.push(ms(ts.saturating_sub(last)));
            last = ts;
        }
    }
    out
}

/// The lifecycle transitions a request's track shows, in write order (`(seq, item)`).
fn transitions(t: &Track, start: u64, outer: &Args) -> Vec<(u64, Item)> {
    let first_tokens: Vec<u64> = t
        .instants
        .iter()
        .filter(|i| i.name == slice::FIRST_TOKEN)
        .map(|i| i.ts)
        .collect();
    let mut items: Vec<(u64, Item)> = Vec::new();
    for s in &t.slices {
        let tr = match s.name.as_str() {
            slice::QUEUED => Transition::Arrived,
            slice::PREFILL => Transition::Scheduled,
            slice::DECODE if !first_tokens.contains(&s.ts) => Transition::Scheduled,
            _ => continue,
        };
        items.push((s.seq, Item::Transition(s.ts, tr)));
    }
    for i in &t.instants {
        let tr = match i.name.as_str() {
            slice::FIRST_TOKEN => Transition::FirstToken,
            slice::PREEMPTED => Transition::Preempted,
            slice::FINISHED => {
                let reason = arg_s(&i.args, arg::FINISH_REASON).and_then(arg::parse_finish_reason);
                Transition::Finished(reason.unwrap_or(llmprof_abi::FinishReason::None))
            }
            _ => continue,
        };
        items.push((i.seq, Item::Transition(i.ts, tr)));
    }
    items.sort_by_key(|(seq, _)| *seq);
    // A trace without the instant (of an earlier version) still has the request's TTFT.
    if first_tokens.is_empty()
        && let Some(v) = arg_f(outer, arg::TTFT_MS)
    {
        let ft = start + (v * 1e6).round() as u64;
        let at = items
            .iter()
            .position(|(_, it)| matches!(it, Item::Transition(ts, _) if *ts > ft))
            .unwrap_or(items.len());
        let seq = if at == 0 { 0 } else { items[at - 1].0 };
        items.insert(at, (seq, Item::Transition(ft, Transition::FirstToken)));
    }
    items
}

/// What the request slice's args say about the request.
fn info_of(a: &Args) -> RequestInfo {
    let u = |k| arg_f(a, k).unwrap_or(0.0) as u32;
    RequestInfo {
        model: arg_s(a, arg::MODEL).unwrap_or("").to_owned(),
        is_chat: arg_s(a, arg::ENDPOINT) == Some(arg::ENDPOINT_CHAT),
        prompt_tokens: u(arg::PROMPT_TOKENS),
        output_tokens: u(arg::OUTPUT_TOKENS),
        max_tokens: u(arg::MAX_TOKENS),
        temperature: arg_f(a, arg::TEMPERATURE).unwrap_or(0.0) as f32,
        top_p: arg_f(a, arg::TOP_P).unwrap_or(0.0) as f32,
        x_request_id: arg_s(a, arg::X_REQUEST_ID).unwrap_or("").to_owned(),
        trace_context: None,
        finish_reason: None,
        num_preemptions: u(arg::NUM_PREEMPTIONS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(xid: &str, wire: bool, arrival_ns: u64, ttft_ms: Option<f64>) -> RequestRow {
        RequestRow {
            x_request_id: xid.to_owned(),
            wire,
            arrival_ns,
            ttft_ms,
            ..RequestRow::default()
        }
    }

    #[test]
    fn an_engine_request_joins_its_outermost_wire_view_by_x_request_id() {
        let mut rows = vec![
            // The engine's own view, the engine's HTTP server's wire view, the gateway's in front of it.
            row("a", false, 12_000_000, Some(100.0)),
            row("a", true, 11_000_000, Some(104.0)),
            row("a", true, 10_000_000, Some(109.5)),
            // No wire view; a wire request of another id; an engine request without an id.
            row("b", false, 0, Some(50.0)),
            row("c", true, 0, Some(20.0)),
            row("", false, 0, Some(1.0)),
            row("", true, 0, Some(2.0)),
        ];
        join_wire(&mut rows);
        assert_eq!(rows[0].wire_ttft_ms, Some(109.5));
        assert_eq!(rows[0].outside_engine_ttft_ms, Some(9.5));
        for r in &rows[1..] {
            assert_eq!(r.wire_ttft_ms, None, "{r:?}");
            assert_eq!(r.outside_engine_ttft_ms, None, "{r:?}");
        }
    }
}
