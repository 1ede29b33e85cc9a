#!/usr/bin/env python3
"""What `llmprof attach` costs a CUDA server, A/B interleaved, in one command (run as root on the GPU machine).

Modes, in a rotating order each round: detached, the default attach (kernel summaries), `--gpu-kernels all`
(every kernel a slice), `--gpu-kernels off`. Two targets:
- llmserve `--device cuda` (started here on --port) under `bench_engine.py` at each --concurrency level: decode
  tokens/s per mode, median and range over --rounds, the change against the detached median;
- a launch-bound PyTorch loop (`torch_matmul.py --size 256`: small matmuls + a host sync per iteration):
  iterations/s per mode (from its `done N`), same layout.
For every attached run: trace MB per minute, llmprof's own CPU (% of one core) and peak RSS, its estimate of
the cost (`est. ... = X% of its CPU`) and of the CUPTI helper's part (from the exit summary), and the CUPTI
records and per-record cost: (loss of the default mode over `--gpu-kernels off`) / records — the figure
llmprof's estimate assumes (`selfacct::CUPTI_RECORD_NS`) and this measures.

    sudo python3 tools/gpu/bench_attach.py --llmprof BUNDLE/llmprof --llmserve BUNDLE/llmserve \\
        --model SmolLM2-135M-Instruct.Q4_1.gguf --out results/attach [--rounds 3] [--duration 8]

Writes `attach.json` and `attach.txt` (the summary) under --out; traces are deleted after they are measured.
Python standard library only.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = [
    ("detached", None),
    ("default", []),
    ("gpu-kernels all", ["--gpu-kernels", "all"]),
    ("gpu-kernels off", ["--gpu-kernels", "off"]),
]


def attach(llmprof, pid, trace, extra):
    """Starts `llmprof attach` and waits for `probes live`."""
    if os.path.exists(trace):
        os.remove(trace)
    p = subprocess.Popen(
        [llmprof, "attach", "--pid", str(pid), "-o", trace] + extra,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while time.time() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        if "probes live" in line:
            return p
    p.kill()
    raise RuntimeError("llmprof attach did not report `probes live` within 60 s")


def detach(p, trace, seconds):
    """Ends the session like Ctrl-C; what its exit summary and the trace say."""
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    size = os.path.getsize(trace) if os.path.exists(trace) else 0
    if os.path.exists(trace):
        os.remove(trace)
    r = {"trace_mb_per_min": size / 1e6 / (seconds / 60.0)}
    m = re.search(r"llmprof itself ([\d.]+) ms CPU \(([\d.]+)% of one core\), peak RSS ([\d.]+) MiB", out)
    if m:
        r["llmprof_cpu_pct"] = float(m.group(2))
        r["llmprof_rss_mib"] = float(m.group(3))
    m = re.search(r"est\. ([\d.]+) ms CPU added to the target = ([\d.]+)% of its CPU", out)
    if m:
        r["estimate_pct"] = float(m.group(2))
    m = re.search(r"CUPTI helper in the target: est\. ([\d.]+) ms .*?, ([\d.]+) ms \(measured there\) \+ (\d+) CUPTI", out)
    if m:
        r["cupti_est_ms"] = float(m.group(1))
        r["cupti_thread_ms"] = float(m.group(2))
        r["cupti_records"] = int(m.group(3))
    r["summary_tail"] = out[-3000:] + err[-1500:]
    return r


def med(v):
    return (statistics.median(v), min(v), max(v)) if v else (None, None, None)


def interleaved(llmprof, pid, rounds, run_load, label, out_dir):
    """Every mode once per round (rotating order); per mode the load's figure and the session's."""
    runs = {name: [] for name, _ in MODES}
    trace = os.path.join(out_dir, f"bench-{label}.perfetto-trace")
    for rnd in range(rounds):
        order = MODES[rnd % len(MODES):] + MODES[:rnd % len(MODES)]
        for name, extra in order:
            p = attach(llmprof, pid, trace, extra) if extra is not None else None
            t0 = time.time()
            figure = run_load()
            secs = time.time() - t0
            r = {"figure": figure}
            if p:
                r.update(detach(p, trace, secs))
            runs[name].append(r)
            print(f"{label} round {rnd + 1} {name}: {figure:.1f}", flush=True)
    return runs


def report(label, unit, runs, lines):
    base = med([r["figure"] for r in runs["detached"]])[0]
    for name, _ in MODES:
        rs = runs[name]
        m, lo, hi = med([r["figure"] for r in rs])
        s = f"  {label:<28} {name:<16} {m:10.1f} {unit} [{lo:.1f}-{hi:.1f}] {100 * (m / base - 1):+6.2f}%"
        if name != "detached":
            for key, fmt in [
                ("trace_mb_per_min", "trace {:.1f} MB/min"),
                ("llmprof_cpu_pct", "llmprof {:.1f}% of a core"),
                ("llmprof_rss_mib", "RSS {:.0f} MiB"),
                ("estimate_pct", "estimate {:.2f}%"),
            ]:
                v = [r[key] for r in rs if key in r]
                if v:
                    s += ", " + fmt.format(statistics.median(v))
        lines.append(s)
    d = [r for r in runs["default"] if "cupti_records" in r]
    off = med([r["figure"] for r in runs["gpu-kernels off"]])[0]
    dm = med([r["figure"] for r in runs["default"]])[0]
    if d and off and dm:
        lines.append(
            f"  {label}: default vs off {100 * (dm / off - 1):+.2f}%; CUPTI records per run (median) "
            f"{statistics.median(r['cupti_records'] for r in d)}; helper threads {statistics.median(r['cupti_thread_ms'] for r in d):.1f} ms"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llmprof", required=True)
    ap.add_argument("--llmserve", help="llmserve built with --features cuda (skip the engine part without it)")
    ap.add_argument("--model", help="the GGUF llmserve serves")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per run (default 8)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engine-args", default="", help="extra arguments for bench_engine.py (quoted)")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch loop")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    lines, result = [], {}

    if a.llmserve and a.model:
        srv = subprocess.Popen(
            [a.llmserve, "--device", "cuda", "--port", str(a.port), "--model", a.model],
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(a.out, "llmserve.log"), "w"),
        )
        url = f"http://127.0.0.1:{a.port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        try:
            for c in [int(x) for x in a.concurrency.split(",") if x]:
                def load(c=c):
                    j = os.path.join(a.out, "engine.json")
                    subprocess.run(
                        [sys.executable, os.path.join(HERE, "bench_engine.py"), "--url", url, "--concurrency",
                         str(c), "--duration", str(a.duration), "--json", j] + a.engine_args.split(),
                        check=True, stdout=subprocess.DEVNULL)
                    with open(j) as f:
                        return json.load(f)["medians"][0]["decode_tokens_per_s_median"]
                runs = interleaved(a.llmprof, srv.pid, a.rounds, load, f"llmserve-c{c}", a.out)
                result[f"llmserve_c{c}"] = runs
                report(f"llmserve c{c}", "tok/s", runs, lines)
        finally:
            srv.terminate()
            srv.wait()

    if not a.no_torch:
        # The loop is its own process per run: attach to a fresh one each time.
        runs = {name: [] for name, _ in MODES}
        trace = os.path.join(a.out, "bench-torch.perfetto-trace")
        for rnd in range(a.rounds):
            order = MODES[rnd % len(MODES):] + MODES[:rnd % len(MODES)]
            for name, extra in order:
                p = subprocess.Popen(
                    [sys.executable, os.path.join(HERE, "torch_matmul.py"), "--seconds", str(a.duration), "--size",
                     "256"], stdout=subprocess.PIPE, text=True)
                ready = p.stdout.readline()
                assert ready.startswith("ready"), ready
                s = attach(a.llmprof, p.pid, trace, extra) if extra is not None else None
                t0 = time.time()
                rest = p.stdout.read()
                p.wait()
                secs = time.time() - t0
                m = re.search(r"done (\d+)", rest)
                r = {"figure": int(m.group(1)) / a.duration if m else 0.0}
                if s:
                    r.update(detach(s, trace, secs))
                runs[name].append(r)
                print(f"torch round {rnd + 1} {name}: {r['figure']:.1f} it/s", flush=True)
        result["torch"] = runs
        report("torch loop (256, chain 8)", "it/s", runs, lines)

    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "attach.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out, "attach.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
