//! `cargo xtask bench kernels`: quantized matmul throughput of the CPU kernels, single thread, in GMAC/s of
//! on-CPU time, for the default model's shapes (1536 × 576), with the kernel family this CPU selects
//! (`LLMSERVE_SIMD=avx512|avx2|scalar` caps it for a side-by-side comparison):
//! - `hot`: one matrix, in cache, per weight type and tokens per call (1, 4, 8, 16; activations prepared once
//!   per product, as the engine prepares once per product group);
//! - `cold`: Q4_1 over 160 distinct matrices (80 MB, the default model's size) taken in turn, as an engine step
//!   takes its layers: against `hot`, how much of a step's matmul time is waiting for memory.

mod common;

use inference::gguf::GgmlType;
use inference::quant::{MatOut, Prepared, QMatrix, quantize_ggml, simd_level};

use common::{emit, fail, rounds, thread_cpu_ns};

const ROWS: usize = 1536;
const COLS: usize = 576;

fn weights() -> Vec<f32> {
    (0..ROWS * COLS)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect()
}

fn matrix(ty: GgmlType, w: &[f32]) -> QMatrix {
    let q = quantize_ggml(ty, w).unwrap_or_else(|e| fail(&format!("quantize {ty:?}: {e}")));
    QMatrix::from_ggml(ty, ROWS, COLS, &q).unwrap_or_else(|e| fail(&format!("matrix {ty:?}: {e}")))
}

/// GMAC/s of `calls` products over `mats` (in turn) with `n_tok` tokens, on this thread's CPU time.
fn gmacs(mats: &[QMatrix], n_tok: usize, calls: usize, prep: &mut Prepared) -> f64 {
    let x: Vec<f32> = (0..n_tok * COLS).map(|i| (i % 13) as f32 / 13.0).collect();
    let mut out = vec![0f32; ROWS * n_tok];
    let cpu0 = thread_cpu_ns();
    for m in mats.iter().cycle().take(calls) {
        let a = prep.prepare(&x, n_tok, COLS);
        m.matmul_prepared(&a, 0, &mut MatOut::row_major(&mut out, n_tok));
    }
    std::hint::black_box(&out);
    let s = (thread_cpu_ns() - cpu0) as f64 / 1e9;
    (ROWS * COLS * n_tok * calls) as f64 / s / 1e9
}

fn main() {
    let rounds = rounds();
    eprintln!("kernels: {:?}, {rounds} rounds", simd_level());
    let w = weights();
    let hot: Vec<(GgmlType, QMatrix)> = [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F32]
        .into_iter()
        .map(|ty| (ty, matrix(ty, &w)))
        .collect();
    let cold: Vec<QMatrix> = (0..160).map(|_| matrix(GgmlType::Q4_1, &w)).collect();
    let mut prep = Prepared::default();
    for _ in 0..rounds {
        for (ty, m) in &hot {
            for n_tok in [1, 4, 8, 16] {
                // Tens of milliseconds of CPU per measurement: the thread CPU clock ticks coarsely on some VMs.
                let calls = 2000 / n_tok.min(4);
                let v = gmacs(std::slice::from_ref(m), n_tok, calls, &mut prep);
                emit(&format!("hot {ty:?} n_tok={n_tok:>2}"), "GMAC/s", v);
            }
        }
        for n_tok in [1, 8] {
            let v = gmacs(&cold, n_tok, 3 * cold.len(), &mut prep);
            emit(&format!("cold Q4_1 n_tok={n_tok:>2}"), "GMAC/s", v);
        }
    }
}
