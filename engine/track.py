"""Stable object ids across frames: a small ByteTrack-style tracker over yolo-cl's detections.

Each frame, the tracks' boxes are predicted forward (constant velocity of centre and size,
scaled by the frames that passed, so live sources that drop frames still track), then matched
to the frame's detections of the same class by IoU with an optimal assignment (SciPy's
``linear_sum_assignment``), confident detections first and the rest against the tracks left
over (ByteTrack's two stages). A matched track takes the detection's box; a detection left over
starts a new track; a track unseen for more than ``max_age`` frames ends. Ids are never reused.

Why not a library: PyPI's maintained trackers could not be installed beside yolo-cl's
dependencies (see the README's tracking paragraph): supervision dropped ByteTrack after 0.26 and
its successor ``trackers``, like supervision 0.26, requires ``opencv-python``, a second OpenCV
wheel next to ``opencv-python-headless``; norfair requires NumPy < 2.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Iterable, Optional

import numpy as np


@dataclass
class _Track:
    track_id: int
    class_id: int
    box: np.ndarray                  # x1 y1 x2 y2 at the last update
    velocity: np.ndarray             # per frame: centre x, centre y, width, height
    frame: int                       # frame index of the last update
    hits: int = 1
    trail: deque = field(default_factory=lambda: deque(maxlen=32))

    def predicted(self, frame: int) -> np.ndarray:
        """The box expected at ``frame`` (constant velocity since the last update)."""
        dt = frame - self.frame
        cx, cy, w, h = _cxcywh(self.box) + self.velocity * dt
        w, h = max(w, 1.0), max(h, 1.0)
        return np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])


def _cxcywh(b: np.ndarray) -> np.ndarray:
    return np.array([(b[0] + b[2]) / 2, (b[1] + b[3]) / 2, b[2] - b[0], b[3] - b[1]])


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of each x1 y1 x2 y2 row of ``a`` with each of ``b``."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    a, b = a[:, None, :], b[None, :, :]
    iw = np.clip(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0, None)
    ih = np.clip(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0, None)
    inter = iw * ih
    union = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1]) + (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1]) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


class Tracker:
    """Assigns a ``track_id`` to each detection of a stream of frames (see the module docstring).

    ``max_age``: frames a track survives without a detection; ``min_iou``: the least overlap
    between a predicted track box and a detection to match them; ``high``: the confidence of
    the first matching stage (the rest are matched in the second); ``smoothing``: how much of
    the velocity estimate each update keeps (0: the last step alone)."""

    def __init__(self, max_age: int = 30, min_iou: float = 0.2, high: float = 0.5, smoothing: float = 0.6) -> None:
        self.max_age, self.min_iou, self.high, self.smoothing = max_age, min_iou, high, smoothing
        self.tracks: list = []
        self._next_id = 1
        self._frame = -1

    def update(self, detections: Iterable, frame: Optional[int] = None) -> list:
        """Copies of ``detections`` with ``track_id`` set. ``frame`` is the frame's index in the
        source (default: the previous one plus one); gaps count as frames the tracks moved through."""
        frame = self._frame + 1 if frame is None else int(frame)
        self._frame = frame
        dets = list(detections)
        self.tracks = [t for t in self.tracks if frame - t.frame <= self.max_age]
        ids: list = [None] * len(dets)
        free = set(range(len(self.tracks)))
        order = sorted(range(len(dets)), key=lambda i: -dets[i].confidence)
        for stage in ([i for i in order if dets[i].confidence >= self.high],
                      [i for i in order if dets[i].confidence < self.high]):
            self._match(dets, stage, free, ids, frame)
        for i in order:                                   # unmatched detections start tracks
            if ids[i] is None:
                t = _Track(self._next_id, dets[i].class_id, np.asarray(dets[i].box, float), np.zeros(4), frame)
                t.trail.append(_cxcywh(t.box)[:2])
                self._next_id += 1
                self.tracks.append(t)
                ids[i] = t.track_id
        return [replace(d, track_id=tid) for d, tid in zip(dets, ids)]

    def _match(self, dets: list, which: list, free: set, ids: list, frame: int) -> None:
        from scipy.optimize import linear_sum_assignment
        tracks = sorted(free)
        if not which or not tracks:
            return
        boxes = np.array([dets[i].box for i in which], float)
        pred = np.array([self.tracks[t].predicted(frame) for t in tracks])
        iou = iou_matrix(pred, boxes)
        same = np.array([[self.tracks[t].class_id == dets[i].class_id for i in which] for t in tracks])
        cost = np.where(same & (iou >= self.min_iou), 1.0 - iou, 2.0)
        rows, cols = linear_sum_assignment(cost)
        for r, c in zip(rows, cols):
            if cost[r, c] > 1.0:
                continue
            t = self.tracks[tracks[r]]
            new = np.asarray(dets[which[c]].box, float)
            dt = max(1, frame - t.frame)
            step = (_cxcywh(new) - _cxcywh(t.box)) / dt
            t.velocity = step if t.hits == 1 else self.smoothing * t.velocity + (1 - self.smoothing) * step
            t.box, t.frame, t.hits = new, frame, t.hits + 1
            t.trail.append(_cxcywh(new)[:2])
            ids[which[c]] = t.track_id
            free.discard(tracks[r])

    def trails(self) -> dict:
        """``{track_id: [(x, y), ...]}``: the recent box centres of every live track, oldest first."""
        return {t.track_id: [tuple(p) for p in t.trail] for t in self.tracks}
