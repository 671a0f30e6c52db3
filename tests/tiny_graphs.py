"""The engine's graph of a tiny cfg text, for tests that drive the executor or the tuner directly.

Those tests (no Detector) write a cfg built with tiny_cfgs, give it random weights
(darknet_io, independent of yolo_cl) and build the graph: the same calls each time, here once.
"""
from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

from darknet_io import write_random_weights
from yolo_cl.cfg import parse_cfg
from yolo_cl.graph import Graph, build_graph
from yolo_cl.kernels import gemm_local as gl
from yolo_cl.kernels import winograd
from yolo_cl.layers import build_layers, parse_net
from yolo_cl.weights import load_weights


def write_model(folder: str, name: str, text: str, seed: int) -> tuple:
    """(cfg path, weights path) of ``text`` written into ``folder`` with random weights from ``seed``."""
    cfg = os.path.join(folder, f"{name}.cfg")
    with open(cfg, "w") as f:
        f.write(text)
    return cfg, write_random_weights(cfg, os.path.join(folder, f"{name}.weights"), seed=seed)


def graph_of(cfg: str, weights: Optional[str] = None, keep: Sequence[int] = ()) -> Graph:
    """The fused graph of ``cfg`` at its own size, with ``weights`` loaded (None: shapes only)."""
    sections = parse_cfg(cfg)
    info = parse_net(sections[0], None)
    layers = build_layers(sections, info)
    return build_graph(info, layers, load_weights(weights, layers) if weights else None, keep=keep)


def conv_nodes(path, text: str) -> list:
    """The conv nodes (shapes only) of the cfg ``text``, written to ``path``."""
    with open(path, "w") as f:
        f.write(text)
    return [n for n in graph_of(str(path)).nodes if n.op == "conv"]


# A small local-GEMM tile, so the tiny maps still give several work-groups and ragged edges.
TINY_TILE = dict(MWG=16, NWG=16, KWG=8, MDIMC=4, NDIMC=4)


def local_pick(gemm: dict, m: Optional[int] = None) -> Callable:
    """A ``pick(node)`` for :class:`FixedTuning` on the local family with tile ``gemm``: Winograd
    F(m x m) for the convs it applies to (when ``m`` is given), the implicit GEMM for the rest."""
    def pick(node) -> dict:
        if m is not None and winograd.applicable(node):
            M, N, K, _ = winograd.gemm_shape(node, m)
            return {"algo": "winograd", "m": m, "family": "local", **gl.complete(gemm, M, N, K)}
        M, N, K = node.attrs["filters"], node.output.h * node.output.w, node.attrs["in_c"] * node.attrs["size"] ** 2
        return {"algo": "implicit", "family": "local", **gl.complete(gemm, M, N, K, implicit=True)}
    return pick


class FixedTuning:
    """A tuning table that answers every conv with ``pick(node)``."""

    def __init__(self, pick) -> None:
        self.pick = pick

    def conv_config(self, node, batch: int = 1) -> dict:
        return self.pick(node)
