"""The tuner: finds fast, correct conv configs on one device (``yolo-cl tune``, :class:`Tuner`).

For each unique shape key it asks the kernel families (``kernels.family``) for every legal
config, orders them by the families' cost models and lets the family-blind search
(``search.guided``) time at most a quarter of them: the cost model's best per (algorithm,
kernel) group, then neighbours of the fastest, then a successive-halving re-timing of the
finalists. Every candidate is checked against a NumPy convolution before it is timed (relative
error within the precision's tolerance: 1e-4 fp32, 1e-2 fp16, 2e-2 tf32) and timed through
``measure``. Results go to the tuning database (``tuning_db``).
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from . import measure, search
from .errors import YoloClError, reason
from .graph import Node, Tensor, View
from .kernels import TRANSPOSE, BindContext, family, layout, writes_through
from .kernels import gemm_mma
from .kernels.nodes import bind_node
from .precision import FP32, Precision
from .search import config_key, new_state
from .tuning_db import shape_key

log = logging.getLogger("yolo_cl.tuner")

TIMED_FRACTION = 0.25
BUILDS = ("processes", "threads")
TRAVERSE_CHUNK = 256        # candidates a traversal binds (compiles) in parallel before timing them
CLOCKS = measure.CLOCKS


# -- NumPy reference ----------------------------------------------------------------------
def _act(x: np.ndarray, name: str) -> np.ndarray:
    if name == "leaky":
        return np.where(x > 0, x, 0.1 * x)
    if name == "relu":
        return np.maximum(x, 0)
    if name == "relu6":
        return np.clip(x, 0, 6)
    if name == "logistic":
        return 1 / (1 + np.exp(-x))
    if name == "tanh":
        return np.tanh(x)
    if name == "mish":
        sp = np.where(x > 20, x, np.where(x < -20, np.exp(x), np.log1p(np.exp(np.minimum(x, 20)))))
        return x * np.tanh(sp)
    if name == "swish":
        return x / (1 + np.exp(-x))
    if name == "hard_mish":
        return np.where(x > 0, x, np.where(x > -2, x * x * 0.5 + x, 0))
    return x


def reference_conv(x: np.ndarray, node: Node, residual: Optional[np.ndarray] = None) -> np.ndarray:
    """Darknet conv (+ bias, activation, optional residual add and activation) in NumPy, float64."""
    a = node.attrs
    B, C, H, W = x.shape
    ks, sy, sx, pad, dil, g = a["size"], a["stride_y"], a["stride_x"], a["pad"], a["dilation"], a["groups"]
    oh, ow = node.output.h, node.output.w
    xp = np.zeros((B, C, H + 2 * pad + ks * dil, W + 2 * pad + ks * dil), np.float64)
    xp[:, :, pad:pad + H, pad:pad + W] = x
    w = a["weights"].reshape(a["filters"], C // g, ks, ks).astype(np.float64)
    out = np.zeros((B, a["filters"], oh, ow), np.float64)
    fg, cg = a["filters"] // g, C // g
    for ky in range(ks):
        for kx in range(ks):
            patch = xp[:, :, ky * dil: ky * dil + sy * (oh - 1) + 1: sy, kx * dil: kx * dil + sx * (ow - 1) + 1: sx]
            for gi in range(g):
                out[:, gi * fg:(gi + 1) * fg] += np.einsum(
                    "fc,bchw->bfhw", w[gi * fg:(gi + 1) * fg, :, ky, kx], patch[:, gi * cg:(gi + 1) * cg])
    out = _act(out + a["bias"].astype(np.float64).reshape(1, -1, 1, 1), a["activation"])
    if residual is not None:
        out = _act(out + residual, a["activation2"])
    return out


def reference_through(y: np.ndarray, node: Node) -> np.ndarray:
    """The max-pool or upsample ``node`` (a layer a conv writes through) applied to ``y`` in NumPy:
    Darknet's windows (``padding // 2`` cells before, padded cells never the max), its nearest
    upsample."""
    a = node.attrs
    if node.op == "upsample":
        s = a["stride"]
        return y.repeat(s, axis=2).repeat(s, axis=3) * a["scale"]
    k, sy, sx, off = a["size"], a["stride_y"], a["stride_x"], a["padding"] // 2
    B, C, H, W = y.shape
    oh, ow = node.output.h, node.output.w
    yp = np.full((B, C, max(H + off, sy * (oh - 1) + k), max(W + off, sx * (ow - 1) + k)), -np.inf, y.dtype)
    yp[:, :, off:off + H, off:off + W] = y
    out = np.full((B, C, oh, ow), -np.inf, y.dtype)
    for ky in range(k):
        for kx in range(k):
            np.maximum(out, yp[:, :, ky:ky + sy * (oh - 1) + 1:sy, kx:kx + sx * (ow - 1) + 1:sx], out=out)
    return out


def rel_error(x: np.ndarray, ref: np.ndarray) -> float:
    if not np.isfinite(x).all():
        return math.inf
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


# -- one conv, alone ----------------------------------------------------------------------
class _Plan:
    """Offsets of an isolated node's own tensors (the planner's interface)."""

    def __init__(self, offsets: dict) -> None:
        self.offsets = offsets

    def offset(self, tensor: Tensor) -> int:
        return self.offsets[tensor.id]


class ConvBench:
    """A conv node cut out of its graph, on random data: binds candidates, checks, times them.

    The output lives in a slice (one spare channel on each side) so a kernel that writes
    outside its concat slice fails the check. Nodes without weights (shape-only graphs) get
    random ones. A conv that writes through a layer (graph.mark_write_fusions: a max-pool or
    upsample that reads it) keeps doing so here, as in the network: a config that stores that
    layer is checked on it (and on its own output where it keeps that too), and a config that
    cannot is charged the layer's own launch, which the network then runs (``time``). Likewise a
    config that transposes the input to the layout it reads (``kernels.TRANSPOSE``) is not charged
    that launch where ``input_channels_last`` says the network stores the input so already (a conv
    writing it for this one alone: ``layout.sole_conv_edges``).
    """

    def __init__(self, rt, node: Node, batch: int, precision: Precision, queue, seed: int = 0,
                 reference: bool = True, mma: str = "", input_channels_last: bool = False) -> None:
        """``precision``: storage and rounding of the run; ``mma``: the tensor-core mode in use ("" = none)."""
        self.rt, self.batch, self.precision, self.queue = rt, batch, precision, queue
        self.input_channels_last = input_channels_last
        rng = np.random.default_rng(seed)
        a = dict(node.attrs)
        a.pop("read_through", None)        # a folded producer's input is not part of this bench
        written = a.pop("write_through", None)
        x0, o0 = node.inputs[0], node.output
        if a.get("weights") is None:
            k = (a["in_c"] // a["groups"]) * a["size"] ** 2
            a["weights"] = (rng.standard_normal((a["filters"], a["in_c"] // a["groups"], a["size"], a["size"]))
                            / math.sqrt(k)).astype(np.float32)
            a["bias"] = (0.1 * rng.standard_normal(a["filters"])).astype(np.float32)
        tin = Tensor(0, x0.c, x0.h, x0.w, "in")
        tout = Tensor(1, o0.c + 2, o0.h, o0.w, "out")
        tensors = [tin, tout]
        res = None
        if a.get("residual") is not None:
            tres = Tensor(2, o0.c, o0.h, o0.w, "res")
            tensors.append(tres)
            res = View(tres, 0, o0.c)
            a["residual"] = res
        # the layer it writes through, reading this bench's output and writing a tensor of its own
        self.through: Optional[Node] = None
        if written is not None:
            tw = Tensor(3, written.output.c, written.output.h, written.output.w, "written")
            tensors.append(tw)
            self.through = Node(written.op, list(written.layers), [View(tout, 1, o0.c)],
                                View(tw, 0, written.output.c), dict(written.attrs))
            a["write_through"] = self.through
        self.keeps = self.through is not None and bool(a.get("write_keeps"))
        self._through_ms: Optional[float] = None
        self.node = Node("conv", list(node.layers), [View(tin, 0, x0.c)], View(tout, 1, o0.c), a, node.flops)
        offsets, total = {}, 0
        for t in tensors:
            offsets[t.id] = total
            total += -(-t.size * batch // 64) * 64
        item = precision.itemsize
        self.dtype = precision.dtype
        self.arena = rt.alloc(total * item, "tuner arena")
        self.ctx = BindContext(rt, self.arena, _Plan(offsets), batch, precision, mma=mma)
        configs = family.candidates(self.node, rt, batch, precision, mma) + \
            [family.heuristic(self.node, rt, batch, precision, mma)]
        ws = max(family.workspace_bytes(self.node, c, batch, precision) for c in configs)  # any it may bind
        self.ctx.workspace = rt.alloc(ws, "tuner workspace") if ws else None
        self._retired: list = []        # smaller workspaces, kept alive for the launches bound on them
        self._ws_lock = threading.Lock()
        self.offsets, self.tensors, self.total = offsets, tensors, total
        x = rng.standard_normal((batch, x0.c, x0.h, x0.w)).astype(np.float32)
        r = rng.standard_normal((batch, o0.c, o0.h, o0.w)).astype(np.float32) if res is not None else None
        self.x, self.r = x.astype(self.dtype).astype(np.float32), None if r is None else \
            r.astype(self.dtype).astype(np.float32)
        # float32 is plenty for a 1e-4 relative gate, and 5-10x faster to compare than float64
        self.ref = reference_conv(self.x, self.node, self.r).astype(np.float32) if reference else None
        self.ref_through = reference_through(self.ref, self.through) \
            if reference and self.through is not None else None
        self._out = np.empty(tout.size * batch, self.dtype)
        self._out_through = np.empty(self.through.output.tensor.size * batch, self.dtype) \
            if self.through is not None else None
        self._pristine = None

    def _upload(self) -> None:
        """Restore the arena: inputs in place, everything else NaN (a device-side copy of the
        image uploaded on first use: checks are what a traversal spends its time on)."""
        if self._pristine is None:
            host = np.full(self.total, np.nan, self.dtype)
            o = self.offsets
            host[o[0]:o[0] + self.x.size] = self.x.ravel()
            if self.r is not None:
                host[o[2]:o[2] + self.r.size] = self.r.ravel()
            self._pristine = self.rt.upload(host, "tuner arena image")
        self.rt.cl.enqueue_copy(self.queue, self.arena, self._pristine, byte_count=self.arena.size)

    def bind(self, config: dict) -> list:
        """Launches of ``config``; one the candidates did not size the workspace for (a stored
        config, a re-timed variant: a larger split, say) gets a larger workspace first."""
        try:
            need = family.workspace_bytes(self.node, config, self.batch, self.precision)
        except (KeyError, TypeError, ValueError):
            need = 0                    # a malformed config: binding says why
        with self._ws_lock:
            ws = self.ctx.workspace
            if need > (ws.size if ws is not None else 0):
                self._retired.append(ws)
                self.ctx.workspace = self.rt.alloc(need, "tuner workspace")
        return family.bind(self.ctx, self.node, config)

    def check(self, launches: list) -> float:
        """Run once on poisoned output memory; relative error vs NumPy (inf if it wrote outside its
        slice): of the conv's output, or of the layer it wrote through (and of its own output too
        where it keeps that)."""
        self._upload()
        for l in launches:
            self.rt.cl.enqueue_nd_range_kernel(self.queue, l.kernel, l.gsize, l.lsize)
        item = self.ctx.itemsize
        self.rt.cl.enqueue_copy(self.queue, self._out, self.arena, src_offset=self.offsets[1] * item)
        wrote = writes_through(launches)
        if wrote:
            self.rt.cl.enqueue_copy(self.queue, self._out_through, self.arena, src_offset=self.offsets[3] * item)
        self.queue.finish()
        t = self.tensors[1]
        out = self._out.astype(np.float32, copy=False).reshape(self.batch, t.c, t.h, t.w)
        if not (np.isnan(out[:, 0]).all() and np.isnan(out[:, -1]).all()):
            return math.inf
        if not wrote:
            return rel_error(out[:, 1:-1], self.ref)
        w = self.through.output.tensor
        err = rel_error(self._out_through.astype(np.float32, copy=False).reshape(self.batch, w.c, w.h, w.w),
                        self.ref_through)
        return max(err, rel_error(out[:, 1:-1], self.ref)) if self.keeps else err

    def time(self, launches: list, reps: int, clock: str = "events") -> float:
        """Fastest of ``reps`` runs in milliseconds (``measure.time_launches``), plus the launch of
        the layer the conv writes through where these launches do not store it; without an input
        transpose the network will not run (``input_channels_last``)."""
        if self.input_channels_last:
            launches = [l for l in launches if l.name != TRANSPOSE]
        ms = measure.time_launches(self.rt, self.queue, launches, reps, clock)
        return ms if self.through is None or writes_through(launches) else ms + self.through_ms(reps, clock)

    def through_ms(self, reps: int, clock: str = "events") -> float:
        """The written-through layer's own launch time (measured once): what the network pays
        for it after a conv that does not store it."""
        if self._through_ms is None:
            try:
                self._through_ms = measure.time_launches(self.rt, self.queue, bind_node(self.ctx, self.through),
                                                         max(reps, 3), clock)
            except Exception as e:       # noqa: BLE001 - charge nothing rather than stop the search
                log.warning("layer %s: cannot time the %s it writes through (%s); configs are timed without it",
                            self.node.label, self.through.op, reason(e))
                self._through_ms = 0.0
        return self._through_ms


# -- the tuner ------------------------------------------------------------------------------
@dataclass
class TuneResult:
    """The outcome for one shape key."""

    key: str
    config: dict
    ms: float
    flops: int
    candidates: int
    timed: int
    rejected: int = 0
    seconds: float = 0.0
    times: dict = field(default_factory=dict)      # config_key(config) -> best ms seen
    phases: dict = field(default_factory=dict)     # seconds spent compiling, checking, timing

    @property
    def gflops(self) -> float:
        return self.flops / (self.ms * 1e6) if self.ms > 0 else 0.0


class Tuner:
    """Finds fast, correct conv configs on one device and writes them to a TuningDatabase."""

    def __init__(self, rt, precision: Precision = FP32, batch: int = 1, fraction: float = TIMED_FRACTION,
                 reps: int = 2, progress: Optional[Callable] = None, seed: int = 0, clock: str = "events",
                 jobs: Optional[int] = None, build: str = "processes") -> None:
        if clock not in CLOCKS:
            raise YoloClError(f"clock '{clock}' is not one of {', '.join(CLOCKS)}")
        if clock == "cpu" and not rt.is_cpu:
            raise YoloClError("the cpu clock only measures CPU devices")
        if build not in BUILDS:
            raise YoloClError(f"build '{build}' is not one of {', '.join(BUILDS)}")
        self.rt, self.precision, self.batch, self.clock = rt, precision, batch, clock
        self.mma = gemm_mma.mode_for(rt, precision)     # the families offered next to it are searched
        self.keys = family.space_keys()
        self.fraction, self.reps, self.seed = fraction, reps, seed
        self.progress = progress
        self.deadline: Optional[float] = None
        self.tol = precision.run_as(self.mma).tolerance
        self.jobs = max(1, jobs if jobs is not None else min(16, os.cpu_count() or 1))
        # Worker processes compile into the on-disk binary cache, which this process then loads
        # from: without that cache they would compile for nothing.
        self.build = build if rt.binary_cache else "threads"
        self._pool = None
        self._built: set = set()        # (program key, config key) already built in this process
        self.queue = measure.profiling_queue(rt)

    # -- candidates ---------------------------------------------------------------------------
    def candidates(self, node: Node) -> list:
        """Every legal config of the device's kernel families for ``node``."""
        return family.candidates(node, self.rt, self.batch, self.precision, self.mma)

    # -- measuring ------------------------------------------------------------------------
    @staticmethod
    def _bind(bench: ConvBench, cfg: dict):
        """The candidate's launches, or why it cannot be built or bound (a one-line string)."""
        try:
            return bench.bind(cfg)
        except Exception as e:       # noqa: BLE001 - any failing candidate is just not a candidate
            return reason(e)

    def _bind_many(self, bench: ConvBench, cfgs: list, state: dict) -> None:
        """Bind -- and so compile -- the candidates not bound yet, ``jobs`` at a time.

        Compiling dominates tuning (NVIDIA's compiler takes about 0.44 s per GEMM program on an
        H100, PoCL's up to 3.6 s, timing a candidate milliseconds), and builds of different programs
        run in parallel (worker processes, or ``Runtime.program`` in threads). Nothing is timed
        meanwhile: checks and timings stay serial.
        """
        todo = {}
        for c in cfgs:
            k = config_key(c)
            if k not in state["launches"] and k not in state["bound"]:
                todo[k] = c
        if self.jobs <= 1 or len(todo) <= 1:
            return
        t0 = time.perf_counter()
        pk = _program_key(bench.node, self.batch, self.precision, self.mma)
        if self.build == "processes":
            new = [c for k, c in todo.items() if (pk, k) not in self._built]     # e.g. a search after a traversal
            if len(new) > 1:
                self._compile_in_workers(bench, new)
            for k, c in todo.items():          # now a load from the binary cache
                state["bound"][k] = self._bind(bench, c)
        else:
            with ThreadPoolExecutor(self.jobs) as pool:
                for k, bound in zip(todo, pool.map(lambda c: self._bind(bench, c), todo.values())):
                    state["bound"][k] = bound
        self._built.update((pk, k) for k in todo)
        state["seconds"]["compile"] += time.perf_counter() - t0

    def _compile_in_workers(self, bench: ConvBench, cfgs: list) -> None:
        """Bind ``cfgs`` in ``jobs`` worker processes (spawned once, kept for the tuner's life), each
        with its own context on this device: their builds land in the on-disk binary cache.
        (Some drivers, PoCL among them, serialise compiles within a process.)"""
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn"))
        spec = device_spec(self.rt.device)
        parts = [cfgs[i::self.jobs] for i in range(self.jobs)]
        try:
            list(self._pool.map(_worker_bind, *zip(*[(spec, bench.node, self.batch, self.precision, p, self.mma)
                                                      for p in parts if p])))
        except Exception as e:      # noqa: BLE001 - e.g. a worker the driver killed: bind here instead
            log.warning("parallel compile failed (%s: %s); compiling in this process", type(e).__name__, reason(e))
            self.close()
            self.build = "threads"

    def close(self) -> None:
        """Stop the compile workers (if any)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def expired(self) -> bool:
        """True once ``deadline`` (a ``time.perf_counter()`` value, or None) has passed: a search then
        stops timing new candidates and keeps the best it has (``yolo-cl tune --budget``)."""
        return self.deadline is not None and time.perf_counter() > self.deadline

    def measure(self, bench: ConvBench, cfg: dict, reps: int, state: dict) -> float:
        """Check then time one candidate (fastest of ``reps`` runs, ms); inf if it fails to build,
        bind or match the reference. ``state`` (``search.new_state()``) keeps what was bound,
        checked and timed, so a candidate is checked once however often it is timed."""
        key = config_key(cfg)
        if key in state["launches"]:
            launches = state["launches"][key]
            if launches is None:
                return math.inf
        else:
            t0 = time.perf_counter()
            launches = state["bound"].pop(key) if key in state["bound"] else self._bind(bench, cfg)
            t1 = time.perf_counter()
            if isinstance(launches, str):
                launches, err = None, launches
            else:
                try:
                    err = bench.check(launches)
                except Exception as e:       # noqa: BLE001 - e.g. a launch the device refuses
                    launches, err = None, reason(e)
            state["seconds"]["compile"] += t1 - t0
            state["seconds"]["check"] += time.perf_counter() - t1
            if launches is None or err > self.tol:
                log.debug("config %s rejected: %s", cfg, err if launches is None else f"relative error {err:.3g}")
                state["rejected"] += 1
                launches = None
            state["launches"][key] = launches
            if launches is None:
                return math.inf
            state["timed"].add(key)
        t0 = time.perf_counter()
        ms = bench.time(launches, reps, self.clock)
        state["seconds"]["time"] += time.perf_counter() - t0
        state["times"][key] = min(ms, state["times"].get(key, math.inf))
        if self.progress:
            self.progress(1)
        return ms

    def search(self, node: Node, input_channels_last: bool = False) -> TuneResult:
        """Guided search: time at most ``fraction`` of the legal candidates (``search.guided``);
        ``input_channels_last``: see :class:`ConvBench`."""
        t0 = time.perf_counter()
        cands = self.candidates(node)
        bench = ConvBench(self.rt, node, self.batch, self.precision, self.queue, self.seed, mma=self.mma,
                          input_channels_last=input_channels_last)
        state = new_state()
        n = len(cands)
        budget = max(1, int(self.fraction * n)) if n > 1 else 1
        timed = search.guided(cands, lambda c: family.cost(node, c, self.batch, self.rt),
                              lambda c, reps: self.measure(bench, c, reps, state),
                              lambda cfgs: self._bind_many(bench, cfgs, state), state, budget, self.reps,
                              self.jobs, self.expired, self.keys)
        return self._finish(node, bench, timed, state, n, t0)

    def traverse(self, node: Node, input_channels_last: bool = False) -> TuneResult:
        """Full traversal: check and time every legal candidate (the baseline the search is judged by)."""
        t0 = time.perf_counter()
        cands = self.candidates(node)
        bench = ConvBench(self.rt, node, self.batch, self.precision, self.queue, self.seed, mma=self.mma,
                          input_channels_last=input_channels_last)
        state = new_state()
        timed = {}
        for i in range(0, len(cands), TRAVERSE_CHUNK):
            if self.expired():
                break
            chunk = cands[i:i + TRAVERSE_CHUNK]
            self._bind_many(bench, chunk, state)
            for c in chunk:
                timed[config_key(c)] = (self.measure(bench, c, self.reps, state), c)
        return self._finish(node, bench, timed, state, len(cands), t0)

    def _finish(self, node: Node, bench: ConvBench, timed: dict, state: dict, n: int, t0: float) -> TuneResult:
        """The best of the finalists after successive halving (``search.finish``); the heuristic if none passed."""
        finalists = search.finish(timed, lambda c, reps: self.measure(bench, c, reps, state))
        if not finalists:
            cfg = family.heuristic(node, self.rt, self.batch, self.precision, self.mma)
            return TuneResult(shape_key(node, self.batch), cfg, math.inf, node.flops * self.batch, n,
                              len(state["timed"]), state["rejected"], time.perf_counter() - t0)
        best = finalists[0]
        ms = state["times"][config_key(best)]
        return TuneResult(shape_key(node, self.batch), best, ms, node.flops * self.batch, n, len(state["timed"]),
                          state["rejected"], time.perf_counter() - t0, dict(state["times"]), dict(state["seconds"]))

    # -- whole networks -----------------------------------------------------------------------
    def unique_convs(self, graph) -> list:
        """One conv node per shape key, in graph order."""
        seen, out = set(), []
        for node in graph.nodes:
            if node.op != "conv":
                continue
            k = shape_key(node, self.batch)
            if k not in seen:
                seen.add(k)
                out.append(node)
        return out

    def tune_graph(self, graph, budget_s: Optional[float] = None, exhaustive: bool = False) -> list:
        """Tune every unique conv shape (largest FLOPs first, so a time budget goes where it pays),
        each timed as most convs of its shape sit in the network (:func:`inputs_channels_last`)."""
        nodes = sorted(self.unique_convs(graph), key=lambda n: -n.flops)
        last = inputs_channels_last(graph, self.batch)
        results = []
        t0 = time.perf_counter()
        for node in nodes:
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                log.warning("tuning budget of %.0f s spent: %d of %d shapes left on the heuristic",
                            budget_s, len(nodes) - len(results), len(nodes))
                break
            flag = last[shape_key(node, self.batch)]
            results.append(self.traverse(node, flag) if exhaustive else self.search(node, flag))
        return results


def inputs_channels_last(graph, batch: int) -> dict:
    """{shape key: whether most convs of that shape read an input that a conv writes for them
    alone (``layout.sole_conv_edges``): one the network stores channels-last where the conv
    reads it so}."""
    edges = layout.sole_conv_edges(graph)
    votes: dict = {}
    for node in graph.nodes:
        if node.op == "conv":
            votes.setdefault(shape_key(node, batch), []).append(node.inputs[0].tensor.id in edges)
    return {k: 2 * sum(v) > len(v) for k, v in votes.items()}


_WORKER: dict = {}      # in a compile worker: its runtime, and the bench of the shape it last bound


def _worker_bind(device: str, node: Node, batch: int, precision: Precision, cfgs: list, mma: str = "") -> int:
    """In a compile worker process: bind (and so build into the binary cache) and run once each config."""
    from .runtime import Runtime
    if "rt" not in _WORKER:
        _WORKER["rt"] = Runtime(device)
    rt = _WORKER["rt"]
    key = _program_key(node, batch, precision, mma)
    if _WORKER.get("key") != key:
        _WORKER["bench"] = None         # free the last shape's buffers first
        _WORKER["bench"] = ConvBench(rt, node, batch, precision, rt.queue, reference=False, mma=mma)
        _WORKER["key"] = key
    bench = _WORKER["bench"]
    for c in cfgs:
        launches = Tuner._bind(bench, c)
        if isinstance(launches, str):
            continue
        try:        # a first run: PoCL generates the code per work-group size then, into its disk cache
            for l in launches:
                rt.cl.enqueue_nd_range_kernel(rt.queue, l.kernel, l.gsize, l.lsize)
            rt.queue.finish()
        except Exception:       # noqa: BLE001 - the main process's check reports it
            pass
    return len(cfgs)


def _program_key(node: Node, batch: int, precision: Precision, mma: str = "") -> tuple:
    """What, besides the config, decides which programs binding a conv builds."""
    a = node.attrs
    w = a.get("write_through")
    return (shape_key(node, batch), a.get("activation"), a.get("activation2"), a.get("residual") is not None,
            precision.half, mma, None if w is None else (w.op, w.output.h, w.output.w), a.get("write_keeps"))


def device_spec(device) -> str:
    """The "P:D" index of ``device`` (for another process to open the same one)."""
    from .runtime import list_devices
    for pi, di, _, d in list_devices():
        if d == device:
            return f"{pi}:{di}"
    return device.name


