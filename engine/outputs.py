"""Any layer's output: layer names, which layers a request means, and what a head layer outputs.

Every layer has a name ``<kind>_<index>`` in the style of OpenCV's Darknet importer
(``conv_12``, ``maxpool_3``, ``route_20``, ``yolo_16``); OpenCV's own spellings (``pool_3``,
``concat_20``, ``identity_20``) and the full section name (``convolutional_12``) are accepted
too. A request may also name a layer by its index, negative ones counting from the end.

The engine returns a ``[yolo]``/``[region]`` head's *input* (the raw convolution output) for
decoding; Darknet's head layer itself outputs an activated copy, computed here on the host
from that raw input exactly as ``forward_yolo_layer`` (AlexeyAB) and ``forward_region_layer``
(pjreddie's layout; AlexeyAB's CPU path also transposes it) do.
"""
from __future__ import annotations

from typing import Iterable, Union

import numpy as np

from .errors import YoloClError

SHORT = {"convolutional": "conv"}
# Other spellings accepted for a kind: OpenCV's importer names and Darknet's section aliases.
ALSO = {"convolutional": ("convolutional",), "maxpool": ("pool", "max"), "avgpool": ("avg",),
        "route": ("concat", "identity"), "softmax": ("soft",)}


def layer_name(layer) -> str:
    """The layer's name, e.g. ``conv_12`` or ``yolo_16``."""
    return f"{SHORT.get(layer.kind, layer.kind)}_{layer.index}"


def layer_indices(layers: list, wanted: Iterable[Union[int, str]]) -> list:
    """Layer indices for a list of indices (negative from the end) and names; a one-line error otherwise."""
    n = len(layers)
    out = []
    for w in wanted:
        if isinstance(w, (int, np.integer)) and not isinstance(w, bool):
            i = int(w) + n if w < 0 else int(w)
            if not 0 <= i < n:
                raise YoloClError(f"output {int(w)} is not a layer index (the network has layers 0..{n - 1})")
            out.append(i)
            continue
        if not isinstance(w, str):
            raise YoloClError(f"output {str(w)[:40]!r} is neither a layer index nor a layer name")
        prefix, _, num = w.strip().lower().rpartition("_")
        i = int(num) if num.isdigit() else -1
        if not 0 <= i < n:
            raise YoloClError(f"output '{w[:40]}' names no layer (names look like conv_12 or yolo_16; "
                              "'yolo-cl info' lists them)")
        kind = layers[i].kind
        if prefix not in (SHORT.get(kind, kind), kind) + ALSO.get(kind, ()):
            raise YoloClError(f"output '{w[:40]}': layer {i} is {layer_name(layers[i])}, not a {prefix} layer")
        out.append(i)
    return out


def _logistic(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


def head_output(raw: np.ndarray, layer) -> np.ndarray:
    """A [yolo]/[region] layer's own output (N, C, H, W) from its raw input; other kinds unchanged."""
    if layer.kind not in ("yolo", "region"):
        return raw
    p = layer.p
    n = len(p["mask"]) if layer.kind == "yolo" else p["num"]
    b, c, h, w = raw.shape
    x = np.array(raw, np.float32).reshape(b, n, c // n, h, w)
    if layer.kind == "yolo":
        if not p["new_coords"]:                       # yolo_layer.c: logistic x, y, objectness, classes
            x[:, :, 0:2] = _logistic(x[:, :, 0:2])
            x[:, :, 4:] = _logistic(x[:, :, 4:])
        s = np.float32(p["scale_x_y"])                # scal_add_cpu(2*w*h, scale_x_y, -0.5*(scale_x_y - 1))
        x[:, :, 0:2] = x[:, :, 0:2] * s + np.float32(-0.5 * (s - 1))
    else:                                             # region_layer.c: logistic x, y, objectness
        x[:, :, 0:2] = _logistic(x[:, :, 0:2])
        x[:, :, 4] = _logistic(x[:, :, 4])
        if p["softmax"]:                              # softmax_cpu over the classes of each box
            cls = x[:, :, 5:].astype(np.float64)
            e = np.exp(cls - cls.max(axis=2, keepdims=True))
            x[:, :, 5:] = e / e.sum(axis=2, keepdims=True)
    return x.reshape(b, c, h, w)
