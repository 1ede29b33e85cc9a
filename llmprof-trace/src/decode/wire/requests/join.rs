//! One request, two views: joining a wire request to the engine request it carried.
//!
//! An engine with llmprof's probes (llmserve) reports each request through its request records, and the
//! wire probe sees the same request on the engine's HTTP socket. Both views are kept (the engine's phases,
//! the wire's status, bytes and client-side timing), but they are one request: the wire view names the
//! engine request it carried (`EventBody::WireEnd::engine_req`), so `llmprof report` counts it once and the
//! OTel builder exports one span.
//!
//! The join is decided when the wire exchange ends (its response end, or its connection's close or reset),
//! among the engine requests of the **same process** not joined yet:
//! - with an `x-request-id` on the wire, the engine request with that id (a different non-empty id never
//!   joins);
//! - otherwise by timing: the engine request arrived inside the exchange (the engine's arrival is after the
//!   request's head was read) and, unless the client went away first, finished before the response ended;
//!   of those, the tightest fit (least time between the two starts plus between the two ends), which tells
//!   apart requests that overlap on several connections.
//!
//! The engine's records of a request come before the response's last write (the server writes it after the
//! engine finished), so a join never waits. Bounded: at most [`MAX_PER_PROCESS`] engine requests are kept per
//! process (the oldest go first: an engine request no wire exchange claimed, e.g. one submitted without HTTP).

use std::collections::{HashMap, VecDeque};

/// Most unjoined engine requests kept per process.
pub const MAX_PER_PROCESS: usize = 4096;

/// An engine request as the join sees it.
#[derive(Clone, Debug)]
struct Seen {
    id: u64,
    arrival_ns: u64,
    finish_ns: Option<u64>,
    x_request_id: String,
}

/// One wire exchange, ended.
#[derive(Clone, Copy, Debug)]
pub struct Exchange<'a> {
    /// When its first bytes arrived (or were read).
    pub start_ns: u64,
    /// When its response ended, or its connection closed.
    pub end_ns: u64,
    /// The client went away before the response ended (the engine may still be running it).
    pub cancelled: bool,
    /// Its `x-request-id` (empty: none).
    pub x_request_id: &'a str,
}

/// The engine requests of each process that no wire exchange claimed yet.
#[derive(Debug, Default)]
pub struct Joiner {
    by_pid: HashMap<u32, VecDeque<Seen>>,
}

impl Joiner {
    /// An engine request of `pid` arrived at `ts_ns`.
    pub fn arrived(&mut self, pid: u32, id: u64, ts_ns: u64, x_request_id: &str) {
        let q = self.by_pid.entry(pid).or_default();
        if q.iter().any(|s| s.id == id) {
            return;
        }
        if q.len() >= MAX_PER_PROCESS {
            q.pop_front();
        }
        q.push_back(Seen {
            id,
            arrival_ns: ts_ns,
            finish_ns: None,
            x_request_id: x_request_id.to_owned(),
        });
    }

    /// An engine request of `pid` finished at `ts_ns`.
    pub fn finished(&mut self, pid: u32, id: u64, ts_ns: u64) {
        if let Some(s) = self
            .by_pid
            .get_mut(&pid)
            .and_then(|q| q.iter_mut().find(|s| s.id == id))
        {
            s.finish_ns = Some(ts_ns);
        }
    }

    /// The process exited: its engine requests are forgotten.
    pub fn forget(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
    }

    /// The engine request of `pid` that the exchange `x` carried (see the module docs), taken out of the
    /// candidates; `None` when no engine request fits.
    pub fn take(&mut self, pid: u32, x: &Exchange<'_>) -> Option<u64> {
        let q = self.by_pid.get_mut(&pid)?;
        let fits = |s: &Seen| {
            s.arrival_ns >= x.start_ns
                && s.arrival_ns <= x.end_ns
                && (x.cancelled || s.finish_ns.is_some_and(|f| f <= x.end_ns))
        };
        let by_id = (!x.x_request_id.is_empty())
            .then(|| q.iter().position(|s| s.x_request_id == x.x_request_id && fits(s)))
            .flatten();
        let i = by_id.or_else(|| {
            q.iter()
                .enumerate()
                .filter(|(_, s)| fits(s))
                .filter(|(_, s)| x.x_request_id.is_empty() || s.x_request_id.is_empty())
                .min_by_key(|(_, s)| {
                    (s.arrival_ns - x.start_ns) + x.end_ns.saturating_sub(s.finish_ns.unwrap_or(x.end_ns))
                })
                .map(|(i, _)| i)
        })?;
        q.remove(i).map(|s| s.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(start_ns: u64, end_ns: u64) -> Exchange<'static> {
        Exchange {
            start_ns,
            end_ns,
            cancelled: false,
            x_request_id: "",
        }
    }

    #[test]
    fn overlapping_requests_join_the_tightest_exchange_of_their_process() {
        let mut j = Joiner::default();
        // Two connections at once: A [0, 100] carried engine 1 [10, 90]; B [5, 60] carried engine 2 [12, 50].
        j.arrived(7, 1, 10, "");
        j.arrived(7, 2, 12, "");
        j.finished(7, 2, 50);
        // Another process's request never joins process 7's exchange.
        j.arrived(8, 3, 11, "");
        j.finished(8, 3, 55);
        assert_eq!(
            j.take(7, &x(5, 60)),
            Some(2),
            "1 had not finished when B's response ended"
        );
        j.finished(7, 1, 90);
        assert_eq!(j.take(7, &x(0, 100)), Some(1));
        assert_eq!(j.take(7, &x(0, 100)), None, "each engine request joins once");
        // A GET /health on the same port carried no engine request.
        assert_eq!(j.take(8, &x(200, 201)), None);
    }

    #[test]
    fn an_x_request_id_decides_and_a_different_one_never_joins() {
        let mut j = Joiner::default();
        j.arrived(7, 1, 10, "a");
        j.finished(7, 1, 20);
        j.arrived(7, 2, 11, "b");
        j.finished(7, 2, 21);
        let mut ex = x(0, 30);
        ex.x_request_id = "b";
        assert_eq!(j.take(7, &ex), Some(2), "the id, not the tighter fit");
        ex.x_request_id = "c";
        assert_eq!(j.take(7, &ex), None);
    }

    #[test]
    fn a_cancelled_exchange_joins_the_engine_request_still_running() {
        let mut j = Joiner::default();
        j.arrived(7, 1, 10, "");
        let mut ex = x(0, 30);
        assert_eq!(
            j.take(7, &ex),
            None,
            "a finished exchange needs a finished engine request"
        );
        ex.cancelled = true;
        assert_eq!(j.take(7, &ex), Some(1));
    }

    #[test]
    fn the_candidates_are_bounded_per_process() {
        let mut j = Joiner::default();
        for id in 0..(MAX_PER_PROCESS as u64 + 10) {
            j.arrived(7, id, 100 + id, "");
        }
        assert_eq!(j.by_pid[&7].len(), MAX_PER_PROCESS);
        assert_eq!(j.by_pid[&7].front().map(|s| s.id), Some(10));
        j.forget(7);
        assert!(j.by_pid.is_empty());
    }
}
