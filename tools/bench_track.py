#!/usr/bin/env python3
"""Tracker comparison on a synthetic scene: id switches and time per frame.

N boxes of a few classes move at constant velocity across a 1280x720 frame (bouncing off the
edges, so same-class boxes cross), detections are the true boxes with pixel noise, a random 5%
are missed and confidences vary. An id switch is a frame where an object's id differs from the
one it had before. Compares yolo_cl.track.Tracker with motpy's MultiObjectTracker when motpy is
installed (``pip install motpy``; not a yolo-cl dependency).

usage: python tools/bench_track.py [--objects 30] [--frames 300] [--seed 0]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from yolo_cl import Detection
from yolo_cl.track import Tracker


def scene(objects: int, frames: int, seed: int):
    """Per frame: [(object index, Detection)]."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform((50, 50), (1230, 670), (objects, 2))
    vel = rng.uniform(-9, 9, (objects, 2))
    size = rng.uniform(30, 90, (objects, 2))
    cls = rng.integers(0, 3, objects)
    for _ in range(frames):
        pos += vel
        for k, hi in ((0, 1280), (1, 720)):
            out = (pos[:, k] < 0) | (pos[:, k] > hi)
            vel[out, k] *= -1
        dets = []
        for i in range(objects):
            if rng.random() < 0.05:
                continue
            c = pos[i] + rng.normal(0, 2, 2)
            w, h = size[i] + rng.normal(0, 2, 2)
            dets.append((i, Detection(int(cls[i]), str(cls[i]), float(rng.uniform(0.3, 0.95)),
                                      (c[0] - w / 2, c[1] - h / 2, c[0] + w / 2, c[1] + h / 2))))
        yield dets


def switches(ids: dict) -> int:
    return sum(sum(1 for a, b in zip(v, v[1:]) if a != b) for v in ids.values())


def run_ours(frames: list) -> tuple:
    import scipy.optimize  # noqa: F401  (the import is not the tracking)
    t, ids, t0 = Tracker(), {}, time.perf_counter()
    for f, dets in enumerate(frames):
        for (i, _), d in zip(dets, t.update([d for _, d in dets], frame=f)):
            ids.setdefault(i, []).append(d.track_id)
    return switches(ids), (time.perf_counter() - t0) / len(frames) * 1e3


def run_motpy(frames: list) -> tuple:
    from motpy import Detection as MD, MultiObjectTracker
    mot, ids, t0 = MultiObjectTracker(dt=1.0), {}, time.perf_counter()
    for dets in frames:
        mot.step([MD(box=np.array(d.box), score=d.confidence, class_id=d.class_id) for _, d in dets])
        tracks = mot.active_tracks(min_steps_alive=1)
        boxes = np.array([tr.box for tr in tracks]).reshape(-1, 4)
        for i, d in dets:              # motpy does not say which detection a track took: nearest box
            if len(boxes):
                ids.setdefault(i, []).append(tracks[int(np.abs(boxes - np.array(d.box)).sum(1).argmin())].id)
    return switches(ids), (time.perf_counter() - t0) / len(frames) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=30)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    frames = list(scene(a.objects, a.frames, a.seed))
    print(f"{a.objects} objects, {a.frames} frames, 5% missed detections")
    print(f"{'tracker':<12} {'id switches':>12} {'ms/frame':>9}")
    sw, ms = run_ours(frames)
    print(f"{'yolo-cl':<12} {sw:>12} {ms:>9.3f}")
    try:
        sw, ms = run_motpy(frames)
        print(f"{'motpy':<12} {sw:>12} {ms:>9.3f}")
    except ImportError:
        print("motpy        not installed (pip install motpy)")


if __name__ == "__main__":
    main()
