//! The CUDA kernels' logic without a GPU: the generated kernel source is compiled as C++ with a small emulator
//! (`tools/gpu/kernel_emu/emu.h`: each CUDA thread a fiber, warp shuffles and votes as barriers, `mma.sync`
//! m16n8k16 from the PTX ISA's fragment layout) and checked against double-precision references
//! (`tools/gpu/kernel_emu/kernels_test.cpp`): every matmul weight type and epilogue, on CUDA cores and on tensor
//! cores, embedding, RMSNorm, RoPE with the paged KV write, paged causal attention, and sampling on the device
//! (`sample_test.h`: every draw against sampling.rs's rule, chi-square over thousands of draws). Without a C++20 compiler
//! (`g++`, installed by `cargo xtask setup-tools`) it skips loudly, and fails under CI (`e2e::require`).
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

use std::path::Path;
use std::process::Command;

#[test]
fn kernels_match_references_under_the_cpu_emulator() {
    if !e2e::require(
        Command::new("g++").arg("--version").output().is_ok(),
        "g++ not installed; the emulated kernel checks need a C++20 compiler (`cargo xtask setup-tools` installs it)",
    ) {
        return;
    }
    let emu = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/gpu/kernel_emu");
    let dir = std::env::temp_dir().join(format!("llmserve-kernel-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("kernels.cu"),
        inference::backend::cuda::kernels::kernel_source(),
    )
    .unwrap();
    let exe = dir.join("kernels_test");
    let out = Command::new("g++")
        .args(["-std=c++20", "-O1", "-w", "-fno-strict-aliasing", "-I"])
        .arg(&dir)
        .arg("-I")
        .arg(&emu)
        .arg("-o")
        .arg(&exe)
        .arg(emu.join("kernels_test.cpp"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "compiling the kernels under the emulator failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    eprintln!("{stdout}");
    assert!(
        run.status.success() && stdout.contains("ALL OK"),
        "emulated kernel checks failed:\n{stdout}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
