#!/usr/bin/env python3
"""Half arithmetic (``YOLO_CL_HALF_MATH``) accuracy: the accumulation choice, and a network's heads.

    python3 tools/check_half_math.py [--model yolov3-tiny] [--size 160] [--images DIR]

First a NumPy model of one GEMM output summed over K products of half inputs (weights
N(0, 1/K), inputs relu(N(0, 1)) as after a leaky conv), rounded as the kernels round: every
multiply-add in half over the whole K, in half over blocks of 16 (or 8, gemm_local's smallest
KWG) added in float (what the FMA families do), and in float (fp16 storage without half
arithmetic). Then ``--model`` at ``--size`` runs at fp32, at fp16 in float arithmetic and at
fp16 in half arithmetic (emulated where the device has no ``cl_khr_fp16``), and prints each
fp16 run's heads' relative error against fp32 (norm of the difference over the norm, per head,
on a fixed random input). With ``--images``, the detections on every .jpg there are compared
with fp32's as tools/check_mma.py does (same class, IoU >= 0.9, confidence within 0.02).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

import yolo_cl
from yolo_cl.precision import HALF_MATH_ENV


def summed(K: int, block: int, half: bool, n: int = 512, seed: int = 0) -> float:
    """Relative error (norm) of n dot products of length K with each ``block`` k steps summed in
    half (``half``) or float, the blocks added in float32, against float64."""
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((K, 1)) / np.sqrt(K)).astype(np.float16).astype(np.float32)
    b = np.maximum(rng.standard_normal((K, n)), 0).astype(np.float16).astype(np.float32)
    ref = (a.astype(np.float64) * b).sum(0)
    acc = np.zeros(n, np.float32)
    for k0 in range(0, K, block):
        h = np.zeros(n, np.float32)
        for k in range(k0, min(K, k0 + block)):
            h = a[k] * b[k] + h
            if half:
                h = h.astype(np.float16).astype(np.float32)
        acc += h
    return float(np.linalg.norm(acc - ref) / np.linalg.norm(ref))


def heads(model: str, size: int, precision: str, setting: str, blob: np.ndarray) -> tuple:
    os.environ[HALF_MATH_ENV] = setting
    det = yolo_cl.Detector(model, input_size=(size, size), precision=precision)
    return det, [np.asarray(h, np.float64) for h in det.forward(blob)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="yolov3-tiny")
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--images", help="folder of .jpg images for the detection comparison")
    args = ap.parse_args()
    print("one output summed over K (relative error vs float64): whole K in half | blocks of 16 | of 8 | float")
    for K in (27, 144, 1152, 4608):
        print(f"  K={K:5d}: {summed(K, K, True):.2e} | {summed(K, 16, True):.2e} | "
              f"{summed(K, 8, True):.2e} | {summed(K, K, False):.2e}")
    blob = np.random.default_rng(1).random((1, 3, args.size, args.size), dtype=np.float32)
    runs = {key: heads(args.model, args.size, *key, blob) for key in
            (("fp32", "off"), ("fp16", "off"), ("fp16", "emulate"))}
    ref = runs[("fp32", "off")][1]
    for key in (("fp16", "off"), ("fp16", "emulate")):
        errs = [float(np.linalg.norm(x - y) / np.linalg.norm(x)) for x, y in zip(ref, runs[key][1])]
        what = "float arithmetic" if key[1] == "off" else "half arithmetic (emulated)"
        print(f"{args.model} {args.size}x{args.size} fp16, {what}: heads relative error vs fp32 "
              + ", ".join(f"{e:.2e}" for e in errs))
    if args.images:
        import cv2
        sys.path.insert(0, str(Path(__file__).parent))
        from check_mma import unmatched
        for key in (("fp16", "off"), ("fp16", "emulate")):
            bad, total = 0, 0
            for path in sorted(Path(args.images).glob("*.jpg")):
                img = cv2.imread(str(path))
                a, b = runs[("fp32", "off")][0].detect(img), runs[key][0].detect(img)
                total += len(a)
                bad += len(unmatched(a, b) + unmatched(b, a))
            print(f"fp16 {key[1]}: {total} fp32 detections, {bad} unmatched either way")
    return 0


if __name__ == "__main__":
    sys.exit(main())
