"""The direct conv kernels (``cl/conv.cl`` + the plain ``cl/gemm.cl`` GEMM): depthwise convs, and
configs without a ``"family"`` (``{"algo": "im2col" | "gemm1x1", "TM": 4, "VW": 8, "KU": 1}``).

Depthwise convs (groups == channels == filters) run only here: ``{"algo": "depthwise"}``. The
family-less GEMM configs are what tables written by hand or by older versions hold; the
database never files them, and the tuner never proposes them.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from . import (BindContext, Launch, conv_gemm_shape, epilogue_defines, i32, is_depthwise, is_pointwise,
               residual_args)
from . import winograd
from ..graph import Node

FAMILY = None                   # its configs name no family
ALGOS = ("gemm1x1", "im2col", "depthwise")
LEGAL = (("TM", range(1, 33)), ("VW", (1, 2, 4, 8, 16)), ("KU", range(1, 17)))


def conv_shape(node: Node, batch: int = 1) -> dict:
    """The GEMM view of a conv by name: M (filters per group), N (output pixels), K, G, batch."""
    return dict(zip("MNKG", conv_gemm_shape(node)), B=batch)


def algorithms(node: Node) -> list:
    """Algorithms of these kernels that can run this conv."""
    if is_depthwise(node):
        return ["depthwise", "im2col"]
    if is_pointwise(node):
        return ["gemm1x1", "im2col"]
    return ["im2col"]


class Direct:
    """The kernel-family interface (see ``family.py``) of the direct kernels."""

    name = FAMILY
    tensor_cores = False
    timed_beside_tensor_cores = False
    derived, schedule, block = (), (), ()
    stores_nhwc, reads_nhwc = (), ()

    def offered(self, rt, mma: str) -> bool:
        return True

    def candidates(self, node: Node, rt, batch: int, precision, mma: str) -> list:
        return [{"algo": "depthwise"}] if is_depthwise(node) else []

    def heuristic(self, node: Node, rt, batch: int, precision, mma: str,
                  planes: bool = False) -> Optional[dict]:
        return {"algo": "depthwise"} if is_depthwise(node) else None

    def why_illegal(self, node: Node, cfg: dict, rt, mma: str = "") -> Optional[str]:
        if cfg["algo"] not in ALGOS:
            return f"algorithm {cfg['algo']} is not one of {', '.join(ALGOS)}"
        if cfg["algo"] not in algorithms(node):
            return f"algorithm {cfg['algo']} cannot run this layer"
        if cfg["algo"] != "depthwise":
            for key, legal in LEGAL:
                v = cfg.get(key, 1)
                if isinstance(v, bool) or not isinstance(v, int) or v not in legal:
                    return f"{key}={v!r} is not a legal value"
        return None

    def cost(self, node: Node, cfg: dict, batch: int, rt) -> float:
        return 0.0

    def workspace_bytes(self, node: Node, cfg: dict, batch: int, precision) -> int:
        return winograd.scratch_elems(node, batch, cfg) * precision.itemsize

    def bind(self, ctx: BindContext, node: Node, cfg: dict) -> list:
        reason = self.why_illegal(node, cfg, ctx.rt)
        if reason is not None:
            raise ValueError(reason)
        weights = upload_weights(ctx, node)
        if cfg["algo"] == "depthwise":
            return [_bind_depthwise(ctx, node, cfg, weights)]
        return _bind_gemm(ctx, node, cfg, weights)


KERNEL_FAMILY = Direct()


def upload_weights(ctx: BindContext, node: Node) -> dict:
    """Device copies of the folded weights (storage precision) and bias (float), uploaded once per layer."""
    a = node.attrs
    w = a["weights"].reshape(a["filters"], -1)
    return ctx.cached((node.layers[0], ctx.half), lambda: {   # same weights at every input size and batch
        "A": ctx.rt.upload(w.astype(ctx.dtype), f"weights of layer {node.label}"),
        "Af": ctx.rt.upload(w.astype(np.float32), f"weights of layer {node.label}") if is_depthwise(node) else None,
        "bias": ctx.rt.upload(a["bias"].astype(np.float32), f"bias of layer {node.label}"),
    })


def gemm_defines(ctx: BindContext, cfg: dict, s: dict, node: Node) -> dict:
    d = epilogue_defines(ctx, node)
    d.update(TM=cfg["TM"], VW=cfg["VW"], KU=cfg.get("KU", 1))
    if s["M"] % cfg["TM"]:
        d["CHECK_M"] = True
    if s["N"] % cfg["VW"]:
        d["CHECK_N"] = True
    return d


def gemm_global(cfg: dict, s: dict) -> tuple:
    return (-(-s["N"] // cfg["VW"]), -(-s["M"] // cfg["TM"]), s["B"] * s["G"])


def _bind_gemm(ctx: BindContext, node: Node, cfg: dict, wts: dict) -> list:
    a = node.attrs
    s = conv_shape(node, ctx.batch)
    x, out = node.inputs[0], node.output
    launches = []
    if cfg["algo"] == "gemm1x1":
        xb, xoff, xbs = ctx.view(x)
        b_args = [xb, xoff, xbs, np.int32(s["K"] * x.h * x.w), np.int32(x.h * x.w)]
    else:
        KN = s["K"] * s["N"]
        ws = ctx.scratch(winograd.im2col_elems(node, ctx.batch) * ctx.itemsize)
        im2col_args = ctx.view(x) + i32(a["in_c"] // a["groups"], x.h, x.w) + [ws] + \
            i32(out.h, out.w, a["size"], a["stride_x"], a["stride_y"], a["pad"], a["dilation"], a["groups"])
        k = ctx.kernel("conv.cl", "yc_im2col", ctx.defines(), im2col_args)
        launches.append(Launch(k, (s["N"], s["K"], s["B"] * s["G"]), None, node, "im2col"))
        b_args = [ws, np.int32(0), np.int32(s["G"] * KN), np.int32(KN), np.int32(s["N"])]
    yb, yoff, ybs = ctx.view(out)
    args = [wts["A"], wts["bias"]] + b_args + [yb, yoff, ybs, np.int32(s["N"])] + residual_args(ctx, node) + \
        i32(s["M"], s["N"], s["K"], s["G"])
    defines = gemm_defines(ctx, cfg, s, node)
    k = ctx.kernel("gemm.cl", "yc_gemm", defines, args)
    launches.append(Launch(k, gemm_global(cfg, s), None, node, "gemm", dict(cfg), node.flops * ctx.batch))
    return launches


def _bind_depthwise(ctx: BindContext, node: Node, cfg: dict, wts: dict) -> Launch:
    a = node.attrs
    x, out = node.inputs[0], node.output
    d = epilogue_defines(ctx, node)
    args = ctx.view(x) + i32(x.h, x.w) + [wts["Af"], wts["bias"]] + ctx.view(out) + residual_args(ctx, node) + \
        i32(out.h, out.w, a["size"], a["stride_x"], a["stride_y"], a["pad"], a["dilation"])
    k = ctx.kernel("conv.cl", "yc_depthwise", d, args)
    return Launch(k, (out.h * out.w, out.c, ctx.batch), None, node, "depthwise", dict(cfg), node.flops * ctx.batch)
