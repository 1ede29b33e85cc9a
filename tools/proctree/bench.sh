#!/bin/bash
# Process-start cost of the process-tree programs (docs/lab/stacks-threads-wire.md, "Process trees"). As root:
#   tools/proctree/bench.sh [LLMPROF] [N]
# A: detached; B: llmprof attached to an unrelated process (every fork pays the TRACED lookup); C: the loop itself
# traced (each child joins the tree). Three rounds, fork+exit and vfork+exec; prints us per iteration.
set -eu
LL=${1:-target/release/llmprof}
N=${2:-2000}
T=$(mktemp -d)
gcc -O2 -o "$T/forkbench" "$(dirname "$0")/forkbench.c"
for round in 1 2 3; do
  for ex in 0 1; do
    echo "A $ex $("$T/forkbench" "$N" "$ex" 0)"
    sleep 100 & SP=$!
    "$LL" attach --pid "$SP" --gpu-sample-interval 0 --no-cuda -o "$T/b.pftrace" >/dev/null 2>&1 & LP=$!
    sleep 3
    echo "B $ex $("$T/forkbench" "$N" "$ex" 0)"
    kill -INT "$LP"; wait "$LP" || true; kill "$SP"; rm -f "$T/b.pftrace"
    "$T/forkbench" "$N" "$ex" 4 > "$T/c.out" & BP=$!
    "$LL" attach --pid "$BP" --gpu-sample-interval 0 --no-cuda -o "$T/c.pftrace" > "$T/c.summary" 2>/dev/null & LP=$!
    wait "$BP"; sleep 0.5
    echo "C $ex $(cat "$T/c.out")"
    kill -INT "$LP" 2>/dev/null || true; wait "$LP" || true
    grep -E "proc_tree|processes traced" "$T/c.summary" || true
    rm -f "$T/c.pftrace"
  done
done
rm -rf "$T"
