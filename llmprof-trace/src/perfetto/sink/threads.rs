//! What lands on a thread's own track: NVTX-style ranges, slow syscalls, model-file operations, connects.

use std::io::{self, Write};

use llmprof_abi::{FileOp, RangeOp, RangeRecord, read_str};

use super::TraceSink;
use crate::event::{Event, EventBody};
use crate::names::syscalls;
use crate::names::{arg, slice};
use crate::perfetto::writer::{arg_b, arg_f, arg_i, arg_s, arg_u};

impl<W: Write> TraceSink<W> {
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

    /// A syscall slower than the threshold.
    pub(super) fn slow_syscall(&mut self, ev: &Event, nr: u64, ret: i64, dur_ns: u64) -> io::Result<()> {
        let track = self.thread_track(ev.pid, ev.tid)?;
        let args = vec![
            arg_u(arg::NR, nr),
            arg_i(arg::RET, ret),
            arg_f(arg::LATENCY_MS, dur_ns as f64 / 1e6),
        ];
        let name = slice::syscall(&syscalls::name(nr));
        self.slice(ev.ts_ns, dur_ns, track, &name, args, Vec::new())
    }

    /// An open of a model file.
    pub(super) fn file_open(&mut self, ev: &Event, path: &str, ret: i64, dur_ns: u64) -> io::Result<()> {
        let track = self.thread_track(ev.pid, ev.tid)?;
        let args = vec![
            arg_s(arg::PATH, path),
            arg_i(arg::RET, ret),
            arg_f(arg::LATENCY_MS, dur_ns as f64 / 1e6),
        ];
        let name = slice::model_file(slice::FILE_OPEN);
        self.slice(ev.ts_ns, dur_ns, track, &name, args, Vec::new())
    }

    /// A read / pread64 / readv / mmap / close on a model-file fd.
    pub(super) fn file_io(&mut self, ev: &Event) -> io::Result<()> {
        let EventBody::FileIo {
            op,
            fd,
            path,
            ret,
            len,
            dur_ns,
        } = &ev.body
        else {
            return Ok(());
        };
        let track = self.thread_track(ev.pid, ev.tid)?;
        let mut args = vec![
            arg_i(arg::FD, i64::from(*fd)),
            arg_u(arg::REQUESTED_BYTES, *len),
            arg_f(arg::LATENCY_MS, *dur_ns as f64 / 1e6),
        ];
        if let Some(p) = path {
            args.push(arg_s(arg::PATH, p.clone()));
        }
        match op {
            FileOp::Read | FileOp::Pread | FileOp::Readv => args.push(arg_i(arg::BYTES, *ret)),
            FileOp::Mmap => args.push(arg_s(arg::ADDRESS, format!("{:#x}", *ret as u64))),
            FileOp::Close => args.push(arg_i(arg::RET, *ret)),
        }
        let name = slice::model_file(op.name());
        self.slice(ev.ts_ns, *dur_ns, track, &name, args, Vec::new())
    }

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
