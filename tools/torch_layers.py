#!/usr/bin/env python3
"""Where the PyTorch peer's time goes: its CUDA kernels per forward, by kernel name (torch.profiler
over 20 eager runs after 20 warm-ups), for ``torch_darknet.py``'s model (``../shared/gpu``: the
peer of BENCHMARKS.md's comparisons) in fp16 or tf32, channels-last, ``cudnn.benchmark`` on.

    TORCH_DARKNET=../shared/gpu python3 tools/torch_layers.py CFG WEIGHTS SIZE BATCH PREC OUT.txt

Needs PyTorch with CUDA (the GPU machine's image); not part of yolo-cl.
"""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.environ.get("TORCH_DARKNET", os.path.join(os.path.dirname(__file__), "..", ".bench")))
import torch_darknet as td  # noqa: E402

RUNS = 20


def main() -> None:
    cfg, wts, size, batch, prec, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
    torch.backends.cudnn.benchmark = True
    td.set_tf32(prec == "tf32")
    dt = torch.float16 if prec == "fp16" else torch.float32
    m = td.Darknet(cfg, fold=True, size=size).eval()
    m.load_weights(wts)
    m = m.cuda().to(dtype=dt).to(memory_format=torch.channels_last)
    x = torch.rand(batch, 3, size, size).cuda().to(dt).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        for _ in range(RUNS):
            m(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(RUNS):
                m(x)
            torch.cuda.synchronize()
    kernels = [(e.device_time_total / RUNS / 1000.0, e.count // RUNS, e.key) for e in prof.key_averages()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort(reverse=True)
    lines = [f"{ms:.4f} ms x{n}: {name[:160]}" for ms, n, name in kernels]
    lines.append(f"all kernels {sum(k[0] for k in kernels):.3f} ms per forward ({prec}, {size}, batch {batch})")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[:30] + lines[-1:]))


if __name__ == "__main__":
    main()
