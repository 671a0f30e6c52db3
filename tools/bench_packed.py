#!/usr/bin/env python3
"""A plain frame to the device: the whole frame against only the rows its resize reads, packed.

For each frame size (``--sizes WxH,...``) resized to the network's input (``--size``, ``--fit``),
times the upload the device path does for a plain (pageable) frame, taking turns, median of
``--reps`` (each waited for): ``staging.upload`` of the whole frame through pinned memory, and
``staging.upload_rows`` of the rows ``packed_rows`` names. Prints the bytes each way too. On a
GPU this is the copy and the DMA on a plain frame's critical path; on a CPU device the DMA is
another host copy.

    python tools/bench_packed.py --sizes 1280x720,1920x1080,3840x2160,4032x3024
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from yolo_cl import Detector, staging
from yolo_cl.kernels.preprocess import packed_rows, rows_share


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1280x720,1920x1080,3840x2160,4032x3024")
    ap.add_argument("--size", type=int, default=416, help="the network input")
    ap.add_argument("--fit", default=None, help="stretch, letterbox or crop (default: the model's)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--device")
    args = ap.parse_args()
    det = Detector("yolov3-tiny", input_size=args.size, device=args.device,
                   **({"fit": args.fit} if args.fit else {}))
    rt = det.runtime
    print(f"{rt.device_name}, network input {args.size}", flush=True)
    for spec in args.sizes.split(","):
        w, h = (int(v) for v in spec.lower().split("x"))
        frame = np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)
        place = det.placement(w, h)
        rows, _ = packed_rows(h, place.new_h)
        host = staging.pinned(rt, (frame.nbytes,), np.uint8)[1]
        dev = rt.alloc(frame.nbytes, "bench frame")

        def whole() -> None:
            for e in staging.upload(rt, dev, frame, host):
                e.wait()

        def packed() -> None:
            for e in staging.upload_rows(rt, dev, frame, rows, host):
                e.wait()
        ts: dict = {whole: [], packed: []}
        for fn in ts:
            fn()
        for _ in range(args.reps):
            for fn, t in ts.items():
                t0 = time.perf_counter()
                fn()
                t.append((time.perf_counter() - t0) * 1e3)
        a, b = (float(np.median(t)) for t in ts.values())
        used = "packed" if len(rows) <= rows_share(rt) * h else "whole"
        print(f"{w}x{h} -> {place.new_w}x{place.new_h} ({det.fit}): whole {frame.nbytes / 1e6:.2f} MB {a:.3f} ms; "
              f"packed {len(rows)} of {h} rows {len(rows) * w * 3 / 1e6:.2f} MB {b:.3f} ms ({b / a:.2f}x); "
              f"the device path sends it {used}", flush=True)


if __name__ == "__main__":
    main()
