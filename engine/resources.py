"""Locate the files shipped beside the code: kernel sources, the model zoo, configs.

Installed, they live inside the package (``yolo_cl/_cl`` …); in a source checkout
they are the top-level ``cl/``, ``models/`` and ``configs/`` folders.
"""
from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
_LAYOUT = {"cl": "_cl", "models": "_models", "configs": "_configs"}


def resource_dir(name: str) -> Path:
    """Return the folder holding shipped resource ``name`` (cl, models or configs)."""
    installed = _HERE / _LAYOUT[name]
    if installed.is_dir():
        return installed
    return _HERE.parent / name
