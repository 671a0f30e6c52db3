"""The CPU GEMM family (cl/gemm.cl) against NumPy on PoCL: both kernels over a spread of configs
and odd shapes, the fused epilogue, groups, batches, concat slices, fp16 storage, and the
row-wise im2col.

Each case uses fresh random data and a NaN-poisoned output buffer with spare rows around the
slice, so an unwritten element or a write outside the slice fails the comparison.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from gemm_ref import LEAKY, LINEAR, LOGISTIC, MISH, RELU, SlicedC, reference, rel_err, run_common_kernel
from tiny_cfgs import conv, net_header, shortcut
from tiny_graphs import conv_nodes
from yolo_cl.kernels import gemm_cpu as gc
from yolo_cl.precision import FP16, FP32
from yolo_cl.runtime import Runtime


@pytest.fixture(scope="module")
def rt():
    return Runtime()


def full(cfg: dict) -> dict:
    """A family config with defaults for the tunables a case does not name."""
    c = {"kernel": "nv", "VW": 8, "NV": 1, "KU": 1, "WG": 0}
    c.update(cfg)
    c.setdefault("TM" if c["kernel"] == "nv" else "TN", 4)
    return c


def run_gemm(rt, cfg, A, B, bias, *, residual=None, act=LINEAR, act2=LINEAR, half=False, c_pad=(0, 0), packed=True):
    """Run the family's kernel for ``cfg`` on host arrays; A (G,M,K), B (batch,G,K,N); returns C (batch,G,M,N).

    ``c_pad`` = (rows before, rows after) of extra output per image: C is a slice of a larger
    tensor, as when a conv writes into a concat. ``packed=False`` runs yc_gemm on the plain
    [G][M][K] weights (the layout of untuned legacy configs).
    """
    cl = rt.cl
    dt = np.float16 if half else np.float32
    G, M, K = A.shape
    batch, N = B.shape[0], B.shape[-1]
    c = SlicedC(rt, batch, G, M, N, c_pad, dt, residual)
    w = A.reshape(G * M, K)
    Ah = gc.pack_weights(w, G, gc.pack_rows(cfg), dt) if packed else w.astype(dt)
    bufs = [rt.upload(np.ascontiguousarray(Ah), "A"), rt.upload(bias.astype(np.float32), "bias"),
            rt.upload(B.astype(dt).ravel(), "B")]
    d = gc.defines({"HALF_STORAGE": half, "ACT": act}, cfg, M, N)
    if not packed:
        del d["PACK_A"]
    if residual is not None:
        d.update(RESIDUAL=True, ACT2=act2)
    i = np.int32
    args = bufs + [i(0), i(G * K * N), i(K * N), i(N), c.buf, i(c.off), i(c.bstride), i(N),
                   c.rbuf, i(c.off), i(c.bstride), i(M), i(N), i(K), i(G)]
    k = cl.Kernel(rt.program("gemm.cl", d), gc.kernel_name(cfg))
    k.set_args(*args)
    cl.enqueue_nd_range_kernel(rt.queue, k, gc.grid(cfg, M, N, batch * G), gc.local_size(cfg))
    return c.read()


def case(rt, cfg, M, N, K, *, G=1, batch=1, seed=0, tol=1e-5, **kw):
    rng = np.random.default_rng(seed)
    assert gc.why_illegal(cfg, M, N, K) is None, gc.why_illegal(cfg, M, N, K)
    half = kw.get("half", False)
    q = (lambda a: a.astype(np.float16).astype(np.float32)) if half else (lambda a: a)
    A = q(rng.standard_normal((G, M, K)).astype(np.float32))
    B = q(rng.standard_normal((batch, G, K, N)).astype(np.float32))
    bias = rng.standard_normal(G * M).astype(np.float32)
    res = q(rng.standard_normal((batch, G, M, N)).astype(np.float32)) if kw.pop("with_residual", False) else None
    out = run_gemm(rt, cfg, A, B, bias, residual=res, **kw)
    err = rel_err(out, reference(A, B, bias, res, kw.get("act", LINEAR), kw.get("act2", LINEAR)))
    assert err < tol, f"{cfg} M={M} N={N} K={K}: relative error {err:.2e}"


# Register blocks of both kernels, vector widths 1-16, NV 1-3, k unroll, explicit work-groups,
# both grid orders.
CONFIGS = [
    {"kernel": "nv", "TM": 8, "VW": 8, "NV": 1, "KU": 1, "WG": 0},
    {"kernel": "nv", "TM": 6, "VW": 8, "NV": 2, "KU": 4, "WG": 1, "ORD": 1},
    {"kernel": "nv", "TM": 3, "VW": 4, "NV": 3, "KU": 2, "WG": 0, "ORD": 1},
    {"kernel": "nv", "TM": 1, "VW": 16, "NV": 1, "KU": 1, "WG": 1},
    {"kernel": "nv", "TM": 5, "VW": 2, "NV": 1, "KU": 3, "WG": 0},
    {"kernel": "mv", "TN": 4, "VW": 8, "NV": 2, "KU": 1, "WG": 0},
    {"kernel": "mv", "TN": 6, "VW": 4, "NV": 1, "KU": 4, "WG": 1, "ORD": 1},
    {"kernel": "mv", "TN": 3, "VW": 8, "NV": 3, "KU": 1, "WG": 0, "ORD": 1},
    {"kernel": "mv", "TN": 1, "VW": 16, "NV": 1, "KU": 2, "WG": 0},
    {"kernel": "mv", "TN": 12, "VW": 1, "NV": 2, "KU": 1, "WG": 1},
]
ODD = [(1, 1, 1), (5, 7, 3), (17, 33, 27), (75, 130, 41), (33, 169, 96)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_configs_odd_and_exact_shapes(rt, cfg):
    """Each config on an odd shape (M, N, K not multiples of the block: checks emitted) and an exact one (none)."""
    rows, cols = gc.block(cfg)
    odd = ODD[CONFIGS.index(cfg) % len(ODD)]
    exact = (2 * rows, 3 * cols, 19)
    assert "CHECK_M" not in gc.defines({}, cfg, *exact[:2]) and "CHECK_N" not in gc.defines({}, cfg, *exact[:2])
    for M, N, K in (odd, exact):
        case(rt, cfg, M, N, K, act=LEAKY)


def test_epilogue_residual_groups_batch_slice(rt):
    """Bias + mish + residual add + leaky, 3 groups, batch 2, writing into the middle of a concat."""
    for cfg in (CONFIGS[1], CONFIGS[5]):
        case(rt, cfg, 7, 45, 20, G=3, batch=2, act=MISH, act2=LEAKY, with_residual=True, c_pad=(5, 3))


@pytest.mark.parametrize("act,seed", [(LINEAR, 0), (LEAKY, 1), (RELU, 2), (MISH, 6), (LOGISTIC, 4)])
def test_vector_epilogue_activations(rt, act, seed):
    """The epilogue on whole vectors: the activations it computes as SIMD (linear, leaky, relu,
    mish) and one it computes lane by lane (logistic), after a residual add too, in both kernels
    on exact and ragged blocks (pre-activations reach +-25: both sides of mish's threshold 20)."""
    for cfg in (CONFIGS[1], CONFIGS[6]):
        rows, cols = gc.block(cfg)
        for M, N in ((2 * rows, 2 * cols), (rows + 3, cols + 5)):
            case(rt, cfg, M, N, 37, act=act, act2=act, with_residual=True, seed=seed)


def test_exp_and_mish_functions(rt):
    """common.h's yc_exp (plain-arithmetic exp) and yc_mish against float64 over [-100, 100]:
    exp within 2e-7 relative where it is not clamped, mish within 2e-6 of Darknet's formula
    (softplus threshold 20: x above it, exp(x) below -20) where it is not tiny."""
    src = ('#include "common.h"\n__kernel void k(__global const float* x, __global float* e, __global float* m)'
           '{ const int i = get_global_id(0); e[i] = yc_exp(x[i]); m[i] = yc_mish(x[i]); }')
    x = np.concatenate([np.linspace(-100, 100, 20001), np.random.default_rng(1).standard_normal(20000) * 8])
    x = x.astype(np.float32)
    e, m = run_common_kernel(rt, src, x)
    xd = x.astype(np.float64)
    inside = (xd > -87) & (xd < 88)
    ref_e = np.exp(xd[inside])
    assert np.max(np.abs(e[inside] - ref_e) / ref_e) < 2e-7
    assert (e[xd >= 88] == e[xd >= 88].max()).all() and np.isfinite(e).all()
    sp = np.where(xd > 20, xd, np.where(xd < -20, np.exp(xd), np.log1p(np.exp(np.minimum(xd, 20)))))
    ref_m = xd * np.tanh(sp)
    big = np.abs(ref_m) > 1e-30
    assert np.max(np.abs(m[big] - ref_m[big]) / np.abs(ref_m[big])) < 2e-6
    assert np.max(np.abs(m - ref_m)) < 1e-5


def test_one_channel_and_single_pixel(rt):
    """K = 1 (a 1x1 conv of a 1-channel input), M = 1 and N = 1."""
    for cfg in (CONFIGS[0], CONFIGS[7]):
        for M, N, K in ((9, 40, 1), (1, 40, 9), (12, 1, 30)):
            case(rt, cfg, M, N, K)


def test_fp16_storage(rt):
    """Half storage (float math): inputs, weights and outputs as half."""
    for cfg in (CONFIGS[1], CONFIGS[5]):
        case(rt, cfg, 19, 70, 33, act=LEAKY, half=True, with_residual=True, tol=2e-3)


def test_unpacked_weights(rt):
    """yc_gemm on plain [G][M][K] weights, the layout untuned legacy configs bind."""
    for cfg in (full({"TM": 3, "VW": 4}), full({"TM": 8, "VW": 16})):
        for M, N, K in ((10, 37, 11), (16, 32, 8)):
            rng = np.random.default_rng(M)
            A = rng.standard_normal((2, M, K)).astype(np.float32)
            B = rng.standard_normal((1, 2, K, N)).astype(np.float32)
            bias = rng.standard_normal(2 * M).astype(np.float32)
            out = run_gemm(rt, cfg, A, B, bias, act=LEAKY, packed=False)
            assert rel_err(out, reference(A, B, bias, act=LEAKY)) < 1e-5


def test_tuner_space_sample(rt):
    """A seeded sample of what the tuner may choose on a ragged shape, each checked against NumPy."""
    M, N, K = 21, 50, 13
    space = gc.space(M, N, K)
    assert space and all(gc.why_illegal(c, M, N, K) is None for c in space)
    rng = np.random.default_rng(1)
    for i in rng.choice(len(space), 6, replace=False):
        case(rt, space[i], M, N, K, act=LEAKY)


def test_legality():
    ok = full({"TM": 4})
    assert gc.why_illegal(ok, 10, 10, 10) is None
    assert "VW" in gc.why_illegal(full({"VW": 3}), 10, 10, 10)
    assert "register block" in gc.why_illegal(full({"TM": 16, "VW": 16, "NV": 1}), 10, 10, 10)
    assert "divide" in gc.why_illegal(full({"WG": 4}), 10, 17, 10)      # 3 column blocks
    assert "exceeds" in gc.why_illegal(full({"WG": 8}), 10, 64, 10, max_wg=4)
    assert "missing" in gc.why_illegal({"kernel": "nv"}, 10, 10, 10)
    assert "integer" in gc.why_illegal(full({"TM": "4"}), 10, 10, 10)
    assert "kernel" in gc.why_illegal(full({"kernel": "xx"}), 10, 10, 10)
    assert "ORD" in gc.why_illegal(full({"ORD": 2}), 10, 10, 10)
    assert "divide" in gc.why_illegal(full({"WG": 3, "ORD": 1, "TM": 3}), 10, 64, 10)    # 4 row blocks of 3


def test_pack_weights_layout():
    w = np.arange(2 * 5 * 3, dtype=np.float32).reshape(10, 3)      # G=2, M=5, K=3
    p = gc.pack_weights(w, 2, 4)
    assert p.shape == (2, 2, 3, 4)                                  # [G][MB][K][rows]
    for g, m, k in itertools.product(range(2), range(5), range(3)):
        assert p[g, m // 4, k, m % 4] == w[g * 5 + m, k]
    assert (p[:, 1, :, 1:] == 0).all()                              # rows past M are zero


def im2col_ref(x, KS, SX, SY, PAD, DIL, G):
    B, C, H, W = x.shape
    OH = (H + 2 * PAD - DIL * (KS - 1) - 1) // SY + 1
    OW = (W + 2 * PAD - DIL * (KS - 1) - 1) // SX + 1
    cg = C // G
    out = np.zeros((B, G, cg * KS * KS, OH * OW), np.float32)
    for b, g, c, ky, kx, oy, ox in itertools.product(range(B), range(G), range(cg), range(KS), range(KS),
                                                     range(OH), range(OW)):
        iy, ix = oy * SY - PAD + ky * DIL, ox * SX - PAD + kx * DIL
        if 0 <= iy < H and 0 <= ix < W:
            out[b, g, (c * KS + ky) * KS + kx, oy * OW + ox] = x[b, g * cg + c, iy, ix]
    return out, OH, OW


@pytest.mark.parametrize("shape", [(1, 2, 7, 9, 3, 1, 1, 1, 1, 1), (2, 4, 8, 6, 3, 2, 2, 1, 1, 2),
                                   (1, 3, 9, 9, 3, 1, 1, 2, 2, 1), (1, 2, 5, 4, 1, 1, 1, 0, 1, 1),
                                   (2, 2, 5, 41, 3, 2, 2, 1, 1, 1), (1, 2, 4, 37, 3, 1, 1, 1, 1, 1),
                                   (1, 1, 6, 50, 5, 3, 1, 2, 1, 1)],
                         ids=["3x3s1", "3x3s2-groups-batch", "dilated", "1x1", "3x3s2-wide", "3x3s1-wide",
                              "5x5s3-wide"])
def test_im2col_rows(rt, shape):
    B, C, H, W, KS, SX, SY, PAD, DIL, G = shape
    x = np.random.default_rng(0).standard_normal((B, C, H, W)).astype(np.float32)
    ref, OH, OW = im2col_ref(x, KS, SX, SY, PAD, DIL, G)
    cl, i = rt.cl, np.int32
    xb = rt.upload(np.concatenate([np.zeros(5, np.float32), x.ravel()]), "x")   # a view at offset 5
    out = np.full(ref.size, np.nan, np.float32)
    ob = rt.upload(out, "col")
    k = cl.Kernel(rt.program("gemm.cl", {}), "yc_im2col_rows")
    k.set_args(xb, i(5), i(C * H * W), i(C // G), i(H), i(W), ob, i(OH), i(OW), i(KS), i(SX), i(SY), i(PAD), i(DIL),
               i(G))
    cl.enqueue_nd_range_kernel(rt.queue, k, (OH, (C // G) * KS * KS, B * G), None)
    cl.enqueue_copy(rt.queue, out, ob)
    rt.queue.finish()
    np.testing.assert_array_equal(out.reshape(ref.shape), ref)


def conv_net(c: int, k: int, d: int, g: int, width: int = 24, height: int = 10) -> str:
    """A ``k`` x ``k`` conv (dilation ``d``, ``g`` groups) over ``c`` channels, a 1x1 conv, and a shortcut."""
    return (net_header(width, height, c) + conv(10, k, bn=0, dilation=d, groups=g)
            + conv(10, 1, pad=0, bn=0, act="linear") + shortcut(-2, act="leaky"))


@pytest.mark.parametrize("c,k,d,g", [(3, 3, 1, 1), (4, 5, 2, 2), (1, 3, 1, 1)], ids=["3x3", "5x5-dil2-groups", "1ch"])
def test_conv_algorithms(rt, tmp_path, c, k, d, g):
    """Whole convs through each algorithm of the family (im2col, implicit, Winograd F(2x2)/F(4x4),
    gemm1x1 with a fused residual) against the tuner's NumPy reference, at batch 2."""
    from yolo_cl.tuner import ConvBench
    nodes = conv_nodes(tmp_path / "net.cfg", conv_net(c, k, d, g))
    nv = {"kernel": "nv", "TM": 4, "VW": 8, "NV": 1, "KU": 2, "WG": 0}
    mv = {"kernel": "mv", "TN": 3, "VW": 4, "NV": 2, "KU": 1, "WG": 1, "ORD": 1}
    cases = [(nodes[0], {"algo": "im2col", **mv}), (nodes[0], {"algo": "implicit", **nv}),
             (nodes[0], {"algo": "implicit", **dict(nv, ORD=1)}),
             (nodes[0], {"algo": "implicit", **dict(nv, VW=4, NV=3, TM=3)}),
             (nodes[1], {"algo": "gemm1x1", **mv})]
    if k == 3 and d == 1 and g == 1:
        cases += [(nodes[0], {"algo": "winograd", "m": m, **cfg}) for m in (2, 4) for cfg in (nv, mv)]
    algos = gc.conv_algos(nodes[0])
    assert ("implicit" in algos) and (("winograd" in algos) == (k == 3 and d == 1 and g == 1))
    assert nodes[1].attrs["residual"] is not None
    for node, cfg in cases:
        cfg = {"family": "cpu", **cfg}
        bench = ConvBench(rt, node, 2, FP32, rt.queue, seed=3)
        err = bench.check(bench.bind(cfg))
        assert err < 1e-4, f"{cfg}: relative error {err:.2e}"
    bad = {"family": "cpu", "algo": "implicit", **dict(nv, NV=2)}      # 16 does not divide the width 24
    assert "divide" in gc.conv_illegal(nodes[0], bad)


@pytest.mark.parametrize("c,k,d,g", [(3, 3, 1, 1), (32, 3, 1, 1), (4, 5, 2, 2)], ids=["3x3-c3", "3x3-c32", "5x5-dil2-groups"])
def test_heuristic_is_legal_and_correct(rt, tmp_path, c, k, d, g):
    """The untuned pick, at either precision, is a legal config of the family that computes the
    conv (checked against NumPy); F(4x4) Winograd only with fp32 storage."""
    from yolo_cl.tuner import ConvBench
    nodes = conv_nodes(tmp_path / "net.cfg", conv_net(c, k, d, g))
    for node in nodes:
        for precision in (FP32, FP16):
            half = precision.half
            cfg = gc.heuristic_config(node, 2, precision)
            assert cfg["algo"] in gc.conv_algos(node)
            assert gc.KERNEL_FAMILY.why_illegal(node, cfg, rt) is None, cfg
            fused = cfg.get("kernel") == "fused"
            assert fused == (node.attrs["size"] == 3 and d == 1 and g == 1 and c <= gc.FUSED_MAX_C), cfg
            assert not (half and cfg.get("m", 2) != 2), cfg
            bench = ConvBench(rt, node, 2, precision, rt.queue, seed=5)
            err = bench.check(bench.bind(cfg))
            assert err < (1e-2 if half else 1e-4), f"{cfg}: relative error {err:.2e}"


def test_heuristic_large_maps(rt, tmp_path):
    """Over large maps the heuristic's fixed rules apply and compute the conv: a 1x1 conv over at
    least POINTWISE_MIN_N pixels gets POINTWISE_BLOCK (here with ragged rows: 10 filters in 4-row
    blocks), a dilated 3x3 (no Winograd) over 32 channels and IMPLICIT_LARGE_N pixels the implicit
    GEMM; on smaller maps neither rule applies. A plain 3x3 over 32 channels gets the fused
    Winograd on either."""
    from yolo_cl.tuner import ConvBench
    for (w, h), large in (((256, 128), True), ((24, 10), False)):
        conv3, conv1 = conv_nodes(tmp_path / "net.cfg", conv_net(32, 3, 2, 1, w, h))
        assert (w * h >= gc.IMPLICIT_LARGE_N) == large and (w * h >= gc.POINTWISE_MIN_N) == large
        c3, c1 = gc.heuristic_config(conv3), gc.heuristic_config(conv1)
        rule = {"family": "cpu", "algo": "implicit", **gc.IMPLICIT_BLOCK, **gc.HEURISTIC_FIXED}
        assert (c3 == rule) == large, c3
        plain = conv_nodes(tmp_path / "plain.cfg", conv_net(32, 3, 1, 1, w, h))[0]
        assert gc.heuristic_config(plain) == {"family": "cpu", "algo": "winograd", "m": 4, **gc.FUSED_BLOCK}
        assert ({k: c1[k] for k in gc.POINTWISE_BLOCK if k in c1} == gc.POINTWISE_BLOCK) == large, c1
        for node, cfg in ((conv3, c3), (conv1, c1)):
            bench = ConvBench(rt, node, 1, FP32, rt.queue, seed=7)
            assert bench.check(bench.bind(cfg)) < 1e-4, cfg
