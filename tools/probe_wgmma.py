#!/usr/bin/env python3
"""Hopper's wgmma through NVIDIA's OpenCL: does the patched-PTX road load, and how fast is it.

    python3 tools/probe_wgmma.py [--sizes 4096] [--configs MT=128/NT=128/SWZ=64/ST=3,...] [--reps 10]
                                 [--layouts kn,nk] [--shapes MxNxK,...] [--mma f16|tf32]

Prints the device, whether ``yolo_cl.kernels.gemm_wgmma``'s probe passes (its kernel built,
patched to sm_90a by ``yolo_cl.ptx`` and loaded as a binary, or refused with the reason under
``--verbose``), then for each square size and config the device time of ``yc_gemm_wgmma``
(profiling events, best of ``--reps`` after a warm-up) in TFLOP/s with its relative error against
NumPy on a 256-row slice, with B n-contiguous (``kn``: [K][N], as a conv's input planes) and
k-contiguous (``nk``: B transposed; the only layout at ``--mma tf32``, float operands). ``--shapes`` times M x N x K GEMMs instead of squares (e.g.
a network's convolutions as GEMMs: filters x pixels x inputs), each with the fastest config. ``tools/check_mma.py`` gives the mma.sync family's figures to compare.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np

from yolo_cl.kernels import gemm_wgmma as gw
from yolo_cl.runtime import Runtime

CONFIGS = [dict(MT=128, NT=128, SWZ=64, ST=3), dict(MT=128, NT=128, SWZ=64, ST=2),
           dict(MT=128, NT=128, SWZ=32, ST=4), dict(MT=128, NT=128, SWZ=32, ST=6),
           dict(MT=64, NT=128, SWZ=128, ST=2), dict(MT=128, NT=64, SWZ=128, ST=2),
           dict(MT=128, NT=256, SWZ=32, ST=4), dict(MT=256, NT=128, SWZ=32, ST=4),
           dict(MT=256, NT=128, SWZ=64, ST=2), dict(MT=128, NT=256, SWZ=64, ST=2),
           dict(MT=128, NT=128, SWZ=128, ST=3, AR=1), dict(MT=128, NT=128, SWZ=128, ST=2, AR=1),
           dict(MT=256, NT=128, SWZ=128, ST=3, AR=1)]       # AR: A in registers (f16 only)


def time_gemm(rt, cfg: dict, M: int, N: int, K: int, reps: int, b_kn: bool, mma: str = "f16") -> tuple:
    """(best ms, relative error on a row slice) of an M x N x K GEMM under ``cfg``."""
    cl = rt.cl
    rng = np.random.default_rng(0)
    dtype = np.float16 if mma == "f16" else np.float32
    A = rng.standard_normal((M, K), dtype=np.float32).astype(dtype)
    B = rng.standard_normal((K, N), dtype=np.float32).astype(dtype)
    g = gw.bound_gemm(rt, A, B if b_kn else np.ascontiguousarray(B.T), cfg, b_kn, mma)
    evs = [cl.enqueue_nd_range_kernel(rt.queue, g.kernel, g.gsize, g.lsize) for _ in range(reps + 1)]
    rt.queue.finish()
    ms = min(e.profile.end - e.profile.start for e in evs[1:]) * 1e-6
    out = np.empty((M, N), dtype)
    cl.enqueue_copy(rt.queue, out, g.c)
    rt.queue.finish()
    ref = A[:256].astype(np.float64) @ B.astype(np.float64)
    err = float(np.linalg.norm(out[:256].astype(np.float64) - ref) / np.linalg.norm(ref))
    return ms, err


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4096")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--configs", default="", help="','-separated configs, e.g. MT=128/NT=128/SWZ=64/ST=3")
    ap.add_argument("--shapes", default="", help="','-separated MxNxK GEMMs instead of --sizes")
    ap.add_argument("--layouts", default="kn,nk", help="B n-contiguous (kn) and/or k-contiguous (nk)")
    ap.add_argument("--mma", default="f16", choices=("f16", "tf32"), help="input type (tf32: float, B k-contiguous)")
    ap.add_argument("--verbose", action="store_true", help="say why the probe refuses")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    rt = Runtime(profiling=True)
    print(f"device: {rt.device_name} ({rt.vendor}, driver {rt.driver}); Hopper: {gw.hopper(rt)}; "
          f"emulated: {gw.emulated()}")
    t0 = time.perf_counter()
    ok = gw.available(rt)
    print(f"probe: {'yes' if ok else 'no'} ({time.perf_counter() - t0:.2f} s)", flush=True)
    if not ok:
        return 1
    configs = [{k: int(v) for k, v in (kv.split("=") for kv in c.split("/"))} for c in args.configs.split(",")] \
        if args.configs else CONFIGS
    shapes = [tuple(int(v) for v in t.split("x")) for t in args.shapes.split(",")] if args.shapes \
        else [(n, n, n) for n in (int(v) for v in args.sizes.split(","))]
    for (M, N, K), layout in ((shape, lay) for shape in shapes for lay in args.layouts.split(",")):
        best = None
        for cfg in configs:
            name = f"{M}x{N}x{K} B {layout} " + " ".join(f"{k}{v}" for k, v in cfg.items())
            why = gw.why_illegal(cfg, args.mma)
            if why is not None:
                if not args.shapes:
                    print(f"{name}: skipped ({why})")
                continue
            try:
                ms, err = time_gemm(rt, cfg, M, N, K, args.reps, layout == "kn", args.mma)
            except Exception as e:      # noqa: BLE001 - report and go on with the next config
                print(f"{name}: FAILED {str(e).splitlines()[0][:200]}", flush=True)
                continue
            if not args.shapes:
                print(f"{name}: {ms:.3f} ms {2 * M * N * K / ms / 1e9:.1f} TFLOP/s  rel err {err:.2e}", flush=True)
            if best is None or ms < best[0]:
                best = (ms, err, name)
        if args.shapes and best is not None:
            ms, err, name = best
            print(f"{name}: {ms * 1e3:.1f} us {2 * M * N * K / ms / 1e9:.1f} TFLOP/s  rel err {err:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
