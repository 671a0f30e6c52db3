"""Layers a conv's epilogue writes instead of its own output (graph.mark_write_fusions), on PoCL.

A 2x2 stride-2 [maxpool] or an [upsample] that is the only reader of a conv's output is marked
on that conv. The GPU GEMM families store the upsampled output from their epilogue (each value
stride x stride times); the tensor-core family's implicit GEMM (emulated here, the real
instruction on an NVIDIA GPU) orders its columns in pooled blocks and stores each window's max.
The layer's launch then disappears, and the network's outputs must equal the same plan with
folding off exactly (the epilogue stores what the layer's own kernel would have) and the NumPy
Darknet forward pass (tests/darknet_io.py, independent of yolo_cl) within the precision's error.
"""
from __future__ import annotations

import numpy as np
import pytest

from darknet_io import forward_numpy
from mma_env import emulate, rt  # noqa: F401 - fixtures
from tiny_cfgs import conv, maxpool, net_header, route, upsample
from tiny_graphs import TINY_TILE, FixedTuning, graph_of, local_pick, write_model
from yolo_cl.executor import Executor
from yolo_cl.kernels import gemm_mma as gm
from yolo_cl.kernels import winograd
from yolo_cl.precision import FP16, FP32, TF32

# 40x24: the first two pools' maps (20x12, 10x6) are whole blocks of 4 pooled pixels, the third's
# and the last's (5x3) end in a partial block; the second pool writes into a concat's slice; the
# 1x1 conv's output only the upsample reads; the last pool's input is read by a route too, so its
# conv stores both.
CFG = (net_header(40, 24)
       + conv(8) + maxpool(2, 2)                      # 1
       + conv(12, bn=0, act="mish") + maxpool(2, 2)   # 3 (mish: the max after ACT)
       + conv(10) + maxpool(2, 2)                     # 5: 15 pooled pixels
       + conv(6, 1) + upsample(2)                     # 7
       + route(-1, 3)
       + conv(9, bn=0, act="linear") + maxpool(2, 2)  # 10: its input also read by 11's route
       + route(-2) + conv(5, 1, bn=0, act="linear"))

WRITTEN = [1, 3, 5, 7, 10]      # layers whose launch a writing conv replaces


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    cfg, wts = write_model(str(tmp_path_factory.mktemp("wt")), "w", CFG, seed=5)
    blob = np.random.default_rng(4).random((2, 3, 24, 40), dtype=np.float32) - 0.5
    ref = forward_numpy(cfg, wts, blob, keep="heads")
    return cfg, wts, blob, list(ref.values())[-1]


def mma_pick(tile: dict, wino: bool = False):
    """The tensor-core family's implicit GEMM (1x1s straight from the input) with ``tile``; with
    ``wino``, the local family's Winograd F(2x2) for the 3x3 stride-1 convs that read a pool."""
    local = local_pick(TINY_TILE, m=2)

    def pick(node) -> dict:
        if wino and winograd.applicable(node) and node.attrs.get("read_through"):
            return local(node)
        return {"algo": gm.conv_algos(node)[0], "family": "mma", **tile}
    return pick


def layers_of(ex: Executor) -> set:
    return {i for l in ex.launches for i in l.node.layers}


def test_graph_marks_only_sole_readers(net):
    """Every 2x2 pool and the upsample that read a conv's output are marked; the conv whose output
    a route reads too keeps storing it; a folding plan gives the pooled tensor life from its writer."""
    graph = graph_of(net[0])
    marked = {n.layers[0]: n.attrs["write_through"] for n in graph.nodes if n.attrs.get("write_through")}
    assert {c: w.layers[0] for c, w in marked.items()} == {0: 1, 2: 3, 4: 5, 6: 7, 9: 10}
    assert [c for c in marked if graph.nodes[[n.layers[0] for n in graph.nodes].index(c)].attrs["write_keeps"]] == [9]
    from yolo_cl.planner import lifetimes
    conv0 = graph.nodes[0]
    pooled = conv0.attrs["write_through"].output.tensor.id
    assert lifetimes(graph, fold=True)[pooled][0] == 0
    assert lifetimes(graph, fold=False)[pooled][0] == 1


@pytest.mark.parametrize("precision,tile", [
    (FP16, dict(MWG=16, NWG=32, KWG=16, WM=1, WN=2, ST=2, GA=2)),     # runs of 8 columns, ragged N
    (FP16, dict(MWG=32, NWG=32, KWG=32, WM=2, WN=1, ST=2, GA=1)),     # per-k tables
    (FP16, dict(MWG=16, NWG=16, KWG=16, WM=1, WN=1)),                 # one stage, register prefetch
    (TF32, dict(MWG=16, NWG=32, KWG=8, WM=1, WN=2, ST=2, GA=4)),      # floats by cp.async
], ids=["f16-ga2", "f16-ga1", "f16-st1", "tf32-ga4"])
def test_written_through_equals_unfolded_and_numpy(rt, net, precision, tile):
    cfg, wts, blob, ref = net
    graph = graph_of(cfg, wts)
    mma = gm.mode_for(rt, precision)
    on = Executor(rt, graph, batch=2, precision=precision, tuning=FixedTuning(mma_pick(tile)), mma=mma, fold=True)
    off = Executor(rt, graph, batch=2, precision=precision, tuning=FixedTuning(mma_pick(tile)), mma=mma, fold=False)
    assert layers_of(off) - layers_of(on) == set(WRITTEN)
    writes = sorted(l.config["writes"] for l in on.launches if l.config.get("writes"))
    assert writes == ["maxpool"] * 4 + ["upsample"]
    a, b = on.run(blob)[0], off.run(blob)[0]
    np.testing.assert_array_equal(a, b)
    assert float(np.abs(a - ref).max() / np.abs(ref).max()) < 2e-2


def test_tiles_without_whole_blocks_keep_the_pool(rt, net):
    """Warp tiles of 8 columns cannot hold a window: the pools keep their launches, the upsample
    (written by any GEMM epilogue) does not."""
    cfg, wts, blob, ref = net
    tile = dict(MWG=16, NWG=16, KWG=16, WM=1, WN=2, ST=2)
    ex = Executor(rt, graph_of(cfg, wts), batch=2, precision=FP16, tuning=FixedTuning(mma_pick(tile)),
                  mma=gm.mode_for(rt, FP16), fold=True)
    assert {1, 3, 5, 10} <= layers_of(ex) and 7 not in layers_of(ex)
    assert float(np.abs(ex.run(blob)[0] - ref).max() / np.abs(ref).max()) < 2e-2


def test_local_family_writes_the_upsample(rt, net):
    """The FMA local GEMM stores the upsample from its epilogue too (fp32: equal to NumPy's)."""
    cfg, wts, blob, ref = net
    graph = graph_of(cfg, wts)
    pick = FixedTuning(local_pick(TINY_TILE))
    on = Executor(rt, graph, batch=2, precision=FP32, tuning=pick, fold=True)
    off = Executor(rt, graph, batch=2, precision=FP32, tuning=pick, fold=False)
    assert layers_of(off) - layers_of(on) == {7}
    a = on.run(blob)[0]
    np.testing.assert_array_equal(a, off.run(blob)[0])
    assert float(np.abs(a - ref).max() / np.abs(ref).max()) < 2e-4


def test_writer_wins_over_a_reader(rt, net):
    """At tf32 the Winograd convs (local family) that would read through a pool or an upsample their
    producer writes are bound again without folding: they read the stored tensor, and the result
    is unchanged."""
    cfg, wts, blob, ref = net
    graph = graph_of(cfg, wts)
    tile = dict(MWG=16, NWG=32, KWG=8, WM=1, WN=2, ST=2)
    mma = gm.mode_for(rt, TF32)
    on = Executor(rt, graph, batch=2, precision=TF32, tuning=FixedTuning(mma_pick(tile, wino=True)), mma=mma,
                  fold=True)
    off = Executor(rt, graph, batch=2, precision=TF32, tuning=FixedTuning(mma_pick(tile, wino=True)), mma=mma,
                   fold=False)
    readers = {l.node.layers[0]: bool(l.config.get("through")) for l in on.launches if l.name == "wino_input"}
    assert readers == {2: False, 9: False}          # pool 1 and the upsample were written by their producers
    assert layers_of(off) - layers_of(on) == {1, 5, 7}      # pools 3 and 10 follow Winograd convs
    np.testing.assert_array_equal(on.run(blob)[0], off.run(blob)[0])


# Pools that no block of columns can hold (a 2x2 stride-1 one, yolov3-tiny's layer 11, and a 3x3
# stride-2 one with padding), each alone reading a conv whose K is split: the split-K sum computes
# each window from the partial sums.
SPLIT = (net_header(20, 14) + conv(16) + conv(24) + maxpool(2, 1) + conv(12, bn=0, act="mish") + maxpool(3, 2)
         + conv(6, 1, bn=0, act="linear"))


@pytest.mark.parametrize("family", ["mma", "local"])
def test_split_sums_write_any_pool(rt, tmp_path, family):
    cfg, wts = write_model(str(tmp_path), "s", SPLIT, seed=8)
    blob = np.random.default_rng(9).random((2, 3, 14, 20), dtype=np.float32) - 0.5
    ref = list(forward_numpy(cfg, wts, blob, keep="heads").values())[-1]
    local = local_pick(TINY_TILE)

    def pick(node) -> dict:
        split = {"SK": 2} if node.attrs["size"] == 3 and node.layers[0] > 0 else {}
        if family == "local":
            return {**local(node), **split}
        return {"algo": gm.conv_algos(node)[0], "family": "mma", **dict(MWG=16, NWG=32, KWG=16, WM=1, WN=2, ST=2),
                **split}
    precision = FP16 if family == "mma" else FP32
    mma = gm.mode_for(rt, precision) if family == "mma" else ""
    graph = graph_of(cfg, wts)
    on = Executor(rt, graph, batch=2, precision=precision, tuning=FixedTuning(pick), mma=mma, fold=True)
    off = Executor(rt, graph, batch=2, precision=precision, tuning=FixedTuning(pick), mma=mma, fold=False)
    sums = [l for l in on.launches if l.name == "splitk_sum"]
    assert len(sums) == 2 and all(l.config.get("writes") == "maxpool" for l in sums)
    assert layers_of(off) - layers_of(on) == {2, 4}
    a = on.run(blob)[0]
    np.testing.assert_array_equal(a, off.run(blob)[0])
    assert float(np.abs(a - ref).max() / np.abs(ref).max()) < (2e-2 if precision.half else 2e-4)


@pytest.mark.parametrize("cpu_cfg", [
    {"family": "cpu", "algo": "winograd", "m": 4, "kernel": "fused", "KB": 8, "KS": 1},
    {"family": "cpu", "algo": "winograd", "m": 2, "kernel": "fused", "KB": 8, "KS": 1},
    {"family": "cpu", "algo": "winograd", "m": 4, "kernel": "mv", "VW": 16, "NV": 1, "KU": 1, "WG": 0, "TN": 6},
], ids=["fused-f4", "fused-f2", "mv-f4"])
@pytest.mark.parametrize("precision", [FP32, FP16], ids=["fp32", "fp16"])
def test_cpu_winograd_writes_its_pool_by_default(rt, net, cpu_cfg, precision):
    """The CPU family's Winograd stores (fused, and the tile-vector output transform) hold whole
    2x2 windows in each tile: a pool that alone reads such a conv is stored pooled, by default on
    a CPU device too (writing costs nothing), and the outputs equal the unfolded plan's."""
    cfg, wts, blob, ref = net
    graph = graph_of(cfg, wts)

    def pick(node) -> dict:         # the CPU family throughout (a GPU runs it as named), 1x1s unfused
        if winograd.applicable(node):
            return dict(cpu_cfg)
        return {"family": "cpu", "algo": "gemm1x1", "kernel": "nv", "VW": 8, "NV": 1, "KU": 4, "WG": 1, "ORD": 0, "TM": 4}
    default = Executor(rt, graph, batch=2, precision=precision, tuning=FixedTuning(pick))
    off = Executor(rt, graph, batch=2, precision=precision, tuning=FixedTuning(pick), fold=False)
    written = {l.node.layers[0] for l in default.launches if l.config.get("writes") == "maxpool"}
    assert written == {0, 2, 4}                    # conv 9's pool is also read by the route: kept
    pools = {1, 3, 5, 10}                          # (a GPU's default plan also reads the upsample through)
    assert (layers_of(off) - layers_of(default)) & pools == {1, 3, 5}
    a = default.run(blob)[0]
    np.testing.assert_array_equal(a, off.run(blob)[0])
    assert float(np.abs(a - ref).max() / np.abs(ref).max()) < (2e-2 if precision.half else 2e-4)   # F(4x4) in half


def test_the_tuner_checks_what_a_writing_config_stores(rt, net):
    """``tuner.ConvBench`` benches each marked conv as the network runs it: the tensor-core tile
    that stores a pool (the last one keeping its own output for the route too) or the upsample is
    checked on what it stores, and within the fp16 gate; a wrong pooled value would fail it."""
    from yolo_cl import tuner
    graph = graph_of(net[0], net[1])
    tile = dict(MWG=16, NWG=32, KWG=16, WM=1, WN=2, ST=2, GA=2)
    mma = gm.mode_for(rt, FP16)
    q = rt.cl.CommandQueue(rt.context, rt.device)
    stored = {}
    for node in graph.nodes:
        if node.attrs.get("write_through") is None:
            continue
        bench = tuner.ConvBench(rt, node, 2, FP16, q, seed=1, mma=mma)
        cfg = mma_pick(tile)(node)
        if cfg["algo"] != "implicit":
            cfg.pop("GA")                   # the gather is the implicit GEMM's
        launches = bench.bind(cfg)
        assert tuner.writes_through(launches)
        stored[node.layers[0]] = bench.keeps
        assert bench.check(launches) < FP16.tolerance
        bench.ref_through = -bench.ref_through
        assert bench.check(launches) > 1.0
    assert stored == {0: False, 2: False, 4: False, 6: False, 9: True}
