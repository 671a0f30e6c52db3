"""Load and save Darknet ``.weights`` files: header, then each convolution's parameters in cfg order.

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
    """Raw Darknet parameters of one convolutional layer (batchnorm not yet folded)."""

    biases: np.ndarray
    weights: np.ndarray              # (filters, channels // groups, size, size)
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


def conv_param_count(layer) -> int:
    """Number of float32 values a conv layer reads from the weights file."""
    p = layer.p
    n = p["filters"]
    return n * (4 if p["bn"] else 1) + n * (p["in_c"] // p["groups"]) * p["size"] ** 2


def param_count(layer) -> int:
    """Number of float32 values ``layer`` reads from the weights file (0: it has no parameters)."""
    if layer.kind == "convolutional":
        return conv_param_count(layer)
    if layer.kind == "shortcut":
        return layer.p.get("nweights", 0)   # AlexeyAB's weights_type: load_shortcut_weights
    return 0


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
    """Return ``{layer index: ConvParams}`` for every convolutional layer (and ``{index: float32 array}``
    for each weighted [shortcut]), validating the exact size.

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
        if l.kind == "shortcut":
            sw = take(param_count(l)).copy()
            if not np.all(np.isfinite(sw)):
                raise WeightsError(f"{path}: layer {l.index} [shortcut] (line {l.section.line}) has non-finite weights")
            out[l.index] = sw
            continue
        q = l.p
        n = q["filters"]
        biases = take(n)
        scales = mean = variance = None
        if q["bn"]:
            scales, mean, variance = take(n), take(n), take(n)
        w = take(n * (q["in_c"] // q["groups"]) * q["size"] ** 2).reshape(n, q["in_c"] // q["groups"], q["size"], q["size"])
        cp = ConvParams(biases, w, scales, mean, variance)
        for name, arr in (("biases", biases), ("weights", w), ("scales", scales), ("mean", mean), ("variance", variance)):
            if arr is not None and not np.all(np.isfinite(arr)):
                raise WeightsError(f"{path}: layer {l.index} [convolutional] (line {l.section.line}) has non-finite {name}")
        if variance is not None and np.any(variance < 0):
            raise WeightsError(f"{path}: layer {l.index} [convolutional] (line {l.section.line}) has negative variance")
        out[l.index] = cp
    return out


def save_weights(path: Union[str, Path], layers: list, params: dict, seen: int = 0) -> None:
    """Write ``params`` ({conv layer index: ConvParams}) as a Darknet weights file, format 0.2.0 with a
    64-bit ``seen`` as both Darknets' save_weights do: biases, then scales, mean and variance
    with batchnorm, then the weights, layer by layer in cfg order. Written to a temporary file and
    renamed, so a failed write leaves no half-written file."""
    p = Path(path)
    name = show(str(path), 300)
    chunks = [np.array([0, 2, 0], "<i4").tobytes(), np.array([seen], "<u8").tobytes()]
    for l in layers:
        if not param_count(l):
            continue
        cp = params.get(l.index)
        if cp is None:
            raise WeightsError(f"{name}: no parameters given for layer {l.index} [{l.kind}]")
        if l.kind == "shortcut":
            if np.shape(cp) != (param_count(l),):
                raise WeightsError(f"{name}: layer {l.index} [shortcut] weights have shape {np.shape(cp)}, "
                                   f"not ({param_count(l)},)")
            chunks.append(np.ascontiguousarray(cp, "<f4").tobytes())
            continue
        q = l.p
        shape = (q["filters"], q["in_c"] // q["groups"], q["size"], q["size"])
        parts = [("biases", cp.biases, (q["filters"],))]
        if q["bn"]:
            parts += [(k, getattr(cp, k), (q["filters"],)) for k in ("scales", "mean", "variance")]
        parts.append(("weights", cp.weights, shape))
        for what, arr, want in parts:
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
