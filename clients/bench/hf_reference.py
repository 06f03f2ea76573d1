#!/usr/bin/env python3
"""The transformers reference that `gyre-bench run` measures gyre against.

Usage:
    python hf_reference.py --model DIR --input spec.json

spec.json (written by gyre-bench):
    {"prompts": [[ids...], ...],   # B prompts of equal length (a static batch)
     "new_tokens": L,              # tokens generated per prompt
     "threads": T,                 # torch.set_num_threads(T)
     "repeats": R,                 # timed runs after one warm-up; the median is reported
     "mode": "generate" | "ttft",  # ttft: time to the first generated token (L ignored)
     "device": "auto" | "cpu" | "cuda"}

Runs `model.generate(input_ids [B, P], do_sample=False, max_new_tokens=L,
min_new_tokens=L, use_cache=True)` (greedy, EOS never ends it early, so every
row gets exactly L new tokens) and prints one JSON line on stdout:
    {"mode", "tok_per_s", "seconds", "runs", "batch", "prompt_tokens", "new_tokens",
     "threads", "device", "dtype", "attn_implementation", "torch", "transformers"}
tok_per_s = B * L / seconds, where seconds is the median wall time of one
generate call (prefill included), as gyre's figure includes it.
"""

import argparse
import json
import os
import statistics
import sys
import time


def load_model(path, device="auto", threads=0):
    """Imports torch and transformers (offline, quiet) and loads the model at
    `path` on `device` ("auto": cuda when there is one), bf16 on CUDA and f32
    on the CPU (as gyre --device auto). Returns (torch, transformers, model,
    device, dtype)."""
    for k, v in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                 ("TOKENIZERS_PARALLELISM", "false"), ("TRANSFORMERS_VERBOSITY", "error")):
        os.environ.setdefault(k, v)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    if threads > 0:
        torch.set_num_threads(threads)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return torch, transformers, model, device, dtype


def generate_seconds(model, ids, n, device):
    """Wall time of one greedy `generate` of exactly `n` new tokens per row
    of `ids` ([B, P] on `device`), prefill included."""
    import torch

    gen = dict(do_sample=False, max_new_tokens=n, min_new_tokens=n, use_cache=True,
               num_beams=1, pad_token_id=model.generation_config.pad_token_id or 0)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **gen)
    if device == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    got = out.shape[1] - ids.shape[1]
    if got != n:
        raise RuntimeError(f"generate returned {got} new tokens, expected {n}")
    return dt


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True, help="JSON spec (see above)")
    args = ap.parse_args()
    with open(args.input) as f:
        spec = json.load(f)

    torch, transformers, model, device, dtype = load_model(
        args.model, spec.get("device", "auto"), int(spec.get("threads", 0)))
    prompts = spec["prompts"]
    if len({len(p) for p in prompts}) != 1:
        raise SystemExit("prompts must all have the same length")
    ids = torch.tensor(prompts, dtype=torch.long, device=device)
    mode = spec.get("mode", "generate")
    new = 1 if mode == "ttft" else int(spec["new_tokens"])

    generate_seconds(model, ids, min(new, 8), device)  # warm-up: allocator, kernels, lazy init
    runs = [generate_seconds(model, ids, new, device)
            for _ in range(max(1, int(spec.get("repeats", 1))))]
    seconds = statistics.median(runs)
    batch = len(prompts)
    print(json.dumps({
        "mode": mode,
        "tok_per_s": batch * new / seconds,
        "seconds": seconds,
        "runs": runs,
        "batch": batch,
        "prompt_tokens": len(prompts[0]),
        "new_tokens": new,
        "threads": torch.get_num_threads(),
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
