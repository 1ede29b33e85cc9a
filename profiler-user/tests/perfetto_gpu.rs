//! The GPU part of the Perfetto sink on a fixture built in code (no GPU, no root): NVML samples become
//! per-GPU counter tracks and the target's GPU-memory counter; CUDA driver calls of an engine with probes
//! become per-step launch batches and individual synchronize slices on the thread's CUDA track. Checked with
//! Perfetto's real trace processor.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use llmprof_abi::{CudaFunc, StepKind};
use llmprof_trace::event::{Event, GpuSample, SessionStats};
use llmprof_trace::names::{arg, counter, slice, tp_arg, track};
use llmprof_trace::perfetto::TraceSink;
use llmprof_trace::testing;

const PID: u32 = 777;
const TID: u32 = 778;
const MS: u64 = 1_000_000;
const T0: u64 = 5_000 * 1_000 * MS;

fn cuda(ts: u64, func: CudaFunc, dur: u64, arg: u64) -> Event {
    testing::cuda(PID, TID, T0 + ts, func, dur, arg)
}

fn gpu(ts: u64, util: f64, proc_mem: Option<u64>) -> Event {
    let sample = GpuSample {
        util_mem_pct: Some(util / 2.0),
        power_w: Some(300.5),
        process_mem_bytes: proc_mem,
        ..testing::h100(util)
    };
    testing::gpu(PID, T0 + ts, sample)
}

fn fixture() -> Vec<Event> {
    let mut evs = vec![gpu(0, 10.0, None)];
    // Two engine steps of 50 launches + a synchronizing copy + a stream sync each.
    for s in 0..2u64 {
        let base = 10 * MS + s * 20 * MS;
        for i in 0..50 {
            evs.push(cuda(base + i * 10_000, CudaFunc::LaunchKernel, 4_000, 0));
        }
        evs.push(cuda(base + MS, CudaFunc::MemcpyDtoH, 100_000, 4096));
        evs.push(cuda(base + 2 * MS, CudaFunc::StreamSynchronize, 5 * MS, 0));
        evs.push(
            testing::step(
                PID,
                TID,
                StepKind::Decode,
                s + 1,
                T0 + base - 1_000,
                T0 + base + 8 * MS,
                &[1],
            )
            .build(),
        );
    }
    evs.push(gpu(100 * MS, 90.0, Some(512 << 20)));
    evs.push(gpu(200 * MS, 80.0, Some(512 << 20)));
    evs.sort_by_key(|e| e.ts_ns);
    evs
}

#[test]
fn gpu_counters_and_cuda_slices_load_in_the_trace_processor() {
    if !e2e::require(
        e2e::trace_processor::available(),
        "Perfetto trace processor not installed (cargo xtask setup-tools)",
    ) {
        return;
    }
    let info = testing::process(PID, "llmserve", "llmserve --backend cuda", [(TID, "engine")]);
    let mut sink = TraceSink::new(Vec::new(), &[info], Some((T0, 1_700_000_000 * 1_000_000_000))).unwrap();
    for e in fixture() {
        sink.push(&e).unwrap();
    }
    let stats = SessionStats {
        end_reason: "duration elapsed".into(),
        ..Default::default()
    };
    let bytes = sink.finish(&stats, Some(T0 + 300 * MS)).unwrap();
    let path = std::env::temp_dir().join(format!(
        "llmprof-gpu-fixture-{}.perfetto-trace",
        std::process::id()
    ));
    std::fs::write(&path, bytes).unwrap();
    let mut tp = e2e::trace_processor::load(&path).unwrap();
    assert_eq!(tp.import_errors().unwrap(), Vec::<serde_json::Value>::new());
    assert_eq!(tp.unterminated_slices().unwrap(), Vec::<serde_json::Value>::new());
    let mut q = |sql: &str| tp.query_i64(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let samples = |agg: &str, track: &str| {
        format!(
            "select {agg} from counter c join counter_track t on c.track_id = t.id where t.name = '{track}'"
        )
    };
    let gpu0 = |metric: (&str, &str)| samples("count(*)", &track::gpu_counter(0, metric.0));
    assert_eq!(q(&gpu0(counter::GPU_UTILIZATION)), 3);
    assert_eq!(q(&gpu0(counter::GPU_POWER)), 3);
    assert_eq!(q(&gpu0(counter::GPU_SM_CLOCK)), 3);
    assert_eq!(q(&gpu0(counter::GPU_TEMPERATURE)), 3);
    assert_eq!(q(&gpu0(counter::GPU_MEMORY_USED)), 3);
    assert_eq!(q(&gpu0(counter::GPU_PCIE_TX)), 3);
    assert_eq!(
        q(&gpu0(counter::GPU_PCIE_RX)),
        0,
        "unsupported counters stay absent"
    );
    assert_eq!(q(&samples("count(*)", &track::gpu_process_memory(0, PID))), 2);
    assert_eq!(
        q(&samples(
            "cast(max(c.value) as int)",
            &track::gpu_counter(0, counter::GPU_UTILIZATION.0)
        )),
        90
    );
    // Per-step launch batches with their step ids; copies ≥ 50 µs and syncs individually.
    let (step_id, function) = (tp_arg(arg::STEP_ID), tp_arg(arg::FUNCTION));
    assert_eq!(
        q(&format!(
            "select count(*) from slice where name = '{}' and extract_arg(arg_set_id, '{step_id}') in (1, 2)",
            slice::cuda_batch(Some(CudaFunc::LaunchKernel.name()), 50)
        )),
        2
    );
    assert_eq!(
        q(&format!(
            "select count(*) from slice where name = '{}' and dur = 5000000",
            slice::cuda_call(CudaFunc::StreamSynchronize.name())
        )),
        2
    );
    assert_eq!(
        q(&format!(
            "select count(*) from slice where name = '{}' and extract_arg(arg_set_id, '{function}') = '{}{}'",
            slice::cuda_call(CudaFunc::MemcpyDtoH.name()),
            CudaFunc::MemcpyDtoH.name(),
            llmprof_abi::CudaVariant::V2.suffix()
        )),
        2
    );
    assert_eq!(
        q(&format!(
            "select count(*) from thread_track t join thread using (utid) \
             where t.name = '{}' and thread.tid = 778",
            track::CUDA
        )),
        1
    );
    std::fs::remove_file(&path).unwrap();
}
