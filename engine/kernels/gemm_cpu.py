"""The CPU GEMM family (``cl/gemm.cl``): configs, legality, candidates, cost model, binding.

A config is a dict of the kernel's tunables::

    {"family": "cpu", "algo": "im2col" | "gemm1x1", "kernel": "nv" | "mv",
     "TM": 8, "VW": 8, "NV": 1, "KU": 1, "WG": 0}          # "nv": TM rows x VW*NV columns
    {"family": "cpu", "algo": ..., "kernel": "mv",
     "TN": 4, "VW": 8, "NV": 2, "KU": 1, "WG": 1}          # "mv": VW*NV rows x TN columns
    {"family": "cpu", "algo": "winograd", "m": 2, "kernel": ..., ...}
    {"family": "cpu", "algo": "implicit", "kernel": "nv", ...}

``nv`` vectorises along N (output pixels), ``mv`` along M (filters); see the .cl header.
``WG`` is the work-group width along dimension 0: 0 lets the driver choose, n > 0 asks for
(n, 1, 1) (on PoCL a work-group is one task of its thread pool, looping over its work-items).
``ORD`` orders the grid: 0 walks column blocks first (consecutive work-items share their A
panel), 1 row blocks first (they share their B strip, the better order when B is large).
Weights are packed once per layout at bind time (``pack_weights``: [G][MB][K][rows]) so a k
step's weights are contiguous and the inner loop has no row checks. ``im2col`` uses this
family's row-wise ``yc_im2col_rows`` (a contiguous run per work-item); ``implicit`` (stride-1
convs, ``nv`` blocks whose width divides the output rows) reads the input directly and
skips the im2col pass. ``winograd`` (3x3
stride-1 convs) runs ``cl/winograd.cl``'s input and output transforms around this family's
GEMM, batched over the (m+2)^2 transform points: F(2x2) does 2.25x and F(4x4) 4x fewer
multiplies than the direct GEMM. Its transforms run ``VT`` (default ``WINO_VT``, 8) neighbouring
tiles to a work-item as SIMD lanes (``yc_wino_*_vt``: contiguous row loads and swizzles instead
of one gather per element; ``VT`` 1 keeps the one-tile kernels the GPU family uses).
``kernel`` ``fused`` runs it as one launch (``yc_wino_fused``: a work-item transforms a group of
8 consecutive tiles' input channels into private memory, multiplies them by ``KB`` output channels' weights
at a time and inverse-transforms them into the output), for layers of few input channels::

    {"family": "cpu", "algo": "winograd", "m": 4, "kernel": "fused", "KB": 8, "KS": 1}
"""
from __future__ import annotations

import itertools
from typing import Optional

import numpy as np

from . import (BindContext, Launch, conv_gemm_shape, epilogue_defines, i32, is_depthwise, is_pointwise,
               marked, packed_upload, residual_args, written_pool)
from . import winograd
from ..errors import YoloClError
from ..graph import Node
from ..precision import FP32, Precision
from ..runtime import wide_vectors

FAMILY = "cpu"
ALGOS = ("gemm1x1", "im2col", "implicit", "winograd")
KERNELS = ("nv", "mv")
VECTOR_WIDTHS = (1, 2, 4, 8, 16)
MAX_ACC = 128                 # accumulator floats per work-item: 16 AVX registers of 8 lanes
MAX_BLOCK = 16                # largest TM / TN
WINO_VT = 8                   # Winograd transforms: tiles per work-item, as SIMD lanes (cl/winograd.cl)
WINO_VTS = (1, 8)             # legal VT: the one-tile kernels, or 8 lanes (yc_wino_input_vt swizzles 8)
# The fused Winograd's tunables (cl/winograd.cl ``yc_wino_fused``, 8 tiles a work-item): KB output
# channels per register block (KB accumulator vectors), the output channels cut into KS slices
# (work-items along dimension 1; each slice transforms the input again). A work-item keeps its
# tiles' transformed input in private memory, (m+2)^2 * C vectors of 8 floats: at most
# FUSED_MAX_PRIVATE bytes (PoCL keeps private arrays on its worker threads' stacks), which bounds
# C (142 channels at F(4x4)).
FUSED_KBS = (4, 6, 8, 12)
FUSED_KSS = (1, 2, 4)
FUSED_MAX_PRIVATE = 160 * 1024


def round_up(x: int, r: int) -> int:
    return -(-x // r) * r


def block(cfg: dict) -> tuple:
    """(rows, columns) of C one work-item computes."""
    if cfg["kernel"] == "nv":
        return cfg["TM"], cfg["VW"] * cfg["NV"]
    return cfg["VW"] * cfg["NV"], cfg["TN"]


def grid(cfg: dict, M: int, N: int, Z: int) -> tuple:
    """Global size: (column blocks, row blocks, batch * groups), or rows first with ORD=1."""
    rows, cols = block(cfg)
    g = (-(-N // cols), -(-M // rows), Z)
    return (g[1], g[0], Z) if cfg.get("ORD", 0) else g


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
    order = cfg.get("ORD", 0)
    for name, v in (("VW", vw), ("NV", nv), ("KU", ku), ("WG", wg), ("TM/TN", t), ("ORD", order)):
        if isinstance(v, bool) or not isinstance(v, int):
            return f"{name}={v!r} is not an integer"
    if vw not in VECTOR_WIDTHS:
        return f"VW={vw} is not one of {VECTOR_WIDTHS}"
    if not 1 <= nv <= 4 or not 1 <= t <= MAX_BLOCK or not 1 <= ku <= 16 or order not in ORDS:
        return "NV must be 1-4, TM/TN 1-16, KU 1-16 and ORD 0 or 1"
    if t * vw * nv > MAX_ACC:
        return f"register block of {t * vw * nv} accumulators exceeds {MAX_ACC}"
    if wg < 0 or wg > max_wg:
        return f"work-group of {wg} exceeds the device's {max_wg}"
    if wg and grid(cfg, M, N, 1)[0] % wg:
        return f"work-group width {wg} does not divide the {grid(cfg, M, N, 1)[0]} blocks of dimension 0"
    return None


def defines(ctx_defines: dict, cfg: dict, M: int, N: int) -> dict:
    """Kernel defines for ``cfg`` on this shape: tunables plus only the bounds checks it needs."""
    d = dict(ctx_defines)
    rows, cols = block(cfg)
    d.update(VW=cfg["VW"], NV=cfg["NV"], KU=cfg["KU"], PACK_A=True, MFIRST=bool(cfg.get("ORD", 0)))
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
# Register blocks worth trying: 8-wide vectors (one AVX register), two or three of them, or one
# 16-wide; shapes a wider vector or another split would only duplicate are left out.
_NV_BLOCKS = ([(tm, 8, 1) for tm in (2, 4, 6, 8, 12)] + [(tm, 8, 2) for tm in (2, 4, 6)] +
              [(tm, 16, 1) for tm in (2, 4, 6)] + [(tm, 8, 3) for tm in (2, 4)])
_MV_BLOCKS = ([(tn, 8, 1) for tn in (2, 3, 4, 6, 8, 12)] + [(tn, 8, 2) for tn in (2, 3, 4, 6)] +
              [(tn, 16, 1) for tn in (2, 4, 6)] + [(tn, 8, 3) for tn in (2, 3, 4)])
KUS = (1, 4)
WGS = (0, 1)
ORDS = (0, 1)


def registers_needed(cfg: dict, lanes: int = 8) -> int:
    """SIMD registers one k step keeps live: accumulators, the loaded vectors, one broadcast."""
    rows, cols = block(cfg)
    per_vec = max(1, cfg["VW"] // lanes)
    return -(-rows * cols // max(min(cfg["VW"], lanes), 1)) + cfg["NV"] * per_vec + 1


def simd(rt) -> tuple:
    """(lanes, registers) of the device's SIMD unit: 16 x 8 floats (AVX2), 32 x 16 (AVX-512)."""
    lanes = int(getattr(rt.device, "native_vector_width_float", 8) or 8)
    return (16, 32) if wide_vectors(lanes) else (max(lanes, 4), 16)


def modelled_unit(rt) -> tuple:
    """(lanes, registers) the untuned pick and the search's cost model assume for ``rt``'s CPU: its
    own where it has 16-float vectors (AVX-512, measured on a Zen 5), else the 8-float unit their
    rules were measured on (AVX2; narrower units too, as before: no data says otherwise)."""
    lanes, registers = simd(rt)
    return (lanes, registers) if wide_vectors(lanes) else (8, 16)


def space(M: int, N: int, K: int, max_wg: int = 4096, lanes: int = 8, registers: int = 16) -> list:
    """Every legal (kernel, block, KU, WG) of the family for this shape: blocks whose accumulators
    fit the register file, minus those that pad more than they compute (e.g. 16 rows for M = 3)."""
    out = []
    for kernel, blocks in (("nv", _NV_BLOCKS), ("mv", _MV_BLOCKS)):
        for (t, vw, nv), ku, wg, order in itertools.product(blocks, KUS, WGS, ORDS):
            c = {"kernel": kernel, "VW": vw, "NV": nv, "KU": ku, "WG": wg, "ORD": order,
                 ("TM" if kernel == "nv" else "TN"): t}
            if registers_needed(c, lanes) > registers or why_illegal(c, M, N, K, max_wg) is not None:
                continue
            if waste(c, M, N) > 0.5:
                continue
            out.append(c)
    return out


def waste(cfg: dict, M: int, N: int) -> float:
    """Fraction of the computed block area that falls outside C (padding work)."""
    rows, cols = block(cfg)
    return 1.0 - (M * N) / (round_up(M, rows) * round_up(N, cols))


def cost(cfg: dict, M: int, N: int, K: int, Z: int = 1, threads: int = 2, lanes: int = 8,
         registers: int = 16, l2_bytes: int = 512 * 1024) -> float:
    """Relative time estimate (lower is better), used to order and prune the search.

    Per k step a block does rows*cols FMA lanes and loads (rows + cols) values, one side as
    vectors and the other as broadcasts; it is throughput-bound by the larger of the FMA
    vector count and the load count. Accumulators beyond the SIMD register file (``registers``
    of ``lanes`` floats) spill; padding adds work; too few blocks leave threads idle.
    """
    rows, cols = block(cfg)
    vw = cfg["VW"]
    width = min(vw, lanes)                           # floats one vector instruction works on
    fma = rows * cols / width
    loads = (cols / vw + rows) if cfg["kernel"] == "nv" else (rows / vw + cols)
    per_step = max(fma, 0.75 * loads) + 1.5          # + loop and address overhead
    live = rows * cols / width + cfg["NV"] * max(1, vw // lanes) + 1
    if live > registers:
        per_step *= 1.0 + 0.15 * (live - registers)   # spills: a load and a store per extra register
    if cfg["kernel"] == "mv" and N % cols:
        per_step += 0.1 * cols                        # clamped column loads
    mb, nb = -(-M // rows), -(-N // cols)
    blocks = mb * nb * Z
    work = blocks * K * per_step
    fill = min(1.0, blocks / (4 * threads))
    ku = cfg["KU"]
    unroll = 1.0 if ku == 1 else (0.97 if ku in (2, 4) else 0.99)
    # Consecutive work-items run back to back on one core and share one operand: the A panel
    # (ORD 0, column blocks first) or the B strip (ORD 1). The other operand is re-read once per
    # block of the shared one; from L3 or memory when it is larger than a core's L2.
    order = cfg.get("ORD", 0)
    other, passes = (4.0 * K * N, mb) if order == 0 else (4.0 * K * M, nb)
    traffic = 0.0 if other <= l2_bytes else Z * other * (passes - 1) * (0.1 if other <= 16 * 2 ** 20 else 0.3)
    # Each work-group is one task of the driver's thread pool: a fixed cost that matters when a
    # block's k loop is short. With WG=0 the driver picks groups along dimension 0 (up to ~16).
    wg = cfg.get("WG", 0)
    dim0 = nb if order == 0 else mb
    groups = blocks / (wg if wg else max(1, min(16, dim0)))
    return (work * unroll + traffic + 150.0 * groups) / fill


# The heuristic's fixed tunables: on recorded PoCL traversals (tools/heuristic_eval.py) a k loop
# unrolled by 4, one work-item per work-group and column blocks first were the better choice on
# most shapes, where the cost model's estimates of these three are weakest. Behind im2col (a B
# matrix 9x the input) the tuner picked row blocks first (ORD 1) on all five stride-2 shapes of
# yolov4 416.
HEURISTIC_FIXED = {"KU": 4, "WG": 1, "ORD": 0}
HEURISTIC_ORD = {"im2col": 1}          # for strided convs (a stride-1 one has the implicit GEMM)


def heuristic(M: int, N: int, K: int, Z: int = 1, fits=None, order: int = HEURISTIC_FIXED["ORD"],
              lanes: int = 8, registers: int = 16) -> dict:
    """An untuned pick: the cost model's best register block with ``HEURISTIC_FIXED`` tunables
    and grid ``order`` (and, given ``fits``, only blocks it accepts), for a SIMD unit of
    ``registers`` registers of ``lanes`` floats (:func:`simd`)."""
    best, best_cost = None, None
    for c in space(M, N, K, lanes=lanes, registers=registers):
        c = {**c, **HEURISTIC_FIXED, "ORD": order}
        if why_illegal(c, M, N, K) is not None or (fits is not None and not fits(c)):
            continue
        e = cost(c, M, N, K, Z, lanes=lanes, registers=registers)
        if best_cost is None or e < best_cost:
            best, best_cost = c, e
    return best or {"kernel": "nv", "TM": 1, "VW": 1, "NV": 1, "KU": 1, "WG": 0}


# -- conv binding -----------------------------------------------------------------------------
def conv_algos(node: Node) -> list:
    """Algorithms of this family that can run ``node``."""
    if is_pointwise(node):
        return ["gemm1x1"]
    algos = ["im2col"]
    if node.attrs["stride_x"] == 1:
        algos.append("implicit")
    if winograd.applicable(node):
        algos.append("winograd")
    return algos


def conv_illegal(node: Node, cfg: dict) -> Optional[str]:
    """Why ``cfg`` cannot run ``node`` beyond the GEMM's own legality, or None."""
    if cfg.get("algo") == "implicit":
        if cfg.get("kernel") != "nv":
            return "the implicit GEMM is an nv kernel"
        if node.output.w % (cfg["VW"] * cfg["NV"]):
            return f"block width {cfg['VW'] * cfg['NV']} does not divide the output width {node.output.w}"
    return None


def gemm_shape(node: Node, cfg: dict) -> tuple:
    """(M, N, K, G) of the GEMM a config runs: the conv's, or Winograd's batched one."""
    if cfg.get("algo") == "winograd":
        return winograd.gemm_shape(node, int(cfg.get("m", 2)))
    return conv_gemm_shape(node)


def max_work_group(rt) -> int:
    return int(rt.device.max_work_group_size)


def candidates(node: Node, rt, batch: int = 1, precision: Precision = FP32) -> list:
    """Legal configs (with "algo" and "family") for ``node`` on ``rt``'s device (Winograd with the
    tile sizes ``precision`` allows)."""
    out = []
    for algo in conv_algos(node):
        for m in (precision.winograd_tiles if algo == "winograd" else (None,)):
            head = {"family": FAMILY, "algo": algo} if m is None else {"family": FAMILY, "algo": algo, "m": m}
            M, N, K, G = gemm_shape(node, head)
            out.extend(c for c in ({**head, **c} for c in space(M, N, K, max_work_group(rt), *simd(rt)))
                       if conv_illegal(node, c) is None)
            if m is not None:
                out.extend(fused_space(node, m))
    return out


def fused_illegal(node: Node, cfg: dict) -> Optional[str]:
    """Why fused Winograd config ``cfg`` cannot run ``node``, or None."""
    m, kb, ks = cfg.get("m", 2), cfg.get("KB"), cfg.get("KS", 1)
    if kb not in FUSED_KBS or ks not in FUSED_KSS:
        return f"fused Winograd needs KB in {FUSED_KBS} and KS in {FUSED_KSS}, not KB={kb} KS={ks}"
    private = (m + 2) ** 2 * node.attrs["in_c"] * WINO_VT * 4
    if private > FUSED_MAX_PRIVATE:
        return f"fused Winograd over {node.attrs['in_c']} channels needs {private} bytes of private memory"
    return None


def fused_slices(filters: int, kb: int, ks: int) -> tuple:
    """(register blocks per work-item, work-items along dimension 1): ``filters`` in blocks of
    ``kb`` cut into ``ks`` slices, or fewer where there are fewer blocks."""
    mb = -(-filters // kb)
    per = -(-mb // ks)
    return per, -(-mb // per)


def fused_groups(node: Node, m: int) -> int:
    """Work-items along dimension 0 of the fused Winograd: groups of WINO_VT consecutive tiles in
    row-major order (a group continues on the next tile row, so only the last may be partial)."""
    return -(-winograd.tile_grid(node, m)[2] // WINO_VT)


def fused_space(node: Node, m: int) -> list:
    """The fused Winograd's legal configs for ``node`` with tile size ``m`` (a KS that slices the
    filters no finer than a smaller one is left out)."""
    head = {"family": FAMILY, "algo": "winograd", "m": m, "kernel": "fused"}
    out = []
    for kb in FUSED_KBS:
        seen = set()
        for ks in FUSED_KSS:
            c = {**head, "KB": kb, "KS": ks}
            slices = fused_slices(node.attrs["filters"], kb, ks)
            if slices not in seen and fused_illegal(node, c) is None:
                out.append(c)
            seen.add(slices)
    return out


# Stride-1 convs with K up to this (3x3 over 16 channels) run the implicit GEMM untuned: on the
# recorded traversals it beat im2col 1.9-3.2x and Winograd 2.7-9x there (the transforms dominate),
# with IMPLICIT_BLOCK where its 16 columns divide the output rows.
IMPLICIT_MAX_K = 144
IMPLICIT_BLOCK = {"kernel": "nv", "TM": 4, "VW": 8, "NV": 2}   # the best implicit block on both recorded shapes
# ... and so do those over at least IMPLICIT_LARGE_N pixels with K up to IMPLICIT_LARGE_MAX_K (3x3
# over 32 channels at 208x208 in yolov3 and yolov4 416): by process CPU time (load 14) the implicit
# GEMM took 14.2 ms there against 17.6-24.8 ms for Winograd F(4x4), whose transforms dominate at so
# few channels, and 15.0 ms for the shipped im2col entry.
IMPLICIT_LARGE_N = 32768
IMPLICIT_LARGE_MAX_K = 288


# 1x1 convs over at least this many output pixels run POINTWISE_BLOCK untuned: their B (the input
# itself) outgrows a core's L2, and walking the row blocks first so consecutive work-items share
# the B strip is what the tuner chose on the large-map 1x1 shapes of yolov4 416. By process CPU
# time over all 1x1 shapes (load 14-18, one process, weighted by count), the heuristic came to
# 1.10x the shipped entries' total on yolov4 416 (1.48x with the cost model's pick there: mv
# blocks, column blocks first) and 1.17x on yolov3 416; a 6-row block did as well on yolov4 but
# 2x worse on yolov3's 512->256 at 26x26.
POINTWISE_MIN_N = 512
POINTWISE_BLOCK = {"kernel": "nv", "TM": 4, "VW": 8, "NV": 2, "KU": 4, "WG": 1, "ORD": 1}


# Winograd-able convs over at most FUSED_MAX_C input channels, or FUSED_WIDE_C over at least
# FUSED_WIDE_MIN_N output pixels, run the fused Winograd untuned, with the largest tile the
# precision allows and FUSED_BLOCK. Per conv (events clock, idle, best of 5 interleaved rounds) it
# took 0.38-0.75x the time of the shipped unfused-Winograd or implicit entries on every such shape
# over 16-64 channels of yolov3-tiny, yolov4-tiny, yolov3 and yolov4 at 416, where the transforms'
# traffic and launches dominate the unfused Winograd's layers; over 3 channels (the first conv)
# 0.73x (yolov3-tiny) to 0.97x (yolov4, where mish dominates). Over 128 channels it won at 38x38
# and larger (416: yolov3's 128 -> 256 at 52x52 0.73x, yolov4-tiny's 128 -> 128 0.76x; 608:
# 0.58-0.85x) and lost at 26x26 (1.1-1.2x: 49 tiles make 7 work-items for 2 cores).
FUSED_MAX_C = 64
FUSED_WIDE_C, FUSED_WIDE_MIN_N = 128, 1024
FUSED_BLOCK = {"kernel": "fused", "KB": 8, "KS": 1}


# On a SIMD unit of 16 floats (AVX-512; PoCL reports native float vectors of 16) the untuned pick
# takes a block of six 16-float vectors: 6 rows x 16 columns (``nv``) where the GEMM's N is a
# multiple of 16, else 16 rows x 6 columns (``mv``: a ragged N, e.g. 13x13 or 26x26 maps, or
# Winograd's few tiles), k unrolled once, one work-item a work-group, row blocks first (column
# blocks first for Winograd's batched GEMM). Timed on a Zen 5 (Debian's PoCL 3.1) over the 101
# conv shapes of eight networks and sizes, weighted by how often each occurs: 523 ms against 640
# with the cost model's blocks and the 8-lane tunables, and 509 for the tuned entries
# (BENCHMARKS.md, thirty-first session). There the fused Winograd stops at FUSED_MAX_C channels.
WIDE_FIXED = {"VW": 16, "NV": 1, "KU": 1, "WG": 1}
WIDE_ORD = {"winograd": 0}             # else 1


def wide_block(cfg: dict, N: int) -> dict:
    """``cfg`` (a GEMM config of the family) with the 16-lane unit's block and tunables for a GEMM
    of N columns (see ``WIDE_FIXED``)."""
    head = {k: v for k, v in cfg.items() if k not in ("kernel", "TM", "TN", "VW", "NV", "KU", "WG", "ORD")}
    block = {"kernel": "nv", "TM": 6} if N % 16 == 0 else {"kernel": "mv", "TN": 6}
    return {**head, **block, **WIDE_FIXED, "ORD": WIDE_ORD.get(cfg.get("algo"), 1)}


def widened(block: dict, lanes: int) -> dict:
    """A rule's register block of 8-float vectors on a SIMD unit of ``lanes`` floats: the same
    rows and columns in 16-float vectors where the unit has them (NV 2 of 8 -> NV 1 of 16)."""
    if wide_vectors(lanes) and block.get("VW") == 8 and block.get("NV", 1) % 2 == 0:
        return {**block, "VW": 16, "NV": block["NV"] // 2}
    return block


def heuristic_config(node: Node, batch: int = 1, precision: Precision = FP32, simd_unit: tuple = (8, 16)) -> dict:
    """The untuned choice for a conv on a CPU whose SIMD unit is ``simd_unit`` (lanes, registers:
    :func:`simd`): the fused Winograd by rule (``FUSED_MAX_C``, ``FUSED_WIDE_C``), the fixed rules
    below, else the cost model's best algorithm and block (Winograd with the tile sizes
    ``precision`` allows, as in the tuner's candidates); on a 16-lane unit the GEMMs' blocks and
    tunables by :func:`wide_block`."""
    best, best_cost = None, None
    algos = conv_algos(node)
    M, N, K, G = conv_gemm_shape(node)
    cin = node.attrs["in_c"]
    # half storage converts every load: there the 16-float blocks ran 8-13% slower than the 8-float
    # picks (yolov3-tiny and yolov4-tiny 416 on the Zen 5), so it keeps those
    lanes, registers = (8, 16) if precision.half else simd_unit
    # on a 16-float unit the unfused Winograd's GEMM on 16-float blocks beats the fused one from
    # 128 channels on: at 52x52 and 64x64 0.72-1.29 against 0.92-1.40 ms (thirty-first session)
    wide_fused = not wide_vectors(lanes) and cin <= FUSED_WIDE_C and N >= FUSED_WIDE_MIN_N
    if "winograd" in algos and (cin <= FUSED_MAX_C or wide_fused):
        cfg = {"family": FAMILY, "algo": "winograd", "m": max(precision.winograd_tiles), **FUSED_BLOCK}
        if fused_illegal(node, cfg) is None:
            return cfg
    if algos == ["gemm1x1"] and (N >= POINTWISE_MIN_N or wide_vectors(lanes)):
        cfg = {"family": FAMILY, "algo": "gemm1x1", **POINTWISE_BLOCK}
        cfg = wide_block(cfg, N) if wide_vectors(lanes) else cfg
        if why_illegal(cfg, M, N, K) is None:
            return cfg
    if "implicit" in algos and (K <= IMPLICIT_MAX_K or (N >= IMPLICIT_LARGE_N and K <= IMPLICIT_LARGE_MAX_K)):
        head = {"family": FAMILY, "algo": "implicit"}
        fits = lambda c: conv_illegal(node, {**head, **c}) is None       # noqa: E731
        for cfg in ({**head, **widened(IMPLICIT_BLOCK, lanes), **HEURISTIC_FIXED},
                    {**head, **IMPLICIT_BLOCK, **HEURISTIC_FIXED},
                    {**head, **heuristic(M, N, K, batch * G, fits, lanes=lanes, registers=registers)}):
            if why_illegal(cfg, M, N, K) is None and conv_illegal(node, cfg) is None:
                return cfg
    for algo in algos:
        for m in (precision.winograd_tiles if algo == "winograd" else (None,)):
            head = {"family": FAMILY, "algo": algo} if m is None else {"family": FAMILY, "algo": algo, "m": m}
            M, N, K, G = gemm_shape(node, head)
            fits = lambda c, head=head: conv_illegal(node, {**head, **c}) is None   # noqa: E731
            strided = node.attrs["stride_x"] > 1 or node.attrs["stride_y"] > 1
            order = HEURISTIC_ORD.get(algo, HEURISTIC_FIXED["ORD"]) if strided else HEURISTIC_FIXED["ORD"]
            wide = wide_block(head, N) if wide_vectors(lanes) and algo != "implicit" else None
            if wide is not None and why_illegal(wide, M, N, K) is None and conv_illegal(node, wide) is None:
                cfg = wide              # the 16-lane rule's block: no search
            else:
                cfg = {**head, **heuristic(M, N, K, batch * G, fits, order, lanes, registers)}
                if conv_illegal(node, cfg) is not None:
                    continue
            c = conv_cost(node, cfg, batch, (lanes, registers))
            if best_cost is None or c < best_cost:
                best, best_cost = cfg, c
    return best


def fused_cost(node: Node, cfg: dict, batch: int = 1, threads: int = 2) -> float:
    """``cost``'s units for the fused Winograd: per work-item (8 tiles) the multiplies, a step of
    KB FMAs and KB + 1 loads per transform point, channel and block, the input transform of every
    channel (again in every slice) and the inverse transform and epilogue of every filter."""
    m, kb, ks = int(cfg.get("m", 2)), cfg["KB"], cfg.get("KS", 1)
    t2, C, F = (m + 2) ** 2, node.attrs["in_c"], node.attrs["filters"]
    per, slices = fused_slices(F, kb, ks)
    items = fused_groups(node, m) * slices * batch
    step = max(kb, 0.75 * (kb + 1)) + 1.5
    work = items * (t2 * C * per * step + 8.0 * t2 * C + 6.0 * per * kb * (t2 + m * m))
    return work / min(1.0, items / (4 * threads))


def conv_cost(node: Node, cfg: dict, batch: int = 1, simd_unit: tuple = (8, 16)) -> float:
    """``cost`` for a conv config on a SIMD unit of (lanes, registers), plus the passes around the
    GEMM: im2col (a K x N write and read), Winograd's transforms (T2 x (K + M) x N values, each
    several adds)."""
    if cfg.get("kernel") == "fused":
        return fused_cost(node, cfg, batch)
    M, N, K, G = gemm_shape(node, cfg)
    c = cost(cfg, M, N, K, batch * G, lanes=simd_unit[0], registers=simd_unit[1])
    if cfg["algo"] == "implicit":
        c *= 1.05                    # edge runs and row bookkeeping
    elif cfg["algo"] == "im2col":
        c += 4.0 * K * N * batch * G / 8
    elif cfg["algo"] == "winograd":
        c += 12.0 * G * (K + M) * N * batch / 8
    return c


def packed_weights(ctx: BindContext, node: Node, rows: int) -> dict:
    """Weights packed in ``rows``-row panels and the bias, uploaded once per node, precision and layout."""
    a = node.attrs
    return packed_upload(ctx, node, (node.layers[0], ctx.half, FAMILY, rows),
                         lambda: pack_weights(a["weights"].reshape(a["filters"], -1), a["groups"], rows, ctx.dtype))


def bind(ctx: BindContext, node: Node, cfg: dict) -> list:
    """Launches for a conv under a CPU-family config: [im2col,] GEMM, or Winograd's three."""
    a = node.attrs
    x, out = node.inputs[0], node.output
    algo = cfg.get("algo")
    reason = KERNEL_FAMILY.why_illegal(node, cfg, ctx.rt)
    if reason is not None:
        raise YoloClError(reason)
    if algo == "winograd" and cfg.get("kernel") == "fused":
        return _bind_wino_fused(ctx, node, cfg)
    M, N, K, G = gemm_shape(node, cfg)
    if algo == "winograd":
        return _bind_winograd(ctx, node, cfg)
    wts = packed_weights(ctx, node, pack_rows(cfg))
    launches = []
    xb, xoff, xbs = ctx.view(x)
    extra, d = [], defines({**epilogue_defines(ctx, node), **ctx.half_math_defines()}, cfg, M, N)
    if algo in ("gemm1x1", "implicit"):
        b_args = [xb, xoff, xbs, np.int32(K // a["size"] ** 2 * x.h * x.w), np.int32(x.h * x.w)]
        if algo == "implicit":
            d.update(IMPLICIT=True, IM_KS=a["size"], IM_SY=a["stride_y"], IM_PAD=a["pad"], IM_DIL=a["dilation"])
            extra = i32(x.h, x.w, out.w)
    else:
        KN = K * N
        ws = ctx.scratch(winograd.im2col_elems(node, ctx.batch) * ctx.itemsize)
        im2col_args = [xb, xoff, xbs] + i32(a["in_c"] // G, x.h, x.w) + [ws] + \
            i32(out.h, out.w, a["size"], a["stride_x"], a["stride_y"], a["pad"], a["dilation"], G)
        k = ctx.kernel("gemm.cl", "yc_im2col_rows", ctx.defines(), im2col_args)
        launches.append(Launch(k, (out.h, K, ctx.batch * G), None, node, "im2col"))
        b_args = [ws, np.int32(0), np.int32(G * KN), np.int32(KN), np.int32(N)]
    yb, yoff, ybs = ctx.view(out)
    args = [wts["A"], wts["bias"]] + b_args + [yb, yoff, ybs, np.int32(N)] + residual_args(ctx, node) + \
        i32(M, N, K, G) + extra
    k = ctx.kernel("gemm.cl", kernel_name(cfg), d, args)
    launches.append(Launch(k, grid(cfg, M, N, ctx.batch * G), local_size(cfg), node, "gemm",
                           dict(cfg), node.flops * ctx.batch))
    return launches


def wino_weights(ctx: BindContext, node: Node, m: int, rows: int) -> dict:
    """U = G g G^T (T2, F, C) packed as this family's A with T2 groups, and the bias; uploaded once."""
    def pack() -> np.ndarray:
        return pack_weights(winograd.point_filters(node, m).astype(np.float32), (m + 2) ** 2, rows, ctx.dtype)
    return packed_upload(ctx, node, (node.layers[0], ctx.half, FAMILY, "winograd", m, rows), pack, "Winograd weights")


def _bind_winograd(ctx: BindContext, node: Node, cfg: dict) -> list:
    """Input transform, this family's GEMM batched over the T2 points (no bias), output transform + epilogue."""
    m = int(cfg.get("m", 2))
    M, P, C, t2 = winograd.gemm_shape(node, m)
    wts = wino_weights(ctx, node, m, pack_rows(cfg))
    gd = defines(ctx.defines(NO_BIAS=True, **ctx.half_math_defines()), cfg, M, P)

    def gemm(gargs: list) -> Launch:
        return Launch(ctx.kernel("gemm.cl", kernel_name(cfg), gd, gargs), grid(cfg, M, P, ctx.batch * t2),
                      local_size(cfg), node, "wino_gemm", dict(cfg), node.flops * ctx.batch)
    return winograd.transform_launches(ctx, node, m, wts, gemm, int(cfg.get("VT", WINO_VT)))


def _bind_wino_fused(ctx: BindContext, node: Node, cfg: dict) -> list:
    """The fused Winograd conv: one launch, no workspace; weights U packed [T2][MB][C][KB] in float."""
    a, x, out = node.attrs, node.inputs[0], node.output
    m, kb, ks = int(cfg.get("m", 2)), int(cfg["KB"]), int(cfg.get("KS", 1))
    F, C = a["filters"], a["in_c"]

    def pack() -> np.ndarray:
        return pack_weights(winograd.point_filters(node, m).astype(np.float32), (m + 2) ** 2, kb, np.float32)
    wts = packed_upload(ctx, node, (node.layers[0], FAMILY, "winograd-fused", m, kb), pack, "Winograd weights")
    tw = winograd.tile_grid(node, m)[1]
    kbs, slices = fused_slices(F, kb, ks)
    pool = written_pool(ctx, node)          # the 2x2 pool that alone reads it: stored pooled (WPOOL)
    d = {**epilogue_defines(ctx, node), "WINO_M": m, "WINO_VT": WINO_VT, "WF_C": C, "WF_KB": kb,
         "WPOOL": pool is not None}
    args = ctx.view(x) + i32(x.h, x.w, a["pad"], tw) + [wts["A"], wts["bias"]] + i32(F, kbs) + \
        ctx.view(pool.output if pool else out) + i32(out.h, out.w) + residual_args(ctx, node)
    k = ctx.kernel("winograd.cl", "yc_wino_fused", d, args)
    return [Launch(k, (fused_groups(node, m), slices, ctx.batch), (1, 1, 1), node,
                   "wino_fused", marked(cfg, "maxpool" if pool else ""), node.flops * ctx.batch)]


class CpuGemm:
    """The kernel-family interface (see ``family.py``) of the CPU GEMM and its Winograd."""

    name = FAMILY
    tensor_cores = False
    timed_beside_tensor_cores = False
    derived, schedule, block = (), ("KU", "WG", "ORD", "KS"), ("VW", "NV", "m", "KB")
    stores_nhwc, reads_nhwc = (), ()

    def offered(self, rt, mma: str) -> bool:
        return rt.is_cpu and not mma

    def candidates(self, node: Node, rt, batch: int, precision: Precision, mma: str) -> list:
        return [] if is_depthwise(node) else candidates(node, rt, batch, precision)

    def heuristic(self, node: Node, rt, batch: int, precision: Precision, mma: str,
                  planes: bool = False) -> Optional[dict]:
        return None if is_depthwise(node) else heuristic_config(node, batch, precision, modelled_unit(rt))

    def why_illegal(self, node: Node, cfg: dict, rt, mma: str = "") -> Optional[str]:
        algo = cfg.get("algo")
        if algo not in conv_algos(node):
            return f"algorithm '{algo}' of the CPU GEMM family cannot run {node.describe()}"
        if algo == "winograd" and cfg.get("m", 2) not in winograd.TILE_SIZES:
            return f"Winograd tile size m={cfg.get('m')} is not one of {winograd.TILE_SIZES}"
        if algo == "winograd" and cfg.get("kernel") == "fused":
            return fused_illegal(node, cfg)
        if algo == "winograd" and cfg.get("VT", WINO_VT) not in WINO_VTS:
            return f"Winograd transform lanes VT={cfg.get('VT')} is not one of {WINO_VTS}"
        M, N, K, G = gemm_shape(node, cfg)
        reason = why_illegal(cfg, M, N, K, max_work_group(rt)) or conv_illegal(node, cfg)
        return None if reason is None else f"GEMM config {cfg} cannot run M={M} N={N} K={K}: {reason}"

    def cost(self, node: Node, cfg: dict, batch: int, rt) -> float:
        return conv_cost(node, cfg, batch, modelled_unit(rt))

    def workspace_bytes(self, node: Node, cfg: dict, batch: int, precision: Precision) -> int:
        return winograd.scratch_elems(node, batch, cfg) * precision.itemsize

    def bind(self, ctx: BindContext, node: Node, cfg: dict) -> list:
        return bind(ctx, node, cfg)


KERNEL_FAMILY = CpuGemm()
