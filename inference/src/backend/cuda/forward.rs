//! The forward pass on the device: the kernel launch sequence of one step and the activation buffers it uses.
//!
//! Per step: embedding → per layer (RMSNorm and the Q/K/V matmuls, RoPE + KV-cache write, paged attention,
//! output matmul added to the residual, RMSNorm and the gate and up matmuls with the SiLU gate applied, down
//! matmul added to the residual) → final RMSNorm of the rows that need logits → LM head → each logit row's
//! next token (`sample_rows`: the argmax, or a draw with the row's sampling parameters). Steps of
//! [`super::mma::MMA_MIN_TOKENS`] tokens or more (prefill chunks) run every product on tensor cores
//! ([`super::mma`]) with separate norm and RoPE launches; below that, up to [`FUSE_MAX_TOKENS`] tokens, each
//! RMSNorm and what follows it is one launch (RMSNorm, Q/K/V, RoPE and the cache write; RMSNorm, gate and up): a
//! batch-1 decode step is 5 launches per layer. Everything is queued on the backend's one stream; activations
//! stay on the device, only the packed index arrays (with the sampling parameters) go up (one copy) and the
//! tokens (with log-probabilities where asked, and the logits only for [`crate::backend::Logits::Full`] rows)
//! come back. [`Step::launch`] queues kernels only (no copies, no events, no allocation), so the same call
//! records a CUDA graph when the stream is capturing. Buffers grow on demand (doubling) and are reused across
//! steps; a graph's buffers are sized once, before capture, and never move.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, DeviceRepr, DriverError, LaunchConfig,
    PushKernelArg, ValidAsZeroBits,
};

use super::KvDtype;
use super::kernels::{self, MODE_ADD, MODE_SILU_MUL, MODE_STORE, ROW_THREADS, TOKEN_TILE, WARPS};
use super::layout::Packed;
use super::mma::{MMA_BM, MMA_BN, MMA_THREADS};
use super::sample::{LOGPROB_WORDS, SAMPLE_THREADS};
use super::weights::{DeviceMatrix, DeviceWeights};
use crate::model::ModelConfig;

/// Most tokens a step may have for the fused RMSNorm + Q/K/V + RoPE and RMSNorm + gate/up launches. Each warp of a
/// fused launch recomputes its tokens' norms (the sums side by side): cheaper than the separate norm launch and
/// its round trip through memory at every decode batch (H100, SmolLM2-135M, CUDA graphs: batch 32 3.23 ms/step
/// fused against 3.97 unfused, batch 1 0.91 against 1.19) and at prompts of 68 and 136 tokens (prefill step 3.49
/// against 3.69 ms, 6.04 against 6.21), even at ~256, and 2-3 % dearer at 512 (39.8 against 38.5 ms per prompt;
/// docs/lab/engine-gpu.md). `LLMSERVE_CUDA_FUSE_MAX_TOKENS` ([`super::FUSE_ENV`]) sets another limit for a run.
pub const FUSE_MAX_TOKENS: usize = 256;

/// The loaded kernels.
#[derive(Debug)]
pub struct Kernels {
    matmul: Vec<CudaFunction>,
    matmul_mma: Vec<CudaFunction>,
    embed: Vec<CudaFunction>,
    /// `qkv_rope[weight type][KV type]`, flattened: index `ty * KV_TYPES.len() + kv`.
    qkv_rope: Vec<CudaFunction>,
    gate_up: Vec<CudaFunction>,
    rms_norm: CudaFunction,
    rope_kv: Vec<CudaFunction>,
    attention: Vec<CudaFunction>,
    sample: CudaFunction,
}

impl Kernels {
    /// Looks every kernel up in `module`.
    pub fn load(module: &Arc<CudaModule>) -> Result<Self, String> {
        let get = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| format!("kernel {name} not in the compiled module: {e}"))
        };
        let per_type = |prefix: &str| -> Result<Vec<CudaFunction>, String> {
            kernels::WEIGHT_TYPES
                .iter()
                .map(|t| get(&format!("{prefix}_{t}")))
                .collect()
        };
        let per_kv = |prefix: &str| -> Result<Vec<CudaFunction>, String> {
            kernels::KV_TYPES
                .iter()
                .map(|t| get(&format!("{prefix}_{t}")))
                .collect()
        };
        let qkv_rope = kernels::WEIGHT_TYPES
            .iter()
            .flat_map(|t| {
                kernels::KV_TYPES
                    .iter()
                    .map(move |kv| format!("qkv_rope_{t}_{kv}"))
            })
            .map(|name| get(&name))
            .collect::<Result<_, _>>()?;
        Ok(Kernels {
            matmul: per_type("matmul")?,
            matmul_mma: per_type("matmul_mma")?,
            embed: per_type("embed")?,
            qkv_rope,
            gate_up: per_type("gate_up")?,
            rms_norm: get("rms_norm")?,
            rope_kv: per_kv("rope_kv")?,
            attention: per_kv("attention")?,
            sample: get("sample_rows")?,
        })
    }
}

/// A device buffer that grows to the largest size asked for.
#[derive(Debug)]
pub struct Buf<T> {
    /// The allocation (at least the size asked for last).
    pub dev: CudaSlice<T>,
}

impl<T: DeviceRepr + ValidAsZeroBits> Buf<T> {
    fn new(stream: &Arc<CudaStream>) -> Result<Self, DriverError> {
        Ok(Buf {
            dev: stream.alloc_zeros::<T>(1)?,
        })
    }

    /// Makes room for `n` elements (contents are lost when it grows); true when the buffer moved.
    fn ensure(&mut self, stream: &Arc<CudaStream>, n: usize) -> Result<bool, DriverError> {
        if self.dev.len() < n {
            self.dev = stream.alloc_zeros::<T>(n.next_power_of_two())?;
            return Ok(true);
        }
        Ok(false)
    }
}

/// Activation and index buffers of a step.
#[derive(Debug)]
pub struct Scratch {
    x: Buf<f32>,
    xn: Buf<f32>,
    q: Buf<f32>,
    k: Buf<f32>,
    v: Buf<f32>,
    att: Buf<f32>,
    gate: Buf<f32>,
    /// Logits of the step's logit rows, `[nl][vocab]`.
    pub logits: Buf<f32>,
    /// The next token of each logit row, `[nl]`.
    pub tokens: Buf<i32>,
    /// The log-probability words of each logit row, `[nl][LOGPROB_WORDS]`.
    pub logprobs: Buf<i32>,
    /// The raw logits under the sampling histories' entries (`sample_rows` restores them), one per entry.
    pub hist_raw: Buf<f32>,
    /// The packed index arrays ([`Packed`]).
    pub idx: Buf<i32>,
}

impl Scratch {
    /// Empty buffers.
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self, DriverError> {
        Ok(Scratch {
            x: Buf::new(stream)?,
            xn: Buf::new(stream)?,
            q: Buf::new(stream)?,
            k: Buf::new(stream)?,
            v: Buf::new(stream)?,
            att: Buf::new(stream)?,
            gate: Buf::new(stream)?,
            logits: Buf::new(stream)?,
            tokens: Buf::new(stream)?,
            logprobs: Buf::new(stream)?,
            hist_raw: Buf::new(stream)?,
            idx: Buf::new(stream)?,
        })
    }

    /// Makes room for a step laid out as `p` of a model `c` with `vocab` logits per row; true when a buffer
    /// moved (a graph recorded on the old buffers must not be replayed).
    pub fn ensure(
        &mut self,
        stream: &Arc<CudaStream>,
        c: &ModelConfig,
        vocab: usize,
        p: &Packed,
    ) -> Result<bool, DriverError> {
        let n = p.n;
        let qd = c.n_heads * c.head_dim;
        let mut moved = false;
        for (buf, len) in [
            (&mut self.x, n * c.dim),
            (&mut self.xn, n * c.dim),
            (&mut self.q, n * qd),
            (&mut self.att, n * qd),
            (&mut self.k, n * c.kv_dim()),
            (&mut self.v, n * c.kv_dim()),
            (&mut self.gate, n * c.ffn_dim),
            (&mut self.logits, p.nl * vocab),
        ] {
            moved |= buf.ensure(stream, len)?;
        }
        moved |= self.tokens.ensure(stream, p.nl)?;
        moved |= self.logprobs.ensure(stream, p.nl * LOGPROB_WORDS)?;
        moved |= self.hist_raw.ensure(stream, p.history_entries() + 1)?;
        moved |= self.idx.ensure(stream, p.len + 1)?;
        Ok(moved)
    }

    /// Makes room for `entries` sampling-history entries after a graph step's fixed arrays (`p`), so that the
    /// histories of any batch up to that many fit without moving the buffers.
    pub fn ensure_history(
        &mut self,
        stream: &Arc<CudaStream>,
        p: &Packed,
        entries: usize,
    ) -> Result<bool, DriverError> {
        let mut moved = self.hist_raw.ensure(stream, entries + 1)?;
        moved |= self.idx.ensure(stream, p.len + 2 * entries + 1)?;
        Ok(moved)
    }
}

/// The paged KV cache: per layer, `slots × kv_dim` elements of K and of V in `dtype`.
#[derive(Debug)]
pub struct KvCache {
    /// Element type.
    pub dtype: KvDtype,
    /// Per layer K cache (raw bytes of `dtype` elements).
    pub k: Vec<CudaSlice<u8>>,
    /// Per layer V cache.
    pub v: Vec<CudaSlice<u8>>,
}

/// What a step needs besides its buffers.
pub struct Step<'a> {
    /// The stream everything is queued on.
    pub stream: &'a Arc<CudaStream>,
    /// The kernels.
    pub kernels: &'a Kernels,
    /// Model hyper-parameters.
    pub config: &'a ModelConfig,
    /// Weights on the device.
    pub weights: &'a DeviceWeights,
    /// RoPE inverse frequencies on the device.
    pub inv_freq: &'a CudaSlice<f32>,
    /// The KV cache.
    pub kv: &'a mut KvCache,
    /// Token slots per KV block.
    pub block_size: usize,
    /// Most tokens for the fused RMSNorm launches ([`FUSE_MAX_TOKENS`] unless the options say otherwise).
    pub fuse_max_tokens: usize,
    /// Fewest tokens for the tensor-core products ([`super::mma`]); 0: never.
    pub mma_min_tokens: usize,
}

fn grid(n: usize, per: usize) -> u32 {
    n.div_ceil(per).max(1) as u32
}

fn rows_cfg(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.max(1) as u32, 1, 1),
        block_dim: (ROW_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Step<'_> {
    /// Whether a step of `n` tokens runs its products on tensor cores (then unfused: the fused launches' norms
    /// live in the CUDA-core kernels).
    fn tensor_cores(&self, n: usize) -> bool {
        self.mma_min_tokens > 0 && n >= self.mma_min_tokens
    }

    /// `out (=|+=|silu-gated) W · x` for `n` tokens: on tensor cores for long steps (widths a multiple of 32).
    fn matmul(
        &self,
        m: &DeviceMatrix,
        x: &CudaSlice<f32>,
        n: usize,
        out: &mut CudaSlice<f32>,
        mode: i32,
    ) -> Result<(), DriverError> {
        let (rows, cols, nt) = (m.rows as i32, m.cols as i32, n as i32);
        let (f, cfg) = if self.tensor_cores(n) && m.cols.is_multiple_of(kernels::QBLOCK) {
            let cfg = LaunchConfig {
                grid_dim: (grid(m.rows, MMA_BN), grid(n, MMA_BM), 1),
                block_dim: (MMA_THREADS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            (&self.kernels.matmul_mma[m.kind.index()], cfg)
        } else {
            let cfg = LaunchConfig {
                grid_dim: (grid(m.rows, WARPS), grid(n, TOKEN_TILE), 1),
                block_dim: (32 * WARPS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            (&self.kernels.matmul[m.kind.index()], cfg)
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&m.f)
            .arg(&m.d)
            .arg(&m.m)
            .arg(&m.q)
            .arg(&rows)
            .arg(&cols)
            .arg(x)
            .arg(&nt)
            .arg(out)
            .arg(&mode);
        // SAFETY: the arguments match `matmul_*`'s and `matmul_mma_*`'s parameters (the same list) in order and
        // type; `x` holds at least n × cols and `out` n × rows floats (Scratch sized them for this step); the
        // matrix arrays are the uploaded ones for its type; the tensor-core kernel only for widths a multiple of
        // 32 (its 16-byte loads and whole quant blocks), on a device that has it (the backend's options).
        unsafe { b.launch(cfg) }.map(|_| ())
    }

    /// The attention block's input for layer `l`: RMSNorm (weight `norm`) of the residual stream `x`, Q, K and V of
    /// `n` tokens, RoPE on Q and K at each token's position, K and V stored at each token's cache slot; rotated Q
    /// left in `q`. One launch when the three matrices share a type and width and `n` ≤ `fuse_max_tokens` (else
    /// the norm into `xn`, three matmuls into `q`/`k`/`v` and `rope_kv`).
    #[allow(
        clippy::too_many_arguments,
        reason = "the norm, three matrices, their outputs and the token arrays"
    )]
    fn qkv_rope(
        &mut self,
        l: usize,
        norm: &CudaSlice<f32>,
        (wq, wk, wv): (&DeviceMatrix, &DeviceMatrix, &DeviceMatrix),
        x: &CudaSlice<f32>,
        xn: &mut CudaSlice<f32>,
        n: usize,
        (q, k, v): (&mut CudaSlice<f32>, &mut CudaSlice<f32>, &mut CudaSlice<f32>),
        (pos, slot): (&CudaView<'_, i32>, &CudaView<'_, i32>),
    ) -> Result<(), DriverError> {
        let c = self.config;
        let (nh, nkv, hd) = (c.n_heads as i32, c.n_kv_heads as i32, c.head_dim as i32);
        let kv_kind = self.kv.dtype.index();
        let same = wq.kind == wk.kind && wq.kind == wv.kind && wq.cols == wk.cols && wq.cols == wv.cols;
        if !same || n > self.fuse_max_tokens || self.tensor_cores(n) {
            self.rms_norm(x, norm, xn, n, None)?;
            self.matmul(wq, xn, n, q, MODE_STORE)?;
            self.matmul(wk, xn, n, k, MODE_STORE)?;
            self.matmul(wv, xn, n, v, MODE_STORE)?;
            let mut b = self.stream.launch_builder(&self.kernels.rope_kv[kv_kind]);
            b.arg(q)
                .arg(k)
                .arg(&*v)
                .arg(&mut self.kv.k[l])
                .arg(&mut self.kv.v[l])
                .arg(pos)
                .arg(slot)
                .arg(self.inv_freq)
                .arg(&nh)
                .arg(&nkv)
                .arg(&hd);
            // SAFETY: arguments match `rope_kv_<dtype>` for the cache's element type; slots come from validated
            // block tables (inside the cache, or its pad block), q/k/v hold n tokens, inv_freq holds
            // head_dim / 2 floats.
            return unsafe { b.launch(rows_cfg(n)) }.map(|_| ());
        }
        let eps = c.rms_eps;
        let (r0, r1, r2) = (wq.rows as i32, wk.rows as i32, wv.rows as i32);
        let (cols, nt) = (wq.cols as i32, n as i32);
        let blocks = grid(wq.rows, WARPS) + grid(wk.rows, WARPS) + grid(wv.rows, WARPS);
        let cfg = LaunchConfig {
            grid_dim: (blocks, grid(n, TOKEN_TILE), 1),
            block_dim: (32 * WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = &self.kernels.qkv_rope[wq.kind.index() * kernels::KV_TYPES.len() + kv_kind];
        let mut b = self.stream.launch_builder(f);
        for m in [wq, wk, wv] {
            b.arg(&m.f).arg(&m.d).arg(&m.m).arg(&m.q);
        }
        b.arg(&r0)
            .arg(&r1)
            .arg(&r2)
            .arg(&cols)
            .arg(x)
            .arg(norm)
            .arg(&eps)
            .arg(&nt)
            .arg(q)
            .arg(&mut self.kv.k[l])
            .arg(&mut self.kv.v[l])
            .arg(pos)
            .arg(slot)
            .arg(self.inv_freq)
            .arg(&hd);
        // SAFETY: the arguments match `qkv_rope_<type>_<dtype>`'s parameters in order and type, for the matrices'
        // type and the cache's element type; the three matrices have `cols` (= dim) columns (checked above) and
        // n_heads × head_dim (Q) and n_kv × head_dim (K, V) rows, even (check_geometry), as the kernel's RoPE
        // pairs need; `x` holds n × cols floats, `norm` cols, `q` n × Q rows (Scratch sized it for this step);
        // slots come from validated block tables; inv_freq holds head_dim / 2 floats.
        unsafe { b.launch(cfg) }.map(|_| ())
    }

    /// RMSNorm (weight `norm`) of the residual stream `x`, then `out = silu(Wg · x̂) * (Wu · x̂)` for `n` tokens:
    /// one launch when gate and up share a type and shape and `n` ≤ `fuse_max_tokens` (else the norm into `xn`
    /// and two matmuls).
    fn gate_up(
        &self,
        norm: &CudaSlice<f32>,
        (wg, wu): (&DeviceMatrix, &DeviceMatrix),
        x: &CudaSlice<f32>,
        xn: &mut CudaSlice<f32>,
        n: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), DriverError> {
        if wg.kind != wu.kind
            || wg.rows != wu.rows
            || wg.cols != wu.cols
            || n > self.fuse_max_tokens
            || self.tensor_cores(n)
        {
            self.rms_norm(x, norm, xn, n, None)?;
            self.matmul(wg, xn, n, out, MODE_STORE)?;
            return self.matmul(wu, xn, n, out, MODE_SILU_MUL);
        }
        let eps = self.config.rms_eps;
        let (rows, cols, nt) = (wg.rows as i32, wg.cols as i32, n as i32);
        let cfg = LaunchConfig {
            grid_dim: (grid(wg.rows, WARPS), grid(n, TOKEN_TILE), 1),
            block_dim: (32 * WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.kernels.gate_up[wg.kind.index()]);
        for m in [wg, wu] {
            b.arg(&m.f).arg(&m.d).arg(&m.m).arg(&m.q);
        }
        b.arg(&rows)
            .arg(&cols)
            .arg(x)
            .arg(norm)
            .arg(&eps)
            .arg(&nt)
            .arg(out);
        // SAFETY: the arguments match `gate_up_*`'s parameters; both matrices have this kernel's type and shape
        // (checked above); `x` holds n × cols floats, `norm` cols and `out` n × rows.
        unsafe { b.launch(cfg) }.map(|_| ())
    }

    fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        n_rows: usize,
        rows: Option<&CudaView<'_, i32>>,
    ) -> Result<(), DriverError> {
        let dim = self.config.dim as i32;
        let eps = self.config.rms_eps;
        let use_rows = i32::from(rows.is_some());
        let mut b = self.stream.launch_builder(&self.kernels.rms_norm);
        b.arg(x).arg(w).arg(out).arg(&dim).arg(&eps);
        match rows {
            Some(r) => b.arg(r),
            None => b.arg(w),
        };
        b.arg(&use_rows);
        // SAFETY: arguments match `rms_norm`'s parameters; `x` holds every row named (or `n_rows` rows), `out`
        // n_rows × dim floats; when `use_rows` is 0 the rows pointer is never read.
        unsafe { b.launch(rows_cfg(n_rows)) }.map(|_| ())
    }

    /// Queues the kernels of the step whose index arrays sit in `s.idx` as `p` says, leaving the logits of its
    /// `p.nl` logit rows in `s.logits`. Kernels only: `s` must have been sized for `p` ([`Scratch::ensure`]) and
    /// the index arrays uploaded (outside a capture) before the kernels run.
    pub fn launch(&mut self, s: &mut Scratch, p: &Packed) -> Result<(), DriverError> {
        let c = self.config;
        let st = self.stream;
        let (n, nl) = (p.n, p.nl);
        let (hd, nh, nkv) = (c.head_dim, c.n_heads, c.n_kv_heads);
        let weights = self.weights;
        let kv_kind = self.kv.dtype.index();
        let idx = &s.idx.dev;
        let tokens = idx.slice(p.tokens..p.tokens + n);
        let pos = idx.slice(p.pos..p.pos + n);
        let slot = idx.slice(p.slot..p.slot + n);
        let table_off = idx.slice(p.table_off..p.table_off + n);
        let logit_rows = idx.slice(p.logit_rows..p.logit_rows + nl);
        let tables = idx.slice(p.tables..p.history.max(p.tables + 1));
        let params = idx.slice(p.params..p.params + nl * super::sample::SAMPLE_WORDS);
        // Histories vary in length (a graph's buffer has room for the longest); the kernel reads each row's entries.
        let history = idx.slice(p.history..);

        // Embedding.
        let e = &weights.token_embd;
        let cols = e.cols as i32;
        let mut b = st.launch_builder(&self.kernels.embed[e.kind.index()]);
        b.arg(&e.f)
            .arg(&e.d)
            .arg(&e.m)
            .arg(&e.q)
            .arg(&cols)
            .arg(&tokens)
            .arg(&mut s.x.dev);
        // SAFETY: arguments match `embed_*`; tokens were validated against the vocabulary (the embedding's
        // rows) and `x` holds n × dim floats.
        unsafe { b.launch(rows_cfg(n)) }?;

        let (nh_i, nkv_i, hd_i, bs_i, n_i) =
            (nh as i32, nkv as i32, hd as i32, self.block_size as i32, n as i32);
        let scale = 1.0 / (hd as f32).sqrt();
        for (l, lw) in weights.layers.iter().enumerate() {
            // Attention block.
            self.qkv_rope(
                l,
                &lw.attn_norm,
                (&lw.wq, &lw.wk, &lw.wv),
                &s.x.dev,
                &mut s.xn.dev,
                n,
                (&mut s.q.dev, &mut s.k.dev, &mut s.v.dev),
                (&pos, &slot),
            )?;
            let mut b = st.launch_builder(&self.kernels.attention[kv_kind]);
            b.arg(&s.q.dev)
                .arg(&self.kv.k[l])
                .arg(&self.kv.v[l])
                .arg(&mut s.att.dev)
                .arg(&pos)
                .arg(&table_off)
                .arg(&tables)
                .arg(&n_i)
                .arg(&nh_i)
                .arg(&nkv_i)
                .arg(&hd_i)
                .arg(&bs_i)
                .arg(&scale);
            let cfg = LaunchConfig {
                grid_dim: ((n * nh).max(1) as u32, 1, 1),
                block_dim: (32 * WARPS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: arguments match `attention_<dtype>`; every position 0..=pos of each token's sequence is
            // covered by its (validated) block table and was written by this or an earlier step; head_dim ≤
            // MAX_HEAD_DIM was checked at creation.
            unsafe { b.launch(cfg) }?;
            self.matmul(&lw.wo, &s.att.dev, n, &mut s.x.dev, MODE_ADD)?;

            // Feed-forward block.
            self.gate_up(
                &lw.ffn_norm,
                (&lw.w_gate, &lw.w_up),
                &s.x.dev,
                &mut s.xn.dev,
                n,
                &mut s.gate.dev,
            )?;
            self.matmul(&lw.w_down, &s.gate.dev, n, &mut s.x.dev, MODE_ADD)?;
        }

        if nl > 0 {
            self.rms_norm(
                &s.x.dev,
                &weights.output_norm,
                &mut s.xn.dev,
                nl,
                Some(&logit_rows),
            )?;
            let head = weights.lm_head();
            self.matmul(head, &s.xn.dev, nl, &mut s.logits.dev, MODE_STORE)?;
            let vocab = head.rows as i32;
            let mut b = st.launch_builder(&self.kernels.sample);
            b.arg(&mut s.logits.dev)
                .arg(&vocab)
                .arg(&params)
                .arg(&history)
                .arg(&mut s.hist_raw.dev)
                .arg(&mut s.tokens.dev)
                .arg(&mut s.logprobs.dev);
            let cfg = LaunchConfig {
                grid_dim: (nl as u32, 1, 1),
                block_dim: (SAMPLE_THREADS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: arguments match `sample_rows`; `logits` holds nl rows of `vocab` floats, `tokens` nl ints and
            // `logprobs` nl × LOGPROB_WORDS (Scratch sized them for this step); `params` holds nl rows of
            // SAMPLE_WORDS, and every row's history entries (offset + length in its words) lie inside the
            // histories after `p.history`, with `hist_raw` one float per entry (Scratch::ensure, or
            // Scratch::ensure_history for a graph's buffers, checked against the step by the backend).
            unsafe { b.launch(cfg) }?;
        }
        Ok(())
    }
}
