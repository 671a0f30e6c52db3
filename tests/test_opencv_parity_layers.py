"""The newer Darknet layers against OpenCV 4.x's Darknet importer, where it has them.

OpenCV 4.14 imports [connected] (with batch_normalize), [crop], [cost] and the activations
swish/mish/tanh/logistic/leaky/relu; it refuses [batchnorm], [activation], [local_avgpool],
[reorg3d], [l2norm], [empty], [implicit], [Gaussian_yolo], [detection], [deconvolutional],
[logistic] and the other activations of src/activations.c, which tests/test_layers_darknet.py
checks against the NumPy reference alone. Both engines read the same weights file (written by
tests/test_layers_darknet.py's writer) and run with OpenCV's batchnorm epsilon 1e-6.

One difference is OpenCV's, not ours: for a [connected] layer with batch_normalize, Darknet stores
biases, weights, scales, mean, variance (AlexeyAB src/parser.c:2093-2105, load_connected_weights),
while OpenCV's importer reads the statistics before the weights, as for a convolution (given the
Darknet file it outputs NaN). Those cases hand OpenCV a copy with the blocks in its order, so both
compute with the same parameters; test_opencv_reads_connected_batchnorm_in_conv_order pins it.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

import yolo_cl
from yolo_cl.weights import param_count

sys.path.insert(0, os.path.dirname(__file__))
from test_layers_darknet import write_net  # noqa: E402
from tiny_cfgs import conv, sec  # noqa: E402

OPENCV_BN_EPS = 1e-6

CASES = {
    "connected_leaky": (conv(4, 3, 2) + sec("connected", output=11, activation="leaky"), (13, 11)),
    "connected_bn_logistic": (conv(4, 3, 2) + sec("connected", output=9, batch_normalize=1, activation="logistic"),
                              (12, 10)),
    "connected_chain": (conv(3, 3, 1, act="mish") + sec("connected", output=10, activation="tanh") +
                        sec("connected", output=6, batch_normalize=1, activation="swish") +
                        sec("connected", output=4, activation="linear"), (9, 7)),
    "crop": (conv(3, 3, 1) + sec("crop", crop_height=5, crop_width=6), (11, 9)),
    "crop_noadjust": (conv(3, 3, 1) + sec("crop", crop_height=4, crop_width=7, noadjust=1), (11, 10)),
    "classifier_softmax_cost": (conv(5, 3, 2) + sec("avgpool") + sec("connected", output=7, activation="linear") +
                                sec("softmax") + sec("cost", type="sse"), (16, 16)),
}


def opencv_order(weights: Path, layers: list, out: Path) -> Path:
    """A copy of a Darknet weights file with every batch-normalised [connected] layer's blocks in
    OpenCV's order (biases, scales, mean, variance, weights) instead of Darknet's."""
    data = np.fromfile(weights, "<f4", offset=20)
    parts, pos = [], 0
    for l in layers:
        n = param_count(l)
        block = data[pos:pos + n]
        if l.kind == "connected" and l.p["bn"]:
            o, k = l.p["outputs"], l.p["inputs"]
            block = np.concatenate([block[:o], block[o + o * k:], block[o:o + o * k]])
        parts.append(block)
        pos += n
    out.write_bytes(weights.read_bytes()[:20] + np.concatenate(parts).astype("<f4").tobytes())
    return out


def opencv_forward(cfg: Path, weights: Path, blob: np.ndarray) -> np.ndarray:
    net = cv2.dnn.readNetFromDarknet(str(cfg), str(weights))
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setInput(blob)
    return np.asarray(net.forward(), np.float32)


@pytest.mark.parametrize("name", CASES)
def test_matches_opencv(tmp_path, name):
    body, size = CASES[name]
    cfg, weights, _ = write_net(tmp_path, body, size)
    blob = np.random.default_rng(5).uniform(0, 1, (1, 3, size[1], size[0])).astype(np.float32)
    det = yolo_cl.Detector(cfg, weights, bn_eps=OPENCV_BN_EPS)
    ours = det.forward(blob)[0]
    ref = opencv_forward(cfg, opencv_order(weights, det.layers, tmp_path / "opencv.weights"), blob).reshape(ours.shape)
    scale = max(1.0, float(np.abs(ref).max()))
    assert float(np.abs(ref).max()) > 0
    assert float(np.abs(ours - ref).max()) <= 1e-4 * scale, float(np.abs(ours - ref).max())


def test_opencv_reads_connected_batchnorm_in_conv_order(tmp_path):
    """Given Darknet's own file, OpenCV takes weights for statistics (NaN from negative 'variances')."""
    cfg, weights, _ = write_net(tmp_path, sec("connected", output=6, batch_normalize=1, activation="linear"), (5, 4))
    blob = np.random.default_rng(0).uniform(0, 1, (1, 3, 4, 5)).astype(np.float32)
    ours = yolo_cl.Detector(cfg, weights, bn_eps=OPENCV_BN_EPS).forward(blob)[0].ravel()
    assert np.all(np.isfinite(ours))
    assert not np.allclose(opencv_forward(cfg, weights, blob).ravel(), ours, atol=1e-3, equal_nan=False)
