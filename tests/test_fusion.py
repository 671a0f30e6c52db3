"""Layers folded into a conv's input read (graph.mark_read_fusions, cl/fused.cl), on PoCL.

Folding is the default on GPUs only (on a CPU the redundant reads cost more than the launch);
these tests ask for it with ``fold=True`` and check that a CPU's default plan leaves it off.

A [maxpool] or [upsample] that only a Winograd conv reads runs inside that conv's input
transform: its launch disappears, and the network's outputs must equal both the NumPy
reference (tests/darknet_io.py, independent of yolo_cl) and the same plan with folding off,
exactly: the folded read computes the same values the layer's own kernel would have stored.
"""
from __future__ import annotations

import tempfile

import numpy as np
import pytest

from darknet_io import forward_numpy
from tiny_cfgs import conv, maxpool, net_header, route, upsample
from tiny_graphs import TINY_TILE, FixedTuning, graph_of, local_pick, write_model
from yolo_cl.executor import Executor
from yolo_cl.precision import FP16, FP32
from yolo_cl.runtime import Runtime

# Odd sizes; a 2/2 pool, a 3/2 pool with padding, a 2/1 pool (yolov3-tiny's layer 11), an
# upsample into the first slice of a concat a conv writes the rest of, and a maxpool whose
# output a second layer also reads (so it must not be folded).
CFG = (net_header(23, 19)
       + conv(8) + maxpool(2, 2)
       + conv(12) + maxpool(3, 2)
       + conv(10, bn=0) + maxpool(2, 1)
       + conv(6) + upsample(2) + route(-1, 2)
       + conv(9, bn=0, act="linear") + maxpool(2, 2)
       + conv(5, bn=0) + route(-1, -2))


wino_pick = local_pick(TINY_TILE, m=2)        # Winograd F(2x2) for the 3x3 convs, the implicit GEMM for the rest
implicit_pick = local_pick(TINY_TILE)


@pytest.fixture(scope="module")
def net():
    cfg, wts = write_model(tempfile.mkdtemp(), "f", CFG, seed=3)
    graph = graph_of(cfg, wts)
    blob = np.random.default_rng(2).random((2, 3, 19, 23), dtype=np.float32) - 0.5
    ref = forward_numpy(cfg, wts, blob, keep="heads")
    return graph, blob, list(ref.values())[-1]


@pytest.fixture(scope="module")
def rt():
    return Runtime()


def test_graph_marks_only_legal_folds(net):
    """The three pools that only a conv reads and the upsample are marked; the last pool, read by
    the final route too, is not."""
    graph = net[0]
    marked = [p for n in graph.nodes if n.op == "conv" for p in n.attrs.get("read_through") or ()]
    assert [p.op for p in marked] == ["maxpool", "maxpool", "maxpool", "upsample"]
    last_pool = [n for n in graph.nodes if n.op == "maxpool"][-1]
    assert last_pool not in marked
    # A plan that may fold keeps each folded pool's input alive until its conv; one that will not, does not.
    from yolo_cl.planner import lifetimes
    conv = next(n for n in graph.nodes if n.op == "conv" and n.attrs.get("read_through"))
    src = conv.attrs["read_through"][0].inputs[0].tensor.id
    step = graph.nodes.index(conv)
    assert lifetimes(graph, fold=True)[src][1] == step
    assert lifetimes(graph, fold=False)[src][1] == step - 1


@pytest.mark.parametrize("precision", [FP32, FP16], ids=["fp32", "fp16"])
def test_folded_network_equals_unfolded_and_numpy(rt, net, precision):
    graph, blob, ref = net
    on = Executor(rt, graph, batch=2, precision=precision, tuning=FixedTuning(wino_pick), fold=True)
    off = Executor(rt, graph, batch=2, precision=precision, tuning=FixedTuning(wino_pick), fold=False)
    default = Executor(rt, graph, batch=2, precision=precision, tuning=FixedTuning(wino_pick))
    assert len(default.launches) == len((off if rt.is_cpu else on).launches)    # folding: GPUs only, by default
    kinds = [l.name for l in on.launches]
    assert kinds.count("maxpool_rows") == 1 and kinds.count("upsample") == 0       # 3 pools + upsample folded
    assert len(off.launches) == len(on.launches) + 4
    assert sum(1 for l in on.launches if l.config.get("through")) == 4
    a, b = on.run(blob)[0], off.run(blob)[0]
    np.testing.assert_array_equal(a, b)
    err = float(np.abs(a - ref).max() / np.abs(ref).max())
    assert err < (5e-3 if precision.half else 2e-4)
    np.testing.assert_array_equal(on.run(blob, eager=True)[0], a)     # re-binding folds the same way


def test_conv_not_reading_through_keeps_the_producer(rt, net):
    """Convs on the implicit GEMM cannot fold: every pool keeps its launch (the upsample's is gone
    all the same: its producer's epilogue writes it, tests/test_write_through.py)."""
    graph, blob, ref = net
    ex = Executor(rt, graph, batch=2, tuning=FixedTuning(implicit_pick), fold=True)
    kinds = [l.name for l in ex.launches]
    assert kinds.count("maxpool_rows") == 4 and kinds.count("upsample") == 0
    assert not any(l.config.get("through") for l in ex.launches)
    assert [l.config.get("writes") for l in ex.launches if l.config.get("writes")] == ["upsample"]
    out = ex.run(blob)[0]
    assert float(np.abs(out - ref).max() / np.abs(ref).max()) < 2e-4


def test_default_plan_of_yolov3_tiny_equals_unfolded(rt):
    """The shipped model on this device's default plan (tuning database or heuristic) at a small size."""
    from yolo_cl import Detector
    det = Detector("yolov3-tiny", input_size=160)
    graph = det.executor(1).graph
    on = Executor(det.runtime, graph, tuning=det.tuning, fold=True)
    off = Executor(det.runtime, graph, tuning=det.tuning, fold=False)
    blob = np.random.default_rng(0).random((1, 3, 160, 160), dtype=np.float32)
    assert len(on.launches) < len(off.launches)
    for a, b in zip(on.run(blob), off.run(blob)):
        np.testing.assert_array_equal(a, b)


SPP_CONV = net_header(17, 12) + conv(6, bn=0)
SPP = (SPP_CONV + maxpool(5, 1) + route(-2) + maxpool(9, 1) + route(-4)
       + maxpool(13, 1) + route(-1, -3, -5, -6) + conv(4, 1, bn=0))


def np_maxpool_same(x: np.ndarray, size: int) -> np.ndarray:
    """Darknet's stride-1 max-pool with padding size-1: the max over the in-image part of each centred window."""
    r = size // 2
    pad = np.pad(x, ((0, 0), (0, 0), (r, r), (r, r)), constant_values=-np.inf)
    h, w = x.shape[2:]
    return np.max([pad[:, :, dy:dy + h, dx:dx + w] for dy in range(size) for dx in range(size)], axis=0)


# The same with two pools (5 and 9): the kernel's two-window variant.
SPP2 = (SPP_CONV + maxpool(5, 1) + route(-2) + maxpool(9, 1)
        + route(-1, -3, -4) + conv(4, 1, bn=0))


@pytest.mark.parametrize("precision,pools", [(FP32, 3), (FP16, 3), (FP32, 2)], ids=["fp32-3", "fp16-3", "fp32-2"])
def test_spp_pools_run_as_one_launch(rt, precision, pools):
    """SPP's pools become one maxpool_nested launch whose concat equals NumPy's pools of the
    conv output exactly (max is exact), and the network equals the NumPy reference."""
    cfg, wts = write_model(tempfile.mkdtemp(), "spp", SPP if pools == 3 else SPP2, seed=4)
    blob = np.random.default_rng(5).random((2, 3, 12, 17), dtype=np.float32) - 0.5
    route, last = (6, 7) if pools == 3 else (4, 5)
    graph = graph_of(cfg, wts, keep=(0, route, last))
    assert [n.op for n in graph.nodes][:3] == ["conv", "maxpool_nested", "conv"]
    ex = Executor(rt, graph, batch=2, precision=precision)
    kinds = [l.name for l in ex.launches]
    assert kinds.count("maxpool_nested") == 1 and "maxpool_rows" not in kinds
    conv0, spp, out = ex.run(blob)
    sizes = (13, 9, 5) if pools == 3 else (9, 5)
    want = np.concatenate([np_maxpool_same(conv0, s) for s in sizes] + [conv0], 1)
    np.testing.assert_array_equal(spp, want)
    ref = forward_numpy(cfg, wts, blob, keep=[last])[last]
    assert float(np.abs(out - ref).max() / np.abs(ref).max()) < (5e-3 if precision.half else 2e-4)


# yolov4-tiny's second head: a route of [upsample | a conv output another route already holds]
# (so a copy), read by a 3x3 conv: both segments would fold into its input transform, but the
# strided conv before the upsample writes it from its epilogue (graph.mark_write_fusions), so the
# input transform reads through the copy alone.
COPY = (net_header(16, 14) + conv(6, bn=0) + conv(8, bn=0) + route(0, 1) + conv(4, stride=2, bn=0) + upsample(2)
        + route(-1, 1) + conv(5, bn=0, act="linear"))


@pytest.mark.parametrize("precision", [FP32, FP16], ids=["fp32", "fp16"])
def test_route_copy_and_upsample_fold_into_one_read(rt, precision):
    cfg, wts = write_model(tempfile.mkdtemp(), "copy", COPY, seed=6)
    graph = graph_of(cfg, wts)
    assert [n.op for n in graph.nodes] == ["conv", "conv", "conv", "upsample", "copy", "conv"]
    assert [p.op for p in graph.nodes[-1].attrs["read_through"]] == ["upsample", "copy"]
    blob = np.random.default_rng(7).random((2, 3, 14, 16), dtype=np.float32) - 0.5
    on = Executor(rt, graph, batch=2, precision=precision, tuning=FixedTuning(wino_pick), fold=True)
    off = Executor(rt, graph, batch=2, precision=precision, tuning=FixedTuning(wino_pick), fold=False)
    kinds = [l.name for l in on.launches]
    assert "copy" not in kinds and "upsample" not in kinds and len(off.launches) == len(on.launches) + 2
    assert [l.config.get("writes") for l in on.launches if l.config.get("writes")] == ["upsample"]
    assert [l.config.get("through") for l in on.launches if l.config.get("through")] == ["copy"]
    a, b = on.run(blob)[0], off.run(blob)[0]
    np.testing.assert_array_equal(a, b)
    ref = forward_numpy(cfg, wts, blob, keep="heads")
    ref = list(ref.values())[-1]
    assert float(np.abs(a - ref).max() / np.abs(ref).max()) < (5e-3 if precision.half else 2e-4)
