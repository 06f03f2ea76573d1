#!/usr/bin/env python3
"""The GPU's measured device-to-device copy bandwidth (bytes read + written per
second; the median of 20 copies of 4 GiB after warm-up) and a large bf16
matrix product's rate: the two ceilings the decode figures are held against."""
import json
import statistics

import torch


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)


def main():
    n = 1 << 31  # bf16 elements: 4 GiB
    src = torch.randn(n // 2, device="cuda", dtype=torch.float32).view(torch.bfloat16)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src))
    bw = 2 * src.numel() * 2 / t
    del src, dst
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    tm = timed(lambda: a @ b, reps=10)
    print(json.dumps({"device": torch.cuda.get_device_name(0),
                      "copy_bytes_per_s": bw, "copy_tb_per_s": round(bw / 1e12, 3),
                      "bf16_matmul_tflops": round(2 * m ** 3 / tm / 1e12, 1)}))


if __name__ == "__main__":
    main()
