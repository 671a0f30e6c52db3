"""Sanity tests of the test-reference helpers (darknet_io, opencv_ref) and of
the bundled model data.  Independent of yolo_cl.  ~1-2 min on 2 CPU cores
(random weights are cached, see darknet_io.cached_random_weights)."""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np
import pytest

import cv2  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import darknet_io  # noqa: E402
import opencv_ref  # noqa: E402
from tiny_cfgs import conv, maxpool, net_header, yolo  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")
TINY_CFG = os.path.join(MODELS, "yolov3-tiny.cfg")
TINY_WEIGHTS = os.path.join(MODELS, "yolov3-tiny.weights")
DOG = os.path.join(MODELS, "images", "dog.jpg")
ZOO_CFGS = sorted(os.path.join(MODELS, "cfg", f) for f in os.listdir(os.path.join(MODELS, "cfg"))
                  if f.endswith(".cfg"))
ALL_CFGS = [TINY_CFG] + ZOO_CFGS
SMALL = 128  # test size for every net (multiple of 32)


def _id(p):
    return os.path.splitext(os.path.basename(p))[0]


def _blob(size, seed=0, n=1):
    return np.random.default_rng(seed).random((n, 3, size, size), dtype=np.float32)


# --------------------------------------------------------------------------
# bundled data
# --------------------------------------------------------------------------

def test_sha256sums():
    with open(os.path.join(MODELS, "SHA256SUMS")) as f:
        rows = [line.split() for line in f if line.strip()]
    assert len(rows) >= 17
    for digest, name in rows:
        with open(os.path.join(MODELS, name), "rb") as g:
            assert hashlib.sha256(g.read()).hexdigest() == digest, name


def test_zoo_yaml_matches_cfgs():
    import yaml
    with open(os.path.join(MODELS, "zoo.yaml")) as f:
        zoo = yaml.safe_load(f)["models"]
    assert {m["name"] for m in zoo} >= {"yolov3-tiny", "yolov4", "yolov7", "efficientnet-lite3"}
    listed = {os.path.join(MODELS, m["cfg"]) for m in zoo}
    assert listed == set(ALL_CFGS)
    for m in zoo:
        cfg = os.path.join(MODELS, m["cfg"])
        secs = darknet_io.parse_cfg(cfg)
        classes = {int(o["classes"]) for t, o in secs if t in ("yolo", "region")}
        if classes:
            assert classes == {m["classes"]}, m["name"]
        if m["names"] is not None:
            with open(os.path.join(MODELS, m["names"])) as f:
                assert len([x for x in f.read().splitlines() if x.strip()]) == m["classes"]
        if m["weights"] is not None:
            assert os.path.getsize(os.path.join(MODELS, m["weights"])) == darknet_io.weights_size(cfg)


# --------------------------------------------------------------------------
# darknet_io
# --------------------------------------------------------------------------

def test_weights_size_matches_real_file():
    assert darknet_io.weights_size(TINY_CFG) == os.path.getsize(TINY_WEIGHTS) == 35434956
    (major, minor, rev), params = darknet_io.read_weights(TINY_CFG, TINY_WEIGHTS)
    assert (major, minor) == (0, 2)
    assert len(params) == len(darknet_io.layer_shapes(TINY_CFG))


@pytest.mark.parametrize("cfg", ALL_CFGS, ids=_id)
def test_random_weights_exact_size(cfg):
    path = darknet_io.cached_random_weights(cfg)
    assert os.path.getsize(path) == darknet_io.weights_size(cfg)
    with open(path, "rb") as f:
        hdr = np.frombuffer(f.read(12), "<i4")
    assert list(hdr) == [0, 2, 0]
    data = np.fromfile(path, "<f4", offset=20)
    assert np.isfinite(data).all()


def test_random_weights_header_variants(tmp_path):
    cfg = os.path.join(MODELS, "cfg", "yolov2-tiny.cfg")
    kw = dict(calib_size=64)  # fast; the calibration size does not change the layout
    p1 = darknet_io.write_random_weights(cfg, str(tmp_path / "a.weights"), major=0, minor=1, **kw)
    p2 = darknet_io.write_random_weights(cfg, str(tmp_path / "b.weights"), major=0, minor=2, **kw)
    assert os.path.getsize(p1) == darknet_io.weights_size(cfg, 0, 1) == darknet_io.weights_size(cfg) - 4
    assert os.path.getsize(p2) == darknet_io.weights_size(cfg)
    # same seed -> same floats regardless of header
    assert np.fromfile(p1, "<f4", offset=16).tobytes() == np.fromfile(p2, "<f4", offset=20).tobytes()
    p3 = darknet_io.write_random_weights(cfg, str(tmp_path / "c.weights"), seed=1, **kw)
    assert np.fromfile(p3, "<f4", offset=20).tobytes() != np.fromfile(p2, "<f4", offset=20).tobytes()


def test_expected_shapes():
    L = darknet_io.layer_shapes(os.path.join(MODELS, "cfg", "yolov2.cfg"))
    reorg = [x for x in L if x.type == "reorg"][0]
    assert reorg.in_shape == (64, 26, 26) and reorg.out_shape == (256, 13, 13)
    L = darknet_io.layer_shapes(os.path.join(MODELS, "cfg", "yolov4-tiny.cfg"))
    r = [x for x in L if x.type == "route" and "groups" in x.opts][0]
    assert r.out_shape[0] == r.in_shape[0] // 2
    heads = [x.in_shape for x in darknet_io.layer_shapes(os.path.join(MODELS, "cfg", "yolov7.cfg"))
             if x.type == "yolo"]
    assert heads == [(255, 80, 80), (255, 40, 40), (255, 20, 20)]


# --------------------------------------------------------------------------
# opencv_ref: naming, fusion, NumPy agreement
# --------------------------------------------------------------------------

TINY_NET_CFG = (net_header(32, 32) + conv(8) + maxpool() + conv(6, act="mish") + conv(18, 1, bn=0, act="linear")
                + yolo((0, 1, 2), classes=1))


def _manual_conv(x, w, b, k, bn=None, act="linear"):
    f, c = b.shape[0], x.shape[0]
    w = w.reshape(f, c, k, k).astype(np.float64)
    p = k // 2
    xp = np.pad(x, ((0, 0), (p, p), (p, p)))
    H, W = x.shape[1:]
    y = np.zeros((f, H, W))
    for i in range(k):
        for j in range(k):
            y += np.einsum("fc,chw->fhw", w[:, :, i, j], xp[:, i:i + H, j:j + W])
    if bn is not None:
        s, m, v = (a.astype(np.float64)[:, None, None] for a in bn)
        y = (y - m) / np.sqrt(v + 1e-6) * s
    y += b.astype(np.float64)[:, None, None]
    if act == "leaky":
        y = np.where(y > 0, y, 0.1 * y)
    elif act == "mish":
        y = y * np.tanh(np.log1p(np.exp(y)))
    return y


def test_opencv_post_activation_outputs_match_manual_numpy(tmp_path):
    cfg = tmp_path / "tiny.cfg"
    cfg.write_text(TINY_NET_CFG)
    w = darknet_io.write_random_weights(str(cfg), str(tmp_path / "tiny.weights"), seed=3)
    _, P = darknet_io.read_weights(str(cfg), w)
    x = _blob(32, seed=1)[0]
    y0 = _manual_conv(x, P[0]["weights"], P[0]["biases"], 3,
                      (P[0]["scales"], P[0]["rolling_mean"], P[0]["rolling_variance"]), "leaky")
    y1 = y0.reshape(8, 16, 2, 16, 2).max(axis=(2, 4))
    y2 = _manual_conv(y1, P[2]["weights"], P[2]["biases"], 3,
                      (P[2]["scales"], P[2]["rolling_mean"], P[2]["rolling_variance"]), "mish")
    y3 = _manual_conv(y2, P[3]["weights"], P[3]["biases"], 1)

    net = opencv_ref.opencv_net(str(cfg), w)
    assert opencv_ref.layer_output_names(net, 5) == ["leaky_1", "pool_1", "mish_3", "conv_3", "yolo_4"]
    outs = opencv_ref.opencv_layer_outputs(str(cfg), w, x[None], [0, 1, 2, 3])
    for j, ref in enumerate([y0, y1, y2, y3]):
        np.testing.assert_allclose(outs[j][0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    (head,) = opencv_ref.opencv_heads(str(cfg), w, x[None])
    assert head.shape == (1, 18, 16, 16)
    np.testing.assert_allclose(head[0], y3, rtol=1e-4, atol=1e-4 * np.abs(y3).max())
    npy = darknet_io.forward_numpy(str(cfg), w, x[None])
    for j, ref in enumerate([y0, y1, y2, y3]):
        np.testing.assert_allclose(npy[j][0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_opencv_naming_rule_yolov3_tiny():
    net = opencv_ref.opencv_net(TINY_CFG, TINY_WEIGHTS)
    names = opencv_ref.layer_output_names(net, 24)
    assert names[0] == "leaky_1" and names[1] == "pool_1"
    assert names[13] == "leaky_14" and names[15] == "conv_15" and names[16] == "yolo_16"
    assert names[17] == "identity_17" and names[19] == "upsample_19" and names[20] == "concat_20"
    assert names[22] == "conv_22"
    assert opencv_ref.head_layer_indices(TINY_CFG) == [16, 23]


def test_cfg_at_size(tmp_path):
    p = opencv_ref.cfg_at_size(TINY_CFG, 160, 96, str(tmp_path), head_thresh=0.05)
    secs = darknet_io.parse_cfg(p)
    assert secs[0][1]["width"] == "160" and secs[0][1]["height"] == "96"
    assert all(o["thresh"] == "0.05" for t, o in secs if t == "yolo")
    assert [t for t, _ in secs] == [t for t, _ in darknet_io.parse_cfg(TINY_CFG)]
    eff = opencv_ref.cfg_at_size(os.path.join(MODELS, "cfg", "efficientnet-lite3.cfg"), 128, 128,
                                 str(tmp_path))
    assert "relu6" not in open(eff).read()


def _rel_err(a, b):
    return float(np.abs(a - b).max() / (np.abs(b).max() + 1e-6))


@pytest.mark.parametrize("cfg", ALL_CFGS, ids=_id)
def test_random_weights_heads_tame_and_opencv_matches_numpy(cfg):
    """OpenCV loads every cfg at 128x128 with random weights; head inputs are
    finite and O(1) (|x| < 1e3); NumPy's forward agrees with OpenCV."""
    w = darknet_io.cached_random_weights(cfg)
    blob = _blob(SMALL)
    relu6 = "relu6" in open(cfg).read()
    heads = opencv_ref.opencv_heads(cfg, w, blob, strict_relu6=not relu6)
    L = darknet_io.layer_shapes(cfg, SMALL, SMALL)
    detector = any(x.type in ("yolo", "region") for x in L)
    expect = [x.in_shape for x in L if x.type in ("yolo", "region")] or [L[-1].out_shape]
    assert [h.shape[1:] for h in heads] == expect
    for h in heads:
        assert h.dtype == np.float32 and np.isfinite(h).all()
        assert np.abs(h).max() < 1e3
        if detector:  # not collapsed (the classifier's softmax output is ~1/1000)
            assert h.std() > 0.05
    ref = darknet_io.forward_numpy(cfg, w, blob, keep="heads")
    assert len(ref) == len(heads)
    for r in ref.values():
        assert np.isfinite(r).all() and np.abs(r).max() < 1e3
    if not relu6:
        for h, r in zip(heads, ref.values()):
            assert _rel_err(h, r) < 5e-3, _id(cfg)


def test_numpy_matches_opencv_on_efficientnet_with_relu(tmp_path):
    """efficientnet-lite3 with relu6 -> relu (OpenCV cannot import relu6):
    checks NumPy's depthwise conv, avgpool, dropout, shortcut and softmax."""
    cfg = opencv_ref.cfg_at_size(os.path.join(MODELS, "cfg", "efficientnet-lite3.cfg"), SMALL, SMALL,
                                 str(tmp_path))
    w = darknet_io.cached_random_weights(cfg)
    blob = _blob(SMALL, seed=2)
    L = darknet_io.layer_shapes(cfg)
    last_conv = max(x.index for x in L if x.type == "convolutional")
    dw = [x.index for x in L if x.type == "convolutional" and int(x.opts.get("groups", 1)) > 1]
    want = sorted({dw[0], dw[-1], last_conv, len(L) - 1})
    ocv = opencv_ref.opencv_layer_outputs(cfg, w, blob, want)
    npy = darknet_io.forward_numpy(cfg, w, blob, keep=want)
    for j in want:
        a = ocv[j].reshape(npy[j].shape)
        assert _rel_err(a, npy[j]) < 5e-3, (j, L[j].type)
    assert abs(float(npy[len(L) - 1].sum()) - 1.0) < 1e-4  # softmax


# --------------------------------------------------------------------------
# real weights
# --------------------------------------------------------------------------

def test_yolov3_tiny_dog_detections():
    img = cv2.imread(DOG)
    assert img is not None
    dets = opencv_ref.opencv_detections(TINY_CFG, TINY_WEIGHTS, img, 416, 0.25, 0.45)
    classes = {c for c, _, _ in dets}
    assert 16 in classes and 1 in classes and (7 in classes or 2 in classes), dets
    for c, conf, (x1, y1, x2, y2) in dets:
        assert 0.25 < conf <= 1.0
        assert -50 < x1 < x2 < img.shape[1] + 50 and -50 < y1 < y2 < img.shape[0] + 50
    dog = [d for d in dets if d[0] == 16][0]
    x1, y1, x2, y2 = dog[2]
    assert 100 < x1 < 160 and 190 < y1 < 250 and 350 < x2 < 420 and 490 < y2 < 560
    # a lower threshold returns a superset (head thresh rewritten below OpenCV's 0.2)
    low = opencv_ref.opencv_detections(TINY_CFG, TINY_WEIGHTS, img, 416, 0.1, 0.45)
    assert len(low) >= len(dets) and min(d[1] for d in low) < 0.2


def test_yolov3_tiny_real_weights_numpy_matches_opencv():
    img = cv2.imread(DOG)
    blob = cv2.dnn.blobFromImage(img, 1 / 255.0, (416, 416), swapRB=True, crop=False)
    heads = opencv_ref.opencv_heads(TINY_CFG, TINY_WEIGHTS, blob)
    ref = list(darknet_io.forward_numpy(TINY_CFG, TINY_WEIGHTS, blob, keep="heads").values())
    assert [h.shape for h in heads] == [(1, 255, 13, 13), (1, 255, 26, 26)]
    for h, r in zip(heads, ref):
        assert _rel_err(h, r) < 1e-3
