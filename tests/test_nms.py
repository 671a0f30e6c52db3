"""NMS against a box-by-box reference written the way Darknet's do_nms_sort / diounms_sort are:
for each class, boxes sorted by falling probability; each box not yet suppressed zeroes the
probability of every later box it overlaps (IoU, or IoU minus DIoU's distance term)."""
from __future__ import annotations

import numpy as np
import pytest

from yolo_cl import postprocess as post


def _box_terms(a, b):
    """IoU and DIoU's d^2/c^2 of two xywh boxes, scalar by scalar in the boxes' precision."""
    ax1, ay1, ax2, ay2 = a[0] - a[2] / 2, a[1] - a[3] / 2, a[0] + a[2] / 2, a[1] + a[3] / 2
    bx1, by1, bx2, by2 = b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2
    iw = min(ax2, bx2) - max(ax1, bx1)
    ih = min(ay2, by2) - max(ay1, by1)
    inter = iw * ih if iw > 0 and ih > 0 else 0
    union = a[2] * a[3] + b[2] * b[3] - inter
    iou = inter / union if union > 0 else 0
    cw = max(ax2, bx2) - min(ax1, bx1)
    ch = max(ay2, by2) - min(ay1, by1)
    c2 = cw * cw + ch * ch
    d2 = (a[0] - b[0]) ** 2 + (a[1] - b[1]) ** 2
    return iou, (d2 / c2 if c2 > 0 else 0)


def reference_nms(boxes, probs, thresh, kind, beta):
    probs = probs.copy()
    for k in range(probs.shape[1]):
        order = sorted(range(len(boxes)), key=lambda i: -probs[i, k])
        for ii, i in enumerate(order):
            if probs[i, k] == 0:
                continue
            for j in order[ii + 1:]:
                iou, d = _box_terms(boxes[i], boxes[j])
                score = iou - d ** (0.6 if kind == "greedynms" else beta) if kind != "default" else iou
                if score > thresh:
                    probs[j, k] = 0
    return probs


@pytest.mark.parametrize("kind", ["default", "greedynms", "diounms"])
@pytest.mark.parametrize("n", [1, 7, 60, 300])
@pytest.mark.parametrize("way", ["short", "pairwise", "blocks"])
def test_nms_matches_the_box_by_box_reference(kind, n, way, monkeypatch):
    """Each way of running the greedy pass: one pass over lists for every class (``NMS_SHORT``),
    or per class with all overlaps computed once, or in blocks of 128 rows. Probabilities on a
    coarse grid, so ties (kept in row order, as a stable sort does) are exercised too."""
    monkeypatch.setattr(post, "NMS_SHORT", 10 ** 6 if way == "short" else 0)
    monkeypatch.setattr(post, "NMS_PAIRWISE", 10 ** 6 if way == "pairwise" else 0)
    rng = np.random.default_rng(n)
    # clustered boxes, so suppression chains (a box suppressed before it could suppress) occur
    centres = rng.random((max(1, n // 10), 2))
    xy = centres[rng.integers(0, len(centres), n)] + 0.03 * rng.standard_normal((n, 2))
    boxes = np.concatenate([xy, 0.05 + 0.15 * rng.random((n, 2))], 1).astype(np.float32)
    probs = rng.random((n, 3)) * (rng.random((n, 3)) < 0.7)
    if n == 60:
        probs = np.round(probs * 4) / 4
    probs = probs.astype(np.float32)
    got = post.nms(boxes, probs, 0.45, kind, beta=0.6)
    want = reference_nms(boxes, probs, 0.45, kind, 0.6)
    np.testing.assert_array_equal(got, want)
    if n >= 60:
        assert 0 < (got > 0).sum() < (probs > 0).sum()      # some boxes kept, some suppressed


def test_detections_best_first_clipped_and_unclipped():
    """``to_detections``: one Detection per (box, class) above the threshold, in pixels, falling
    confidence with ties in (row, class) order; the box clipped to the image, ``unclipped`` not."""
    boxes = np.array([[0.5, 0.5, 0.2, 0.2], [0.05, 0.9, 0.2, 0.4], [0.7, 0.3, 0.1, 0.1]])
    probs = np.array([[0.0, 0.6, 0.3], [0.6, 0.0, 0.9], [0.2, 0.6, 0.0]], np.float32)
    dets = post.to_detections(boxes, probs, 200, 100, 0.25, ["a", "b"])
    assert [(d.class_id, d.label) for d in dets] == [(2, "2"), (1, "b"), (0, "a"), (1, "b"), (2, "2")]
    assert [d.confidence for d in dets] == pytest.approx([0.9, 0.6, 0.6, 0.6, 0.3])
    assert [d.box for d in dets[1:3]] == [pytest.approx((80, 40, 120, 60)), pytest.approx((0, 70, 30, 100))]
    assert dets[2].unclipped == pytest.approx((-10, 70, 30, 110))
    assert all(isinstance(v, float) for d in dets for v in (d.confidence, *d.box, *d.unclipped))
    assert all(type(d.class_id) is int for d in dets)


@pytest.mark.parametrize("seed", range(4))
def test_detections_follow_a_stable_sort_by_falling_confidence(seed):
    """Many tied confidences: the order is NumPy's stable argsort of the negated confidences over
    the (row, class) pairs above the threshold, each with its own row's box."""
    rng = np.random.default_rng(seed)
    boxes = np.concatenate([rng.random((30, 2)), 0.05 + 0.3 * rng.random((30, 2))], 1).astype(np.float32)
    probs = (rng.integers(0, 5, (30, 6)) / 4).astype(np.float32)         # 0, .25, .5, .75, 1: ties everywhere
    dets = post.to_detections(boxes, probs, 640, 480, 0.25, None)
    rows, cls = (probs > 0.25).nonzero()
    conf = probs[rows, cls]
    order = np.argsort(-conf, kind="stable")
    assert [(d.class_id, d.confidence) for d in dets] == list(zip(cls[order].tolist(), conf[order].tolist()))
    x, y, w, h = boxes[rows[order]].astype(np.float64).T
    want = np.stack([(x - w / 2) * 640, (y - h / 2) * 480, (x + w / 2) * 640, (y + h / 2) * 480], 1)
    np.testing.assert_array_equal(np.array([d.unclipped for d in dets]), want)
    assert post.to_detections(boxes, probs, 640, 480, 1.0, None) == []


@pytest.mark.parametrize("fit", ["stretch", "letterbox", "crop"])
@pytest.mark.parametrize("n", [0, 1, 9, 40])
def test_placed_detections_equal_the_general_path(fit, n):
    """``placed_detections`` (the device-NMS list's fast path) gives exactly what correct_boxes,
    finite_only and to_detections give, for every fit's placement; a non-finite value sends
    the list back to that path (None)."""
    from yolo_cl.preprocess import placement
    rng = np.random.default_rng(n)
    boxes = np.concatenate([rng.random((n, 2)), 0.02 + 0.5 * rng.random((n, 2))], 1).astype(np.float32)
    probs = (rng.random((n, 5)) * (rng.random((n, 5)) < 0.4)).astype(np.float32)
    if n:
        probs[n // 2, 1] = probs[0, 3] = 0.7                  # a tie across rows: (row, class) order decides
    place = placement(fit, 1280, 720, 416, 416)
    got = post.placed_detections(boxes, probs, place, 1280, 720, 0.25, ["a", "b", "c"])
    want = post.to_detections(post.correct_boxes(boxes, place), probs, 1280, 720, 0.25, ["a", "b", "c"])
    assert got == want                          # bit-equal boxes, same order, labels and confidences
    if n:
        bad = probs.copy()
        bad[0, 0] = np.nan
        assert post.placed_detections(boxes, bad, place, 1280, 720, 0.25, None) is None
        far = boxes.copy()
        far[-1, 2] = np.inf
        assert post.placed_detections(far, probs, place, 1280, 720, 0.25, None) is None
