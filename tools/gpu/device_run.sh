#!/usr/bin/env bash
# One session on a lent GPU machine (no Rust, no network), from the repository root there:
#   tools/gpu/device_run.sh OUT_DIR
# Needs, carried from the build machine: target/gpu-bundle (tools/gpu/build_bundle.sh) and the default model split
# in two parts (the model is larger than one transfer may be): a first call carries gpu-carry/a and copies
# model.part1 to /tmp (the repository copy is replaced on the next call, /tmp stays while the machine is held);
# this call carries gpu-carry/b/model.part2. SKIP_TORCH=1 skips the PyTorch part.
# Runs the engine's CUDA checks (tools/gpu/run_gpu_checks.sh: GPU tests, Paris over HTTP, benchmark, llmprof attach
# to the CUDA engine) and llmprof against PyTorch (tools/gpu/check_torch.sh), then packs every log and trace into
# OUT_DIR/results.tgz with the two summaries beside it.
set -u
OUT=${1:?usage: device_run.sh OUT_DIR}
R=/tmp/gpu-results
rm -rf "$R"; mkdir -p "$R"
{
    date -u; uname -a; nvidia-smi -L
    echo "--- BTF / tracefs"; ls -l /sys/kernel/btf/vmlinux; mount | grep -E 'tracefs|debugfs'
    echo "--- libraries"; ldconfig -p | grep -E 'libcuda|nvidia-ml|nvrtc'
    python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())'
} >"$R/00-host.txt" 2>&1
cat "$R/00-host.txt"
MODEL=/tmp/SmolLM2-135M-Instruct.Q4_1.gguf
PART1=/tmp/model.part1
[ -f gpu-carry/a/model.part1 ] && PART1=gpu-carry/a/model.part1
if [ -f "$PART1" ] && [ -f gpu-carry/b/model.part2 ]; then
    cat "$PART1" gpu-carry/b/model.part2 >"$MODEL"
    sha256sum "$MODEL" | tee "$R/model.sha256"
else
    echo "model parts missing: the checks that need the model are skipped" | tee "$R/model.sha256"
fi
BENCH_DURATION=${BENCH_DURATION:-10} bash target/gpu-bundle/run_gpu_checks.sh target/gpu-bundle "$MODEL" "$R/engine" \
    2>&1 | tee "$R/engine-console.log"
[ "${SKIP_TORCH:-0}" = 1 ] || timeout 240 bash tools/gpu/check_torch.sh target/gpu-bundle/llmprof "$R/torch" 2>&1 | tee "$R/torch-console.log"
tar czf "$OUT/results.tgz" -C /tmp gpu-results
cp "$R/engine/summary.txt" "$OUT/engine-summary.txt" 2>/dev/null
cp "$R/torch-console.log" "$OUT/torch-console.txt" 2>/dev/null
ls -l "$OUT"
