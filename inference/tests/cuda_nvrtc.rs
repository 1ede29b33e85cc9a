//! NVRTC compiles the engine's generated CUDA source for Hopper and Ampere, without a GPU: NVRTC needs no
//! driver. `cargo xtask setup-tools` installs PyPI's `nvidia-cuda-nvrtc` wheel into the project cache and
//! `cargo xtask test` puts its lib folder on `LD_LIBRARY_PATH`; the CUDA toolkit or any folder the engine
//! searches (src/backend/cuda/libs.rs) works too. Without NVRTC it skips loudly, and fails under CI.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

use inference::backend::cuda::{kernels, libs};

#[test]
fn nvrtc_compiles_the_kernels_for_hopper_and_ampere() {
    let loaded = libs::load_nvrtc();
    if !e2e::require(
        loaded.is_ok(),
        &format!(
            "NVRTC not found ({}); `cargo xtask setup-tools` installs the nvidia-cuda-nvrtc wheel",
            loaded.as_ref().err().map(ToString::to_string).unwrap_or_default()
        ),
    ) {
        return;
    }
    eprintln!("NVRTC: {}", loaded.unwrap());
    for cc in [(9, 0), (8, 0)] {
        let c = kernels::compile(cc).unwrap_or_else(|e| panic!("sm_{}{}: {e}", cc.0, cc.1));
        assert!(c.kind.starts_with("cubin"), "{}", c.kind);
        assert!(c.image.len() > 1000, "{} bytes", c.image.len());
        // An ELF image (CUBIN) for that architecture.
        assert_eq!(&c.image[..4], b"\x7fELF");
    }
}
