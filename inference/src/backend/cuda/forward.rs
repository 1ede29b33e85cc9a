//! The forward pass on the device: the kernel launch sequence of one step and the activation buffers it uses.
//!
//! Per step: embedding → per layer (RMSNorm, Q/K/V matmuls, RoPE + KV-cache write, paged attention, output
//! matmul added to the residual, RMSNorm, gate matmul, up matmul with the SiLU gate fused in its epilogue, down
//! matmul added to the residual) → final RMSNorm of the rows that need logits → LM head. Everything is queued on
//! the backend's one stream; activations stay on the device, only the index arrays go up and the logits come
//! back. Buffers grow on demand (doubling) and are reused across steps.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};

use super::kernels::{self, MODE_ADD, MODE_SILU_MUL, MODE_STORE, ROW_THREADS, TOKEN_TILE, WARPS};
use super::layout::StepLayout;
use super::weights::{DeviceMatrix, DeviceWeights};
use crate::model::ModelConfig;

/// The loaded kernels.
#[derive(Debug)]
pub struct Kernels {
    matmul: Vec<CudaFunction>,
    embed: Vec<CudaFunction>,
    rms_norm: CudaFunction,
    rope_kv: CudaFunction,
    attention: CudaFunction,
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
        Ok(Kernels {
            matmul: per_type("matmul")?,
            embed: per_type("embed")?,
            rms_norm: get("rms_norm")?,
            rope_kv: get("rope_kv")?,
            attention: get("attention")?,
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

    /// Makes room for `n` elements (contents are lost when it grows).
    fn ensure(&mut self, stream: &Arc<CudaStream>, n: usize) -> Result<(), DriverError> {
        if self.dev.len() < n {
            self.dev = stream.alloc_zeros::<T>(n.next_power_of_two())?;
        }
        Ok(())
    }

    /// Grows to `src.len()` and copies `src` to the start.
    fn upload(&mut self, stream: &Arc<CudaStream>, src: &[T]) -> Result<(), DriverError> {
        self.ensure(stream, src.len().max(1))?;
        if !src.is_empty() {
            stream.memcpy_htod(src, &mut self.dev.slice_mut(0..src.len()))?;
        }
        Ok(())
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
    logits: Buf<f32>,
    tokens: Buf<i32>,
    pos: Buf<i32>,
    slot: Buf<i32>,
    table_off: Buf<i32>,
    tables: Buf<i32>,
    logit_rows: Buf<i32>,
    /// Host copy of the logits.
    pub host_logits: Vec<f32>,
    /// Host-side index arrays.
    pub layout: StepLayout,
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
            pos: Buf::new(stream)?,
            slot: Buf::new(stream)?,
            table_off: Buf::new(stream)?,
            tables: Buf::new(stream)?,
            logit_rows: Buf::new(stream)?,
            host_logits: Vec::new(),
            layout: StepLayout::default(),
        })
    }
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
    /// Per layer K cache.
    pub k_cache: &'a mut [CudaSlice<f32>],
    /// Per layer V cache.
    pub v_cache: &'a mut [CudaSlice<f32>],
    /// Token slots per KV block.
    pub block_size: usize,
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
    /// `out (=|+=|silu-gated) W · x` for `n` tokens.
    fn matmul(
        &self,
        m: &DeviceMatrix,
        x: &CudaSlice<f32>,
        n: usize,
        out: &mut CudaSlice<f32>,
        mode: i32,
    ) -> Result<(), DriverError> {
        let f = &self.kernels.matmul[m.kind.index()];
        let (rows, cols, nt) = (m.rows as i32, m.cols as i32, n as i32);
        let cfg = LaunchConfig {
            grid_dim: (grid(m.rows, WARPS), grid(n, TOKEN_TILE), 1),
            block_dim: (32 * WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
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
        // SAFETY: the arguments match `matmul_*`'s parameters in kernels.rs in order and type; `x` holds at
        // least n × cols and `out` n × rows floats (Scratch sized them for this step); the matrix arrays are
        // the uploaded ones for its type.
        unsafe { b.launch(cfg) }.map(|_| ())
    }

    fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        n_rows: usize,
        rows: Option<&CudaSlice<i32>>,
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

    /// Runs the step described by `s.layout`, leaving the logits of its `logit_rows` in `s.logits`.
    pub fn run(&mut self, s: &mut Scratch) -> Result<(), DriverError> {
        let c = self.config;
        let st = self.stream;
        let n = s.layout.num_tokens();
        let nl = s.layout.logit_rows.len();
        let (dim, hd, nh, nkv) = (c.dim, c.head_dim, c.n_heads, c.n_kv_heads);
        let (qd, kvd, ffn) = (nh * hd, c.kv_dim(), c.ffn_dim);
        let weights = self.weights;
        let vocab = weights.lm_head().rows;

        s.tokens.upload(st, &s.layout.tokens)?;
        s.pos.upload(st, &s.layout.pos)?;
        s.slot.upload(st, &s.layout.slot)?;
        s.table_off.upload(st, &s.layout.table_off)?;
        s.tables.upload(st, &s.layout.tables)?;
        s.logit_rows.upload(st, &s.layout.logit_rows)?;
        s.x.ensure(st, n * dim)?;
        s.xn.ensure(st, n * dim)?;
        s.q.ensure(st, n * qd)?;
        s.att.ensure(st, n * qd)?;
        s.k.ensure(st, n * kvd)?;
        s.v.ensure(st, n * kvd)?;
        s.gate.ensure(st, n * ffn)?;
        s.logits.ensure(st, nl * vocab)?;

        // Embedding.
        let e = &weights.token_embd;
        let cols = e.cols as i32;
        let mut b = st.launch_builder(&self.kernels.embed[e.kind.index()]);
        b.arg(&e.f)
            .arg(&e.d)
            .arg(&e.m)
            .arg(&e.q)
            .arg(&cols)
            .arg(&s.tokens.dev)
            .arg(&mut s.x.dev);
        // SAFETY: arguments match `embed_*`; tokens were validated against the vocabulary (the embedding's
        // rows) and `x` holds n × dim floats.
        unsafe { b.launch(rows_cfg(n)) }?;

        let (nh_i, nkv_i, hd_i, bs_i, n_i) =
            (nh as i32, nkv as i32, hd as i32, self.block_size as i32, n as i32);
        let scale = 1.0 / (hd as f32).sqrt();
        for (l, lw) in weights.layers.iter().enumerate() {
            // Attention block.
            self.rms_norm(&s.x.dev, &lw.attn_norm, &mut s.xn.dev, n, None)?;
            self.matmul(&lw.wq, &s.xn.dev, n, &mut s.q.dev, MODE_STORE)?;
            self.matmul(&lw.wk, &s.xn.dev, n, &mut s.k.dev, MODE_STORE)?;
            self.matmul(&lw.wv, &s.xn.dev, n, &mut s.v.dev, MODE_STORE)?;
            let mut b = st.launch_builder(&self.kernels.rope_kv);
            b.arg(&mut s.q.dev)
                .arg(&mut s.k.dev)
                .arg(&s.v.dev)
                .arg(&mut self.k_cache[l])
                .arg(&mut self.v_cache[l])
                .arg(&s.pos.dev)
                .arg(&s.slot.dev)
                .arg(self.inv_freq)
                .arg(&nh_i)
                .arg(&nkv_i)
                .arg(&hd_i);
            // SAFETY: arguments match `rope_kv`; slots come from validated block tables (inside the cache),
            // q/k/v hold n tokens, inv_freq holds head_dim / 2 floats.
            unsafe { b.launch(rows_cfg(n)) }?;
            let mut b = st.launch_builder(&self.kernels.attention);
            b.arg(&s.q.dev)
                .arg(&self.k_cache[l])
                .arg(&self.v_cache[l])
                .arg(&mut s.att.dev)
                .arg(&s.pos.dev)
                .arg(&s.table_off.dev)
                .arg(&s.tables.dev)
                .arg(&n_i)
                .arg(&nh_i)
                .arg(&nkv_i)
                .arg(&hd_i)
                .arg(&bs_i)
                .arg(&scale);
            let cfg = LaunchConfig {
                grid_dim: (grid(n * nh, WARPS), 1, 1),
                block_dim: (32 * WARPS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: arguments match `attention`; every position 0..=pos of each token's sequence is covered by
            // its (validated) block table and was written by this or an earlier step; head_dim ≤ MAX_HEAD_DIM
            // was checked at creation.
            unsafe { b.launch(cfg) }?;
            self.matmul(&lw.wo, &s.att.dev, n, &mut s.x.dev, MODE_ADD)?;

            // Feed-forward block.
            self.rms_norm(&s.x.dev, &lw.ffn_norm, &mut s.xn.dev, n, None)?;
            self.matmul(&lw.w_gate, &s.xn.dev, n, &mut s.gate.dev, MODE_STORE)?;
            self.matmul(&lw.w_up, &s.xn.dev, n, &mut s.gate.dev, MODE_SILU_MUL)?;
            self.matmul(&lw.w_down, &s.gate.dev, n, &mut s.x.dev, MODE_ADD)?;
        }

        if nl > 0 {
            self.rms_norm(
                &s.x.dev,
                &weights.output_norm,
                &mut s.xn.dev,
                nl,
                Some(&s.logit_rows.dev),
            )?;
            self.matmul(weights.lm_head(), &s.xn.dev, nl, &mut s.logits.dev, MODE_STORE)?;
        }
        Ok(())
    }
}

/// Copies the logits of the last step (`nl` rows of `vocab`) back to the host and splits them per row.
pub fn fetch_logits(
    stream: &Arc<CudaStream>,
    s: &mut Scratch,
    nl: usize,
    vocab: usize,
) -> Result<Vec<Vec<f32>>, DriverError> {
    if nl == 0 {
        return Ok(Vec::new());
    }
    s.host_logits.resize(nl * vocab, 0.0);
    stream.memcpy_dtoh(&s.logits.dev.slice(0..nl * vocab), &mut s.host_logits[..])?;
    stream.synchronize()?;
    Ok(s.host_logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
}
