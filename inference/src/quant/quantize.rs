//! f32 values → ggml block bytes (ggml's reference quantizers): what writes the tests' models and the
//! kernels' test matrices. Not on any serving path.

use super::{BLOCK, QuantError, f32_to_f16};
use crate::gguf::GgmlType;

/// Quantizes f32 values into ggml block bytes (used to write test models; not on any runtime path).
pub fn quantize_ggml(ty: GgmlType, values: &[f32]) -> Result<Vec<u8>, QuantError> {
    let mut out = Vec::new();
    match ty {
        GgmlType::F32 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        GgmlType::F16 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&f32_to_f16(*v).to_le_bytes())),
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 => {
            if !values.len().is_multiple_of(BLOCK) {
                return Err(QuantError::Shape(format!(
                    "{} values is not a multiple of {BLOCK}",
                    values.len()
                )));
            }
            for b in values.chunks_exact(BLOCK) {
                quantize_block(ty, b, &mut out);
            }
        }
        GgmlType::Other(_) => return Err(QuantError::Unsupported(ty)),
    }
    Ok(out)
}

/// ggml's reference quantizers (ggml-quants.c `quantize_row_*_ref`).
fn quantize_block(ty: GgmlType, b: &[f32], out: &mut Vec<u8>) {
    match ty {
        GgmlType::Q8_0 => {
            let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
            out.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
        }
        GgmlType::Q4_0 => {
            let max = b.iter().fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
            let d = max / -8.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
            for j in 0..16 {
                let q0 = ((b[j] * id + 8.5) as i32).clamp(0, 15) as u8;
                let q1 = ((b[j + 16] * id + 8.5) as i32).clamp(0, 15) as u8;
                out.push(q0 | (q1 << 4));
            }
        }
        GgmlType::Q4_1 => {
            let min = b.iter().fold(f32::INFINITY, |a, &v| a.min(v));
            let max = b.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            let d = (max - min) / 15.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
            out.extend_from_slice(&f32_to_f16(min).to_le_bytes());
            for j in 0..16 {
                let q0 = (((b[j] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                let q1 = (((b[j + 16] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                out.push(q0 | (q1 << 4));
            }
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::Other(_) => {}
    }
}
