//! The eBPF build chain and the committed eBPF object (owner: eBPF).
//!
//! `setup-ebpf` installs what building `profiler-ebpf/` needs: a compiler able to build `core` for
//! `bpfel-unknown-none` and `bpf-linker`. Two chains are detected, never assumed:
//! - Debian: `rustc-web` + `rust-web-src` (apt; rustc with rust-src, used with `RUSTC_BOOTSTRAP=1`).
//! - rustup: a nightly toolchain with the `rust-src` component (the usual aya setup on a developer box).
//!
//! `bpf-linker` 0.13 is built against an LLVM of the compiler's major version: Debian's `llvm-N-dev` when
//! installed, else the `libLLVM.so.N*` a rustup toolchain ships (linked through a prefix of symlinks,
//! since that directory has neither `libLLVM.so` nor `llvm-config`).
//!
//! `build-ebpf` builds the object through a fixed path with path prefixes remapped (so the bytes do not depend on
//! where the checkout lives) and copies it to `profiler-user/ebpf/llmprof-ebpf.o`, next to a `.toolchain` file
//! naming the compiler and linker that made it. `build-ebpf --check` rebuilds and fails when the committed object
//! differs from the fresh one in what the kernel runs: instructions, maps, relocations, BTF types ([`compare`]);
//! line info alone may differ, so moving code between lines or files needs no new object (CI runs the check).
//! Both check that the object's programs and maps are the ones `llmprof_abi`'s families name.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util::{have, repo_root, run};

mod compare;

/// bpf-linker release: 0.13 links LLVM 21–23 bitcode (features `llvm-21`/`llvm-22`/`llvm-23`).
const BPF_LINKER_VERSION: &str = "0.13.0";
/// LLVM majors bpf-linker 0.13 supports.
const LLVM_MAJORS: [u32; 3] = [21, 22, 23];
/// Debian packages of the compiler chain (bookworm: rustc 1.96 with LLVM 22, and its library sources).
const DEBIAN_RUST: [&str; 2] = ["rustc-web", "rust-web-src"];
/// Debian's rustc and its sysroot.
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_SYSROOT: &str = "/usr";
/// The committed object and the record of the chain that built it.
const OBJECT: &str = "profiler-user/ebpf/llmprof-ebpf.o";
const TOOLCHAIN_RECORD: &str = "profiler-user/ebpf/llmprof-ebpf.o.toolchain";

/// A compiler able to build `core` for bpfel-unknown-none.
#[derive(Debug)]
enum Chain {
    /// Debian's rustc-web with rust-web-src.
    Debian,
    /// A rustup nightly with rust-src.
    Nightly,
}

fn debian_ready() -> bool {
    Path::new(DEBIAN_RUSTC).exists()
        && Path::new(DEBIAN_SYSROOT)
            .join("lib/rustlib/src/rust/library/core")
            .is_dir()
}

fn nightly_ready() -> bool {
    Command::new("rustup")
        .args(["component", "list", "--toolchain", "nightly", "--installed"])
        .output()
        .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("rust-src"))
        .unwrap_or(false)
}

fn detect_chain() -> Option<Chain> {
    if debian_ready() {
        Some(Chain::Debian)
    } else if nightly_ready() {
        Some(Chain::Nightly)
    } else {
        None
    }
}

/// `rustc -vV` of the chain.
fn rustc_version(chain: &Chain) -> Result<String> {
    let out = match chain {
        Chain::Debian => Command::new(DEBIAN_RUSTC).arg("-vV").output(),
        Chain::Nightly => Command::new("rustc").args(["+nightly", "-vV"]).output(),
    }
    .context("running rustc -vV")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn llvm_major(rustc_vv: &str) -> Option<u32> {
    let v = rustc_vv.lines().find_map(|l| l.strip_prefix("LLVM version: "))?;
    v.split('.').next()?.parse().ok()
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cargo")
        })
}

fn rustup_home() -> PathBuf {
    std::env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".rustup")
        })
}

fn bpf_linker_version() -> Option<String> {
    let out = Command::new("bpf-linker").arg("--version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// An LLVM prefix (with `lib/libLLVM.so`) of major `major` for building bpf-linker.
fn llvm_prefix(major: u32) -> Result<PathBuf> {
    let debian = PathBuf::from(format!("/usr/lib/llvm-{major}"));
    if debian.join("lib/libLLVM.so").exists() {
        return Ok(debian);
    }
    // A rustup toolchain's libLLVM: lib/libLLVM.so.<major>.<minor>-rust-<version>.
    let toolchains = rustup_home().join("toolchains");
    let want = format!("libLLVM.so.{major}.");
    let mut libs: Vec<PathBuf> = std::fs::read_dir(&toolchains)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|tc| {
            std::fs::read_dir(tc.path().join("lib"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&want))
        })
        .collect();
    libs.sort();
    if let Some(lib) = libs.pop() {
        let prefix = cargo_home().join("llmprof").join(format!("llvm-{major}"));
        let libdir = prefix.join("lib");
        std::fs::create_dir_all(&libdir).with_context(|| format!("creating {}", libdir.display()))?;
        let file_name = lib.file_name().context("libLLVM file name")?;
        for link in [libdir.join("libLLVM.so"), libdir.join(file_name)] {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&lib, &link)
                .with_context(|| format!("linking {} to {}", link.display(), lib.display()))?;
        }
        println!("setup-ebpf: using {} as LLVM {major}", lib.display());
        return Ok(prefix);
    }
    // Last resort: Debian's llvm-N-dev.
    if have("apt-get") {
        run(Command::new("apt-get")
            .args(["install", "-y", "-q", &format!("llvm-{major}-dev")])
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
        if debian.join("lib/libLLVM.so").exists() {
            return Ok(debian);
        }
    }
    bail!("no LLVM {major} found (neither /usr/lib/llvm-{major} nor a rustup toolchain's libLLVM.so.{major})")
}

/// `cargo xtask setup-ebpf`.
pub fn setup() -> Result<()> {
    let chain = match detect_chain() {
        Some(c) => c,
        None if have("apt-get") => {
            println!("setup-ebpf: installing Debian's {}", DEBIAN_RUST.join(" "));
            run(Command::new("apt-get").args(["update", "-q"]))?;
            run(Command::new("apt-get")
                .args(["install", "-y", "-q"])
                .args(DEBIAN_RUST)
                .env("DEBIAN_FRONTEND", "noninteractive"))?;
            detect_chain().context("rustc-web installed but its rust-src is missing")?
        }
        None => {
            run(Command::new("rustup").args(["toolchain", "install", "nightly", "--component", "rust-src"]))?;
            detect_chain().context("no compiler able to build core for bpfel-unknown-none")?
        }
    };
    let vv = rustc_version(&chain)?;
    println!(
        "setup-ebpf: compiler chain {chain:?}: {}",
        vv.lines().next().unwrap_or("")
    );
    if let Some(v) = bpf_linker_version() {
        if v.contains(BPF_LINKER_VERSION) {
            println!("setup-ebpf: {v} already installed");
            return Ok(());
        }
        println!("setup-ebpf: replacing {v}");
    }
    let major = llvm_major(&vv).context("cannot tell the compiler's LLVM version")?;
    let feature_major = LLVM_MAJORS
        .iter()
        .copied()
        .find(|m| *m >= major)
        .with_context(|| {
            format!("bpf-linker {BPF_LINKER_VERSION} supports LLVM {LLVM_MAJORS:?}, the compiler has {major}")
        })?;
    let prefix = llvm_prefix(feature_major)?;
    println!(
        "setup-ebpf: building bpf-linker {BPF_LINKER_VERSION} against LLVM {feature_major} at {}",
        prefix.display()
    );
    run(Command::new("cargo")
        .args(["install", "bpf-linker", "--locked", "--force", "--version"])
        .arg(format!("={BPF_LINKER_VERSION}"))
        .args(["--no-default-features", "--features"])
        .arg(format!("llvm-{feature_major}"))
        .env("LLVM_PREFIX", &prefix))?;
    let v = bpf_linker_version().context("bpf-linker installed but does not run")?;
    println!("setup-ebpf: {v} ready");
    Ok(())
}

/// Fixed path through which the sources are built: cargo hashes the absolute path of `llmprof-abi` (outside
/// the eBPF workspace) into every symbol name of the object, so building through the same path on every
/// machine keeps the object byte-identical wherever the checkout lives.
const STABLE_SRC: &str = "/tmp/llmprof-ebpf-src";

/// (Re)creates [`STABLE_SRC`] as symlinks into `root`; returns it.
fn stable_source_path(root: &Path) -> Result<PathBuf> {
    let dir = PathBuf::from(STABLE_SRC);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {STABLE_SRC}"))?;
    for name in ["Cargo.toml", "llmprof-abi", "profiler-ebpf"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(root.join(name), &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    Ok(dir)
}

/// Builds the object; returns (path of the fresh object, toolchain record).
fn build_object(root: &Path) -> Result<(PathBuf, String)> {
    let chain = detect_chain().context("no eBPF compiler chain: run `cargo xtask setup-ebpf` first")?;
    let linker = bpf_linker_version().context("bpf-linker missing: run `cargo xtask setup-ebpf` first")?;
    let vv = rustc_version(&chain)?;
    // Two checkouts building at once would race on the symlinks of STABLE_SRC: one build at a time.
    std::fs::create_dir_all(crate::util::cache_dir())?;
    let lock_path = crate::util::cache_dir().join("ebpf-build.lock");
    let lock =
        std::fs::File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    let src = stable_source_path(root)?;
    // One target dir per checkout (LLMPROF_EBPF_TARGET_DIR) keeps cargo's mtime checks honest when several
    // checkouts build through the same STABLE_SRC path.
    let target_dir = std::env::var_os("LLMPROF_EBPF_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::util::cache_dir().join("ebpf-target"));
    let sysroot = match chain {
        Chain::Debian => PathBuf::from(DEBIAN_SYSROOT),
        Chain::Nightly => {
            let out = Command::new("rustc")
                .args(["+nightly", "--print", "sysroot"])
                .output()?;
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    // Remapped so the object does not depend on where the checkout, cargo's registry or rust-src live.
    let flags = [
        "-Cdebuginfo=2".to_string(),
        "-Clink-arg=--btf".to_string(),
        format!("--remap-path-prefix={}=/llmprof", root.display()),
        format!("--remap-path-prefix={STABLE_SRC}=/llmprof"),
        format!("--remap-path-prefix={}=/cargo", cargo_home().display()),
        format!(
            "--remap-path-prefix={}=/rust",
            sysroot.join("lib/rustlib/src/rust").display()
        ),
    ]
    .join("\u{1f}");
    let mut cmd = Command::new("cargo");
    match chain {
        Chain::Debian => {
            cmd.env("RUSTC", DEBIAN_RUSTC).env("RUSTC_BOOTSTRAP", "1");
        }
        Chain::Nightly => {
            cmd.arg("+nightly");
        }
    }
    cmd.args(["build", "--release", "--locked", "--manifest-path"])
        .arg(src.join("profiler-ebpf/Cargo.toml"))
        .current_dir(root.join("profiler-ebpf"))
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", flags)
        .env_remove("RUSTFLAGS");
    run(&mut cmd)?;
    drop(lock);
    let obj = target_dir.join("bpfel-unknown-none/release/llmprof-ebpf");
    let record = format!("{vv}\n{linker}\n");
    Ok((obj, record))
}

/// `cargo xtask build-ebpf [--check]`: with `check`, fails when the committed object differs from a fresh
/// build and writes nothing.
pub fn build(check: bool) -> Result<()> {
    let root = repo_root();
    let (fresh, record) = build_object(&root)?;
    let fresh_bytes = std::fs::read(&fresh).with_context(|| format!("reading {}", fresh.display()))?;
    let committed = root.join(OBJECT);
    let record_path = root.join(TOOLCHAIN_RECORD);
    compare::kernel_names(&fresh_bytes).context("the fresh eBPF object and llmprof_abi disagree on names")?;
    if check {
        let old = std::fs::read(&committed).with_context(|| format!("reading {}", committed.display()))?;
        let old_record = std::fs::read_to_string(&record_path).unwrap_or_default();
        if old == fresh_bytes {
            println!(
                "build-ebpf --check: {OBJECT} matches its source byte for byte ({} bytes)",
                old.len()
            );
            return Ok(());
        }
        let differences = compare::differences(&old, &fresh_bytes, 20)?;
        if differences.is_empty() {
            println!(
                "build-ebpf --check: {OBJECT} matches its source in instructions, maps, relocations and BTF \
                 types; only its line info differs (`cargo xtask build-ebpf` refreshes it)"
            );
            return Ok(());
        }
        if old_record != record {
            bail!(
                "{OBJECT} differs from a fresh build, and it was built by another toolchain:\n--- committed\n{old_record}--- here\n{record}\
                 Rebuild with `cargo xtask build-ebpf` and commit both files."
            );
        }
        bail!(
            "{OBJECT} differs from a fresh build of profiler-ebpf/ in what the kernel runs:\n  {}\n\
             Run `cargo xtask build-ebpf` and commit the object.",
            differences.join("\n  ")
        );
    }
    std::fs::create_dir_all(committed.parent().context("object dir")?)?;
    std::fs::write(&committed, &fresh_bytes).with_context(|| format!("writing {}", committed.display()))?;
    std::fs::write(&record_path, &record)?;
    println!("build-ebpf: wrote {OBJECT} ({} bytes)", fresh_bytes.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_major_from_rustc_vv() {
        let vv = "rustc 1.96.0 (ac68faa20 2026-05-25)\nhost: x86_64-unknown-linux-gnu\nLLVM version: 22.1.8";
        assert_eq!(llvm_major(vv), Some(22));
        assert_eq!(llvm_major("rustc 1.0"), None);
    }
}
