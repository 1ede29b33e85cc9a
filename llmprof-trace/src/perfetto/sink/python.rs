//! Python stack samples on the sampled thread's track: one `python sample` instant per sample, its frames
//! as args. The simplest form the trace processor reads back; the native stack sampler's callstack samples
//! will carry these frames (merged with [`crate::event::python::merge_stacks`]) instead.

use std::io::{self, Write};

use super::TraceSink;
use crate::event::Event;
use crate::event::python::{PyStackSample, PyStackStatus};
use crate::names::{arg, slice};
use crate::perfetto::writer::{Arg, ArgValue, arg_s, arg_u};

impl<W: Write> TraceSink<W> {
    /// One Python stack sample.
    pub(super) fn py_stack(&mut self, ev: &Event, s: &PyStackSample) -> io::Result<()> {
        let track = self.thread_track(ev.pid, ev.tid)?;
        let status = match s.status {
            PyStackStatus::Complete => "complete",
            PyStackStatus::Truncated => "truncated",
            PyStackStatus::NoThread => "no_thread",
            PyStackStatus::ReadFailed => "read_failed",
        };
        let mut args = vec![
            arg_u(arg::PY_DEPTH, s.frames.len() as u64),
            arg_s(arg::PY_STATUS, status),
        ];
        if let Some(leaf) = s.frames.first() {
            args.push(arg_s(arg::PY_LEAF, leaf.function.clone()));
            args.push(arg_s(arg::PY_STACK, s.render()));
            let array = |name, v: Vec<ArgValue>| Arg {
                name,
                value: ArgValue::Array(v),
            };
            let fr = &s.frames;
            args.push(array(
                arg::PY_FUNCTIONS,
                fr.iter().map(|f| ArgValue::S(f.function.clone())).collect(),
            ));
            args.push(array(
                arg::PY_FILES,
                fr.iter().map(|f| ArgValue::S(f.file.clone())).collect(),
            ));
            // 0: no line for the instruction.
            args.push(array(
                arg::PY_LINES,
                fr.iter()
                    .map(|f| ArgValue::U(f.line.map_or(0, u64::from)))
                    .collect(),
            ));
        }
        self.instant(ev.ts_ns, track, slice::PY_SAMPLE, args, Vec::new())
    }
}
