"""Refuse a model that cannot fit before anything is allocated for it.

A cfg downloaded from anywhere can ask for a 65536-channel layer at 16384x16384, or a
weights file of 10^12 floats. Every such request is turned into a :class:`LimitError`
naming the layer and the bytes it would need, instead of an allocation that takes the
machine down. The estimate is deliberately simple: activations + weights + im2col
workspace, from the shapes alone.

The cap is ``YOLO_CL_MAX_BYTES`` if set (bytes, or with a K/M/G/T suffix), else the
device's global memory when a device is known, else :data:`DEFAULT_MAX_BYTES`.
Kernels index with 32-bit integers, so no single buffer may exceed 2^31 elements either.
"""
from __future__ import annotations

import os
import re
from typing import Optional

from .errors import LimitError

DEFAULT_MAX_BYTES = 16 << 30
ENV_VAR = "YOLO_CL_MAX_BYTES"
INT32_MAX = 2**31 - 1
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def max_bytes(device=None) -> int:
    """The memory cap in bytes: the env var, else the device's global memory, else 16 GiB."""
    raw = os.environ.get(ENV_VAR, "").strip()
    if raw:
        text = raw.upper().removesuffix("IB").removesuffix("B")
        unit = text[-1:] if text[-1:] in _SUFFIX else ""
        try:
            value = float(text[:len(text) - len(unit)]) * _SUFFIX[unit]
        except ValueError:
            raise LimitError(f"{ENV_VAR}='{raw[:40]}' is not a size (e.g. 8G or 8589934592)") from None
        if not value > 0 or value == float("inf"):
            raise LimitError(f"{ENV_VAR}='{raw[:40]}' must be a positive size")
        return int(value)
    if device is not None:
        try:
            return int(device.global_mem_size)
        except Exception:   # a device object without the query: fall back to the default cap
            pass
    return DEFAULT_MAX_BYTES


def gib(nbytes: int) -> str:
    """Human-readable size for messages."""
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):.1f} GiB"
    return f"{nbytes / (1 << 20):.1f} MiB"


def cap_source(device=None) -> str:
    """Where the cap came from, for messages."""
    if os.environ.get(ENV_VAR, "").strip():
        return f"{ENV_VAR}"
    if device is not None:
        return f"global memory of {getattr(device, 'name', 'the device').strip()}; set {ENV_VAR} to change"
    return f"default cap; set {ENV_VAR} to change"


def layer_bytes(layer, batch: int = 1, itemsize: int = 4) -> dict:
    """Bytes one layer needs on its own: its output, its weights and its im2col scratch."""
    out = layer.c * layer.h * layer.w * batch
    weights = workspace = 0
    if layer.kind == "convolutional":
        p = layer.p
        k = (p["in_c"] // p["groups"]) * p["size"] ** 2
        weights = p["filters"] * k + p["filters"] * (4 if p["bn"] else 1)
        workspace = batch * p["groups"] * k * layer.h * layer.w   # im2col, which any conv may be tuned to
    return {"activations": out * itemsize, "weights": weights * 4, "workspace": workspace * itemsize,
            "elements": max(out, workspace)}


def check_layer(layer, cap: Optional[int] = None, batch: int = 1, itemsize: int = 4) -> None:
    """Raise LimitError if one layer alone needs more than ``cap`` bytes or 2^31 elements."""
    cap = max_bytes() if cap is None else cap
    need = layer_bytes(layer, batch, itemsize)
    total = need["activations"] + need["weights"] + need["workspace"]
    if total > cap:
        raise LimitError(f"layer {layer.index} [{layer.kind}] would need {gib(total)} "
                         f"({layer.c}x{layer.h}x{layer.w} output, {gib(need['weights'])} weights, "
                         f"{gib(need['workspace'])} workspace), more than the {gib(cap)} limit "
                         f"({cap_source()})")
    if need["elements"] > INT32_MAX:
        raise LimitError(f"layer {layer.index} [{layer.kind}] would need {need['elements']} elements in one "
                         f"buffer, more than the 2^31 that 32-bit kernel indexing allows")


def check_weights(nbytes: int, path: str) -> None:
    """Raise LimitError if a cfg asks for a weights file larger than the cap."""
    cap = max_bytes()
    if nbytes > cap:
        raise LimitError(f"{path}: the cfg needs {gib(nbytes)} of weights, more than the {gib(cap)} limit "
                         f"({cap_source()})")


def check_executor(graph, arena_elems: int, workspace_elems: int, batch: int, itemsize: int,
                   device=None) -> None:
    """Raise LimitError before an executor allocates more than the device can hold."""
    cap = max_bytes(device)
    weights = 0
    for n in graph.nodes:
        if n.op == "conv":
            a = n.attrs
            weights += a["filters"] * (a["in_c"] // a["groups"]) * a["size"] ** 2 * itemsize + 4 * a["filters"]
    arena = arena_elems * itemsize
    workspace = workspace_elems * itemsize
    total = arena + weights + workspace
    if total > cap or arena_elems > INT32_MAX or workspace_elems > INT32_MAX:
        worst = max(graph.layers, key=lambda l: sum(v for k, v in layer_bytes(l, batch, itemsize).items()
                                                      if k != "elements"))
        wb = layer_bytes(worst, batch, itemsize)
        why = (f"more than the {gib(cap)} limit ({cap_source(device)})" if total > cap
               else "more than the 2^31 elements that 32-bit kernel indexing allows in one buffer")
        raise LimitError(f"layer {worst.index} [{worst.kind}] would need "
                         f"{gib(wb['activations'] + wb['weights'] + wb['workspace'])} of a batch-{batch} total "
                         f"{gib(total)} (activations {gib(arena)}, weights {gib(weights)}, "
                         f"workspace {gib(workspace)}), {why}")


# -- image files ------------------------------------------------------------------------------
MAX_IMAGE_PIXELS = 1 << 28      # 16384 x 16384: ~1.8 GiB peak for the whole CLI process (README) itself


def image_header_size(data: bytes) -> Optional[tuple]:
    """(width, height) from a PNG, JPEG, BMP, WebP or PNM header without decoding; None if unknown."""
    import struct
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:2] == b"BM" and len(data) >= 26:
        w, h = struct.unpack("<ii", data[18:26])
        return abs(w), abs(h)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        kind = data[12:16]
        if kind == b"VP8X":
            return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
        if kind == b"VP8 ":
            w, h = struct.unpack("<HH", data[26:30])
            return w & 0x3FFF, h & 0x3FFF
        if kind == b"VP8L":
            bits = int.from_bytes(data[21:25], "little")
            return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    if data[:1] == b"P" and data[1:2] in b"123456" and len(data) > 2:
        fields = re.sub(rb"#[^\n]*", b" ", data[2:256]).split()
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
            return int(fields[0]), int(fields[1])
    return None


def _jpeg_size(data: bytes) -> Optional[tuple]:
    """Walk a JPEG's marker segments to its first start-of-frame (SOF0..SOF15 but DHT/JPG/DAC)."""
    i = 2
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:                    # fill byte
            i += 1
            continue
        if 0xD0 <= marker <= 0xD9 or marker == 0x01:
            i += 2
            continue
        seg = int.from_bytes(data[i + 2:i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h, w = int.from_bytes(data[i + 5:i + 7], "big"), int.from_bytes(data[i + 7:i + 9], "big")
            return w, h
        i += 2 + seg
    return None


def check_image_pixels(data: bytes, name: str) -> None:
    """Raise LimitError if an encoded image's header claims more than MAX_IMAGE_PIXELS."""
    size = image_header_size(data)
    if size is not None and size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise LimitError(f"{name}: image is {size[0]}x{size[1]} pixels, more than the {MAX_IMAGE_PIXELS} pixel "
                         f"limit (16384x16384); scale it down first")
