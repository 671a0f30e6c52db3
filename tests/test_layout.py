"""Tensors stored channels-last for the wgmma family's nhwc convs (engine/kernels/layout.py).

A conv whose output only an nhwc conv reads stores it as pixels of channels through the shared
GEMM epilogue (directly, or through the split-K sum), and the reader takes it without its
transpose launch; the answers equal the NumPy Darknet forward pass. Emulated on PoCL (as in
test_gemm_wgmma.py), the real instructions on a Hopper GPU."""
from __future__ import annotations

import pytest

from gemm_ref import rel_err
from mma_env import emulate_hopper, rt  # noqa: F401 - fixtures
from tiny_cfgs import conv, net_header, shortcut
from yolo_cl.errors import YoloClError
from yolo_cl.kernels import gemm_wgmma as gw
from yolo_cl.kernels import layout
from yolo_cl.precision import FP16

# 0: 3x3 (mma), 1: 1x1 (mma, split-K: stored channels-last through the sum), 2: nhwc 3x3 (read
# twice, by 3 and as 4's shortcut: planes), 3: nhwc 1x1 (transposes its input), 4: nhwc 3x3 with
# the shortcut fused, 6: nhwc 3x3, 7: 1x1 (wgmma gemm1x1, reading planes), 8: nhwc 3x3, 9: the head.
NET = (net_header(16, 16) + conv(64) + conv(24, 1) + conv(32) + conv(16, 1) + conv(32) + shortcut(-3)
       + conv(24) + conv(16, 1) + conv(16) + conv(18, 1, bn=0, act="linear"))
MMA_1X1 = {"family": "mma", "algo": "gemm1x1", "MWG": 64, "NWG": 64, "KWG": 32, "WM": 2, "WN": 2, "ST": 2}
NHWC = {"family": "wgmma", "algo": "nhwc", "MT": 64, "NT": 64, "SWZ": 64, "ST": 2}
CONFIGS = [{"family": "mma", "algo": "implicit", "MWG": 64, "NWG": 64, "KWG": 32, "WM": 2, "WN": 2},
           {**MMA_1X1, "SK": 2}, NHWC, NHWC, NHWC, NHWC,
           {"family": "wgmma", "algo": "gemm1x1", "MT": 64, "NT": 64, "SWZ": 64, "ST": 2}, NHWC, MMA_1X1]


@pytest.fixture(autouse=True)
def emulate(emulate_hopper):
    """Every test here on the real wgmma where it runs, emulated elsewhere."""


def detector(rt, tmp_path, monkeypatch, net: str = NET, configs: list = CONFIGS):
    """(Detector, blob, reference) of ``net`` with ``configs`` recorded as a user tuning database."""
    import yolo_cl
    from test_gemm_mma import net_and_reference
    from yolo_cl.kernels.family import tuning_database
    from yolo_cl.tuning_db import shape_key
    monkeypatch.setenv("YOLO_CL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("YOLO_CL_NO_SHIPPED_TUNING", "1")
    cfg, weights, blob, ref = net_and_reference(tmp_path, net, 16, 5, batch=2)
    det = yolo_cl.Detector(str(cfg), weights, precision="fp16")
    nodes = [l.node for l in det.executor(2).launches if l.node.op == "conv" and l.name != "splitk_sum"]
    nodes = list(dict.fromkeys(nodes))
    assert len(nodes) == len(configs)
    tuning_database(rt, FP16, "f16").record({shape_key(n, 2): c for n, c in zip(nodes, configs)})
    return yolo_cl.Detector(str(cfg), weights, precision="fp16"), blob, ref


def test_producers_store_channels_last_and_readers_skip_the_transpose(rt, tmp_path, monkeypatch):
    det, blob, ref = detector(rt, tmp_path, monkeypatch)
    ex = det.executor(2)
    launches = ex.launches
    stores = [l.node.label for l in launches if l.config.get("stores") == "nhwc"]
    reads = [l.node.label for l in launches if l.config.get("reads") == "nhwc"]
    transposed = [l.node.label for l in launches if l.name == "nchw_to_nhwc"]
    assert len(ex.ctx.nhwc) == 4 and len(set(stores)) == 4 and len(reads) == 4
    assert len(transposed) == 1                 # the conv reading layer 2, which a shortcut reads too
    assert any(l.name == "splitk_sum" and l.config.get("stores") == "nhwc" for l in launches)
    assert rel_err(det.forward(blob)[0], ref) < 1e-2


def test_channels_not_filling_16_bytes_are_padded_by_the_transpose(rt, tmp_path, monkeypatch):
    """nhwc convs of the network's 3-channel input and of a 12-channel tensor: each input is
    transposed with its channels padded to 8 and 16 (a producer never stores such a tensor
    channels-last), the weights padded alike; the answer equals the NumPy forward pass."""
    net = net_header(16, 16) + conv(12) + conv(16) + conv(18, 1, bn=0, act="linear")
    det, blob, ref = detector(rt, tmp_path, monkeypatch, net, [NHWC, NHWC, MMA_1X1])
    ex = det.executor(2)
    transposes = [l for l in ex.launches if l.name == "nchw_to_nhwc"]
    assert not ex.ctx.nhwc and len(transposes) == 2
    assert [gw.nhwc_channels(l.node) for l in transposes] == [8, 16]
    assert [gw.gemm_k(l.node, "nhwc") for l in transposes] == [72, 144]
    assert rel_err(det.forward(blob)[0], ref) < 1e-2


def test_a_reader_that_falls_back_gets_planes(rt, tmp_path, monkeypatch):
    """An nhwc config that fails to bind falls back to the heuristic's, here mma's, which reads
    planes: the executor binds its producer again storing planes, and the answer stays right."""
    monkeypatch.setattr(gw.KERNEL_FAMILY, "heuristic", lambda *a: None)
    det, blob, ref = detector(rt, tmp_path, monkeypatch)
    bind = gw.bind
    failing = {}

    def refuse_once_per_layer(ctx, node, cfg):
        if cfg.get("algo") == "nhwc" and node.attrs["in_c"] == 16 and node.inputs[0].tensor.id in ctx.nhwc:
            failing[node.label] = True
            raise YoloClError("refused for the test")
        return bind(ctx, node, cfg)
    monkeypatch.setattr(gw, "bind", refuse_once_per_layer)
    ex = det.executor(2)
    assert failing and len(ex.ctx.nhwc) == 4 - len(failing)
    assert len({l.node.label for l in ex.launches if l.config.get("stores") == "nhwc"}) == len(ex.ctx.nhwc)
    assert len([l for l in ex.launches if l.config.get("reads") == "nhwc"]) == len(ex.ctx.nhwc)
    assert rel_err(det.forward(blob)[0], ref) < 1e-2


def test_no_tensor_is_stored_channels_last_without_an_nhwc_reader(rt, tmp_path, monkeypatch):
    """Untuned with no family picking nhwc (wgmma's pick off), every tensor stays planes."""
    import yolo_cl
    monkeypatch.setattr(gw.KERNEL_FAMILY, "heuristic", lambda *a: None)
    from test_gemm_mma import net_and_reference
    monkeypatch.setenv("YOLO_CL_NO_SHIPPED_TUNING", "1")
    monkeypatch.setenv("YOLO_CL_CACHE", str(tmp_path / "cache"))
    cfg, weights, blob, ref = net_and_reference(tmp_path, NET, 16, 5)
    ex = yolo_cl.Detector(str(cfg), weights, precision="fp16").executor(1)
    assert ex.ctx.nhwc == frozenset() and not layout.disagreeing(ex.ctx.nhwc, [])
    assert not any(l.config.get("stores") or l.config.get("reads") for l in ex.launches)


def test_the_registry_answers_which_configs_store_and_read_channels_last():
    """Every family declares its channels-last algorithms; layout.py asks the registry, not names."""
    from yolo_cl.kernels import family
    assert all(isinstance(f.stores_nhwc, tuple) and isinstance(f.reads_nhwc, tuple) for f in family.FAMILIES)
    assert family.reads_nhwc(NHWC) and not family.reads_nhwc(MMA_1X1)
    assert family.stores_nhwc(MMA_1X1) and family.stores_nhwc(NHWC)
    assert not family.stores_nhwc({"family": "mma", "algo": "winograd", "m": 2})
    assert not family.stores_nhwc({"family": "cpu", "algo": "im2col"}) and not family.reads_nhwc({"oops": 1})


def test_bench_names_what_a_launch_stores_and_reads():
    from yolo_cl.bench import _config_text
    text = _config_text({**NHWC, "stores": "nhwc", "reads": "nhwc", "writes": "upsample"})
    assert text == "wgmma nhwc MT64 NT64 SWZ64 ST2 stores:nhwc reads:nhwc writes:upsample"


def test_a_plan_no_family_reads_channels_last_for_asks_nothing(rt, tmp_path, monkeypatch):
    """At fp32 (no tensor-core family offered) the plan never looks up a conv's config for it."""
    import yolo_cl
    from test_gemm_mma import net_and_reference

    def boom(*a, **k):
        raise AssertionError("looked up a config")
    monkeypatch.setattr(layout, "bound_config", boom)
    cfg, weights, blob, ref = net_and_reference(tmp_path, NET, 16, 5)
    ex = yolo_cl.Detector(str(cfg), weights).executor(1)
    assert ex.ctx.nhwc == frozenset()
    assert rel_err(ex.run(blob)[0], ref) < 1e-4


def test_the_tuner_charges_no_transpose_the_network_skips(rt, tmp_path, monkeypatch):
    """A conv whose input one conv writes for it alone is timed without its transpose launch (the
    network stores that input channels-last), one reading the network's input or a tensor a
    shortcut reads too with it; the check runs the transpose either way."""
    from tiny_graphs import graph_of
    from yolo_cl import tuner as tmod
    from yolo_cl.kernels import TRANSPOSE
    from yolo_cl.tuning_db import shape_key
    path = tmp_path / "net.cfg"
    path.write_text(NET)
    graph = graph_of(str(path))
    convs = [n for n in graph.nodes if n.op == "conv"]
    last = tmod.inputs_channels_last(graph, 2)
    assert [last[shape_key(n, 2)] for n in convs] == [False, True, True, False, True, True, True, True, True]
    timed = []
    monkeypatch.setattr(tmod.measure, "time_launches", lambda rt_, q, ls, reps, clock: timed.append(
        [l.name for l in ls]) or 1.0)
    for flag in (True, False):
        bench = tmod.ConvBench(rt, convs[2], 2, FP16, rt.queue, mma="f16", input_channels_last=flag)
        launches = bench.bind(NHWC)
        assert launches[0].name == TRANSPOSE and bench.check(launches) < FP16.tolerance
        bench.time(launches, 1)
    assert timed == [["gemm_wgmma"], [TRANSPOSE, "gemm_wgmma"]]
