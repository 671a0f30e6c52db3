#!/usr/bin/env python3
"""The tensor-core family on a real NVIDIA GPU: probe, GEMM throughput sweep, accuracy.

    python3 tools/check_mma.py [--sizes 1024,2048,4096] [--reps 20] [--images DIR]

Prints the device and its compute capability, the probe's verdict per mode, then for each mode
(f16, tf32), square size and config the device time of ``yc_gemm_mma`` (OpenCL profiling
events, best of ``--reps`` after a warm-up) in TFLOP/s and its relative error against NumPy
(on a 512-row slice of C for the large sizes). The reference tests themselves run with
``python3 -m pytest tests/test_gemm_mma.py`` (real instruction where the probe passes).
With ``--images``, the bundled yolov3-tiny runs every image there at fp32, fp16 and tf32 and
reports whether each precision's detections match fp32's (same classes, IoU >= 0.9, confidence
within 0.02) and the heads' relative error.
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections import Counter

import numpy as np

from yolo_cl.kernels import gemm_mma as gm
from yolo_cl.kernels import i32
from yolo_cl.runtime import Runtime

CONFIGS = [dict(MWG=128, NWG=128, KWG=32, WM=2, WN=2), dict(MWG=128, NWG=128, KWG=32, WM=2, WN=4),
           dict(MWG=256, NWG=128, KWG=32, WM=4, WN=2), dict(MWG=128, NWG=256, KWG=32, WM=2, WN=4),
           # ST > 1: the cp.async ring (local memory caps the stages at 48 KB per work-group)
           dict(MWG=128, NWG=128, KWG=32, WM=2, WN=2, ST=2), dict(MWG=128, NWG=128, KWG=32, WM=2, WN=4, ST=2),
           dict(MWG=128, NWG=128, KWG=16, WM=2, WN=2, ST=3), dict(MWG=128, NWG=128, KWG=16, WM=2, WN=2, ST=4),
           dict(MWG=128, NWG=128, KWG=16, WM=2, WN=4, ST=4), dict(MWG=128, NWG=256, KWG=16, WM=2, WN=4, ST=3),
           dict(MWG=256, NWG=128, KWG=16, WM=4, WN=2, ST=2), dict(MWG=64, NWG=128, KWG=32, WM=2, WN=2, ST=3),
           dict(MWG=128, NWG=64, KWG=32, WM=2, WN=2, ST=3), dict(MWG=128, NWG=128, KWG=32, WM=4, WN=2, ST=2),
           # staged configs that fit tf32's twice-as-wide tiles in 48 KB (the last is tf32 only: k8)
           dict(MWG=128, NWG=128, KWG=16, WM=2, WN=4, ST=2), dict(MWG=128, NWG=128, KWG=8, WM=2, WN=4, ST=4)]


def registers(rt, program) -> str:
    """The registers per work-item NVIDIA's compiler reports for ``program`` (its build log under
    ``-cl-nv-verbose``), or "" where the log does not say."""
    log = program.get_build_info(rt.device, rt.cl.program_build_info.LOG) or ""
    found = re.findall(r"Used (\d+) registers", log)
    return f" {found[-1]} registers" if found else ""


def time_gemm(rt, mode: str, cfg: dict, n: int, reps: int) -> tuple:
    """(best ms, relative error on a row slice, registers) of an n x n x n GEMM under ``cfg``."""
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
    d = gm.defines({"HALF_STORAGE": half, "NO_BIAS": True}, cfg, n, n, n, mode, gm.b_vector(cfg, mode, False, n))
    (_, name, d, args, gs, ls), = gm.launch_specs(cfg, d, n, n, n, 1, 1, [a, bias], [b] + i32(0, 0, 0, n),
                                                  [c] + i32(0, 0, n), [c] + i32(0, 0), [])
    prg = rt.program("gemm_mma.cl", d)
    k = cl.Kernel(prg, name)
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
    return ms, err, registers(rt, prg)


def iou(a: tuple, b: tuple) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def unmatched(ref: list, got: list) -> list:
    """Detections of ``ref`` with no same-class detection in ``got`` at IoU >= 0.9 and confidence +-0.02."""
    return [r for r in ref if not any(g.class_id == r.class_id and iou(r.box, g.box) >= 0.9
                                      and abs(g.confidence - r.confidence) <= 0.02 for g in got)]


def accuracy(images: str) -> None:
    """fp16 / tf32 detections and heads of the bundled yolov3-tiny against fp32's."""
    from pathlib import Path

    import cv2

    import yolo_cl
    dets = {p: yolo_cl.Detector("yolov3-tiny", precision=p) for p in ("fp32", "fp16", "tf32")}
    print("precisions compute on:", {p: (d.mma or "FMA") for p, d in dets.items()})
    for p, d in dets.items():       # which kernels the convs run (tensor-core families, FMA ones)
        names = Counter(l.name for l in d.executor(1).launches if l.node.op == "conv")
        print(f"  {p} conv launches:", dict(names.most_common()))
    blob = np.random.default_rng(1).random((1, 3, 416, 416), dtype=np.float32)
    ref_heads = dets["fp32"].forward(blob)
    for p in ("fp16", "tf32"):
        err = max(float(np.linalg.norm(x - y) / np.linalg.norm(x)) for x, y in zip(ref_heads, dets[p].forward(blob)))
        bad, total = 0, 0
        for path in sorted(Path(images).glob("*.jpg")):
            img = cv2.imread(str(path))
            a, b = dets["fp32"].detect(img), dets[p].detect(img)
            miss = unmatched(a, b) + unmatched(b, a)
            total += len(a)
            bad += len(miss)
            if miss:
                print(f"  {p} {path.name}: {[(m.label, round(m.confidence, 3)) for m in miss]}")
        print(f"{p}: heads relative error {err:.2e}; {total} fp32 detections, {bad} unmatched either way", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,2048,4096")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--modes", default="f16,tf32")
    ap.add_argument("--images", help="folder of .jpg images for the detection accuracy check")
    ap.add_argument("--configs", default="",
                    help="','-separated configs to time instead of the built-in list, e.g. MWG=128/NWG=192/KWG=32/WM=2/WN=4/ST=2")
    ap.add_argument("--build-options", default="",
                    help="'|'-separated compiler option sets to sweep, e.g. '|-cl-nv-maxrregcount=128' "
                         "(each GEMM is timed under each; with NVIDIA, -cl-nv-verbose is added to report registers)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")     # the probe's verdict, if it says no
    rt = Runtime(profiling=True, binary_cache=not args.build_options)   # a cached binary has no build log
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
    option_sets = args.build_options.split("|") if args.build_options else [rt.build_options]
    verbose = "-cl-nv-verbose" if args.build_options and "NVIDIA" in rt.vendor.upper() else ""
    configs = [{k: int(v) for k, v in (kv.split("=") for kv in c.split("/"))} for c in args.configs.split(",")] \
        if args.configs else CONFIGS
    for mode in args.modes.split(","):
        if not ok[mode]:
            continue
        for n in (int(s) for s in args.sizes.split(",")):
            for cfg in configs:
                if gm.why_illegal(cfg, n, n, n, mode, lim=gm.device_limits(rt)) is not None:
                    continue
                for opts in option_sets:
                    rt.build_options = " ".join(o for o in (opts.strip(), verbose) if o)
                    try:
                        ms, err, regs = time_gemm(rt, mode, cfg, n, args.reps)
                    except Exception as e:      # noqa: BLE001 - report and go on with the next config
                        print(f"{mode} {n}^3 {cfg} [{opts}]: FAILED {str(e).splitlines()[0][:200]}", flush=True)
                        continue
                    print(f"{mode} {n}^3 {' '.join(f'{k}{v}' for k, v in cfg.items())}"
                          f"{f' [{opts}]' if args.build_options else ''}: {ms:.3f} ms "
                          f"{2 * n ** 3 / ms / 1e9:.1f} TFLOP/s  rel err {err:.2e}{regs}", flush=True)
    if args.images:
        accuracy(args.images)
    return 0


if __name__ == "__main__":
    sys.exit(main())
