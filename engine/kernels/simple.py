"""Launches for the non-convolution layers (cl/layers.cl): one kernel each."""
from __future__ import annotations

import numpy as np

from . import BindContext, Launch, act_id, i32, row_kernels

CONN_WG = {"cpu": 1, "gpu": 64}   # yc_connected's lanes per output: a row per work-item on CPUs
from ..graph import Node


def bind(ctx: BindContext, node: Node) -> list:
    """The single launch that runs ``node``."""
    out = node.output
    a = node.attrs
    B = ctx.batch
    if node.op == "implicit":
        args = [_param(ctx, node, "value")] + ctx.view(out)
        return [_launch(ctx, node, "yc_fill", ctx.defines(), args, (out.c * out.h * out.w, B))]
    if node.op == "norm_channels":
        mode = a["mode"]
        d = ctx.defines(SOFTMAX="softmax" in mode, MAXVAL=mode.endswith("maxval"))
        return [_launch(ctx, node, "yc_norm_channels", d, ctx.view(out) + i32(out.c, out.h * out.w),
                        (out.h * out.w, B))]
    x = node.inputs[0]
    X, Y = ctx.view(x), ctx.view(out)
    hw = out.h * out.w
    d = ctx.defines()
    if node.op == "maxpool":
        args = X + i32(x.h, x.w) + Y + i32(out.h, out.w)
        rows = row_kernels(ctx.rt)
        window = ctx.defines(MP_SIZE=a["size"], MP_SX=a["stride_x"], MP_SY=a["stride_y"], MP_PAD=a["padding"] // 2,
                             MP_PIXELS=not rows)
        return [_launch(ctx, node, "yc_maxpool_rows", window, args, (out.h if rows else hw, out.c, B))]
    if node.op == "maxpool_depth":
        args = X + i32(x.c, x.h * x.w) + Y + i32(out.c)
        return [_launch(ctx, node, "yc_maxpool_depth", d, args, (hw, out.c, B))]
    if node.op == "avgpool":
        return [_launch(ctx, node, "yc_avgpool", d, X + i32(x.h * x.w) + Y, (out.c, B))]
    if node.op == "upsample":
        args = X + i32(x.h, x.w) + Y + [np.int32(a["stride"]), np.float32(a["scale"])]
        if row_kernels(ctx.rt):  # a row per work-item: no division per output element
            k = ctx.kernel("layers.cl", "yc_upsample_rows", ctx.defines(UP_S=a["stride"]), args)
            return [Launch(k, (x.h, out.c, B), None, node, "upsample")]
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
    act = ctx.defines(ACT=act_id(a.get("activation", "linear")))
    if node.op == "act":
        return [_launch(ctx, node, "yc_act", act, X + Y, (x.c * x.h * x.w, B))]
    if node.op == "batchnorm":
        args = X + Y + [_param(ctx, node, "weights"), _param(ctx, node, "bias"), np.int32(hw)]
        return [_launch(ctx, node, "yc_affine", act, args, (hw, out.c, B))]
    if node.op == "connected":
        args = X + Y + [_param(ctx, node, "weights"), _param(ctx, node, "bias"), np.int32(a["inputs"])]
        wg = CONN_WG["cpu" if ctx.rt.is_cpu else "gpu"]
        k = ctx.kernel("layers.cl", "yc_connected", dict(act, CONN_WG=wg), args)
        return [Launch(k, (out.c * wg, B), (wg, 1), node, "connected")]
    if node.op == "deconv":
        args = X + i32(x.c, x.h, x.w) + Y + i32(out.h, out.w) + [_param(ctx, node, "weights"), _param(ctx, node, "bias")] \
            + i32(a["size"], a["stride"], a["pad"])
        s = a["stride"]
        phases = s * s * (-(-out.h // s)) * (-(-out.w // s))
        return [_launch(ctx, node, "yc_deconv", act, args, (phases, out.c, B))]
    if node.op == "local":
        args = X + i32(x.c, x.h, x.w) + Y + i32(out.h, out.w, out.c) + \
            [_param(ctx, node, "weights"), _param(ctx, node, "bias")] + i32(a["size"], a["stride"], a["pad"])
        return [_launch(ctx, node, "yc_local", act, args, (hw, out.c, B))]
    if node.op == "crop":
        args = X + i32(x.h, x.w) + Y + i32(out.h, out.w, a["dy"], a["dx"]) + [np.float32(a["scale"]), np.float32(a["shift"])]
        return [_launch(ctx, node, "yc_crop", d, args, (hw, out.c, B))]
    if node.op == "local_avgpool":
        args = X + i32(x.h, x.w) + Y + i32(out.h, out.w, a["size"], a["stride_x"], a["stride_y"], a["padding"])
        return [_launch(ctx, node, "yc_local_avgpool", d, args, (hw, out.c, B))]
    if node.op == "reorg3d":
        args = X + i32(x.c, x.h, x.w) + Y + i32(a["stride"])
        return [_launch(ctx, node, "yc_reorg3d", d, args, (hw, out.c, B))]
    if node.op == "lrn":
        args = X + Y + i32(x.c, hw, a["size"]) + [np.float32(a["alpha"]), np.float32(a["beta"]), np.float32(a["kappa"])]
        return [_launch(ctx, node, "yc_lrn", d, args, (hw, B))]
    if node.op == "l2norm":
        return [_launch(ctx, node, "yc_l2norm", d, X + Y + i32(x.c, hw), (hw, B))]
    raise ValueError(f"no kernel for op {node.op}")


def _param(ctx: BindContext, node: Node, name: str):
    """A float32 device copy of ``node.attrs[name]`` (weights, bias, constant), uploaded once per layer."""
    key = ("param", node.layers[0], name)
    return ctx.cached(key, lambda: {"buf": ctx.rt.upload(np.ascontiguousarray(node.attrs[name], np.float32).ravel(),
                                                         f"{name} of layer {node.label}")})["buf"]


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
        act = act_id(node.attrs["activation"] if last else "linear")
        weighted = {}
        if (node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)) != (1.0, 1.0):   # one extra input
            weighted = {"SC_ALPHA": _cl_float(node.attrs["alpha"]), "SC_BETA": _cl_float(node.attrs["beta"])}
        if node.attrs.get("sc_weights") is not None:
            weighted = {"SC_WEIGHTS": True}
            args += [_shortcut_factors(ctx, node, start), np.int32(out.c), np.int32(out.h * out.w)]
        launches.append(_launch(ctx, node, "yc_add", ctx.defines(ACT=act, **weighted), args, (size, ctx.batch)))
        src = out
    return launches


def _shortcut_factors(ctx: BindContext, node: Node, start: int):
    """The device rows of factors one weighted-shortcut launch uses: its source (the previous
    layer for the first launch, the running sum, times 1, after), then its up to 3 inputs."""
    w = node.attrs["sc_weights"]
    rows = np.zeros((4, w.shape[1]), np.float32)
    rows[0] = w[0] if start == 0 else 1.0
    chunk = w[1 + start:4 + start]
    rows[1:1 + len(chunk)] = chunk
    key = ("shortcut factors", node.label, start, rows.tobytes())
    return ctx.cached(key, lambda: {"w": ctx.rt.upload(rows, f"shortcut factors of layer {node.label}")})["w"]


def _cl_float(v: float) -> str:
    """An exact OpenCL C float literal (hexadecimal) for a -D define."""
    return float(np.float32(v)).hex() + "f"


def _launch(ctx: BindContext, node: Node, name: str, defines: dict, args: list, gsize: tuple) -> Launch:
    return Launch(ctx.kernel("layers.cl", name, defines, args), gsize, None, node, name.replace("yc_", ""))
