//! The CPU backend: Llama forward pass over a batch of sequence chunks with a paged f32 KV cache.
//!
//! Owns the KV-cache memory (per layer, K and V, `num_blocks × block_size` token slots of `n_kv_heads ×
//! head_dim` floats) and the compute: RMSNorm, Q/K/V projections, RoPE (llama.cpp NORM mode: adjacent pairs;
//! GGUF converters permute Q/K rows for it), causal GQA attention that reads K/V through each sequence's block
//! table, output projection, SiLU-gated FFN, final norm and LM head. All tokens of a step go through each weight
//! matrix together (batched kernels, see [`crate::quant`]); matrices are split by output rows across the
//! compute pool of `threads` threads ([`super::pool`]: spins briefly, then parks), and attention is split by
//! (token, head). Scratch buffers are reused across steps
//! (no per-token allocation of activations). The device interval of a step is the host compute interval
//! (CLOCK_BOOTTIME). Never blocks on anything but its own compute.

use std::sync::Arc;

use super::pool::{ComputePool, PoolStats};
use super::{Backend, BackendError, BatchItem, DeviceClock, StepOutput};
use crate::model::{Model, ModelConfig};
use crate::quant::{self, QMatrix};

/// Row-split granularity: each matrix product is cut into about this many tasks per thread, so work stealing
/// evens out threads slowed by other processes.
const TASKS_PER_THREAD: usize = 3;

/// Attention with fewer multiply-adds than this (per step, Q·K over every cached position) runs on the calling
/// thread: below it the pool's hand-off costs more than splitting saves (~30 µs of AVX-512 work).
const INLINE_ATTENTION_MACS: usize = 1 << 18;

/// Fewest rows in one matmul task (smaller tasks cost more in scheduling than they save).
const MIN_TASK_ROWS: usize = 16;

/// The CPU backend.
pub struct CpuBackend {
    model: Arc<Model>,
    num_blocks: usize,
    block_size: usize,
    threads: usize,
    pool: ComputePool,
    /// Per layer: K cache, `[slot][kv_dim]` with slot = block × block_size + offset.
    k_cache: Vec<Vec<f32>>,
    /// Per layer: V cache, same layout.
    v_cache: Vec<Vec<f32>>,
    /// RoPE inverse frequencies, `[head_dim / 2]`.
    inv_freq: Vec<f32>,
    scratch: Scratch,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("model", &self.model.config.name)
            .field("num_blocks", &self.num_blocks)
            .field("block_size", &self.block_size)
            .field("threads", &self.threads)
            .finish()
    }
}

/// Reusable activation buffers (grown on demand, never shrunk).
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    gate: Vec<f32>,
    tmp: Vec<f32>,
    /// Per token of the step: (item index, position).
    tok: Vec<(usize, usize)>,
    /// Rows of `x` whose logits are wanted.
    logit_rows: Vec<usize>,
    /// Matmul task list: output bounds (in `tmp`) and, per task, (matrix index, first row).
    bounds: Vec<usize>,
    tasks: Vec<(usize, usize)>,
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

pub(crate) fn rope_inv_freq(c: &ModelConfig) -> Vec<f32> {
    // theta_i = base^(-2i / head_dim) (RoPE paper; llama.cpp rope with n_dims = head_dim).
    (0..c.head_dim / 2)
        .map(|i| (f64::from(c.rope_base).powf(-2.0 * i as f64 / c.head_dim as f64)) as f32)
        .collect()
}

impl CpuBackend {
    /// A backend for `model` with a KV cache of `num_blocks` blocks of `block_size` tokens, computing with
    /// `threads` threads (0: the number of available CPUs).
    pub fn new(
        model: Arc<Model>,
        num_blocks: usize,
        block_size: usize,
        threads: usize,
    ) -> Result<Self, BackendError> {
        if num_blocks == 0 || block_size == 0 {
            return Err(BackendError::InvalidBatch(
                "KV cache needs at least one block of at least one slot".into(),
            ));
        }
        let threads = if threads == 0 {
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        } else {
            threads
        };
        let pool = ComputePool::new(threads, "llmserve-cpu")
            .map_err(|e| BackendError::Device(format!("cannot start {threads} compute threads: {e}")))?;
        let c = &model.config;
        let per_layer = num_blocks
            .checked_mul(block_size)
            .and_then(|s| s.checked_mul(c.kv_dim()))
            .ok_or_else(|| BackendError::InvalidBatch("KV cache size overflows".into()))?;
        let k_cache = (0..c.n_layers).map(|_| vec![0f32; per_layer]).collect();
        let v_cache = (0..c.n_layers).map(|_| vec![0f32; per_layer]).collect();
        let inv_freq = rope_inv_freq(c);
        Ok(CpuBackend {
            model,
            num_blocks,
            block_size,
            threads,
            pool,
            k_cache,
            v_cache,
            inv_freq,
            scratch: Scratch::default(),
        })
    }

    /// The model in use.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Blocks in the KV cache.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Compute threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The compute pool's counters (jobs run, parks).
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Bytes of KV-cache memory.
    pub fn kv_cache_bytes(&self) -> usize {
        self.k_cache
            .iter()
            .chain(&self.v_cache)
            .map(|l| l.len() * 4)
            .sum()
    }

    fn validate(&self, batch: &[BatchItem<'_>]) -> Result<(), BackendError> {
        super::validate_batch(&self.model.config, self.num_blocks, self.block_size, batch)
    }
}

/// Computes `W_i · x` for every matrix of `mats` over `n_tok` tokens on the pool, writing each result
/// `[rows_i][n_tok]` consecutively into `tmp`: one flat loop over tasks of about `total rows / (threads ×
/// TASKS_PER_THREAD)` rows (one hand-off per matrix group).
fn matmul_multi(
    pool: &mut ComputePool,
    bounds: &mut Vec<usize>,
    tasks: &mut Vec<(usize, usize)>,
    tmp: &mut [f32],
    mats: &[&QMatrix],
    x: &[f32],
    n_tok: usize,
) {
    let total: usize = mats.iter().map(|m| m.rows()).sum();
    let chunk = total
        .div_ceil(pool.threads() * TASKS_PER_THREAD)
        .max(MIN_TASK_ROWS);
    bounds.clear();
    tasks.clear();
    let mut off = 0;
    bounds.push(0);
    for (mi, m) in mats.iter().enumerate() {
        let mut r = 0;
        while r < m.rows() {
            let nr = chunk.min(m.rows() - r);
            tasks.push((mi, r));
            off += nr * n_tok;
            bounds.push(off);
            r += nr;
        }
    }
    let tasks = &*tasks;
    pool.segments_mut(&mut tmp[..off], bounds, |i, out| {
        let (mi, row0) = tasks[i];
        mats[mi].matmul_rows(x, n_tok, row0, out);
    });
}

/// `src` is `[rows][n_tok]`; writes `dst[t * rows + r]`.
fn transpose_into(src: &[f32], rows: usize, n_tok: usize, dst: &mut [f32]) {
    if n_tok == 1 {
        dst[..rows].copy_from_slice(&src[..rows]);
        return;
    }
    for r in 0..rows {
        for t in 0..n_tok {
            dst[t * rows + r] = src[r * n_tok + t];
        }
    }
}

/// `out = x / rms(x) * w` per row of `dim`.
fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let dim = w.len();
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let ss = quant::dot(xr, xr);
        let scale = 1.0 / (ss / dim as f32 + eps).sqrt();
        for ((o, &xv), &wv) in or.iter_mut().zip(xr).zip(w) {
            *o = xv * scale * wv;
        }
    }
}

/// RoPE, NORM mode (adjacent pairs), on every head of a `[n_heads][head_dim]` vector at `pos`.
fn rope(v: &mut [f32], head_dim: usize, pos: usize, inv_freq: &[f32]) {
    for head in v.chunks_exact_mut(head_dim) {
        for (i, pair) in head.chunks_exact_mut(2).enumerate() {
            let (s, c) = (pos as f32 * inv_freq[i]).sin_cos();
            let (a, b) = (pair[0], pair[1]);
            pair[0] = a * c - b * s;
            pair[1] = a * s + b * c;
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn device_clock(&self) -> DeviceClock {
        DeviceClock::HostCompute
    }

    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn forward(&mut self, batch: &[BatchItem<'_>]) -> Result<StepOutput, BackendError> {
        let start = llmprof_probes::boottime_ns();
        self.validate(batch)?;
        if batch.is_empty() {
            let end = llmprof_probes::boottime_ns();
            return Ok(StepOutput {
                logits: Vec::new(),
                device_start_ns: start,
                device_end_ns: end,
                graph_batch: 0,
            });
        }
        let logits = self.forward_inner(batch);
        let end = llmprof_probes::boottime_ns();
        Ok(StepOutput {
            logits,
            device_start_ns: start,
            device_end_ns: end,
            graph_batch: 0,
        })
    }

    fn swap_weights(&mut self, model: Arc<Model>) -> Result<(), BackendError> {
        let (a, b) = (&self.model.config, &model.config);
        if a.n_layers != b.n_layers || a.n_kv_heads != b.n_kv_heads || a.head_dim != b.head_dim {
            return Err(BackendError::IncompatibleWeights(format!(
                "KV geometry {} layers × {} KV heads × {} differs from the running {} × {} × {}",
                b.n_layers, b.n_kv_heads, b.head_dim, a.n_layers, a.n_kv_heads, a.head_dim
            )));
        }
        self.inv_freq = rope_inv_freq(b);
        self.model = model;
        Ok(())
    }
}

impl CpuBackend {
    /// The forward pass proper.
    fn forward_inner(&mut self, batch: &[BatchItem<'_>]) -> Vec<Vec<f32>> {
        let model = Arc::clone(&self.model);
        let c = &model.config;
        let w = &model.weights;
        let (dim, hd, nh, nkv) = (c.dim, c.head_dim, c.n_heads, c.n_kv_heads);
        let (qd, kvd, ffn) = (nh * hd, c.kv_dim(), c.ffn_dim);
        let n: usize = batch.iter().map(|b| b.tokens.len()).sum();
        let pool = &mut self.pool;
        let bs = self.block_size;
        let s = &mut self.scratch;
        s.tok.clear();
        s.logit_rows.clear();
        for (i, it) in batch.iter().enumerate() {
            for j in 0..it.tokens.len() {
                s.tok.push((i, it.start_pos + j));
            }
            if it.need_logits {
                s.logit_rows.push(s.tok.len() - 1);
            }
        }
        grow(&mut s.x, n * dim);
        grow(&mut s.xn, n * dim);
        grow(&mut s.q, n * qd);
        grow(&mut s.k, n * kvd);
        grow(&mut s.v, n * kvd);
        grow(&mut s.att, n * qd);
        grow(&mut s.gate, n * ffn);
        let tmp_rows = (qd + 2 * kvd).max(2 * ffn).max(dim);
        grow(&mut s.tmp, tmp_rows * n);

        // Embedding.
        let mut t = 0;
        for it in batch {
            for &tok in it.tokens {
                w.token_embd
                    .dequantize_row(tok as usize, &mut s.x[t * dim..(t + 1) * dim]);
                t += 1;
            }
        }
        let x = &mut s.x[..n * dim];
        let xn = &mut s.xn[..n * dim];
        let scale = 1.0 / (hd as f32).sqrt();
        let group = nh / nkv;

        for (l, lw) in w.layers.iter().enumerate() {
            // Attention block.
            rms_norm(x, &lw.attn_norm, c.rms_eps, xn);
            matmul_multi(
                pool,
                &mut s.bounds,
                &mut s.tasks,
                &mut s.tmp,
                &[&lw.wq, &lw.wk, &lw.wv],
                xn,
                n,
            );
            transpose_into(&s.tmp[..qd * n], qd, n, &mut s.q);
            transpose_into(&s.tmp[qd * n..(qd + kvd) * n], kvd, n, &mut s.k);
            transpose_into(&s.tmp[(qd + kvd) * n..(qd + 2 * kvd) * n], kvd, n, &mut s.v);
            let kc = &mut self.k_cache[l];
            let vc = &mut self.v_cache[l];
            for (ti, &(item, pos)) in s.tok.iter().enumerate() {
                rope(&mut s.q[ti * qd..(ti + 1) * qd], hd, pos, &self.inv_freq);
                rope(&mut s.k[ti * kvd..(ti + 1) * kvd], hd, pos, &self.inv_freq);
                let slot = batch[item].block_table[pos / bs] as usize * bs + pos % bs;
                kc[slot * kvd..(slot + 1) * kvd].copy_from_slice(&s.k[ti * kvd..(ti + 1) * kvd]);
                vc[slot * kvd..(slot + 1) * kvd].copy_from_slice(&s.v[ti * kvd..(ti + 1) * kvd]);
            }
            let (kc, vc) = (&*kc, &*vc);
            let (q, tok) = (&s.q, &s.tok);
            let attend = |idx: usize, out: &mut [f32]| {
                let (ti, h) = (idx / nh, idx % nh);
                let (item, pos) = tok[ti];
                let table = batch[item].block_table;
                let qh = &q[ti * qd + h * hd..ti * qd + (h + 1) * hd];
                let koff = (h / group) * hd;
                // One pass with an online softmax (running max and sum, Milakov & Gimelshein 2018):
                // no score buffer, each K/V slot read once.
                out.fill(0.0);
                let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
                for p in 0..=pos {
                    let slot = table[p / bs] as usize * bs + p % bs;
                    let base = slot * kvd + koff;
                    let sc = quant::dot(qh, &kc[base..base + hd]) * scale;
                    if sc > max {
                        let r = (max - sc).exp();
                        sum *= r;
                        out.iter_mut().for_each(|o| *o *= r);
                        max = sc;
                    }
                    let w = (sc - max).exp();
                    sum += w;
                    quant::axpy(w, &vc[base..base + hd], out);
                }
                let inv = 1.0 / sum;
                out.iter_mut().for_each(|o| *o *= inv);
            };
            // Decode attention over a short context is a few µs: a hand-off would cost more than it saves.
            let work: usize = tok.iter().map(|&(_, pos)| (pos + 1) * qd).sum();
            if work < INLINE_ATTENTION_MACS {
                s.att[..n * qd]
                    .chunks_mut(hd)
                    .enumerate()
                    .for_each(|(i, o)| attend(i, o));
            } else {
                pool.chunks_mut(&mut s.att[..n * qd], hd, attend);
            }
            matmul_multi(
                pool,
                &mut s.bounds,
                &mut s.tasks,
                &mut s.tmp,
                &[&lw.wo],
                &s.att[..n * qd],
                n,
            );
            transpose_into(&s.tmp[..dim * n], dim, n, xn);
            for (a, b) in x.iter_mut().zip(xn.iter()) {
                *a += b;
            }

            // Feed-forward block.
            rms_norm(x, &lw.ffn_norm, c.rms_eps, xn);
            matmul_multi(
                pool,
                &mut s.bounds,
                &mut s.tasks,
                &mut s.tmp,
                &[&lw.w_gate, &lw.w_up],
                xn,
                n,
            );
            // SiLU(gate) * up, read straight from the matmul's [row][token] layout into [token][row], one token's row
            // per task: the `expf`s were the largest serial part of a batched step (one task, i.e. inline, at one
            // token).
            let gate_up = &s.tmp[..2 * ffn * n];
            pool.chunks_mut(&mut s.gate[..n * ffn], ffn, |t, out| {
                for (r, o) in out.iter_mut().enumerate() {
                    let (g, u) = (gate_up[r * n + t], gate_up[(ffn + r) * n + t]);
                    *o = g / (1.0 + (-g).exp()) * u;
                }
            });
            matmul_multi(
                pool,
                &mut s.bounds,
                &mut s.tasks,
                &mut s.tmp,
                &[&lw.w_down],
                &s.gate[..n * ffn],
                n,
            );
            transpose_into(&s.tmp[..dim * n], dim, n, xn);
            for (a, b) in x.iter_mut().zip(xn.iter()) {
                *a += b;
            }
        }

        // Final norm and LM head for the rows that need logits.
        let nl = s.logit_rows.len();
        if nl == 0 {
            return Vec::new();
        }
        grow(&mut s.q, nl * dim);
        for (j, &row) in s.logit_rows.iter().enumerate() {
            let (src, dst) = (&x[row * dim..(row + 1) * dim], &mut s.q[j * dim..(j + 1) * dim]);
            rms_norm(src, &w.output_norm, c.rms_eps, dst);
        }
        let head = w.lm_head();
        let vocab = head.rows();
        grow(&mut s.tmp, vocab * nl);
        matmul_multi(
            pool,
            &mut s.bounds,
            &mut s.tasks,
            &mut s.tmp,
            &[head],
            &s.q[..nl * dim],
            nl,
        );
        (0..nl)
            .map(|j| (0..vocab).map(|r| s.tmp[r * nl + j]).collect())
            .collect()
    }
}
