"""Convolution launches: the tuned config if there is one that binds, else the heuristic's.

Which kernels run a conv is the kernel families' business (``family``): each declares its
configs, legality, heuristic and binding; this module only asks the tuning table (any object
with ``conv_config(node, batch)``, None meaning "no entry") and falls back to the heuristic of
the device's families when the table has no entry or its entry cannot be bound.
"""
from __future__ import annotations

import logging

from . import BindContext, is_depthwise
from . import family
from ..errors import YoloClError, reason
from ..graph import Node
from ..precision import FP32, Precision

log = logging.getLogger("yolo_cl.kernels")
_WARNED: set = set()   # (device, layer, config) already reported as falling back

__all__ = ["bind", "bound_config", "choose", "heuristic_config", "is_depthwise", "workspace_bytes"]


def heuristic_config(node: Node, rt, batch: int = 1, precision: Precision = FP32, mma: str = "",
                     planes: bool = False) -> dict:
    """The untuned config for ``node`` on ``rt``'s device (``mma``: the tensor-core mode in use;
    ``planes``: its input reaches it as NCHW planes whatever the configs)."""
    return family.heuristic(node, rt, batch, precision, mma, planes)


def bind(ctx: BindContext, node: Node, config: dict = None) -> list:
    """Launches for one conv node under ``config`` (default: the tuning table's, or the heuristic's)."""
    if config is None:
        return _bind_chosen(ctx, node)
    return family.bind(ctx, node, config)


def choose(ctx: BindContext, node: Node) -> tuple:
    """(config, fallback): the tuning table's entry for ``node`` where it has one worth using (not
    yet checked for legality: binding does that and falls back), else the heuristic's; and the
    heuristic's (told whether the input can reach the conv channels-last: ``ctx.sole_edges``)."""
    planes = ctx.sole_edges is not None and node.inputs[0].tensor.id not in ctx.sole_edges
    fallback = heuristic_config(node, ctx.rt, ctx.batch, ctx.precision, ctx.mma, planes)
    config = None
    if ctx.tuning is not None:
        try:
            config = ctx.tuning.conv_config(node, ctx.batch)
        except (KeyError, TypeError, ValueError):
            config = None
    if config is None or not family.competes(config, ctx.mma):
        return fallback, fallback   # no entry; or an FMA config, which does not compete with tensor cores
    return config, fallback


def bound_config(ctx: BindContext, node: Node) -> dict:
    """The config ``node`` will bind (its tuned one where legal, else the heuristic's)."""
    config, fallback = choose(ctx, node)
    return config if family.why_illegal(node, config, ctx.rt, ctx.mma) is None else fallback


def workspace_bytes(ctx: BindContext, node: Node) -> int:
    """Scratch ``node`` needs under the config it will bind, and under the fallback it may bind
    instead (a config that cannot run needs none: it will not be bound)."""
    need = 0
    for c in choose(ctx, node):
        if family.why_illegal(node, c, ctx.rt, ctx.mma) is None:
            need = max(need, family.workspace_bytes(node, c, ctx.batch, ctx.precision))
    return need


def _bind_chosen(ctx: BindContext, node: Node) -> list:
    """Bind the tuning table's choice; if it has none, or it cannot be built or bound, the heuristic
    (with one warning for a config that failed).

    A tuned config comes from a file written on some other day, driver or device: one that
    no longer compiles (or is malformed) must cost speed, never the model.
    """
    config, fallback = choose(ctx, node)
    if config == fallback:
        return bind(ctx, node, fallback)
    try:
        problem = family.why_illegal(node, config, ctx.rt, ctx.mma)
        if problem is not None:
            raise ValueError(problem)
        return bind(ctx, node, config)
    except (YoloClError, KeyError, TypeError, ValueError, ctx.rt.cl.Error) as e:
        key = (ctx.rt.device_name, node.label, repr(config))
        if key not in _WARNED:
            _WARNED.add(key)
            log.warning("layer %s (%s): tuned config %s failed on %s (%s); using the heuristic config %s",
                        node.label, node.describe(), config, ctx.rt.device_name, reason(e), fallback)
    return bind(ctx, node, fallback)
