"""The tuner never stores a config that fails to build or gives a wrong answer on this device.

Faults are injected into the candidate list: one candidate whose build raises (as a driver
bug would), one whose launches skip the GEMM (so the output is stale: a wrong answer). Both
must be rejected by the tuner's NumPy check and the best *correct* config chosen.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from yolo_cl.cfg import parse_cfg
from yolo_cl.errors import DeviceError
from yolo_cl.graph import build_graph
from yolo_cl.kernels.conv import heuristic_config
from yolo_cl.layers import build_layers, parse_net
from yolo_cl.runtime import Runtime
from yolo_cl.tuner import ConvBench, Tuner
from yolo_cl.weights import load_weights

ROOT = Path(__file__).resolve().parents[1]
TINY_CFG = ROOT / "models" / "yolov3-tiny.cfg"
TINY_WEIGHTS = ROOT / "models" / "yolov3-tiny.weights"


@pytest.fixture(scope="module")
def conv_node():
    sections = parse_cfg(TINY_CFG)
    net = parse_net(sections[0], 64)
    layers = build_layers(sections, net)
    graph = build_graph(net, layers, load_weights(TINY_WEIGHTS, layers))
    return next(n for n in graph.nodes if n.op == "conv" and n.attrs["size"] == 3 and n.attrs["in_c"] >= 16)


@pytest.mark.parametrize("search", ["traverse", "search"])
def test_tuner_rejects_broken_and_wrong_candidates(conv_node, monkeypatch, search):
    rt = Runtime()
    good = heuristic_config(conv_node, rt)
    broken = dict(good, injected="fails to build")
    wrong = dict(good, injected="wrong answer")
    real_bind = ConvBench.bind

    def bind(self, config):
        if config.get("injected") == "fails to build":
            raise DeviceError("kernel gemm.cl failed to build on this device: error: injected")
        if config.get("injected") == "wrong answer":
            launches = real_bind(self, good)
            return launches[:-1] if len(launches) > 1 else []   # the last launch writes the output: skip it
        return real_bind(self, config)

    monkeypatch.setattr(ConvBench, "bind", bind)
    tuner = Tuner(rt, fraction=1.0, reps=1)
    monkeypatch.setattr(tuner, "candidates", lambda node: [wrong, broken, good])
    result = getattr(tuner, search)(conv_node)
    assert result.config == good
    assert result.rejected == 2
