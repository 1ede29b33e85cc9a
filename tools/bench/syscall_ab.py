#!/usr/bin/env python3
"""Same-run A/B of llmprof binaries on the syscall path: a C loop of bare getppid calls
(tools/bench/getppid_loop.c), detached and with each binary's `llmprof attach` (default settings), interleaved
with a rotating order; prints thread CPU ns per call and what each binary adds over the same round's detached
run (medians and ranges). Use it to compare two builds of the eBPF programs; `cargo xtask bench syscalls
--anchor` compares llmprof with bpftrace.

usage: sudo ROUNDS=7 CALLS=4000000 tools/bench/syscall_ab.py LLMPROF_A [LLMPROF_B ...]
"""
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    bins = sys.argv[1:]
    if not bins:
        sys.exit(__doc__)
    work = tempfile.mkdtemp(prefix="llmprof-syscall-ab-")
    loop = os.path.join(work, "getppid_loop")
    subprocess.run(["cc", "-O2", "-o", loop, os.path.join(HERE, "getppid_loop.c")], check=True)
    p = subprocess.Popen([loop, os.environ.get("CALLS", "4000000")], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    pid = int(p.stdout.readline().split()[1])

    def measure():
        p.stdin.write("go\n")
        p.stdin.flush()
        return float(p.stdout.readline())

    trace = os.path.join(work, "t.perfetto-trace")
    modes = ["detached"] + bins
    res = {m: [] for m in modes}
    added = {m: [] for m in bins}
    for r in range(int(os.environ.get("ROUNDS", "5"))):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        got = {}
        for m in order:
            if m == "detached":
                got[m] = measure()
                continue
            if os.path.exists(trace):
                os.remove(trace)  # attach never overwrites a file
            a = subprocess.Popen([m, "attach", "--pid", str(pid), "-o", trace], stderr=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL, text=True)
            while True:
                line = a.stderr.readline()
                if "probes live" in line:
                    break
                if not line:
                    sys.exit(f"llmprof attach failed: {m}")
            got[m] = measure()
            a.send_signal(2)
            a.communicate(timeout=60)
        for m in modes:
            res[m].append(got[m])
        for m in bins:
            added[m].append(got[m] - got["detached"])
        print(r, got, flush=True)
    p.kill()
    for m in modes:
        print(f"{m}: {statistics.median(res[m]):.1f} ns/call ({min(res[m]):.1f}-{max(res[m]):.1f})")
    for m in bins:
        print(f"added by {m}: {statistics.median(added[m]):.1f} ns/call ({min(added[m]):.1f}-{max(added[m]):.1f})")


if __name__ == "__main__":
    main()
