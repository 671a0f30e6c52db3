"""Give every tensor a place in one device arena, reusing memory by liveness.

A tensor lives from the first node that writes it to the last node that reads it
(the graph's input from the start, the outputs to the end). A tensor a side branch touches
(branches.py: it runs on a second queue beside the nodes after its fork) lives from the fork
to the end, so nothing running beside the branch shares its memory. Tensors are placed
largest first at the lowest offset that overlaps no tensor alive at the same time:
the arena's size is the memory pool's peak, reported beside the naive sum.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from .graph import Graph, reads, writes

ALIGN = 64   # elements: 256-byte aligned offsets suit every vector width


@dataclass
class Plan:
    """Element offsets of each tensor (per batch of ``batch`` images) in one arena."""

    batch: int
    offsets: dict          # tensor id -> element offset in the arena
    lifetimes: dict        # tensor id -> (first step, last step)
    arena_elems: int
    naive_elems: int

    def offset(self, tensor) -> int:
        return self.offsets[tensor.id]


def lifetimes(graph: Graph, fold: bool = True, write: Optional[bool] = None, branches: Sequence = (),
              spans: Sequence = ()) -> dict:
    """(first write, last read) step of each tensor; -1 is before the first node. ``fold``: a conv
    may read through the producers the graph marked on it (graph.mark_read_fusions), so their
    inputs live until that conv has run; ``write`` (default ``fold``): it may write the output of
    the layer it writes through (graph.mark_write_fusions), which then lives from that conv on.
    ``branches``: ``branches.Branch``es run beside the rest; what each touches lives from its
    fork (or its first write, if earlier) to the end. ``spans``: (first, last) node index ranges
    that run image by image (per_image.py): image 0's nodes of the span, then image 1's, so what
    any node of a span touches lives over the whole span."""
    write = fold if write is None else write
    end = len(graph.nodes)
    life: dict = {graph.input.id: [-1, -1]}
    for step, node in enumerate(graph.nodes):
        for v in reads(node, fold):
            life.setdefault(v.tensor.id, [step, step])[1] = step
        for v in writes(node, write):
            span = life.setdefault(v.tensor.id, [step, step])
            span[0] = min(span[0], step)
            span[1] = max(span[1], step)
    for v in graph.outputs:
        life.setdefault(v.tensor.id, [-1, end])[1] = end
    for b in branches:
        read, written = b.reads_writes(graph, fold, write)
        for t in read | written:
            span = life[t]
            span[0], span[1] = min(span[0], b.fork), end
    for lo, hi in spans:
        touched = {v.tensor.id for n in graph.nodes[lo:hi + 1] for v in (*reads(n, fold), *writes(n, write))}
        for t in touched:
            span = life[t]
            span[0], span[1] = min(span[0], lo), max(span[1], hi)
    return {k: tuple(v) for k, v in life.items()}


def plan_memory(graph: Graph, batch: int = 1, fold: bool = True, write: Optional[bool] = None,
                branches: Sequence = (), spans: Sequence = ()) -> Plan:
    """Place tensors in an arena by liveness (greedy, largest first, lowest fitting offset);
    ``fold``, ``write``, ``branches`` and ``spans``: as in ``lifetimes`` (False, False, (), () for
    an executor that reads or writes through nothing and runs every launch on one queue, batch-wide)."""
    life = lifetimes(graph, fold, write, branches, spans)
    sizes = {t.id: _align(t.size * batch) for t in graph.tensors if t.id in life}
    placed: list = []       # (offset, size, first, last)
    offsets: dict = {}
    for tid in sorted(sizes, key=lambda t: (-sizes[t], t)):
        first, last = life[tid]
        size = sizes[tid]
        clashes = sorted((o, s) for o, s, f, l in placed if not (l < first or last < f))
        offset = 0
        for o, s in clashes:
            if offset + size <= o:
                break
            offset = max(offset, o + s)
        offsets[tid] = offset
        placed.append((offset, size, first, last))
    arena = max((o + s for o, s, _, _ in placed), default=0)
    return Plan(batch, offsets, life, arena, sum(sizes.values()))


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
