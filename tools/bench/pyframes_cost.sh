#!/usr/bin/env bash
# Per-sample cost of Python frames: llmprof's eBPF walker vs py-spy, on the same target
# (profiler-user/tests/fixtures/python/burn.py, f -> g -> h burning CPU), at 99 Hz.
# Usage (root): tools/bench/pyframes_cost.sh [PYTHON] [SECONDS] [PY_SPY]
# Prints, per run: samples, the walker's in-kernel ns per run (kernel.bpf_stats_enabled), llmprof's and
# py-spy's own CPU ms per sample. Results and how they were read: docs/lab/stacks-threads-wire.md, "Python frames".
set -euo pipefail
PY=${1:-/root/.pyenv/versions/3.11.7/bin/python3.11}
SECS=${2:-10}
PYSPY=${3:-py-spy}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LLMPROF=${LLMPROF:-$ROOT/target/debug/llmprof}
BURN=$ROOT/profiler-user/tests/fixtures/python/burn.py
OUT=$(mktemp -d)
cpu_ms() { awk '{print ($14 + $15) * 1000 / '"$(getconf CLK_TCK)"'}' "/proc/$1/stat"; }

"$PY" "$BURN" chain > /dev/null & TARGET=$!
trap 'kill $TARGET 2>/dev/null || true' EXIT
sleep 0.5

old=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
"$LLMPROF" attach --pid "$TARGET" -d "${SECS}s" -o "$OUT/t.pftrace" > "$OUT/llmprof.err" 2>&1 & L=$!
sleep $((SECS - 1))
fd=$(for f in /proc/$L/fdinfo/*; do grep -q "^prog_type:.*" "$f" 2>/dev/null && grep -q "prog_tag" "$f" && echo "$f"; done |
  while read -r f; do n=$(readlink "/proc/$L/fd/$(basename "$f")"); [[ $n == anon_inode:bpf-prog ]] && echo "$f"; done |
  xargs grep -l "^prog_type:\s*7$" 2>/dev/null | head -1 || true)
if [[ -n $fd ]]; then
  rt=$(awk '/run_time_ns/ {print $2}' "$fd"); rc=$(awk '/run_cnt/ {print $2}' "$fd")
fi
lcpu=$(cpu_ms $L)
wait $L || true
sysctl -qw kernel.bpf_stats_enabled="$old"
hits=$(awk '/probe py_stack:/ {gsub(",", ""); print $4}' "$OUT/llmprof.err")
echo "llmprof: py_stack samples $hits; perf_event program runs ${rc:-?} (all CPUs, all processes), in-kernel ns/run $(( ${rt:-0} / (${rc:-1} + 0) )), ns per Python sample $(( ${rt:-0} / (${hits:-1} + 0) )); llmprof CPU ${lcpu} ms for the session"

for mode in "" "--nonblocking"; do
  "$PYSPY" record --rate 99 -d "$SECS" --pid "$TARGET" -f raw -o "$OUT/spy.txt" $mode > "$OUT/spy.out" 2>&1 & S=$!
  sleep $((SECS - 1)); scpu=$(cpu_ms $S); wait $S || true
  n=$(awk '{s += $NF} END {print s}' "$OUT/spy.txt")
  echo "py-spy ${mode:-blocking}: samples $n, py-spy CPU ${scpu} ms in $((SECS - 1)) s = $(awk -v c="$scpu" -v n="$n" -v s="$SECS" 'BEGIN {printf "%.0f", c * 1000 / (n * (s - 1) / s)}') us per sample"
done
rm -rf "$OUT"
