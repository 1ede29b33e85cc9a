//! `llmserve --device cuda|auto` as a user meets it, with or without a GPU: the real binary on a tiny model.
//!
//! Where no GPU is usable (no NVIDIA driver, or a build without the `cuda` feature), `--device cuda` must exit
//! at once with a message that says why and what to do, and `--device auto` must serve on the CPU after saying
//! why in one line. Where a GPU and a `cuda` build meet, both must serve on the GPU and answer a request.

#![allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]

mod serve_common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use serve_common::{Server, tiny_model};

/// Whether this machine has an NVIDIA kernel driver (the CUDA backend can only start where it does).
fn nvidia_driver_present() -> bool {
    std::path::Path::new("/proc/driver/nvidia").exists()
}

fn gpu_usable() -> bool {
    cfg!(feature = "cuda") && nvidia_driver_present()
}

#[test]
fn device_cuda_without_a_usable_gpu_fails_with_the_reason() {
    if gpu_usable() {
        let s = Server::start(
            &tiny_model(),
            &["--device", "cuda", "--served-model-name", "tiny"],
        );
        assert!(s.stderr().contains("backend cuda on "), "{}", s.stderr());
        let r = s.post_json(
            "/v1/completions",
            &json!({"model": "tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_llmserve"))
        .arg("--model")
        .arg(tiny_model())
        .args(["--port", "0", "--device", "cuda"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("llmserve --device cuda kept running without a GPU");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!status.success(), "exit status {status}; stderr:\n{stderr}");
    assert!(!stdout.contains("listening on"), "it served anyway:\n{stdout}");
    assert!(
        !stderr.contains("panicked"),
        "a panic instead of an error:\n{stderr}"
    );
    assert!(stderr.contains("--device cuda:"), "{stderr}");
    assert!(
        stderr.contains("--device cpu"),
        "the message says what to do instead:\n{stderr}"
    );
    if cfg!(feature = "cuda") {
        assert!(
            stderr.contains("libcuda.so.1"),
            "names the missing driver library:\n{stderr}"
        );
    } else {
        assert!(
            stderr.contains("--features cuda"),
            "says how to build with CUDA:\n{stderr}"
        );
    }
}

#[test]
fn device_auto_serves_on_the_gpu_or_falls_back_to_the_cpu_with_one_line() {
    let s = Server::start(
        &tiny_model(),
        &["--device", "auto", "--served-model-name", "tiny"],
    );
    let stderr = s.stderr();
    if gpu_usable() {
        assert!(stderr.contains("backend cuda on "), "{stderr}");
    } else {
        assert!(stderr.contains("backend cpu with "), "{stderr}");
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("--device auto: CUDA is not usable"))
            .collect();
        assert_eq!(lines.len(), 1, "one line says why:\n{stderr}");
        assert!(lines[0].contains("using the CPU"), "{stderr}");
    }
    let r = s.post_json(
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let m = s.get("/metrics").text();
    assert!(m.contains("llmserve:device_busy_seconds_total{"), "{m}");
}

/// `--device cpu` gives the CPU backend with an f16 KV cache unless f32 is asked for.
#[test]
fn the_cpu_cache_is_f16_unless_f32_is_asked_for() {
    use inference::backend::KvCacheDtype;
    use inference::backend::device::{BackendOptions, DeviceChoice, create_backend};
    use inference::model::Model;

    let path = std::env::temp_dir().join(format!("llmserve-device-{}.gguf", std::process::id()));
    e2e::gguf::write_tiny_gguf(&path, &e2e::gguf::TinyModelSpec::default()).unwrap();
    let model = std::sync::Arc::new(Model::load(&path).unwrap());
    std::fs::remove_file(&path).ok();
    for (dtype, want) in [
        (KvCacheDtype::Auto, "KV cache f16"),
        (KvCacheDtype::F16, "KV cache f16"),
        (KvCacheDtype::F32, "KV cache f32"),
    ] {
        let o = BackendOptions {
            num_blocks: 8,
            block_size: 4,
            threads: 1,
            kv_cache_dtype: dtype,
            enforce_eager: false,
            max_num_seqs: 4,
        };
        let s = create_backend(DeviceChoice::Cpu, model.clone(), &o).unwrap();
        assert_eq!(s.backend.name(), "cpu");
        assert!(s.description.contains(want), "{dtype:?}: {}", s.description);
    }
}
