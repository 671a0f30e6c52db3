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
from torch.profiler import profile, ProfilerActivity, record_function

sys.path.insert(0, os.environ.get("TORCH_DARKNET", os.path.join(os.path.dirname(__file__), "..", ".bench")))
import torch_darknet as td  # noqa: E402

cfg, wts, size, batch, prec, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
torch.backends.cudnn.benchmark = True
td.set_tf32(prec == 'tf32')
dt = torch.float16 if prec == 'fp16' else torch.float32
m = td.Darknet(cfg, fold=True, size=size).eval()
m.load_weights(wts)
m = m.cuda().to(dtype=dt).to(memory_format=torch.channels_last)
x = torch.rand(batch, 3, size, size).cuda().to(dt).contiguous(memory_format=torch.channels_last)
for i, mod in enumerate(m.mods):
    if isinstance(mod, td.Conv):
        f = mod.forward
        def wrapped(t, f=f, i=i, mod=mod):
            with record_function(f"L{i:03d} k{mod.k} s{mod.stride} n{mod.n}"):
                return f(t)
        mod.forward = wrapped
with torch.inference_mode():
    for _ in range(20):
        m(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            m(x)
        torch.cuda.synchronize()
rows = []
total = 0.0
for e in prof.key_averages():
    if e.key.startswith("L"):
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        rows.append((e.key, t / e.count / 1000.0))
rows.sort()
kern = {}
for e in prof.key_averages():
    if e.device_type == torch.autograd.DeviceType.CUDA if hasattr(e, "device_type") else False:
        kern[e.key] = (getattr(e, "device_time_total", 0.0) / 20 / 1000.0, e.count // 20)
with open(out, "w") as fo:
    for k, t in rows:
        fo.write(f"{k}  {t:.4f} ms\n")
        total += t
    fo.write(f"conv layers total {total:.3f} ms ({prec}, {size}, batch {batch})\n")
    for k, (t, c) in sorted(kern.items(), key=lambda kv: -kv[1][0])[:25]:
        fo.write(f"kernel {t:.4f} ms/iter x{c}: {k[:150]}\n")
print(open(out).read()[-3000:])
