"""Network heads -> detections, as Darknet (AlexeyAB) decodes them.

``[yolo]``: logistic on x, y, objectness and classes (not with ``new_coords``), ``scale_x_y``,
box sizes from anchors; ``[region]``: logistic x, y, objectness and softmax classes;
``[Gaussian_yolo]``: [yolo] with a sigma per box coordinate that discounts the probabilities;
``[detection]`` (YOLOv1): boxes per grid cell of a flat vector. Boxes are mapped back with
``correct_yolo_boxes`` and suppressed per class by the head's ``nms_kind``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .preprocess import Placement


@dataclass
class Detection:
    """One detected object: class, confidence and box (x1, y1, x2, y2) in original image pixels."""

    class_id: int
    label: str
    confidence: float
    box: tuple                        # clipped to the image
    unclipped: Optional[tuple] = None  # the same box before clipping, as Darknet prints it
    track_id: Optional[int] = None     # a stable id across frames, when a Tracker assigned one

    def to_dict(self) -> dict:
        out = {"class_id": self.class_id, "label": self.label, "confidence": round(float(self.confidence), 6),
               "box": [round(float(v), 2) for v in self.box]}
        if self.track_id is not None:
            out["track_id"] = self.track_id
        return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def decode_yolo(raw: np.ndarray, p: dict, net_w: int, net_h: int, thresh: float):
    """One [yolo] head (C, H, W) -> (boxes xywh relative to the network input, objectness, probs)."""
    nm = len(p["mask"])
    c5 = p["classes"] + 5
    _, lh, lw = raw.shape
    x = raw.reshape(nm, c5, lh, lw).astype(np.float32)
    if not p["new_coords"]:
        x = x.copy()
        x[:, 0:2] = _sigmoid(x[:, 0:2])
        x[:, 4:] = _sigmoid(x[:, 4:])
    s = p["scale_x_y"]
    xy = x[:, 0:2] * s - 0.5 * (s - 1)
    obj = x[:, 4]
    keep = obj > thresh
    n_idx, row, col = np.nonzero(keep)
    anchors = np.asarray(p["anchors"], np.float32).reshape(-1, 2)[np.asarray(p["mask"])[n_idx]]
    bx = (col + xy[n_idx, 0, row, col]) / lw
    by = (row + xy[n_idx, 1, row, col]) / lh
    tw, th = x[n_idx, 2, row, col], x[n_idx, 3, row, col]
    if p["new_coords"]:
        bw = tw * tw * 4 * anchors[:, 0] / net_w
        bh = th * th * 4 * anchors[:, 1] / net_h
    else:
        bw = np.exp(tw) * anchors[:, 0] / net_w
        bh = np.exp(th) * anchors[:, 1] / net_h
    o = obj[n_idx, row, col]
    probs = o[:, None] * x[n_idx, 5:, row, col]
    probs = np.where(probs > thresh, probs, 0.0)
    return np.stack([bx, by, bw, bh], 1), o, probs


def decode_region(raw: np.ndarray, p: dict, thresh: float):
    """One [region] head (YOLOv2) -> (boxes, objectness, probs); Darknet sets objectness to 1."""
    n = p["num"]
    c5 = p["classes"] + 5
    _, lh, lw = raw.shape
    x = raw.reshape(n, c5, lh, lw).astype(np.float32)
    obj = _sigmoid(x[:, 4])
    cls = x[:, 5:]
    if p["softmax"]:
        e = np.exp(cls - cls.max(axis=1, keepdims=True))
        cls = e / e.sum(axis=1, keepdims=True)
    probs = obj[:, None] * cls                       # (n, classes, lh, lw)
    probs = np.where(probs > thresh, probs, 0.0)
    keep = probs.max(axis=1) > 0
    n_idx, row, col = np.nonzero(keep)
    anchors = np.asarray(p["anchors"], np.float32).reshape(-1, 2)[n_idx]
    bx = (col + _sigmoid(x[n_idx, 0, row, col])) / lw
    by = (row + _sigmoid(x[n_idx, 1, row, col])) / lh
    bw = np.exp(x[n_idx, 2, row, col]) * anchors[:, 0] / lw
    bh = np.exp(x[n_idx, 3, row, col]) * anchors[:, 1] / lh
    probs = probs[n_idx, :, row, col]
    return np.stack([bx, by, bw, bh], 1), np.ones(len(n_idx), np.float32), probs


def decode_gaussian_yolo(raw: np.ndarray, p: dict, net_w: int, net_h: int, thresh: float):
    """One [Gaussian_yolo] head (C, H, W) -> (boxes, objectness, probs), as get_gaussian_yolo_detections.

    Per anchor: x, y, w, h each as (mean, sigma), objectness, classes. Logistic on everything but the
    w and h means; scale_x_y on the x and y means; a class's probability is objectness x class x
    (1 - the mean of the four sigmas)."""
    nm = len(p["mask"])
    _, lh, lw = raw.shape
    x = raw.reshape(nm, p["classes"] + 9, lh, lw).astype(np.float32).copy()
    act = [0, 1, 2, 3, 5, 7] + list(range(8, p["classes"] + 9))
    x[:, act] = _sigmoid(x[:, act])
    s = p["scale_x_y"]
    x[:, [0, 2]] = x[:, [0, 2]] * s - 0.5 * (s - 1)
    keep = x[:, 8] > thresh
    n_idx, row, col = np.nonzero(keep)
    anchors = np.asarray(p["anchors"], np.float32).reshape(-1, 2)[np.asarray(p["mask"])[n_idx]]
    v = x[n_idx, :, row, col]                        # (boxes, classes + 9)
    bw = np.exp(v[:, 4]) * anchors[:, 0] / net_w
    bh = np.exp(v[:, 6]) * anchors[:, 1] / net_h
    bx = (col + v[:, 0]) / lw
    by = (row + v[:, 2]) / lh
    if p["yolo_point"] == "left_top":
        bx, by = bx + bw / 2, by + bh / 2
    elif p["yolo_point"] == "right_bottom":
        bx, by = bx - bw / 2, by - bh / 2
    obj = v[:, 8]
    uncertainty = (v[:, 1] + v[:, 3] + v[:, 5] + v[:, 7]) / 4
    probs = obj[:, None] * v[:, 9:] * (1 - uncertainty[:, None])
    probs = np.where(probs > thresh, probs, 0.0)
    return np.stack([bx, by, bw, bh], 1), obj, probs


def decode_detection(raw: np.ndarray, p: dict, thresh: float):
    """A YOLOv1 [detection] head (its flat input) -> (boxes, objectness, probs), as get_detection_detections.

    The input holds side*side cells of class scores (softmaxed when ``softmax``), then num confidences
    per cell, then num boxes (x, y, w, h) per cell; w and h are squared when ``sqrt``."""
    side, n, classes = p["side"], p["num"], p["classes"]
    cells = side * side
    v = raw.reshape(-1).astype(np.float32)
    cls = v[:cells * classes].reshape(cells, classes)
    if p["softmax"]:
        e = np.exp(cls - cls.max(axis=1, keepdims=True))
        cls = e / e.sum(axis=1, keepdims=True)
    scale = v[cells * classes:cells * (classes + n)].reshape(cells, n)
    box = v[cells * (classes + n):].reshape(cells, n, 4)
    cell = np.arange(cells)
    bx = (box[..., 0] + (cell % side)[:, None]) / side
    by = (box[..., 1] + (cell // side)[:, None]) / side
    power = 2 if p["sqrt"] else 1
    bw, bh = box[..., 2] ** power, box[..., 3] ** power
    probs = scale[:, :, None] * cls[:, None, :]      # (cells, n, classes)
    probs = np.where(probs > thresh, probs, 0.0).reshape(cells * n, classes)
    keep = probs.max(axis=1) > 0
    boxes = np.stack([bx, by, bw, bh], -1).reshape(cells * n, 4)
    return boxes[keep], scale.reshape(-1)[keep], probs[keep]


def correct_boxes(boxes: np.ndarray, place: Placement) -> np.ndarray:
    """Darknet's correct_yolo_boxes: undo the layout offset/scale; result relative to the image."""
    b = boxes.astype(np.float64)          # a copy: the caller's rows stay as they are
    b[:, 0] = (b[:, 0] * place.net_w - place.box_dx) / place.new_w
    b[:, 1] = (b[:, 1] * place.net_h - place.box_dy) / place.new_h
    b[:, 2] *= place.net_w / place.new_w
    b[:, 3] *= place.net_h / place.new_h
    return b


def all_finite(boxes: np.ndarray, probs: np.ndarray) -> bool:
    """Whether every box and probability is finite (the usual case, in two reductions)."""
    return bool(np.isfinite(boxes).all() and np.isfinite(probs).all())


def finite_only(boxes: np.ndarray, probs: np.ndarray) -> tuple:
    """(boxes, probs, dropped): rows whose box or scores are not finite removed (overflowing
    anchors or weights), so no NaN or infinity reaches NMS, printing or JSON."""
    if all_finite(boxes, probs):
        return boxes, probs, 0
    ok = np.isfinite(boxes).all(axis=1) & np.isfinite(probs).all(axis=1)
    return boxes[ok], probs[ok], int((~ok).sum())


def _corners(boxes: np.ndarray) -> tuple:
    """x1, y1, x2, y2 columns of xywh rows."""
    x, y, hw, hh = boxes[:, 0], boxes[:, 1], boxes[:, 2] / 2, boxes[:, 3] / 2
    return x - hw, y - hh, x + hw, y + hh


def _iou_terms(a: np.ndarray, b: np.ndarray, centres: bool = True):
    """IoU of each box of ``a`` (xywh rows) with each of ``b``, plus DIoU's centre-distance term
    (d^2 / c^2; None unless ``centres``, which plain NMS does not need): two (len(a), len(b)) arrays."""
    ax1, ay1, ax2, ay2 = (v[:, None] for v in _corners(a))
    bx1, by1, bx2, by2 = _corners(b)
    iw = np.minimum(ax2, bx2) - np.maximum(ax1, bx1)
    ih = np.minimum(ay2, by2) - np.maximum(ay1, by1)
    inter = np.maximum(iw, 0) * np.maximum(ih, 0)      # 0 unless both overlap
    union = (a[:, 2] * a[:, 3])[:, None] + b[:, 2] * b[:, 3] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(union > 0, inter / union, 0.0)
        if not centres:
            return iou, None
        cw = np.maximum(ax2, bx2) - np.minimum(ax1, bx1)
        ch = np.maximum(ay2, by2) - np.minimum(ay1, by1)
        c2 = cw * cw + ch * ch
        d2 = (a[:, 0, None] - b[:, 0]) ** 2 + (a[:, 1, None] - b[:, 1]) ** 2
        return iou, np.where(c2 > 0, d2 / c2, 0.0)


NMS_BLOCK = 128     # boxes whose overlaps with the later ones are computed in one NumPy pass
NMS_PAIRWISE = 1024  # up to this many candidate boxes, all their overlaps are computed once
NMS_SHORT = 64      # up to this many, the greedy pass runs over Python lists: a frame's usual few
                    # candidates then cost tens of microseconds, not a NumPy pass per class


def _suppresses(a: np.ndarray, b: np.ndarray, thresh: float, kind: str, beta: float) -> np.ndarray:
    """(len(a), len(b)) bool: would box a of ``a`` suppress box b of ``b``."""
    iou, dterm = _iou_terms(a, b, centres=kind in ("greedynms", "diounms"))
    if kind == "greedynms":
        return (iou - dterm ** 0.6) > thresh     # box_diou
    if kind == "diounms":
        return (iou - dterm ** beta) > thresh    # box_diounms
    return iou > thresh


def _greedy(boxes: np.ndarray, pairs: Optional[np.ndarray], thresh: float, kind: str, beta: float) -> np.ndarray:
    """Survivors of boxes sorted by falling probability: a box still alive suppresses every later
    one it overlaps. ``pairs`` is their suppression matrix, or None to compute it a block of
    ``NMS_BLOCK`` rows at a time; either way the Python loop per survivor only ANDs a mask."""
    alive = np.ones(len(boxes), bool)
    for s in range(0, len(boxes), NMS_BLOCK):
        rows = np.flatnonzero(alive[s:s + NMS_BLOCK]) + s
        if len(rows) == 0:
            continue
        over = pairs[rows, s:] if pairs is not None else _suppresses(boxes[rows], boxes[s:], thresh, kind, beta)
        for r, i in enumerate(rows):
            if alive[i]:
                alive[i + 1:] &= ~over[r, i + 1 - s:]
    return alive


def _nms_short(boxes: np.ndarray, probs: np.ndarray, thresh: float, kind: str, beta: float) -> tuple:
    """(rows, classes) that NMS zeroes, for a few boxes whose every row has a probability.

    Every (box, class) entry in one order -- class, then falling probability, then row, the
    order of the per-class stable sort -- and one pass that keeps an entry unless a kept entry
    of its class suppresses it: the same greedy rule as ``_greedy``, over Python lists."""
    over = _suppresses(boxes, boxes, thresh, kind, beta).tolist()
    rows, cls = np.nonzero(probs > 0)
    order = np.lexsort((rows, -probs[rows, cls], cls))
    gone_r, gone_k = [], []
    current, kept = -1, []
    for r, k in zip(rows[order].tolist(), cls[order].tolist()):
        if k != current:
            current, kept = k, []
        for s in kept:
            if over[s][r]:
                gone_r.append(r)
                gone_k.append(k)
                break
        else:
            kept.append(r)
    return gone_r, gone_k


def nms(boxes: np.ndarray, probs: np.ndarray, thresh: float, kind: str = "default", beta: float = 0.6) -> np.ndarray:
    """Darknet's per-class NMS (do_nms_sort / diounms_sort): zeroes suppressed entries of ``probs``.

    Overlaps depend on the boxes, not the class: for up to ``NMS_PAIRWISE`` candidate boxes
    they are computed once for all classes, beyond that per class in blocks (thousands of boxes
    a class, as a low ``--thresh`` for mAP evaluation gives, take milliseconds, not seconds).
    Up to ``NMS_SHORT`` boxes, one pass over lists (``_nms_short``) does every class at once.
    """
    probs = probs.copy()
    if thresh <= 0 or len(boxes) == 0:
        return probs
    live = np.flatnonzero((probs > 0).any(axis=1))
    if len(live) <= NMS_SHORT:
        gone_r, gone_k = _nms_short(boxes[live], probs[live], thresh, kind, beta)
        probs[live[gone_r], gone_k] = 0
        return probs
    pairs = _suppresses(boxes[live], boxes[live], thresh, kind, beta) if len(live) <= NMS_PAIRWISE else None
    for k in np.flatnonzero((probs[live] > 0).any(axis=0)):
        col = probs[live, k]
        o = np.argsort(-col, kind="stable")
        o = o[col[o] > 0]
        alive = _greedy(boxes[live[o]], None if pairs is None else pairs[np.ix_(o, o)], thresh, kind, beta)
        probs[live[o[~alive]], k] = 0
    return probs


def placed_detections(boxes: np.ndarray, probs: np.ndarray, place: Placement, img_w: int, img_h: int,
                      thresh: float, names: Optional[list]) -> Optional[list]:
    """``to_detections(correct_boxes(boxes, place), probs, ...)`` for candidates whose NMS is done
    (the device ran it), mapping only the boxes that become detections: a frame's list then costs
    a few NumPy calls, not a pass per column over every candidate. None if a box or probability
    is not finite: the general path drops those rows (``finite_only``) and warns."""
    if not all_finite(boxes, probs):
        return None
    return to_detections(boxes, probs, img_w, img_h, thresh, names, place)


def to_detections(boxes: np.ndarray, probs: np.ndarray, img_w: int, img_h: int, thresh: float,
                  names: Optional[list], place: Optional[Placement] = None) -> list:
    """Every (box, class) with probability above ``thresh``, in original pixels, best first.

    The boxes are relative to the image, or with ``place`` still to the network input: then each
    box that becomes a detection is mapped back with ``correct_boxes``' arithmetic. Corners are
    computed as ``_corners`` does, in Python floats (the same float64 arithmetic, without a NumPy
    call per column for a frame's few detections). The few selected rows are ordered by Python's
    stable sort (ties keep (row, class) order): four NumPy calls a frame, not nine, on the path a
    ``detect`` waits for after the device is done."""
    rows, cls = (probs > thresh).nonzero()
    if not rows.size:
        return []
    conf = probs[rows, cls].tolist()
    order = sorted(range(len(conf)), key=conf.__getitem__, reverse=True)
    return _in_pixels(order, cls.tolist(), conf, boxes[rows].tolist(), img_w, img_h, names, place)


def listed_detections(listed: np.ndarray, place: Placement, img_w: int, img_h: int,
                      names: Optional[list]) -> list:
    """``to_detections`` of what the device NMS kept and listed (``kernels.decode``: rows of g
    and class as int bits, probability, x, y, w, h relative to the network input, row as int
    bits, in any order; every entry above the threshold, every value finite): ordered as
    ``to_detections`` orders the rows sorted by g (falling probability, then g, then row, then
    class), mapped through ``place``. Three NumPy calls, whatever the candidates were."""
    if not len(listed):
        return []
    ints = listed.view(np.int32).tolist()        # whole rows: cheaper than picking columns in NumPy
    vals = listed[:, 2:7].tolist()
    order = sorted(range(len(ints)), key=lambda j: (-vals[j][0], ints[j][0], ints[j][7], ints[j][1]))
    return _in_pixels(order, [i[1] for i in ints], [v[0] for v in vals], [v[1:] for v in vals],
                      img_w, img_h, names, place)


def _in_pixels(order: list, cls: list, conf: list, boxes: list, img_w: int, img_h: int,
               names: Optional[list], place: Optional[Placement]) -> list:
    """Detections ``order`` picks of (class, confidence, xywh box) lists: the boxes relative to
    the image, or with ``place`` to the network input (mapped back with ``correct_boxes``'
    arithmetic); corners as ``_corners`` computes them, in Python floats (float64)."""
    w, h = float(img_w), float(img_h)
    if place is not None:           # correct_boxes' factors, once
        nw, nh, dx, dy, iw, ih = place.net_w, place.net_h, place.box_dx, place.box_dy, place.new_w, place.new_h
        sw, sh = nw / iw, nh / ih
    labels = names or ()
    out = []
    for i in order:
        k, c, (x, y, bw, bh) = cls[i], conf[i], boxes[i]
        if place is not None:
            x, y, bw, bh = (x * nw - dx) / iw, (y * nh - dy) / ih, bw * sw, bh * sh
        a, b, e, f = (x - bw / 2) * w, (y - bh / 2) * h, (x + bw / 2) * w, (y + bh / 2) * h
        out.append(Detection(k, labels[k] if k < len(labels) else str(k), c,
                             (a if a > 0.0 else 0.0, b if b > 0.0 else 0.0, e if e < w else w, f if f < h else h),
                             (a, b, e, f)))
    return out
