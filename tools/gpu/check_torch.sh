#!/usr/bin/env bash
# llmprof on a real GPU against PyTorch (run as root on the GPU machine, from the repository root).
#
#   tools/gpu/check_torch.sh PATH/TO/llmprof OUTDIR
#
# 1. doctor + a 5 s attach to tools/gpu/torch_matmul.py (CUDA initialized before the attach);
# 2. a 15 s attach to a torch_matmul.py that loads CUDA 2 s after the attach (libcuda found on a later tick).
# Writes into OUTDIR: nvidia-smi.txt, torch*.out/err, doctor.txt, attach*.txt/err, torch*.perfetto-trace;
# prints the attach summaries. Check the traces with tools/gpu/check_trace.sh (node + trace processor).
set -u
LLMPROF=${1:?usage: check_torch.sh LLMPROF OUTDIR}
OUT=${2:?usage: check_torch.sh LLMPROF OUTDIR}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
wait_ready() { # FILE PID: 0 once FILE has the `ready` line, 1 when PID died or after 120 s
    for _ in $(seq 1 240); do
        grep -q '^ready' "$1" 2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.5
    done
    return 1
}

python3 "$HERE/torch_matmul.py" --seconds 20 > "$OUT/torch.out" 2> "$OUT/torch.err" &
TPID=$!
if ! wait_ready "$OUT/torch.out" $TPID; then
    echo "torch_matmul.py did not start:"; cat "$OUT/torch.err"; kill $TPID 2>/dev/null; exit 1
fi
head -1 "$OUT/torch.out"
"$LLMPROF" doctor --pid $TPID > "$OUT/doctor.txt" 2>&1
"$LLMPROF" attach --pid $TPID -d 5s -o "$OUT/torch.perfetto-trace" > "$OUT/attach.txt" 2> "$OUT/attach.err"
echo "attach exit code $?" >> "$OUT/attach.txt"
kill $TPID 2>/dev/null; wait $TPID 2>/dev/null

python3 "$HERE/torch_matmul.py" --seconds 6 --lazy 2 > "$OUT/torch-lazy.out" 2> "$OUT/torch-lazy.err" &
LPID=$!
wait_ready "$OUT/torch-lazy.out" $LPID || { echo "lazy torch_matmul.py did not start"; cat "$OUT/torch-lazy.err"; }
"$LLMPROF" attach --pid $LPID -d 15s -o "$OUT/torch-lazy.perfetto-trace" > "$OUT/attach-lazy.txt" 2> "$OUT/attach-lazy.err"
echo "attach exit code $?" >> "$OUT/attach-lazy.txt"
wait $LPID 2>/dev/null

echo "== doctor (GPU lines)"; grep -E 'nvml|libcuda' "$OUT/doctor.txt"
# The first attach ran with --gpu-kernels auto: with libllmprof_cupti.so next to llmprof, the kernels are there.
echo "== kernels (report, CUDA before attach)"; grep 'GPU kernels' "$OUT/attach.err"
"$LLMPROF" report "$OUT/torch.perfetto-trace" 2>&1 | sed -n '/[Kk]ernel/,+12p' | head -20
echo "== attach (CUDA before attach)"; cat "$OUT/attach.txt"; tail -3 "$OUT/attach.err"
echo "== attach (CUDA loaded after attach)"; cat "$OUT/attach-lazy.txt"; tail -3 "$OUT/attach-lazy.err"
