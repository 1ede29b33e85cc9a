//! The wire probe's pure halves together: the kernel's response scanner (`llmprof_abi::scan_byte`, driven here
//! the way `profiler-ebpf/src/wire.rs` drives it, write by write) feeding the [`Reconstructor`].

use llmprof_abi::{
    FinishReason, HTTP_END_CHUNKED, HTTP_END_DONE, HTTP_END_LENGTH, HTTP_FLAG_HEAD_DONE, HttpConnState,
    HttpOp, RequestEventKind, Scan, WriteOutcome, counting_body, finish_write, read_str, scan_byte,
    start_response,
};

use super::*;

/// One connection as the kernel sees it: whether a response is under way, and its scanner state.
struct Sim {
    st: HttpConnState,
    in_response: bool,
    ts: u64,
    records: Vec<WireRecord>,
    /// Response bytes written so far.
    written: u64,
}

impl Sim {
    fn new() -> Self {
        Self {
            st: HttpConnState {
                conn: 7,
                remaining: -1,
                ..HttpConnState::default()
            },
            in_response: false,
            ts: 0,
            records: Vec::new(),
            written: 0,
        }
    }

    fn rec(&mut self, op: HttpOp) -> WireRecord {
        self.ts += 1_000_000;
        WireRecord {
            ts_ns: self.ts,
            pid: 1,
            tid: 1,
            fd: 5,
            conn: 7,
            op: Some(op),
            ..WireRecord::default()
        }
    }

    /// The server read a whole request head (and maybe a body).
    fn read(&mut self, head: &str) {
        self.in_response = false;
        let mut r = self.rec(HttpOp::RequestStart);
        let end = head.find("\r\n\r\n").map_or(head.len(), |i| i + 4);
        r.head = head.as_bytes()[..end].to_vec();
        r.flags = HTTP_FLAG_HEAD_DONE;
        self.records.push(r);
    }

    /// The server wrote `bytes` (one syscall): the kernel's `on_write`.
    fn write(&mut self, bytes: &str) -> WriteOutcome {
        let mut x = Scan {
            st: self.st,
            ..Scan::default()
        };
        if !self.in_response {
            start_response(&mut x.st);
            self.in_response = true;
        }
        let scanned = !counting_body(&x.st);
        if scanned {
            for (i, c) in bytes.bytes().enumerate() {
                scan_byte(c, i as u64, &mut x);
            }
        }
        let o = finish_write(&mut x, bytes.len() as u64, scanned);
        self.st = x.st;
        // Each record of a write carries the write's result, as the kernel's do.
        let ret = bytes.len() as i64;
        self.written += bytes.len() as u64;
        if o.response_start {
            let mut r = self.rec(HttpOp::ResponseStart);
            r.status = o.status;
            r.ret = ret;
            self.records.push(r);
        }
        if o.events > 0 {
            let mut r = self.rec(HttpOp::Sse);
            r.events = o.events;
            r.content_events = o.content;
            r.flags = o.flags;
            r.ret = ret;
            self.records.push(r);
        }
        if o.end != 0 {
            let mut r = self.rec(HttpOp::ResponseEnd);
            r.flags = o.end;
            r.ret = ret;
            self.records.push(r);
        }
        o
    }

    fn close(&mut self) {
        let r = self.rec(HttpOp::Close);
        self.records.push(r);
    }

    fn events(&self) -> Vec<Event> {
        let mut rc = Reconstructor::new();
        let mut out = Vec::new();
        for r in &self.records {
            rc.push(r.clone(), &mut out);
        }
        out
    }
}

const HEAD: &str = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n\
                    x-request-id: abc-1\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n\
                    Content-Length: 10\r\n\r\n{\"a\":\"b\"}";
const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
const ROLE: &str = r#"data: {"id": "c1", "model": "/models/m.gguf", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}"#;
const ROLE_ONLY: &str = r#"data: {"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}"#;
const FINISH: &str = r#"data: {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}"#;

fn token(t: &str) -> String {
    format!(
        r#"data: {{"id": "c1", "choices": [{{"index": 0, "delta": {{"content": "{t}"}}, "finish_reason": null}}]}}"#
    )
}

/// One SSE event as uvicorn writes it in chunked encoding: size line, event, blank line, chunk end.
fn chunk(event: &str) -> String {
    let body = format!("{event}\r\n\r\n");
    format!("{:x}\r\n{body}\r\n", body.len())
}

fn kinds(evs: &[Event]) -> Vec<String> {
    evs.iter()
        .map(|e| match &e.body {
            EventBody::Request(r) => format!("{:?}", RequestEventKind::from_raw(r.kind)),
            EventBody::WireToken { count, .. } => format!("tokens {count}"),
            EventBody::WireResponse { status, .. } => format!("status {status}"),
            EventBody::WireEnd { status, streamed, .. } => {
                format!("end {status}{}", if *streamed { " streamed" } else { "" })
            }
            EventBody::WireRequest { method, path, .. } => format!("{method} {path}"),
            other => other.kind_name().to_owned(),
        })
        .collect()
}

#[test]
fn head_keeps_method_path_and_the_two_headers_only() {
    let h = parse_head(HEAD.as_bytes()).unwrap();
    assert_eq!(h.method, "POST");
    assert_eq!(h.path, "/v1/chat/completions");
    assert_eq!(h.x_request_id, "abc-1");
    let (t, s, f) = h.traceparent.unwrap();
    assert_eq!(t[0], 0x4b);
    assert_eq!(s[7], 0xb7);
    assert_eq!(f, 1);
    assert!(!format!("{h:?}").contains("secret"), "no other header is kept");
    assert!(parse_head(b"\x16\x03\x01garbage").is_none());
    assert!(parse_head(b"{\"partial\": \"body\"}").is_none());
}

#[test]
fn role_only_first_chunk_is_not_the_first_token() {
    for first in [ROLE, ROLE_ONLY] {
        let mut s = Sim::new();
        s.read(HEAD);
        assert!(s.write(SSE_HEAD).response_start);
        let o = s.write(&chunk(first));
        assert_eq!((o.events, o.content), (1, 0), "{first}");
        let o = s.write(&chunk(&token("Hi")));
        assert_eq!((o.events, o.content), (1, 1));
        s.write(&chunk(&token(" there")));
        s.write(&chunk(FINISH));
        let o = s.write(&format!("{}0\r\n\r\n", chunk("data: [DONE]")));
        assert_eq!(o.end, HTTP_END_DONE | HTTP_END_CHUNKED);
        let evs = s.events();
        assert_eq!(
            kinds(&evs),
            [
                "Some(Arrived)",
                "POST /v1/chat/completions",
                "status 200",
                "Some(FirstToken)",
                "tokens 1",
                "end 200 streamed",
                "Some(Finished)"
            ]
        );
        let EventBody::Request(arrived) = &evs[0].body else {
            panic!()
        };
        assert_eq!(read_str(&arrived.x_request_id), "abc-1");
        assert_eq!(arrived.has_trace_context, 1);
        assert_eq!(arrived.is_chat, 1);
        let EventBody::WireEnd { bytes, .. } = &evs[5].body else {
            panic!()
        };
        assert_eq!(*bytes, Some(s.written), "every write of the stream, each once");
        let EventBody::Request(fin) = &evs[6].body else {
            panic!()
        };
        assert_eq!(fin.output_tokens, 2);
        assert_eq!(fin.finish_reason, FinishReason::Stop as u32);
        // The first token's time is the write that carried "Hi" (records are 1 ms apart from the first read).
        assert!(evs[3].ts_ns > evs[2].ts_ns);
    }
}

#[test]
fn events_split_across_writes_and_several_in_one_write() {
    let mut s = Sim::new();
    s.read(HEAD);
    s.write(SSE_HEAD);
    // One event cut in three writes (in the middle of `data:`, of the key and of the value).
    let ev = chunk(&token("Hello"));
    let (a, rest) = ev.split_at(9);
    let (b, c) = rest.split_at(rest.find("ntent").unwrap() + 2);
    assert_eq!(s.write(a).events, 0);
    assert_eq!(s.write(b).events, 0);
    let o = s.write(c);
    assert_eq!((o.events, o.content), (1, 1));
    // Three events in one write: two with content, one role-only.
    let many = format!("{}{}{}", chunk(ROLE_ONLY), chunk(&token("a")), chunk(&token("b")));
    let o = s.write(&many);
    assert_eq!((o.events, o.content), (3, 2));
    let evs = s.events();
    assert!(kinds(&evs).contains(&"tokens 2".to_owned()), "{:?}", kinds(&evs));
}

#[test]
fn escaped_quotes_and_keys_inside_values_do_not_fool_the_scanner() {
    let mut s = Sim::new();
    s.read(HEAD);
    s.write(SSE_HEAD);
    // A role-only chunk whose id mentions content, then an empty content with escapes elsewhere.
    let tricky =
        r#"data: {"id": "\"content\": \"x\"", "choices": [{"delta": {"role": "assistant", "content": ""}}]}"#;
    assert_eq!(s.write(&chunk(tricky)).content, 0);
    let esc = r#"data: {"choices": [{"delta": {"content": "\"quoted\""}}]}"#;
    assert_eq!(s.write(&chunk(esc)).content, 1);
    let tool = r#"data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}}]}"#;
    assert_eq!(s.write(&chunk(tool)).content, 1);
    let no_tool = r#"data: {"choices": [{"delta": {"tool_calls": []}}]}"#;
    assert_eq!(s.write(&chunk(no_tool)).content, 0);
    let text = r#"data: {"choices": [{"text": "x", "index": 0}]}"#;
    assert_eq!(s.write(&chunk(text)).content, 1);
}

#[test]
fn keep_alive_requests_and_a_non_streaming_json_response() {
    let mut s = Sim::new();
    // 1: a JSON response with Content-Length, head and body in separate writes.
    s.read(HEAD);
    let body = r#"{"choices": [{"message": {"role": "assistant", "content": "Paris"}}]}"#;
    let o = s.write(&format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
        body.len()
    ));
    assert!(o.response_start && o.end == 0);
    let o = s.write(body);
    assert_eq!((o.events, o.end), (0, HTTP_END_LENGTH), "a JSON body is not SSE");
    // 2: head and body in one write.
    s.read(HEAD);
    let o = s.write(&format!(
        "HTTP/1.1 404 Not Found\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ));
    assert_eq!((o.status, o.end), (404, HTTP_END_LENGTH));
    // 3: a stream on the same connection.
    s.read(HEAD);
    s.write(SSE_HEAD);
    s.write(&chunk(&token("x")));
    s.write("0\r\n\r\n");
    let evs = s.events();
    let finished = evs
        .iter()
        .filter(|e| matches!(&e.body, EventBody::Request(r) if r.kind == RequestEventKind::Finished as u32))
        .count();
    assert_eq!(finished, 3);
    let first_tokens = kinds(&evs).iter().filter(|k| *k == "Some(FirstToken)").count();
    assert_eq!(first_tokens, 1, "only the stream has a first token");
    let ids: HashSet<u64> = evs
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::Request(r) => Some(r.req_id),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 3, "three requests on one connection");
    assert!(ids.iter().all(|&i| i > WIRE_REQ_BASE));
}

#[test]
fn a_connection_closed_mid_stream_is_a_cancelled_request() {
    let mut s = Sim::new();
    s.read(HEAD);
    s.write(SSE_HEAD);
    s.write(&chunk(&token("x")));
    s.close();
    let evs = s.events();
    let EventBody::Request(last) = &evs.last().unwrap().body else {
        panic!()
    };
    assert_eq!(last.kind, RequestEventKind::Finished as u32);
    assert_eq!(last.finish_reason, FinishReason::Abort as u32);
}

#[test]
fn tls_is_reported_once_per_process_and_llmprofs_own_scrapes_are_left_out() {
    let own = std::sync::Arc::new(OwnConns::default());
    let mut rc = Reconstructor::with_own(own.clone());
    let mut out = Vec::new();
    for conn in [1, 2] {
        let r = WireRecord {
            pid: 3,
            conn,
            op: Some(HttpOp::Tls),
            ..WireRecord::default()
        };
        rc.push(r, &mut out);
    }
    assert_eq!(out.len(), 1);
    assert!(matches!(&out[0].body, EventBody::Marker { text } if text.contains("TLS")));
    out.clear();
    // llmprof's scraper registered the server's end of its connection (fd 5 of pid 3) from t=100 to t=200.
    own.open(3, 5, 100);
    own.close(3, 5, 200);
    let scrape = |conn: u64, fd: i32, ts_ns: u64| WireRecord {
        pid: 3,
        fd,
        conn,
        ts_ns,
        op: Some(HttpOp::RequestStart),
        flags: HTTP_FLAG_HEAD_DONE,
        head: b"GET /metrics HTTP/1.0\r\nHost: h\r\nUser-Agent: llmprof\r\n\r\n".to_vec(),
        ..WireRecord::default()
    };
    rc.push(scrape(9, 5, 150), &mut out);
    assert!(out.is_empty());
    assert_eq!((rc.stats.requests, rc.stats.own), (0, 1));
    // The same head from a client (another fd, or that fd reused after llmprof's connection ended) is a
    // request like any other: the header hides nothing.
    rc.push(scrape(10, 6, 150), &mut out);
    rc.push(scrape(11, 5, 250), &mut out);
    assert_eq!((rc.stats.requests, rc.stats.own), (2, 1));
    assert!(!out.is_empty());
    // The server closed llmprof's connection and gave its fd to a client's before the scraper, slow to wake
    // up, ended the span: the client's request is the server's.
    own.open(3, 7, 300);
    rc.push(scrape(12, 7, 310), &mut out);
    rc.push(
        WireRecord {
            pid: 3,
            fd: 7,
            conn: 12,
            ts_ns: 320,
            op: Some(HttpOp::Close),
            ..WireRecord::default()
        },
        &mut out,
    );
    rc.push(scrape(13, 7, 330), &mut out);
    own.close(3, 7, 400);
    assert_eq!((rc.stats.requests, rc.stats.own), (3, 2));
}

#[test]
fn a_wire_request_becomes_an_otel_span_parented_on_the_callers_traceparent() {
    use opentelemetry::trace::{SpanId, TraceId};
    let mut s = Sim::new();
    s.read(HEAD);
    s.write(SSE_HEAD);
    s.write(&chunk(ROLE));
    s.write(&chunk(&token("Hi")));
    s.write(&chunk(&token("!")));
    s.write("0\r\n\r\n");
    let mut b =
        crate::otel::SpanBuilder::new(crate::clock::WallClock::with_offset(1_700_000_000_000_000_000));
    let mut spans = Vec::new();
    for e in s.events() {
        b.on_event(&e, &mut spans);
    }
    let req = spans.first().expect("a span for the wire request");
    let (t, p, _) = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
    assert_eq!(req.span_context.trace_id(), TraceId::from_bytes(t));
    assert_eq!(req.parent_span_id, SpanId::from_bytes(p));
    assert!(req.parent_span_is_remote);
}

#[test]
fn a_request_starts_when_its_bytes_arrived_and_says_how_long_they_waited() {
    let ttft = |arrival_before_read: Option<u64>| {
        let mut s = Sim::new();
        s.ts = 100_000_000;
        s.read(HEAD);
        let read_ns = s.records[0].ts_ns;
        s.records[0].arrival_ns = arrival_before_read.map_or(0, |d| read_ns - d);
        s.write(SSE_HEAD);
        s.write(&chunk(&token("Hi")));
        let evs = s.events();
        let wait = evs.iter().find_map(|e| match &e.body {
            EventBody::WireRequest { socket_wait_ns, .. } => Some(*socket_wait_ns),
            _ => None,
        });
        let at = |k: RequestEventKind| {
            evs.iter()
                .find(|e| matches!(&e.body, EventBody::Request(r) if RequestEventKind::from_raw(r.kind) == Some(k)))
                .map(|e| e.ts_ns)
                .unwrap()
        };
        (
            at(RequestEventKind::FirstToken) - at(RequestEventKind::Arrived),
            wait.unwrap(),
        )
    };
    let (read_based, none) = ttft(None);
    assert_eq!(none, None, "no arrival seen: the request starts at the read");
    let (arrival_based, wait) = ttft(Some(4_000_000));
    assert_eq!(wait, Some(4_000_000), "4 ms in the server's socket");
    assert_eq!(arrival_based, read_based + 4_000_000, "the wait is part of TTFT");
    // A stamp after the read (a clock oddity) is not believed.
    let mut s = Sim::new();
    s.read(HEAD);
    s.records[0].arrival_ns = s.records[0].ts_ns + 1;
    let evs = s.events();
    assert!(evs.iter().any(|e| matches!(
        &e.body,
        EventBody::WireRequest {
            socket_wait_ns: None,
            ..
        }
    )));
}

fn finished(evs: &[Event]) -> Vec<FinishReason> {
    evs.iter()
        .filter_map(|e| match &e.body {
            EventBody::Request(r) if r.kind == RequestEventKind::Finished as u32 => {
                Some(FinishReason::from_raw(r.finish_reason))
            }
            _ => None,
        })
        .collect()
}

fn ends(evs: &[Event]) -> Vec<(u32, Option<u64>, bool, Option<u64>)> {
    evs.iter()
        .filter_map(|e| match &e.body {
            EventBody::WireEnd {
                status,
                bytes,
                streamed,
                engine_req,
                ..
            } => Some((*status, *bytes, *streamed, *engine_req)),
            _ => None,
        })
        .collect()
}

#[test]
fn every_request_has_its_status_and_a_4xx_or_5xx_is_failed_not_finished() {
    let mut s = Sim::new();
    let body = r#"{"error": {"message": "The model `x` does not exist.", "code": "model_not_found"}}"#;
    s.read(HEAD);
    let resp = format!(
        "HTTP/1.1 404 Not Found\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write(&resp);
    s.read(HEAD);
    let ok = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
    s.write(ok);
    s.read(HEAD);
    let unavailable = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n";
    s.write(unavailable);
    let mut evs = Vec::new();
    let mut rc = Reconstructor::new();
    for r in s.records.clone() {
        rc.push(r, &mut evs);
    }
    assert_eq!(
        finished(&evs),
        [FinishReason::Error, FinishReason::Stop, FinishReason::Error]
    );
    let e = ends(&evs);
    assert_eq!(e.iter().map(|x| x.0).collect::<Vec<_>>(), [404, 200, 503]);
    let sizes: Vec<Option<u64>> = e.iter().map(|x| x.1).collect();
    assert_eq!(
        sizes,
        [
            Some(resp.len() as u64),
            Some(ok.len() as u64),
            Some(unavailable.len() as u64)
        ]
    );
    assert!(e.iter().all(|x| !x.2), "none streamed: {e:?}");
    assert_eq!(rc.stats.failed, 2);
}

#[test]
fn the_engine_request_a_wire_exchange_carried_is_named_at_its_end() {
    // No x-request-id: the engine's request 9 arrived and finished inside the exchange, in the same process.
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut s = Sim::new();
    s.read(head);
    s.write(SSE_HEAD);
    s.write(&chunk(&token("x")));
    let mut rc = Reconstructor::new();
    let mut evs = Vec::new();
    let recs = s.records.clone();
    let t0 = recs[0].ts_ns;
    for r in recs {
        rc.push(r, &mut evs);
    }
    let engine = |kind, ts| Event {
        ts_ns: ts,
        pid: 1,
        tid: 9,
        body: EventBody::Request(Box::new(RequestRecord::new(kind, 9, ts))),
    };
    rc.engine(&engine(RequestEventKind::Arrived, t0 + 10));
    rc.engine(&engine(RequestEventKind::Finished, s.ts + 10));
    s.records.clear();
    s.write(&format!("{}0\r\n\r\n", chunk("data: [DONE]")));
    for r in s.records.clone() {
        rc.push(r, &mut evs);
    }
    let e = ends(&evs);
    assert_eq!((e[0].0, e[0].2, e[0].3), (200, true, Some(9)), "{e:?}");
    assert_eq!(rc.stats.joined, 1);
}
