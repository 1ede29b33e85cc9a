//! The GPU layer end to end without a GPU: `llmprof attach` (the real binary, real eBPF) on `llmprof-testee`
//! driving a stand-in libcuda (`tests/fixtures/fake_libcuda.c`, compiled here with gcc into a temp dir as
//! `libcuda.so.1`, exporting the real CUDA driver symbols). Checked with Perfetto's trace processor: the
//! CUDA driver slices, their names, counts, host times (synchronize ≥ the stand-in's sleep), the per-step
//! aggregation of launches, and the one line + one marker that say NVML is absent.
//!
//! Needs root, gcc and the trace processor: skips loudly without them, fails under `CI=true`.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use e2e::fixtures::{scratch_dir, stand_in_libcuda};
use e2e::testee::Testee;
use e2e::trace_processor::Trace;
use llmprof_abi::{CudaFunc, CudaVariant};
use llmprof_trace::names::{arg, category, marker, slice, tp_arg, track, value};

const LLMPROF: &str = env!("CARGO_BIN_EXE_llmprof");
/// Held by the tests whose timing a CPU-heavy neighbour would upset (the late-load test waits a fixed time for
/// the next tick) and by the CPU-heavy budget test: on a 2-core machine they do not overlap.
static TIMING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Points NVML at a library that does not exist, so the "NVML absent" path runs on any host.
const NO_NVML: &str = "/nonexistent/libnvidia-ml.so.1";

fn preconditions() -> bool {
    e2e::require(e2e::is_root(), "not root: cannot load eBPF programs")
        && e2e::require(
            e2e::trace_processor::available(),
            "Perfetto trace processor not installed (cargo xtask setup-tools)",
        )
        && e2e::require(
            e2e::fixtures::have_gcc(),
            "gcc not installed (apt-get install gcc): cannot build the stand-in libcuda",
        )
}

/// `llmprof attach` on `pid` for `secs`: returns once it says its probes are live, with a receiver of its
/// (stdout, stderr, success) at exit.
fn attach(pid: u32, secs: u32, trace: &Path) -> mpsc::Receiver<(String, String, bool)> {
    attach_with(pid, secs, trace, &[])
}

/// [`attach`] with more arguments.
fn attach_with(pid: u32, secs: u32, trace: &Path, args: &[&str]) -> mpsc::Receiver<(String, String, bool)> {
    let mut child = Command::new(LLMPROF)
        .args([
            "attach",
            "--pid",
            &pid.to_string(),
            "-d",
            &format!("{secs}s"),
            // The summary's internals (CUDA probe points, NVML, costs) that these tests read.
            "-v",
            "-o",
        ])
        .arg(trace)
        .args(args)
        .env(llmprof::nvml::NVML_LIB_ENV, NO_NVML)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut stderr, seen) = e2e::attach::wait_probes_live(&mut child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
        let out = child.wait_with_output().unwrap();
        let _ = tx.send((
            String::from_utf8_lossy(&out.stdout).into_owned(),
            seen + &rest,
            out.status.success(),
        ));
    });
    rx
}

/// Slices on the CUDA tracks named `name`.
fn cuda_slices(name: &str) -> String {
    format!(
        "select s.* from slice s join track t on s.track_id = t.id \
         where t.name = '{}' and s.name = '{name}'",
        track::CUDA
    )
}

/// `extract_arg` of the annotation `key`.
fn extract(key: &str) -> String {
    format!("extract_arg(arg_set_id, '{}')", tp_arg(key))
}

/// An individual CUDA call's slice name.
fn call(f: CudaFunc) -> String {
    slice::cuda_call(f.name())
}

#[test]
fn cuda_driver_calls_become_host_time_slices_aggregated_per_step() {
    if !preconditions() {
        return;
    }
    let dir = scratch_dir("llmprof-cuda");
    let lib = stand_in_libcuda(&dir);
    let mut t = Testee::spawn(&["--libcuda", lib.to_str().unwrap()]);
    let pid = t.pid();
    let trace = dir.join("cuda.perfetto-trace");
    let done = attach(pid, 3, &trace);
    t.cmd("cuda 3 100", "cuda done");
    let (stdout, stderr, ok) = done.recv_timeout(Duration::from_secs(30)).unwrap();
    t.exit();
    assert!(ok, "attach failed:\n{stdout}\n{stderr}");

    // The summary: CUDA probes attached to the stand-in, NVML absent said once.
    let cuda_line = stdout
        .lines()
        .find(|l| l.contains("CUDA driver calls:") && l.contains("entry points"))
        .unwrap_or("");
    assert!(
        cuda_line.contains("libcuda.so.1") && cuda_line.contains("16 entry points"),
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("GPU counters: unavailable: NVML").count(),
        1,
        "{stdout}"
    );
    assert!(
        !stderr.contains("NVML"),
        "NVML absence is said in the summary only:\n{stderr}"
    );

    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    assert_eq!(tp.unterminated_slices().unwrap(), Vec::<serde_json::Value>::new());

    // One launch slice per step, carrying its step id and the 100 launches (both cuLaunchKernel symbols).
    let per_step = format!(
        "select count(distinct {}) from ({}) where {} = 100",
        extract(arg::STEP_ID),
        cuda_slices(&slice::cuda_batch(Some(CudaFunc::LaunchKernel.name()), 100)),
        extract(arg::LAUNCHES)
    );
    assert_eq!(tp.int(&per_step), 3);
    // Synchronize calls are individual, and their host time covers the stand-in's 5 / 3 / 2 ms sleeps.
    let syncs = |name: &str, min_ns: u64| {
        format!(
            "select count(*) from ({}) where dur >= {min_ns}",
            cuda_slices(name)
        )
    };
    assert_eq!(tp.int(&syncs(&call(CudaFunc::StreamSynchronize), 5_000_000)), 3);
    // ... each labelled with the engine step it happened in.
    let sync_steps = format!(
        "select count(distinct {}) from ({})",
        extract(arg::STEP_ID),
        cuda_slices(&call(CudaFunc::StreamSynchronize))
    );
    assert_eq!(tp.int(&sync_steps), 3);
    assert_eq!(tp.int(&syncs(&call(CudaFunc::CtxSynchronize), 3_000_000)), 1);
    assert_eq!(tp.int(&syncs(&call(CudaFunc::EventSynchronize), 2_000_000)), 1);
    // The failing call keeps its CUresult.
    let failed = format!(
        "select count(*) from ({}) where {} = 1 and {} = '{}{}'",
        cuda_slices(&call(CudaFunc::EventSynchronize)),
        extract(arg::RESULT),
        extract(arg::FUNCTION),
        CudaFunc::EventSynchronize.name(),
        CudaVariant::Ptsz.suffix()
    );
    assert_eq!(tp.int(&failed), 1);
    // The 200 µs device-to-host copy is its own slice with its byte count.
    let copies = format!(
        "select count(*) from ({}) where dur >= 200000 and {} = 4096",
        cuda_slices(&call(CudaFunc::MemcpyDtoH)),
        extract(arg::BYTES)
    );
    assert_eq!(tp.int(&copies), 3);
    // The short calls after the steps are gathered into one batch, per function.
    let batch = format!(
        "select {} as f from ({})",
        extract(arg::FUNCTIONS),
        cuda_slices(&slice::cuda_batch(None, 6))
    );
    let rows = tp.query(&batch).unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let f = rows[0]["f"].as_str().unwrap_or_default().to_owned();
    let calls: Vec<(String, u64, f64)> = value::cuda_functions(&f);
    for want in [
        CudaFunc::MemAlloc,
        CudaFunc::MemFree,
        CudaFunc::MemcpyHtoDAsync,
        CudaFunc::GraphLaunch,
        CudaFunc::LaunchKernelEx,
    ] {
        assert!(
            calls.iter().any(|(name, n, _)| name == want.name() && *n == 1),
            "{f}"
        );
    }
    // Every CUDA slice has the cuda-host category and sits on a track of the calling thread (a child of its
    // thread track, which the trace processor files under the thread); one slice of each such track (its
    // first written) says it is host time.
    assert_eq!(
        tp.int(&format!(
            "select count(*) from slice s join track t on s.track_id = t.id \
                 where t.name = '{}' and s.category != '{}'",
            track::CUDA,
            category::CUDA_HOST,
        )),
        0
    );
    assert_eq!(
        tp.int(&format!(
            "select count(*) from slice s join track t on s.track_id = t.id where t.name = '{}' \
                 and extract_arg(s.arg_set_id, '{}') = '{}'",
            track::CUDA,
            tp_arg(arg::NOTE),
            arg::CUDA_NOTE
        )),
        tp.int(&format!(
            "select count(distinct t.id) from track t join slice s on s.track_id = t.id where t.name = '{}'",
            track::CUDA
        ))
    );
    assert_eq!(
        tp.int(&format!(
            "select count(*) from slice s join track t on s.track_id = t.id where t.name = '{}'",
            track::CUDA
        )),
        3 + 3 + 3 + 1 + 1 + 2
    );
    let tid = pid as i64;
    assert_eq!(
        tp.int(&format!(
            "select count(*) from thread_track t join thread using (utid) \
                 where t.name = '{}' and thread.tid = {tid}",
            track::CUDA
        )),
        1
    );
    // NVML absent: one marker, nothing else.
    assert_eq!(
        tp.int(&format!(
            "select count(*) from slice where name like '{}%'",
            marker::gpu_counters_unavailable("NVML")
        )),
        1
    );
    assert_eq!(
        tp.int(&format!(
            "select count(*) from track where name like '{}%'",
            track::GPU_PREFIX
        )),
        0
    );
    drop(tp);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The summary's `overhead_by_probe_ms` entry of `probe`, ms.
fn by_probe_ms(tp: &mut Trace, probe: &str) -> f64 {
    let rows = tp
        .query(&format!(
            "select {} as b from slice where name = '{}'",
            extract(arg::OVERHEAD_BY_PROBE_MS),
            marker::SUMMARY
        ))
        .unwrap();
    let b = rows[0]["b"].as_str().unwrap_or_default().to_owned();
    value::pairs(&b)
        .find(|(k, _)| *k == probe)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no {probe} in overhead_by_probe_ms {b:?}"))
}

/// The self-accounting covers the CUDA probes: the entry + return pair is calibrated at start-up, and the
/// estimate charges each traced driver call that cost (an H200 run once said 0.0 ms for 66k calls).
#[test]
fn cuda_probes_are_calibrated_and_charged_in_the_overhead_estimate() {
    if !preconditions() {
        return;
    }
    let dir = scratch_dir("llmprof-cuda-cost");
    let lib = stand_in_libcuda(&dir);
    let mut t = Testee::spawn(&["--libcuda", lib.to_str().unwrap()]);
    let trace = dir.join("cost.perfetto-trace");
    // Stopped once every launch was made: a fixed duration could end first on a loaded machine.
    // `-v`: the summary's calibrated costs.
    let session = e2e::attach::Attached::start(t.pid(), &["-v"], &trace);
    t.cmd("cuda 3 1000", "cuda done");
    let stdout = session.stop();
    t.exit();
    assert!(
        stdout.contains("ns per timed CUDA driver call (entry + return probe)")
            && stdout.contains("ns per counted launch (entry probe only)"),
        "{stdout}"
    );
    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    let cost = tp.float(&format!(
        "select {} from slice where name = '{}'",
        extract(arg::COST_NS_CUDA_CALL),
        marker::SUMMARY
    ));
    eprintln!(
        "calibrated CUDA call cost: {cost:.0} ns, charged {:.2} ms",
        by_probe_ms(&mut tp, "cuda")
    );
    let counted = tp.float(&format!(
        "select {} from slice where name = '{}'",
        extract(arg::COST_NS_CUDA_COUNTED),
        marker::SUMMARY
    ));
    eprintln!("calibrated counted launch cost: {counted:.0} ns");
    assert!(cost > 0.0, "calibrated CUDA call cost {cost} ns");
    assert!(counted > 0.0, "calibrated counted launch cost {counted} ns");
    // `cuda 3 1000` (llmprof-testee): 3 × 1,000 launches and, after the steps, a LaunchKernelEx, a
    // GraphLaunch and two async copies, counted at the entry-only cost; per step a blocking copy and a
    // stream synchronize, and after them an alloc, a free, a context and two event synchronizes, at the
    // pair's. No less than that, and no more than every one of those calls at the pair's (counted calls are
    // not charged twice).
    let cuda_ms = by_probe_ms(&mut tp, "cuda");
    let least = (3_004.0 * counted + 11.0 * cost) / 1e6;
    assert!(
        cuda_ms >= least * 0.99 && cuda_ms <= 3_030.0 * cost.max(counted) / 1e6 * 1.01,
        "cuda charged {cuda_ms} ms at {counted} ns per counted launch, {cost} ns per timed call"
    );
    assert!(
        tp.peak("llmprof cost per hit: CUDA call (entry + return probe)") > 0.0,
        "the cost counter track"
    );
    drop(tp);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// With a budget a launch-heavy target blows, the `cuda_detached` step comes, and no CUDA call is traced
/// after it.
#[test]
fn a_launch_heavy_target_over_budget_gets_its_cuda_probes_detached() {
    if !preconditions() {
        return;
    }
    let _serial = TIMING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = scratch_dir("llmprof-cuda-budget");
    let lib = stand_in_libcuda(&dir);
    let mut t = Testee::spawn(&["--libcuda", lib.to_str().unwrap()]);
    let trace = dir.join("budget.perfetto-trace");
    let done = attach_with(t.pid(), 8, &trace, &["--overhead-budget", "0.5%"]);
    t.cmd("cuda 150 5000", "cuda done");
    let (stdout, stderr, ok) = done.recv_timeout(Duration::from_secs(40)).unwrap();
    t.exit();
    assert!(ok, "attach failed:\n{stdout}\n{stderr}");
    assert!(stderr.contains("CUDA driver uprobes detached"), "{stderr}");
    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    let at = tp.int(&format!(
        "select ts from slice where name = '{}' order by ts limit 1",
        marker::degradation("cuda_detached")
    ));
    assert!(
        tp.int(&format!(
            "select count(*) from slice where category = '{}' and ts < {at}",
            category::CUDA_HOST
        )) > 0,
        "CUDA calls traced before the step"
    );
    assert_eq!(
        tp.int(&format!(
            "select count(*) from slice where category = '{}' and ts > {at}",
            category::CUDA_HOST
        )),
        0,
        "no CUDA call traced after cuda_detached"
    );
    drop(tp);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A process that loads libcuda after llmprof attached (as PyTorch does on first CUDA use): the probes are
/// attached on the next tick and its calls are traced (here with every call timed, launches included).
#[test]
fn libcuda_loaded_after_attach_is_found_on_the_next_tick() {
    if !preconditions() {
        return;
    }
    let _serial = TIMING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = scratch_dir("llmprof-cuda-late");
    let lib = stand_in_libcuda(&dir);
    let mut t = Testee::spawn(&[]);
    let trace = dir.join("late.perfetto-trace");
    // Every call timed (`--cuda-calls all`, the pair at launches too); the other tests run the default.
    let done = attach_with(t.pid(), 12, &trace, &["--cuda-calls", "all"]);
    t.cmd(&format!("cuda-load {}", lib.display()), "cuda loaded");
    // The session checks the target's maps every second; attaching the 16 probes one by one then takes
    // seconds on a loaded machine, so rounds of calls are repeated for 8 s: the rounds after all probes are
    // live are traced whole.
    let until = std::time::Instant::now() + Duration::from_secs(8);
    while std::time::Instant::now() < until {
        t.cmd("cuda 1 10", "cuda done");
        std::thread::sleep(Duration::from_millis(400));
    }
    let (stdout, stderr, ok) = done.recv_timeout(Duration::from_secs(30)).unwrap();
    t.exit();
    assert!(ok, "attach failed:\n{stdout}\n{stderr}");
    let mut tp = e2e::trace_processor::load(&trace).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    assert_eq!(
        tp.int(&format!(
            "select count(*) from slice where name like '{} in pid%'",
            marker::LIBCUDA_NOT_LOADED
        )),
        1
    );
    assert_eq!(
        tp.int(&format!(
            "select count(*) from slice where name like '{}'",
            marker::cuda_probes_attached(16, "%", 1)
        )),
        1
    );
    assert!(
        tp.int(&format!(
            "select count(*) from ({})",
            cuda_slices(&slice::cuda_batch(Some(CudaFunc::LaunchKernel.name()), 10))
        )) >= 1,
        "a round of 10 launches traced after the late attach"
    );
    assert!(
        tp.int(&format!(
            "select count(*) from ({})",
            cuda_slices(&call(CudaFunc::StreamSynchronize))
        )) >= 1
    );
    drop(tp);
    std::fs::remove_dir_all(&dir).unwrap();
}
