//! GPU activity from CUPTI ([`crate::event::cupti`]): one slice per kernel / copy / memset on a `CUDA device D stream S`
//! child track of its process; the CUDA API calls CUPTI recorded on a `CUDA API calls (CUPTI)` child track of
//! the calling thread, each with a flow to the work it launched (by correlation id); host waits on a
//! `GPU waits (CUPTI)` child track of the waiting thread. A kernel launched inside an engine step (the step whose
//! host time range holds the launch) carries its `step_id`.
//!
//! The default mode's summaries: a CUDA graph launch is one slice (`CUDA graph N`) on its stream's track; each
//! busy interval a slice (`GPU busy: <top kernel>`, kernels / busy / idle / the top kernel's time in its args, the step
//! whose host time holds its start in `step_id`) on a `CUDA device D busy` child track of the process, the
//! gaps between them being the GPU's idle time; each window's summary one slice on the process's
//! `GPU work per window (CUPTI)` track, its rows (kernel name, copy kind or wait; count, total, min, max) in
//! array args.
//!
//! GPU events arrive when their chunk is handed over, after the work ran: their slices are written at the
//! work's own times (the trace processor sorts). The links are [`LaunchLinks`]'s (bounded).

use std::collections::HashMap;
use std::io::{self, Write};

use llmprof_abi::cupti::{GpuActivityKind, NO_GRAPH};

use super::{TraceSink, uuid};
use crate::event::Event;
use crate::event::cupti::{GpuApi, GpuBusyInterval, GpuWindow, GpuWork, LaunchLinks};
use crate::names::arg as common;
use crate::names::cupti::{arg, category, slice, track};
use crate::perfetto::schema::{TYPE_SLICE_BEGIN, TYPE_SLICE_END, TrackEvent};
use crate::perfetto::writer::{Arg, ArgValue, arg_s, arg_u, arg_u_array};

const NS_GPU_STREAM: u64 = 10;
const NS_GPU_API: u64 = 11;
const NS_GPU_WAIT: u64 = 12;
const NS_GPU_BUSY: u64 = 13;
const NS_GPU_WINDOW: u64 = 14;
/// Flow ids of launches: this bit, the pid and the correlation id (request flows never set it).
const FLOW_GPU: u64 = 1 << 62;

/// What the sink keeps to link GPU work to its launch and step, and to keep stream tracks nested.
#[derive(Default)]
pub(super) struct GpuState {
    pub(super) links: LaunchLinks,
    /// Per stream track: end of the last top-level slice (a partly overlapping one is clipped to it).
    ends: HashMap<u64, u64>,
}

fn flow(pid: u32, correlation: u32) -> u64 {
    FLOW_GPU | (u64::from(pid) << 32) | u64::from(correlation)
}

fn dims(d: [u32; 3]) -> String {
    format!("{},{},{}", d[0], d[1], d[2])
}

impl<W: Write> TraceSink<W> {
    /// A CUDA API call: its slice on the thread's API track, starting a flow to the work it launched.
    pub(super) fn gpu_api(&mut self, ev: &Event, c: &GpuApi) -> io::Result<()> {
        let r = &c.rec;
        let id = uuid(NS_GPU_API, u64::from(ev.tid));
        let track = self.thread_child_track(ev.pid, ev.tid, id, track::API)?;
        let flows = if r.correlation != 0 {
            self.gpu.links.call(ev.pid, r.correlation, ev.tid, r.start_ns);
            vec![flow(ev.pid, r.correlation)]
        } else {
            Vec::new()
        };
        let begin = TrackEvent {
            r#type: Some(TYPE_SLICE_BEGIN),
            track_uuid: Some(track),
            categories: vec![category::CUDA_API.to_owned()],
            flow_ids: flows,
            ..Default::default()
        };
        let args = vec![arg_u(arg::CBID, r.cbid), arg_u(arg::CORRELATION, r.correlation)];
        let name = slice::api_call(r.cbid, r.runtime != 0, c.name.as_deref());
        self.w.write_event(r.start_ns, Some(&name), begin, args)?;
        self.end(r.end_ns, track, Vec::new())
    }

    /// A kernel, copy, memset (on its stream's track) or host wait (on the waiting thread's track).
    pub(super) fn gpu_work(&mut self, ev: &Event, g: &GpuWork) -> io::Result<()> {
        let r = &g.rec;
        let launch = (r.correlation != 0)
            .then(|| self.gpu.links.launch(ev.pid, r.correlation))
            .flatten();
        if g.kind == GpuActivityKind::Sync {
            return self.gpu_wait(ev.pid, g, launch.map(|l| l.0));
        }
        let key =
            (u64::from(ev.pid) << 32) | (u64::from(r.device & 0xff) << 24) | u64::from(r.stream & 0xff_ffff);
        let id = uuid(NS_GPU_STREAM, key);
        let (device, stream) = (r.device, r.stream);
        let track = self.child_track(ev.pid, id, || track::stream(device, stream))?;
        let (name, kind) = match g.kind {
            GpuActivityKind::Kernel => (
                g.name.as_deref().unwrap_or(slice::KERNEL_UNNAMED).to_owned(),
                arg::KIND_KERNEL,
            ),
            GpuActivityKind::Memcpy => (slice::memcpy(r.detail), arg::KIND_MEMCPY),
            GpuActivityKind::Graph => (slice::graph(r.graph_id), arg::KIND_GRAPH),
            _ => (slice::MEMSET.to_owned(), arg::KIND_MEMSET),
        };
        let mut args = vec![
            arg_s(arg::KIND, kind),
            arg_u(arg::DEVICE, r.device),
            arg_u(arg::STREAM, r.stream),
        ];
        if g.kind == GpuActivityKind::Kernel {
            args.extend([
                arg_s(arg::GRID, dims(r.grid)),
                arg_s(arg::BLOCK, dims(r.block)),
                arg_u(arg::REGISTERS, r.registers),
                arg_u(arg::SHARED_STATIC, r.shared_static),
                arg_u(arg::SHARED_DYNAMIC, r.shared_dynamic),
            ]);
            if let Some(m) = &g.mangled {
                args.push(arg_s(arg::MANGLED, m.as_ref()));
            }
        } else if g.kind != GpuActivityKind::Graph {
            args.push(arg_u(common::BYTES, r.bytes));
            if g.kind == GpuActivityKind::Memcpy {
                args.push(arg_s(arg::COPY_KIND, slice::copy_kind(r.detail)));
            }
        }
        if r.graph_id != NO_GRAPH {
            args.push(arg_u(arg::GRAPH_ID, r.graph_id));
            if g.kind != GpuActivityKind::Graph {
                args.push(arg_u(arg::GRAPH_NODE, r.graph_node));
            }
        }
        if r.correlation != 0 {
            args.push(arg_u(arg::CORRELATION, r.correlation));
        }
        if let Some((tid, _)) = launch {
            args.push(arg_u(arg::LAUNCH_TID, tid));
        }
        if let Some(step) = g.step(ev.pid, &self.gpu.links) {
            args.push(arg_u(common::STEP_ID, step));
        }
        // One stream runs one piece of work at a time; a record that overlaps the previous one partly (clock
        // mapping jitter) starts where it ended so the track stays well nested.
        let start = self.clip(id, r.start_ns, r.end_ns);
        let begin = TrackEvent {
            r#type: Some(TYPE_SLICE_BEGIN),
            track_uuid: Some(track),
            categories: vec![category::GPU.to_owned()],
            // Not terminating: every piece of work of one launch continues its flow (a CUDA graph replay's
            // kernels share the launch's correlation id: launch → first kernel → next kernel ...).
            flow_ids: launch.map(|_| flow(ev.pid, r.correlation)).into_iter().collect(),
            ..Default::default()
        };
        self.w.write_event(start, Some(&name), begin, args)?;
        let end = TrackEvent {
            r#type: Some(TYPE_SLICE_END),
            track_uuid: Some(track),
            ..Default::default()
        };
        self.w.write_event(r.end_ns, None, end, Vec::<Arg>::new())
    }

    /// A busy interval of one device: a slice on the process's `CUDA device D busy` track.
    pub(super) fn gpu_busy(&mut self, ev: &Event, b: &GpuBusyInterval) -> io::Result<()> {
        let r = &b.rec;
        let id = uuid(
            NS_GPU_BUSY,
            (u64::from(ev.pid) << 32) | u64::from(r.device & 0xffff),
        );
        let device = r.device;
        let track = self.child_track(ev.pid, id, || track::busy(device))?;
        let start = self.clip(id, r.start_ns, r.end_ns);
        // The device is in the track's name and the top kernel in the slice's: not repeated in args (a
        // string arg is not interned; one of these slices comes per engine step).
        let mut args = vec![
            arg_u(arg::KERNELS, r.kernels),
            arg_u(arg::BUSY_NS, r.busy_ns),
            arg_u(arg::IDLE_NS, (r.end_ns - r.start_ns).saturating_sub(r.busy_ns)),
        ];
        if r.top_count > 0 {
            args.push(arg_u(arg::TOP_KERNEL_NS, r.top_ns));
            args.push(arg_u(arg::TOP_KERNEL_COUNT, r.top_count));
        }
        if let Some(step) = self.gpu.links.step_at(ev.pid, r.start_ns) {
            args.push(arg_u(common::STEP_ID, step));
        }
        let begin = TrackEvent {
            r#type: Some(TYPE_SLICE_BEGIN),
            track_uuid: Some(track),
            categories: vec![category::GPU.to_owned()],
            ..Default::default()
        };
        self.w
            .write_event(start, Some(&slice::busy(b.top.as_deref())), begin, args)?;
        self.end(r.end_ns, track, Vec::new())
    }

    /// A window's summary: one slice spanning its rows on the process's summary track, the rows in array args.
    pub(super) fn gpu_window(&mut self, ev: &Event, w: &GpuWindow) -> io::Result<()> {
        if w.rows.is_empty() {
            return Ok(());
        }
        let id = uuid(NS_GPU_WINDOW, u64::from(ev.pid));
        let track = self.child_track(ev.pid, id, || track::SUMMARY.to_owned())?;
        let (first, last) = w.span();
        let start = self.clip(id, first, last);
        let mut rows: Vec<&crate::event::cupti::SummaryRow> = w.rows.iter().collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.rec.total_ns));
        let kind = |k: GpuActivityKind| match k {
            GpuActivityKind::Kernel => arg::KIND_KERNEL,
            GpuActivityKind::Memcpy => arg::KIND_MEMCPY,
            GpuActivityKind::Memset => arg::KIND_MEMSET,
            GpuActivityKind::Sync => arg::KIND_WAIT,
            GpuActivityKind::Graph => arg::KIND_GRAPH,
        };
        let name = |r: &crate::event::cupti::SummaryRow| match r.kind {
            GpuActivityKind::Kernel => r.name.as_deref().unwrap_or(slice::KERNEL_UNNAMED).to_owned(),
            GpuActivityKind::Memcpy => slice::memcpy(r.rec.detail),
            GpuActivityKind::Memset => slice::MEMSET.to_owned(),
            GpuActivityKind::Sync => slice::wait(r.rec.detail),
            GpuActivityKind::Graph => slice::graph(r.rec.detail),
        };
        let strings = |f: &dyn Fn(&crate::event::cupti::SummaryRow) -> String| {
            ArgValue::Array(rows.iter().map(|r| ArgValue::S(f(r))).collect())
        };
        let args = vec![
            arg_u(arg::WINDOW, w.window),
            Arg {
                name: arg::ROW_KIND,
                value: strings(&|r| kind(r.kind).to_owned()),
            },
            Arg {
                name: arg::ROW_NAME,
                value: strings(&name),
            },
            arg_u_array(arg::ROW_DEVICE, rows.iter().map(|r| u64::from(r.rec.device))),
            arg_u_array(arg::ROW_COUNT, rows.iter().map(|r| r.rec.count)),
            arg_u_array(arg::ROW_TOTAL_NS, rows.iter().map(|r| r.rec.total_ns)),
            arg_u_array(arg::ROW_MIN_NS, rows.iter().map(|r| r.rec.min_ns)),
            arg_u_array(arg::ROW_MAX_NS, rows.iter().map(|r| r.rec.max_ns)),
            arg_u_array(arg::ROW_BYTES, rows.iter().map(|r| r.rec.bytes)),
        ];
        let begin = TrackEvent {
            r#type: Some(TYPE_SLICE_BEGIN),
            track_uuid: Some(track),
            categories: vec![category::GPU.to_owned()],
            ..Default::default()
        };
        self.w.write_event(start, Some(slice::WINDOW), begin, args)?;
        self.end(last, track, Vec::new())
    }

    /// Where a slice of `[start, end]` on track `id` starts so the track stays well nested: at the end of the
    /// previous one when it overlaps it partly.
    fn clip(&mut self, id: u64, start: u64, end: u64) -> u64 {
        let last = self.gpu.ends.get(&id).copied().unwrap_or(0);
        if end > last {
            self.gpu.ends.insert(id, end);
        }
        if start < last && end > last { last } else { start }
    }

    fn gpu_wait(&mut self, pid: u32, g: &GpuWork, tid: Option<u32>) -> io::Result<()> {
        let r = &g.rec;
        let track = match tid {
            Some(tid) => {
                self.thread_child_track(pid, tid, uuid(NS_GPU_WAIT, u64::from(tid)), track::WAITS)?
            }
            None => self.child_track(pid, uuid(NS_GPU_WAIT, 1 << 40 | u64::from(pid)), || {
                track::WAITS.to_owned()
            })?,
        };
        let begin = TrackEvent {
            r#type: Some(TYPE_SLICE_BEGIN),
            track_uuid: Some(track),
            categories: vec![category::CUDA_API.to_owned()],
            ..Default::default()
        };
        let mut args = vec![arg_u(arg::DEVICE, r.device), arg_u(arg::STREAM, r.stream)];
        if r.correlation != 0 {
            args.push(arg_u(arg::CORRELATION, r.correlation));
        }
        self.w
            .write_event(r.start_ns, Some(&slice::wait(r.detail)), begin, args)?;
        self.end(r.end_ns, track, Vec::new())
    }
}

impl<W: Write> TraceSink<W> {
    /// A named child track `id` of thread `tid`'s track.
    fn thread_child_track(&mut self, pid: u32, tid: u32, id: u64, name: &str) -> io::Result<u64> {
        if self.tracks.contains(&id) {
            return Ok(id);
        }
        let parent = self.thread_track(pid, tid)?;
        self.descriptor(crate::perfetto::schema::TrackDescriptor {
            uuid: Some(id),
            parent_uuid: Some(parent),
            name: Some(name.to_owned()),
            ..Default::default()
        })
    }
}
