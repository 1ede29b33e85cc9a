#!/usr/bin/env python3
"""Decode throughput, TTFT and device busy time of a running llmserve (python3 standard library only).

For each concurrency level, N client threads each send streaming requests back to back (fixed max_tokens,
prompts that make the model write on) for --duration seconds, as each sampling profile of --sampling says:

- greedy: /v1/completions with temperature 0 (the default; what earlier runs measured);
- sampled: /v1/completions with --chat-temperature and --chat-top-p (the greedy profile's prompts and endpoint, so
  the two differ only in how tokens are picked);
- chat-greedy: /v1/chat/completions with temperature 0 (the baseline of the chat profiles: same prompts and
  template, so the answers end alike);
- chat: /v1/chat/completions with temperature --chat-temperature (0.8) and top_p --chat-top-p (0.95), what a
  chat client sends;
- openai-default: /v1/chat/completions without temperature or top_p, so the server's default (OpenAI's: 1.0).

With several profiles every level runs each of them in turn (interleaved, so they share the machine's state) and
the summary puts them side by side with each profile's ratio to greedy (for the chat profiles, to chat-greedy when
it runs too). Reported per level and profile:

- decode tokens/s: completion tokens (from each response's usage) per wall-clock second;
- per-request decode tokens/s: (completion_tokens - 1) / (last token time - first token time), median;
- TTFT: time from sending the request to the first streamed text, median and p95;
- server CPU time per token (with --server-pid, on the same machine): the change of the server process's user +
  system time (/proc/PID/stat) over the completion tokens, which a loaded machine disturbs far less than tokens/s;
- device busy: from llmserve's /metrics, the change of llmserve:device_busy_seconds_total (the step records'
  device intervals: CUDA events on the CUDA backend) divided by the change of llmserve:step_seconds_total (host
  time of the steps) -- "how much of each step the device is busy" -- and divided by wall time.

Usage: bench_engine.py --url http://127.0.0.1:8000 [--concurrency 1,32] [--max-tokens 128] [--prompt-repeat 1]
                       [--duration 20] [--sampling greedy,chat,openai-default] [--server-pid PID]
Prints one line per level and a JSON summary (also written to --json PATH when given).
"""

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "The history of the Roman Empire begins with the founding of the city of Rome. In the",
    "Here is a detailed recipe for a traditional French onion soup. First, you",
    "The following is a long essay about the importance of sleep for human health.",
    "Chapter 1. The train left the station at dawn, and as the fields rolled past the window,",
    "To understand how computers work, we must start with the transistor, which",
]


def get(url, path, timeout=10):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read().decode()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"GET {path}: HTTP {r.status}: {body[:300]}")
    return body


def metrics(url):
    """The llmserve/vLLM counters this benchmark reads, summed over label sets."""
    want = {
        "llmserve:device_busy_seconds_total": 0.0,
        "llmserve:step_seconds_total": 0.0,
        "vllm:generation_tokens_total": 0.0,
        "vllm:prompt_tokens_total": 0.0,
    }
    want["steps"] = 0.0
    for line in get(url, "/metrics").splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name == "llmserve:engine_steps_total":
            try:
                want["steps"] += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
            continue
        if name in want:
            try:
                want[name] += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return want


# Sampling profiles: (endpoint, the request fields besides model, prompt/messages, max_tokens and streaming).
PROFILES = ("greedy", "sampled", "chat-greedy", "chat", "openai-default")


def profile_request(profile, chat_temperature=0.8, chat_top_p=0.95):
    """(path, extra body fields) of a sampling profile (see the module doc)."""
    if profile == "greedy":
        return "/v1/completions", {"temperature": 0}
    if profile == "sampled":
        return "/v1/completions", {"temperature": chat_temperature, "top_p": chat_top_p}
    if profile == "chat-greedy":
        return "/v1/chat/completions", {"temperature": 0}
    if profile == "chat":
        return "/v1/chat/completions", {"temperature": chat_temperature, "top_p": chat_top_p}
    if profile == "openai-default":
        return "/v1/chat/completions", {}
    raise ValueError(f"unknown sampling profile {profile!r} (known: {', '.join(PROFILES)})")


def cpu_seconds(pid):
    """User + system CPU time of process `pid` (all its threads), from /proc/PID/stat; None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def one_request(url, model, prompt, max_tokens, timeout, profile="greedy", request=None):
    """Streams one request of a sampling profile; returns (ttft_s, first_to_last_s, completion_tokens,
    prompt_tokens) or raises. `request`: (path, extra fields) from profile_request, default the profile's."""
    u = urllib.parse.urlparse(url)
    path, extra = request or profile_request(profile)
    fields = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if path == "/v1/chat/completions":
        fields["messages"] = [{"role": "user", "content": prompt}]
    else:
        fields["prompt"] = prompt
    fields.update(extra)
    body = json.dumps(fields)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    t0 = time.perf_counter()
    c.request("POST", path, body=body, headers={"content-type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    first = last = None
    tokens = prompt_tokens = None
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(4096)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    continue
                msg = json.loads(data)
                now = time.perf_counter()
                choices = msg.get("choices") or []
                piece = (choices[0].get("text") or (choices[0].get("delta") or {}).get("content")) if choices else None
                if piece:
                    if first is None:
                        first = now
                    last = now
                if msg.get("usage"):
                    tokens = msg["usage"].get("completion_tokens")
                    prompt_tokens = msg["usage"].get("prompt_tokens")
    c.close()
    if first is None:
        first = last = time.perf_counter()
    return first - t0, (last - first), tokens or 0, prompt_tokens or 0


def run_level(url, model, prompts, concurrency, max_tokens, duration, timeout, profile="greedy", request=None,
              server_pid=None):
    results, errors = [], []
    lock = threading.Lock()
    stop_at = time.perf_counter() + duration

    def worker(i):
        k = i
        while time.perf_counter() < stop_at:
            try:
                res = one_request(url, model, prompts[k % len(prompts)], max_tokens, timeout, profile, request)
                with lock:
                    results.append(res)
            except Exception as e:  # noqa: BLE001 -- reported below
                with lock:
                    errors.append(str(e))
                time.sleep(0.1)
            k += 1

    m0 = metrics(url)
    cpu0 = cpu_seconds(server_pid) if server_pid else None
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu1 = cpu_seconds(server_pid) if server_pid else None
    m1 = metrics(url)
    d = {k: m1[k] - m0[k] for k in m0}
    tokens = sum(r[2] for r in results)
    ttfts = sorted(r[0] for r in results)
    per_req = [(r[2] - 1) / r[1] for r in results if r[2] > 1 and r[1] > 0]
    step_s = d["llmserve:step_seconds_total"]
    dev_s = d["llmserve:device_busy_seconds_total"]
    out = {
        "concurrency": concurrency,
        "profile": profile,
        "requests": len(results),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "wall_s": round(wall, 3),
        "completion_tokens": tokens,
        "decode_tokens_per_s": round(tokens / wall, 1) if wall > 0 else 0.0,
        "engine_generation_tokens": d["vllm:generation_tokens_total"],
        "mean_completion_tokens": round(tokens / len(results), 1) if results else 0.0,
        "mean_prompt_tokens": round(sum(r[3] for r in results) / len(results), 1) if results else 0.0,
        "per_request_decode_tokens_per_s_median": round(statistics.median(per_req), 1) if per_req else None,
        "ttft_s_median": round(statistics.median(ttfts), 4) if ttfts else None,
        "ttft_s_p95": round(ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))], 4) if ttfts else None,
        "engine_steps": d["steps"],
        "mean_step_ms": round(1e3 * step_s / d["steps"], 3) if d["steps"] > 0 else None,
        "mean_tokens_per_step": round(d["vllm:generation_tokens_total"] / d["steps"], 2) if d["steps"] > 0 else None,
        "step_seconds": round(step_s, 3),
        "device_busy_seconds": round(dev_s, 3),
        "device_busy_fraction_of_steps": round(dev_s / step_s, 3) if step_s > 0 else None,
        "device_busy_fraction_of_wall": round(dev_s / wall, 3) if wall > 0 else None,
        "server_cpu_s": round(cpu1 - cpu0, 3) if cpu0 is not None and cpu1 is not None else None,
        "server_cpu_ms_per_token": round(1e3 * (cpu1 - cpu0) / tokens, 3)
        if cpu0 is not None and cpu1 is not None and tokens else None,
    }
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", help="served model name (default: the first of /v1/models)")
    ap.add_argument("--concurrency", default="1,32", help="comma-separated levels")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-repeat", type=int, default=1,
                    help="each prompt repeated this many times (about 17 tokens each): prefill-heavy loads")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per level")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, s")
    ap.add_argument("--rounds", type=int, default=1, help="runs of every level; medians and ranges reported")
    ap.add_argument("--json", help="also write the summary here")
    ap.add_argument("--sampling", default="greedy",
                    help="comma-separated sampling profiles run at every level: greedy (completions, temperature 0), "
                         "sampled (completions, --chat-temperature, --chat-top-p), "
                         "chat-greedy (chat endpoint, temperature 0), chat (chat endpoint, --chat-temperature, "
                         "--chat-top-p), openai-default (chat endpoint, the server's default temperature)")
    ap.add_argument("--chat-temperature", type=float, default=0.8)
    ap.add_argument("--chat-top-p", type=float, default=0.95)
    ap.add_argument("--server-pid", type=int, help="the server's pid (same machine): report its CPU time per token")
    a = ap.parse_args()
    profiles = [x.strip() for x in a.sampling.split(",") if x.strip()]
    requests = {p: profile_request(p, a.chat_temperature, a.chat_top_p) for p in profiles}

    model = a.model or json.loads(get(a.url, "/v1/models"))["data"][0]["id"]
    # Warm-up: one short request (first-step costs such as buffer growth are not measured).
    prompts = [" ".join([p] * max(1, a.prompt_repeat)) for p in PROMPTS]
    for p in profiles:
        one_request(a.url, model, prompts[0], 8, a.timeout, p, requests[p])
    summary = {"url": a.url, "model": model, "max_tokens": a.max_tokens, "rounds": a.rounds,
               "sampling": {p: {"path": requests[p][0], **requests[p][1]} for p in profiles}, "levels": []}
    levels = [int(x) for x in a.concurrency.split(",") if x.strip()]
    for rnd in range(max(1, a.rounds)):
        for level, profile in [(lv, p) for lv in levels for p in profiles]:
            r = run_level(a.url, model, prompts, level, a.max_tokens, a.duration, a.timeout, profile,
                          requests[profile], a.server_pid)
            r["round"] = rnd + 1
            summary["levels"].append(r)
            tag = f" {profile}" if len(profiles) > 1 else ""
            print(
                f"round {rnd + 1} concurrency {level:3d}{tag}: {r['decode_tokens_per_s']:8.1f} tokens/s decode "
                f"({r['requests']} requests, {r['mean_prompt_tokens']} prompt and "
                f"{r['mean_completion_tokens']} completion tokens each, "
                f"{r['per_request_decode_tokens_per_s_median']} tokens/s per request); "
                f"TTFT median {r['ttft_s_median']} s p95 {r['ttft_s_p95']} s; "
                f"{r['engine_steps']:.0f} steps of {r['mean_step_ms']} ms, {r['mean_tokens_per_step']} tokens/step; "
                f"device busy {r['device_busy_fraction_of_steps']} of step time, "
                f"{r['device_busy_fraction_of_wall']} of wall time; "
                f"server CPU {r['server_cpu_ms_per_token']} ms/token; errors {r['errors']}",
                flush=True,
            )
            if r["errors"]:
                print(f"  first error: {r['first_error']}", file=sys.stderr)
    summary["medians"] = []
    for level, profile in [(lv, p) for lv in levels for p in profiles]:
        runs = [lv for lv in summary["levels"] if lv["concurrency"] == level and lv["profile"] == profile]
        tps = [lv["decode_tokens_per_s"] for lv in runs]
        steps = [lv["mean_step_ms"] for lv in runs if lv["mean_step_ms"] is not None]
        cpu = [lv["server_cpu_ms_per_token"] for lv in runs if lv.get("server_cpu_ms_per_token") is not None]
        ttft = [lv["ttft_s_median"] for lv in runs if lv["ttft_s_median"] is not None]
        m = {
            "concurrency": level,
            "profile": profile,
            "runs": len(runs),
            "decode_tokens_per_s_median": statistics.median(tps),
            "decode_tokens_per_s_min": min(tps),
            "decode_tokens_per_s_max": max(tps),
            "mean_step_ms_median": statistics.median(steps) if steps else None,
            "ttft_s_median_of_medians": statistics.median(ttft) if ttft else None,
            "server_cpu_ms_per_token_median": statistics.median(cpu) if cpu else None,
            "server_cpu_ms_per_token_min": min(cpu) if cpu else None,
            "server_cpu_ms_per_token_max": max(cpu) if cpu else None,
        }
        summary["medians"].append(m)
        tag = f" {profile}" if len(profiles) > 1 else ""
        print(
            f"concurrency {level:3d}{tag}: median {m['decode_tokens_per_s_median']:.1f} tokens/s over {len(runs)} runs "
            f"[{m['decode_tokens_per_s_min']:.1f}-{m['decode_tokens_per_s_max']:.1f}], step {m['mean_step_ms_median']} ms, "
            f"TTFT {m['ttft_s_median_of_medians']} s"
            + (f", server CPU {m['server_cpu_ms_per_token_median']} ms/token "
               f"[{m['server_cpu_ms_per_token_min']}-{m['server_cpu_ms_per_token_max']}]" if cpu else ""),
            flush=True,
        )
    if len(profiles) > 1:
        # Side by side: each profile's median decode rate and TTFT, and its ratio to greedy at the same level.
        summary["side_by_side"] = []
        print("\nconcurrency " + " ".join(f"{p:>24}" for p in profiles) + "   (median tokens/s [ratio to greedy])")
        for level in levels:
            row = {m["profile"]: m for m in summary["medians"] if m["concurrency"] == level}
            cells, entry = [], {"concurrency": level}
            for p in profiles:
                chat = requests[p][0] == "/v1/chat/completions" and "chat-greedy" in row
                base = row.get("chat-greedy" if chat else "greedy", {}).get("decode_tokens_per_s_median")
                tps = row[p]["decode_tokens_per_s_median"]
                ratio = tps / base if base else None
                entry[p] = {"decode_tokens_per_s_median": tps, "ratio_to_greedy": round(ratio, 3) if ratio else None,
                            "ttft_s_median": row[p]["ttft_s_median_of_medians"]}
                cells.append(f"{tps:>12.1f} [{ratio:.2f}x]" if ratio else f"{tps:>24.1f}")
            summary["side_by_side"].append(entry)
            print(f"{level:>11} " + " ".join(f"{c:>24}" for c in cells), flush=True)
    print(json.dumps(summary, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)
    if any(lv["requests"] == 0 or lv["errors"] for lv in summary["levels"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
