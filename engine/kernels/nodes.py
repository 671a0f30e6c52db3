"""Launches for any graph node: convolutions through ``conv`` (the kernel families), sibling
max-pools merged by the graph through ``fused``, the rest through ``simple``; and the scratch a
node needs."""
from __future__ import annotations

from . import BindContext, conv, family, fused, simple
from ..graph import Node


def bind_node(ctx: BindContext, node: Node) -> list:
    """Launches for ``node`` (in order)."""
    if node.op == "conv":
        return conv.bind(ctx, node)
    if node.op == "maxpool_nested":
        return fused.bind_nested_pools(ctx, node)
    return simple.bind(ctx, node)


def workspace_elems(node: Node, batch: int) -> int:
    """Scratch elements a node needs (im2col, Winograd, split-K partials); 0 if none."""
    return family.workspace_elems(node, batch) if node.op == "conv" else 0
