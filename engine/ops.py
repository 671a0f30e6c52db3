"""Standalone convolution ops on OpenCL for any Python user: ``yolo_cl.ops``.

- :func:`conv2d` -- NCHW cross-correlation (not flipped, like PyTorch and Darknet), any batch,
  stride, padding, dilation and groups. Planes that see one input channel each (plain
  single-channel images, depthwise) at stride 1 run a dedicated tiled kernel; everything else
  runs im2col + the engine's GEMM (``cl/gemm.cl``).
- :func:`causal_depthwise_conv1d` and :func:`causal_depthwise_conv1d_backward` --
  ``out[b][c][t] = eps + sum_{u<=t} w[c][T-1-(t-u)] * k[b][c][u]`` and its gradients.

Arguments are NumPy arrays (results come back as NumPy) or pyopencl arrays (results stay on the
device, on the array's queue). Images bigger than one device allocation, or than
``max_tile_bytes``, run in row bands with halos, so host memory is the only size limit. Kernel
configs (tile shape, register block) are chosen by a short timed search once per device and
shape bucket and saved to the engine's tuning database (the user cache), so later processes
read them instead of searching; ``set_tuning`` controls when a search happens.
"""
from __future__ import annotations

import os
import threading
import warnings
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence, Tuple, Union

import numpy as np

from .errors import DeviceError, LimitError, YoloClError
from .measure import time_call
from .precision import FP32
from .runtime import Runtime, select_device

__all__ = ["conv2d", "causal_depthwise_conv1d", "causal_depthwise_conv1d_backward", "runtime", "set_tuning",
           "tuned_configs", "OpError", "corr2d_candidates", "causal1d_candidates"]

IntPair = Union[int, Sequence[int]]

TUNE_ENV = "YOLO_CL_OPS_TUNE"          # "auto" (default), "on" or "off"
AUTO_TUNE_FLOPS = 1e9                  # in "auto" mode, calls with less work use the heuristic config
_TUNE_FLOPS = {True: 2e8, False: 1e10}  # work of one timed tuning run, CPU / GPU
_MAX_GROUPS = 65535                    # work-groups along global dims 1 and 2 (CUDA grid limit)


class OpError(YoloClError, ValueError):
    """Arguments an op cannot run with: shapes, dtypes, strides."""


# -- devices -------------------------------------------------------------------------------------

class _AdoptedRuntime(Runtime):
    """A Runtime that speaks through a caller's pyopencl queue, so their arrays can be used directly."""

    def __init__(self, queue) -> None:
        super().__init__(queue.device)
        self.context, self.queue = queue.context, queue
        self.profiling = bool(queue.properties & self.cl.command_queue_properties.PROFILING_ENABLE)


class _Ctx:
    """What the ops keep per device beside its Runtime (which allocates, pools and builds): kernel
    objects with their arguments set per call, tuned configs, the device's limits."""

    def __init__(self, rt: Runtime) -> None:
        self.rt, self.cl = rt, rt.cl
        self.pool = rt.pool
        self.configs: dict = {}
        self.not_in_db: set = set()          # shape buckets the tuning database had no config for
        self.events: deque = deque(maxlen=4096)   # launch events, kept on a profiling runtime (benchmarks)
        self._kernels: dict = {}
        self.lock = threading.RLock()
        d = rt.device
        self.is_cpu = rt.is_cpu
        self.host_memory = bool(d.host_unified_memory) if rt.is_cpu else False   # buffers can wrap NumPy arrays
        self.max_alloc = int(d.max_mem_alloc_size)
        self.global_mem = int(d.global_mem_size)
        self.local_mem = int(d.local_mem_size)
        self.max_wg = int(d.max_work_group_size)
        self.max_const = int(d.max_constant_buffer_size)
        simd = int(d.preferred_vector_width_float or 4)
        self.simd = 16 if simd >= 16 else (8 if simd >= 8 else 4)

    def kernel(self, source: str, name: str, defines: dict):
        key = (source, name, tuple(sorted(defines.items())))
        k = self._kernels.get(key)
        if k is None:
            k = self.cl.Kernel(self.rt.program(source, defines), name)
            self._kernels[key] = k
        return k

    def alloc(self, nbytes: int, what: str):
        return self.rt.pooled(nbytes, what)

    def upload(self, a: np.ndarray, what: str):
        """A device copy of ``a``, enqueued without waiting (pyopencl keeps ``a`` alive until it is done)."""
        buf = self.alloc(a.nbytes, what)
        if a.nbytes:
            self.cl.enqueue_copy(self.rt.queue, buf, a, is_blocking=False)
        return buf

    def run(self, kernel, gsize: tuple, lsize: Optional[tuple], args: list) -> None:
        kernel.set_args(*args)
        try:
            ev = self.cl.enqueue_nd_range_kernel(self.rt.queue, kernel, gsize, lsize)
            if self.rt.profiling:
                self.events.append(ev)
        except self.cl.Error as e:
            raise DeviceError(f"kernel {kernel.function_name} {gsize}/{lsize} failed on "
                              f"{self.rt.device_name}: {e}") from None


_CONTEXTS: dict = {}
_CONTEXTS_LOCK = threading.Lock()


def _is_device_array(a) -> bool:
    try:
        import pyopencl.array as cla
    except ImportError:   # pragma: no cover - pyopencl is a hard dependency
        return False
    return isinstance(a, cla.Array)


def _context(device=None, arrays: Sequence = ()) -> _Ctx:
    """The cached context for ``device`` (or for the queue of the first pyopencl array given).

    Arrays made on the queue of a known context (``runtime(device).queue``) use that context;
    arrays of another queue get a context that adopts it."""
    import pyopencl as cl
    dev_arrays = [a for a in arrays if _is_device_array(a)]
    with _CONTEXTS_LOCK:
        if dev_arrays:
            queue = dev_arrays[0].queue
            if queue is None:
                raise OpError("a pyopencl array without a queue was passed; create it with a queue")
            known = [ctx for ctx in _CONTEXTS.values() if ctx.rt.queue.int_ptr == queue.int_ptr]
            key, make = ("queue", queue.int_ptr), (lambda: _AdoptedRuntime(queue))
        elif isinstance(device, Runtime):
            known = [ctx for ctx in _CONTEXTS.values() if ctx.rt is device]
            key, make = ("runtime", id(device)), (lambda: device)
        else:
            dev = device if isinstance(device, cl.Device) else select_device(device)
            known = []
            key, make = ("device", dev.int_ptr), (lambda: Runtime(dev))
        if known:
            return known[0]
        ctx = _CONTEXTS.get(key)
        if ctx is None:
            ctx = _Ctx(make())
            _CONTEXTS[key] = ctx
    return ctx


def runtime(device=None) -> Runtime:
    """The Runtime the ops use for ``device``: make pyopencl arrays on its ``queue`` to keep data on the device."""
    return _context(device).rt


def free_memory(device=None) -> None:
    """Return the device memory the ops keep pooled for reuse (scratch and output buffers) to the driver."""
    ctx = _context(device)
    with ctx.lock:
        ctx.pool.free_held()


def launch_events(device=None) -> deque:
    """The OpenCL events of the ops' recent launches on ``device`` (the last 4096; kept only on a
    profiling runtime, ``Runtime(profiling=True)``): a benchmark clears it, calls an op and sums
    the events' times (``measure.event_ms``)."""
    return _context(device).events


def tuned_configs(device=None) -> dict:
    """The configs the timed search has chosen on ``device`` so far, by shape bucket (a copy)."""
    return dict(_context(device).configs)


# -- tuning --------------------------------------------------------------------------------------

_tune_mode = os.environ.get(TUNE_ENV, "auto").strip().lower() or "auto"


def set_tuning(mode: str) -> None:
    """When to run the timed config search: ``"auto"`` (calls of 1 GFLOP or more), ``"on"`` or ``"off"``."""
    global _tune_mode
    if mode not in ("auto", "on", "off"):
        raise OpError(f"tuning mode must be 'auto', 'on' or 'off', not {mode!r}")
    _tune_mode = mode


def _wants_tuning(tune: Optional[bool], flops: float) -> bool:
    if tune is not None:
        return bool(tune)
    if _tune_mode == "on":
        return True
    if _tune_mode == "off":
        return False
    return flops >= AUTO_TUNE_FLOPS


def _db_key(key: tuple) -> str:
    """The tuning-database key of an op's shape bucket, e.g. ``ops corr2d 14 15 8192 True``."""
    return "ops " + " ".join(str(v) for v in key)


def _remembered(ctx: _Ctx, key: tuple, candidates: list) -> Optional[dict]:
    """The config chosen for ``key`` before: in this process, else in the tuning database (the
    engine's: shipped files and the user cache), if it is still one of this device's candidates."""
    if key in ctx.configs:
        return ctx.configs[key]
    if key in ctx.not_in_db:             # read the files once per bucket, not on every untuned call
        return None
    from .tuning_db import TuningDatabase
    cfg = TuningDatabase(ctx.rt, FP32).lookup_key(_db_key(key))
    if cfg is not None and cfg in candidates:
        ctx.configs[key] = cfg
        return cfg
    ctx.not_in_db.add(key)
    return None


def _store(ctx: _Ctx, key: tuple, cfg: dict) -> None:
    """Write a searched config to the user tuning database, so later processes skip the search."""
    from .tuning_db import TuningDatabase
    try:
        TuningDatabase(ctx.rt, FP32).record({_db_key(key): dict(cfg)})
    except (OSError, YoloClError) as e:
        warnings.warn(f"yolo_cl.ops: could not save the tuned config for {_db_key(key)}: {e}", stacklevel=3)


def _search(ctx: _Ctx, key: tuple, candidates: list, trial: Callable[[dict], None]) -> dict:
    """Time ``trial`` under each candidate config, remember the fastest for ``key`` and return it.

    Callers use ``_remembered`` first and the heuristic ``candidates[0]`` when not tuning (not
    remembered, so a later call that tunes still searches). The winner goes to ``ctx.configs``
    and to the user tuning database, shared with the engine's conv configs."""
    timings = []
    for cand in candidates:
        try:
            timings.append((time_call(lambda: trial(cand), ctx.rt.queue), cand))   # the first call builds
        except DeviceError:
            continue                     # a config this device cannot build or launch
    if not timings:
        return candidates[0]
    cfg = min(timings, key=lambda tc: tc[0])[1]
    ctx.configs[key] = cfg
    ctx.not_in_db.discard(key)
    _store(ctx, key, cfg)
    return cfg


# -- argument helpers ----------------------------------------------------------------------------

def _pair(v: IntPair, name: str, minimum: int) -> Tuple[int, int]:
    vals = (v, v) if isinstance(v, (int, np.integer)) else tuple(v)
    if len(vals) != 2 or any(not isinstance(i, (int, np.integer)) or i < minimum for i in vals):
        raise OpError(f"{name} must be an int >= {minimum} or a pair of them, not {v!r}")
    return int(vals[0]), int(vals[1])


def _host(a, name: str) -> np.ndarray:
    """A C-contiguous float32 copy-if-needed of host data (small device arrays are read back)."""
    if _is_device_array(a):
        a = a.get()
    arr = np.asarray(a)
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise OpError(f"{name} must hold real numbers, not {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def _check_device(a, name: str):
    if a.dtype != np.float32:
        raise OpError(f"{name} on the device must be float32, not {a.dtype}")
    if not a.flags.c_contiguous:
        raise OpError(f"{name} on the device must be C-contiguous")
    return a


def _i32(*vals) -> list:
    return [np.int32(v) for v in vals]


def _i64(*vals) -> list:
    return [np.int64(v) for v in vals]


def _tile_cap(ctx: _Ctx, max_tile_bytes: Optional[int]) -> int:
    cap = min(ctx.max_alloc, ctx.global_mem // 2)
    if max_tile_bytes is not None:
        if max_tile_bytes < 1024:
            raise OpError(f"max_tile_bytes must be at least 1024, not {max_tile_bytes}")
        cap = min(cap, int(max_tile_bytes))
    return cap


# -- conv2d: geometry and configs ----------------------------------------------------------------

@dataclass(frozen=True)
class _Conv:
    """One conv2d problem: shapes, stride, padding, dilation, groups."""

    n: int
    c: int
    h: int
    w: int
    f: int
    kh: int
    kw: int
    sy: int
    sx: int
    py: int
    px: int
    dy: int
    dx: int
    g: int
    direct: bool = False                 # runs the tiled correlation kernel (else im2col + GEMM)

    @property
    def oh(self) -> int:
        return (self.h + 2 * self.py - self.dy * (self.kh - 1) - 1) // self.sy + 1

    @property
    def ow(self) -> int:
        return (self.w + 2 * self.px - self.dx * (self.kw - 1) - 1) // self.sx + 1

    @property
    def k(self) -> int:
        return (self.c // self.g) * self.kh * self.kw

    @property
    def one_plane(self) -> bool:
        """Each output plane reads one input plane at stride 1: what the correlation kernel can run."""
        return self.c == self.g and self.sy == self.sx == 1 and self.dy == self.dx == 1

    @property
    def flops(self) -> float:
        return 2.0 * self.n * self.f * self.oh * self.ow * self.k

    def in_rows(self, rows: int) -> int:
        """Input rows a band of ``rows`` output rows reads (at most the image)."""
        return min(self.h, (rows - 1) * self.sy + (self.kh - 1) * self.dy + 1)


def _corr2d_tile(cfg: dict, kh: int, kw: int) -> Tuple[int, int, int]:
    """(tile width, tile height, local floats) of a yc_corr2d config; mirrors cl/ops.cl."""
    vec = cfg["VEC"]
    rxw = vec * cfg["NV"] if vec else cfg["RX"]
    tw, th = cfg["LX"] * rxw, cfg["LY"] * cfg["RY"]
    if not vec and cfg.get("STATIC") and cfg["RX"] % 4 == 0:
        segn = -(-(cfg["RX"] + kw - 1) // 4) * 4
        pitch = -(-(tw - cfg["RX"] + segn) // 4) * 4
    else:
        align = vec or 4
        pitch = -(-(tw + kw - 1) // align) * align
    return tw, th, (th + kh - 1) * pitch


def corr2d_candidates(ctx_or_device=None, kh: int = 3, kw: int = 3, gpu: Optional[bool] = None) -> list:
    """Configs of the 2-D correlation kernel that fit the device, heuristic first; [] if none fits.

    ``gpu`` picks the family (default: the device's kind); tests run the GPU family on PoCL."""
    ctx = ctx_or_device if isinstance(ctx_or_device, _Ctx) else _context(ctx_or_device)
    if not (not ctx.is_cpu if gpu is None else gpu):
        v = ctx.simd
        # One work-item per work-group: CPU drivers run a work-group as a loop, and a private
        # tile per block of RY x NV vectors is cheap. RY*NV accumulators + NV row vectors + one
        # broadcast weight must fit the SIMD registers (16 with AVX2).
        # Small kernels get their size compiled in: fixed short tap loops unroll (2.5x at 3x3).
        raw = [dict(VEC=v, NV=nv, RY=ry, LX=1, LY=1) for nv, ry in ((2, 4), (3, 4), (2, 6), (3, 3), (4, 2), (2, 3))]
        if kh * kw <= 25:
            for cfg in raw:
                cfg["STATIC"] = True
    else:
        # Scalar register blocks of RY x RX outputs, 128-thread work-groups. Unrolled over the
        # input rows (taps compiled in) every weight is a constant-memory operand but the body
        # holds RY*RX*KH*KW multiply-adds; ROLL_R keeps one row's worth and indexes the weights.
        # On the H200 the 14x15 winner was RX=4, RY=4 at 80 registers: small blocks keep 6 groups
        # per SM, so the neighbours of that block (tile shape, rows, 256 threads) come next.
        raw = [dict(VEC=0, RX=4, RY=4, LX=16, LY=8), dict(VEC=0, RX=4, RY=8, LX=16, LY=8),
               dict(VEC=0, RX=4, RY=4, LX=32, LY=4), dict(VEC=0, RX=4, RY=2, LX=16, LY=8),
               dict(VEC=0, RX=4, RY=3, LX=32, LY=8), dict(VEC=0, RX=4, RY=4, LX=16, LY=16),
               dict(VEC=0, RX=8, RY=2, LX=16, LY=8), dict(VEC=0, RX=8, RY=4, LX=8, LY=16),
               dict(VEC=0, RX=4, RY=8, LX=16, LY=8, ROLL_R=True), dict(VEC=0, RX=4, RY=8, LX=32, LY=4, ROLL_R=True),
               dict(VEC=0, RX=4, RY=16, LX=16, LY=4, ROLL_R=True)]
        raw += [dict(VEC=0, RX=4, RY=4, LX=32, LY=8), dict(VEC=0, RX=4, RY=2, LX=16, LY=16),
                dict(VEC=0, RX=4, RY=4, LX=16, LY=16, WLOCAL=True), dict(VEC=0, RX=8, RY=4, LX=16, LY=8, WLOCAL=True),
                dict(VEC=0, RX=4, RY=8, LX=16, LY=8, WLOCAL=True)]
        for cfg in raw:                  # taps compiled in when the unrolled body stays a sane size
            body = cfg["RY"] * cfg["RX"] * kw * (1 if cfg.get("ROLL_R") else kh)
            cfg["STATIC"] = body <= 16384
            if not cfg["STATIC"]:
                cfg.pop("WLOCAL", None)
    return [cfg for cfg in raw if cfg["LX"] * cfg["LY"] <= ctx.max_wg
            and (_corr2d_tile(cfg, kh, kw)[2] + (kh * kw if cfg.get("WLOCAL") else 0)) * 4 <= ctx.local_mem - 256]


def _gemm_candidates(ctx: _Ctx, m: int, n: int) -> list:
    vw = 16 if ctx.is_cpu and n >= 64 else (8 if n >= 8 else 1)
    tm = 8 if m >= 8 else (4 if m >= 4 else 1)
    out = [dict(TM=tm, VW=vw)]
    for alt in ([dict(TM=4, VW=8), dict(TM=8, VW=8), dict(TM=4, VW=16)] if m >= 4 and n >= 16 else []):
        if alt not in out:
            out.append(alt)
    return out


# -- conv2d: running bands -----------------------------------------------------------------------

@dataclass
class _Src:
    """An input band on the device: (buffer, element offset, rows held, first image row held)."""

    buf: object
    off: int
    rows: int
    row0: int


@dataclass
class _Dst:
    """An output band on the device: (buffer, element offset, per-image stride, channel stride)."""

    buf: object
    off: int
    bstride: int
    cstride: int


class _Conv2dRunner:
    """Weights on the device and the launches of one conv2d call, band by band.

    ``run`` takes the problem too, so tuning can time a smaller problem with the same weights."""

    def __init__(self, ctx: _Ctx, p: _Conv, w: np.ndarray, bias: np.ndarray) -> None:
        self.ctx = ctx
        self.bias = ctx.upload(bias, "conv2d bias")
        if p.direct:
            self.w = ctx.upload(w, "conv2d weights")
            self.single_w = p.f == 1 and w.nbytes <= ctx.max_const
        else:
            self.w = ctx.upload(w.reshape(p.f, -1), "conv2d weights")
            self.dummy = ctx.alloc(4, "conv2d residual placeholder")

    def release(self) -> None:
        for buf in (self.w, self.bias, getattr(self, "dummy", None)):
            if buf is not None:
                buf.release()

    def run(self, cfg: dict, p: _Conv, src: _Src, dst: _Dst, nb: int, oy0: int, rows: int) -> None:
        """Output rows [oy0, oy0 + rows) of ``nb`` images from ``src`` into ``dst``."""
        if p.direct:
            self._corr2d(cfg, p, src, dst, nb, oy0, rows)
        else:
            self._gemm(cfg, p, src, dst, nb, oy0, rows)

    def _corr2d(self, cfg: dict, p: _Conv, src: _Src, dst: _Dst, nb: int, oy0: int, rows: int) -> None:
        ctx, cl = self.ctx, self.ctx.cl
        defines = dict(YC_CORR2D=True, VEC=cfg["VEC"], RY=cfg["RY"], LX=cfg["LX"], LY=cfg["LY"],
                       SINGLE_W=self.single_w)
        if cfg["VEC"]:
            defines["NV"] = cfg["NV"]
        else:
            defines.update(RX=cfg["RX"], ROLL_R=bool(cfg.get("ROLL_R")), WLOCAL=bool(cfg.get("WLOCAL")))
        if cfg.get("STATIC"):
            defines.update(KH=p.kh, KW=p.kw)
        k = ctx.kernel("ops.cl", "yc_corr2d", defines)
        tw, th, floats = _corr2d_tile(cfg, p.kh, p.kw)
        gsize = (-(-p.ow // tw) * cfg["LX"], -(-rows // th) * cfg["LY"], nb * p.f)
        args = [src.buf] + _i64(src.off, src.rows * p.w) + \
            _i32(src.rows, p.w, oy0 - p.py - src.row0, -p.px) + [self.w, self.bias, dst.buf] + \
            _i64(dst.off, dst.cstride) + _i32(rows, p.ow, p.c, p.f, p.kh, p.kw) + [cl.LocalMemory(floats * 4)]
        ctx.run(k, gsize, (cfg["LX"], cfg["LY"], 1), args)

    def _gemm(self, cfg: dict, p: _Conv, src: _Src, dst: _Dst, nb: int, oy0: int, rows: int) -> None:
        ctx = self.ctx
        cg, m, kk, npix = p.c // p.g, p.f // p.g, p.k, rows * p.ow
        if kk > _MAX_GROUPS:
            raise LimitError(f"conv2d with {kk} taps per output (C/groups*KH*KW) exceeds {_MAX_GROUPS}")
        col = ctx.alloc(4 * nb * p.g * kk * npix, "conv2d im2col workspace")
        im2col = ctx.kernel("ops.cl", "yc_im2col2d", dict(YC_IM2COL=True))
        args = [src.buf] + _i64(src.off, p.c * src.rows * p.w, src.rows * p.w) + \
            _i32(cg, src.rows, p.w, oy0 * p.sy - p.py - src.row0, -p.px) + [col] + \
            _i32(rows, p.ow, p.kh, p.kw, p.sy, p.sx, p.dy, p.dx, p.g)
        ctx.run(im2col, (npix, kk, nb * p.g), None, args)
        defines = dict(TM=cfg["TM"], VW=cfg["VW"], KU=1, CHECK_M=m % cfg["TM"] != 0, CHECK_N=npix % cfg["VW"] != 0)
        gemm = ctx.kernel("gemm.cl", "yc_gemm", defines)
        args = [self.w, self.bias, col] + _i32(0, p.g * kk * npix, kk * npix, npix) + [dst.buf] + \
            _i32(dst.off, dst.bstride, dst.cstride) + [self.dummy] + _i32(0, 0) + _i32(m, npix, kk, p.g)
        ctx.run(gemm, (-(-npix // cfg["VW"]), -(-m // cfg["TM"]), nb * p.g), None, args)
        col.release()


def _band_bytes(p: _Conv, nb: int, rows: int, host_io: bool) -> int:
    elems = 0 if p.direct else nb * p.g * p.k * rows * p.ow
    if host_io:
        elems += nb * p.c * p.in_rows(rows) * p.w + nb * p.f * rows * p.ow
    return 4 * elems


def _bands(p: _Conv, cap: int, host_io: bool, align: int = 1) -> Tuple[int, int]:
    """(images per chunk, output rows per band) whose device buffers fit ``cap`` bytes.

    Band heights are multiples of ``align`` (the kernel's tile height) where possible, so every
    output row sits at the same place in its tile, is summed in the same order, and tiled
    results equal untiled ones bit for bit."""
    if not p.direct:
        cap = min(cap, 2**31 - 4)        # yc_gemm addresses with 32-bit offsets
    planes = p.f if p.direct else p.g
    nb_max = max(1, min(p.n, _MAX_GROUPS // planes))
    per_image = _band_bytes(p, 1, p.oh, host_io)
    if per_image <= cap:
        return max(1, min(nb_max, cap // max(per_image, 1))), p.oh
    lo, hi = 0, p.oh                     # largest band height that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _band_bytes(p, 1, mid, host_io) <= cap:
            lo = mid
        else:
            hi = mid - 1
    if lo >= align:
        lo -= lo % align
    if lo < 1:
        raise LimitError(f"one output row of this conv2d needs {_band_bytes(p, 1, 1, host_io) / 2**20:.1f} MiB "
                         f"on the device, more than the tile limit of {cap / 2**20:.1f} MiB")
    return 1, lo


def _band_align(p: _Conv, cfg: dict) -> int:
    return _corr2d_tile(cfg, p.kh, p.kw)[1] if p.direct else 1


def _conv2d_config(ctx: _Ctx, p: _Conv, runner: _Conv2dRunner, tune: Optional[bool]) -> dict:
    """The kernel config for ``p``: remembered, searched on a smaller problem of its bucket, or heuristic."""
    if p.direct:
        cands = corr2d_candidates(ctx, p.kh, p.kw)
        key = ("corr2d", p.kh, p.kw, min(1 << (p.ow - 1).bit_length(), 8192), runner.single_w)
    else:
        cands = _gemm_candidates(ctx, p.f // p.g, p.oh * p.ow)
        key = ("gemm", p.f // p.g, p.k, min(1 << (p.oh * p.ow - 1).bit_length(), 1 << 20), p.g)
    known = _remembered(ctx, key, cands)
    if known is not None:
        return known
    if not _wants_tuning(tune, p.flops) or len(cands) == 1:
        return cands[0]
    ow = min(p.ow, 1024 if ctx.is_cpu else 4096)
    rows = max(1, min(p.oh, 4096, int(_TUNE_FLOPS[ctx.is_cpu] / (2.0 * p.k * ow * p.f))))
    tp = _Conv(1, p.c, (rows - 1) * p.sy + (p.kh - 1) * p.dy + 1, (ow - 1) * p.sx + (p.kw - 1) * p.dx + 1,
               p.f, p.kh, p.kw, p.sy, p.sx, 0, 0, p.dy, p.dx, p.g, p.direct)
    xs = ctx.upload(np.random.default_rng(0).random((tp.c, tp.h, tp.w), dtype=np.float32), "conv2d tuning input")
    ys = ctx.alloc(4 * tp.f * tp.oh * tp.ow, "conv2d tuning output")
    src, dst = _Src(xs, 0, tp.h, 0), _Dst(ys, 0, tp.f * tp.oh * tp.ow, tp.oh * tp.ow)
    cfg = _search(ctx, key, cands, lambda c: runner.run(c, tp, src, dst, 1, 0, tp.oh))
    xs.release()
    ys.release()
    return cfg


def conv2d(x, w, bias=None, stride: IntPair = 1, pad: IntPair = 0, dilation: IntPair = 1, groups: int = 1,
           device=None, *, max_tile_bytes: Optional[int] = None, tune: Optional[bool] = None,
           config: Optional[dict] = None):
    """2-D cross-correlation ``y[n][f] = bias[f] + sum_{c,ky,kx} w[f][c][ky][kx] * x[n][g*C/G + c][...]``.

    ``x`` (N, C, H, W) and ``w`` (F, C/groups, KH, KW), NumPy or pyopencl float32 (a pair of
    2-D arrays is one single-channel image and kernel); ``stride``, ``pad`` (zeros) and
    ``dilation`` are ints or (y, x) pairs. Returns (N, F, OH, OW) of the same kind as ``x``.
    ``max_tile_bytes`` caps the device memory of one band (default: the largest allocation);
    ``tune`` forces (True) or skips (False) the config search; ``config`` pins a kernel config
    (see :func:`corr2d_candidates`).
    """
    flat = np.ndim(x) == 2 and np.ndim(w) == 2
    on_device = _is_device_array(x)
    if on_device and flat:
        raise OpError("pass device images as 4-D (N, C, H, W) arrays")
    ctx = _context(device, [x])
    wh = _host(w, "w")
    if flat:
        x = _host(x, "x")[None, None]
        wh = wh[None, None]
    if x.ndim != 4 or wh.ndim != 4:
        raise OpError(f"conv2d expects x (N, C, H, W) and w (F, C/groups, KH, KW), got {tuple(x.shape)} "
                      f"and {tuple(wh.shape)}")
    if not isinstance(groups, (int, np.integer)) or groups < 1:
        raise OpError(f"groups must be a positive int, not {groups!r}")
    n, c, h, wd = (int(v) for v in x.shape)
    f, cg, kh, kw = (int(v) for v in wh.shape)
    if c % groups or f % groups or cg != c // groups:
        raise OpError(f"x has {c} channels and w is {tuple(wh.shape)}: with groups={groups} w must be "
                      f"(F, {c // groups if c % groups == 0 else '?'}, KH, KW) with F divisible by {groups}")
    if min(kh, kw, f) < 1:
        raise OpError(f"w has an empty dimension: {tuple(wh.shape)}")
    (sy, sx), (py, px), (dy, dx) = _pair(stride, "stride", 1), _pair(pad, "pad", 0), _pair(dilation, "dilation", 1)
    p = _Conv(n, c, h, wd, f, kh, kw, sy, sx, py, px, dy, dx, int(groups))
    if p.oh < 1 or p.ow < 1:
        raise OpError(f"a {kh}x{kw} kernel (dilation {dy}x{dx}, pad {py}x{px}) does not fit a {h}x{wd} image")
    b = np.zeros(f, np.float32) if bias is None else _host(bias, "bias").reshape(-1)
    if b.shape != (f,):
        raise OpError(f"bias must have {f} values, not {b.size}")
    if config is not None:
        direct = "LX" in config
        if direct and not p.one_plane:
            raise OpError("a correlation-kernel config was given for a conv2d that needs im2col + GEMM")
    else:
        direct = p.one_plane and bool(corr2d_candidates(ctx, kh, kw))
    p = replace(p, direct=direct)

    with ctx.lock:
        runner = _Conv2dRunner(ctx, p, wh, b)
        try:
            cfg = config if config is not None else _conv2d_config(ctx, p, runner, tune)
            if on_device:
                out = _conv2d_device(ctx, p, runner, cfg, _check_device(x, "x"), max_tile_bytes)
            else:
                out = _conv2d_host(ctx, p, runner, cfg, _host(x, "x"), max_tile_bytes)
        finally:
            runner.release()
    return out[0, 0] if flat else out


def _aligned_empty(shape: tuple, align: int = 4096) -> np.ndarray:
    """An uninitialised float32 array on an ``align``-byte boundary, so a driver can use it in place
    (PoCL copies host pointers aligned to less than its 128-byte base alignment)."""
    n = int(np.prod(shape))
    raw = np.empty(n + align // 4, np.float32)
    skip = (-raw.ctypes.data % align) // 4
    return raw[skip:skip + n].reshape(shape)


def _conv2d_host(ctx: _Ctx, p: _Conv, runner: _Conv2dRunner, cfg: dict, x: np.ndarray,
                 max_tile_bytes: Optional[int]) -> np.ndarray:
    cl, q = ctx.cl, ctx.rt.queue
    nb_max, band = _bands(p, _tile_cap(ctx, max_tile_bytes), True, _band_align(p, cfg))
    out = _aligned_empty((p.n, p.f, p.oh, p.ow))
    for n0 in range(0, p.n, nb_max):
        nb = min(nb_max, p.n - n0)
        for oy0 in range(0, p.oh, band):
            rows = min(band, p.oh - oy0)
            r0 = min(max(0, oy0 * p.sy - p.py), p.h)
            r1 = max(r0, min(p.h, (oy0 + rows - 1) * p.sy - p.py + (p.kh - 1) * p.dy + 1))
            xb = np.ascontiguousarray(x[n0:n0 + nb, :, r0:r1, :])
            yb = out[n0:n0 + nb] if rows == p.oh else _aligned_empty((nb, p.f, rows, p.ow))
            if ctx.host_memory and xb.nbytes and yb.nbytes:
                # The device works in host memory: let it read and write the arrays in place.
                xbuf = cl.Buffer(ctx.rt.context, cl.mem_flags.READ_ONLY | cl.mem_flags.USE_HOST_PTR, hostbuf=xb)
                ybuf = cl.Buffer(ctx.rt.context, cl.mem_flags.WRITE_ONLY | cl.mem_flags.USE_HOST_PTR, hostbuf=yb)
            else:
                xbuf = ctx.upload(xb, "conv2d input band")
                ybuf = ctx.alloc(yb.nbytes, "conv2d output band")
            runner.run(cfg, p, _Src(xbuf, 0, r1 - r0, r0), _Dst(ybuf, 0, p.f * rows * p.ow, rows * p.ow),
                       nb, oy0, rows)
            if ctx.host_memory and xb.nbytes and yb.nbytes:
                mapped, _ = cl.enqueue_map_buffer(q, ybuf, cl.map_flags.READ, 0, yb.shape, yb.dtype)
                if mapped.__array_interface__["data"][0] != yb.__array_interface__["data"][0]:
                    yb[...] = mapped     # a driver that kept its own copy after all
                mapped.base.release(q)
            else:
                cl.enqueue_copy(q, yb, ybuf)
                ybuf.release()
                xbuf.release()
            if rows != p.oh:
                out[n0:n0 + nb, :, oy0:oy0 + rows] = yb
    return out


def _conv2d_device(ctx: _Ctx, p: _Conv, runner: _Conv2dRunner, cfg: dict, x, max_tile_bytes: Optional[int]):
    import pyopencl.array as cla
    out = cla.empty(ctx.rt.queue, (p.n, p.f, p.oh, p.ow), np.float32, allocator=x.allocator or ctx.pool)
    if not p.direct and max(x.size, out.size) >= 2**31:
        raise LimitError("conv2d on device arrays of 2^31 or more elements needs the direct kernel; "
                         "pass NumPy arrays to run it in bands")
    nb_max, band = _bands(p, _tile_cap(ctx, max_tile_bytes), False, _band_align(p, cfg))
    xoff, yoff = x.offset // 4, out.offset // 4
    for n0 in range(0, p.n, nb_max):
        nb = min(nb_max, p.n - n0)
        for oy0 in range(0, p.oh, band):
            rows = min(band, p.oh - oy0)
            src = _Src(x.base_data, xoff + n0 * p.c * p.h * p.w, p.h, 0)
            dst = _Dst(out.base_data, yoff + n0 * p.f * p.oh * p.ow + oy0 * p.ow, p.f * p.oh * p.ow, p.oh * p.ow)
            runner.run(cfg, p, src, dst, nb, oy0, rows)
    return out


# -- causal depthwise 1-D convolution ------------------------------------------------------------

def _causal_layout(ctx: _Ctx, cfg: dict, t: int, mode: int) -> Tuple[int, int, int, int]:
    """(padded length TP, work-group size, local floats for A rows, for windows; 0 when not staged)."""
    r, rb = cfg["R"], (cfg["VEC"] or cfg["RB"])
    tp = -(-t // (2 * r)) * (2 * r)
    pairs = tp // (2 * r)
    size = 1 if cfg["VEC"] else min(pairs, ctx.max_wg, 256)   # CPU: one work-item runs the pairs in turn
    a_floats, w_floats = rb * tp, (rb if mode == 2 else 1) * (tp + r)
    if 4 * (a_floats + w_floats) > ctx.local_mem - 256:
        a_floats = w_floats = 0
    return tp, size, a_floats, w_floats


def causal1d_candidates(ctx_or_device=None, mode: int = 0, gpu: Optional[bool] = None) -> list:
    """Configs of the causal 1-D kernel, heuristic first (for tests and tuning); ``mode`` 2 is grad of w.

    ``gpu`` picks the family (default: the device's kind); tests run the GPU family on PoCL."""
    ctx = ctx_or_device if isinstance(ctx_or_device, _Ctx) else _context(ctx_or_device)
    if not (not ctx.is_cpu if gpu is None else gpu):
        # Lanes are rows; a chunk keeps 2R+1 vectors in registers (16 of them with AVX2, 32 with AVX-512).
        out = [dict(VEC=ctx.simd, R=r, S=1) for r in ((12, 10, 8) if ctx.simd >= 16 else (7, 6, 5))]
    else:
        # R outputs x RB rows of scalars per work-item; S splits the rows of the grad-of-w reduction.
        out = [dict(VEC=0, R=4, RB=4, S=4), dict(VEC=0, R=4, RB=4, S=1), dict(VEC=0, R=8, RB=4, S=2),
               dict(VEC=0, R=4, RB=8, S=2), dict(VEC=0, R=8, RB=2, S=4)]
    if mode != 2:                        # the split only matters for the reduction over rows
        seen, uniq = set(), []
        for cfg in out:
            key = tuple((k, v) for k, v in sorted(cfg.items()) if k != "S")
            if key not in seen:
                seen.add(key)
                uniq.append(cfg)
        out = uniq
    return out


class _Causal:
    """Launches of the causal 1-D kernel for (rows, C, T) in one of its three modes."""

    def __init__(self, ctx: _Ctx, t: int) -> None:
        self.ctx, self.t = ctx, t

    def launch(self, cfg: dict, mode: int, a, wsrc, y, rows: int, c: int, eps: float = 0.0) -> None:
        ctx = self.ctx
        cl = ctx.cl
        tp, size, a_floats, w_floats = _causal_layout(ctx, cfg, self.t, mode)
        if cfg["VEC"] and not a_floats:  # rows too long for local memory: the GPU kernel from global memory
            cfg = dict(VEC=0, R=4, RB=4, S=cfg.get("S", 1))
            tp, size, a_floats, w_floats = _causal_layout(ctx, cfg, self.t, mode)
        defines = dict(YC_CAUSAL1D=True, R=cfg["R"], VEC=cfg["VEC"], RB=None if cfg["VEC"] else cfg["RB"],
                       ROW_WINDOWS=mode == 2, LOCAL_ROWS=a_floats > 0)
        k = ctx.kernel("ops.cl", "yc_causal1d", defines)
        groups = -(-rows // (cfg["VEC"] or cfg["RB"]))
        if c > _MAX_GROUPS:
            raise LimitError(f"causal_depthwise_conv1d supports at most {_MAX_GROUPS} channels, not {c}")
        z = max(1, min(cfg.get("S", 1), groups)) if mode == 2 else groups
        local = [cl.LocalMemory(4 * max(a_floats, 4)), cl.LocalMemory(4 * max(w_floats, 4))]
        args = [a, wsrc, y] + _i32(rows, c, self.t, tp) + [np.float32(eps), np.int32(mode == 1)] + local
        ctx.run(k, (size, c, z), (size, 1, 1), args)

    def splits(self, cfg: dict, rows: int) -> int:
        return max(1, min(cfg.get("S", 1), -(-rows // (cfg["VEC"] or cfg["RB"]))))

    def grad_w(self, cfg: dict, k, g, gw, rows: int, c: int) -> None:
        """gw[C][T] = sum over rows (through S partial planes folded by yc_sum_planes)."""
        ctx = self.ctx
        s = self.splits(cfg, rows)
        if s == 1:
            self.launch(cfg, 2, k, g, gw, rows, c)
            return
        part = ctx.alloc(4 * s * c * self.t, "grad_w partial sums")
        self.launch(cfg, 2, k, g, part, rows, c)
        fold = ctx.kernel("ops.cl", "yc_sum_planes", dict(YC_SUM=True))
        ctx.run(fold, (c * self.t,), None, [part, gw] + _i32(c * self.t, s))
        part.release()


def _causal_args(w, k, names=("w", "k")) -> Tuple[int, int, int]:
    if len(w.shape) != 2 or len(k.shape) != 3 or w.shape[0] != k.shape[1] or w.shape[1] != k.shape[2]:
        raise OpError(f"causal_depthwise_conv1d expects {names[0]} (C, T) and {names[1]} (B, C, T), got "
                      f"{tuple(w.shape)} and {tuple(k.shape)}")
    b, c, t = (int(v) for v in k.shape)
    if min(b, c, t) < 1:
        raise OpError(f"{names[1]} has an empty dimension: {tuple(k.shape)}")
    return b, c, t


def _causal_config(ctx: _Ctx, mode: int, b: int, c: int, t: int, tune: Optional[bool]) -> dict:
    cands = causal1d_candidates(ctx, mode)
    flops = 2.0 * b * c * t * (t + 1) / 2
    key = ("causal1d", mode, t, b, 1 << max(c - 1, 1).bit_length())
    known = _remembered(ctx, key, cands)
    if known is not None:
        return known
    if not _wants_tuning(tune, flops) or len(cands) == 1:
        return cands[0]
    ct = max(1, min(c, int(_TUNE_FLOPS[ctx.is_cpu] / max(b * t * (t + 1), 1))))
    if not ctx.is_cpu:
        ct = max(ct, min(c, 256))        # enough channels to fill a GPU
    rng = np.random.default_rng(0)
    a = ctx.upload(rng.random((b, ct, t), dtype=np.float32), "causal1d tuning rows")
    wsrc = ctx.upload(rng.random((b if mode == 2 else 1, ct, t), dtype=np.float32), "causal1d tuning window")
    y = ctx.alloc(4 * b * ct * t, "causal1d tuning output")
    runner = _Causal(ctx, t)
    if mode == 2:
        trial = lambda cfg: runner.grad_w(cfg, a, wsrc, y, b, ct)   # noqa: E731
    else:
        trial = lambda cfg: runner.launch(cfg, mode, a, wsrc, y, b, ct)   # noqa: E731
    cfg = _search(ctx, key, cands, trial)
    for buf in (a, wsrc, y):
        buf.release()
    return cfg


def _row_chunk(ctx: _Ctx, c: int, t: int, per_row_arrays: int, fixed_bytes: int, max_tile_bytes) -> int:
    cap = _tile_cap(ctx, max_tile_bytes) - fixed_bytes
    per_row = 4 * c * t * per_row_arrays
    rows = cap // per_row if cap > 0 else 0
    if rows < 1:
        raise LimitError(f"one row of C={c}, T={t} needs {per_row / 2**20:.1f} MiB on the device, more than "
                         f"the tile limit")
    return min(int(rows), _MAX_GROUPS)


def causal_depthwise_conv1d(w, k, eps: float = 0.0, device=None, *, tune: Optional[bool] = None,
                            config: Optional[dict] = None, max_tile_bytes: Optional[int] = None):
    """``out[b][c][t] = eps + sum_{u<=t} w[c][T-1-(t-u)] * k[b][c][u]`` for w (C, T) and k (B, C, T).

    NumPy in, NumPy out; pyopencl ``k`` in, pyopencl out (on its queue). Each work-item does the
    same number of multiply-adds (output blocks t and T-1-t are paired)."""
    b, c, t = _causal_args(w, k)
    ctx = _context(device, [k, w])
    with ctx.lock:
        cfg = config if config is not None else _causal_config(ctx, 0, b, c, t, tune)
        runner = _Causal(ctx, t)
        wbuf = ctx.upload(_host(w, "w"), "causal1d weights")
        if _is_device_array(k):
            import pyopencl.array as cla
            kd = _check_device(k, "k")
            kd = kd if kd.offset == 0 else kd.copy()
            out = cla.empty(ctx.rt.queue, (b, c, t), np.float32, allocator=kd.allocator or ctx.pool)
            runner.launch(cfg, 0, kd.base_data, wbuf, out.base_data, b, c, eps)
        else:
            kh = _host(k, "k")
            out = np.empty((b, c, t), np.float32)
            chunk = _row_chunk(ctx, c, t, 2, 4 * c * t, max_tile_bytes)
            for r0 in range(0, b, chunk):
                rows = min(chunk, b - r0)
                kbuf = ctx.upload(kh[r0:r0 + rows], "causal1d input rows")
                ybuf = ctx.alloc(4 * rows * c * t, "causal1d output rows")
                runner.launch(cfg, 0, kbuf, wbuf, ybuf, rows, c, eps)
                ctx.cl.enqueue_copy(ctx.rt.queue, out[r0:r0 + rows], ybuf)
                kbuf.release()
                ybuf.release()
        wbuf.release()
    return out


def causal_depthwise_conv1d_backward(w, k, grad_out, device=None, *, tune: Optional[bool] = None,
                                     config: Optional[dict] = None, max_tile_bytes: Optional[int] = None):
    """Gradients ``(grad_w, grad_k)`` of :func:`causal_depthwise_conv1d` for upstream ``grad_out`` (B, C, T).

    ``grad_k[b][c][u] = sum_{t>=u} grad_out[b][c][t] * w[c][T-1-(t-u)]`` (the forward op run
    backwards in time) and ``grad_w[c][T-1-s] = sum_b sum_{t>=s} grad_out[b][c][t] * k[b][c][t-s]``.
    ``config`` may be one dict for both kernels or {"grad_k": ..., "grad_w": ...}."""
    b, c, t = _causal_args(w, k)
    if tuple(grad_out.shape) != (b, c, t):
        raise OpError(f"grad_out must have the shape of k {(b, c, t)}, not {tuple(grad_out.shape)}")
    ctx = _context(device, [k, grad_out, w])
    with ctx.lock:
        if config is not None and "grad_k" in config:
            cfg_k, cfg_w = config["grad_k"], config["grad_w"]
        elif config is not None:
            cfg_k = cfg_w = config
        else:
            cfg_k = _causal_config(ctx, 1, b, c, t, tune)
            cfg_w = _causal_config(ctx, 2, b, c, t, tune)
        runner = _Causal(ctx, t)
        wbuf = ctx.upload(_host(w, "w"), "causal1d weights")
        if _is_device_array(k) or _is_device_array(grad_out):
            import pyopencl.array as cla
            q = ctx.rt.queue
            kd = k if _is_device_array(k) else cla.to_device(q, _host(k, "k"))
            gd = grad_out if _is_device_array(grad_out) else cla.to_device(q, _host(grad_out, "grad_out"))
            kd, gd = (_check_device(a, name) for a, name in ((kd, "k"), (gd, "grad_out")))
            kd = kd if kd.offset == 0 else kd.copy()
            gd = gd if gd.offset == 0 else gd.copy()
            grad_k = cla.empty(q, (b, c, t), np.float32, allocator=kd.allocator or ctx.pool)
            grad_w = cla.empty(q, (c, t), np.float32, allocator=kd.allocator or ctx.pool)
            runner.launch(cfg_k, 1, gd.base_data, wbuf, grad_k.base_data, b, c)
            runner.grad_w(cfg_w, kd.base_data, gd.base_data, grad_w.base_data, b, c)
        else:
            kh, gh = _host(k, "k"), _host(grad_out, "grad_out")
            grad_k = np.empty((b, c, t), np.float32)
            grad_w = np.zeros((c, t), np.float32)
            part = np.empty((c, t), np.float32)
            chunk = _row_chunk(ctx, c, t, 3, 4 * c * t * (2 + runner.splits(cfg_w, b)), max_tile_bytes)
            gwbuf = ctx.alloc(4 * c * t, "grad_w")
            for r0 in range(0, b, chunk):
                rows = min(chunk, b - r0)
                kbuf = ctx.upload(kh[r0:r0 + rows], "causal1d input rows")
                gbuf = ctx.upload(gh[r0:r0 + rows], "causal1d gradient rows")
                ybuf = ctx.alloc(4 * rows * c * t, "grad_k rows")
                runner.launch(cfg_k, 1, gbuf, wbuf, ybuf, rows, c)
                runner.grad_w(cfg_w, kbuf, gbuf, gwbuf, rows, c)
                ctx.cl.enqueue_copy(ctx.rt.queue, grad_k[r0:r0 + rows], ybuf)
                ctx.cl.enqueue_copy(ctx.rt.queue, part, gwbuf)
                grad_w += part
                for buf in (kbuf, gbuf, ybuf):
                    buf.release()
            gwbuf.release()
        wbuf.release()
    return grad_w, grad_k
