"""Turn graph nodes into launches: specialised kernels with their arguments bound once.

This module holds what every kernel module shares (:class:`Launch`, :class:`BindContext`,
argument helpers). ``nodes.bind_node`` is the single entry point; convolutions go through
``conv`` to the kernel families registered in ``family``, the other ops to ``simple``. A
:class:`Launch` is everything needed to enqueue one kernel per frame with no Python work beyond
the call itself.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ..errors import YoloClError
from ..graph import Node, View, pool_2x2
from ..layers import ACTIVATIONS
from ..precision import FP32, Precision, half_math


# The small layers (pools, upsampling) take a row of output per work-item on a CPU -- a plain
# loop with no division per element, 2-5x faster on PoCL -- and an element per work-item on other
# devices: on an H100 the row kernel took 0.157 ms for yolov3-tiny's first maxpool (16x416x416,
# 3328 rows), a third of the network's device time.
ROW_KERNELS = {"CPU": True}


def row_kernels(rt) -> bool:
    """Whether ``rt``'s device runs the small layers' row-per-work-item kernels."""
    return ROW_KERNELS.get(rt.device_type, False)


# The name of a launch that only stores a conv's input in the layout its GEMM reads (channels-last):
# what the tuner does not charge where the network stores that input so in the first place.
TRANSPOSE = "nchw_to_nhwc"


@dataclass
class Launch:
    """One pre-bound kernel enqueue."""

    kernel: object
    gsize: tuple
    lsize: Optional[tuple]
    node: Node
    name: str
    config: dict = field(default_factory=dict)
    flops: int = 0


@dataclass
class BindContext:
    """What binding needs: the runtime, the arena and plan, batch size, precision."""

    rt: object
    arena: object
    plan: object
    batch: int
    precision: Precision = FP32
    workspace: object = None
    tuning: object = None          # tuning database lookups (None: heuristics)
    mma: str = ""                  # tensor-core mode of the mma family ("f16", "tf32"; "" = none)
    weight_cache: dict = field(default_factory=dict)   # device weights, shared by every batch size
    fold: bool = True              # convs read through the producers the graph marked (graph.mark_read_fusions)
    write: bool = True             # convs store the layers they write through (graph.mark_write_fusions)
    written: frozenset = frozenset()   # ids of the layers a conv wrote through: their outputs exist, no read through them
    nhwc: frozenset = frozenset()      # ids of the tensors stored channels-last (layout.nhwc_tensors)
    # {tensor id: (writer, reader)} of the tensors a producer could store channels-last
    # (layout.sole_conv_edges); a conv whose input is not one reads it as planes. None: not known
    # (a conv cut out of its graph)
    sole_edges: Optional[dict] = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def half(self) -> bool:
        """Activations (and packed weights) stored as half."""
        return self.precision.half

    @property
    def itemsize(self) -> int:
        return self.precision.itemsize

    @property
    def dtype(self):
        return self.precision.dtype

    def view(self, v: View) -> list:
        """Kernel arguments for a view: buffer, element offset, batch stride."""
        t = v.tensor
        return [self.arena, np.int32(self.plan.offset(t) + v.c0 * t.h * t.w), np.int32(t.size)]

    def defines(self, **extra) -> dict:
        d = {"HALF_STORAGE": self.half}
        d.update(extra)
        return d

    def half_math_defines(self) -> dict:
        """Defines that switch the FMA GEMM families' arithmetic to half (cl/common.h's hreal):
        HALF_MATH on a ``cl_khr_fp16`` device, with HALF_EMULATE where it is emulated
        (``precision.half_math``); none where it computes in float."""
        mode = half_math(self.precision, self.rt.fp16)
        return {"HALF_MATH": True, "HALF_EMULATE": True} if mode == "emulate" else \
            {"HALF_MATH": True} if mode == "native" else {}

    def cached(self, key: tuple, make: Callable[[], dict]) -> dict:
        """``weight_cache[key]``, made by ``make()`` on first use. Thread-safe: the tuner binds
        candidates from several threads, and a kernel bound to a buffer that a racing thread's
        duplicate replaced in the cache would point at freed memory."""
        with self._lock:
            if key not in self.weight_cache:
                self.weight_cache[key] = make()
            return self.weight_cache[key]

    def scratch(self, nbytes: int):
        """The workspace, checked to hold ``nbytes``: the executor sizes it for the configs it binds,
        and a kernel given too small a buffer would write past its end."""
        ws = self.workspace
        if ws is None or ws.size < nbytes:
            raise YoloClError(f"the workspace holds {0 if ws is None else ws.size} bytes, {nbytes} are needed")
        return ws

    def kernel(self, source: str, name: str, defines: dict, args: list, patch=None):
        """Build (cached; its binary through ``patch``, see ``Runtime.program``) and return a
        kernel with ``args`` bound."""
        prg = self.rt.program(source, defines) if patch is None else self.rt.program(source, defines, patch=patch)
        k = self.rt.cl.Kernel(prg, name)
        k.set_args(*args)
        return k


def packed_upload(ctx: BindContext, node: Node, key: tuple, pack: Callable[[], np.ndarray],
                  what: str = "weights") -> dict:
    """{"A": the weights in a family's layout (``pack()``), "bias": float bias} on the device,
    uploaded once per ``key`` (a layer, precision and layout)."""
    return ctx.cached(key, lambda: {
        "A": ctx.rt.upload(pack(), f"{what} of layer {node.label}"),
        "bias": ctx.rt.upload(node.attrs["bias"].astype(np.float32), f"bias of layer {node.label}")})


def act_id(name: str) -> str:
    """The kernel define of an activation: its name in cl/common.h (``A_LEAKY``)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation '{name}' has no kernel")
    return "A_" + name.upper()


def i32(*values) -> list:
    return [np.int32(v) for v in values]


def epilogue_defines(ctx: BindContext, node: Node) -> dict:
    """Defines of a conv's fused epilogue: its activation, and the shortcut add + activation if fused."""
    a = node.attrs
    d = ctx.defines(ACT=act_id(a["activation"]))
    if a.get("residual") is not None:
        d.update(RESIDUAL=True, ACT2=act_id(a["activation2"]))
    return d


def residual_args(ctx: BindContext, node: Node) -> list:
    """Kernel arguments of the fused shortcut's input view (the arena as a dummy when there is none)."""
    r = node.attrs.get("residual")
    return ctx.view(r) if r is not None else [ctx.arena, np.int32(0), np.int32(0)]


@dataclass
class Store:
    """Where a GEMM conv's epilogue stores (:func:`write_target`): its defines, the C arguments
    [buffer, offset, batch stride, ldc], trailing arguments (the conv's own output where it keeps
    it beside a pool), the op it writes through ("" for none) and the elements of a row of C the
    split-K sum writes (the conv's pixels, or the pooled map's); ``layout`` "nhwc" where the
    output is stored channels-last (``BindContext.nhwc``)."""

    defines: dict
    c_args: list
    extra: list
    writes: str
    n_out: int
    layout: str = ""


# Defines of the epilogue, which the split-K sum kernel (gemm_local.cl) runs where K is split.
EPILOGUE_KEYS = ("HALF_STORAGE", "ACT", "ACT2", "RESIDUAL", "NO_BIAS", "UP_S", "UP_OW", "SUM_POOL", "MP_SIZE",
                 "MP_SX", "MP_SY", "MP_PAD", "SUM_OW", "SUM_OH", "SUM_PW", "NHWC_OUT")


def write_target(ctx: BindContext, node: Node, pool: str = "") -> Store:
    """Where a GEMM conv stores: its own output, or the output of the layer it writes through
    (graph.mark_write_fusions) where the context folds and the kernel can: an upsample always (the
    epilogue stores each value stride x stride times, cl/gemm_epilogue.h); a 2x2 stride-2 max-pool
    where ``pool`` is "blocks" (the tensor-core implicit GEMM's POOL2; with ``write_keeps``, the
    conv's own output too, through trailing arguments); any max-pool that alone reads the conv
    where ``pool`` is "sum" (the split-K sum kernel computes each window from the partial sums).
    A conv whose output tensor the context stores channels-last (``ctx.nhwc``) stores it so."""
    out = node.output
    N = out.h * out.w
    if out.tensor.id in ctx.nhwc:       # layout.nhwc_tensors: a whole tensor, written through nothing
        return Store({"NHWC_OUT": out.c}, ctx.view(out) + [np.int32(N)], [], "", N, "nhwc")
    w = node.attrs.get("write_through") if ctx.write else None
    if w is not None and w.op == "upsample":
        s = w.attrs["stride"]
        return Store({"UP_S": s, "UP_OW": out.w}, ctx.view(w.output) + [np.int32(N * s * s)], [], "upsample", N)
    keep = bool(node.attrs.get("write_keeps"))
    if w is not None and w.op == "maxpool" and pool == "blocks" and pool_2x2(w):
        return Store({"POOL2": True, "POOL_PIX": N // 4, "POOL_KEEP": keep}, ctx.view(w.output) + [np.int32(N // 4)],
                     ctx.view(out) if keep else [], "maxpool", N)
    if w is not None and w.op == "maxpool" and pool == "sum" and not keep:
        a, p = w.attrs, w.output
        d = {"SUM_POOL": True, "MP_SIZE": a["size"], "MP_SX": a["stride_x"], "MP_SY": a["stride_y"],
             "MP_PAD": a["padding"] // 2, "SUM_OW": out.w, "SUM_OH": out.h, "SUM_PW": p.w}
        return Store(d, ctx.view(p) + [np.int32(p.h * p.w)], [], "maxpool", p.h * p.w)
    return Store({}, ctx.view(out) + [np.int32(N)], [], "", N)


def marked(config: dict, writes: str, stores: str = "") -> dict:
    """A launch's config, with ``writes`` naming the op it wrote through (what the executor drops)
    and ``stores`` the layout it stored its output in where not the usual ("nhwc")."""
    out = {**config, "writes": writes} if writes else dict(config)
    return {**out, "stores": stores} if stores else out


def writes_through(launches: list) -> bool:
    """Whether a conv's launches store the layer it writes through (``marked``: the executor then
    drops that layer's own launch, and the tuner checks what they store there)."""
    return any(l.config.get("writes") for l in launches)


def written_layers(launches) -> frozenset:
    """Ids of the layers whose outputs convs among ``launches`` store by writing through them."""
    return frozenset(id(l.node.attrs["write_through"]) for l in launches if l.config.get("writes"))


def written_pool(ctx: BindContext, node: Node) -> Optional[Node]:
    """The 2x2 stride-2 max-pool that alone reads ``node``'s output (graph.mark_write_fusions),
    where the context writes through: a Winograd conv's tile-vector store computes it (its tiles
    hold whole windows); None otherwise."""
    w = node.attrs.get("write_through") if ctx.write else None
    keep = node.attrs.get("write_keeps")
    return w if w is not None and w.op == "maxpool" and pool_2x2(w) and not keep else None


def conv_gemm_shape(node: Node) -> tuple:
    """(M, N, K, G) of a conv as GEMMs: filters per group, output pixels, K per group, groups."""
    a = node.attrs
    g = a["groups"]
    return a["filters"] // g, node.output.h * node.output.w, (a["in_c"] // g) * a["size"] ** 2, g


def is_depthwise(node: Node) -> bool:
    """groups == channels == filters: a conv the direct depthwise kernel runs."""
    a = node.attrs
    return a["groups"] > 1 and a["groups"] == a["in_c"] == a["filters"]


def is_pointwise(node: Node) -> bool:
    """A 1x1, stride-1, unpadded conv: its input already is the GEMM's B matrix."""
    a = node.attrs
    return a["size"] == 1 and a["stride_x"] == 1 and a["stride_y"] == 1 and a["pad"] == 0
