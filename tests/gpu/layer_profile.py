#!/usr/bin/env python3
"""Device time of each operation of one decode step at batch 1, on a GPU.

Times, with PyTorch on the GPU machine, the operations a Llama decode step
runs per layer (the projections through cuBLAS as F.linear, as gyre's CUDA
path and transformers run them; libtorch's varlen flash attention over
gathered keys, as gyre's flash path; the small elementwise kernels), each
captured 64 times in a CUDA graph and replayed, so launch cost is what a
graph pays. Prints microseconds per call and, for the projections, the
bytes of weight read per second against the measured copy bandwidth.

    python3 tests/gpu/layer_profile.py [--shape llama-3-8b] [--context 256] [--bandwidth OUT/bandwidth.json]
"""

import argparse
import json

import torch
import torch.nn.functional as F

SHAPES = {
    "llama-3-8b": dict(hidden=4096, inter=14336, heads=32, kv_heads=8, head_dim=128,
                       vocab=128256, layers=32),
    "llama-3.2-1b": dict(hidden=2048, inter=8192, heads=32, kv_heads=8, head_dim=64,
                         vocab=128256, layers=16),
}


def graph_time_us(fn, reps=64, rounds=20):
    """Mean device time of fn() replayed from a CUDA graph of `reps` calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(rounds):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / (rounds * reps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-3-8b", choices=sorted(SHAPES))
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--bandwidth", default=None, help="bandwidth.json from tests/gpu/bandwidth.py")
    a = ap.parse_args()
    c = SHAPES[a.shape]
    dev, bf = "cuda", torch.bfloat16
    torch.manual_seed(0)
    h, i, nh, nkv, hd = c["hidden"], c["inter"], c["heads"], c["kv_heads"], c["head_dim"]
    copy = json.load(open(a.bandwidth))["copy_bytes_per_s"] if a.bandwidth else None
    x = torch.randn(1, h, device=dev, dtype=bf)
    rows = []

    def linear(name, n_out, n_in):
        w = torch.randn(n_out, n_in, device=dev, dtype=bf) * 0.02
        xi = torch.randn(1, n_in, device=dev, dtype=bf)
        us = graph_time_us(lambda: F.linear(xi, w))
        rows.append((name, us, w.numel() * 2))

    linear("qkv projection", (nh + 2 * nkv) * hd, h)
    linear("o projection", h, nh * hd)
    linear("gate_up projection", 2 * i, h)
    linear("down projection", h, i)
    per_layer_linear = sum(r[1] for r in rows)
    slots = 4096
    kc = torch.randn(slots, nkv, hd, device=dev, dtype=bf)
    vc = torch.randn(slots, nkv, hd, device=dev, dtype=bf)
    gather = torch.randperm(slots, device=dev)[: a.context]
    rows.append(("gather keys (index_select)", graph_time_us(lambda: kc.index_select(0, gather)), None))
    q = torch.randn(1, nh, hd, device=dev, dtype=bf)
    k, v = kc.index_select(0, gather), vc.index_select(0, gather)
    cu_q = torch.tensor([0, 1], device=dev, dtype=torch.int32)
    cu_k = torch.tensor([0, a.context], device=dev, dtype=torch.int32)
    used = torch.tensor([a.context], device=dev, dtype=torch.int32)

    def flash():
        return torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, 1, a.context, 0.0, True, False, scale=hd ** -0.5,
            seqused_k=used)

    try:
        rows.append(("flash attention (varlen, 1 query)", graph_time_us(flash), None))
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"flash attention: {e}")
    w = torch.randn(h, device=dev, dtype=bf)
    rows.append(("rms_norm (libtorch)", graph_time_us(lambda: F.rms_norm(x, (h,), w, 1e-5)), None))
    rows.append(("residual add", graph_time_us(lambda: x + x), None))
    gu = torch.randn(1, 2 * i, device=dev, dtype=bf)
    rows.append(("silu(gate) * up (two kernels)", graph_time_us(lambda: F.silu(gu[:, :i]) * gu[:, i:]), None))
    lm = torch.randn(c["vocab"], h, device=dev, dtype=bf) * 0.02
    lm_us = graph_time_us(lambda: F.linear(x, lm))
    rows.append(("lm_head (once a step)", lm_us, lm.numel() * 2))
    del lm
    print(f"{a.shape}, batch 1, {a.context} keys, {torch.cuda.get_device_name()}")
    out = []
    for name, us, nbytes in rows:
        line = f"  {name:36s} {us:8.2f} us"
        rec = {"op": name, "us": round(us, 3)}
        if nbytes:
            bw = nbytes / (us * 1e-6)
            line += f"   {bw / 1e12:5.2f} TB/s"
            rec["weight_tb_per_s"] = round(bw / 1e12, 3)
            if copy:
                line += f" ({100 * bw / copy:4.0f}% of copy bandwidth)"
        print(line)
        out.append(rec)
    step_linear = per_layer_linear * c["layers"] + lm_us
    print(f"  projections of a whole step (x{c['layers']} layers + lm_head): {step_linear / 1000:.3f} ms")
    print(json.dumps({"shape": a.shape, "context": a.context, "ops": out,
                      "step_projections_ms": round(step_linear / 1000, 4)}))


if __name__ == "__main__":
    main()
