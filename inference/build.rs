//! Keeps the llmprof probe symbols in the dynamic symbol table of `llmserve`, so `strip` does not remove them and
//! llmprof can find them in stripped builds (docs/probe-abi.md).

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=llmprof_*");
    println!("cargo:rerun-if-changed=build.rs");
}
