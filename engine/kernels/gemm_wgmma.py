"""Hopper's warpgroup MMA (``wgmma``, sm_90a) for a half GEMM, ``cl/gemm_wgmma.cl``.

NVIDIA's OpenCL C compiler emits PTX for ``sm_90`` only, where ``mma.sync`` (the ``mma`` family)
is the widest tensor-core instruction; ``wgmma`` reads both operands from local memory in
swizzled layouts and is what cuDNN's Hopper kernels run on. The kernel writes it as markers that
``yolo_cl.ptx`` turns into instructions in the built PTX (``Runtime.program(..., patch=...)``).

Not yet a conv family: C = A @ B with B k-contiguous (given transposed) or, with ``b_kn``,
n-contiguous as a conv's input planes are (wgmma's transposed-B layout), for the GEMM benchmark
(``tools/probe_wgmma.py``) and the reference tests; the conv binding with the shared epilogue
comes next (issue 17).
"""
from __future__ import annotations

import logging
import os
from typing import Optional

import numpy as np

from ..ptx import raise_to_sm90a

log = logging.getLogger("yolo_cl.kernels")

EMULATE_ENV = "YOLO_CL_WGMMA_EMULATE"
LOCAL_LIMIT = 48 * 1024            # what NVIDIA's OpenCL lets a work-group hold (static arrays)
DEFAULT = {"MT": 128, "NT": 128, "SWZ": 64, "ST": 3}    # H100: 330 TFLOP/s at 4096^3 (BENCHMARKS.md)
_PROBED: dict = {}                 # (device, driver, emulated) -> bool


def emulated() -> bool:
    """Whether wgmma is computed in plain OpenCL C (``YOLO_CL_WGMMA_EMULATE=1``) instead of PTX."""
    return os.environ.get(EMULATE_ENV, "").strip() == "1"


def k_tile(cfg: dict) -> int:
    """k per stage: one swizzled row of ``SWZ`` bytes of halves."""
    return int(cfg["SWZ"]) // 2


def local_bytes(cfg: dict) -> int:
    """Local memory of a work-group: ``ST`` stages of (MT + NT) rows of ``SWZ`` bytes."""
    return int(cfg["ST"]) * (int(cfg["MT"]) + int(cfg["NT"])) * int(cfg["SWZ"])


def why_illegal(cfg: dict) -> Optional[str]:
    """Why ``cfg`` cannot be built, or None."""
    if int(cfg["MT"]) not in (64, 128, 256) or int(cfg["NT"]) not in (64, 128, 256):
        return "MT and NT are 64, 128 or 256"
    if int(cfg["SWZ"]) not in (32, 64, 128):
        return "SWZ is 32, 64 or 128"
    if int(cfg["ST"]) < 2:
        return "ST is 2 or more"
    if local_bytes(cfg) > LOCAL_LIMIT:
        return f"{local_bytes(cfg)} bytes of local memory (at most {LOCAL_LIMIT})"
    return None


def hopper(rt) -> bool:
    """An NVIDIA device reporting compute capability 9.0 (wgmma is sm_90a's, not later chips')."""
    d = rt.device
    if "NVIDIA" not in d.vendor.upper() or "cl_nv_device_attribute_query" not in d.extensions:
        return False
    try:
        return int(d.compute_capability_major_nv) == 9
    except Exception:                   # noqa: BLE001 - an attribute the driver refuses means no
        return False


def defines(cfg: dict, b_kn: bool = False) -> dict:
    d = {k: int(cfg[k]) for k in ("MT", "NT", "SWZ")}
    d["STAGES"] = int(cfg["ST"])
    d["B_KN"] = b_kn
    d["WGMMA_EMULATE"] = emulated()
    return d


def program(rt, cfg: dict, b_kn: bool = False):
    """The kernel's program for ``cfg`` (B n-contiguous with ``b_kn``): built and patched to
    sm_90a, or emulated."""
    why = why_illegal(cfg)
    if why is not None:
        raise ValueError(f"wgmma config {cfg}: {why}")
    return rt.program("gemm_wgmma.cl", defines(cfg, b_kn), patch=None if emulated() else raise_to_sm90a)


def gemm(rt, A: np.ndarray, B: np.ndarray, cfg: dict = DEFAULT, b_kn: bool = False) -> np.ndarray:
    """C = A @ B (float32 out) on the device, B given transposed ([N][K]) or with ``b_kn`` as is
    ([K][N]); the operands rounded to half and zero-padded to the tiles: the probe's, the tests'
    and the benchmark's GEMM."""
    cl = rt.cl
    (M, K), N = A.shape, (B.shape[1] if b_kn else B.shape[0])
    mt, nt, kt = int(cfg["MT"]), int(cfg["NT"]), k_tile(cfg)
    Mp, Np, Kp = -(-M // mt) * mt, -(-N // nt) * nt, -(-K // kt) * kt
    a = np.zeros((Mp, Kp), np.float16)
    a[:M, :K] = A
    if b_kn:
        b = np.zeros((Kp, Np), np.float16)
        b[:K, :N] = B
    else:
        b = np.zeros((Np, Kp), np.float16)
        b[:N, :K] = B
    ab, bb = rt.upload(a, "A"), rt.upload(b, "B")
    cb = rt.alloc(Mp * Np * 2, "C")
    k = cl.Kernel(program(rt, cfg, b_kn), "yc_gemm_wgmma")
    k.set_args(ab, bb, cb, np.int32(Mp), np.int32(Np), np.int32(Kp))
    threads = 2 * mt
    cl.enqueue_nd_range_kernel(rt.queue, k, (Np // nt * threads, Mp // mt), (threads, 1))
    out = np.empty((Mp, Np), np.float16)
    cl.enqueue_copy(rt.queue, out, cb)
    rt.queue.finish()
    return out[:M, :N].astype(np.float32)


def probe(rt) -> float:
    """The larger relative error of a ragged 150x70x100 GEMM (padding in every dimension) against
    NumPy, with B k-contiguous and n-contiguous."""
    rng = np.random.default_rng(11)
    A = rng.standard_normal((150, 100)).astype(np.float16)
    B = rng.standard_normal((100, 70)).astype(np.float16)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    cfg = {"MT": 128, "NT": 64, "SWZ": 64, "ST": 2}
    return max(float(np.linalg.norm(gemm(rt, A, B.T, cfg) - ref) / np.linalg.norm(ref)),
               float(np.linalg.norm(gemm(rt, A, B, cfg, b_kn=True) - ref) / np.linalg.norm(ref)))


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
