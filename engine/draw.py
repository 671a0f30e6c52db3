"""Draw detections on an image: a box, a "label 87%" tag on a filled background, one colour per class.

Colours come from the class id alone (a fixed palette), so a class keeps its colour
across frames, images and runs. Line and text sizes follow the image size, so the
result reads the same on a thumbnail and on a 4K frame.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

import cv2
import numpy as np

from .preprocess import check_image

# Kelly-style distinct colours (RGB), bright enough for a filled label background.
PALETTE = ((255, 56, 56), (255, 157, 151), (255, 112, 31), (255, 178, 29), (207, 210, 49), (72, 249, 10),
           (146, 204, 23), (61, 219, 134), (26, 147, 52), (0, 212, 187), (44, 153, 168), (0, 194, 255),
           (52, 69, 147), (100, 115, 255), (0, 24, 236), (132, 56, 255), (82, 0, 133), (203, 56, 255),
           (255, 149, 200), (255, 55, 199))
FONT = cv2.FONT_HERSHEY_SIMPLEX


def class_color(class_id: int) -> tuple:
    """A bright BGR colour that depends only on ``class_id`` (20 distinct ones, then repeating)."""
    r, g, b = PALETTE[int(class_id) % len(PALETTE)]
    return b, g, r


def _text_color(bgr: tuple) -> tuple:
    """Black on light backgrounds, white on dark ones."""
    b, g, r = bgr
    return (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 150 else (255, 255, 255)


def _label(d, names: Optional[Sequence[str]]) -> str:
    return names[d.class_id] if names is not None and 0 <= d.class_id < len(names) else d.label


def draw(image_bgr: np.ndarray, detections: Iterable, names: Optional[Sequence[str]] = None,
         trails: Optional[dict] = None) -> np.ndarray:
    """An annotated copy of ``image_bgr``; the input is left untouched.

    ``detections`` are :class:`yolo_cl.Detection` objects (or anything with ``class_id``,
    ``label``, ``confidence`` and ``box`` = (x1, y1, x2, y2) in pixels). ``names``, if
    given, overrides each detection's label by class id. A tracked detection's id leads its
    label (``#7 person 91%``); ``trails`` (``Tracker.trails()``) draws each track's recent
    centres as a line in its class's colour.
    """
    out = check_image(image_bgr).copy()
    h, w = out.shape[:2]
    side = max(1, min(h, w))
    thick = max(1, round(side / 300))
    scale = max(0.35, side / 1000)
    text_thick = max(1, thick // 2)
    # One box per distinct box; other classes of the same box join its tag, as in Darknet.
    groups: dict = {}
    for d in detections:
        groups.setdefault(tuple(d.box), []).append(d)
    best_first = sorted((sorted(g, key=lambda d: -d.confidence) for g in groups.values()),
                        key=lambda g: -g[0].confidence)
    pad = max(1, thick)
    if trails:
        classes = {getattr(d, "track_id", None): d.class_id for g in best_first for d in g}
        for tid, points in trails.items():
            if tid in classes and len(points) > 1:
                pts = np.round(np.asarray(points, np.float64)).astype(np.int32).reshape(-1, 1, 2)
                cv2.polylines(out, [pts], False, class_color(classes[tid]), thick, cv2.LINE_AA)
    tags, taken = [], []
    for group in best_first:          # the best detections choose their tag's place first
        text = ", ".join(f"{_label(e, names)} {e.confidence * 100:.0f}%" for e in group)
        if getattr(group[0], "track_id", None) is not None:
            text = f"#{group[0].track_id} {text}"
        (tw, th), base = cv2.getTextSize(text, FONT, scale, text_thick)
        x1, y1, x2, y2 = (int(np.clip(round(v), 0, lim - 1)) for v, lim in zip(group[0].box, (w, h, w, h)))
        rect = _place_tag(x1, y1, x2, y2, tw + 2 * pad, th + base + 2 * pad, w, h, taken)
        taken.append(rect)
        tags.append((group[0], (x1, y1, x2, y2), text, rect, th))
    for d, (x1, y1, x2, y2), text, (tx, ty, tx2, ty2), th in reversed(tags):   # the best drawn last, on top
        color = class_color(d.class_id)
        cv2.rectangle(out, (x1, y1), (x2, y2), color, thick, cv2.LINE_AA)
        cv2.rectangle(out, (tx, ty), (tx2, ty2), color, cv2.FILLED)
        cv2.putText(out, text, (tx + pad, ty + pad + th), FONT, scale, _text_color(color), text_thick, cv2.LINE_AA)
    return out


def _overlaps(a: tuple, b: tuple) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _place_tag(x1: int, y1: int, x2: int, y2: int, tw: int, th: int, w: int, h: int, taken: list) -> tuple:
    """Where a ``tw`` x ``th`` tag of box (x1, y1, x2, y2) goes: above the box's top-left corner, else just
    inside it, else below the box, else inside its bottom edge, else stepped down from the top until it
    covers no tag placed before; the first candidate if nothing is free. Always inside the image."""
    tx = int(min(max(0, x1), max(0, w - tw)))

    def at(y: int) -> tuple:
        y = int(min(max(0, y), max(0, h - th)))
        return tx, y, tx + tw, y + th

    candidates = [at(y1 - th) if y1 - th >= 0 else at(y1), at(y1), at(y2), at(y2 - th)]
    candidates += [at(y) for y in range(y1 + th, y2 - th, th)]
    for rect in candidates:
        if not any(_overlaps(rect, t) for t in taken):
            return rect
    return candidates[0]
