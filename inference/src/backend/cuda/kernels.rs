//! The CUDA kernels of the forward pass: their CUDA C source (`kernels.cu`, with the engine's constants filled in)
//! and their compilation with NVRTC for the GPU at hand.
//!
//! Kernels (all f32 activations with f32 accumulation, like the CPU backend: activations are never quantized,
//! see docs/architecture.md, Decisions):
//! - `matmul_{f32,q8_0,q4_0,q4_1}`: `out[t][r] (=|+=|silu-gated) W[r]·x[t]` for a tile of [`TOKEN_TILE`]
//!   tokens per block row; one warp per weight row, 4 (Q4_x) or 8 (Q8_0, F32) lanes per 32-element quant block
//!   reading 4 bytes of quants each, so a weight row is read once per token tile, in contiguous runs, and
//!   dequantized in registers; each lane issues the loads of [`ROW_PREFETCH`] blocks before using the first.
//! - `qkv_rope_{f32,q8_0,q4_0,q4_1}_{f32,f16}`: per tile of [`TOKEN_TILE`] tokens (a block row each), the attention
//!   block's first half in one launch: RMSNorm of the residual stream, the Q, K and V matmuls (each warp recomputes its tokens' norms;
//!   the norm weight is folded into the weights it reads), RoPE on Q and K (the two warps of a rotation pair trade
//!   sums through shared memory), K and V written into the paged cache.
//! - `gate_up_{f32,q8_0,q4_0,q4_1}`: RMSNorm and the feed-forward's gate and up matmuls in one launch, writing
//!   `silu(gate) * up`.
//! - `matmul_mma_{f32,q8_0,q4_0,q4_1}` ([`super::mma`]): the same products on tensor cores (f16 inputs, f32
//!   accumulation) for steps of at least [`super::mma::MMA_MIN_TOKENS`] tokens, on sm_80 and later.
//! - `embed_{f32,q8_0,q4_0,q4_1}`: embedding rows of the step's tokens.
//! - `rms_norm`: RMSNorm of rows (optionally a gathered subset, for the rows that need logits).
//! - `sample_rows` ([`super::sample`]): the next token of each logit row, the argmax (the host's
//!   `sampling::argmax` rules) or drawn as `sampling`'s rule says (penalties, temperature, `min_p`, `top_k`,
//!   `top_p`, a Philox draw), with log-probabilities when asked, so decoding copies one index per sequence to the
//!   host instead of a vocabulary-sized row.
//! - `rope_kv_{f32,f16}`: RoPE (llama.cpp NORM mode, adjacent pairs) on Q and K, then K and V written into the
//!   paged cache at each token's slot, as f32 or rounded to f16 (IEEE half, round to nearest even).
//! - `attention_{f32,f16}`: causal GQA attention for one (token, head) per block, its warps splitting the keys
//!   (online softmax per warp, combined at the end), reading K/V (f32, or f16 widened to f32) through the
//!   sequence's block table in 16-byte pieces (scores: a key per lane; values: several keys per pass, each lane a
//!   piece of one); arithmetic in f32 either way.
//!
//! Compilation goes to a CUBIN for the device's exact `sm_XY` (loadable by an older driver of the same major
//! version, unlike PTX from a newer NVRTC), falling back to PTX for `compute_XY` when NVRTC cannot target the
//! device. Never launches anything itself (that is [`super::forward`]).

use std::ffi::{CStr, CString};
use std::sync::{Arc, Mutex};

/// Elements per quantization block (ggml's QK8_0 = QK4_0 = QK4_1 = 32; also the warp size the matmul relies on).
pub const QBLOCK: usize = crate::quant::BLOCK;

/// Tokens per matmul block (accumulators per lane); the grid's second dimension covers the rest.
pub const TOKEN_TILE: usize = 8;

/// Quant blocks per lane whose weight loads a matmul warp issues together, before using the first (a Q4 row of
/// 1,536 columns, SmolLM2's widest, is 6 blocks per lane).
pub const ROW_PREFETCH: usize = 6;

/// Warps per block of the matmul and attention kernels.
pub const WARPS: usize = 4;

/// Largest head dimension the attention kernel holds in registers (Llama-family models use 64 to 128).
pub const MAX_HEAD_DIM: usize = 256;

/// Threads per block of the row-wise kernels (embed, rms_norm, rope_kv).
pub const ROW_THREADS: usize = 256;

/// Weight types the kernels read, in the order of the `TY_*` constants of the source.
pub const WEIGHT_TYPES: &[&str] = &["f32", "q8_0", "q4_0", "q4_1"];

/// KV-cache element types the kernels read and write, in [`super::KvDtype`]'s order.
pub const KV_TYPES: &[&str] = &["f32", "f16"];

/// Matmul epilogue: store the product.
pub const MODE_STORE: i32 = 0;
/// Matmul epilogue: add the product to the output (residual connections).
pub const MODE_ADD: i32 = 1;
/// Matmul epilogue: `out = silu(out) * product` (the gate already in `out`, the product is `up`).
pub const MODE_SILU_MUL: i32 = 2;

/// Every kernel the forward pass loads.
pub fn kernel_names() -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for ty in WEIGHT_TYPES {
        v.push(format!("matmul_{ty}"));
        v.push(format!("matmul_mma_{ty}"));
        v.push(format!("embed_{ty}"));
        v.push(format!("gate_up_{ty}"));
        for kv in KV_TYPES {
            v.push(format!("qkv_rope_{ty}_{kv}"));
        }
    }
    for kv in KV_TYPES {
        v.push(format!("rope_kv_{kv}"));
        v.push(format!("attention_{kv}"));
    }
    v.push("rms_norm".into());
    v.push("sample_rows".into());
    v
}

/// The forward pass's CUDA C (`kernels.cu`), with `@NAME@` placeholders for the constants above.
const SOURCE_TEMPLATE: &str = include_str!("kernels.cu");

/// The CUDA C source of all kernels, with the engine's constants filled in.
pub fn kernel_source() -> String {
    let forward = SOURCE_TEMPLATE
        .replace("@QBLOCK@", &QBLOCK.to_string())
        .replace("@TOKEN_TILE@", &TOKEN_TILE.to_string())
        .replace("@WARPS@", &WARPS.to_string())
        .replace("@MAX_HEAD_DIM@", &MAX_HEAD_DIM.to_string())
        .replace("@ROW_PREFETCH@", &ROW_PREFETCH.to_string())
        .replace("@MODE_STORE@", &MODE_STORE.to_string())
        .replace("@MODE_ADD@", &MODE_ADD.to_string())
        .replace("@MODE_SILU_MUL@", &MODE_SILU_MUL.to_string());
    forward + &super::mma::source() + &super::sample::source()
}

/// NVRTC options for a device of compute capability `(major, minor)`: `target` is `sm` (CUBIN) or `compute`
/// (PTX). Precise division and square root, no flush-to-zero (the CPU backend's arithmetic).
pub fn nvrtc_options(cc: (i32, i32), target: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={target}_{}{}", cc.0, cc.1),
        "--std=c++17".into(),
        "--ftz=false".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--fmad=true".into(),
    ]
}

/// A compiled module image and how it was made.
#[derive(Debug)]
pub struct Compiled {
    /// CUBIN or PTX bytes (PTX NUL-terminated).
    pub image: Vec<u8>,
    /// `cubin sm_90` or `ptx compute_90`.
    pub kind: String,
}

/// A compiled image and the compute capability it is for.
type CacheEntry = ((i32, i32), Arc<Compiled>);

/// [`compile`], once per compute capability per process (each backend of a process reuses the image; NVRTC
/// takes seconds).
pub fn compile_cached(cc: (i32, i32)) -> Result<Arc<Compiled>, String> {
    static CACHE: Mutex<Vec<CacheEntry>> = Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, c)) = cache.iter().find(|(k, _)| *k == cc) {
        return Ok(c.clone());
    }
    let c = Arc::new(compile(cc)?);
    cache.push((cc, c.clone()));
    Ok(c)
}

/// Compiles [`kernel_source`] for a device of compute capability `cc`: a CUBIN for `sm_XY`, else PTX for
/// `compute_XY`. The error carries NVRTC's log of both attempts.
pub fn compile(cc: (i32, i32)) -> Result<Compiled, String> {
    let src = kernel_source();
    match compile_with(&src, &nvrtc_options(cc, "sm"), true) {
        Ok(image) => Ok(Compiled {
            image,
            kind: format!("cubin sm_{}{}", cc.0, cc.1),
        }),
        Err(cubin_err) => match compile_ptx(cc) {
            Ok(image) => Ok(Compiled {
                image,
                kind: format!("ptx compute_{}{} (cubin failed: {cubin_err})", cc.0, cc.1),
            }),
            Err(ptx_err) => Err(format!(
                "NVRTC could not compile the kernels: for sm_{0}{1}: {cubin_err}; for compute_{0}{1}: {ptx_err}",
                cc.0, cc.1
            )),
        },
    }
}

/// What the assembler allotted one kernel (from its `-v` report).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelResources {
    /// Kernel (entry function) name.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of stack frame per thread (local memory that is not spills, e.g. a library function's array).
    pub stack_bytes: u32,
    /// Bytes of register spill stores plus loads per thread (local-memory traffic the kernel was not written for).
    pub spill_bytes: u32,
}

/// Compiles the kernels for `cc` (a CUBIN, as [`compile`] does) with the assembler's verbose report and returns
/// each kernel's registers, stack and spills. Needs NVRTC, no GPU.
pub fn resources(cc: (i32, i32)) -> Result<Vec<KernelResources>, String> {
    let mut options = nvrtc_options(cc, "sm");
    options.push("--ptxas-options=-v".into());
    let log = compile_log(&kernel_source(), &options)?;
    Ok(parse_ptxas_report(&log))
}

/// Parses ptxas's `-v` report: per entry function a "Compiling entry function 'NAME'" line, a "N bytes stack frame,
/// N bytes spill stores, N bytes spill loads" line and a "Used N registers" line.
pub fn parse_ptxas_report(log: &str) -> Vec<KernelResources> {
    fn number_before(line: &str, what: &str) -> Option<u32> {
        let head = &line[..line.find(what)?];
        head.split_whitespace().last()?.parse().ok()
    }
    let mut out: Vec<KernelResources> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default();
            out.push(KernelResources {
                name: name.to_string(),
                registers: 0,
                stack_bytes: 0,
                spill_bytes: 0,
            });
        } else if let Some(k) = out.last_mut() {
            if line.contains("bytes stack frame") {
                k.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                k.spill_bytes = number_before(line, "bytes spill stores").unwrap_or(0)
                    + number_before(line, "bytes spill loads").unwrap_or(0);
            } else if let Some(n) = line
                .split("Used ")
                .nth(1)
                .and_then(|r| number_before(r, "registers"))
            {
                k.registers = n;
            }
        }
    }
    out
}

/// PTX for `compute_XY` ([`compile`]'s fallback when NVRTC cannot make a CUBIN for the device), NUL-terminated.
pub fn compile_ptx(cc: (i32, i32)) -> Result<Vec<u8>, String> {
    compile_with(&kernel_source(), &nvrtc_options(cc, "compute"), false)
}

/// One NVRTC compilation that only reports: NVRTC's log on success (with `--ptxas-options=-v`, the assembler's
/// report), the error and log otherwise.
fn compile_log(src: &str, options: &[String]) -> Result<String, String> {
    nvrtc_compile(src, options, |_| Ok(())).map(|((), log)| log)
}

/// One NVRTC compilation; returns the CUBIN (`cubin`) or PTX image.
fn compile_with(src: &str, options: &[String], cubin: bool) -> Result<Vec<u8>, String> {
    use cudarc::nvrtc::{result, sys};
    let image = |prog: sys::nvrtcProgram| -> Result<Vec<u8>, String> {
        if !cubin {
            // SAFETY: `prog` is the live, compiled program nvrtc_compile hands over.
            return unsafe { result::get_ptx(prog) }
                .map(|p| p.iter().map(|&c| c as u8).collect())
                .map_err(|e| format!("nvrtcGetPTX: {e:?}"));
        }
        let mut size = 0usize;
        // SAFETY: as above; `size` is a valid out-pointer.
        let r = unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
            return Err(format!("nvrtcGetCUBINSize: {r:?} (size {size})"));
        }
        let mut buf = vec![0u8; size];
        // SAFETY: as above; `buf` holds the `size` bytes NVRTC reported.
        let r = unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) };
        if r == sys::nvrtcResult::NVRTC_SUCCESS {
            Ok(buf)
        } else {
            Err(format!("nvrtcGetCUBIN: {r:?}"))
        }
    };
    nvrtc_compile(src, options, image).map(|(image, _)| image)
}

/// Creates an NVRTC program of `src`, compiles it with `options` and, when that succeeds, hands it to `read`;
/// returns what `read` made and NVRTC's log, or the error with the log. The program is destroyed either way.
fn nvrtc_compile<T>(
    src: &str,
    options: &[String],
    read: impl FnOnce(cudarc::nvrtc::sys::nvrtcProgram) -> Result<T, String>,
) -> Result<(T, String), String> {
    use cudarc::nvrtc::result;
    let csrc = CString::new(src).map_err(|e| format!("kernel source: {e}"))?;
    let name = c"llmserve_kernels.cu";
    let prog = result::create_program(&csrc, Some(name)).map_err(|e| format!("nvrtcCreateProgram: {e:?}"))?;
    // SAFETY: `prog` is a live program created just above; it is destroyed exactly once, at the end, and `read`
    // only sees it while it is live.
    let out = unsafe {
        let compiled = result::compile_program(prog, options);
        let log = result::get_program_log(prog)
            .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
            .unwrap_or_default();
        match compiled {
            Ok(()) => read(prog).map(|v| (v, log)),
            Err(e) => Err(format!("{e:?} with {options:?}: {log}")),
        }
    };
    // SAFETY: `prog` is live and not used after this.
    unsafe { result::destroy_program(prog) }.map_err(|e| format!("nvrtcDestroyProgram: {e:?}"))?;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_defines_every_kernel_the_backend_loads() {
        let src = kernel_source();
        for name in kernel_names() {
            let of = |prefixes: &[&str], types: &[&'static str]| -> Option<&'static str> {
                types
                    .iter()
                    .find(|ty| prefixes.iter().any(|p| name == format!("{p}_{ty}")))
                    .copied()
            };
            let qkv = WEIGHT_TYPES.iter().find_map(|ty| {
                KV_TYPES
                    .iter()
                    .find(|kv| name == format!("qkv_rope_{ty}_{kv}"))
                    .map(|kv| (ty, kv))
            });
            let defined = if let Some((ty, kv)) = qkv {
                src.contains(&format!("INSTANTIATE_QKV({ty}, TY_{}, {kv}, ", ty.to_uppercase()))
            } else if let Some(ty) = of(&["matmul_mma"], WEIGHT_TYPES) {
                src.contains(&format!("INSTANTIATE_MMA({ty}, TY_{})", ty.to_uppercase()))
            } else if let Some(ty) = of(&["matmul", "embed", "gate_up"], WEIGHT_TYPES) {
                src.contains(&format!("INSTANTIATE({ty}, TY_{})", ty.to_uppercase()))
            } else if let Some(ty) = of(&["rope_kv", "attention"], KV_TYPES) {
                src.contains(&format!("INSTANTIATE_KV({ty}, "))
            } else {
                // `extern "C" __global__ void [__launch_bounds__(N)] name(`
                src.lines()
                    .any(|l| l.contains("extern \"C\" __global__ void") && l.contains(&format!(" {name}(")))
            };
            assert!(defined, "kernel {name} missing from the source");
        }
        assert_eq!(
            kernel_names().len(),
            4 * WEIGHT_TYPES.len() + WEIGHT_TYPES.len() * KV_TYPES.len() + 2 * KV_TYPES.len() + 2
        );
    }

    #[test]
    fn constants_are_substituted_and_consistent() {
        let src = kernel_source();
        assert!(!src.contains('@'), "unsubstituted placeholder");
        assert!(src.contains(&format!("#define TOKEN_TILE {TOKEN_TILE}")));
        assert!(src.contains(&format!("#define MAX_HEAD_DIM {MAX_HEAD_DIM}")));
        assert!(src.contains(&format!("#define MODE_SILU_MUL {MODE_SILU_MUL}")));
        assert_eq!(
            QBLOCK, 32,
            "the matmul maps one lane to one element of a quant block"
        );
        assert_eq!(MAX_HEAD_DIM % 32, 0);
        // NVRTC takes the source as a C string.
        assert!(!src.contains('\0'));
    }

    #[test]
    fn source_is_balanced() {
        let src = kernel_source();
        for (open, close) in [('{', '}'), ('(', ')'), ('[', ']')] {
            let o = src.matches(open).count();
            let c = src.matches(close).count();
            assert_eq!(o, c, "unbalanced {open}{close}");
        }
    }

    #[test]
    fn ptxas_reports_parse_into_per_kernel_resources() {
        let log = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'argmax_rows' for 'sm_90'
ptxas info    : Function properties for argmax_rows
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 16 registers, used 1 barriers, 256 bytes smem
ptxas info    : Compile time = 19.313 ms
ptxas info    : Compiling entry function 'qkv_rope_q4_1_f16' for 'sm_90'
ptxas info    : Function properties for qkv_rope_q4_1_f16
ptxas         .     32 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 112 registers, used 1 barriers, 32 bytes cumulative stack size, 128 bytes smem
";
        let r = parse_ptxas_report(log);
        assert_eq!(
            r,
            vec![
                KernelResources {
                    name: "argmax_rows".into(),
                    registers: 16,
                    stack_bytes: 0,
                    spill_bytes: 0
                },
                KernelResources {
                    name: "qkv_rope_q4_1_f16".into(),
                    registers: 112,
                    stack_bytes: 32,
                    spill_bytes: 20
                },
            ]
        );
        assert!(parse_ptxas_report("").is_empty());
    }

    #[test]
    fn options_target_the_device() {
        let o = nvrtc_options((9, 0), "sm");
        assert_eq!(o[0], "--gpu-architecture=sm_90");
        assert!(o.contains(&"--ftz=false".to_string()));
        assert_eq!(
            nvrtc_options((8, 6), "compute")[0],
            "--gpu-architecture=compute_86"
        );
    }
}
