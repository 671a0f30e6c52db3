"""Weights files: every header Darknet writes, the writer, and networks that need no weights at all."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import yolo_cl
from yolo_cl.cfg import parse_cfg
from yolo_cl.errors import WeightsError
from yolo_cl.layers import build_layers, parse_net
from yolo_cl.weights import load_weights, needs_weights, read_header, save_weights

sys.path.insert(0, os.path.dirname(__file__))
import np_darknet  # noqa: E402
from test_layers import write_weights  # noqa: E402
from tiny_cfgs import conv, net_header, sec  # noqa: E402

NET = net_header(12, 10)
PARAMETERLESS = (sec("maxpool", size=2, stride=1) + sec("upsample", stride=2) + sec("maxpool", size=2, stride=2) +
                 sec("route", layers=[-1, -3]) + sec("shortcut", **{"from": -4}, activation="leaky") +
                 sec("maxpool", size=3, stride=2))


def layers_of(path: Path) -> list:
    sections = parse_cfg(path)
    return build_layers(sections, parse_net(sections[0]))


@pytest.fixture
def convnet(tmp_path):
    cfg = tmp_path / "c.cfg"
    cfg.write_text(NET + conv(5, 3, 1) + conv(4, 1, 1, bn=0, act="linear", groups=1))
    w = tmp_path / "c.weights"
    write_weights(cfg, w, seed=3)
    return cfg, w


def test_save_weights_round_trips(convnet, tmp_path):
    cfg, w = convnet
    layers = layers_of(cfg)
    params = load_weights(w, layers)
    out = tmp_path / "copy.weights"
    save_weights(out, layers, params, seen=12345)
    assert out.read_bytes()[20:] == w.read_bytes()[20:]          # the same floats in the same order
    h = read_header(out)
    assert (h.major, h.minor, h.revision, h.seen, h.wide_seen, h.transpose) == (0, 2, 0, 12345, True, False)
    again = load_weights(out, layers)
    for i, cp in params.items():
        for name in ("biases", "weights", "scales", "mean", "variance"):
            a, b = getattr(cp, name), getattr(again[i], name)
            assert (a is None and b is None) or np.array_equal(a, b)


def test_save_weights_leaves_nothing_on_failure(convnet, tmp_path):
    cfg, w = convnet
    layers = layers_of(cfg)
    params = load_weights(w, layers)
    with pytest.raises(WeightsError, match="cannot write weights file"):
        save_weights(tmp_path / "missing" / "x.weights", layers, params)
    bad = dict(params)
    bad[0] = type(params[0])(params[0].biases[:2], params[0].weights)
    with pytest.raises(WeightsError, match=r"layer 0 \[convolutional\] biases have shape \(2,\), not \(5,\)"):
        save_weights(tmp_path / "y.weights", layers, bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.cfg", "c.weights"]


@pytest.mark.parametrize("major,minor,wide", [(0, 1, False), (0, 2, True), (1, 0, True), (0, 0, False),
                                              (1001, 0, False), (0, 1001, False), (1001, 0, True)])
def test_every_header_darknet_writes(convnet, tmp_path, major, minor, wide):
    """32-bit ``seen`` before format 0.2 and (pjreddie) with the transpose flag; 64-bit otherwise; a
    transposed header with a 64-bit ``seen`` (AlexeyAB reads it so) is told apart by the file size."""
    cfg, w = convnet
    layers = layers_of(cfg)
    body = w.read_bytes()[20:]
    f = tmp_path / "h.weights"
    f.write_bytes(np.array([major, minor, 7], "<i4").tobytes() + np.array([99], "<u8" if wide else "<u4").tobytes()
                  + body)
    params = load_weights(f, layers)
    assert np.array_equal(params[1].weights.ravel(), load_weights(w, layers)[1].weights.ravel())
    h = read_header(f, f.stat().st_size, len(body) // 4)
    assert (h.seen, h.wide_seen, h.transpose) == (99, wide, major > 1000 or minor > 1000)


def test_bad_header_is_refused(tmp_path):
    f = tmp_path / "x.weights"
    f.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(32))
    with pytest.raises(WeightsError, match="is not a Darknet weights file"):
        read_header(f)


def test_parameterless_network_needs_no_weights(tmp_path):
    cfg = tmp_path / "p.cfg"
    cfg.write_text(NET + PARAMETERLESS)
    det = yolo_cl.Detector(cfg)
    assert not needs_weights(det.layers)
    blob = np.random.default_rng(0).standard_normal((1, 3, 10, 12)).astype(np.float32)
    ref = np_darknet.forward(det.layers, {}, blob)[-1]
    np.testing.assert_allclose(det.forward(blob)[0], ref, rtol=1e-5, atol=1e-5)
    cfg2 = tmp_path / "q.cfg"
    cfg2.write_text(NET + conv(2, 1, 1))
    with pytest.raises(yolo_cl.YoloClError, match="no weights given"):
        yolo_cl.Detector(cfg2)


def test_cli_runs_a_parameterless_network_without_weights(tmp_path):
    """A [yolo] head fed straight from a concat of two max-pools of the image: no parameters, no file.
    The unused key is reported once on stderr, beside the detections on stdout."""
    import cv2
    cfg = tmp_path / "p.cfg"
    cfg.write_text(NET + sec("maxpool", size=2, stride=1) * 2 + sec("route", layers=[-1, -2], activation="relu") +
                   sec("yolo", classes=1, num=1, mask=0, anchors="4,4"))
    img = tmp_path / "i.png"
    cv2.imwrite(str(img), np.full((20, 24, 3), 200, np.uint8))
    r = subprocess.run([sys.executable, "-m", "yolo_cl", "detect", str(img), "--cfg", str(cfg), "--thresh", "0.5"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [f"{cfg}:16: warning: layer 2 [route]: unused key 'activation=relu' "
                                     "(no Darknet reads it)"]
    assert str(img) in r.stdout
