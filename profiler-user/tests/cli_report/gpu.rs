//! The `gpu` section: NVML counters, CUDA driver time and the GPU markers; left out of a trace without GPU
//! data; the same numbers as Perfetto's trace processor.

use super::*;

/// A CUDA driver call (argument 4096) on the scheduler thread at `ts` units + `off_ns`, lasting `dur_ns`.
fn cuda(ts: u64, off_ns: u64, func: CudaFunc, dur_ns: u64) -> Event {
    testing::cuda(PID, SCHED, at(ts) + off_ns, func, dur_ns, 4096)
}

/// One NVML sample of GPU 0 (no PCIe RX: unsupported counters stay absent).
fn gpu(ts: u64, util: f64, power: f64, proc_mib: Option<u64>) -> Event {
    let sample = GpuSample {
        util_mem_pct: Some(10.0),
        power_w: Some(power),
        process_mem_bytes: proc_mib.map(|m| m << 20),
        ..testing::h100(util)
    };
    testing::gpu(PID, at(ts), sample)
}

const CUDA_MARKER: &str = "CUDA driver probes attached: 41 entry points of /usr/lib/libcuda.so.1 (0 of them only reachable through \
     cuGetProcAddress)";

/// The GPU layer on top of the fixture:
/// - NVML samples at 0, 3 and 6 ms: utilization 20/50/80 % (mean 50, max 80), power 100/200/300 W, the
///   target's memory absent, then 256 and 512 MiB (2 samples, mean 384, max 512);
/// - decode step 2 (2.3-2.8 ms): 3 kernel launches of 4 µs, then a 0.2 ms `cuStreamSynchronize`;
/// - mixed step 3 (3.0-3.5 ms): 5 launches, a 0.1 ms synchronize and a 0.1 ms `cuMemcpyDtoH` (≥ 50 µs: its
///   own slice). Launches per step 3 and 5; synchronize 2 calls, 0.3 ms; all host time 0.432 ms.
fn gpu_events() -> Vec<Event> {
    let mut v = vec![
        gpu(0, 20.0, 100.0, None),
        gpu(30, 50.0, 200.0, Some(256)),
        gpu(60, 80.0, 300.0, Some(512)),
        testing::marker(PID, 0, at(1), CUDA_MARKER),
    ];
    for i in 0..3 {
        v.push(cuda(23, 10_000 * (i + 1), CudaFunc::LaunchKernel, 4_000));
    }
    v.push(cuda(24, 0, CudaFunc::StreamSynchronize, 2 * U));
    for i in 0..5 {
        v.push(cuda(30, 10_000 * (i + 1), CudaFunc::LaunchKernel, 4_000));
    }
    v.push(cuda(32, 0, CudaFunc::StreamSynchronize, U));
    v.push(cuda(33, 0, CudaFunc::MemcpyDtoH, U));
    v
}

fn cuda_probe() -> usize {
    llmprof_abi::PROBE_NAMES
        .iter()
        .position(|n| *n == "cuda")
        .unwrap()
}

#[test]
fn report_has_a_gpu_section_with_counters_cuda_time_and_markers() {
    let mut st = stats();
    st.probes[cuda_probe()].hits = 12;
    st.probes[cuda_probe()].emitted = 11;
    st.probes[cuda_probe()].dropped = 1;
    let path = write_trace_with("gpu.perfetto-trace", &gpu_events(), &st);
    let j = report_json(&path);
    let g = &j["gpu"];
    assert_eq!(g["gpus"].as_array().unwrap().len(), 1, "{g:#}");
    let gpu0 = &g["gpus"][0];
    assert_eq!(gpu0["index"], 0);
    assert_eq!(gpu0["name"], "NVIDIA H100 80GB HBM3 (GPU-0123)");
    let counter = |metric: &str| -> &Value {
        gpu0["counters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["metric"] == metric)
            .unwrap_or_else(|| panic!("no {metric} in {gpu0:#}"))
    };
    let util = counter(counter::GPU_UTILIZATION.0);
    assert_eq!(
        (util["unit"].as_str(), &util["samples"]),
        (Some("%"), &Value::from(3))
    );
    assert_ms(&util["mean"], 50.0);
    assert_ms(&util["max"], 80.0);
    assert_ms(&counter(counter::GPU_POWER.0)["mean"], 200.0);
    assert_ms(&counter(counter::GPU_MEMORY_USED.0)["max"], 1024.0);
    assert!(
        gpu0["counters"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["metric"] != counter::GPU_PCIE_RX.0),
        "an unsupported counter is not reported"
    );
    let mem = &gpu0["process_memory_mib"][0];
    assert_eq!(
        (&mem["pid"], &mem["samples"]),
        (&Value::from(PID), &Value::from(2))
    );
    assert_ms(&mem["mean"], 384.0);
    assert_ms(&mem["max"], 512.0);

    let c = &g["cuda"];
    let f = |name: &str| -> &Value {
        c["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["function"] == name)
            .unwrap_or_else(|| panic!("no {name} in {c:#}"))
    };
    let sync = f("cuStreamSynchronize");
    assert_eq!(sync["calls"], 2);
    assert_ms(&sync["total_ms"], 0.3);
    assert_eq!(sync["individual"]["count"], 2);
    assert_ms(&sync["individual"]["p50"], 0.1);
    assert_ms(&sync["individual"]["p99"], 0.2);
    assert_ms(&sync["individual"]["max"], 0.2);
    let launch = f("cuLaunchKernel");
    assert_eq!(
        (&launch["calls"], &launch["individual"]["count"]),
        (&Value::from(8), &Value::from(0))
    );
    assert_ms(&launch["total_ms"], 0.032);
    assert_eq!(f("cuMemcpyDtoH")["calls"], 1);
    assert_eq!(
        c["functions"][0]["function"], "cuStreamSynchronize",
        "by total time"
    );
    assert_ms(&c["host_total_ms"], 0.432);
    assert_eq!(c["synchronize_calls"], 2);
    assert_ms(&c["synchronize_ms"], 0.3);
    let lps = &c["launches_per_step"];
    assert_eq!(lps["count"], 2);
    assert_ms(&lps["p50"], 3.0);
    assert_ms(&lps["max"], 5.0);
    assert_eq!(
        c["summary"],
        serde_json::json!({"calls": 11, "individual": 3, "batches": 2, "batched": 8, "over_budget": 0})
    );
    assert_eq!(
        c["probe"],
        serde_json::json!({"hits": 12, "emitted": 11, "dropped": 1})
    );
    assert_eq!(
        CUDA_MARKER,
        marker::cuda_probes_attached(41, "/usr/lib/libcuda.so.1", 0),
        "the fixture's marker is the one llmprof writes"
    );
    assert_eq!(g["markers"], serde_json::json!([CUDA_MARKER]));
    assert_eq!(
        j["drops"]["total_dropped"], 8,
        "5 syscalls + 1 cuda probe drops + 2 in user space"
    );

    let out = llmprof(&["report"], &path);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "GPU 0: NVIDIA H100 80GB HBM3 (GPU-0123)",
        "utilization                samples      3  mean      50.00  max      80.00 %",
        "memory of pid 4242         samples      2  mean     384.00  max     512.00 MiB",
        "the host waited for the GPU in 2 synchronize calls, 0.300 ms",
        "cuStreamSynchronize              2        0.300       2      0.100      0.200      0.200",
        "cuLaunchKernel                   8        0.032       0          -          -          -",
        "launches per engine step: 2 steps, p50 3, max 5",
        "calls 11: 3 individual, 8 in 2 batches",
        "marker: CUDA driver probes attached: 41 entry points",
        "cuda             hits         12  emitted         11  dropped        1",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_trace_without_gpu_data_leaves_the_section_out() {
    let path = write_trace("nogpu.perfetto-trace");
    assert_eq!(report_json(&path)["gpu"], Value::Null);
    let out = llmprof(&["report"], &path);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("\nGPU"), "nothing to say, no section: {text}");
    let _ = std::fs::remove_file(&path);
}

/// The GPU numbers of the report against Perfetto's trace processor on the same file.
#[test]
fn gpu_section_agrees_with_perfetto_trace_processor() {
    if !e2e::require(
        e2e::trace_processor::available(),
        "Perfetto trace processor not installed (cargo xtask setup-tools)",
    ) {
        return;
    }
    let path = write_trace_with("gpu-tp.perfetto-trace", &gpu_events(), &stats());
    let j = report_json(&path);
    let mut tp = e2e::trace_processor::load(&path).expect("trace loads");
    let row = tp
        .query(&format!(
            "select avg(c.value) as mean, max(c.value) as max, count(*) as n from counter c \
             join counter_track t on c.track_id = t.id where t.name = '{}'",
            track::gpu_counter(0, counter::GPU_UTILIZATION.0)
        ))
        .unwrap();
    let util = &j["gpu"]["gpus"][0]["counters"][0];
    assert_eq!(util["metric"], counter::GPU_UTILIZATION.0);
    assert_eq!(util["samples"], row[0]["n"]);
    assert!(
        close(&util["mean"], row[0]["mean"].as_f64().unwrap()),
        "{util} vs {row:?}"
    );
    assert!(
        close(&util["max"], row[0]["max"].as_f64().unwrap()),
        "{util} vs {row:?}"
    );
    let sync = tp
        .query(&format!(
            "select sum(dur) / 1e6 as v from slice where category = '{}' and name like '%{}'",
            category::CUDA_HOST,
            slice::cuda_call("Synchronize")
        ))
        .unwrap();
    assert!(close(
        &j["gpu"]["cuda"]["synchronize_ms"],
        sync[0]["v"].as_f64().unwrap()
    ));
    let (launches, step_id) = (tp_arg(arg::LAUNCHES), tp_arg(arg::STEP_ID));
    let most = tp
        .query_i64(&format!(
            "select max(n) from (select sum(extract_arg(arg_set_id, '{launches}')) as n from slice \
             where category = '{}' and extract_arg(arg_set_id, '{step_id}') is not null \
             group by extract_arg(arg_set_id, '{step_id}'))",
            category::CUDA_HOST
        ))
        .unwrap();
    assert!(close(&j["gpu"]["cuda"]["launches_per_step"]["max"], most as f64));
    drop(tp);
    let _ = std::fs::remove_file(&path);
}
