//! What the HTTP wire probe adds to a wire request's track (drawn like an engine request from its `Request`
//! records, see `engine.rs`): the request line, the response's status line, the SSE content events after
//! the first token and the exchange's end (status, bytes, streamed, the engine request it carried), as
//! instants.

use std::io::{self, Write};

use super::TraceSink;
use crate::names::{arg, slice};
use crate::perfetto::writer::{arg_b, arg_s, arg_u};

impl<W: Write> TraceSink<W> {
    /// The request line of wire request `req` (and how long it waited in the server's socket, when known).
    pub(super) fn wire_request(
        &mut self,
        pid: u32,
        ts: u64,
        req: u64,
        method: &str,
        path: &str,
        socket_wait_ns: Option<u64>,
    ) -> io::Result<()> {
        let track = self.request_track(pid, req, "")?;
        let mut args = vec![
            arg_s(arg::HTTP_METHOD, method.to_owned()),
            arg_s(arg::HTTP_PATH, path.to_owned()),
        ];
        if let Some(w) = socket_wait_ns {
            args.push(arg_u(arg::SOCKET_WAIT_NS, w));
        }
        self.instant(ts, track, slice::HTTP_REQUEST_LINE, args, Vec::new())
    }

    /// The status line of wire request `req`'s response.
    pub(super) fn wire_response(&mut self, pid: u32, ts: u64, req: u64, status: u32) -> io::Result<()> {
        let track = self.request_track(pid, req, "")?;
        self.instant(
            ts,
            track,
            slice::HTTP_RESPONSE,
            vec![arg_u(arg::HTTP_STATUS, status)],
            Vec::new(),
        )
    }

    /// `count` SSE content events of one write of wire request `req`'s response (after its first token).
    pub(super) fn wire_token(&mut self, pid: u32, ts: u64, req: u64, count: u32) -> io::Result<()> {
        let track = self.request_track(pid, req, "")?;
        self.instant(
            ts,
            track,
            slice::WIRE_TOKEN,
            vec![arg_u(arg::COUNT, count)],
            Vec::new(),
        )
    }

    /// Wire request `req`'s exchange ended.
    #[expect(
        clippy::too_many_arguments,
        reason = "the fields of one event, named at the one call site"
    )]
    pub(super) fn wire_end(
        &mut self,
        pid: u32,
        ts: u64,
        req: u64,
        status: u32,
        bytes: Option<u64>,
        streamed: bool,
        engine_req: Option<u64>,
    ) -> io::Result<()> {
        let track = self.request_track(pid, req, "")?;
        let mut args = vec![arg_u(arg::HTTP_STATUS, status), arg_b(arg::STREAMED, streamed)];
        if let Some(b) = bytes {
            args.push(arg_u(arg::RESPONSE_BYTES, b));
        }
        if let Some(e) = engine_req {
            args.push(arg_s(arg::ENGINE_REQUEST, slice::request(e)));
        }
        self.instant(ts, track, slice::HTTP_RESPONSE_END, args, Vec::new())
    }
}
