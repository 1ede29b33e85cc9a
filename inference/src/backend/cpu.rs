//! The CPU backend: Llama forward pass over a batch of sequence chunks with a paged f32 KV cache.
//!
//! Owns the KV-cache memory (per layer, K and V, `num_blocks × block_size` token slots of `n_kv_heads ×
//! head_dim` floats) and the compute: RMSNorm, Q/K/V projections, RoPE (llama.cpp NORM mode: adjacent pairs;
//! GGUF converters permute Q/K rows for it), causal GQA attention that reads K/V through each sequence's block
//! table ([`crate::attention`]), output projection, SiLU-gated FFN, final norm and LM head. All tokens of a step
//! go through each weight matrix together (batched kernels, see [`crate::quant`]); matrices are split by output
//! rows across the compute pool of `threads` threads ([`super::pool`]: spins briefly, then parks), and attention
//! by (token, KV head). Activations are token-major (`[token][feature]`) throughout: each task of a split product
//! writes its rows straight into its columns of the step's buffer ([`SharedCols`]), the output and down
//! projections adding onto the residual stream as they store, so no transposes or separate residual passes run
//! on the engine thread. Scratch buffers are reused across steps (no per-token allocation of activations). The
//! device interval of a step is the host compute interval (CLOCK_BOOTTIME). Never blocks on anything but its own
//! compute.

use std::sync::Arc;

use super::pool::{ComputePool, PoolStats};
use super::{Backend, BackendError, BatchItem, DeviceClock, Logits, StepOutput};
use crate::attention::{self, F16, KvElem, KvHead, PagedKv};
use crate::model::{Model, ModelConfig};
use crate::quant::{self, Acts, AlignedVec, QMatrix, SharedCols};
use crate::sampling;

/// Row-split granularity: each matrix product is cut into this many tasks per thread. One: every task start
/// costs its first rows' weights from L3 (no prefetch has run yet) and the tile kernel's set-up, and with 4 per
/// thread that was ~1.5 ms of a 14 ms concurrency-8 step (docs/lab/engine-cpu.md, "AMX tiles and an f16 KV
/// cache"). A worker that has not claimed its task yet is covered by the pool (the calling thread runs unclaimed
/// tasks itself); one preempted mid-task is waited for.
const TASKS_PER_THREAD: usize = 1;

/// Attention with fewer multiply-adds than this (per step, Q·K over every cached position) runs on the calling
/// thread: below it the pool's hand-off costs more than splitting saves (sized at ~30 µs of work for the earlier,
/// scalar-`exp` attention; the vector kernel does that much in a fraction of the time, so the threshold is
/// conservative).
const INLINE_ATTENTION_MACS: usize = 1 << 18;

/// Fewest rows in one matmul task (smaller tasks cost more in scheduling than they save).
const MIN_TASK_ROWS: usize = 16;

/// Task rows are a multiple of this: the AMX kernel takes rows 16 at a time (a partial group costs a whole one).
const TASK_ROW_MULTIPLE: usize = 16;

/// The CPU backend.
pub struct CpuBackend {
    model: Arc<Model>,
    num_blocks: usize,
    block_size: usize,
    threads: usize,
    pool: ComputePool,
    /// The KV cache of every layer.
    kv: KvCache,
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

/// Reusable activation buffers (grown on demand, never shrunk), all token-major (`[token][feature]`).
#[derive(Default)]
struct Scratch {
    /// The residual stream.
    x: Vec<f32>,
    /// Normalized `x`.
    xn: Vec<f32>,
    /// Q, K and V side by side per token (`qd + 2 kvd`).
    qkv: Vec<f32>,
    /// Attention output per token (`qd`).
    att: Vec<f32>,
    /// Gate and up projections side by side per token (`2 ffn`).
    gate_up: Vec<f32>,
    /// SiLU(gate) · up per token (`ffn`).
    act: Vec<f32>,
    /// Logits of the rows that want them (`vocab` each).
    logits: Vec<f32>,
    /// Per token of the step: (item index, position).
    tok: Vec<(usize, usize)>,
    /// Per token of the step: its RoPE rotation (`head_dim / 2` interleaved cos, sin), computed once per step for
    /// every layer.
    rope_cs: Vec<f32>,
    /// Rows of `x` whose logits are wanted.
    logit_rows: Vec<usize>,
    /// Matmul task list: (matrix index, first row, rows, first output column).
    tasks: Vec<MatTask>,
    /// One sampler (and its buffers) per [`Logits::Sample`] row of a step, so the rows are sampled in parallel.
    samplers: Vec<sampling::Sampler>,
    /// The current product group's activations in the kernels' prepared form (AMX tiles where they run).
    prep: quant::Prepared,
}

/// Per layer, the K and V caches (`[slot][kv_dim]` with slot = block × block_size + offset), in the element type
/// chosen at start (`--kv-cache-dtype`).
enum KvCache {
    F32 {
        k: Vec<AlignedVec<f32>>,
        v: Vec<AlignedVec<f32>>,
    },
    F16 {
        k: Vec<AlignedVec<F16>>,
        v: Vec<AlignedVec<F16>>,
    },
}

impl KvCache {
    fn new(f16: bool, layers: usize, per_layer: usize) -> Self {
        fn caches<T: KvElem>(layers: usize, per_layer: usize) -> Vec<AlignedVec<T>> {
            (0..layers).map(|_| AlignedVec::zeroed(per_layer)).collect()
        }
        if f16 {
            KvCache::F16 {
                k: caches(layers, per_layer),
                v: caches(layers, per_layer),
            }
        } else {
            KvCache::F32 {
                k: caches(layers, per_layer),
                v: caches(layers, per_layer),
            }
        }
    }

    /// The element type's name.
    fn dtype(&self) -> &'static str {
        match self {
            KvCache::F32 { .. } => f32::NAME,
            KvCache::F16 { .. } => F16::NAME,
        }
    }

    /// Bytes of memory.
    fn bytes(&self) -> usize {
        fn sum<T>(k: &[AlignedVec<T>], v: &[AlignedVec<T>]) -> usize {
            k.iter().chain(v).map(|l| std::mem::size_of_val(&l[..])).sum()
        }
        match self {
            KvCache::F32 { k, v } => sum(k, v),
            KvCache::F16 { k, v } => sum(k, v),
        }
    }
}

/// The attention geometry of a step.
#[derive(Debug, Clone, Copy)]
struct AttnShape {
    /// Head size.
    hd: usize,
    /// Query, KV and Q+K+V widths per token.
    qd: usize,
    kvd: usize,
    qkvd: usize,
    /// KV heads, and query heads per KV head.
    nkv: usize,
    group: usize,
    /// Slots per KV-cache block.
    bs: usize,
    /// Score scale, 1 / √hd.
    scale: f32,
}

/// One layer's attention after its Q/K/V product: RoPE on the queries and keys, the keys and values written to
/// the layer's cache (`kc`, `vc`), and each token's attention over its sequence into `att`.
#[expect(
    clippy::too_many_arguments,
    reason = "one layer's attention reads the step's scratch piece by piece"
)]
fn attention_block<T: attention::Kernel>(
    pool: &mut ComputePool,
    sh: AttnShape,
    batch: &[BatchItem<'_>],
    tok: &[(usize, usize)],
    rope_cs: &[f32],
    qkv: &mut [f32],
    (kc, vc): (&mut [T], &mut [T]),
    att: &mut [f32],
) {
    let AttnShape {
        hd,
        qd,
        kvd,
        qkvd,
        nkv,
        group,
        bs,
        scale,
    } = sh;
    for (ti, (&(item, pos), row)) in tok.iter().zip(qkv.chunks_exact_mut(qkvd)).enumerate() {
        let cs = &rope_cs[ti * hd..(ti + 1) * hd];
        let (q, kv) = row.split_at_mut(qd);
        rope(q, hd, cs);
        rope(&mut kv[..kvd], hd, cs);
        let slot = batch[item].block_table[pos / bs] as usize * bs + pos % bs;
        T::store_row(&kv[..kvd], &mut kc[slot * kvd..(slot + 1) * kvd]);
        T::store_row(&kv[kvd..], &mut vc[slot * kvd..(slot + 1) * kvd]);
    }
    let kv = PagedKv {
        k: &*kc,
        v: &*vc,
        stride: kvd,
        block_size: bs,
    };
    let qkv = &*qkv;
    // One task per (token, KV head), all the query heads of its group at once (consecutive in `q`).
    let attend = |idx: usize, out: &mut [f32]| {
        let (ti, kvh) = (idx / nkv, idx % nkv);
        let (item, pos) = tok[ti];
        let q0 = ti * qkvd + kvh * group * hd;
        let qs = &qkv[q0..q0 + group * hd];
        let head = KvHead {
            cache: kv,
            table: batch[item].block_table,
            offset: kvh * hd,
            len: pos + 1,
        };
        attention::attend(qs, hd, &head, scale, out);
    };
    // Decode attention over a short context is a few µs: a hand-off would cost more than it saves.
    let work: usize = tok.iter().map(|&(_, pos)| (pos + 1) * qd).sum();
    if work < INLINE_ATTENTION_MACS {
        att.chunks_mut(group * hd)
            .enumerate()
            .for_each(|(i, o)| attend(i, o));
    } else {
        pool.chunks_mut(att, group * hd, attend);
    }
}

/// One task of a split matrix product: rows `row0 .. row0 + rows` of matrix `mat`, written from output column
/// `col`.
#[derive(Debug, Clone, Copy)]
struct MatTask {
    mat: usize,
    row0: usize,
    rows: usize,
    col: usize,
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
    /// A backend for `model` with an f32 KV cache of `num_blocks` blocks of `block_size` tokens, computing with
    /// `threads` threads (0: the number of available CPUs).
    pub fn new(
        model: Arc<Model>,
        num_blocks: usize,
        block_size: usize,
        threads: usize,
    ) -> Result<Self, BackendError> {
        Self::with_kv_f16(model, num_blocks, block_size, threads, false)
    }

    /// [`Self::new`] with an f16 KV cache when `kv_f16` (half the memory, and half the bytes attention reads per
    /// cached position; logits within about 1e-3 of the f32 cache's, `model_reference`).
    pub fn with_kv_f16(
        model: Arc<Model>,
        num_blocks: usize,
        block_size: usize,
        threads: usize,
        kv_f16: bool,
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
        let kv = KvCache::new(kv_f16, c.n_layers, per_layer);
        let inv_freq = rope_inv_freq(c);
        Ok(CpuBackend {
            model,
            num_blocks,
            block_size,
            threads,
            pool,
            kv,
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
        self.kv.bytes()
    }

    /// The KV cache's element type (`f32` or `f16`).
    pub fn kv_cache_dtype(&self) -> &'static str {
        self.kv.dtype()
    }

    fn validate(&self, batch: &[BatchItem<'_>]) -> Result<(), BackendError> {
        super::validate_batch(&self.model.config, self.num_blocks, self.block_size, batch)
    }
}

/// Computes `W_i · x` for every matrix of `mats` over `n_tok` tokens on the pool, token-major: the matrices'
/// rows side by side, token `t`'s result for row `r` of matrix `i` at `out[t * ld + cols_before_i + r]` with
/// `ld` = the matrices' rows together. `accumulate` adds onto `out` (a residual connection) instead of storing.
/// One flat loop over tasks of about `total rows / (threads × TASKS_PER_THREAD)` rows (one hand-off per matrix
/// group); each task writes its own output columns.
fn matmul_multi(
    pool: &mut ComputePool,
    tasks: &mut Vec<MatTask>,
    out: &mut [f32],
    mats: &[&QMatrix],
    x: Acts<'_>,
    accumulate: bool,
) {
    let n_tok = x.n_tok();
    let ld: usize = mats.iter().map(|m| m.rows()).sum();
    let chunk = ld
        .div_ceil(pool.threads() * TASKS_PER_THREAD)
        .max(MIN_TASK_ROWS)
        .next_multiple_of(TASK_ROW_MULTIPLE);
    tasks.clear();
    let mut col = 0;
    for (mat, m) in mats.iter().enumerate() {
        let mut row0 = 0;
        while row0 < m.rows() {
            let rows = chunk.min(m.rows() - row0);
            tasks.push(MatTask { mat, row0, rows, col });
            row0 += rows;
            col += rows;
        }
    }
    let tasks = &*tasks;
    let cols = SharedCols::new(out, n_tok, ld, accumulate);
    pool.run(tasks.len(), &|i| {
        let t = tasks[i];
        // SAFETY: the tasks' column ranges `col .. col + rows` tile `0 .. ld` without overlap, and the pool runs
        // each task index exactly once, so no two live views share a column.
        let mut view = unsafe { cols.columns(t.col, t.rows) };
        mats[t.mat].matmul_prepared(&x, t.row0, &mut view);
    });
}

/// The gated feed-forward's first half on the pool: `act = SiLU(x · W_gateᵀ) ⊙ (x · W_upᵀ)`, token-major. Each task
/// takes a range of the `ffn` rows, computes them for both matrices into its own columns of `gate_up` (`[n_tok][2
/// ffn]`: gate then up) and applies the SiLU to them at once, so the activation costs no hand-off of its own and
/// reads its inputs while they are in the core's cache.
fn gated_ffn(
    pool: &mut ComputePool,
    gate_up: &mut [f32],
    act: &mut [f32],
    gate: &QMatrix,
    up: &QMatrix,
    x: Acts<'_>,
) {
    let n_tok = x.n_tok();
    let ffn = gate.rows();
    assert_eq!(up.rows(), ffn, "gate and up projections differ in rows");
    // Two matrices per task: half the rows of a plain product's task.
    let chunk = ffn
        .div_ceil(pool.threads() * TASKS_PER_THREAD)
        .max(MIN_TASK_ROWS)
        .next_multiple_of(TASK_ROW_MULTIPLE);
    let gu = SharedCols::new(gate_up, n_tok, 2 * ffn, false);
    let out = SharedCols::new(act, n_tok, ffn, false);
    pool.run(ffn.div_ceil(chunk), &|i| {
        let (row0, rows) = (i * chunk, chunk.min(ffn - i * chunk));
        // SAFETY: task `i` has rows `i chunk ..` (the tasks tile `0 .. ffn` without overlap, each runs once), so the
        // gate columns `row0 ..`, the up columns `ffn + row0 ..` and the output columns `row0 ..` of different tasks
        // are disjoint.
        let (mut g, mut u, mut a) = unsafe {
            (
                gu.columns(row0, rows),
                gu.columns(ffn + row0, rows),
                out.columns(row0, rows),
            )
        };
        gate.matmul_prepared(&x, row0, &mut g);
        up.matmul_prepared(&x, row0, &mut u);
        for tok in 0..n_tok {
            quant::silu_mul(g.token_row(tok), u.token_row(tok), a.token_row(tok));
        }
    });
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

/// The rotation of position `pos`: `(cos, sin)` of `pos · inv_freq[i]` for each pair `i`, interleaved into `cs`.
fn rope_angles(pos: usize, inv_freq: &[f32], cs: &mut [f32]) {
    for (f, out) in inv_freq.iter().zip(cs.chunks_exact_mut(2)) {
        let (s, c) = (pos as f32 * f).sin_cos();
        out[0] = c;
        out[1] = s;
    }
}

/// RoPE, NORM mode (adjacent pairs), on every head of a `[n_heads][head_dim]` vector, with the position's
/// rotation `cs` from [`rope_angles`].
fn rope(v: &mut [f32], head_dim: usize, cs: &[f32]) {
    for head in v.chunks_exact_mut(head_dim) {
        for (pair, r) in head.chunks_exact_mut(2).zip(cs.chunks_exact(2)) {
            let (c, s) = (r[0], r[1]);
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
                device_start_ns: start,
                device_end_ns: end,
                ..StepOutput::default()
            });
        }
        let mut out = self.forward_inner(batch);
        let end = llmprof_probes::boottime_ns();
        out.device_start_ns = start;
        out.device_end_ns = end;
        Ok(out)
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
    /// The forward pass proper: the next token of every row whose logits are wanted (the argmax, or drawn by
    /// the sampler for [`Logits::Sample`] rows), their log-probabilities where asked, and the logits of the rows
    /// that want them in full (copied out of the scratch buffer only for those).
    fn forward_inner(&mut self, batch: &[BatchItem<'_>]) -> StepOutput {
        let model = Arc::clone(&self.model);
        let c = &model.config;
        let w = &model.weights;
        let (dim, hd, nh, nkv) = (c.dim, c.head_dim, c.n_heads, c.n_kv_heads);
        let (qd, kvd, ffn) = (nh * hd, c.kv_dim(), c.ffn_dim);
        let qkvd = qd + 2 * kvd;
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
            if it.logits.wanted() {
                s.logit_rows.push(s.tok.len() - 1);
            }
        }
        grow(&mut s.x, n * dim);
        grow(&mut s.xn, n * dim);
        grow(&mut s.qkv, n * qkvd);
        grow(&mut s.att, n * qd);
        grow(&mut s.gate_up, n * 2 * ffn);
        grow(&mut s.act, n * ffn);
        grow(&mut s.rope_cs, n * hd);
        for (&(_, pos), cs) in s.tok.iter().zip(s.rope_cs.chunks_exact_mut(hd)) {
            rope_angles(pos, &self.inv_freq, cs);
        }

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
        let group = nh / nkv;
        let sh = AttnShape {
            hd,
            qd,
            kvd,
            qkvd,
            nkv,
            group,
            bs,
            scale: 1.0 / (hd as f32).sqrt(),
        };

        for (l, lw) in w.layers.iter().enumerate() {
            // Attention block.
            rms_norm(x, &lw.attn_norm, c.rms_eps, xn);
            let qkv = &mut s.qkv[..n * qkvd];
            let acts = s.prep.prepare(xn, n, dim);
            matmul_multi(pool, &mut s.tasks, qkv, &[&lw.wq, &lw.wk, &lw.wv], acts, false);
            let (tok, cs, att) = (&s.tok, &s.rope_cs, &mut s.att[..n * qd]);
            match &mut self.kv {
                KvCache::F32 { k, v } => {
                    attention_block(pool, sh, batch, tok, cs, qkv, (&mut k[l], &mut v[l]), att)
                }
                KvCache::F16 { k, v } => {
                    attention_block(pool, sh, batch, tok, cs, qkv, (&mut k[l], &mut v[l]), att)
                }
            }
            // Output projection, added onto the residual stream.
            let acts = s.prep.prepare(&s.att[..n * qd], n, qd);
            matmul_multi(pool, &mut s.tasks, x, &[&lw.wo], acts, true);

            // Feed-forward block.
            rms_norm(x, &lw.ffn_norm, c.rms_eps, xn);
            let acts = s.prep.prepare(xn, n, dim);
            gated_ffn(
                pool,
                &mut s.gate_up[..n * 2 * ffn],
                &mut s.act[..n * ffn],
                &lw.w_gate,
                &lw.w_up,
                acts,
            );
            let acts = s.prep.prepare(&s.act[..n * ffn], n, ffn);
            matmul_multi(pool, &mut s.tasks, x, &[&lw.w_down], acts, true);
        }

        // Final norm and LM head for the rows that need logits.
        let nl = s.logit_rows.len();
        if nl == 0 {
            return StepOutput::default();
        }
        for (j, &row) in s.logit_rows.iter().enumerate() {
            let (src, dst) = (&x[row * dim..(row + 1) * dim], &mut xn[j * dim..(j + 1) * dim]);
            rms_norm(src, &w.output_norm, c.rms_eps, dst);
        }
        let head = w.lm_head();
        let vocab = head.rows();
        grow(&mut s.logits, vocab * nl);
        let logits = &mut s.logits[..vocab * nl];
        let acts = s.prep.prepare(&xn[..nl * dim], nl, dim);
        matmul_multi(pool, &mut s.tasks, logits, &[head], acts, false);
        let full = super::full_logits(logits, vocab, batch);
        let mut out = StepOutput {
            tokens: Vec::with_capacity(nl),
            logits: full,
            ..StepOutput::default()
        };
        // Greedy rows take the argmax here; sampled rows are drawn on the pool, one task per row (each its own
        // sampler), then collected in batch order.
        let mut jobs: Vec<SampleJob<'_>> = Vec::new();
        let wanting = batch.iter().filter(|it| it.logits.wanted());
        for (i, (row, it)) in logits.chunks_exact_mut(vocab).zip(wanting).enumerate() {
            match &it.logits {
                Logits::Sample(spec) => {
                    out.tokens.push(0);
                    jobs.push(SampleJob {
                        row,
                        spec,
                        at: i,
                        picked: None,
                    });
                }
                _ => out.tokens.push(sampling::argmax(row)),
            }
        }
        if s.samplers.len() < jobs.len() {
            s.samplers.resize_with(jobs.len(), sampling::Sampler::new);
        }
        let mut tasks: Vec<(&mut SampleJob<'_>, &mut sampling::Sampler)> =
            jobs.iter_mut().zip(s.samplers.iter_mut()).collect();
        let draw = |t: &mut (&mut SampleJob<'_>, &mut sampling::Sampler)| {
            t.0.picked = Some(t.1.sample(t.0.row, t.0.spec));
        };
        match tasks.len() {
            0 => {}
            1 => tasks.iter_mut().for_each(draw),
            _ => pool.chunks_mut(&mut tasks, 1, |_, t| t.iter_mut().for_each(draw)),
        }
        for j in jobs {
            if let Some(picked) = j.picked {
                out.tokens[j.at] = picked.token;
                out.logprobs.extend(picked.logprobs);
            }
        }
        out
    }
}

/// One [`Logits::Sample`] row of a step: its logits, its spec, its place among the step's output rows, and the
/// token drawn.
struct SampleJob<'a> {
    row: &'a mut [f32],
    spec: &'a sampling::SampleSpec<'a>,
    at: usize,
    picked: Option<sampling::Sampled>,
}
