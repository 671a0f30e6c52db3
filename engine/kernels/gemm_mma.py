"""The tensor-core GEMM family (``cl/gemm_mma.cl``): capability probe, configs, legality, binding.

NVIDIA's OpenCL C compiler accepts inline PTX, and ``mma.sync`` reaches the tensor cores: fp16
inputs with fp32 accumulation (``m16n8k16``) for the ``fp16`` precision (half storage), TF32
inputs (``m16n8k8``) for ``tf32`` (float storage). A config is a dict of the kernel's tunables::

    {"family": "mma", "algo": "im2col" | "gemm1x1" | "implicit" | "winograd",
     "MWG": 128, "NWG": 64, "KWG": 32, "WM": 2, "WN": 2, "SK": 1, "ST": 2}

``winograd`` (3x3 stride-1 convs; with ``"m": 2`` or 4) runs ``cl/winograd.cl``'s input and output
transforms (``winograd.transform_launches``) around this family's GEMM batched over the (m+2)^2
transform points (A = the transformed filters, B = the transformed input: an explicit B, so the
cp.async ring copies it without a gather), never split (the workspace holds V and the products).
Neither the heuristic nor the tuner picks it: it lost to the implicit GEMM on an H100 (the
transforms' memory round trips cost more than the multiplies saved); configs that name it run.

``ST`` (optional, default 1) is the number of local-memory stages: 1 keeps one buffer and
prefetches the next tile into registers (two barriers per k-step); 2 to 4 run a ring of
buffers filled by ``cp.async`` ST-1 tiles ahead, one barrier per k-step, B kept n-contiguous
and read with ``ldmatrix.trans`` (``cl/gemm_mma.cl`` says how).

``GA`` (optional, default 0; implicit convs at ST > 1) is how the im2col B tile is gathered: 0
element by element (each finding its (c, ky, kx) and pixel by division), 1 the same order with
the tile's per-k offsets in a small local table built once per k-tile, 2 (f16) runs of 8
neighbouring output columns per work-item, (c, ky, kx) once per run and a run inside one output
row read from one row offset, 3 (f16) as 2 with such a run read as the two aligned 16-byte
blocks that cover it (where B's offset and strides are multiples of 8 halves; 2 elsewhere), 4
(tf32) element by element as 0, each float copied into local memory by its own 4-byte
``cp.async`` with A, STAGES-1 tiles ahead, instead of through registers one tile ahead.
``YOLO_CL_MMA_GATHER=0|1|2|3|4`` forces one on every implicit conv (raising ST to 2 where it is 1,
for every value alike), to compare them in a network (``tools/mma_gather_ab.py``).

``BS`` (optional, default 0; an explicit B at ST > 1) 1 copies B's rows by ``cp.async`` with A,
STAGES-1 tiles ahead, where they are not whole 16-byte chunks (N or B's offsets not multiples of
8 halves or 4 floats, as a 13x13 map's planes of 169 pixels): each row as the aligned chunks that
cover it, landing shifted by its misalignment, its fragments read with scalar local loads. Without
it such a B goes through registers one tile ahead, and each k-step waits on the L2.

``SK`` (optional, default 1) splits K over SK work-groups per C tile where M x N gives too few
work-groups (yolov3's 13x13 layers: M = 1024, N = 169, K = 4608). The partial planes live in
the workspace, and gemm_local.cl's split-sum kernel adds them and runs the epilogue in a second
launch. ``SS`` 1 (a split config's optional key, default 0) has the work-group that finishes a
tile last (a per-tile count) add them in the GEMM launch itself instead; the tuner tries both
where it splits, the heuristic keeps the second launch until a network run on a GPU has
measured the difference, and ``YOLO_CL_MMA_SPLIT_SUM=kernel`` turns it on for every split.

The family is offered only where :func:`available` says so: an NVIDIA device of compute
capability 8.0 or later on which a small GEMM of this very kernel builds, runs and matches
NumPy (once per process, device, driver and mode; the binary is cached on disk like every
other). ``YOLO_CL_MMA_EMULATE=1`` builds the kernel with ``MMA_EMULATE``: each mma is then
computed in plain OpenCL C with the PTX fragment layout, so the family runs (slowly) on any
device, PoCL in CI included.
"""
from __future__ import annotations

import itertools
import logging
import os
from typing import Optional

import numpy as np

from . import (BindContext, Launch, conv_gemm_shape, epilogue_defines, i32, is_depthwise,
               is_pointwise, marked, packed_upload, residual_args, winograd, write_target)
from .gemm_local import (SPLITS, DeviceLimits, b_operand, conv_cost, device_limits, k_chunk, partial_bytes,
                         round_up, scratch_bytes, split_k, split_sum_spec, tile_defines)
from ..errors import YoloClError
from ..graph import Node

FAMILY = "mma"
MODES = ("f16", "tf32")         # mma input types (a precision's ``mma``)
MPAD, KPAD = 256, 64            # A is padded to these: every MWG divides MPAD, every KWG divides KPAD
TUNABLES = ("MWG", "NWG", "KWG", "WM", "WN")
STAGES = (1, 2, 3)              # local-memory stages the search tries (the kernel takes up to 4)
HEURISTIC_STAGES = 2            # the untuned pick's stages
ALGOS = ("gemm1x1", "im2col", "implicit", "winograd")
EMULATE_ENV = "YOLO_CL_MMA_EMULATE"
SPLIT_SUM_ENV = "YOLO_CL_MMA_SPLIT_SUM"      # "kernel": split-K sums inside the GEMM launch
GATHERS = (0, 1, 2, 3, 4)       # "GA": the implicit B gather (element, per-k table, runs of 8, aligned runs,
                                # tf32 elements by cp.async)
GATHER_MODE = {2: "f16", 3: "f16", 4: "tf32"}    # gathers that exist for one mma mode only
HEURISTIC_GATHER = 0            # the untuned pick's gather (GA 1 pays on deep 3x3 convs, costs on the first ones)
WIDE_GATHER = 1                 # ... and the wide tiles' (H100, 608 batch 8: 128x128 GA 1 0.27 ms, GA 0 0.34)
GATHER_ENV = "YOLO_CL_MMA_GATHER"            # "0" to "4": that gather on every implicit conv (A/B)
LDSM = 1                        # fragments through ldmatrix (the emulation reads them one word at a time)

log = logging.getLogger("yolo_cl.kernels")
_PROBED: dict = {}              # (device, driver, mode, emulated) -> bool


def emulated() -> bool:
    """Whether mma is computed in plain OpenCL C (``YOLO_CL_MMA_EMULATE=1``) instead of PTX."""
    return os.environ.get(EMULATE_ENV, "").strip() == "1"


def split_in_kernel(cfg: dict) -> bool:
    """Whether ``cfg``'s split-K partial sums are added inside the GEMM launch (its ``SS`` 1, or
    ``YOLO_CL_MMA_SPLIT_SUM=kernel`` for every split) rather than by a second launch."""
    return split_k(cfg) > 1 and (int(cfg.get("SS", 0)) == 1 or os.environ.get(SPLIT_SUM_ENV, "").strip() == "kernel")


def gather(cfg: dict) -> int:
    """The implicit B gather of ``cfg`` (``GA``, see the module doc)."""
    return int(cfg.get("GA", 0))


def forced_gather(cfg: dict, mode: str) -> dict:
    """``cfg`` with the gather ``YOLO_CL_MMA_GATHER`` names (and ST >= 2, which every gather
    but 0 needs, for all values alike), where it is set and legal for ``mode``; else ``cfg``."""
    value = os.environ.get(GATHER_ENV, "").strip()
    if value not in {str(g) for g in GATHERS} or GATHER_MODE.get(int(value), mode) != mode:
        return cfg
    return {**cfg, "GA": int(value), "ST": max(stages(cfg), 2)}


def aligned_gather(cfg: dict, *b_ints) -> dict:
    """``cfg`` with GA 3 (aligned 16-byte reads of the input) lowered to 2 where B's offset and
    strides (``b_ints``, in elements) are not all multiples of 8 halves."""
    if gather(cfg) == 3 and any(int(v) % 8 for v in b_ints):
        return {**cfg, "GA": 2}
    return cfg


def tile_count(cfg: dict, M: int, N: int, Z: int) -> int:
    """C tiles of a launch over Z matrices: the split-K counts, one int32 each."""
    return -(-M // int(cfg["MWG"])) * -(-N // int(cfg["NWG"])) * Z


def k_step(mode: str) -> int:
    """K of one mma instruction: 16 halves or 8 tf32."""
    return 16 if mode == "f16" else 8


def tf32_round(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest TF32 value (ties away from zero), as the kernel and cvt.rna round."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


# -- capability ------------------------------------------------------------------------------
def compute_capability(rt) -> int:
    """The major compute capability an NVIDIA device reports (cl_nv_device_attribute_query); 0 for
    any other device, or where the driver refuses the attribute."""
    d = rt.device
    if "NVIDIA" not in str(getattr(d, "vendor", "")).upper() \
            or "cl_nv_device_attribute_query" not in str(getattr(d, "extensions", "")):
        return 0
    try:
        return int(d.compute_capability_major_nv)
    except Exception:                   # noqa: BLE001 - an attribute the driver refuses means none
        return 0


def tensor_cores(rt) -> bool:
    """An NVIDIA device reporting compute capability 8.0 or later."""
    return compute_capability(rt) >= 8


def available(rt, mode: str) -> bool:
    """Whether this family can run ``mode`` ("f16" or "tf32") on ``rt``'s device: the hardware
    (or emulation) is there and a small GEMM of the real kernel matches NumPy. The probe runs in
    a context of its own, so a kernel that faults cannot take ``rt``'s queue down with it. Any
    failure says no, with one line at INFO level (``--verbose``)."""
    from ..runtime import Runtime
    key = (rt.device_name, rt.driver, mode, emulated())
    if key not in _PROBED:
        ok = False
        if emulated() or tensor_cores(rt):
            try:
                err = probe(Runtime(rt.device, binary_cache=rt.binary_cache), mode)
                ok = err < 1e-3
                if not ok:
                    log.info("tensor cores (%s) off on %s: probe GEMM error %.2g", mode, rt.device_name, err)
            except Exception as e:      # noqa: BLE001 - a driver that cannot build or run it: FMA families
                log.info("tensor cores (%s) off on %s: %s", mode, rt.device_name, str(e).splitlines()[0][:200])
        _PROBED[key] = ok
    return _PROBED[key]


def mode_for(rt, precision) -> str:
    """The mma mode a :class:`~yolo_cl.precision.Precision` computes in on ``rt`` ("" where it
    stays on the FMA families)."""
    mode = precision.mma
    return mode if mode and available(rt, mode) else ""


def probe(rt, mode: str) -> float:
    """Relative error of a ragged 40x24x40 GEMM (every bounds check) against NumPy."""
    rng = np.random.default_rng(7)
    M, N, K = 40, 24, 40
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    cfg = {"MWG": 32, "NWG": 16, "KWG": 32 if mode == "f16" else 16, "WM": 2, "WN": 1}
    C = gemm(rt, A, B, mode, cfg)
    if mode == "f16":
        A, B = A.astype(np.float16), B.astype(np.float16)
    else:
        A, B = tf32_round(A), tf32_round(B)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    return float(np.linalg.norm(C - ref) / np.linalg.norm(ref))


def gemm(rt, A: np.ndarray, B: np.ndarray, mode: str, cfg: dict) -> np.ndarray:
    """C = A @ B on the device through this family (no epilogue): the probe's and tools' GEMM."""
    cl = rt.cl
    (M, K), N = A.shape, B.shape[1]
    half = mode == "f16"
    dt = np.float16 if half else np.float32
    a = rt.upload(pack_weights(A, 1, mode), "A")
    b = rt.upload(np.ascontiguousarray(B, dt), "B")
    c = rt.alloc(M * N * np.dtype(dt).itemsize, "C")
    bias = rt.upload(np.zeros(M, np.float32), "bias")
    d = defines({"HALF_STORAGE": half, "NO_BIAS": True}, cfg, M, N, K, mode, b_vector(cfg, mode, False, N))
    for src, name, dd, args, gs, ls in launch_specs(cfg, d, M, N, K, 1, 1, [a, bias], [b] + i32(0, 0, 0, N),
                                                    [c] + i32(0, 0, N), [c] + i32(0, 0), []):
        k = cl.Kernel(rt.program(src, dd), name)
        k.set_args(*args)
        cl.enqueue_nd_range_kernel(rt.queue, k, gs, ls)
    out = np.empty((M, N), dt)
    cl.enqueue_copy(rt.queue, out, c)
    rt.queue.finish()
    return out.astype(np.float32)


# -- configs ---------------------------------------------------------------------------------
def why_illegal(cfg: dict, M: int, N: int, K: int, mode: str, implicit: bool = False,
                lim: DeviceLimits = DeviceLimits()) -> Optional[str]:
    """None if ``cfg`` can run this shape in ``mode`` on a device with limits ``lim``, else the reason."""
    try:
        mwg, nwg, kwg, wm, wn = (int(cfg[k]) for k in TUNABLES)
    except (KeyError, TypeError, ValueError) as e:
        return f"missing or malformed tunable {e}"
    if mode not in MODES:
        return f"mma mode '{mode}' is not one of {', '.join(MODES)}"
    if min(mwg, nwg, kwg, wm, wn) < 1 or MPAD % mwg or KPAD % kwg:
        return f"MWG must divide {MPAD} and KWG {KPAD}"
    if kwg % k_step(mode):
        return f"KWG must be a multiple of the instruction's K ({k_step(mode)})"
    if mwg % (16 * wm) or nwg % (8 * wn):
        return "each warp's tile must be whole m16n8 fragments"
    if (mwg // wm // 16) * (nwg // wn // 8) > 32:
        return "too many fragments per warp (accumulator registers)"
    threads = 32 * wm * wn
    if threads > lim.max_wg:
        return f"work-group of {threads} exceeds the device's {lim.max_wg}"
    if local_bytes(cfg, mode) > lim.local_mem:
        return "local memory exceeded"
    if not 1 <= stages(cfg) <= 4:
        return "ST (local-memory stages) must be 1 to 4"
    ga = gather(cfg)
    if ga not in GATHERS:
        return f"GA (the implicit gather) must be one of {GATHERS}"
    if ga and (not implicit or stages(cfg) == 1):
        return "GA > 0 gathers an implicit conv's B at ST > 1"
    if GATHER_MODE.get(ga, mode) != mode:
        return (f"GA {ga} packs runs of halves: f16 only" if GATHER_MODE[ga] == "f16"
                else f"GA {ga} copies single floats by cp.async: tf32 only")
    if ga == 1 and threads % nwg:
        return "GA 1 needs NWG to divide the work-group"
    if int(cfg.get("BS", 0)) not in (0, 1) or (int(cfg.get("BS", 0)) and (implicit or stages(cfg) == 1)):
        return "BS (B rows by shifted chunks) is 0 or 1, and 1 only for an explicit B at ST > 1"
    sk = split_k(cfg)
    if int(cfg.get("SS", 0)) not in (0, 1) or (int(cfg.get("SS", 0)) and sk == 1):
        return "SS (split sum in the GEMM launch) is 0 or 1, and 1 only with SK > 1"
    if sk > 1 and (sk > 8 or (sk - 1) * k_chunk(K, sk, kwg) >= K):
        return "every K split must be non-empty (and SK <= 8)"
    return None


def stages(cfg: dict) -> int:
    """Local-memory stages of ``cfg`` (1 = single buffer with register prefetch)."""
    return int(cfg.get("ST", 1))


def local_bytes(cfg: dict, mode: str) -> int:
    """Local memory of the A and B tiles, all stages (plus the emulation's lane exchange, the split
    sum's flag and GA 1's tables)."""
    mwg, nwg, kwg = int(cfg["MWG"]), int(cfg["NWG"]), int(cfg["KWG"])
    words = kwg // (2 if mode == "f16" else 1) + 4
    extra = 32 * 6 * 4 * int(cfg["WM"]) * int(cfg["WN"]) if emulated() else 0
    st = stages(cfg)
    extra += 4 if split_k(cfg) > 1 else 0     # the in-kernel split sum's "last work-group" flag
    extra += 2 * kwg * 8 if gather(cfg) == 1 else 0     # GA 1's per-k tables (two k-tiles of int2)
    if st == 1:
        return (mwg + nwg) * words * 4 + extra
    return st * (mwg * words * 4 + kwg * (nwg + 8) * (2 if mode == "f16" else 4)) + extra


def chunk_elems(mode: str) -> int:
    """B elements in a 16-byte chunk: 8 halves for f16, 4 floats for tf32."""
    return 8 if mode == "f16" else 4


def b_vector(cfg: dict, mode: str, implicit: bool, N: int, *b_ints) -> bool:
    """Whether B can be copied as 16-byte chunks (BVEC): a staged config, an explicit B, and N and
    every B offset and stride (``b_ints``, in elements) multiples of a chunk's elements."""
    return stages(cfg) > 1 and not implicit and all(int(v) % chunk_elems(mode) == 0 for v in (N,) + b_ints)


def defines(ctx_defines: dict, cfg: dict, M: int, N: int, K: int, mode: str, bvec: bool = False) -> dict:
    """Kernel defines for ``cfg`` on this shape: tunables, mode, and only the bounds checks it needs
    (``bvec``: B rows copied as 16-byte chunks, see :func:`b_vector`; where they cannot be, ``BS``
    copies them as shifted chunks)."""
    d = dict(ctx_defines)
    d.update({k: int(cfg[k]) for k in TUNABLES})
    d.update(MPAD=MPAD, KPAD=KPAD, LDSM=LDSM)
    if stages(cfg) > 1:
        d["STAGES"] = stages(cfg)
        if bvec:
            d["BVEC"] = True
        elif int(cfg.get("BS", 0)):
            d["B_SHIFT"] = True
    if gather(cfg):
        d["GATHER"] = gather(cfg)
    d.update(tile_defines(cfg, M, N, K))
    d["MMA_TF32" if mode == "tf32" else "MMA_F16"] = True
    if emulated():
        d["MMA_EMULATE"] = True
    return d


def sizes(cfg: dict, M: int, N: int, Z: int) -> tuple:
    """(global size, local size) of the launch over Z = batch * groups matrices."""
    threads = 32 * cfg["WM"] * cfg["WN"]
    return (-(-N // cfg["NWG"]) * threads, -(-M // cfg["MWG"]), Z * split_k(cfg)), (threads, 1, 1)


def launch_specs(cfg: dict, defines_: dict, M: int, N: int, K: int, G: int, Z: int, a_args: list,
                 b_args: list, c_args: list, r_args: list, extra: list, partial=None, counters=None,
                 n_out: Optional[int] = None) -> list:
    """(source, kernel name, defines, args, global, local) of the launches that compute C: the GEMM,
    and with SK > 1 (``partial``: a buffer of ``partial_bytes``) either the sum inside it, given
    ``counters`` (:func:`tile_count` zeroed int32s, left zeroed by every launch), or a split-sum
    launch over ``n_out`` elements a row (default N). Arguments as gemm_local.launch_specs'."""
    gs, ls = sizes(cfg, M, N, Z)
    dims = i32(M, N, K, G)
    if split_k(cfg) == 1:
        return [("gemm_mma.cl", "yc_gemm_mma", defines_, a_args + b_args + c_args + r_args + dims + extra, gs, ls)]
    if counters is not None:
        return [("gemm_mma.cl", "yc_gemm_mma", {**defines_, "SK_FIX": True},
                 a_args + b_args + c_args + r_args + dims + extra + [partial, counters], gs, ls)]
    gemm_c = [partial] + i32(0, 0, N)
    return [("gemm_mma.cl", "yc_gemm_mma", defines_, a_args + b_args + gemm_c + r_args + dims + extra, gs, ls),
            split_sum_spec(defines_, split_k(cfg), partial, a_args[1], c_args, r_args, M, N, G, Z, n_out)]


def pool_blocks(cfg: dict, algo: str) -> bool:
    """Whether ``cfg`` can store a 2x2 max-pool of its output (POOL2): an implicit GEMM, no K split,
    and each warp's columns whole 16-column blocks."""
    return algo == "implicit" and split_k(cfg) == 1 and (int(cfg["NWG"]) // int(cfg["WN"])) % 16 == 0


def pack_weights(w: np.ndarray, G: int, mode: str) -> np.ndarray:
    """[G*M][K] row-major weights -> [G][Mp][Kp] zero-padded, as half (f16) or TF32-rounded float."""
    gm, K = w.shape
    M = gm // G
    out = np.zeros((G, round_up(M, MPAD), round_up(K, KPAD)), np.float16 if mode == "f16" else np.float32)
    src = w.reshape(G, M, K)
    out[:, :M, :K] = src if mode == "f16" else tf32_round(src)
    return out


# -- the search space ------------------------------------------------------------------------
_TILES = [(256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64), (128, 32), (64, 32),
          (32, 64), (32, 32), (32, 16), (16, 32), (16, 16)]
_WARPS = [(2, 2), (4, 2), (2, 4), (4, 1), (1, 4), (2, 1), (1, 2), (1, 1)]


def space(M: int, N: int, K: int, mode: str, implicit: bool = False, lim: DeviceLimits = DeviceLimits()) -> list:
    """Every legal config of the family for this shape (tiles x warp grids x k-slices x stages)."""
    out = []
    for (mwg, nwg), (wm, wn), kwg, st in itertools.product(_TILES, _WARPS, (16, 32, 64), STAGES):
        c = {"MWG": mwg, "NWG": nwg, "KWG": kwg, "WM": wm, "WN": wn, **({"ST": st} if st > 1 else {})}
        frags = (mwg // wm // 16) * (nwg // wn // 8) if mwg % (16 * wm) == 0 and nwg % (8 * wn) == 0 else 0
        if frags < 2 or why_illegal(c, M, N, K, mode, implicit, lim) is not None:
            continue
        # an implicit staged config in every legal gather ("GA" always present: siblings for the search);
        # an explicit one whose B rows are not whole chunks (N) also with them copied as shifted chunks
        variants = [c] if st == 1 or (not implicit and N % chunk_elems(mode) == 0) else \
            [c, {**c, "BS": 1}] if not implicit else \
            [{**c, "GA": ga} for ga in GATHERS if why_illegal({**c, "GA": ga}, M, N, K, mode, implicit, lim) is None]
        for v in variants:
            out.append(v)
            if -(-M // mwg) * -(-N // nwg) < 2 * lim.compute_units:    # few tiles: split K too
                out += [{**v, "SK": sk, "SS": ss} for sk in SPLITS for ss in (0, 1)     # SS: schedule siblings
                        if K >= 128 * sk and why_illegal({**v, "SK": sk}, M, N, K, mode, implicit, lim) is None]
    return out


def heuristic(M: int, N: int, K: int, Z: int, mode: str, implicit: bool = False,
              lim: DeviceLimits = DeviceLimits()) -> dict:
    """An untuned pick after the tuned H200 yolov3 winners (BENCHMARKS.md): 128 x 32 tiles of four
    warps wherever M fills them, smaller tiles for small M, wide tiles (x 128) where even those
    give 8 work-groups per compute unit, and where the tiles alone leave compute units idle and K
    is long, 32 x 32 (or 32 x 16) tiles for a GEMM reading B as it is (a 1x1 conv), K split for
    one gathering it."""
    kwg = 64 if mode == "f16" else 32
    prefs = [{"MWG": 128, "NWG": 32, "KWG": kwg, "WM": 4, "WN": 1},
             {"MWG": 64, "NWG": 32, "KWG": 32, "WM": 2, "WN": 2},
             {"MWG": 32, "NWG": 32, "KWG": 32, "WM": 2, "WN": 1},
             {"MWG": 16, "NWG": 32, "KWG": 32, "WM": 1, "WN": 2}]
    legal = [p for p in prefs if why_illegal(p, M, N, K, mode, implicit, lim) is None]
    if not legal:
        legal = [min(space(M, N, K, mode, implicit, lim), key=lambda c: c["WM"] * c["WN"])]
    best = next((p for p in legal if round_up(M, p["MWG"]) <= 1.3 * M), legal[-1])
    if -(-M // best["MWG"]) * -(-N // best["NWG"]) * Z >= 8 * lim.compute_units:
        # plenty of work (batched or large maps): wider tiles reuse each loaded B column more
        # (H100, yolov3 608 batch 8: 1.1-2x per conv, BENCHMARKS.md "Batched shapes")
        wide = {"MWG": 128, "NWG": 128, "KWG": 32, "WM": 2, "WN": 4} if M > 64 else \
            {"MWG": 64, "NWG": 128, "KWG": 32, "WM": 2, "WN": 2}
        if why_illegal({**wide, "ST": HEURISTIC_STAGES}, M, N, K, mode, implicit, lim) is None:
            ga = {"GA": WIDE_GATHER} if implicit and why_illegal(
                {**wide, "ST": HEURISTIC_STAGES, "GA": WIDE_GATHER}, M, N, K, mode, implicit, lim) is None else {}
            return {**wide, "ST": HEURISTIC_STAGES, **ga}
    if why_illegal({**best, "ST": HEURISTIC_STAGES}, M, N, K, mode, implicit, lim) is None:
        best = {**best, "ST": HEURISTIC_STAGES}
        if not implicit and N % chunk_elems(mode):
            best = {**best, "BS": 1}     # ragged rows by cp.async (H200: 13x13 1x1s 16 -> 11-12 us in yolov3)
        if HEURISTIC_GATHER and why_illegal({**best, "GA": HEURISTIC_GATHER}, M, N, K, mode, implicit, lim) is None:
            best = {**best, "GA": HEURISTIC_GATHER}
    groups = -(-M // best["MWG"]) * -(-N // best["NWG"]) * Z
    if groups < 4 * lim.compute_units and K >= 512:       # few tiles, long K
        if not implicit:
            # a 1x1 conv reading its input as it is: small unsplit tiles instead of a K split and
            # its sum launch (every tuned H200 yolov3 416 1x1 conv at 26x26 and 13x13, fp16 and
            # tf32: untuned yolov3 416 on an H200, BENCHMARKS.md thirtieth session)
            small = {"MWG": 32, "NWG": 32, "KWG": kwg, "WM": 1, "WN": 2, "ST": 3}      # the tuned ones' 3-4 stages
            if -(-M // 32) * -(-N // 32) * Z < lim.compute_units:
                small["NWG"] = 16
            if N % chunk_elems(mode):
                small["BS"] = 1
            if why_illegal(small, M, N, K, mode, implicit, lim) is None:
                return small
        # a gathered B (or no small tile fits): share K out
        splits = [sk for sk in SPLITS if why_illegal({**best, "SK": sk}, M, N, K, mode, implicit, lim) is None]
        if splits:
            return {**best, "SK": next((sk for sk in splits if groups * sk >= 4 * lim.compute_units), splits[-1])}
    return dict(best)


# -- conv binding ----------------------------------------------------------------------------
def conv_algos(node: Node) -> list:
    """Algorithms of this family that can run ``node`` (the first is the heuristic's)."""
    algos = ["gemm1x1", "implicit", "im2col"] if is_pointwise(node) else ["implicit", "im2col"]
    return algos + (["winograd"] if winograd.applicable(node) else [])


def candidates(node: Node, rt, mode: str, batch: int = 1) -> list:
    """Legal configs (with "algo" and "family") for ``node`` on ``rt``'s device in ``mode``, the
    tuner's space. Winograd is not in it: on an H100 it lost to the implicit GEMM on every yolov3
    shape (BENCHMARKS.md, seventh GPU session), and its smaller GEMM would rank its configs first
    in the search's cost order; a config naming it (``tools/retime.py``'s
    ``set:algo=winograd/m=2``) still runs."""
    M, N, K, G = conv_gemm_shape(node)
    lim = device_limits(rt)
    return [{"algo": algo, "family": FAMILY, **c} for algo in conv_algos(node) if algo != "winograd"
            for c in space(M, N, K, mode, algo == "implicit", lim)]


def heuristic_config(node: Node, mode: str, batch: int = 1, lim: DeviceLimits = DeviceLimits()) -> dict:
    """The untuned choice: 1x1 straight from the input, others im2col'ed on the fly (implicit)."""
    M, N, K, G = conv_gemm_shape(node)
    algo = conv_algos(node)[0]
    return {"algo": algo, "family": FAMILY, **heuristic(M, N, K, batch * G, mode, algo == "implicit", lim)}


def bind(ctx: BindContext, node: Node, cfg: dict) -> list:
    """Launches for a conv under an mma config: [im2col,] GEMM."""
    a = node.attrs
    M, N, K, G = conv_gemm_shape(node)
    mode = ctx.mma
    algo = cfg.get("algo")
    if not mode:
        raise YoloClError("the tensor-core family is not available on this device and precision")
    if algo not in ALGOS or (algo == "gemm1x1" and not is_pointwise(node)):
        raise YoloClError(f"algorithm '{algo}' cannot run this layer in the mma family")
    if algo == "winograd":
        return bind_winograd(ctx, node, cfg)
    lim = device_limits(ctx.rt)
    forced = forced_gather(cfg, mode) if algo == "implicit" else cfg
    if forced is not cfg and why_illegal(forced, M, N, K, mode, True, lim) is None:
        cfg = forced
    reason = why_illegal(cfg, M, N, K, mode, algo == "implicit", lim)
    if reason is not None:
        raise YoloClError(f"mma GEMM config {cfg} cannot run M={M} N={N} K={K}: {reason}")
    wts = packed_upload(ctx, node, (node.layers[0], mode, FAMILY),
                        lambda: pack_weights(a["weights"].reshape(a["filters"], -1), G, mode))
    x, out = node.inputs[0], node.output
    launches, b_args = b_operand(ctx, node, algo)
    cfg = aligned_gather(cfg, *b_args[1:4])
    Z = ctx.batch * G
    if split_k(cfg) > 1 and (algo == "im2col" or ctx.workspace is None
                             or partial_bytes(cfg, M, N, Z) > ctx.workspace.size):
        cfg = {**cfg, "SK": 1}          # the partial sums live in the workspace, which im2col needs itself
    store = write_target(ctx, node, "blocks" if pool_blocks(cfg, algo)
                         else "sum" if split_k(cfg) > 1 and not split_in_kernel(cfg) else "")
    if store.defines.get("POOL2"):
        N = round_up(N, 16)             # whole blocks of 4 pooled pixels: the last may run past the map
    d = defines({**epilogue_defines(ctx, node), **store.defines}, cfg, M, N, K, mode,
                b_vector(cfg, mode, algo == "implicit", N, *b_args[1:]))
    extra = []
    if algo == "implicit":
        d.update(IMPLICIT=True, KS=a["size"], SX=a["stride_x"], SY=a["stride_y"], PAD=a["pad"], DIL=a["dilation"])
        extra = i32(x.h, x.w, out.w) + store.extra
    counters = None
    if split_in_kernel(cfg):
        # Zero between launches. A kernel does not keep its buffer arguments alive (NVIDIA's driver
        # then fails the enqueue), so the context's cache holds them, as it holds the weights.
        n = tile_count(cfg, M, N, Z)
        counters = ctx.cached((node.layers[0], FAMILY, "split-K counts", n), lambda: {
            "counts": ctx.rt.upload(np.zeros(n, np.int32), f"split-K counts of layer {node.label}")})["counts"]
    specs = launch_specs(cfg, d, M, N, K, G, Z, [wts["A"], wts["bias"]], b_args, store.c_args,
                         residual_args(ctx, node), extra, ctx.workspace, counters, store.n_out)
    for i, (src, name, dd, args, gs, ls) in enumerate(specs):
        k = ctx.kernel(src, name, dd, args)
        launches.append(Launch(k, gs, ls, node, "gemm_mma" if i == 0 else "splitk_sum",
                               marked(cfg, store.writes, store.layout), node.flops * ctx.batch if i == 0 else 0))
    return launches


def bind_winograd(ctx: BindContext, node: Node, cfg: dict) -> list:
    """Input transform, this family's GEMM over the (m+2)^2 points (U = G g G^T packed per point
    as A), output transform + the conv's epilogue."""
    m, mode = int(cfg.get("m", 2)), ctx.mma
    M, P, C, t2 = winograd.checked_gemm_shape(node, m)
    cfg = {k: v for k, v in cfg.items() if k not in ("SK", "SS")}     # the workspace holds V and the products
    reason = why_illegal(cfg, M, P, C, mode, False, device_limits(ctx.rt))
    if reason is not None:
        raise YoloClError(f"mma Winograd GEMM config {cfg} cannot run M={M} N={P} K={C}: {reason}")

    def pack() -> np.ndarray:
        return pack_weights(winograd.point_filters(node, m), t2, mode)
    wts = packed_upload(ctx, node, (node.layers[0], mode, FAMILY, "winograd", m), pack, "Winograd weights")
    d = defines(ctx.defines(NO_BIAS=True), cfg, M, P, C, mode, b_vector(cfg, mode, False, P, t2 * C * P, C * P))

    def gemm(gargs: list) -> Launch:
        gs, ls = sizes(cfg, M, P, ctx.batch * t2)
        return Launch(ctx.kernel("gemm_mma.cl", "yc_gemm_mma", d, gargs), gs, ls, node, "wino_gemm", dict(cfg),
                      node.flops * ctx.batch)
    return winograd.transform_launches(ctx, node, m, wts, gemm)


class MmaGemm:
    """The kernel-family interface (see ``family.py``) of the tensor-core GEMM."""

    name = FAMILY
    tensor_cores = True
    timed_beside_tensor_cores = False
    derived, schedule, block = (), ("GA", "SS", "BS"), ("MWG", "NWG")
    stores_nhwc, reads_nhwc = ("gemm1x1", "im2col", "implicit"), ()     # not Winograd's output transform

    def offered(self, rt, mma: str) -> bool:
        return bool(mma)

    def candidates(self, node: Node, rt, batch: int, precision, mma: str) -> list:
        return [] if is_depthwise(node) else candidates(node, rt, mma, batch)

    def heuristic(self, node: Node, rt, batch: int, precision, mma: str,
                  planes: bool = False) -> Optional[dict]:
        return None if is_depthwise(node) else heuristic_config(node, mma, batch)

    def why_illegal(self, node: Node, cfg: dict, rt, mma: str = "") -> Optional[str]:
        if cfg["algo"] not in conv_algos(node):
            return f"algorithm '{cfg['algo']}' cannot run this layer in the mma family"
        if cfg["algo"] == "winograd" and int(cfg.get("m", 2)) not in winograd.TILE_SIZES:
            return f"Winograd tile size {cfg.get('m')} is not one of {winograd.TILE_SIZES}"
        return None

    def cost(self, node: Node, cfg: dict, batch: int, rt) -> float:
        return conv_cost(node, cfg, batch, rt)       # the same tile economics, warps for work-items

    def workspace_bytes(self, node: Node, cfg: dict, batch: int, precision) -> int:
        return scratch_bytes(node, cfg, batch, precision)

    def bind(self, ctx: BindContext, node: Node, cfg: dict) -> list:
        return bind(ctx, node, cfg)


KERNEL_FAMILY = MmaGemm()
