"""``Detector.forward(blob, outputs=[...])``: any layer's output, as Darknet computes it.

The reference is tests/np_darknet.py (every layer's float64 output); a [yolo]/[region] layer's
own output is written here from Darknet's forward_yolo_layer / forward_region_layer loops.
The net is built so that the requested layers would otherwise be fused away or written into
a concat slice: a conv feeding a shortcut (fused into the conv's epilogue) and convs that
write straight into a [route]'s channels.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import yolo_cl
from yolo_cl.weights import load_weights

sys.path.insert(0, os.path.dirname(__file__))
import np_darknet  # noqa: E402
from test_layers import assert_close, fused_residuals, write_net  # noqa: E402
from tiny_cfgs import conv, sec  # noqa: E402

SIZE = (15, 11)
BODY = (conv(4, 3, 1) +                                          # 0
        conv(4, 3, 1) +                                          # 1: fused into the shortcut
        sec("shortcut", **{"from": -2}, activation="leaky") +    # 2
        conv(6, 3, 2) +                                          # 3: writes into route 5's slice
        conv(6, 1, 1, act="mish") +                              # 4: writes into route 5's slice
        sec("route", layers=[-1, -2]) +                          # 5
        sec("dropout", probability=0.3) +                        # 6
        conv(2 * 7, 1, 1, bn=0, act="linear") +                  # 7
        sec("yolo", classes=2, num=3, mask="1,2", anchors="2,3, 4,5, 6,7", scale_x_y=1.1) +   # 8
        sec("route", layers=-4) +                                # 9
        conv(2 * 8, 1, 1, bn=0, act="linear") +                  # 10
        sec("region", classes=3, num=2, coords=4, softmax=1, anchors="1,1, 2,2"))             # 11


def yolo_reference(x: np.ndarray, p: dict) -> np.ndarray:
    """forward_yolo_layer: logistic on x, y (entry 0, 2*w*h values) and objectness + classes
    (entry 4, (1+classes)*w*h values) of each mask, then x, y scaled by scale_x_y about 0.5."""
    b, c, h, w = x.shape
    out = x.astype(np.float64).reshape(b, -1).copy()
    n, per = len(p["mask"]), c // len(p["mask"])
    for bb in range(b):
        for k in range(n):
            box = k * per * h * w
            out[bb, box:box + 2 * h * w] = np_darknet.logistic(out[bb, box:box + 2 * h * w])
            obj = box + 4 * h * w
            out[bb, obj:obj + (1 + p["classes"]) * h * w] = np_darknet.logistic(out[bb, obj:obj + (1 + p["classes"]) * h * w])
            s = p["scale_x_y"]
            out[bb, box:box + 2 * h * w] = out[bb, box:box + 2 * h * w] * s - 0.5 * (s - 1)
    return out.reshape(x.shape)


def region_reference(x: np.ndarray, p: dict) -> np.ndarray:
    """pjreddie's forward_region_layer: logistic on x, y and objectness, softmax over each box's classes."""
    b, c, h, w = x.shape
    out = x.astype(np.float64).reshape(b, p["num"], c // p["num"], h * w).copy()
    out[:, :, 0:2] = np_darknet.logistic(out[:, :, 0:2])
    out[:, :, 4] = np_darknet.logistic(out[:, :, 4])
    cls = out[:, :, 5:]
    e = np.exp(cls - cls.max(axis=2, keepdims=True))
    out[:, :, 5:] = e / e.sum(axis=2, keepdims=True)
    return out.reshape(x.shape)


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("outputs")
    cfg, weights = write_net(tmp, BODY, SIZE, 3, seed=5)
    det = yolo_cl.Detector(cfg, weights, input_size=SIZE)
    blob = np.random.default_rng(7).standard_normal((2, 3, SIZE[1], SIZE[0])).astype(np.float32)
    ref = np_darknet.forward(det.layers, load_weights(weights, det.layers), blob)
    ref[8] = yolo_reference(ref[7], det.layers[8].p)
    ref[11] = region_reference(ref[10], det.layers[11].p)
    return det, blob, ref


def test_every_layer_by_index(net):
    det, blob, ref = net
    assert fused_residuals(det) == 1            # the default graph fuses conv 1 into the shortcut...
    got = det.forward(blob, outputs=list(range(len(det.layers))))
    assert_close(got, ref)                      # ...but its output, asked for, is there
    assert det.executor(2, SIZE, tuple(range(len(det.layers)))).graph.kept == tuple(range(len(det.layers)))


def test_names_and_negative_indices(net):
    det, blob, ref = net
    assert det.layer_names == ["conv_0", "conv_1", "shortcut_2", "conv_3", "conv_4", "route_5", "dropout_6",
                               "conv_7", "yolo_8", "route_9", "conv_10", "region_11"]
    got = det.forward(blob, outputs=["yolo_8", "conv_1", -1, "concat_5", "convolutional_3", 4])
    assert_close(got, [ref[8], ref[1], ref[11], ref[5], ref[3], ref[4]])


def test_default_forward_is_unchanged(net):
    det, blob, ref = net
    assert_close(det.forward(blob), [ref[7], ref[10]])      # the heads' raw inputs, for decoding


@pytest.mark.parametrize("bad,msg", [
    (["conv_99"], "output 'conv_99' names no layer"),
    (["yolo_7"], "output 'yolo_7': layer 7 is conv_7, not a yolo layer"),
    ([12], r"output 12 is not a layer index \(the network has layers 0..11\)"),
    ([-13], "output -13 is not a layer index"),
    ([1.5], "output '1.5' is neither a layer index nor a layer name"),
    ("conv_1", "outputs must be a list"),
])
def test_bad_requests_are_one_line_errors(net, bad, msg):
    det, blob, _ = net
    with pytest.raises(yolo_cl.YoloClError, match=msg):
        det.forward(blob, outputs=bad)


@pytest.mark.parametrize("alpha,beta,act", [(0.5, 1, "linear"), (1, -2, "leaky"), (0.25, 3, "logistic")])
def test_pjreddie_weighted_shortcut(tmp_path, alpha, beta, act):
    """pjreddie's shortcut_cpu: out = alpha*out + beta*add, then the activation; never fused into the conv."""
    body = conv(5, 3, 1) + conv(5, 3, 1) + sec("shortcut", **{"from": -2}, alpha=alpha, beta=beta, activation=act)
    cfg, weights = write_net(tmp_path, body, (9, 7), 3, seed=2)
    det = yolo_cl.Detector(cfg, weights, input_size=(9, 7))
    assert fused_residuals(det) == 0
    blob = np.random.default_rng(3).standard_normal((1, 3, 7, 9)).astype(np.float32)
    outs = np_darknet.forward(det.layers, load_weights(weights, det.layers), blob)
    want = np_darknet.activate(alpha * outs[1] + beta * outs[0], act)
    assert_close(det.forward(blob), [want])
