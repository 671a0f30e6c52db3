"""Side branches: the layers only one detection head needs, run beside the rest of the network.

A multi-scale detector ends each scale but the last in a short branch: yolov3-tiny's 13x13
head is two convs (layers 14 and 15) that nothing after them reads, while the network goes on
to the 26x26 scale. On one in-order queue those convs run alone on a GPU that their small
grids cannot fill. With ``YOLO_CL_BRANCHES=1`` (or ``Executor(branches=True)``) they run on a
second queue while the next scale is computed. It is off by default: on an H100 through
NVIDIA's OpenCL it gained 1-2% on yolov3 416 and lost 1-8% on yolov3-tiny, whose plan is short
enough that the fork and join's extra commands (and its head read after the join instead of as
soon as it is complete) cost more than the overlap saves (BENCHMARKS.md, "Sixteenth GPU session").

``side_branches`` finds, for every head but the one computed last, the nodes whose outputs only
that head needs, and keeps a branch only where running it beside the rest is safe: whatever it
reads is complete when it starts (the *fork*: its first node's place in the plan), and no later
node of the rest reads what it writes or writes what it reads. The planner keeps every tensor a
branch touches alive from its fork to the end of the plan, so no tensor of the rest shares its
memory while the two queues run; the executor joins the queues after the last launch.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .graph import Graph, reads, writes

ENV = "YOLO_CL_BRANCHES"        # "1": side branches on a second queue; unset or "0": one queue


@dataclass(frozen=True)
class Branch:
    """The nodes (by index in ``graph.nodes``) one head alone needs, from ``fork`` on."""

    nodes: frozenset
    fork: int                   # the step of its first node: everything it reads is written before

    def reads_writes(self, graph: Graph, fold: bool, write: bool) -> tuple:
        """(tensor ids the branch reads, tensor ids it writes)."""
        read, written = set(), set()
        for i in self.nodes:
            r, w = _touches(graph.nodes[i], fold, write)
            read |= r
            written |= w
        return read, written


def wanted(asked=None) -> bool:
    """Whether an executor runs side branches on a second queue: ``asked`` if given, else whether
    ``YOLO_CL_BRANCHES`` is 1 (off by default, see above)."""
    if asked is not None:
        return bool(asked)
    return os.environ.get(ENV, "").strip() == "1"


def _touches(node, fold: bool, write: bool) -> tuple:
    """(tensor ids ``node`` reads, tensor ids it writes), folded producers and written layers included."""
    return {v.tensor.id for v in reads(node, fold)}, {v.tensor.id for v in writes(node, write)}


def side_branches(graph: Graph, fold: bool = True, write: bool = True) -> list:
    """The ``Branch`` of every head but the last computed, where one is safe to run beside the
    rest (``fold``/``write``: as the executor folds, since folded reads and writes count)."""
    touches = [_touches(n, fold, write) for n in graph.nodes]
    readers: dict = {}
    writers: dict = {}
    for i, (r, w) in enumerate(touches):
        for t in r:
            readers.setdefault(t, set()).add(i)
        for t in w:
            writers.setdefault(t, set()).add(i)
    heads = [max(writers.get(v.tensor.id, {-1})) for v in graph.outputs]
    out = []
    for h in sorted(set(heads)):
        if h < 0 or h == max(heads):
            continue
        b = _grow(h, touches, readers, writers, {v.tensor.id for v in graph.outputs})
        if _safe(b, touches, len(graph.nodes)):
            out.append(b)
    return out


def _grow(head: int, touches: list, readers: dict, writers: dict, returned: set) -> Branch:
    """The head's node and, back from it, every producer whose outputs only the branch reads."""
    nodes = {head}
    todo = [head]
    while todo:
        for t in touches[todo.pop()][0]:
            for p in writers.get(t, ()):
                if p in nodes:
                    continue
                outs = touches[p][1]
                if outs & returned or not all(readers.get(o, set()) <= nodes for o in outs):
                    continue
                nodes.add(p)
                todo.append(p)
    return Branch(frozenset(nodes), min(nodes))


def _safe(b: Branch, touches: list, n: int) -> bool:
    """Whether ``b`` can run beside the nodes after its fork: what it reads is written before the
    fork or by itself, and no later node outside it touches what it writes or writes what it reads."""
    read = set().union(*(touches[i][0] for i in b.nodes))
    written = set().union(*(touches[i][1] for i in b.nodes))
    later = [i for i in range(b.fork + 1, n) if i not in b.nodes]
    if not later:
        return False                # nothing to run beside
    for i in later:
        r, w = touches[i]
        if r & written or w & written or w & read:
            return False
    return True
