"""gyre-bench's f32 matrix-product peak (`clients/bench/matmul_peak.py`),
the ceiling that L1 and S2 hold their FLOP/s against.

The peak is the fastest GEMM measured on the machine, so it must be the best
of the libraries it timed, each of which it reports; on a CPU with AVX-512
that includes OpenBLAS forced onto its AVX-512 kernels (MKL runs AVX2 on AMD
CPUs, and OpenBLAS may not recognise a new CPU). Tiny sizes: this checks the
report, not the machine's speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "clients" / "bench" / "matmul_peak.py"


def run_peak() -> dict:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--threads", "1", "--sizes", "64", "96",
         "--repeats", "1"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return set(next((line for line in f if line.startswith("flags")), "").split())


def test_peak_is_the_best_library_it_timed():
    peak = run_peak()
    by = peak["by_source"]
    assert "torch.mm" in by and "numpy (OpenBLAS)" in by, by
    assert all(v > 0 for v in by.values()), by
    assert peak["source"] in by
    assert peak["flops"] == max(by.values())
    assert peak["n"] in (64, 96) and peak["threads"] == 1
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= cpu_flags():
        assert "numpy (OpenBLAS, AVX-512 kernels)" in by, by
