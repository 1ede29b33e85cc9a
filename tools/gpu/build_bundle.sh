#!/usr/bin/env bash
# Builds what tools/gpu/run_gpu_checks.sh needs on a GPU machine without Rust, into one folder:
# llmserve (release, --features cuda), the cuda_backend test binary, llmprof (release), bench_engine.py and the
# check script itself. Usage: tools/gpu/build_bundle.sh [OUT_DIR]   (default: target/gpu-bundle)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-target/gpu-bundle}
mkdir -p "$OUT"
cargo build --release -p inference --features cuda --bin llmserve
# The test binary's path is printed by cargo as "Executable tests/cuda_backend.rs (target/release/deps/...)".
TEST_BIN=$(cargo test --release -p inference --features cuda --test cuda_backend --no-run 2>&1 \
    | sed -n 's/.*Executable tests\/cuda_backend.rs (\(.*\))/\1/p' | tail -1)
[ -x "$TEST_BIN" ] || { echo "cuda_backend test binary not found" >&2; exit 1; }
cp target/release/llmserve "$OUT/llmserve"
cp "$TEST_BIN" "$OUT/cuda_backend"
if cargo build --release -p llmprof 2>/dev/null && [ -x target/release/llmprof ]; then
    cp target/release/llmprof "$OUT/llmprof"
else
    echo "note: llmprof not built; the trace step will be skipped" >&2
fi
cp tools/gpu/bench_engine.py tools/gpu/run_gpu_checks.sh "$OUT/"
chmod +x "$OUT"/*.sh "$OUT"/*.py
ls -l "$OUT"
echo "bundle ready: $OUT (run there: ./run_gpu_checks.sh . /path/SmolLM2-135M-Instruct.Q4_1.gguf ./gpu-results)"
