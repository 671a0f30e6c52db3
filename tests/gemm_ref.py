"""What both GEMM families' tests share: the float64 references (GEMM and direct convolution),
the error measure, B's kernel arguments (a matrix, or a conv input gathered implicitly), and C as a
NaN-poisoned slice of a larger tensor (as when a conv writes into a concat), read back with a
check that nothing outside the slice was written; and a runner for small kernels of ``cl/common.h``'s
functions, element by element against NumPy."""
from __future__ import annotations

import os

import numpy as np

from yolo_cl.kernels import act_id

LINEAR, LEAKY, MISH = act_id("linear"), act_id("leaky"), act_id("mish")
RELU, LOGISTIC = act_id("relu"), act_id("logistic")


def leaky(x):
    return np.where(x > 0, x, 0.1 * x)


def mish(x):
    return x * np.tanh(np.log1p(np.exp(np.minimum(x, 20.0))))


ACTS = {LINEAR: lambda x: x, LEAKY: leaky, MISH: mish, RELU: lambda x: np.maximum(x, 0.0),
        LOGISTIC: lambda x: 1.0 / (1.0 + np.exp(-x))}


def reference(A, B, bias, residual=None, act=LINEAR, act2=LINEAR):
    """C = act2(act(A.B + bias) + residual) in float64; A (G,M,K), B (batch,G,K,N)."""
    G, M, K = A.shape
    C = np.einsum("gmk,bgkn->bgmn", A.astype(np.float64), B.astype(np.float64))
    C = ACTS[act](C + bias.reshape(1, G, M, 1))
    if residual is not None:
        C = ACTS[act2](C + residual.reshape(C.shape))
    return C


def b_operand(defines: dict, implicit, G: int, K: int, N: int) -> tuple:
    """B's stride arguments (after its buffer) and the trailing arguments of an implicit conv
    (adding its defines): B is a (batch, G, K, N) matrix, or with ``implicit`` = dict(x=(batch,
    C, H, W), KS, SX, SY, PAD, DIL, OW) the conv input whose im2col the kernel gathers."""
    if implicit is None:
        return [np.int32(0), np.int32(G * K * N), np.int32(K * N), np.int32(N)], []
    _, C, H, W = implicit["x"]
    defines.update(IMPLICIT=True, **{k: implicit[k] for k in ("KS", "SX", "SY", "PAD", "DIL")})
    return ([np.int32(0), np.int32(C * H * W), np.int32((C // G) * H * W), np.int32(H * W)],
            [np.int32(H), np.int32(W), np.int32(implicit["OW"])])


def conv_reference(x, w, bias, stride, pad, dil, groups):
    """Direct NCHW convolution in float64."""
    n, C, H, W = x.shape
    F, cg, ks, _ = w.shape
    OH = (H + 2 * pad - dil * (ks - 1) - 1) // stride + 1
    OW = (W + 2 * pad - dil * (ks - 1) - 1) // stride + 1
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((n, F, OH, OW))
    fg = F // groups
    for g in range(groups):
        for ky in range(ks):
            for kx in range(ks):
                patch = xp[:, g * cg:(g + 1) * cg, ky * dil: ky * dil + stride * (OH - 1) + 1: stride,
                           kx * dil: kx * dil + stride * (OW - 1) + 1: stride]
                out[:, g * fg:(g + 1) * fg] += np.einsum("fc,nchw->nfhw", w[g * fg:(g + 1) * fg, :, ky, kx], patch)
    return out + bias.reshape(1, -1, 1, 1)


def rel_err(x, ref):
    assert np.isfinite(x).all(), "non-finite (unwritten) output"
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


class SlicedC:
    """C (batch, G*M, N) as rows [before, before + G*M) of a NaN-poisoned (batch, rows, N) buffer,
    and the residual R laid out the same way (C's buffer stands in when there is none)."""

    def __init__(self, rt, batch, G, M, N, c_pad, dt, residual=None) -> None:
        self.rt, self.shape = rt, (batch, G, M, N)
        self.before, after = c_pad
        self.rows = G * M + self.before + after
        self.off, self.bstride = self.before * N, self.rows * N
        self.poison = np.full(batch * self.bstride, np.nan, dt)
        self.buf = rt.upload(self.poison, "C")
        if residual is None:
            self.rbuf = self.buf
        else:
            full = np.zeros((batch, self.rows, N), np.float32)
            full[:, self.before:self.before + G * M] = residual.reshape(batch, G * M, N)
            self.rbuf = rt.upload(full.astype(dt).ravel(), "R")

    def read(self) -> np.ndarray:
        """C as float32 (batch, G, M, N), after checking the rows around the slice are untouched."""
        batch, G, M, N = self.shape
        out = np.empty_like(self.poison)
        self.rt.cl.enqueue_copy(self.rt.queue, out, self.buf)
        self.rt.queue.finish()
        out = out.astype(np.float32).reshape(batch, self.rows, N)
        end = self.before + G * M
        assert np.isnan(out[:, :self.before]).all() and np.isnan(out[:, end:]).all(), "wrote outside its slice"
        return out[:, self.before:end].reshape(self.shape)


def run_common_kernel(rt, src: str, x: np.ndarray, outputs: int = 2) -> list:
    """Build ``src`` (whose ``__kernel void k(x, out0, out1, ...)`` may use ``cl/common.h``), run
    it over float32 ``x`` one work-item per element, and return its ``outputs`` float32 arrays."""
    cl_dir = os.path.join(os.path.dirname(__file__), "..", "cl")
    prg = rt.cl.Program(rt.context, src).build(options=f"-I{cl_dir}")
    bufs = [rt.upload(x, "x")] + [rt.alloc(x.nbytes, f"out{i}") for i in range(outputs)]
    prg.k(rt.queue, x.shape, None, *bufs)
    outs = [np.empty_like(x) for _ in range(outputs)]
    for o, b in zip(outs, bufs[1:]):
        rt.cl.enqueue_copy(rt.queue, o, b)
    rt.queue.finish()
    return outs
