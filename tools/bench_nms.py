#!/usr/bin/env python3
"""NMS time, on the host and on the device.

Host (default): ``postprocess.nms`` on N random boxes of 80 classes, each class probability
non-zero for 10% of the boxes (about what a detector leaves at a low --thresh, e.g. for mAP
evaluation).
``--device``: the device NMS kernel (``yc_nms`` in cl/decode.cl) alone, on candidate sets in the
decode's row layout (a real frame's kind of list, a crowd of one class, every class live), device
time from profiling events; and ``Detector.detect`` of a 1280x720 frame (yolov3-tiny at 416, the
device path) with the NMS on the device and on the host, alternating in one process, from a
``frame_array`` frame and from a plain one.

    PYTHONPATH=.src python tools/bench_nms.py [N ...]
    . tools/gpu-setup.sh && python3 tools/bench_nms.py --device --precision fp32,fp16
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import cv2
import numpy as np

from yolo_cl import Detector, postprocess
from yolo_cl.kernels.decode import LIST_COLS, LIST_MAX, NMS_CLASSES, NMS_KINDS, NMS_MAX, nms_local
from yolo_cl.runtime import Runtime

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from bench_host import median_ms               # noqa: E402


def host(sizes: list) -> None:
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


def candidate_rows(rng, n: int, classes: int, live: int) -> np.ndarray:
    """n rows as the decode kernel writes them (g, x, y, w, h, objectness, probabilities), clustered
    boxes, probabilities in ``live`` of the classes."""
    centres = rng.random((max(1, n // 8), 2))
    xy = centres[rng.integers(0, len(centres), n)] + 0.03 * rng.standard_normal((n, 2))
    rows = np.zeros((n, classes + 6), np.float32)
    rows[:, 0] = rng.permutation(10 * n)[:n].astype(np.int32).view(np.float32)
    rows[:, 1:3], rows[:, 3:5], rows[:, 5] = xy, 0.05 + 0.15 * rng.random((n, 2)), 0.9
    cols = rng.permutation(classes)[:live]
    rows[:, 6 + cols] = rng.random((n, live)) * (rng.random((n, live)) < max(0.4, 1.0 / live))
    return rows


def kernel_times(reps: int) -> None:
    """Device time of yc_nms alone on a few candidate sets, median of ``reps`` profiled launches."""
    rt = Runtime(profiling=True)
    cl = rt.cl
    prg = rt.program("decode.cl", {"HALF_STORAGE": False, "NMS_MAX": NMS_MAX, "NMS_CLASSES": NMS_CLASSES})
    local = nms_local(rt)
    rng = np.random.default_rng(0)
    sets = {"9 boxes, 4 classes live": candidate_rows(rng, 9, 80, 4),
            f"{NMS_MAX} boxes, one class (a crowd)": candidate_rows(rng, NMS_MAX, 80, 1),
            "9 boxes, 80 classes live": candidate_rows(rng, 9, 80, 80),
            f"{NMS_MAX} boxes, 80 classes live": candidate_rows(rng, NMS_MAX, 80, 80)}
    for name, rows in sets.items():
        # buffers made once, as the decoder's are: a buffer's first use would be timed with the kernel
        buf = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE, rows.nbytes)
        cnt = cl.Buffer(rt.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                        hostbuf=np.array([len(rows)], np.int32))
        listed = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE, 8)
        dets = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE, LIST_MAX * LIST_COLS * 4)
        k = cl.Kernel(prg, "yc_nms")
        for kind in ("default", "greedynms"):
            k.set_args(cnt, buf, np.int32(len(rows)), np.int32(80), np.float32(0.45), np.int32(NMS_KINDS[kind]),
                       np.float32(0.6), np.float32(1), np.float32(1), listed, dets, np.int32(LIST_MAX))
            ts = []
            for _ in range(reps):
                cl.enqueue_copy(rt.queue, buf, rows)            # the kernel zeroes in place: fresh rows each time
                ev = cl.enqueue_nd_range_kernel(rt.queue, k, (local,), (local,))
                ev.wait()
                ts.append((ev.profile.end - ev.profile.start) / 1e3)
            print(f"yc_nms, {name}, {kind}: {statistics.median(ts[2:]):.1f} us", flush=True)


def detect_times(precision: str, rounds: int, calls: int) -> None:
    """detect of a 1280x720 frame, device NMS on / off alternating (``rounds`` x ``calls``)."""
    det = Detector("yolov3-tiny", precision=precision, device_preprocess=True, device_decode=True)
    img = cv2.resize(cv2.imread(str(ROOT / "models" / "images" / "dog.jpg")), (1280, 720))
    pinned = det.frame_array(720, 1280)
    pinned[...] = img
    for frame, label in ((pinned, "frame_array frame"), (img, "plain frame")):
        med: dict = {True: [], False: []}
        for _ in range(rounds):
            for on in (True, False):
                det.device_path.device_nms = on
                med[on].append(median_ms(lambda: det.detect(frame), calls, warm=5))
        print(f"yolov3-tiny 416 {precision}, detect of a 1280x720 {label}: NMS on the device "
              f"{statistics.median(med[True]):.3f} ms, on the host {statistics.median(med[False]):.3f} ms", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="*", type=int, help="host NMS: boxes per run (default 50 200 2000 10000)")
    ap.add_argument("--device", action="store_true", help="the device NMS kernel and detect with it on and off")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=100)
    a = ap.parse_args()
    if not a.device:
        host(a.sizes or [50, 200, 2000, 10000])
        return
    kernel_times(25)
    for p in a.precision.split(","):
        detect_times(p, a.rounds, a.calls)


if __name__ == "__main__":
    main()
