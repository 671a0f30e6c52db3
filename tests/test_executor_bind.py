"""Binding a plan on several threads (so that programs compile at once where the driver can):
the same launches, in the same order, and the same results as on one thread; a layer that
fails to bind is named, the first of them in plan order."""
from __future__ import annotations

import re

import numpy as np
import pytest

import yolo_cl.executor as exmod
from test_tuner import net_cfg
from yolo_cl.bench import random_params
from yolo_cl.errors import YoloClError
from yolo_cl.executor import Executor
from yolo_cl.model import load_model
from yolo_cl.precision import FP32
from yolo_cl.runtime import Runtime, is_pocl


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    path = tmp_path_factory.mktemp("bind") / "net.cfg"
    path.write_text(net_cfg(24, 20))
    return load_model(str(path), params="optional", make_params=random_params).graph


def signature(ex: Executor) -> list:
    return [(l.node.label, l.name, l.kernel.function_name, tuple(l.gsize)) for l in ex.launches]


def test_threads_bind_the_same_plan(graph, monkeypatch):
    rt = Runtime()
    if is_pocl(rt.device):
        assert rt.build_threads == 1        # PoCL compiles one program at a time per process
    x = np.random.default_rng(2).standard_normal((2, 3, 20, 24)).astype(np.float32)
    one = Executor(rt, graph, 2, FP32)
    monkeypatch.setenv("YOLO_CL_BUILD_THREADS", "4")
    assert rt.build_threads == 4
    four = Executor(rt, graph, 2, FP32)
    assert signature(four) == signature(one)
    for a, b in zip(four.run(x), one.run(x)):
        np.testing.assert_array_equal(a, b)


def test_the_first_failing_layer_is_named(graph, monkeypatch):
    convs = [n for n in graph.nodes if n.op == "conv"]
    real = exmod.bind_node

    def failing(ctx, node):
        if node is convs[1] or node is convs[3]:
            raise YoloClError("no kernel for it")
        return real(ctx, node)
    monkeypatch.setattr(exmod, "bind_node", failing)
    monkeypatch.setenv("YOLO_CL_BUILD_THREADS", "4")
    with pytest.raises(YoloClError, match=f"^layer {re.escape(convs[1].label)} .*: no kernel for it$"):
        Executor(Runtime(), graph, 1, FP32)
