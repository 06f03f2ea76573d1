#!/usr/bin/env python3
"""The transformers reference of G1 and G2: many batch sizes, one model load.

Usage:
    python hf_sweep.py --model DIR --input spec.json

spec.json (written by gyre-bench):
    {"threads": T,                 # torch.set_num_threads(T)
     "repeats": R,                 # timed runs per batch size; the median is reported
     "device": "auto" | "cpu" | "cuda",
     "jobs": [{"name": "G1",
               "mode": "generate" | "ttft",   # ttft: 1 new token (L ignored)
               "prompts": [[ids...], ...],    # equal lengths; batch B uses the first B
               "batches": [B, ...],
               "new_tokens": L}, ...]}

The model is loaded once (bf16 on CUDA, f32 on the CPU, as hf_reference.py).
For each job and each batch size B in turn: one warm-up `generate` of the
same shape and length as the timed ones (so the allocator's pool already
holds every size they need), then R timed runs of
`model.generate(prompts[:B], do_sample=False, max_new_tokens=L,
min_new_tokens=L, use_cache=True)`. A batch size that fails (out of memory,
say) gets its error recorded and the next one still runs. Prints one JSON
line on stdout:
    {"device", "dtype", "attn_implementation", "threads", "torch", "transformers",
     "load_seconds", "jobs": [{"name", "mode", "points": [
         {"batch": B, "error": null | "...", "result": null | {"mode", "tok_per_s",
          "seconds", "runs", "batch", "prompt_tokens", "new_tokens", "threads",
          "device", "dtype", "attn_implementation", "torch", "transformers"}}]}]}
where a result has the fields of hf_reference.py's output (tok_per_s = B * L
/ the median seconds of one call).
"""

import argparse
import gc
import json
import statistics
import sys
import time

from hf_reference import generate_seconds, load_model


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True, help="JSON spec (see above)")
    args = ap.parse_args()
    with open(args.input) as f:
        spec = json.load(f)

    t0 = time.perf_counter()
    torch, transformers, model, device, dtype = load_model(
        args.model, spec.get("device", "auto"), int(spec.get("threads", 0)))
    load_seconds = time.perf_counter() - t0
    repeats = max(1, int(spec.get("repeats", 1)))
    common = {
        "threads": torch.get_num_threads(),
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }

    def measure(mode, prompts, batch, new):
        if batch < 1 or batch > len(prompts):
            raise ValueError(f"batch {batch} needs 1 to {len(prompts)} prompts")
        rows = prompts[:batch]
        if len({len(p) for p in rows}) != 1:
            raise ValueError("prompts must all have the same length")
        ids = torch.tensor(rows, dtype=torch.long, device=device)
        generate_seconds(model, ids, new, device)  # warm-up of the same shape
        runs = [generate_seconds(model, ids, new, device) for _ in range(repeats)]
        seconds = statistics.median(runs)
        return dict(common, mode=mode, tok_per_s=batch * new / seconds, seconds=seconds,
                    runs=runs, batch=batch, prompt_tokens=len(rows[0]), new_tokens=new)

    jobs = []
    for job in spec["jobs"]:
        mode = job.get("mode", "generate")
        new = 1 if mode == "ttft" else int(job["new_tokens"])
        points = []
        for batch in job["batches"]:
            result, error = None, None
            try:
                result = measure(mode, job["prompts"], int(batch), new)
            except Exception as e:  # noqa: BLE001 - recorded, and the next size still runs
                error = f"{type(e).__name__}: {str(e).strip()[:400]}"
            if error is not None:
                # The exception's frames held the failed call's tensors.
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
                print(f"hf_sweep: {job.get('name')} batch {batch}: {error}", file=sys.stderr,
                      flush=True)
            points.append({"batch": int(batch), "result": result, "error": error})
        jobs.append({"name": job.get("name"), "mode": mode, "points": points})
        if device == "cuda":
            torch.cuda.empty_cache()

    print(json.dumps(dict(common, load_seconds=load_seconds, jobs=jobs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
