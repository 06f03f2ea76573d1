#!/usr/bin/env python3
"""Each kernel stage's own device time in a batch-1 decode graph, from the
output of `device.sh stages`: steptime runs of one model with nothing
doubled (`X=1`) and with one stage's kernels launched twice
(`GYRE_TWICE=STAGE`). A stage's cost is its run's graph replay time less
the plain runs' median (the first graph a run logs: the shortest context);
per layer divides by the model's `num_hidden_layers` (the `gemv` stage also
holds the vocabulary projection).

    python3 tests/gpu/stages.py STAGES.txt MODELS_DIR
"""
import json
import os
import re
import statistics
import sys
from collections import defaultdict

RUN = re.compile(r"^== steptime (\S+) streams=1 prompt=\d+ (.*)$")
REPLAY = re.compile(r'replay_ms="([0-9.]+)"')


def runs(path):
    """{model: {setting: [replay ms of each run]}}."""
    out = defaultdict(lambda: defaultdict(list))
    model = setting = None
    for line in open(path, encoding="utf-8", errors="replace"):
        m = RUN.match(line.strip())
        if m:
            model, setting = m.group(1), m.group(2).strip()
            continue
        r = REPLAY.search(line)
        if r and model is not None:
            out[model][setting].append(float(r.group(1)))
            model = None  # the first graph of the run only
    return out


def layers(models_dir, name):
    try:
        with open(os.path.join(models_dir, name, "config.json")) as f:
            return int(json.load(f)["num_hidden_layers"])
    except (OSError, KeyError, ValueError):
        return None


def main():
    data, models_dir = runs(sys.argv[1]), sys.argv[2]
    if not data:
        print("no steptime runs with graph replay times found")
        return 1
    for model, by in data.items():
        plain = by.get("X=1", [])
        if not plain:
            print(f"== {model}: no plain run")
            continue
        base = statistics.median(plain)
        n = layers(models_dir, model)
        spread = max(plain) - min(plain)
        print(f"== {model}: plain graph {base:.3f} ms ({len(plain)} runs, spread {spread:.3f} ms)"
              + (f", {n} layers" if n else ""))
        total = 0.0
        for setting, times in by.items():
            if not setting.startswith("GYRE_TWICE="):
                continue
            stage = setting.split("=", 1)[1]
            d = statistics.median(times) - base
            total += d
            per = f"{d * 1e3 / n:7.2f} us a layer" if n else ""
            print(f"  {stage:6s} {d * 1e3:8.1f} us a step {100 * d / base:5.1f}%  {per}")
        rest = base - total
        print(f"  stages together {total * 1e3:.1f} us; the rest of the step {rest * 1e3:.1f} us"
              f" ({100 * rest / base:.1f}%: embedding, sampling, libtorch's own ops, gaps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
