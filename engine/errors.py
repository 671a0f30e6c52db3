"""The one exception family yolo-cl raises for anything a user can cause.

Every message is a single line that names the file, line or layer at fault, so the
CLI can print it as-is instead of a traceback.
"""
from __future__ import annotations


def reason(e: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (its type's name if it has none), for one-line reports."""
    text = str(e)
    return text.splitlines()[0][:limit] if text else type(e).__name__


class YoloClError(Exception):
    """Base class: a clear, one-line, user-facing error."""


class CfgError(YoloClError):
    """A Darknet .cfg file is malformed or asks for something unsupported."""


class WeightsError(YoloClError):
    """A .weights file is missing, truncated, oversized or garbled."""


class ImageError(YoloClError):
    """An image or video source cannot be read."""


class DeviceError(YoloClError):
    """OpenCL is missing, a kernel failed to build, or the device is out of memory."""


class LimitError(YoloClError):
    """A model would need more memory or work than the configured limits allow."""
