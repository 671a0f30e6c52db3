"""Darknet cfg text for the tests' tiny networks, one writer per section kind.

Each test still spells out its own network (which layers, sizes and activations it needs, so
a reader sees them next to the asserts); this module only writes the sections, so the
``[net]`` header, a ``[convolutional]`` block or a ``[yolo]`` head is not typed out again
in every file. Values are written as given: a list or tuple as comma-separated numbers,
a string as it stands.
"""
from __future__ import annotations

# yolov3-tiny's six anchors, as Darknet's cfgs write them.
ANCHORS = "10,14, 23,27, 37,58, 81,82, 135,169, 344,319"


def sec(kind: str, **opts) -> str:
    """One ``[kind]`` section with ``key=value`` lines in the order given, and a blank line."""
    lines = [f"[{kind}]"]
    for k, v in opts.items():
        lines.append(f"{k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}")
    return "\n".join(lines) + "\n\n"


def net_header(width: int, height: int, channels: int = 3, **opts) -> str:
    """The ``[net]`` header of a ``width`` x ``height`` input with ``channels`` planes."""
    return sec("net", width=width, height=height, channels=channels, **opts)


def conv(filters: int, size: int = 3, stride: int = 1, pad: int = 1, bn: int = 1, act: str = "leaky",
         **opts) -> str:
    """A ``[convolutional]`` section (batch-normalized and leaky unless told)."""
    return sec("convolutional", batch_normalize=bn, filters=filters, size=size, stride=stride, pad=pad,
               activation=act, **opts)


def maxpool(size: int = 2, stride: int = 2) -> str:
    return sec("maxpool", size=size, stride=stride)


def upsample(stride: int = 2) -> str:
    return sec("upsample", stride=stride)


def route(*layers: int) -> str:
    """A ``[route]`` of ``layers`` (relative when negative), concatenated in that order."""
    return sec("route", layers=layers)


def shortcut(frm: int, act: str = "linear", **opts) -> str:
    """A ``[shortcut]`` adding layer ``frm`` to the previous one."""
    return sec("shortcut", **{"from": frm}, activation=act, **opts)


def yolo(mask, classes: int, num: int = 6, anchors: str = ANCHORS, **opts) -> str:
    """A ``[yolo]`` head using the anchors numbered in ``mask`` out of the ``num`` in ``anchors``."""
    return sec("yolo", mask=mask, anchors=anchors, classes=classes, num=num, **opts)
