"""Every layer kernel and option against the NumPy Darknet reference (tests/np_darknet.py).

Each test writes a tiny cfg (8-40 px, a few channels) and random Darknet-format weights to
``tmp_path``, runs it through ``yolo_cl.Detector`` and compares ``forward`` with the float64
reference. A network without [yolo] returns its last layer's output, so each net ends with the
layer under test (or with a [route] that exposes several intermediate results at once). Sizes
are chosen so nothing divides the kernels' tiles: odd spatial sizes, 1 channel, 3/5/17/255 filters.
Some tests also assert which fused nodes or kernels ran, so the path they mean to cover is covered.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import yolo_cl
from yolo_cl.weights import load_weights

sys.path.insert(0, os.path.dirname(__file__))
import darknet_io  # noqa: E402
import np_darknet  # noqa: E402
from tiny_cfgs import conv, net_header, sec  # noqa: E402

ACTIVATIONS = ("linear", "leaky", "relu", "relu6", "logistic", "tanh", "mish", "swish", "hard_mish")
RTOL = 1e-4


# -- cfg and weights writers ---------------------------------------------------------------------------

def write_weights(cfg: Path, out: Path, seed: int, gain: float = 1.5) -> None:
    """A Darknet .weights file (format 0.2, 64-bit ``seen``) with random, O(1)-scaled parameters.

    The blocks and their order come from darknet_io.layer_shapes (independent of the engine):
    per conv, biases, then scales/rolling_mean/rolling_variance with batch_normalize, then weights
    scaled by gain / sqrt(fan-in) so every layer's output stays O(1)."""
    rng = np.random.default_rng(seed)
    blocks = [np.array([0, 2, 0], "<i4").tobytes(), np.array([0], "<u8").tobytes()]
    for layer in darknet_io.layer_shapes(str(cfg)):
        counts = dict(layer.params)
        for name, n in layer.params:
            if name == "weights":
                a = rng.standard_normal(n) * gain / np.sqrt(n / counts["biases"])
            elif name == "scales":
                a = rng.uniform(0.5, 1.5, n)
            elif name == "rolling_variance":
                a = rng.uniform(0.25, 2.0, n)
            else:                                   # biases, rolling_mean
                a = rng.normal(0.0, 0.5, n)
            blocks.append(a.astype("<f4").tobytes())
    out.write_bytes(b"".join(blocks))


def write_net(tmp_path: Path, body: str, size: tuple, channels: int, seed: int = 0, name: str = "net") -> tuple:
    """cfg + weights files. The cfg says 416x416: the Detector runs it at ``size`` through ``input_size``."""
    cfg = tmp_path / f"{name}.cfg"
    cfg.write_text(net_header(416, 416, channels) + body)
    weights = tmp_path / f"{name}.weights"
    write_weights(cfg, weights, seed)
    return cfg, weights


def reference(det, weights: Path, blob: np.ndarray) -> list:
    """np_darknet's outputs for ``blob`` (what ``det.forward`` should return), from the raw weights."""
    params = load_weights(weights, det.layers)
    return np_darknet.outputs(det.layers, np_darknet.forward(det.layers, params, blob))


def assert_close(got: list, ref: list, rtol: float = RTOL, atol: float = None) -> None:
    """Same shapes; values within rtol, and atol relative to each output's largest magnitude."""
    assert [g.shape for g in got] == [r.shape for r in ref]
    for g, r in zip(got, ref):
        assert np.all(np.isfinite(g))
        tol = rtol * max(1.0, float(np.abs(r).max())) if atol is None else atol
        np.testing.assert_allclose(g, r, rtol=rtol, atol=tol)


def check(tmp_path: Path, body: str, size: tuple = (17, 13), channels: int = 3, batch: int = 1, seed: int = 0,
          precision: str = "fp32", blob: np.ndarray = None, rtol: float = RTOL, atol: float = None, tuning=None):
    """Build the net, forward a random blob, compare with the reference; returns the Detector."""
    cfg, weights = write_net(tmp_path, body, size, channels, seed)
    det = yolo_cl.Detector(cfg, weights, input_size=size, precision=precision, tuning=tuning)
    if blob is None:
        blob = np.random.default_rng(seed + 1).standard_normal((batch, channels, size[1], size[0])).astype(np.float32)
    assert_close(det.forward(blob), reference(det, weights, blob), rtol, atol)
    return det


def ops(det) -> list:
    return [n.op for n in det.graph.nodes]


def launches(det) -> list:
    return [l.name for l in det.executor(1).launches]


def fused_residuals(det) -> int:
    return sum(1 for n in det.graph.nodes if n.op == "conv" and n.attrs.get("residual") is not None)


# -- the reference itself, against literal transliterations of Darknet's loops ----------------------------

class _Section:
    """Just enough of a cfg section for np_darknet.Options."""

    def __init__(self, **opts) -> None:
        self.options = {k: (str(v), 0) for k, v in opts.items()}


def _o(**opts):
    return np_darknet.Options(_Section(**opts))


def test_reference_reorg_is_reorg_cpu_on_input_dims():
    """reorg_cpu(x, w, h, c, batch, stride, forward=0, out): out[in_index] = x[out_index]."""
    rng = np.random.default_rng(0)
    b, c, h, w, s = 2, 8, 4, 6, 2
    x = rng.standard_normal((b, c, h, w))
    flat, out = x.ravel(), np.empty(x.size)
    in_c = c // (s * s)
    for bb in range(b):
        for k in range(c):
            for j in range(h):
                for i in range(w):
                    in_index = i + w * (j + h * (k + c * bb))
                    c2, offset = k % in_c, k // in_c
                    w2, h2 = i * s + offset % s, j * s + offset // s
                    out[in_index] = flat[w2 + w * s * (h2 + h * s * (c2 + in_c * bb))]
    got = np_darknet.reorg(_o(stride=s), x)
    assert got.shape == (b, c * s * s, h // s, w // s)
    np.testing.assert_array_equal(got.ravel(), out)


@pytest.mark.parametrize("size,stride,padding", [(2, 2, 1), (3, 1, 2), (3, 2, 0), (5, 3, 4), (2, 1, 3)])
def test_reference_maxpool_is_darknets_loop(size, stride, padding):
    rng = np.random.default_rng(size * 10 + stride)
    x = rng.standard_normal((1, 2, 7, 5))
    _, c, h, w = x.shape
    oh, ow = (h + padding - size) // stride + 1, (w + padding - size) // stride + 1
    ref = np.empty((1, c, oh, ow))
    for k in range(c):
        for i in range(oh):
            for j in range(ow):
                m = np_darknet.NEG_FLT_MAX
                for n in range(size):
                    for mm in range(size):
                        y, xx = -(padding // 2) + i * stride + n, -(padding // 2) + j * stride + mm
                        if 0 <= y < h and 0 <= xx < w:
                            m = max(m, x[0, k, y, xx])
                ref[0, k, i, j] = m
    np.testing.assert_array_equal(np_darknet.maxpool(_o(size=size, stride=stride, padding=padding), x), ref)


def test_reference_conv_is_a_direct_loop():
    """Grouped, strided (x != y), dilated, padded conv against a per-output-element loop."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 4, 7, 6))
    f, g, k, sx, sy, d, pad = 6, 2, 3, 2, 1, 2, 1
    p = type("P", (), {})()
    p.weights = rng.standard_normal((f, 4 // g, k, k))
    p.biases = rng.standard_normal(f)
    got = np_darknet.convolutional(_o(filters=f, size=k, stride_x=sx, stride_y=sy, dilation=d, padding=pad,
                                      groups=g, activation="linear"), x, p)
    P = pad * d
    oh, ow = (7 + 2 * P - d * (k - 1) - 1) // sy + 1, (6 + 2 * P - d * (k - 1) - 1) // sx + 1
    ref = np.zeros((1, f, oh, ow))
    for o in range(f):
        grp = o // (f // g)
        for i in range(oh):
            for j in range(ow):
                acc = p.biases[o]
                for ci in range(4 // g):
                    for ky in range(k):
                        for kx in range(k):
                            y, xx = i * sy - P + ky * d, j * sx - P + kx * d
                            if 0 <= y < 7 and 0 <= xx < 6:
                                acc += p.weights[o, ci, ky, kx] * x[0, grp * (4 // g) + ci, y, xx]
                ref[0, o, i, j] = acc
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_reference_agrees_with_darknet_io(tmp_path):
    """Two independently written references (np_darknet, darknet_io.forward_numpy) agree on a mixed net."""
    body = (conv(6, 3, 1) + sec("maxpool", size=2, stride=2) + conv(6, 3, 1, act="mish") +
            sec("shortcut", **{"from": -2}, activation="leaky") + sec("upsample", stride=2) +
            sec("route", layers=[-1, -5]) + conv(4, 1, 1, bn=0, act="logistic"))
    cfg, weights = write_net(tmp_path, body, (16, 12), 3)
    from yolo_cl.cfg import parse_cfg
    from yolo_cl.layers import build_layers, parse_net
    sections = parse_cfg(cfg)
    layers = build_layers(sections, parse_net(sections[0], (16, 12)))
    blob = np.random.default_rng(5).random((2, 3, 12, 16)).astype(np.float32)
    ours = np_darknet.forward(layers, load_weights(weights, layers), blob)
    theirs = darknet_io.forward_numpy(str(cfg), str(weights), blob)
    for i, y in enumerate(ours):
        np.testing.assert_allclose(theirs[i], y, rtol=1e-4, atol=1e-4)


# -- convolution ------------------------------------------------------------------------------------------

CONV_CASES = {
    # kernel size x stride, odd input
    **{f"k{k}s{s}": (conv(5, k, s), (17, 13), 3) for k in (1, 3, 5, 7) for s in (1, 2)},
    # stride_x != stride_y
    "sx2sy1_k3": (conv(6, 3, stride_x=2, stride_y=1), (17, 13), 3),
    "sx1sy2_k1": (conv(4, 1, stride_x=1, stride_y=2), (13, 17), 3),
    "sx3sy2_k5": (conv(3, 5, stride_x=3, stride_y=2), (31, 9), 2),
    # pad off, explicit padding
    "nopad_k3": (conv(5, 3, 1, pad=0), (17, 13), 3),
    "nopad_k5s2": (conv(5, 5, 2, pad=0), (31, 9), 3),
    "padding2_k3": (conv(5, 3, 1, pad=0, padding=2), (13, 11), 3),
    "padding1_k5s2": (conv(5, 5, 2, pad=0, padding=1), (17, 13), 3),
    "padding1_k1": (conv(4, 1, 1, pad=0, padding=1), (9, 7), 3),
    # dilation
    "dil2_k3": (conv(5, 3, 1, dilation=2), (17, 13), 3),
    "dil2_k3s2": (conv(5, 3, 2, dilation=2), (17, 13), 3),
    "dil3_k5": (conv(4, 5, 1, dilation=3), (31, 19), 2),
    # groups
    "g2_k3": (conv(6, 3, 1, groups=2), (17, 13), 4),
    "g4_k1": (conv(12, 1, 1, groups=4), (17, 13), 8),
    "g4_k3s2": (conv(8, 3, 2, groups=4), (13, 11), 8),
    "g3_mult2": (conv(6, 3, 1, groups=3), (13, 11), 3),
    "dw_k3": (conv(6, 3, 1, groups=6), (17, 13), 6),
    "dw_k5s2": (conv(5, 5, 2, groups=5), (17, 13), 5),
    "dw_k3_dil2": (conv(4, 3, 1, groups=4, dilation=2), (13, 11), 4),
    "dw_k3_sx2sy1": (conv(3, 3, groups=3, stride_x=2, stride_y=1), (13, 11), 3),
    # one input channel
    "c1_k3": (conv(4, 3, 1), (17, 13), 1),
    "c1_k1": (conv(3, 1, 1), (31, 9), 1),
    "c1_k7s2": (conv(2, 7, 2), (31, 19), 1),
    # filters that are not multiples of any tile
    "f1_k3": (conv(1, 3, 1), (17, 13), 3),
    "f17_k1": (conv(17, 1, 1), (31, 9), 5),
    "f33_k3s2": (conv(33, 3, 2), (31, 9), 3),
    "f255_k1": (conv(255, 1, 1, bn=0, act="linear"), (13, 11), 8),
    "f255_k3": (conv(255, 3, 1), (9, 7), 3),
    # even kernels (pad=1 pads size/2 on each side)
    "k2s2": (conv(6, 2, 2), (17, 13), 3),
    "k4s1": (conv(5, 4, 1), (13, 11), 3),
    # kernel larger than the input, stride larger than the kernel
    "k7_on_5x3": (conv(4, 7, 1), (5, 3), 3),
    "k1s3": (conv(5, 1, 3), (17, 13), 3),
    "k3s4": (conv(5, 3, 4), (17, 13), 3),
    # without batchnorm
    "nobn_k3": (conv(5, 3, 1, bn=0, act="linear"), (17, 13), 3),
    "nobn_k1s2": (conv(7, 1, 2, bn=0), (17, 13), 3),
    # a chain: the second conv reads the first's output (not the network input)
    "chain": (conv(8, 3, 2) + conv(5, 3, 1, groups=1) + conv(5, 3, 1, groups=5) + conv(3, 1, 1), (31, 19), 3),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv(tmp_path, case):
    body, size, channels = CONV_CASES[case]
    det = check(tmp_path, body, size, channels)
    if case.startswith("dw"):
        assert "depthwise" in launches(det)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_conv_activation(tmp_path, act):
    bn = ACTIVATIONS.index(act) % 2
    check(tmp_path, conv(7, 3, 1, bn=bn, act=act) + conv(5, 1, 1, bn=1 - bn, act=act), (17, 13), 3)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_activation_large_inputs(tmp_path, act):
    """Pre-activations from -1000 to 1000 through a 1x1 identity conv: softplus/exp thresholds, no overflow."""
    cfg = tmp_path / "act.cfg"
    cfg.write_text(net_header(40, 8, 1) + conv(1, 1, 1, bn=0, act=act))
    weights = tmp_path / "act.weights"
    weights.write_bytes(np.array([0, 2, 0], "<i4").tobytes() + np.array([0], "<u8").tobytes() +
                        np.array([0.0, 1.0], "<f4").tobytes())    # bias 0, weight 1
    det = yolo_cl.Detector(cfg, weights, input_size=(40, 8))
    edges = [-1000, -100, -45, -30, -20.5, -20, -19.5, -6, -2.5, -2, -1.5, -1e-3, 0, 1e-3, 1.5, 5.9, 6, 6.1,
             19.5, 20, 20.5, 30, 45, 100, 1000]
    x = np.concatenate([np.array(edges), np.linspace(-25, 25, 320 - len(edges))]).astype(np.float32)
    blob = x.reshape(1, 1, 8, 40)
    got = det.forward(blob)
    ref = np_darknet.activate(blob.astype(np.float64), act)
    np.testing.assert_allclose(got[0], ref, rtol=1e-5, atol=1e-6)


# -- pooling ----------------------------------------------------------------------------------------------

POOL_CASES = {
    "k2s2_odd": (sec("maxpool", size=2, stride=2), (17, 13), 3),
    "k2s2_pad0": (sec("maxpool", size=2, stride=2, padding=0), (17, 13), 3),
    "k3s2_pad1": (sec("maxpool", size=3, stride=2, padding=1), (17, 13), 2),
    "k3s2_pad3": (sec("maxpool", size=3, stride=2, padding=3), (17, 13), 2),
    "k3s1_same": (sec("maxpool", size=3, stride=1), (17, 13), 3),
    "k5s1_spp": (sec("maxpool", size=5, stride=1), (17, 13), 3),
    "k9s1_spp": (sec("maxpool", size=9, stride=1), (17, 13), 3),
    "k13s1_spp": (sec("maxpool", size=13, stride=1), (17, 13), 3),
    "k4s3": (sec("maxpool", size=4, stride=3), (31, 9), 3),
    "k2s1_tiny": (sec("maxpool", size=2, stride=1), (17, 13), 3),
    "k1s2": (sec("maxpool", size=1, stride=2), (17, 13), 3),
    "sx2sy1": (sec("maxpool", size=2, stride_x=2, stride_y=1), (17, 13), 3),
    "sx1sy3_k3": (sec("maxpool", size=3, stride_x=1, stride_y=3, padding=1), (13, 17), 2),
    "c1_k2s2": (sec("maxpool", size=2, stride=2), (31, 19), 1),
    "depth_out4": (sec("maxpool", maxpool_depth=1, out_channels=4), (13, 11), 6),
    "depth_out1": (sec("maxpool", maxpool_depth=1), (13, 11), 5),
    "avgpool": (sec("avgpool"), (17, 13), 5),
    "avgpool_c1": (sec("avgpool"), (31, 9), 1),
    "after_conv": (conv(5, 3, 1) + sec("maxpool", size=2, stride=2) + sec("maxpool", size=3, stride=1) +
                   sec("avgpool"), (31, 19), 3),
}


@pytest.fixture(params=["rows", "pixels"])
def small_kernels(request, monkeypatch):
    """Run the pools and upsampling both ways, whatever the test device: a row of output per
    work-item (what a CPU runs) and an element per work-item (what a GPU runs)."""
    from yolo_cl import kernels
    everywhere = {"CPU": True, "GPU": True, "ACCELERATOR": True}
    monkeypatch.setattr(kernels, "ROW_KERNELS", everywhere if request.param == "rows" else {})
    return request.param


def assert_small_kernel_geometry(det, way: str) -> None:
    """Each pool / upsample launch has a work-item per row (``rows``: of the output for a pool,
    of the input for the others) or per output element (``pixels``)."""
    seen = 0
    for l in det.executor(1).launches:
        if l.name in ("maxpool_rows", "maxpool_nested", "upsample"):
            x, out = l.node.inputs[0], l.node.output
            rows = out.h if l.name == "maxpool_rows" else x.h
            pixels = x.h * x.w if l.name == "maxpool_nested" else out.h * out.w
            assert l.gsize[0] == (rows if way == "rows" else pixels), (l.name, way, l.gsize)
            seen += 1
    assert seen


@pytest.mark.parametrize("case", list(POOL_CASES))
def test_pool(tmp_path, case, small_kernels):
    body, size, channels = POOL_CASES[case]
    det = check(tmp_path, body, size, channels)
    if "maxpool" in body and "maxpool_depth" not in body:
        assert_small_kernel_geometry(det, small_kernels)


def test_spp_block(tmp_path, small_kernels):
    """YOLOv4's SPP: three stride-1 maxpools routed with their input; the pools write into the concat."""
    body = (conv(4, 1, 1) + sec("maxpool", size=5, stride=1) + sec("route", layers=-2) +
            sec("maxpool", size=9, stride=1) + sec("route", layers=-4) + sec("maxpool", size=13, stride=1) +
            sec("route", layers=[-1, -3, -5, -6]))
    assert_small_kernel_geometry(check(tmp_path, body, (17, 13), 3), small_kernels)


# -- route ------------------------------------------------------------------------------------------------

ROUTE_CASES = {
    "single": (conv(4, 3, 1) + conv(5, 3, 1) + sec("route", layers=-2)),
    "single_absolute": (conv(4, 3, 1) + conv(5, 3, 1) + sec("route", layers=0) + conv(3, 3, 1)),
    "multi": (conv(4, 3, 1) + conv(5, 3, 1) + sec("route", layers=[-1, -2])),
    "multi_of_views": (conv(6, 3, 1) + sec("route", layers=-1, groups=2, group_id=1) + sec("dropout") +
                       conv(2, 1, 1) + sec("route", layers=[-2, -1, -3])),
    "multi_then_conv": (conv(4, 3, 1) + conv(5, 3, 1) + sec("route", layers=[-1, -2]) + conv(3, 1, 1)),
    "group0": (conv(6, 3, 1) + sec("route", layers=-1, groups=2, group_id=0)),
    "group1": (conv(6, 3, 1) + sec("route", layers=-1, groups=2, group_id=1)),
    "group1_then_conv": (conv(6, 3, 1) + sec("route", layers=-1, groups=2, group_id=1) + conv(4, 3, 1)),
    "group2_of3": (conv(9, 3, 1) + sec("route", layers=-1, groups=3, group_id=2) + conv(4, 1, 1)),
    "groups_multi": (conv(4, 3, 1) + conv(6, 3, 1) + sec("route", layers=[-1, -2], groups=2, group_id=1)),
    "same_layer_twice": (conv(3, 3, 1) + conv(2, 3, 1) + sec("route", layers=[-1, -2, -1])),
    # yolov4-tiny's CSP block: half of a conv, two convs, concat, 1x1, concat with the first conv
    "csp": (conv(8, 3, 1) + sec("route", layers=-1, groups=2, group_id=1) + conv(4, 3, 1) + conv(4, 3, 1) +
            sec("route", layers=[-1, -2]) + conv(8, 1, 1) + sec("route", layers=[-6, -1])),
    # nested: a route of routes; layer 0 and layer 3 are routed twice; the last route exposes all of them
    "nested": (conv(3, 3, 1) + conv(4, 3, 1) + sec("route", layers=[0, 1]) + conv(5, 1, 1) +
               sec("route", layers=[2, 3]) + sec("route", layers=[0, 3, 1]) + sec("route", layers=-2) +
               sec("route", layers=[4, 5, 6, 2])),
    # a conv fused with its shortcut writes into a concat slice
    "fused_shortcut_into_concat": (conv(4, 3, 1) + conv(4, 3, 1) + sec("shortcut", **{"from": -2}) +
                                   conv(4, 3, 1) + sec("route", layers=[-1, -2])),
    # the fused conv reads its residual from one slice of a concat and writes another
    "residual_and_output_in_one_concat": (conv(4, 3, 1) + conv(4, 3, 1) + sec("shortcut", **{"from": -2}) +
                                          sec("route", layers=[-1, -3])),
    "dead_branch": (conv(4, 3, 1) + conv(5, 3, 1) + sec("route", layers=-2)),
    "route_of_input_sized_maxpool": (sec("maxpool", size=3, stride=1) + conv(3, 3, 1) +
                                     sec("route", layers=[-1, -2]) + conv(2, 1, 1)),
}


@pytest.mark.parametrize("case", list(ROUTE_CASES))
def test_route(tmp_path, case):
    det = check(tmp_path, ROUTE_CASES[case], (17, 13), 3)
    if case == "multi_then_conv":
        assert "copy" not in ops(det), "producers should write straight into the concat"
    if case in ("fused_shortcut_into_concat", "residual_and_output_in_one_concat"):
        assert fused_residuals(det) == 1


# -- shortcut ---------------------------------------------------------------------------------------------

SHORTCUT_CASES = {
    # fusable: conv -> shortcut with a same-shape `from`; the add and its activation run in the conv epilogue
    "fused_leaky": (conv(5, 3, 1) + conv(5, 3, 1, act="mish") + sec("shortcut", **{"from": -2}, activation="leaky"), 1),
    "fused_1x1_linear": (conv(6, 3, 1) + conv(6, 1, 1) + sec("shortcut", **{"from": -2}), 1),
    "fused_depthwise_swish": (conv(4, 3, 1) + conv(4, 3, 1, groups=4) +
                              sec("shortcut", **{"from": -2}, activation="swish"), 1),
    "fused_from_route": (conv(4, 3, 1) + conv(2, 3, 1) + sec("route", layers=[-1, -2]) + conv(6, 3, 1) +
                         sec("shortcut", **{"from": -2}, activation="relu"), 1),
    "fused_absolute_from": (conv(5, 3, 1) + conv(5, 3, 2) + conv(5, 3, 1) + sec("shortcut", **{"from": 1}), 1),
    # not fusable
    "after_maxpool": (conv(4, 3, 1) + sec("maxpool", size=3, stride=1) +
                      sec("shortcut", **{"from": -2}, activation="leaky"), 0),
    "after_route": (conv(3, 3, 1) + conv(3, 3, 1) + sec("route", layers=[-1, -2]) + conv(6, 3, 1) +
                    sec("route", layers=-2) + sec("shortcut", **{"from": -2}, activation="logistic"), 0),
    "conv_used_twice": (conv(4, 3, 1) + conv(4, 3, 1) + sec("shortcut", **{"from": -2}) +
                        sec("route", layers=[-2, -1]), 0),
    "from_fewer_channels": (conv(3, 3, 1) + conv(6, 3, 1) + sec("shortcut", **{"from": -2}), 0),
    "from_more_channels": (conv(8, 3, 1) + conv(5, 3, 1) + sec("shortcut", **{"from": -2}, activation="tanh"), 0),
    "from_self": (conv(4, 3, 1) + sec("shortcut", **{"from": -1}, activation="leaky"), 0),
    "depthwise_from_group_view": (conv(8, 3, 1) + sec("route", layers=-1, groups=2, group_id=1) +
                                  conv(4, 3, 1, groups=4) + sec("shortcut", **{"from": -2}), 1),
    "two_from": (conv(4, 3, 1) + conv(4, 3, 1) + conv(4, 3, 1) +
                 sec("shortcut", **{"from": [-2, -3]}, activation="relu"), 0),
    "four_from_mixed_channels": (conv(4, 3, 1) + conv(2, 3, 1) + conv(4, 3, 1) + conv(6, 3, 1) + conv(4, 3, 1) +
                                 sec("shortcut", **{"from": [-2, -3, -4, -5]}, activation="logistic"), 0),
    "chained": (conv(4, 3, 1) + conv(4, 3, 1) + sec("shortcut", **{"from": -2}) + conv(4, 3, 1) +
                sec("shortcut", **{"from": -2}, activation="mish") + sec("shortcut", **{"from": -4}), 1),
}


@pytest.mark.parametrize("case", list(SHORTCUT_CASES))
def test_shortcut(tmp_path, case):
    body, fused = SHORTCUT_CASES[case]
    det = check(tmp_path, body, (17, 13), 3)
    assert fused_residuals(det) == fused


# -- upsample, reorg, scale_channels, sam, dropout, softmax --------------------------------------------------

MISC_CASES = {
    "upsample2": (conv(4, 3, 1) + sec("upsample", stride=2), (9, 7), 3),
    "upsample3": (conv(3, 3, 1) + sec("upsample", stride=3), (9, 7), 3),
    "upsample2_scale": (conv(3, 1, 1) + sec("upsample", stride=2, scale=0.5), (5, 3), 2),
    "upsample_route": (conv(4, 3, 1) + conv(4, 3, 2) + sec("upsample", stride=2) + sec("route", layers=[-1, -3]),
                       (16, 12), 4),
    "reorg2": (conv(4, 3, 1) + sec("reorg", stride=2), (12, 8), 3),
    "reorg2_c1_input": (conv(4, 3, 1) + sec("reorg", stride=2), (10, 6), 1),
    "reorg3": (conv(9, 3, 1) + sec("reorg", stride=3), (9, 6), 3),
    "reorg_yolov2": (conv(8, 3, 1) + conv(4, 3, 2) + sec("route", layers=-2) + sec("reorg", stride=2) +
                     sec("route", layers=[-1, -3]) + conv(5, 3, 1), (16, 12), 3),
    "scale_channels_se": (conv(6, 3, 1) + sec("avgpool") + conv(3, 1, 1, bn=0, act="relu") +
                          conv(6, 1, 1, bn=0, act="logistic") + sec("scale_channels", **{"from": -4}),
                          (17, 13), 3),
    "scale_channels_act": (conv(5, 3, 1) + sec("avgpool") + conv(5, 1, 1, bn=0, act="logistic") +
                           sec("scale_channels", **{"from": -3}, activation="leaky"), (13, 11), 3),
    "scale_channels_of_concat": (conv(3, 3, 1) + conv(3, 3, 1) + sec("route", layers=[-1, -2]) + sec("avgpool") +
                                 conv(6, 1, 1, act="logistic") + sec("scale_channels", **{"from": -3}), (13, 11), 3),
    "scale_wh": (conv(5, 3, 1) + conv(1, 1, 1, act="logistic") +
                 sec("scale_channels", **{"from": -2}, scale_wh=1), (17, 13), 3),
    "sam": (conv(4, 3, 1) + conv(4, 1, 1, act="logistic") + sec("sam", **{"from": -2}), (17, 13), 3),
    "sam_act": (conv(4, 3, 1) + conv(4, 3, 1, act="tanh") + sec("sam", **{"from": -2}, activation="relu"),
                (13, 11), 3),
    "dropout_middle": (conv(4, 3, 1) + sec("dropout", probability=0.3) + conv(3, 3, 1), (17, 13), 3),
    "dropout_last": (conv(4, 3, 1) + sec("dropout", probability=0.5), (17, 13), 3),
    "dropout_first": (sec("dropout") + conv(3, 3, 1), (17, 13), 3),
    "softmax_classifier": (conv(8, 3, 2) + sec("avgpool") + conv(10, 1, 1, bn=0, act="linear") + sec("softmax"),
                           (31, 19), 3),
    "softmax_groups": (conv(6, 3, 1) + sec("softmax", groups=4), (5, 4), 3),
    "softmax_groups_temperature": (conv(6, 3, 1, bn=0, act="linear") + sec("softmax", groups=3, temperature=2.5),
                                   (7, 3), 3),
}


@pytest.mark.parametrize("case", [c for c in MISC_CASES if c.startswith("upsample")])
def test_upsample_both_ways(tmp_path, case, small_kernels):
    body, size, channels = MISC_CASES[case]
    assert_small_kernel_geometry(check(tmp_path, body, size, channels), small_kernels)


@pytest.mark.parametrize("case", list(MISC_CASES))
def test_misc(tmp_path, case):
    body, size, channels = MISC_CASES[case]
    det = check(tmp_path, body, size, channels)
    if case.startswith("softmax"):
        total = [g.sum() for g in det.forward(np.ones((1, channels, size[1], size[0]), np.float32))]
        assert total[0] == pytest.approx({"softmax_classifier": 1, "softmax_groups": 4}.get(case, 3), rel=1e-5)


# -- heads, precision, batch --------------------------------------------------------------------------------

YOLO_NET = (conv(8, 3, 1) + sec("maxpool", size=2, stride=2) + conv(16, 3, 1) + sec("maxpool", size=2, stride=2) +
            conv(16, 3, 1) + conv(18, 1, 1, bn=0, act="linear") +
            sec("yolo", mask=[3, 4, 5], anchors="10,14,23,27,37,58,81,82,135,169,344,319", classes=1, num=6) +
            sec("route", layers=-3) + conv(8, 1, 1) + sec("upsample", stride=2) + sec("route", layers=[-1, -8]) +
            conv(16, 3, 1) + conv(18, 1, 1, bn=0, act="linear") +
            sec("yolo", mask=[0, 1, 2], anchors="10,14,23,27,37,58,81,82,135,169,344,319", classes=1, num=6))

REGION_NET = (conv(8, 3, 1) + conv(4, 3, 2) + sec("route", layers=-2) + sec("reorg", stride=2) +
              sec("route", layers=[-1, -3]) + conv(12, 1, 1, bn=0, act="linear") +
              sec("region", anchors="1,1,2,2", classes=1, num=2, softmax=1))

MIXED_NET = (conv(6, 3, 1, act="mish") + conv(6, 3, 1, groups=6, act="swish") +
             sec("shortcut", **{"from": -2}, activation="leaky") + sec("maxpool", size=2, stride=2) +
             conv(8, 3, 1, groups=2) + sec("route", layers=-1, groups=2, group_id=1) + conv(4, 1, 1) +
             sec("upsample", stride=2) + sec("route", layers=[-1, -6]) + conv(5, 3, 1, act="relu6") +
             sec("shortcut", **{"from": -3}, activation="linear") + sec("avgpool") +
             conv(3, 1, 1, bn=0, act="linear") + sec("softmax"))


def test_yolo_heads_in_cfg_order(tmp_path):
    det = check(tmp_path, YOLO_NET, (32, 24), 3)
    assert [o.shape for o in det.forward(np.zeros((1, 3, 24, 32), np.float32))] == [(1, 18, 6, 8), (1, 18, 12, 16)]


def test_region_head(tmp_path):
    det = check(tmp_path, REGION_NET, (16, 12), 3)
    assert det.heads[0].kind == "region"


SHAPES_NET = (conv(4, 3, 1) + sec("reorg", stride=2) + sec("maxpool", maxpool_depth=1, out_channels=6) +
              conv(6, 1, 1, act="logistic") + sec("sam", **{"from": -2}) + sec("route", layers=[-1, -3, -4]) +
              sec("upsample", stride=3, scale=0.5) + sec("avgpool") + conv(28, 1, 1, bn=0, act="logistic") +
              sec("scale_channels", **{"from": -3}, activation="tanh") + sec("softmax", groups=2))


@pytest.mark.parametrize("net,size", [(YOLO_NET, (32, 24)), (MIXED_NET, (18, 14)), (SHAPES_NET, (10, 6))],
                         ids=["yolo", "mixed", "shapes"])
def test_fp16(tmp_path, net, size):
    """Half storage (float math): within ~1e-2 of the float64 reference, relative to each output's range."""
    cfg, weights = write_net(tmp_path, net, size, 3)
    det = yolo_cl.Detector(cfg, weights, input_size=size, precision="fp16")
    blob = np.random.default_rng(7).random((2, 3, size[1], size[0])).astype(np.float32)
    got, ref = det.forward(blob), reference(det, weights, blob)
    assert [g.shape for g in got] == [r.shape for r in ref]
    for g, r in zip(got, ref):
        assert np.all(np.isfinite(g))
        assert np.abs(g - r).max() <= 1e-2 * np.abs(r).max()


# the first head's input is also written into a later concat (an output view with a channel offset)
HEAD_IN_CONCAT_NET = (conv(6, 3, 1) + conv(12, 1, 1, bn=0, act="linear") +
                      sec("yolo", mask=[0, 1], anchors="1,1,2,2", classes=1, num=2) + conv(3, 3, 1) +
                      sec("route", layers=[-1, -3]) + conv(12, 1, 1, bn=0, act="linear") +
                      sec("yolo", mask=[0, 1], anchors="1,1,2,2", classes=1, num=2))


@pytest.mark.parametrize("net,size", [(YOLO_NET, (32, 24)), (MIXED_NET, (18, 14)), (ROUTE_CASES["nested"], (17, 13)),
                                      (ROUTE_CASES["group1"], (17, 13)), (HEAD_IN_CONCAT_NET, (13, 11))],
                         ids=["yolo", "mixed", "nested", "group_view_output", "head_in_concat"])
def test_batch_equals_single(tmp_path, net, size):
    """A batch of 3 gives each image the result it gets alone, and matches the reference."""
    cfg, weights = write_net(tmp_path, net, size, 3)
    det = yolo_cl.Detector(cfg, weights, input_size=size)
    blob = np.random.default_rng(8).standard_normal((3, 3, size[1], size[0])).astype(np.float32)
    batched = det.forward(blob)
    assert_close(batched, reference(det, weights, blob))
    for i in range(3):
        single = det.forward(blob[i:i + 1])
        for b, s in zip(batched, single):
            np.testing.assert_allclose(b[i], s[0], rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(s).max())))


def test_every_prefix_of_a_mixed_net(tmp_path):
    """Each intermediate layer of MIXED_NET as the last layer of its own net (fusion differs at the cut)."""
    sections = ["[" + part for part in MIXED_NET.split("[")[1:]]
    for k in range(1, len(sections) + 1):
        d = tmp_path / str(k)
        d.mkdir()
        check(d, "".join(sections[:k]), (18, 14), 3, seed=k)


class FixedTuning:
    """A tuning database that answers one config per kind of conv (pointwise, depthwise, other)."""

    def __init__(self, general: dict, pointwise: dict = None, depthwise: dict = None) -> None:
        self.general, self.pointwise, self.depthwise = general, pointwise or general, depthwise or general

    def pick(self, node) -> dict:
        from yolo_cl import kernels as kconv
        if kconv.is_depthwise(node):
            return self.depthwise
        return self.pointwise if kconv.is_pointwise(node) else self.general

    def conv_config(self, node, batch: int) -> dict:
        return dict(self.pick(node))


BASIC = dict(general={"algo": "im2col", "TM": 3, "VW": 4, "KU": 2}, pointwise={"algo": "gemm1x1", "TM": 5, "VW": 8},
             depthwise={"algo": "depthwise"})
CPU_MV = dict(general={"family": "cpu", "algo": "im2col", "kernel": "mv", "TN": 3, "VW": 4, "NV": 2, "KU": 2, "WG": 0},
              pointwise={"family": "cpu", "algo": "gemm1x1", "kernel": "mv", "TN": 6, "VW": 8, "NV": 1, "KU": 4,
                         "WG": 0})
CPU_NV = dict(general={"family": "cpu", "algo": "im2col", "kernel": "nv", "TM": 6, "VW": 4, "NV": 2, "KU": 4, "WG": 1},
              pointwise={"family": "cpu", "algo": "gemm1x1", "kernel": "nv", "TM": 1, "VW": 16, "NV": 1, "KU": 2,
                         "WG": 1})
CONFIG_NET = (conv(4, 3, 1) + conv(4, 3, 1, act="mish") + sec("shortcut", **{"from": -2}, activation="swish") +
              conv(8, 1, 1, groups=2) + conv(8, 3, 2, groups=4) + conv(8, 3, 1, groups=8, act="relu6") +
              sec("shortcut", **{"from": -2}) + sec("route", layers=-1, groups=2, group_id=1) + conv(17, 1, 1) +
              conv(3, 5, 1, dilation=2) + sec("route", layers=[-1, -2]))


@pytest.mark.parametrize("configs", [BASIC, CPU_MV, CPU_NV], ids=["basic", "cpu_mv", "cpu_nv"])
def test_conv_configs(tmp_path, configs):
    """Explicit (tuned) kernel configs, not only the heuristic's: cl/conv.cl's im2col + the plain GEMM,
    the depthwise kernel, both CPU GEMM variants, with residuals and group views, at batch 2."""
    tuning = FixedTuning(**configs)
    det = check(tmp_path, CONFIG_NET, (19, 15), 3, batch=2, tuning=tuning)
    for ex in (det.executor(1), det.executor(2)):
        convs = [l for l in ex.launches if l.node.op == "conv" and l.name in ("gemm", "depthwise")]
        assert len(convs) == 7
        for l in convs:
            assert l.config == tuning.pick(l.node), "a config fell back to the heuristic"


def test_forward_at_other_sizes(tmp_path):
    """One Detector, blobs of other sizes: the graph is rebuilt per size and still matches the reference."""
    cfg, weights = write_net(tmp_path, YOLO_NET, (32, 24), 3)
    det = yolo_cl.Detector(cfg, weights, input_size=(32, 24))
    for b, (w, h) in ((2, (40, 16)), (1, (12, 28)), (1, (32, 24))):
        blob = np.random.default_rng(w).standard_normal((b, 3, h, w)).astype(np.float32)
        assert_close(det.forward(blob), reference(det, weights, blob))
