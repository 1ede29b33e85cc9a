//! The egress family on a thread's own track: each connect attempt is an instant, flagged when its address
//! is outside the allowed CIDRs.

use std::io::{self, Write};

use super::TraceSink;
use crate::event::{Event, EventBody};
use crate::names::{arg, slice};
use crate::perfetto::writer::{arg_b, arg_f, arg_i, arg_s, arg_u};

impl<W: Write> TraceSink<W> {
    /// A connect attempt: an instant, flagged when outside the allowed CIDRs.
    pub(super) fn connect(&mut self, ev: &Event) -> io::Result<()> {
        let EventBody::Connect {
            addr,
            port,
            ret,
            dur_ns,
            allowed,
        } = &ev.body
        else {
            return Ok(());
        };
        let track = self.thread_track(ev.pid, ev.tid)?;
        let (name, verdict) = if *allowed {
            (slice::CONNECT, arg::VERDICT_ALLOWED)
        } else {
            (slice::CONNECT_FLAGGED, arg::VERDICT_FLAGGED)
        };
        let args = vec![
            arg_s(arg::ADDRESS, addr.to_string()),
            arg_u(arg::PORT, *port),
            arg_b(arg::ALLOWED, *allowed),
            arg_s(arg::VERDICT, verdict),
            arg_i(arg::RET, *ret),
            arg_f(arg::LATENCY_MS, *dur_ns as f64 / 1e6),
        ];
        self.instant(ev.ts_ns, track, name, args, Vec::new())
    }
}
