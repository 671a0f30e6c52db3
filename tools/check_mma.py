#!/usr/bin/env python3
"""The tensor-core family on a real NVIDIA GPU: probe, GEMM throughput sweep, accuracy.

    python3 tools/check_mma.py [--sizes 1024,2048,4096] [--reps 20]

Prints the device and its compute capability, the probe's verdict per mode, then for each mode
(f16, tf32), square size and config the device time of ``yc_gemm_mma`` (OpenCL profiling
events, best of ``--reps`` after a warm-up) in TFLOP/s and its relative error against NumPy
(on a 512-row slice of C for the large sizes). The reference tests themselves run with
``python3 -m pytest tests/test_gemm_mma.py`` (real instruction where the probe passes).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np

from yolo_cl.kernels import gemm_mma as gm
from yolo_cl.kernels import i32
from yolo_cl.runtime import Runtime

CONFIGS = [dict(MWG=128, NWG=128, KWG=32, WM=2, WN=2), dict(MWG=128, NWG=128, KWG=32, WM=2, WN=4),
           dict(MWG=256, NWG=128, KWG=32, WM=4, WN=2), dict(MWG=128, NWG=256, KWG=32, WM=2, WN=4),
           dict(MWG=128, NWG=128, KWG=64, WM=2, WN=2), dict(MWG=64, NWG=128, KWG=32, WM=2, WN=2)]


def time_gemm(rt, mode: str, cfg: dict, n: int, reps: int) -> tuple:
    """(best ms, relative error on a row slice) of an n x n x n GEMM under ``cfg``."""
    cl = rt.cl
    rng = np.random.default_rng(0)
    half = mode == "f16"
    dt = np.float16 if half else np.float32
    A = rng.standard_normal((n, n), dtype=np.float32)
    B = rng.standard_normal((n, n), dtype=np.float32).astype(dt)
    a = rt.upload(gm.pack_weights(A, 1, mode), "A")
    b = rt.upload(B, "B")
    c = rt.alloc(n * n * np.dtype(dt).itemsize, "C")
    bias = rt.upload(np.zeros(n, np.float32), "bias")
    d = gm.defines({"HALF_STORAGE": half, "NO_BIAS": True}, cfg, n, n, n, mode)
    (_, name, d, args, gs, ls), = gm.launch_specs(cfg, d, n, n, n, 1, 1, [a, bias], [b] + i32(0, 0, 0, n),
                                                  [c] + i32(0, 0, n), [c] + i32(0, 0), [])
    k = cl.Kernel(rt.program("gemm_mma.cl", d), name)
    k.set_args(*args)
    evs = [cl.enqueue_nd_range_kernel(rt.queue, k, gs, ls) for _ in range(reps + 1)]
    rt.queue.finish()
    ms = min((e.profile.end - e.profile.start) for e in evs[1:]) * 1e-6
    out = np.empty((n, n), dt)
    cl.enqueue_copy(rt.queue, out, c)
    rt.queue.finish()
    rows = slice(0, min(n, 512))
    Ar = A[rows].astype(np.float16) if half else gm.tf32_round(A[rows])
    Br = B if half else gm.tf32_round(B)
    ref = Ar.astype(np.float64) @ Br.astype(np.float64)
    err = float(np.linalg.norm(out[rows].astype(np.float64) - ref) / np.linalg.norm(ref))
    return ms, err


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,2048,4096")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--modes", default="f16,tf32")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")     # the probe's verdict, if it says no
    rt = Runtime(profiling=True)
    d = rt.device
    cc = ""
    if "cl_nv_device_attribute_query" in d.extensions:
        cc = f" compute capability {d.compute_capability_major_nv}.{d.compute_capability_minor_nv}"
    print(f"device: {rt.device_name} ({rt.vendor}, driver {rt.driver}){cc}; emulated={gm.emulated()}")
    ok = {}
    for mode in args.modes.split(","):
        t0 = time.perf_counter()
        ok[mode] = gm.available(rt, mode)
        print(f"probe {mode}: {'yes' if ok[mode] else 'no'} ({time.perf_counter() - t0:.2f} s)", flush=True)
    for mode in args.modes.split(","):
        if not ok[mode]:
            continue
        for n in (int(s) for s in args.sizes.split(",")):
            for cfg in CONFIGS:
                if gm.why_illegal(cfg, n, n, n, mode, lim=gm.device_limits(rt)) is not None:
                    continue
                try:
                    ms, err = time_gemm(rt, mode, cfg, n, args.reps)
                except Exception as e:      # noqa: BLE001 - report and go on with the next config
                    print(f"{mode} {n}^3 {cfg}: FAILED {str(e).splitlines()[0][:200]}", flush=True)
                    continue
                print(f"{mode} {n}^3 {' '.join(f'{k}{v}' for k, v in cfg.items())}: {ms:.3f} ms "
                      f"{2 * n ** 3 / ms / 1e9:.1f} TFLOP/s  rel err {err:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
