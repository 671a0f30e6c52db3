"""The model zoo shipped in ``models/``: cfgs by name, the bundled weights, class names.

A zoo name is a cfg's file stem (``yolov3-tiny``, ``yolov4`` …). Class names default to
the list whose length matches the model's class count (COCO's 80, VOC's 20).
"""
from __future__ import annotations

from typing import Optional

from .resources import resource_dir

NAMES_BY_COUNT = {80: "coco.names", 20: "voc.names"}


def zoo_cfgs() -> dict:
    """``{name: cfg path}`` for every cfg in the zoo."""
    root = resource_dir("models")
    out = {}
    for p in sorted(list(root.glob("cfg/*.cfg")) + list(root.glob("*.cfg"))):
        out[p.stem] = p
    return out


def resolve(name: str) -> Optional[tuple]:
    """(cfg, weights or None) for a zoo name, or None if ``name`` is not in the zoo. Weights are the
    bundled file, else a download in the user cache (``<cache>/weights/NAME.weights``)."""
    cfg = zoo_cfgs().get(name)
    if cfg is None:
        return None
    weights = cfg.with_suffix(".weights")
    if not weights.is_file():
        weights = resource_dir("models") / f"{name}.weights"
    if not weights.is_file():                      # fetched earlier by `yolo-cl download NAME`
        from .runtime import cache_dir
        weights = cache_dir() / "weights" / f"{name}.weights"
    return cfg, (weights if weights.is_file() else None)


def default_names(classes: int) -> Optional[list]:
    """The zoo's class-name list with ``classes`` entries, if there is one."""
    fname = NAMES_BY_COUNT.get(classes)
    if fname is None:
        return None
    return read_names(resource_dir("models") / fname)


def read_names(path) -> list:
    """One class name per line (blank lines dropped), read through the bounded user-file reader."""
    from .userfiles import read_text
    return [line.strip() for line in read_text(path, "names file").splitlines() if line.strip()]
