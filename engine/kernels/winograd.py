"""Winograd F(m x m, 3x3) convolution (``cl/winograd.cl``) for 3x3 stride-1 convs, m = 2 or 4.

The filter transform U = G g G^T runs once, at bind time, in float64 on the host; the
T2 = (m+2)^2 element-wise products are one batched GEMM of a GEMM family (G = T2 groups,
M = filters, N = tiles, K = channels); the output transform carries the conv epilogue. This
module holds the transforms; the families that run Winograd (``gemm_local``, ``gemm_cpu``)
import it and add their GEMM. A config is the GEMM's plus the tile size::

    {"algo": "winograd", "m": 2, "family": "local", "MWG": 64, ...}

F(2x2) cuts the multiplies 2.25x, F(4x4) 4x but with larger transform constants and so
more rounding error: ``tests/test_winograd.py`` measures both against a direct conv, and the
tuner keeps F(4x4) only where it is faster.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from . import BindContext, Launch, epilogue_defines, fused, i32, marked, residual_args, written_pool
from ..errors import YoloClError
from ..graph import Node

TILE_SIZES = (2, 4)

# Lavin & Gray's matrices: filter transform G (t x 3) for each output tile size m.
_G = {
    2: np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64),
    4: np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                 [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64),
}


def applicable(node: Node) -> bool:
    """3x3, stride 1, no dilation, one group: the convs Winograd F(m, 3x3) computes."""
    a = node.attrs
    return (a["size"] == 3 and a["stride_x"] == 1 and a["stride_y"] == 1 and a["dilation"] == 1
            and a["groups"] == 1)


def tile_grid(node: Node, m: int) -> tuple:
    """(TH, TW, P): the grid of m x m output tiles and their count."""
    th, tw = -(-node.output.h // m), -(-node.output.w // m)
    return th, tw, th * tw


def gemm_shape(node: Node, m: int) -> tuple:
    """(M, N, K, groups) of the batched GEMM: filters x tiles x channels, (m+2)^2 of them."""
    a = node.attrs
    return a["filters"], tile_grid(node, m)[2], a["in_c"], (m + 2) ** 2


def checked_gemm_shape(node: Node, m: int) -> tuple:
    """``gemm_shape``, after a clear error where F(m x m, 3x3) cannot run ``node`` (a family's bind)."""
    if not applicable(node) or m not in TILE_SIZES:
        raise YoloClError(f"Winograd F({m}x{m},3x3) cannot run {node.describe()}")
    return gemm_shape(node, m)


def workspace_elems(node: Node, batch: int, m: int = 2) -> int:
    """Transformed input V plus the GEMM's products Mt, for ``batch`` images."""
    M, P, C, t2 = gemm_shape(node, m)
    return batch * t2 * P * (C + M)


def im2col_elems(node: Node, batch: int) -> int:
    """im2col's K x N matrix per image and group."""
    a = node.attrs
    g = a["groups"]
    return batch * g * (a["in_c"] // g) * a["size"] ** 2 * node.output.h * node.output.w


def scratch_elems(node: Node, batch: int, cfg: Optional[dict] = None) -> int:
    """A conv's scratch under ``cfg``'s algorithm: im2col's matrix, Winograd's transformed input and
    products for its tile size, 0 for algorithms that read the input in place (gemm1x1, implicit,
    depthwise). ``cfg`` None: the largest of any algorithm and tile size (a device-free report)."""
    algo = None if cfg is None else cfg.get("algo")
    if algo == "im2col":
        return im2col_elems(node, batch)
    if algo == "winograd":      # the fused kernel (a CPU family's) keeps V and the products in private memory
        return 0 if cfg.get("kernel") == "fused" else workspace_elems(node, batch, int(cfg.get("m", 2)))
    if cfg is not None:
        return 0
    wino = max(workspace_elems(node, batch, m) for m in TILE_SIZES) if applicable(node) else 0
    return max(im2col_elems(node, batch), wino)


def filter_transform(w: np.ndarray, m: int) -> np.ndarray:
    """(F, C, 3, 3) filters -> U (T2, F, C) = G g G^T, flattened over the transform points."""
    G = _G[m]
    # One GEMM with the Kronecker product (G (x) G is (t*t, 9)): this runs at every start-up for
    # every Winograd layer, so no einsum (100x slower) and float32 (3x faster than float64; the
    # 9-term sums lose ~1e-7 relative, far below what the Winograd GEMM itself rounds) for
    # float32 weights, as the graph stores them.
    t = m + 2
    F, C = w.shape[0], w.shape[1]
    dt = np.result_type(w.dtype, np.float32)          # float64 weights (tests) keep float64
    with np.errstate(invalid="ignore", over="ignore"):   # absurd weights stay absurd, quietly
        U = np.kron(G, G).astype(dt) @ np.asarray(w, dt).reshape(F * C, 9).T   # (t*t, F*C)
    return U.reshape(t * t, F, C)


def point_filters(node: Node, m: int) -> np.ndarray:
    """The batched GEMM's A before a family packs it: U (``filter_transform``) as (T2 * F, C), the
    filters of each transform point in turn (T2 groups of F rows)."""
    U = filter_transform(node.attrs["weights"], m)
    return U.reshape(-1, U.shape[2])


def tile_groups(node: Node, m: int, vt: int, rows: bool = False) -> int:
    """Work-items along a transform's first dimension: one per tile (``vt`` 1), or one per group
    of ``vt`` consecutive tiles in row-major order (the tile-vector kernels), with ``rows`` groups
    cut at tile-row ends."""
    th, tw, p = tile_grid(node, m)
    return th * -(-tw // vt) if rows else -(-p // vt)


def rows_grouped(tw: int, vt: int) -> bool:
    """Whether the tile-vector output transform cuts its groups at row ends (``WINO_ROWS``): where
    a row's groups leave at most one lane idle, so storing a group's outputs in one piece pays."""
    return vt > 1 and tw % vt in (0, vt - 1)


def transform_launches(ctx: BindContext, node: Node, m: int, wts: dict, gemm, vt: int = 1) -> list:
    """Input transform, the GEMMs over the T2 points, output transform + epilogue: the launches
    of either GEMM family's Winograd conv. ``gemm(args)`` makes the family's GEMM launch from the
    shared argument list (A = ``wts["A"]`` in that family's layout, B = V, C = Mt, no bias).
    ``vt`` > 1 runs the transforms ``vt`` tiles to a work-item as SIMD lanes (``*_vt`` kernels: the
    CPU family's), 1 a tile to a work-item (the driver vectorises, as GPUs do across a warp)."""
    out = node.output
    M, P, C, t2 = gemm_shape(node, m)
    tw = tile_grid(node, m)[1]
    B, ws = ctx.batch, ctx.scratch(workspace_elems(node, ctx.batch, m) * ctx.itemsize)
    v_off, m_off = 0, B * t2 * C * P
    groups = tile_groups(node, m, vt)
    launches = [fused.wino_input(ctx, node, m, v_off, tw, P, vt, groups)]   # through a folded maxpool/upsample if marked
    gargs = [wts["A"], wts["bias"], ws] + i32(v_off, t2 * C * P, C * P, P) + [ws] + i32(m_off, t2 * M * P, P) + \
        [ws, np.int32(0), np.int32(0)] + i32(M, P, C, t2)
    launches.append(gemm(gargs))
    od = epilogue_defines(ctx, node)
    od["WINO_M"] = m
    pool = written_pool(ctx, node) if vt > 1 else None      # the tile-vector store can pool (WPOOL)
    oargs = [ws] + i32(m_off, M, P, tw) + [wts["bias"]] + ctx.view(pool.output if pool else out) + \
        i32(out.h, out.w) + residual_args(ctx, node)
    info = marked({"m": m, "vt": vt} if vt > 1 else {"m": m}, "maxpool" if pool else "")
    if vt > 1:
        od["WINO_VT"] = vt
    od["WPOOL"] = pool is not None
    if rows_grouped(tw, vt):
        od["WINO_ROWS"] = info["rows"] = True
        groups = tile_groups(node, m, vt, rows=True)
    k_out = ctx.kernel("winograd.cl", "yc_wino_output_vt" if vt > 1 else "yc_wino_output", od, oargs)
    launches.append(Launch(k_out, (groups, M, B), None, node, "wino_output", info))
    return launches
