"""Half arithmetic in the FMA GEMM families (cl/common.h's hreal, HALF_MATH) against NumPy on PoCL.

No device here lists ``cl_khr_fp16``, so the half path runs emulated (``YOLO_CL_HALF_MATH=emulate``:
float registers, every multiply-add rounded to half). The tests check the rounding itself against
NumPy's float16, the families' convs (1x1, im2col, implicit, Winograd F(2x2); ragged shapes, an
activation and a fused shortcut) within the fp16 gate through the tuner's own check, a GEMM whose
output equals a NumPy model of the blocked half sums bit for bit (and differs from float
arithmetic: the emulation really rounds), a tiny network's heads against fp32, and that without
the switch every kernel is built with the defines it had before.
"""
from __future__ import annotations

import tempfile

import numpy as np
import pytest

from gemm_ref import run_common_kernel
from tiny_cfgs import conv, maxpool, net_header, route, shortcut, upsample, yolo
from tiny_graphs import TINY_TILE, FixedTuning, conv_nodes, graph_of, local_pick, write_model
from yolo_cl.errors import YoloClError
from yolo_cl.executor import Executor
from yolo_cl.kernels import epilogue_defines
from yolo_cl.kernels import gemm_cpu as gc
from yolo_cl.kernels import gemm_local as gl
from yolo_cl.kernels import winograd
from yolo_cl.precision import FP16, FP32, HALF_MATH_ENV, half_math
from yolo_cl.runtime import Runtime
from yolo_cl.tuner import ConvBench, rel_error

GATE = FP16.tolerance          # the tuner's fp16 gate, 1e-2 relative
HK = 16                        # gemm.cl's k steps per half block (its HK default)


@pytest.fixture(scope="module")
def rt():
    return Runtime()


@pytest.fixture
def emulate(monkeypatch):
    monkeypatch.setenv(HALF_MATH_ENV, "emulate")


def test_hround_matches_numpy(rt):
    """yc_hround (scalar) and its float8 form against NumPy's float32 -> float16 -> float32: ties
    to even, half subnormals, the largest half, overflow to infinity, signed values, NaN."""
    src = ('#include "common.h"\n'
           'YC_DEFINE_HROUND(yc_hround, float, uint, as_uint, as_float)\n'
           'YC_DEFINE_HROUND(yc_hround8, float8, uint8, as_uint8, as_float8)\n'
           '__kernel void k(__global const float* x, __global float* s, __global float* v)'
           '{ const int i = get_global_id(0); s[i] = yc_hround(x[i]);'
           '  if (i % 8 == 0) vstore8(yc_hround8(vload8(0, x + i)), 0, v + i); }')
    rng = np.random.default_rng(3)
    h = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)   # every finite half >= 0
    ties = (h[:-1] + h[1:]) / 2                                                       # the midpoints: ties
    x = np.concatenate([h, ties, np.nextafter(ties, 0), np.nextafter(ties, 1), -ties,
                        rng.standard_normal(20000) * 10.0 ** rng.integers(-9, 6, 20000),
                        [65504, 65519.99, 65520, 1e6, -1e6, np.inf, -np.inf, np.nan, 2.0 ** -25, 2.0 ** -26]])
    x = np.concatenate([x, np.zeros(-len(x) % 8)]).astype(np.float32)
    s, v = run_common_kernel(rt, src, x)
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(s, ref)
    np.testing.assert_array_equal(v, ref)


def test_setting_and_defines(rt, monkeypatch):
    """auto computes in half only where the device lists cl_khr_fp16, emulate everywhere, off
    nowhere; fp32 never; a bad value is a one-line error. PoCL here has no cl_khr_fp16."""
    assert not rt.fp16
    for setting, has, want in (("auto", False, ""), ("auto", True, "native"), ("off", True, ""),
                               ("emulate", False, "emulate"), ("emulate", True, "emulate"), ("", True, "native")):
        monkeypatch.setenv(HALF_MATH_ENV, setting)
        assert half_math(FP16, has) == want, (setting, has)
        assert half_math(FP32, has) == ""
    monkeypatch.setenv(HALF_MATH_ENV, "fast")
    with pytest.raises(YoloClError, match=HALF_MATH_ENV):
        half_math(FP16, True)


def net_text(c: int = 21) -> str:
    """A ragged 3x3 conv (leaky), a 1x1 conv with a fused shortcut (leaky) and a strided 3x3."""
    return (net_header(22, 10, c) + conv(19, 3, bn=0) + conv(19, 1, pad=0, bn=0, act="linear")
            + shortcut(-2, act="leaky") + conv(13, 3, stride=2, bn=0, act="mish"))


NV = {"kernel": "nv", "TM": 3, "VW": 4, "NV": 1, "KU": 2, "WG": 0}
MV = {"kernel": "mv", "TN": 3, "VW": 4, "NV": 2, "KU": 1, "WG": 1, "ORD": 1}


def family_cases(nodes: list) -> list:
    """(node, config) pairs: every algorithm the two FMA families bind, ragged in M and N."""
    conv3, conv1, strided = nodes
    cases = [(conv3, {"family": "cpu", "algo": "implicit", **dict(NV, VW=2)}),      # 22 = 11 blocks of 2
             (conv3, {"family": "cpu", "algo": "im2col", **MV}),
             (conv3, {"family": "cpu", "algo": "winograd", "m": 2, **NV}),
             (conv1, {"family": "cpu", "algo": "gemm1x1", **NV}),
             (conv1, {"family": "cpu", "algo": "gemm1x1", **MV}),
             (strided, {"family": "cpu", "algo": "im2col", **NV})]
    for node, algo in ((conv3, "implicit"), (conv3, "im2col"), (conv1, "gemm1x1"), (strided, "im2col")):
        M, N, K, _ = gc.conv_gemm_shape(node)
        cases.append((node, {"family": "local", "algo": algo,
                             **gl.complete(TINY_TILE, M, N, K, implicit=algo == "implicit")}))
    M, N, K, _ = winograd.gemm_shape(conv3, 2)
    cases.append((conv3, {"family": "local", "algo": "winograd", "m": 2, **gl.complete(TINY_TILE, M, N, K)}))
    return cases


def test_families_within_gate(rt, tmp_path, emulate):
    """Every algorithm of both families with emulated half arithmetic, through the tuner's own
    check (NumPy conv, poisoned output slice), at batch 2: within the fp16 gate, and built with
    HALF_MATH + HALF_EMULATE."""
    nodes = conv_nodes(tmp_path / "net.cfg", net_text())
    assert nodes[1].attrs["residual"] is not None
    for node, cfg in family_cases(nodes):
        bench = ConvBench(rt, node, 2, FP16, rt.queue, seed=4)
        launches = bench.bind(cfg)
        gemms = [l for l in launches if l.name in ("gemm", "gemm_local", "wino_gemm")]
        assert gemms, cfg
        err = bench.check(launches)
        assert err < GATE, f"{cfg}: relative error {err:.2e}"


def blocked_half_gemm(A: np.ndarray, B: np.ndarray, block: int) -> np.ndarray:
    """NumPy model of the kernels' half arithmetic: each block of ``block`` k steps summed in half
    (a fused multiply-add rounded to half per step), the block sums added in float32."""
    M, K = A.shape
    acc = np.zeros((M, B.shape[1]), np.float32)
    for k0 in range(0, K, block):
        h = np.zeros_like(acc, dtype=np.float16)
        for k in range(k0, min(K, k0 + block)):
            h = (A[:, k:k + 1].astype(np.float32) * B[k].astype(np.float32) + h.astype(np.float32)).astype(np.float16)
        acc += h.astype(np.float32)
    return acc


@pytest.mark.parametrize("family", ["cpu-nv", "cpu-mv", "local"])
def test_emulation_rounds_like_half(rt, tmp_path, monkeypatch, family):
    """A 1x1 conv (linear, bias) over 70 channels equals the NumPy model of blocked half sums bit
    for bit; the same conv in float arithmetic does not (the emulation rounds), and is closer to
    the float64 result."""
    text = net_header(13, 7, 70) + conv(11, 1, pad=0, bn=0, act="linear")
    node = conv_nodes(tmp_path / "net.cfg", text)[0]
    M, N, K, _ = gc.conv_gemm_shape(node)
    if family == "local":
        cfg, block = {"family": "local", "algo": "gemm1x1", **gl.complete(TINY_TILE, M, N, K)}, TINY_TILE["KWG"]
    else:
        cfg, block = {"family": "cpu", "algo": "gemm1x1", **(NV if family == "cpu-nv" else MV)}, HK
    outs = {}
    for setting in ("emulate", "off"):
        monkeypatch.setenv(HALF_MATH_ENV, setting)
        bench = ConvBench(rt, node, 1, FP16, rt.queue, seed=9)
        assert bench.check(bench.bind(cfg)) < GATE
        t = bench.tensors[1]
        outs[setting] = bench._out.astype(np.float32).reshape(t.c, t.h * t.w)[1:-1]
    a = bench.node.attrs
    A = a["weights"].reshape(M, K).astype(np.float16)
    B = bench.x.reshape(K, N).astype(np.float16)
    model = (blocked_half_gemm(A, B, block) + a["bias"].astype(np.float32)[:, None]).astype(np.float16)
    np.testing.assert_array_equal(outs["emulate"], model.astype(np.float32))
    exact = A.astype(np.float64) @ B.astype(np.float64) + a["bias"][:, None]
    differ = np.mean(outs["emulate"] != outs["off"])
    e_half, e_float = rel_error(outs["emulate"], exact), rel_error(outs["off"], exact)
    print(f"{family}: {differ:.0%} of outputs differ; error vs float64 half {e_half:.2e}, float {e_float:.2e}")
    assert differ > 0.05 and e_half > 1.2 * e_float


def test_off_builds_the_previous_defines(rt, tmp_path, monkeypatch):
    """On a device without cl_khr_fp16, with the switch on auto or off, every program a family
    binds is built with exactly the defines it was before half arithmetic existed (the epilogue's
    and the config's); with emulate the GEMMs add HALF_MATH and HALF_EMULATE and nothing else."""
    nodes = conv_nodes(tmp_path / "net.cfg", net_text())
    built = []
    real = rt.program
    monkeypatch.setattr(rt, "program", lambda source, defines=None: (built.append((source, dict(defines or {}))),
                                                                      real(source, defines))[1])
    for setting in ("auto", "off", "emulate"):
        monkeypatch.setenv(HALF_MATH_ENV, setting)
        for node, cfg in family_cases(nodes):
            if cfg["algo"] == "winograd":
                continue            # its GEMM's defines are the same call (NO_BIAS instead of the epilogue)
            built.clear()
            bench = ConvBench(rt, node, 1, FP16, rt.queue)
            bench.bind(cfg)
            M, N, K, _ = gc.conv_gemm_shape(node)
            mod = gc if cfg["family"] == "cpu" else gl
            fitted = cfg if mod is gc else gl.fit(cfg, M, N, K, cfg["algo"] == "implicit", gl.device_limits(rt))
            before = mod.defines(epilogue_defines(bench.ctx, node), fitted, M, N) if mod is gc else \
                mod.defines(epilogue_defines(bench.ctx, node), fitted, M, N, K)
            a = node.attrs
            if cfg["algo"] == "implicit":
                before.update({"IMPLICIT": True, "IM_KS": a["size"], "IM_SY": a["stride_y"], "IM_PAD": a["pad"],
                               "IM_DIL": a["dilation"]} if mod is gc else
                              {"IMPLICIT": True, "KS": a["size"], "SX": a["stride_x"], "SY": a["stride_y"],
                               "PAD": a["pad"], "DIL": a["dilation"]})
            gemm = [d for s, d in built if s in ("gemm.cl", "gemm_local.cl") and "ACT" in d]
            assert len(gemm) == 1, built
            half = {"HALF_MATH": True, "HALF_EMULATE": True} if setting == "emulate" else {}
            assert gemm[0] == {**before, **half}, (setting, cfg)
            others = [d for s, d in built if d is not gemm[0]]
            assert not any("HALF_MATH" in d for d in others), others


NET = (net_header(32, 24) + conv(8) + maxpool() + conv(16) + maxpool() + conv(32) + conv(16, 1)
       + conv(32) + conv(18, 1, bn=0, act="linear") + yolo([3, 4, 5], 1)
       + route(-4) + conv(8, 1) + upsample() + route(-1, -10) + conv(16) + conv(18, 1, bn=0, act="linear")
       + yolo([0, 1, 2], 1))


@pytest.mark.parametrize("family", ["cpu", "local"])
def test_network_heads_within_gate(rt, monkeypatch, family):
    """A tiny yolov3-tiny-like network (yolo heads, concat, upsample) at fp16 with emulated half
    arithmetic: both heads within the fp16 gate of fp32 (on the CPU family's heuristic configs, or
    the local family with Winograd F(2x2) on every 3x3)."""
    cfg, wts = write_model(tempfile.mkdtemp(), "net", NET, seed=2)
    graph = graph_of(cfg, wts)
    blob = np.random.default_rng(1).random((1, 3, 24, 32), dtype=np.float32)
    tuning = FixedTuning(local_pick(TINY_TILE, 2)) if family == "local" else None
    # The CPU heuristic's fused Winograd (few-channel 3x3 convs) computes in float: keep its GEMMs here.
    monkeypatch.setattr(gc, "FUSED_MAX_C", 0)
    monkeypatch.setattr(gc, "FUSED_WIDE_C", 0)
    heads, built = {}, []
    real = rt.program
    monkeypatch.setattr(rt, "program", lambda source, defines=None: (built.append((source, dict(defines or {}))),
                                                                      real(source, defines))[1])
    for precision, setting in ((FP32, "off"), (FP16, "emulate")):
        monkeypatch.setenv(HALF_MATH_ENV, setting)
        built.clear()
        ex = Executor(rt, graph, batch=1, precision=precision, tuning=tuning)
        heads[precision.name] = [np.asarray(h, np.float32) for h in ex.run(blob)]
        gemms = [d for s, d in built if s in ("gemm.cl", "gemm_local.cl") and ("ACT" in d or "NO_BIAS" in d)]
        assert len(gemms) >= 6 and all(("HALF_EMULATE" in d) == precision.half for d in gemms), built
        assert not any("HALF_MATH" in d for s, d in built if s not in ("gemm.cl", "gemm_local.cl")), built
    errs = [rel_error(h, r) for h, r in zip(heads["fp16"], heads["fp32"])]
    print(family, "fp16 emulated half arithmetic vs fp32:", " ".join(f"{e:.2e}" for e in errs))
    assert len(errs) == 2 and max(errs) < GATE, errs
