"""The tensor-core GEMM family (cl/gemm_mma.cl) against NumPy: emulated on PoCL, real on NVIDIA.

On a device without tensor cores (PoCL in CI) ``YOLO_CL_MMA_EMULATE=1`` computes every mma in
plain OpenCL C with the PTX fragment layout, so the tiling, fragment indexing, bounds and
epilogue code run here; on an NVIDIA GPU of compute capability 8+ the same tests run the real
instruction (tools/check_mma.py). Inputs are rounded as the hardware rounds them (half, TF32),
so the references are exact up to float accumulation and the store.
"""
from __future__ import annotations

import numpy as np
import pytest

from gemm_ref import LEAKY, LINEAR, SlicedC, b_operand, conv_reference, leaky, reference, rel_err
from mma_env import emulate, rt  # noqa: F401 - fixtures
from tiny_cfgs import conv, net_header, route, shortcut
from yolo_cl.kernels import gemm_mma as gm
from yolo_cl.kernels import gemm_wgmma as gw
from yolo_cl.precision import FP16, FP32, PRECISIONS, TF32


def rounded(x, mode):
    """``x`` as the mma inputs see it."""
    return x.astype(np.float16).astype(np.float32) if mode == "f16" else gm.tf32_round(x)


def run_gemm(rt, cfg, mode, A, B, bias, *, residual=None, act=LINEAR, act2=LINEAR, c_pad=(0, 0), implicit=None,
             bvec=False):
    """yc_gemm_mma on host arrays: A (G,M,K), B (batch,G,K,N) or the conv input; returns C (batch,G,M,N).
    ``bvec``: B rows by 16-byte cp.async chunks (where :func:`gm.b_vector` allows it)."""
    cl = rt.cl
    half = mode == "f16"
    dt = np.float16 if half else np.float32
    G, M, K = A.shape
    batch = B.shape[0]
    N = B.shape[-1] if implicit is None else implicit["OH"] * implicit["OW"]
    c = SlicedC(rt, batch, G, M, N, c_pad, dt, residual)
    Abuf = rt.upload(gm.pack_weights(A.reshape(G * M, K), G, mode), "A")
    biasb = rt.upload(bias.astype(np.float32), "bias")
    Bbuf = rt.upload(B.astype(dt).ravel(), "B")
    bvec = bvec and implicit is None and gm.b_vector(cfg, mode, False, N, G * K * N, K * N)
    if implicit is not None:        # B's offset 0, batch and group strides, as b_operand passes them
        _, C, H, W = implicit["x"]
        cfg = gm.aligned_gather(cfg, C * H * W, (C // G) * H * W)
    d = gm.defines({"HALF_STORAGE": half, "ACT": act}, cfg, M, N, K, mode, bvec)
    assert ("BVEC" in d) == bvec
    assert ("B_SHIFT" in d) == (not bvec and gm.stages(cfg) > 1 and bool(cfg.get("BS")))
    if residual is not None:
        d.update(RESIDUAL=True, ACT2=act2)
    b_args, extra = b_operand(d, implicit, G, K, N)
    partial = rt.upload(np.full(max(gm.partial_bytes(cfg, M, N, batch * G) // 4, 1), np.nan, np.float32), "P")
    split = gm.split_k(cfg) > 1
    counters = None
    if gm.split_in_kernel(cfg):
        counters = rt.upload(np.zeros(gm.tile_count(cfg, M, N, batch * G), np.int32), "counts")
    specs = gm.launch_specs(cfg, d, M, N, K, G, batch * G, [Abuf, biasb], [Bbuf] + b_args,
                            [c.buf, np.int32(c.off), np.int32(c.bstride), np.int32(N)],
                            [c.rbuf, np.int32(c.off), np.int32(c.bstride)], extra, partial, counters)
    assert len(specs) == (2 if split and counters is None else 1)
    for src, name, dd, args, gs, ls in specs:
        k = cl.Kernel(rt.program(src, dd), name)
        k.set_args(*args)
        cl.enqueue_nd_range_kernel(rt.queue, k, gs, ls)
    if counters is not None:        # every tile's last work-group left its count at 0 for the next launch
        left = np.empty(gm.tile_count(cfg, M, N, batch * G), np.int32)
        cl.enqueue_copy(rt.queue, left, counters)
        assert not left.any(), left
    return c.read()


TOL = {"f16": 2e-3, "tf32": 1e-5}      # beyond input rounding: the half store (f16), float sums
CONFIGS = [  # (mode, config, ragged M, N, K); emulation on PoCL is slow: shapes stay small
    ("f16", dict(MWG=32, NWG=16, KWG=16, WM=2, WN=1), (33, 29, 41)),
    ("f16", dict(MWG=64, NWG=32, KWG=32, WM=2, WN=2), (70, 37, 60)),
    ("f16", dict(MWG=16, NWG=64, KWG=64, WM=1, WN=2), (5, 70, 17)),
    ("tf32", dict(MWG=32, NWG=32, KWG=8, WM=1, WN=2), (33, 29, 41)),
    ("tf32", dict(MWG=32, NWG=16, KWG=32, WM=1, WN=1), (1, 1, 1)),
    # ST > 1: the cp.async ring, B [k][n] (ldmatrix.trans on the GPU: x2 for FN = 1, x4 pairs else)
    ("f16", dict(MWG=32, NWG=16, KWG=16, WM=2, WN=1, ST=2), (33, 29, 41)),
    ("f16", dict(MWG=64, NWG=32, KWG=32, WM=2, WN=2, ST=3), (70, 37, 100)),
    ("f16", dict(MWG=16, NWG=48, KWG=16, WM=1, WN=2, ST=4), (5, 70, 97)),
    ("tf32", dict(MWG=32, NWG=32, KWG=8, WM=1, WN=2, ST=3), (33, 29, 41)),
]


@pytest.mark.parametrize("mode,cfg,odd", CONFIGS, ids=lambda v: "-".join(f"{k}{x}" for k, x in v.items())
                         if isinstance(v, dict) else str(v))
def test_gemm_ragged_and_exact_shapes(rt, mode, cfg, odd):
    """Every bounds check emitted (ragged M, N, K), then none (tile multiples)."""
    rng = np.random.default_rng(0)
    for M, N, K in (odd, (cfg["MWG"], 2 * cfg["NWG"], 2 * cfg["KWG"])):
        assert gm.why_illegal(cfg, M, N, K, mode) is None
        A = rounded(rng.standard_normal((1, M, K)).astype(np.float32), mode)
        B = rounded(rng.standard_normal((1, 1, K, N)).astype(np.float32), mode)
        bias = rng.standard_normal(M).astype(np.float32)
        out = run_gemm(rt, cfg, mode, A, B, bias, act=LEAKY)
        assert rel_err(out, reference(A, B, bias, act=LEAKY)) < TOL[mode], (M, N, K, cfg)


@pytest.mark.parametrize("mode,st", [("f16", 1), ("tf32", 1), ("f16", 2), ("tf32", 2)])
def test_full_epilogue_groups_batches_residual_slice(rt, mode, st):
    """Groups, batches, bias, leaky, a fused residual + leaky, written into a concat slice."""
    rng = np.random.default_rng(1)
    G, M, N, K, batch = 2, 24, 52, 40, 3
    cfg = dict(MWG=32, NWG=32, KWG=16, WM=2, WN=2, ST=st)
    A = rounded(rng.standard_normal((G, M, K)).astype(np.float32), mode)
    B = rounded(rng.standard_normal((batch, G, K, N)).astype(np.float32), mode)
    bias = rng.standard_normal(G * M).astype(np.float32)
    R = rng.standard_normal((batch, G, M, N)).astype(np.float32)
    if mode == "f16":
        R = R.astype(np.float16).astype(np.float32)
    out = run_gemm(rt, cfg, mode, A, B, bias, residual=R, act=LEAKY, act2=LEAKY, c_pad=(5, 3))
    assert rel_err(out, reference(A, B, bias, R, LEAKY, LEAKY)) < TOL[mode]


@pytest.mark.parametrize("mode,sk,st,in_kernel", [("f16", 3, 1, "SS"), ("tf32", 2, 1, "env"), ("f16", 3, 3, "env"),
                                                  ("tf32", 2, 2, "SS"), ("f16", 3, 2, "")])
def test_split_k_full_epilogue(rt, mode, sk, st, in_kernel, monkeypatch):
    """K split over work-groups (the last split shorter, CHECK_K), partial planes summed with the
    whole epilogue (batches, residual, a concat slice) by gemm_local.cl's yc_gemm_splitk in a
    second launch, or by the tile's last work-group: a config's SS 1, or YOLO_CL_MMA_SPLIT_SUM=kernel."""
    if in_kernel == "env":
        monkeypatch.setenv(gm.SPLIT_SUM_ENV, "kernel")
    rng = np.random.default_rng(5)
    G, M, N, K, batch = 1, 33, 29, 100, 2
    cfg = dict(MWG=32, NWG=16, KWG=16, WM=2, WN=1, SK=sk, ST=st, **({"SS": 1} if in_kernel == "SS" else {}))
    assert gm.split_in_kernel(cfg) == bool(in_kernel)
    assert gm.why_illegal(cfg, M, N, K, mode) is None
    A = rounded(rng.standard_normal((G, M, K)).astype(np.float32), mode)
    B = rounded(rng.standard_normal((batch, G, K, N)).astype(np.float32), mode)
    bias = rng.standard_normal(G * M).astype(np.float32)
    R = rounded(rng.standard_normal((batch, G, M, N)).astype(np.float32), mode)
    out = run_gemm(rt, cfg, mode, A, B, bias, residual=R, act=LEAKY, act2=LEAKY, c_pad=(2, 1))
    assert rel_err(out, reference(A, B, bias, R, LEAKY, LEAKY)) < TOL[mode]
    assert "non-empty" in gm.why_illegal({**cfg, "SK": 8}, M, N, 40, mode)
    assert "SS" in gm.why_illegal({**cfg, "SK": 1, "SS": 1}, M, N, K, mode)


@pytest.mark.parametrize("mode", ["f16", "tf32"])
@pytest.mark.parametrize("cfg,shape", [(dict(MWG=32, NWG=32, KWG=16, WM=2, WN=2, ST=2), (33, 40, 41)),
                                       (dict(MWG=64, NWG=16, KWG=32, WM=2, WN=1, ST=3), (64, 32, 128))],
                         ids=["ragged", "exact"])
def test_b_rows_copied_as_chunks(rt, mode, cfg, shape):
    """BVEC (N a multiple of a 16-byte chunk's elements: 8 halves, 4 floats): B rows reach local
    memory as cp.async chunks, the chunks past N and the rows past K zero-filled, with batches and
    the epilogue; TF32 B is copied unrounded and rounded to nearest as its fragments are loaded, so
    the result is the product of the rounded inputs."""
    rng = np.random.default_rng(8)
    M, N, K = shape
    A = rounded(rng.standard_normal((1, M, K)).astype(np.float32), mode)
    B = rng.standard_normal((2, 1, K, N)).astype(np.float32)
    B = B if mode == "tf32" else rounded(B, mode)          # tf32: the kernel must round it
    bias = rng.standard_normal(M).astype(np.float32)
    out = run_gemm(rt, cfg, mode, A, B, bias, act=LEAKY, bvec=True)
    assert rel_err(out, reference(A, rounded(B, mode), bias, act=LEAKY)) < TOL[mode]
    assert not gm.b_vector(cfg, "f16", False, 36) and gm.b_vector(cfg, "tf32", False, 36)
    assert not gm.b_vector(cfg, "tf32", False, 34)
    assert not gm.b_vector({**cfg, "ST": 1}, mode, False, 32) and not gm.b_vector(cfg, mode, True, 32)


@pytest.mark.parametrize("mode,cfg,shape", [
    ("f16", dict(MWG=32, NWG=16, KWG=64, WM=1, WN=2, ST=2, BS=1), (33, 29, 130)),
    ("f16", dict(MWG=64, NWG=32, KWG=16, WM=2, WN=2, ST=3, BS=1), (64, 45, 37)),
    ("tf32", dict(MWG=32, NWG=16, KWG=16, WM=2, WN=1, ST=3, BS=1), (33, 27, 41))])
def test_b_rows_copied_as_shifted_chunks(rt, mode, cfg, shape):
    """BS: rows of an odd N (and batches and groups starting mid-chunk) reach local memory as the
    aligned 16-byte chunks that cover them, each row shifted by its own misalignment, the columns
    past N and the rows past K zeroed; the product equals NumPy's, with the epilogue."""
    rng = np.random.default_rng(9)
    M, N, K = shape
    G, batch = 2, 2
    A = rounded(rng.standard_normal((G, M, K)).astype(np.float32), mode)
    B = rng.standard_normal((batch, G, K, N)).astype(np.float32)
    B = B if mode == "tf32" else rounded(B, mode)
    bias = rng.standard_normal(G * M).astype(np.float32)
    out = run_gemm(rt, cfg, mode, A, B, bias, act=LEAKY, bvec=True)     # BVEC refused: N is odd
    assert rel_err(out, reference(A, rounded(B, mode), bias, act=LEAKY)) < TOL[mode]
    assert gm.why_illegal(cfg, M, N, K, mode) is None
    assert "BS" in gm.why_illegal(cfg, M, N, K, mode, implicit=True)
    assert "BS" in gm.why_illegal({**cfg, "ST": 1}, M, N, K, mode)


def test_unrounded_tf32_inputs_are_rounded_to_nearest(rt):
    """Float inputs go in as TF32 rounded to nearest: the result matches NumPy on the rounded
    inputs, and is off the unrounded product by TF32's error, not more."""
    rng = np.random.default_rng(4)
    M, N, K = 48, 40, 64
    A = rng.standard_normal((1, M, K)).astype(np.float32)
    B = rng.standard_normal((1, 1, K, N)).astype(np.float32)
    bias = np.zeros(M, np.float32)
    out = run_gemm(rt, dict(MWG=32, NWG=32, KWG=16, WM=2, WN=2), "tf32", A, B, bias)
    assert rel_err(out, reference(gm.tf32_round(A), gm.tf32_round(B), bias)) < 1e-5
    assert 1e-5 < rel_err(out, reference(A, B, bias)) < 2e-3


def conv_case(rng, mode: str, geom: tuple, batch: int, C: int, H: int, W: int, F: int) -> tuple:
    """A random conv (input, weights and bias rounded for ``mode``): (x, w, bias, (M, N, K), the
    implicit geometry ``run_gemm`` takes)."""
    ks, stride, pad, dil, groups = geom
    OH = (H + 2 * pad - dil * (ks - 1) - 1) // stride + 1
    OW = (W + 2 * pad - dil * (ks - 1) - 1) // stride + 1
    x = rounded(rng.standard_normal((batch, C, H, W)).astype(np.float32), mode)
    w = rounded(rng.standard_normal((F, C // groups, ks, ks)).astype(np.float32), mode)
    bias = rng.standard_normal(F).astype(np.float32)
    geo = dict(x=x.shape, KS=ks, SX=stride, SY=stride, PAD=pad, DIL=dil, OH=OH, OW=OW)
    return x, w, bias, (F // groups, OH * OW, (C // groups) * ks * ks), geo


@pytest.mark.parametrize("mode,geom,st", [("f16", (3, 1, 1, 1, 1), 1), ("tf32", (3, 2, 1, 1, 1), 1),
                                          ("f16", (3, 1, 1, 1, 2), 1), ("tf32", (1, 1, 0, 1, 1), 1),
                                          ("f16", (3, 2, 1, 1, 1), 2), ("tf32", (3, 1, 1, 1, 2), 3)],
                         ids=["f16-3x3s1", "tf32-3x3s2", "f16-3x3g2", "tf32-1x1", "f16-3x3s2-st2", "tf32-3x3g2-st3"])
def test_implicit_conv(rt, mode, geom, st):
    """im2col gathered inside the B-tile load, against a direct float64 convolution."""
    ks, stride, pad, dil, groups = geom
    rng = np.random.default_rng(3)
    batch, C, H, W, F = 2, 6, 11, 9, 10
    x, w, bias, (M, N, K), geo = conv_case(rng, mode, geom, batch, C, H, W, F)
    cfg = dict(MWG=16, NWG=32, KWG=16, WM=1, WN=2, ST=st)
    out = run_gemm(rt, cfg, mode, w.reshape(groups, M, K), x, bias, implicit=geo)
    ref = conv_reference(x, w, bias, stride, pad, dil, groups)
    assert rel_err(out.reshape(ref.shape), ref) < TOL[mode]


GATHER_CASES = [  # (mode, config with GA, (ks, stride, pad, dil, groups), (C, H, W, F)): ragged on purpose
    # W 13: most runs of 8 columns cross an output row; H*W = 143 not a multiple of NWG
    ("f16", dict(MWG=16, NWG=32, KWG=16, WM=1, WN=2, ST=2, GA=2), (3, 1, 1, 1, 1), (5, 11, 13, 10)),
    # OW 6 < 8: a run spans up to three rows; K = 63 ragged, split over 2 (the last split short)
    ("f16", dict(MWG=32, NWG=16, KWG=16, WM=2, WN=1, ST=3, GA=2, SK=2), (3, 1, 1, 1, 1), (7, 5, 6, 20)),
    # W 20: interior row runs and both padding edges; stride 2 and a dilation through the general path
    ("f16", dict(MWG=16, NWG=64, KWG=32, WM=1, WN=2, ST=2, GA=2), (3, 1, 1, 1, 1), (3, 9, 20, 12)),
    ("f16", dict(MWG=16, NWG=32, KWG=16, WM=1, WN=2, ST=2, GA=2), (3, 2, 1, 1, 1), (6, 11, 9, 10)),
    ("f16", dict(MWG=16, NWG=32, KWG=16, WM=1, WN=2, ST=4, GA=2), (3, 1, 2, 2, 2), (6, 10, 11, 8)),
    # GA 3 (aligned 16-byte blocks shifted into place; C*H*W multiples of 8): W 13, 22, OW 6, dilation 2
    ("f16", dict(MWG=16, NWG=32, KWG=16, WM=1, WN=2, ST=2, GA=3), (3, 1, 1, 1, 1), (6, 12, 13, 10)),
    ("f16", dict(MWG=16, NWG=64, KWG=32, WM=1, WN=2, ST=3, GA=3), (3, 1, 1, 1, 1), (4, 9, 22, 12)),
    ("f16", dict(MWG=32, NWG=16, KWG=16, WM=2, WN=1, ST=2, GA=3, SK=2), (3, 1, 1, 1, 1), (8, 5, 6, 20)),
    ("f16", dict(MWG=16, NWG=32, KWG=16, WM=1, WN=2, ST=4, GA=3), (3, 1, 2, 2, 1), (8, 10, 11, 8)),
    # GA 1 (per-k table, double-buffered): f16 and tf32, more k-tiles than table slots
    ("f16", dict(MWG=16, NWG=32, KWG=16, WM=1, WN=2, ST=2, GA=1), (3, 1, 1, 1, 1), (5, 11, 13, 10)),
    ("f16", dict(MWG=32, NWG=16, KWG=16, WM=2, WN=1, ST=3, GA=1, SK=2), (3, 1, 1, 1, 1), (7, 5, 6, 20)),
    ("tf32", dict(MWG=32, NWG=32, KWG=8, WM=1, WN=2, ST=2, GA=1), (3, 2, 1, 1, 1), (5, 11, 13, 10)),
    ("tf32", dict(MWG=16, NWG=32, KWG=16, WM=1, WN=2, ST=3, GA=1), (1, 1, 0, 1, 1), (9, 7, 9, 10)),
    # GA 4 (tf32 floats by cp.async): a fixed column per work-item, a column per element (48 does
    # not divide 64 work-items) in a grouped conv, split K
    ("tf32", dict(MWG=32, NWG=32, KWG=8, WM=1, WN=2, ST=2, GA=4), (3, 2, 1, 1, 1), (5, 11, 13, 10)),
    ("tf32", dict(MWG=16, NWG=48, KWG=16, WM=1, WN=2, ST=3, GA=4), (3, 1, 1, 1, 2), (8, 7, 9, 10)),
    ("tf32", dict(MWG=32, NWG=16, KWG=16, WM=2, WN=1, ST=4, GA=4, SK=2), (3, 1, 1, 1, 1), (7, 5, 6, 20)),
]


@pytest.mark.parametrize("mode,cfg,geom,shape", GATHER_CASES,
                         ids=[f"{m}-GA{c['GA']}-k{g[0]}s{g[1]}d{g[3]}g{g[4]}-{'x'.join(map(str, sh))}"
                              for m, c, g, sh in GATHER_CASES])
def test_implicit_conv_gathers(rt, mode, cfg, geom, shape):
    """The im2col gathers GA 1 (per-k table), GA 2 (runs of 8 columns), GA 3 (aligned runs) and GA
    4 (tf32 by cp.async) against a direct float64 convolution: ragged W, H*W, channels and K,
    padding edges, batch 2, bias + leaky, a fused residual + leaky, written into a concat slice."""
    ks, stride, pad, dil, groups = geom
    C, H, W, F = shape
    rng = np.random.default_rng(11)
    batch = 2
    x, w, bias, (M, N, K), geo = conv_case(rng, mode, geom, batch, C, H, W, F)
    OH, OW = geo["OH"], geo["OW"]
    assert gm.why_illegal(cfg, M, N, K, mode, implicit=True) is None
    assert gm.aligned_gather(cfg, C * H * W, (C // groups) * H * W) == cfg     # GA 3 runs as GA 3 here
    R = rounded(rng.standard_normal((batch, F, OH, OW)).astype(np.float32), mode)
    out = run_gemm(rt, cfg, mode, w.reshape(groups, M, K), x, bias, implicit=geo, residual=R.reshape(batch, groups, M, N),
                   act=LEAKY, act2=LEAKY, c_pad=(3, 2))
    ref = conv_reference(x, w, bias, stride, pad, dil, groups)
    ref = leaky(leaky(ref) + R)
    assert rel_err(out.reshape(ref.shape), ref) < TOL[mode]


def test_async_tf32_gather_rounds_what_it_copies(rt):
    """GA 4 copies the input's floats unrounded; the fragments round them to nearest TF32, so
    an unrounded input gives the product of the rounded one."""
    rng = np.random.default_rng(12)
    geom, (C, H, W, F) = (3, 1, 1, 1, 1), (6, 9, 10, 12)
    x, w, bias, (M, N, K), geo = conv_case(rng, "tf32", geom, 1, C, H, W, F)
    raw = x + rng.standard_normal(x.shape).astype(np.float32) * 1e-3       # bits TF32 drops
    cfg = dict(MWG=16, NWG=32, KWG=8, WM=1, WN=2, ST=2, GA=4)
    out = run_gemm(rt, cfg, "tf32", w.reshape(1, M, K), raw, bias, implicit=geo)
    ref = conv_reference(rounded(raw, "tf32"), w, bias, 1, 1, 1, 1)
    assert rel_err(out.reshape(ref.shape), ref) < TOL["tf32"]


def test_gather_legality_and_override(monkeypatch):
    """GA > 0 only where its kernel path exists; the tuner's space offers every legal gather of a
    staged implicit config and both split-sum places (SS) of a split one, as schedule siblings;
    YOLO_CL_MMA_GATHER forces one gather, with ST >= 2."""
    base = dict(MWG=64, NWG=32, KWG=32, WM=2, WN=2, ST=2)
    M, N, K = 64, 100, 288
    assert gm.why_illegal({**base, "GA": 2}, M, N, K, "f16", implicit=True) is None
    assert gm.why_illegal({**base, "GA": 1}, M, N, K, "tf32", implicit=True) is None
    assert "f16" in gm.why_illegal({**base, "GA": 2}, M, N, K, "tf32", implicit=True)
    assert gm.aligned_gather({**base, "GA": 3}, 0, 936, 468) == {**base, "GA": 2}      # a stride of 4 mod 8
    assert gm.aligned_gather({**base, "GA": 3}, 8, 936, 936) == {**base, "GA": 3}
    assert "implicit" in gm.why_illegal({**base, "GA": 1}, M, N, K, "f16", implicit=False)
    assert "ST > 1" in gm.why_illegal({**base, "ST": 1, "GA": 2}, M, N, K, "f16", implicit=True)
    assert "divide" in gm.why_illegal({**base, "MWG": 16, "NWG": 64, "WM": 1, "WN": 1, "GA": 1}, M, N, K, "f16", implicit=True)
    assert "tf32 only" in gm.why_illegal({**base, "GA": 4}, M, N, K, "f16", implicit=True)
    assert gm.why_illegal({**base, "GA": 4}, M, N, K, "tf32", implicit=True) is None
    assert "one of" in gm.why_illegal({**base, "GA": 5}, M, N, K, "tf32", implicit=True)
    assert gm.local_bytes({**base, "GA": 1}, "f16") == gm.local_bytes(base, "f16") + 2 * 32 * 8     # its k tables
    sp = gm.space(M, N, K, "f16", True)
    assert {c.get("GA") for c in sp} == {None, 0, 1, 2, 3}
    assert {c.get("GA") for c in gm.space(M, N, K, "tf32", True)} == {None, 0, 1, 4}
    assert all(("GA" in c) == (gm.stages(c) > 1) for c in sp)
    assert not any("GA" in c for c in gm.space(M, N, K, "f16", False))
    from yolo_cl.kernels.gemm_local import DeviceLimits
    split = [c for c in gm.space(1024, 169, 4608, "f16", True, DeviceLimits(1024, 48 * 1024, 132)) if "SK" in c]
    assert split and {c["SS"] for c in split} == {0, 1}             # the split sum's place: tuned per config
    assert gm.forced_gather(base, "f16") == base
    monkeypatch.setenv(gm.GATHER_ENV, "2")
    assert gm.forced_gather({**base, "ST": 1}, "f16") == {**base, "GA": 2}
    assert gm.forced_gather(base, "tf32") == base                  # GA 2 is f16 only: left as tuned
    monkeypatch.setenv(gm.GATHER_ENV, "4")
    assert gm.forced_gather(base, "tf32") == {**base, "GA": 4} and gm.forced_gather(base, "f16") == base
    monkeypatch.setenv(gm.GATHER_ENV, "0")
    assert gm.forced_gather({**base, "ST": 1, "GA": 1}, "tf32") == {**base, "GA": 0}


def test_space_legality_and_heuristic():
    from yolo_cl.kernels.gemm_local import DeviceLimits
    lim = DeviceLimits(max_wg=1024, local_mem=48 * 1024, compute_units=132)
    for mode in ("f16", "tf32"):
        for M, N, K in [(1024, 169, 4608), (32, 173056, 27), (255, 676, 512)]:
            sp = gm.space(M, N, K, mode, False, lim)
            assert len(sp) > 20 and all(gm.why_illegal(c, M, N, K, mode, False, lim) is None for c in sp)
            assert gm.why_illegal(gm.heuristic(M, N, K, 1, mode, False, lim), M, N, K, mode, False, lim) is None
    # wide tiles only where the narrow pick already gives 8 work-groups per compute unit
    narrow = gm.heuristic(256, 4096, 1152, 1, "f16", True, lim)
    assert (narrow["MWG"], narrow["NWG"]) == (128, 32) and "GA" not in narrow
    wide = gm.heuristic(256, 5776, 1152, 8, "f16", True, lim)
    assert (wide["MWG"], wide["NWG"], wide["WM"] * wide["WN"], wide["GA"]) == (128, 128, 8, gm.WIDE_GATHER)
    assert gm.why_illegal(wide, 256, 5776, 1152, "f16", True, lim) is None
    thin = gm.heuristic(32, 92416, 64, 8, "f16", False, lim)
    assert (thin["MWG"], thin["NWG"], "GA" in thin) == (64, 128, False)
    roomy = DeviceLimits(max_wg=1024, local_mem=64 * 1024, compute_units=132)    # room for 2 stages, emulated too
    ragged = gm.heuristic(512, 169, 1024, 1, "f16", False, roomy)      # a 13x13 1x1: rows by shifted chunks
    assert ragged.get("BS") == 1 and gm.stages(ragged) > 1
    # few tiles, long K, B as it is: small unsplit tiles (32 x 16 where 32 x 32 leave SMs idle)
    assert (ragged["MWG"], ragged["NWG"], gm.split_k(ragged)) == (32, 16, 1)
    mid = gm.heuristic(256, 676, 512, 1, "tf32", False, lim)            # a 26x26 1x1: whole 4-float chunks
    assert (mid["MWG"], mid["NWG"], mid["KWG"], gm.split_k(mid), mid.get("BS")) == (32, 32, 32, 1, None)
    assert gm.heuristic(256, 676, 512, 1, "f16", False, lim).get("BS") == 1     # 676 halves: ragged chunks
    assert gm.split_k(gm.heuristic(512, 169, 4608, 1, "f16", True, lim)) > 1     # a gathered B still splits
    assert "BS" not in gm.heuristic(512, 176, 1024, 1, "f16", False, roomy)
    assert "BS" not in gm.heuristic(512, 169, 1024, 1, "f16", True, roomy)     # an implicit B is gathered
    sp = gm.space(512, 169, 1024, "f16", False, lim)
    assert any(c.get("BS") for c in sp) and all(gm.stages(c) > 1 for c in sp if c.get("BS"))
    assert not any(c.get("BS") for c in gm.space(512, 176, 1024, "f16", False, lim))
    tf32 = gm.heuristic(256, 5776, 1152, 8, "tf32", True, lim)          # wide tf32 tiles overflow 48 KB
    assert tf32["NWG"] == 32 and gm.why_illegal(tf32, 256, 5776, 1152, "tf32", True, lim) is None
    base = dict(MWG=64, NWG=64, KWG=32, WM=2, WN=2)
    assert "K" in gm.why_illegal({**base, "KWG": 8}, 64, 64, 64, "f16")          # f16 mma takes k16
    assert gm.why_illegal({**base, "KWG": 8}, 64, 64, 64, "tf32") is None
    assert "fragments" in gm.why_illegal({**base, "MWG": 32, "WM": 4}, 64, 64, 64, "f16")
    assert "work-group" in gm.why_illegal(base, 64, 64, 64, "f16", lim=DeviceLimits(max_wg=64))
    assert "local memory" in gm.why_illegal(base, 64, 64, 64, "f16", lim=DeviceLimits(local_mem=1024))


def test_probe_passes_on_tensor_cores_or_emulated_and_says_no_otherwise(rt, monkeypatch):
    assert gm.available(rt, "f16") and gm.available(rt, "tf32")     # real, or emulated by the fixture
    assert gm.mode_for(rt, FP16) == "f16" and gm.mode_for(rt, TF32) == "tf32"
    assert gm.mode_for(rt, FP32) == ""
    monkeypatch.delenv(gm.EMULATE_ENV, raising=False)
    hw = gm.tensor_cores(rt)                                         # PoCL: no NVIDIA compute capability
    assert gm.available(rt, "f16") == hw and (gm.mode_for(rt, TF32) == "tf32") == hw


NET = (net_header(24, 24) + conv(16) + conv(32, stride=2) + conv(16, 1) + conv(32) + shortcut(-3) + route(-1, -4)
       + conv(18, 1, bn=0, act="linear"))


def net_and_reference(tmp_path, text: str, size, seed: int, batch: int = 1) -> tuple:
    """(cfg path, weights path, a random input blob, the NumPy Darknet forward pass's last output)
    of a cfg ``text`` with random weights; ``size``: the input's side, or its (height, width)."""
    from darknet_io import forward_numpy, write_random_weights
    cfg = tmp_path / "net.cfg"
    cfg.write_text(text)
    weights = write_random_weights(str(cfg), str(tmp_path / "net.weights"), calib_size=32)
    h, w = (size, size) if isinstance(size, int) else size
    blob = np.random.default_rng(seed).random((batch, 3, h, w), dtype=np.float32)
    ref = forward_numpy(str(cfg), weights, blob, keep="heads")
    return cfg, weights, blob, ref[max(ref)]


@pytest.fixture
def mma_alone(monkeypatch):
    """On a Hopper GPU the wgmma family takes some convs from mma.sync's; the tests of the mma
    family through the Detector keep it to themselves (elsewhere this changes nothing)."""
    monkeypatch.setattr(gw, "hopper", lambda rt: False)


@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_conv_net_end_to_end(rt, tmp_path, precision, mma_alone):
    """A small conv net (3x3, strided, 1x1, fused shortcut, concat) through the Detector on the
    mma family, against the NumPy Darknet forward pass and the FMA fp32 path."""
    import yolo_cl
    cfg, weights, blob, ref = net_and_reference(tmp_path, NET, 24, 6)
    det = yolo_cl.Detector(str(cfg), weights, precision=precision)
    assert det.mma == PRECISIONS[precision].mma
    names = {l.name for l in det.executor(1).launches if l.node.op == "conv"}
    assert names == {"gemm_mma"}, names                     # every conv on the mma family
    out = det.forward(blob)[0]
    assert rel_err(out, ref) < 1e-2
    fp32 = yolo_cl.Detector(str(cfg), weights).forward(blob)[0]
    assert rel_err(fp32, ref) < 1e-4 < rel_err(out, ref)   # the fp32 path stays IEEE; mma rounds


@pytest.mark.parametrize("ga", ["1", "3"])
def test_forced_gather_through_the_detector(rt, tmp_path, monkeypatch, ga):
    """YOLO_CL_MMA_GATHER forces a gather on every implicit conv of a network (ST raised to 2): the
    bound configs say so (GA 3 where the input's arena offset and strides are multiples of 8,
    else 2) and the output matches the NumPy Darknet forward pass."""
    import yolo_cl
    monkeypatch.setenv(gm.GATHER_ENV, ga)
    cfg, weights, blob, ref = net_and_reference(tmp_path, NET, 24, 6)
    det = yolo_cl.Detector(str(cfg), weights, precision="fp16")
    implicit = [l.config for l in det.executor(1).launches if l.name == "gemm_mma" and l.config["algo"] == "implicit"]
    assert implicit and all(gm.stages(c) >= 2 for c in implicit)
    gathers = {c["GA"] for c in implicit}
    assert gathers == {1} if ga == "1" else (3 in gathers and gathers <= {2, 3}), gathers
    assert rel_err(det.forward(blob)[0], ref) < 1e-2


def test_tuning_database_offers_only_mma_configs_on_tensor_cores(tmp_path):
    """FMA configs tuned for a precision do not compete with tensor cores: with an mma mode the
    look-up skips them (finding the mma entry, else the mma heuristic); without, nothing changes."""
    import yaml
    from test_tuner import convs, fake_rt, record
    from yolo_cl import tuning_db as dbm
    from yolo_cl.kernels import conv, family
    node = convs(tmp_path)[0]
    key = dbm.shape_key(node)
    local = {"family": "local", "algo": "implicit", "MWG": 32, "NWG": 32, "KWG": 16, "MDIMC": 8, "NDIMC": 8}
    mma = {"family": "mma", "algo": "implicit", "MWG": 32, "NWG": 32, "KWG": 32, "WM": 2, "WN": 1}
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(yaml.safe_dump({"version": 1, "records": [record(kind="GPU", precision="fp16",
                                                                      configs={key: local})]}))
    second.write_text(yaml.safe_dump({"version": 1, "records": [record(kind="GPU", precision="fp16",
                                                                       configs={key: mma})]}))
    rt = fake_rt(kind="GPU")
    user = tmp_path / "user.yaml"

    def database(paths, mma=""):
        return dbm.TuningDatabase(rt, FP16, paths=paths, user_path=user, fits=family.stored_config_fits(rt, mma))
    assert database([first, second]).conv_config(node) == local
    assert database([first, second], "f16").conv_config(node) == mma
    assert database([first], "f16").conv_config(node) is None          # no entry: the heuristic's turn
    assert conv.heuristic_config(node, rt, 1, FP16, "f16") == gm.heuristic_config(node, "f16")


@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_tuner_searches_the_mma_family_with_its_gate(rt, tmp_path, precision):
    """On tensor cores (emulated here) the tuner's candidates are the mma family's (at tf32 on a
    GPU the local FMA family's too: it competes there), and a real candidate lands between the
    fp32 gate and the precision's own (fp16 1e-2, tf32 2e-2)."""
    from test_tuner import convs
    from yolo_cl import tuner as tmod
    node = convs(tmp_path, 12, 12)[2]                       # 3x3/2 mish
    precision = PRECISIONS[precision]
    tuner = tmod.Tuner(rt, precision, reps=1)
    assert tuner.mma == precision.mma and tuner.tol == precision.tolerance
    cands = tuner.candidates(node)
    fma = {"local"} if precision is TF32 and not rt.is_cpu else set()
    wgmma = {"wgmma"} if gw.available(rt) else set()     # a Hopper GPU: f16 and tf32 alike
    assert cands and {c["family"] for c in cands} == {gm.FAMILY} | fma | wgmma
    assert {c["algo"] for c in cands if c["family"] == gm.FAMILY} == {"implicit", "im2col"}
    bench = tmod.ConvBench(rt, node, 1, precision, tuner.queue, mma=tuner.mma)
    err = bench.check(bench.bind(gm.heuristic_config(node, tuner.mma)))
    assert FP32.tolerance < err < tuner.tol


SPLIT_NET = net_header(16, 16) + conv(64, stride=2, bn=0) + conv(32, bn=0)


def test_in_kernel_split_sum_through_the_detector(rt, tmp_path, monkeypatch, mma_alone):
    """A layer the heuristic splits (K = 576, two tiles) with YOLO_CL_MMA_SPLIT_SUM=kernel: one
    launch per conv, no split-sum launch, the per-tile counts kept alive past binding (a kernel
    does not hold its buffer arguments; NVIDIA's driver fails the enqueue of a freed one), and
    two frames in a row (the counts reset) match the NumPy Darknet forward pass."""
    import gc

    import yolo_cl
    monkeypatch.setenv(gm.SPLIT_SUM_ENV, "kernel")
    cfg, weights, blob, ref = net_and_reference(tmp_path, SPLIT_NET, 16, 9)
    det = yolo_cl.Detector(str(cfg), weights, precision="fp16")
    launches = det.executor(1).launches
    assert [l.name for l in launches] == ["gemm_mma", "gemm_mma"]
    assert gm.split_k(launches[1].config) > 1
    gc.collect()
    for _ in range(2):
        assert rel_err(det.forward(blob)[0], ref) < 1e-2


def test_tune_retunes_a_shape_whose_own_entry_is_an_fma_config(rt, tmp_path, monkeypatch):
    """With tensor cores in use (emulated here), a shape whose entry for this device and driver is
    an FMA family's config still needs tuning (it used to count as tuned: on an H100 with shipped
    FMA fp16 entries, `yolo-cl tune --precision fp16` tuned nothing); an mma entry counts."""
    import io
    import re

    from test_tuner import convs
    from yolo_cl import tune_cli
    from yolo_cl.kernels.family import tuning_database
    from yolo_cl.tuning_db import shape_key
    monkeypatch.setenv("YOLO_CL_NO_SHIPPED_TUNING", "1")
    nodes = convs(tmp_path)
    db = tmp_path / "user.yaml"
    local = {"family": "local", "algo": "implicit", "MWG": 32, "NWG": 32, "KWG": 16, "MDIMC": 8, "NDIMC": 8}
    mma = {"family": "mma", "algo": "implicit", "MWG": 32, "NWG": 32, "KWG": 32, "WM": 2, "WN": 1}

    def need(entry: dict) -> tuple:
        tuning_database(rt, FP16, "f16", user_path=db).record(
            {shape_key(n): {**entry, "algo": gm.conv_algos(n)[0]} for n in nodes})
        out = io.StringIO()
        tune_cli.tune_model(str(tmp_path / "net24x20.cfg"), precision="fp16", budget_s=0, db_path=str(db),
                        progress=False, out=out)
        todo, total = re.search(r"(\d+) of (\d+) conv shapes need tuning", out.getvalue()).groups()
        return int(todo), int(total)

    todo, total = need(local)
    assert todo == total > 0
    assert need(mma) == (0, total)


WINO_CFG = (net_header(22, 18) + conv(13) + conv(13, act="mish") + shortcut(-2, act="leaky")
            + conv(20, stride=2, bn=0) + conv(9, 1) + route(-2) + conv(7) + route(-1, -3)
            + conv(11, bn=0, act="linear"))


@pytest.mark.parametrize("precision,m,st", [("fp16", 2, 2), ("fp16", 2, 1), ("tf32", 4, 3)])
def test_winograd_on_tensor_cores(rt, tmp_path, precision, m, st):
    """Winograd F(m x m, 3x3) with this family's GEMM over the transform points, every 3x3
    stride-1 conv of a small net (odd maps, mish, a fused shortcut, convs writing into a concat,
    batch 2; the 22x18 input's 11x9 tiles are a multiple of 8, so B goes by 16-byte chunks at ST
    > 1, the 11x9 map's 6x5 are not), the rest implicit, against the NumPy Darknet forward pass."""
    from tiny_graphs import FixedTuning, graph_of
    from yolo_cl.executor import Executor
    from yolo_cl.kernels import winograd
    cfg, weights, blob, ref = net_and_reference(tmp_path, WINO_CFG, (18, 22), 4, batch=2)
    tile = dict(MWG=16, NWG=32, KWG=16, WM=1, WN=2, ST=st)

    def pick(node) -> dict:
        algo = "winograd" if winograd.applicable(node) else "implicit"
        return {"algo": algo, "family": "mma", **tile, **({"m": m} if algo == "winograd" else {})}
    precision = PRECISIONS[precision]
    ex = Executor(rt, graph_of(str(cfg), weights), batch=2, precision=precision, tuning=FixedTuning(pick),
                  mma=gm.mode_for(rt, precision))
    wino = [l for l in ex.launches if l.name == "wino_gemm"]
    assert len(wino) == 4 and all(l.config["m"] == m for l in wino)
    assert all(l.name in ("gemm_mma", "wino_gemm", "wino_input", "wino_output") for l in ex.launches
               if l.node.op == "conv")
    out = ex.run(blob)[0]
    assert rel_err(out, ref) < 2e-2
    assert gm.KERNEL_FAMILY.why_illegal(ex.graph.nodes[0], {"algo": "winograd", "m": 6, **tile}, rt) is not None


def test_tf32_binds_fma_configs_next_to_tensor_cores(rt, tmp_path):
    """At tf32 the FMA family competes: a conv whose stored config is the local GEMM's (Winograd
    or implicit, timed faster there) runs on it beside the tensor-core convs, and the net still
    matches the NumPy Darknet forward pass within tf32's gate; at fp16 the same table's FMA
    entries stand aside for the tensor cores."""
    from tiny_graphs import FixedTuning, graph_of
    from yolo_cl.executor import Executor
    from yolo_cl.kernels import gemm_local as gl
    from yolo_cl.kernels import winograd
    cfg, weights, blob, ref = net_and_reference(tmp_path, WINO_CFG, (18, 22), 5, batch=2)
    mma_tile = dict(MWG=16, NWG=32, KWG=16, WM=1, WN=2, ST=2)

    def pick(node) -> dict:
        if winograd.applicable(node):       # the 3x3 stride-1 convs: fp32 FMA Winograd
            return gl.wino_heuristic(node, 2, 2)
        if node.attrs["stride_x"] == 2:     # the strided one: the local implicit GEMM
            return gl.heuristic_config(node, 2)
        return {"algo": gm.conv_algos(node)[0], "family": "mma", **mma_tile}
    runs = {}
    for precision in (TF32, FP16):
        ex = Executor(rt, graph_of(str(cfg), weights), batch=2, precision=precision, tuning=FixedTuning(pick),
                      mma=gm.mode_for(rt, precision))
        families = {(l.config or {}).get("family") for l in ex.launches if l.node.op == "conv"} - {None}
        runs[precision.name] = families, {l.name for l in ex.launches}, ex.run(blob)[0]
    families, names, out = runs["tf32"]
    assert families == {"local", "mma"} and {"gemm_mma", "gemm_local", "wino_gemm"} <= names
    assert rel_err(out, ref) < 2e-2
    families, names, out = runs["fp16"]
    assert families == {"mma"} and "gemm_local" not in names and rel_err(out, ref) < 2e-2


def test_winograd_named_but_not_searched(rt, tmp_path):
    """The tuner's space leaves Winograd out (it lost on every measured shape), while a config
    naming it is legal for the family on a 3x3 stride-1 conv (and on no other)."""
    from tiny_graphs import conv_nodes
    from yolo_cl.kernels import winograd
    nodes = conv_nodes(tmp_path / "w.cfg", WINO_CFG)
    node, strided = nodes[0], next(n for n in nodes if n.attrs["stride_x"] == 2)
    assert winograd.applicable(node) and not winograd.applicable(strided)
    cands = gm.KERNEL_FAMILY.candidates(node, rt, 1, FP16, "f16")
    assert cands and not any(c["algo"] == "winograd" for c in cands)
    wino = {**cands[0], "algo": "winograd", "m": 2}
    wino.pop("GA", None)
    assert gm.KERNEL_FAMILY.why_illegal(node, wino, rt) is None
    assert gm.KERNEL_FAMILY.why_illegal(strided, wino, rt) is not None
