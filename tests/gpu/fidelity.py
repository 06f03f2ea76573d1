#!/usr/bin/env python3
"""Fidelity of gyre's CUDA engine against transformers, on a GPU machine.

Both run in bf16 on the same GPU and the same weights. For each model, the
same prompts go through transformers (batch 1, SDPA attention, a greedy loop
over its KV cache) and through gyre's engine (`greedy` example: all prompts
submitted at once, so they share batched steps, flash attention over the
paged cache). Reports, per prompt, how many greedy tokens are identical and,
at the first divergence, the top-1/top-2 logit margin on both sides: a
divergence where the margin is within bf16 rounding of zero is a near tie,
not a bug.

Models:
  --shape NAME        random weights in a real shape (seeded, bf16, built in /tmp)
  --family DIR        a directory with a config.json (tiny test families): random weights
  --gguf FILE         a real GGUF (transformers dequantizes it; needs the gguf package)

    python3 tests/gpu/fidelity.py --greedy-bin BIN --out results.json --shape llama-3.2-1b

Writes a JSON report and prints a table.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

NEW_TOKENS = 32
SEED = 1234
# FIDELITY_DEVICE=cpu runs the same comparison on the CPU (bf16 both sides), to try the script.
DEV = os.environ.get("FIDELITY_DEVICE", "cuda")

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SHAPES = {
    # meta-llama/Llama-3.2-1B's config.json
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         vocab_size=128256, max_position_embeddings=131072,
                         rope_theta=500000.0, rope_scaling=LLAMA3_ROPE,
                         tie_word_embeddings=True),
    # meta-llama/Meta-Llama-3-8B's config.json
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                       vocab_size=128256, max_position_embeddings=8192,
                       rope_theta=500000.0, rope_scaling=None, tie_word_embeddings=False),
}
LLAMA_COMMON = dict(model_type="llama", architectures=["LlamaForCausalLM"], rms_norm_eps=1e-5,
                    hidden_act="silu", initializer_range=0.02, attention_bias=False,
                    mlp_bias=False, bos_token_id=128000, eos_token_id=128001)


def device_name():
    return torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu"


def log(msg):
    print(f"[fidelity {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_random(config: dict, out: str):
    """Seeded random bf16 weights for `config`, initialised on the GPU, saved to `out`;
    loaded back instead when an earlier run saved the same config there (STAMP)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    stamp = os.path.join(out, "STAMP")
    want = json.dumps({"config": config, "seed": SEED}, sort_keys=True)
    if os.path.exists(stamp) and open(stamp).read() == want:
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).to(DEV)
        model.eval()
        return model
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    cfg = AutoConfig.from_pretrained(out)
    torch.manual_seed(SEED)
    with torch.device(DEV):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    model.save_pretrained(out)
    with open(stamp, "w") as f:
        f.write(want)
    return model


def hf_greedy(model, prompt, n):
    """Greedy tokens and, per position, the top-1 minus top-2 logit (float32)."""
    toks, margins, tops = [], [], []
    with torch.no_grad():
        out = model(torch.tensor([prompt], device=DEV), use_cache=True)
        past = out.past_key_values
        for i in range(n):
            logits = out.logits[0, -1].float()
            top = torch.topk(logits, 2)
            t = int(top.indices[0])
            toks.append(t)
            margins.append(float(top.values[0] - top.values[1]))
            tops.append(float(top.values[0]))
            if i == n - 1:
                break
            out = model(torch.tensor([[t]], device=DEV), past_key_values=past, use_cache=True)
            past = out.past_key_values
    return toks, margins, tops


def tie(top):
    """Two bf16 steps at the size of the top logit: a lead this small is a
    tie within the rounding of bf16 logits."""
    return 2 * 2.0 ** (math.floor(math.log2(max(abs(top), 1e-3))) - 7)


def gyre_greedy(bin_path, model_path, prompts, n, score=False):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
        path = f.name
    t0 = time.time()
    proc = subprocess.run([bin_path, model_path, path, str(n), DEV] + (["score"] if score else []),
                          capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"greedy failed ({proc.returncode}): {proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    log(f"gyre: {len(rows)} prompts in {time.time() - t0:.1f} s (load included)")
    return rows


def random_prompts(vocab, lengths):
    g = torch.Generator().manual_seed(SEED)
    return [torch.randint(100, min(vocab, 32000), (n,), generator=g).tolist() for n in lengths]


def compare(name, model, model_path, prompts, bin_path, n):
    hf = [hf_greedy(model, p, n) for p in prompts]
    ours = gyre_greedy(bin_path, model_path, prompts, n)
    rows = []
    for p, (ht, hm, htop), o in zip(prompts, hf, ours):
        gt = o["tokens"]
        same = next((i for i, (a, b) in enumerate(zip(ht, gt)) if a != b), min(len(ht), len(gt)))
        row = {"prompt_tokens": len(p), "identical": same, "hf": ht, "gyre": gt,
               "hf_margin_median": sorted(hm)[len(hm) // 2]}
        if same < n:
            top2 = o["top2"][same]
            row["diverge"] = {
                "hf_margin": hm[same],
                "hf_top_logit": htop[same],
                "tie_at_two_bf16_steps": tie(htop[same]),
                "gyre_margin": top2[1] - top2[3] if len(top2) >= 4 else None,
                "gyre_pick_is_hf_top2": None,
            }
        rows.append(row)
    # Teacher forcing: each prompt followed by transformers' greedy tokens,
    # scored by gyre in one prefill; at each generated position, does gyre's
    # top-1 equal transformers' choice? Counted over all positions and over
    # those where transformers' top-1 leads by more than TIE (a lead of one
    # or two bf16 steps at these logit sizes is a tie within rounding).
    forced = gyre_greedy(bin_path, model_path, [p + ht[:-1] for p, (ht, _, _) in zip(prompts, hf)], n,
                         score=True)
    agree = [0, 0, 0, 0]  # all: agree, total; clear lead: agree, total
    for p, (ht, hm, htop), o, row in zip(prompts, hf, forced, rows):
        picks = [t[0] for t in o["prompt_top2"][len(p) - 1:]]
        ok = [a == b for a, b in zip(picks, ht)]
        row["forced_agree"] = sum(ok)
        agree[0] += sum(ok)
        agree[1] += len(ok)
        for good, m, top in zip(ok, hm, htop):
            if m > tie(top):
                agree[2] += good
                agree[3] += 1
    full = sum(r["identical"] >= n for r in rows)
    log(f"{name}: teacher-forced top-1 agreement {agree[0]}/{agree[1]}; where transformers leads "
        f"by more than two bf16 steps: {agree[2]}/{agree[3]}")
    log(f"{name}: {full}/{len(rows)} prompts identical for {n} tokens; identical prefix "
        f"lengths {[r['identical'] for r in rows]}")
    for r in rows:
        if "diverge" in r:
            d = r["diverge"]
            log(f"  {name}: prompt of {r['prompt_tokens']} tokens diverges at {r['identical']}: "
                f"margin there hf {d['hf_margin']:.4f} (two bf16 steps: {d['tie_at_two_bf16_steps']:.4f}), "
                f"gyre {d['gyre_margin']:.4f} "
                f"(hf median margin {r['hf_margin_median']:.4f})")
    return {"model": name, "new_tokens": n, "identical_all": full, "prompts": len(rows),
            "forced_agree": agree[0], "forced_total": agree[1], "forced_agree_clear": agree[2],
            "forced_total_clear": agree[3], "rows": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--greedy-bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--family", action="append", default=[])
    ap.add_argument("--gguf", action="append", default=[])
    ap.add_argument("--tokens", type=int, default=NEW_TOKENS)
    ap.add_argument("--workdir", default="/tmp/gyre-fidelity")
    ap.add_argument("--keep", action="store_true", help="keep the random models in --workdir")
    ap.add_argument("--build-only", action="store_true", help="only build the --shape models (kept)")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    log(f"torch {torch.__version__}, {device_name()}")
    results = []

    def done(res):
        results.append(res)
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "device": device_name(),
                       "results": results}, f, indent=1)

    lengths = [5, 17, 64, 100, 257, 512, 33, 1000]
    for shape in args.shape:
        out = os.path.join(args.workdir, shape)
        cfg = dict(LLAMA_COMMON, **SHAPES[shape])
        t0 = time.time()
        model = build_random(cfg, out)
        log(f"{shape}: built and saved in {time.time() - t0:.1f} s")
        if args.build_only:
            continue
        done(compare(shape, model, out, random_prompts(cfg["vocab_size"], lengths), args.greedy_bin,
                     args.tokens))
        del model
        if DEV == "cuda":
            torch.cuda.empty_cache()
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    for fam in args.family:
        name = os.path.basename(fam.rstrip("/"))
        out = os.path.join(args.workdir, name)
        with open(os.path.join(fam, "config.json")) as f:
            cfg = json.load(f)
        cfg.pop("torch_dtype", None)
        cfg["dtype"] = "bfloat16"
        model = build_random(cfg, out)
        for extra in ("generation_config.json",):
            if os.path.exists(os.path.join(fam, extra)):
                shutil.copy(os.path.join(fam, extra), out)
        done(compare(name, model, out, random_prompts(cfg["vocab_size"], lengths[:6]),
                     args.greedy_bin, args.tokens))
        del model
    for gguf in args.gguf:
        from transformers import AutoTokenizer
        d, fname = os.path.split(gguf)
        tok = AutoTokenizer.from_pretrained(d, gguf_file=fname)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=fname, dtype=torch.bfloat16).to(DEV).eval()
        texts = ["What is the capital of France?", "Write a haiku about the sea.",
                 "Explain why the sky is blue in two sentences.", "List three prime numbers.",
                 "Translate 'good morning' into Spanish.", "What does a compiler do?",
                 "Give me a short recipe for pancakes.", "Who wrote Hamlet?"]
        prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False) for t in texts]
        prompts = [list(p["input_ids"]) if isinstance(p, dict) else list(p) for p in prompts]
        done(compare(fname, model, gguf, prompts, args.greedy_bin, args.tokens))
        del model
    print("\nmodel                          identical/prompts (%d tokens)   teacher-forced top-1: all, "
          "clear lead" % args.tokens)
    for r in results:
        print(f"{r['model']:<30} {r['identical_all']}/{r['prompts']:<30} {r['forced_agree']}/"
              f"{r['forced_total']}   {r['forced_agree_clear']}/{r['forced_total_clear']}")


if __name__ == "__main__":
    sys.exit(main())
