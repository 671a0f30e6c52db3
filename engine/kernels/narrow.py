"""Convs of a narrow input computed directly (``cl/conv_narrow.cl``): a GPU family.

A network's first conv reads 3 channels: as a GEMM its K is 27 (a 3x3 window), so the tensor-core
families pad it to a 32- or 64-wide k-tile, gather it element by element and are bound by that
gather (yolov3 608 batch 8: 0.33 ms on an H100, of which its output's writes would take a fifth).
Here a work-group keeps ``FPW`` filters' weights in local memory, each work-item reads its pixel's
window once into registers and sums it with each filter by FMA, and the sums leave through local
memory in the output's order (coalesced whether planes or channels-last), or with ``PX`` 1 or 2
straight from the registers of a work-item summing PX pixels (16-byte stores where a pixel's
channels are contiguous), through the GEMM families' epilogue (bias, activation, shortcut, concat
slice, an upsample written through, channels-last for an ``nhwc`` reader; a max-pool is left to
its own launch). With ``TC`` (fp16 where the mma family's f16 probe passed) the sums are mma.sync
products instead: the weights held as fragments in registers for the whole launch, each 8 pixels'
windows gathered straight into fragments (``cl/mma.h``; emulated with the mma family's switch),
and a channels-last output staged in local memory to leave as coalesced 16-byte stores.
Offered on GPUs at every precision, for convs of at most 4 input channels and one group; tuned in
only (``heuristic`` None), measured against the others in BENCHMARKS.md (nineteenth, thirtieth and
thirty-second sessions).
"""
from __future__ import annotations

from typing import Optional

from . import BindContext, Launch, conv_gemm_shape, epilogue_defines, gemm_mma, i32, marked, packed_upload, \
    residual_args, write_target
from ..graph import Node

FAMILY = "narrow"
ALGOS = ("direct",)
MAX_CHANNELS = 4
MAX_K = 64                         # the window a work-item keeps in registers
FPWS = (4, 8, 16, 32)              # filters per work-group (each work-item sums them all)
WGS = (64, 128, 256)               # work-group sizes (work-items)
PXS = (0, 1, 2)                    # pixels a work-item sums in registers (0: one, through local memory)
NBS = (1, 2, 4)                    # with TC: blocks of 8 pixels a warp computes in turn
LOCAL_LIMIT = 40 * 1024            # the weights and the sums a work-group stages


def pixels(cfg: dict) -> int:
    """Pixels a work-item sums in registers (config key ``PX``; 0 or absent: one, through local memory)."""
    return int(cfg.get("PX", 0))


def tensor_cores(cfg: dict) -> bool:
    """Whether the sums are f16 mma products (config key ``TC``; ``NB`` blocks of 8 pixels a warp)."""
    return bool(int(cfg.get("TC", 0)))


def local_bytes(cfg: dict, K: int) -> int:
    """Local memory of a work-group: FPW filters' weights (k padded to 4) and FPW x (WG + 1) sums,
    with ``PX`` the weights alone, with ``TC`` the weights as fragment words (k padded to 16) and
    a block of 8 pixels' half sums a warp."""
    f, wg = int(cfg["FPW"]), int(cfg["WG"])
    if tensor_cores(cfg):
        return 4 * f * 8 * -(-K // 16) + 2 * 8 * f * wg // 32
    return 4 * f * K if pixels(cfg) else 4 * f * (-(-K // 4) * 4 + wg + 1)


def runs(node: Node) -> bool:
    """Whether ``node`` is a conv this family runs: one group, at most 4 input channels, a window
    of at most 64 values."""
    M, N, K, G = conv_gemm_shape(node)
    return G == 1 and node.attrs["in_c"] <= MAX_CHANNELS and K <= MAX_K


def why_illegal(node: Node, cfg: dict, mma: str = "") -> Optional[str]:
    """Why ``cfg`` cannot run ``node`` (in tensor-core mode ``mma``), or None."""
    if not runs(node):
        return f"the narrow family runs convs of one group and at most {MAX_CHANNELS} input channels"
    if cfg.get("algo") not in ALGOS:
        return f"algorithm '{cfg.get('algo')}' is not the narrow family's (direct)"
    if cfg.get("FPW") not in FPWS or cfg.get("WG") not in WGS or cfg.get("PX", 0) not in PXS:
        return f"FPW is one of {FPWS}, WG one of {WGS} and PX one of {PXS}"
    if tensor_cores(cfg):
        if mma != "f16":
            return "TC (tensor cores) runs where f16 mma does (fp16 on an NVIDIA GPU of compute capability 8+)"
        if int(cfg["FPW"]) % 16 or cfg.get("NB") not in NBS or pixels(cfg):
            return f"TC takes FPW a multiple of 16, NB one of {NBS}, no PX"
    elif "NB" in cfg:
        return "NB (blocks of 8 pixels a warp) is TC's"
    if local_bytes(cfg, conv_gemm_shape(node)[2]) > LOCAL_LIMIT:
        return f"{local_bytes(cfg, conv_gemm_shape(node)[2])} bytes of local memory (at most {LOCAL_LIMIT})"
    return None


def bind(ctx: BindContext, node: Node, cfg: dict) -> list:
    """The one launch of ``node`` under ``cfg``."""
    a = node.attrs
    M, N, K, _ = conv_gemm_shape(node)
    x = node.inputs[0]
    wts = packed_upload(ctx, node, (node.layers[0], ctx.half, FAMILY),
                        lambda: a["weights"].reshape(M, K).astype(ctx.dtype))
    store = write_target(ctx, node)
    d = {**epilogue_defines(ctx, node), **store.defines, "CIN": a["in_c"], "KS": a["size"], "SX": a["stride_x"],
         "SY": a["stride_y"], "PAD": a["pad"], "DIL": a["dilation"], "FPW": int(cfg["FPW"]), "WG": int(cfg["WG"]),
         "PX": pixels(cfg)}
    if tensor_cores(cfg):
        d.update(TC=1, NB=int(cfg["NB"]), MMA_F16=True, MMA_EMULATE=gemm_mma.emulated())
    xb, xoff, xbs = ctx.view(x)
    args = [wts["A"], wts["bias"], xb, xoff, xbs] + i32(0, 0) + store.c_args + residual_args(ctx, node) + \
        i32(M, N, K, 1, x.h, x.w, node.output.w)
    wg = int(cfg["WG"])
    per_group = wg // 32 * int(cfg["NB"]) * 8 if tensor_cores(cfg) else wg * max(1, pixels(cfg))
    gs = (-(-N // per_group) * wg, -(-M // int(cfg["FPW"])), ctx.batch)
    k = ctx.kernel("conv_narrow.cl", "yc_conv_narrow", d, args)
    return [Launch(k, gs, (wg, 1, 1), node, "conv_narrow", marked(cfg, store.writes, store.layout),
                   node.flops * ctx.batch)]


class Narrow:
    """The kernel-family interface (see ``family.py``) of the narrow-input direct conv."""

    name = FAMILY
    tensor_cores = False
    timed_beside_tensor_cores = True
    derived, schedule, block = (), ("WG", "PX", "NB"), ("FPW", "TC")
    stores_nhwc, reads_nhwc = ALGOS, ()

    def offered(self, rt, mma: str) -> bool:
        return not rt.is_cpu

    def candidates(self, node: Node, rt, batch: int, precision, mma: str) -> list:
        if not runs(node):
            return []
        M = conv_gemm_shape(node)[0]
        cands = [{"algo": "direct", "family": FAMILY, "FPW": f, "WG": w, **({"PX": px} if px else {})}
                 for f in FPWS if f < 2 * M for w in WGS for px in PXS]
        if mma == "f16" and precision.half:
            cands += [{"algo": "direct", "family": FAMILY, "FPW": f, "WG": w, "TC": 1, "NB": nb}
                      for f in (16, 32) if f < M + 16 for w in WGS for nb in NBS]
        return [c for c in cands if why_illegal(node, c, mma) is None]

    def heuristic(self, node: Node, rt, batch: int, precision, mma: str,
                  planes: bool = False) -> Optional[dict]:
        return None

    def why_illegal(self, node: Node, cfg: dict, rt, mma: str = "") -> Optional[str]:
        return why_illegal(node, cfg, mma)

    def cost(self, node: Node, cfg: dict, batch: int, rt) -> float:
        return 0.0

    def workspace_bytes(self, node: Node, cfg: dict, batch: int, precision) -> int:
        return 0

    def bind(self, ctx: BindContext, node: Node, cfg: dict) -> list:
        why = why_illegal(node, cfg, ctx.mma)
        if why is not None:
            raise ValueError(why)
        return bind(ctx, node, cfg)


KERNEL_FAMILY = Narrow()
