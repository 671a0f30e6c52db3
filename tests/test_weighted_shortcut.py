"""AlexeyAB's weighted [shortcut] (weights_type, weights_normalization) against shortcut_multilayer_cpu.

The reference transliterates Darknet's loop (src/blas.c) element by element in float32; the
weights file is written here by hand in load_weights_upto's order (each conv's biases and
weights, then the shortcut's (n + 1) or (n + 1) * channels factors).
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import yolo_cl
from yolo_cl.errors import CfgError, WeightsError
from yolo_cl.weights import load_weights

sys.path.insert(0, os.path.dirname(__file__))
import np_darknet  # noqa: E402
from test_layers import assert_close, fused_residuals  # noqa: E402
from tiny_cfgs import conv, net_header, sec  # noqa: E402

SIZE = (7, 5)


def multilayer_reference(x: np.ndarray, adds: list, weights: np.ndarray, norm: str) -> np.ndarray:
    """shortcut_multilayer_cpu for one image batch, with its float32 arithmetic and index rules."""
    b = x.shape[0]
    src_outputs = x[0].size
    n = len(adds)
    layer_step = weights.size // (n + 1)
    step = src_outputs // layer_step
    xin = x.reshape(b, -1).astype(np.float32)
    add_flat = [a.reshape(b, -1).astype(np.float32) for a in adds]
    out = np.empty_like(xin)
    f32 = np.float32
    for src_b in range(b):
        for src_i in range(src_outputs):
            ws = [weights[src_i // step + k * layer_step] for k in range(n + 1)]
            total, max_val = f32(1), f32(-np.finfo(np.float32).max)
            if norm != "none":
                if norm == "softmax":
                    max_val = max(ws)
                total = f32(0.0001)
                for w in ws:
                    total = f32(total + (max(w, f32(0)) if norm == "relu" else np.exp(f32(w - max_val))))

            def factor(w):
                if norm == "relu":
                    return f32(max(w, f32(0)) / total)
                if norm == "softmax":
                    return f32(np.exp(f32(w - max_val)) / total)
                return w
            v = f32(xin[src_b, src_i] * factor(ws[0]))
            for k in range(n):
                if src_i < add_flat[k].shape[1]:
                    v = f32(v + add_flat[k][src_b, src_i] * factor(ws[k + 1]))
            out[src_b, src_i] = v
    return out.reshape(x.shape)


def write_weights(path, convs: list, shortcut: np.ndarray, rng) -> None:
    """Header 0.2.0 + 64-bit seen, each conv (no batchnorm) biases then weights, then the shortcut's."""
    blocks = [np.array([0, 2, 0], "<i4").tobytes(), np.array([0], "<u8").tobytes()]
    for filters, fan_in in convs:
        blocks.append(rng.normal(0, 0.5, filters).astype("<f4").tobytes())
        blocks.append((rng.standard_normal(filters * fan_in) / np.sqrt(fan_in)).astype("<f4").tobytes())
    blocks.append(shortcut.astype("<f4").tobytes())
    path.write_bytes(b"".join(blocks))


CASES = {   # name: (weights_type, weights_normalization, from, activation)
    "per_feature": ("per_feature", "none", "-2", "linear"),
    "per_channel_relu": ("per_channel", "relu", "-2", "leaky"),
    "per_channel_softmax_3": ("per_channel", "softmax", "-2,-3,-4", "linear"),
    "per_layer_avg_relu_5": ("per_layer", "avg_relu", "-2,-3,-4,-5,0", "logistic"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_weighted_shortcut(tmp_path, case):
    wtype, norm, frm, act = CASES[case]
    c = 4
    body = "".join(conv(c, 1, 1, bn=0, act="linear") for _ in range(5))
    body += sec("shortcut", **{"from": frm}, weights_type=wtype, weights_normalization=norm, activation=act)
    cfg = tmp_path / "w.cfg"
    cfg.write_text(net_header(*SIZE) + body)
    n = len(frm.split(","))
    nweights = (n + 1) * (c if wtype == "per_channel" else 1)
    rng = np.random.default_rng(4)
    raw = rng.normal(0.3, 1.0, nweights).astype(np.float32)
    w = tmp_path / "w.weights"
    write_weights(w, [(c, 3)] + [(c, c)] * 4, raw, rng)
    det = yolo_cl.Detector(cfg, w)
    assert fused_residuals(det) == 0
    params = load_weights(w, det.layers)
    np.testing.assert_array_equal(params[5].weights, raw)
    blob = np.random.default_rng(5).standard_normal((2, 3, SIZE[1], SIZE[0])).astype(np.float32)
    outs = np_darknet.forward(det.layers, {k: v for k, v in params.items() if k < 5}, blob[:, :, :, :])[:5]
    adds = [outs[j] for j in det.layers[5].inputs[1:]]
    want = np_darknet.activate(multilayer_reference(outs[4], adds, raw, "relu" if norm == "avg_relu" else norm)
                               .astype(np.float64), act)
    assert_close(det.forward(blob, outputs=[5]), [want])


def test_weighted_shortcut_errors(tmp_path):
    base = net_header(7, 5) + conv(2, 1, 1, bn=0) * 2
    cfg = tmp_path / "e.cfg"
    cfg.write_text(base + sec("shortcut", **{"from": -2}, weights_type="per_pixel"))
    with pytest.raises(CfgError, match="option 'weights_type=per_pixel' is not one of"):
        yolo_cl.Detector(cfg, tmp_path / "none.weights")
    cfg.write_text(base + sec("shortcut", **{"from": -2}, weights_type="per_feature", weights_normalization="max"))
    with pytest.raises(CfgError, match="'weights_normalization=max' is not one of none, relu, softmax"):
        yolo_cl.Detector(cfg, tmp_path / "none.weights")
    cfg.write_text(base + sec("shortcut", **{"from": -2}, weights_type="per_feature", alpha=2))
    with pytest.raises(CfgError, match=r"alpha/beta \(pjreddie's Darknet\) and weights_type \(AlexeyAB's\)"):
        yolo_cl.Detector(cfg, tmp_path / "none.weights")
    cfg.write_text(base + sec("shortcut", **{"from": -2}, weights_type="per_channel"))
    w = tmp_path / "short.weights"
    write_weights(w, [(2, 3), (2, 2)], np.ones(3, np.float32), np.random.default_rng(0))   # needs 6
    with pytest.raises(WeightsError, match=r"data ends inside layer 2 \[shortcut\]"):
        yolo_cl.Detector(cfg, w)
