#!/usr/bin/env bash
# GPU checks of llmserve's CUDA backend, for a GPU machine without Rust: everything is built elsewhere
# (tools/gpu/build_bundle.sh) and carried here as a bundle folder.
#
# Usage: tools/gpu/run_gpu_checks.sh BUNDLE_DIR MODEL_GGUF [OUT_DIR]
#   BUNDLE_DIR has: llmserve (built with --features cuda), cuda_backend (the test binary), bench_engine.py,
#               and optionally llmprof (the profiler CLI; used when running as root).
#   MODEL_GGUF is SmolLM2-135M-Instruct.Q4_1.gguf.
#   OUT_DIR (default ./gpu-results) receives every log, the benchmark JSON and, with llmprof, a trace.
#
# Steps (each logged to OUT_DIR/NN-*.log; a summary at the end and in OUT_DIR/summary.txt):
#   1. environment: nvidia-smi, NVRTC libraries found;
#   2. the ignored GPU tests of inference/tests/cuda_backend/ (CPU vs GPU logits on tiny models of every
#      type, "Paris" on the default model, CUDA-event step times on the host clock, tokens drawn on the device
#      against sampling.rs's rule (chi-square) and the host sampler, tensor-core prefill of 512 tokens within the
#      f16 tolerance and its time, decode throughput greedy and sampled);
#   3. llmserve --device cuda: startup log, a chat request answered with "Paris", a seeded sampled chat request
#      (temperature 0.8, top_p 0.95) giving the same text twice, log-probabilities, /metrics;
#   4. tools/gpu/bench_engine.py: decode tokens/s at concurrency 1 and 32 (BENCH_ROUNDS runs each, medians),
#      greedy and sampled side by side (completions at temperature 0; chat at temperature 0, at 0.8 with top_p
#      0.95, and at OpenAI's default 1.0), the sampled/greedy ratios (goal >= 0.9), TTFT, device busy fraction;
#      4b: a prompt-heavy load (~510-token prompts, 16 tokens out, concurrency 1 and 8) with the prefill products
#      on tensor cores (the default) and on CUDA cores (LLMSERVE_CUDA_MMA_MIN_TOKENS=0), side by side (TTFT);
#   5. (root and llmprof present) llmprof attach during a short load: a trace with "device (CUDA)" slices,
#      and llmprof report on it;
#   6. llmserve --device auto picks CUDA.
# Exit status: 0 when every step passed.
set -u
BUNDLE=${1:?usage: run_gpu_checks.sh BUNDLE_DIR MODEL_GGUF [OUT_DIR]}
MODEL=${2:?usage: run_gpu_checks.sh BUNDLE_DIR MODEL_GGUF [OUT_DIR]}
OUT=${3:-./gpu-results}
BENCH_DURATION=${BENCH_DURATION:-15}
BENCH_ROUNDS=${BENCH_ROUNDS:-3}
PORT=${PORT:-18231}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUNDLE=$(cd "$BUNDLE" && pwd)
if [ -f "$MODEL" ]; then
    MODEL=$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")
    HAVE_MODEL=1
else
    echo "WARNING: model $MODEL not found: only the tiny-model GPU tests run (no Paris, no server, no benchmark)"
    HAVE_MODEL=0
fi
RESULTS=()
FAILED=0
SERVER_PID=

step() { echo; echo "=== $1"; }
record() { # name status detail
    RESULTS+=("$(printf '%-34s %-4s %s' "$1" "$2" "$3")")
    [ "$2" = ok ] || [ "$2" = skip ] || FAILED=1
}
stop_server() {
    if [ -n "$SERVER_PID" ]; then
        kill "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
        SERVER_PID=
    fi
}
trap stop_server EXIT
# Starts llmserve with the given args; waits for "listening on" (max 120 s). Log: $1.
start_server() {
    local log=$1; shift
    "$BUNDLE/llmserve" --model "$MODEL" --port "$PORT" --served-model-name smollm2 "$@" >"$log.stdout" 2>"$log" &
    SERVER_PID=$!
    for _ in $(seq 1 240); do
        grep -q "listening on" "$log.stdout" 2>/dev/null && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || { SERVER_PID=; return 1; }
        sleep 0.5
    done
    return 1
}

[ -x "$BUNDLE/llmserve" ] || { echo "missing $BUNDLE/llmserve"; exit 2; }

step "1. environment"
{
    nvidia-smi || true
    echo "--- NVRTC candidates"
    ldconfig -p | grep -E "libnvrtc|libcuda" || true
    ls -l /usr/local/cuda*/lib64/libnvrtc* 2>/dev/null || true
    python3 - <<'EOF' || true
import glob, site, sys
for s in site.getsitepackages() + [site.getusersitepackages()]:
    for p in sorted(glob.glob(s + "/nvidia/*/lib/libnvrtc*")):
        print(p)
EOF
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
} >"$OUT/01-env.log" 2>&1
head -20 "$OUT/01-env.log"
if nvidia-smi -L >/dev/null 2>&1; then record "gpu present" ok "$(nvidia-smi -L | head -1)"; else record "gpu present" FAIL "nvidia-smi -L failed"; fi

step "2. GPU tests (cuda_backend --ignored)"
if [ -x "$BUNDLE/cuda_backend" ]; then
    FILTER=()
    [ "$HAVE_MODEL" = 1 ] || FILTER=(cuda_logits_match_cpu cuda_step_times cuda_sampling_follows cuda_graph_replay_matches_eager_launches_exactly)
    LLMSERVE_MODEL="$MODEL" timeout 600 "$BUNDLE/cuda_backend" --ignored --nocapture --test-threads 1 \
        "${FILTER[@]}" >"$OUT/02-cuda-tests.log" 2>&1
    rc=$?
    grep -E "^test |test result|agree|answer|tokens/s|anchors|chi-square|largest|panicked" "$OUT/02-cuda-tests.log"
    if [ $rc -eq 0 ]; then record "cuda_backend tests" ok "$(grep 'test result' "$OUT/02-cuda-tests.log")"
    else record "cuda_backend tests" FAIL "exit $rc, see 02-cuda-tests.log"; fi
else
    record "cuda_backend tests" FAIL "no test binary in the bundle"
fi

step "3. llmserve --device cuda: Paris over HTTP"
if [ "$HAVE_MODEL" = 0 ]; then
    record "llmserve on cuda (needs the model)" skip "no model file"
elif start_server "$OUT/03-llmserve-cuda.log" --device cuda; then
    cat "$OUT/03-llmserve-cuda.log"
    python3 - "$PORT" >"$OUT/03-chat.log" 2>&1 <<'EOF'
import json, sys, urllib.request
port = sys.argv[1]
body = json.dumps({"model": "smollm2", "temperature": 0, "max_tokens": 30,
                   "messages": [{"role": "user", "content": "What is the capital of France?"}]}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                             {"content-type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=120))
text = r["choices"][0]["message"]["content"]
print("answer:", repr(text))
m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
for line in m.splitlines():
    if line.startswith(("llmserve:device_busy", "llmserve:step_seconds", "llmserve:engine_steps")):
        print(line)
ok = "Paris" in text
# Sampled on the device: a seed gives the same text twice; the log-probabilities come back.
def chat(extra):
    body = {"model": "smollm2", "max_tokens": 40, "messages": [{"role": "user", "content": "Tell me a story."}]}
    body.update(extra)
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))
sampled = {"temperature": 0.8, "top_p": 0.95, "seed": 42}
a, b = chat(sampled), chat(sampled)
same = a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
print("sampled (seed 42) twice:", repr(a["choices"][0]["message"]["content"][:80]), "same" if same else "DIFFERENT")
lp = chat({"temperature": 0, "logprobs": True, "top_logprobs": 3, "max_tokens": 5})["choices"][0]["logprobs"]
print("logprobs of the first token:", lp["content"][0]["token"], lp["content"][0]["logprob"], [t["token"] for t in lp["content"][0]["top_logprobs"]])
sys.exit(0 if ok and same and len(lp["content"]) == 5 else 1)
EOF
    rc=$?
    cat "$OUT/03-chat.log"
    if [ $rc -eq 0 ]; then record "HTTP chat on cuda (Paris, seeded, logprobs)" ok "$(grep answer "$OUT/03-chat.log")"
    else record "HTTP chat on cuda (Paris, seeded, logprobs)" FAIL "see 03-chat.log"; fi
    if grep -q "backend cuda on" "$OUT/03-llmserve-cuda.log"; then record "startup log names the GPU" ok "$(grep -o 'backend cuda on [^;]*' "$OUT/03-llmserve-cuda.log")"
    else record "startup log names the GPU" FAIL "see 03-llmserve-cuda.log"; fi
    if grep -q "decode as CUDA graphs" "$OUT/03-llmserve-cuda.log"; then record "decode graphs captured" ok "$(grep -o 'decode as CUDA graphs[^)]*)' "$OUT/03-llmserve-cuda.log" | head -1)"
    else record "decode graphs captured" FAIL "see 03-llmserve-cuda.log"; fi

    step "4. benchmark (concurrency 1 and 32, greedy and sampled, $BENCH_ROUNDS rounds)"
    timeout 400 python3 "$BUNDLE/bench_engine.py" --url "http://127.0.0.1:$PORT" --model smollm2 \
        --concurrency 1,32 --max-tokens 128 --duration "$BENCH_DURATION" --rounds "$BENCH_ROUNDS" \
        --sampling greedy,chat-greedy,chat,openai-default --json "$OUT/04-bench.json" >"$OUT/04-bench.log" 2>&1
    rc=$?
    grep -E "^concurrency|error|^ +[0-9]+ +[0-9.]+ \[" "$OUT/04-bench.log"
    if [ $rc -eq 0 ]; then record "benchmark (graphs, f16 KV)" ok "$(grep -E '^concurrency +[0-9]+ (greedy|chat):' "$OUT/04-bench.log" | sed 's/ over .*//' | tr '\n' ';')"
    else record "benchmark (graphs, f16 KV)" FAIL "exit $rc, see 04-bench.log"; fi
    # Sampled decode against greedy (the chat profiles against chat at temperature 0): the goal is 0.9x or more.
    python3 - "$OUT/04-bench.json" >"$OUT/04-ratios.log" 2>&1 <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1])).get("side_by_side") or []
pairs = [(r["concurrency"], p, r[p]["ratio_to_greedy"]) for r in rows for p in ("chat", "openai-default") if p in r]
print("; ".join(f"c{c} {p} {x}x" for c, p, x in pairs))
sys.exit(0 if pairs and all(x is not None and x >= 0.9 for _, _, x in pairs) else 1)
EOF
    rc=$?
    cat "$OUT/04-ratios.log"
    if [ $rc -eq 0 ]; then record "sampled decode >= 0.9x greedy" ok "$(head -1 "$OUT/04-ratios.log")"
    else record "sampled decode >= 0.9x greedy" FAIL "$(head -1 "$OUT/04-ratios.log"), see 04-bench.log"; fi

    step "5. llmprof attach (root only)"
    if [ -x "$BUNDLE/llmprof" ] && [ "$(id -u)" = 0 ]; then
        timeout 60 python3 "$BUNDLE/bench_engine.py" --url "http://127.0.0.1:$PORT" --model smollm2 \
            --concurrency 8 --max-tokens 64 --duration 12 >"$OUT/05-load.log" 2>&1 &
        LOAD=$!
        sleep 1
        timeout 60 "$BUNDLE/llmprof" attach --pid "$SERVER_PID" -d 8s -o "$OUT/cuda.perfetto-trace" \
            --metrics-url "http://127.0.0.1:$PORT/metrics" >"$OUT/05-attach.log" 2>&1
        rc=$?
        wait $LOAD
        "$BUNDLE/llmprof" report "$OUT/cuda.perfetto-trace" >"$OUT/05-report.log" 2>&1
        head -40 "$OUT/05-report.log"
        if [ $rc -eq 0 ] && [ -s "$OUT/cuda.perfetto-trace" ] && grep -aq "device (CUDA)" "$OUT/cuda.perfetto-trace"; then
            record "llmprof trace with CUDA slices" ok "$(stat -c %s "$OUT/cuda.perfetto-trace") bytes"
        else
            record "llmprof trace with CUDA slices" FAIL "exit $rc, see 05-attach.log"
        fi
        # Steps that replayed a decode graph carry the graph_batch arg; the report counts them.
        "$BUNDLE/llmprof" report --json "$OUT/cuda.perfetto-trace" >"$OUT/05-report.json" 2>&1
        g=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["steps"]; print(s["graph_replayed"]["count"], "of", s["count"])' \
            "$OUT/05-report.json" 2>/dev/null || echo "0 of ?")
        if [ "${g%% *}" -gt 0 ] 2>/dev/null; then record "trace marks graph-replayed steps" ok "$g steps"
        else record "trace marks graph-replayed steps" FAIL "$g steps, see 05-report.json"; fi
        # Kernels through the injected CUPTI helper: the report's top kernels must not be empty.
        if [ -f "$BUNDLE/libllmprof_cupti.so" ]; then
            timeout 60 python3 "$BUNDLE/bench_engine.py" --url "http://127.0.0.1:$PORT" --model smollm2 \
                --concurrency 8 --max-tokens 64 --duration 12 >"$OUT/05b-load.log" 2>&1 &
            LOAD=$!
            sleep 1
            timeout 90 "$BUNDLE/llmprof" attach --pid "$SERVER_PID" -d 8s --gpu-kernels on \
                -o "$OUT/kernels.perfetto-trace" >"$OUT/05b-attach.log" 2>&1
            rc=$?
            wait $LOAD
            "$BUNDLE/llmprof" report --json "$OUT/kernels.perfetto-trace" >"$OUT/05b-report.json" 2>&1
            n=$(python3 -c 'import json,sys; k=json.load(open(sys.argv[1])).get("kernels") or {}; print(len(k.get("top") or []))' \
                "$OUT/05b-report.json" 2>/dev/null || echo 0)
            # Where the GPU time goes: the top kernels and how busy the GPU was inside the engine's steps.
            python3 - "$OUT/05b-report.json" <<'PYEOF' 2>&1 | tee "$OUT/05b-kernels.txt"
import json, sys
k = json.load(open(sys.argv[1])).get("kernels") or {}
print(f"kernels {k.get('kernels')} gpu_ms {k.get('gpu_ms')} copies {k.get('copies')} copy_ms {k.get('copy_ms')} lost {k.get('lost')}")
for r in (k.get("top") or [])[:12]:
    print(f"  {r['name'][:60]:<60} n {r['count']:>7} total {r['total_ms']:>9.1f} ms mean {1e3 * r['mean_ms']:>8.2f} us {r['share_pct']:>5.1f} %")
s = dict(k.get("steps") or {})
s.pop("per_step", None)
print("steps:", s)
PYEOF
            if [ $rc -eq 0 ] && [ "$n" -gt 0 ]; then
                record "llmprof --gpu-kernels on: kernels in the report" ok "$n kernel names"
            else
                record "llmprof --gpu-kernels on: kernels in the report" FAIL "exit $rc, $n kernels, see 05b-attach.log"
            fi
        fi
    else
        record "llmprof trace with CUDA slices" skip "needs root and BUNDLE/llmprof"
    fi
else
    cat "$OUT/03-llmserve-cuda.log"
    record "llmserve --device cuda starts" FAIL "see 03-llmserve-cuda.log"
fi
stop_server

# Long prompts: steps of 64 tokens or more run their products on tensor cores (mma::MMA_MIN_TOKENS); the same load
# with them on CUDA cores (LLMSERVE_CUDA_MMA_MIN_TOKENS=0, the engine before tensor cores) gives TTFT before/after.
step "4b. prompt-heavy load: prefill on tensor cores (default) and on CUDA cores"
for cfg in tensor-cores:64 cuda-cores:0; do
    name=${cfg%%:*}
    if [ "$HAVE_MODEL" = 1 ] && LLMSERVE_CUDA_MMA_MIN_TOKENS=${cfg#*:} start_server "$OUT/04b-llmserve-$name.log" --device cuda; then
        timeout 200 python3 "$BUNDLE/bench_engine.py" --url "http://127.0.0.1:$PORT" --model smollm2 \
            --concurrency 1,8 --prompt-repeat 30 --max-tokens 16 --duration "$BENCH_DURATION" --rounds "$BENCH_ROUNDS" \
            --json "$OUT/04b-bench-$name.json" >"$OUT/04b-bench-$name.log" 2>&1
        rc=$?
        grep -E "^concurrency|error" "$OUT/04b-bench-$name.log"
        if [ $rc -eq 0 ]; then record "long prompts, $name" ok "$(grep -E '^concurrency' "$OUT/04b-bench-$name.log" | sed 's/ over .*step/, step/' | tr '\n' ';')"
        else record "long prompts, $name" FAIL "exit $rc, see 04b-bench-$name.log"; fi
    else
        record "long prompts, $name" skip "no model or the server did not start"
    fi
    stop_server
done

step "6. llmserve --device auto picks CUDA"
if [ "$HAVE_MODEL" = 0 ]; then
    record "--device auto picks CUDA" skip "no model file"
elif start_server "$OUT/06-llmserve-auto.log" --device auto && grep -q "backend cuda on" "$OUT/06-llmserve-auto.log"; then
    record "--device auto picks CUDA" ok ""
else
    record "--device auto picks CUDA" FAIL "see 06-llmserve-auto.log"
fi
stop_server

echo
echo "=== summary"
printf '%s\n' "${RESULTS[@]}" | tee "$OUT/summary.txt"
exit $FAILED
