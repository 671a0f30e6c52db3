"""Build the fused inference graph from Darknet layers and their weights.

What happens here, and only here:
- batchnorm is folded into the convolution's weights and bias (in float64, eps 1e-5, as Darknet);
- a convolution's activation and a following ``[shortcut]`` (add + its own activation)
  become one node, the shortcut's add running in the conv's epilogue;
- a multi-input ``[route]`` becomes one concat tensor that its producers write straight
  into (each into its channel slice), so no copy runs; ``[route]`` with ``groups`` and
  ``[dropout]`` are just views;
- layers whose outputs were asked for (``keep``) are not fused away: their output stays a
  readable view, and the graph returns those views instead of the heads' inputs;
- consecutive centred stride-1 ``[maxpool]`` layers of one input writing slices of one tensor
  (SPP's 5/9/13 into their concat) become one ``maxpool_nested`` node: one launch, one pass;
- a ``[maxpool]``, ``[upsample]`` or route copy whose output only one conv reads is marked on that
  conv (``attrs["read_through"]``): a conv whose algorithm can compute the folded layers as it reads
  its input (Winograd's input transform, cl/fused.cl) runs them, and the executor drops their launches;
- a ``[maxpool]`` or an ``[upsample]`` that is the only reader of a conv's output (a 2x2 stride-2
  pool: one of its readers) is marked on that conv (``attrs["write_through"]``): a conv whose
  kernel can store that layer's output from its epilogue (the GPU GEMM families, their split-K sums,
  the CPU Winograd) does, and the executor drops the layer's launch.

The graph is a list of nodes in execution order, each reading and writing *views*
(a channel slice of a tensor). Tensors get memory later, from the planner.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from .layers import CHANNEL_ACTIVATIONS, HEADS, Layer, NetInfo, head_layers

BN_EPS = 1e-5   # Darknet's (normalize_cpu and fuse_conv_batchnorm); OpenCV's importer uses 1e-6
# Layer kinds that produce a fresh tensor (and so can write into a concat slice).
PRODUCERS = {"convolutional", "maxpool", "avgpool", "upsample", "reorg", "shortcut", "scale_channels", "sam",
             "softmax", "connected", "deconvolutional", "crop", "batchnorm", "activation", "logistic",
             "local_avgpool", "reorg3d", "l2norm", "implicit", "implicit_add", "implicit_mul", "local", "normalization"}
# Layers whose output is their input: Darknet's [empty] shares its input's buffer, [cost] is skipped
# at inference, [dropout] scales only in training, and the heads are decoded on the host.
PASS_THROUGH = ("dropout", "empty", "cost") + HEADS
# Element-wise one-input layers -> the node op that runs them.
SIMPLE_OPS = {"avgpool": "avgpool", "upsample": "upsample", "reorg": "reorg", "softmax": "softmax",
              "crop": "crop", "activation": "act", "logistic": "act", "local_avgpool": "local_avgpool",
              "reorg3d": "reorg3d", "l2norm": "l2norm", "normalization": "lrn"}


@dataclass(eq=False)
class Tensor:
    """A block of activations, batch-major NCHW, that the planner will place in memory."""

    id: int
    c: int
    h: int
    w: int
    name: str

    @property
    def size(self) -> int:
        """Elements per image."""
        return self.c * self.h * self.w


@dataclass(frozen=True, eq=False)
class View:
    """Channels ``[c0, c0 + c)`` of a tensor: contiguous within each image."""

    tensor: Tensor
    c0: int
    c: int

    @property
    def h(self) -> int:
        return self.tensor.h

    @property
    def w(self) -> int:
        return self.tensor.w

    @property
    def shape(self) -> tuple:
        return (self.c, self.tensor.h, self.tensor.w)

    def slice(self, c0: int, c: int) -> "View":
        return View(self.tensor, self.c0 + c0, c)


@dataclass(eq=False)
class Node:
    """One step of execution: an op reading ``inputs`` and writing ``output``."""

    op: str
    layers: list
    inputs: list
    output: View
    attrs: dict = field(default_factory=dict)
    flops: int = 0

    @property
    def label(self) -> str:
        return "+".join(str(i) for i in self.layers)

    def describe(self) -> str:
        a = self.attrs
        if self.op == "conv":
            s = f"conv {a['size']}x{a['size']}/{a['stride_x']}"
            if a["groups"] > 1:
                s += f" g{a['groups']}"
            s += f" {a['activation']}"
            if a.get("residual") is not None:
                s += f" +add {a['activation2']}"
            return s
        if self.op in ("act", "connected", "deconv", "local"):
            return f"{self.op} {a['activation']}"
        if self.op == "norm_channels":
            return a["mode"]
        return self.op


@dataclass
class Graph:
    """The fused network: nodes in order, the input tensor, and the views ``forward`` returns."""

    net: NetInfo
    layers: list
    nodes: list
    input: Tensor
    outputs: list            # views: raw inputs of each [yolo]/[region] layer, or the last layer's output
    heads: list              # the [yolo]/[region] Layer records, aligned with outputs (empty if none)
    tensors: list
    kept: tuple = ()         # the layer indices ``outputs`` belong to when built with ``keep``

    @property
    def flops(self) -> int:
        return sum(n.flops for n in self.nodes)


def fold_batchnorm(params, eps: float = BN_EPS, weights: Optional[np.ndarray] = None) -> tuple:
    """Darknet's fuse_conv_batchnorm: fold BN into (weights, bias), computed in float64.

    ``weights`` (default ``params.weights``) has one row per output channel along axis 0."""
    w = (params.weights if weights is None else weights).astype(np.float64)
    b = params.biases.astype(np.float64)
    if params.scales is not None:
        k = params.scales.astype(np.float64) / np.sqrt(params.variance.astype(np.float64) + eps)
        b = b - k * params.mean.astype(np.float64)
        w = w * k.reshape((-1,) + (1,) * (w.ndim - 1))
    return w.astype(np.float32), b.astype(np.float32)


def shortcut_weights(raw: np.ndarray, inputs: int, channels: int, normalization: str) -> np.ndarray:
    """AlexeyAB's weighted shortcut: the (inputs, channels) factor of each input (the previous layer
    first) per output channel, normalized as shortcut_multilayer_cpu does it in float32: ``relu``
    w / (eps + sum relu(w)), ``softmax`` exp(w - max) / (eps + sum exp(w - max)), eps 0.0001. The
    file's weights are (inputs,) for per_feature (Darknet's initial value, ones, without a file)
    or (inputs, channels) for per_channel."""
    w = np.asarray(raw, np.float32).reshape(inputs, -1)
    w = np.broadcast_to(w, (inputs, channels)).astype(np.float32)
    if normalization == "relu":
        w = np.maximum(w, np.float32(0))
    elif normalization == "softmax":
        w = np.exp(w - w.max(axis=0)).astype(np.float32)
    else:
        return w
    total = np.full(channels, 0.0001, np.float32)
    for k in range(inputs):              # Darknet's order of summation
        total = total + w[k]
    return (w / total).astype(np.float32)


def _consumers(layers: list) -> dict:
    uses: dict = {l.index: [] for l in layers}
    uses[-1] = []
    for l in layers:
        for j in l.inputs:
            uses[j].append(l.index)
    return uses


def build_graph(net: NetInfo, layers: list, params: Optional[dict], bn_eps: float = BN_EPS,
                keep: Sequence[int] = (), fold: Optional[bool] = None) -> Graph:
    """Fuse layers into nodes. ``params`` maps conv layer index -> ConvParams (None: shapes only).

    ``bn_eps`` is batchnorm's epsilon: Darknet's 1e-5 by default; 1e-6 reproduces OpenCV's importer.
    ``keep``: layer indices whose outputs the graph returns (in that order), none fused away.
    ``fold``: merge sibling max-pools and mark the layers convs may read or write through (below); None:
    yes unless the environment sets YOLO_CL_FOLD=0 (the plan before these fusions, for benchmarks)."""
    if fold is None:
        fold = folding_default() is not False
    tensors: list = []

    def new_tensor(c: int, h: int, w: int, name: str) -> Tensor:
        t = Tensor(len(tensors), c, h, w, name)
        tensors.append(t)
        return t

    uses = _consumers(layers)
    heads = head_layers(layers)
    by_index = {l.index: l for l in layers}
    kept = set(keep)

    def fuses(conv: Layer) -> bool:
        """A conv whose output was asked for keeps it: its shortcut is not folded into its epilogue."""
        return conv.index not in kept and _fuses_into_shortcut(conv, by_index, uses)

    # 1. Concat targets: each multi-input route claims producers that can write into its slices.
    slot: dict = {}      # producer layer index -> (route index, channel offset)
    for l in layers:
        if l.kind != "route" or len(l.inputs) < 2 or l.p["groups"] != 1:
            continue
        offset = 0
        for j in l.inputs:
            src = by_index[j]
            if src.kind in PRODUCERS and j not in slot and not fuses(src):
                slot[j] = (l.index, offset)
            offset += src.c

    # 2. Shortcuts fused into the conv that feeds them.
    fused_into: dict = {}  # conv index -> shortcut layer
    for l in layers:
        if l.kind == "shortcut":
            conv = by_index.get(l.inputs[0])
            if conv is not None and fuses(conv):
                fused_into[conv.index] = l

    graph_input = new_tensor(net.channels, net.height, net.width, "input")
    view: dict = {-1: View(graph_input, 0, net.channels)}
    concat: dict = {}    # route index -> Tensor
    nodes: list = []

    def out_view(l: Layer) -> View:
        """Where layer l writes: its slice of a concat, or a fresh tensor."""
        target = l
        if l.kind == "convolutional" and l.index in fused_into:
            target = fused_into[l.index]
        if target.index in slot:
            r, off = slot[target.index]
            if r not in concat:
                route = by_index[r]
                concat[r] = new_tensor(route.c, route.h, route.w, f"route{r}")
            return View(concat[r], off, target.c)
        return View(new_tensor(target.c, target.h, target.w, f"l{target.index}"), 0, target.c)

    fused_shortcuts = {s.index for s in fused_into.values()}
    for l in layers:
        i, p = l.index, l.p
        if i in fused_shortcuts:
            continue   # already emitted with its conv
        if l.kind in PASS_THROUGH:
            view[i] = view[l.inputs[0]]
            continue
        if l.kind == "route":
            if len(l.inputs) == 1 or p["groups"] > 1:
                parts = []
                for j in l.inputs:
                    v = view[j]
                    part = v.c // p["groups"]
                    parts.append(v.slice(p["group_id"] * part, part))
                if len(parts) == 1:
                    view[i] = parts[0]
                    continue
            else:
                parts = [view[j] for j in l.inputs]
            if i not in concat:
                concat[i] = new_tensor(l.c, l.h, l.w, f"route{i}")
            out = View(concat[i], 0, l.c)
            offset = 0
            for j, v in zip(l.inputs, parts):
                if v.tensor is not out.tensor or v.c0 != offset:
                    nodes.append(Node("copy", [i], [v], out.slice(offset, v.c)))
                offset += v.c
            view[i] = out
            continue
        out = out_view(l)
        if not l.inputs:   # [implicit*]: a constant
            attrs = dict(p, value=params[i].weights if params is not None else None)
            nodes.append(Node("implicit", [i], [], out, attrs))
            view[i] = out
            continue
        x = view[l.inputs[0]]
        if l.kind == "convolutional":
            attrs = dict(p)
            if p["activation"] in CHANNEL_ACTIVATIONS:
                attrs["activation"] = "linear"      # the epilogue is per element; the channel norm follows
            if params is not None:
                attrs["weights"], attrs["bias"] = fold_batchnorm(params[i], bn_eps)
            layers_done = [i]
            sc = fused_into.get(i)
            attrs["residual"] = None
            if sc is not None:
                attrs["residual"] = view[sc.inputs[1]]
                attrs["activation2"] = sc.p["activation"]
                layers_done.append(sc.index)
                view[sc.index] = out
            k = (p["in_c"] // p["groups"]) * p["size"] ** 2
            nodes.append(Node("conv", layers_done, [x], out, attrs, 2 * p["filters"] * k * l.h * l.w))
            if p["activation"] in CHANNEL_ACTIVATIONS:   # in place: one work-item owns a pixel's channels
                nodes.append(Node("norm_channels", [i], [out], out, dict(mode=p["activation"])))
        elif l.kind in ("connected", "deconvolutional", "batchnorm", "local"):
            nodes.append(_weighted_node(l, x, out, params, bn_eps))
        elif l.kind == "maxpool":
            op = "maxpool_depth" if p["depth"] else "maxpool"
            nodes.append(Node(op, [i], [x], out, dict(p)))
        elif l.kind == "shortcut":
            attrs = dict(p)
            if p.get("nweights"):
                raw = params.get(i) if params is not None else None
                attrs["sc_weights"] = shortcut_weights(np.ones(p["nweights"], np.float32) if raw is None else raw.weights,
                                                       len(l.inputs), l.c, p["normalization"])
            nodes.append(Node("add", [i], [x] + [view[j] for j in l.inputs[1:]], out, attrs))
        elif l.kind in ("scale_channels", "sam"):
            # inputs: [the scale (previous layer), the tensor being scaled (from)]
            nodes.append(Node(l.kind, [i], [x, view[l.inputs[1]]], out, dict(p)))
        else:
            nodes.append(Node(SIMPLE_OPS[l.kind], [i], [x], out, dict(p)))
        view[i] = out

    if keep:
        outputs = [view[i] for i in keep]
    elif heads:
        outputs = [view[h.inputs[0]] for h in heads]
    else:
        outputs = [view[layers[-1].index]]
    graph = Graph(net, layers, nodes, graph_input, outputs, heads, tensors, tuple(keep))
    if fold:
        merge_sibling_pools(graph)
        mark_read_fusions(graph)
        mark_write_fusions(graph)
    return graph


def _weighted_node(l: Layer, x: View, out: View, params: Optional[dict], bn_eps: float) -> Node:
    """The node of a [connected], [deconvolutional], [local] or [batchnorm] layer, batchnorm folded into it.

    A deconvolution's weights become (filters, channels, size, size); a [batchnorm] becomes a
    per-channel affine ``x * scale + bias``."""
    i, p = l.index, l.p
    attrs = dict(p)
    cp = params[i] if params is not None else None
    if l.kind == "connected":
        if cp is not None and cp.weights.shape[1] != p["inputs"]:
            raise l.error(f"the weights are for {cp.weights.shape[1]} inputs, but at this network size the layer "
                          f"gets {p['inputs']}: a network with [connected] layers runs only at its cfg's size")
        if cp is not None:
            attrs["weights"], attrs["bias"] = fold_batchnorm(cp, bn_eps)
        return Node("connected", [i], [x], out, attrs, 2 * p["outputs"] * p["inputs"])
    if l.kind == "deconvolutional":
        if cp is not None:
            attrs["weights"], attrs["bias"] = fold_batchnorm(cp, bn_eps, cp.weights.transpose(1, 0, 2, 3))
        return Node("deconv", [i], [x], out, attrs, 2 * p["filters"] * p["in_c"] * p["size"] ** 2 * x.h * x.w)
    if l.kind == "local":
        if cp is not None:
            attrs["weights"], attrs["bias"] = cp.weights, cp.biases
        return Node("local", [i], [x], out, attrs, 2 * l.c * l.h * l.w * p["in_c"] * p["size"] ** 2)
    if cp is not None:
        scale, attrs["bias"] = fold_batchnorm(cp, bn_eps, np.ones(l.c, np.float32))
        attrs["weights"] = scale
    return Node("batchnorm", [i], [x], out, attrs)


def _fuses_into_shortcut(conv: Layer, by_index: dict, uses: dict) -> bool:
    """True if ``conv`` feeds only a single-source [shortcut] whose other input has its exact shape."""
    if conv.kind != "convolutional" or len(uses[conv.index]) != 1 or conv.p["activation"] in CHANNEL_ACTIVATIONS:
        return False
    sc = by_index[uses[conv.index][0]]
    if sc.kind != "shortcut" or len(sc.inputs) != 2 or sc.inputs[0] != conv.index:
        return False
    if (sc.p.get("alpha", 1.0), sc.p.get("beta", 1.0)) != (1.0, 1.0) or sc.p.get("nweights"):
        return False                    # the conv epilogue adds unweighted
    other = sc.inputs[1]
    src = by_index.get(other)
    shape = (src.c, src.h, src.w) if src is not None else None
    return shape == (conv.c, conv.h, conv.w)


# -- layers folded into a conv's input read ---------------------------------------------------
def folding_default() -> Optional[bool]:
    """What the environment asks of folding: YOLO_CL_FOLD=0 False, =1 True, unset None (each
    executor then chooses by its device)."""
    v = os.environ.get("YOLO_CL_FOLD", "").strip()
    return None if v == "" else v != "0"


FOLDABLE = ("maxpool", "upsample", "copy")
MAX_SEGMENTS = 2          # upsample/copy producers one input transform reads through


def _readers(graph: Graph) -> dict:
    """tensor id -> (node, view) of every read of it (inputs and fused shortcut inputs)."""
    out: dict = {}
    for node in graph.nodes:
        for v in reads(node, fold=False):
            out.setdefault(v.tensor.id, []).append((node, v))
    return out


def _overlap(a: View, b: View) -> bool:
    return a.tensor is b.tensor and a.c0 < b.c0 + b.c and b.c0 < a.c0 + a.c


def foldable(producer: Node, conv: Node, readers: dict, returned: list) -> bool:
    """Whether ``conv`` can compute ``producer``'s output while reading its input: the conv's input
    is the only read of the channels the producer writes (no returned view holds them either) and
    they lie inside that input view (a max-pool's output must be that whole view)."""
    if producer.op not in FOLDABLE or conv.op != "conv" or producer is conv:
        return False
    out, x = producer.output, conv.inputs[0]
    t = out.tensor
    if x.tensor is not t or any(_overlap(out, v) for v in returned):
        return False
    if any(_overlap(out, v) and (node is not conv or v is not x) for node, v in readers.get(t.id, [])):
        return False
    if not (x.c0 <= out.c0 and out.c0 + out.c <= x.c0 + x.c):
        return False
    if producer.op == "maxpool":             # the pooled tensor is exactly what the conv reads
        return out.c0 == 0 and out.c == t.c and x.c0 == 0 and x.c == t.c
    return True


def mark_read_fusions(graph: Graph) -> int:
    """Set ``attrs["read_through"]`` (a list of nodes) on each conv that may fold producers of its
    input: one max-pool, or up to MAX_SEGMENTS upsamples and route copies; returns how many convs."""
    readers = _readers(graph)
    returned = list(graph.outputs)
    writers: dict = {}
    for node in graph.nodes:
        writers.setdefault(node.output.tensor.id, []).append(node)
    marked = 0
    for node in graph.nodes:
        if node.op != "conv":
            continue
        x = node.inputs[0]
        folds = [w for w in writers.get(x.tensor.id, []) if foldable(w, node, readers, returned)]
        pools = [w for w in folds if w.op == "maxpool"]
        folds = pools[:1] if pools else folds[:MAX_SEGMENTS]
        if folds:
            node.attrs["read_through"] = folds
            marked += 1
    return marked


def extra_reads(node: Node) -> list:
    """Views a node reads beyond its inputs because of a folded producer (for the planner)."""
    return [v for p in node.attrs.get("read_through") or () for v in p.inputs]


def reads(node: Node, fold: bool = True) -> list:
    """Every view ``node`` reads: its inputs, a fused shortcut's input and, where ``fold``, the
    inputs of the producers it reads through (the planner's and the side branches' one rule)."""
    res = node.attrs.get("residual")
    return [*node.inputs, *([res] if res is not None else []), *(extra_reads(node) if fold else [])]


# -- layers a conv's epilogue writes instead of its own output -------------------------------
def pool_2x2(node: Node) -> bool:
    """A 2x2 stride-2 max-pool whose windows tile its input exactly (even sides, no offset)."""
    a = node.attrs
    x, out = node.inputs[0], node.output
    return (node.op == "maxpool" and a["size"] == 2 and a["stride_x"] == a["stride_y"] == 2
            and a["padding"] in (0, 1) and out.h * 2 == x.h and out.w * 2 == x.w)


def writable(conv: Node, consumer: Node, readers: dict, returned: list) -> Optional[bool]:
    """Whether ``conv``'s epilogue can store ``consumer``'s output: ``consumer`` reads exactly
    ``conv``'s output and is a max-pool or an upsample of scale 1, and ``conv`` has no fused
    shortcut (whose add would read the pooled or upsampled layout). True: in place of its own
    output, which nothing else reads or returns; False: a 2x2 stride-2 pool whose input is read
    elsewhere too, stored beside the conv's own output; None: neither."""
    out = conv.output
    if conv.op != "conv" or conv.attrs.get("residual") is not None or not _same(consumer.inputs[0], out):
        return None
    t = out.tensor
    alone = (out.c0 == 0 and out.c == t.c and not any(v.tensor is t for v in returned)
             and [n for n, _ in readers.get(t.id, [])] == [consumer])
    if consumer.op == "upsample":
        return True if alone and consumer.attrs["stride"] > 1 and consumer.attrs["scale"] == 1.0 else None
    if consumer.op != "maxpool":
        return None
    return alone if pool_2x2(consumer) else (True if alone else None)


def mark_write_fusions(graph: Graph) -> int:
    """Set ``attrs["write_through"]`` (the consumer node) on each conv whose output a 2x2 stride-2
    max-pool or an upsample reads (:func:`writable`), and ``attrs["write_keeps"]`` where the conv
    must still store its own output too; returns how many convs."""
    readers = _readers(graph)
    returned = list(graph.outputs)
    marked = 0
    for node in graph.nodes:
        for consumer, _ in readers.get(node.output.tensor.id, []):
            alone = writable(node, consumer, readers, returned)
            if alone is not None:
                node.attrs["write_through"] = consumer
                node.attrs["write_keeps"] = not alone
                marked += 1
                break
    return marked


def extra_writes(node: Node) -> list:
    """Views a node may write beyond its output because of a layer it writes through (for the planner)."""
    w = node.attrs.get("write_through")
    return [w.output] if w is not None else []


def writes(node: Node, write: bool = True) -> list:
    """Every view ``node`` may write: its output and, where ``write``, the layer it writes through."""
    return [node.output, *(extra_writes(node) if write else [])]


def _same(a: View, b: View) -> bool:
    return a.tensor is b.tensor and a.c0 == b.c0 and a.c == b.c


def _centred_pool(node: Node) -> bool:
    """A stride-1 max-pool of odd size padded to keep the input's size (Darknet's default padding)."""
    a = node.attrs
    return (node.op == "maxpool" and a["stride_x"] == a["stride_y"] == 1 and a["size"] % 2 == 1
            and a["padding"] == a["size"] - 1)


def merge_sibling_pools(graph: Graph, most: int = 3) -> int:
    """Replace runs of consecutive centred stride-1 max-pools of the same input view, of distinct
    sizes, writing slices of one tensor, by one ``maxpool_nested`` node (attrs ``sizes`` and
    ``outputs``, smallest first); returns how many nodes it removed."""
    out, removed, i = [], 0, 0
    nodes = graph.nodes
    while i < len(nodes):
        run = [nodes[i]]
        if _centred_pool(nodes[i]):
            x, t = nodes[i].inputs[0], nodes[i].output.tensor
            j = i + 1
            while (j < len(nodes) and len(run) < most and _centred_pool(nodes[j]) and _same(nodes[j].inputs[0], x)
                   and nodes[j].output.tensor is t and nodes[j].attrs["size"] not in [n.attrs["size"] for n in run]):
                run.append(nodes[j])
                j += 1
        if len(run) == 1:
            out.append(nodes[i])
            i += 1
            continue
        run.sort(key=lambda n: n.attrs["size"])
        layers_ = [l for n in run for l in n.layers]
        out.append(Node("maxpool_nested", layers_, [run[0].inputs[0]], run[0].output,
                        dict(sizes=[n.attrs["size"] for n in run], outputs=[n.output for n in run])))
        removed += len(run) - 1
        i += len(run)
    graph.nodes[:] = out
    return removed
