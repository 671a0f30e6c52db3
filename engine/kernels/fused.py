"""Launches that do several layers' work (``cl/fused.cl``).

- Winograd's input transform reading through a folded [maxpool] or [upsample]: the graph marks
  the pairs (``conv.attrs["read_through"]``, graph.mark_read_fusions); the conv's input
  transform computes the folded layer's values as it reads them, so the executor drops the
  folded layer's own launch (and its output is never written);
- ``maxpool_nested``: sibling max-pools of one input (graph.merge_sibling_pools) in one pass.
"""
from __future__ import annotations

import numpy as np

from . import BindContext, Launch, i32
from ..graph import Node


def wino_input(ctx: BindContext, node: Node, m: int, v_off: int, tw: int, P: int) -> Launch:
    """The input transform of Winograd conv ``node`` into the workspace at ``v_off``: the plain
    ``yc_wino_input``, or ``yc_wino_input_fused`` where the node reads through a folded layer
    (the launch's ``config["through"]`` then names that layer's op)."""
    x = node.inputs[0]
    C = node.attrs["in_c"]
    head = ctx.view(x) + i32(C, x.h, x.w) + [ctx.workspace] + i32(v_off, tw, P, node.attrs["pad"])
    src = node.attrs.get("read_through") if ctx.fold else None
    if src is None:
        k = ctx.kernel("winograd.cl", "yc_wino_input", ctx.defines(WINO_M=m), head)
        return Launch(k, (P, C, ctx.batch), None, node, "wino_input", {"m": m})
    s = src.inputs[0]
    a = src.attrs
    if src.op == "maxpool":
        d = ctx.defines(WINO_M=m, POOL=True, MP_SIZE=a["size"], MP_SX=a["stride_x"], MP_SY=a["stride_y"],
                        MP_PAD=a["padding"] // 2)
        scale = 1.0
    else:
        d = ctx.defines(WINO_M=m, UPS=True, US_C0=src.output.c0 - x.c0, US_C=src.output.c, US_S=a["stride"])
        scale = a["scale"]
    args = head + ctx.view(s) + i32(s.h, s.w) + [np.float32(scale)]
    k = ctx.kernel("fused.cl", "yc_wino_input_fused", d, args)
    return Launch(k, (P, C, ctx.batch), None, node, "wino_input", {"m": m, "through": src.op})


def bind_nested_pools(ctx: BindContext, node: Node) -> list:
    """One launch computing every pool of a ``maxpool_nested`` node into its output views."""
    x = node.inputs[0]
    sizes, outs = node.attrs["sizes"], node.attrs["outputs"]
    radii = [s // 2 for s in sizes] + [0] * (3 - len(sizes))
    d = ctx.defines(MP_N=len(sizes), MP_R0=radii[0], MP_R1=radii[1], MP_R2=radii[2])
    args = ctx.view(x) + i32(x.h, x.w)
    for k in range(3):
        args += ctx.view(outs[k]) if k < len(outs) else [ctx.arena, np.int32(0), np.int32(0)]
    k = ctx.kernel("fused.cl", "yc_maxpool_nested", d, args)
    return [Launch(k, (x.h, x.c, ctx.batch), None, node, "maxpool_nested", {"sizes": list(sizes)})]
