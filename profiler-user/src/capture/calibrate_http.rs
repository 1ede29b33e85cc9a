//! Start-up calibration of the HTTP wire probe: what one followed request and one followed SSE write cost the
//! target, measured on this machine like the other probes ([`super::calibrate`]).
//!
//! llmprof, traced for the calibration, plays an HTTP server over two socket pairs: on one the server end is in
//! `HTTP_CONNS` (followed, as an accepted connection of a target would be), on the other it is not. Both run the
//! same syscalls, so the difference of their median rounds is the probe alone: per request, the head read (its
//! copy and the `bpf_loop` to the blank line, the head record) plus a small JSON response (status, length,
//! end records); per SSE write, the response scanner over a typical OpenAI chat chunk (~230 bytes: one
//! `bpf_loop` step per byte) and its record. The peers are drained in the same rounds, untimed differences
//! cancel. Afterwards the connections leave the map and the sockets are closed; the records are discarded
//! with the rest of the calibration's.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use aya::maps::HashMap;
use llmprof_abi::{HTTP_CONNS_MAP, HttpConnState, SockKey};

use super::error::CaptureError;
use super::object::{map_err, map_mut};
use super::rounds::median_round;

/// Requests (head read + JSON response) per timed round.
const REQUESTS_PER_ROUND: u32 = 60;
/// SSE writes per timed round.
const WRITES_PER_ROUND: u32 = 120;

const REQUEST: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\
    User-Agent: OpenAI/Python 1.60.0\r\nAccept: application/json\r\nContent-Type: application/json\r\n\
    Content-Length: 2\r\nx-request-id: 0d3f1a52-7c4e-4b8e-9a0a-4f2e8d6c1b3a\r\n\r\n{}";
const JSON_RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
const SSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";
const SSE_CHUNK: &[u8] = br#"data: {"id":"chatcmpl-3f1a527c4e4b8e9a","object":"chat.completion.chunk","created":1764150000,"model":"default","system_fingerprint":null,"choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null}]}

"#;

/// What the calibration measured, ns per hit.
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpCost {
    /// A followed request: head read and a small JSON response.
    pub request_ns: f64,
    /// A followed SSE write of a typical chat chunk.
    pub sse_write_ns: f64,
}

/// One server end and its client peer.
struct Pair {
    server: UnixStream,
    client: UnixStream,
}

impl Pair {
    fn new() -> Result<Self, CaptureError> {
        let (server, client) = UnixStream::pair().map_err(CaptureError::CalibrationSocket)?;
        Ok(Pair { server, client })
    }

    /// One request: the client sends it, the server reads it and answers with a small JSON body, the client
    /// reads the answer.
    fn request(&self, buf: &mut [u8]) {
        use std::io::{Read, Write};
        let _ = (&self.client).write_all(REQUEST);
        let _ = (&self.server).read(buf);
        let _ = (&self.server).write_all(JSON_RESPONSE);
        let _ = (&self.client).read(buf);
    }

    /// One SSE event written by the server and read by the client.
    fn sse(&self, buf: &mut [u8]) {
        use std::io::{Read, Write};
        let _ = (&self.server).write_all(SSE_CHUNK);
        let _ = (&self.client).read(buf);
    }

    /// The server reads a request and starts a streamed answer.
    fn start_stream(&self, buf: &mut [u8]) {
        use std::io::{Read, Write};
        let _ = (&self.client).write_all(REQUEST);
        let _ = (&self.server).read(buf);
        let _ = (&self.server).write_all(SSE_HEAD);
        let _ = (&self.client).read(buf);
    }
}

/// Measures [`HttpCost`] with llmprof itself traced (the caller's job, like the other measurements).
pub(super) fn measure(ebpf: &mut aya::Ebpf) -> Result<HttpCost, CaptureError> {
    let me = std::process::id();
    let (followed, plain) = (Pair::new()?, Pair::new()?);
    let key = SockKey {
        pid: me,
        fd: followed.server.as_raw_fd(),
    };
    set_followed(ebpf, key, true)?;
    let mut buf = vec![0u8; 4096];
    let measured = {
        let req_plain = median_round(REQUESTS_PER_ROUND, || plain.request(&mut buf));
        let req_followed = median_round(REQUESTS_PER_ROUND, || followed.request(&mut buf));
        plain.start_stream(&mut buf);
        followed.start_stream(&mut buf);
        let sse_plain = median_round(WRITES_PER_ROUND, || plain.sse(&mut buf));
        let sse_followed = median_round(WRITES_PER_ROUND, || followed.sse(&mut buf));
        HttpCost {
            request_ns: (req_followed - req_plain).max(0.0),
            sse_write_ns: (sse_followed - sse_plain).max(0.0),
        }
    };
    // The connection leaves the map before its socket closes (a close of a followed fd is a record).
    set_followed(ebpf, key, false)?;
    drop::<[OwnedFd; 4]>([
        followed.server.into(),
        followed.client.into(),
        plain.server.into(),
        plain.client.into(),
    ]);
    Ok(measured)
}

fn set_followed(ebpf: &mut aya::Ebpf, key: SockKey, on: bool) -> Result<(), CaptureError> {
    let mut conns: HashMap<_, SockKey, HttpConnState> = map_mut(ebpf, HTTP_CONNS_MAP)?;
    if on {
        let st = HttpConnState {
            conn: 1,
            remaining: -1,
            ..HttpConnState::default()
        };
        conns.insert(key, st, 0).map_err(map_err(HTTP_CONNS_MAP))
    } else {
        conns.remove(&key).map_err(map_err(HTTP_CONNS_MAP))
    }
}
