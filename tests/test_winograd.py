"""Winograd F(2x2,3x3) / F(4x4,3x3) and the local GEMM family inside whole networks, against NumPy.

A small cfg covers what the epilogues must handle: odd sizes and channel counts, a fused
shortcut (residual + ACT2), a concat the convs write straight into, leaky and mish. Every
conv is forced onto one algorithm by a fixed tuning table; the reference is darknet_io's
NumPy forward pass (float64 accumulations, independent of yolo_cl).
"""
from __future__ import annotations

import tempfile

import numpy as np
import pytest

from darknet_io import forward_numpy
from tiny_cfgs import conv, net_header, route, shortcut
from tiny_graphs import TINY_TILE, FixedTuning, graph_of, local_pick, write_model
from yolo_cl.precision import FP16, FP32
from yolo_cl.executor import Executor
from yolo_cl.kernels import gemm_local as gl
from yolo_cl.kernels import winograd
from yolo_cl.runtime import Runtime

CFG = (net_header(22, 18)
       + conv(13) + conv(13, act="mish") + shortcut(-2, act="leaky")
       + conv(20, stride=2, bn=0) + conv(9, 1) + route(-2) + conv(7) + route(-1, -3)
       + conv(11, bn=0, act="linear"))


@pytest.fixture(scope="module")
def net():
    cfg, wts = write_model(tempfile.mkdtemp(), "w", CFG, seed=5)
    graph = graph_of(cfg, wts)
    rng = np.random.default_rng(11)
    blob = rng.random((2, 3, 18, 22), dtype=np.float32)
    ref = forward_numpy(cfg, wts, blob, keep="heads")
    return graph, blob, list(ref.values())[-1]


@pytest.fixture(scope="module")
def rt():
    return Runtime()


def run(rt, graph, blob, pick, half=False):
    ex = Executor(rt, graph, batch=blob.shape[0], precision=FP16 if half else FP32, tuning=FixedTuning(pick))
    return ex, ex.run(blob)[0]


def rel(x, ref):
    assert np.isfinite(x).all()
    return float(np.abs(x - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def direct(rt, net):
    """The same network with every conv on the implicit GEMM (no Winograd), fp32."""
    graph, blob, ref = net
    out = run(rt, graph, blob, implicit_pick)[1]
    assert rel(out, ref) < 2e-4          # float32 engine vs the float32 NumPy reference
    return out


def implicit_pick(node):
    M, N = node.attrs["filters"], node.output.h * node.output.w
    K = node.attrs["in_c"] * node.attrs["size"] ** 2
    return {"algo": "implicit", "family": "local", **gl.heuristic(M, N, K, 2, True)}


@pytest.mark.parametrize("m", [2, 4])
def test_winograd_matches_direct(rt, net, direct, m):
    graph, blob, ref = net
    ex, out = run(rt, graph, blob, local_pick(TINY_TILE, m))
    assert sum(l.name == "wino_gemm" for l in ex.launches) == 4
    assert rel(out, ref) < 2e-4
    err = rel(out, direct)
    print(f"F({m}x{m},3x3) fp32: max |wino - direct| / max |direct| = {err:.2e}")
    assert err < (5e-6 if m == 2 else 3e-5)


def test_winograd_half_storage(rt, net, direct):
    """F(2x2) with half storage stays near direct fp16; F(4x4)'s larger constants cost ~10x more."""
    graph, blob, ref = net
    d16 = rel(run(rt, graph, blob, implicit_pick, half=True)[1], direct)
    w2, w4 = (rel(run(rt, graph, blob, local_pick(TINY_TILE, m), half=True)[1], direct) for m in (2, 4))
    print(f"fp16 storage, error vs direct fp32: direct {d16:.2e}, F(2x2) {w2:.2e}, F(4x4) {w4:.2e}")
    assert d16 < 5e-3 and w2 < 5e-3
    assert w4 < 5e-2


def test_filter_transform_against_direct_1d():
    """Winograd identity on random 1D data: A^T [(G g) * (B^T d)] = correlation of d with g."""
    rng = np.random.default_rng(4)
    BT = {2: np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float),
          4: np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                       [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], float)}
    AT = {2: np.array([[1, 1, 1, 0], [0, 1, -1, -1]], float),
          4: np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], float)}
    for m in (2, 4):
        w = rng.standard_normal((1, 1, 3, 3))
        d = rng.standard_normal((m + 2, m + 2))
        U = winograd.filter_transform(w, m).reshape(m + 2, m + 2)
        Y = AT[m] @ (U * (BT[m] @ d @ BT[m].T)) @ AT[m].T
        direct = np.array([[np.sum(d[i:i + 3, j:j + 3] * w[0, 0]) for j in range(m)] for i in range(m)])
        np.testing.assert_allclose(Y, direct, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("algo", ["im2col", "barrier-free", "split-k"])     # implicit: the ``direct`` fixture
def test_local_family_in_network(rt, net, algo):
    graph, blob, ref = net

    def pick(node):
        M, N = node.attrs["filters"], node.output.h * node.output.w
        K = node.attrs["in_c"] * node.attrs["size"] ** 2
        if algo == "barrier-free":
            c = dict(MWG=32, NWG=32, KWG=8, MDIMC=8, NDIMC=8, SA=0, SB=0, PF=0)
            a = "gemm1x1" if gl.is_pointwise(node) else "im2col"
        elif algo == "split-k":         # partial sums in the workspace, epilogue (shortcut, concat) in the sum
            c = dict(MWG=16, NWG=16, KWG=8, MDIMC=4, NDIMC=4, SK=2)
            a = "gemm1x1" if gl.is_pointwise(node) else "implicit"
        else:
            c, a = dict(MWG=32, NWG=16, KWG=16, MDIMC=8, NDIMC=4), algo
        return {"algo": a, "family": "local", **gl.complete(c, M, N, K, implicit=a == "implicit")}

    ex, out = run(rt, graph, blob, pick)
    if algo == "split-k":
        assert sum(l.name == "splitk_sum" for l in ex.launches) == 6      # every conv of the net
    assert rel(out, ref) < 2e-4


def test_gpu_heuristic_and_candidates_are_legal(rt, net):
    graph, blob, ref = net
    for node in graph.nodes:
        if node.op != "conv":
            continue
        cands = gl.KERNEL_FAMILY.candidates(node, rt, 2, FP32, "")
        assert cands and all(c["family"] == "local" for c in cands)
        assert any(c["algo"] == "winograd" for c in cands) == winograd.applicable(node)
        h = gl.heuristic_config(node, 2, gl.device_limits(rt))
        if h["algo"] == "winograd":
            M, N, K, _ = winograd.gemm_shape(node, h["m"])
        else:
            M, N = node.attrs["filters"], node.output.h * node.output.w
            K = node.attrs["in_c"] * node.attrs["size"] ** 2
        assert gl.why_illegal(h, M, N, K, h["algo"] == "implicit", gl.device_limits(rt)) is None
    _, out = run(rt, graph, blob, lambda n: gl.heuristic_config(n, 2, gl.device_limits(rt)))
    assert rel(out, ref) < 2e-4


def test_small_device_limits_fall_back_to_a_legal_tile(rt, net, direct, monkeypatch):
    """A config too big for the device (here: pretend 64 work-items, 4 KiB local) is re-picked, not failed."""
    graph, blob, ref = net
    small = gl.DeviceLimits(max_wg=64, local_mem=4096, compute_units=4)
    monkeypatch.setattr(gl, "device_limits", lambda rt: small)
    big = dict(MWG=64, NWG=64, KWG=16, MDIMC=16, NDIMC=16)
    ex, out = run(rt, graph, blob, local_pick(big, 2))
    assert all(l.lsize is None or l.lsize[0] * l.lsize[1] <= 64 for l in ex.launches)
    assert rel(out, direct) < 5e-6


WIDE_CFG = (net_header(70, 9) + conv(13) + conv(13, act="mish") + shortcut(-2, act="leaky")
            + conv(6) + route(-1, -2) + conv(5, bn=0, act="linear"))
CPU_IM2COL = {"family": "cpu", "algo": "im2col", "kernel": "mv", "TN": 3, "VW": 4, "NV": 2, "KU": 1, "WG": 1, "ORD": 1}
CPU_GEMM = {"kernel": "nv", "TM": 4, "VW": 8, "NV": 1, "KU": 2, "WG": 0}


@pytest.fixture(scope="module")
def wide():
    """A 70-pixel-wide net, so tile groups run both the interior (contiguous rows) and edge paths:
    a residual with mish then leaky, a conv written into a concat, 9 rows (a partial tile row)."""
    cfg, wts = write_model(tempfile.mkdtemp(), "wide", WIDE_CFG, seed=9)
    graph = graph_of(cfg, wts)
    blob = np.random.default_rng(12).random((2, 3, 9, 70), dtype=np.float32)
    ref = forward_numpy(cfg, wts, blob, keep="heads")
    return graph, blob, list(ref.values())[-1]


@pytest.mark.parametrize("m,vt,half", [(2, 8, False), (4, 8, False), (2, 8, True)])
@pytest.mark.parametrize("which", ["net", "wide"])
def test_cpu_tile_vector_transforms(rt, net, wide, m, vt, half, which):
    """The CPU family's Winograd with its transforms ``vt`` tiles to a work-item as SIMD lanes
    (``yc_wino_input_vt`` / ``yc_wino_output_vt``, and ``yc_wino_input_plane`` on the narrow
    maps) against the NumPy forward pass and against the one-tile kernels (vt 1), which do the same
    arithmetic: odd widths and heights, partial tile groups, residual, concat, batch 2."""
    graph, blob, ref = net if which == "net" else wide

    def pick_vt(v):
        def pick(node):
            if winograd.applicable(node):
                return {"family": "cpu", "algo": "winograd", "m": m, "VT": v, **CPU_GEMM}
            return dict(CPU_IM2COL)
        return pick
    ex, out = run(rt, graph, blob, pick_vt(vt), half=half)
    transforms = [l for l in ex.launches if l.name in ("wino_input", "wino_output")]
    assert len(transforms) == 2 * sum(l.name == "wino_gemm" for l in ex.launches) >= 6
    assert all(l.config["vt"] == vt for l in transforms)
    # maps narrower than a group's run (8 * m + 2 columns) take the whole-plane input transform
    planes = [l.config.get("plane", False) for l in transforms if l.name == "wino_input"]
    assert planes == [l.node.inputs[0].w < 8 * m + 2 for l in transforms if l.name == "wino_input"]
    assert any(planes) == (which == "net")
    assert rel(out, ref) < (5e-3 if half else 2e-4)
    one = run(rt, graph, blob, pick_vt(1), half=half)[1]
    assert rel(out, one) < 1e-6


def test_cpu_plane_transform_at_batch_8(rt):
    """The whole-plane input transform keeps a private plane per work-item on PoCL's worker
    stacks: it runs in one-item work-groups, so a large batch (where PoCL chose work-groups of
    dozens of items and overflowed its stack: yolov3-tiny at 160, batch 6) still matches NumPy."""
    cfg, wts = write_model(tempfile.mkdtemp(), "w8", CFG, seed=5)
    blob = np.random.default_rng(8).random((8, 3, 18, 22), dtype=np.float32)
    ref = list(forward_numpy(cfg, wts, blob, keep="heads").values())[-1]
    pick = lambda node: ({"family": "cpu", "algo": "winograd", "m": 4, "VT": 8, **CPU_GEMM}  # noqa: E731
                         if winograd.applicable(node) else dict(CPU_IM2COL))
    ex, out = run(rt, graph_of(cfg, wts), blob, pick)
    planes = [l for l in ex.launches if l.config.get("plane")]
    assert planes and all(l.lsize == (1, 1, 1) for l in planes)
    assert rel(out, ref) < 2e-4


@pytest.mark.parametrize("rows", [True, False])
@pytest.mark.parametrize("which", ["net", "wide"])
def test_cpu_output_transform_groups(rt, net, wide, monkeypatch, rows, which):
    """The tile-vector output transform with its groups cut at tile-row ends (``WINO_ROWS``) and
    continuing on the next row, forced either way on every layer (rows of 3-35 tiles: groups
    crossing one or two row ends, partial last groups), against NumPy and the one-tile kernels;
    and the host's rule: cut only where a row's groups leave at most one lane idle."""
    graph, blob, ref = net if which == "net" else wide
    monkeypatch.setattr(winograd, "rows_grouped", lambda tw, vt: vt > 1 and rows)
    pick = lambda vt: lambda node: ({"family": "cpu", "algo": "winograd", "m": 4, "VT": vt, **CPU_GEMM}  # noqa: E731
                                    if winograd.applicable(node) else dict(CPU_IM2COL))
    ex, out = run(rt, graph, blob, pick(8))
    outs = [l for l in ex.launches if l.name == "wino_output"]
    assert outs and all(l.config.get("rows", False) == rows for l in outs)
    assert rel(out, ref) < 2e-4
    assert rel(out, run(rt, graph, blob, pick(1))[1]) < 1e-6
    monkeypatch.undo()
    assert [winograd.rows_grouped(tw, 8) for tw in (4, 7, 8, 13, 16, 26)] == [False, True, True, False, True, False]
    assert not winograd.rows_grouped(7, 1)


def test_cpu_transform_lanes_are_checked(rt, net):
    """A VT the kernels cannot build is refused by the family's legality check, with the reason."""
    from yolo_cl.kernels import gemm_cpu as gc
    node = next(n for n in net[0].nodes if n.op == "conv" and winograd.applicable(n))
    cfg = {"family": "cpu", "algo": "winograd", "m": 4, **CPU_GEMM}
    assert gc.KERNEL_FAMILY.why_illegal(node, dict(cfg, VT=8), rt) is None
    assert "VT=16" in gc.KERNEL_FAMILY.why_illegal(node, dict(cfg, VT=16), rt)


def fused_pick(m, kb, ks):
    """Every Winograd-able conv on the CPU family's fused Winograd, the rest on im2col."""
    def pick(node):
        if winograd.applicable(node):
            return {"family": "cpu", "algo": "winograd", "m": m, "kernel": "fused", "KB": kb, "KS": ks}
        return dict(CPU_IM2COL)
    return pick


def unfused_pick(m):
    def pick(node):
        if winograd.applicable(node):
            return {"family": "cpu", "algo": "winograd", "m": m, **CPU_GEMM}
        return dict(CPU_IM2COL)
    return pick


@pytest.mark.parametrize("m,kb,ks,half", [(4, 8, 1, False), (2, 6, 2, False), (4, 12, 2, False), (4, 4, 1, True),
                                          (2, 8, 1, True)])
@pytest.mark.parametrize("which", ["net", "wide"])
def test_cpu_fused_winograd(rt, net, wide, m, kb, ks, half, which):
    """The fused CPU Winograd (``yc_wino_fused``: transform, multiply and inverse transform of a
    tile group in one work-item) against the NumPy forward pass and against the unfused Winograd of
    the same tile size: filter counts (13, 11, 9, 5...) that are not multiples of the register block
    KB, output channels split into KS slices, odd widths and heights (partial tile groups and tile
    rows), a residual with mish then leaky, a conv written into a concat slice, half storage,
    batch 2. One launch per conv, no transform launches and no workspace."""
    graph, blob, ref = net if which == "net" else wide
    ex, out = run(rt, graph, blob, fused_pick(m, kb, ks), half=half)
    names = [l.name for l in ex.launches]
    assert names.count("wino_fused") == sum(winograd.applicable(n) for n in graph.nodes if n.op == "conv") >= 3
    assert not {"wino_input", "wino_gemm", "wino_output"} & set(names)
    err = rel(out, ref)
    assert err < (5e-3 if half else 2e-4)
    unfused = run(rt, graph, blob, unfused_pick(m), half=half)[1]
    print(f"fused F({m}x{m}) {'fp16' if half else 'fp32'}: {err:.2e} vs NumPy, unfused {rel(unfused, ref):.2e}")
    if half:        # the unfused kernels round V and the products to half in the workspace, the fused never
        assert err <= rel(unfused, ref)
    else:           # the same sums in the same order, but for the GEMM's contractions
        assert rel(out, unfused) < 2e-6


# Every activation but stair (a step function: a rounding difference at a step would be a jump).
ACTS = ("linear", "leaky", "relu", "relu6", "logistic", "tanh", "mish", "swish", "hard_mish", "elu", "selu",
        "gelu", "hardtan", "lhtan", "ramp", "plse", "loggy", "relie", "revleaky")


def test_cpu_fused_winograd_activations(rt):
    """Each activation in the fused Winograd's epilogue, one conv per activation over a shared
    input, against NumPy: the same net with linear convs (same weights) through the NumPy forward
    pass, then np_darknet's activation."""
    import np_darknet

    def text(acts):
        return net_header(19, 11) + conv(6) + "".join(conv(5, act=a, bn=0) + route(0) for a in acts)
    folder = tempfile.mkdtemp()
    cfg_lin, wts = write_model(folder, "lin", text(["linear"] * len(ACTS)), seed=3)
    cfg = folder + "/acts.cfg"
    with open(cfg, "w") as f:
        f.write(text(ACTS))
    keep = [1 + 2 * i for i in range(len(ACTS))]
    blob = np.random.default_rng(8).uniform(-1, 1, (1, 3, 11, 19)).astype(np.float32)
    z = forward_numpy(cfg_lin, wts, blob, keep=keep)
    ex, _ = run(rt, graph_of(cfg, wts, keep=keep), blob, fused_pick(4, 4, 1))
    outs = ex.run(blob)
    assert sum(l.name == "wino_fused" for l in ex.launches) == len(ACTS) + 1
    for act, i, out in zip(ACTS, keep, outs):
        assert rel(out, np_darknet.activate(z[i], act)) < 2e-4, act


def test_cpu_fused_winograd_legality(rt, net):
    """Register blocks and slices outside the declared tunables, and channel counts whose
    transformed tiles would not fit private memory, are refused with the reason; the candidates
    hold only legal fused configs, for every tile size, and the fused config needs no workspace."""
    from yolo_cl.kernels import gemm_cpu as gc
    node = next(n for n in net[0].nodes if n.op == "conv" and winograd.applicable(n))
    cfg = {"family": "cpu", "algo": "winograd", "m": 4, "kernel": "fused", "KB": 8, "KS": 1}
    assert gc.KERNEL_FAMILY.why_illegal(node, cfg, rt) is None
    assert "KB=5" in gc.KERNEL_FAMILY.why_illegal(node, dict(cfg, KB=5), rt)
    fused = [c for c in gc.KERNEL_FAMILY.candidates(node, rt, 1, FP32, "") if c.get("kernel") == "fused"]
    assert {c["m"] for c in fused} == set(FP32.winograd_tiles)
    assert all(gc.KERNEL_FAMILY.why_illegal(node, c, rt) is None for c in fused)
    assert gc.KERNEL_FAMILY.workspace_bytes(node, cfg, 1, FP32) == 0
    path = tempfile.mkdtemp() + "/c160.cfg"
    with open(path, "w") as f:
        f.write(net_header(9, 7, channels=160) + conv(4))
    deep = graph_of(path).nodes[0]
    assert "private memory" in gc.KERNEL_FAMILY.why_illegal(deep, cfg, rt)        # 36 x 160 x 8 floats
    assert gc.KERNEL_FAMILY.why_illegal(deep, dict(cfg, m=2), rt) is None         # 16 x 160 x 8


def test_cpu_fused_winograd_yolov3_tiny_heads(rt):
    """yolov3-tiny with its real weights on a real image at 416: the two heads with every 3x3
    stride-1 conv on the fused Winograd equal those with the unfused one (F(4x4) both), and the
    NumPy forward pass."""
    import cv2
    from pathlib import Path
    from yolo_cl.kernels import gemm_cpu as gc
    root = Path(__file__).resolve().parents[1]
    cfg, wts = str(root / "models" / "yolov3-tiny.cfg"), str(root / "models" / "yolov3-tiny.weights")
    img = cv2.imread(str(root.parent / "shared" / "images" / "dog.jpg"))
    blob = cv2.dnn.blobFromImage(img, 1 / 255.0, (416, 416), swapRB=True, crop=False)
    graph = graph_of(cfg, wts)

    fused = {"family": "cpu", "algo": "winograd", "m": 4, "kernel": "fused", "KB": 8, "KS": 1}
    can_fuse = [n for n in graph.nodes if n.op == "conv" and winograd.applicable(n) and gc.fused_illegal(n, fused) is None]

    def pick(kind):
        def p(node):
            if not winograd.applicable(node):
                return gc.heuristic_config(node)
            if kind == "fused" and node in can_fuse:
                return fused
            return {"family": "cpu", "algo": "winograd", "m": 4, **CPU_GEMM}     # past 142 channels in both
        return p
    heads = {}
    for kind in ("fused", "unfused"):
        ex = Executor(rt, graph, batch=1, precision=FP32, tuning=FixedTuning(pick(kind)))
        fused_launches = sum(l.name == "wino_fused" for l in ex.launches)
        assert fused_launches == (len(can_fuse) if kind == "fused" else 0) and len(can_fuse) >= 4
        heads[kind] = ex.run(blob)
    ref = list(forward_numpy(cfg, wts, blob, keep="heads").values())
    assert len(heads["fused"]) == len(ref) == 2
    for f, u, r in zip(heads["fused"], heads["unfused"], ref):
        assert rel(f, u) < 1e-5 and rel(f, r) < 2e-4
