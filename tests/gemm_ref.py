"""What both GEMM families' tests share: the float64 reference, the error measure, and C as a
NaN-poisoned slice of a larger tensor (as when a conv writes into a concat), read back with a
check that nothing outside the slice was written."""
from __future__ import annotations

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
