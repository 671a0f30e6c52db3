"""The kernel-family interface and its one registry.

A *family* is a set of conv kernels with their tunables: the CPU GEMM (``gemm_cpu``), the
GPU local-memory GEMM (``gemm_local``, Winograd included), the tensor-core GEMMs (``gemm_mma``;
``gemm_wgmma``, Hopper's warpgroup MMA), the GPU direct conv of a narrow input (``narrow``: a
network's RGB conv) and the direct kernels (``direct``: depthwise, and configs without a family). Each module
declares one object, ``KERNEL_FAMILY``, with the methods of :class:`KernelFamily`, the same signatures in every
family; a config names its family by ``config["family"]``. The executor (through ``conv``),
the tuner and bench ask this module, never a family by name. Adding a family is one module
and one line in ``FAMILIES``.
"""
from __future__ import annotations

from typing import Optional, Protocol

from . import direct, gemm_cpu, gemm_local, gemm_mma, gemm_wgmma, narrow
from ..graph import Node
from ..precision import FMA_COMPETES, Precision
from ..search import SpaceKeys
from ..tuning_db import TuningDatabase


class KernelFamily(Protocol):
    """What every family declares, next to its kernel."""

    name: Optional[str]      # its configs' "family" value (None: configs without one)
    tensor_cores: bool       # computes on tensor cores (then FMA families' configs stand aside)
    timed_beside_tensor_cores: bool  # an FMA family whose fp16 entries were tuned against them (they compete)
    derived: tuple           # config keys it derives from the others (the search never turns them)
    schedule: tuple          # knobs that change neither register block nor tiles (k unroll, prefetch)
    block: tuple             # keys that make a config's block or tile shape
    stores_nhwc: tuple       # algorithms that can store a conv's output channels-last (kernels/layout.py)
    reads_nhwc: tuple        # algorithms that read a conv's input channels-last

    def offered(self, rt, mma: str) -> bool:
        """Whether it is one of the device's families (``mma``: the tensor-core mode in use, or "")."""

    def candidates(self, node: Node, rt, batch: int, precision: Precision, mma: str) -> list:
        """Every legal config for ``node`` on ``rt``'s device, for the tuner ([] if it cannot run it)."""

    def heuristic(self, node: Node, rt, batch: int, precision: Precision, mma: str,
                  planes: bool = False) -> Optional[dict]:
        """The untuned config for ``node`` on ``rt``'s device (None if it does not run it; the
        device says e.g. how wide a CPU's vectors are); ``planes``: its input reaches it as NCHW
        planes whatever the configs (no producer can store it channels-last)."""

    def why_illegal(self, node: Node, cfg: dict, rt, mma: str = "") -> Optional[str]:
        """Why ``cfg`` cannot run ``node`` on ``rt``'s device in tensor-core mode ``mma`` ("" for
        none, "f16", "tf32": a tile's k depends on it), or None (binding may still adapt a legal
        config to the exact shape, e.g. re-derive vector widths)."""

    def cost(self, node: Node, cfg: dict, batch: int, rt) -> float:
        """Relative time estimate of ``cfg`` (lower first), to order the tuner's search."""

    def workspace_bytes(self, node: Node, cfg: dict, batch: int, precision: Precision) -> int:
        """Scratch bytes ``cfg`` needs for ``node`` (im2col, Winograd, split-K partial sums)."""

    def bind(self, ctx, node: Node, cfg: dict) -> list:
        """The launches that compute ``node`` under ``cfg``."""


FAMILIES: tuple = (direct.KERNEL_FAMILY, narrow.KERNEL_FAMILY, gemm_wgmma.KERNEL_FAMILY, gemm_mma.KERNEL_FAMILY,
                   gemm_local.KERNEL_FAMILY, gemm_cpu.KERNEL_FAMILY)
_BY_NAME = {f.name: f for f in FAMILIES}


def family_of(cfg: dict) -> KernelFamily:
    """The family a config belongs to; ValueError for a config that names none we have."""
    if not isinstance(cfg, dict) or "algo" not in cfg:
        raise ValueError(f"config {cfg!r} is not a dict with an 'algo'")
    try:
        return _BY_NAME[cfg.get("family")]
    except (KeyError, TypeError):
        raise ValueError(f"config {cfg!r} names no kernel family of {', '.join(map(str, _BY_NAME))}") from None


def stores_nhwc(cfg) -> bool:
    """Whether ``cfg``'s launches can store a conv's output channels-last (the shared GEMM
    epilogue's NHWC_OUT): the question kernels/layout.py asks of a producer."""
    try:
        return cfg["algo"] in family_of(cfg).stores_nhwc
    except (ValueError, KeyError, TypeError):
        return False


def reads_nhwc(cfg) -> bool:
    """Whether ``cfg``'s launches read a conv's input channels-last (the wgmma family's ``nhwc``)."""
    try:
        return cfg["algo"] in family_of(cfg).reads_nhwc
    except (ValueError, KeyError, TypeError):
        return False


def offered(rt, mma: str) -> list:
    """The device's families, in the order they claim a layer."""
    return [f for f in FAMILIES if f.offered(rt, mma)]


def candidates(node: Node, rt, batch: int, precision: Precision, mma: str) -> list:
    """Every legal config of the device's families for ``node``: the tuner's search space."""
    return [c for f in offered(rt, mma) for c in f.candidates(node, rt, batch, precision, mma)]


def heuristic(node: Node, rt, batch: int, precision: Precision, mma: str, planes: bool = False) -> dict:
    """The untuned config: the first of the device's families that runs ``node`` (a family whose
    pick cannot run here -- its probe failed -- passes the layer on to the next). ``planes``: see
    :meth:`KernelFamily.heuristic`."""
    for f in offered(rt, mma):
        cfg = f.heuristic(node, rt, batch, precision, mma, planes)
        if cfg is not None and f.why_illegal(node, cfg, rt, mma) is None:
            return cfg
    raise ValueError(f"no kernel family runs {node.describe()}")


def competes(cfg: dict, mma: str) -> bool:
    """Whether a tuned config is worth using: with f16 tensor cores on, an FMA family's tuned GEMM
    does not compete with them (depthwise convs have no tensor-core kernel; an fp16 record's FMA
    entries were tuned before there were tensor-core kernels). With tf32 it does
    (``precision.FMA_COMPETES``): a tf32 record holds an FMA config only where it was timed faster.
    A family made for what tensor cores do badly (``timed_beside_tensor_cores``) competes too."""
    if not mma or mma in FMA_COMPETES or cfg.get("algo") == "depthwise":
        return True
    f = family_of(cfg)
    return f.tensor_cores or f.timed_beside_tensor_cores


def why_illegal(node: Node, cfg, rt, mma: str = "") -> Optional[str]:
    """Why a config (from a table or file: any value) cannot run ``node`` in mode ``mma``, or None."""
    try:
        return family_of(cfg).why_illegal(node, cfg, rt, mma)
    except (ValueError, KeyError, TypeError) as e:
        return str(e) or type(e).__name__


def stored_config_fits(rt, mma: str):
    """The check a tuning database applies to a stored config: legal for the node and worth using."""
    def fits(node: Node, cfg) -> bool:
        return why_illegal(node, cfg, rt, mma) is None and competes(cfg, mma)
    return fits


def tuning_database(rt, precision: Precision, mma: str = "", **kw) -> TuningDatabase:
    """The tuning database a run on ``rt``'s device reads: records of what ``precision`` runs as
    there (``mma``: the tensor-core mode in use), stored configs checked by ``stored_config_fits``.
    ``kw``: TuningDatabase's ``paths`` and ``user_path``."""
    return TuningDatabase(rt, precision.run_as(mma), fits=stored_config_fits(rt, mma), **kw)


def cost(node: Node, cfg: dict, batch: int, rt) -> float:
    return family_of(cfg).cost(node, cfg, batch, rt)


def workspace_bytes(node: Node, cfg: dict, batch: int, precision: Precision) -> int:
    """Scratch bytes ``cfg`` needs for ``node``: the executor sizes one workspace for the configs it binds."""
    return family_of(cfg).workspace_bytes(node, cfg, batch, precision)


def space_keys() -> SpaceKeys:
    """What the family-blind search needs to know of every family's config keys."""
    def union(attr: str) -> tuple:
        return tuple(dict.fromkeys(k for f in FAMILIES for k in getattr(f, attr)))
    return SpaceKeys(fixed=("family",) + union("derived"), schedule=union("schedule"), block=union("block"))


def bind(ctx, node: Node, cfg: dict) -> list:
    return family_of(cfg).bind(ctx, node, cfg)
