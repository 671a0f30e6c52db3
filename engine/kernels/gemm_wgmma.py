"""Hopper's warpgroup MMA (``wgmma``, sm_90a): a tensor-core GEMM family, ``cl/gemm_wgmma.cl``.

NVIDIA's OpenCL C compiler emits PTX for ``sm_90`` only, where ``mma.sync`` (the ``mma`` family)
is the widest tensor-core instruction; ``wgmma`` reads both operands from local memory in
swizzled layouts and is what cuDNN's Hopper kernels run on. The kernel writes it as markers that
``yolo_cl.ptx`` turns into instructions in the built PTX (``Runtime.program(..., patch=...)``).

As a conv family it runs fp16 convs of one group: 1x1 convs straight from their input planes
(``gemm1x1``), any conv with its im2col matrix gathered element by element as the tiles are
staged (``implicit``) or written by an im2col pass first (``im2col``), or (``nhwc``) from its
input transposed to pixels of channels first (padded with zeros to a multiple of 8: a network's
3-channel input as 8), whose windows the tiles then copy 16 bytes at a time (one pass over the
input, not im2col's KxK), with the shared epilogue
(bias, activation, fused shortcut, concat slice, an upsample written through, channels-last where
kernels/layout.py says); split-K (``SK``, not with im2col) through the local family's split-sum
kernel; no pool written through. It is offered on a Hopper GPU (or with ``YOLO_CL_WGMMA_EMULATE=1``) and
used where its probe passes (run when its configs are first asked for or checked), searched by
the tuner next to the others. At ``tf32`` (``m64nNk8.f32.tf32.tf32``: float operands, which the
tensor cores read as TF32, both k-contiguous as the instruction requires) it runs ``nhwc`` convs
only, the weights rounded to TF32 when packed, the activations' low mantissa bits dropped by the
hardware. Untuned, it claims the 1x1 convs with work for every SM and the spatial convs of 8n
channels (:func:`heuristic_config`), with the tiles that won on yolov3 608 batch 8 and 416 batch
1, and leaves the rest to the ``mma`` family; per-shape speeds in BENCHMARKS.md (seventeenth to
twentieth sessions).
"""
from __future__ import annotations

import logging
import os
from typing import Callable, NamedTuple, Optional

import numpy as np

from . import TRANSPOSE, BindContext, Launch, conv_gemm_shape, epilogue_defines, i32, is_depthwise, \
    is_pointwise, marked, packed_upload, residual_args, write_target
from .gemm_local import b_operand, conv_cost, k_chunk, partial_bytes, scratch_bytes, split_k, split_sum_spec
from .gemm_mma import KPAD, compute_capability, pack_weights, tf32_round
from ..errors import YoloClError
from ..graph import Node
from ..ptx import raise_to_sm90a

log = logging.getLogger("yolo_cl.kernels")

FAMILY = "wgmma"
ALGOS = ("gemm1x1", "implicit", "im2col", "nhwc")
MODES = {"f16": ALGOS, "tf32": ("nhwc",)}      # mma mode -> the algorithms it runs (tf32: k-contiguous B only)
EMULATE_ENV = "YOLO_CL_WGMMA_EMULATE"
LOCAL_LIMIT = 48 * 1024            # what NVIDIA's OpenCL lets a work-group hold (static arrays)
DEFAULT = {"MT": 128, "NT": 128, "SWZ": 64, "ST": 3}    # H100: 279-330 TFLOP/s at 4096^3 (BENCHMARKS.md)
UNTUNED = {"MT": 64, "NT": 128, "SWZ": 128, "ST": 2}    # the tile most yolov3 608 batch 8 nhwc shapes kept
UNTUNED_1X1 = {"MT": 128, "NT": 64, "SWZ": 128, "ST": 2}    # ... and every gemm1x1 one
UNTUNED_FEW = {"MT": 64, "NT": 64, "SWZ": 64, "ST": 4, "WI": 1}   # yolov3 416 batch 1's 3x3 convs at 208-52
UNTUNED_DEEP = {"MT": 64, "NT": 64, "SWZ": 128, "ST": 2, "SK": 4}   # ... and at 26-13, K split in four
DEEP_K = 2304                      # K from which a conv of few tiles splits it (3x3 of 256 channels)
# ... and where its input patches can be staged (a stride-1 3x3 conv over whole channel slices):
# the tiles yolov3 416's tuned entries took on an H200 at fp16 and tf32 (104x104 to 26x26 unsplit,
# 13x13 split in four; at tf32, whose k-tiles are half as wide, 26x26 split too)
UNTUNED_PATCH = {"MT": 64, "NT": 64, "SWZ": 128, "ST": 3, "AR": 1, "PT": 1, "AP": 2}
UNTUNED_PATCH_DEEP = {"MT": 128, "NT": 64, "SWZ": 128, "ST": 3, "AR": 1, "PT": 1, "AP": 2, "SK": 4}
PATCH_SPLIT_TILES = 72             # k-tiles from which an untuned patch conv splits K (K = 4608 at fp16)
HOPPER_SMS = 132                   # H100 / H200 SXM: the heuristic's "work for every SM"
# The tuner's space: the configs that led somewhere on the H100 (tools/probe_wgmma.py), 48 KB each at most.
# "AR": A in registers (fp16 and tf32), B alone in the stages (H200, 4096^3: 412 against 281 TFLOP/s).
# "PT": a stride-1 3x3 conv's B from one input patch per channel slice (H200: yolov3 608 batch 8's
# c256 f512 at 38x38 0.1089 -> 0.0939 ms, 416's at 26x26 0.0275 -> 0.0187; BENCHMARKS.md); "AP": A
# prefetched into the L2: 1 the whole K range at the start (with PT a slice ahead), 2 (PT) every
# slice at the start, the lines shared out among the tiles (H200, in the network: 416's PT convs at
# 52x52 0.020 -> 0.017 ms, 608 batch 8's at 38x38 0.101 -> 0.096; a conv timed alone cannot see it).
# "PT" 2: the patch's tiles NT consecutive pixels of a grid two columns wider than the map, not rows
# of 8 (608 batch 8's c512 f1024 at 19x19 0.1025 -> 0.0932 ms, 38x38 0.0912 -> 0.0879).
# Tried and dropped: a work-group computing several N tiles in turn as one stream of stages
# (thirty-first session): slower on every yolov3 608 batch 8 and 416 shape timed (thirty-second
# session; two tiles 0.3-73% slower at batch 8, 28-202% at 416): the resident work-groups of an SM
# already overlap one's pipeline fill with another's drain.
SPACE = [{"MT": 128, "NT": 128, "SWZ": 64, "ST": 3}, {"MT": 128, "NT": 64, "SWZ": 128, "ST": 2},
         {"MT": 64, "NT": 128, "SWZ": 128, "ST": 2}, {"MT": 128, "NT": 256, "SWZ": 32, "ST": 4},
         {"MT": 256, "NT": 128, "SWZ": 32, "ST": 4}, {"MT": 128, "NT": 128, "SWZ": 32, "ST": 4},
         {"MT": 64, "NT": 64, "SWZ": 64, "ST": 4}, {"MT": 64, "NT": 64, "SWZ": 64, "ST": 4, "WI": 1},
         {"MT": 128, "NT": 128, "SWZ": 128, "ST": 3, "AR": 1}, {"MT": 128, "NT": 128, "SWZ": 128, "ST": 2, "AR": 1},
         {"MT": 256, "NT": 128, "SWZ": 128, "ST": 3, "AR": 1}, {"MT": 128, "NT": 64, "SWZ": 128, "ST": 6, "AR": 1},
         {"MT": 64, "NT": 128, "SWZ": 128, "ST": 3, "AR": 1}, {"MT": 64, "NT": 64, "SWZ": 128, "ST": 6, "AR": 1},
         {"MT": 128, "NT": 64, "SWZ": 128, "ST": 3, "AR": 1, "PT": 1}, {"MT": 64, "NT": 64, "SWZ": 128, "ST": 3, "AR": 1, "PT": 1},
         {"MT": 64, "NT": 128, "SWZ": 128, "ST": 2, "AR": 1, "PT": 1},
         {"MT": 64, "NT": 64, "SWZ": 128, "ST": 3, "AR": 1, "PT": 1, "AP": 2},
         {"MT": 128, "NT": 64, "SWZ": 128, "ST": 2, "AR": 1, "PT": 2, "AP": 2},
         {"MT": 64, "NT": 64, "SWZ": 128, "ST": 2, "AR": 1, "PT": 2, "AP": 2},
         {"MT": 128, "NT": 128, "SWZ": 128, "ST": 2, "AR": 1, "PT": 2}]
_PROBED: dict = {}                 # (device, driver, emulated) -> bool (f16 and tf32 probed together)


def emulated() -> bool:
    """Whether wgmma is computed in plain OpenCL C (``YOLO_CL_WGMMA_EMULATE=1``) instead of PTX."""
    return os.environ.get(EMULATE_ENV, "").strip() == "1"


def element_bytes(mma: str) -> int:
    """Bytes of an operand element: a half, or a float read as TF32."""
    return 4 if mma == "tf32" else 2


def k_tile(cfg: dict, mma: str = "f16") -> int:
    """k per stage: one swizzled row of ``SWZ`` bytes of operand elements."""
    return int(cfg["SWZ"]) // element_bytes(mma)


def a_in_registers(cfg: dict) -> bool:
    """Whether A reaches the warpgroups' registers (config key ``AR``) instead of the stages."""
    return int(cfg.get("AR", 0)) == 1


def from_patch(cfg: dict) -> bool:
    """Whether a 3x3 conv's B comes from one input patch per channel slice (config key ``PT`` 1 or 2)."""
    return int(cfg.get("PT", 0)) in (1, 2)


def flat_patch(cfg: dict) -> bool:
    """``PT`` 2: tiles of NT consecutive output pixels on a grid padded to W + 2 columns."""
    return int(cfg.get("PT", 0)) == 2


def patch_lines(cfg: dict, width: int = 0) -> int:
    """Input pixels a ``PT`` stage holds: the (NT / 8 + 2) x 10 under a tile of NT / 8 rows of 8;
    with ``PT`` 2 the NT + 2 (``width`` + 2) + 2 under NT pixels of a map ``width`` wide (0: the
    least any map needs)."""
    if flat_patch(cfg):
        return int(cfg["NT"]) + 2 * (width + 2) + 2
    return (int(cfg["NT"]) // 8 + 2) * 10


def local_bytes(cfg: dict, width: int = 0) -> int:
    """Local memory of a work-group: ``ST`` stages of (MT + NT) rows of ``SWZ`` bytes, NT with A
    in registers; with ``PT`` ``ST`` patches, each rounded up to the swizzle's 1024-byte period
    (``PT`` 2's on a map ``width`` wide)."""
    if from_patch(cfg):
        return int(cfg["ST"]) * -(-patch_lines(cfg, width) * int(cfg["SWZ"]) // 1024) * 1024
    rows = (0 if a_in_registers(cfg) else int(cfg["MT"])) + int(cfg["NT"])
    return int(cfg["ST"]) * rows * int(cfg["SWZ"])


def why_illegal(cfg: dict, mma: str = "f16") -> Optional[str]:
    """Why ``cfg`` cannot be built to compute in ``mma`` mode, or None."""
    if int(cfg["MT"]) not in (64, 128, 256) or int(cfg["NT"]) not in (64, 128, 256):
        return "MT and NT are 64, 128 or 256"
    if int(cfg["SWZ"]) not in (32, 64, 128):
        return "SWZ is 32, 64 or 128"
    if int(cfg["ST"]) < 2:
        return "ST is 2 or more"
    if int(cfg.get("AR", 0)) not in (0, 1):
        return "AR (A in registers) is 0 or 1"
    if local_bytes(cfg) > LOCAL_LIMIT:
        return f"{local_bytes(cfg)} bytes of local memory (at most {LOCAL_LIMIT})"
    if not 1 <= split_k(cfg) <= 8:
        return "SK is 1 to 8"
    if int(cfg.get("WI", 0)) not in (0, 1) or (int(cfg.get("WI", 0)) and int(cfg["MT"]) != 64):
        return "WI (a stage's wgmma kept in flight) is 0 or 1, and 1 only with MT 64 (one warpgroup)"
    if a_in_registers(cfg) and (int(cfg["NT"]) > 128 or int(cfg.get("WI", 0))):
        return "AR (A in registers) runs NT 64 or 128 and waits for each stage's wgmma (no WI)"
    if int(cfg.get("PT", 0)) not in (0, 1, 2):
        return "PT (B from an input patch) is 0, 1 or 2 (flat tiles)"
    if from_patch(cfg) and (not a_in_registers(cfg) or int(cfg["SWZ"]) != 128 or int(cfg["NT"]) > 128):
        return "PT (B from an input patch) needs AR 1, SWZ 128 and NT 64 or 128"
    if int(cfg.get("AP", 0)) not in (0, 1, 2) or (int(cfg.get("AP", 0)) == 2 and not from_patch(cfg)):
        return "AP (A prefetched into the L2) is 0, 1, or with PT 2"
    return None


def why_not_patch(node: Node, cfg: dict, mma: str = "f16") -> Optional[str]:
    """Why ``node`` cannot run ``cfg``'s ``PT`` (B from an input patch), or None: a 3x3 conv of
    stride and dilation 1 and padding 1 over whole channel slices (a k-tile: 64 channels at f16, 32
    at tf32), ``nhwc``, its K split (``SK``) into whole slices, none empty."""
    if not from_patch(cfg):
        return None
    a, kt = node.attrs, k_tile(cfg, mma)
    if cfg.get("algo") != "nhwc" or a["size"] != 3 or a["stride_x"] != 1 or a["stride_y"] != 1 \
            or a["dilation"] != 1 or a["pad"] != 1 or a["in_c"] % kt or conv_gemm_shape(node)[3] != 1:
        return f"PT (B from an input patch) runs nhwc 3x3 convs of stride 1, padding 1 and {kt}n channels"
    slices, sk = a["in_c"] // kt, split_k(cfg)
    if (sk - 1) * -(-slices // sk) >= slices:
        return f"PT splits K by {kt}-channel slices: {slices} cannot give {sk} non-empty splits"
    if local_bytes(cfg, node.output.w) > LOCAL_LIMIT:
        return f"PT 2's patches of a {node.output.w}-wide map take {local_bytes(cfg, node.output.w)} bytes of local memory"
    return None


def why_not_split(cfg: dict, K: int, algo: str, mma: str = "f16") -> Optional[str]:
    """Why ``cfg``'s K split cannot run a GEMM of ``K`` under ``algo``, or None: each split a whole
    number of k-tiles, none empty; im2col's matrix fills the workspace the partial sums need."""
    sk = split_k(cfg)
    if sk == 1:
        return None
    if algo == "im2col":
        return "no K split after im2col (its matrix is the workspace)"
    kt = k_tile(cfg, mma)
    if (sk - 1) * k_chunk(K, sk, kt) < K:
        return None
    return f"K = {K} cannot give {sk} non-empty splits of {kt}-wide k-tiles"


def hopper(rt) -> bool:
    """An NVIDIA device reporting compute capability 9.0 (wgmma is sm_90a's, not later chips')."""
    return compute_capability(rt) == 9


def defines(cfg: dict, b_kn: bool = False, mma: str = "f16") -> dict:
    """The kernel's tunables, layout (``b_kn``: B n-contiguous) and input type, its emulation where
    it is on."""
    d = {k: int(cfg[k]) for k in ("MT", "NT", "SWZ")}
    d.update(STAGES=int(cfg["ST"]), SK=split_k(cfg), KPAD=KPAD, B_KN=b_kn, TF32=mma == "tf32",
             INFLIGHT=int(cfg.get("WI", 0)), A_REG=a_in_registers(cfg), PATCH=from_patch(cfg),
             APREFETCH=int(cfg.get("AP", 0)), WGMMA_EMULATE=emulated())
    return d


def patch() -> Optional[Callable[[bytes], bytes]]:
    """What ``Runtime.program`` does to the built binary: sm_90a markers (none when emulated)."""
    return None if emulated() else raise_to_sm90a


def aligned(*ints) -> bool:
    """Whether B's offsets, strides and row length (in halves) let cp.async copy 16-byte chunks."""
    return all(int(v) % 8 == 0 for v in ints)


def launch(cfg: dict, M: int, N: int, Z: int, out=None) -> tuple:
    """(global size, local size) over Z images, each split SK ways: N / NT tiles of output pixels,
    or with ``PT`` tiles of NT / 8 rows of 8 over the output tensor ``out`` (``PT`` 2: of NT pixels
    of its grid padded to ``out.w`` + 2 columns)."""
    threads = 2 * int(cfg["MT"])
    if flat_patch(cfg):
        tiles = -(-out.h * (out.w + 2) // int(cfg["NT"]))
    else:
        tiles = -(-out.h // (int(cfg["NT"]) // 8)) * -(-out.w // 8) if from_patch(cfg) else -(-N // int(cfg["NT"]))
    return (tiles * threads, -(-M // int(cfg["MT"])), Z * split_k(cfg)), (threads, 1, 1)


class BoundGemm(NamedTuple):
    """A GEMM ready to enqueue: the kernel with its arguments set, its sizes, C's buffer ([M][N]
    half), and every buffer it reads (a kernel does not keep its buffer arguments alive)."""

    kernel: object
    gsize: tuple
    lsize: tuple
    c: object
    buffers: tuple


def bound_gemm(rt, A: np.ndarray, B: np.ndarray, cfg: dict = DEFAULT, b_kn: bool = False,
               mma: str = "f16") -> BoundGemm:
    """C = A @ B on the device, bound: B given transposed ([N][K]) or with ``b_kn`` as is
    ([K][N]), the operands uploaded as half, or at ``mma`` "tf32" as float (A rounded to TF32, C
    float), k padded to a multiple of 8 where B is transposed."""
    why = why_illegal(cfg, mma) or ("a K split needs its sum launch: convs bind one" if split_k(cfg) > 1 else None) \
        or ("tf32 reads B k-contiguous only" if b_kn and mma == "tf32" else None)
    if why is not None:
        raise ValueError(f"wgmma config {cfg}: {why}")
    (M, K), N = A.shape, (B.shape[1] if b_kn else B.shape[0])
    if not b_kn and K % 8:
        pad = 8 - K % 8
        A, B, K = np.pad(A, ((0, 0), (0, pad))), np.pad(B, ((0, 0), (0, pad))), K + pad
    half = mma == "f16"
    a = rt.upload(pack_a(np.asarray(A, np.float32), cfg, mma), "A")
    b = rt.upload(np.ascontiguousarray(B, np.float16 if half else np.float32), "B")
    c = rt.alloc(M * N * element_bytes(mma), "C")
    bias = rt.upload(np.zeros(M, np.float32), "bias")
    d = {**defines(cfg, b_kn, mma), "HALF_STORAGE": half, "NO_BIAS": True, "B_SCALAR": b_kn and not aligned(N)}
    k = rt.cl.Kernel(rt.program("gemm_wgmma.cl", d, patch=patch()), "yc_gemm_wgmma")
    k.set_args(a, bias, b, *i32(0, 0, 0, N if b_kn else K), c, *i32(0, 0, N), c, *i32(0, 0), *i32(M, N, K, 1))
    return BoundGemm(k, *launch(cfg, M, N, 1), c, (a, b, bias))


def pack_fragments(w: np.ndarray, MT: int, mma: str = "f16") -> np.ndarray:
    """[M][K] weights -> each work-item's wgmma A fragments (M padded to MT, K to KPAD with zeros),
    the register layout of ``wgmma``'s A operand (that of ``mma.m16n8k16`` / ``m16n8k8`` per warp),
    so that a k-step of a tile is 2 MT consecutive 16-byte loads. For m-tile i, k-step s,
    work-item (warpgroup wg, warp w, lane 4g + t), rows r = 64 wg + 16 w + g and r + 8:
    f16, [Mp/MT][Kp/16][2 MT][8] halves: k 2t, 2t + 1 and the same at k + 8, ordered (r, k),
    (r, k + 1), (r + 8, k), (r + 8, k + 1), then at k + 8;
    tf32, [Mp/MT][Kp/8][2 MT][4] floats rounded to TF32: (r, t), (r + 8, t), (r, t + 4), (r + 8, t + 4)."""
    M, K = w.shape
    Mp, Kp = -(-M // MT) * MT, -(-K // KPAD) * KPAD
    half = mma == "f16"
    a = np.zeros((Mp, Kp), np.float16 if half else np.float32)
    a[:M, :K] = w if half else tf32_round(np.asarray(w, np.float32))
    tid = np.arange(2 * MT)
    wg, warp, lane = tid // 128, tid % 128 // 32, tid % 32
    r = 64 * wg + 16 * warp + lane // 4
    if half:
        k, step = 2 * (lane % 4), 16
        rows = np.stack([r, r, r + 8, r + 8, r, r, r + 8, r + 8], 1)
        cols = np.stack([k, k + 1, k, k + 1, k + 8, k + 9, k + 8, k + 9], 1)
    else:
        k, step = lane % 4, 8
        rows, cols = np.stack([r, r + 8, r, r + 8], 1), np.stack([k, k, k + 4, k + 4], 1)
    tiles = a.reshape(Mp // MT, MT, Kp // step, step).transpose(0, 2, 1, 3)     # [m-tile][k-step][MT][step]
    return np.ascontiguousarray(tiles[:, :, rows, cols])


def pack_a(w: np.ndarray, cfg: dict, mma: str) -> np.ndarray:
    """The weights [M][K] as ``cfg``'s kernel reads them: fragments with A in registers, else
    gemm_mma's padded rows."""
    return pack_fragments(w, int(cfg["MT"]), mma) if a_in_registers(cfg) else pack_weights(w, 1, mma)


def gemm(rt, A: np.ndarray, B: np.ndarray, cfg: dict = DEFAULT, b_kn: bool = False, mma: str = "f16") -> np.ndarray:
    """C = A @ B (float32 out) through :func:`bound_gemm`: the probe's and the tests' GEMM."""
    g = bound_gemm(rt, A, B, cfg, b_kn, mma)
    cl = rt.cl
    cl.enqueue_nd_range_kernel(rt.queue, g.kernel, g.gsize, g.lsize)
    out = np.empty((A.shape[0], B.shape[1] if b_kn else B.shape[0]), np.float16 if mma == "f16" else np.float32)
    cl.enqueue_copy(rt.queue, out, g.c)
    rt.queue.finish()
    return out.astype(np.float32)


def probe(rt) -> float:
    """The largest relative error of a ragged 150x70x100 GEMM (padding in every dimension) against
    NumPy: in half with B k-contiguous and n-contiguous, in TF32 with B k-contiguous."""
    rng = np.random.default_rng(11)
    A = rng.standard_normal((150, 100)).astype(np.float16)
    B = rng.standard_normal((100, 70)).astype(np.float16)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    cfg = {"MT": 128, "NT": 64, "SWZ": 64, "ST": 2}
    return max(float(np.linalg.norm(c - ref) / np.linalg.norm(ref))
               for c in (gemm(rt, A, B.T, cfg), gemm(rt, A, B, cfg, b_kn=True), gemm(rt, A, B.T, cfg, mma="tf32")))


def available(rt) -> bool:
    """Whether wgmma runs on ``rt``'s device (or is emulated) and a probe GEMM matches NumPy. The
    probe runs in a context of its own, so a kernel that faults cannot take ``rt``'s queue down
    with it. Any failure says no, with one line at INFO level (``--verbose``)."""
    from ..runtime import Runtime
    key = (rt.device_name, rt.driver, emulated())
    if key not in _PROBED:
        ok = False
        if emulated() or hopper(rt):
            try:
                err = probe(Runtime(rt.device, binary_cache=rt.binary_cache))
                ok = err < 1e-2
                if not ok:
                    log.info("wgmma off on %s: probe GEMM error %.2g", rt.device_name, err)
            except Exception as e:      # noqa: BLE001 - a driver that cannot build, load or run it
                log.info("wgmma off on %s: %s", rt.device_name, str(e).splitlines()[0][:200])
        _PROBED[key] = ok
    return _PROBED[key]


# -- the conv family ---------------------------------------------------------------------------
def conv_algos(node: Node, mma: str = "f16") -> list:
    """Algorithms of this family that can run ``node`` (one group) in ``mma`` mode: a 1x1 conv's
    input as B, the im2col matrix gathered on the fly, or written by an im2col pass first, and the
    input transposed to NHWC (tf32: only the last)."""
    if conv_gemm_shape(node)[3] != 1 or is_depthwise(node):
        return []
    algos = ["gemm1x1"] if is_pointwise(node) else []
    return [a for a in algos + ["implicit", "im2col", "nhwc"] if a in MODES.get(mma, ())]


def nhwc_channels(node: Node) -> int:
    """The channels of an nhwc conv's input pixel: ``in_c`` rounded up to 8, so that a pixel's
    channels are whole 16-byte chunks (the rest zeros, in the input and in the weights)."""
    return -(-node.attrs["in_c"] // 8) * 8


def gemm_k(node: Node, algo: str) -> int:
    """K of ``node``'s GEMM under ``algo``: an nhwc conv's taps of padded pixels."""
    return node.attrs["size"] ** 2 * nhwc_channels(node) if algo == "nhwc" else conv_gemm_shape(node)[2]


def heuristic_config(node: Node, batch: int, mma: str = "f16", planes: bool = False) -> Optional[dict]:
    """The untuned pick (None: the ``mma`` family's). A conv whose 128 x 128 tiles number at least
    one per SM: a 1x1 conv straight from its input (``gemm1x1``, :data:`UNTUNED_1X1` tiles), a
    spatial one whose channels fill 16-byte chunks ``nhwc`` (:data:`UNTUNED`); on an H100 every
    such yolov3 608 batch 8 shape ran 1.3-1.9x faster so. A spatial conv of fewer tiles (one image):
    ``nhwc`` on 64 x 64 tiles, four stages, each stage's wgmma kept in flight while the next is
    staged (:data:`UNTUNED_FEW`: 2-5% faster so on an H200), or from K = 2304 on with K split in
    four (:data:`UNTUNED_DEEP`), except strided deep ones, where mma.sync's split-K was as fast
    (yolov3 416 batch 1, BENCHMARKS.md, nineteenth session). Before those, a stride-1 3x3 conv of
    few tiles whose input patches can be staged takes them (:data:`UNTUNED_PATCH`; from
    :data:`PATCH_SPLIT_TILES` k-tiles on, split in four: :data:`UNTUNED_PATCH_DEEP`; BENCHMARKS.md,
    thirtieth session). A conv that writes a max-pool through stays with mma, whose epilogue
    computes the pool (yolov3-tiny's 208x208 one). At tf32 (no ``gemm1x1``) the same spatial convs, the strided deep ones split too: mma.sync's tf32 runs at
    half its f16 rate, and every such yolov3 416 shape ran 1.2-1.8x faster so on an H200
    (BENCHMARKS.md, twentieth session). Where the conv's input reaches it as planes (``planes``: read
    by another layer too, or a route's slice) and its tiles are few, the transpose it would need
    (5 us or more a launch) costs more than ``nhwc`` saves there (yolov7 416 batch 1's convs after
    routes: 0.003-0.008 ms slower each, twentieth session): mma's too."""
    algos = conv_algos(node, mma)
    pool = node.attrs.get("write_through")
    if not algos or (pool is not None and pool.op == "maxpool"):
        return None
    M, N = conv_gemm_shape(node)[:2]
    many = -(-M // 128) * -(-N // 128) * batch >= HOPPER_SMS
    if "gemm1x1" in algos:
        return {"algo": "gemm1x1", "family": FAMILY, **UNTUNED_1X1} if many else None
    if node.attrs["in_c"] % 8 or node.attrs["size"] == 1:      # padded channels; a strided 1x1: mma's
        return None
    if many:
        return {"algo": "nhwc", "family": FAMILY, **UNTUNED}
    if planes:
        return None
    K = gemm_k(node, "nhwc")
    deep = K // k_tile(UNTUNED_PATCH, mma) >= PATCH_SPLIT_TILES
    patch = {"algo": "nhwc", "family": FAMILY, **(UNTUNED_PATCH_DEEP if deep else UNTUNED_PATCH)}
    if why_illegal(patch, mma) is None and why_not_patch(node, patch, mma) is None:
        return patch
    if K < DEEP_K:
        return {"algo": "nhwc", "family": FAMILY, **UNTUNED_FEW}
    strided = node.attrs["stride_x"] > 1 or node.attrs["stride_y"] > 1
    if (mma == "tf32" or not strided) and why_not_split(UNTUNED_DEEP, K, "nhwc", mma) is None:
        return {"algo": "nhwc", "family": FAMILY, **UNTUNED_DEEP}
    return None


def nhwc_weights(node: Node) -> np.ndarray:
    """A conv's weights [filters][K] with k ordered (ky, kx, c), as an nhwc conv's B rows are
    (c padded with zero weights to :func:`nhwc_channels`)."""
    a = node.attrs
    w = a["weights"].reshape(a["filters"], a["in_c"], a["size"], a["size"]).transpose(0, 2, 3, 1)
    return np.pad(w, ((0, 0), (0, 0), (0, 0), (0, nhwc_channels(node) - a["in_c"]))).reshape(a["filters"], -1)


def nhwc_operand(ctx: BindContext, node: Node, at: int = 0) -> tuple:
    """(launches, B arguments) of an nhwc conv: the input transposed into the workspace at byte
    ``at`` ([image][H][W][CP], CP the padded channels), read by the GEMM as B rows of channels
    (its ldb: CP); or where its producer stored it channels-last (``ctx.nhwc``: kernels/layout.py,
    channels a multiple of 8 only) the input as it is."""
    x, c, cp = node.inputs[0], node.attrs["in_c"], nhwc_channels(node)
    xb, xoff, xbs = ctx.view(x)
    if x.tensor.id in ctx.nhwc:
        return [], [xb, xoff, xbs] + i32(0, c)
    ws = ctx.scratch(at + nhwc_bytes(node, ctx.batch, ctx.itemsize))
    y_off = at // ctx.itemsize
    k = ctx.kernel("conv.cl", "yc_nchw_to_nhwc", ctx.defines(),
                   [xb, xoff, xbs] + i32(c, x.h * x.w) + [ws] + i32(y_off, cp))
    gs = (-(-x.h * x.w // 32) * 32, -(-cp // 32) * 8, ctx.batch)
    return [Launch(k, gs, (32, 8, 1), node, TRANSPOSE)], [ws] + i32(y_off, cp * x.h * x.w, 0, cp)


def transpose_at(cfg: dict, M: int, N: int, batch: int) -> int:
    """Where an nhwc conv's transposed input starts in the workspace: after the split-K partial
    sums, rounded up to 256 bytes, since its pixels are copied 16 bytes at a time (4 * SK * M * N
    bytes of partials end mid-chunk where SK * M * N is not a multiple of 4: a 255-filter 1x1 at
    13x13 split in two faulted on the GPU and crashed PoCL)."""
    return -(-partial_bytes(cfg, M, N, batch) // 256) * 256


def nhwc_bytes(node: Node, batch: int, itemsize: int) -> int:
    """The workspace of an nhwc conv: its input, transposed (channels padded)."""
    x = node.inputs[0]
    return batch * nhwc_channels(node) * x.h * x.w * itemsize


def bind(ctx: BindContext, node: Node, cfg: dict) -> list:
    """Launches for a conv under a wgmma config: [im2col,] GEMM with the fused epilogue."""
    if ctx.mma not in MODES:
        raise YoloClError("the wgmma family computes fp16 or tf32 on a Hopper GPU's tensor cores only")
    algo = cfg.get("algo")
    if algo not in conv_algos(node, ctx.mma):
        raise YoloClError(f"algorithm '{algo}' cannot run this layer in the wgmma family at {ctx.mma}")
    M, N = conv_gemm_shape(node)[:2]
    K = gemm_k(node, algo)
    why = why_illegal(cfg, ctx.mma) or why_not_split(cfg, K, algo, ctx.mma) or why_not_patch(node, cfg, ctx.mma)
    if why is not None:
        raise YoloClError(f"wgmma config {cfg}: {why}")
    a = node.attrs
    nhwc = algo == "nhwc"
    sk = split_k(cfg)
    partials = partial_bytes(cfg, M, N, ctx.batch)      # first in the workspace, an nhwc transpose after
    frag = ("fragments", int(cfg["MT"])) if a_in_registers(cfg) else ()
    if nhwc:
        wts = packed_upload(ctx, node, (node.layers[0], ctx.mma, FAMILY, "nhwc") + frag,
                            lambda: pack_a(nhwc_weights(node), cfg, ctx.mma))
        launches, b_args = nhwc_operand(ctx, node, transpose_at(cfg, M, N, ctx.batch))
    else:
        wts = packed_upload(ctx, node, (node.layers[0], "f16", FAMILY) + frag,
                            lambda: pack_a(a["weights"].reshape(a["filters"], -1), cfg, "f16"))
        launches, b_args = b_operand(ctx, node, algo)
    store = write_target(ctx, node)
    d = {**epilogue_defines(ctx, node), **store.defines, **defines(cfg, not nhwc, ctx.mma),
         "B_SCALAR": not nhwc and not aligned(N, *b_args[1:3], b_args[4])}
    extra = []
    if algo in ("implicit", "nhwc"):
        x = node.inputs[0]
        d.update({"NHWC" if nhwc else "IMPLICIT": True}, KS=a["size"], SX=a["stride_x"], SY=a["stride_y"],
                 PAD=a["pad"], DIL=a["dilation"])
        if flat_patch(cfg):
            d.update(PFLAT=True, PW=node.output.w + 2)
        extra = i32(x.h, x.w, node.output.w)
    c_args = store.c_args if sk == 1 else [ctx.scratch(partials)] + i32(0, 0, N)
    r_args = residual_args(ctx, node)
    args = [wts["A"], wts["bias"]] + b_args + c_args + r_args + i32(M, N, K, 1) + extra
    gs, ls = launch(cfg, M, N, ctx.batch, node.output)
    k = ctx.kernel("gemm_wgmma.cl", "yc_gemm_wgmma", d, args, patch=patch())
    info = marked(cfg, store.writes, store.layout)
    if nhwc and not launches:
        info["reads"] = "nhwc"
    launches.append(Launch(k, gs, ls, node, "gemm_wgmma", info, node.flops * ctx.batch))
    if sk > 1:      # the partial sums added and the epilogue run by the local family's split-sum kernel
        src, name, sum_d, sum_args, gs, ls = split_sum_spec(d, sk, c_args[0], wts["bias"], store.c_args, r_args,
                                                            M, N, 1, ctx.batch, store.n_out)
        launches.append(Launch(ctx.kernel(src, name, sum_d, sum_args), gs, ls, node, "splitk_sum", info))
    return launches


class WgmmaGemm:
    """The kernel-family interface (see ``family.py``) of the wgmma GEMM."""

    name = FAMILY
    tensor_cores = True
    timed_beside_tensor_cores = False
    derived, schedule, block = (), ("WI", "AR", "PT", "AP"), ("MT", "NT")
    stores_nhwc, reads_nhwc = ALGOS, ("nhwc",)

    # The probe runs only where the family is asked for configs (the tuner) or a stored config
    # of it is checked: a run that binds none of its configs does not pay for it at start-up.
    def offered(self, rt, mma: str) -> bool:
        return mma in MODES and (hopper(rt) or emulated())

    def candidates(self, node: Node, rt, batch: int, precision, mma: str) -> list:
        if not available(rt):
            return []
        return [{"algo": algo, "family": FAMILY, **c} for algo in conv_algos(node, mma) for c in SPACE
                if why_illegal(c, mma) is None and why_not_patch(node, {"algo": algo, **c}, mma) is None]

    def heuristic(self, node: Node, rt, batch: int, precision, mma: str,
                  planes: bool = False) -> Optional[dict]:
        return heuristic_config(node, batch, mma, planes) if mma in MODES else None

    def why_illegal(self, node: Node, cfg: dict, rt, mma: str = "") -> Optional[str]:
        if not available(rt):           # a stored entry on a device (or driver) where the probe fails
            return "wgmma does not run on this device"
        mma = mma if mma in MODES else "f16"
        if cfg.get("algo") not in conv_algos(node, mma):
            return f"algorithm '{cfg.get('algo')}' cannot run this layer in the wgmma family at {mma}"
        try:
            return why_illegal(cfg, mma) or why_not_split(cfg, gemm_k(node, cfg["algo"]), cfg["algo"], mma) \
                or why_not_patch(node, cfg, mma)
        except (KeyError, TypeError, ValueError) as e:
            return f"wgmma config {cfg}: {e}"

    def cost(self, node: Node, cfg: dict, batch: int, rt) -> float:
        return conv_cost(node, {**cfg, "MWG": int(cfg["MT"]), "NWG": int(cfg["NT"])}, batch, rt)

    def workspace_bytes(self, node: Node, cfg: dict, batch: int, precision) -> int:
        if cfg.get("algo") == "nhwc":       # the partial sums, then the transposed input
            M, N = conv_gemm_shape(node)[:2]
            return transpose_at(cfg, M, N, batch) + nhwc_bytes(node, batch, precision.itemsize)
        return scratch_bytes(node, cfg, batch, precision)

    def bind(self, ctx: BindContext, node: Node, cfg: dict) -> list:
        return bind(ctx, node, cfg)


KERNEL_FAMILY = WgmmaGemm()
