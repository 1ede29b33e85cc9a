#!/bin/bash
# System calls per generated token of llmserve under load, counted by the kernel's raw_syscalls
# tracepoint through `perf stat` (root), with the decode rate of the same round.
#
# usage: sudo tools/bench/engine_syscalls.sh [LLMSERVE] [THREADS] [CONCURRENCY] [ROUNDS]
#   LLMSERVE defaults to target/release/llmserve (cargo build --release -p inference), THREADS 2, CONCURRENCY 1,
#   ROUNDS 3; the model is the default one (cargo xtask fetch-model). Each round: CONCURRENCY concurrent
#   non-streaming chat completions of 128 greedy tokens; prints tokens/s and system calls per token.
set -euo pipefail
BIN=${1:-target/release/llmserve}; T=${2:-2}; C=${3:-1}; R=${4:-3}
MODEL=${LLMSERVE_MODEL:-$HOME/.cache/llmprof/models/SmolLM2-135M-Instruct.Q4_1.gguf}
DIR=$(mktemp -d)
"$BIN" --model "$MODEL" --port 0 --threads "$T" --max-num-seqs 32 >"$DIR/out" 2>"$DIR/err" &
PID=$!
trap 'kill $PID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 300); do grep -q listening "$DIR/out" && break; sleep 0.2; done
PORT=$(grep -o 'listening on http://[^ ]*' "$DIR/out" | sed 's/.*://')
req() {
  curl -sf "localhost:$PORT/v1/chat/completions" -H 'content-type: application/json' \
    -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Write a long story about a robot who learns to paint.\"}],\"max_tokens\":$1,\"temperature\":0}" |
    python3 -c 'import sys,json; print(json.load(sys.stdin)["usage"]["completion_tokens"])'
}
req 8 >/dev/null
for r in $(seq "$R"); do
  perf stat -e raw_syscalls:sys_enter -p "$PID" -o "$DIR/perf" &
  SP=$!
  sleep 0.3
  START=$(date +%s.%N)
  PIDS=""
  for c in $(seq "$C"); do req 128 >"$DIR/n$c" & PIDS="$PIDS $!"; done
  # shellcheck disable=SC2086
  wait $PIDS
  END=$(date +%s.%N)
  kill -INT "$SP"; wait "$SP" || true
  N=$(cat $(seq -f "$DIR/n%g" "$C") | paste -sd+ | bc)
  SC=$(awk '/raw_syscalls/ {gsub(",", "", $1); print $1}' "$DIR/perf")
  python3 -c "print(f'round $r: concurrency $C: {$N} tokens, {$N/($END-$START):.1f} tok/s, {$SC} syscalls = {$SC/$N:.1f} per token')"
done
