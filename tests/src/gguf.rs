//! Tiny random Llama GGUF files for the engine's tests (of both the model and the serving side): the one
//! builder of model fixtures, outside the engine that ships.
//!
//! Owns a generator of complete, loadable models: Llama metadata, a working GPT-2 byte-level BPE vocabulary
//! (256 byte tokens, merges for a few words, ChatML special tokens `<|endoftext|>`, `<|im_start|>`,
//! `<|im_end|>`), a ChatML chat template, and deterministic pseudo-random weights in a chosen tensor type,
//! written with the engine's own GGUF writer and quantizer.

use std::path::Path;

use inference::gguf::{GgmlType, Value, writer};
use inference::quant::{QuantError, quantize_ggml};
use inference::tokenizer::byte_to_unicode;

/// Chat template written into tiny models (ChatML with a default system message, like SmolLM2's).
pub const TINY_CHAT_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are tiny.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Words whose BPE merges the tiny vocabulary has (a leading space is part of the word, as GPT-2 splits).
const WORDS: &[&str] = &[
    "the",
    " the",
    " and",
    "ing",
    " is",
    "Hello",
    " world",
    " capital",
    " of",
    " France",
    " Paris",
    "What",
    "user",
    "assistant",
    "system",
    " tiny",
    "You",
    " are",
];

/// Special tokens at ids 0, 1, 2 (as in SmolLM2's vocabulary).
pub const TINY_SPECIALS: &[&str] = &["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Shape and contents of a tiny model.
#[derive(Debug, Clone)]
pub struct TinyModelSpec {
    /// Transformer blocks.
    pub n_layers: usize,
    /// Model dimension (a multiple of 32 for quantized types).
    pub dim: usize,
    /// Query heads.
    pub n_heads: usize,
    /// KV heads.
    pub n_kv_heads: usize,
    /// FFN hidden dimension (a multiple of 32 for quantized types).
    pub ffn_dim: usize,
    /// Context length.
    pub context_len: usize,
    /// Type of the 2-D weight tensors (embedding included).
    pub weight_type: GgmlType,
    /// Whether the output projection is tied to the embedding (no `output.weight`).
    pub tied_embeddings: bool,
    /// Seed of the weights.
    pub seed: u64,
    /// RoPE base.
    pub rope_base: f32,
    /// `general.name`.
    pub name: String,
}

impl Default for TinyModelSpec {
    fn default() -> Self {
        TinyModelSpec {
            n_layers: 2,
            dim: 64,
            n_heads: 4,
            n_kv_heads: 2,
            ffn_dim: 128,
            context_len: 512,
            weight_type: GgmlType::F32,
            tied_embeddings: false,
            seed: 1,
            rope_base: 10_000.0,
            name: "tiny-llama".to_string(),
        }
    }
}

/// xorshift64*: deterministic weights without a dependency.
struct Rng(u64);

impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        ((v >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// The tiny vocabulary: (tokens, token types, merges).
pub fn tiny_vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let b2u = byte_to_unicode();
    let mut tokens: Vec<String> = TINY_SPECIALS.iter().map(|s| s.to_string()).collect();
    let mut types = vec![3i32; tokens.len()]; // 3 = CONTROL
    for c in b2u {
        tokens.push(c.to_string());
        types.push(1); // 1 = NORMAL
    }
    let mut merges: Vec<String> = Vec::new();
    for w in WORDS {
        let syms: Vec<String> = w.bytes().map(|b| b2u[b as usize].to_string()).collect();
        let mut acc = syms[0].clone();
        for s in &syms[1..] {
            let merge = format!("{acc} {s}");
            let merged = format!("{acc}{s}");
            if !merges.contains(&merge) {
                merges.push(merge);
            }
            if !tokens.contains(&merged) {
                tokens.push(merged.clone());
                types.push(1);
            }
            acc = merged;
        }
    }
    (tokens, types, merges)
}

/// (name, dims, type, bytes) of one tensor to write.
type Tensor = (String, Vec<u64>, GgmlType, Vec<u8>);

/// Encodes a tiny model as GGUF bytes.
pub fn tiny_gguf_bytes(spec: &TinyModelSpec) -> Result<Vec<u8>, QuantError> {
    let (tokens, types, merges) = tiny_vocab();
    let vocab = tokens.len();
    let head_dim = spec.dim / spec.n_heads;
    let s = |v: &str| Value::String(v.to_string());
    let u = |v: usize| Value::U32(v as u32);
    let meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), s("llama")),
        ("general.name".into(), s(&spec.name)),
        ("general.alignment".into(), Value::U32(32)),
        ("llama.block_count".into(), u(spec.n_layers)),
        ("llama.context_length".into(), u(spec.context_len)),
        ("llama.embedding_length".into(), u(spec.dim)),
        ("llama.feed_forward_length".into(), u(spec.ffn_dim)),
        ("llama.attention.head_count".into(), u(spec.n_heads)),
        ("llama.attention.head_count_kv".into(), u(spec.n_kv_heads)),
        ("llama.rope.freq_base".into(), Value::F32(spec.rope_base)),
        ("llama.rope.dimension_count".into(), u(head_dim)),
        ("llama.attention.layer_norm_rms_epsilon".into(), Value::F32(1e-5)),
        ("llama.vocab_size".into(), u(vocab)),
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("smollm")),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.iter().map(|t| s(t)).collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(merges.iter().map(|m| s(m)).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
        ("tokenizer.ggml.padding_token_id".into(), Value::U32(0)),
        ("tokenizer.chat_template".into(), s(TINY_CHAT_TEMPLATE)),
    ];
    let mut rng = Rng(spec.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut tensors: Vec<Tensor> = Vec::new();
    let mat =
        |name: String, rows: usize, cols: usize, ty: GgmlType, rng: &mut Rng| -> Result<Tensor, QuantError> {
            let amp = 1.0 / (cols as f32).sqrt() * 1.7;
            let vals: Vec<f32> = (0..rows * cols).map(|_| rng.next_f32() * amp).collect();
            Ok((
                name,
                vec![cols as u64, rows as u64],
                ty,
                quantize_ggml(ty, &vals)?,
            ))
        };
    let norm = |name: String, n: usize, rng: &mut Rng| {
        let vals: Vec<f32> = (0..n).map(|_| 1.0 + 0.2 * rng.next_f32()).collect();
        (
            name,
            vec![n as u64],
            GgmlType::F32,
            vals.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
        )
    };
    let ty = spec.weight_type;
    let (q_dim, kv_dim) = (spec.n_heads * head_dim, spec.n_kv_heads * head_dim);
    // Embedding values larger than the projections' so the residual stream carries signal.
    tensors.push(mat("token_embd.weight".into(), vocab, spec.dim, ty, &mut rng)?);
    for l in 0..spec.n_layers {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let an = norm(n("attn_norm"), spec.dim, &mut rng);
        tensors.push(mat(n("attn_q"), q_dim, spec.dim, ty, &mut rng)?);
        tensors.push(mat(n("attn_k"), kv_dim, spec.dim, ty, &mut rng)?);
        tensors.push(mat(n("attn_v"), kv_dim, spec.dim, ty, &mut rng)?);
        tensors.push(mat(n("attn_output"), spec.dim, q_dim, ty, &mut rng)?);
        let fnorm = norm(n("ffn_norm"), spec.dim, &mut rng);
        tensors.push(mat(n("ffn_gate"), spec.ffn_dim, spec.dim, ty, &mut rng)?);
        tensors.push(mat(n("ffn_up"), spec.ffn_dim, spec.dim, ty, &mut rng)?);
        tensors.push(mat(n("ffn_down"), spec.dim, spec.ffn_dim, ty, &mut rng)?);
        tensors.push(an);
        tensors.push(fnorm);
    }
    tensors.push(norm("output_norm.weight".into(), spec.dim, &mut rng));
    if !spec.tied_embeddings {
        tensors.push(mat("output.weight".into(), vocab, spec.dim, ty, &mut rng)?);
    }
    Ok(writer::encode(&meta, &tensors))
}

/// Writes a tiny model to `path`.
pub fn write_tiny_gguf(path: &Path, spec: &TinyModelSpec) -> std::io::Result<()> {
    let bytes = tiny_gguf_bytes(spec).map_err(std::io::Error::other)?;
    std::fs::write(path, bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;
    use inference::model::Model;

    #[test]
    fn tiny_model_loads_and_tokenizes() {
        let dir = std::env::temp_dir().join(format!("llmserve-tiny-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let path = dir.join("tiny.gguf");
        for ty in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
        ] {
            let spec = TinyModelSpec {
                weight_type: ty,
                tied_embeddings: ty == GgmlType::Q4_1,
                ..Default::default()
            };
            write_tiny_gguf(&path, &spec).expect("write");
            let m = Model::load(&path).expect("load");
            assert_eq!(m.config.n_layers, 2);
            assert_eq!(m.config.head_dim, 16);
            assert_eq!(m.config.eos_token_ids, vec![0, 2]);
            assert_eq!(m.file_bytes, std::fs::metadata(&path).expect("meta").len());
            let ids = m.tokenizer.encode("<|im_start|>user\nHello world<|im_end|>");
            let hello = m.tokenizer.token_id("Hello").expect("Hello token");
            let world = m.tokenizer.token_id("Ġworld").expect("world token");
            assert_eq!(
                ids,
                vec![
                    1,
                    m.tokenizer.token_id("user").expect("user"),
                    m.tokenizer.byte_token(b'\n').expect("newline"),
                    hello,
                    world,
                    2
                ]
            );
            assert_eq!(
                m.tokenizer.decode(&ids),
                "<|im_start|>user\nHello world<|im_end|>"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
