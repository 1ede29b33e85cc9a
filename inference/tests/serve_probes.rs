//! The probe points survive `strip` (they are in the dynamic symbol table of `llmserve`) and start with their
//! 5-byte NOP. What a detached probe call costs is `cargo xtask bench probes`.

#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

use std::process::Command;

use llmprof_abi::ENGINE_PROBES;

fn dynamic_symbols(path: &std::path::Path) -> String {
    let out = Command::new("nm")
        .arg("-D")
        .arg("--defined-only")
        .arg(path)
        .output()
        .expect("nm (binutils) runs");
    assert!(
        out.status.success(),
        "nm -D failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn probe_symbols_survive_strip() {
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_llmserve"));
    let dir = std::env::temp_dir().join(format!("llmserve-strip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stripped = dir.join("llmserve");
    std::fs::copy(&bin, &stripped).unwrap();
    let st = Command::new("strip")
        .arg(&stripped)
        .status()
        .expect("strip (binutils) runs");
    assert!(st.success());
    let before = std::fs::metadata(&bin).unwrap().len();
    let after = std::fs::metadata(&stripped).unwrap().len();
    assert!(
        after < before,
        "strip removed something ({before} -> {after} bytes)"
    );
    let syms = dynamic_symbols(&stripped);
    for name in ENGINE_PROBES.iter().chain([&llmprof_abi::ABI_VERSION_SYMBOL]) {
        assert!(
            syms.lines().any(|l| l.split_whitespace().last() == Some(name)),
            "{name} missing from the dynamic symbols of the stripped binary:\n{syms}"
        );
    }
    // And the code at the symbol starts with the 5-byte NOP: read it from the stripped ELF.
    let out = Command::new("objdump")
        .arg("-d")
        .arg(format!("--disassemble={}", llmprof_abi::PROBE_STEP))
        .arg(&stripped)
        .output()
        .expect("objdump (binutils) runs");
    assert!(
        out.status.success(),
        "objdump -d failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = String::from_utf8_lossy(&out.stdout);
    // The label is `<NAME>:`, or `<NAME@@VERSION>:` where the symbol is versioned (`@@Base` in a stripped binary).
    let label = format!("<{}", llmprof_abi::PROBE_STEP);
    let is_label = |l: &str| {
        l.split_once(&label)
            .is_some_and(|(_, rest)| rest == ">:" || (rest.starts_with('@') && rest.ends_with(">:")))
    };
    let first = d.lines().skip_while(|l| !is_label(l)).nth(1);
    let nop5 = llmprof_abi::PROBE_NOP5.map(|b| format!("{b:02x}")).join(" ");
    assert!(
        first.is_some_and(|l| l.contains(&nop5)),
        "{} starts with the 5-byte NOP {nop5}:\n{d}",
        llmprof_abi::PROBE_STEP
    );
    let _ = std::fs::remove_dir_all(&dir);
}
