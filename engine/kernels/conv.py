"""Convolution launches: pick an algorithm and a kernel config, bind weights and views.

Algorithms (``config["algo"]``):
- ``gemm1x1``: 1x1 stride-1 conv, the input *is* the B matrix, no im2col;
- ``im2col``: im2col into a shared workspace, then the generated GEMM;
- ``depthwise``: direct kernel for groups == channels == filters.
The GEMM kernel is ``cl/gemm.cl`` specialised by the config's defines; the tuner
(or, without one, :func:`heuristic_config`) chooses them per layer shape.
"""
from __future__ import annotations

import logging

import numpy as np

from . import BindContext, Launch, conv_gemm_shape, epilogue_defines, i32, is_pointwise, residual_args
from . import gemm_cpu, gemm_local, gemm_mma, winograd
from ..errors import YoloClError, reason
from ..graph import Node

log = logging.getLogger("yolo_cl.kernels")
_WARNED: set = set()   # (device, layer, config) already reported as falling back


def conv_shape(node: Node, batch: int = 1) -> dict:
    """The GEMM view of a conv by name: M (filters per group), N (output pixels), K, G, batch."""
    return dict(zip("MNKG", conv_gemm_shape(node)), B=batch)


def is_depthwise(node: Node) -> bool:
    a = node.attrs
    return a["groups"] > 1 and a["groups"] == a["in_c"] == a["filters"]


def algorithms(node: Node) -> list:
    """Algorithms that can run this conv."""
    if is_depthwise(node):
        return ["depthwise", "im2col"]
    if is_pointwise(node):
        return ["gemm1x1", "im2col"]
    return ["im2col"]


def heuristic_config(node: Node, device_is_cpu: bool, batch: int = 1, half: bool = False, mma: str = "") -> dict:
    """A sane untuned choice: the layer's natural algorithm and a mid-size register block
    (``half``: for half storage, which rules out some algorithms on a CPU; on tensor cores,
    ``mma`` = "f16" or "tf32", the mma family)."""
    algo = algorithms(node)[0]
    if algo == "depthwise":
        return {"algo": algo}
    if mma:
        return gemm_mma.heuristic_config(node, mma, batch)
    if not device_is_cpu:
        return gemm_local.heuristic_config(node, batch)
    return gemm_cpu.heuristic_config(node, batch, half)


def cpu_candidates(node: Node, rt, batch: int = 1) -> list:
    """Legal CPU-family configs for ``node`` (barrier-free GEMM: gemm1x1/im2col), for the tuner."""
    if is_depthwise(node):
        return []
    return gemm_cpu.candidates(node, rt, batch)


def gpu_candidates(node: Node, rt, batch: int = 1, mma: str = "") -> list:
    """Legal GPU-family configs for ``node`` (local GEMM: gemm1x1/implicit/im2col; Winograd; on
    tensor cores, ``mma``, the mma family alone), for the tuner."""
    if is_depthwise(node):
        return []
    if mma:
        return gemm_mma.candidates(node, rt, mma, batch)
    return gemm_local.candidates(node, rt, batch) + winograd.candidates(node, rt, batch)


def workspace_elems(node: Node, batch: int) -> int:
    """im2col scratch for the worst algorithm this node may run (tuner may pick im2col)."""
    if "im2col" not in algorithms(node):
        return 0
    s = conv_shape(node, batch)
    wino = max(winograd.workspace_elems(node, batch, m) for m in winograd.TILE_SIZES) \
        if winograd.applicable(node) else 0
    return max(s["B"] * s["G"] * s["K"] * s["N"], wino)


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


def bind(ctx: BindContext, node: Node, config: dict = None) -> list:
    """Launches for one conv node under ``config`` (default: the tuning database or heuristic)."""
    if config is None:
        return _bind_chosen(ctx, node)
    algo = config["algo"]
    if config.get("family") == gemm_cpu.FAMILY:
        return gemm_cpu.bind(ctx, node, config)
    if algo == "winograd":
        return winograd.bind(ctx, node, config)
    if config.get("family") == gemm_local.FAMILY:
        return gemm_local.bind(ctx, node, config)
    if config.get("family") == gemm_mma.FAMILY:
        return gemm_mma.bind(ctx, node, config)
    weights = upload_weights(ctx, node)
    if algo == "depthwise":
        return [_bind_depthwise(ctx, node, config, weights)]
    return _bind_gemm(ctx, node, config, weights)


def _bind_chosen(ctx: BindContext, node: Node) -> list:
    """Bind the tuning database's choice; if it cannot be built or bound, warn once and use the heuristic.

    A tuned config comes from a file written on some other day, driver or device: one that
    no longer compiles (or is malformed) must cost speed, never the model.
    """
    fallback = heuristic_config(node, ctx.rt.is_cpu, ctx.batch, ctx.half, ctx.mma)
    if ctx.tuning is None:
        return bind(ctx, node, fallback)
    config = None
    try:
        config = ctx.tuning.conv_config(node, ctx.batch)
        if ctx.mma and isinstance(config, dict) and config.get("family") != gemm_mma.FAMILY \
                and config.get("algo") != "depthwise":
            config = fallback       # FMA configs (tuned or heuristic) do not compete with tensor cores
        _check_basic_config(node, config)
        return bind(ctx, node, config)
    except (YoloClError, KeyError, TypeError, ValueError, ctx.rt.cl.Error) as e:
        if config == fallback:
            raise
        key = (ctx.rt.device_name, node.label, repr(config))
        if key not in _WARNED:
            _WARNED.add(key)
            log.warning("layer %s (%s): tuned config %s failed on %s (%s); using the heuristic config %s",
                        node.label, node.describe(), config, ctx.rt.device_name, reason(e), fallback)
    return bind(ctx, node, fallback)


def _check_basic_config(node: Node, config) -> None:
    """ValueError if a config of this module's own family cannot run ``node`` (other families check themselves)."""
    if not isinstance(config, dict) or "algo" not in config:
        raise ValueError(f"config {config!r} is not a dict with an 'algo'")
    if config.get("family") is not None or config["algo"] not in ("gemm1x1", "im2col", "depthwise"):
        return
    if config["algo"] not in algorithms(node):
        raise ValueError(f"algorithm {config['algo']} cannot run this layer")
    if config["algo"] != "depthwise":
        for key, legal in (("TM", range(1, 33)), ("VW", (1, 2, 4, 8, 16)), ("KU", range(1, 17))):
            v = config.get(key, 1)
            if isinstance(v, bool) or not isinstance(v, int) or v not in legal:
                raise ValueError(f"{key}={v!r} is not a legal value")


def upload_weights(ctx: BindContext, node: Node) -> dict:
    """Device copies of the folded weights (storage precision) and bias (float), uploaded once per node."""
    a = node.attrs
    w = a["weights"].reshape(a["filters"], -1)
    return ctx.cached((node.layers[0], ctx.half), lambda: {   # same weights at every input size and batch
        "A": ctx.rt.upload(w.astype(ctx.dtype), f"weights of layer {node.label}"),
        "Af": ctx.rt.upload(w.astype(np.float32), f"weights of layer {node.label}") if is_depthwise(node) else None,
        "bias": ctx.rt.upload(a["bias"].astype(np.float32), f"bias of layer {node.label}"),
    })


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
        im2col_args = ctx.view(x) + i32(a["in_c"] // a["groups"], x.h, x.w) + [ctx.workspace] + \
            i32(out.h, out.w, a["size"], a["stride_x"], a["stride_y"], a["pad"], a["dilation"], a["groups"])
        k = ctx.kernel("conv.cl", "yc_im2col", ctx.defines(), im2col_args)
        launches.append(Launch(k, (s["N"], s["K"], s["B"] * s["G"]), None, node, "im2col"))
        b_args = [ctx.workspace, np.int32(0), np.int32(s["G"] * KN), np.int32(KN), np.int32(s["N"])]
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
