"""Tracking ids: a synthetic video of boxes drawn with OpenCV (two of one class crossing, one occluded,
one missed for a frame and for several) keeps every object's id."""
from __future__ import annotations

import cv2
import numpy as np

from yolo_cl import Detection, draw
from yolo_cl.track import Tracker

W, H, FRAMES = 640, 360, 64
# name: (class, colour BGR, start centre, velocity per frame, size)
OBJECTS = {"a": (0, (0, 0, 255), (60, 150), (8.0, 0.6), (60, 80)),      # left to right
           "b": (0, (0, 255, 0), (580, 175), (-8.0, -0.4), (60, 80)),   # right to left: crosses a at frame ~32
           "c": (2, (255, 0, 0), (100, 300), (7.0, -2.0), (40, 30)),
           "d": (0, (0, 255, 255), (320, 40), (0.0, 0.0), (50, 50))}    # standing still
MISSED = {("c", 20), ("d", 10), ("d", 11), ("d", 12), ("d", 13), ("d", 14)}


def synthetic_video():
    """Frames (drawn in order a, b, c, d: b hides part of a where they cross) and, per frame, the
    detections a detector would give: each object's visible pixels' bounding box."""
    for f in range(FRAMES):
        img = np.zeros((H, W, 3), np.uint8)
        for name, (_, color, (x, y), (vx, vy), (bw, bh)) in OBJECTS.items():
            cx, cy = x + vx * f, y + vy * f
            cv2.rectangle(img, (int(cx - bw / 2), int(cy - bh / 2)), (int(cx + bw / 2), int(cy + bh / 2)), color, -1)
        dets = []
        for name, (cls, color, *_rest) in OBJECTS.items():
            mask = cv2.inRange(img, color, color)
            if (name, f) in MISSED or cv2.countNonZero(mask) < 200:
                continue
            x, y, w, h = cv2.boundingRect(mask)
            dets.append((name, Detection(cls, str(cls), 0.9 - 0.3 * (name == "b" and 28 <= f <= 36),
                                         (float(x), float(y), float(x + w), float(y + h)))))
        yield f, img, dets


def test_ids_survive_crossing_occlusion_and_missed_frames():
    tracker = Tracker(max_age=10)
    seen: dict = {}
    for f, img, dets in synthetic_video():
        out = tracker.update([d for _, d in dets], frame=f)
        assert [d.box for d in out] == [d.box for _, d in dets]          # the detections themselves are kept
        for (name, _), d in zip(dets, out):
            seen.setdefault(name, set()).add(d.track_id)
        if f == 31:
            annotated = draw(img, out, trails=tracker.trails())
            assert annotated.shape == img.shape and not np.array_equal(annotated, img)
    assert all(len(ids) == 1 for ids in seen.values()), seen               # one id per object, start to end
    assert len({next(iter(ids)) for ids in seen.values()}) == len(OBJECTS)  # and different objects differ


def test_ids_end_after_max_age_and_skipped_frames_still_match():
    t = Tracker(max_age=3)
    box = (100.0, 100.0, 140.0, 140.0)
    first = t.update([Detection(0, "x", 0.9, box)], frame=0)[0].track_id
    moved = (130.0, 100.0, 170.0, 140.0)                                   # 30 px in 3 frames (frames dropped)
    assert t.update([Detection(0, "x", 0.9, (110.0, 100.0, 150.0, 140.0))], frame=1)[0].track_id == first
    assert t.update([Detection(0, "x", 0.9, moved)], frame=3)[0].track_id == first
    assert t.update([Detection(0, "x", 0.9, (200.0, 100.0, 240.0, 140.0))], frame=10)[0].track_id != first
    assert t.update([], frame=11) == []
    other = t.update([Detection(1, "y", 0.9, (200.0, 100.0, 240.0, 140.0))], frame=12)[0]
    assert other.track_id not in (first, None)                              # another class: another track
    assert Detection(0, "x", 0.9, box, track_id=7).to_dict()["track_id"] == 7
    assert "track_id" not in Detection(0, "x", 0.9, box).to_dict()


def test_detect_track_on_a_real_clip(tmp_path):
    """``yolo-cl detect clip --track --jsonl`` end to end: every detection carries a track id, and ids
    persist across frames (the clip's people stay in view)."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    clip = Path(__file__).resolve().parents[1].parent / "shared" / "videos" / "library1.mp4"
    jl, out = tmp_path / "t.jsonl", tmp_path / "t.mp4"
    r = subprocess.run([sys.executable, "-m", "yolo_cl", "detect", str(clip), "--size", "160", "--track",
                        "--thresh", "0.2", "--jsonl", str(jl), "--out", str(out)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    frames = [json.loads(line) for line in jl.read_text().splitlines()]
    assert len(frames) == 69 and out.stat().st_size > 0
    objs = [o for f in frames for o in f["objects"]]
    assert objs and all(isinstance(o["track_id"], int) for o in objs)
    ids = [o["track_id"] for o in objs]
    assert max(ids.count(i) for i in set(ids)) >= 20          # some object keeps its id for 20+ frames
