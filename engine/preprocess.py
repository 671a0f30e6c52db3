"""Image -> network blob, as Darknet (AlexeyAB) prepares it.

Stretch (the default) resizes straight to the network size; letterbox keeps the aspect
ratio and pads with 0.5 grey. Both resample with ``cv2.resize`` INTER_LINEAR, as Darknet's
Python API and OpenCV do. Then BGR -> RGB, /255, HWC -> CHW.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import cv2
import numpy as np

from .errors import ImageError

FITS = ("stretch", "letterbox", "crop")


def letterbox_size(img_w: int, img_h: int, net_w: int, net_h: int) -> tuple:
    """Darknet's scaled size of the image inside the network input (integer arithmetic as in C).

    A side never rounds down to 0 pixels (a 1x100000 strip still gets one row)."""
    if net_w / img_w < net_h / img_h:
        return net_w, max(1, (img_h * net_w) // img_w)
    return max(1, (img_w * net_h) // img_h), net_h


def check_image(image) -> np.ndarray:
    """Accept a BGR uint8 image (grey and BGRA are converted, 16-bit scaled down); reject anything else."""
    if (type(image) is np.ndarray and image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
            and image.size and image.flags.c_contiguous):
        return image                     # a frame as decoders give it: nothing to check further
    if image is None or not isinstance(image, np.ndarray) or image.size == 0:
        raise ImageError("image is empty or not a numpy array")
    if not (np.issubdtype(image.dtype, np.integer) or np.issubdtype(image.dtype, np.floating)
            or image.dtype == np.bool_):
        raise ImageError(f"image has dtype {image.dtype}; expected uint8, uint16 or a real number type")
    if image.ndim == 2:
        image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR) if image.dtype == np.uint8 else np.stack([image] * 3, -1)
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise ImageError(f"image has shape {image.shape}; expected HxW, HxWx3 or HxWx4")
    if image.shape[2] == 1:
        image = np.repeat(image, 3, axis=2)
    if image.shape[2] == 4:
        image = image[:, :, :3]
    if image.dtype == np.uint16:
        image = (image >> 8).astype(np.uint8)
    elif image.dtype != np.uint8:
        f = np.nan_to_num(image.astype(np.float64), nan=0.0, posinf=255.0, neginf=0.0)
        image = np.rint(np.clip(f * 255.0 if f.max() <= 1.0 else f, 0, 255)).astype(np.uint8)
    return np.ascontiguousarray(image)


@dataclass(frozen=True)
class Placement:
    """Where the resized image sits inside the network input, and how boxes map back."""

    net_w: int
    net_h: int
    new_w: int          # resized image size
    new_h: int
    x0: int             # its top-left pixel in the network input
    y0: int
    box_dx: float       # the offsets box decoding subtracts (Darknet's correct_yolo_boxes
    box_dy: float       # assumes (net - new) / 2, as a float)

    @property
    def padded(self) -> bool:
        return (self.new_w, self.new_h) != (self.net_w, self.net_h)


@lru_cache(maxsize=1024)
def placement(fit: str, img_w: int, img_h: int, net_w: int, net_h: int, stride: int = 32) -> Placement:
    """Lay out an image for ``fit`` (a frozen value, cached: a stream asks it per frame of one size):

    - ``stretch``: resized to the whole input (Darknet's default);
    - ``letterbox``: aspect kept, centred, grey padding (``letter_box=1``);
    - ``crop``: letterbox scale, but the input itself shrinks to the image's aspect ratio,
      rounded up to the stride. The image keeps its letterbox offset modulo the stride, so
      the conv grids line up with the letterboxed run and detections agree with it.
    """
    if fit == "stretch":
        return Placement(net_w, net_h, net_w, net_h, 0, 0, 0.0, 0.0)
    nw, nh = letterbox_size(img_w, img_h, net_w, net_h)
    if fit == "letterbox":
        return Placement(net_w, net_h, nw, nh, (net_w - nw) // 2, (net_h - nh) // 2,
                         (net_w - nw) / 2.0, (net_h - nh) / 2.0)
    x0, y0 = ((net_w - nw) // 2) % stride, ((net_h - nh) // 2) % stride
    cw, ch = -(-(x0 + nw) // stride) * stride, -(-(y0 + nh) // stride) * stride
    return Placement(cw, ch, nw, nh, x0, y0, float(x0), float(y0))


def to_blob(image_bgr: np.ndarray, net_w: int, net_h: int, fit: str = "stretch", out=None,
            place: Optional[Placement] = None) -> np.ndarray:
    """One image -> (3, H, W) float32 in [0, 1], RGB, laid out by ``place`` (default: ``fit`` at net_w x net_h).

    An ``out`` with one channel (a ``channels=1`` model) gets the image in grey, converted
    before resizing as Darknet loads images for such a model."""
    img = check_image(image_bgr)
    gray = out is not None and out.shape[0] == 1
    if gray:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)[:, :, None]
    h, w = img.shape[:2]
    if place is None:
        place = placement("letterbox" if fit == "crop" else fit, w, h, net_w, net_h)
    resized = cv2.resize(img, (place.new_w, place.new_h), interpolation=cv2.INTER_LINEAR)
    if gray:
        resized = resized.reshape(place.new_h, place.new_w, 1)
    if place.padded:
        canvas = np.full((place.net_h, place.net_w, img.shape[2]), 127.5, np.float32)
        canvas[place.y0:place.y0 + place.new_h, place.x0:place.x0 + place.new_w] = resized
        rgb = canvas[:, :, ::-1]
    else:
        rgb = resized[:, :, ::-1]
    blob = out if out is not None else np.empty((3, place.net_h, place.net_w), np.float32)
    np.multiply(rgb.transpose(2, 0, 1), np.float32(1.0 / 255.0), out=blob, casting="unsafe")
    return blob
