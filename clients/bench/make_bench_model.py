#!/usr/bin/env python3
"""Build the random-weight Llama that `gyre-bench` benchmarks on.

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python clients/bench/make_bench_model.py --out .gyre/bench/llama-64m
    HF_HUB_OFFLINE=1 .venv/bin/python clients/bench/make_bench_model.py --out DIR --preset quick

Presets (float32, untied embeddings, vocabulary of the phi-3 tokenizer, 32064):
    bench  hidden 512, 8 layers, 8 heads / 4 KV heads, MLP 2048   (~64 M parameters)
    quick  hidden 128, 2 layers, 4 heads / 2 KV heads, MLP 344    (~8.6 M; smoke tests)

<out> becomes an ordinary HuggingFace directory (config.json in the classic
rope_theta/rope_scaling layout, model.safetensors, generation_config.json, the
phi-3 tokenizer.json and tokenizer_config.json with tokenizer_class
PreTrainedTokenizerFast, as tests/fixtures/make_models.py ships them). The
weights come from a fixed seed. <out>/STAMP holds the sha256 of this script
and the preset; a re-run with a matching STAMP exits at once. Prints the
parameter count. No network is used.
"""

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

SCRIPT_PATH = os.path.abspath(__file__)
FILES = ("config.json", "generation_config.json", "model.safetensors",
         "tokenizer.json", "tokenizer_config.json")
SEED = 4242

PRESETS = {
    "bench": dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=64),
    "quick": dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32),
}
COMMON = dict(
    vocab_size=32064, max_position_embeddings=4096, rope_theta=10000.0, rope_scaling=None,
    rms_norm_eps=1e-5, hidden_act="silu", initializer_range=0.02, use_cache=True,
    tie_word_embeddings=False, attention_bias=False, mlp_bias=False, pretraining_tp=1,
    bos_token_id=1, eos_token_id=32000, pad_token_id=32000,
)
# upstream Phi-3-mini generation_config
GENERATION = dict(bos_token_id=1, eos_token_id=[32000, 32001, 32007], pad_token_id=32000)


def stamp_text(preset):
    with open(SCRIPT_PATH, "rb") as f:
        return f"{hashlib.sha256(f.read()).hexdigest()} {preset}"


def up_to_date(out, preset):
    stamp = os.path.join(out, "STAMP")
    if not os.path.isfile(stamp):
        return False
    with open(stamp) as f:
        if f.read().strip() != stamp_text(preset):
            return False
    return all(os.path.isfile(os.path.join(out, fn)) for fn in FILES)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def write_tokenizer(data, d):
    src = os.path.join(data, "tokenizers", "phi-3-mini-instruct")
    shutil.copyfile(os.path.join(src, "tokenizer.json"), os.path.join(d, "tokenizer.json"))
    with open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    # transformers>=5 LlamaTokenizer rebuilds the pipeline instead of using
    # tokenizer.json verbatim; the generic fast class uses it as-is, as gyre does.
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    write_json(os.path.join(d, "tokenizer_config.json"), cfg)


def fix_config_json(d):
    """transformers>=5 writes `rope_parameters`; ship the classic hub layout."""
    path = os.path.join(d, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.pop("rope_parameters", None)
    for k in ("rope_theta", "rope_scaling", "bos_token_id", "eos_token_id", "pad_token_id",
              "tie_word_embeddings", "max_position_embeddings", "vocab_size"):
        cfg[k] = COMMON[k]
    cfg["torch_dtype"] = "float32"
    cfg["dtype"] = "float32"
    write_json(path, dict(sorted(cfg.items())))


def build(out, preset, data):
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    tmp = os.path.join(out, f".tmp-{os.getpid()}")
    os.makedirs(tmp)
    try:
        transformers.utils.logging.disable_progress_bar()
        cfg = AutoConfig.for_model("llama", **COMMON, **PRESETS[preset])
        cfg.architectures = ["LlamaForCausalLM"]
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(cfg).float().eval()
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(tmp, safe_serialization=True)
        fix_config_json(tmp)
        gen = dict(GENERATION, transformers_version=transformers.__version__)
        write_json(os.path.join(tmp, "generation_config.json"), gen)
        write_tokenizer(data, tmp)
        for fn in os.listdir(tmp):
            os.chmod(os.path.join(tmp, fn), 0o644)
            os.replace(os.path.join(tmp, fn), os.path.join(out, fn))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return params


def count_params(out):
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    h, i, n = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q = c["num_attention_heads"] * hd
    kv = c["num_key_value_heads"] * hd
    layer = h * q * 2 + h * kv * 2 + 3 * h * i + 2 * h
    return 2 * c["vocab_size"] * h + n * layer + h


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="model directory to create")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="bench")
    ap.add_argument("--data", default=str(Path(SCRIPT_PATH).parents[2] / "tests" / "data"),
                    help="data dir with tokenizers/ (default: the repository's tests/data)")
    ap.add_argument("--force", action="store_true", help="rebuild even if STAMP matches")
    args = ap.parse_args()
    out = os.path.abspath(args.out)

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent invocations wait here
        if not args.force and up_to_date(out, args.preset):
            print(f"bench model up to date: {out} ({count_params(out):,} parameters)", flush=True)
            return 0
        for k, v in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                     ("TOKENIZERS_PARALLELISM", "false"), ("TRANSFORMERS_VERBOSITY", "error"),
                     ("HF_HUB_DISABLE_PROGRESS_BARS", "1")):
            os.environ.setdefault(k, v)
        stamp = os.path.join(out, "STAMP")
        if os.path.exists(stamp):
            os.remove(stamp)
        params = build(out, args.preset, args.data)
        assert params == count_params(out), (params, count_params(out))
        with open(stamp, "w") as f:
            f.write(stamp_text(args.preset) + "\n")
    print(f"bench model ({args.preset}) written: {out} ({params:,} parameters)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
