//! GPU activity from CUPTI in the Perfetto sink, on a fixture built in code (no GPU, no root): an engine's two
//! steps and the kernels they launched, decoded from a chunk of the `llmprof_abi::cupti` layouts
//! (`llmprof_trace::testing::cupti::engine_fixture`). Checked with Perfetto's real trace processor: 0 import
//! errors, the kernels on their stream's track, each with the `step_id` of the step whose host time held its
//! launch, the flows from the launching API calls.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use llmprof_trace::event::SessionStats;
use llmprof_trace::names::cupti::{slice, track};
use llmprof_trace::names::{arg, tp_arg};
use llmprof_trace::perfetto::TraceSink;
use llmprof_trace::testing;

const PID: u32 = 777;
const TID: u32 = 778;
const MS: u64 = 1_000_000;
const T0: u64 = 5_000 * 1_000 * MS;

#[test]
fn kernels_land_on_stream_tracks_with_their_step_and_launch_flow() {
    if !e2e::require(
        e2e::trace_processor::available(),
        "Perfetto trace processor not installed (cargo xtask setup-tools)",
    ) {
        return;
    }
    let (events, gpu) = testing::cupti::engine_fixture(PID, TID, T0);
    let procs = [testing::process(
        PID,
        "llmserve",
        "llmserve --device cuda",
        [(TID, "engine")],
    )];
    let mut sink = TraceSink::new(Vec::new(), &procs, Some((T0, 1_700_000_000 * 1_000 * MS))).unwrap();
    for e in &events {
        sink.push(e).unwrap();
    }
    let stats = SessionStats {
        end_reason: "duration elapsed".into(),
        gpu,
        ..Default::default()
    };
    let bytes = sink.finish(&stats, Some(T0 + 40 * MS)).unwrap();
    let path = std::env::temp_dir().join(format!(
        "llmprof-kernels-fixture-{}.perfetto-trace",
        std::process::id()
    ));
    std::fs::write(&path, bytes).unwrap();
    let mut tp = e2e::trace_processor::load(&path).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    assert_eq!(tp.unterminated_slices().unwrap(), Vec::<serde_json::Value>::new());
    let kernels = |name: &str, step: u64| {
        format!(
            "select count(*) from slice s join track t on s.track_id = t.id where t.name = '{}' and s.name = '{name}' \
             and extract_arg(s.arg_set_id, '{}') = {step}",
            track::stream(0, 7),
            tp_arg(arg::STEP_ID)
        )
    };
    for (name, step) in [("gemm<128>", 1), ("gemm<128>", 2), ("softmax", 1), ("softmax", 2)] {
        assert_eq!(
            tp.query_i64(&kernels(name, step)).unwrap(),
            1,
            "{name} in step {step}"
        );
    }
    // The first gemm: 2 ms to 4 ms after T0, mapped from the CUPTI clock.
    let first = format!(
        "select min(s.ts) from slice s join track t on s.track_id = t.id where t.name = '{}'",
        track::stream(0, 7)
    );
    assert_eq!(tp.query_i64(&first).unwrap(), (T0 + 2 * MS) as i64);
    // Each kernel from its API call on the engine thread's API track.
    let flows = format!(
        "select count(*) from flow f join slice a on f.slice_out = a.id join slice b on f.slice_in = b.id \
         join track t on a.track_id = t.id where t.name = '{}' and a.name = '{}'",
        track::API,
        slice::api_call(307, false, None)
    );
    assert_eq!(tp.query_i64(&flows).unwrap(), 4);
    let _ = std::fs::remove_file(&path);
}
