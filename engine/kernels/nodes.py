"""Launches for any graph node: convolutions through ``conv`` (the kernel families), sibling
max-pools merged by the graph through ``fused``, the rest through ``simple``; and the scratch a
node needs."""
from __future__ import annotations

from . import BindContext, conv, fused, simple, winograd
from ..graph import Node


def bind_node(ctx: BindContext, node: Node) -> list:
    """Launches for ``node`` (in order)."""
    if node.op == "conv":
        return conv.bind(ctx, node)
    if node.op == "maxpool_nested":
        return fused.bind_nested_pools(ctx, node)
    return simple.bind(ctx, node)


def workspace_bytes(ctx: BindContext, node: Node) -> int:
    """Scratch bytes ``node`` needs under the config it binds (im2col, Winograd, split-K partials); 0 if none."""
    return conv.workspace_bytes(ctx, node) if node.op == "conv" else 0


def largest_workspace_elems(node: Node, batch: int) -> int:
    """Scratch elements of ``node``'s largest algorithm, whatever config a device would pick: for
    reports made without a device."""
    return winograd.scratch_elems(node, batch) if node.op == "conv" else 0
