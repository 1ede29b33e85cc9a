#!/bin/bash
# Rough A/B of llama_cpp.server CPU per generated token, attached (llmprof attach, wire probe on) vs detached.
# Expects `python -m llama_cpp.server --port 18431` running (servers venv of `cargo xtask setup`); run as root.
ROOT=$(cd "$(dirname "$0")/.." && pwd)
V=~/.cache/llmprof/venvs/servers; P=$(pgrep -f "llama_cpp.server --model" | head -1)
cpu() { awk '{print $14+$15}' /proc/$P/stat; }
for r in 1 2 3 4; do
 for mode in detached attached; do
  if [ $mode = attached ]; then $ROOT/target/debug/llmprof attach --pid $P -o /tmp/ab-$r.perfetto-trace --gpu-sample-interval 0 > /dev/null 2>/tmp/ab.err & L=$!; sleep 4; fi
  c0=$(cpu); chrt -f 10 $V/bin/python $ROOT/tests/py/wire_client.py --base-url http://localhost:18431/v1 --requests 3 --max-tokens 32 --out /tmp/ab.json; c1=$(cpu)
  tok=$(python3 -c "import json; print(sum(r['chunks'] for r in json.load(open('/tmp/ab.json'))))")
  if [ $mode = attached ]; then kill -INT $L; wait $L; fi
  echo "$r $mode ticks=$((c1-c0)) tokens=$tok ms_per_token=$(python3 -c "print(round(($c1-$c0)*10/$tok,3))")"
 done
done
