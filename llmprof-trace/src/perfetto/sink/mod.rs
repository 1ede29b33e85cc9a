//! The Perfetto sink: turns the ordered [`Event`] stream into tracks, slices, flows and counters.
//!
//! Owns the layout of an llmprof trace (which track each event lands on, with which name and args: the names
//! themselves are [`crate::names`]'s) and the bookkeeping that keeps it well formed: every open range and request
//! is closed at [`TraceSink::finish`] with an explicit `closed_by` arg, so the trace has no unterminated slices.
//! It is a pure consumer of events: it never reads /proc or the kernel (process and thread names come in as
//! [`ProcessInfo`]). [`TraceSink::push`] hands each event kind to its own step, in these files:
//! - `engine`: per traced process, the `engine steps` track (one slice per step with its attributes and the
//!   ids and token shares of its requests as typed array args, flows to its requests), `device (host compute)` /
//!   `device (CUDA)` (the device interval of each step) and one `request N` track per request, drawn from its
//!   [`crate::event::engine::RequestTimeline`]: queued → prefill → decode phase slices inside a `request N` slice,
//!   first-token / preemption / finish instants, flows; NVTX-style ranges on each thread's track;
//! - `wire`: what the HTTP wire probe adds to a wire request's track (request and status lines, SSE content
//!   events, the exchange's end);
//! - `syscalls`: slow syscalls on each thread's track, the `syscalls/s` counter of each process;
//! - `files`: model-file open/read/mmap/close slices on each thread's track;
//! - `egress`: connect instants on each thread's track, flagged outside the allowed CIDRs;
//! - `cuda`: `CUDA driver calls (host time)` (a child track of each calling thread): the CUDA driver API calls
//!   seen by the libcuda uprobes, category `cuda-host`: synchronize calls and long copies/allocations one by one
//!   (`cuStreamSynchronize (host)`), launches gathered per engine step or 10 ms window (`cuLaunchKernel ×N
//!   (host)`), see [`cuda::agg`]. Host-side times, not GPU execution;
//! - `cupti`: GPU activity from CUPTI (injected helper): `CUDA device D stream S` tracks with one slice per
//!   kernel / copy / memset, the CUDA API calls on each thread with flows to the work they launched, host waits;
//! - `stacks`: CPU stack samples as Perfetto callstack samples (`PerfSample` + interned frames), see there;
//! - `sched`: thread states (sched_switch / sched_waking of the traced threads) in Perfetto's ftrace
//!   encoding, one `FtraceEventBundle` per CPU: Perfetto's own thread-state rows and `thread_state` table; the off-CPU stacks (of the `stacks`
//!   family) go in the same bundles as `sched_blocked_reason` events;
//! - `python`: Python stack samples, one `python sample` instant on the sampled thread's track (when the
//!   native stack samples do not carry the Python frames as callstack frames);
//! - `proc`: each traced process's track, named by its command line (renamed when it executes a program), and
//!   the `process start` / `process exec` / `process exit` instants on it (process trees);
//!
//! and what is no probe family's:
//! - `counters`: per process `KV cache usage`, `requests running`, `requests waiting`, `preemptions` (the
//!   engine's `/metrics`), `GPU N memory (pid P)`; global GPU counters (one group per GPU: `GPU N utilization`,
//!   `GPU N memory used`, `GPU N power`, ...) and llmprof's own cost every tick (`llmprof overhead: ...`,
//!   `llmprof CPU`, `llmprof RSS`, `llmprof cost per hit: ...`, [`crate::names::counter::OVERHEAD`]);
//! - `session`: the global `llmprof` track: markers (probes not found, target exited, trace size limit), the
//!   overhead budget's steps (`overhead budget: <step>`), and at the end the per-probe `llmprof drops: <probe>`
//!   counters and the final `llmprof summary` instant with the session statistics and self-accounting.
//!
//! A new probe family is one more file here, named after it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Write};

use super::schema::{
    CLOCK_BOOTTIME, CLOCK_REALTIME, Clock, ClockSnapshot, CounterDescriptor, TYPE_COUNTER, TYPE_INSTANT,
    TYPE_SLICE_BEGIN, TYPE_SLICE_END, ThreadDescriptor, TracePacket, TrackDescriptor, TrackEvent,
};
use super::writer::{Arg, PacketWriter};
use crate::event::engine::RequestTimeline;
use crate::event::{Event, EventBody, ProcessInfo};
use crate::names::{counter, marker, track};
use cuda::agg::{AggStats, CudaAggregator, CudaSlice};

// One file per probe family.
pub mod cuda;
mod cupti;
mod egress;
mod engine;
mod files;
mod proc;
mod python;
mod sched;
mod stacks;
mod syscalls;
mod wire;

// What every family shares.
mod counters;
mod session;

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
mod tests;

/// How many syscall aggregates the summary lists (by total time).
pub const SUMMARY_TOP_SYSCALLS: usize = 10;

/// Key offset of the [`counter::OVERHEAD`] tracks in the global namespace (drop counters use 1..=probes).
const OVERHEAD_KEY: u64 = 0x100;

// Track uuid namespaces (top byte), so uuids of different kinds never collide.
const NS_PROCESS: u64 = 1;
const NS_THREAD: u64 = 2;
const NS_STEPS: u64 = 3;
const NS_DEVICE: u64 = 4;
const NS_REQUEST: u64 = 5;
const NS_COUNTER: u64 = 6;
const NS_GLOBAL: u64 = 7;
const NS_CUDA: u64 = 8;
const NS_GPU: u64 = 9;

const MIB: f64 = 1024.0 * 1024.0;

fn uuid(ns: u64, id: u64) -> u64 {
    (ns << 56) | (id & ((1 << 56) - 1))
}

/// A request's flow id and track key: its process and id.
fn pid_req(pid: u32, req: u64) -> u64 {
    // Bit 31 tells a request seen on the wire (ids from `event::WIRE_REQ_BASE`) from the engine's own ids.
    let wire = if crate::names::slice::is_wire_request(req) {
        1 << 31
    } else {
        0
    };
    (u64::from(pid) << 32) | wire | (req & 0x7fff_ffff)
}

/// Counter tracks of a process.
#[derive(Clone, Copy)]
enum Counter {
    KvUsage = 0,
    Running = 1,
    Waiting = 2,
    Preemptions = 3,
    SyscallRate = 4,
}

impl Counter {
    /// `(track name, unit)`.
    fn spec(self) -> (&'static str, &'static str) {
        match self {
            Self::KvUsage => counter::KV_USAGE,
            Self::Running => counter::RUNNING,
            Self::Waiting => counter::WAITING,
            Self::Preemptions => counter::PREEMPTIONS,
            Self::SyscallRate => counter::SYSCALL_RATE,
        }
    }
}

/// Per-kind counts of what the sink wrote (printed at exit).
#[derive(Clone, Debug, Default)]
pub struct EventCounts {
    /// Events per kind name ([`EventBody::kind_name`]; `cuda_slice` / `cuda_batch` for the CUDA slices written).
    pub by_kind: BTreeMap<&'static str, u64>,
}

/// The sink. Feed it ordered events with [`TraceSink::push`], then call [`TraceSink::finish`].
pub struct TraceSink<W: Write> {
    w: PacketWriter<W>,
    tracks: HashSet<u64>,
    processes: HashMap<u32, ProcessInfo>,
    /// The processes traced from the start (their exit is also a `target exited` marker).
    targets: HashSet<u32>,
    /// Processes started during the session whose track has no name yet, with their start (see `procs`).
    unnamed: HashMap<u32, u64>,
    thread_names: HashMap<u32, String>,
    /// Requests seen and not finished, by (pid, request id).
    requests: BTreeMap<(u32, u64), RequestTimeline>,
    /// Open NVTX ranges per (pid, tid): names, innermost last.
    ranges: BTreeMap<(u32, u32), Vec<String>>,
    counts: EventCounts,
    last_ts: u64,
    first_ts: Option<u64>,
    cuda: CudaAggregator,
    cuda_out: Vec<CudaSlice>,
    sched: sched::SchedState,
    callstacks: stacks::Callstacks,
    gpu: cupti::GpuState,
}

impl<W: Write> TraceSink<W> {
    /// Starts a trace on `out`: a BOOTTIME/REALTIME clock snapshot (when given) and the descriptors of the
    /// traced processes and their known threads; a marker on the llmprof track for each process whose engine
    /// probes were not found.
    pub fn new(out: W, processes: &[ProcessInfo], clocks: Option<(u64, u64)>) -> io::Result<Self> {
        let mut s = Self {
            w: PacketWriter::new(out),
            tracks: HashSet::new(),
            processes: processes.iter().map(|p| (p.pid, p.clone())).collect(),
            targets: processes.iter().map(|p| p.pid).collect(),
            unnamed: HashMap::new(),
            thread_names: HashMap::new(),
            requests: BTreeMap::new(),
            ranges: BTreeMap::new(),
            counts: EventCounts::default(),
            last_ts: clocks.map(|c| c.0).unwrap_or(0),
            first_ts: None,
            cuda: CudaAggregator::new(processes.iter().filter(|p| p.engine_probes).map(|p| p.pid)),
            cuda_out: Vec::new(),
            sched: sched::SchedState::default(),
            callstacks: stacks::Callstacks::default(),
            gpu: cupti::GpuState::default(),
        };
        if let Some((boot, real)) = clocks {
            s.w.write(TracePacket {
                timestamp: Some(boot),
                clock_snapshot: Some(ClockSnapshot {
                    clocks: vec![
                        Clock {
                            clock_id: Some(CLOCK_BOOTTIME),
                            timestamp: Some(boot),
                        },
                        Clock {
                            clock_id: Some(CLOCK_REALTIME),
                            timestamp: Some(real),
                        },
                    ],
                    primary_trace_clock: Some(CLOCK_BOOTTIME),
                }),
                ..Default::default()
            })?;
        }
        for p in processes {
            for t in &p.threads {
                s.thread_names.insert(t.tid, t.name.clone());
            }
        }
        for p in processes {
            s.process_track(p.pid)?;
            for t in &p.threads {
                s.thread_track(p.pid, t.tid)?;
            }
            if !p.engine_probes {
                let ts = s.last_ts;
                s.marker(ts, &marker::engine_probes_not_found(p.pid))?;
            }
        }
        Ok(s)
    }

    /// Names a thread that appeared after the start (before its first event, so its track gets the name).
    pub fn note_thread(&mut self, tid: u32, name: String) {
        self.thread_names.entry(tid).or_insert(name);
    }

    /// Whether the sink already knows a name for `tid`.
    pub fn knows_thread(&self, tid: u32) -> bool {
        self.thread_names.contains_key(&tid)
    }

    /// What was written so far, per event kind.
    pub fn counts(&self) -> &EventCounts {
        &self.counts
    }

    /// Slices still open (request slices and their phases, ranges): each costs an end when finishing.
    pub fn open_slices(&self) -> usize {
        self.requests
            .values()
            .map(|r| 1 + usize::from(r.phase().is_some()))
            .sum::<usize>()
            + self.ranges.values().map(Vec::len).sum::<usize>()
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.w.bytes()
    }

    /// Flushes buffered packets to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }

    /// What the CUDA call aggregation did so far.
    pub fn cuda_stats(&self) -> AggStats {
        self.cuda.stats()
    }

    /// Writes the CUDA batches still open (so [`TraceSink::cuda_stats`] is final); [`TraceSink::finish`] does
    /// it too.
    pub fn flush_cuda(&mut self) -> io::Result<()> {
        self.cuda.finish(&mut self.cuda_out);
        self.write_cuda()
    }

    /// Writes one event: the CUDA batches its time closes, then the event by kind.
    pub fn push(&mut self, ev: &Event) -> io::Result<()> {
        let ts = ev.ts_ns;
        self.last_ts = self.last_ts.max(ts);
        self.first_ts.get_or_insert(ts);
        self.cuda.advance(ts, &mut self.cuda_out);
        self.write_cuda()?;
        self.count(ev.body.kind_name());
        // A process that has not executed a program keeps its parent's name once it has lived
        // `procs::NAME_AFTER_NS` without an exec (a forked worker): between fork and exec a child makes syscalls,
        // is switched and sampled like any other, so none of those events says it will not exec.
        if !self.unnamed.is_empty() && !matches!(ev.body, EventBody::ProcessExec { .. }) {
            self.name_process(ev.pid, Some(ts))?;
        }
        match &ev.body {
            EventBody::Step(rec) => self.step(ev.pid, rec),
            EventBody::Request(rec) => self.request(ev.pid, ts, rec),
            // Prompt and completion text go to OTel spans only (`--capture-content`); the trace file, which is
            // passed around more freely, never holds it. Counted so the summary says it was seen.
            EventBody::Content { .. } => Ok(()),
            EventBody::Range(rec) => self.range(ev, rec),
            EventBody::SlowSyscall { nr, ret, dur_ns } => self.slow_syscall(ev, *nr, *ret, *dur_ns),
            EventBody::FileOpen { path, ret, dur_ns } => self.file_open(ev, path, *ret, *dur_ns),
            EventBody::FileIo { .. } => self.file_io(ev),
            EventBody::Connect { .. } => self.connect(ev),
            EventBody::CudaCall { .. } => self.cuda_call(ev),
            EventBody::CudaCount { .. } => self.cuda_count(ev),
            EventBody::GpuSample(g) => self.gpu_sample(ev.pid, ts, g),
            EventBody::Metrics(m) => self.metrics(ev.pid, ts, m),
            EventBody::SyscallRate { per_sec } => self.syscall_rate(ev.pid, ts, *per_sec),
            EventBody::ProcessStart { ppid, name, cmdline } => self.process_start(ev, *ppid, name, cmdline),
            EventBody::ProcessExec {
                filename,
                name,
                cmdline,
            } => self.process_exec(ev, filename, name, cmdline),
            EventBody::ProcessExit { exit_code } => self.process_end(ev, *exit_code),
            EventBody::Marker { text } => self.marker(ts, text),
            EventBody::Overhead(o) => self.overhead(ts, o),
            EventBody::Degraded(d) => self.degraded(ts, d),
            EventBody::PyStack(s) => self.py_stack(ev, s),
            EventBody::WireRequest {
                req_id,
                method,
                path,
                socket_wait_ns,
            } => self.wire_request(ev.pid, ts, *req_id, method, path, *socket_wait_ns),
            EventBody::WireResponse { req_id, status } => self.wire_response(ev.pid, ts, *req_id, *status),
            EventBody::WireToken { req_id, count } => self.wire_token(ev.pid, ts, *req_id, *count),
            EventBody::WireEnd {
                req_id,
                status,
                bytes,
                streamed,
                engine_req,
            } => self.wire_end(ev.pid, ts, *req_id, *status, *bytes, *streamed, *engine_req),
            EventBody::SchedSwitch(s) => self.sched_switch(ev, s),
            EventBody::SchedWake(w) => self.sched_wake(ev, w),
            EventBody::CpuSample(s) => self.cpu_sample(ev, s),
            EventBody::OffCpuStack(s) => self.offcpu_stack(ev, s),
            EventBody::GpuWork(g) => self.gpu_work(ev, g),
            EventBody::GpuApi(c) => self.gpu_api(ev, c),
            EventBody::GpuBusy(b) => self.gpu_busy(ev, b),
            EventBody::GpuSummary(w) => self.gpu_window(ev, w),
        }
    }

    fn count(&mut self, kind: &'static str) {
        *self.counts.by_kind.entry(kind).or_default() += 1;
    }

    // ---- tracks ----

    fn descriptor(&mut self, d: TrackDescriptor) -> io::Result<u64> {
        let id = d.uuid.unwrap_or(0);
        if self.tracks.insert(id) {
            self.w.write(TracePacket {
                track_descriptor: Some(d),
                ..Default::default()
            })?;
        }
        Ok(id)
    }

    fn process_track(&mut self, pid: u32) -> io::Result<u64> {
        let id = uuid(NS_PROCESS, u64::from(pid));
        if self.tracks.contains(&id) {
            return Ok(id);
        }
        let d = self.process_descriptor(pid);
        self.descriptor(d)
    }

    fn thread_track(&mut self, pid: u32, tid: u32) -> io::Result<u64> {
        let id = uuid(NS_THREAD, u64::from(tid));
        if self.tracks.contains(&id) {
            return Ok(id);
        }
        self.process_track(pid)?;
        let name = self.thread_names.get(&tid).cloned();
        self.descriptor(TrackDescriptor {
            uuid: Some(id),
            thread: Some(ThreadDescriptor {
                pid: Some(pid as i32),
                tid: Some(tid as i32),
                thread_name: name,
            }),
            ..Default::default()
        })
    }

    /// A named track under the process's track; `name` is only built when the track is new.
    fn child_track(&mut self, pid: u32, id: u64, name: impl FnOnce() -> String) -> io::Result<u64> {
        if self.tracks.contains(&id) {
            return Ok(id);
        }
        let parent = self.process_track(pid)?;
        self.descriptor(TrackDescriptor {
            uuid: Some(id),
            parent_uuid: Some(parent),
            name: Some(name()),
            ..Default::default()
        })
    }

    fn counter_track(&mut self, pid: u32, c: Counter) -> io::Result<u64> {
        let id = uuid(NS_COUNTER, (u64::from(pid) << 8) | c as u64);
        if self.tracks.contains(&id) {
            return Ok(id);
        }
        let parent = self.process_track(pid)?;
        let (name, unit) = c.spec();
        self.descriptor(TrackDescriptor {
            uuid: Some(id),
            parent_uuid: Some(parent),
            name: Some(name.to_owned()),
            counter: Some(CounterDescriptor {
                unit_name: Some(unit.to_owned()),
                is_incremental: None,
            }),
            ..Default::default()
        })
    }

    fn global_track(&mut self, key: u64, name: String, counter: bool) -> io::Result<u64> {
        let id = uuid(NS_GLOBAL, key);
        if self.tracks.contains(&id) {
            return Ok(id);
        }
        self.descriptor(TrackDescriptor {
            uuid: Some(id),
            name: Some(name),
            counter: counter.then(CounterDescriptor::default),
            ..Default::default()
        })
    }

    /// The global [`track::LLMPROF`] track.
    fn llmprof_track(&mut self) -> io::Result<u64> {
        self.global_track(0, track::LLMPROF.to_owned(), false)
    }

    // ---- track events ----

    fn slice(
        &mut self,
        ts: u64,
        dur: u64,
        track: u64,
        name: &str,
        args: Vec<Arg>,
        flows: Vec<u64>,
    ) -> io::Result<()> {
        self.begin(ts, track, name, args, flows)?;
        self.end(ts + dur, track, Vec::new())
    }

    fn begin(&mut self, ts: u64, track: u64, name: &str, args: Vec<Arg>, flows: Vec<u64>) -> io::Result<()> {
        let ev = TrackEvent {
            r#type: Some(TYPE_SLICE_BEGIN),
            track_uuid: Some(track),
            flow_ids: flows,
            ..Default::default()
        };
        self.w.write_event(ts, Some(name), ev, args)
    }

    fn end(&mut self, ts: u64, track: u64, args: Vec<Arg>) -> io::Result<()> {
        let ev = TrackEvent {
            r#type: Some(TYPE_SLICE_END),
            track_uuid: Some(track),
            ..Default::default()
        };
        self.w.write_event(ts, None, ev, args)
    }

    fn instant(
        &mut self,
        ts: u64,
        track: u64,
        name: &str,
        args: Vec<Arg>,
        terminating: Vec<u64>,
    ) -> io::Result<()> {
        let ev = TrackEvent {
            r#type: Some(TYPE_INSTANT),
            track_uuid: Some(track),
            terminating_flow_ids: terminating,
            ..Default::default()
        };
        self.w.write_event(ts, Some(name), ev, args)
    }

    fn counter(&mut self, ts: u64, track: u64, value: f64) -> io::Result<()> {
        let ev = TrackEvent {
            r#type: Some(TYPE_COUNTER),
            track_uuid: Some(track),
            double_counter_value: Some(value),
            ..Default::default()
        };
        self.w.write_event(ts, None, ev, Vec::new())
    }
}
