"""Which tensors a plan stores channels-last (NHWC) instead of as planes (NCHW).

The wgmma family's ``nhwc`` convs read their input as pixels of channels, so that every row of a
B tile is a 16-byte copy; where the input is stored as planes they transpose it first, one pass
over it (``gemm_wgmma.nhwc_operand``). A tensor that only such a conv reads, and that a conv
stores through the shared GEMM epilogue (``cl/gemm_epilogue.h``'s ``NHWC_OUT``), is stored
channels-last by its producer instead, and the reader takes it as it is: no transpose, no launch.

The choice follows the configs the plan is about to bind (``conv.choose``), so both ends are
predicted before either is bound; a config that then fails to bind falls back to one that may not
agree, which :func:`disagreeing` finds in the bound launches (the producer's launch marked
``stores: nhwc``, the reader's ``reads: nhwc``) so the executor binds both ends again with the
tensor stored as planes.
"""
from __future__ import annotations

from . import BindContext, family
from .conv import bound_config
from ..graph import Graph, View, reads


def _whole(v: View) -> bool:
    return v.c0 == 0 and v.c == v.tensor.c


def sole_conv_edges(graph: Graph, fold: bool = True, write: bool = True) -> dict:
    """{tensor id: (writer, reader)} of the tensors a plan could store channels-last, whatever the
    configs: one writer (a conv, its whole output, through the shared GEMM epilogue: where the
    plan ``write``s through, not a conv that stores a layer it writes through), one reader (a
    conv, the whole tensor as its input, nothing else), channels a multiple of 8 (a pixel's whole
    16-byte chunks, as the reader takes them), not a network output. The tuner charges an nhwc
    config no transpose for such an input (``tuner.ConvBench``)."""
    readers: dict = {}
    writers: dict = {}
    for node in graph.nodes:
        writers.setdefault(node.output.tensor.id, []).append(node)
        for v in reads(node, fold):
            readers.setdefault(v.tensor.id, []).append(node)
    returned = {v.tensor.id for v in graph.outputs}
    out = {}
    for tid, ws in writers.items():
        rs = readers.get(tid, [])
        if tid in returned or len(ws) != 1 or len(rs) != 1 or ws[0].op != "conv" or not _whole(ws[0].output):
            continue
        if write and ws[0].attrs.get("write_through") is not None:
            continue
        r = rs[0]
        if r.op != "conv" or r.inputs[0].tensor.id != tid or not _whole(r.inputs[0]):
            continue
        if r.inputs[0].c % 8:       # read as pixels padded to 16 bytes: transposed (and padded) first
            continue
        out[tid] = (ws[0], r)
    return out


def nhwc_tensors(ctx: BindContext) -> frozenset:
    """Ids of the tensors to store channels-last: of the plan's :func:`sole_conv_edges`
    (``ctx.sole_edges``, which the executor sets first), those whose reader is bound to read
    channels-last and whose writer to a config that can store so. None where no family the
    device offers reads channels-last (the question costs a look-up per conv: a plan on a CPU,
    or at fp32, does not ask it)."""
    if not ctx.sole_edges or not any(f.reads_nhwc for f in family.offered(ctx.rt, ctx.mma)):
        return frozenset()
    return frozenset(tid for tid, (w, r) in ctx.sole_edges.items()
                     if family.reads_nhwc(bound_config(ctx, r)) and family.stores_nhwc(bound_config(ctx, w)))


def disagreeing(nhwc: frozenset, bound: list) -> frozenset:
    """Ids of the tensors in ``nhwc`` whose writer did not store them channels-last or whose
    reader did not read them so, from ``bound`` [(node, launches)]."""
    stored = {n.output.tensor.id for n, ls in bound if any(l.config.get("stores") == "nhwc" for l in ls)}
    read = {n.inputs[0].tensor.id for n, ls in bound if n.op == "conv"
            and any(l.config.get("reads") == "nhwc" for l in ls)}
    return frozenset(t for t in nhwc if t not in stored or t not in read)
