#!/usr/bin/env bash
# Builds what tools/gpu/run_gpu_checks.sh needs on a GPU machine without Rust, into one folder:
# llmserve (release, --features cuda), the cuda_backend test binary, llmprof (release) with its CUPTI helper
# (libllmprof_cupti.so), bench_engine.py, the check script itself, and bench_attach.py with torch_matmul.py (what
# attaching costs: tools/gpu/device_run.sh bench). Usage: tools/gpu/build_bundle.sh [OUT_DIR]   (default: target/gpu-bundle)
# WITH_LLMPROF=0 skips building llmprof (then the trace step of the checks is skipped).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-target/gpu-bundle}
mkdir -p "$OUT"
cargo build --release -p inference --features cuda --bin llmserve
# The test binary's path is printed by cargo as "Executable tests/cuda_backend/main.rs (target/release/deps/...)".
TEST_BIN=$(cargo test --release -p inference --features cuda --test cuda_backend --no-run 2>&1 \
    | sed -n 's/.*Executable tests\/cuda_backend\/main.rs (\(.*\))/\1/p' | tail -1)
[ -x "$TEST_BIN" ] || { echo "cuda_backend test binary not found" >&2; exit 1; }
# Debug info stripped (6 MB instead of 35 MB); the probe symbols live in .dynsym and stay.
strip --strip-debug -o "$OUT/llmserve" target/release/llmserve
strip --strip-debug -o "$OUT/cuda_backend" "$TEST_BIN"
if [ "${WITH_LLMPROF:-1}" = 1 ] && cargo build --release -p llmprof && [ -x target/release/llmprof ]; then
    strip --strip-debug -o "$OUT/llmprof" target/release/llmprof
    # The CUPTI helper `llmprof attach --gpu-kernels` injects; found next to the llmprof binary.
    cargo build --release -p llmprof-cupti --lib
    strip --strip-debug -o "$OUT/libllmprof_cupti.so" target/release/libllmprof_cupti.so
else
    echo "note: llmprof not built; the trace step will be skipped" >&2
fi
cp tools/gpu/bench_engine.py tools/gpu/run_gpu_checks.sh tools/gpu/bench_attach.py tools/gpu/torch_matmul.py "$OUT/"
chmod +x "$OUT"/*.sh "$OUT"/*.py
ls -l "$OUT"
echo "bundle ready: $OUT (run there: ./run_gpu_checks.sh . /path/SmolLM2-135M-Instruct.Q4_1.gguf ./gpu-results)"
