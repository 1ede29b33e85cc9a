//! GPU activity handed over by a CUPTI helper library, end to end without a GPU: `llmprof attach` (the real
//! binary, real eBPF) on a process that has `libllmprof_cupti.so` loaded and hands it chunks of GPU activity.
//!
//! The chunks come from `tests/fixtures/gpu_testee.c` through the stand-in helper `tests/fixtures/gpu_helper.c`
//! (both compiled here with gcc): known kernels with made-up names, shapes and times on a clock 1000 s off
//! BOOTTIME. The assertions are what a user checks and do not depend on how the chunks were produced (the real
//! injected helper hands over the same layouts): the kernel slices in Perfetto's trace processor with their
//! demangled names, on the stream's track, at times mapped into the session, with their args; the flows from
//! the launching API calls; the wait on the waiting thread; the losses in the summary; `llmprof report`'s top
//! kernels. Needs root, gcc and the trace processor: skips loudly without them, fails under `CI=true`.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use std::process::Command;

use e2e::testee::Testee;
use e2e::trace_processor::Trace;
use llmprof_trace::names::cupti::{arg, slice, track};
use llmprof_trace::names::{marker, tp_arg};

const LLMPROF: &str = env!("CARGO_BIN_EXE_llmprof");
const MS: i64 = 1_000_000;

fn preconditions() -> bool {
    e2e::require(e2e::is_root(), "not root: cannot load eBPF programs")
        && e2e::require(
            e2e::trace_processor::available(),
            "Perfetto trace processor not installed (cargo xtask setup-tools)",
        )
        && e2e::require(
            e2e::fixtures::have_gcc(),
            "gcc not installed (apt-get install gcc): cannot build the stand-in helper library",
        )
}

fn extract(key: &str) -> String {
    format!("extract_arg(s.arg_set_id, '{}')", tp_arg(key))
}

/// Slices named `name` on the track named `track`.
fn on_track(track: &str, name: &str) -> String {
    format!("from slice s join track t on s.track_id = t.id where t.name = '{track}' and s.name = '{name}'")
}

#[test]
fn kernel_slices_from_handed_over_chunks_with_names_times_args_flows_and_report() {
    if !preconditions() {
        return;
    }
    let dir = e2e::fixtures::scratch_dir("llmprof-gpu-activity");
    let exe = e2e::fixtures::gpu_helper_testee(&dir, llmprof_abi::cupti::GPU_HELPER_LIB);
    let mut t = Testee::start(&mut Command::new(&exe));
    let pid = t.pid();
    let trace = dir.join("gpu.perfetto-trace");
    // `-v`: the summary's GPU activity line.
    let session = e2e::attach::Attached::start(pid, &["-v"], &trace);
    t.send("go");
    let done = t.line();
    let bounds: Vec<i64> = done
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(bounds.len(), 2, "testee said {done:?}");
    let (b0, b1) = (bounds[0], bounds[1]);
    // The chunks are in the ring once the handoff returned; give the session a poll interval to drain them.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let stdout = session.stop();
    t.exit();

    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    assert_eq!(tp.unterminated_slices().unwrap(), Vec::<serde_json::Value>::new());

    // The handoff probe was attached in the process that had the helper loaded.
    let attached = marker_text(&mut tp, &format!("handoff probe attached in pid {pid}"));
    assert!(
        attached.contains(llmprof_abi::cupti::GPU_HELPER_LIB),
        "{attached}"
    );

    // Kernels: demangled names, on their stream's track, times mapped into the testee's window, exact durations.
    let gemm = on_track(&track::stream(0, 7), "gemm<128>");
    let vadd = on_track(&track::stream(0, 13), "vector_add");
    assert_eq!(tp.int(&format!("select count(*) {gemm}")), 10);
    assert_eq!(tp.int(&format!("select count(*) {vadd}")), 5);
    assert_eq!(
        tp.int(&format!("select count(*) {gemm} and s.dur = {}", 3 * MS / 2)),
        10
    );
    assert_eq!(tp.int(&format!("select count(*) {vadd} and s.dur = {MS}")), 5);
    assert_eq!(
        tp.int(&format!(
            "select count(*) {gemm} and s.ts >= {b0} and s.ts + s.dur <= {b1}"
        )),
        10,
        "kernel times mapped to BOOTTIME inside [{b0}, {b1}]"
    );
    // Launched 2 ms apart, in order.
    assert_eq!(tp.int(&format!("select max(s.ts) - min(s.ts) {gemm}")), 18 * MS);
    // Args.
    let args = format!(
        "select count(*) {gemm} and {} = '64,2,1' and {} = '128,1,1' and {} = 40 and {} = 1024 and {} = 2048 \
         and {} = '_Z4gemmILi128EEvPKfPfi' and {} = '{}'",
        extract(arg::GRID),
        extract(arg::BLOCK),
        extract(arg::REGISTERS),
        extract(arg::SHARED_STATIC),
        extract(arg::SHARED_DYNAMIC),
        extract(arg::MANGLED),
        extract(arg::KIND),
        arg::KIND_KERNEL,
    );
    assert_eq!(tp.int(&args), 10);
    // The copy.
    let copy = on_track(&track::stream(0, 7), &slice::memcpy(1));
    let bytes = extract(llmprof_trace::names::arg::BYTES);
    assert_eq!(tp.int(&format!("select count(*) {copy} and {bytes} = 4096")), 1);

    // Flows: each kernel from its launching API call on the testee's thread (its pid: single-threaded).
    // The API call tracks are children of the thread track.
    let flows_by_name = format!(
        "select count(*) from flow f join slice a on f.slice_out = a.id join slice b on f.slice_in = b.id \
         join track t on a.track_id = t.id where t.name = '{}' and a.name = '{}' \
         and b.name in ('gemm<128>', 'vector_add') and a.ts < b.ts",
        track::API,
        slice::api_call(307, false, None)
    );
    assert_eq!(tp.int(&flows_by_name), 15);
    // The wait, on the waiting thread's wait track.
    assert_eq!(
        tp.int(&format!(
            "select count(*) {} and s.dur = {}",
            on_track(track::WAITS, &slice::wait(3)),
            2 * MS
        )),
        1
    );

    // Losses in the summary: the two chunks, the 3 records "CUPTI" dropped.
    let summary = summary_arg(&mut tp, arg::SUMMARY);
    assert!(
        summary.starts_with("chunks=2 activities=17 api_calls=16 "),
        "{summary}"
    );
    assert!(summary.contains("helper_dropped=3"), "{summary}");
    assert!(
        stdout.contains(
            "GPU activity (CUPTI helper): 2 chunks, 17 kernels/copies/waits/graph launches, 16 API calls, \
             0 summary rows, 0 busy intervals; lost: 3"
        ),
        "{stdout}"
    );

    // The report's top kernels.
    let out = Command::new(LLMPROF)
        .args(["report", "--json"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let top = &r["kernels"]["top"];
    assert_eq!(
        (top[0]["name"].as_str(), top[0]["count"].as_u64()),
        (Some("gemm<128>"), Some(10))
    );
    assert!(
        (top[0]["total_ms"].as_f64().unwrap() - 15.0).abs() < 1e-6,
        "{top}"
    );
    assert!(
        (top[0]["share_pct"].as_f64().unwrap() - 75.0).abs() < 1e-6,
        "{top}"
    );
    assert_eq!(
        (top[1]["name"].as_str(), top[1]["count"].as_u64()),
        (Some("vector_add"), Some(5))
    );
    assert_eq!(r["kernels"]["lost"], 3);
    let text = Command::new(LLMPROF).arg("report").arg(&trace).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("GPU kernels (CUPTI, every kernel): 15 kernels, 20.000 ms GPU time"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The text of the first marker on the `llmprof` track containing `part`.
fn marker_text(tp: &mut Trace, part: &str) -> String {
    let rows = tp
        .query(&format!(
            "select name from slice where name like '%{part}%' limit 1"
        ))
        .unwrap();
    rows.first()
        .and_then(|r| r["name"].as_str())
        .unwrap_or_else(|| panic!("no marker with {part:?}"))
        .to_owned()
}

/// A string arg of the `llmprof summary` instant.
fn summary_arg(tp: &mut Trace, key: &str) -> String {
    let rows = tp
        .query(&format!(
            "select extract_arg(arg_set_id, '{}') as v from slice where name = '{}'",
            tp_arg(key),
            marker::SUMMARY
        ))
        .unwrap();
    rows.first()
        .and_then(|r| r["v"].as_str())
        .unwrap_or_else(|| panic!("summary has no {key}"))
        .to_owned()
}
