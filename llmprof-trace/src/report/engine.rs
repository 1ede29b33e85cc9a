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
use crate::event::engine::{RequestInfo, RequestTimeline, StepInfo, Transition};
use crate::names::{arg, slice, track};

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

/// What a wire request's track says of its HTTP exchange.
#[derive(Default)]
struct WireView {
    path: Option<String>,
    status: Option<u32>,
    streamed: Option<bool>,
    bytes: Option<u64>,
    engine_req: Option<u64>,
}

fn wire_view(t: &Track) -> WireView {
    let mut w = WireView::default();
    for i in &t.instants {
        if i.name == slice::HTTP_REQUEST_LINE {
            w.path = arg_s(&i.args, arg::HTTP_PATH).map(str::to_owned);
        } else if i.name == slice::HTTP_RESPONSE {
            w.status = w.status.or(arg_f(&i.args, arg::HTTP_STATUS).map(|v| v as u32));
        } else if i.name == slice::HTTP_RESPONSE_END {
            if let Some(s) = arg_f(&i.args, arg::HTTP_STATUS)
                .map(|v| v as u32)
                .filter(|s| *s != 0)
            {
                w.status = Some(s);
            }
            w.streamed = match i.args.get(arg::STREAMED) {
                Some(Val::B(b)) => Some(*b),
                _ => w.streamed,
            };
            w.bytes = arg_f(&i.args, arg::RESPONSE_BYTES).map(|v| v as u64);
            w.engine_req = arg_s(&i.args, arg::ENGINE_REQUEST).and_then(slice::parse_request);
        }
    }
    w
}

/// Every request with a track, in request id order, each once (an engine request's wire views folded into
/// it), the wire views folded, and the inter-token latencies of the successful requests (ms).
pub(super) fn requests(d: &Decoded, steps: &[Step]) -> (Vec<RequestRow>, Vec<RequestRow>, Vec<f64>) {
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
    let mut engine_of: HashMap<(u32, u64), u64> = HashMap::new();
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
        let mut own: Vec<f64> = Vec::new();
        for (_, item) in items {
            match item {
                Item::Transition(ts, tr) => {
                    tl.transition(tr, ts);
                }
                Item::Step(s) => own.extend(tl.on_step(&s).map(ms)),
            }
        }
        // A request seen on the wire: one sample per SSE content event after the first token.
        let wire = wire_itl(t, tl.first_token_ns());
        let wire_seen = !wire.is_empty();
        own.extend(wire);
        // A request no step names: one sample, (finish − first token) / (output tokens − 1).
        let info = tl.info();
        if let (false, 0, Some(ft), Some(end), n @ 2..) = (
            wire_seen,
            tl.token_steps(),
            tl.first_token_ns(),
            tl.finished_ns(),
            info.output_tokens,
        ) {
            own.push(ms(end.saturating_sub(ft)) / f64::from(n - 1));
        }
        // Attached after it arrived: its arrival (and so queue time and TTFT) is unknown.
        let known = |v: Option<u64>| v.map(ms).filter(|_| !mid);
        let on_wire = slice::is_wire_request(req_id);
        let engine_only = |v: Option<f64>| v.filter(|_| !on_wire);
        let mut sorted = own.clone();
        sorted.sort_by(f64::total_cmp);
        let itl_p50_ms = (!sorted.is_empty()).then(|| sorted[(sorted.len() - 1) / 2]);
        let pid = t
            .parent
            .and_then(|p| d.tracks.get(&p))
            .and_then(|p| p.pid)
            .unwrap_or(0);
        let w = if on_wire {
            wire_view(t)
        } else {
            WireView::default()
        };
        if let Some(e) = w.engine_req {
            engine_of.insert((pid, req_id), e);
        }
        let endpoint = arg_s(&outer.args, arg::ENDPOINT).unwrap_or("").to_owned();
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
            pid,
            arrival_ns: outer.ts,
            wire_ttft_ms: None,
            outside_engine_ttft_ms: None,
            socket_wait_ms: t
                .instants
                .iter()
                .find(|i| i.name == slice::HTTP_REQUEST_LINE)
                .and_then(|i| arg_f(&i.args, arg::SOCKET_WAIT_NS))
                .map(|ns| ns / 1e6),
            path: w.path.unwrap_or(endpoint),
            http_status: w.status,
            streamed: w.streamed,
            response_bytes: w.bytes,
            wire_req_id: None,
            itl_ms: own,
            joined_to: None,
        });
    }
    rows.sort_by_key(|q| q.req_id);
    let joined = join_wire(&mut rows, &engine_of);
    let itl = rows
        .iter()
        .filter(|q| !q.failed())
        .flat_map(|q| q.itl_ms.iter().copied())
        .collect();
    (rows, joined, itl)
}

/// Folds the wire views of each engine request into it: the view the capture joined in the same process
/// (`engine_of`: (pid, wire id) → engine id, from the trace), and views of another process (a gateway in
/// front of the engine) with the engine request's `x-request-id`. The outermost view (the first to arrive:
/// what the client sees) gives the wire TTFT, and its difference to the engine's TTFT is the time spent
/// outside the engine; the view in the engine's own process gives the status, path, bytes and whether it
/// streamed, or, when the engine has no HTTP server of its own (vLLM's engine-core process behind its API
/// server), the innermost view (the last to see the request arrive). Returns the wire views folded (each with
/// the engine request it joined).
fn join_wire(rows: &mut Vec<RequestRow>, engine_of: &HashMap<(u32, u64), u64>) -> Vec<RequestRow> {
    let engine: HashMap<(u32, u64), usize> = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.wire)
        .map(|(i, r)| ((r.pid, r.req_id), i))
        .collect();
    let by_xid: HashMap<&str, usize> = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.wire && !r.x_request_id.is_empty())
        .map(|(i, r)| (r.x_request_id.as_str(), i))
        .collect();
    // Each wire view: the engine row it is a view of, and whether it is that engine's own (same process).
    let mut target: Vec<Option<(usize, bool)>> = vec![None; rows.len()];
    for (i, r) in rows.iter().enumerate().filter(|(_, r)| r.wire) {
        target[i] = engine_of
            .get(&(r.pid, r.req_id))
            .and_then(|e| engine.get(&(r.pid, *e)))
            .map(|&e| (e, true))
            .or_else(|| {
                let &e = by_xid
                    .get(r.x_request_id.as_str())
                    .filter(|_| !r.x_request_id.is_empty())?;
                Some((e, rows[e].pid == r.pid))
            });
    }
    let mut outer: HashMap<usize, (u64, Option<f64>)> = HashMap::new();
    // The view whose status, path and bytes the engine row takes: its own process's, else the innermost tier
    // that served it (the last to see it arrive: vLLM's API server in front of its engine-core process).
    let mut nearest: HashMap<usize, (bool, u64, usize)> = HashMap::new();
    for (i, t) in target.iter().enumerate() {
        let Some((e, own)) = *t else { continue };
        let w = &rows[i];
        let o = outer.entry(e).or_insert((w.arrival_ns, w.ttft_ms));
        if w.arrival_ns < o.0 {
            *o = (w.arrival_ns, w.ttft_ms);
        }
        let n = nearest.entry(e).or_insert((own, w.arrival_ns, i));
        if (own, w.arrival_ns) > (n.0, n.1) {
            *n = (own, w.arrival_ns, i);
        }
    }
    for (&e, &(_, _, i)) in &nearest {
        let w = &rows[i];
        let (path, status, streamed, bytes, id) = (
            w.path.clone(),
            w.http_status,
            w.streamed,
            w.response_bytes,
            w.req_id,
        );
        let wait = w.socket_wait_ms;
        let r = &mut rows[e];
        if !path.is_empty() {
            r.path = path;
        }
        r.http_status = status.or(r.http_status);
        r.streamed = streamed.or(r.streamed);
        r.response_bytes = bytes.or(r.response_bytes);
        r.socket_wait_ms = wait.or(r.socket_wait_ms);
        r.wire_req_id = Some(id);
    }
    for (e, (_, ttft)) in outer {
        if let Some(w) = ttft {
            let r = &mut rows[e];
            r.wire_ttft_ms = Some(w);
            r.outside_engine_ttft_ms = r.ttft_ms.map(|t| w - t);
        }
    }
    let ids: Vec<u64> = rows.iter().map(|r| r.req_id).collect();
    let all = std::mem::take(rows);
    let mut views = Vec::new();
    for (mut r, t) in all.into_iter().zip(&target) {
        match t {
            None => rows.push(r),
            Some((e, _)) => {
                r.joined_to = Some(ids[*e]);
                views.push(r);
            }
        }
    }
    views
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
    fn an_engine_request_folds_its_wire_views_into_one_row() {
        let mut rows = vec![
            // The engine's own view (pid 1), its HTTP server's wire view, a gateway's (pid 2) in front of it.
            RequestRow {
                req_id: 5,
                pid: 1,
                ..row("a", false, 12_000_000, Some(100.0))
            },
            RequestRow {
                req_id: 101,
                pid: 1,
                http_status: Some(200),
                path: "/v1/chat/completions".into(),
                streamed: Some(true),
                response_bytes: Some(900),
                ..row("a", true, 11_000_000, Some(104.0))
            },
            RequestRow {
                req_id: 102,
                pid: 2,
                ..row("a", true, 10_000_000, Some(109.5))
            },
            // No x-request-id: joined by the capture (same process, by timing).
            RequestRow {
                req_id: 6,
                pid: 1,
                ..row("", false, 20_000_000, Some(50.0))
            },
            RequestRow {
                req_id: 103,
                pid: 1,
                http_status: Some(200),
                ..row("", true, 19_000_000, Some(52.0))
            },
            // A wire request of another id, and one of no engine request (GET /health).
            RequestRow {
                req_id: 104,
                pid: 1,
                ..row("c", true, 0, Some(20.0))
            },
            RequestRow {
                req_id: 105,
                pid: 1,
                http_status: Some(404),
                ..row("", true, 0, None)
            },
        ];
        let engine_of = [((1, 101), 5), ((1, 103), 6)].into_iter().collect();
        let views = join_wire(&mut rows, &engine_of);
        let joined: Vec<(u64, Option<u64>)> = views.iter().map(|v| (v.req_id, v.joined_to)).collect();
        assert_eq!(joined, [(101, Some(5)), (102, Some(5)), (103, Some(6))]);
        let ids: Vec<u64> = rows.iter().map(|r| r.req_id).collect();
        assert_eq!(ids, [5, 6, 104, 105], "each request once");
        assert_eq!(
            rows[0].wire_ttft_ms,
            Some(109.5),
            "the outermost view is the client's"
        );
        assert_eq!(rows[0].outside_engine_ttft_ms, Some(9.5));
        assert_eq!(rows[0].http_status, Some(200));
        assert_eq!(rows[0].wire_req_id, Some(101), "the engine's own wire view");
        assert_eq!(rows[0].response_bytes, Some(900));
        assert_eq!(rows[1].wire_ttft_ms, Some(52.0));
        assert_eq!(rows[1].wire_req_id, Some(103));
        assert!(rows[3].failed(), "a 404 is a failed request");
        assert!(!rows[2].failed());
    }

    #[test]
    fn an_engine_without_its_own_http_server_takes_the_innermost_view() {
        // vLLM: the engine core (pid 7) has no socket; its API server (pid 6) serves the request, a gateway
        // (pid 5) in front of that.
        let mut rows = vec![
            RequestRow {
                req_id: 1,
                pid: 7,
                ..row("v", false, 30_000_000, Some(40.0))
            },
            RequestRow {
                req_id: 201,
                pid: 6,
                http_status: Some(200),
                path: "/v1/chat/completions".into(),
                streamed: Some(true),
                ..row("v", true, 20_000_000, Some(60.0))
            },
            RequestRow {
                req_id: 202,
                pid: 5,
                http_status: Some(200),
                path: "/gateway".into(),
                ..row("v", true, 10_000_000, Some(75.0))
            },
        ];
        let views = join_wire(&mut rows, &HashMap::new());
        assert_eq!(views.len(), 2);
        assert_eq!(rows.len(), 1, "one request");
        assert_eq!(rows[0].wire_req_id, Some(201), "the API server's view");
        assert_eq!(rows[0].path, "/v1/chat/completions");
        assert_eq!(rows[0].streamed, Some(true));
        assert_eq!(
            rows[0].wire_ttft_ms,
            Some(75.0),
            "the gateway's is the client's TTFT"
        );
        assert_eq!(rows[0].outside_engine_ttft_ms, Some(35.0));
    }
}
