use super::*;
use llmprof_abi::StepKind;

#[test]
fn formatted_names_parse_back() {
    assert_eq!(slice::parse_request(&slice::request(42)), Some(42));
    assert_eq!(slice::parse_request("request 4 (x)"), None);
    assert_eq!(track::request(4, "xr-4"), "request 4 (xr-4)");
    for k in [StepKind::Prefill, StepKind::Decode, StepKind::Mixed] {
        assert_eq!(slice::parse_step(slice::step(Some(k))), Some(k));
    }
    assert_eq!(slice::parse_step(slice::step(None)), None);
    use track::GpuTrack;
    assert_eq!(
        track::parse_gpu(&track::gpu_group(1, "H100", "GPU-9")),
        Some(GpuTrack::Group(1, "H100 (GPU-9)"))
    );
    assert_eq!(
        track::parse_gpu(&track::gpu_counter(0, counter::GPU[0].0)),
        Some(GpuTrack::Counter(0, "utilization"))
    );
    assert_eq!(
        track::parse_gpu(&track::gpu_process_memory(2, 77)),
        Some(GpuTrack::ProcessMemory(2, 77))
    );
    assert_eq!(track::parse_gpu(track::LLMPROF), None);
    assert_eq!(tp_arg(arg::NUM_SEQS), "debug.num_seqs");
    let stop = llmprof_abi::FinishReason::Stop;
    assert_eq!(arg::parse_finish_reason(stop.name()), Some(stop));
    assert_eq!(arg::parse_finish_reason(arg::UNFINISHED), None);
}

#[test]
fn string_values_read_back() {
    let p = value::probe_counters(3, 2, 1);
    assert_eq!(p, "hits=3 emitted=2 dropped=1");
    assert_eq!(value::field::<u64>(&p, value::DROPPED), Some(1));
    let t = value::top_syscall("read", 7, 4, 1.5);
    assert_eq!(value::field::<f64>(&t, value::TOTAL_MS), Some(1.5));
    let c = value::cuda_calls(1, 2, 3, 4, 5);
    assert_eq!(value::field::<u64>(&c, value::OVER_BUDGET), Some(5));
    let f = [
        value::cuda_function("cuLaunchKernel", 50, 0.2),
        value::cuda_function("cuMemcpyHtoDAsync", 3, 0.012),
    ];
    assert_eq!(
        value::cuda_functions(&f.join(" ")),
        vec![
            ("cuLaunchKernel".to_owned(), 50, 0.2),
            ("cuMemcpyHtoDAsync".to_owned(), 3, 0.012)
        ]
    );
    assert!(value::cuda_functions("").is_empty());
    let pairs: Vec<(&str, f64)> = value::pairs("syscalls=1.500 x=y").collect();
    assert_eq!(pairs, [("syscalls", 1.5)]);
}
