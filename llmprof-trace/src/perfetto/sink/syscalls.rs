//! The syscalls family: each syscall slower than the threshold is a slice on its thread's own track, and the
//! per-process syscall rate a `syscalls/s` counter.

use std::io::{self, Write};

use super::{Counter, TraceSink};
use crate::event::Event;
use crate::names::syscalls;
use crate::names::{arg, slice};
use crate::perfetto::writer::{arg_f, arg_i, arg_u};

impl<W: Write> TraceSink<W> {
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

    /// The syscall rate over the last sampling interval.
    pub(super) fn syscall_rate(&mut self, pid: u32, ts: u64, per_sec: f64) -> io::Result<()> {
        let t = self.counter_track(pid, Counter::SyscallRate)?;
        self.counter(ts, t, per_sec)
    }
}
