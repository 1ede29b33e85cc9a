//! The Perfetto sink: turns the ordered [`Event`] stream into tracks, slices, flows and counters.
//!
//! Owns the layout of an llmprof trace (which track each event lands on, slice names, arg names) and the
//! bookkeeping that keeps it well formed: every open range and request is closed at [`TraceSink::finish`]
//! with an explicit `closed_by` arg, so the trace has no unterminated slices. It is a pure consumer of events:
//! it never reads /proc or the kernel (process and thread names come in as [`ProcessInfo`]).
//!
//! Layout, per traced process (track names in quotes):
//! - thread tracks: NVTX-style ranges, slow syscalls, model-file open/read/mmap slices, connect instants;
//! - "engine steps": one slice per step (prefill/decode/mixed) with its attributes, flows to its requests;
//! - "device (host compute)" / "device (CUDA)": the device interval of each step;
//! - "request N": queued → prefill → decode slices inside a "request N" slice, preemption instants, flows;
//! - counters: "KV cache usage", "requests running", "requests waiting", "preemptions", "syscalls/s".
//!
//! - "CUDA driver calls (host time)" (a child track of each calling thread): CUDA driver API calls seen by the
//!   libcuda uprobes, category `cuda-host`: synchronize calls and long copies/allocations one by one
//!   (`cuStreamSynchronize (host)`), launches gathered per engine step or 10 ms window
//!   (`cuLaunchKernel ×N (host)`), see [`crate::cuda_agg`]. Host-side times, not GPU execution;
//! - GPU counters (global, one group per GPU): "GPU N utilization", "GPU N memory used", "GPU N power", ...,
//!   and per traced process "GPU N memory (pid P)".
//!
//! A global "llmprof" track carries markers (probes not found, target exited, trace size limit), the overhead
//! budget's steps ("overhead budget: <step>") and the final "llmprof summary" instant with the session
//! statistics and self-accounting; "llmprof drops: <probe>" counter tracks carry per-probe drops and
//! "llmprof overhead: ..." / "llmprof CPU" / "llmprof RSS" / "llmprof cost per hit: ..." counter tracks
//! llmprof's own cost every tick ([`OVERHEAD_COUNTERS`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Write};

use llmprof_abi::{
    DeviceClock, FinishReason, PROBE_NAMES, RangeOp, RequestEventKind, RequestRecord, StepKind, StepRecord,
    read_str,
};

use super::schema::{
    CLOCK_BOOTTIME, CLOCK_REALTIME, Clock, ClockSnapshot, CounterDescriptor, ProcessDescriptor, TYPE_COUNTER,
    TYPE_INSTANT, TYPE_SLICE_BEGIN, TYPE_SLICE_END, ThreadDescriptor, TracePacket, TrackDescriptor,
    TrackEvent,
};
use super::writer::{Arg, PacketWriter, arg_b, arg_f, arg_i, arg_s, arg_u};
use crate::cuda_agg::{AggStats, BatchEnd, CudaAggregator, CudaSlice, CudaSliceKind};
use crate::event::{
    Degradation, Event, EventBody, GpuSample, MetricsSample, OverheadSample, ProcessInfo, SessionStats,
};
use crate::syscall_names;

/// Name of the global track with llmprof's own markers and summary.
pub const LLMPROF_TRACK: &str = "llmprof";
/// Name of the summary instant on [`LLMPROF_TRACK`].
pub const SUMMARY_EVENT: &str = "llmprof summary";
/// Name of the steps track.
pub const STEPS_TRACK: &str = "engine steps";
/// Name of each thread's child track of CUDA driver calls.
pub const CUDA_TRACK: &str = "CUDA driver calls (host time)";
/// Category of the CUDA driver call slices.
pub const CUDA_CATEGORY: &str = "cuda-host";
/// The `note` arg of every CUDA driver call slice: what its duration means.
pub const CUDA_NOTE: &str = "host-side time in the CUDA driver call (enqueue, or waiting for the GPU in synchronize calls); not GPU kernel execution";
/// How many syscall aggregates the summary lists (by total time).
pub const SUMMARY_TOP_SYSCALLS: usize = 10;
/// Prefix of the overhead budget's instants on [`LLMPROF_TRACK`] (followed by the step's name).
pub const DEGRADATION_PREFIX: &str = "overhead budget: ";
/// Global counter tracks of llmprof's self-accounting: `(name, unit)`, written every tick.
pub const OVERHEAD_COUNTERS: [(&str, &str); 8] = [
    ("llmprof overhead: est. target CPU added", "%"),
    ("llmprof overhead: est. added CPU", "ms/s"),
    ("llmprof CPU", "%"),
    ("llmprof RSS", "MiB"),
    ("llmprof cost per hit: syscall", "ns"),
    ("llmprof cost per hit: engine probe", "ns"),
    ("llmprof degradation level", "level"),
    ("llmprof cost per hit: CUDA call (entry + return probe)", "ns"),
];
/// Key offset of the [`OVERHEAD_COUNTERS`] tracks in the global namespace (drop counters use 1..=probes).
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

/// GPU counter tracks: (name suffix after "GPU N ", unit). Index = metric id in the track uuid; `llmprof
/// report` reads the tracks back by these names.
pub const GPU_COUNTERS: [(&str, &str); 8] = [
    ("utilization", "%"),
    ("memory utilization", "%"),
    ("memory used", "MiB"),
    ("power", "W"),
    ("SM clock", "MHz"),
    ("temperature", "°C"),
    ("PCIe TX (device to host)", "MB/s"),
    ("PCIe RX (host to device)", "MB/s"),
];
const MIB: f64 = 1024.0 * 1024.0;

fn uuid(ns: u64, id: u64) -> u64 {
    (ns << 56) | (id & ((1 << 56) - 1))
}

fn pid_req(pid: u32, req: u64) -> u64 {
    (u64::from(pid) << 32) | (req & 0xffff_ffff)
}

/// Counter tracks of a process, indexed into [`COUNTERS`].
#[derive(Clone, Copy)]
enum Counter {
    KvUsage = 0,
    Running = 1,
    Waiting = 2,
    Preemptions = 3,
    SyscallRate = 4,
}

/// `(track name, unit)` of each [`Counter`].
const COUNTERS: [(&str, &str); 5] = [
    ("KV cache usage", "fraction"),
    ("requests running", "requests"),
    ("requests waiting", "requests"),
    ("preemptions", "preemptions"),
    ("syscalls/s", "calls/s"),
];

/// Per-kind counts of what the sink wrote (printed at exit).
#[derive(Clone, Debug, Default)]
pub struct EventCounts {
    /// Events per kind name (`step`, `request`, `range`, `slow_syscall`, ...).
    pub by_kind: BTreeMap<&'static str, u64>,
}

/// Where a request is in its lifecycle.
struct RequestState {
    arrived_ns: u64,
    first_token_ns: Option<u64>,
    /// Name of the open inner phase slice, if any.
    phase: Option<&'static str>,
    prompt_tokens: u32,
    output_tokens: u32,
    preemptions: u32,
}

/// The sink. Feed it ordered events with [`TraceSink::push`], then call [`TraceSink::finish`].
pub struct TraceSink<W: Write> {
    w: PacketWriter<W>,
    tracks: HashSet<u64>,
    processes: HashMap<u32, ProcessInfo>,
    thread_names: HashMap<u32, String>,
    requests: BTreeMap<(u32, u64), RequestState>,
    /// Open NVTX ranges per (pid, tid): names, innermost last.
    ranges: BTreeMap<(u32, u32), Vec<String>>,
    counts: EventCounts,
    last_ts: u64,
    first_ts: Option<u64>,
    cuda: CudaAggregator,
    cuda_out: Vec<CudaSlice>,
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
            thread_names: HashMap::new(),
            requests: BTreeMap::new(),
            ranges: BTreeMap::new(),
            counts: EventCounts::default(),
            last_ts: clocks.map(|c| c.0).unwrap_or(0),
            first_ts: None,
            cuda: CudaAggregator::new(processes.iter().filter(|p| p.engine_probes).map(|p| p.pid)),
            cuda_out: Vec::new(),
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
                let text = format!(
                    "engine probes not found in pid {}: engine tracks are empty",
                    p.pid
                );
                s.marker(ts, &text)?;
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
            .map(|r| 1 + usize::from(r.phase.is_some()))
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

    fn count(&mut self, kind: &'static str) {
        *self.counts.by_kind.entry(kind).or_default() += 1;
    }

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
        let (name, cmdline) = match self.processes.get(&pid) {
            Some(p) => (
                Some(p.name.clone()),
                p.cmdline
                    .split(' ')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect(),
            ),
            None => (None, Vec::new()),
        };
        self.descriptor(TrackDescriptor {
            uuid: Some(id),
            process: Some(ProcessDescriptor {
                pid: Some(pid as i32),
                cmdline,
                process_name: name,
            }),
            ..Default::default()
        })
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

    fn child_track(&mut self, pid: u32, id: u64, name: String) -> io::Result<u64> {
        if self.tracks.contains(&id) {
            return Ok(id);
        }
        let parent = self.process_track(pid)?;
        self.descriptor(TrackDescriptor {
            uuid: Some(id),
            parent_uuid: Some(parent),
            name: Some(name),
            ..Default::default()
        })
    }

    fn counter_track(&mut self, pid: u32, c: Counter) -> io::Result<u64> {
        let id = uuid(NS_COUNTER, (u64::from(pid) << 8) | c as u64);
        if self.tracks.contains(&id) {
            return Ok(id);
        }
        let parent = self.process_track(pid)?;
        let (name, unit) = COUNTERS[c as usize];
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

    fn slice(
        &mut self,
        ts: u64,
        dur: u64,
        track: u64,
        name: &str,
        args: Vec<Arg>,
        flows: Vec<u64>,
    ) -> io::Result<()> {
        let begin = TrackEvent {
            r#type: Some(TYPE_SLICE_BEGIN),
            track_uuid: Some(track),
            flow_ids: flows,
            ..Default::default()
        };
        self.w.write_event(ts, Some(name), begin, args)?;
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

    /// An instant on the llmprof track.
    pub fn marker(&mut self, ts: u64, text: &str) -> io::Result<()> {
        let t = self.global_track(0, LLMPROF_TRACK.to_owned(), false)?;
        self.instant(ts, t, text, vec![arg_s("marker", text)], Vec::new())
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

    /// An instant on the llmprof track with string args (session metadata, e.g. the alert behind a trace).
    pub fn annotation(&mut self, ts: u64, name: &str, args: &[(&'static str, String)]) -> io::Result<()> {
        let t = self.global_track(0, LLMPROF_TRACK.to_owned(), false)?;
        let args = args.iter().map(|(k, v)| arg_s(k, v.clone())).collect();
        self.instant(ts, t, name, args, Vec::new())
    }

    /// Writes one event.
    pub fn push(&mut self, ev: &Event) -> io::Result<()> {
        let ts = ev.ts_ns;
        self.last_ts = self.last_ts.max(ts);
        self.first_ts.get_or_insert(ts);
        self.cuda.advance(ts, &mut self.cuda_out);
        self.write_cuda()?;
        match &ev.body {
            EventBody::Step(rec) => {
                self.count("step");
                self.step(ev.pid, rec)?;
                self.cuda.step(
                    ev.pid,
                    rec.host_start_ns,
                    rec.host_end_ns,
                    rec.step_id,
                    &mut self.cuda_out,
                );
                self.write_cuda()
            }
            EventBody::CudaCall {
                func,
                variant,
                dur_ns,
                arg,
                result,
            } => {
                self.count("cuda_call");
                self.cuda.call(
                    ev.pid,
                    ev.tid,
                    ts,
                    *func,
                    *variant,
                    *dur_ns,
                    *arg,
                    *result,
                    &mut self.cuda_out,
                );
                self.write_cuda()
            }
            EventBody::GpuSample(g) => {
                self.count("gpu_sample");
                self.gpu_sample(ev.pid, ts, g)
            }
            EventBody::Request(rec) => {
                self.count("request");
                self.request(ev.pid, ts, rec)
            }
            // Prompt and completion text go to OTel spans only (`--capture-content`); the trace file, which is
            // passed around more freely, never holds it. Counted so the summary says it was seen.
            EventBody::Content { .. } => {
                self.count("content");
                Ok(())
            }
            EventBody::Range(rec) => {
                self.count("range");
                let track = self.thread_track(ev.pid, ev.tid)?;
                let name = format!("{}::{}", read_str(&rec.domain), read_str(&rec.name));
                match RangeOp::from_raw(rec.op) {
                    Some(RangeOp::Push) => {
                        self.ranges
                            .entry((ev.pid, ev.tid))
                            .or_default()
                            .push(name.clone());
                        let args = vec![arg_u("step_id", rec.step_id)];
                        self.begin(ts, track, &name, args, Vec::new())
                    }
                    Some(RangeOp::Pop) => {
                        let stack = self.ranges.entry((ev.pid, ev.tid)).or_default();
                        if stack.pop().is_some() {
                            self.end(ts, track, Vec::new())
                        } else {
                            // A pop whose push happened before we attached: nothing to close.
                            self.instant(
                                ts,
                                track,
                                "unmatched range pop",
                                vec![arg_s("range", name)],
                                Vec::new(),
                            )
                        }
                    }
                    Some(RangeOp::Mark) => {
                        self.instant(ts, track, &name, vec![arg_u("step_id", rec.step_id)], Vec::new())
                    }
                    None => Ok(()),
                }
            }
            EventBody::SlowSyscall { nr, ret, dur_ns } => {
                self.count("slow_syscall");
                let track = self.thread_track(ev.pid, ev.tid)?;
                let name = syscall_names::name(*nr);
                let args = vec![
                    arg_u("nr", *nr),
                    arg_i("ret", *ret),
                    arg_f("latency_ms", *dur_ns as f64 / 1e6),
                ];
                self.slice(ts, *dur_ns, track, &format!("syscall {name}"), args, Vec::new())
            }
            EventBody::FileOpen { path, ret, dur_ns } => {
                self.count("file_open");
                let track = self.thread_track(ev.pid, ev.tid)?;
                let args = vec![
                    arg_s("path", path.clone()),
                    arg_i("ret", *ret),
                    arg_f("latency_ms", *dur_ns as f64 / 1e6),
                ];
                self.slice(ts, *dur_ns, track, "model file open", args, Vec::new())
            }
            EventBody::FileIo {
                op,
                fd,
                path,
                ret,
                len,
                dur_ns,
            } => {
                self.count("file_io");
                let track = self.thread_track(ev.pid, ev.tid)?;
                let mut args = vec![
                    arg_i("fd", i64::from(*fd)),
                    arg_u("requested_bytes", *len),
                    arg_f("latency_ms", *dur_ns as f64 / 1e6),
                ];
                if let Some(p) = path {
                    args.push(arg_s("path", p.clone()));
                }
                match op {
                    llmprof_abi::FileOp::Read | llmprof_abi::FileOp::Pread | llmprof_abi::FileOp::Readv => {
                        args.push(arg_i("bytes", *ret));
                    }
                    llmprof_abi::FileOp::Mmap => args.push(arg_s("address", format!("{:#x}", *ret as u64))),
                    llmprof_abi::FileOp::Close => args.push(arg_i("ret", *ret)),
                }
                self.slice(
                    ts,
                    *dur_ns,
                    track,
                    &format!("model file {}", op.name()),
                    args,
                    Vec::new(),
                )
            }
            EventBody::Connect {
                addr,
                port,
                ret,
                dur_ns,
                allowed,
            } => {
                self.count("connect");
                let track = self.thread_track(ev.pid, ev.tid)?;
                let verdict = if *allowed { "allowed" } else { "flagged" };
                let args = vec![
                    arg_s("address", addr.to_string()),
                    arg_u("port", *port),
                    arg_b("allowed", *allowed),
                    arg_s("verdict", verdict),
                    arg_i("ret", *ret),
                    arg_f("latency_ms", *dur_ns as f64 / 1e6),
                ];
                let name = if *allowed {
                    "connect"
                } else {
                    "connect (flagged egress)"
                };
                self.instant(ts, track, name, args, Vec::new())
            }
            EventBody::ProcessExit { exit_code } => {
                self.count("process_exit");
                let t = self.global_track(0, LLMPROF_TRACK.to_owned(), false)?;
                let args = vec![
                    arg_s("marker", "target exited"),
                    arg_u("pid", ev.pid),
                    arg_i("exit_code", *exit_code),
                ];
                self.instant(ts, t, "target exited", args, Vec::new())
            }
            EventBody::Metrics(m) => {
                self.count("metrics");
                self.metrics(ev.pid, ts, m)
            }
            EventBody::SyscallRate { per_sec } => {
                self.count("syscall_rate");
                let t = self.counter_track(ev.pid, Counter::SyscallRate)?;
                self.counter(ts, t, *per_sec)
            }
            EventBody::Marker { text } => {
                self.count("marker");
                self.marker(ts, text)
            }
            EventBody::Overhead(o) => {
                self.count("overhead");
                self.overhead(ts, o)
            }
            EventBody::Degraded(d) => {
                self.count("degradation");
                self.degraded(ts, d)
            }
        }
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
            name: Some(CUDA_TRACK.to_owned()),
            ..Default::default()
        })
    }

    /// Writes the CUDA slices the aggregator produced.
    fn write_cuda(&mut self) -> io::Result<()> {
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
        let track = self.cuda_track(s.pid, s.tid)?;
        let (name, mut args) = match &s.kind {
            CudaSliceKind::Call {
                func,
                variant,
                arg,
                result,
            } => {
                self.count("cuda_slice");
                let mut args = vec![
                    arg_s("function", format!("{}{}", func.name(), variant.suffix())),
                    arg_f("host_ms", s.dur_ns as f64 / 1e6),
                    arg_u("result", *result),
                ];
                match func.arg() {
                    Some((_, llmprof_abi::CudaArg::Bytes)) => args.push(arg_u("bytes", *arg)),
                    Some((_, llmprof_abi::CudaArg::DevicePtr)) => {
                        args.push(arg_s("dptr", format!("{arg:#x}")));
                    }
                    Some((_, llmprof_abi::CudaArg::Stream)) => {
                        args.push(arg_s("stream", format!("{arg:#x}")));
                    }
                    None => {}
                }
                (format!("{} (host)", func.name()), args)
            }
            CudaSliceKind::Batch {
                funcs,
                calls,
                host_total_ns,
                max_ns,
                errors,
                end,
                per_step,
            } => {
                self.count("cuda_batch");
                let name = match funcs.keys().next() {
                    Some(f) if funcs.len() == 1 => format!("{} ×{calls} (host)", f.name()),
                    _ => format!("CUDA calls ×{calls} (host)"),
                };
                let breakdown: Vec<String> = funcs
                    .iter()
                    .map(|(f, (n, ns))| format!("{}={n} ({:.3} ms)", f.name(), *ns as f64 / 1e6))
                    .collect();
                let launches: u64 = funcs
                    .iter()
                    .filter(|(f, _)| f.class() == llmprof_abi::CudaClass::Launch)
                    .map(|(_, (n, _))| n)
                    .sum();
                let mut args = vec![
                    arg_u("calls", *calls),
                    arg_u("launches", launches),
                    arg_f("host_total_ms", *host_total_ns as f64 / 1e6),
                    arg_f("host_max_ms", *max_ns as f64 / 1e6),
                    arg_s("functions", breakdown.join(" ")),
                    arg_s(
                        "aggregated_per",
                        if *per_step { "engine step" } else { "10 ms window" },
                    ),
                    arg_u("errors", *errors),
                ];
                match end {
                    BatchEnd::Step => args.push(arg_s("ended_by", "step end")),
                    BatchEnd::Window => args.push(arg_s("ended_by", "window")),
                    BatchEnd::Call => args.push(arg_s("ended_by", "next individual call")),
                    BatchEnd::End => args.push(arg_s("ended_by", "end of trace")),
                }
                (name, args)
            }
        };
        if let Some(id) = s.step_id {
            args.push(arg_u("step_id", id));
        }
        args.push(arg_s("note", CUDA_NOTE));
        let begin = TrackEvent {
            r#type: Some(TYPE_SLICE_BEGIN),
            track_uuid: Some(track),
            categories: vec![CUDA_CATEGORY.to_owned()],
            ..Default::default()
        };
        self.w.write_event(s.ts_ns, Some(&name), begin, args)?;
        self.end(s.ts_ns + s.dur_ns, track, Vec::new())
    }

    fn gpu_track(&mut self, g: &GpuSample, metric: usize) -> io::Result<u64> {
        let idx = u64::from(g.index) << 8;
        let group = uuid(NS_GPU, idx | 0xff);
        if !self.tracks.contains(&group) {
            let name = if g.uuid.is_empty() {
                format!("GPU {}: {}", g.index, g.name)
            } else {
                format!("GPU {}: {} ({})", g.index, g.name, g.uuid)
            };
            self.descriptor(TrackDescriptor {
                uuid: Some(group),
                name: Some(name),
                ..Default::default()
            })?;
        }
        let id = uuid(NS_GPU, idx | metric as u64);
        if self.tracks.contains(&id) {
            return Ok(id);
        }
        let (name, unit) = GPU_COUNTERS[metric];
        self.descriptor(TrackDescriptor {
            uuid: Some(id),
            parent_uuid: Some(group),
            name: Some(format!("GPU {} {name}", g.index)),
            counter: Some(CounterDescriptor {
                unit_name: Some(unit.to_owned()),
                is_incremental: None,
            }),
            ..Default::default()
        })
    }

    fn gpu_sample(&mut self, pid: u32, ts: u64, g: &GpuSample) -> io::Result<()> {
        let values = [
            g.util_gpu_pct,
            g.util_mem_pct,
            g.mem_used_bytes.map(|b| b as f64 / MIB),
            g.power_w,
            g.sm_clock_mhz,
            g.temperature_c,
            g.pcie_tx_bytes_per_s.map(|b| b / 1e6),
            g.pcie_rx_bytes_per_s.map(|b| b / 1e6),
        ];
        for (metric, v) in values.into_iter().enumerate() {
            if let Some(v) = v {
                let t = self.gpu_track(g, metric)?;
                self.counter(ts, t, v)?;
            }
        }
        // The traced process's device memory: 0 when it has no context on this GPU (once it had one).
        let id = uuid(NS_GPU, (1 << 40) | (u64::from(pid) << 8) | u64::from(g.index));
        if g.process_mem_bytes.is_some() || self.tracks.contains(&id) {
            if !self.tracks.contains(&id) {
                let parent = self.process_track(pid)?;
                self.descriptor(TrackDescriptor {
                    uuid: Some(id),
                    parent_uuid: Some(parent),
                    name: Some(format!("GPU {} memory (pid {pid})", g.index)),
                    counter: Some(CounterDescriptor {
                        unit_name: Some("MiB".to_owned()),
                        is_incremental: None,
                    }),
                    ..Default::default()
                })?;
            }
            self.counter(ts, id, g.process_mem_bytes.unwrap_or(0) as f64 / MIB)?;
        }
        Ok(())
    }

    fn overhead_counter(&mut self, i: usize, ts: u64, v: f64) -> io::Result<()> {
        let id = uuid(NS_GLOBAL, OVERHEAD_KEY + i as u64);
        if !self.tracks.contains(&id) {
            let (name, unit) = OVERHEAD_COUNTERS[i];
            self.descriptor(TrackDescriptor {
                uuid: Some(id),
                name: Some(name.to_owned()),
                counter: Some(CounterDescriptor {
                    unit_name: Some(unit.to_owned()),
                    is_incremental: None,
                }),
                ..Default::default()
            })?;
        }
        self.counter(ts, id, v)
    }

    fn overhead(&mut self, ts: u64, o: &OverheadSample) -> io::Result<()> {
        let secs = (o.interval_ns as f64 / 1e9).max(1e-9);
        if let Some(p) = o.est_overhead_pct {
            self.overhead_counter(0, ts, p)?;
        }
        self.overhead_counter(1, ts, o.est_added_ns / 1e6 / secs)?;
        self.overhead_counter(2, ts, o.llmprof_cpu_ns / o.interval_ns.max(1) as f64 * 100.0)?;
        self.overhead_counter(3, ts, o.llmprof_rss_bytes as f64 / (1u64 << 20) as f64)?;
        self.overhead_counter(4, ts, o.cost_syscall_ns)?;
        if let Some(c) = o.cost_probe_ns {
            self.overhead_counter(5, ts, c)?;
        }
        if let Some(c) = o.cost_cuda_ns {
            self.overhead_counter(7, ts, c)?;
        }
        self.overhead_counter(6, ts, f64::from(o.level))
    }

    fn degraded(&mut self, ts: u64, d: &Degradation) -> io::Result<()> {
        let t = self.global_track(0, LLMPROF_TRACK.to_owned(), false)?;
        let args = vec![
            arg_u("level", d.level),
            arg_s("step", d.name),
            arg_s("change", d.change.clone()),
            arg_f("est_overhead_pct", d.overhead_pct),
            arg_f("budget_pct", d.budget_pct),
            arg_u("syscalls_counted", d.syscalls_counted),
        ];
        self.instant(
            ts,
            t,
            &format!("{DEGRADATION_PREFIX}{}", d.name),
            args,
            Vec::new(),
        )
    }

    fn metrics(&mut self, pid: u32, ts: u64, m: &MetricsSample) -> io::Result<()> {
        for (c, v) in [
            (Counter::KvUsage, m.kv_cache_usage),
            (Counter::Running, m.running),
            (Counter::Waiting, m.waiting),
            (Counter::Preemptions, m.preemptions_total),
        ] {
            if let Some(v) = v {
                let t = self.counter_track(pid, c)?;
                self.counter(ts, t, v)?;
            }
        }
        Ok(())
    }

    fn step(&mut self, pid: u32, r: &StepRecord) -> io::Result<()> {
        let kind = StepKind::from_raw(r.kind).map(StepKind::name).unwrap_or("step");
        let steps = self.child_track(pid, uuid(NS_STEPS, u64::from(pid)), STEPS_TRACK.to_owned())?;
        let n = (r.num_req_ids as usize).min(r.req_ids.len());
        let flows: Vec<u64> = r.req_ids[..n].iter().map(|&q| pid_req(pid, q)).collect();
        let req_ids = r.req_ids[..n]
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let req_tokens = r.req_tokens[..n]
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let args = vec![
            arg_u("step_id", r.step_id),
            arg_u("num_seqs", r.num_seqs),
            arg_u("prefill_tokens", r.prefill_tokens),
            arg_u("decode_tokens", r.decode_tokens),
            arg_u("kv_blocks_used", r.kv_blocks_used),
            arg_u("kv_blocks_total", r.kv_blocks_total),
            arg_u("num_waiting", r.num_waiting),
            arg_u("num_preempted", r.num_preempted),
            arg_s("req_ids", req_ids),
            arg_s("req_tokens", req_tokens),
            arg_b("req_ids_truncated", r.req_ids_truncated != 0),
        ];
        let dur = r.host_end_ns.saturating_sub(r.host_start_ns);
        self.slice(r.host_start_ns, dur, steps, kind, args, flows)?;
        if r.device_end_ns > r.device_start_ns {
            let label = match r.device_clock {
                x if x == DeviceClock::CudaEvents as u32 => "device (CUDA)",
                _ => "device (host compute)",
            };
            let dev = self.child_track(pid, uuid(NS_DEVICE, u64::from(pid)), label.to_owned())?;
            let args = vec![arg_u("step_id", r.step_id)];
            self.slice(
                r.device_start_ns,
                r.device_end_ns - r.device_start_ns,
                dev,
                kind,
                args,
                Vec::new(),
            )?;
        }
        Ok(())
    }

    fn request_track(&mut self, pid: u32, req: u64, xid: &str) -> io::Result<u64> {
        let name = if xid.is_empty() {
            format!("request {req}")
        } else {
            format!("request {req} ({xid})")
        };
        self.child_track(pid, uuid(NS_REQUEST, pid_req(pid, req)), name)
    }

    fn request(&mut self, pid: u32, ev_ts: u64, r: &RequestRecord) -> io::Result<()> {
        let ts = if r.ts_ns != 0 { r.ts_ns } else { ev_ts };
        let Some(kind) = RequestEventKind::from_raw(r.kind) else {
            return Ok(());
        };
        let xid = read_str(&r.x_request_id).to_owned();
        let track = self.request_track(pid, r.req_id, &xid)?;
        let key = (pid, r.req_id);
        let flow = pid_req(pid, r.req_id);
        if !self.requests.contains_key(&key) {
            // First sight: open the request slice (mid-request when we attached after it arrived).
            let mut args = vec![
                arg_u("req_id", r.req_id),
                arg_u("prompt_tokens", r.prompt_tokens),
                arg_u("max_tokens", r.max_tokens),
                arg_f("temperature", f64::from(r.temperature)),
                arg_f("top_p", f64::from(r.top_p)),
                arg_s("model", read_str(&r.model)),
                arg_s("x_request_id", xid.clone()),
                arg_s(
                    "endpoint",
                    if r.is_chat != 0 {
                        "/v1/chat/completions"
                    } else {
                        "/v1/completions"
                    },
                ),
            ];
            if r.has_trace_context != 0 {
                args.push(arg_s("trace_id", hex(&r.trace_id)));
                args.push(arg_s("parent_span_id", hex(&r.parent_span_id)));
            }
            if kind != RequestEventKind::Arrived {
                args.push(arg_b("attached_mid_request", true));
            }
            self.begin(ts, track, &format!("request {}", r.req_id), args, vec![flow])?;
            self.requests.insert(
                key,
                RequestState {
                    arrived_ns: ts,
                    first_token_ns: None,
                    phase: None,
                    prompt_tokens: r.prompt_tokens,
                    output_tokens: 0,
                    preemptions: 0,
                },
            );
        }
        let next_phase = match kind {
            RequestEventKind::Arrived => Some("queued"),
            RequestEventKind::Scheduled => {
                let first = self.requests.get(&key).and_then(|s| s.first_token_ns);
                Some(if first.is_some() { "decode" } else { "prefill" })
            }
            RequestEventKind::FirstToken => Some("decode"),
            RequestEventKind::Preempted => Some("queued (preempted)"),
            RequestEventKind::Finished => None,
        };
        // Close the current phase.
        let open = self.requests.get_mut(&key).and_then(|s| s.phase.take());
        if open.is_some() {
            self.end(ts, track, Vec::new())?;
        }
        if let Some(s) = self.requests.get_mut(&key) {
            s.output_tokens = s.output_tokens.max(r.output_tokens);
            s.prompt_tokens = s.prompt_tokens.max(r.prompt_tokens);
            if kind == RequestEventKind::FirstToken {
                s.first_token_ns.get_or_insert(ts);
            }
            s.preemptions = s.preemptions.max(r.num_preemptions);
        }
        match kind {
            RequestEventKind::Preempted => {
                let args = vec![
                    arg_u("num_preemptions", r.num_preemptions),
                    arg_u("output_tokens", r.output_tokens),
                ];
                self.instant(ts, track, "preempted", args, Vec::new())?;
            }
            RequestEventKind::FirstToken => {
                let ttft = self
                    .requests
                    .get(&key)
                    .map(|s| ts.saturating_sub(s.arrived_ns))
                    .unwrap_or(0);
                self.instant(
                    ts,
                    track,
                    "first token",
                    vec![arg_f("ttft_ms", ttft as f64 / 1e6)],
                    Vec::new(),
                )?;
            }
            _ => {}
        }
        if kind == RequestEventKind::Finished {
            let reason = FinishReason::from_raw(r.finish_reason).name();
            let args = vec![
                arg_s("finish_reason", reason),
                arg_u("output_tokens", r.output_tokens),
            ];
            self.instant(ts, track, "finished", args, vec![flow])?;
            if let Some(s) = self.requests.remove(&key) {
                let args = self.request_end_args(&s, reason, "finished");
                self.end(ts, track, args)?;
            }
            return Ok(());
        }
        if let Some(p) = next_phase {
            self.begin(ts, track, p, Vec::new(), Vec::new())?;
            if let Some(s) = self.requests.get_mut(&key) {
                s.phase = Some(p);
            }
        }
        Ok(())
    }

    fn request_end_args(&self, s: &RequestState, reason: &str, closed_by: &str) -> Vec<Arg> {
        let mut args = vec![
            arg_s("finish_reason", reason),
            arg_u("prompt_tokens", s.prompt_tokens),
            arg_u("output_tokens", s.output_tokens),
            arg_u("num_preemptions", s.preemptions),
            arg_s("closed_by", closed_by),
        ];
        if let Some(ft) = s.first_token_ns {
            args.push(arg_f("ttft_ms", ft.saturating_sub(s.arrived_ns) as f64 / 1e6));
        }
        args
    }

    /// Closes what is still open (requests, ranges) at the last timestamp seen with `closed_by` = `reason`,
    /// writes the summary, flushes, and returns the sink.
    pub fn finish(mut self, stats: &SessionStats, end_ts: Option<u64>) -> io::Result<W> {
        let ts = end_ts.unwrap_or(self.last_ts).max(self.last_ts);
        let reason = if stats.end_reason.is_empty() {
            "end of trace"
        } else {
            stats.end_reason.as_str()
        };
        let open: Vec<_> = std::mem::take(&mut self.requests).into_iter().collect();
        for ((pid, req), s) in open {
            let track = self.request_track(pid, req, "")?;
            if s.phase.is_some() {
                self.end(ts, track, vec![arg_s("closed_by", reason)])?;
            }
            let args = self.request_end_args(&s, "unfinished", reason);
            self.end(ts, track, args)?;
        }
        self.flush_cuda()?;
        let ranges: Vec<_> = std::mem::take(&mut self.ranges).into_iter().collect();
        for ((pid, tid), stack) in ranges {
            let track = self.thread_track(pid, tid)?;
            for _ in stack {
                self.end(ts, track, vec![arg_s("closed_by", reason)])?;
            }
        }
        // Per-probe drop counters: 0 at the start, the total at the end.
        let start = self.first_ts.unwrap_or(ts).min(ts);
        for (i, name) in PROBE_NAMES.iter().enumerate() {
            let t = self.global_track(1 + i as u64, format!("llmprof drops: {name}"), true)?;
            self.counter(start, t, 0.0)?;
            self.counter(ts, t, stats.probes[i].dropped as f64)?;
        }
        let mut args = vec![
            arg_s("end_reason", reason),
            arg_u("total_dropped", stats.total_dropped()),
            arg_u("user_drops", stats.user_drops),
            arg_u("decode_errors", stats.decode_errors),
        ];
        for (i, name) in PROBE_NAMES.iter().enumerate() {
            let c = stats.probes[i];
            args.push(arg_s(
                name,
                format!("hits={} emitted={} dropped={}", c.hits, c.emitted, c.dropped),
            ));
        }
        let mut sys = stats.syscalls.clone();
        sys.sort_by_key(|a| std::cmp::Reverse(a.total_ns));
        let top: Vec<String> = sys
            .iter()
            .take(SUMMARY_TOP_SYSCALLS)
            .map(|a| {
                format!(
                    "{} tid={} count={} total_ms={:.3}",
                    syscall_names::name(a.nr),
                    a.tid,
                    a.count,
                    a.total_ns as f64 / 1e6
                )
            })
            .collect();
        args.push(arg_s("top_syscalls", top.join("; ")));
        let c = self.cuda.stats();
        if c.calls > 0 {
            args.push(arg_s(
                "cuda_calls",
                format!(
                    "calls={} individual={} batches={} batched={} over_budget={}",
                    c.calls, c.individual, c.batches, c.batched_calls, c.over_budget
                ),
            ));
        }
        let events: Vec<String> = self
            .counts
            .by_kind
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        args.push(arg_s("events", events.join(" ")));
        if let Some(o) = &stats.overhead {
            args.extend(overhead_args(o));
        }
        let t = self.global_track(0, LLMPROF_TRACK.to_owned(), false)?;
        self.instant(ts, t, SUMMARY_EVENT, args, Vec::new())?;
        self.w.finish()
    }
}

/// The self-accounting part of the summary (documented in docs/perfetto-trace.md; read by `llmprof report`).
fn overhead_args(o: &crate::event::OverheadSummary) -> Vec<Arg> {
    let mut args = vec![
        arg_f("overhead_est_target_cpu_ms", o.est_added_ns / 1e6),
        arg_f("llmprof_cpu_ms", o.llmprof_cpu_ns / 1e6),
        arg_f(
            "llmprof_cpu_pct",
            o.llmprof_cpu_ns / (o.elapsed_ns.max(1) as f64) * 100.0,
        ),
        arg_f(
            "llmprof_max_rss_mib",
            o.llmprof_max_rss_bytes as f64 / (1u64 << 20) as f64,
        ),
    ];
    if let Some(t) = o.target_cpu_ns {
        args.push(arg_f("target_cpu_ms", t / 1e6));
    }
    if let Some(p) = o.est_overhead_pct {
        args.push(arg_f("overhead_est_target_pct", p));
    }
    if let Some(c) = &o.calibration {
        args.push(arg_f("cost_ns_syscall", c.syscall_ns));
        if let Some(p) = c.probe_ns {
            args.push(arg_f("cost_ns_engine_probe", p));
        }
        if let Some(p) = c.probe_sampled_out_ns {
            args.push(arg_f("cost_ns_engine_probe_sampled_out", p));
        }
        if let Some(p) = c.cuda_call_ns {
            args.push(arg_f("cost_ns_cuda_call", p));
        }
        args.push(arg_f("syscalls_per_probe_hit", c.syscalls_per_probe_hit));
        args.push(arg_s("probe_entry", c.entry_name()));
        args.push(arg_f("calibration_ms", c.took_ms));
    }
    let by_probe: Vec<String> = PROBE_NAMES
        .iter()
        .zip(&o.est_added_by_probe_ns)
        .filter(|(_, ns)| **ns > 0.0)
        .map(|(name, ns)| format!("{name}={:.3}", ns / 1e6))
        .collect();
    args.push(arg_s("overhead_by_probe_ms", by_probe.join(" ")));
    if let Some(b) = o.budget_pct {
        args.push(arg_f("overhead_budget_pct", b));
    }
    let steps: Vec<&str> = o.degradations.iter().map(|d| d.name).collect();
    args.push(arg_s("degradations", steps.join(" ")));
    if let Some(l) = o.size_limit {
        args.push(arg_u("trace_size_limit_bytes", l));
        args.push(arg_u("events_not_written", o.events_not_written));
    }
    args
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
