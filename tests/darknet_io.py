"""Self-contained Darknet helpers for tests (numpy only; never imports yolo_cl).

* ``parse_cfg`` / ``layer_shapes``: a small cfg parser and shape tracker
  (convolutional, connected, batchnorm, maxpool incl. maxpool_depth, avgpool,
  route incl. groups/group_id, shortcut, upsample, reorg, scale_channels, sam,
  dropout, softmax, yolo, region, ...).
* ``weights_size``: exact byte size of a ``.weights`` file for a cfg.
* ``write_random_weights``: random but numerically tame weights.
* ``forward_numpy``: a plain NumPy forward pass (a second, independent
  reference; it is also what calibrates the random weights).

Darknet ``.weights`` layout::

    int32 major, minor, revision
    seen: uint64 if (major*10 + minor) >= 2 and major < 1000 and minor < 1000 else uint32
    per [convolutional], in cfg order:
        biases[filters]
        if batch_normalize: scales[filters], rolling_mean[filters], rolling_variance[filters]
        weights[filters * (c / groups) * size * size]
    per [connected]: biases[out], weights[out * in], then (if batch_normalize)
        scales, rolling_mean, rolling_variance
    per [batchnorm]: scales[c], rolling_mean[c], rolling_variance[c]

How the random weights stay O(1) (and input dependent): a fixed-variance
(He-style) init does not work for these nets: conv inputs have large positive
means (post leaky/mish/swish), so a random filter's output is dominated by a
per-channel constant; non-homogeneous activations and positively correlated
shortcut inputs then inflate the scale by ~1.1-1.5x per layer (yolov7 reached
|x| ~ 600 at 128 px, its logistic heads saturated).  So the writer runs the
network layer by layer in NumPy on two synthetic calibration images (1/f
"natural" noise and uniform noise, 256x256) and, for every conv:

1. draws N(0, 1) weights and (except for the first conv) projects out each
   filter's response to the per-channel means of its input
   (w_f -= (w_f.u/|u|^2) u, u = fan-in vector of channel means), so outputs
   carry no large per-channel constants that BN statistics would have to
   cancel exactly (without this, yolov4 on dog.jpg at 416 reached ~1e4);
2. rescales the weights so the conv output has unit std;
3. BN: rolling_mean = observed per-channel mean + N(0, 0.1) * sd,
   rolling_variance = one layer-wide variance * U(0.5, 2) (per-channel
   variances from a small batch overfit it), scales ~ U(0.5, 1.5),
   biases ~ N(0, 0.1);  no BN (the heads): biases centre each channel
   (+ N(0, 0.5)).

Result (forward_numpy): every layer's rms is ~0.3-5 and heads |x| < ~15 for
all bundled cfgs, on uniform noise and on photos, at 128..608 px.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "parse_cfg",
    "layer_shapes",
    "weights_size",
    "header_size",
    "write_random_weights",
    "cached_random_weights",
    "read_weights",
    "forward_numpy",
    "activate",
    "LayerInfo",
]

BN_EPS = 1e-6  # darknet: sqrt(variance + .000001f)


# --------------------------------------------------------------------------
# cfg parsing
# --------------------------------------------------------------------------

def parse_cfg(cfg_path: str) -> list[tuple[str, dict[str, str]]]:
    """Return [(section_name, {key: value})] in file order, [net] included.

    Mirrors Darknet's reader: lines starting with '#' or ';' are comments,
    all whitespace is removed, and (like atoi/atof stopping at garbage) inline
    '#' comments after a value are dropped.
    """
    sections: list[tuple[str, dict[str, str]]] = []
    with open(cfg_path, "r", encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = re.sub(r"\s+", "", raw)
            if not line or line[0] in "#;":
                continue
            if line[0] == "[":
                end = line.find("]")
                sections.append((line[1:end].lower(), {}))
                continue
            if "=" not in line:
                continue
            if not sections:
                raise ValueError(f"{cfg_path}: option outside a section: {raw!r}")
            key, val = line.split("=", 1)
            sections[-1][1][key] = val.split("#", 1)[0]
    if not sections or sections[0][0] not in ("net", "network"):
        raise ValueError(f"{cfg_path}: first section must be [net]")
    return sections


def _i(opts: dict, key: str, default: int) -> int:
    v = opts.get(key)
    if v is None or v == "":
        return default
    return int(float(v))


def _f(opts: dict, key: str, default: float) -> float:
    v = opts.get(key)
    if v is None or v == "":
        return default
    return float(v)


def _ints(opts: dict, key: str) -> list[int]:
    v = opts.get(key, "")
    return [int(x) for x in v.split(",") if x != ""]


def _abs_index(i: int, ref: int) -> int:
    return ref + i if i < 0 else i


# --------------------------------------------------------------------------
# shape tracking
# --------------------------------------------------------------------------

@dataclass
class LayerInfo:
    index: int                 # darknet layer index ([net] excluded)
    type: str                  # section name
    opts: dict
    in_shape: tuple            # (c, h, w) of the previous layer's output
    out_shape: tuple           # (c, h, w)
    params: list = field(default_factory=list)  # [(name, count)] in file order


_CONV = ("convolutional", "conv")
_CONN = ("connected", "conn")
_PASS = ("dropout", "yolo", "region", "cost", "detection", "gaussian_yolo",
         "empty", "silence")


def _conv_geom(o: dict, c: int, h: int, w: int):
    filters = _i(o, "filters", 1)
    size = _i(o, "size", 1)
    groups = max(1, _i(o, "groups", 1))
    stride = _i(o, "stride", 1)
    sx = _i(o, "stride_x", -1)
    sy = _i(o, "stride_y", -1)
    sx = stride if sx < 1 else sx
    sy = stride if sy < 1 else sy
    dil = max(1, _i(o, "dilation", 1))
    padding = size // 2 if _i(o, "pad", 0) else _i(o, "padding", 0)
    ek = (size - 1) * dil + 1
    oh = (h + 2 * padding - ek) // sy + 1
    ow = (w + 2 * padding - ek) // sx + 1
    return dict(filters=filters, size=size, groups=groups, sx=sx, sy=sy, dil=dil,
                padding=padding, oh=oh, ow=ow)


def _pool_geom(o: dict, h: int, w: int):
    stride = _i(o, "stride", 1)
    size = _i(o, "size", stride)
    sx = _i(o, "stride_x", stride)
    sy = _i(o, "stride_y", stride)
    padding = _i(o, "padding", size - 1)
    return dict(size=size, sx=sx, sy=sy, padding=padding,
                oh=(h + padding - size) // sy + 1, ow=(w + padding - size) // sx + 1)


def layer_shapes(cfg_path: str, width: int | None = None, height: int | None = None) -> list[LayerInfo]:
    """Walk the cfg; per layer: input/output (c, h, w) and weight blocks."""
    secs = parse_cfg(cfg_path)
    net = secs[0][1]
    c = _i(net, "channels", 3)
    h = height if height is not None else _i(net, "height", 0)
    w = width if width is not None else _i(net, "width", 0)
    if _i(net, "inputs", 0) and not (h and w):
        c, h, w = _i(net, "inputs", 0), 1, 1
    cur = (c, h, w)
    layers: list[LayerInfo] = []

    for idx, (typ, o) in enumerate(secs[1:]):
        c, h, w = cur
        params: list = []
        if typ in _CONV:
            g = _conv_geom(o, c, h, w)
            if c % g["groups"]:
                raise ValueError(f"layer {idx}: channels {c} not divisible by groups {g['groups']}")
            f = g["filters"]
            params.append(("biases", f))
            if _i(o, "batch_normalize", 0):
                params += [("scales", f), ("rolling_mean", f), ("rolling_variance", f)]
            params.append(("weights", f * (c // g["groups"]) * g["size"] * g["size"]))
            cur = (f, g["oh"], g["ow"])
        elif typ in _CONN:
            outputs = _i(o, "output", 1)
            params += [("biases", outputs), ("weights", outputs * c * h * w)]
            if _i(o, "batch_normalize", 0):
                params += [("scales", outputs), ("rolling_mean", outputs), ("rolling_variance", outputs)]
            cur = (outputs, 1, 1)
        elif typ == "batchnorm":
            params += [("scales", c), ("rolling_mean", c), ("rolling_variance", c)]
        elif typ in ("maxpool", "max", "local_avgpool"):
            if _i(o, "maxpool_depth", 0):
                cur = (_i(o, "out_channels", 1), h, w)
            else:
                g = _pool_geom(o, h, w)
                cur = (c, g["oh"], g["ow"])
        elif typ in ("avgpool", "avg"):
            cur = (c, 1, 1)
        elif typ == "upsample":
            s = _i(o, "stride", 2)
            cur = (c, h // -s, w // -s) if s < 0 else (c, h * s, w * s)
        elif typ in ("reorg", "reorg3d"):
            s = _i(o, "stride", 1)
            if _i(o, "reverse", 0):
                cur = (c // (s * s), h * s, w * s)
            else:
                cur = (c * s * s, h // s, w // s)
        elif typ == "route":
            refs = [_abs_index(i, idx) for i in _ints(o, "layers")]
            groups = max(1, _i(o, "groups", 1))
            oc = sum(layers[r].out_shape[0] // groups for r in refs)
            first = layers[refs[0]].out_shape
            cur = (oc, first[1], first[2])
        elif typ == "shortcut":
            if o.get("weights_type", "none") != "none":
                raise NotImplementedError("shortcut weights_type not supported")
        elif typ in ("scale_channels", "sam"):
            cur = layers[_abs_index(_i(o, "from", -1), idx)].out_shape
        elif typ in ("softmax", "soft", "logistic", "activation") or typ in _PASS:
            pass
        else:
            raise NotImplementedError(f"layer type [{typ}] not supported by darknet_io")
        layers.append(LayerInfo(idx, typ, o, (c, h, w), cur, params))
    return layers


# --------------------------------------------------------------------------
# sizes
# --------------------------------------------------------------------------

def _seen64(major: int, minor: int) -> bool:
    return (major * 10 + minor) >= 2 and major < 1000 and minor < 1000


def header_size(major: int = 0, minor: int = 2, revision: int = 0) -> int:
    return 12 + (8 if _seen64(major, minor) else 4)


def weights_size(cfg_path: str, major: int = 0, minor: int = 2, revision: int = 0) -> int:
    """Exact byte count of a Darknet .weights file for cfg_path."""
    n = sum(cnt for L in layer_shapes(cfg_path) for _, cnt in L.params)
    return header_size(major, minor, revision) + 4 * n


# --------------------------------------------------------------------------
# NumPy forward
# --------------------------------------------------------------------------

def _softplus(x):
    # darknet uses a threshold of 20 (x above: x; below -20: exp(x)); in
    # float32 that equals log(1 + exp(x)) to rounding
    return np.logaddexp(np.float32(0), x)


def _sigmoid(x):
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


def activate(x: np.ndarray, act: str) -> np.ndarray:
    """Darknet activations (float32 in, float32 out)."""
    if act == "linear":
        return x
    if act == "leaky":
        return np.where(x > 0, x, np.float32(0.1) * x)
    if act == "relu":
        return np.maximum(x, 0)
    if act == "relu6":
        return np.clip(x, 0, 6)
    if act == "logistic":
        return _sigmoid(x).astype(np.float32)
    if act == "tanh":
        return np.tanh(x)
    if act == "mish":
        return (x * np.tanh(_softplus(x))).astype(np.float32)
    if act == "swish":
        return (x * _sigmoid(x)).astype(np.float32)
    if act == "hard_mish":
        return np.where(x > 0, x, np.where(x > -2, x * x / 2 + x, 0)).astype(np.float32)
    if act == "elu":
        return np.where(x >= 0, x, np.expm1(np.minimum(x, 0))).astype(np.float32)
    raise NotImplementedError(f"activation {act!r}")


def _conv2d(x: np.ndarray, W: np.ndarray, g: dict) -> np.ndarray:
    """x (N,C,H,W) float32, W (F, C/groups, k, k) -> (N,F,oh,ow), no bias."""
    N, C, H, Wd = x.shape
    F, Cg, k, _ = W.shape
    G = g["groups"]
    p, sy, sx, d, oh, ow = g["padding"], g["sy"], g["sx"], g["dil"], g["oh"], g["ow"]
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p))) if p else x
    out = np.zeros((N, F, oh, ow), np.float32)
    Fg = F // G
    for ki in range(k):
        for kj in range(k):
            r0, c0 = ki * d, kj * d
            xs = xp[:, :, r0:r0 + (oh - 1) * sy + 1:sy, c0:c0 + (ow - 1) * sx + 1:sx]
            wk = W[:, :, ki, kj]
            if G == 1:
                out += np.einsum("fc,nchw->nfhw", wk, xs, optimize=True)
            elif Cg == 1 and Fg == 1:
                out += wk[None, :, 0, None, None] * xs
            else:
                xg = xs.reshape(N, G, Cg, oh * ow)
                wg = wk.reshape(G, Fg, Cg)
                out += np.matmul(wg, xg).reshape(N, F, oh, ow)
    return out


def _maxpool(x: np.ndarray, g: dict) -> np.ndarray:
    N, C, H, W = x.shape
    size, sy, sx, pad, oh, ow = g["size"], g["sy"], g["sx"], g["padding"], g["oh"], g["ow"]
    top = pad // 2
    bottom = max(0, (oh - 1) * sy + size - H - top)
    right = max(0, (ow - 1) * sx + size - W - top)
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (top, right)), constant_values=-np.inf)
    # separable max: rows then columns
    rows = None
    for a in range(size):
        s = xp[:, :, a:a + (oh - 1) * sy + 1:sy, :]
        rows = s if rows is None else np.maximum(rows, s)
    out = None
    for b in range(size):
        s = rows[:, :, :, b:b + (ow - 1) * sx + 1:sx]
        out = s if out is None else np.maximum(out, s)
    return np.ascontiguousarray(out)


def _reorg(x: np.ndarray, s: int, reverse: bool) -> np.ndarray:
    """Darknet's reorg_cpu(input, w, h, c, batch, stride, forward=reverse)."""
    N, C, H, W = x.shape
    out_c = C // (s * s)
    k, j, i = np.meshgrid(np.arange(C), np.arange(H), np.arange(W), indexing="ij")
    c2 = k % out_c
    off = k // out_c
    w2 = i * s + off % s
    h2 = j * s + off // s
    in_index = (i + W * (j + H * k)).ravel()
    out_index = (w2 + W * s * (h2 + H * s * c2)).ravel()
    xf = x.reshape(N, -1)
    of = np.empty_like(xf)
    if reverse:
        of[:, out_index] = xf[:, in_index]
        return of.reshape(N, out_c, H * s, W * s)
    of[:, in_index] = xf[:, out_index]
    return of.reshape(N, C * s * s, H // s, W // s)


def _bn(y: np.ndarray, p: dict) -> np.ndarray:
    s = p["scales"].astype(np.float32)
    m = p["rolling_mean"].astype(np.float32)
    v = p["rolling_variance"].astype(np.float32)
    sh = (1, -1) + (1,) * (y.ndim - 2)
    return ((y - m.reshape(sh)) / np.sqrt(v.reshape(sh) + np.float32(BN_EPS)) * s.reshape(sh)).astype(np.float32)


def _forward_layer(L: LayerInfo, x: np.ndarray, outs: list, p: dict,
                   pre_hook=None) -> np.ndarray:
    """One darknet layer. x: previous layer's output (N,C,H,W)."""
    typ, o, idx = L.type, L.opts, L.index
    if typ in _CONV or typ in _CONN:
        if typ in _CONV:
            g = _conv_geom(o, *L.in_shape)
            f = g["filters"]
            W = p["weights"].reshape(f, L.in_shape[0] // g["groups"], g["size"], g["size"])
            y = _conv2d(x, W, g)
        else:
            f = _i(o, "output", 1)
            y = (x.reshape(x.shape[0], -1) @ p["weights"].reshape(f, -1).T).reshape(x.shape[0], f, 1, 1)
        if pre_hook is not None:  # calibration: may (re)write p from y
            y = pre_hook(y, p)
        if "scales" in p:
            y = _bn(y, p)
        y = y + p["biases"].astype(np.float32).reshape(1, -1, 1, 1)
        return activate(y.astype(np.float32), o.get("activation", "logistic"))
    if typ == "batchnorm":
        return _bn(x, p)
    if typ in ("maxpool", "max"):
        if _i(o, "maxpool_depth", 0):
            oc = _i(o, "out_channels", 1)
            N, C, H, W = x.shape
            out = np.full((N, oc, H, W), -np.inf, np.float32)
            for k in range(C):
                out[:, k % oc] = np.maximum(out[:, k % oc], x[:, k])
            return out
        return _maxpool(x, _pool_geom(o, *L.in_shape[1:]))
    if typ in ("avgpool", "avg"):
        return x.mean(axis=(2, 3), keepdims=True, dtype=np.float64).astype(np.float32)
    if typ == "upsample":
        s = _i(o, "stride", 2)
        scale = np.float32(_f(o, "scale", 1.0))
        if s < 0:
            raise NotImplementedError("upsample with negative stride")
        y = x.repeat(s, axis=2).repeat(s, axis=3)
        return y * scale if scale != 1 else y
    if typ == "reorg":
        return _reorg(x, _i(o, "stride", 1), bool(_i(o, "reverse", 0)))
    if typ == "route":
        refs = [_abs_index(i, idx) for i in _ints(o, "layers")]
        groups = max(1, _i(o, "groups", 1))
        gid = _i(o, "group_id", 0)
        parts = []
        for r in refs:
            a = outs[r]
            cg = a.shape[1] // groups
            parts.append(a[:, gid * cg:(gid + 1) * cg])
        return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0].copy()
    if typ == "shortcut":
        y = x.copy()
        for r in _ints(o, "from"):
            a = outs[_abs_index(r, idx)]
            if a.shape != y.shape:
                raise NotImplementedError(f"shortcut of mismatched shapes {a.shape} vs {y.shape}")
            y += a
        return activate(y, o.get("activation", "linear"))
    if typ == "scale_channels":
        a = outs[_abs_index(_i(o, "from", -1), idx)]
        return (a * x).astype(np.float32)
    if typ == "sam":
        a = outs[_abs_index(_i(o, "from", -1), idx)]
        return (a * x).astype(np.float32)
    if typ in ("softmax", "soft"):
        groups = max(1, _i(o, "groups", 1))
        N = x.shape[0]
        xf = x.reshape(N, groups, -1).astype(np.float64)
        e = np.exp(xf - xf.max(axis=2, keepdims=True))
        return (e / e.sum(axis=2, keepdims=True)).astype(np.float32).reshape(x.shape)
    if typ == "logistic":
        return activate(x, "logistic")
    if typ in _PASS:
        return x  # dropout = identity at inference; yolo/region: raw head input
    raise NotImplementedError(f"forward of [{typ}]")


def read_weights(cfg_path: str, weights_path: str) -> tuple[tuple[int, int, int], list[dict]]:
    """((major, minor, revision), per-layer {param name: float32 array})."""
    layers = layer_shapes(cfg_path)
    with open(weights_path, "rb") as f:
        major, minor, revision = (int(v) for v in np.frombuffer(f.read(12), "<i4"))
        f.read(8 if _seen64(major, minor) else 4)
        data = np.frombuffer(f.read(), "<f4")
    pos = 0
    out = []
    for L in layers:
        p = {}
        for name, cnt in L.params:
            if pos + cnt > data.size:
                raise ValueError(f"{weights_path}: truncated at layer {L.index} ({L.type})")
            p[name] = data[pos:pos + cnt]
            pos += cnt
        out.append(p)
    if pos != data.size:
        raise ValueError(f"{weights_path}: {data.size - pos} trailing floats")
    return (major, minor, revision), out


def forward_numpy(cfg_path: str, weights_path: str, blob: np.ndarray,
                  keep: str | list[int] = "all") -> dict[int, np.ndarray]:
    """Run the net in NumPy on an NCHW float32 blob at any size.

    Returns {darknet layer index: output} for keep="all", "heads" (the raw
    inputs of [yolo]/[region] layers, or the last layer's output if there are
    none) or a list of indices.  [yolo]/[region]/[dropout] outputs are their
    inputs (the head decoding is not modelled).
    """
    x = np.ascontiguousarray(blob, dtype=np.float32)
    if x.ndim == 3:
        x = x[None]
    layers = layer_shapes(cfg_path, width=x.shape[3], height=x.shape[2])
    if layers and x.shape[1] != layers[0].in_shape[0]:
        raise ValueError(f"blob has {x.shape[1]} channels, cfg wants {layers[0].in_shape[0]}")
    _, params = read_weights(cfg_path, weights_path)
    heads = [L.index - 1 for L in layers if L.type in ("yolo", "region")]
    if keep == "heads":
        want = set(heads) if heads else {len(layers) - 1}
    elif keep == "all":
        want = set(range(len(layers)))
    else:
        want = set(keep)
    last_use = {}
    for L in layers:
        refs = []
        if L.type == "route":
            refs = _ints(L.opts, "layers")
        elif L.type == "shortcut":
            refs = _ints(L.opts, "from")
        elif L.type in ("scale_channels", "sam"):
            refs = [_i(L.opts, "from", -1)]
        for r in refs:
            last_use[_abs_index(r, L.index)] = L.index
    outs: list = []
    for L in layers:
        y = _forward_layer(L, x, outs, params[L.index])
        outs.append(y)
        x = y
        # free what is no longer needed
        for j in range(max(0, L.index - 1)):
            if outs[j] is not None and j not in want and last_use.get(j, -1) <= L.index:
                outs[j] = None
    return {j: outs[j] for j in sorted(want)}


# --------------------------------------------------------------------------
# random weights
# --------------------------------------------------------------------------

def _pink(c: int, h: int, w: int, rng, alpha: float = 1.0) -> np.ndarray:
    """1/f^alpha noise (natural-image-like spectrum), colour-correlated, in [0, 1]."""
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    f = np.sqrt(fx * fx + fy * fy)
    f[0, 0] = 1.0
    amp = f ** -alpha
    amp[0, 0] = 0.0
    base = np.fft.irfft2(amp * np.exp(2j * np.pi * rng.random((h, fx.shape[1]))), s=(h, w))
    img = np.empty((c, h, w))
    for k in range(c):  # channels share most of their structure, like RGB
        own = np.fft.irfft2(amp * np.exp(2j * np.pi * rng.random((h, fx.shape[1]))), s=(h, w))
        img[k] = 0.8 * base / base.std() + 0.45 * own / own.std()
    lo, hi = np.percentile(img, [1, 99])
    return np.clip((img - lo) / (hi - lo), 0, 1).astype(np.float32)


def _calibration_batch(c: int, h: int, w: int, seed: int, n: int = 2) -> np.ndarray:
    """Synthetic calibration images in [0, 1]: 1/f ("natural") noise, then
    uniform noise (the two input kinds tests feed)."""
    rng = np.random.default_rng(seed + 7919)
    imgs = [_pink(c, h, w, rng), rng.random((c, h, w), dtype=np.float32)]
    return np.stack(imgs[:n]).astype(np.float32)


def _r4(a):
    """Round to 4 significant digits (makes files robust to BLAS summation order)."""
    a = np.asarray(a, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.floor(np.log10(np.abs(a)))
    e = np.where(np.isfinite(e), e, 0)
    q = 10.0 ** (e - 3)
    return np.round(a / q) * q


def _project_out_means(wflat: np.ndarray, x: np.ndarray, L: LayerInfo) -> None:
    """Make every filter blind to its input channels' (calibration) means:
    w_f -= (w_f . u / |u|^2) u, with u the fan-in vector of per-channel means.

    Post-activation inputs have large positive means; a random filter's
    response to them is a per-channel constant that dominates its output and,
    on inputs whose means differ from the calibration data (real photos),
    becomes an offset that BN cannot remove and that deep stacks amplify
    (yolov4 on dog.jpg reached |x| ~ 1e4).  In place on wflat."""
    g = _conv_geom(L.opts, *L.in_shape)
    G, k, F = g["groups"], g["size"], g["filters"]
    C = L.in_shape[0]
    Cg, Fg = C // G, F // G
    if Cg * k * k < 4:
        return
    mu = _r4(x.mean(axis=(0, 2, 3), dtype=np.float64))
    W = wflat.reshape(G, Fg, Cg * k * k)
    U = np.repeat(mu.reshape(G, Cg), k * k, axis=1)          # (G, Cg*k*k)
    nrm = (U * U).sum(axis=1, keepdims=True)                  # (G, 1)
    ok = nrm[:, 0] > 1e-12
    if not ok.any():
        return
    coef = np.matmul(W, U.astype(np.float32)[:, :, None])[:, :, 0] / np.where(nrm > 1e-12, nrm, 1.0)
    coef = (coef * ok[:, None]).astype(np.float32)                  # (G, Fg)
    W -= coef[:, :, None] * U.astype(np.float32)[:, None, :]


def write_random_weights(cfg_path: str, out_path: str, seed: int = 0,
                         major: int = 0, minor: int = 2, revision: int = 0,
                         calib_size: int = 256, seen: int = 0) -> str:
    """Write a Darknet .weights file for cfg_path with random, O(1)-activation
    values (data-dependent init, see the module docstring).

    calib_size: side of the synthetic calibration images (rounded up to a
    multiple of 32).  Takes ~1-10 s of CPU per big cfg (use
    cached_random_weights in tests).  Deterministic for a given seed on one
    machine; calibration statistics are rounded to 4 significant digits so
    other BLAS builds give the same bytes except in rare rounding-boundary
    cases.  Returns out_path.
    """
    rng = np.random.default_rng(seed)
    net = parse_cfg(cfg_path)[0][1]
    s = max(32, -(-int(calib_size) // 32) * 32)
    layers = layer_shapes(cfg_path, width=s, height=s)
    c0 = _i(net, "channels", 3)
    x = _calibration_batch(c0, s, s, seed)
    outs: list = []
    blocks: list[np.ndarray] = []

    for L in layers:
        p: dict[str, np.ndarray] = {}
        bn = "scales" in dict(L.params)
        if L.type in _CONV or L.type in _CONN:
            cnt = dict(L.params)
            wcount = cnt["weights"]
            p["weights"] = rng.standard_normal(wcount, dtype=np.float32)
            p["biases"] = rng.normal(0.0, 0.1, cnt["biases"]).astype(np.float32)
            if bn:
                f = cnt["scales"]
                p["scales"] = rng.uniform(0.5, 1.5, f).astype(np.float32)
                jitter_m = rng.normal(0.0, 0.1, f)
                jitter_v = rng.uniform(0.5, 2.0, f)
            else:
                jitter_b = rng.normal(0.0, 0.5, cnt["biases"])

            if L.type in _CONV and L.index > 0:
                # not for the first conv: the image's mean colour is signal,
                # and a mean-blind first layer is a high-pass filter that
                # leaves smooth photos almost no energy (yolov7 collapsed)
                _project_out_means(p["weights"], x, L)

            def hook(y, p, bn=bn):
                sd = float(y.std(dtype=np.float64))
                k = float(_r4(1.0 / sd)) if sd > 0 else 1.0
                p["weights"] *= np.float32(k)
                y = y * np.float32(k)
                m = y.mean(axis=(0, 2, 3), dtype=np.float64)
                v = y.var(axis=(0, 2, 3), dtype=np.float64)
                if bn:
                    # per-channel mean, but one layer-wide variance: per-channel
                    # variances from a small batch overfit it (channels that
                    # happened to be flat get huge gains on other inputs)
                    vg = max(float(v.mean()), 1e-3)
                    p["rolling_mean"] = _r4(m + jitter_m * np.sqrt(vg)).astype(np.float32)
                    p["rolling_variance"] = _r4(vg * jitter_v).astype(np.float32)
                else:
                    p["biases"] = _r4(-m + jitter_b).astype(np.float32)
                return y

            y = _forward_layer(L, x, outs, p, pre_hook=hook)
        elif L.type == "batchnorm":
            c = L.in_shape[0]
            m = x.mean(axis=(0, 2, 3), dtype=np.float64)
            v = np.maximum(x.var(axis=(0, 2, 3), dtype=np.float64), 1e-3)
            p["scales"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
            p["rolling_mean"] = _r4(m + rng.normal(0, 0.1, c) * np.sqrt(v)).astype(np.float32)
            p["rolling_variance"] = _r4(v * rng.uniform(0.5, 2.0, c)).astype(np.float32)
            y = _forward_layer(L, x, outs, p)
        else:
            y = _forward_layer(L, x, outs, p)
        for name, _ in L.params:
            blocks.append(np.asarray(p[name], dtype="<f4"))
        outs.append(y)
        x = y

    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "wb") as f:
        f.write(np.array([major, minor, revision], dtype="<i4").tobytes())
        f.write(np.array([seen], dtype="<u8" if _seen64(major, minor) else "<u4").tobytes())
        for a in blocks:
            f.write(a.tobytes())
    return out_path


GENERATOR_VERSION = 4  # bump when write_random_weights' output changes


def cached_random_weights(cfg_path: str, cache_dir: str | None = None, seed: int = 0,
                          major: int = 0, minor: int = 2, revision: int = 0) -> str:
    """write_random_weights into a cache keyed by (cfg content, seed, header,
    generator version); returns the path.  cache_dir defaults to
    $YOLO_CL_WEIGHTS_CACHE or <tmp>/yolo-cl-random-weights.  Safe for
    concurrent test workers (atomic rename)."""
    import hashlib
    import tempfile

    if cache_dir is None:
        cache_dir = os.environ.get("YOLO_CL_WEIGHTS_CACHE") or os.path.join(
            tempfile.gettempdir(), "yolo-cl-random-weights")
    with open(cfg_path, "rb") as f:
        h = hashlib.sha256(f.read())
    h.update(f"|seed={seed}|v={major}.{minor}.{revision}|gen={GENERATOR_VERSION}".encode())
    base = os.path.splitext(os.path.basename(cfg_path))[0]
    path = os.path.join(cache_dir, f"{base}-{h.hexdigest()[:16]}.weights")
    if os.path.exists(path) and os.path.getsize(path) == weights_size(cfg_path, major, minor, revision):
        return path
    os.makedirs(cache_dir, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    write_random_weights(cfg_path, tmp, seed=seed, major=major, minor=minor, revision=revision)
    os.replace(tmp, path)
    return path


if __name__ == "__main__":  # pragma: no cover
    import sys
    import time

    for path in sys.argv[1:]:
        t = time.time()
        out = "/tmp/" + os.path.basename(path) + ".weights"
        write_random_weights(path, out)
        print(path, "bytes", weights_size(path), os.path.getsize(out), f"{time.time() - t:.1f}s")
