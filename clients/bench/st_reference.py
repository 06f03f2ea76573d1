#!/usr/bin/env python3
"""The sentence-transformers reference of gyre-bench's embeddings scenario (E1).

Usage:
    python st_reference.py --model DIR --input spec.json

spec.json (written by gyre-bench):
    {"sentences": [...],     # the batch (mixed lengths)
     "threads": T,           # torch.set_num_threads(T)
     "repeats": R,           # timed runs after one warm-up; the median counts
     "device": "auto" | "cpu" | "cuda"}

Times `SentenceTransformer(DIR).encode(sentences, batch_size=B)` for B = 32
(its default) and B = len(sentences), and reports the faster, so gyre is
compared with sentence-transformers at its best. Prints one JSON line:
    {"sentences_per_s", "seconds", "runs", "batch_size", "by_batch_size",
     "sentences", "threads", "device", "torch", "sentence_transformers"}
"""

import argparse
import json
import os
import statistics
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    args = ap.parse_args()
    with open(args.input) as f:
        spec = json.load(f)
    for k, v in (("HF_HUB_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false"),
                 ("TRANSFORMERS_VERBOSITY", "error")):
        os.environ.setdefault(k, v)
    import torch
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    threads = int(spec.get("threads", 0))
    if threads > 0:
        torch.set_num_threads(threads)
    device = spec.get("device", "auto")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = SentenceTransformer(args.model, device=device)
    sentences = spec["sentences"]
    repeats = max(1, int(spec.get("repeats", 3)))

    def once(batch_size):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.encode(sentences, batch_size=batch_size, convert_to_numpy=True,
                               show_progress_bar=False)
        if device == "cuda":
            torch.cuda.synchronize()
        assert out.shape[0] == len(sentences)
        return time.perf_counter() - t0

    by_batch = {}
    for bs in sorted({32, len(sentences)}):
        once(bs)  # warm-up
        runs = [once(bs) for _ in range(repeats)]
        by_batch[bs] = {"seconds": statistics.median(runs), "runs": runs}
    best = min(by_batch, key=lambda b: by_batch[b]["seconds"])
    seconds = by_batch[best]["seconds"]
    print(json.dumps({
        "sentences_per_s": len(sentences) / seconds,
        "seconds": seconds,
        "runs": by_batch[best]["runs"],
        "batch_size": best,
        "by_batch_size": {str(k): v for k, v in by_batch.items()},
        "sentences": len(sentences),
        "threads": torch.get_num_threads(),
        "device": device,
        "torch": torch.__version__,
        "sentence_transformers": sentence_transformers.__version__,
    }))


if __name__ == "__main__":
    main()
