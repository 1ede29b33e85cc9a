#!/usr/bin/env bash
# eBPF cost of an off-CPU stack (issue 13): the sched_switch program's run time per blocking switch of a traced
# thread, with off-CPU stacks (default: stack sampling on) minus without (--no-sample), from the kernel's BPF
# run-time statistics (kernel.bpf_stats_enabled; read from llmprof's own program fds in /proc/PID/fdinfo).
# Target: a thread that sleeps N × 1 ms (llmprof-testee `sleeper`, native) or a CPython loop of time.sleep
# (with the Python walk at the block point).
#
# Usage: sudo tools/bench/offcpu_cost.sh [native|python PYTHON] [SLEEPS]
# Prints, per mode, the program's runs, total ns and ns per traced blocking switch.
set -euo pipefail
cd "$(dirname "$0")/../.."
KIND=${1:-native}
PY=${2:-/root/.pyenv/versions/3.11.7/bin/python3.11}
N=${3:-2000}
BIN=${CARGO_TARGET_DIR:-target}/debug
prev=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
trap 'sysctl -qw kernel.bpf_stats_enabled=$prev' EXIT

sswitch_stats() { # pid of llmprof -> "run_cnt run_time_ns" of llmprof_sswitch
  local best=""
  for f in /proc/$1/fdinfo/*; do
    if grep -q '^prog_type:' "$f" 2>/dev/null; then
      local id; id=$(awk '/^prog_id:/{print $2}' "$f")
      local name; name=$(cat /sys/kernel/debug/bpf/prog_$id 2>/dev/null || true)
      # the sched_switch program is the one with the most runs of the tracepoint programs
      local cnt t; cnt=$(awk '/^run_cnt:/{print $2}' "$f"); t=$(awk '/^run_time_ns:/{print $2}' "$f")
      echo "$cnt $t"
    fi
  done | sort -n | tail -1
}

run() { # extra attach args...
  local out; out=$(mktemp -d)
  if [ "$KIND" = native ]; then
    mkfifo "$out/in"; "$BIN/llmprof-testee" < "$out/in" > "$out/t.out" & local tp=$!
    exec 3>"$out/in"
  else
    "$PY" -c "import time
time.sleep(3)
for _ in range($N): time.sleep(0.001)
time.sleep(30)" & local tp=$!
  fi
  sleep 0.5
  "$BIN/llmprof" attach --pid "$tp" -d 60s -o "$out/t.perfetto-trace" "$@" > "$out/attach.log" 2>&1 & local lp=$!
  until grep -q "probes live" "$out/attach.log"; do sleep 0.1; done
  local before; before=$(sswitch_stats $lp)
  if [ "$KIND" = native ]; then echo "sleeper $N 1" >&3; until grep -q "sleeper done" "$out/t.out"; do sleep 0.1; done
  else sleep $((N / 700 + 4)); fi
  local after; after=$(sswitch_stats $lp)
  kill -INT $lp; wait $lp || true
  [ "$KIND" = native ] && { echo exit >&3; exec 3>&-; }
  kill $tp 2>/dev/null || true; wait $tp 2>/dev/null || true
  read -r c0 t0 <<<"$before"; read -r c1 t1 <<<"$after"
  echo "$* runs $((c1 - c0)) ns $((t1 - t0)) offcpu_stacks $(grep -o 'offcpu_stack [0-9]*' "$out/attach.log" | awk '{print $2}')"
  rm -rf "$out"
}
run --no-sample
run
