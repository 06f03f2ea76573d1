#!/usr/bin/env python3
"""transformers' beam search, the reference of `gyre-bench run`'s B1 scenario.

Usage:
    python hf_beam_reference.py --gguf FILE --input spec.json

spec.json (written by gyre-bench):
    {"prompts": ["text", ...],   # chat messages' user texts, rendered with the model's template
     "num_beams": W, "new_tokens": L, "threads": T, "repeats": R}

Loads the GGUF with transformers (`gguf_file=`, dequantized to float32, on CPU), renders
each prompt with the chat template, and times `generate(num_beams=W, num_return_sequences=1,
do_sample=False, max_new_tokens=L)` per prompt (after one warm-up). Prints one JSON line:
    {"tok_per_s", "seconds", "tokens", "prompt_ids": [[...]], "output_ids": [[...]],
     "threads", "torch", "transformers"}
tokens: the best hypotheses' lengths summed (the EOS included); seconds: the median over the
repeats of the summed wall time; tok_per_s = tokens / seconds.
"""

import argparse
import json
import os
import statistics
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--input", required=True)
    args = ap.parse_args()
    with open(args.input) as f:
        spec = json.load(f)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if int(spec.get("threads", 0)) > 0:
        torch.set_num_threads(int(spec["threads"]))
    folder, name = os.path.dirname(args.gguf), os.path.basename(args.gguf)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    eos = tok.eos_token_id
    prompts = []
    for text in spec["prompts"]:
        rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
        prompts.append(tok(rendered, add_special_tokens=False).input_ids)
    kw = dict(do_sample=False, num_beams=int(spec["num_beams"]), num_return_sequences=1,
              max_new_tokens=int(spec["new_tokens"]), eos_token_id=eos, pad_token_id=eos,
              use_cache=True)

    def one(ids):
        x = torch.tensor([ids])
        with torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x), **kw)
        new = out[0, len(ids):].tolist()
        return new[:new.index(eos) + 1] if eos in new else new

    one(prompts[0])  # warm-up
    runs, outputs = [], []
    for _ in range(max(1, int(spec.get("repeats", 1)))):
        t0 = time.perf_counter()
        outputs = [one(p) for p in prompts]
        runs.append(time.perf_counter() - t0)
    seconds = statistics.median(runs)
    tokens = sum(len(o) for o in outputs)
    print(json.dumps({"tok_per_s": tokens / seconds, "seconds": seconds, "runs": runs,
                      "tokens": tokens, "prompt_ids": prompts, "output_ids": outputs,
                      "threads": torch.get_num_threads(), "torch": torch.__version__,
                      "transformers": transformers.__version__}), flush=True)


if __name__ == "__main__":
    main()
