//! The CPU backend against a separately written, straightforward f32 reference forward pass (naive loops over
//! dequantized weights, no KV cache, f64 sums) on tiny generated Llama GGUFs of every supported tensor type:
//! chunked prefill through a paged KV cache with a scattered block table, then decode, must give the reference
//! logits; chunked prefill equals one-shot prefill; a mixed batch equals the sequences run alone.

use std::path::PathBuf;
use std::sync::Arc;

use e2e::gguf::{TinyModelSpec, write_tiny_gguf};
use inference::backend::cpu::CpuBackend;
use inference::backend::{Backend, BatchItem, Logits};
use inference::gguf::GgmlType;
use inference::model::{Model, ModelConfig};

/// Relative tolerance of backend logits against the reference (scaled by the largest reference logit).
const REL_TOL: f64 = 1e-4;

fn tiny_model(ty: GgmlType, tied: bool, tag: &str) -> Arc<Model> {
    let dir = std::env::temp_dir().join(format!("llmserve-model-ref-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path: PathBuf = dir.join(format!("{tag}-{ty:?}.gguf"));
    let spec = TinyModelSpec {
        weight_type: ty,
        tied_embeddings: tied,
        seed: 42,
        ..Default::default()
    };
    write_tiny_gguf(&path, &spec).expect("write tiny gguf");
    let m = Model::load(&path).expect("load tiny gguf");
    std::fs::remove_file(&path).ok();
    Arc::new(m)
}

/// The reference: a whole-sequence forward pass with every weight dequantized to f32.
struct Reference {
    c: ModelConfig,
    embd: Vec<f32>,
    layers: Vec<[Vec<f32>; 9]>,
    out_norm: Vec<f32>,
    head: Vec<f32>,
}

impl Reference {
    fn new(m: &Model) -> Self {
        let w = &m.weights;
        Reference {
            c: m.config.clone(),
            embd: w.token_embd.dequantize(),
            layers: w
                .layers
                .iter()
                .map(|l| {
                    [
                        l.attn_norm.clone(),
                        l.wq.dequantize(),
                        l.wk.dequantize(),
                        l.wv.dequantize(),
                        l.wo.dequantize(),
                        l.ffn_norm.clone(),
                        l.w_gate.dequantize(),
                        l.w_up.dequantize(),
                        l.w_down.dequantize(),
                    ]
                })
                .collect(),
            out_norm: w.output_norm.clone(),
            head: w.lm_head().dequantize(),
        }
    }

    fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
        w.chunks(x.len())
            .map(|row| {
                row.iter()
                    .zip(x)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum::<f64>() as f32
            })
            .collect()
    }

    fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
        let ms = x.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>() / x.len() as f64;
        let s = 1.0 / (ms + f64::from(eps)).sqrt();
        x.iter()
            .zip(w)
            .map(|(a, b)| (f64::from(*a) * s) as f32 * b)
            .collect()
    }

    /// Rotates adjacent pairs (x[2i], x[2i+1]) of each head by pos · base^(-2i/head_dim).
    fn rope(x: &mut [f32], head_dim: usize, pos: usize, base: f32) {
        for h in 0..x.len() / head_dim {
            for i in 0..head_dim / 2 {
                let theta = pos as f64 * f64::from(base).powf(-((2 * i) as f64) / head_dim as f64);
                let (a, b) = (
                    f64::from(x[h * head_dim + 2 * i]),
                    f64::from(x[h * head_dim + 2 * i + 1]),
                );
                x[h * head_dim + 2 * i] = (a * theta.cos() - b * theta.sin()) as f32;
                x[h * head_dim + 2 * i + 1] = (a * theta.sin() + b * theta.cos()) as f32;
            }
        }
    }

    /// Logits at every position.
    fn forward(&self, tokens: &[u32]) -> Vec<Vec<f32>> {
        let c = &self.c;
        let hd = c.head_dim;
        let mut xs: Vec<Vec<f32>> = tokens
            .iter()
            .map(|&t| self.embd[t as usize * c.dim..(t as usize + 1) * c.dim].to_vec())
            .collect();
        for l in &self.layers {
            let mut qs = Vec::new();
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for (p, x) in xs.iter().enumerate() {
                let xn = Self::rmsnorm(x, &l[0], c.rms_eps);
                let mut q = Self::matvec(&l[1], &xn);
                let mut k = Self::matvec(&l[2], &xn);
                Self::rope(&mut q, hd, p, c.rope_base);
                Self::rope(&mut k, hd, p, c.rope_base);
                qs.push(q);
                ks.push(k);
                vs.push(Self::matvec(&l[3], &xn));
            }
            for p in 0..xs.len() {
                let mut att = vec![0f32; c.n_heads * hd];
                for h in 0..c.n_heads {
                    let kvh = h / (c.n_heads / c.n_kv_heads);
                    let scores: Vec<f64> = (0..=p)
                        .map(|j| {
                            (0..hd)
                                .map(|d| f64::from(qs[p][h * hd + d]) * f64::from(ks[j][kvh * hd + d]))
                                .sum::<f64>()
                                / (hd as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for d in 0..hd {
                        att[h * hd + d] = (0..=p)
                            .map(|j| e[j] / sum * f64::from(vs[j][kvh * hd + d]))
                            .sum::<f64>() as f32;
                    }
                }
                let o = Self::matvec(&l[4], &att);
                for (a, b) in xs[p].iter_mut().zip(o) {
                    *a += b;
                }
                let xn = Self::rmsnorm(&xs[p], &l[5], c.rms_eps);
                let g = Self::matvec(&l[6], &xn);
                let u = Self::matvec(&l[7], &xn);
                let h: Vec<f32> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| (f64::from(*g) / (1.0 + (-f64::from(*g)).exp())) as f32 * u)
                    .collect();
                let d = Self::matvec(&l[8], &h);
                for (a, b) in xs[p].iter_mut().zip(d) {
                    *a += b;
                }
            }
        }
        xs.iter()
            .map(|x| Self::matvec(&self.head, &Self::rmsnorm(x, &self.out_norm, c.rms_eps)))
            .collect()
    }
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_within(got, want, REL_TOL, what);
}

/// Relative tolerance of the logits with an f16 KV cache: keys and values rounded to 11 significant bits (relative
/// error ≤ 2⁻¹¹ ≈ 4.9e-4 each) move scores and attention outputs by about that much, and the logits after the
/// remaining layers by about as much again; measured on these models: up to 7.7e-4 (positions 21–40, F32 and Q4_1).
const REL_TOL_F16_KV: f64 = 3e-3;

/// Largest `|got - want|` within `tol` × the largest `|want|`.
fn assert_within(got: &[f32], want: &[f32], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: vocab size");
    let scale = want.iter().fold(0f64, |a, v| a.max(f64::from(v.abs()))).max(1e-3);
    let err = got
        .iter()
        .zip(want)
        .fold(0f64, |a, (g, w)| a.max((f64::from(*g) - f64::from(*w)).abs()));
    assert!(
        err <= tol * scale,
        "{what}: max |Δlogit| {err:e} > {tol} × {scale}"
    );
}

/// A fixed token sequence of the tiny vocabulary.
fn sequence(m: &Model, len: usize) -> Vec<u32> {
    let mut ids = m
        .tokenizer
        .encode("<|im_start|>user\nWhat is the capital of France? Hello world, the tiny one.");
    let mut k = 3;
    while ids.len() < len {
        ids.push((k * 37 % m.config.vocab_size) as u32);
        k += 1;
    }
    ids.truncate(len);
    ids
}

/// Runs `tokens[..prompt]` as prefill chunks of the given sizes, then decodes the rest one token at a time;
/// returns the logits after the prefill and after each decoded token.
fn run_backend(
    m: &Arc<Model>,
    tokens: &[u32],
    prompt: usize,
    chunks: &[usize],
    block_size: usize,
) -> Vec<Vec<f32>> {
    run_backend_kv(m, tokens, prompt, chunks, block_size, false)
}

/// [`run_backend`] with an f16 KV cache when `kv_f16`.
fn run_backend_kv(
    m: &Arc<Model>,
    tokens: &[u32],
    prompt: usize,
    chunks: &[usize],
    block_size: usize,
    kv_f16: bool,
) -> Vec<Vec<f32>> {
    let blocks = tokens.len().div_ceil(block_size);
    let num_blocks = blocks * 2 + 3;
    let mut be = CpuBackend::with_kv_f16(Arc::clone(m), num_blocks, block_size, 2, kv_f16).expect("backend");
    assert_eq!(be.kv_cache_dtype(), if kv_f16 { "f16" } else { "f32" });
    // A scattered block table: odd blocks from the end of the pool.
    let table: Vec<u32> = (0..blocks as u32)
        .map(|i| (num_blocks as u32 - 1) - 2 * i)
        .collect();
    let mut out = Vec::new();
    let mut pos = 0;
    let mut sizes = chunks.iter().copied().chain(std::iter::repeat(usize::MAX));
    while pos < prompt {
        let end = pos.saturating_add(sizes.next().unwrap_or(usize::MAX)).min(prompt);
        let need = end == prompt;
        let item = BatchItem {
            tokens: &tokens[pos..end],
            start_pos: pos,
            block_table: &table,
            logits: if need { Logits::Full } else { Logits::None },
        };
        let r = be.forward(&[item]).expect("prefill");
        assert_eq!(r.logits.len(), usize::from(need));
        assert!(r.device_end_ns >= r.device_start_ns && r.device_start_ns > 0);
        out.extend(r.logits);
        pos = end;
    }
    for p in prompt..tokens.len() {
        let item = BatchItem {
            tokens: &tokens[p..p + 1],
            start_pos: p,
            block_table: &table,
            logits: Logits::Full,
        };
        out.extend(be.forward(&[item]).expect("decode").logits);
    }
    out
}

#[test]
fn model_backend_matches_reference_for_every_tensor_type() {
    for (ty, tied) in [
        (GgmlType::F32, false),
        (GgmlType::F16, false),
        (GgmlType::Q8_0, true),
        (GgmlType::Q4_0, false),
        (GgmlType::Q4_1, true),
    ] {
        let m = tiny_model(ty, tied, "ref");
        let tokens = sequence(&m, 24);
        let want = Reference::new(&m).forward(&tokens);
        let prompt = 15;
        let got = run_backend(&m, &tokens, prompt, &[4, 7], 4);
        assert_eq!(got.len(), 1 + tokens.len() - prompt);
        for (i, g) in got.iter().enumerate() {
            let p = prompt - 1 + i;
            assert_close(g, &want[p], &format!("{ty:?} position {p}"));
        }
    }
}

/// With the f16 KV cache (the server's default), chunked prefill and decode stay within [`REL_TOL_F16_KV`] of the
/// f32 reference, and pick the same next tokens wherever the reference's best logit leads by more than that.
#[test]
fn model_f16_kv_cache_stays_close_to_reference() {
    for (ty, tied) in [(GgmlType::F32, false), (GgmlType::Q4_1, true)] {
        let m = tiny_model(ty, tied, "f16kv");
        let tokens = sequence(&m, 40);
        let want = Reference::new(&m).forward(&tokens);
        let prompt = 21;
        let got = run_backend_kv(&m, &tokens, prompt, &[5, 9], 4, true);
        assert_eq!(got.len(), 1 + tokens.len() - prompt);
        for (i, g) in got.iter().enumerate() {
            let p = prompt - 1 + i;
            assert_within(
                g,
                &want[p],
                REL_TOL_F16_KV,
                &format!("f16 KV {ty:?} position {p}"),
            );
            let mut order: Vec<usize> = (0..want[p].len()).collect();
            order.sort_by(|&a, &b| want[p][b].total_cmp(&want[p][a]));
            let scale = want[p].iter().fold(0f32, |a, v| a.max(v.abs()));
            if f64::from(want[p][order[0]] - want[p][order[1]]) > 2.0 * REL_TOL_F16_KV * f64::from(scale) {
                let best = (0..g.len()).max_by(|&a, &b| g[a].total_cmp(&g[b]));
                assert_eq!(best, Some(order[0]), "f16 KV {ty:?} position {p}: greedy token");
            }
        }
    }
}

#[test]
fn model_chunked_prefill_equals_one_shot() {
    let m = tiny_model(GgmlType::Q4_1, false, "chunk");
    let tokens = sequence(&m, 40);
    let one_shot = run_backend(&m, &tokens, 33, &[], 16);
    for chunks in [&[1usize, 1, 1][..], &[5, 3, 8, 2], &[16, 16]] {
        for block_size in [1, 3, 16] {
            let chunked = run_backend(&m, &tokens, 33, chunks, block_size);
            assert_eq!(chunked.len(), one_shot.len());
            for (a, b) in chunked.iter().zip(&one_shot) {
                assert_close(a, b, &format!("chunks {chunks:?} block size {block_size}"));
            }
        }
    }
}

#[test]
fn model_mixed_batch_equals_sequences_alone() {
    let m = tiny_model(GgmlType::Q8_0, false, "mixed");
    let a = sequence(&m, 12);
    let b: Vec<u32> = sequence(&m, 20).into_iter().rev().collect();
    let want_a = Reference::new(&m).forward(&a);
    let want_b = Reference::new(&m).forward(&b);
    let mut be = CpuBackend::new(Arc::clone(&m), 16, 4, 2).expect("backend");
    let (ta, tb): (Vec<u32>, Vec<u32>) = ((0..4).collect(), (4..9).collect());
    // Step 1: prefill all of `a` and the first 9 tokens of `b` (no logits for `b`).
    let r = be
        .forward(&[
            BatchItem {
                tokens: &a,
                start_pos: 0,
                block_table: &ta,
                logits: Logits::Full,
            },
            BatchItem {
                tokens: &b[..9],
                start_pos: 0,
                block_table: &tb,
                logits: Logits::None,
            },
        ])
        .expect("step 1");
    assert_eq!(r.logits.len(), 1);
    assert_close(&r.logits[0], &want_a[11], "a after prefill");
    // Step 2: rest of `b`'s prompt as a chunk together with... nothing else; step 3: decode both.
    let r = be
        .forward(&[BatchItem {
            tokens: &b[9..19],
            start_pos: 9,
            block_table: &tb,
            logits: Logits::Full,
        }])
        .expect("step 2");
    assert_close(&r.logits[0], &want_b[18], "b after chunked prefill");
    let next_a = [b[0]];
    let mut a2 = a.clone();
    a2.push(next_a[0]);
    let want_a2 = Reference::new(&m).forward(&a2);
    let r = be
        .forward(&[
            BatchItem {
                tokens: &b[19..20],
                start_pos: 19,
                block_table: &tb,
                logits: Logits::Full,
            },
            BatchItem {
                tokens: &next_a,
                start_pos: 12,
                block_table: &ta,
                logits: Logits::Full,
            },
        ])
        .expect("step 3");
    assert_eq!(r.logits.len(), 2);
    assert_close(&r.logits[0], &want_b[19], "b decode");
    assert_close(&r.logits[1], &want_a2[12], "a decode");
}

/// A batch mixing what its items want back: logits, the argmax only, nothing. The argmax of every item that wants
/// output comes back in batch order, logits only for those that asked for them, all matching the reference.
#[test]
fn model_batch_returns_argmax_for_every_row_and_logits_only_where_asked() {
    let m = tiny_model(GgmlType::Q8_0, false, "wants");
    let mut be = CpuBackend::new(Arc::clone(&m), 16, 4, 1).expect("backend");
    let reference = Reference::new(&m);
    let prompts: [&[u32]; 4] = [&[5, 6, 7], &[9, 2], &[4, 4, 4, 4], &[11]];
    let wants = [Logits::Full, Logits::Argmax, Logits::None, Logits::Argmax];
    let tables: [&[u32]; 4] = [&[0], &[1], &[2], &[3]];
    let batch: Vec<BatchItem<'_>> = (0..4)
        .map(|i| BatchItem {
            tokens: prompts[i],
            start_pos: 0,
            block_table: tables[i],
            logits: wants[i],
        })
        .collect();
    let out = be.forward(&batch).expect("forward");
    let last: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| reference.forward(p).pop().expect("a row per token"))
        .collect();
    let ref_argmax = |i: usize| inference::sampling::argmax(&last[i]);
    assert_eq!(
        out.tokens,
        [ref_argmax(0), ref_argmax(1), ref_argmax(3)],
        "one argmax per item that wants output, in batch order"
    );
    assert_eq!(
        out.logits.len(),
        1,
        "logits only for the item that asked for them"
    );
    assert_close(&out.logits[0], &last[0], "the Full item's logits");
}

#[test]
fn model_backend_rejects_bad_batches_and_swaps_weights() {
    let m = tiny_model(GgmlType::F32, false, "bad");
    let mut be = CpuBackend::new(Arc::clone(&m), 4, 4, 1).expect("backend");
    let toks = [5u32, 6, 7, 8, 9];
    let short_table = [0u32];
    assert!(
        be.forward(&[BatchItem {
            tokens: &toks,
            start_pos: 0,
            block_table: &short_table,
            logits: Logits::Full
        }])
        .is_err()
    );
    assert!(
        be.forward(&[BatchItem {
            tokens: &toks,
            start_pos: 0,
            block_table: &[0, 9],
            logits: Logits::Full
        }])
        .is_err()
    );
    assert!(
        be.forward(&[BatchItem {
            tokens: &[100_000],
            start_pos: 0,
            block_table: &[0],
            logits: Logits::Full
        }])
        .is_err()
    );
    assert!(
        be.forward(&[BatchItem {
            tokens: &[],
            start_pos: 0,
            block_table: &[0],
            logits: Logits::Full
        }])
        .is_err()
    );
    // Same geometry swaps; a different one is refused.
    let other = tiny_model(GgmlType::Q8_0, true, "swap");
    be.swap_weights(Arc::clone(&other)).expect("same geometry");
    let r = be
        .forward(&[BatchItem {
            tokens: &toks,
            start_pos: 0,
            block_table: &[1, 2],
            logits: Logits::Full,
        }])
        .expect("forward");
    assert_close(
        &r.logits[0],
        &Reference::new(&other).forward(&toks)[4],
        "after swap",
    );
    let dir = std::env::temp_dir().join(format!("llmserve-model-ref-{}", std::process::id()));
    let path = dir.join("three-layers.gguf");
    write_tiny_gguf(
        &path,
        &TinyModelSpec {
            n_layers: 3,
            ..Default::default()
        },
    )
    .expect("write");
    let three = Arc::new(Model::load(&path).expect("load"));
    assert!(be.swap_weights(three).is_err());
}
