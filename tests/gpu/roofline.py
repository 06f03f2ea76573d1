#!/usr/bin/env python3
"""Bytes one batch-1 decode step must read from GPU memory, from a model's
safetensors headers: every weight once, except the input embedding table
when the LM head is a separate tensor (a step reads one row of it), plus the
KV cache of `context` tokens. Divided by the measured copy bandwidth
(bandwidth.py's JSON), it gives the decode roofline in tokens per second.

    python3 tests/gpu/roofline.py MODEL_DIR BANDWIDTH_JSON CONTEXT [MEASURED_TOK_S...]
"""
import glob
import json
import os
import struct
import sys

SIZES = {"BF16": 2, "F16": 2, "F32": 4}


def weight_bytes(d):
    total, embed, tied = 0, 0, True
    for f in glob.glob(os.path.join(d, "*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
        for name, t in hdr.items():
            if name == "__metadata__":
                continue
            b = SIZES[t["dtype"]]
            for s in t["shape"]:
                b *= s
            total += b
            if name.endswith("embed_tokens.weight"):
                embed = b
            if name == "lm_head.weight":
                tied = False
    return total - (0 if tied else embed)


def main():
    d, bw_json, context = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(bw_json) as f:
        bw = json.loads(f.read().strip().splitlines()[-1])["copy_bytes_per_s"]
    cfg = json.load(open(os.path.join(d, "config.json")))
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * hd * 2 * context
    w = weight_bytes(d)
    roof = bw / (w + kv)
    out = {"model": os.path.basename(d.rstrip("/")), "weight_bytes_read": w, "kv_bytes_read": kv,
           "copy_tb_per_s": bw / 1e12, "roofline_tok_s": roof}
    for m in sys.argv[4:]:
        out.setdefault("measured", []).append({"tok_s": float(m), "of_roofline": float(m) / roof})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
