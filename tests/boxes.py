"""Box overlap for tests that match detections, written independently of yolo_cl.postprocess."""
from __future__ import annotations

import numpy as np


def iou(a, b) -> float:
    """Intersection over union of two (x1, y1, x2, y2) boxes; 0 when both are empty."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def same_detections(a: list, b: list, tol: float = 1e-3) -> bool:
    """Same classes in the same order, confidences and boxes (pixels) within ``tol``: the host
    and device decodes compute box centres in float64 and float32."""
    if len(a) != len(b):
        return False
    return all(x.class_id == y.class_id and abs(x.confidence - y.confidence) <= tol
               and np.abs(np.subtract(x.box, y.box)).max() <= tol for x, y in zip(a, b))
