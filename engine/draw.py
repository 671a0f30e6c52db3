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


def draw(image_bgr: np.ndarray, detections: Iterable, names: Optional[Sequence[str]] = None) -> np.ndarray:
    """An annotated copy of ``image_bgr``; the input is left untouched.

    ``detections`` are :class:`yolo_cl.Detection` objects (or anything with ``class_id``,
    ``label``, ``confidence`` and ``box`` = (x1, y1, x2, y2) in pixels). ``names``, if
    given, overrides each detection's label by class id.
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
    ordered = sorted((sorted(g, key=lambda d: -d.confidence) for g in groups.values()),
                     key=lambda g: g[0].confidence)
    # The least confident first, so the best detections end up on top.
    for group in ordered:
        d = group[0]
        color = class_color(d.class_id)
        x1, y1, x2, y2 = (int(round(v)) for v in d.box)
        x1, x2 = np.clip([x1, x2], 0, w - 1)
        y1, y2 = np.clip([y1, y2], 0, h - 1)
        cv2.rectangle(out, (int(x1), int(y1)), (int(x2), int(y2)), color, thick, cv2.LINE_AA)
        text = ", ".join(f"{_label(e, names)} {e.confidence * 100:.0f}%" for e in group)
        (tw, th), base = cv2.getTextSize(text, FONT, scale, text_thick)
        pad = max(1, thick)
        tag_h = th + base + 2 * pad
        # The tag sits on top of the box, or just inside it when the box touches the top edge.
        ty = int(y1) - tag_h if int(y1) - tag_h >= 0 else int(y1)
        tx = int(min(max(0, int(x1) - thick // 2), max(0, w - tw - 2 * pad)))
        cv2.rectangle(out, (tx, ty), (tx + tw + 2 * pad, ty + tag_h), color, cv2.FILLED)
        cv2.putText(out, text, (tx + pad, ty + pad + th), FONT, scale, _text_color(color), text_thick, cv2.LINE_AA)
    return out
