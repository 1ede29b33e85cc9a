//! Single-thread speed of the matmul kernels on the default model's matrix shapes (Q4_1 and Q8_0, 1 and 8
//! tokens), in thread CPU time so that other processes on the machine do not count. Compare kernel families
//! with `LLMSERVE_SIMD=avx2` / `scalar`:
//!
//! ```text
//! cargo run --release -p inference --example kernels
//! LLMSERVE_SIMD=avx2 cargo run --release -p inference --example kernels
//! ```

use inference::gguf::GgmlType;
use inference::quant::{QMatrix, quantize_ggml, simd_level};

/// CPU time of the calling thread, seconds (CLOCK_THREAD_CPUTIME_ID through std: no libc dependency here).
fn thread_cpu_s() -> f64 {
    // /proc/thread-self/schedstat: first field is the time on CPU in ns.
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    s.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / 1e9
}

fn main() {
    println!("kernels: {:?}", simd_level());
    for (ty, rows, cols) in [
        (GgmlType::Q4_1, 1536, 576),
        (GgmlType::Q4_1, 576, 1536),
        (GgmlType::Q8_0, 4096, 576),
    ] {
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect();
        let m = QMatrix::from_ggml(ty, rows, cols, &quantize_ggml(ty, &w).expect("quantize")).expect("matrix");
        for n_tok in [1usize, 8] {
            let x: Vec<f32> = (0..n_tok * cols).map(|i| ((i * 31 % 97) as f32 / 50.0) - 1.0).collect();
            let mut out = vec![0f32; rows * n_tok];
            let mut runs = Vec::new();
            for _ in 0..7 {
                let reps = 200;
                let t = thread_cpu_s();
                for _ in 0..reps {
                    m.matmul_rows(&x, n_tok, 0, &mut out);
                }
                runs.push((thread_cpu_s() - t) / reps as f64);
            }
            runs.sort_by(f64::total_cmp);
            let macs = (rows * cols * n_tok) as f64;
            println!(
                "{ty:?} {rows}x{cols} x {n_tok} tok: median {:.1} us ({:.2} GMAC/s), range {:.1}-{:.1} us",
                runs[3] * 1e6,
                macs / runs[3] / 1e9,
                runs[0] * 1e6,
                runs[6] * 1e6
            );
        }
    }
}
