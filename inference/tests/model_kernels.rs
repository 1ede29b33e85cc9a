//! Kernel throughput measurement (ignored; release): quantized matmul rows per second for the default model's
//! shapes, single thread, with the kernel family this CPU selects (`LLMSERVE_SIMD=avx512`, `avx2` cap it). `cargo test --release -p inference --test model_kernels -- --ignored --nocapture`

use std::time::Instant;

use inference::gguf::GgmlType;
use inference::quant::{MatOut, Prepared, QMatrix, quantize_ggml, simd_level};

/// Nanoseconds this thread has run on a CPU (first field of /proc/thread-self/schedstat).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

#[test]
#[ignore = "speed measurement; run in release with --ignored --nocapture"]
fn model_kernel_speed() {
    // `LLMSERVE_SIMD=avx512` (or `avx2`, `scalar`) caps the kernel family for a side-by-side comparison.
    println!("kernels: {:?}", simd_level());
    let (rows, cols) = (1536, 576);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let mut prep = Prepared::default();
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F32] {
        let m =
            QMatrix::from_ggml(ty, rows, cols, &quantize_ggml(ty, &w).expect("quantize")).expect("matrix");
        for n_tok in [1, 4, 8, 16] {
            let x: Vec<f32> = (0..n_tok * cols).map(|i| (i % 13) as f32 / 13.0).collect();
            let mut out = vec![0f32; rows * n_tok];
            // Enough calls for tens of milliseconds of CPU: the thread CPU clock ticks coarsely on some VMs.
            let iters = 2000 / n_tok.min(4);
            let t = Instant::now();
            let cpu0 = thread_cpu_ns();
            for _ in 0..iters {
                // Preparation included: the engine prepares once per product group, here once per product.
                let a = prep.prepare(&x, n_tok, cols);
                m.matmul_prepared(&a, 0, &mut MatOut::row_major(&mut out, n_tok));
            }
            let wall = t.elapsed().as_secs_f64();
            // On a loaded machine wall time mostly measures other processes: report on-CPU time.
            let s = (thread_cpu_ns() - cpu0) as f64 / 1e9;
            println!("  wall {wall:.4} s, on CPU {s:.4} s");
            let macs = (rows * cols * n_tok * iters) as f64;
            println!(
                "{ty:?} n_tok={n_tok}: {:.2} GMAC/s ({:.1} us per call)",
                macs / s / 1e9,
                s / iters as f64 * 1e6
            );
        }
    }
}

/// The same Q4_1 kernel over weights that are not in any cache: 160 distinct 1536×576 matrices (80 MB, the default
/// model's size) taken in turn, as an engine step takes its layers. Against `model_kernel_speed`'s L2-resident
/// matrix it shows how much of a step's matmul time is waiting for memory.
#[test]
#[ignore = "speed measurement; run in release with --ignored --nocapture"]
fn model_kernel_speed_with_cold_weights() {
    let (rows, cols, count) = (1536, 576, 160);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let q = quantize_ggml(GgmlType::Q4_1, &w).expect("quantize");
    let mut prep = Prepared::default();
    let mats: Vec<QMatrix> = (0..count)
        .map(|_| QMatrix::from_ggml(GgmlType::Q4_1, rows, cols, &q).expect("matrix"))
        .collect();
    for n_tok in [1, 8] {
        let x: Vec<f32> = (0..n_tok * cols).map(|i| (i % 13) as f32 / 13.0).collect();
        let mut out = vec![0f32; rows * n_tok];
        let passes = 3;
        let cpu0 = thread_cpu_ns();
        for _ in 0..passes {
            for m in &mats {
                let a = prep.prepare(&x, n_tok, cols);
                m.matmul_prepared(&a, 0, &mut MatOut::row_major(&mut out, n_tok));
            }
        }
        let s = (thread_cpu_ns() - cpu0) as f64 / 1e9;
        let macs = (rows * cols * n_tok * count * passes) as f64;
        println!(
            "Q4_1 cold n_tok={n_tok}: {:.2} GMAC/s ({:.1} us per call)",
            macs / s / 1e9,
            s / (count * passes) as f64 * 1e6
        );
    }
}
