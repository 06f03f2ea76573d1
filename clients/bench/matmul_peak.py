#!/usr/bin/env python3
"""The f32 matrix-product peak of this machine, for gyre-bench's L1.

Usage:
    .venv/bin/python clients/bench/matmul_peak.py --threads 2

Times torch.mm (libtorch's GEMM) on square f32 matrices of a few sizes with
the given intra-op thread count, best of several products each, and prints
one JSON line: {"flops": best FLOP/s (2 n^3 per product), "n": the size that
gave it, "threads", "torch"}.
"""

import argparse
import json
import time

import torch


def best_seconds(a, b, repeats):
    torch.mm(a, b)  # warm-up: packing buffers, thread pool
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 3072])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    best = (0.0, 0)
    for n in args.sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        flops = 2 * n**3 / best_seconds(a, b, args.repeats)
        best = max(best, (flops, n))
    print(json.dumps({"flops": best[0], "n": best[1], "threads": args.threads,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
