"""The kernel-family registry (which family a config belongs to, which families a device has,
their heuristics and candidates), the one Precision value and the one load_model."""
from __future__ import annotations

import numpy as np
import pytest

from test_tuner import convs, fake_rt, net_cfg
from tiny_cfgs import conv, net_header
from yolo_cl.bench import random_params
from yolo_cl.errors import YoloClError
from yolo_cl.executor import Executor
from yolo_cl.kernels import conv as convk
from yolo_cl.kernels import family, gemm_cpu, gemm_local, gemm_mma
from yolo_cl.model import load_model
from yolo_cl.precision import FP16, FP32, TF32, precision_named
from yolo_cl.runtime import Runtime


def test_a_cpu_heuristic_takes_the_devices_vector_width(tmp_path):
    """A CPU device reporting 16-float native vectors (AVX-512) gets register blocks of 16-float
    vectors untuned, as 31 of the 33 GEMM entries tuned on such a CPU have (configs/pocl-cpu.yaml,
    the Zen 5 record), at fp32; one reporting 8 (AVX2) the blocks it had, 8-float vectors, and so
    does half storage on either."""
    nodes = [n for size in (160, 256) for n in load_model("yolov3-tiny", None, size, params="made",
                                                           make_params=random_params).graph.nodes if n.op == "conv"]
    wide, narrow = fake_rt(), fake_rt()
    wide.device.native_vector_width_float = 16
    picks16 = [family.heuristic(n, wide, 1, FP32, "") for n in nodes]
    picks8 = [family.heuristic(n, narrow, 1, FP32, "") for n in nodes]
    gemms16 = [(n, c) for n, c in zip(nodes, picks16) if c.get("kernel") in ("nv", "mv")]
    assert len(gemms16) >= 5 and all(c["VW"] == 16 and c["NV"] == 1 for _, c in gemms16), gemms16
    for n, c in gemms16:        # six vectors: 6 x 16 where N is whole vectors, 16 x 6 where it is ragged
        if c["algo"] != "implicit":
            N = gemm_cpu.gemm_shape(n, c)[1]
            assert (c["kernel"], c.get("TM", c.get("TN"))) == (("nv", 6) if N % 16 == 0 else ("mv", 6)), (N, c)
            assert (c["KU"], c["WG"], c["ORD"]) == (1, 1, 0 if c["algo"] == "winograd" else 1)
    assert {gemm_cpu.gemm_shape(n, c)[1] % 16 == 0 for n, c in gemms16} == {True, False}
    assert all(c["VW"] == 8 for c in picks8 if c.get("kernel") in ("nv", "mv"))
    assert picks8 == [gemm_cpu.heuristic_config(n, 1, FP32) for n in nodes]
    sse = fake_rt()
    sse.device.native_vector_width_float = 4       # narrower still: the 8-float rules, as before
    assert [family.heuristic(n, sse, 1, FP32, "") for n in nodes] == picks8
    # 128 channels at 52x52: the fused Winograd on 8-float units, the unfused one on 16-float blocks
    from tiny_graphs import conv_nodes
    c128 = conv_nodes(tmp_path / "c128.cfg", net_header(52, 52, 128) + conv(128))[0]
    assert family.heuristic(c128, narrow, 1, FP32, "")["kernel"] == "fused"
    assert family.heuristic(c128, wide, 1, FP32, "") == {"family": "cpu", "algo": "winograd", "m": 4, "kernel": "mv",
                                                         "TN": 6, "VW": 16, "NV": 1, "KU": 1, "WG": 1, "ORD": 0}
    # half storage converts every load, and there the 8-float picks ran faster: kept on any unit
    assert [family.heuristic(n, wide, 1, FP16, "") for n in nodes] == [gemm_cpu.heuristic_config(n, 1, FP16)
                                                                      for n in nodes]


def test_cpu_cost_model_counts_a_narrow_vector_as_part_of_a_wide_unit():
    """On a 16-float SIMD unit an 8-float vector does half a vector instruction's work, so the same
    6 x 16 block costs more as two 8-float vectors than as one 16-float one; on an 8-float unit the
    two are alike (a 16-float vector is two instructions there)."""
    narrow = {"kernel": "nv", "TM": 6, "VW": 8, "NV": 2, "KU": 1, "WG": 1, "ORD": 1}
    wide = {**narrow, "VW": 16, "NV": 1}
    M, N, K = 256, 4096, 512
    assert gemm_cpu.cost(narrow, M, N, K, lanes=16, registers=32) > 1.5 * gemm_cpu.cost(wide, M, N, K, lanes=16,
                                                                                         registers=32)
    assert gemm_cpu.cost(narrow, M, N, K) == pytest.approx(gemm_cpu.cost(wide, M, N, K), rel=0.1)


def test_family_of_names_the_family_or_refuses():
    assert family.family_of({"algo": "implicit", "family": "local"}) is gemm_local.KERNEL_FAMILY
    assert family.family_of({"algo": "depthwise"}).name is None
    for bad in ({"algo": "im2col", "family": "nonsense"}, {"family": "cpu"}, "not a dict", None):
        with pytest.raises(ValueError):
            family.family_of(bad)
    assert family.why_illegal(None, {"algo": "winograd", "family": "nonsense"}, fake_rt()) is not None


def test_each_device_gets_its_families_heuristic(tmp_path):
    node = convs(tmp_path)[0]
    cpu, gpu = fake_rt(), fake_rt(kind="GPU")
    assert family.heuristic(node, cpu, 1, FP32, "") == gemm_cpu.heuristic_config(node, 1, FP32)
    assert family.heuristic(node, gpu, 1, FP32, "") == gemm_local.heuristic_config(node, 1)
    assert family.heuristic(node, gpu, 1, FP16, "f16") == gemm_mma.heuristic_config(node, "f16", 1)
    assert [f.name for f in family.offered(cpu, "")] == [None, "cpu"]
    assert [f.name for f in family.offered(gpu, "f16")] == [None, "narrow", "mma"]
    assert [f.name for f in family.offered(gpu, "tf32")] == [None, "narrow", "mma", "local"]     # fp32 FMA competes
    assert family.heuristic(node, gpu, 1, TF32, "tf32") == gemm_mma.heuristic_config(node, "tf32", 1)
    cands = family.candidates(node, cpu, 1, FP16, "")
    assert cands and {c["family"] for c in cands} == {"cpu"}
    assert not any(c["algo"] == "winograd" and c["m"] == 4 for c in cands)      # FP16 allows F(2x2) only
    assert any(c["algo"] == "winograd" and c["m"] == 4 for c in family.candidates(node, cpu, 1, FP32, ""))


def test_tensor_cores_set_fma_configs_aside():
    """At f16 an FMA config never stands for a conv; at tf32 it may (fp32 is at least as accurate)."""
    local = {"algo": "implicit", "family": "local"}
    assert family.competes(local, "") and not family.competes(local, "f16") and family.competes(local, "tf32")
    assert family.competes({"algo": "implicit", "family": "mma"}, "f16")
    assert family.competes({"algo": "depthwise"}, "f16")


def test_search_keys_come_from_the_families():
    keys = family.space_keys()
    assert set(gemm_local.DERIVED) <= set(keys.fixed) and "family" in keys.fixed
    assert {"KU", "WG", "ORD", "KS", "PF", "GA", "SS", "WI", "AR", "PT", "AP", "BS", "PX", "NB"} == set(keys.schedule)


def test_precision_is_one_value():
    assert precision_named("fp16") is FP16 and precision_named(FP16) is FP16
    assert (FP16.itemsize, FP32.itemsize, FP16.half, TF32.half) == (2, 4, True, False)
    assert TF32.run_as("") is FP32 and TF32.run_as("tf32") is TF32 and FP16.run_as("") is FP16
    assert FP16.winograd_tiles == (2,) and FP32.tolerance < FP16.tolerance < TF32.tolerance
    with pytest.raises(YoloClError, match="fp64"):
        precision_named("fp64")


def test_load_model(tmp_path):
    shapes = load_model("yolov3-tiny", None, 96, params="none")
    assert shapes.params is None and shapes.net.width == 96 and shapes.graph.nodes
    assert load_model("yolov3-tiny", None, 96).weights_path is not None          # the zoo's weights
    cfg = tmp_path / "w.cfg"
    cfg.write_text(net_header(8, 8) + conv(2, 1, pad=0, bn=0, act="linear"))
    with pytest.raises(YoloClError, match="no weights"):
        load_model(str(cfg))
    made = load_model(str(cfg), params="optional", make_params=random_params)
    assert list(made.params) == [0] and made.graph.nodes[0].attrs["weights"].shape == (2, 3, 1, 1)


class LayerTable:
    """A tuning table that hands out the configs it is given by layer index (None: no entry)."""

    def __init__(self, by_layer: dict) -> None:
        self.by_layer = by_layer

    def conv_config(self, node, batch: int = 1):
        return self.by_layer.get(node.layers[0])


def test_workspace_is_what_the_bound_configs_need(tmp_path):
    """The executor's one workspace is as large as the configs it binds need, no more (not the worst
    config of any family); the results do not change; a config bound beyond it is refused."""
    (tmp_path / "ws.cfg").write_text(net_cfg(24, 20))
    graph = load_model(str(tmp_path / "ws.cfg"), params="optional", make_params=random_params).graph
    s1, s2 = [n for n in graph.nodes if n.op == "conv" and n.attrs["size"] == 3]   # 3->8 stride 1, 12->6 stride 2
    rt = Runtime()
    x = np.random.default_rng(1).standard_normal((1, 3, 20, 24)).astype(np.float32)
    base = {"family": "cpu", "kernel": "nv", "TM": 4, "VW": 8, "NV": 1, "KU": 1, "WG": 0}
    heads = Executor(rt, graph, 1, FP32).run(x)

    implicit = Executor(rt, graph, 1, FP32, LayerTable({s1.layers[0]: {**base, "algo": "implicit"},
                                                         s2.layers[0]: {**base, "algo": "im2col"}}))
    assert implicit.workspace_bytes == 4 * (12 * 9) * (10 * 12)     # only s2's im2col matrix: K x N floats
    wino = Executor(rt, graph, 1, FP32, LayerTable({s1.layers[0]: {**base, "algo": "winograd", "m": 2},
                                                     s2.layers[0]: {**base, "algo": "im2col"}}))
    assert wino.workspace_bytes == 4 * 16 * (10 * 12) * (3 + 8)     # F(2x2): 16 points x 120 tiles x (C + M)
    for ex in (implicit, wino):
        for got, want in zip(ex.run(x), heads):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(YoloClError, match="workspace holds"):
        convk.bind(implicit.ctx, s1, {**base, "algo": "winograd", "m": 2})
