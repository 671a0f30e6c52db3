"""From a model name to a graph: resolve a zoo name or paths, parse the cfg, build the layers,
read (or make) the weights, fuse the graph. The one way the detector, the CLI, bench, the tuner
and the tools load a network."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

from .cfg import parse_cfg, warn_unheard
from .errors import YoloClError
from .graph import BN_EPS, Graph, build_graph
from .layers import NetInfo, build_layers, parse_net
from .weights import load_weights, needs_weights
from .zoo import resolve

WEIGHTS = ("required", "optional", "made", "none")


@dataclass
class Model:
    """A parsed network: its files, cfg sections, layers, parameters and fused graph."""

    cfg_path: Path
    weights_path: Optional[Path]
    sections: list
    net: NetInfo
    layers: list
    params: Optional[dict]         # layer index -> parameters; None: shapes only
    graph: Graph
    cfg_warnings: list             # unused or repeated cfg keys (with ``warn``), one line each


def resolve_model(model: Union[str, Path], weights: Optional[Union[str, Path]] = None) -> tuple:
    """A zoo name or cfg path (and optional weights path) -> (cfg path, weights path or None).
    A zoo name brings its bundled weights unless ``weights`` is given."""
    p = Path(str(model))
    if not p.is_file() and "/" not in str(model) and not str(model).endswith(".cfg"):
        z = resolve(str(model))
        if z is None:
            from .zoo import zoo_cfgs
            raise YoloClError(f"'{model}' is neither a cfg file nor a zoo model ({', '.join(zoo_cfgs())})")
        cfg_path, zoo_weights = z
        return cfg_path, Path(weights) if weights is not None else zoo_weights
    return p, (Path(weights) if weights is not None else None)


def load_model(model: Union[str, Path], weights: Optional[Union[str, Path]] = None, size=None, *,
               params: str = "required", bn_eps: float = BN_EPS,
               make_params: Optional[Callable[[list], dict]] = None, warn: bool = False,
               fold: Optional[bool] = None) -> Model:
    """Load ``model`` (zoo name or cfg path) at input ``size`` (None: the cfg's).

    ``params``: ``required`` -- a network with weighted layers needs a weights file (the zoo's or
    ``weights``); ``optional`` -- without one, ``make_params(layers)`` makes them (e.g. random
    weights for a speed run); ``made`` -- ``make_params(layers)`` whatever files there are;
    ``none`` -- shapes only (the graph carries no weights). ``warn``: log the cfg keys nobody reads.
    ``fold``: graph.build_graph's (None: its default)."""
    if params not in WEIGHTS:
        raise ValueError(f"params '{params}' is not one of {', '.join(WEIGHTS)}")
    cfg_path, weights_path = resolve_model(model, weights)
    sections = parse_cfg(cfg_path)
    net = parse_net(sections[0], size)
    layers = build_layers(sections, net)
    cfg_warnings = warn_unheard(sections) if warn else []
    values = None
    if params == "made":
        values, weights_path = make_params(layers), None
    elif params != "none":
        if weights_path is not None:
            values = load_weights(weights_path, layers)
        elif params == "optional" and make_params is not None:
            values = make_params(layers)
        elif needs_weights(layers):
            raise YoloClError(f"{cfg_path}: no weights given (use --weights, or 'yolo-cl info' for shapes only)")
        else:
            values = {}
    return Model(cfg_path, weights_path if params != "none" else None, sections, net, layers, values,
                 build_graph(net, layers, values, bn_eps, fold=fold), cfg_warnings)
