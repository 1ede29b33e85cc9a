//! The engine's tracks of a traced process: `engine steps`, the steps' device interval, one track per request;
//! and on a thread's own track the NVTX-style ranges the engine marks (`llmprof_range`).
//!
//! A step slice carries the ids of the requests it served and each one's tokens as typed array args
//! ([`arg::REQ_IDS`], [`arg::REQ_TOKENS`]: `debug.req_ids[0]`, ... in the trace processor), so a reader gets them
//! back without parsing text. A request's track is drawn from its [`RequestTimeline`]: the outer `request N`
//! slice, the engine-reported phases inside it, and instants at the first token, preemptions and the finish.

use std::io::{self, Write};

use llmprof_abi::{DeviceClock, RangeOp, RangeRecord, RequestRecord, StepKind, StepRecord, read_str};

use super::{NS_DEVICE, NS_REQUEST, NS_STEPS, TraceSink, pid_req, uuid};
use crate::event::Event;
use crate::event::engine::{RequestTimeline, Transition};
use crate::names::{arg, slice, track};
use crate::perfetto::writer::{Arg, arg_b, arg_f, arg_s, arg_u, arg_u_array};

impl<W: Write> TraceSink<W> {
    /// An engine step: its slice on `engine steps` (flows to its requests), its device interval, and the end of
    /// the CUDA batches it closes.
    pub(super) fn step(&mut self, pid: u32, r: &StepRecord) -> io::Result<()> {
        let kind = slice::step(StepKind::from_raw(r.kind));
        self.gpu.links.step(pid, r);
        let steps = self.child_track(pid, uuid(NS_STEPS, u64::from(pid)), || track::STEPS.to_owned())?;
        let n = (r.num_req_ids as usize).min(r.req_ids.len());
        let flows: Vec<u64> = r.req_ids[..n].iter().map(|&q| pid_req(pid, q)).collect();
        let mut args = vec![
            arg_u(arg::STEP_ID, r.step_id),
            arg_u(arg::NUM_SEQS, r.num_seqs),
            arg_u(arg::PREFILL_TOKENS, r.prefill_tokens),
            arg_u(arg::DECODE_TOKENS, r.decode_tokens),
            arg_u(arg::KV_BLOCKS_USED, r.kv_blocks_used),
            arg_u(arg::KV_BLOCKS_TOTAL, r.kv_blocks_total),
            arg_u(arg::NUM_WAITING, r.num_waiting),
            arg_u(arg::NUM_PREEMPTED, r.num_preempted),
            arg_u_array(arg::REQ_IDS, r.req_ids[..n].iter().copied()),
            arg_u_array(arg::REQ_TOKENS, r.req_tokens[..n].iter().map(|&t| u64::from(t))),
            arg_b(arg::REQ_IDS_TRUNCATED, r.req_ids_truncated != 0),
        ];
        if r.graph_batch > 0 {
            args.push(arg_u(arg::GRAPH_BATCH, r.graph_batch));
        }
        let dur = r.host_end_ns.saturating_sub(r.host_start_ns);
        self.slice(r.host_start_ns, dur, steps, kind, args, flows)?;
        if r.device_end_ns > r.device_start_ns {
            let label = match r.device_clock {
                x if x == DeviceClock::CudaEvents as u32 => track::DEVICE_CUDA,
                _ => track::DEVICE_HOST,
            };
            let dev = self.child_track(pid, uuid(NS_DEVICE, u64::from(pid)), || label.to_owned())?;
            let args = vec![arg_u(arg::STEP_ID, r.step_id)];
            let dur = r.device_end_ns - r.device_start_ns;
            self.slice(r.device_start_ns, dur, dev, kind, args, Vec::new())?;
        }
        self.cuda
            .step(pid, r.host_start_ns, r.host_end_ns, r.step_id, &mut self.cuda_out);
        self.write_cuda()
    }

    /// The track of request `req` of `pid` (named with its `x-request-id` when the first record had one).
    pub(super) fn request_track(&mut self, pid: u32, req: u64, xid: &str) -> io::Result<u64> {
        self.child_track(pid, uuid(NS_REQUEST, pid_req(pid, req)), || {
            track::request(req, xid)
        })
    }

    /// A request lifecycle record: the end of the phase it closes, its instant, the start of the phase it opens;
    /// at first sight the outer request slice, at the finish its end.
    pub(super) fn request(&mut self, pid: u32, ev_ts: u64, r: &RequestRecord) -> io::Result<()> {
        let ts = if r.ts_ns != 0 { r.ts_ns } else { ev_ts };
        let Some(transition) = Transition::of(r) else {
            return Ok(());
        };
        let track = self.request_track(pid, r.req_id, read_str(&r.x_request_id))?;
        let key = (pid, r.req_id);
        let flow = pid_req(pid, r.req_id);
        if !self.requests.contains_key(&key) {
            // First sight: open the request slice (mid-request when we attached after it arrived).
            let Some(tl) = RequestTimeline::from_record(r, ts) else {
                return Ok(());
            };
            let args = request_begin_args(&tl);
            self.begin(ts, track, &slice::request(r.req_id), args, vec![flow])?;
            self.requests.insert(key, tl);
        }
        let Some(tl) = self.requests.get_mut(&key) else {
            return Ok(());
        };
        let Some(change) = tl.on_record(r, ts) else {
            return Ok(());
        };
        let start = tl.start_ns();
        if change.closed.is_some() {
            self.end(ts, track, Vec::new())?;
        }
        match transition {
            Transition::Preempted => {
                let args = vec![
                    arg_u(arg::NUM_PREEMPTIONS, r.num_preemptions),
                    arg_u(arg::OUTPUT_TOKENS, r.output_tokens),
                ];
                self.instant(ts, track, slice::PREEMPTED, args, Vec::new())?;
            }
            Transition::FirstToken => {
                let ttft = ts.saturating_sub(start);
                let args = vec![arg_f(arg::TTFT_MS, ttft as f64 / 1e6)];
                self.instant(ts, track, slice::FIRST_TOKEN, args, Vec::new())?;
            }
            Transition::Finished(reason) => {
                let args = vec![
                    arg_s(arg::FINISH_REASON, reason.name()),
                    arg_u(arg::OUTPUT_TOKENS, r.output_tokens),
                ];
                self.instant(ts, track, slice::FINISHED, args, vec![flow])?;
                if let Some(tl) = self.requests.remove(&key) {
                    let args = request_end_args(&tl, reason.name(), arg::CLOSED_BY_FINISHED);
                    self.end(ts, track, args)?;
                }
            }
            Transition::Arrived | Transition::Scheduled => {}
        }
        if let Some(p) = change.opened {
            self.begin(ts, track, p.name(), Vec::new(), Vec::new())?;
        }
        Ok(())
    }

    /// Closes the requests still open at `ts`: their phase and their request slice, with `closed_by` = `reason`.
    pub(super) fn close_requests(&mut self, ts: u64, reason: &str) -> io::Result<()> {
        let open: Vec<_> = std::mem::take(&mut self.requests).into_iter().collect();
        for ((pid, req), mut tl) in open {
            let track = self.request_track(pid, req, "")?;
            if tl.close_unfinished(ts).1.is_some() {
                self.end(ts, track, vec![arg_s(arg::CLOSED_BY, reason)])?;
            }
            let args = request_end_args(&tl, arg::UNFINISHED, reason);
            self.end(ts, track, args)?;
        }
        Ok(())
    }

    /// An NVTX-style push (a slice begins), pop (it ends) or mark (an instant).
    pub(super) fn range(&mut self, ev: &Event, rec: &RangeRecord) -> io::Result<()> {
        let ts = ev.ts_ns;
        let track = self.thread_track(ev.pid, ev.tid)?;
        let name = slice::range(read_str(&rec.domain), read_str(&rec.name));
        match RangeOp::from_raw(rec.op) {
            Some(RangeOp::Push) => {
                self.ranges
                    .entry((ev.pid, ev.tid))
                    .or_default()
                    .push(name.clone());
                let args = vec![arg_u(arg::STEP_ID, rec.step_id)];
                self.begin(ts, track, &name, args, Vec::new())
            }
            Some(RangeOp::Pop) => {
                let stack = self.ranges.entry((ev.pid, ev.tid)).or_default();
                if stack.pop().is_some() {
                    self.end(ts, track, Vec::new())
                } else {
                    // A pop whose push happened before we attached: nothing to close.
                    let args = vec![arg_s(arg::RANGE, name)];
                    self.instant(ts, track, slice::UNMATCHED_RANGE_POP, args, Vec::new())
                }
            }
            Some(RangeOp::Mark) => {
                let args = vec![arg_u(arg::STEP_ID, rec.step_id)];
                self.instant(ts, track, &name, args, Vec::new())
            }
            None => Ok(()),
        }
    }
}

/// The request slice's args at its start: what the request asked for.
fn request_begin_args(tl: &RequestTimeline) -> Vec<Arg> {
    let info = tl.info();
    let mut args = vec![
        arg_u(arg::REQ_ID, tl.req_id()),
        arg_u(arg::PROMPT_TOKENS, info.prompt_tokens),
        arg_u(arg::MAX_TOKENS, info.max_tokens),
        arg_f(arg::TEMPERATURE, f64::from(info.temperature)),
        arg_f(arg::TOP_P, f64::from(info.top_p)),
        arg_s(arg::MODEL, info.model.clone()),
        arg_s(arg::X_REQUEST_ID, info.x_request_id.clone()),
        arg_s(
            arg::ENDPOINT,
            if info.is_chat {
                arg::ENDPOINT_CHAT
            } else {
                arg::ENDPOINT_COMPLETIONS
            },
        ),
    ];
    if let Some(c) = &info.trace_context {
        args.push(arg_s(arg::TRACE_ID, hex(&c.trace_id)));
        args.push(arg_s(arg::PARENT_SPAN_ID, hex(&c.parent_span_id)));
    }
    if tl.attached_mid_request() {
        args.push(arg_b(arg::ATTACHED_MID_REQUEST, true));
    }
    args
}

/// The request slice's args at its end: what it got.
fn request_end_args(tl: &RequestTimeline, reason: &str, closed_by: &str) -> Vec<Arg> {
    let info = tl.info();
    let mut args = vec![
        arg_s(arg::FINISH_REASON, reason),
        arg_u(arg::PROMPT_TOKENS, info.prompt_tokens),
        arg_u(arg::OUTPUT_TOKENS, info.output_tokens),
        arg_u(arg::NUM_PREEMPTIONS, info.num_preemptions),
        arg_s(arg::CLOSED_BY, closed_by),
    ];
    if let Some(ttft) = tl.ttft_ns() {
        args.push(arg_f(arg::TTFT_MS, ttft as f64 / 1e6));
    }
    args
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
