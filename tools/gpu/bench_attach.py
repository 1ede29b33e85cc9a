#!/usr/bin/env python3
"""What `llmprof attach` costs a CUDA server, A/B interleaved, in one command (run as root on the GPU machine).

Modes, in a rotating order each round: detached, the default attach (kernel summaries), `--gpu-kernels all`
(every kernel a slice: the deep mode), `--gpu-kernels off`. Targets:
- llmserve `--device cuda` (started here on --port) under `bench_engine.py` at each --concurrency level: decode
  tokens/s per mode;
- a launch-bound PyTorch loop (`torch_matmul.py --size 256`: 8 small matmuls + a host sync per iteration, a
  fresh process per run that starts its loop once the session is live): iterations/s.
Per mode the median and range over --rounds and the change against the detached median. For every attached run,
measured from outside while the load ran: trace MB per minute, llmprof's CPU (% of one core, /proc) and RSS
(VmRSS at the end of the load; the peak, start-up included, from its exit summary); and from its exit summary its
estimate of what it added to the target and the CUPTI helper's part (the helper's measured thread time, CUPTI
records). Then per target: CUPTI's cost per record on the critical path, (1 − default / off) × run seconds /
CUPTI records of the default run, the figure llmprof's estimate assumes (`selfacct::CUPTI_RECORD_NS`, 300 ns) and
this measures; and the default's estimate against its measured loss.

    sudo python3 tools/gpu/bench_attach.py --llmprof BUNDLE/llmprof --llmserve BUNDLE/llmserve \\
        --model SmolLM2-135M-Instruct.Q4_1.gguf --out results/attach [--rounds 3] [--duration 6]

Time: each run is --duration s plus ~2 s (attach, stop); 4 modes × rounds × (levels + 1 PyTorch target):
~8 minutes with the defaults. Writes `attach.json` and `attach.txt` (the summary) under --out; traces are deleted
after they are measured. Python standard library only.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = [
    ("detached", None),
    ("default", []),
    ("gpu-kernels all", ["--gpu-kernels", "all"]),
    ("gpu-kernels off", ["--gpu-kernels", "off"]),
]


def cpu_s(pid):
    """user + system CPU seconds of `pid` (all threads), from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def attach(llmprof, pid, trace, extra):
    """Starts `llmprof attach`, waits for `probes live`; its stderr is drained (and kept) by a thread."""
    if os.path.exists(trace):
        os.remove(trace)
    p = subprocess.Popen(
        [llmprof, "attach", "--pid", str(pid), "-o", trace] + extra,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    live = threading.Event()
    p.err_lines = []

    def drain():
        for line in p.stderr:
            p.err_lines.append(line)
            if "probes live" in line:
                live.set()
        live.set()

    threading.Thread(target=drain, daemon=True).start()
    if not live.wait(60) or p.poll() is not None:
        p.kill()
        raise RuntimeError("llmprof attach did not report `probes live`: " + "".join(p.err_lines[-5:]))
    return p


def detach(p, trace, seconds):
    """Ends the session like Ctrl-C; what its exit summary and the trace say."""
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=300)
    err = "".join(p.err_lines)
    size = os.path.getsize(trace) if os.path.exists(trace) else 0
    if os.path.exists(trace):
        os.remove(trace)
    r = {"trace_mb_per_min": size / 1e6 / (seconds / 60.0)}
    m = re.search(r"llmprof itself ([\d.]+) ms CPU \(([\d.]+)% of one core\), peak RSS ([\d.]+) MiB", out)
    if m:
        r["llmprof_peak_rss_mib"] = float(m.group(3))
    m = re.search(r"est\. ([\d.]+) ms CPU added to the target(?: = ([\d.]+)% of its CPU)?", out)
    if m:
        r["estimate_ms"] = float(m.group(1))
        if m.group(2):
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


def one_run(llmprof, pid, trace, extra, run_load):
    """One mode once: the session (if any), the load, what both measured."""
    p = attach(llmprof, pid, trace, extra) if extra is not None else None
    c0 = cpu_s(p.pid) if p else None
    t0 = time.time()
    figure = run_load()
    secs = time.time() - t0
    r = {"figure": figure, "seconds": secs}
    if p:
        c1 = cpu_s(p.pid)
        if c0 is not None and c1 is not None:
            r["llmprof_cpu_pct"] = 100 * (c1 - c0) / secs
        r["llmprof_rss_mib"] = rss_mib(p.pid)
        r.update(detach(p, trace, secs))
    return r


def rotated(rnd):
    k = rnd % len(MODES)
    return MODES[k:] + MODES[:k]


def report(label, unit, runs, lines):
    base = med([r["figure"] for r in runs["detached"]])[0]
    for name, _ in MODES:
        rs = runs[name]
        m, lo, hi = med([r["figure"] for r in rs])
        if m is None:
            continue
        s = f"  {label:<26} {name:<16} {m:10.1f} {unit} [{lo:.1f}-{hi:.1f}] {100 * (m / base - 1):+6.2f}%"
        if name != "detached":
            for key, fmt in [
                ("trace_mb_per_min", "trace {:.1f} MB/min"),
                ("llmprof_cpu_pct", "llmprof {:.1f}% of a core"),
                ("llmprof_rss_mib", "RSS {:.0f} MiB"),
                ("llmprof_peak_rss_mib", "peak {:.0f} MiB"),
                ("estimate_pct", "its estimate {:.2f}% of the target's CPU"),
            ]:
                v = [r[key] for r in rs if r.get(key) is not None]
                if v:
                    s += ", " + fmt.format(statistics.median(v))
        lines.append(s)
    d = [r for r in runs["default"] if "cupti_records" in r]
    off = med([r["figure"] for r in runs["gpu-kernels off"]])[0]
    dm = med([r["figure"] for r in runs["default"]])[0]
    if d and off and dm:
        records = statistics.median(r["cupti_records"] for r in d)
        secs = statistics.median(r["seconds"] for r in d)
        per_record = (1 - dm / off) * secs / records * 1e9 if records else float("nan")
        lines.append(
            f"  {label}: default vs off {100 * (dm / off - 1):+.2f}%; CUPTI records per run {records:.0f}, the helper's "
            f"threads {statistics.median(r['cupti_thread_ms'] for r in d):.1f} ms; CUPTI's cost per record on the "
            f"critical path {per_record:.0f} ns (selfacct::CUPTI_RECORD_NS assumes 300)"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llmprof", required=True)
    ap.add_argument("--llmserve", help="llmserve built with --features cuda (skip the engine part without it)")
    ap.add_argument("--model", help="the GGUF llmserve serves")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--duration", type=float, default=6.0, help="seconds per run (default 6)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engine-args", default="", help="extra arguments for bench_engine.py (quoted)")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch loop")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    lines, result = [], {}
    levels = [int(x) for x in a.concurrency.split(",") if x] if a.llmserve and a.model else []
    targets = len(levels) + (0 if a.no_torch else 1)
    print(f"bench_attach: {targets} targets x {len(MODES)} modes x {a.rounds} rounds x ~{a.duration + 2:.0f} s "
          f"= ~{targets * len(MODES) * a.rounds * (a.duration + 2) / 60:.1f} min", flush=True)

    if levels:
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
            for c in levels:
                def load(c=c):
                    j = os.path.join(a.out, "engine.json")
                    subprocess.run(
                        [sys.executable, os.path.join(HERE, "bench_engine.py"), "--url", url, "--concurrency",
                         str(c), "--duration", str(a.duration), "--json", j] + a.engine_args.split(),
                        check=True, stdout=subprocess.DEVNULL)
                    with open(j) as f:
                        return json.load(f)["medians"][0]["decode_tokens_per_s_median"]

                label = f"llmserve-c{c}"
                trace = os.path.join(a.out, f"bench-{label}.perfetto-trace")
                runs = {name: [] for name, _ in MODES}
                for rnd in range(a.rounds):
                    for name, extra in rotated(rnd):
                        r = one_run(a.llmprof, srv.pid, trace, extra, load)
                        runs[name].append(r)
                        print(f"{label} round {rnd + 1} {name}: {r['figure']:.1f} tok/s", flush=True)
                result[label] = runs
                report(f"llmserve c{c}", "tok/s", runs, lines)
        finally:
            srv.terminate()
            srv.wait()

    if not a.no_torch:
        runs = {name: [] for name, _ in MODES}
        trace = os.path.join(a.out, "bench-torch.perfetto-trace")
        for rnd in range(a.rounds):
            for name, extra in rotated(rnd):
                p = subprocess.Popen(
                    [sys.executable, os.path.join(HERE, "torch_matmul.py"), "--seconds", str(a.duration), "--size",
                     "256", "--go-on-stdin"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                ready = p.stdout.readline()
                if not ready.startswith("ready"):
                    raise RuntimeError(f"torch_matmul.py said {ready!r}")

                def load(p=p):
                    p.stdin.write("go\n")
                    p.stdin.flush()
                    rest = p.stdout.read()
                    p.wait()
                    m = re.search(r"done (\d+)", rest)
                    return int(m.group(1)) / a.duration if m else 0.0

                r = one_run(a.llmprof, p.pid, trace, extra, load)
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
