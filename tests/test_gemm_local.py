"""The GPU GEMM family (cl/gemm_local.cl) against NumPy on PoCL: many configs, odd shapes.

PoCL runs work-group kernels slowly but correctly, so shapes stay small; each case uses fresh
random data and a poisoned output buffer, so unwritten elements fail the comparison.
"""
from __future__ import annotations

import numpy as np
import pytest

from gemm_ref import LEAKY, LINEAR, SlicedC, b_operand, conv_reference, reference, rel_err
from yolo_cl.kernels import gemm_local as gl
from yolo_cl.runtime import Runtime


@pytest.fixture(scope="module")
def rt():
    return Runtime()


def run_gemm(rt, cfg, A, B, bias, *, residual=None, act=LINEAR, act2=LINEAR, half=False, c_pad=(0, 0), implicit=None):
    """Run yc_gemm_local on host arrays; A (G,M,K), B (batch,G,K,N) or conv input; returns C (batch,G,M,N).

    ``c_pad`` = (rows before, rows after) of extra output space per image, to check writes stay
    inside a concat slice. ``implicit`` = dict(x=(batch,C,H,W), KS, SX, SY, PAD, DIL, OH, OW).
    """
    cl = rt.cl
    dt = np.float16 if half else np.float32
    G, M, K = A.shape
    batch = B.shape[0]
    N = B.shape[-1] if implicit is None else implicit["OH"] * implicit["OW"]
    c = SlicedC(rt, batch, G, M, N, c_pad, dt, residual)
    Abuf = rt.upload(gl.pack_weights(A.reshape(G * M, K), G, dt), "A")
    biasb = rt.upload(bias.astype(np.float32), "bias")
    Bbuf = rt.upload(B.astype(dt).ravel(), "B")
    defines = gl.defines({"HALF_STORAGE": half, "ACT": act}, cfg, M, N, K)
    if residual is not None:
        defines.update(RESIDUAL=True, ACT2=act2)
    b_args, extra = b_operand(defines, implicit, G, K, N)
    partial = rt.upload(np.full(max(gl.partial_bytes(cfg, M, N, batch * G) // 4, 1), np.nan, np.float32), "P")
    specs = gl.launch_specs(cfg, defines, M, N, K, G, batch * G, [Abuf, biasb], [Bbuf] + b_args,
                            [c.buf, np.int32(c.off), np.int32(c.bstride), np.int32(N)],
                            [c.rbuf, np.int32(c.off), np.int32(c.bstride)], extra, partial)
    assert len(specs) == (2 if gl.split_k(cfg) > 1 else 1)
    for name, d, args, gs, ls, _ in specs:
        k = cl.Kernel(rt.program("gemm_local.cl", d), name)
        k.set_args(*args)
        cl.enqueue_nd_range_kernel(rt.queue, k, gs, ls)
    return c.read()


ODD_SHAPES = [(1, 1, 1), (5, 7, 3), (17, 33, 27), (75, 130, 41), (33, 169, 95)]
CONFIGS = [
    dict(MWG=16, NWG=16, KWG=8, MDIMC=4, NDIMC=4),
    dict(MWG=32, NWG=32, KWG=16, MDIMC=8, NDIMC=8),
    dict(MWG=64, NWG=32, KWG=16, MDIMC=8, NDIMC=8, PF=0),
    dict(MWG=32, NWG=64, KWG=32, MDIMC=4, NDIMC=16),
    dict(MWG=16, NWG=64, KWG=8, MDIMC=4, NDIMC=32),      # non-square work-group 32x4
    dict(MWG=64, NWG=64, KWG=8, MDIMC=8, NDIMC=8, SA=0, SB=0),
    dict(MWG=32, NWG=32, KWG=16, MDIMC=8, NDIMC=8, SA=1, SB=0),
    dict(MWG=128, NWG=128, KWG=16, MDIMC=16, NDIMC=16),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_gemm_configs_odd_shapes(rt, cfg):
    rng = np.random.default_rng(0)
    odd = ODD_SHAPES[CONFIGS.index(cfg) % len(ODD_SHAPES)]     # every bounds check emitted
    exact = (2 * cfg["MWG"], 2 * cfg["NWG"], 3 * cfg["KWG"])     # none emitted
    for M, N, K in (odd, exact):
        c = gl.complete(cfg, M, N, K)
        assert gl.why_illegal(c, M, N, K) is None
        A = rng.standard_normal((1, M, K)).astype(np.float32)
        B = rng.standard_normal((1, 1, K, N)).astype(np.float32)
        bias = rng.standard_normal(M).astype(np.float32)
        out = run_gemm(rt, c, A, B, bias, act=LEAKY)
        assert rel_err(out, reference(A, B, bias, act=LEAKY)) < 1e-5, (M, N, K, c)


def check_full_epilogue(rt, rng, c, G, M, N, K, batch):
    """Groups, batches, bias, leaky, a fused residual + leaky, written into a concat slice."""
    assert gl.why_illegal(c, M, N, K) is None, gl.why_illegal(c, M, N, K)
    A = rng.standard_normal((G, M, K)).astype(np.float32)
    B = rng.standard_normal((batch, G, K, N)).astype(np.float32)
    bias = rng.standard_normal(G * M).astype(np.float32)
    R = rng.standard_normal((batch, G, M, N)).astype(np.float32)
    out = run_gemm(rt, c, A, B, bias, residual=R, act=LEAKY, act2=LEAKY, c_pad=(5, 3))
    assert rel_err(out, reference(A, B, bias, R, LEAKY, LEAKY)) < 1e-5, c


def test_vector_b_loads_and_groups_batches_residual_slice(rt):
    rng = np.random.default_rng(1)
    G, M, N, K, batch = 2, 24, 52, 40, 3
    for cfg in (dict(MWG=32, NWG=32, KWG=8, MDIMC=8, NDIMC=8, VWB=4), dict(MWG=16, NWG=64, KWG=16, MDIMC=4,
                                                                           NDIMC=16, VWB=2, VB=4)):
        check_full_epilogue(rt, rng, gl.complete(cfg, M, N, K), G, M, N, K, batch)


def test_half_storage(rt):
    rng = np.random.default_rng(2)
    M, N, K = 40, 75, 72
    c = gl.complete(dict(MWG=32, NWG=32, KWG=16, MDIMC=8, NDIMC=8), M, N, K)
    A = rng.standard_normal((1, M, K)).astype(np.float16).astype(np.float32)
    B = rng.standard_normal((1, 1, K, N)).astype(np.float16).astype(np.float32)
    bias = rng.standard_normal(M).astype(np.float32)
    out = run_gemm(rt, c, A, B, bias, half=True)
    assert rel_err(out, reference(A, B, bias)) < 2e-3


@pytest.mark.parametrize("sk", [2, 3, 4])
def test_split_k(rt, sk):
    """K split over work-groups, partial planes summed by yc_gemm_splitk with the whole epilogue:
    odd shapes (last split shorter, CHECK_K), groups, batches, residual, a concat slice."""
    rng = np.random.default_rng(10 + sk)
    for (G, M, N, K, batch), cfg in (((1, 33, 50, 95, 1), dict(MWG=32, NWG=32, KWG=8, MDIMC=8, NDIMC=8)),
                                     ((2, 24, 52, 128, 3), dict(MWG=16, NWG=64, KWG=16, MDIMC=4, NDIMC=16,
                                                                PF=0))):
        check_full_epilogue(rt, rng, {**gl.complete(cfg, M, N, K), "SK": sk}, G, M, N, K, batch)


def test_split_k_implicit_and_half(rt):
    rng = np.random.default_rng(20)
    batch, C, H, W, F, ks = 2, 8, 9, 7, 12, 3
    x = rng.standard_normal((batch, C, H, W)).astype(np.float32)
    w = rng.standard_normal((F, C, ks, ks)).astype(np.float32)
    bias = rng.standard_normal(F).astype(np.float32)
    M, N, K = F, H * W, C * ks * ks
    geo = dict(x=x.shape, KS=ks, SX=1, SY=1, PAD=1, DIL=1, OH=H, OW=W)
    c = {**gl.complete(dict(MWG=16, NWG=16, KWG=8, MDIMC=4, NDIMC=16), M, N, K, implicit=True), "SK": 3}
    assert gl.why_illegal(c, M, N, K, implicit=True) is None
    out = run_gemm(rt, c, w.reshape(1, M, K), x, bias, implicit=geo)
    ref = conv_reference(x, w, bias, 1, 1, 1, 1)
    assert rel_err(out.reshape(ref.shape), ref) < 1e-5
    A = rng.standard_normal((1, 40, 72)).astype(np.float16).astype(np.float32)
    B = rng.standard_normal((1, 1, 72, 75)).astype(np.float16).astype(np.float32)
    b2 = rng.standard_normal(40).astype(np.float32)
    c2 = {**gl.complete(dict(MWG=32, NWG=32, KWG=16, MDIMC=8, NDIMC=8), 40, 75, 72), "SK": 2}
    assert rel_err(run_gemm(rt, c2, A, B, b2, half=True), reference(A, B, b2)) < 2e-3


def test_split_k_legality_and_space():
    base = gl.complete(dict(MWG=64, NWG=64, KWG=16, MDIMC=8, NDIMC=8), 64, 64, 64)
    assert "non-empty" in gl.why_illegal({**base, "SK": 4}, 64, 64, 40)       # 16-row chunks: split 4 is empty
    assert gl.why_illegal({**base, "SK": 2}, 64, 64, 40) is None
    assert gl.fit({**base, "SK": 8}, 64, 64, 40)["SK"] == 1                   # a tuned split too long for this K
    lim = gl.DeviceLimits(max_wg=1024, local_mem=48 * 1024, compute_units=132)
    few = gl.space(512, 676, 2304, False, lim)                  # 88 64x64 tiles for 132 units
    assert any(gl.split_k(c) > 1 for c in few)
    assert not any(gl.split_k(c) > 1 for c in gl.space(32, 173056, 27, True, lim))   # plenty of tiles, short K


def test_heuristic_splits_k_only_when_tiles_leave_units_idle(monkeypatch):
    lim = gl.DeviceLimits(max_wg=1024, local_mem=48 * 1024, compute_units=132)
    h = gl.heuristic(256, 169, 4608, 1, False, lim)          # a handful of tiles, K = 4608
    assert gl.split_k(h) > 1 and gl.why_illegal(h, 256, 169, 4608, False, lim) is None
    assert gl.split_k(gl.heuristic(32, 173056, 27, 1, True, lim)) == 1     # thousands of tiles
    assert gl.split_k(gl.heuristic(256, 169, 512, 1, False, lim)) == 1     # K too short to share
    monkeypatch.setattr(gl, "HEURISTIC_SPLIT", False)
    assert gl.split_k(gl.heuristic(256, 169, 4608, 1, False, lim)) == 1


IMPLICIT_CONFIGS = [dict(MWG=16, NWG=16, KWG=8, MDIMC=4, NDIMC=4), dict(MWG=32, NWG=32, KWG=16, MDIMC=4, NDIMC=16),
                    dict(MWG=16, NWG=32, KWG=32, MDIMC=8, NDIMC=8, PF=0)]


@pytest.mark.parametrize("geom,cfg", [((3, 1, 1, 1, 1), 0), ((3, 2, 1, 1, 1), 1), ((1, 1, 0, 1, 1), 2),
                                      ((3, 1, 2, 2, 1), 0), ((3, 1, 1, 1, 2), 1), ((5, 1, 2, 1, 1), 2)],
                         ids=["3x3s1", "3x3s2", "1x1", "3x3dil2", "3x3g2", "5x5"])
def test_implicit_conv(rt, geom, cfg):
    """im2col gathered inside the B-tile load, against a direct float64 convolution (one config each)."""
    ks, stride, pad, dil, groups = geom
    rng = np.random.default_rng(3)
    batch, C, H, W, F = 2, 6, 11, 9, 10
    OH = (H + 2 * pad - dil * (ks - 1) - 1) // stride + 1
    OW = (W + 2 * pad - dil * (ks - 1) - 1) // stride + 1
    x = rng.standard_normal((batch, C, H, W)).astype(np.float32)
    w = rng.standard_normal((F, C // groups, ks, ks)).astype(np.float32)
    bias = rng.standard_normal(F).astype(np.float32)
    M, N, K = F // groups, OH * OW, (C // groups) * ks * ks
    geo = dict(x=x.shape, KS=ks, SX=stride, SY=stride, PAD=pad, DIL=dil, OH=OH, OW=OW)
    c = gl.complete(IMPLICIT_CONFIGS[cfg], M, N, K, implicit=True)
    assert gl.why_illegal(c, M, N, K, implicit=True) is None, gl.why_illegal(c, M, N, K, implicit=True)
    out = run_gemm(rt, c, w.reshape(groups, M, K), x, bias, implicit=geo)
    ref = conv_reference(x, w, bias, stride, pad, dil, groups)
    assert rel_err(out.reshape(ref.shape), ref) < 1e-5, c


def test_space_is_legal_and_search_has_choices():
    lim = gl.DeviceLimits(max_wg=256, local_mem=16 * 1024, compute_units=8)
    for M, N, K, implicit in [(1024, 169, 4608, False), (32, 173056, 27, True), (255, 676, 512, False)]:
        sp = gl.space(M, N, K, implicit, lim)
        assert len(sp) > 20
        assert all(gl.why_illegal(c, M, N, K, implicit, lim) is None for c in sp)
        assert all(c["MDIMC"] * c["NDIMC"] <= 256 for c in sp)
        h = gl.heuristic(M, N, K, 1, implicit, lim)
        assert gl.why_illegal(h, M, N, K, implicit, lim) is None


def test_illegal_configs_are_named():
    base = gl.complete(dict(MWG=64, NWG=64, KWG=16, MDIMC=8, NDIMC=8), 64, 64, 64)
    assert "work-group" in gl.why_illegal(base, 64, 64, 64, lim=gl.DeviceLimits(max_wg=32))
    assert "local memory" in gl.why_illegal(base, 64, 64, 64, lim=gl.DeviceLimits(local_mem=1024))
    assert gl.why_illegal({**base, "VWB": 4}, 64, 66, 64) is not None      # N % 4 != 0
    assert gl.why_illegal({**base, "MWG": 48}, 64, 64, 64) is not None
