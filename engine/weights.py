"""Load and save Darknet ``.weights`` files: header, then each weighted layer's parameters in cfg order.

The expected byte count is computed from the layers first, so a truncated, oversized
or mismatched file is rejected with a message naming the layer before anything is read.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np

from .cfg import regular_file_size, show
from .errors import WeightsError
from .limits import check_weights


@dataclass
class ConvParams:
    """Raw Darknet parameters of one weighted layer (batchnorm not yet folded)."""

    biases: np.ndarray
    weights: np.ndarray              # conv (filters, channels // groups, size, size); see read_layer for others
    scales: Optional[np.ndarray] = None
    mean: Optional[np.ndarray] = None
    variance: Optional[np.ndarray] = None


@dataclass
class Header:
    """A weights file's header: format version, images seen in training, and the size of ``seen``."""

    major: int
    minor: int
    revision: int
    seen: int
    wide_seen: bool = True   # ``seen`` stored as 64 bits (else 32)

    @property
    def nbytes(self) -> int:
        return 12 + (8 if self.wide_seen else 4)

    @property
    def transpose(self) -> bool:
        """Darknet's flag (major or minor > 1000): [connected] weights are stored transposed."""
        return self.major > 1000 or self.minor > 1000


def seen_is_wide(major: int, minor: int) -> bool:
    """Darknet stores ``seen`` as 64-bit from format 0.2 on (major*10+minor >= 2, pjreddie's rule, which
    also says a transposed header (major or minor > 1000) has a 32-bit ``seen``)."""
    return major * 10 + minor >= 2 and major < 1000 and minor < 1000


def param_count(layer) -> int:
    """Number of float32 values a layer reads from the weights file (0 for layers without parameters)."""
    p, kind = layer.p, layer.kind
    if kind == "convolutional":
        n = p["filters"]
        return n * (4 if p["bn"] else 1) + n * (p["in_c"] // p["groups"]) * p["size"] ** 2
    if kind == "deconvolutional":
        n = p["filters"]
        return n * (4 if p["bn"] else 1) + n * p["in_c"] * p["size"] ** 2
    if kind == "connected":
        n = p["outputs"]
        return n * (4 if p["bn"] else 1) + n * p["inputs"]
    if kind == "batchnorm":
        return 4 * layer.c
    if kind == "local":
        return layer.c * layer.h * layer.w * (1 + p["in_c"] * p["size"] ** 2)
    if kind in ("implicit", "implicit_add", "implicit_mul"):
        return p["filters"] * p["atoms"]
    if kind == "shortcut":
        return p.get("nweights", 0)   # AlexeyAB's weights_type: load_shortcut_weights
    return 0


def read_layer(layer, take, transpose: bool) -> ConvParams:
    """One layer's parameters, in Darknet's order (load_*_weights in parser.c), from ``take(n)``.

    - [convolutional]/[deconvolutional]: biases, [scales, mean, variance], weights; a deconvolution's
      weights are (channels, filters, size, size), as its col2im GEMM reads them;
    - [connected]: biases, weights (outputs, inputs) — stored (inputs, outputs) when the header's
      ``transpose`` flag is set — then [scales, mean, variance];
    - [local]: a bias per output element (filters, out_h, out_w), then weights
      (out_h * out_w, filters, channels, size, size): one filter bank per output pixel;
    - [batchnorm]: biases, scales, mean, variance (AlexeyAB's order; pjreddie's fork stores no biases);
    - [implicit*]: the (filters, atoms) constant, in ``weights``;
    - a weighted [shortcut] (AlexeyAB's weights_type): its (inputs) or (inputs * channels) factors,
      in ``weights`` (load_shortcut_weights).
    """
    p, kind = layer.p, layer.kind
    if kind in ("implicit", "implicit_add", "implicit_mul"):
        return ConvParams(np.zeros(0, np.float32), take(p["filters"] * p["atoms"]))
    if kind == "shortcut":
        return ConvParams(np.zeros(0, np.float32), take(p["nweights"]))
    if kind == "local":
        n, k = p["filters"], p["in_c"] * p["size"] ** 2
        return ConvParams(take(n * layer.h * layer.w), take(layer.h * layer.w * n * k).reshape(layer.h * layer.w, n, k))
    if kind == "batchnorm":
        return ConvParams(take(layer.c), np.zeros(0, np.float32), take(layer.c), take(layer.c), take(layer.c))
    n = p["outputs"] if kind == "connected" else p["filters"]
    biases = take(n)
    scales = mean = variance = None
    if kind == "connected":
        if transpose:
            w = take(n * p["inputs"]).reshape(p["inputs"], n).T.copy()
        else:
            w = take(n * p["inputs"]).reshape(n, p["inputs"])
    if p["bn"]:
        scales, mean, variance = take(n), take(n), take(n)
    if kind == "convolutional":
        w = take(n * (p["in_c"] // p["groups"]) * p["size"] ** 2).reshape(n, p["in_c"] // p["groups"], p["size"], p["size"])
    elif kind == "deconvolutional":
        w = take(n * p["in_c"] * p["size"] ** 2).reshape(p["in_c"], n, p["size"], p["size"])
    return ConvParams(biases, w, scales, mean, variance)


def needs_weights(layers: list) -> bool:
    """True if any layer has parameters: a route/shortcut/upsample/maxpool-only network needs no file."""
    return any(param_count(l) for l in layers)


def read_header(path: Union[str, Path], size: Optional[int] = None, params: Optional[int] = None) -> Header:
    """Read and sanity-check the header of a weights file.

    A transposed header (major or minor > 1000) has a 32-bit ``seen`` in pjreddie's Darknet
    and a 64-bit one in AlexeyAB's (which tests only major*10+minor >= 2): given the file's
    ``size`` and the cfg's float count ``params``, the width that makes the sizes agree is taken."""
    name = show(str(path), 300)
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError as e:
        raise WeightsError(f"{name}: cannot read weights file ({e.strerror})") from None
    if len(head) < 16:
        raise WeightsError(f"{name}: {len(head)} bytes is too short for a Darknet weights header")
    major, minor, revision = (int(v) for v in np.frombuffer(head[:12], "<i4"))
    if not (0 <= major < 1 << 16 and 0 <= minor < 1 << 16 and revision >= 0):
        raise WeightsError(f"{name}: header version {major}.{minor}.{revision} is not a Darknet weights file")
    wide = seen_is_wide(major, minor)
    if (major > 1000 or minor > 1000) and size is not None and params is not None:
        wide = size == 20 + 4 * params
    h = Header(major, minor, revision, 0, wide)
    if h.wide_seen and len(head) < 20:
        raise WeightsError(f"{name}: truncated in the header")
    h.seen = int(np.frombuffer(head[12:20], "<u8")[0] if h.wide_seen else np.frombuffer(head[12:16], "<u4")[0])
    return h


def load_weights(path: Union[str, Path], layers: list) -> dict:
    """Return ``{layer index: ConvParams}`` for every weighted layer, validating the exact size.

    Any header Darknet writes is read (:func:`read_header`); ``header.transpose`` says how a
    [connected] layer's matrix is laid out."""
    p = Path(path)
    path = show(str(path), 300)
    actual = regular_file_size(p, path, WeightsError, "weights file")
    weighted = [l for l in layers if param_count(l)]
    header = read_header(p, actual, sum(param_count(l) for l in weighted))
    expected = header.nbytes + 4 * sum(param_count(l) for l in weighted)
    check_weights(expected, path)   # before any read: a cfg asking for 10^12 floats stops here
    actual = p.stat().st_size
    if actual != expected:
        # Name the first layer the file cannot fully supply (or say how much is left over).
        offset, missing = header.nbytes, None
        for l in weighted:
            offset += 4 * param_count(l)
            if offset > actual:
                missing = l
                break
        if missing is not None:
            raise WeightsError(f"{path}: truncated: {actual} bytes, but the cfg needs {expected}; "
                               f"data ends inside layer {missing.index} [{missing.kind}] (line {missing.section.line})")
        raise WeightsError(f"{path}: {actual} bytes, but the cfg needs exactly {expected}: "
                           f"{actual - expected} extra bytes; the weights do not match this cfg")
    try:
        data = np.fromfile(p, dtype="<f4", offset=header.nbytes)
    except OSError as e:
        raise WeightsError(f"{path}: cannot read weights file ({e.strerror})") from None
    if 4 * data.size != expected - header.nbytes:   # the file changed while we read it
        raise WeightsError(f"{path}: changed size while being read")
    out: dict = {}
    pos = 0

    def take(n: int) -> np.ndarray:
        nonlocal pos
        pos += n
        return data[pos - n:pos]

    for l in weighted:
        cp = read_layer(l, take, header.transpose)
        where = f"{path}: layer {l.index} [{l.kind}] (line {l.section.line})"
        for name in ("biases", "weights", "scales", "mean", "variance"):
            arr = getattr(cp, name)
            if arr is not None and not np.all(np.isfinite(arr)):
                raise WeightsError(f"{where} has non-finite {name}")
        if cp.variance is not None and np.any(cp.variance < 0):
            raise WeightsError(f"{where} has negative variance")
        out[l.index] = cp
    return out


def layer_arrays(layer, cp: ConvParams) -> list:
    """``(name, array, shape)`` of one layer's parameters in the order Darknet writes them (the
    inverse of :func:`read_layer`, non-transposed [connected] matrices)."""
    p, kind = layer.p, layer.kind
    if kind in ("implicit", "implicit_add", "implicit_mul"):
        return [("weights", cp.weights, (p["filters"] * p["atoms"],))]
    if kind == "shortcut":
        return [("weights", cp.weights, (p["nweights"],))]
    if kind == "local":
        n, k, hw = p["filters"], p["in_c"] * p["size"] ** 2, layer.h * layer.w
        return [("biases", cp.biases, (n * hw,)), ("weights", cp.weights, (hw, n, k))]
    if kind == "batchnorm":
        return [(k, getattr(cp, k), (layer.c,)) for k in ("biases", "scales", "mean", "variance")]
    n = p["outputs"] if kind == "connected" else p["filters"]
    bn = [(k, getattr(cp, k), (n,)) for k in ("scales", "mean", "variance")] if p["bn"] else []
    if kind == "connected":
        return [("biases", cp.biases, (n,)), ("weights", cp.weights, (n, p["inputs"]))] + bn
    if kind == "deconvolutional":
        shape = (p["in_c"], n, p["size"], p["size"])
    else:
        shape = (n, p["in_c"] // p["groups"], p["size"], p["size"])
    return [("biases", cp.biases, (n,))] + bn + [("weights", cp.weights, shape)]


def save_weights(path: Union[str, Path], layers: list, params: dict, seen: int = 0) -> None:
    """Write ``params`` ({layer index: ConvParams}) as a Darknet weights file, format 0.2.0 with a
    64-bit ``seen`` as both Darknets' save_weights do, each weighted layer's parameters in
    Darknet's order (:func:`layer_arrays`). Written to a temporary file and renamed, so a failed
    write leaves no half-written file."""
    p = Path(path)
    name = show(str(path), 300)
    chunks = [np.array([0, 2, 0], "<i4").tobytes(), np.array([seen], "<u8").tobytes()]
    for l in layers:
        if not param_count(l):
            continue
        cp = params.get(l.index)
        if cp is None:
            raise WeightsError(f"{name}: no parameters given for layer {l.index} [{l.kind}]")
        for what, arr, want in layer_arrays(l, cp):
            if arr is None or np.shape(arr) != want:
                raise WeightsError(f"{name}: layer {l.index} [{l.kind}] {what} have shape "
                                   f"{None if arr is None else np.shape(arr)}, not {want}")
            chunks.append(np.ascontiguousarray(arr, "<f4").tobytes())
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for c in chunks:
                f.write(c)
        os.replace(tmp, p)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise WeightsError(f"{name}: cannot write weights file ({e.strerror})") from None
