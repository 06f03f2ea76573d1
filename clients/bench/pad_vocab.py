#!/usr/bin/env python3
"""Copy a HuggingFace model directory with its tokenizer padded to the
embedding's rows, for llama.cpp's converter (gyre-bench's L1).

Usage:
    .venv/bin/python clients/bench/pad_vocab.py SRC DST

llama.cpp wants one token per row of the embedding matrix; the bench model
(make_bench_model.py) has the phi-3 tokenizer's 32,011 tokens over 32,064
rows, as Phi-3 itself does. DST gets SRC's files (the weights linked, not
copied) with tokenizer.json's `added_tokens` extended by placeholder special
tokens `<|pad_N|>` for ids N from the tokenizer's size up to `vocab_size`
(config.json). The weights and every existing token are unchanged, so the
model computes what SRC's does; the placeholders are never produced by
tokenizing text.
"""

import json
import os
import shutil
import sys
from pathlib import Path


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    config = json.loads((src / "config.json").read_text())
    tokenizer = json.loads((src / "tokenizer.json").read_text())
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name == "tokenizer.json" or not f.is_file():
            continue
        if f.suffix == ".safetensors":
            os.symlink(f, dst / f.name)
        else:
            shutil.copy2(f, dst / f.name)
    ids = set(tokenizer["model"]["vocab"].values()) | {t["id"] for t in tokenizer["added_tokens"]}
    size = max(ids) + 1
    for n in range(size, config["vocab_size"]):
        tokenizer["added_tokens"].append({
            "id": n, "content": f"<|pad_{n}|>", "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True,
        })
    (dst / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    print(f"{dst}: {size} tokens padded to {config['vocab_size']}")


if __name__ == "__main__":
    main()
