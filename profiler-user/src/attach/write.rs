//! Writing the session's events: the ordered events into the trace (naming threads that appeared after the
//! start) and the span export, under the size cap.
//!
//! Owns what reaches the trace file and what `--max-trace-size` keeps out (counted, never silently lost).
//! Never reorders: the merge did.

use std::io::{self, Write};
use std::path::Path;

use llmprof_trace::event::Event;
use llmprof_trace::perfetto::TraceSink;
use llmprof_trace::sizecap::SizeCap;

use super::options::AttachError;
use crate::otel::OtelSink;
use crate::sys::procfs;

/// The error of a failed write to the trace file.
pub(super) fn output_error(path: &Path) -> impl Fn(io::Error) -> AttachError + '_ {
    |source| AttachError::Output {
        path: path.to_owned(),
        source,
    }
}

/// Writes ordered events to the sink, naming threads that appeared after the start from /proc.
/// Every event at or after `floor_ns` goes to the trace and, when configured, to the OTel span builder. With a
/// size cap, stops at the first event that would leave too little room to end the trace: returns true then, and
/// counts that event and the rest of `ready` in `not_written`.
pub(super) fn write_all<W: Write>(
    sink: &mut TraceSink<W>,
    otel: &mut Option<OtelSink>,
    ready: &mut Vec<Event>,
    floor_ns: u64,
    cap: Option<&SizeCap>,
    not_written: &mut u64,
) -> io::Result<bool> {
    if let Some(c) = cap
        && c.reached(sink.bytes(), sink.open_slices())
    {
        *not_written += ready.len() as u64;
        ready.clear();
        return Ok(true);
    }
    let mut full = false;
    for ev in ready.drain(..) {
        if ev.ts_ns < floor_ns {
            continue;
        }
        if full {
            *not_written += 1;
            continue;
        }
        if let Some(c) = cap
            && c.reached(sink.bytes(), sink.open_slices())
        {
            full = true;
            *not_written += 1;
            continue;
        }
        if ev.tid != 0
            && !sink.knows_thread(ev.tid)
            && let Some(name) = procfs::thread_name(ev.pid, ev.tid)
        {
            sink.note_thread(ev.tid, name);
        }
        if let Some(o) = otel.as_mut() {
            o.push(&ev);
        }
        sink.push(&ev)?;
    }
    Ok(full)
}
