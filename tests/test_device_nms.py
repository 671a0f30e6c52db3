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
from yolo_cl.executor import batch_bucket
from yolo_cl.kernels.decode import LIST_COLS, LIST_MAX, NMS_CLASSES, NMS_KINDS, NMS_MAX, nms_local
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


def device_nms(rt, images: list, classes: int, thresh: float, kind: str, beta: float, sx: float, sy: float,
               dmax: int = LIST_MAX, lists: bool = False):
    """Run yc_nms over each image's rows (one work-group each); the rows as the kernel left them
    (and with ``lists`` its lists: per image (entries, non-finite candidates, the entries' rows))."""
    cl = rt.cl
    prg = rt.program("decode.cl", {"HALF_STORAGE": False, "NMS_MAX": NMS_MAX, "NMS_CLASSES": NMS_CLASSES})
    rowlen = classes + 6
    host = np.zeros((len(images), CAP, rowlen), np.float32)
    count = np.array([len(r) for r in images], np.int32)
    for b, r in enumerate(images):
        host[b, :len(r)] = r
    rows = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    cnt = cl.Buffer(rt.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=count)
    listed = np.full((len(images), 2), 7, np.int32)      # not what any image's list says
    dets = np.full((len(images), max(1, dmax), LIST_COLS), np.nan, np.float32)
    lbuf = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=listed)
    dbuf = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=dets)
    k = cl.Kernel(prg, "yc_nms")
    k.set_args(cnt, rows, np.int32(CAP), np.int32(classes), np.float32(thresh), np.int32(NMS_KINDS[kind]),
               np.float32(beta), np.float32(sx), np.float32(sy), lbuf, dbuf, np.int32(dmax))
    local = nms_local(rt)
    cl.enqueue_nd_range_kernel(rt.queue, k, (local * len(images),), (local,))
    cl.enqueue_copy(rt.queue, host, rows)
    cl.enqueue_copy(rt.queue, listed, lbuf)
    cl.enqueue_copy(rt.queue, dets, dbuf)
    out = [host[b, :len(r)] for b, r in enumerate(images)]
    if lists:
        return out, [(int(n), int(dropped), dets[b, :max(0, min(n, dmax))]) for b, (n, dropped) in enumerate(listed)]
    return out


def listed_as_rows(listed: np.ndarray) -> set:
    """A kernel's list as a set of (g, row, class, probability, x, y, w, h)."""
    ints = listed.view(np.int32)[:, [0, 7, 1]]
    return {(int(g), int(i), int(k), *map(float, v)) for (g, i, k), v in zip(ints, listed[:, 2:7])}


def kept_as_rows(before: np.ndarray, after: np.ndarray) -> set:
    """What the list should hold: every finite row's nonzero probability left after the NMS."""
    ok = np.isfinite(before[:, 1:5]).all(axis=1) & np.isfinite(before[:, 6:]).all(axis=1)
    g = before[:, 0].view(np.int32)
    return {(int(g[i]), int(i), int(k), float(after[i, 6 + k]), *map(float, before[i, 1:5]))
            for i, k in zip(*np.nonzero(after[:, 6:] > 0)) if ok[i]}


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
    got, lists = device_nms(rt, images, classes, 0.45, kind, 0.5, sx, sy, lists=True)
    for before, after, (entries, dropped, listed) in zip(images, got, lists):
        order = np.argsort(before[:, 0].view(np.int32), kind="stable")
        if len(before) > NMS_MAX:            # left to the host: untouched, no list
            np.testing.assert_array_equal(after, before)
            assert entries == -1
            continue
        np.testing.assert_array_equal(after[order][:, 6:], host_nms(before, 0.45, kind, 0.5, sx, sy))
        np.testing.assert_array_equal(after[:, :6], before[:, :6])
        ok = np.isfinite(before[:, 1:5]).all(axis=1) & np.isfinite(before[:, 6:]).all(axis=1)
        assert dropped == int((~ok).sum())
        kept = kept_as_rows(before, after)
        if len(kept) > LIST_MAX:             # more than the list holds: it says so
            assert entries == LIST_MAX + 1 and listed_as_rows(listed) < kept
        else:
            assert entries == len(listed) == len(kept) and listed_as_rows(listed) == kept
    assert lists[1][1] == 1 and (not 2 <= n <= NMS_MAX or lists[0][1] == 1)      # the non-finite rows, counted
    assert n > NMS_MAX or lists[0][0] > 0
    if 60 <= n <= NMS_MAX:
        kept = (got[0][:, 6:] > 0).sum()
        assert 0 < kept < (images[0][:, 6:] > 0).sum()       # some kept, some suppressed


def test_a_list_too_long_says_so_and_the_rows_are_still_nmsed(rt):
    """More kept entries than the list holds: the count says dmax + 1 (the host then maps the
    rows), the rows are NMSed all the same, and the list's first dmax entries are kept ones."""
    rng = np.random.default_rng(5)
    rows = candidates(rng, 60, 80, False)
    got, [(entries, dropped, listed)] = device_nms(rt, [rows], 80, 0.45, "default", 0.6, 1.0, 1.0, dmax=4, lists=True)
    got = got[0]
    order = np.argsort(rows[:, 0].view(np.int32), kind="stable")
    np.testing.assert_array_equal(got[order][:, 6:], host_nms(rows, 0.45, "default", 0.6, 1.0, 1.0))
    kept = kept_as_rows(rows, got)
    assert len(kept) > 4 and entries == 5 and dropped == 0
    assert len(listed) == 4 and listed_as_rows(listed) <= kept


def test_listed_detections_are_the_rows_detections(rt):
    """A list in any order gives what ``to_detections`` gives for the NMSed rows in g order:
    falling probability, ties by g, row and class, the boxes mapped through the placement."""
    from yolo_cl.preprocess import placement
    rng = np.random.default_rng(8)
    rows = candidates(rng, 40, 3, True)
    got, [(entries, _, listed)] = device_nms(rt, [rows], 3, 0.45, "default", 0.6, 1.0, 1.0, lists=True)
    got = got[0][np.argsort(got[0][:, 0].view(np.int32), kind="stable")]
    place = placement("letterbox", 1280, 720, 416, 416, 32)
    want = post.to_detections(got[:, 1:5], got[:, 6:], 1280, 720, 0.0, None, place)
    shuffled = listed[rng.permutation(len(listed))]
    have = post.listed_detections(shuffled, place, 1280, 720, None)
    assert entries == len(want) > 10 and len({d.confidence for d in want}) < len(want)     # ties
    assert have == want
    assert post.listed_detections(listed[:0], place, 1280, 720, None) == []


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
    calls, rows_mapped = [], []
    real, to_det = post.nms, post.to_detections
    monkeypatch.setattr(post, "nms", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(post, "to_detections", lambda *a, **k: rows_mapped.append(1) or to_det(*a, **k))
    for img, w in zip(frames, want):
        assert same_detections(dev.detect(img), w)
    assert not calls and not rows_mapped       # the device's lists were mapped, no candidate rows
    monkeypatch.setenv("YOLO_CL_DEVICE_NMS", "0")
    off = Detector("yolov3-tiny", fit=fit, device_preprocess=True, device_decode=True)
    assert same_detections(off.detect(frames[0]), want[0]) and calls


@pytest.mark.parametrize("batch", [1, 3])
def test_detect_maps_the_rows_where_the_list_cannot_hold_them(batch, monkeypatch):
    """Where the device NMS could not list what it kept (more candidates than it takes, or a list
    longer than ``LIST_MAX``), the rows come back by a second read and the host maps them: the
    host path's detections either way, for every image of a batch."""
    import yolo_cl.kernels.decode as decode
    host = Detector("yolov3-tiny", input_size=256, device_preprocess=False, device_decode=False)
    frames = [cv2.imread(str(IMAGES[0]))] * batch
    for thresh, list_max in ((0.0005, LIST_MAX), (0.2, 2)):      # > NMS_MAX candidates; a list of 2 overflowing
        monkeypatch.setattr(decode, "LIST_MAX", list_max)
        dev = Detector("yolov3-tiny", input_size=256, device_preprocess=True, device_decode=True)
        got = dev.detect_batch(frames, thresh=thresh)
        want = [host.detect(im, thresh=thresh) for im in frames]
        st = dev.device_path.decoder(dev.executor(batch_bucket(batch)))._sets[0]
        counts, entries = st["host_count"][:batch], st["host_listed"][:batch, 0]
        if list_max == LIST_MAX:
            assert (counts > NMS_MAX).all() and (entries == -1).all()
        else:
            assert (entries == list_max + 1).all()
        assert all(len(w) > 2 for w in want) and all(same_detections(g, w) for g, w in zip(got, want))
