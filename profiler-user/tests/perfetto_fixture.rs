//! The Perfetto sink on a fixture session built in code: packet structure (decoded with our own schema) and
//! what Perfetto's real trace processor makes of it (no import errors, no unterminated slices, the slices,
//! args, flows and counters a user looks for).
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use llmprof_abi::{FileOp, RangeOp, RequestEventKind, StepKind};
use llmprof_trace::event::{Event, EventBody, ProcessInfo, SessionStats, SyscallAggregate};
use llmprof_trace::names::{arg, counter, marker, slice, tp_arg, track};
use llmprof_trace::perfetto::TraceSink;
use llmprof_trace::perfetto::schema::Trace;
use llmprof_trace::testing;
use prost::Message;

const PID: u32 = 4242;
const MAIN: u32 = 4242;
const SCHED: u32 = 4243;
const MS: u64 = 1_000_000;
/// BOOTTIME origin of the fixture (any value; 1000 s after boot).
const T0: u64 = 1_000_000 * MS;

/// A step of the fixture on the scheduler thread: device time 0.1 ms inside the host time, 12 prompt tokens
/// (prefill and mixed), one decode token per request (decode and mixed), 3 of 64 KV blocks.
fn step(id: u64, kind: StepKind, start: u64, end: u64, reqs: &[u64]) -> Event {
    let prefill = if kind == StepKind::Decode { 0 } else { 12 };
    let decode = if kind == StepKind::Prefill {
        0
    } else {
        reqs.len() as u32
    };
    testing::step(PID, SCHED, kind, id, T0 + start, T0 + end, reqs)
        .device(T0 + start + MS / 10, T0 + end - MS / 10)
        .tokens(prefill, decode)
        .kv_blocks(3, 64)
        .build()
}

/// A transition of one of the fixture's traced chat requests (12 prompt tokens, `max_tokens` 16).
fn req(ts: u64, id: u64, kind: RequestEventKind, output: u32, finish: u32) -> Event {
    testing::request(PID, kind, id, T0 + ts)
        .traced([0xab; 16], [0xcd; 8])
        .chat("smollm2", &format!("xr-{id}"))
        .prompt(12, 16)
        .sampling(0.0, 1.0)
        .output_raw(output, finish)
        .preemptions(u32::from(kind == RequestEventKind::Preempted))
        .build()
}

/// An NVTX-style range of the engine during step 1.
fn range(ts: u64, op: RangeOp, name: &str) -> Event {
    testing::range(PID, SCHED, T0 + ts, op, 1, name)
}

/// A session: two requests (one finishes, one is preempted and still running at the end), three steps, an
/// NVTX range left open, a slow syscall, a model-file open + read, two connects (one flagged), metrics.
fn fixture() -> Vec<Event> {
    use RequestEventKind::*;
    let mut v = vec![
        testing::metrics(PID, T0, 0.0, 0.0, 0.0, 0.0),
        req(MS, 1, Arrived, 0, 0),
        req(MS + MS / 10, 2, Arrived, 0, 0),
        range(12 * MS / 10, RangeOp::Push, "forward"),
        req(12 * MS / 10, 1, Scheduled, 0, 0),
        req(12 * MS / 10, 2, Scheduled, 0, 0),
        range(21 * MS / 10, RangeOp::Pop, "forward"),
        step(1, StepKind::Prefill, 12 * MS / 10, 22 * MS / 10, &[1, 2]),
        req(22 * MS / 10, 1, FirstToken, 1, 0),
        req(22 * MS / 10, 2, FirstToken, 1, 0),
        step(2, StepKind::Decode, 23 * MS / 10, 28 * MS / 10, &[1, 2]),
        req(29 * MS / 10, 2, Preempted, 2, 0),
        testing::metrics(PID, T0 + 3 * MS, 0.05, 1.0, 1.0, 1.0),
        req(3 * MS, 2, Scheduled, 2, 0),
        step(3, StepKind::Mixed, 3 * MS, 35 * MS / 10, &[1, 2]),
        range(31 * MS / 10, RangeOp::Push, "sample"),
        range(32 * MS / 10, RangeOp::Mark, "checkpoint"),
        req(36 * MS / 10, 1, Finished, 3, 1),
        testing::slow_syscall(PID, SCHED, T0 + 4 * MS, 35, 0, 2 * MS),
        testing::event(
            PID,
            MAIN,
            T0 + 5 * MS,
            EventBody::FileOpen {
                path: "/models/m.gguf".into(),
                ret: 7,
                dur_ns: MS / 100,
            },
        ),
        testing::event(
            PID,
            MAIN,
            T0 + 51 * MS / 10,
            EventBody::FileIo {
                op: FileOp::Read,
                fd: 7,
                path: Some("/models/m.gguf".into()),
                ret: 1000,
                len: 1000,
                dur_ns: MS / 10,
            },
        ),
        testing::event(
            PID,
            MAIN,
            T0 + 52 * MS / 10,
            EventBody::FileIo {
                op: FileOp::Close,
                fd: 7,
                path: Some("/models/m.gguf".into()),
                ret: 0,
                len: 0,
                dur_ns: MS / 100,
            },
        ),
        testing::connect(PID, MAIN, T0 + 6 * MS, ([10, 0, 0, 1], 80), 0, true),
        testing::connect(PID, MAIN, T0 + 61 * MS / 10, ([127, 0, 0, 2], 9), -111, false),
        testing::event(
            PID,
            0,
            T0 + 62 * MS / 10,
            EventBody::SyscallRate { per_sec: 1234.0 },
        ),
        testing::marker(PID, 0, T0 + 63 * MS / 10, "hello marker"),
    ];
    v.sort_by_key(|e| e.ts_ns);
    v
}

fn process() -> ProcessInfo {
    testing::process(
        PID,
        "llmserve",
        "llmserve --model m.gguf",
        [(MAIN, "llmserve"), (SCHED, "scheduler")],
    )
}

fn stats() -> SessionStats {
    let mut s = SessionStats {
        end_reason: "duration elapsed".into(),
        user_drops: 2,
        ..Default::default()
    };
    s.probes[0].hits = 3;
    s.probes[0].emitted = 3;
    s.probes[3].dropped = 5;
    s.syscalls.push(SyscallAggregate {
        pid: PID,
        tid: SCHED,
        nr: 35,
        count: 4,
        total_ns: 8 * MS,
        hist: vec![0; 32],
    });
    s
}

fn write_fixture() -> Vec<u8> {
    let mut sink = TraceSink::new(
        Vec::new(),
        &[process()],
        Some((T0, 1_700_000_000 * 1_000_000_000)),
    )
    .unwrap();
    for e in fixture() {
        sink.push(&e).unwrap();
    }
    sink.finish(&stats(), Some(T0 + 7 * MS)).unwrap()
}

#[test]
fn packets_have_the_structure_perfetto_expects() {
    let bytes = write_fixture();
    let trace = Trace::decode(bytes.as_slice()).expect("the file is one Trace message");
    assert!(
        trace
            .packet
            .iter()
            .all(|p| p.trusted_packet_sequence_id == Some(1))
    );
    assert_eq!(
        trace.packet[0].sequence_flags,
        Some(3),
        "first packet clears incremental state"
    );
    assert!(trace.packet[0].clock_snapshot.is_some());
    // Each track is described exactly once, before its first event.
    let mut described = std::collections::HashSet::new();
    for p in &trace.packet {
        if let Some(d) = &p.track_descriptor {
            assert!(
                described.insert(d.uuid.unwrap()),
                "track {:?} described twice",
                d.name
            );
        }
        if let Some(e) = &p.track_event {
            assert!(
                described.contains(&e.track_uuid.unwrap()),
                "event before its track"
            );
        }
    }
    let thread_names: Vec<_> = trace
        .packet
        .iter()
        .filter_map(|p| p.track_descriptor.as_ref()?.thread.as_ref()?.thread_name.clone())
        .collect();
    assert_eq!(thread_names, ["llmserve", "scheduler"]);
    // Every prefix that ends on a packet boundary is a valid trace (what a crash leaves).
    let half = Trace::decode(&bytes[..first_boundary_after(&bytes, bytes.len() / 2)]).unwrap();
    assert!(half.packet.len() < trace.packet.len());
}

fn first_boundary_after(b: &[u8], at: usize) -> usize {
    let mut pos = 0;
    while pos < at {
        // tag byte, varint length, payload
        let mut len = 0usize;
        let mut shift = 0;
        let mut i = pos + 1;
        loop {
            let x = b[i];
            len |= usize::from(x & 0x7f) << shift;
            i += 1;
            if x & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        pos = i + len;
    }
    pos
}

#[test]
fn perfetto_trace_processor_loads_the_fixture_cleanly() {
    if !e2e::require(
        e2e::trace_processor::available(),
        "Perfetto trace processor not installed (cargo xtask setup-tools)",
    ) {
        return;
    }
    let path = std::env::temp_dir().join(format!("llmprof-fixture-{}.perfetto-trace", std::process::id()));
    std::fs::write(&path, write_fixture()).unwrap();
    let mut tp = e2e::trace_processor::load(&path).expect("trace loads");
    assert_eq!(
        tp.import_errors().unwrap(),
        Vec::<serde_json::Value>::new(),
        "import errors"
    );
    assert_eq!(
        tp.unterminated_slices().unwrap(),
        Vec::<serde_json::Value>::new(),
        "unterminated slices"
    );

    let q =
        |tp: &mut e2e::trace_processor::Trace, sql: &str| tp.query_i64(sql).unwrap_or_else(|e| panic!("{e}"));
    let on_track =
        |t: &str| format!("select s.* from slice s join track t on s.track_id = t.id where t.name = '{t}'");
    let extract = |key: &str| format!("extract_arg(arg_set_id, '{}')", tp_arg(key));
    // Engine steps: one slice per step, named by kind, with the step's attributes.
    let steps = on_track(track::STEPS);
    for kind in [StepKind::Prefill, StepKind::Decode, StepKind::Mixed] {
        assert_eq!(
            q(
                &mut tp,
                &format!("select count(*) from ({steps}) where name = '{}'", kind.name())
            ),
            1
        );
    }
    assert_eq!(
        q(
            &mut tp,
            &format!(
                "select {} from ({steps}) where name = '{}'",
                extract(arg::NUM_SEQS),
                StepKind::Prefill.name()
            )
        ),
        2
    );
    // The requests a step served are typed array args: `debug.req_ids[0]`, `debug.req_ids[1]`.
    let ids = tp
        .query(&format!(
            "select a.int_value as id from ({steps}) s join args a using (arg_set_id) \
             where s.name = '{}' and a.flat_key = '{}' order by a.key",
            StepKind::Mixed.name(),
            tp_arg(arg::REQ_IDS)
        ))
        .unwrap();
    assert_eq!(ids, [serde_json::json!({"id": 1}), serde_json::json!({"id": 2})]);
    assert_eq!(
        q(
            &mut tp,
            &format!("select count(*) from ({})", on_track(track::DEVICE_HOST))
        ),
        3
    );
    // Requests: async tracks with phases, TTFT and tokens; flows from requests to the steps.
    let r1 = on_track(&track::request(1, "xr-1"));
    let outer1 = slice::request(1);
    assert_eq!(
        q(
            &mut tp,
            &format!(
                "select count(*) from ({r1}) where name in ('{}', '{}', '{}')",
                slice::QUEUED,
                slice::PREFILL,
                slice::DECODE
            )
        ),
        3
    );
    assert_eq!(
        q(
            &mut tp,
            &format!(
                "select {} from ({r1}) where name = '{outer1}'",
                extract(arg::OUTPUT_TOKENS)
            )
        ),
        3
    );
    let ttft = tp
        .query(&format!(
            "select {} as v from ({r1}) where name = '{outer1}'",
            extract(arg::TTFT_MS)
        ))
        .unwrap();
    assert!(
        (ttft[0]["v"].as_f64().unwrap() - 1.2).abs() < 1e-6,
        "ttft {ttft:?}"
    );
    let r2 = on_track(&track::request(2, "xr-2"));
    assert_eq!(
        q(
            &mut tp,
            &format!("select count(*) from ({r2}) where name = '{}'", slice::PREEMPTED)
        ),
        1
    );
    let closed = tp
        .query(&format!(
            "select {} as v from ({r2}) where name = '{}'",
            extract(arg::CLOSED_BY),
            slice::request(2)
        ))
        .unwrap();
    assert_eq!(closed[0]["v"], "duration elapsed");
    assert!(
        q(&mut tp, "select count(*) from flow") >= 6,
        "request → step flows"
    );
    // Thread slices: NVTX range, slow syscall, model file.
    let sched = "select s.* from slice s join thread_track tt on s.track_id = tt.id join thread using (utid) where thread.tid = 4243";
    assert_eq!(
        q(
            &mut tp,
            &format!(
                "select count(*) from ({sched}) where name = '{}'",
                slice::range("llmserve", "forward")
            )
        ),
        1
    );
    assert_eq!(
        q(
            &mut tp,
            &format!(
                "select count(*) from ({sched}) where name = '{}' and dur = 2000000",
                slice::syscall("nanosleep")
            )
        ),
        1
    );
    assert_eq!(
        q(
            &mut tp,
            &format!(
                "select {} from slice where name = '{}'",
                extract(arg::BYTES),
                slice::model_file(FileOp::Read.name())
            )
        ),
        1000
    );
    let flagged = tp
        .query(&format!(
            "select {} as port, {} as a from slice where name = '{}'",
            extract(arg::PORT),
            extract(arg::ADDRESS),
            slice::CONNECT_FLAGGED
        ))
        .unwrap();
    assert_eq!(flagged.len(), 1);
    assert_eq!(flagged[0]["port"], 9);
    assert_eq!(flagged[0]["a"], "127.0.0.2");
    // Counters.
    let counter_sql = |agg: &str, t: &str| {
        format!("select {agg} from counter c join counter_track t on c.track_id = t.id where t.name = '{t}'")
    };
    assert_eq!(q(&mut tp, &counter_sql("count(*)", counter::KV_USAGE.0)), 2);
    assert_eq!(
        q(
            &mut tp,
            &counter_sql("cast(max(value) as int)", counter::SYSCALL_RATE.0)
        ),
        1234
    );
    assert_eq!(
        q(
            &mut tp,
            &counter_sql(
                "cast(max(value) as int)",
                &track::drops(llmprof_abi::PROBE_NAMES[3])
            )
        ),
        5
    );
    // Names from /proc (a process by its command line), and the summary where a user sees it.
    assert_eq!(
        q(
            &mut tp,
            "select count(*) from process where pid = 4242 and name = 'llmserve --model m.gguf'"
        ),
        1
    );
    assert_eq!(
        q(
            &mut tp,
            "select count(*) from thread where tid = 4243 and name = 'scheduler'"
        ),
        1
    );
    let summary = tp
        .query(&format!(
            "select {} as r, {} as d from slice where name = '{}'",
            extract(arg::END_REASON),
            extract(arg::TOTAL_DROPPED),
            marker::SUMMARY
        ))
        .unwrap();
    assert_eq!(summary.len(), 1);
    assert_eq!(summary[0]["r"], "duration elapsed");
    assert_eq!(summary[0]["d"], 7);
    drop(tp);
    let _ = std::fs::remove_file(&path);
}
