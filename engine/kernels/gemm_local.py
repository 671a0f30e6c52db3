"""The GPU GEMM family (``cl/gemm_local.cl``): configs, legality, candidates, binding.

A config is a dict of the kernel's tunables (see the .cl file's header)::

    {"family": "local", "algo": "im2col" | "gemm1x1" | "implicit",
     "MWG": 64, "NWG": 64, "KWG": 16, "MDIMC": 8, "NDIMC": 8,
     "SA": 1, "SB": 1, "VWA": 4, "VWB": 1, "VA": 4, "VB": 4, "PF": 1}
    {"family": "local", "algo": "winograd", "m": 2, "MWG": 64, ...}   # Winograd's batched GEMM

``SK`` (optional, default 1) splits K over SK work-groups per C tile, for shapes whose M x N
gives too few work-groups to fill the device; a second kernel sums the partial planes (kept in
the workspace) and runs the epilogue. ``implicit`` gathers the im2col matrix inside the GEMM's B-tile load (no workspace, no
extra pass). Weights for this family are stored once, at bind time, transposed and
zero-padded (``pack_weights``) so A tiles never need bounds checks. ``candidates``
enumerates only configs that are legal for the device (work-group size, local memory)
and the shape (divisibility), for the tuner to search; ``heuristic`` is the untuned pick.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import (EPILOGUE_KEYS, BindContext, Launch, conv_gemm_shape, epilogue_defines, i32, is_depthwise,
               is_pointwise, marked, packed_upload, residual_args, write_target)
from . import winograd
from ..errors import YoloClError
from ..graph import Node
from ..precision import FMA_COMPETES

FAMILY = "local"
MPAD, KPAD = 128, 32            # A is padded to these: every MWG divides MPAD, every KWG divides KPAD
TUNABLES = ("MWG", "NWG", "KWG", "MDIMC", "NDIMC", "SA", "SB", "VWA", "VWB", "VA", "VB", "PF")
DERIVED = ("VWA", "VWB", "VA", "VB")      # set by ``complete`` from the tile, work-group and shape
ALGOS = ("gemm1x1", "im2col", "implicit")
SPLITS = (2, 4)                 # split-K factors the search tries
HEURISTIC_SPLIT = True          # the untuned pick splits K where tiles leave compute units idle


@dataclass(frozen=True)
class DeviceLimits:
    """What legality depends on: the largest work-group and the local memory per work-group."""

    max_wg: int = 1024
    local_mem: int = 48 * 1024
    compute_units: int = 64


def device_limits(rt) -> DeviceLimits:
    d = rt.device
    return DeviceLimits(int(d.max_work_group_size), int(d.local_mem_size), int(d.max_compute_units))


def round_up(x: int, r: int) -> int:
    return -(-x // r) * r


def _vec(n: int, cap: int = 4) -> int:
    """Largest vector width <= cap that divides n."""
    for w in (8, 4, 2, 1):
        if w <= cap and n % w == 0:
            return w
    return 1


def complete(cfg: dict, M: int, N: int, K: int, implicit: bool = False) -> dict:
    """Fill derived tunables (vector widths, defaults) for a tile/shape choice."""
    c = {"SA": 1, "SB": 1, "PF": 1, **cfg}
    mwi, nwi = c["MWG"] // c["MDIMC"], c["NWG"] // c["NDIMC"]
    threads = c["MDIMC"] * c["NDIMC"]
    c.setdefault("VA", _vec(mwi))
    c.setdefault("VB", _vec(nwi))
    if "VWA" not in c:
        c["VWA"] = 1 if not c["SA"] else next((w for w in (4, 2, 1) if c["MWG"] % w == 0 and (c["KWG"] * c["MWG"] // w) % threads == 0), 1)
    if "VWB" not in c:
        ok = not implicit and c["SB"]
        c["VWB"] = next((w for w in (4, 2, 1) if w == 1 or (ok and N % w == 0 and
                                                         (c["KWG"] * c["NWG"] // w) % threads == 0)), 1)
    return c


def fit(cfg: dict, M: int, N: int, K: int, implicit: bool = False, lim: DeviceLimits = DeviceLimits()) -> dict:
    """``cfg`` itself if legal for this exact shape, else the same tile with vector widths re-derived
    (a tuned entry found through a neighbouring size bucket may not divide this N)."""
    if why_illegal(cfg, M, N, K, implicit, lim) is None:
        return cfg
    core = {k: cfg[k] for k in ("MWG", "NWG", "KWG", "MDIMC", "NDIMC", "SA", "SB", "PF") if k in cfg}
    extra = {k: v for k, v in cfg.items() if k not in TUNABLES}
    sk = split_k(cfg)
    if sk > 1 and "KWG" in cfg and (sk - 1) * k_chunk(K, sk, int(cfg["KWG"])) >= K:
        extra["SK"] = 1                 # this K is too short for the split
    return {**extra, **complete(core, M, N, K, implicit)}


def fits_device(cfg: dict, lim: DeviceLimits) -> bool:
    """Whether the work-group size and local memory of ``cfg`` fit the device."""
    try:
        threads = int(cfg["MDIMC"]) * int(cfg["NDIMC"])
        local = (int(cfg.get("SA", 1)) * int(cfg["MWG"]) + int(cfg.get("SB", 1)) * int(cfg["NWG"])) * int(cfg["KWG"]) * 4
    except (KeyError, TypeError, ValueError):
        return True         # malformed: why_illegal names the problem
    return threads <= lim.max_wg and local <= lim.local_mem


def why_illegal(cfg: dict, M: int, N: int, K: int, implicit: bool = False,
                lim: DeviceLimits = DeviceLimits()) -> Optional[str]:
    """None if ``cfg`` can run this shape on a device with limits ``lim``, else the reason."""
    try:
        mwg, nwg, kwg, mdimc, ndimc = (int(cfg[k]) for k in ("MWG", "NWG", "KWG", "MDIMC", "NDIMC"))
        sa, sb, vwa, vwb, va, vb = (int(cfg[k]) for k in ("SA", "SB", "VWA", "VWB", "VA", "VB"))
    except KeyError as e:
        return f"missing tunable {e}"
    threads = mdimc * ndimc
    if MPAD % mwg or KPAD % kwg:
        return f"MWG must divide {MPAD} and KWG {KPAD}"
    if mwg % mdimc or nwg % ndimc:
        return "work-group shape must divide the tile"
    mwi, nwi = mwg // mdimc, nwg // ndimc
    if mwi % va or nwi % vb or va not in (1, 2, 4, 8) or vb not in (1, 2, 4, 8):
        return "fragment vector width must divide the register block"
    if mwi * nwi > 128:
        return "register block too large"
    if threads > lim.max_wg:
        return f"work-group of {threads} exceeds the device's {lim.max_wg}"
    if (sa * kwg * mwg + sb * kwg * nwg) * 4 > lim.local_mem:
        return "local memory exceeded"
    if sa and (mwg % vwa or (kwg * mwg // vwa) % threads):
        return "A tile does not split evenly over the work-group"
    if sb and (nwg % vwb or (kwg * nwg // vwb) % threads):
        return "B tile does not split evenly over the work-group"
    if vwb > 1 and (implicit or not sb or N % vwb):
        return "vector B loads need an explicit B and N divisible by the width"
    if implicit and (not sb or threads % nwg):
        return "implicit GEMM needs B staged and a work-group that is a multiple of NWG"
    if not sa and vwa != 1:
        return "VWA only applies to a staged A"
    sk = int(cfg.get("SK", 1))
    if sk > 1 and (sk > 8 or (sk - 1) * k_chunk(K, sk, kwg) >= K):
        return "every K split must be non-empty (and SK <= 8)"
    return None


def k_chunk(K: int, sk: int, kwg: int) -> int:
    """K rows per split (a multiple of KWG), as the kernel computes it."""
    return round_up(-(-K // sk), kwg)


def split_k(cfg: dict) -> int:
    return int(cfg.get("SK", 1))


def defines(ctx_defines: dict, cfg: dict, M: int, N: int, K: int) -> dict:
    """Kernel defines for ``cfg`` on this shape: tunables plus only the bounds checks it needs."""
    d = dict(ctx_defines)
    d.update({k: int(cfg[k]) for k in TUNABLES})
    d.update(tile_defines(cfg, M, N, K))
    return d


def tile_defines(cfg: dict, M: int, N: int, K: int) -> dict:
    """The split (SK) and the bounds checks a tile of MWG x NWG x KWG needs on this shape (both GPU GEMM families)."""
    d = {"SK": split_k(cfg)} if split_k(cfg) > 1 else {}
    d.update({f"CHECK_{dim}": True for dim, size, tile in (("M", M, "MWG"), ("N", N, "NWG"), ("K", K, "KWG"))
              if size % cfg[tile]})
    return d


def sizes(cfg: dict, M: int, N: int, Z: int) -> tuple:
    """(global size, local size) of the GEMM launch over Z = batch * groups matrices."""
    gs = (-(-N // cfg["NWG"]) * cfg["NDIMC"], -(-M // cfg["MWG"]) * cfg["MDIMC"], Z * split_k(cfg))
    return gs, (cfg["NDIMC"], cfg["MDIMC"], 1)


def partial_bytes(cfg: dict, M: int, N: int, Z: int) -> int:
    """Scratch for the split-K partial sums (float32); 0 without a split."""
    sk = split_k(cfg)
    return 4 * sk * Z * M * N if sk > 1 else 0


def scratch_bytes(node: Node, cfg: dict, batch: int, precision) -> int:
    """Scratch of a GPU GEMM family's config: im2col's or Winograd's (which keep no split-K: the
    workspace is theirs), or the float32 split-K partial sums of a gemm1x1 / implicit GEMM."""
    if cfg.get("algo") in ("im2col", "winograd"):
        return winograd.scratch_elems(node, batch, cfg) * precision.itemsize
    M, N, K, G = conv_gemm_shape(node)
    return partial_bytes(cfg, M, N, batch * G)


def launch_specs(cfg: dict, defines_: dict, M: int, N: int, K: int, G: int, Z: int, a_args: list,
                 b_args: list, c_args: list, r_args: list, extra: list, partial=None,
                 n_out: Optional[int] = None) -> list:
    """(kernel name, defines, args, global, local, label) of the launches that compute C under ``cfg``:
    the GEMM, and with SK > 1 the split sum (``partial``: a buffer of ``partial_bytes``) over
    ``n_out`` elements a row of C (default N: fewer where it stores a max-pool of the conv).

    a_args = [A, bias]; b_args = [B, off, batch stride, group stride, ldb]; c_args = [C, off,
    batch stride, ldc]; r_args = [R, off, batch stride]; extra = the implicit GEMM's [H, W, OW]."""
    dims = [np.int32(v) for v in (M, N, K, G)]
    gs, ls = sizes(cfg, M, N, Z)
    if split_k(cfg) == 1:
        return [("yc_gemm_local", defines_, a_args + b_args + c_args + r_args + dims + extra, gs, ls, "gemm_local")]
    gemm_c = [partial, np.int32(0), np.int32(0), np.int32(N)]
    return [("yc_gemm_local", defines_, a_args + b_args + gemm_c + r_args + dims + extra, gs, ls, "gemm_local"),
            ("yc_gemm_splitk", defines_, [partial, a_args[1]] + c_args + r_args + [np.int32(v) for v in (M, N, G)],
             (round_up(n_out or N, 64), M, Z), (64, 1, 1), "splitk_sum")]


def split_sum_spec(gemm_defines: dict, sk: int, partial, bias, c_args: list, r_args: list, M: int, N: int,
                   G: int, Z: int, n_out: Optional[int] = None) -> tuple:
    """(source, kernel name, defines, args, global, local) of ``yc_gemm_splitk`` summing another
    family's ``sk`` partial planes (``partial``) and running the epilogue over ``n_out`` elements a
    row (default N): built with only the GEMM's epilogue defines, so one program serves every
    config of that epilogue."""
    d = {**{k: v for k, v in gemm_defines.items() if k in EPILOGUE_KEYS}, "SK": sk}
    return ("gemm_local.cl", "yc_gemm_splitk", d, [partial, bias] + c_args + r_args + i32(M, N, G),
            (round_up(n_out or N, 64), M, Z), (64, 1, 1))


def pack_weights(w: np.ndarray, G: int, dtype=np.float32) -> np.ndarray:
    """[G*M][K] row-major weights -> [G][Kp][Mp], transposed and zero-padded (this family's A)."""
    gm, K = w.shape
    M = gm // G
    Mp, Kp = round_up(M, MPAD), round_up(K, KPAD)
    out = np.zeros((G, Kp, Mp), dtype)
    out[:, :K, :M] = w.reshape(G, M, K).transpose(0, 2, 1)
    return out


# -- the search space -------------------------------------------------------------------------
_TILES = [(128, 128), (128, 64), (64, 128), (64, 64), (128, 32), (32, 128), (64, 32), (32, 64), (32, 32),
          (16, 64), (64, 16), (16, 32), (32, 16), (16, 16)]
_SHAPES = [(16, 16), (8, 8), (8, 16), (16, 8), (8, 32), (32, 8), (4, 16), (16, 4), (8, 4), (4, 8), (4, 4),
           (4, 32), (32, 4)]


def space(M: int, N: int, K: int, implicit: bool = False, lim: DeviceLimits = DeviceLimits(),
          staged_only: bool = False) -> list:
    """Every legal config of the family for this shape (tiles x work-group shapes x KWG x staging x PF)."""
    out = []
    for (mwg, nwg), (mdimc, ndimc), kwg in itertools.product(_TILES, _SHAPES, (8, 16, 32)):
        if mwg % mdimc or nwg % ndimc:
            continue
        mwi, nwi = mwg // mdimc, nwg // ndimc
        if not (2 <= mwi * nwi <= 64) or mwi > 8 or nwi > 8:
            continue
        stagings = [(1, 1)] if (staged_only or implicit) else [(1, 1), (0, 0), (1, 0)]
        for (sa, sb), pf in itertools.product(stagings, (1, 0)):
            if not (sa or sb) and (pf or kwg != 8):
                continue        # barrier-free: PF and KWG are meaningless; keep one copy
            c = complete({"MWG": mwg, "NWG": nwg, "KWG": kwg, "MDIMC": mdimc, "NDIMC": ndimc,
                          "SA": sa, "SB": sb, "PF": pf}, M, N, K, implicit)
            if why_illegal(c, M, N, K, implicit, lim) is None:
                out.append(c)
                # Split K where the C tiles alone leave compute units idle (e.g. M=512, N=676 in
                # 64x64 tiles: 88 work-groups for 132 units) and K is long enough to share.
                tiles = -(-M // mwg) * -(-N // nwg)
                if sa and sb and pf and tiles < 2 * lim.compute_units:
                    for sk in SPLITS:
                        ck = {**c, "SK": sk}
                        if K >= 128 * sk and why_illegal(ck, M, N, K, implicit, lim) is None:
                            out.append(ck)
    return out


def waste(cfg: dict, M: int, N: int) -> float:
    """Fraction of the launched tile area that falls outside C (padding work)."""
    return 1.0 - (M * N) / (round_up(M, cfg["MWG"]) * round_up(N, cfg["NWG"]))


def heuristic(M: int, N: int, K: int, Z: int = 1, implicit: bool = False,
              lim: DeviceLimits = DeviceLimits()) -> dict:
    """An untuned pick: the biggest tile that still gives every compute unit several work-groups.

    Tuning yolov3 on an H100 found mid-size tiles with 4x4 / 4x2 register blocks winning at
    batch 1 (work-groups in flight matter more than per-work-item reuse), so those are offered.
    """
    prefs = [{"MWG": 128, "NWG": 128, "KWG": 16, "MDIMC": 16, "NDIMC": 16},
             {"MWG": 64, "NWG": 128, "KWG": 16, "MDIMC": 8, "NDIMC": 32},
             {"MWG": 128, "NWG": 64, "KWG": 16, "MDIMC": 16, "NDIMC": 8},
             {"MWG": 64, "NWG": 64, "KWG": 16, "MDIMC": 8, "NDIMC": 8},
             {"MWG": 64, "NWG": 32, "KWG": 16, "MDIMC": 8, "NDIMC": 8},
             {"MWG": 32, "NWG": 64, "KWG": 16, "MDIMC": 4, "NDIMC": 32},
             {"MWG": 64, "NWG": 16, "KWG": 16, "MDIMC": 16, "NDIMC": 8},
             {"MWG": 32, "NWG": 16, "KWG": 16, "MDIMC": 8, "NDIMC": 8}]
    best, best_score = None, None
    for p in prefs:
        c = complete(p, M, N, K, implicit)
        if why_illegal(c, M, N, K, implicit, lim) is not None:
            continue
        groups = -(-M // c["MWG"]) * -(-N // c["NWG"]) * Z
        fill = min(1.0, groups / (4 * lim.compute_units))
        score = fill * (1.0 - waste(c, M, N)) * (c["MWG"] * c["NWG"]) ** 0.25
        if best_score is None or score > best_score:
            best, best_score = c, score
    if best is None:        # tiny device: the smallest legal config
        best = min(space(M, N, K, implicit, lim, staged_only=True), key=lambda c: c["MDIMC"] * c["NDIMC"])
    groups = -(-M // best["MWG"]) * -(-N // best["NWG"]) * Z
    if HEURISTIC_SPLIT and groups < lim.compute_units and K >= 1024:
        # Too few tiles to fill the device and a long K: the H200 sweep's winners on YOLOv2's
        # N = 169..2704 shapes all split K by 4 (1.1-1.9x over the unsplit tile).
        for sk in sorted(SPLITS, reverse=True):
            if why_illegal({**best, "SK": sk}, M, N, K, implicit, lim) is None:
                return {**best, "SK": sk}
    return best


# -- conv binding -----------------------------------------------------------------------------
def conv_algos(node: Node) -> list:
    """Algorithms of this family that can run ``node``."""
    return ["gemm1x1", "implicit", "im2col"] if is_pointwise(node) else ["implicit", "im2col"]


def candidates(node: Node, rt, batch: int = 1) -> list:
    """Legal configs (with "algo" and "family") for ``node`` on ``rt``'s device."""
    M, N, K, G = conv_gemm_shape(node)
    lim = device_limits(rt)
    out = []
    for algo in conv_algos(node):
        for c in space(M, N, K, algo == "implicit", lim):
            out.append({"algo": algo, "family": FAMILY, **c})
    return out


def heuristic_config(node: Node, batch: int = 1, lim: DeviceLimits = DeviceLimits()) -> dict:
    """The untuned choice for a conv on a GPU: Winograd F(2x2) for 3x3 stride-1 convs with enough
    channels (2.6-4x faster than the implicit GEMM on yolov3's, H100), 1x1 straight from the
    input, others implicit."""
    if winograd.applicable(node) and node.attrs["in_c"] >= 16:
        return wino_heuristic(node, batch, 2, lim)
    M, N, K, G = conv_gemm_shape(node)
    algo = conv_algos(node)[0]
    return {"algo": algo, "family": FAMILY, **heuristic(M, N, K, batch * G, algo == "implicit", lim)}


def packed_weights(ctx: BindContext, node: Node) -> dict:
    """This family's weight layout and the bias, uploaded once per node and precision."""
    a = node.attrs
    return packed_upload(ctx, node, (node.layers[0], ctx.half, FAMILY),    # by layer: shared by every input size
                         lambda: pack_weights(a["weights"].reshape(a["filters"], -1), a["groups"], ctx.dtype))


def b_operand(ctx: BindContext, node: Node, algo: str) -> tuple:
    """(launches, B arguments) of a conv's GEMM: the input itself (gemm1x1, implicit), or an im2col
    pass into the workspace first. B arguments: [buffer, offset, batch stride, group stride, ldb]."""
    a = node.attrs
    M, N, K, G = conv_gemm_shape(node)
    x, out = node.inputs[0], node.output
    xb, xoff, xbs = ctx.view(x)
    if algo != "im2col":
        return [], [xb, xoff, xbs, np.int32((a["in_c"] // G) * x.h * x.w), np.int32(x.h * x.w)]
    KN = K * N
    ws = ctx.scratch(winograd.im2col_elems(node, ctx.batch) * ctx.itemsize)
    im2col_args = [xb, xoff, xbs] + i32(a["in_c"] // G, x.h, x.w) + [ws] + \
        i32(out.h, out.w, a["size"], a["stride_x"], a["stride_y"], a["pad"], a["dilation"], G)
    k = ctx.kernel("conv.cl", "yc_im2col", ctx.defines(), im2col_args)
    return [Launch(k, (N, K, ctx.batch * G), None, node, "im2col")], \
        [ws, np.int32(0), np.int32(G * KN), np.int32(KN), np.int32(N)]


def bind(ctx: BindContext, node: Node, cfg: dict) -> list:
    """Launches for a conv under a local-family config: [im2col,] GEMM, or Winograd's three."""
    if cfg["algo"] == "winograd":
        return bind_winograd(ctx, node, cfg)
    a = node.attrs
    M, N, K, G = conv_gemm_shape(node)
    x, out = node.inputs[0], node.output
    wts = packed_weights(ctx, node)
    algo = cfg["algo"]
    implicit = algo == "implicit"
    lim = device_limits(ctx.rt)
    if not fits_device(cfg, lim):       # e.g. the limit-blind default heuristic on a small GPU
        cfg = {**cfg, **heuristic(M, N, K, ctx.batch * G, implicit, lim)}
    cfg = fit(cfg, M, N, K, implicit, lim)
    reason = why_illegal(cfg, M, N, K, implicit, lim)
    if reason is not None:
        raise YoloClError(f"GEMM config {cfg} cannot run M={M} N={N} K={K}: {reason}")
    if algo not in ALGOS:
        raise YoloClError(f"algorithm '{algo}' is not one of the local GEMM family's {', '.join(ALGOS)}")
    launches, b_args = b_operand(ctx, node, algo)
    Z = ctx.batch * G
    if split_k(cfg) > 1 and (algo == "im2col" or ctx.workspace is None
                             or partial_bytes(cfg, M, N, Z) > ctx.workspace.size):
        cfg = {**cfg, "SK": 1}          # the partial sums live in the workspace, which im2col needs itself
    d = defines({**epilogue_defines(ctx, node), **ctx.half_math_defines()}, cfg, M, N, K)
    extra = []
    if implicit:
        d.update(IMPLICIT=True, KS=a["size"], SX=a["stride_x"], SY=a["stride_y"], PAD=a["pad"], DIL=a["dilation"])
        extra = i32(x.h, x.w, out.w)
    store = write_target(ctx, node, "sum" if split_k(cfg) > 1 else "")
    d.update(store.defines)
    specs = launch_specs(cfg, d, M, N, K, G, Z, [wts["A"], wts["bias"]], b_args, store.c_args,
                         residual_args(ctx, node), extra, ctx.workspace, store.n_out)
    for i, (name, dd, args, gs, ls, label) in enumerate(specs):
        k = ctx.kernel("gemm_local.cl", name, dd, args)
        launches.append(Launch(k, gs, ls, node, label, marked(cfg, store.writes, store.layout),
                               node.flops * ctx.batch if i == 0 else 0))
    return launches


def wino_candidates(node: Node, rt, tiles: tuple = winograd.TILE_SIZES) -> list:
    """Legal Winograd configs for ``node`` (tile sizes x the GEMM family's space).

    ``tiles``: the tile sizes the precision allows (F(4x4) loses too much to rounding in half).
    """
    if not winograd.applicable(node):
        return []
    lim = device_limits(rt)
    out = []
    for m in tiles:
        M, N, K, t2 = winograd.gemm_shape(node, m)
        out.extend({"algo": "winograd", "m": m, "family": FAMILY, **c} for c in space(M, N, K, False, lim)
                   if split_k(c) == 1)       # the workspace holds V and Mt: no room for split-K partials
    return out


def wino_heuristic(node: Node, batch: int = 1, m: int = 2, lim: DeviceLimits = DeviceLimits()) -> dict:
    M, N, K, t2 = winograd.gemm_shape(node, m)
    return {"algo": "winograd", "m": m, "family": FAMILY, **heuristic(M, N, K, batch * t2, False, lim)}


def wino_weights(ctx: BindContext, node: Node, m: int) -> dict:
    """U in this family's packed layout, and the bias; uploaded once per layer, precision, m."""
    def pack() -> np.ndarray:
        return pack_weights(winograd.point_filters(node, m), (m + 2) ** 2, ctx.dtype)
    return packed_upload(ctx, node, (node.layers[0], ctx.half, FAMILY, "winograd", m), pack, "Winograd weights")


def bind_winograd(ctx: BindContext, node: Node, cfg: dict) -> list:
    """Input transform, this family's GEMM batched over the T2 points, output transform + epilogue."""
    m = int(cfg.get("m", 2))
    M, P, C, t2 = winograd.checked_gemm_shape(node, m)
    lim = device_limits(ctx.rt)
    if not fits_device(cfg, lim):
        cfg = {**cfg, **heuristic(M, P, C, ctx.batch * t2, False, lim)}
    cfg = fit({**cfg, "SK": 1} if split_k(cfg) > 1 else cfg, M, P, C, False, lim)
    reason = why_illegal(cfg, M, P, C, False, lim)
    if reason is not None:
        raise YoloClError(f"Winograd GEMM config {cfg} cannot run M={M} N={P} K={C}: {reason}")
    wts = wino_weights(ctx, node, m)
    gd = defines(ctx.defines(NO_BIAS=True, **ctx.half_math_defines()), cfg, M, P, C)

    def gemm(gargs: list) -> Launch:
        gs, ls = sizes(cfg, M, P, ctx.batch * t2)
        return Launch(ctx.kernel("gemm_local.cl", "yc_gemm_local", gd, gargs), gs, ls, node, "wino_gemm",
                      dict(cfg), node.flops * ctx.batch)
    return winograd.transform_launches(ctx, node, m, wts, gemm)


def conv_cost(node: Node, cfg: dict, batch: int, rt) -> float:
    """A coarse prior for the GPU GEMM families: padding waste, occupancy, tile size, one pass
    saved by no im2col (the tensor-core family's tiles have the same economics, warps instead
    of work-items)."""
    if cfg["algo"] == "winograd":
        M, N, K, Z = winograd.gemm_shape(node, cfg.get("m", 2))     # Z = T2 GEMMs in one launch
    else:
        M, N, K, Z = conv_gemm_shape(node)                          # Z = conv groups
    work = Z * M * N * K * batch
    w = waste(cfg, M, N)
    groups = -(-M // cfg["MWG"]) * -(-N // cfg["NWG"]) * Z * batch * split_k(cfg)
    units = int(rt.device.max_compute_units)
    fill = min(1.0, groups / (2 * units))
    tile = (cfg["MWG"] * cfg["NWG"]) ** 0.5
    reuse = 1.0 + 16.0 / tile + (0.0 if cfg.get("SA", 1) and cfg.get("SB", 1) else 0.3)
    extra = (1.1 if cfg["algo"] == "im2col" else 1.0) * (1.05 if split_k(cfg) > 1 else 1.0)
    return work / max(fill, 1e-3) / (1 - w + 1e-6) * reuse * extra


class LocalGemm:
    """The kernel-family interface (see ``family.py``) of the local-memory GPU GEMM and its Winograd."""

    name = FAMILY
    tensor_cores = False
    timed_beside_tensor_cores = False
    derived, schedule, block = DERIVED, ("PF",), ("MWG", "NWG", "m")
    # Never channels-last: a work-item's register block leaves as runs along n (pixels), which a
    # channels-last store scatters C apart. At tf32 on an H200 (where its configs meet wgmma's
    # nhwc readers) so stored, yolov3 416's RGB conv took 0.097 ms, not 0.022, and its 1x1 at
    # 208x208 0.034, not 0.012: a plain store and the reader's transpose cost far less.
    stores_nhwc, reads_nhwc = (), ()

    def offered(self, rt, mma: str) -> bool:
        return not rt.is_cpu and (not mma or mma in FMA_COMPETES)

    def candidates(self, node: Node, rt, batch: int, precision, mma: str) -> list:
        if is_depthwise(node):
            return []
        return candidates(node, rt, batch) + wino_candidates(node, rt, precision.winograd_tiles)

    def heuristic(self, node: Node, rt, batch: int, precision, mma: str,
                  planes: bool = False) -> Optional[dict]:
        return None if is_depthwise(node) else heuristic_config(node, batch)

    def why_illegal(self, node: Node, cfg: dict, rt, mma: str = "") -> Optional[str]:
        if cfg["algo"] not in conv_algos(node) + ["winograd"]:
            return f"algorithm {cfg['algo']} of the local GEMM family cannot run {node.describe()}"
        return None

    def cost(self, node: Node, cfg: dict, batch: int, rt) -> float:
        return conv_cost(node, cfg, batch, rt)

    def workspace_bytes(self, node: Node, cfg: dict, batch: int, precision) -> int:
        return scratch_bytes(node, cfg, batch, precision)

    def bind(self, ctx: BindContext, node: Node, cfg: dict) -> list:
        return bind(ctx, node, cfg)


KERNEL_FAMILY = LocalGemm()
