"""The CPU GEMM family (``cl/gemm.cl``): configs, legality, candidates, cost model, binding.

A config is a dict of the kernel's tunables::

    {"family": "cpu", "algo": "im2col" | "gemm1x1", "kernel": "nv" | "mv",
     "TM": 8, "VW": 8, "NV": 1, "KU": 1, "WG": 0}          # "nv": TM rows x VW*NV columns
    {"family": "cpu", "algo": ..., "kernel": "mv",
     "TN": 4, "VW": 8, "NV": 2, "KU": 1, "WG": 1}          # "mv": VW*NV rows x TN columns

``nv`` vectorises along N (output pixels), ``mv`` along M (filters); see the .cl header.
``WG`` is the work-group width along N: 0 lets the driver choose, n > 0 asks for (n, 1, 1)
(on PoCL a work-group is one task of its thread pool, looping over its work-items).
Weights are packed once per layout at bind time (``pack_weights``: [G][MB][K][rows]) so a k
step's weights are contiguous and the inner loop has no row checks. ``im2col`` uses this
family's row-wise ``yc_im2col_rows`` (a contiguous run per work-item).
"""
from __future__ import annotations

import itertools
from typing import Optional

import numpy as np

from . import BindContext, Launch, act_id, i32
from ..errors import YoloClError
from ..graph import Node

FAMILY = "cpu"
ALGOS = ("gemm1x1", "im2col")
KERNELS = ("nv", "mv")
VECTOR_WIDTHS = (1, 2, 4, 8, 16)
MAX_ACC = 128                 # accumulator floats per work-item: 16 AVX registers of 8 lanes
MAX_BLOCK = 16                # largest TM / TN


def round_up(x: int, r: int) -> int:
    return -(-x // r) * r


def block(cfg: dict) -> tuple:
    """(rows, columns) of C one work-item computes."""
    if cfg["kernel"] == "nv":
        return cfg["TM"], cfg["VW"] * cfg["NV"]
    return cfg["VW"] * cfg["NV"], cfg["TN"]


def grid(cfg: dict, M: int, N: int, Z: int) -> tuple:
    """Global size: (column blocks, row blocks, batch * groups)."""
    rows, cols = block(cfg)
    return -(-N // cols), -(-M // rows), Z


def local_size(cfg: dict) -> Optional[tuple]:
    wg = int(cfg.get("WG", 0))
    return None if wg == 0 else (wg, 1, 1)


def why_illegal(cfg: dict, M: int, N: int, K: int, max_wg: int = 4096) -> Optional[str]:
    """None if ``cfg`` can run an M x N x K GEMM on a device with work-groups up to ``max_wg``, else why."""
    try:
        kernel = cfg["kernel"]
        vw, nv, ku, wg = (cfg[k] for k in ("VW", "NV", "KU", "WG"))
        t = cfg["TM"] if kernel == "nv" else cfg["TN"]
    except KeyError as e:
        return f"missing tunable {e}"
    if kernel not in KERNELS:
        return f"kernel '{kernel}' is not one of {', '.join(KERNELS)}"
    for name, v in (("VW", vw), ("NV", nv), ("KU", ku), ("WG", wg), ("TM/TN", t)):
        if isinstance(v, bool) or not isinstance(v, int):
            return f"{name}={v!r} is not an integer"
    if vw not in VECTOR_WIDTHS:
        return f"VW={vw} is not one of {VECTOR_WIDTHS}"
    if not 1 <= nv <= 4 or not 1 <= t <= MAX_BLOCK or not 1 <= ku <= 16:
        return "NV must be 1-4, TM/TN 1-16 and KU 1-16"
    if t * vw * nv > MAX_ACC:
        return f"register block of {t * vw * nv} accumulators exceeds {MAX_ACC}"
    if wg < 0 or wg > max_wg:
        return f"work-group of {wg} exceeds the device's {max_wg}"
    if wg and grid(cfg, M, N, 1)[0] % wg:
        return f"work-group width {wg} does not divide the {grid(cfg, M, N, 1)[0]} column blocks"
    return None


def defines(ctx_defines: dict, cfg: dict, M: int, N: int) -> dict:
    """Kernel defines for ``cfg`` on this shape: tunables plus only the bounds checks it needs."""
    d = dict(ctx_defines)
    rows, cols = block(cfg)
    d.update(VW=cfg["VW"], NV=cfg["NV"], KU=cfg["KU"], PACK_A=True)
    if cfg["kernel"] == "nv":
        d["TM"] = cfg["TM"]
    else:
        d["TN"] = cfg["TN"]
    if M % rows:
        d["CHECK_M"] = True
    if N % cols:
        d["CHECK_N"] = True
    return d


def kernel_name(cfg: dict) -> str:
    return "yc_gemm" if cfg["kernel"] == "nv" else "yc_gemm_mv"


def pack_rows(cfg: dict) -> int:
    """Rows per packed weight panel (the register block's M extent)."""
    return block(cfg)[0]


def pack_weights(w: np.ndarray, G: int, rows: int, dtype=np.float32) -> np.ndarray:
    """[G*M][K] row-major weights -> [G][MB][K][rows], MB = ceil(M/rows), rows past M zero."""
    gm, K = w.shape
    M = gm // G
    MB = -(-M // rows)
    padded = np.zeros((G, MB * rows, K), dtype)
    padded[:, :M] = w.reshape(G, M, K)
    return np.ascontiguousarray(padded.reshape(G, MB, rows, K).transpose(0, 1, 3, 2))


# -- the search space -------------------------------------------------------------------------
_NV_BLOCKS = [(tm, vw, nv) for tm in (1, 2, 4, 6, 8, 12, 16) for vw, nv in
              ((4, 1), (8, 1), (4, 2), (8, 2), (16, 1), (8, 3))]
_MV_BLOCKS = [(tn, vw, nv) for tn in (1, 2, 3, 4, 6, 8, 12) for vw, nv in
              ((4, 1), (8, 1), (4, 2), (8, 2), (16, 1), (8, 3))]
KUS = (1, 2, 4)
WGS = (0, 1, 4)


def space(M: int, N: int, K: int, max_wg: int = 4096) -> list:
    """Every legal (kernel, block, KU, WG) of the family for this shape, minus blocks that pad
    more than they compute (e.g. 16-row blocks for M = 3)."""
    out = []
    for kernel, blocks in (("nv", _NV_BLOCKS), ("mv", _MV_BLOCKS)):
        for (t, vw, nv), ku, wg in itertools.product(blocks, KUS, WGS):
            c = {"kernel": kernel, "VW": vw, "NV": nv, "KU": ku, "WG": wg,
                 ("TM" if kernel == "nv" else "TN"): t}
            if t * vw * nv < 8 or why_illegal(c, M, N, K, max_wg) is not None:
                continue
            if waste(c, M, N) > 0.5:
                continue
            out.append(c)
    return out


def waste(cfg: dict, M: int, N: int) -> float:
    """Fraction of the computed block area that falls outside C (padding work)."""
    rows, cols = block(cfg)
    return 1.0 - (M * N) / (round_up(M, rows) * round_up(N, cols))


def cost(cfg: dict, M: int, N: int, K: int, Z: int = 1, threads: int = 2) -> float:
    """Relative time estimate (lower is better), used to order and prune the search.

    Per k step a block does rows*cols FMA lanes and loads (rows + cols) values, one side as
    vectors and the other as broadcasts; it is throughput-bound by the larger of the FMA
    vector count and the load count. Padding adds work; too few blocks leave threads idle;
    a long k loop over a wide strip streams B from outside L1.
    """
    rows, cols = block(cfg)
    vw = cfg["VW"]
    fma = rows * cols / vw
    loads = (cols / vw + rows) if cfg["kernel"] == "nv" else (rows / vw + cols)
    per_step = max(fma, 0.75 * loads) + 1.5          # + loop and address overhead
    if cfg["kernel"] == "mv" and N % cols:
        per_step += 0.1 * cols                        # clamped column loads
    blocks = -(-M // rows) * -(-N // cols) * Z
    work = blocks * K * per_step
    fill = min(1.0, blocks / (4 * threads))
    ku = cfg["KU"]
    unroll = 1.0 if ku == 1 else (0.97 if ku in (2, 4) else 0.99)
    wg = cfg.get("WG", 0)
    sched = 1.0 + (0.02 if wg == 0 else 0.0) + (0.03 if wg == 1 and blocks > 4096 else 0.0)
    return work / fill * unroll * sched


def heuristic(M: int, N: int, K: int, Z: int = 1) -> dict:
    """An untuned pick: the cost model's best over the register blocks, KU 1, driver work-groups."""
    best, best_cost = None, None
    for c in space(M, N, K):
        if c["KU"] != 1 or c["WG"] != 0:
            continue
        e = cost(c, M, N, K, Z)
        if best_cost is None or e < best_cost:
            best, best_cost = c, e
    return best or {"kernel": "nv", "TM": 1, "VW": 1, "NV": 1, "KU": 1, "WG": 0}


# -- conv binding -----------------------------------------------------------------------------
def conv_gemm_shape(node: Node) -> tuple:
    """(M, N, K, G) of a conv as GEMMs: filters per group, output pixels, K per group, groups."""
    a = node.attrs
    g = a["groups"]
    return a["filters"] // g, node.output.h * node.output.w, (a["in_c"] // g) * a["size"] ** 2, g


def is_pointwise(node: Node) -> bool:
    a = node.attrs
    return a["size"] == 1 and a["stride_x"] == 1 and a["stride_y"] == 1 and a["pad"] == 0


def conv_algos(node: Node) -> list:
    """Algorithms of this family that can run ``node``."""
    return ["gemm1x1"] if is_pointwise(node) else ["im2col"]


def max_work_group(rt) -> int:
    return int(rt.device.max_work_group_size)


def candidates(node: Node, rt, batch: int = 1) -> list:
    """Legal configs (with "algo" and "family") for ``node`` on ``rt``'s device."""
    M, N, K, G = conv_gemm_shape(node)
    out = []
    for algo in conv_algos(node):
        out.extend({"family": FAMILY, "algo": algo, **c} for c in space(M, N, K, max_work_group(rt)))
    return out


def heuristic_config(node: Node, batch: int = 1) -> dict:
    """The untuned choice for a conv on a CPU: 1x1 straight from the input, others via im2col."""
    M, N, K, G = conv_gemm_shape(node)
    return {"family": FAMILY, "algo": conv_algos(node)[0], **heuristic(M, N, K, batch * G)}


def conv_cost(node: Node, cfg: dict, batch: int = 1) -> float:
    """``cost`` for a conv config, plus the im2col pass (a K x N write and read) where it has one."""
    M, N, K, G = conv_gemm_shape(node)
    c = cost(cfg, M, N, K, batch * G)
    if cfg["algo"] == "im2col":
        c += 4.0 * K * N * batch * G / 8
    return c


def packed_weights(ctx: BindContext, node: Node, rows: int) -> dict:
    """Weights packed in ``rows``-row panels and the bias, uploaded once per node, precision and layout."""
    a = node.attrs
    key = (node.layers[0], ctx.half, FAMILY, rows)
    if key not in ctx.weight_cache:
        w = pack_weights(a["weights"].reshape(a["filters"], -1), a["groups"], rows, ctx.dtype)
        ctx.weight_cache[key] = {
            "A": ctx.rt.upload(w, f"weights of layer {node.label}"),
            "bias": ctx.rt.upload(a["bias"].astype(np.float32), f"bias of layer {node.label}"),
        }
    return ctx.weight_cache[key]


def epilogue_defines(ctx: BindContext, node: Node) -> dict:
    a = node.attrs
    d = ctx.defines(ACT=act_id(a["activation"]))
    if a.get("residual") is not None:
        d.update(RESIDUAL=True, ACT2=act_id(a["activation2"]))
    return d


def residual_args(ctx: BindContext, node: Node) -> list:
    r = node.attrs.get("residual")
    return ctx.view(r) if r is not None else [ctx.arena, np.int32(0), np.int32(0)]


def workspace_elems(node: Node, batch: int) -> int:
    """im2col scratch (the K x N matrix per image and group), 0 for a pointwise conv."""
    if is_pointwise(node):
        return 0
    M, N, K, G = conv_gemm_shape(node)
    return batch * G * K * N


def bind(ctx: BindContext, node: Node, cfg: dict) -> list:
    """Launches for a conv under a CPU-family config: [im2col,] GEMM."""
    a = node.attrs
    M, N, K, G = conv_gemm_shape(node)
    x, out = node.inputs[0], node.output
    algo = cfg.get("algo")
    if algo not in conv_algos(node):
        raise YoloClError(f"algorithm '{algo}' of the CPU GEMM family cannot run {node.describe()}")
    reason = why_illegal(cfg, M, N, K, max_work_group(ctx.rt))
    if reason is not None:
        raise YoloClError(f"GEMM config {cfg} cannot run M={M} N={N} K={K}: {reason}")
    wts = packed_weights(ctx, node, pack_rows(cfg))
    launches = []
    xb, xoff, xbs = ctx.view(x)
    if algo == "gemm1x1":
        b_args = [xb, xoff, xbs, np.int32(K * x.h * x.w), np.int32(x.h * x.w)]
    else:
        KN = K * N
        im2col_args = [xb, xoff, xbs] + i32(a["in_c"] // G, x.h, x.w) + [ctx.workspace] + \
            i32(out.h, out.w, a["size"], a["stride_x"], a["stride_y"], a["pad"], a["dilation"], G)
        k = ctx.kernel("gemm.cl", "yc_im2col_rows", ctx.defines(), im2col_args)
        launches.append(Launch(k, (out.h, K, ctx.batch * G), None, node, "im2col"))
        b_args = [ctx.workspace, np.int32(0), np.int32(G * KN), np.int32(KN), np.int32(N)]
    yb, yoff, ybs = ctx.view(out)
    args = [wts["A"], wts["bias"]] + b_args + [yb, yoff, ybs, np.int32(N)] + residual_args(ctx, node) + \
        i32(M, N, K, G)
    d = defines(epilogue_defines(ctx, node), cfg, M, N)
    k = ctx.kernel("gemm.cl", kernel_name(cfg), d, args)
    launches.append(Launch(k, grid(cfg, M, N, ctx.batch * G), local_size(cfg), node, "gemm",
                           dict(cfg), node.flops * ctx.batch))
    return launches
