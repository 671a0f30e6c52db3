"""The narrow family (engine/kernels/narrow.py, cl/conv_narrow.cl): convs of at most 4
input channels computed directly, against the NumPy reference through the tuner's gate, and in a
network beside the tensor-core families (their emulation on PoCL)."""
from __future__ import annotations

import pytest

from gemm_ref import rel_err
from mma_env import emulate_hopper, rt  # noqa: F401 - fixtures
from tiny_cfgs import conv, net_header, route, upsample
from tiny_graphs import conv_nodes
from yolo_cl import tuner as tmod
from yolo_cl.kernels import family
from yolo_cl.kernels import narrow
from yolo_cl.precision import FP16, FP32, TF32


@pytest.fixture(autouse=True)
def emulate(emulate_hopper):
    """The wgmma reader of the end-to-end test: real where it runs, emulated elsewhere."""


def narrow_convs(tmp_path) -> list:
    """The gate tests' convs: 3x3 of 3 channels at strides 1 and 2, a 5x5 of 1 channel, a dilated 3x3
    of 4, a 1x1 of 3 (K of 27, 27, 25, 36 and 3), with filters not a multiple of the filters per
    work-item (20, 8, 6, 10, 5) and pixels not of the work-group."""
    nets = [net_header(13, 11) + conv(20), net_header(11, 9) + conv(8, stride=2),
            net_header(9, 10, 1) + conv(6, size=5), net_header(12, 7, 4) + conv(10, dilation=2, act="linear"),
            net_header(10, 9) + conv(5, size=1)]
    nodes = [n for i, t in enumerate(nets) for n in conv_nodes(tmp_path / f"n{i}.cfg", t)]
    assert [n.attrs["in_c"] for n in nodes] == [3, 3, 1, 4, 3]
    assert [n.attrs["stride_x"] for n in nodes] == [1, 2, 1, 1, 1]
    return nodes


@pytest.mark.parametrize("precision", [FP32, FP16], ids=["fp32", "fp16"])
def test_every_config_passes_the_tuners_gate(rt, tmp_path, precision):
    """Every config of :func:`narrow_convs` through the tuner's gate."""
    nodes = narrow_convs(tmp_path)
    tuner = tmod.Tuner(rt, precision, reps=1)
    checked = 0
    for node in nodes:
        bench = tmod.ConvBench(rt, node, 2, precision, tuner.queue)
        for cfg in narrow.KERNEL_FAMILY.candidates(node, rt, 2, precision, ""):
            if cfg.get("PX") and cfg["WG"] != 64:
                continue            # the register path's work-group size changes only its grid
            assert bench.check(bench.bind(cfg)) < precision.tolerance, (node.describe(), cfg)
            checked += 1
    assert checked >= 45        # PX 0 at every WG, 1 and 2 at 64


def test_tensor_core_sums_pass_the_tuners_gate(rt, tmp_path):
    """``TC``: the same convs (:func:`narrow_convs`: K of 3 to 36, so 1 to 3 k-steps of 16; 5 to 20
    filters, so partial M-tiles; maps not a multiple of a warp's 8 x NB pixels) summed by f16 mma
    (emulated on PoCL), each config through the tuner's gate."""
    nodes = narrow_convs(tmp_path)
    tuner = tmod.Tuner(rt, FP16, reps=1)
    checked = 0
    for node in nodes:
        bench = tmod.ConvBench(rt, node, 2, FP16, tuner.queue, mma="f16")
        for cfg in narrow.KERNEL_FAMILY.candidates(node, rt, 2, FP16, "f16"):
            if cfg.get("TC") and cfg["WG"] != 256:
                assert bench.check(bench.bind(cfg)) < FP16.tolerance, (node.describe(), cfg)
                checked += 1
    assert checked >= 3 * 4 + 3         # NB 1, 2, 4 at FPW 16 (and 32 where M > 16)


def test_which_convs_and_configs(tmp_path):
    """Candidates only for one group and at most 4 channels (filters per work-item below twice the
    filters); a wider input, an unknown key or algorithm refused by name; GPUs only."""
    rgb = conv_nodes(tmp_path / "a.cfg", net_header(8, 8) + conv(6))[0]
    wide = conv_nodes(tmp_path / "b.cfg", net_header(8, 8, 8) + conv(6))[0]
    cands = narrow.KERNEL_FAMILY.candidates(rgb, None, 1, FP32, "")
    assert {c["FPW"] for c in cands} == {4, 8} and len(cands) == 2 * len(narrow.WGS) * len(narrow.PXS)
    assert {c.get("PX", 0) for c in cands} == {0, 1, 2} and "PX" in narrow.why_illegal(rgb, {**cands[0], "PX": 3})
    assert narrow.local_bytes({**cands[0], "PX": 1}, 27) == 4 * cands[0]["FPW"] * 27   # the weights alone
    assert not any(c.get("TC") for c in cands)                                       # no tensor cores asked
    tc = [c for c in narrow.KERNEL_FAMILY.candidates(rgb, None, 1, FP16, "f16") if c.get("TC")]
    assert {(c["FPW"], c["NB"]) for c in tc} == {(16, 1), (16, 2), (16, 4)}            # 6 filters: one M-tile
    assert narrow.why_illegal(rgb, tc[0], "f16") is None and "TC" in narrow.why_illegal(rgb, tc[0], "")
    assert "TC" in narrow.why_illegal(rgb, {**tc[0], "FPW": 8}, "f16")
    assert "NB" in narrow.why_illegal(rgb, {**cands[0], "NB": 2})
    assert not any(c.get("TC") for c in narrow.KERNEL_FAMILY.candidates(rgb, None, 1, FP32, "f16"))
    assert narrow.KERNEL_FAMILY.candidates(wide, None, 1, FP32, "") == []
    assert "4 input channels" in narrow.why_illegal(wide, cands[0])
    assert "FPW" in narrow.why_illegal(rgb, {**cands[0], "FPW": 3})
    assert "algorithm" in narrow.why_illegal(rgb, {**cands[0], "algo": "implicit"})

    class Dev:
        is_cpu = True
    assert not narrow.KERNEL_FAMILY.offered(Dev(), "")
    assert narrow.KERNEL_FAMILY.heuristic(rgb, Dev(), 1, FP32, "") is None
    assert family.competes(cands[0], "f16")        # tuned beside the tensor cores: its fp16 entries count


def test_in_a_network_beside_the_tensor_cores(rt, tmp_path, monkeypatch):
    """A tuned fp16 net whose first conv is narrow: it stores channels-last for the wgmma nhwc
    conv that alone reads it, and a second narrow conv writes an upsample through into a concat;
    the heads equal the NumPy forward pass."""
    import yolo_cl
    from test_gemm_mma import net_and_reference
    from yolo_cl.kernels.family import tuning_database
    from yolo_cl.tuning_db import shape_key
    monkeypatch.setenv("YOLO_CL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("YOLO_CL_NO_SHIPPED_TUNING", "1")
    net = (net_header(16, 16) + conv(16) + conv(24) + conv(3, size=1, stride=2) + conv(8) + upsample(2)
           + route(-1, -4) + conv(18, 1, bn=0, act="linear"))
    cfg, weights, blob, ref = net_and_reference(tmp_path, net, 16, 3, batch=2)
    det = yolo_cl.Detector(str(cfg), weights, precision="fp16")
    nodes = list(dict.fromkeys(l.node for l in det.executor(2).launches if l.node.op == "conv"))
    picks = {0: {"algo": "direct", "family": "narrow", "FPW": 8, "WG": 64},
             1: {"algo": "nhwc", "family": "wgmma", "MT": 64, "NT": 64, "SWZ": 64, "ST": 2},
             3: {"algo": "direct", "family": "narrow", "FPW": 4, "WG": 128}}
    tuning_database(rt, FP16, "f16").record({shape_key(nodes[i], 2): c for i, c in picks.items()})
    det = yolo_cl.Detector(str(cfg), weights, precision="fp16")
    launches = det.executor(2).launches
    mine = [l for l in launches if l.name == "conv_narrow"]
    assert [l.node.layers[0] for l in mine] == [0, 3]
    assert mine[0].config.get("stores") == "nhwc" and mine[1].config.get("writes") == "upsample"
    assert not any(l.name == "nchw_to_nhwc" for l in launches)
    assert rel_err(det.forward(blob)[0], ref) < 1e-2


@pytest.mark.parametrize("nb", [1, 4])
def test_tensor_core_sums_in_a_network_stored_channels_last(rt, tmp_path, monkeypatch, nb):
    """``TC``: a first conv of 16 filters on a ragged map (13 x 19 pixels: not whole blocks of a
    warp's 8 x NB) summed by mma stores channels-last for the wgmma nhwc conv that alone reads it,
    and the net equals NumPy's."""
    import yolo_cl
    from test_gemm_mma import net_and_reference
    from yolo_cl.kernels.family import tuning_database
    from yolo_cl.tuning_db import shape_key
    monkeypatch.setenv("YOLO_CL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("YOLO_CL_NO_SHIPPED_TUNING", "1")
    net = net_header(19, 13) + conv(16) + conv(24) + conv(16, stride=2) + conv(18, 1, bn=0, act="linear")
    cfg, weights, blob, ref = net_and_reference(tmp_path, net, (13, 19), 3, batch=2)
    det = yolo_cl.Detector(str(cfg), weights, precision="fp16")
    nodes = list(dict.fromkeys(l.node for l in det.executor(2).launches if l.node.op == "conv"))
    picks = {0: {"algo": "direct", "family": "narrow", "FPW": 16, "WG": 64, "TC": 1, "NB": nb},
             1: {"algo": "nhwc", "family": "wgmma", "MT": 64, "NT": 64, "SWZ": 64, "ST": 2}}
    tuning_database(rt, FP16, "f16").record({shape_key(nodes[i], 2): c for i, c in picks.items()})
    det = yolo_cl.Detector(str(cfg), weights, precision="fp16")
    first = next(l for l in det.executor(2).launches if l.name == "conv_narrow")
    assert first.config.get("TC") == 1 and first.config.get("NB") == nb and first.config.get("stores") == "nhwc"
    assert rel_err(det.forward(blob)[0], ref) < FP16.tolerance


@pytest.mark.parametrize("precision", [FP32, FP16, TF32], ids=["fp32", "fp16", "tf32"])
@pytest.mark.parametrize("px", [1, 2])
def test_sums_from_registers_stored_channels_last(rt, tmp_path, monkeypatch, precision, px):
    """``PX``: a work-item's pixels' sums leave from its registers. A first conv of 16 filters on a
    ragged map (pixels not a multiple of WG x PX) stores channels-last for the wgmma nhwc conv that
    alone reads it (fp16: half, tf32: floats) -- with FPW 16 every filter is the work-group's, so a
    pixel's channels leave as 16-byte stores; with FPW 8 through the epilogue one by one -- and the
    net equals NumPy's."""
    import yolo_cl
    from test_gemm_mma import net_and_reference
    from yolo_cl.kernels.family import tuning_database
    from yolo_cl.tuning_db import shape_key
    monkeypatch.setenv("YOLO_CL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("YOLO_CL_NO_SHIPPED_TUNING", "1")
    net = net_header(19, 13) + conv(16) + conv(24) + conv(16, stride=2) + conv(18, 1, bn=0, act="linear")
    cfg, weights, blob, ref = net_and_reference(tmp_path, net, (13, 19), 3, batch=2)
    mma = precision.mma
    for fpw in (16, 8):
        det = yolo_cl.Detector(str(cfg), weights, precision=precision.name)
        nodes = list(dict.fromkeys(l.node for l in det.executor(2).launches if l.node.op == "conv"))
        picks = {0: {"algo": "direct", "family": "narrow", "FPW": fpw, "WG": 64, "PX": px}}
        if mma:
            picks[1] = {"algo": "nhwc", "family": "wgmma", "MT": 64, "NT": 64, "SWZ": 64, "ST": 2}
        tuning_database(rt, precision, mma).record({shape_key(nodes[i], 2): c for i, c in picks.items()})
        det = yolo_cl.Detector(str(cfg), weights, precision=precision.name)
        first = next(l for l in det.executor(2).launches if l.name == "conv_narrow")
        assert first.config.get("PX") == px and first.config.get("FPW") == fpw
        assert (first.config.get("stores") == "nhwc") == bool(mma)
        assert rel_err(det.forward(blob)[0], ref) < precision.tolerance, fpw
