#!/usr/bin/env python3
"""The f32 matrix-product peak of this machine, for gyre-bench's L1 and S2.

Usage:
    .venv/bin/python clients/bench/matmul_peak.py --threads 2

Times two GEMM libraries on square f32 matrices of a few sizes with the given
thread count, best of several products each: torch.mm (libtorch's MKL) and
NumPy's OpenBLAS. On AMD CPUs MKL takes its AVX2 path, and OpenBLAS's
runtime dispatch may not know a new CPU and fall back to its Haswell (AVX2)
kernels, so on a CPU with AVX-512 OpenBLAS is also timed with its AVX-512
kernels (OPENBLAS_CORETYPE=SKYLAKEX, in a child process since OpenBLAS reads
it at load). The peak is the best of them: the fastest f32 GEMM measured on
this machine. Prints one JSON line: {"flops": best FLOP/s (2 n^3 per
product), "n": the size that gave it, "source": which library gave it,
"threads", "torch": torch's version, "by_source": {library: FLOP/s}}.
"""

import argparse
import json
import os
import subprocess
import sys
import time


def best_seconds(mm, a, b, repeats):
    mm(a, b)  # warm-up: packing buffers, thread pool
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        mm(a, b)
        best = min(best, time.perf_counter() - started)
    return best


def time_torch(threads, sizes, repeats):
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    best = (0.0, 0)
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        best = max(best, (2 * n**3 / best_seconds(torch.mm, a, b, repeats), n))
    return best


def time_numpy(sizes, repeats):
    import numpy as np

    rng = np.random.default_rng(0)
    best = (0.0, 0)
    for n in sizes:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        best = max(best, (2 * n**3 / best_seconds(np.matmul, a, b, repeats), n))
    return best


def numpy_child(threads, sizes, repeats, coretype):
    """NumPy's GEMM timed in a child process (OpenBLAS's threads and core
    type are fixed when it loads); None when it fails."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    cmd = [sys.executable, __file__, "--numpy-only", "--threads", str(threads),
           "--repeats", str(repeats), "--sizes", *map(str, sizes)]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300,
                             check=True).stdout
        return tuple(json.loads(out.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, ValueError, IndexError, OSError) as e:
        print(f"matmul_peak.py: numpy ({coretype or 'default'}): {e}", file=sys.stderr)
        return None


def has_avx512():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= set(flags)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 3072])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--numpy-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.numpy_only:
        print(json.dumps(list(time_numpy(args.sizes, args.repeats))))
        return
    import torch

    results = {"torch.mm": time_torch(args.threads, args.sizes, args.repeats)}
    default = numpy_child(args.threads, args.sizes, args.repeats, None)
    if default:
        results["numpy (OpenBLAS)"] = default
    if has_avx512():
        forced = numpy_child(args.threads, args.sizes, args.repeats, "SKYLAKEX")
        if forced:
            results["numpy (OpenBLAS, AVX-512 kernels)"] = forced
    source, (flops, n) = max(results.items(), key=lambda kv: kv[1][0])
    print(json.dumps({"flops": flops, "n": n, "source": source, "threads": args.threads,
                      "torch": torch.__version__,
                      "by_source": {k: v[0] for k, v in results.items()}}))


if __name__ == "__main__":
    main()
