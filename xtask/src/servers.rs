//! The third-party servers the wire-probe tests and bench run (owner: profiler-user): a Python venv in the
//! project cache (`~/.cache/llmprof/venvs/servers`) with llama.cpp's OpenAI server (`llama-cpp-python[server]`),
//! the OpenAI Python client, gunicorn, uvicorn and httpx.
//!
//! llama-cpp-python builds llama.cpp from source (~3.5 min on 2 cores). Its default native build segfaults on CPUs
//! with AVX-512 and AMX (this machine kind), so it is built for AVX2/FMA/F16C only ([`LLAMA_CMAKE_ARGS`]); pip's
//! wheel cache keeps the built wheel, so a second setup (or a fresh venv) reuses it. Idempotent: a venv whose
//! Python imports every package at the pinned version, built with today's [`LLAMA_CMAKE_ARGS`] (recorded in the
//! venv), is left alone; one built with other flags gets llama.cpp rebuilt (not from the wheel cache).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util::{cache_dir, run};

/// Pinned llama-cpp-python (llama.cpp's `llama_cpp.server`).
const LLAMA_CPP_PYTHON: &str = "llama-cpp-python[server]==0.3.36";
/// Its version as `llama_cpp.__version__` says it.
const LLAMA_CPP_VERSION: &str = "0.3.36";
/// The other packages of the venv: the client the tests measure with and the multi-process front ends.
const PACKAGES: [&str; 4] = ["openai", "gunicorn", "uvicorn", "httpx"];
/// CMake flags of the llama.cpp build: no native tuning (it segfaults with AVX-512/AMX here), AVX2 + FMA + F16C;
/// frame pointers in its C and C++ code, so llmprof's stack sampler (a frame-pointer walk in eBPF) sees whole
/// native stacks through libllama and libggml (`llama_decode` → `ggml_graph_compute` → the kernels).
/// scikit-build-core splits `CMAKE_ARGS` like a shell, so each flag value is one word.
pub const LLAMA_CMAKE_ARGS: &str = "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
                                    -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
                                    -DCMAKE_C_FLAGS=-fno-omit-frame-pointer \
                                    -DCMAKE_CXX_FLAGS=-fno-omit-frame-pointer";
/// File in the venv holding the [`LLAMA_CMAKE_ARGS`] its llama.cpp was built with: a venv built with other
/// flags is rebuilt (pip's wheel cache does not key on `CMAKE_ARGS`, so that build bypasses it).
const BUILD_FLAGS_FILE: &str = "llmprof-llama-cmake-args";
/// The Python the venv is made from: pyenv's 3.11 where it is installed (the test machines' default Python,
/// with 3.10, 3.12 and 3.13 beside it for the Python-frame tests), else `python3`.
const PYENV_VERSIONS: &str = "/root/.pyenv/versions";

/// The venv's directory.
pub fn venv() -> PathBuf {
    cache_dir().join("venvs").join("servers")
}

/// The venv's Python.
pub fn python() -> PathBuf {
    venv().join("bin").join("python")
}

/// A Python 3.11 to create a venv with (this one and vLLM's).
pub fn base_python() -> PathBuf {
    let found = std::fs::read_dir(PYENV_VERSIONS).ok().and_then(|d| {
        let mut v: Vec<PathBuf> = d
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("3.11"))
            })
            .map(|p| p.join("bin").join("python"))
            .filter(|p| p.exists())
            .collect();
        v.sort();
        v.pop()
    });
    found.unwrap_or_else(|| PathBuf::from("python3"))
}

/// Whether the venv's llama.cpp was built with [`LLAMA_CMAKE_ARGS`].
fn built_with_current_flags() -> bool {
    std::fs::read_to_string(venv().join(BUILD_FLAGS_FILE)).is_ok_and(|f| f == LLAMA_CMAKE_ARGS)
}

fn ready() -> bool {
    if !built_with_current_flags() {
        return false;
    }
    let check = format!(
        "import llama_cpp, llama_cpp.server, openai, gunicorn, uvicorn, httpx; \
         assert llama_cpp.__version__ == '{LLAMA_CPP_VERSION}'"
    );
    Command::new(python())
        .args(["-c", &check])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `cargo xtask setup` (servers part).
pub fn setup() -> Result<()> {
    if ready() {
        eprintln!("setup: servers venv ready ({})", venv().display());
        return Ok(());
    }
    if !python().exists() {
        let base = base_python();
        eprintln!(
            "setup: creating the servers venv {} with {}",
            venv().display(),
            base.display()
        );
        run(Command::new(&base).arg("-m").arg("venv").arg(venv()))
            .with_context(|| format!("creating a venv with {}", base.display()))?;
    }
    eprintln!(
        "setup: pip install {LLAMA_CPP_PYTHON} {} (builds llama.cpp, ~3.5 min on 2 cores, once: pip caches the wheel)",
        PACKAGES.join(" ")
    );
    let rebuild = !built_with_current_flags();
    if rebuild {
        // Built before with other flags (or never): pip's wheel cache would hand back the old build.
        let _ = Command::new(python())
            .args(["-m", "pip", "uninstall", "--quiet", "--yes", "llama-cpp-python"])
            .status();
    }
    let mut pip = Command::new(python());
    pip.args(["-m", "pip", "install", "--quiet", LLAMA_CPP_PYTHON])
        .args(PACKAGES)
        .env("CMAKE_ARGS", LLAMA_CMAKE_ARGS)
        .env("FORCE_CMAKE", "1");
    if rebuild {
        pip.args(["--no-cache-dir", "--no-binary", "llama-cpp-python"]);
    }
    run(&mut pip)?;
    std::fs::write(venv().join(BUILD_FLAGS_FILE), LLAMA_CMAKE_ARGS)
        .with_context(|| format!("writing {}", venv().join(BUILD_FLAGS_FILE).display()))?;
    if !ready() {
        bail!(
            "the servers venv {} does not import its packages after pip install",
            venv().display()
        );
    }
    Ok(())
}
