"""Image -> network blob, as Darknet (AlexeyAB) prepares it.

Stretch (the default) resizes straight to the network size; letterbox keeps the aspect
ratio and pads with 0.5 grey. Both resample with ``cv2.resize`` INTER_LINEAR, as Darknet's
Python API and OpenCV do. Then BGR -> RGB, /255, HWC -> CHW.
"""
from __future__ import annotations

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


def to_blob(image_bgr: np.ndarray, net_w: int, net_h: int, fit: str = "stretch", out=None) -> np.ndarray:
    """One image -> (3, net_h, net_w) float32 in [0, 1], RGB."""
    img = check_image(image_bgr)
    h, w = img.shape[:2]
    if fit == "letterbox":
        nw, nh = letterbox_size(w, h, net_w, net_h)
        resized = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
        canvas = np.full((net_h, net_w, 3), 127.5, np.float32)
        x0, y0 = (net_w - nw) // 2, (net_h - nh) // 2
        canvas[y0:y0 + nh, x0:x0 + nw] = resized
        rgb = canvas[:, :, ::-1]
    else:
        rgb = cv2.resize(img, (net_w, net_h), interpolation=cv2.INTER_LINEAR)[:, :, ::-1]
    blob = out if out is not None else np.empty((3, net_h, net_w), np.float32)
    np.multiply(rgb.transpose(2, 0, 1), np.float32(1.0 / 255.0), out=blob, casting="unsafe")
    return blob
