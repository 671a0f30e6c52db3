"""Pipelined vs sequential video detection on one clip: per-stage times and end-to-end fps.

Both modes do the same work per frame — decode, preprocess, forward, postprocess, draw,
encode to an mp4v file — once in a plain loop, once through yolo_cl.video.Pipeline (four
stage threads plus drawing/encoding in the caller). Example:

    PYTHONPATH=/tmp/src python tools/bench_video.py ../shared/videos/library1.mp4 --size 160 --batch 1 4
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import cv2

from yolo_cl import Detector
from yolo_cl.draw import draw
from yolo_cl.preprocess import to_blob
from yolo_cl.video import STAGES, StreamStats, open_source, Pipeline


def _writer(path: str, cap) -> cv2.VideoWriter:
    size = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
    return cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), cap.get(cv2.CAP_PROP_FPS) or 30.0, size)


def sequential(det: Detector, clip: str, out: str, thresh: float) -> StreamStats:
    """One thread, one frame at a time: the loop people write by hand."""
    stats = StreamStats(f"{clip} (sequential)")
    cap = cv2.VideoCapture(clip)
    writer = _writer(out, cap)
    t = stats.stages
    stats.started = time.monotonic()
    while True:
        t0 = time.perf_counter()
        ok, frame = cap.read()
        if not ok:
            break
        t1 = time.perf_counter()
        h, w = frame.shape[:2]
        place = det.placement(w, h)
        blob = to_blob(frame, place.net_w, place.net_h, place=place)[None]
        t2 = time.perf_counter()
        heads = det.forward(blob)
        t3 = time.perf_counter()
        dets = det.postprocess([o[0] for o in heads], w, h, thresh, 0.45, place)
        t4 = time.perf_counter()
        writer.write(draw(frame, dets, det.names))
        t5 = time.perf_counter()
        for name, dt in zip(STAGES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            t[name].add(dt)
        stats.latency.add(t4 - t0)
        stats.frames += 1
    stats.finished = time.monotonic()
    stats.end = "end of file"
    writer.release()
    cap.release()
    return stats


def pipelined(det: Detector, clip: str, out: str, thresh: float, batch: int) -> StreamStats:
    """The same work through the threaded pipeline; drawing and encoding in this thread."""
    cap = cv2.VideoCapture(clip)
    writer = _writer(out, cap)
    cap.release()
    pipe = Pipeline(det, open_source(clip), thresh=thresh, batch=batch)
    pipe.stats.source = f"{clip} (pipelined, batch {batch})"
    times = pipe.stats.stages["output"]
    for r in pipe:
        t0 = time.perf_counter()
        writer.write(draw(r.frame, r.detections, det.names))
        times.add(time.perf_counter() - t0)
    writer.release()
    pipe.source.close()
    return pipe.stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("clip", help="video file")
    ap.add_argument("--model", default="yolov3-tiny")
    ap.add_argument("--size", type=int, default=160, help="network input size (default 160)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1], help="pipeline batch sizes to try")
    ap.add_argument("--device", help="OpenCL device (default: $YOLO_CL_DEVICE, else the first GPU)")
    ap.add_argument("--thresh", type=float, default=0.25)
    ap.add_argument("--repeat", type=int, default=2, help="runs per mode; the fastest is reported (default 2)")
    ap.add_argument("--json", help="also write the results to this JSON file")
    a = ap.parse_args(argv)

    det = Detector(a.model, input_size=a.size, device=a.device)
    for b in a.batch:
        det.executor(b, det.input_size)      # compile every batch size before timing anything
    dev = det.runtime.device
    print(f"device: {dev.name.strip()} ({dev.platform.name.strip()}), {a.model} at {a.size}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    results = []
    modes = [lambda out: sequential(det, a.clip, out, a.thresh)]
    modes += [lambda out, b=b: pipelined(det, a.clip, out, a.thresh, b) for b in a.batch]
    best: list = [None] * len(modes)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "out.mp4")
        sequential(det, a.clip, out, a.thresh)     # warm-up: caches, first-frame allocations
        for _ in range(a.repeat):                  # interleaved, so a busy machine hits all modes alike
            for i, mode in enumerate(modes):
                st = mode(out)
                if best[i] is None or st.fps > best[i].fps:
                    best[i] = st
    runs = best
    for st in runs:
        print(st.format())
        results.append(st.as_dict())
    base = runs[0].fps
    for st in runs[1:]:
        print(f"{st.source}: {st.fps / base:.2f}x the sequential loop")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": dev.name.strip(), "model": a.model, "size": a.size,
                                            "cpus": os.cpu_count(), "load": os.getloadavg()[0],
                                            "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
