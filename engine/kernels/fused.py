"""Launches that do several layers' work (``cl/fused.cl``).

- Winograd's input transform reading through a folded [maxpool], [upsample] or route copy: the graph marks
  the pairs (``conv.attrs["read_through"]``, graph.mark_read_fusions); the conv's input
  transform computes the folded layer's values as it reads them, so the executor drops the
  folded layer's own launch (and its output is never written), except a layer whose producer
  wrote its output (``ctx.written``: graph.mark_write_fusions), which it reads as it is;
- ``maxpool_nested``: sibling max-pools of one input (graph.merge_sibling_pools) in one pass.
"""
from __future__ import annotations

import numpy as np

from . import BindContext, Launch, i32, row_kernels
from ..graph import Node


def wino_input(ctx: BindContext, node: Node, m: int, v_off: int, tw: int, P: int, vt: int = 1,
               groups: int = 0) -> Launch:
    """The input transform of Winograd conv ``node`` into the workspace at ``v_off``: the plain
    ``yc_wino_input`` (``yc_wino_input_vt`` with ``vt`` tiles a work-item, over ``groups`` tile
    groups: ``winograd.tile_groups``; ``yc_wino_input_plane``, a channel plane a work-item, on
    maps narrower than a group's run), or ``yc_wino_input_fused`` where the node reads through
    folded layers (the launch's ``config["through"]`` then names their ops)."""
    x = node.inputs[0]
    C = node.attrs["in_c"]
    head = ctx.view(x) + i32(C, x.h, x.w) + [ctx.workspace] + i32(v_off, tw, P, node.attrs["pad"])
    srcs = [p for p in node.attrs.get("read_through") or () if id(p) not in ctx.written] if ctx.fold else []
    if not srcs and vt > 1 and x.w < vt * m + 2:       # every group's runs cross an edge: whole planes
        th = P // tw
        wp = -(-(vt * m + (tw - 1) * m + vt * m + 2) // 8) * 8
        d = ctx.defines(WINO_M=m, WINO_VT=vt, WP_W=wp, WP_H=th * m + 2)
        k = ctx.kernel("winograd.cl", "yc_wino_input_plane", d, head)
        # one-item work-groups: PoCL keeps each work-item's private plane on its worker thread's
        # stack, so a work-group of its own choosing (e.g. 64 x 2 items at batch 6) overflows it
        return Launch(k, (1, C, ctx.batch), (1, 1, 1), node, "wino_input", {"m": m, "vt": vt, "plane": True})
    if not srcs and vt > 1:
        k = ctx.kernel("winograd.cl", "yc_wino_input_vt", ctx.defines(WINO_M=m, WINO_VT=vt), head)
        return Launch(k, (groups, C, ctx.batch), None, node, "wino_input", {"m": m, "vt": vt})
    if not srcs:
        k = ctx.kernel("winograd.cl", "yc_wino_input", ctx.defines(WINO_M=m), head)
        return Launch(k, (P, C, ctx.batch), None, node, "wino_input", {"m": m})
    if srcs[0].op == "maxpool":
        a = srcs[0].attrs
        d = ctx.defines(WINO_M=m, POOL=True, MP_SIZE=a["size"], MP_SX=a["stride_x"], MP_SY=a["stride_y"],
                        MP_PAD=a["padding"] // 2)
    else:
        d = ctx.defines(WINO_M=m, SEG_N=len(srcs))
        for k, src in enumerate(srcs):
            d.update({f"SEG{k}_C0": src.output.c0 - x.c0, f"SEG{k}_C": src.output.c,
                      f"SEG{k}_S": src.attrs["stride"] if src.op == "upsample" else 1})
    args = list(head)
    for k in range(2):
        if k < len(srcs):
            s = srcs[k].inputs[0]
            scale = srcs[k].attrs["scale"] if srcs[k].op == "upsample" else 1.0
            args += ctx.view(s) + i32(s.h, s.w) + [np.float32(scale)]
        else:
            args += [ctx.arena] + i32(0, 0, 0, 0) + [np.float32(1.0)]
    k = ctx.kernel("fused.cl", "yc_wino_input_fused", d, args)
    return Launch(k, (P, C, ctx.batch), None, node, "wino_input", {"m": m, "through": "+".join(s.op for s in srcs)})


def bind_nested_pools(ctx: BindContext, node: Node) -> list:
    """One launch computing every pool of a ``maxpool_nested`` node into its output views."""
    x = node.inputs[0]
    sizes, outs = node.attrs["sizes"], node.attrs["outputs"]
    radii = [s // 2 for s in sizes] + [0] * (3 - len(sizes))
    rows = row_kernels(ctx.rt)
    d = ctx.defines(MP_N=len(sizes), MP_R0=radii[0], MP_R1=radii[1], MP_R2=radii[2], MP_PIXELS=not rows)
    args = ctx.view(x) + i32(x.h, x.w)
    for k in range(3):
        args += ctx.view(outs[k]) if k < len(outs) else [ctx.arena, np.int32(0), np.int32(0)]
    k = ctx.kernel("fused.cl", "yc_maxpool_nested", d, args)
    return [Launch(k, (x.h if rows else x.h * x.w, x.c, ctx.batch), None, node, "maxpool_nested",
                   {"sizes": list(sizes)})]
