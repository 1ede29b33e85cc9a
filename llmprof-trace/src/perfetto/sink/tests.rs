//! Each step of [`TraceSink::push`] on events built in code: the written bytes are decoded with our own schema
//! and the packets checked (track, type, name, args, flows), by the names of [`crate::names`].

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use llmprof_abi::{
    CudaFunc, CudaVariant, FileOp, RangeOp, RangeRecord, RequestEventKind, RequestRecord, StepKind,
    StepRecord, fill_str,
};
use prost::Message;

use super::*;
use crate::event::{Degradation, GpuSample, MetricsSample, SessionStats, ThreadInfo};
use crate::names::{arg, category, counter, marker, slice, track};
use crate::perfetto::schema::{DebugAnnotation, Trace};

const PID: u32 = 4242;
const TID: u32 = 4243;
const MS: u64 = 1_000_000;
const T0: u64 = 1_000 * MS;

/// A decoded annotation value.
#[derive(Clone, Debug, PartialEq)]
enum V {
    U(u64),
    I(i64),
    F(f64),
    B(bool),
    S(String),
    A(Vec<V>),
}

fn value(d: &DebugAnnotation) -> V {
    if let Some(v) = d.uint_value {
        V::U(v)
    } else if let Some(v) = d.int_value {
        V::I(v)
    } else if let Some(v) = d.double_value {
        V::F(v)
    } else if let Some(v) = d.bool_value {
        V::B(v)
    } else if let Some(v) = &d.string_value {
        V::S(v.clone())
    } else {
        V::A(d.array_values.iter().map(value).collect())
    }
}

/// One track event as a reader sees it.
#[derive(Clone, Debug)]
struct Ev {
    ts: u64,
    kind: i32,
    track: String,
    name: String,
    args: HashMap<String, V>,
    flows: Vec<u64>,
    terminating: Vec<u64>,
    categories: Vec<String>,
    counter: Option<f64>,
}

impl Ev {
    fn arg(&self, key: &str) -> &V {
        self.args
            .get(key)
            .unwrap_or_else(|| panic!("{} has no arg {key}: {:?}", self.name, self.args))
    }
}

/// Decodes a whole trace: its track names (thread and process tracks by their descriptor's name) and events.
fn decode(bytes: &[u8]) -> (HashMap<u64, String>, Vec<Ev>) {
    let trace = Trace::decode(bytes).unwrap();
    let (mut names, mut arg_names, mut tracks) = (HashMap::new(), HashMap::new(), HashMap::new());
    let mut evs = Vec::new();
    for p in trace.packet {
        if let Some(i) = &p.interned_data {
            for n in &i.event_names {
                names.insert(n.iid.unwrap(), n.name.clone().unwrap());
            }
            for n in &i.debug_annotation_names {
                arg_names.insert(n.iid.unwrap(), n.name.clone().unwrap());
            }
        }
        if let Some(d) = &p.track_descriptor {
            let name = d
                .name
                .clone()
                .or_else(|| d.thread.as_ref().and_then(|t| t.thread_name.clone()))
                .or_else(|| d.process.as_ref().and_then(|p| p.process_name.clone()))
                .unwrap_or_default();
            tracks.insert(d.uuid.unwrap(), name);
        }
        let Some(e) = p.track_event else { continue };
        evs.push(Ev {
            ts: p.timestamp.unwrap(),
            kind: e.r#type.unwrap(),
            track: tracks[&e.track_uuid.unwrap()].clone(),
            name: e.name_iid.map(|i| names[&i].clone()).unwrap_or_default(),
            args: e
                .debug_annotations
                .iter()
                .map(|a| (arg_names[&a.name_iid.unwrap()].clone(), value(a)))
                .collect(),
            flows: e.flow_ids,
            terminating: e.terminating_flow_ids,
            categories: e.categories,
            counter: e.double_counter_value,
        });
    }
    (tracks, evs)
}

fn process() -> ProcessInfo {
    ProcessInfo {
        pid: PID,
        name: "llmserve".into(),
        cmdline: "llmserve --model m.gguf".into(),
        threads: vec![ThreadInfo {
            tid: TID,
            name: "scheduler".into(),
        }],
        engine_probes: true,
    }
}

/// The events of a session written and decoded (the session ends "duration elapsed" at the last event).
fn write(events: &[Event]) -> (HashMap<u64, String>, Vec<Ev>) {
    let mut sink = TraceSink::new(Vec::new(), &[process()], Some((T0, 1))).unwrap();
    for e in events {
        sink.push(e).unwrap();
    }
    let stats = SessionStats {
        end_reason: "duration elapsed".into(),
        ..Default::default()
    };
    decode(&sink.finish(&stats, None).unwrap())
}

fn ev(ms: u64, body: EventBody) -> Event {
    Event {
        ts_ns: T0 + ms * MS,
        pid: PID,
        tid: TID,
        body,
    }
}

fn req(ms: u64, id: u64, kind: RequestEventKind) -> Event {
    let rec = RequestRecord {
        is_chat: 1,
        prompt_tokens: 12,
        output_tokens: u32::from(kind == RequestEventKind::Finished) * 3,
        finish_reason: u32::from(kind == RequestEventKind::Finished),
        x_request_id: fill_str("xr"),
        model: fill_str("smollm2"),
        ..RequestRecord::new(kind, id, T0 + ms * MS)
    };
    ev(ms, EventBody::Request(Box::new(rec)))
}

fn step(id: u64, kind: StepKind, start: u64, end: u64, reqs: &[u64]) -> Event {
    let rec = StepRecord {
        host_start_ns: T0 + start * MS,
        host_end_ns: T0 + end * MS,
        device_start_ns: T0 + start * MS,
        device_end_ns: T0 + end * MS,
        num_seqs: reqs.len() as u32,
        ..StepRecord::new(kind, id, reqs)
    }
    .with_req_tokens([8, 4]);
    ev(end, EventBody::Step(Box::new(rec)))
}

fn on<'a>(evs: &'a [Ev], track_name: &str) -> Vec<&'a Ev> {
    evs.iter().filter(|e| e.track == track_name).collect()
}

#[test]
fn step_is_a_slice_with_its_requests_as_typed_args_and_flows() {
    let (_, evs) = write(&[step(7, StepKind::Mixed, 1, 3, &[1, 2])]);
    let steps = on(&evs, track::STEPS);
    assert_eq!(steps.len(), 2, "begin and end: {steps:?}");
    let b = steps[0];
    let mixed = slice::step(Some(StepKind::Mixed));
    assert_eq!((b.kind, b.name.as_str()), (TYPE_SLICE_BEGIN, mixed));
    assert_eq!(b.arg(arg::STEP_ID), &V::U(7));
    assert_eq!(b.arg(arg::NUM_SEQS), &V::U(2));
    assert_eq!(b.arg(arg::REQ_IDS), &V::A(vec![V::U(1), V::U(2)]));
    assert_eq!(b.arg(arg::REQ_TOKENS), &V::A(vec![V::U(8), V::U(4)]));
    assert_eq!(b.arg(arg::REQ_IDS_TRUNCATED), &V::B(false));
    assert_eq!(b.flows, [pid_req(PID, 1), pid_req(PID, 2)]);
    assert_eq!(steps[1].ts - b.ts, 2 * MS);
    let dev = on(&evs, track::DEVICE_HOST);
    assert_eq!(dev[0].name, mixed);
    assert_eq!(dev[0].arg(arg::STEP_ID), &V::U(7));
}

#[test]
fn request_track_shows_the_engine_phases_and_instants() {
    use RequestEventKind::*;
    let (_, evs) = write(&[
        req(1, 1, Arrived),
        req(2, 1, Scheduled),
        req(4, 1, FirstToken),
        req(6, 1, Preempted),
        req(7, 1, Scheduled),
        req(9, 1, Finished),
    ]);
    let r = on(&evs, &track::request(1, "xr"));
    let seq: Vec<(i32, &str)> = r.iter().map(|e| (e.kind, e.name.as_str())).collect();
    let (b, e, i) = (TYPE_SLICE_BEGIN, TYPE_SLICE_END, TYPE_INSTANT);
    let outer = slice::request(1);
    assert_eq!(
        seq,
        [
            (b, outer.as_str()),
            (b, slice::QUEUED),
            (e, ""),
            (b, slice::PREFILL),
            (e, ""),
            (i, slice::FIRST_TOKEN),
            (b, slice::DECODE),
            (e, ""),
            (i, slice::PREEMPTED),
            (b, slice::REQUEUED),
            (e, ""),
            (b, slice::DECODE),
            (e, ""),
            (i, slice::FINISHED),
            (e, ""),
        ]
    );
    assert_eq!(r[0].arg(arg::ENDPOINT), &V::S(arg::ENDPOINT_CHAT.into()));
    assert!(!r[0].args.contains_key(arg::ATTACHED_MID_REQUEST));
    assert_eq!(r[0].flows, [pid_req(PID, 1)]);
    assert_eq!(r[5].arg(arg::TTFT_MS), &V::F(3.0));
    assert_eq!(r[13].terminating, [pid_req(PID, 1)]);
    let end = r[14];
    assert_eq!(end.arg(arg::FINISH_REASON), &V::S("stop".into()));
    assert_eq!(end.arg(arg::CLOSED_BY), &V::S(arg::CLOSED_BY_FINISHED.into()));
    assert_eq!(end.arg(arg::OUTPUT_TOKENS), &V::U(3));
    assert_eq!(end.arg(arg::TTFT_MS), &V::F(3.0));
}

#[test]
fn requests_still_open_are_closed_by_the_end_reason() {
    // First seen at its first token: attached mid-request; no x-request-id on a later track lookup.
    let (_, evs) = write(&[
        req(1, 5, RequestEventKind::FirstToken),
        req(2, 6, RequestEventKind::Arrived),
    ]);
    let r5 = on(&evs, &track::request(5, "xr"));
    assert_eq!(r5[0].arg(arg::ATTACHED_MID_REQUEST), &V::B(true));
    let ends: Vec<_> = r5.iter().filter(|e| e.kind == TYPE_SLICE_END).collect();
    assert_eq!(ends.len(), 2, "the phase and the request");
    assert_eq!(ends[0].arg(arg::CLOSED_BY), &V::S("duration elapsed".into()));
    assert_eq!(ends[1].arg(arg::FINISH_REASON), &V::S(arg::UNFINISHED.into()));
    assert_eq!(ends[1].arg(arg::CLOSED_BY), &V::S("duration elapsed".into()));
    assert_eq!(ends[1].arg(arg::TTFT_MS), &V::F(0.0));
    assert_eq!(on(&evs, &track::request(6, "xr")).len(), 4);
}

#[test]
fn thread_steps_write_ranges_syscalls_files_and_connects() {
    let range = |ms, op| {
        ev(
            ms,
            EventBody::Range(RangeRecord::new(op, T0 + ms * MS, 3, "llmserve", "fwd")),
        )
    };
    let (tracks, evs) = write(&[
        range(1, RangeOp::Pop),
        range(2, RangeOp::Push),
        range(3, RangeOp::Mark),
        ev(
            4,
            EventBody::SlowSyscall {
                nr: 35,
                ret: 0,
                dur_ns: MS,
            },
        ),
        ev(
            5,
            EventBody::FileOpen {
                path: "/m.gguf".into(),
                ret: 7,
                dur_ns: MS,
            },
        ),
        ev(
            6,
            EventBody::FileIo {
                op: FileOp::Pread,
                fd: 7,
                path: Some("/m.gguf".into()),
                ret: 100,
                len: 200,
                dur_ns: MS,
            },
        ),
        ev(
            7,
            EventBody::Connect {
                addr: IpAddr::V4(Ipv4Addr::new(1, 2, 3, 4)),
                port: 443,
                ret: -111,
                dur_ns: 10,
                allowed: false,
            },
        ),
    ]);
    assert!(tracks.values().any(|n| n == "scheduler"));
    let t: Vec<_> = on(&evs, "scheduler")
        .into_iter()
        .filter(|e| e.kind != TYPE_SLICE_END)
        .collect();
    let names: Vec<&str> = t.iter().map(|e| e.name.as_str()).collect();
    let fwd = slice::range("llmserve", "fwd");
    assert_eq!(
        names,
        [
            slice::UNMATCHED_RANGE_POP,
            &fwd,
            &fwd,
            &slice::syscall("nanosleep"),
            &slice::model_file(slice::FILE_OPEN),
            &slice::model_file(FileOp::Pread.name()),
            slice::CONNECT_FLAGGED,
        ]
    );
    assert_eq!(t[0].arg(arg::RANGE), &V::S(fwd.clone()));
    assert_eq!((t[1].kind, t[2].kind), (TYPE_SLICE_BEGIN, TYPE_INSTANT));
    assert_eq!(t[3].arg(arg::NR), &V::U(35));
    assert_eq!(t[5].arg(arg::BYTES), &V::I(100));
    assert_eq!(t[5].arg(arg::REQUESTED_BYTES), &V::U(200));
    assert_eq!(t[6].arg(arg::VERDICT), &V::S(arg::VERDICT_FLAGGED.into()));
    assert_eq!(t[6].arg(arg::PORT), &V::U(443));
    // The range left open is closed by the end reason.
    let last_end = evs
        .iter()
        .rfind(|e| e.track == "scheduler" && e.kind == TYPE_SLICE_END)
        .unwrap();
    assert_eq!(last_end.arg(arg::CLOSED_BY), &V::S("duration elapsed".into()));
}

#[test]
fn counter_steps_write_metrics_gpu_and_process_memory() {
    let gpu = GpuSample {
        index: 1,
        name: "H100".into(),
        uuid: "GPU-9".into(),
        util_gpu_pct: Some(50.0),
        process_mem_bytes: Some(2 << 20),
        ..GpuSample::default()
    };
    let (tracks, evs) = write(&[
        ev(
            1,
            EventBody::Metrics(MetricsSample {
                kv_cache_usage: Some(0.5),
                waiting: Some(2.0),
                ..MetricsSample::default()
            }),
        ),
        ev(2, EventBody::SyscallRate { per_sec: 10.0 }),
        ev(3, EventBody::GpuSample(Box::new(gpu))),
    ]);
    let value = |name: &str| on(&evs, name).iter().find_map(|e| e.counter);
    assert_eq!(value(counter::KV_USAGE.0), Some(0.5));
    assert_eq!(value(counter::WAITING.0), Some(2.0));
    assert_eq!(value(counter::RUNNING.0), None, "not scraped: no track");
    assert_eq!(value(counter::SYSCALL_RATE.0), Some(10.0));
    assert_eq!(value(&track::gpu_counter(1, counter::GPU[0].0)), Some(50.0));
    assert_eq!(value(&track::gpu_process_memory(1, PID)), Some(2.0));
    assert!(
        tracks
            .values()
            .any(|n| *n == track::gpu_group(1, "H100", "GPU-9"))
    );
}

#[test]
fn cuda_calls_become_slices_in_their_category_with_the_note() {
    let call = |ms, func, dur_ns| {
        ev(
            ms,
            EventBody::CudaCall {
                func,
                variant: CudaVariant::V2,
                dur_ns,
                arg: 4096,
                result: 0,
            },
        )
    };
    let (_, evs) = write(&[
        call(1, CudaFunc::LaunchKernel, 1000),
        call(2, CudaFunc::StreamSynchronize, MS),
    ]);
    let c: Vec<_> = on(&evs, track::CUDA)
        .into_iter()
        .filter(|e| e.kind == TYPE_SLICE_BEGIN)
        .collect();
    let names: Vec<&str> = c.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            slice::cuda_batch(Some("cuLaunchKernel"), 1),
            slice::cuda_call("cuStreamSynchronize")
        ]
    );
    for e in &c {
        assert_eq!(e.categories, [category::CUDA_HOST]);
    }
    // The note once per track: on its first slice.
    assert_eq!(c[0].arg(arg::NOTE), &V::S(arg::CUDA_NOTE.into()));
    assert!(!c[1].args.contains_key(arg::NOTE), "{:?}", c[1].args);
    assert_eq!(c[0].arg(arg::LAUNCHES), &V::U(1));
    assert_eq!(c[1].arg(arg::FUNCTION), &V::S("cuStreamSynchronize_v2".into()));
}

#[test]
fn session_steps_write_markers_exits_budget_steps_and_the_summary() {
    let d = Degradation {
        level: 1,
        name: "syscall_events_off",
        change: "off".into(),
        overhead_pct: 6.0,
        budget_pct: 1.0,
        syscalls_counted: 9,
    };
    let (_, evs) = write(&[
        ev(1, EventBody::Marker { text: "hello".into() }),
        ev(2, EventBody::ProcessExit { exit_code: 3 }),
        ev(3, EventBody::Degraded(d)),
    ]);
    let l = on(&evs, track::LLMPROF);
    let names: Vec<&str> = l.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "hello",
            marker::TARGET_EXITED,
            &marker::degradation("syscall_events_off"),
            marker::SUMMARY
        ]
    );
    assert_eq!(l[0].arg(arg::MARKER), &V::S("hello".into()));
    assert_eq!(l[1].arg(arg::EXIT_CODE), &V::I(3));
    assert_eq!(l[2].arg(arg::SYSCALLS_COUNTED), &V::U(9));
    assert_eq!(l[3].arg(arg::END_REASON), &V::S("duration elapsed".into()));
    assert_eq!(
        l[3].arg(arg::EVENTS),
        &V::S("degradation=1 marker=1 process_exit=1".into())
    );
    let drops = on(&evs, &track::drops(llmprof_abi::PROBE_NAMES[0]));
    assert_eq!(
        drops.iter().map(|e| e.counter).collect::<Vec<_>>(),
        [Some(0.0), Some(0.0)]
    );
}

#[test]
fn a_process_without_engine_probes_gets_a_marker() {
    let p = ProcessInfo {
        engine_probes: false,
        ..process()
    };
    let sink = TraceSink::new(Vec::new(), &[p], None).unwrap();
    let (_, evs) = decode(&sink.finish(&SessionStats::default(), None).unwrap());
    assert_eq!(evs[0].name, marker::engine_probes_not_found(PID));
    assert!(evs[0].name.starts_with(marker::ENGINE_PROBES_NOT_FOUND));
    let summary = evs.iter().find(|e| e.name == marker::SUMMARY).unwrap();
    assert_eq!(summary.arg(arg::END_REASON), &V::S(arg::END_OF_TRACE.into()));
}

#[test]
fn processes_of_a_tree_get_named_tracks_and_start_exec_exit_instants() {
    const EXECS: u32 = 5001;
    const FORKS: u32 = 5002;
    const BRIEF: u32 = 5003;
    let at = |ms: u64, pid: u32, body: EventBody| Event {
        ts_ns: T0 + ms * MS,
        pid,
        tid: pid,
        body,
    };
    let start = |ms, pid| {
        at(
            ms,
            pid,
            EventBody::ProcessStart {
                ppid: PID,
                name: "launcher".into(),
                cmdline: "/usr/bin/python3 launch.py".into(),
            },
        )
    };
    let mut sink = TraceSink::new(Vec::new(), &[process()], Some((T0, 1))).unwrap();
    for e in [
        start(1, EXECS),
        // A slow execve is timed from its entry, before the exec: it leaves the track unnamed.
        at(
            2,
            EXECS,
            EventBody::SlowSyscall {
                nr: 59,
                ret: 0,
                dur_ns: 2 * MS,
            },
        ),
        // A stack sample of the child before its exec: still the launcher's image, no name yet.
        at(
            3,
            EXECS,
            EventBody::CpuSample(Box::new(crate::event::stacks::CpuSample {
                cpu: 0,
                frames: Vec::new(),
                truncated: false,
            })),
        ),
        at(
            4,
            EXECS,
            EventBody::ProcessExec {
                filename: "/opt/bin/llmserve".into(),
                name: "llmserve".into(),
                cmdline: "/opt/bin/llmserve --port 8000".into(),
            },
        ),
        start(5, FORKS),
        // Any syscall of a child between fork and exec (Python's subprocess closes fds, a loaded machine makes
        // it slow): no name yet, the child may still execute a program.
        at(
            6,
            FORKS,
            EventBody::SlowSyscall {
                nr: 35,
                ret: 0,
                dur_ns: MS,
            },
        ),
        // A second later without an exec, it is a forked worker: its parent's name is its own.
        at(
            1006,
            FORKS,
            EventBody::SlowSyscall {
                nr: 35,
                ret: 0,
                dur_ns: MS,
            },
        ),
        at(1007, FORKS, EventBody::ProcessExit { exit_code: 5 }),
        // One that ends before: named at the end of the trace.
        start(1008, BRIEF),
        at(1009, BRIEF, EventBody::ProcessExit { exit_code: 0 }),
    ] {
        sink.push(&e).unwrap();
    }
    let bytes = sink.finish(&SessionStats::default(), None).unwrap();
    let trace = Trace::decode(bytes.as_slice()).unwrap();
    let names_of = |pid: u32| -> Vec<Option<String>> {
        trace
            .packet
            .iter()
            .filter_map(|p| p.track_descriptor.as_ref()?.process.clone())
            .filter(|p| p.pid == Some(pid as i32))
            .map(|p| p.process_name)
            .collect()
    };
    // The trace processor keeps a process's first name: none until it is known.
    assert_eq!(names_of(EXECS), [None, Some("llmserve --port 8000".to_owned())]);
    assert_eq!(names_of(FORKS), [None, Some("python3 launch.py".to_owned())]);
    assert_eq!(names_of(BRIEF), [None, Some("python3 launch.py".to_owned())]);
    assert_eq!(names_of(PID), [Some("llmserve --model m.gguf".to_owned())]);
    let (_, evs) = decode(&bytes);
    let named = |n: &str| evs.iter().filter(|e| e.name == n).collect::<Vec<_>>();
    let starts = named(slice::PROCESS_START);
    assert_eq!(starts.len(), 3);
    assert_eq!(starts[0].arg(arg::PPID), &V::U(u64::from(PID)));
    assert_eq!(starts[0].kind, TYPE_INSTANT);
    let exec = named(slice::PROCESS_EXEC);
    assert_eq!(exec[0].track, "llmserve --port 8000");
    assert_eq!(exec[0].arg(arg::FILENAME), &V::S("/opt/bin/llmserve".into()));
    let exit = named(slice::PROCESS_EXIT);
    assert_eq!(exit[0].track, "python3 launch.py");
    assert_eq!(exit[0].arg(arg::EXIT_CODE), &V::I(5));
    assert!(
        !evs.iter().any(|e| e.name == marker::TARGET_EXITED),
        "a child's exit is not the target's"
    );
}
