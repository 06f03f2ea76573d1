#!/usr/bin/env python3
"""Device time a decode step spends in each kernel, from two Nsight Compute
CSV reports (`ncu --metrics gpu__time_duration.sum --csv --print-units base`)
of the same steptime run with FEW and MANY new tokens: their difference,
divided by MANY - FEW, is what one decode step adds (loading and the
prefill cancel out).

    python3 tests/gpu/kernel_times.py FEW.csv MANY.csv STEPS
"""
import csv
import sys
from collections import defaultdict


def totals(path):
    out = defaultdict(lambda: [0, 0.0])
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"]
        name = name.split("(")[0] if name.startswith("gyre_") else name[:90]
        t = out[name]
        t[0] += 1
        t[1] += float(row["Metric Value"].replace(",", ""))
    return out


def main():
    few, many, steps = totals(sys.argv[1]), totals(sys.argv[2]), int(sys.argv[3])
    rows = []
    for name in set(few) | set(many):
        n = (many.get(name, [0, 0.0])[0] - few.get(name, [0, 0.0])[0]) / steps
        t = (many.get(name, [0, 0.0])[1] - few.get(name, [0, 0.0])[1]) / steps
        if n > 0:
            rows.append((t, n, name))
    rows.sort(reverse=True)
    total = sum(t for t, _, _ in rows)
    print(f"one decode step: {sum(n for _, n, _ in rows):.0f} kernels, {total / 1e3:.1f} us of device time")
    for t, n, name in rows:
        print(f"{t / 1e3:9.1f} us {100 * t / total:5.1f}%  {n:5.0f} x {t / n / 1e3:7.2f} us  {name}")


if __name__ == "__main__":
    main()
