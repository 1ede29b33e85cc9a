#!/bin/bash
# The per-chunk cost of llmprof's GPU activity handoff uprobe (llmprof_gpu), without a GPU: the stand-in helper
# and testee of profiler-user/tests/gpu_activity.rs hand over chunks of 145 kernel records (16328 bytes, near
# GPU_CHUNK_MAX) 200 us apart; the testee prints the mean ns per hand-over call, 3 runs detached, 3 attached, 3
# detached again. Needs root and cc. Usage: tools/bench/gpu_handoff.sh [path/to/llmprof] (default target/debug).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
LLMPROF=${1:-$root/target/debug/llmprof}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fx=$root/profiler-user/tests/fixtures
cc -O1 -shared -fPIC -o "$dir/libllmprof_cupti.so" "$fx/gpu_helper.c"
cc -O1 -o "$dir/gpu_testee" "$fx/gpu_testee.c" -L"$dir" -lllmprof_cupti -Wl,-rpath,"$dir"
coproc T { "$dir/gpu_testee"; }
read -r line <&"${T[0]}"
pid=${line#ready }
run() { for _ in 1 2 3; do echo "bench 2000 200" >&"${T[1]}"; read -r r <&"${T[0]}"; echo "$1 ns/chunk ${r#bench }"; done; }
run detached
"$LLMPROF" attach --pid "$pid" -d 15s --gpu-sample-interval 0 --no-sample -o "$dir/bench.perfetto-trace" \
    >"$dir/attach.out" 2>"$dir/attach.err" &
ap=$!
for _ in $(seq 1 200); do grep -q "probes live" "$dir/attach.err" 2>/dev/null && break; sleep 0.1; done
sleep 1
run attached
wait $ap || true
run detached-after
echo exit >&"${T[1]}"
grep -E "GPU activity|probe cuda" "$dir/attach.out"
