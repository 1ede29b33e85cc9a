//! Step device times on the host's BOOTTIME clock, and (printing only) decode throughput.

use super::*;

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_step_times_are_cuda_events_on_the_host_boottime_clock() {
    let model = tiny_model(GgmlType::Q4_1, false);
    let mut gpu = CudaBackend::new(model, 64, 4, 0).unwrap();
    assert_eq!(gpu.device_clock(), DeviceClock::CudaEvents);
    let toks: Vec<u32> = (3..40).collect();
    let table: Vec<u32> = (0..16).collect();
    let started = Instant::now();
    let mut n = 0;
    // Run for over two anchor intervals so the clock is re-anchored.
    while started.elapsed().as_secs_f64() < 2.5 {
        let before = llmprof_probes::boottime_ns();
        let out = gpu
            .forward(&[BatchItem {
                tokens: &toks,
                start_pos: 0,
                block_table: &table,
                logits: Logits::Full,
            }])
            .unwrap();
        let after = llmprof_probes::boottime_ns();
        // The anchor's uncertainty is a few microseconds; allow 50 µs.
        let slack = 50_000;
        assert!(
            out.device_start_ns + slack >= before,
            "device start {} before the call began {before}",
            out.device_start_ns
        );
        assert!(
            out.device_end_ns <= after + slack,
            "device end {} after the call returned {after}",
            out.device_end_ns
        );
        assert!(out.device_end_ns > out.device_start_ns, "empty device interval");
        n += 1;
    }
    assert!(
        gpu.clock_anchors() >= 2,
        "{} anchors in 2.5 s of steps: the clock is not re-anchored",
        gpu.clock_anchors()
    );
    eprintln!("{n} steps, {} clock anchors", gpu.clock_anchors());
}

#[test]
#[ignore = "needs an NVIDIA GPU and the default model; prints decode throughput"]
fn cuda_decode_throughput_batch_1_and_32() {
    let model = load_default_model();
    for (kv, graphs) in [(KvDtype::F16, true), (KvDtype::F32, false), (KvDtype::F16, false)] {
        let mut gpu = cuda(&model, 1024, 16, kv, graphs);
        decode_throughput(&mut gpu, &format!("KV {kv:?}, graphs {graphs}"));
    }
    // Without the fused RMSNorm launches (separate norm, matmul and RoPE launches; the default fuses steps of up
    // to 256 tokens).
    let options = CudaOptions {
        fuse_max_tokens: 0,
        ..CudaOptions::default()
    };
    let mut gpu = CudaBackend::with_options(model.clone(), 1024, 16, options).unwrap();
    decode_throughput(&mut gpu, "KV F16, graphs true, no fused launches");
}

/// Decode tokens/s at batch 1 and 32: greedy (argmax only, what the engine asks for greedy requests), drawn on the
/// device as a chat client asks (temperature 0.8, top_p 0.95; and OpenAI's default, temperature 1), and with the
/// logits copied back, side by side, with the sampled/greedy ratio; then prefill tokens/s of one 512-token prompt
/// (the engine's default step budget).
fn decode_throughput(gpu: &mut CudaBackend, what: &str) {
    let chat = SampleSpec {
        params: SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            ..SamplingParams::default()
        },
        seed: 1,
        index: 0,
        history: &[],
        logprobs: None,
    };
    let openai_default = SampleSpec {
        params: SamplingParams::default(),
        ..chat
    };
    for batch in [1usize, 32] {
        let mut greedy_tps = 0.0;
        for (name, want) in [
            ("greedy", Logits::Argmax),
            ("T 0.8 top_p 0.95", Logits::Sample(chat)),
            ("T 1.0", Logits::Sample(openai_default)),
            ("full logits", Logits::Full),
        ] {
            let prompt_len = 32;
            let steps = 128;
            let tables: Vec<Vec<u32>> = (0..batch)
                .map(|s| {
                    (0..((prompt_len + steps) / 16 + 1) as u32)
                        .map(|b| s as u32 * 16 + b)
                        .collect()
                })
                .collect();
            let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| 100 + i).collect();
            let items: Vec<BatchItem<'_>> =
                tables.iter().map(|t| item(&prompt, 0, t, Logits::Full)).collect();
            gpu.forward(&items).unwrap();
            let toks: Vec<u32> = vec![200; batch];
            let t0 = Instant::now();
            let mut device_ns = 0u64;
            for s in 0..steps {
                let items: Vec<BatchItem<'_>> = tables
                    .iter()
                    .enumerate()
                    .map(|(i, t)| item(&toks[i..i + 1], prompt_len + s, t, want))
                    .collect();
                let out = gpu.forward(&items).unwrap();
                device_ns += out.device_end_ns - out.device_start_ns;
            }
            let wall = t0.elapsed().as_secs_f64();
            let tps = (batch * steps) as f64 / wall;
            if matches!(want, Logits::Argmax) {
                greedy_tps = tps;
            }
            eprintln!(
                "{what}: batch {batch}, {name}: {tps:.0} tokens/s decode ({:.2} ms/step; device busy {:.0}% of the \
                 step; {:.2}x greedy)",
                wall * 1e3 / steps as f64,
                100.0 * device_ns as f64 / 1e9 / wall,
                tps / greedy_tps.max(1e-9)
            );
        }
    }
    let prompt: Vec<u32> = (0..512u32).map(|i| 100 + i).collect();
    let table: Vec<u32> = (0..33).collect();
    let rounds = 8;
    let t0 = Instant::now();
    for _ in 0..rounds {
        gpu.forward(&[item(&prompt, 0, &table, Logits::Argmax)]).unwrap();
    }
    let wall = t0.elapsed().as_secs_f64();
    eprintln!(
        "{what}: prefill of 512 tokens: {:.0} tokens/s ({:.2} ms per prompt)",
        (rounds * prompt.len()) as f64 / wall,
        wall * 1e3 / rounds as f64
    );
}
