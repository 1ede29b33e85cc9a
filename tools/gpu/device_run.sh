#!/usr/bin/env bash
# One session on a lent GPU machine (no Rust, no network), from the repository root there, in two calls (one
# transfer carries at most 64 MiB; the bundle and the 94 MiB model need two):
#   tools/gpu/device_run.sh stage           carries gpu-carry/a (the bundle, gzipped, and model.part1): both go
#                                           to /tmp/llmprof-gpu, which stays while the machine is held
#   tools/gpu/device_run.sh run OUT_DIR     carries gpu-carry/b (model.part2): joins the model, runs the checks
#   tools/gpu/device_run.sh bench OUT_DIR   instead of run (or after it, while the machine is held): what attaching
#                                           costs (tools/gpu/bench_attach.py, ~7 min), its summary in OUT_DIR
# `tools/gpu/device_run.sh split [MODEL]` (here, on the build machine, after tools/gpu/build_bundle.sh) packs
# target/gpu-bundle and cuts the default model into gpu-carry/a and gpu-carry/b.
# SKIP_TORCH=1 skips the PyTorch part. Runs the engine's CUDA checks (tools/gpu/run_gpu_checks.sh: GPU tests,
# Paris over HTTP, benchmarks, llmprof attach to the CUDA engine) and llmprof against PyTorch
# (tools/gpu/check_torch.sh), then packs every log and trace into OUT_DIR/results.tgz with the summaries beside it.
set -u
STAGE=/tmp/llmprof-gpu
case "${1:-}" in
split)
    MODEL=${2:-$HOME/.cache/llmprof/models/SmolLM2-135M-Instruct.Q4_1.gguf}
    mkdir -p gpu-carry/a gpu-carry/b
    half=$(( $(stat -c %s "$MODEL") / 2 ))
    head -c "$half" "$MODEL" >gpu-carry/a/model.part1
    tar czf gpu-carry/a/bundle.tgz -C target gpu-bundle
    tail -c +"$((half + 1))" "$MODEL" >gpu-carry/b/model.part2
    ls -l gpu-carry/a gpu-carry/b
    ;;
stage)
    mkdir -p "$STAGE"
    tar xzf gpu-carry/a/bundle.tgz -C "$STAGE"
    cp gpu-carry/a/model.part1 "$STAGE/"
    ls -l "$STAGE" "$STAGE/gpu-bundle"
    nvidia-smi -L
    ;;
run | bench)
    OUT=${2:?usage: device_run.sh run|bench OUT_DIR}
    R=/tmp/gpu-results
    rm -rf "$R"; mkdir -p "$R"
    {
        date -u; uname -a; nvidia-smi -L
        echo "--- BTF / tracefs"; ls -l /sys/kernel/btf/vmlinux; mount | grep -E 'tracefs|debugfs'
        echo "--- libraries"; ldconfig -p | grep -E 'libcuda|nvidia-ml|nvrtc'
    } >"$R/00-host.txt" 2>&1
    cat "$R/00-host.txt"
    MODEL=$STAGE/SmolLM2-135M-Instruct.Q4_1.gguf
    if [ -f "$MODEL" ]; then
        echo "model already joined"
    elif [ -f "$STAGE/model.part1" ] && [ -f gpu-carry/b/model.part2 ]; then
        cat "$STAGE/model.part1" gpu-carry/b/model.part2 >"$MODEL"
        sha256sum "$MODEL" | tee "$R/model.sha256"
    else
        echo "model parts missing: the checks that need the model are skipped" | tee "$R/model.sha256"
    fi
    if [ "$1" = bench ]; then
        # Detached / default / --gpu-kernels all / off, interleaved, on llmserve c1 and c32 and a PyTorch loop;
        # bounded so the copy below always runs inside the device call's limit (600 s).
        B=$STAGE/gpu-bundle
        timeout "${BENCH_TIMEOUT:-540}" python3 "$B/bench_attach.py" --llmprof "$B/llmprof" --llmserve "$B/llmserve" \
            --model "$MODEL" --out "$R/attach" --rounds "${ROUNDS:-3}" --duration "${BENCH_DURATION:-6}" \
            2>&1 | tee "$R/attach-console.log"
        mkdir -p "$OUT"
        cp "$R/attach/attach.txt" "$R/attach/attach.json" "$R/attach-console.log" "$OUT/" 2>/dev/null
        ls -l "$OUT"
        exit 0
    fi
    # Bounded so that the packing below always runs inside the device call's limit (600 s): CHECKS_TIMEOUT s.
    BENCH_DURATION=${BENCH_DURATION:-6} BENCH_ROUNDS=${BENCH_ROUNDS:-2} timeout "${CHECKS_TIMEOUT:-500}" \
        bash "$STAGE/gpu-bundle/run_gpu_checks.sh" "$STAGE/gpu-bundle" "$MODEL" \
        "$R/engine" 2>&1 | tee "$R/engine-console.log"
    [ "${SKIP_TORCH:-0}" = 1 ] || timeout 240 bash tools/gpu/check_torch.sh "$STAGE/gpu-bundle/llmprof" "$R/torch" \
        2>&1 | tee "$R/torch-console.log"
    mkdir -p "$OUT"
    # Traces stay behind (tens of MB); their reports are in the logs.
    tar czf "$OUT/results.tgz" --exclude='*.perfetto-trace' -C /tmp gpu-results
    cp "$R/engine/summary.txt" "$OUT/engine-summary.txt" 2>/dev/null
    cp "$R/torch-console.log" "$OUT/torch-console.txt" 2>/dev/null
    ls -l "$OUT"
    ;;
*)
    echo "usage: device_run.sh split [MODEL] | stage | run OUT_DIR | bench OUT_DIR" >&2
    exit 2
    ;;
esac
