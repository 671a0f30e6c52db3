"""NMS on the device (cl/decode.cl ``yc_nms``) against the host's ``postprocess.nms`` (the reference).

The kernel runs over candidate rows as the decode kernel writes them (g, x, y, w, h, objectness,
class probabilities; in any order, one work-group per image) and must zero exactly the entries
the host's NMS zeroes once the rows are in g order and scaled as ``correct_boxes`` scales them:
every kind, ties in probability, non-finite rows, the size limit; and the real network through
``Detector.detect`` gives the host path's detections without calling the host's NMS.
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from yolo_cl import Detector
from yolo_cl import postprocess as post
from yolo_cl.kernels.decode import NMS_CLASSES, NMS_KINDS, NMS_MAX
from yolo_cl.runtime import Runtime

from boxes import same_detections

ROOT = Path(__file__).resolve().parents[1]
IMAGES = sorted((ROOT.parent / "shared" / "images").glob("*.jpg")) or sorted((ROOT / "models" / "images").glob("*.jpg"))
CAP = 160


@pytest.fixture(scope="module")
def rt():
    return Runtime()


def candidates(rng, n: int, classes: int, ties: bool) -> np.ndarray:
    """n rows in the decode's layout, shuffled: clustered boxes (so suppression chains occur),
    distinct g values, probabilities with zeros (and on a coarse grid with ``ties``)."""
    centres = rng.random((max(1, n // 8), 2))
    xy = centres[rng.integers(0, len(centres), n)] + 0.03 * rng.standard_normal((n, 2))
    wh = 0.05 + 0.15 * rng.random((n, 2))
    probs = rng.random((n, classes)) * (rng.random((n, classes)) < min(1.0, 6.0 / classes + 0.3))
    if ties:
        probs = np.round(probs * 4) / 4
    g = rng.permutation(10 * n)[:n].astype(np.int32)
    rows = np.zeros((n, classes + 6), np.float32)
    rows[:, 0] = g.view(np.float32)
    rows[:, 1:3], rows[:, 3:5], rows[:, 5], rows[:, 6:] = xy, wh, 0.9, probs
    return rows


def device_nms(rt, images: list, classes: int, thresh: float, kind: str, beta: float, sx: float, sy: float) -> list:
    """Run yc_nms over each image's rows (one work-group each); the rows as the kernel left them."""
    cl = rt.cl
    prg = rt.program("decode.cl", {"HALF_STORAGE": False, "NMS_MAX": NMS_MAX, "NMS_CLASSES": NMS_CLASSES})
    rowlen = classes + 6
    host = np.zeros((len(images), CAP, rowlen), np.float32)
    count = np.array([len(r) for r in images], np.int32)
    for b, r in enumerate(images):
        host[b, :len(r)] = r
    rows = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    cnt = cl.Buffer(rt.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=count)
    k = cl.Kernel(prg, "yc_nms")
    k.set_args(cnt, rows, np.int32(CAP), np.int32(classes), np.float32(thresh), np.int32(NMS_KINDS[kind]),
               np.float32(beta), np.float32(sx), np.float32(sy))
    local = int(min(64, rt.device.max_work_group_size))
    cl.enqueue_nd_range_kernel(rt.queue, k, (local * len(images),), (local,))
    cl.enqueue_copy(rt.queue, host, rows)
    return [host[b, :len(r)] for b, r in enumerate(images)]


def host_nms(rows: np.ndarray, thresh: float, kind: str, beta: float, sx: float, sy: float) -> np.ndarray:
    """The host's way: rows in g order, boxes scaled as correct_boxes does (offsets cancel),
    non-finite rows left out, postprocess.nms; returns the probabilities in g order (dropped rows as they were)."""
    r = rows[np.argsort(rows[:, 0].view(np.int32), kind="stable")]
    boxes = r[:, 1:5].astype(np.float64) * [sx, sy, sx, sy]
    probs = r[:, 6:].copy()
    ok = np.isfinite(boxes).all(axis=1) & np.isfinite(probs).all(axis=1)
    probs[ok] = post.nms(boxes[ok], probs[ok], thresh, kind, beta)
    return probs


@pytest.mark.parametrize("kind", sorted(NMS_KINDS))
@pytest.mark.parametrize("n,classes,ties", [(1, 3, False), (7, 3, False), (60, 3, True), (NMS_MAX, 3, False),
                                            (40, 80, True), (NMS_MAX + 1, 3, False)])
@pytest.mark.parametrize("sx,sy", [(1.0, 1.0), (1.25, 0.75)])
def test_device_nms_zeroes_what_the_host_nms_zeroes(rt, kind, n, classes, ties, sx, sy):
    rng = np.random.default_rng(n * 7 + classes)
    images = [candidates(rng, n, classes, ties), candidates(rng, max(1, n // 2), classes, ties)]
    images[1][0, 2] = np.nan                 # a non-finite row takes no part
    if n >= 2:       # so does a row with a non-finite probability, though its box would suppress row 0's
        first, last = images[0][0], images[0][-1]
        first[6] = 0.9
        last[1:7] = first[1:5].tolist() + [first[5], 0.95]
        last[6 + classes - 1] = np.inf
    got = device_nms(rt, images, classes, 0.45, kind, 0.5, sx, sy)
    for before, after in zip(images, got):
        order = np.argsort(before[:, 0].view(np.int32), kind="stable")
        if len(before) > NMS_MAX:            # left to the host: untouched
            np.testing.assert_array_equal(after, before)
            continue
        np.testing.assert_array_equal(after[order][:, 6:], host_nms(before, 0.45, kind, 0.5, sx, sy))
        np.testing.assert_array_equal(after[:, :6], before[:, :6])
    if 60 <= n <= NMS_MAX:
        kept = (got[0][:, 6:] > 0).sum()
        assert 0 < kept < (images[0][:, 6:] > 0).sum()       # some kept, some suppressed


@pytest.mark.parametrize("kind", sorted(NMS_KINDS))
def test_rows_that_share_a_g_are_visited_once_each(rt, kind):
    """Two rows with the same g (a candidate decoded twice into one list): the kernel orders
    them by row, as the host's stable sort does, and visits each once. With equal ranks two
    rows took one place of the visiting order and left another unset, which the pass then
    followed to a row index out of the buffer."""
    rng = np.random.default_rng(11)
    once = candidates(rng, 12, 3, True)
    rows = np.concatenate([once, once[:7]])
    got = device_nms(rt, [rows], 3, 0.45, kind, 0.5, 1.0, 1.0)[0]
    order = np.argsort(rows[:, 0].view(np.int32), kind="stable")
    np.testing.assert_array_equal(got[order][:, 6:], host_nms(rows, 0.45, kind, 0.5, 1.0, 1.0))


@pytest.mark.parametrize("fit", ["letterbox", "stretch"])
def test_detect_runs_the_nms_on_the_device(fit, monkeypatch):
    """The real network on every shared image: the host path's detections, with the host's NMS
    never called on the device path (and called again with YOLO_CL_DEVICE_NMS=0)."""
    dev = Detector("yolov3-tiny", fit=fit, device_preprocess=True, device_decode=True)
    host = Detector("yolov3-tiny", fit=fit, device_preprocess=False, device_decode=False)
    frames = [cv2.imread(str(p)) for p in IMAGES]
    want = [host.detect(img) for img in frames]
    assert sum(map(len, want)) > 0
    calls = []
    real = post.nms
    monkeypatch.setattr(post, "nms", lambda *a, **k: calls.append(1) or real(*a, **k))
    for img, w in zip(frames, want):
        assert same_detections(dev.detect(img), w)
    assert not calls
    monkeypatch.setenv("YOLO_CL_DEVICE_NMS", "0")
    off = Detector("yolov3-tiny", fit=fit, device_preprocess=True, device_decode=True)
    assert same_detections(off.detect(frames[0]), want[0]) and calls
