//! CUDA driver calls: the slices [`agg`] makes of them, on a child track of each calling thread.

pub mod agg;

use std::io::{self, Write};

use llmprof_abi::{CudaArg, CudaClass};

use super::{NS_CUDA, TraceSink, uuid};
use crate::event::{Event, EventBody};
use crate::names::{arg, category, slice, track, value};
use crate::perfetto::schema::{TYPE_SLICE_BEGIN, TrackDescriptor, TrackEvent};
use crate::perfetto::writer::{Arg, arg_f, arg_s, arg_u};
use agg::{BatchEnd, CudaSlice, CudaSliceKind};

impl<W: Write> TraceSink<W> {
    /// A CUDA driver call: into the aggregator, out as the slices it closes.
    pub(super) fn cuda_call(&mut self, ev: &Event) -> io::Result<()> {
        let EventBody::CudaCall {
            func,
            variant,
            dur_ns,
            arg,
            result,
        } = &ev.body
        else {
            return Ok(());
        };
        self.cuda.call(
            ev.pid,
            ev.tid,
            ev.ts_ns,
            *func,
            *variant,
            *dur_ns,
            *arg,
            *result,
            &mut self.cuda_out,
        );
        self.write_cuda()
    }

    /// A window of counted CUDA driver calls: into the aggregator like the calls it counts.
    pub(super) fn cuda_count(&mut self, ev: &Event) -> io::Result<()> {
        let EventBody::CudaCount {
            last_ns,
            calls,
            bytes,
        } = &ev.body
        else {
            return Ok(());
        };
        self.cuda.counted(
            ev.pid,
            ev.tid,
            ev.ts_ns,
            *last_ns,
            calls,
            *bytes,
            &mut self.cuda_out,
        );
        self.write_cuda()
    }

    /// The track of `tid`'s CUDA driver calls, a child of its thread track.
    fn cuda_track(&mut self, pid: u32, tid: u32) -> io::Result<u64> {
        let id = uuid(NS_CUDA, u64::from(tid));
        if self.tracks.contains(&id) {
            return Ok(id);
        }
        let parent = self.thread_track(pid, tid)?;
        self.descriptor(TrackDescriptor {
            uuid: Some(id),
            parent_uuid: Some(parent),
            name: Some(track::CUDA.to_owned()),
            ..Default::default()
        })
    }

    /// Writes the CUDA slices the aggregator produced.
    pub(super) fn write_cuda(&mut self) -> io::Result<()> {
        if self.cuda_out.is_empty() {
            return Ok(());
        }
        let slices = std::mem::take(&mut self.cuda_out);
        for s in &slices {
            self.cuda_slice(s)?;
        }
        self.cuda_out = slices;
        self.cuda_out.clear();
        Ok(())
    }

    fn cuda_slice(&mut self, s: &CudaSlice) -> io::Result<()> {
        // The note is said once per track (its first slice): on every slice it was most of a slice's bytes.
        let first = !self.tracks.contains(&uuid(NS_CUDA, u64::from(s.tid)));
        let track = self.cuda_track(s.pid, s.tid)?;
        let (name, mut args) = match &s.kind {
            CudaSliceKind::Call { .. } => {
                self.count("cuda_slice");
                call_slice(s)
            }
            CudaSliceKind::Batch { .. } => {
                self.count("cuda_batch");
                batch_slice(s)
            }
        };
        if let Some(id) = s.step_id {
            args.push(arg_u(arg::STEP_ID, id));
        }
        if first {
            args.push(arg_s(arg::NOTE, arg::CUDA_NOTE));
        }
        let begin = TrackEvent {
            r#type: Some(TYPE_SLICE_BEGIN),
            track_uuid: Some(track),
            categories: vec![category::CUDA_HOST.to_owned()],
            ..Default::default()
        };
        self.w.write_event(s.ts_ns, Some(&name), begin, args)?;
        self.end(s.ts_ns + s.dur_ns, track, Vec::new())
    }
}

/// Name and args of one call shown on its own.
fn call_slice(s: &CudaSlice) -> (String, Vec<Arg>) {
    let CudaSliceKind::Call {
        func,
        variant,
        arg: value,
        result,
    } = &s.kind
    else {
        return (String::new(), Vec::new());
    };
    let mut args = vec![
        arg_s(arg::FUNCTION, format!("{}{}", func.name(), variant.suffix())),
        arg_f(arg::HOST_MS, s.dur_ns as f64 / 1e6),
        arg_u(arg::RESULT, *result),
    ];
    match func.arg() {
        Some((_, CudaArg::Bytes)) => args.push(arg_u(arg::BYTES, *value)),
        Some((_, CudaArg::DevicePtr)) => args.push(arg_s(arg::DPTR, format!("{value:#x}"))),
        Some((_, CudaArg::Stream)) => args.push(arg_s(arg::STREAM, format!("{value:#x}"))),
        None => {}
    }
    (slice::cuda_call(func.name()), args)
}

/// Name and args of a batch of calls.
fn batch_slice(s: &CudaSlice) -> (String, Vec<Arg>) {
    let CudaSliceKind::Batch {
        funcs,
        calls,
        host_total_ns,
        max_ns,
        errors,
        end,
        per_step,
        counted,
        counted_bytes,
    } = &s.kind
    else {
        return (String::new(), Vec::new());
    };
    let only = match funcs.keys().next() {
        Some(f) if funcs.len() == 1 => Some(f.name()),
        _ => None,
    };
    let breakdown: Vec<String> = funcs
        .iter()
        .map(|(f, (n, ns))| value::cuda_function(f.name(), *n, *ns as f64 / 1e6))
        .collect();
    let launches: u64 = funcs
        .iter()
        .filter(|(f, _)| f.class() == CudaClass::Launch)
        .map(|(_, (n, _))| n)
        .sum();
    let per = if *per_step {
        arg::AGGREGATED_PER_STEP
    } else {
        arg::AGGREGATED_PER_WINDOW
    };
    let ended_by = match end {
        BatchEnd::Step => arg::ENDED_BY_STEP,
        BatchEnd::Window => arg::ENDED_BY_WINDOW,
        BatchEnd::Call => arg::ENDED_BY_CALL,
        BatchEnd::End => arg::ENDED_BY_END,
    };
    let args = vec![
        arg_u(arg::CALLS, *calls),
        arg_u(arg::LAUNCHES, launches),
        arg_f(arg::HOST_TOTAL_MS, *host_total_ns as f64 / 1e6),
        arg_f(arg::HOST_MAX_MS, *max_ns as f64 / 1e6),
        arg_s(arg::FUNCTIONS, breakdown.join(" ")),
        arg_s(arg::AGGREGATED_PER, per),
        arg_u(arg::ERRORS, *errors),
        arg_s(arg::ENDED_BY, ended_by),
    ];
    let mut args = args;
    if *counted > 0 {
        args.push(arg_u(arg::COUNTED_CALLS, *counted));
        args.push(arg_u(arg::COUNTED_BYTES, *counted_bytes));
    }
    (slice::cuda_batch(only, *calls), args)
}
