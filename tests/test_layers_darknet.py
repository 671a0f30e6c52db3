"""The Darknet layers and activations beyond the YOLO core, each against a float64 NumPy reference.

[connected], [deconvolutional], [crop], [batchnorm], [activation], [logistic], [local_avgpool],
[reorg3d], [l2norm], [empty]/[silence], [cost], [implicit]/[implicit_add]/[implicit_mul], every
activation of Darknet's src/activations.c (element-wise ones as [activation] layers and as conv
epilogues, the normalize_channels family after a conv), and the [Gaussian_yolo] and [detection]
heads' decoding against box-by-box loops written from get_*_detections.

The weights files are written here in Darknet's order (load_*_weights in parser.c) and the
reference reads the arrays this writer made, not what the engine's weights reader returns, so a
slip in the reader's order shows up as a mismatch. Nets are tiny (a few channels, odd sizes).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import yolo_cl
from yolo_cl.cfg import parse_cfg
from yolo_cl.errors import CfgError
from yolo_cl.layers import ACTIVATIONS, CHANNEL_ACTIVATIONS, build_layers, parse_net
from yolo_cl.weights import read_layer

sys.path.insert(0, os.path.dirname(__file__))
import np_darknet  # noqa: E402
from tiny_cfgs import conv, net_header, sec  # noqa: E402

RTOL = 1e-4


def _blocks(layer, rng) -> list:
    """(name, array) pairs of one layer in the order Darknet's weights file stores them."""
    p, kind = layer.p, layer.kind

    def bn(n: int) -> list:
        return [("scales", rng.uniform(0.5, 1.5, n)), ("mean", rng.normal(0, 0.5, n)),
                ("variance", rng.uniform(0.25, 2.0, n))]

    if kind == "convolutional":
        n, k = p["filters"], (p["in_c"] // p["groups"]) * p["size"] ** 2
        return [("biases", rng.normal(0, 0.5, n))] + (bn(n) if p["bn"] else []) + \
            [("weights", rng.standard_normal(n * k) * 1.5 / np.sqrt(k))]
    if kind == "deconvolutional":
        n, k = p["filters"], p["in_c"] * p["size"] ** 2
        return [("biases", rng.normal(0, 0.5, n))] + (bn(n) if p["bn"] else []) + \
            [("weights", rng.standard_normal(n * k) * 1.5 / np.sqrt(k))]
    if kind == "connected":
        n, k = p["outputs"], p["inputs"]
        return [("biases", rng.normal(0, 0.5, n)), ("weights", rng.standard_normal(n * k) * 1.5 / np.sqrt(k))] + \
            (bn(n) if p["bn"] else [])
    if kind == "local":
        n, k, loc = p["filters"], p["in_c"] * p["size"] ** 2, layer.h * layer.w
        return [("biases", rng.normal(0, 0.5, n * loc)), ("weights", rng.standard_normal(loc * n * k) * 1.5 / np.sqrt(k))]
    if kind == "batchnorm":
        return [("biases", rng.normal(0, 0.5, layer.c))] + bn(layer.c)
    if kind in ("implicit", "implicit_add", "implicit_mul"):
        return [("weights", rng.normal(1.0 if kind == "implicit_mul" else 0.0, 0.5, p["filters"] * p["atoms"]))]
    return []


def write_net(tmp_path: Path, body: str, size: tuple, channels: int = 3, seed: int = 0) -> tuple:
    """cfg and weights files (format 0.2) plus the parameters written, per layer, for the reference."""
    cfg = tmp_path / "net.cfg"
    cfg.write_text(net_header(size[0], size[1], channels) + body)
    sections = parse_cfg(cfg)
    layers = build_layers(sections, parse_net(sections[0]))
    rng = np.random.default_rng(seed)
    data = [np.array([0, 2, 0], "<i4").tobytes(), np.array([0], "<u8").tobytes()]
    params = {}
    for layer in layers:
        blocks = _blocks(layer, rng)
        if blocks:
            arrays = dict(biases=None, weights=None, scales=None, mean=None, variance=None)
            arrays.update((k, v.astype(np.float32)) for k, v in blocks)
            params[layer.index] = SimpleNamespace(**arrays)
            data += [v.astype("<f4").tobytes() for _, v in blocks]
    weights = tmp_path / "net.weights"
    weights.write_bytes(b"".join(data))
    return cfg, weights, params


def run(tmp_path: Path, body: str, size: tuple = (11, 9), channels: int = 3, seed: int = 0, blob=None,
        precision: str = "fp32") -> tuple:
    """(engine outputs, reference outputs, detector) of a tiny net on a random blob in [-3, 3]."""
    cfg, weights, params = write_net(tmp_path, body, size, channels, seed)
    det = yolo_cl.Detector(cfg, weights, precision=precision)
    if blob is None:
        blob = np.random.default_rng(seed + 1).uniform(-3, 3, (2, channels, size[1], size[0])).astype(np.float32)
    ref = np_darknet.outputs(det.layers, np_darknet.forward(det.layers, params, blob))
    return det.forward(blob), ref, det


def assert_close(got: list, ref: list, rtol: float = RTOL) -> None:
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        b = np.asarray(b)
        assert a.shape == b.shape, (a.shape, b.shape)
        scale = max(1.0, float(np.abs(b).max()))
        assert np.all(np.isfinite(a))
        assert float(np.abs(a - b).max()) <= rtol * scale, float(np.abs(a - b).max())


def ops(det) -> list:
    return [n.op for n in det.graph.nodes]


# -- activations -----------------------------------------------------------------------------------------

NEW_ACTIVATIONS = ("elu", "selu", "gelu", "hardtan", "lhtan", "ramp", "plse", "stair", "loggy", "relie", "revleaky")


def test_every_darknet_activation_is_known():
    """src/activations.c's get_activation names, all of them (no fallback to relu for any)."""
    darknet = {"logistic", "swish", "mish", "hard_mish", "normalize_channels", "normalize_channels_softmax",
               "normalize_channels_softmax_maxval", "loggy", "relu", "relu6", "elu", "selu", "gelu", "relie",
               "plse", "hardtan", "lhtan", "linear", "ramp", "revleaky", "leaky", "tanh", "stair"}
    assert set(ACTIVATIONS) | set(CHANNEL_ACTIVATIONS) == darknet


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_activation_layer_on_the_input(tmp_path, act):
    """[activation] straight on the blob: the kernel sees exactly the reference's values, so even
    stair's discontinuities compare exactly; the blob spans [-6, 6] to reach every branch."""
    blob = np.random.default_rng(3).uniform(-6, 6, (2, 3, 9, 11)).astype(np.float32)
    blob[0, 0, 0, :11] = [-5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5]    # stair/plse/lhtan break points
    got, ref, det = run(tmp_path, sec("activation", activation=act), blob=blob)
    assert ops(det) == ["act"]
    assert_close(got, ref)


@pytest.mark.parametrize("act", [a for a in NEW_ACTIVATIONS if a != "stair"])
def test_activation_as_conv_epilogue(tmp_path, act):
    """The new activations fused into the GEMM's epilogue (stair is left out: its jumps at integers
    turn a float32 rounding of the conv sum into a step of 1)."""
    got, ref, det = run(tmp_path, conv(5, 3, 1, act=act) + conv(4, 1, 1, bn=0, act=act))
    assert ops(det) == ["conv", "conv"]
    assert_close(got, ref)


def test_activation_in_shortcut_and_connected(tmp_path):
    body = conv(4, 3, 1) + conv(4, 3, 1, act="linear") + sec("shortcut", **{"from": -2}, activation="selu") + \
        sec("connected", output=7, activation="gelu")
    got, ref, _ = run(tmp_path, body)
    assert_close(got, ref)


@pytest.mark.parametrize("act", CHANNEL_ACTIVATIONS)
def test_normalize_channels_after_conv(tmp_path, act):
    """Cross-channel activations run in place after the conv (which then ends linear)."""
    got, ref, det = run(tmp_path, conv(6, 3, 1, act=act))
    assert ops(det) == ["conv", "norm_channels"]
    assert det.graph.nodes[0].attrs["activation"] == "linear"
    assert_close(got, ref)
    per_pixel = got[0].sum(axis=1)       # sum / (sum + 1e-4); 0 where normalize_channels sees no positive value
    assert np.all((per_pixel <= 1.0 + 1e-6) & ((per_pixel > 0.99) | (per_pixel == 0)))
    assert np.mean(per_pixel > 0.99) > 0.5


def test_normalize_channels_conv_is_not_fused_with_a_shortcut(tmp_path):
    body = conv(4, 3, 1) + conv(4, 3, 1, act="normalize_channels") + sec("shortcut", **{"from": -2})
    got, ref, det = run(tmp_path, body)
    assert ops(det) == ["conv", "conv", "norm_channels", "add"]
    assert_close(got, ref)


def test_channel_activation_outside_conv_is_refused(tmp_path):
    cfg = tmp_path / "bad.cfg"
    cfg.write_text(net_header(8, 8) + "[activation]\nactivation=normalize_channels\n")
    with pytest.raises(CfgError, match=r"bad.cfg:7: \[activation\]: .*only applied by \[convolutional\]"):
        yolo_cl.Detector(cfg, tmp_path / "none.weights")


# -- [connected] -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("bn,act", [(0, "logistic"), (1, "leaky"), (0, "linear"), (1, "tanh")])
@pytest.mark.parametrize("lanes", [1, 64])
def test_connected(tmp_path, monkeypatch, bn, act, lanes):
    """Both kernel shapes (a row per work-item, as on CPUs; 64 lanes per row, as on GPUs) on this device."""
    from yolo_cl.kernels import simple
    monkeypatch.setattr(simple, "CONN_WG", {"cpu": lanes, "gpu": lanes})
    body = conv(3, 3, 2) + sec("connected", output=13, batch_normalize=bn, activation=act) + \
        sec("connected", output=5, activation="linear")
    got, ref, det = run(tmp_path, body, size=(13, 11))
    assert ops(det) == ["conv", "connected", "connected"]
    assert [l.gsize for l in det.executor(2).launches if l.name == "connected"][0] == (13 * lanes, 2)
    assert got[0].shape == (2, 5, 1, 1)
    assert_close(got, ref)


def test_connected_fp16(tmp_path):
    got, ref, _ = run(tmp_path, conv(3, 3, 1) + sec("connected", output=9, activation="leaky"), precision="fp16")
    assert_close(got, ref, rtol=2e-2)


def test_connected_weights_transposed_by_the_header_flag():
    """Darknet's load_connected_weights: with transpose set the file holds (inputs, outputs)."""
    layer = SimpleNamespace(kind="connected", p=dict(outputs=3, inputs=4, bn=False))
    data = np.arange(3 + 12, dtype=np.float32)
    for transpose in (False, True):
        pos = [0]

        def take(n):
            pos[0] += n
            return data[pos[0] - n:pos[0]]
        cp = read_layer(layer, take, transpose)
        stored = data[3:].reshape((4, 3) if transpose else (3, 4))
        assert np.array_equal(cp.weights, stored.T if transpose else stored)
        assert np.array_equal(cp.biases, data[:3])


def test_connected_at_another_input_size_is_refused(tmp_path):
    """The weights fix a [connected] layer's input count: another size is a one-line error, not a wrong read."""
    cfg, weights, _ = write_net(tmp_path, conv(3, 3, 1) + sec("connected", output=4), (8, 8))
    det = yolo_cl.Detector(cfg, weights)
    with pytest.raises(CfgError, match=r"net.cfg:\d+: layer 1 \[connected\]: the weights are for 192 inputs, .* 768"):
        det.forward(np.zeros((1, 3, 16, 16), np.float32))


# -- [deconvolutional] -----------------------------------------------------------------------------------

@pytest.mark.parametrize("size,stride,pad,padding,bn", [(2, 2, 0, 0, 0), (3, 2, 1, 0, 1), (4, 2, 0, 1, 1),
                                                        (3, 1, 1, 0, 0), (5, 3, 0, 2, 1), (1, 1, 0, 0, 1)])
def test_deconvolutional(tmp_path, size, stride, pad, padding, bn):
    body = conv(3, 3, 1) + sec("deconvolutional", filters=5, size=size, stride=stride, pad=pad, padding=padding,
                               batch_normalize=bn, activation="leaky")
    got, ref, det = run(tmp_path, body, size=(7, 5))
    h = (5 - 1) * stride + size - 2 * (size // 2 if pad else padding)
    assert got[0].shape[2] == h
    assert ops(det) == ["conv", "deconv"]
    assert_close(got, ref)


def test_reference_deconv_is_a_scatter_loop():
    """np_darknet.deconvolutional against the literal GEMM + col2im scatter of forward_deconvolutional_layer."""
    rng = np.random.default_rng(0)
    c, f, h, w, size, s, pad = 2, 3, 3, 4, 3, 2, 1
    x = rng.standard_normal((1, c, h, w))
    wts = rng.standard_normal((c, f, size, size))
    oh, ow = (h - 1) * s + size - 2 * pad, (w - 1) * s + size - 2 * pad
    want = np.zeros((f, oh, ow))
    for ci in range(c):
        for fi in range(f):
            for iy in range(h):
                for ix in range(w):
                    for ky in range(size):
                        for kx in range(size):
                            r, q = iy * s + ky - pad, ix * s + kx - pad
                            if 0 <= r < oh and 0 <= q < ow:
                                want[fi, r, q] += wts[ci, fi, ky, kx] * x[0, ci, iy, ix]
    o = np_darknet.Options(SimpleNamespace(options={"filters": ("3", 0), "size": ("3", 0), "stride": ("2", 0),
                                                    "pad": ("1", 0), "activation": ("linear", 0)}))
    p = SimpleNamespace(weights=wts, biases=np.zeros(f))
    assert np.allclose(np_darknet.deconvolutional(o, x, p)[0], want)


# -- [local] ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size,stride,pad", [(3, 1, 1), (3, 2, 0), (1, 1, 0), (5, 2, 2), (2, 1, 0)])
def test_local(tmp_path, size, stride, pad):
    body = conv(3, 3, 1) + sec("local", filters=4, size=size, stride=stride, pad=pad, activation="leaky")
    got, ref, det = run(tmp_path, body, size=(9, 7))
    assert ops(det) == ["conv", "local"]
    assert_close(got, ref)


def test_local_whose_sizes_disagree_is_refused(tmp_path):
    cfg = tmp_path / "bad.cfg"
    cfg.write_text(net_header(8, 8) + "[local]\nfilters=2\nsize=3\npad=2\n")
    with pytest.raises(CfgError, match=r"bad.cfg:9: \[local\]: size=3 with pad=2"):
        yolo_cl.Detector(cfg, tmp_path / "none.weights")


# -- element-wise and shape layers ------------------------------------------------------------------------

CASES = {
    "crop": (conv(3, 3, 1) + sec("crop", crop_height=5, crop_width=6, flip=1, angle=0, saturation=1, exposure=1),
             (11, 9), ["conv", "crop"]),
    "crop_noadjust": (conv(3, 3, 1) + sec("crop", crop_height=4, crop_width=3, noadjust=1), (10, 8), ["conv", "crop"]),
    "crop_of_input": (sec("crop", crop_height=9, crop_width=10), (11, 9), ["crop"]),
    "batchnorm": (conv(4, 3, 1, bn=0, act="linear") + sec("batchnorm"), (11, 9), ["conv", "batchnorm"]),
    "batchnorm_then_activation": (conv(4, 3, 1) + sec("batchnorm") + sec("activation", activation="mish"),
                                  (11, 9), ["conv", "batchnorm", "act"]),
    "logistic": (conv(4, 3, 1) + sec("logistic"), (11, 9), ["conv", "act"]),
    "local_avgpool": (conv(3, 3, 1) + sec("local_avgpool", size=2, stride=2), (11, 9), ["conv", "local_avgpool"]),
    "local_avgpool_3s1": (conv(3, 3, 1) + sec("local_avg", size=3, stride=1), (11, 9), ["conv", "local_avgpool"]),
    "local_avgpool_xy": (conv(3, 3, 1) + sec("local_avgpool", size=3, stride_x=2, stride_y=1, padding=3),
                         (11, 9), ["conv", "local_avgpool"]),
    "reorg3d": (conv(3, 3, 1) + sec("reorg3d", stride=2), (12, 8), ["conv", "reorg3d"]),
    "reorg3d_s3": (conv(2, 3, 1) + sec("reorg3d", stride=3), (9, 6), ["conv", "reorg3d"]),
    "l2norm": (conv(5, 3, 1) + sec("l2norm"), (11, 9), ["conv", "l2norm"]),
    "lrn": (conv(9, 3, 1) + sec("normalization", alpha=0.01, beta=0.75, kappa=2, size=5), (11, 9), ["conv", "lrn"]),
    "lrn_size_4": (conv(6, 3, 1) + sec("lrn", alpha=0.002, beta=0.5, kappa=3, size=4), (11, 9), ["conv", "lrn"]),
    "empty_silence_cost": (conv(4, 3, 1) + sec("empty") + sec("silence") + conv(3, 1, 1) + sec("cost", type="sse"),
                           (11, 9), ["conv", "conv"]),
    "implicit": (conv(4, 3, 1) + sec("implicit", filters=6, atoms=2), (11, 9), ["conv", "implicit"]),
    "implicit_mul_scales_channels": (conv(5, 3, 1) + sec("implicit_mul", filters=5) +
                                     sec("scale_channels", **{"from": -2}), (11, 9), ["conv", "implicit", "scale_channels"]),
    "implicit_add_into_route": (conv(3, 3, 1) + sec("avgpool") + sec("implicit_add", filters=4) +
                                sec("route", layers=[-2, -1]), (11, 9), ["conv", "avgpool", "implicit"]),
}


@pytest.mark.parametrize("name", CASES)
def test_layer(tmp_path, name):
    body, size, want_ops = CASES[name]
    got, ref, det = run(tmp_path, body, size=size)
    assert ops(det) == want_ops
    assert_close(got, ref)


def test_reference_lrn_window_is_darknets():
    """Darknet's running sum leaves out channel size/2's square from every window: checked on a direct sum."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 2, (1, 9, 2, 3))
    o = np_darknet.Options(SimpleNamespace(options={"alpha": ("0.01", 0), "beta": ("0.75", 0), "kappa": ("2", 0),
                                                    "size": ("5", 0)}))
    sq = x * x
    want = np.empty_like(x)
    for k in range(9):
        window = sum(sq[:, j] for j in range(max(0, k - 2), min(9, k + 3)))
        want[:, k] = x[:, k] * (2 + 0.01 * (window - sq[:, 2])) ** -0.75
    assert np.allclose(np_darknet.normalization(o, x), want)


def test_layers_fp16_and_batch(tmp_path):
    """Half storage through every new kernel (two images a batch)."""
    body = conv(4, 3, 1) + sec("batchnorm") + sec("local_avgpool", size=2, stride=2) + sec("l2norm") + \
        sec("deconvolutional", filters=3, size=2, stride=2, activation="elu") + sec("crop", crop_height=4, crop_width=6) + \
        sec("local", filters=4, size=3, pad=1, activation="linear") + sec("lrn", size=3, kappa=2, alpha=0.01) + \
        sec("reorg3d", stride=2) + sec("activation", activation="gelu") + \
        conv(6, 1, 1, act="normalize_channels_softmax_maxval") + sec("implicit_mul", filters=6) + \
        sec("scale_channels", **{"from": -2})
    got, ref, det = run(tmp_path, body, size=(12, 10), precision="fp16")
    assert {"batchnorm", "local_avgpool", "l2norm", "deconv", "crop", "local", "lrn", "reorg3d", "act",
            "norm_channels", "implicit"} <= set(ops(det))
    assert_close(got, ref, rtol=2e-2)


def test_crop_that_does_not_fit_is_refused(tmp_path):
    cfg = tmp_path / "bad.cfg"
    cfg.write_text(net_header(8, 8) + "[crop]\ncrop_height=9\ncrop_width=4\n")
    with pytest.raises(CfgError, match=r"bad.cfg:7: \[crop\]: a 4x9 crop does not fit"):
        yolo_cl.Detector(cfg, tmp_path / "none.weights")


@pytest.mark.parametrize("section", ["softmax", "region"])
def test_softmax_tree_is_refused(tmp_path, section):
    cfg = tmp_path / "bad.cfg"
    cfg.write_text(net_header(8, 8) + f"[convolutional]\nfilters=6\n\n[{section}]\n"
                   "classes=1\ntree=data/9k.tree\n")
    with pytest.raises(CfgError, match=rf"bad.cfg:11: \[{section}\]: a hierarchical softmax"):
        yolo_cl.Detector(cfg, tmp_path / "none.weights")


@pytest.mark.parametrize("kind", ["rnn", "lstm", "gru", "crnn", "conv_lstm"])
def test_recurrent_layers_are_refused_by_name(tmp_path, kind):
    cfg = tmp_path / "rnn.cfg"
    cfg.write_text(net_header(8, 8) + f"[{kind}]\noutput=4\n")
    r = subprocess.run([sys.executable, "-m", "yolo_cl", "info", str(cfg)], capture_output=True, text=True)
    assert r.returncode != 0
    assert f"rnn.cfg:6: section [{kind}] is not supported" in r.stderr
    assert "Traceback" not in r.stderr


# -- heads -----------------------------------------------------------------------------------------------

def _sig(v: float) -> float:
    return 1.0 / (1.0 + np.exp(-v))


def gaussian_yolo_loop(raw: np.ndarray, mask, anchors, classes, net_w, net_h, thresh, scale_x_y, point) -> list:
    """get_gaussian_yolo_detections over forward_gaussian_yolo_layer's activations, box by box."""
    _, lh, lw = raw.shape
    x = raw.reshape(len(mask), classes + 9, lh, lw).astype(np.float64)
    out = []
    for row in range(lh):
        for col in range(lw):
            for n, m in enumerate(mask):
                e = x[n, :, row, col]
                obj = _sig(e[8])
                if obj <= thresh:
                    continue
                mu_x = _sig(e[0]) * scale_x_y - 0.5 * (scale_x_y - 1)
                mu_y = _sig(e[2]) * scale_x_y - 0.5 * (scale_x_y - 1)
                bw = np.exp(e[4]) * anchors[2 * m] / net_w
                bh = np.exp(e[6]) * anchors[2 * m + 1] / net_h
                bx, by = (col + mu_x) / lw, (row + mu_y) / lh
                if point == "left_top":
                    bx, by = bx + bw / 2, by + bh / 2
                elif point == "right_bottom":
                    bx, by = bx - bw / 2, by - bh / 2
                uc = (_sig(e[1]) + _sig(e[3]) + _sig(e[5]) + _sig(e[7])) / 4
                probs = [obj * _sig(e[9 + j]) * (1 - uc) for j in range(classes)]
                out.append(((bx, by, bw, bh), [p if p > thresh else 0.0 for p in probs]))
    return out


def detection_loop(raw: np.ndarray, side, num, classes, use_softmax, use_sqrt, thresh) -> list:
    """get_detection_detections (w = h = 1) over forward_detection_layer's output."""
    v = raw.reshape(-1).astype(np.float64).copy()
    if use_softmax:
        for i in range(side * side):
            z = v[i * classes:(i + 1) * classes]
            e = np.exp(z - z.max())
            v[i * classes:(i + 1) * classes] = e / e.sum()
    out = []
    for i in range(side * side):
        row, col = i // side, i % side
        for n in range(num):
            scale = v[side * side * classes + i * num + n]
            b = side * side * (classes + num) + (i * num + n) * 4
            box = ((v[b] + col) / side, (v[b + 1] + row) / side, v[b + 2] ** (2 if use_sqrt else 1),
                   v[b + 3] ** (2 if use_sqrt else 1))
            probs = [scale * v[i * classes + j] for j in range(classes)]
            probs = [p if p > thresh else 0.0 for p in probs]
            if max(probs) > 0:
                out.append((box, probs))
    return out


def _same_boxes(boxes, probs, want) -> None:
    """The decoded (box, class probabilities) rows equal the loop's, in any order."""
    assert len(boxes) == len(want)
    got = sorted(zip(map(tuple, np.round(boxes, 4)), map(tuple, probs)))
    exp = sorted((tuple(np.round(b, 4)), tuple(p)) for b, p in want)
    for (gb, gp), (eb, ep) in zip(got, exp):
        assert np.allclose(gb, eb, atol=2e-4)
        assert np.allclose(gp, ep, atol=2e-4)


@pytest.mark.parametrize("point,scale", [("center", 1.0), ("left_top", 1.1), ("right_bottom", 1.05)])
def test_gaussian_yolo_decode(tmp_path, point, scale):
    from yolo_cl import postprocess as post
    classes, mask, anchors = 2, [1, 2], [10, 14, 23, 27, 37, 58]
    body = conv(4, 3, 2) + conv(len(mask) * (classes + 9), 1, 1, bn=0, act="linear") + \
        sec("Gaussian_yolo", classes=classes, num=3, mask=mask, anchors=anchors, scale_x_y=scale, yolo_point=point,
            nms_kind="greedynms", beta_nms=0.6, ignore_thresh=0.7, truth_thresh=1, iou_thresh=0.213, random=1)
    got, ref, det = run(tmp_path, body, size=(32, 32))
    assert_close(got, ref)
    raw = got[0][0]
    boxes, _, probs = post.decode_gaussian_yolo(raw, det.heads[0].p, 32, 32, 0.3)
    want = gaussian_yolo_loop(raw, mask, anchors, classes, 32, 32, 0.3, scale, point)
    assert len(want) > 3
    _same_boxes(boxes, probs, want)
    dets = det.postprocess([o[0] for o in got], 64, 64, thresh=0.3)
    assert dets
    assert det.heads[0].p["nms_kind"] == "greedynms"


@pytest.mark.parametrize("use_softmax,use_sqrt", [(1, 1), (0, 0)])
def test_detection_decode(tmp_path, use_softmax, use_sqrt):
    from yolo_cl import postprocess as post
    side, num, classes = 3, 2, 4
    body = conv(3, 3, 2) + sec("connected", output=side * side * (5 * num + classes), activation="logistic") + \
        sec("detection", classes=classes, coords=4, rescore=1, side=side, num=num, softmax=use_softmax,
            sqrt=use_sqrt, jitter=0.2, object_scale=1, noobject_scale=0.5, class_scale=1, coord_scale=5)
    got, ref, det = run(tmp_path, body, size=(16, 16))
    assert_close(got, ref)
    raw = got[0][0]
    boxes, _, probs = post.decode_detection(raw, det.heads[0].p, 0.1)
    want = detection_loop(raw, side, num, classes, use_softmax, use_sqrt, 0.1)
    assert len(want) > 2
    _same_boxes(boxes, probs, want)
    assert det.postprocess([o[0] for o in got], 48, 32, thresh=0.1)


def test_detection_without_coords_4_is_refused(tmp_path):
    cfg = tmp_path / "bad.cfg"
    cfg.write_text(net_header(8, 8) + "[connected]\noutput=50\n\n[detection]\nside=2\nnum=2\n"
                   "classes=3\n")
    with pytest.raises(CfgError, match=r"bad.cfg:9: \[detection\]: coords=1: only coords=4"):
        yolo_cl.Detector(cfg, tmp_path / "none.weights")


def test_detection_size_mismatch_is_refused(tmp_path):
    cfg = tmp_path / "bad.cfg"
    cfg.write_text(net_header(8, 8) + "[connected]\noutput=50\n\n[detection]\nside=2\nnum=2\n"
                   "classes=3\ncoords=4\n")
    with pytest.raises(CfgError, match=r"bad.cfg:\d+: .*side=2, num=2, classes=3 need 52"):
        yolo_cl.Detector(cfg, tmp_path / "none.weights")


def test_bench_random_params_cover_every_weighted_layer(tmp_path):
    """`yolo-cl bench` without weights makes parameters for the new weighted layers too, and the
    file it hands OpenCV/Darknet for --compare reads back as the same parameters."""
    from yolo_cl.bench import random_params
    from yolo_cl.weights import load_weights, save_weights
    body = conv(4, 3, 1) + sec("batchnorm") + sec("local", filters=2, size=3, pad=1) + \
        sec("deconvolutional", filters=3, size=2, stride=2, batch_normalize=1) + \
        sec("connected", output=5, batch_normalize=1) + sec("implicit", filters=3)
    cfg, _, _ = write_net(tmp_path, body, (8, 8))
    sections = parse_cfg(cfg)
    layers = build_layers(sections, parse_net(sections[0]))
    params = random_params(layers)
    assert sorted(params) == [0, 1, 2, 3, 4, 5]
    save_weights(tmp_path / "r.weights", layers, params)
    back = load_weights(tmp_path / "r.weights", layers)
    for i, cp in params.items():
        for name in ("biases", "weights", "scales", "mean", "variance"):
            a, b = getattr(cp, name), getattr(back[i], name)
            assert (a is None) == (b is None) and (a is None or np.array_equal(a, b)), (i, name)


HOSTILE = ["0", "-1", "-7", "99999999", "1e9", "2.5", "abc", ""]
NEW_SECTIONS = {
    "connected": ["output", "batch_normalize", "activation"],
    "deconvolutional": ["filters", "size", "stride", "pad", "padding", "batch_normalize"],
    "local": ["filters", "size", "stride", "pad"],
    "crop": ["crop_height", "crop_width", "noadjust", "flip"],
    "local_avgpool": ["size", "stride", "stride_x", "stride_y", "padding"],
    "reorg3d": ["stride", "reverse"],
    "normalization": ["size", "alpha", "beta", "kappa"],
    "implicit": ["filters", "atoms", "mean"],
    "Gaussian_yolo": ["classes", "num", "mask", "anchors", "scale_x_y"],
    "detection": ["classes", "num", "side", "coords", "softmax"],
    "activation": ["activation"],
}


@pytest.mark.parametrize("section", NEW_SECTIONS)
def test_hostile_values_give_clean_errors(tmp_path, section):
    """Every option of the new sections, given nonsense, parses or fails with one yolo-cl error
    naming the file (never another exception): shapes only, no device needed."""
    from yolo_cl.errors import YoloClError
    cfg = tmp_path / "h.cfg"
    for key in NEW_SECTIONS[section]:
        for value in HOSTILE:
            cfg.write_text(net_header(16, 16) + f"[convolutional]\nfilters=18\nsize=1\n\n"
                           f"[{section}]\n{key}={value}\n")
            try:
                sections = parse_cfg(cfg)
                build_layers(sections, parse_net(sections[0]))
            except YoloClError as e:
                assert str(e).startswith(str(cfg)) and "\n" not in str(e), str(e)
