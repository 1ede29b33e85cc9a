//! The files family on a thread's own track: each open of a model file and each read / pread64 / readv /
//! mmap / close on a model-file fd is a slice.

use std::io::{self, Write};

use llmprof_abi::FileOp;

use super::TraceSink;
use crate::event::{Event, EventBody};
use crate::names::{arg, slice};
use crate::perfetto::writer::{arg_f, arg_i, arg_s, arg_u};

impl<W: Write> TraceSink<W> {
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
}
