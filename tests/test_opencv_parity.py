"""yolo-cl against OpenCV 4.x DNN (the reference Darknet importer).

- yolov3-tiny with the real COCO weights on every shared image: head inputs within 1e-3
  max abs, detections equal to OpenCV's (same classes, IoU >= 0.95, confidence within 0.01);
- every zoo cfg with random Darknet-format weights at a small input size: head inputs
  within 1e-3 of the head's largest magnitude, of OpenCV's and of the float64 NumPy forward's
  (where OpenCV's own float32 error exceeds half that, it bounds the agreement instead).
OpenCV's importer normalises with batchnorm eps 1e-6 where Darknet uses 1e-5; the parity tests
run yolo-cl with ``bn_eps=1e-6`` so both compute the same function, and one test bounds the
difference Darknet's own epsilon makes. OpenCV cannot import relu6 (efficientnet-lite3): there both engines run the cfg with relu
substituted (the same function on both sides), and the relu6 original is checked against
the float64 NumPy forward of tests/darknet_io.py.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

import yolo_cl

sys.path.insert(0, os.path.dirname(__file__))
import darknet_io  # noqa: E402
from boxes import iou  # noqa: E402
import opencv_ref  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
TINY_CFG = ROOT / "models" / "yolov3-tiny.cfg"
TINY_WEIGHTS = ROOT / "models" / "yolov3-tiny.weights"
IMAGES = sorted((SHARED / "images").glob("*.jpg"))
ZOO = sorted((ROOT / "models" / "cfg").glob("*.cfg"))
SMALL = {"yolov4x-mish": 96, "yolov7": 96}   # the deepest nets run at 96 px to keep CI short; others at 128


def clip(box, w, h):
    return (max(0.0, box[0]), max(0.0, box[1]), min(float(w), box[2]), min(float(h), box[3]))


OPENCV_BN_EPS = 1e-6


def test_shared_images_and_zoo_are_present():
    """The parametrised tests below need them; an empty list must fail, not skip."""
    assert len(IMAGES) >= 5 and len(ZOO) >= 12


@pytest.fixture(scope="module")
def tiny():
    return yolo_cl.Detector(str(TINY_CFG), str(TINY_WEIGHTS), bn_eps=OPENCV_BN_EPS)


def test_darknet_bn_eps_differs_from_opencv_by_at_most_2e3():
    """Default (Darknet's eps 1e-5) vs OpenCV on dog.jpg: close, and measurably not identical."""
    img = cv2.imread(str(SHARED / "images" / "dog.jpg"))
    blob = cv2.dnn.blobFromImage(img, 1 / 255.0, (416, 416), swapRB=True, crop=False)
    ours = yolo_cl.Detector(str(TINY_CFG), str(TINY_WEIGHTS)).forward(blob)
    ref = opencv_ref.opencv_heads(str(TINY_CFG), str(TINY_WEIGHTS), blob)
    diffs = [float(np.abs(a - b).max()) for a, b in zip(ours, ref)]
    assert max(diffs) < 2e-3
    assert max(diffs) > 1e-4


@pytest.mark.parametrize("path", IMAGES, ids=lambda p: p.stem)
def test_yolov3_tiny_real_weights_matches_opencv(tiny, path):
    img = cv2.imread(str(path))
    blob = cv2.dnn.blobFromImage(img, 1 / 255.0, (416, 416), swapRB=True, crop=False)
    ours = tiny.forward(blob)
    ref = opencv_ref.opencv_heads(str(TINY_CFG), str(TINY_WEIGHTS), blob)
    assert len(ours) == len(ref) == 2
    for a, b in zip(ours, ref):
        assert a.shape == b.shape
        assert np.abs(a - b).max() < 1e-3

    # Detections: OpenCV's sample keeps one class per box (argmax); compare on that basis.
    h, w = img.shape[:2]
    dets = tiny.detect(img, thresh=0.25, nms=0.45)
    cv_dets = opencv_ref.opencv_detections(str(TINY_CFG), str(TINY_WEIGHTS), img, 416, 0.25, 0.45)
    assert cv_dets, path.name
    for cls, conf, box in cv_dets:
        box = clip(box, w, h)
        same = [d for d in dets if d.class_id == cls]
        best = max(same, key=lambda d: iou(d.box, box), default=None)
        assert best is not None, (path.name, cls, conf)
        assert iou(best.box, box) >= 0.95, (path.name, cls)
        assert abs(best.confidence - conf) <= 0.01, (path.name, cls, best.confidence, conf)
    # ...and every confident detection of ours is one OpenCV reports (as its best class or not at all).
    cv_classes = {c for c, _, _ in cv_dets}
    for d in dets:
        if d.confidence >= 0.5:
            assert d.class_id in cv_classes, (path.name, d.label)
    if path.stem == "dog":
        labels = {d.label for d in dets}
        assert {"dog", "bicycle", "truck"} <= labels


def _substituted(cfg: Path, size: int, tmp: Path) -> str:
    return opencv_ref.cfg_at_size(str(cfg), size, size, str(tmp))


@pytest.mark.parametrize("cfg", ZOO, ids=lambda p: p.stem)
def test_zoo_cfg_random_weights_matches_opencv(cfg, tmp_path):
    size = SMALL.get(cfg.stem, 128)
    weights = darknet_io.cached_random_weights(str(cfg))
    blob = np.random.default_rng(7).random((1, 3, size, size), dtype=np.float32)
    relu6 = "relu6" in cfg.read_text()
    # Both engines run the cfg OpenCV can import (relu6 -> relu for efficientnet; otherwise identical).
    run_cfg = _substituted(cfg, size, tmp_path)
    ours = yolo_cl.Detector(run_cfg, weights, bn_eps=OPENCV_BN_EPS).forward(blob)
    ref = opencv_ref.opencv_heads(run_cfg, weights, blob, strict_relu6=False)
    exact = list(darknet_io.forward_numpy(run_cfg, weights, blob, keep="heads").values())
    assert len(ours) == len(ref) == len(exact) >= 1
    for a, b, c in zip(ours, ref, exact):
        assert a.shape == b.shape
        c = np.asarray(c, np.float64).reshape(a.shape)
        scale = float(np.abs(c).max())
        assert scale > 0
        ours_err = float(np.abs(a - c).max())          # vs the float64 forward of the same cfg
        cv_err = float(np.abs(b - c).max())             # OpenCV's own float32 error
        diff = float(np.abs(a - b).max())
        # Deep mish nets amplify float32 rounding, by how much depends on the CPU's vector code
        # (yolov4's last head: 1.06e-3 of the scale on one PoCL host, OpenCV's own 1.21e-3): ours
        # within 1e-3 of the scale, or at least as close to the exact result as OpenCV's float32.
        assert ours_err <= max(1e-3 * scale, cv_err), (cfg.stem, ours_err, scale, cv_err)
        # Where OpenCV itself strays from the exact result by more than 0.5e-3 of the scale,
        # agreement is bounded by its error, not ours.
        allowed = 1e-3 * scale if cv_err <= 0.5e-3 * scale else cv_err + ours_err
        assert diff <= allowed, (cfg.stem, diff, allowed, cv_err, ours_err)
    if relu6:
        ours6 = yolo_cl.Detector(str(cfg), weights, input_size=size, bn_eps=OPENCV_BN_EPS).forward(blob)
        ref6 = darknet_io.forward_numpy(str(cfg), weights, blob, keep="heads")
        for a, b in zip(ours6, ref6.values()):
            b = np.asarray(b, np.float32).reshape(a.shape)
            assert float(np.abs(a - b).max()) <= 1e-3 * float(np.abs(b).max())
