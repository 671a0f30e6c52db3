"""Launches for the non-convolution layers (cl/layers.cl): one kernel each."""
from __future__ import annotations

import numpy as np

from . import BindContext, Launch, act_id, i32
from ..graph import Node


def bind(ctx: BindContext, node: Node) -> list:
    """The single launch that runs ``node``."""
    x = node.inputs[0]
    out = node.output
    a = node.attrs
    B = ctx.batch
    X, Y = ctx.view(x), ctx.view(out)
    hw = out.h * out.w
    d = ctx.defines()
    if node.op == "maxpool":
        args = X + i32(x.h, x.w) + Y + i32(out.h, out.w)
        window = ctx.defines(MP_SIZE=a["size"], MP_SX=a["stride_x"], MP_SY=a["stride_y"], MP_PAD=a["padding"] // 2)
        return [_launch(ctx, node, "yc_maxpool_rows", window, args, (out.h, out.c, B))]
    if node.op == "maxpool_depth":
        args = X + i32(x.c, x.h * x.w) + Y + i32(out.c)
        return [_launch(ctx, node, "yc_maxpool_depth", d, args, (hw, out.c, B))]
    if node.op == "avgpool":
        return [_launch(ctx, node, "yc_avgpool", d, X + i32(x.h * x.w) + Y, (out.c, B))]
    if node.op == "upsample":
        args = X + i32(x.h, x.w) + Y + [np.int32(a["stride"]), np.float32(a["scale"])]
        return [_launch(ctx, node, "yc_upsample", d, args, (hw, out.c, B))]
    if node.op == "reorg":
        args = X + i32(x.c, x.h, x.w) + Y + i32(a["stride"])
        return [_launch(ctx, node, "yc_reorg", d, args, (x.h * x.w, x.c, B))]
    if node.op == "add":
        return _bind_add(ctx, node)
    if node.op in ("scale_channels", "sam"):
        f = node.inputs[1]
        flag = {"SAM": True} if node.op == "sam" else ({"SCALE_WH": True} if a["scale_wh"] else {})
        args = X + ctx.view(f) + Y + i32(hw)
        return [_launch(ctx, node, "yc_scale", ctx.defines(ACT=act_id(a["activation"]), **flag), args, (hw, out.c, B))]
    if node.op == "softmax":
        n = out.c * hw // a["groups"]
        args = X + Y + [np.int32(n), np.float32(a["temperature"])]
        return [_launch(ctx, node, "yc_softmax", d, args, (a["groups"], B))]
    if node.op == "copy":
        return [_launch(ctx, node, "yc_copy", d, X + Y, (x.c * x.h * x.w, B))]
    raise ValueError(f"no kernel for op {node.op}")


def _bind_add(ctx: BindContext, node: Node) -> list:
    """Shortcut add: up to three extra inputs per launch (chained for more)."""
    out = node.output
    size = out.c * out.h * out.w
    extras = node.inputs[1:]
    launches = []
    src = node.inputs[0]
    for start in range(0, max(len(extras), 1), 3):
        chunk = extras[start:start + 3]
        last = start + 3 >= len(extras)
        args = ctx.view(src) + ctx.view(out)
        for j in range(3):
            if j < len(chunk):
                v = chunk[j]
                args += ctx.view(v) + i32(v.c * v.h * v.w)
            else:
                args += [ctx.arena, np.int32(0), np.int32(0), np.int32(0)]
        act = act_id(node.attrs["activation"]) if last else 0
        launches.append(_launch(ctx, node, "yc_add", ctx.defines(ACT=act), args, (size, ctx.batch)))
        src = out
    return launches


def _launch(ctx: BindContext, node: Node, name: str, defines: dict, args: list, gsize: tuple) -> Launch:
    return Launch(ctx.kernel("layers.cl", name, defines, args), gsize, None, node, name.replace("yc_", ""))
