"""Decoded frames of a video file, for tests that feed or check whole clips."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import cv2


def read_frames(path: Path, limit: Optional[int] = None) -> list:
    """The BGR frames of ``path`` in order, all of them or the first ``limit``; fails if OpenCV cannot open it."""
    cap = cv2.VideoCapture(str(path))
    assert cap.isOpened(), f"OpenCV cannot open {path}"
    frames = []
    while limit is None or len(frames) < limit:
        ok, f = cap.read()
        if not ok:
            break
        frames.append(f)
    cap.release()
    return frames
