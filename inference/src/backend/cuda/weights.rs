//! The model's weights in device memory, in the same repacked structure-of-arrays form the CPU kernels use
//! (see [`crate::quant::QData`]): F32 values, or per-block f32 scales (and minimums) plus the raw quants.
//!
//! Owns the upload (once per model load or weight swap) and the choice of kernel per matrix type. Never
//! dequantizes on the host: the kernels read the quantized form.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DriverError};

use crate::model::{Model, Weights};
use crate::quant::{QData, QMatrix};

/// Kernel suffix per storage form, matching [`super::kernels::WEIGHT_TYPES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// F32 (and widened F16).
    F32,
    /// Q8_0.
    Q8_0,
    /// Q4_0.
    Q4_0,
    /// Q4_1.
    Q4_1,
}

impl Kind {
    /// Index into [`super::kernels::WEIGHT_TYPES`].
    pub fn index(self) -> usize {
        match self {
            Kind::F32 => 0,
            Kind::Q8_0 => 1,
            Kind::Q4_0 => 2,
            Kind::Q4_1 => 3,
        }
    }
}

/// A weight matrix on the device. Arrays a type does not use hold one zero element (kernels never read them).
#[derive(Debug)]
pub struct DeviceMatrix {
    /// Storage form.
    pub kind: Kind,
    /// Rows (outputs).
    pub rows: usize,
    /// Columns (inputs).
    pub cols: usize,
    /// F32 values (F32 only).
    pub f: CudaSlice<f32>,
    /// Block scales (quantized types).
    pub d: CudaSlice<f32>,
    /// Block minimums (Q4_1).
    pub m: CudaSlice<f32>,
    /// Quants: one byte per element (Q8_0) or nibble pairs (Q4_x).
    pub q: CudaSlice<u8>,
}

impl DeviceMatrix {
    /// Uploads `m`.
    pub fn upload(stream: &Arc<CudaStream>, m: &QMatrix) -> Result<Self, DriverError> {
        let one_f = || stream.clone_htod(&[0f32]);
        let one_q = || stream.clone_htod(&[0u8]);
        let (kind, f, d, mm, q) = match m.data() {
            QData::F32(v) => (Kind::F32, stream.clone_htod(v)?, one_f()?, one_f()?, one_q()?),
            QData::Q8_0 { d, qs } => {
                let bytes: Vec<u8> = qs.iter().map(|&x| x as u8).collect();
                (
                    Kind::Q8_0,
                    one_f()?,
                    stream.clone_htod(d)?,
                    one_f()?,
                    stream.clone_htod(&bytes)?,
                )
            }
            QData::Q4_0 { d, qs } => (
                Kind::Q4_0,
                one_f()?,
                stream.clone_htod(d)?,
                one_f()?,
                stream.clone_htod(qs)?,
            ),
            QData::Q4_1 { d, m, qs } => (
                Kind::Q4_1,
                one_f()?,
                stream.clone_htod(d)?,
                stream.clone_htod(m)?,
                stream.clone_htod(qs)?,
            ),
        };
        Ok(DeviceMatrix {
            kind,
            rows: m.rows(),
            cols: m.cols(),
            f,
            d,
            m: mm,
            q,
        })
    }

    /// Bytes of device memory.
    pub fn bytes(&self) -> usize {
        self.f.num_bytes() + self.d.num_bytes() + self.m.num_bytes() + self.q.num_bytes()
    }
}

/// One transformer block on the device.
#[derive(Debug)]
pub struct DeviceLayer {
    /// RMSNorm weight before attention.
    pub attn_norm: CudaSlice<f32>,
    /// Q projection.
    pub wq: DeviceMatrix,
    /// K projection.
    pub wk: DeviceMatrix,
    /// V projection.
    pub wv: DeviceMatrix,
    /// Output projection.
    pub wo: DeviceMatrix,
    /// RMSNorm weight before the FFN.
    pub ffn_norm: CudaSlice<f32>,
    /// FFN gate.
    pub w_gate: DeviceMatrix,
    /// FFN up.
    pub w_up: DeviceMatrix,
    /// FFN down.
    pub w_down: DeviceMatrix,
}

/// All weights on the device.
#[derive(Debug)]
pub struct DeviceWeights {
    /// Token embedding.
    pub token_embd: DeviceMatrix,
    /// The blocks.
    pub layers: Vec<DeviceLayer>,
    /// Final RMSNorm weight.
    pub output_norm: CudaSlice<f32>,
    /// Separate LM head (`None`: tied to the embedding).
    pub output: Option<DeviceMatrix>,
}

impl DeviceWeights {
    /// Uploads all weights of `model`.
    pub fn upload(stream: &Arc<CudaStream>, model: &Model) -> Result<Self, DriverError> {
        let w: &Weights = &model.weights;
        let up = |m: &QMatrix| DeviceMatrix::upload(stream, m);
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            layers.push(DeviceLayer {
                attn_norm: stream.clone_htod(&l.attn_norm)?,
                wq: up(&l.wq)?,
                wk: up(&l.wk)?,
                wv: up(&l.wv)?,
                wo: up(&l.wo)?,
                ffn_norm: stream.clone_htod(&l.ffn_norm)?,
                w_gate: up(&l.w_gate)?,
                w_up: up(&l.w_up)?,
                w_down: up(&l.w_down)?,
            });
        }
        let out = DeviceWeights {
            token_embd: up(&w.token_embd)?,
            layers,
            output_norm: stream.clone_htod(&w.output_norm)?,
            output: w.output.as_ref().map(up).transpose()?,
        };
        stream.synchronize()?;
        Ok(out)
    }

    /// The LM head (the embedding when tied).
    pub fn lm_head(&self) -> &DeviceMatrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Bytes of device memory.
    pub fn bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.attn_norm.num_bytes()
                    + l.ffn_norm.num_bytes()
                    + [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
                        .iter()
                        .map(|m| m.bytes())
                        .sum::<usize>()
            })
            .sum();
        layers
            + self.token_embd.bytes()
            + self.output_norm.num_bytes()
            + self.output.as_ref().map_or(0, DeviceMatrix::bytes)
    }

    /// Storage forms of the matrices, counted, for the startup log (e.g. `Q4_1 x 150, Q8_0 x 61`).
    pub fn kinds_summary(&self) -> String {
        let mut counts = [0usize; 4];
        let mut add = |m: &DeviceMatrix| counts[m.kind.index()] += 1;
        add(&self.token_embd);
        if let Some(o) = &self.output {
            add(o);
        }
        for l in &self.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                add(m);
            }
        }
        super::kernels::WEIGHT_TYPES
            .iter()
            .zip(counts)
            .filter(|(_, c)| *c > 0)
            .map(|(t, c)| format!("{} x {c}", t.to_uppercase()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
