//! Requests seen on the wire: the HTTP wire probe's records turned into the same request events the engine's
//! probes give, so every consumer (Perfetto sink, OTel builder, `llmprof report`, `serve`) handles requests of
//! any HTTP/1.1 server without knowing where they came from.
//!
//! Owns the per-connection reconstruction (pure: records in, events out; no kernel, no clock). A connection's
//! exchanges are sequential (HTTP/1.1 without pipelining): a request starts at its first byte read, its head
//! gives the method, path, `traceparent` and `x-request-id` (every other header is dropped here, never
//! stored), the response's first content-carrying SSE event is the first token, each later content event a
//! token, and the response's end (or the connection's close or reset before it: a cancelled request) the
//! finish. Each request becomes:
//! - `EventBody::Request` records: `Arrived` at its first byte, `FirstToken` at its first content event,
//!   `Finished` with the content events as output tokens: `stop`, `error` when the status is 4xx or 5xx (a
//!   failed request is never a finished one), or `abort` when the client went away first;
//! - `EventBody::WireToken` for every content event after the first (the outside view of each token or chunk:
//!   `llmprof report`'s wire inter-token latencies), `EventBody::WireResponse` at the response's status line
//!   and `EventBody::WireEnd` at its end (status, bytes, whether it streamed, and the engine request it
//!   carried: [`join`]).
//!
//! Wire requests get ids from [`WIRE_REQ_BASE`] up, apart from any engine's own ids in the same process.
//! TLS and HTTP/2 connections are reported once per process as a marker and not followed.

use std::collections::{HashMap, HashSet};

use llmprof_abi::{
    FinishReason, HTTP_FLAG_HEAD_CUT, HTTP_FLAG_HEAD_DONE, HttpOp, REQUEST_ID_LEN, RequestEventKind,
    RequestRecord, fill_str,
};

use crate::event::{Event, EventBody, WIRE_REQ_BASE};

pub mod join;

/// The `User-Agent` of llmprof's own HTTP requests (`profiler-user/src/metrics_scrape.rs`): it names llmprof
/// in a server's logs; it hides nothing from the wire view (any client can send it): [`OwnConns`] does.
pub const LLMPROF_USER_AGENT: &str = "llmprof";

/// Most of llmprof's own connections remembered (a scrape every 500 ms: many minutes of them).
const OWN_MAX: usize = 1024;

/// One of llmprof's own connections to a traced server, as the server holds it: its process, the fd of its
/// end, and the span of time it was llmprof's (`until_ns` = `u64::MAX` while open).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnConn {
    /// The server's process.
    pub pid: u32,
    /// The server's fd of the connection.
    pub fd: i32,
    /// From (BOOTTIME ns): before llmprof sent anything on it.
    pub from_ns: u64,
    /// Until (BOOTTIME ns): after llmprof closed it.
    pub until_ns: u64,
}

/// llmprof's own connections to the traced servers (its /metrics scraper), told apart by what no client can
/// forge: llmprof's scraper finds the server's end of the connection it opened, by its own socket's port
/// (which no other process can hold meanwhile), before it sends its request, and registers it here. A
/// request read on such an fd during that span is llmprof's ([`WireStats::own`]); a `User-Agent: llmprof`
/// from anyone else is an ordinary request. Shared by the scraper and every [`Reconstructor`].
#[derive(Debug, Default)]
pub struct OwnConns {
    entries: std::sync::Mutex<Vec<OwnConn>>,
}

impl OwnConns {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<OwnConn>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers the server's end `(pid, fd)` of a connection llmprof opened, from `from_ns` on.
    pub fn open(&self, pid: u32, fd: i32, from_ns: u64) {
        let mut e = self.lock();
        if e.len() >= OWN_MAX {
            e.remove(0);
        }
        e.push(OwnConn {
            pid,
            fd,
            from_ns,
            until_ns: u64::MAX,
        });
    }

    /// llmprof closed its connection whose server end is `(pid, fd)`, at `until_ns`.
    pub fn close(&self, pid: u32, fd: i32, until_ns: u64) {
        if let Some(c) = self
            .lock()
            .iter_mut()
            .rev()
            .find(|c| c.pid == pid && c.fd == fd && c.until_ns == u64::MAX)
        {
            c.until_ns = until_ns;
        }
    }

    /// The server closed `fd` at `ts_ns`: an open span of that fd ends there, whatever llmprof's scraper saw
    /// (the fd may be handed to a client's connection before the scraper, woken by the end of its response,
    /// gets to [`Self::close`]).
    pub fn server_closed(&self, pid: u32, fd: i32, ts_ns: u64) {
        for c in self
            .lock()
            .iter_mut()
            .filter(|c| c.pid == pid && c.fd == fd && c.from_ns <= ts_ns && ts_ns < c.until_ns)
        {
            c.until_ns = ts_ns;
        }
    }

    /// Whether what `pid` read on `fd` at `ts_ns` came over one of llmprof's own connections.
    pub fn is_own(&self, pid: u32, fd: i32, ts_ns: u64) -> bool {
        self.lock()
            .iter()
            .any(|c| c.pid == pid && c.fd == fd && c.from_ns <= ts_ns && ts_ns <= c.until_ns)
    }
}

/// Most head bytes kept per connection while a head spans several reads.
const HEAD_KEEP: usize = 16 << 10;

/// One wire-probe record, decoded (`llmprof_abi::HttpEvent` / `HttpHeadEvent`).
#[derive(Clone, Debug, Default)]
pub struct WireRecord {
    /// When (the syscall's exit), BOOTTIME ns.
    pub ts_ns: u64,
    /// Process and thread.
    pub pid: u32,
    /// See `pid`.
    pub tid: u32,
    /// The connection's fd.
    pub fd: i32,
    /// Connection id (unique in the session).
    pub conn: u64,
    /// What happened (`None`: an op this llmprof does not know; ignored).
    pub op: Option<HttpOp>,
    /// `HTTP_*` flag bits.
    pub flags: u32,
    /// Status code (`ResponseStart`).
    pub status: u32,
    /// SSE events the write ended, and those with content (`Sse`).
    pub events: u32,
    /// See `events`.
    pub content_events: u32,
    /// The syscall's result.
    pub ret: i64,
    /// `RequestStart`: when the request's first bytes arrived in the server's socket (BOOTTIME ns, before
    /// `ts_ns`), 0 when unknown.
    pub arrival_ns: u64,
    /// Request head bytes (`RequestStart` / `RequestHead`), cut at the blank line by the kernel.
    pub head: Vec<u8>,
}

/// What a request head says that llmprof keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Head {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The request target (path and query).
    pub path: String,
    /// `x-request-id`.
    pub x_request_id: String,
    /// `traceparent`: trace id, parent span id, flags.
    pub traceparent: Option<([u8; 16], [u8; 8], u8)>,
}

/// Parses a request head (request line and headers); keeps only what [`Head`] holds. `None` when the first
/// line is not an HTTP/1.x request line.
pub fn parse_head(bytes: &[u8]) -> Option<Head> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path, version) = (first.next()?, first.next()?, first.next()?);
    if !version.starts_with("HTTP/1.") || method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase())
    {
        return None;
    }
    let mut head = Head {
        method: method.to_owned(),
        path: path.to_owned(),
        ..Head::default()
    };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("x-request-id") {
            head.x_request_id = value.chars().take(REQUEST_ID_LEN).collect();
        } else if name.eq_ignore_ascii_case("traceparent") {
            head.traceparent = parse_traceparent(value);
        }
    }
    Some(head)
}

/// A W3C `traceparent` (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`).
pub fn parse_traceparent(v: &str) -> Option<([u8; 16], [u8; 8], u8)> {
    let p: Vec<&str> = v.split('-').collect();
    if p.len() < 4 || p[0].len() != 2 || p[1].len() != 32 || p[2].len() != 16 || p[3].len() != 2 {
        return None;
    }
    let hex = |s: &str, out: &mut [u8]| -> Option<()> {
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(())
    };
    let (mut t, mut s, mut f) = ([0u8; 16], [0u8; 8], [0u8; 1]);
    hex(p[1], &mut t)?;
    hex(p[2], &mut s)?;
    hex(p[3], &mut f)?;
    (t != [0; 16] && s != [0; 8]).then_some((t, s, f[0]))
}

/// The request in flight on a connection.
#[derive(Debug)]
struct Req {
    id: u64,
    /// When its bytes arrived in the server's socket (or, not known, when the server read them).
    start_ns: u64,
    /// How long its first bytes waited in the socket before the server read them (`None`: arrival unknown).
    socket_wait_ns: Option<u64>,
    head: Vec<u8>,
    arrived: bool,
    content: u32,
    last_ns: u64,
    /// Its `x-request-id` (for the join).
    x_request_id: String,
    /// The response's status (0: no status line seen).
    status: u32,
    /// SSE events the response carried (a streamed response has some).
    sse_events: u32,
    /// Bytes of the response's writes that left a record (its status line, its SSE events, its end).
    resp_bytes: u64,
    /// The last response record counted (op and the write's result): one write leaves up to three records.
    last_write: Option<(HttpOp, i64)>,
}

impl Req {
    /// Adds a response write's bytes, once per write: the kernel writes a write's records back to back, in the
    /// order status line, SSE events, end, each with the write's result.
    fn count_write(&mut self, r: &WireRecord) {
        let Some(op) = r.op else { return };
        let rank = |o: HttpOp| match o {
            HttpOp::ResponseStart => 0,
            HttpOp::Sse => 1,
            _ => 2,
        };
        let same_write = self
            .last_write
            .is_some_and(|(prev, ret)| ret == r.ret && rank(prev) < rank(op));
        if !same_write {
            self.resp_bytes += u64::try_from(r.ret).unwrap_or(0);
        }
        self.last_write = Some((op, r.ret));
    }
}

#[derive(Debug, Default)]
struct Conn {
    req: Option<Req>,
}

/// Turns wire records into request events. Feed records in stream order with [`Reconstructor::push`].
#[derive(Debug, Default)]
pub struct Reconstructor {
    conns: HashMap<(u32, u64), Conn>,
    next: u64,
    /// (pid, op) already reported (TLS, HTTP/2).
    noted: HashSet<(u32, u32)>,
    /// llmprof's own connections (none known: every request is the server's).
    own: Option<std::sync::Arc<OwnConns>>,
    /// The engine requests a wire request may have carried.
    engine: join::Joiner,
    /// Requests started, finished, cancelled.
    pub stats: WireStats,
}

/// What the reconstruction saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireStats {
    /// Requests started.
    pub requests: u64,
    /// Requests whose connection closed or reset before the response ended.
    pub cancelled: u64,
    /// Heads that were not an HTTP/1.x request (dropped).
    pub not_http: u64,
    /// llmprof's own requests (its /metrics scraper), left out.
    pub own: u64,
    /// Requests answered with a 4xx or 5xx status.
    pub failed: u64,
    /// Requests joined to the engine request they carried (one request, two views).
    pub joined: u64,
}

impl Reconstructor {
    /// A reconstructor with no connection known.
    pub fn new() -> Self {
        Self::default()
    }

    /// A reconstructor that leaves out the requests of llmprof's own connections in `own`.
    pub fn with_own(own: std::sync::Arc<OwnConns>) -> Self {
        Self {
            own: Some(own),
            ..Self::default()
        }
    }

    /// Sees an event of the engine's own probes: its request records are what a wire request may carry
    /// ([`join`]); a process's exit forgets them.
    pub fn engine(&mut self, ev: &Event) {
        match &ev.body {
            EventBody::Request(rec) if !crate::names::slice::is_wire_request(rec.req_id) => {
                match RequestEventKind::from_raw(rec.kind) {
                    Some(RequestEventKind::Arrived) => self.engine.arrived(
                        ev.pid,
                        rec.req_id,
                        ev.ts_ns,
                        llmprof_abi::read_str(&rec.x_request_id),
                    ),
                    Some(RequestEventKind::Finished) => self.engine.finished(ev.pid, rec.req_id, ev.ts_ns),
                    _ => {}
                }
            }
            EventBody::ProcessExit { .. } => self.engine.forget(ev.pid),
            _ => {}
        }
    }

    /// Applies one record; appends the events it produces to `out`.
    pub fn push(&mut self, r: WireRecord, out: &mut Vec<Event>) {
        let Some(op) = r.op else { return };
        let key = (r.pid, r.conn);
        match op {
            HttpOp::RequestStart => {
                let conn = self.conns.entry(key).or_default();
                let prev = conn.req.take();
                if let Some(prev) = prev {
                    // The previous exchange's end was not seen: it ended with its last write.
                    let at = prev.last_ns;
                    self.finish(&r, prev, at, false, None, out);
                }
                self.next += 1;
                self.stats.requests += 1;
                let conn = self.conns.entry(key).or_default();
                let arrived = (r.arrival_ns != 0 && r.arrival_ns <= r.ts_ns).then_some(r.arrival_ns);
                conn.req = Some(Req {
                    id: WIRE_REQ_BASE + self.next,
                    start_ns: arrived.unwrap_or(r.ts_ns),
                    socket_wait_ns: arrived.map(|a| r.ts_ns - a),
                    head: r.head.clone(),
                    arrived: false,
                    content: 0,
                    last_ns: r.ts_ns,
                    x_request_id: String::new(),
                    status: 0,
                    sse_events: 0,
                    resp_bytes: 0,
                    last_write: None,
                });
                if r.flags & (HTTP_FLAG_HEAD_DONE | HTTP_FLAG_HEAD_CUT) != 0 {
                    self.arrive(key, &r, out);
                }
            }
            HttpOp::RequestHead => {
                let Some(req) = self.req(key) else { return };
                if req.head.len() < HEAD_KEEP {
                    req.head.extend_from_slice(&r.head);
                }
                if r.flags & (HTTP_FLAG_HEAD_DONE | HTTP_FLAG_HEAD_CUT) != 0 {
                    self.arrive(key, &r, out);
                }
            }
            HttpOp::ResponseStart => {
                self.arrive(key, &r, out);
                let Some(req) = self.req(key) else { return };
                req.last_ns = r.ts_ns;
                req.status = r.status;
                req.count_write(&r);
                let id = req.id;
                out.push(ev(
                    &r,
                    EventBody::WireResponse {
                        req_id: id,
                        status: r.status,
                    },
                ));
            }
            HttpOp::Sse => {
                self.arrive(key, &r, out);
                let Some(req) = self.req(key) else { return };
                req.last_ns = r.ts_ns;
                req.sse_events = req.sse_events.saturating_add(r.events);
                req.count_write(&r);
                let mut n = r.content_events;
                if n == 0 {
                    return;
                }
                let id = req.id;
                if req.content == 0 {
                    let rec = RequestRecord::new(RequestEventKind::FirstToken, id, r.ts_ns);
                    out.push(ev(&r, EventBody::Request(Box::new(rec))));
                    n -= 1;
                }
                req.content += r.content_events;
                if n > 0 {
                    out.push(ev(&r, EventBody::WireToken { req_id: id, count: n }));
                }
            }
            HttpOp::ResponseEnd => {
                self.arrive(key, &r, out);
                if let Some(mut req) = self.conns.get_mut(&key).and_then(|c| c.req.take()) {
                    req.count_write(&r);
                    let bytes = req.resp_bytes;
                    self.finish(&r, req, r.ts_ns, false, Some(bytes), out);
                }
            }
            HttpOp::Close | HttpOp::Reset => {
                let req = self.conns.get_mut(&key).and_then(|c| c.req.take());
                if op == HttpOp::Close {
                    self.conns.remove(&key);
                    if let Some(own) = &self.own {
                        own.server_closed(r.pid, r.fd, r.ts_ns);
                    }
                }
                if let Some(req) = req {
                    if !req.arrived {
                        // Nothing but a first read before the client went away: not a request.
                        return;
                    }
                    self.stats.cancelled += 1;
                    self.finish(&r, req, r.ts_ns, true, None, out);
                }
            }
            HttpOp::Tls | HttpOp::Http2 => {
                self.conns.remove(&key);
                if self.noted.insert((r.pid, op as u32)) {
                    let what = if op == HttpOp::Tls {
                        "TLS (encrypted inside the process: requests on it are not decoded)"
                    } else {
                        "HTTP/2 (not decoded: the wire probe reads HTTP/1.1)"
                    };
                    let text = crate::names::marker::wire_not_decoded(r.pid, r.fd, what);
                    out.push(ev(&r, EventBody::Marker { text }));
                }
            }
        }
    }

    fn req(&mut self, key: (u32, u64)) -> Option<&mut Req> {
        self.conns.get_mut(&key)?.req.as_mut()
    }

    /// The request's head is complete (or will not be): its `Arrived` record, at its first byte.
    fn arrive(&mut self, key: (u32, u64), r: &WireRecord, out: &mut Vec<Event>) {
        let Some(conn) = self.conns.get_mut(&key) else {
            return;
        };
        let Some(req) = conn.req.as_mut() else { return };
        if req.arrived {
            return;
        }
        let Some(head) = parse_head(&req.head) else {
            // Not a request line (a connection seeded mid-exchange, or not HTTP): forget it.
            conn.req = None;
            self.stats.not_http += 1;
            return;
        };
        if self.own.as_ref().is_some_and(|o| o.is_own(r.pid, r.fd, r.ts_ns)) {
            conn.req = None;
            self.stats.requests -= 1;
            self.stats.own += 1;
            return;
        }
        req.arrived = true;
        req.head = Vec::new();
        req.x_request_id.clone_from(&head.x_request_id);
        let mut rec = RequestRecord::new(RequestEventKind::Arrived, req.id, req.start_ns);
        rec.is_chat = u8::from(head.path.contains("/chat/completions"));
        rec.x_request_id = fill_str::<REQUEST_ID_LEN>(&head.x_request_id);
        if let Some((t, s, f)) = head.traceparent {
            rec.trace_id = t;
            rec.parent_span_id = s;
            rec.trace_flags = f;
            rec.has_trace_context = 1;
        }
        let mut e = ev(r, EventBody::Request(Box::new(rec)));
        e.ts_ns = req.start_ns;
        out.push(e);
        out.push(Event {
            ts_ns: req.start_ns,
            pid: r.pid,
            tid: r.tid,
            body: EventBody::WireRequest {
                req_id: req.id,
                method: head.method,
                path: head.path,
                socket_wait_ns: req.socket_wait_ns,
            },
        });
    }
}

fn ev(r: &WireRecord, body: EventBody) -> Event {
    Event {
        ts_ns: r.ts_ns,
        pid: r.pid,
        tid: r.tid,
        body,
    }
}

impl Reconstructor {
    /// The exchange `req` ended at `at` (`cancelled`: the client went away first; `bytes`: the response's, when
    /// its end was seen): its end (status, bytes, whether it streamed, the engine request it carried) and its
    /// `Finished` record.
    fn finish(
        &mut self,
        r: &WireRecord,
        req: Req,
        at: u64,
        cancelled: bool,
        bytes: Option<u64>,
        out: &mut Vec<Event>,
    ) {
        if !req.arrived {
            return;
        }
        let failed = req.status >= 400;
        self.stats.failed += u64::from(failed);
        let engine_req = self.engine.take(
            r.pid,
            &join::Exchange {
                start_ns: req.start_ns,
                end_ns: at,
                cancelled,
                x_request_id: &req.x_request_id,
            },
        );
        self.stats.joined += u64::from(engine_req.is_some());
        let mut end = ev(
            r,
            EventBody::WireEnd {
                req_id: req.id,
                status: req.status,
                bytes,
                streamed: req.sse_events > 0,
                engine_req,
            },
        );
        end.ts_ns = at;
        out.push(end);
        let reason = if cancelled {
            FinishReason::Abort
        } else if failed {
            FinishReason::Error
        } else {
            FinishReason::Stop
        };
        let mut rec = RequestRecord::new(RequestEventKind::Finished, req.id, at);
        rec.finish_reason = reason as u32;
        rec.output_tokens = req.content;
        let mut e = ev(r, EventBody::Request(Box::new(rec)));
        e.ts_ns = at;
        out.push(e);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests;
