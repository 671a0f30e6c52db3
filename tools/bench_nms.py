"""NMS time on random boxes: N boxes, 80 classes, each class probability non-zero for 10% of the
boxes (about what a detector leaves at a low --thresh, e.g. for mAP evaluation).

    PYTHONPATH=... python tools/bench_nms.py [N ...]
"""
from __future__ import annotations

import sys
import time

import numpy as np

from yolo_cl import postprocess


def main(sizes: list) -> None:
    for n in sizes:
        rng = np.random.default_rng(n)
        boxes = np.concatenate([rng.random((n, 2)), 0.02 + 0.3 * rng.random((n, 2))], 1).astype(np.float32)
        probs = (rng.random((n, 80)) * (rng.random((n, 80)) < 0.1)).astype(np.float32)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            kept = postprocess.nms(boxes, probs, 0.45)
            times.append(time.perf_counter() - t)
        print(f"{n} boxes, {int((probs > 0).sum())} (box, class) pairs -> {int((kept > 0).sum())} kept: "
              f"median of 5 {np.median(times) * 1e3:.1f} ms")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [50, 200, 2000, 10000])
