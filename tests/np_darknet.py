"""A pure-NumPy, float64 Darknet forward pass: the reference the engine's kernels are tested against.

Written from Darknet's C sources (AlexeyAB's fork: ``forward_*_layer`` in ``src/*_layer.c``,
``reorg_cpu``/``softmax_cpu``/``upsample_cpu``/``shortcut_multilayer_cpu`` in ``blas.c``,
``activations.[ch]``), one plain loop-free function per layer type. It shares no code with the
engine: it takes the engine's ``Layer`` records only for their ``kind`` and their cfg section,
and re-reads every option with Darknet's own defaults, so a parsing or shape slip in
``yolo_cl.layers`` shows up as a mismatch too.

Conventions:
- tensors are float64 NCHW (batch first); ``forward`` returns every layer's output;
- batchnorm is applied the way Darknet's *unfused* inference does it (``forward_batchnorm_layer``
  with ``state.train == 0``): ``(y - rolling_mean) / sqrt(rolling_variance + 1e-5) * scales + biases``,
  the ``.00001f`` of ``normalize_cpu``. The engine instead folds BN into the weights (eps 1e-5,
  ``fuse_conv_batchnorm``); both are the same function, so this also checks the fold;
- ``[yolo]``, ``[region]`` and ``[dropout]`` pass their input through (the engine returns the raw head
  inputs and decodes them on the host);
- activations follow the intended formulas. Darknet's CPU ``activate()`` has no case for relu6, mish,
  swish or hard_mish and returns 0 for them where it is used (relu6 in convolutions, anything but
  linear/leaky/logistic in [scale_channels]/[sam]); its GPU path, and every other framework,
  computes the real function, and so do we;
- dilated convolutions use im2col's geometry (input padded by ``padding * dilation``), which is what
  Darknet computes; its ``convolutional_out_height`` ignores dilation but agrees with it whenever
  ``pad=1`` with an odd kernel or ``dilation=1`` (the only cases Darknet itself gets right).
"""
from __future__ import annotations

import numpy as np

BN_EPS = 1e-5                               # normalize_cpu: sqrt(variance + .00001f)
NEG_FLT_MAX = -float(np.finfo(np.float32).max)   # maxpool's -FLT_MAX for windows in the padding
SOFTPLUS_THRESHOLD = 20.0                   # activate_array_mish's MISH_THRESHOLD


class Options:
    """A cfg section's raw options, read with Darknet's atoi/atof semantics."""

    def __init__(self, section) -> None:
        self.raw = {k: v[0] for k, v in section.options.items()}

    def int(self, key: str, default: int) -> int:
        v = self.raw.get(key)
        return default if v is None else int(float(v))

    def float(self, key: str, default: float) -> float:
        v = self.raw.get(key)
        return default if v is None else float(v)

    def str(self, key: str, default: str) -> str:
        return self.raw.get(key, default).strip()

    def refs(self, key: str, index: int) -> list:
        """Layer indices a list option names; negative ones are relative to ``index``."""
        out = []
        for v in self.raw[key].split(","):
            if v.strip():
                j = int(float(v))
                out.append(index + j if j < 0 else j)
        return out


# -- activations (activations.[ch]) -------------------------------------------------------------------

def softplus(x: np.ndarray) -> np.ndarray:
    """softplus_activate(x, 20): x above the threshold, exp(x) below its negative, else log(exp(x) + 1)."""
    mid = np.log(np.exp(np.clip(x, -SOFTPLUS_THRESHOLD, SOFTPLUS_THRESHOLD)) + 1.0)
    return np.where(x > SOFTPLUS_THRESHOLD, x, np.where(x < -SOFTPLUS_THRESHOLD, np.exp(np.minimum(x, 0.0)), mid))


def logistic(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):            # exp(-x) = inf for x << 0 gives the right limit, 0
        return 1.0 / (1.0 + np.exp(-x))


def activate(x: np.ndarray, name: str) -> np.ndarray:
    if name == "linear":
        return x
    if name == "leaky":
        return np.where(x > 0, x, 0.1 * x)
    if name == "relu":
        return np.where(x > 0, x, 0.0)
    if name == "relu6":
        return np.clip(x, 0.0, 6.0)
    if name == "logistic":
        return logistic(x)
    if name == "tanh":
        with np.errstate(over="ignore"):        # Darknet's tanh_activate; inf -> -1 in the limit
            return 2.0 / (1.0 + np.exp(-2.0 * x)) - 1.0
    if name == "mish":
        return x * np.tanh(softplus(x))
    if name == "swish":
        return x * logistic(x)
    if name == "hard_mish":
        return np.where(x > 0, x, np.where(x > -2, x * x / 2 + x, 0.0))
    with np.errstate(over="ignore"):
        em1 = np.expm1(np.minimum(x, 0.0))
        if name == "elu":
            return np.where(x >= 0, x, em1)
        if name == "selu":
            return np.where(x >= 0, 1.0507 * x, 1.0507 * 1.6732 * em1)
        if name == "loggy":
            return 2.0 / (1.0 + np.exp(-x)) - 1.0
    if name == "gelu":
        return 0.5 * x * (1 + np.tanh(0.797885 * x + 0.035677 * x ** 3))
    if name == "hardtan":
        return np.clip(x, -1.0, 1.0)
    if name == "lhtan":
        return np.where(x < 0, 0.001 * x, np.where(x > 1, 0.001 * (x - 1) + 1, x))
    if name == "ramp":
        return np.where(x > 0, x, 0.0) + 0.1 * x
    if name == "plse":
        return np.where(x < -4, 0.01 * (x + 4), np.where(x > 4, 0.01 * (x - 4) + 1, 0.125 * x + 0.5))
    if name == "stair":                         # C's n % 2 keeps the sign: odd negatives are odd too
        n = np.floor(x)
        return np.where(np.fmod(n, 2) == 0, np.floor(x / 2), (x - n) + np.floor(x / 2))
    if name == "relie":
        return np.where(x > 0, x, 0.01 * x)
    if name == "revleaky":                      # activate(): case REVLEAKY falls through to leaky
        return np.where(x > 0, x, 0.1 * x)
    raise NotImplementedError(f"activation {name!r}")


def normalize_channels(x: np.ndarray, name: str) -> np.ndarray:
    """activate_array_normalize_channels[_softmax]: per pixel across channels, eps 1e-4 in the sum."""
    if name == "normalize_channels":
        pos = np.where(x > 0, x, 0.0)
        return pos / (1e-4 + pos.sum(axis=1, keepdims=True))
    m = x.max(axis=1, keepdims=True) if name.endswith("maxval") else 0.0
    e = np.exp(x - m)
    return e / (1e-4 + e.sum(axis=1, keepdims=True))


# -- layers -------------------------------------------------------------------------------------------

def convolutional(o: Options, x: np.ndarray, params) -> np.ndarray:
    """forward_convolutional_layer: grouped, strided, dilated cross-correlation, BN or bias, activation."""
    n_, c, h, w = x.shape
    filters = o.int("filters", 1)
    size = o.int("size", 1)
    stride = o.int("stride", 1)
    sx = o.int("stride_x", -1)
    sy = o.int("stride_y", -1)
    sx = stride if sx < 1 else sx
    sy = stride if sy < 1 else sy
    dil = 1 if size == 1 else o.int("dilation", 1)
    padding = size // 2 if o.int("pad", 0) else o.int("padding", 0)
    groups = o.int("groups", 1)
    p = padding * dil
    span = dil * (size - 1) + 1
    oh = (h + 2 * p - span) // sy + 1
    ow = (w + 2 * p - span) // sx + 1
    wts = np.asarray(params.weights, np.float64).reshape(filters, c // groups, size, size)
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    cg, fg = c // groups, filters // groups
    y = np.zeros((n_, filters, oh, ow))
    for ky in range(size):
        for kx in range(size):
            y0, x0 = ky * dil, kx * dil
            tap = xp[:, :, y0:y0 + (oh - 1) * sy + 1:sy, x0:x0 + (ow - 1) * sx + 1:sx]
            for g in range(groups):
                y[:, g * fg:(g + 1) * fg] += np.einsum("fc,nchw->nfhw", wts[g * fg:(g + 1) * fg, :, ky, kx],
                                                       tap[:, g * cg:(g + 1) * cg])
    col = (1, -1, 1, 1)
    if o.int("batch_normalize", 0):
        mean = np.asarray(params.mean, np.float64).reshape(col)
        var = np.asarray(params.variance, np.float64).reshape(col)
        y = (y - mean) / np.sqrt(var + BN_EPS) * np.asarray(params.scales, np.float64).reshape(col)
    y = y + np.asarray(params.biases, np.float64).reshape(col)
    act = o.str("activation", "logistic")
    return normalize_channels(y, act) if act.startswith("normalize_channels") else activate(y, act)


def maxpool(o: Options, x: np.ndarray) -> np.ndarray:
    """forward_maxpool_layer: windows start at -padding/2, cells outside the input count as -FLT_MAX."""
    n_, c, h, w = x.shape
    if o.int("maxpool_depth", 0):
        oc = o.int("out_channels", 1)
        y = np.full((n_, oc, h, w), NEG_FLT_MAX)
        for k in range(c):                      # output channel g: max over input channels g, g+oc, ...
            y[:, k % oc] = np.maximum(y[:, k % oc], x[:, k])
        return y
    stride = o.int("stride", 1)
    sx = o.int("stride_x", stride)
    sy = o.int("stride_y", stride)
    size = o.int("size", stride)
    padding = o.int("padding", size - 1)
    oh = (h + padding - size) // sy + 1
    ow = (w + padding - size) // sx + 1
    off = padding // 2
    grown = np.full((n_, c, max(h, (oh - 1) * sy + size) + off, max(w, (ow - 1) * sx + size) + off), NEG_FLT_MAX)
    grown[:, :, off:off + h, off:off + w] = x
    y = np.full((n_, c, oh, ow), NEG_FLT_MAX)
    for dy in range(size):
        for dx in range(size):
            y = np.maximum(y, grown[:, :, dy:dy + (oh - 1) * sy + 1:sy, dx:dx + (ow - 1) * sx + 1:sx])
    return y


def avgpool(o: Options, x: np.ndarray) -> np.ndarray:
    """forward_avgpool_layer: global mean per channel."""
    return x.mean(axis=(2, 3), keepdims=True)


def route(o: Options, index: int, outs: list) -> np.ndarray:
    """forward_route_layer: concatenate part ``group_id`` of ``groups`` of each input's channels."""
    groups = o.int("groups", 1)
    gid = o.int("group_id", 0)
    parts = []
    for j in o.refs("layers", index):
        part = outs[j].shape[1] // groups
        parts.append(outs[j][:, gid * part:(gid + 1) * part])
    return np.concatenate(parts, axis=1)


def shortcut(o: Options, index: int, x: np.ndarray, outs: list) -> np.ndarray:
    """shortcut_multilayer_cpu (no weights): per image, add each ``from`` output where its flat index exists."""
    n_ = x.shape[0]
    y = x.reshape(n_, -1).copy()
    for j in o.refs("from", index):
        a = outs[j].reshape(n_, -1)
        k = min(a.shape[1], y.shape[1])
        y[:, :k] += a[:, :k]
    return activate(y.reshape(x.shape), o.str("activation", "linear"))


def upsample(o: Options, x: np.ndarray) -> np.ndarray:
    """upsample_cpu (forward): nearest neighbour by ``stride``, times ``scale``."""
    s = o.int("stride", 2)
    return o.float("scale", 1.0) * x.repeat(s, axis=2).repeat(s, axis=3)


def reorg(o: Options, x: np.ndarray) -> np.ndarray:
    """[reorg] is Darknet's REORG_OLD: reorg_cpu(input, w, h, c, batch, stride, forward=0) on the INPUT dims.

    For every flat input index ``(k, j, i)`` it reads the element at ``(k % (c/s^2), j*s + off/s, i*s + off%s)``
    of a (c/s^2, h*s, w*s) view of the same buffer, where ``off = k / (c/s^2)``.
    """
    n_, c, h, w = x.shape
    s = o.int("stride", 1)
    in_c = c // (s * s)
    k, j, i = np.meshgrid(np.arange(c), np.arange(h), np.arange(w), indexing="ij")
    c2, off = k % in_c, k // in_c
    w2, h2 = i * s + off % s, j * s + off // s
    src = (w2 + w * s * (h2 + h * s * c2)).ravel()
    flat = x.reshape(n_, -1)
    return flat[:, src].reshape(n_, c * s * s, h // s, w // s)


def scale_channels(o: Options, index: int, x: np.ndarray, outs: list) -> np.ndarray:
    """forward_scale_channels_layer: ``from`` times the previous layer's per-channel values (per-pixel: scale_wh)."""
    f = outs[o.refs("from", index)[0]]
    y = f * x   # x is (n, c, 1, 1), or (n, 1, h, w) with scale_wh: broadcasting is Darknet's index arithmetic
    return activate(y, o.str("activation", "linear"))


def sam(o: Options, index: int, x: np.ndarray, outs: list) -> np.ndarray:
    """forward_sam_layer: element-wise product with ``from``."""
    return activate(outs[o.refs("from", index)[0]] * x, o.str("activation", "linear"))


def softmax(o: Options, x: np.ndarray) -> np.ndarray:
    """softmax_cpu: per image, softmax with temperature over ``groups`` runs of consecutive flat elements."""
    groups = o.int("groups", 1)
    t = o.float("temperature", 1.0)
    v = x.reshape(x.shape[0], groups, -1)
    e = np.exp(v / t - v.max(axis=2, keepdims=True) / t)
    return (e / e.sum(axis=2, keepdims=True)).reshape(x.shape)


def connected(o: Options, x: np.ndarray, params) -> np.ndarray:
    """forward_connected_layer: flat input times weights^T, then batchnorm (unfused) or bias, activation."""
    n_ = x.shape[0]
    outputs = o.int("output", 1)
    y = x.reshape(n_, -1) @ np.asarray(params.weights, np.float64).reshape(outputs, -1).T
    if o.int("batch_normalize", 0):
        y = (y - params.mean) / np.sqrt(np.asarray(params.variance, np.float64) + BN_EPS) * params.scales
    y = y + params.biases
    return activate(y, o.str("activation", "logistic")).reshape(n_, outputs, 1, 1)


def deconvolutional(o: Options, x: np.ndarray, params) -> np.ndarray:
    """forward_deconvolutional_layer (pjreddie): GEMM weights^T x input, col2im (scatter-add), BN or bias, activation."""
    n_, c, h, w = x.shape
    f = o.int("filters", 1)
    size = o.int("size", 1)
    s = o.int("stride", 1)
    pad = size // 2 if o.int("pad", 0) else o.int("padding", 0)
    oh, ow = (h - 1) * s + size - 2 * pad, (w - 1) * s + size - 2 * pad
    wts = np.asarray(params.weights, np.float64).reshape(c, f, size, size)
    big = np.zeros((n_, f, (h - 1) * s + size, (w - 1) * s + size))
    for ky in range(size):
        for kx in range(size):
            big[:, :, ky:ky + (h - 1) * s + 1:s, kx:kx + (w - 1) * s + 1:s] += np.einsum("cf,nchw->nfhw", wts[:, :, ky, kx], x)
    y = big[:, :, pad:pad + oh, pad:pad + ow]
    col = (1, -1, 1, 1)
    if o.int("batch_normalize", 0):
        y = (y - np.asarray(params.mean, np.float64).reshape(col)) / np.sqrt(
            np.asarray(params.variance, np.float64).reshape(col) + BN_EPS) * np.asarray(params.scales).reshape(col)
    y = y + np.asarray(params.biases, np.float64).reshape(col)
    return activate(y, o.str("activation", "logistic"))


def local(o: Options, x: np.ndarray, params) -> np.ndarray:
    """forward_local_layer: im2col (padded by ``pad``), then each output pixel's own (filters, k) GEMM."""
    n_, c, h, w = x.shape
    f, size, s, pad = o.int("filters", 1), o.int("size", 1), o.int("stride", 1), o.int("pad", 0)
    oh, ow = (h + 2 * pad - size) // s + 1, (w + 2 * pad - size) // s + 1
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    wts = np.asarray(params.weights, np.float64).reshape(oh, ow, f, c, size, size)
    y = np.asarray(params.biases, np.float64).reshape(1, f, oh, ow).repeat(n_, axis=0)
    for oy in range(oh):
        for ox in range(ow):
            patch = xp[:, :, oy * s:oy * s + size, ox * s:ox * s + size]
            y[:, :, oy, ox] += np.einsum("fcij,ncij->nf", wts[oy, ox], patch)
    return activate(y, o.str("activation", "logistic"))


def batchnorm(o: Options, x: np.ndarray, params) -> np.ndarray:
    """forward_batchnorm_layer (inference): normalize with the rolling statistics, scale, add biases."""
    col = (1, -1, 1, 1)
    y = (x - np.asarray(params.mean, np.float64).reshape(col)) / np.sqrt(
        np.asarray(params.variance, np.float64).reshape(col) + BN_EPS)
    return y * np.asarray(params.scales, np.float64).reshape(col) + np.asarray(params.biases, np.float64).reshape(col)


def crop(o: Options, x: np.ndarray) -> np.ndarray:
    """forward_crop_layer with train=0: the centred window, times 2 minus 1 (noadjust: unchanged)."""
    _, _, h, w = x.shape
    ch, cw = o.int("crop_height", 1), o.int("crop_width", 1)
    dh, dw = (h - ch) // 2, (w - cw) // 2
    scale, trans = (1.0, 0.0) if o.int("noadjust", 0) else (2.0, -1.0)
    return x[:, :, dh:dh + ch, dw:dw + cw] * scale + trans


def local_avgpool(o: Options, x: np.ndarray) -> np.ndarray:
    """forward_local_avgpool_layer: maxpool's windows, mean over the cells inside the input."""
    n_, c, h, w = x.shape
    stride = o.int("stride", 1)
    sx, sy = o.int("stride_x", stride), o.int("stride_y", stride)
    size = o.int("size", stride)
    padding = o.int("padding", size - 1)
    oh, ow = (h + padding - size) // sy + 1, (w + padding - size) // sx + 1
    off = padding // 2
    big_h, big_w = max(h, (oh - 1) * sy + size) + off, max(w, (ow - 1) * sx + size) + off
    grown = np.zeros((n_, c, big_h, big_w))
    grown[:, :, off:off + h, off:off + w] = x
    inside = np.zeros((1, 1, big_h, big_w))
    inside[:, :, off:off + h, off:off + w] = 1
    total, count = np.zeros((n_, c, oh, ow)), np.zeros((1, 1, oh, ow))
    for dy in range(size):
        for dx in range(size):
            total += grown[:, :, dy:dy + (oh - 1) * sy + 1:sy, dx:dx + (ow - 1) * sx + 1:sx]
            count += inside[:, :, dy:dy + (oh - 1) * sy + 1:sy, dx:dx + (ow - 1) * sx + 1:sx]
    return total / count


def reorg3d(o: Options, x: np.ndarray) -> np.ndarray:
    """[reorg3d]: reorg_cpu(forward=0) on the output dims: out[k, j, i] = in[k % c, j*s + off/s, i*s + off%s]."""
    n_, c, h, w = x.shape
    s = o.int("stride", 1)
    y = np.empty((n_, c * s * s, h // s, w // s))
    for k in range(c * s * s):
        off = k // c
        y[:, k] = x[:, k % c, off // s::s, off % s::s]
    return y


def normalization(o: Options, x: np.ndarray) -> np.ndarray:
    """forward_normalization_layer, its running window sum literally: the first window holds channels
    [0, size/2), each next one drops channel k - (size-1)/2 - 1 and adds channel k + size/2."""
    c = x.shape[1]
    alpha, beta, kappa, size = o.float("alpha", 0.0001), o.float("beta", 0.75), o.float("kappa", 1.0), o.int("size", 5)
    sq = x * x
    norms = np.empty_like(x)
    norms[:, 0] = kappa + alpha * sq[:, :size // 2].sum(axis=1)
    for k in range(1, c):
        norms[:, k] = norms[:, k - 1]
        prev, nxt = k - (size - 1) // 2 - 1, k + size // 2
        if prev >= 0:
            norms[:, k] -= alpha * sq[:, prev]
        if nxt < c:
            norms[:, k] += alpha * sq[:, nxt]
    return x * norms ** -beta


def l2norm(o: Options, x: np.ndarray) -> np.ndarray:
    """l2normalize_cpu: each pixel's channel vector over its norm."""
    return x / np.sqrt((x * x).sum(axis=1, keepdims=True))


def implicit(o: Options, n_: int, params) -> np.ndarray:
    """forward_implicit_layer: the learned (filters, atoms, 1) constant for every image."""
    v = np.asarray(params.weights, np.float64).reshape(1, o.int("filters", 128), o.int("atoms", 1), 1)
    return np.repeat(v, n_, axis=0)


def forward_layer(layer, x: np.ndarray, outs: list, params: dict) -> np.ndarray:
    """One layer's output from the previous layer's output ``x`` and all earlier outputs ``outs``."""
    o, kind, i = Options(layer.section), layer.kind, layer.index
    if kind == "convolutional":
        return convolutional(o, x, params[i])
    if kind == "maxpool":
        return maxpool(o, x)
    if kind == "avgpool":
        return avgpool(o, x)
    if kind == "route":
        return route(o, i, outs)
    if kind == "shortcut":
        return shortcut(o, i, x, outs)
    if kind == "upsample":
        return upsample(o, x)
    if kind == "reorg":
        return reorg(o, x)
    if kind == "scale_channels":
        return scale_channels(o, i, x, outs)
    if kind == "sam":
        return sam(o, i, x, outs)
    if kind == "softmax":
        return softmax(o, x)
    if kind == "connected":
        return connected(o, x, params[i])
    if kind == "deconvolutional":
        return deconvolutional(o, x, params[i])
    if kind == "batchnorm":
        return batchnorm(o, x, params[i])
    if kind == "local":
        return local(o, x, params[i])
    if kind == "activation":
        return activate(x, o.str("activation", "linear"))
    if kind == "logistic":
        return logistic(x)
    if kind == "crop":
        return crop(o, x)
    if kind == "local_avgpool":
        return local_avgpool(o, x)
    if kind == "reorg3d":
        return reorg3d(o, x)
    if kind == "l2norm":
        return l2norm(o, x)
    if kind == "normalization":
        return normalization(o, x)
    if kind in ("implicit", "implicit_add", "implicit_mul"):
        return implicit(o, x.shape[0], params[i])
    if kind in ("dropout", "yolo", "region", "gaussian_yolo", "detection", "empty", "cost"):
        return x
    raise NotImplementedError(f"layer kind [{kind}]")


def forward(layers: list, params: dict, blob: np.ndarray) -> list:
    """Every layer's output (float64 NCHW) for an NCHW ``blob``; ``params`` is ``load_weights``' dict."""
    x = np.asarray(blob, np.float64)
    if x.ndim == 3:
        x = x[None]
    outs: list = []
    for layer in layers:
        x = forward_layer(layer, x, outs, params)
        outs.append(x)
    return outs


def outputs(layers: list, outs: list) -> list:
    """What ``Detector.forward`` returns: each head layer's input, else the last layer's output."""
    heads = [l for l in layers if l.kind in ("yolo", "region", "gaussian_yolo", "detection")]
    if not heads:
        return [outs[-1]]
    return [outs[l.index - 1] for l in heads]
