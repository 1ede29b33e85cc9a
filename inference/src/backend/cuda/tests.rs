//! Unit tests of the CUDA backend that need no GPU: the fuse setting's parsing and the kernels' geometry limits.

use super::*;

fn cfg(head_dim: usize, n_heads: usize, n_kv: usize) -> ModelConfig {
    ModelConfig {
        vocab_size: 10,
        n_layers: 1,
        n_heads,
        n_kv_heads: n_kv,
        head_dim,
        dim: head_dim * n_heads,
        ffn_dim: 32,
        context_len: 64,
        rope_base: 1e4,
        rms_eps: 1e-5,
        bos_token_id: None,
        eos_token_ids: vec![],
        name: "t".into(),
    }
}

#[test]
fn the_fuse_setting_is_a_number_of_tokens() {
    let o = CudaOptions::default();
    assert_eq!(o.fuse_max_tokens, forward::FUSE_MAX_TOKENS);
    assert_eq!(
        o.with_fuse_setting(" 32 ").map(|o| o.fuse_max_tokens).ok(),
        Some(32)
    );
    assert_eq!(o.with_fuse_setting("0").map(|o| o.fuse_max_tokens).ok(), Some(0));
    assert_eq!(
        o.fuse_note(true),
        format!(
            "fused launches up to {} tokens, tensor-core products from {} tokens",
            forward::FUSE_MAX_TOKENS,
            mma::MMA_MIN_TOKENS
        )
    );
    assert_eq!(
        o.with_fuse_setting("0")
            .map(|o| o.fuse_note(false))
            .ok()
            .as_deref(),
        Some("no fused launches, no tensor cores (before sm_80)")
    );
    let off = CudaOptions {
        mma_min_tokens: 0,
        ..o
    };
    assert!(off.fuse_note(true).ends_with("tensor cores off"));
    assert_eq!(tokens_setting(mma::MMA_ENV, " 128").ok(), Some(128));
    assert!(
        tokens_setting(mma::MMA_ENV, "on")
            .err()
            .is_some_and(|e| e.to_string().contains(mma::MMA_ENV))
    );
    for bad in ["", "eight", "-1", "8 tokens"] {
        let e = o
            .with_fuse_setting(bad)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(FUSE_ENV), "{bad:?}: {e}");
    }
}

#[test]
fn geometry_limits_of_the_kernels() {
    assert!(check_geometry(&cfg(64, 9, 3), 1024, 16).is_ok());
    assert!(
        check_geometry(&cfg(512, 1, 1), 16, 16).is_err(),
        "head_dim over MAX_HEAD_DIM"
    );
    assert!(
        check_geometry(&cfg(64, 9, 2), 16, 16).is_err(),
        "heads not a multiple of KV heads"
    );
    assert!(
        check_geometry(&cfg(64, 9, 3), 1 << 28, 16).is_err(),
        "more than 2^31 slots"
    );
    assert!(check_geometry(&cfg(64, 9, 3), 0, 16).is_err());
}
