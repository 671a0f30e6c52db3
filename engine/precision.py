"""The numeric precisions a network runs in, each one value made once and passed everywhere.

A :class:`Precision` says how activations are stored (float or half), what the tuner's
correctness gate accepts, which tensor-core input type it asks for where a device has them, and
which Winograd tile sizes keep its accuracy. ``fp32`` is IEEE float throughout; ``fp16`` stores
activations (and packed weights) as half and computes in float, or on tensor cores in half with
float accumulation, or in half arithmetic on a device with ``cl_khr_fp16`` (:func:`half_math`);
``tf32`` computes on tensor cores with TF32 inputs and runs as ``fp32`` where there are none.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .errors import YoloClError


@dataclass(frozen=True)
class Precision:
    """One precision mode: its name, storage, tolerance and what it allows."""

    name: str                   # "fp32", "fp16", "tf32": the CLI's and the tuning database's word
    half: bool                  # activations and weights stored as half
    tolerance: float            # largest relative error the tuner accepts against NumPy
    mma: str                    # tensor-core input type it asks for ("f16", "tf32"; "" = none)
    winograd_tiles: tuple       # Winograd F(m x m) tile sizes accurate enough for it

    @property
    def dtype(self) -> type:
        """NumPy type of stored activations."""
        return np.float16 if self.half else np.float32

    @property
    def itemsize(self) -> int:
        """Bytes per stored activation."""
        return 2 if self.half else 4

    def run_as(self, mma: str) -> "Precision":
        """What this precision runs (and is tuned, checked and filed) as, given the tensor-core
        mode the device offers it (``mma``, "" for none): without tensor cores tf32 is fp32."""
        return FP32 if self.name == "tf32" and not mma else self

    def __str__(self) -> str:
        return self.name


# F(4x4) loses ~10x more to rounding than F(2x2) (tests/test_winograd.py), beyond half's gate.
FP32 = Precision("fp32", False, 1e-4, "", (2, 4))
FP16 = Precision("fp16", True, 1e-2, "f16", (2,))
TF32 = Precision("tf32", False, 2e-2, "tf32", (2, 4))
PRECISIONS = {p.name: p for p in (FP32, FP16, TF32)}
# Tensor-core modes next to which the FMA kernel families stay on offer (tuned, stored, bound):
# fp32 FMA is at least as accurate as tf32, and on an H100 NVIDIA's tf32 mma.sync loses to it
# on some layers (yolov3's stride-1 3x3 convs, as Winograd) while winning on others.
FMA_COMPETES = ("tf32",)


def precision_named(name: str) -> Precision:
    """The precision called ``name``; a clear error for any other word."""
    if isinstance(name, Precision):
        return name
    try:
        return PRECISIONS[name]
    except (KeyError, TypeError):
        raise YoloClError(f"precision '{name}' is not one of {', '.join(PRECISIONS)}") from None


HALF_MATH_ENV = "YOLO_CL_HALF_MATH"
HALF_MATH_MODES = ("auto", "emulate", "off")


def half_math_setting() -> str:
    """``YOLO_CL_HALF_MATH``: ``auto`` (the default: half arithmetic where the device has it),
    ``emulate`` (half arithmetic mapped onto float with every result rounded to half, on any
    device: the tests' way to run it on PoCL) or ``off``; a clear error for any other word."""
    value = os.environ.get(HALF_MATH_ENV, "").strip().lower() or "auto"
    if value not in HALF_MATH_MODES:
        raise YoloClError(f"{HALF_MATH_ENV}={value!r} is not one of {', '.join(HALF_MATH_MODES)}")
    return value


def half_math(precision: Precision, has_fp16: bool) -> str:
    """How the FMA GEMM families compute under ``precision`` on a device that lists
    ``cl_khr_fp16`` (``has_fp16``) or not: "native" (half arithmetic), "emulate" (float
    arithmetic rounded to half after every step) or "" (float arithmetic, as fp32 does).
    Only half storage computes in half; the tensor-core family has its own arithmetic."""
    if not precision.half:
        return ""
    setting = half_math_setting()
    if setting == "emulate":
        return "emulate"
    return "native" if setting == "auto" and has_fp16 else ""
