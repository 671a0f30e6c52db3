"""The two ends of a batch's plan run image by image, so that its transfers hide behind compute.

A batch's plan waits for its whole input before its first kernel and reads its last head only
after its last kernel: at yolov3 608 batch 8 on an H200, 0.7 ms of upload and 0.9 ms of head read
beside 6 ms of kernels. Nothing in a network mixes images, so any prefix or suffix of the launch
list may run a few images at a time: image 0's first layers as soon as image 0 has landed, beside
image 1's copy; images 0-1's last layers and then their share of the last head's read, beside
images 2-3's last layers. The middle of the plan runs batch-wide as before.

A node bound for ``count`` images against the arena's offsets moved to image ``b``
(:class:`ImagePlan`) computes images ``b`` to ``b + count - 1`` of the batch's tensors; it binds
the config the batch binds (:class:`SameConfigs`), and a node whose launches for a group would
store or read another layout (or read or write through other layers) than the batch's cancels the
split. Since the first group runs the whole span before the next starts it, what a span's nodes
touch lives over the whole span (``planner.lifetimes``'s ``spans``): a tensor dead after the first
node in the batch's order is still needed by the next group.

``YOLO_CL_PER_IMAGE``: ``0`` off, ``first`` or ``last`` only one end, anything else both (the
default, on devices with a copy queue: see ``Executor``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Union

from .graph import Graph, writes
from .kernels import BindContext, written_layers
from .kernels.conv import bound_config
from .kernels.nodes import bind_node
from .launch import LaunchList

ENV = "YOLO_CL_PER_IMAGE"
TAIL_FLOPS = 0.25     # the last span holds at most this share of the network's work ...
TAIL_BYTES = 0.5      # ... and completes at least this share of the heads' bytes ...
TAIL_MIN_BYTES = 16 << 20   # ... and at least this many (float32, the batch's): yolov3 608 batch 8's
# 47 MB last head paid for its per-image launches on an H200, yolov3-tiny 416 batch 4's 2.8 MB did not
# Images per group: an image's upload is short beside its first layers, but the last layers at
# batch 1 cost twice their batch-8 share (yolov3 608 on an H200: 1.15 ms against 0.54), more than
# the head read they hide, so the last span runs two images at a time
FIRST_GROUP = 1
LAST_GROUP = 2


def ends_wanted(asked: Union[bool, str, None] = None) -> tuple:
    """(first, last): which ends run per image; ``asked`` (False, True, or the variable's words
    ``"0"``, ``"first"``, ``"last"``) overrides the variable."""
    if isinstance(asked, bool):
        return (asked, asked)
    v = (os.environ.get(ENV, "") if asked is None else asked).strip().lower()
    return (v not in ("0", "last"), v not in ("0", "first"))


def first_span(graph: Graph) -> int:
    """How many leading nodes read tensors at the input's resolution: long enough per image to
    hide the next image's copy. (yolov3 608 batch 8 on an H200: these two convs ran a pinned
    input's run in 7.00 ms, the four up to the first stride-4 layer in 7.07, batch-wide 7.68.)"""
    area = graph.input.h * graph.input.w
    n = 0
    for node in graph.nodes:
        if any(v.h * v.w != area for v in node.inputs):
            break
        n += 1
    return n


def last_span(graph: Graph, write: bool, first: int, batch: int = 1) -> int:
    """Index of the first node of the last span (``len(graph.nodes)``: none): the nodes after the
    one completing the last head but the final ones, where they hold at most ``TAIL_FLOPS`` of the
    work and their heads at least ``TAIL_BYTES`` of the heads' bytes and ``TAIL_MIN_BYTES`` over
    ``batch`` images (so that their reads are worth hiding and their launches per group cost
    little), and come after the first span."""
    nodes, outs = graph.nodes, graph.outputs
    writer: dict = {}
    for i, node in enumerate(nodes):
        for v in writes(node, write):
            writer[v.tensor.id] = i
    done = [writer.get(v.tensor.id, -1) for v in outs]       # the node completing each head
    end = max(done, default=-1)
    start = max([d for d in done if d < end], default=-1) + 1
    total = sum(n.flops for n in nodes) or 1
    head_bytes = [v.c * v.h * v.w for v in outs]
    tail_heads = sum(b for b, d in zip(head_bytes, done) if d >= start)
    if start <= max(first - 1, 0) or start >= len(nodes) or sum(n.flops for n in nodes[start:]) > TAIL_FLOPS * total \
            or tail_heads < TAIL_BYTES * sum(head_bytes) or 4 * batch * tail_heads < TAIL_MIN_BYTES:
        return len(nodes)
    return start


def spans(graph: Graph, write: bool, batch: int, ends: tuple = (True, True)) -> list:
    """The (first, last) node index ranges to run per image (or group), for ``planner.plan_memory``;
    no last span for a batch of one group, which would only repeat the batch-wide launches."""
    out = []
    first = first_span(graph) if ends[0] else 0
    if first:
        out.append((0, first - 1))
    last = last_span(graph, write, first, batch) if ends[1] and batch > LAST_GROUP else len(graph.nodes)
    if last < len(graph.nodes):
        out.append((last, len(graph.nodes) - 1))
    return out


def groups(batch: int, size: int) -> list:
    """(first image, count) of each group of ``size`` images (the last one holds what is left)."""
    return [(i, min(size, batch - i)) for i in range(0, batch, size)]


@dataclass
class ImagePlan:
    """A memory plan's offsets moved to image ``index`` of its batch (a tensor's images are
    ``tensor.size`` elements apart): what a node bound for fewer images addresses."""

    plan: object
    index: int

    def offset(self, tensor) -> int:
        return self.plan.offset(tensor) + self.index * tensor.size


class SameConfigs:
    """A tuning table answering, for every conv, the config the batch's context binds."""

    def __init__(self, ctx: BindContext) -> None:
        self.ctx = ctx

    def conv_config(self, node, batch: int) -> dict:
        return bound_config(self.ctx, node)


def _signature(launches: list) -> list:
    """What a group's launches must share with the batch's: layouts stored and read, layers read
    or written through."""
    return [tuple(l.config.get(k) for k in ("stores", "reads", "through", "writes")) for l in launches]


class ImageSplit:
    """The launches of a plan's first span per image and of its last span per group of
    ``LAST_GROUP`` images: ``first_end`` and ``last_start`` are where the batch's launch list
    leaves off and takes over (``last_start`` is its length where there is no last span);
    ``first_groups`` and ``last_groups`` are the (first image, count) of each group, in order."""

    def __init__(self, ctx: BindContext, graph: Graph, launches: list, node_spans: list, queue) -> None:
        """``launches``: the batch's plan; ``node_spans``: from :func:`spans`. ValueError where a
        node's launches for a group disagree with the batch's."""
        self.batch = ctx.batch
        by_node: dict = {}
        for l in launches:
            by_node.setdefault(id(l.node), []).append(l)
        first = node_spans[0][1] + 1 if node_spans and node_spans[0][0] == 0 else 0
        last = node_spans[-1][0] if node_spans and node_spans[-1][0] > 0 else len(graph.nodes)
        heads = [n for n in graph.nodes[:first] if id(n) in by_node]
        tails = [n for n in graph.nodes[last:] if id(n) in by_node]
        self.first_end = sum(len(by_node[id(n)]) for n in heads)
        self.last_start = len(launches) - sum(len(by_node[id(n)]) for n in tails)
        if {id(l.node) for l in launches[:self.first_end]} != {id(n) for n in heads} or \
                {id(l.node) for l in launches[self.last_start:]} != {id(n) for n in tails}:
            raise ValueError("the spans' launches are not the ends of the launch list")
        self.first_groups = groups(self.batch, FIRST_GROUP) if heads else []
        self.last_groups = groups(self.batch, LAST_GROUP) if tails else []
        same, written = SameConfigs(ctx), written_layers(launches)     # as the batch binds them
        self.launches: list = []
        self._first = [self._bind(ctx, same, written, g, heads, by_node) for g in self.first_groups]
        self._last = [self._bind(ctx, same, written, g, tails, by_node) for g in self.last_groups]
        self._list = LaunchList(queue, self.launches)

    def _bind(self, ctx: BindContext, same: SameConfigs, written: frozenset, group: tuple, nodes: list,
              by_node: dict) -> tuple:
        """Bind ``nodes`` for the images of ``group``; returns their range in ``self.launches``."""
        image, count = group
        gctx = replace(ctx, batch=count, plan=ImagePlan(ctx.plan, image), tuning=same, written=written)
        lo = len(self.launches)
        for n in nodes:
            mine = bind_node(gctx, n)
            if _signature(mine) != _signature(by_node[id(n)]):
                raise ValueError(f"layer {n.label} binds another layout for {count} images")
            self.launches.extend(mine)
        return lo, len(self.launches)

    def enqueue_first(self, group: int) -> None:
        """Enqueue the first span's launches of ``first_groups[group]``."""
        self._list.enqueue(*self._first[group])

    def enqueue_last(self, group: int) -> None:
        """Enqueue the last span's launches of ``last_groups[group]``."""
        self._list.enqueue(*self._last[group])
