//! NVRTC compiles the engine's generated CUDA source for Hopper and Ampere, without a GPU: NVRTC needs no
//! driver. The PTX holds the tensor-core instruction of the prefill products (`mma.sync … m16n8k16 … f16`), and
//! the assembler's report shows no kernel spilling registers. `cargo xtask setup-tools` installs PyPI's `nvidia-cuda-nvrtc` wheel into the project cache and
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
        // The fallback for a device NVRTC cannot assemble for: PTX text for the virtual architecture.
        let ptx = kernels::compile_ptx(cc).unwrap_or_else(|e| panic!("compute_{}{}: {e}", cc.0, cc.1));
        let text = String::from_utf8_lossy(&ptx);
        assert!(
            text.contains(&format!(".target sm_{}{}", cc.0, cc.1))
                && text.contains(".entry sample_rows")
                && text.contains("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
            "PTX for compute_{}{}: {}",
            cc.0,
            cc.1,
            &text[..text.len().min(300)]
        );
    }
}

/// The assembler's report for Hopper: every kernel the backend loads is there, and none spills registers to local
/// memory (a spill in a latency-bound decode kernel would cost a memory round where the code expects none). Prints
/// each kernel's registers, the number that decides how many blocks share an SM.
#[test]
fn no_kernel_spills_registers_on_hopper() {
    if !e2e::require(
        libs::load_nvrtc().is_ok(),
        "NVRTC not found; `cargo xtask setup-tools` installs the nvidia-cuda-nvrtc wheel",
    ) {
        return;
    }
    let report = kernels::resources((9, 0)).unwrap();
    for name in kernels::kernel_names() {
        let k = report
            .iter()
            .find(|k| k.name == name)
            .unwrap_or_else(|| panic!("{name} missing from the assembler's report"));
        eprintln!(
            "{:<24} {:>3} registers, {:>2} bytes stack",
            k.name, k.registers, k.stack_bytes
        );
        assert_eq!(k.spill_bytes, 0, "{name} spills registers: {k:?}");
        assert!(k.registers > 0, "{name}: no register count in the report: {k:?}");
    }
}
