#!/usr/bin/env python3
"""A PyTorch process doing matmuls on the GPU, for attaching `llmprof` to a real CUDA process.

It initializes CUDA first (so libcuda is mapped and has a context), prints `ready PID` (flushed), then (with
--go-on-stdin once a line arrives on stdin) for --seconds runs iterations of: an fp16 matmul chain on the GPU
(kernel launches), a small host-to-device copy,
a device-to-host copy of a scalar (a synchronizing cuMemcpyDtoH*), and every 10th iteration an explicit
torch.cuda.synchronize() (cuCtxSynchronize / cuStreamSynchronize). It prints `done ITERATIONS` at the end.

    python3 tools/gpu/torch_matmul.py --seconds 20 &
    sudo llmprof attach --pid PID -d 5s -o torch.perfetto-trace
"""
import argparse
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="how long to run the matmul loop (default 20)")
    ap.add_argument("--size", type=int, default=4096, help="matrix size (default 4096)")
    ap.add_argument("--chain", type=int, default=8, help="matmuls per iteration (default 8)")
    ap.add_argument(
        "--lazy",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="print `ready PID` before importing torch and touching CUDA, then wait SECONDS: libcuda is loaded "
        "after a profiler attached (as in a server that initializes CUDA lazily)",
    )
    ap.add_argument(
        "--go-on-stdin",
        action="store_true",
        help="after `ready PID`, wait for a line on stdin before the loop (a bench attaches first)",
    )
    args = ap.parse_args()
    if args.lazy > 0:
        print(f"ready {os.getpid()} (lazy: CUDA in {args.lazy} s)", flush=True)
        time.sleep(args.lazy)
    try:
        import torch
    except ImportError as e:
        print(f"torch_matmul: PyTorch is not installed: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_matmul: torch.cuda.is_available() is False: no usable GPU/driver", file=sys.stderr)
        return 3
    dev = torch.device("cuda")
    a = torch.randn(args.size, args.size, device=dev, dtype=torch.float16)
    b = torch.randn(args.size, args.size, device=dev, dtype=torch.float16)
    host = torch.randn(1024, 1024, pin_memory=True)
    torch.cuda.synchronize()
    if args.lazy <= 0:
        print(f"ready {os.getpid()} {torch.cuda.get_device_name(0)} torch {torch.__version__}", flush=True)
    if args.go_on_stdin:
        sys.stdin.readline()
    end = time.monotonic() + args.seconds
    it = 0
    while time.monotonic() < end:
        x = a
        for _ in range(args.chain):
            x = torch.matmul(x, b)
            x = x * (1.0 / args.size)
        h = host.to(dev, non_blocking=True)
        s = (x.float().mean() + h.mean()).item()  # device-to-host copy: waits for the GPU
        if it % 10 == 0:
            torch.cuda.synchronize()
        it += 1
    print(f"done {it} last={s:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
