"""Kernel configs per (device, layer shape, precision, batch): the tuning database and the tuner.

Inference only *reads* tuned configs (``TuningDatabase.conv_config``); tuning runs when asked
(``yolo-cl tune``, :class:`Tuner`).

Database. YAML files hold *records*, one per (device name, driver, vendor, device type,
precision), each mapping shape keys to configs. The shipped files are ``configs/*.yaml``
(devices we have tuned); new tunings go to the user cache ``cache_dir()/tuning.yaml``.
A look-up falls back level by level, as CLBlast's does:

    0 device name + driver version  (exact)
    1 device name, another driver   (used, but marked stale: ``yolo-cl tune`` re-validates it)
    2 vendor + device type
    3 device type
    -> the family's heuristic (conv.heuristic_config)

Within a level the user cache wins over the shipped files. Spatial size is bucketed (N, the
output pixels, rounded up to a power of two) and a miss tries the neighbouring buckets, so a
new input size does not force a retune. A config that is illegal for the actual shape (e.g. a
work-group width that does not divide it) is skipped. A corrupt file is a warning, then ignored;
writes merge into the current file under an ``fcntl`` lock and land atomically.

Tuner. For each unique shape key it enumerates the device family's legal configs, orders
them with the family's cost model and times at most a quarter of them: the cost model's
best per (algorithm, kernel) group, then neighbours of the fastest, then a successive-halving
re-timing of the finalists. Every candidate is checked against a NumPy convolution before it
is timed (relative error 1e-4 fp32, 1e-2 fp16) and timed with OpenCL profiling events.
"""
from __future__ import annotations

import copy
import itertools
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np

from .errors import YoloClError, reason
from .graph import Node, Tensor, View
from .kernels import BindContext, conv_gemm_shape
from .kernels import conv as convk
from .kernels import gemm_cpu, gemm_local, gemm_mma
from .resources import resource_dir
from .runtime import atomic_write, cache_dir

log = logging.getLogger("yolo_cl.tuner")

DB_VERSION = 1
LEVELS = ("device+driver", "device", "vendor", "type")
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "tf32": 2e-2}
TIMED_FRACTION = 0.25
BUILDS = ("processes", "threads")
TRAVERSE_CHUNK = 256        # candidates a traversal binds (compiles) in parallel before timing them
CLOCKS = ("events", "cpu")
_WARNED: set = set()
_PARSED: dict = {}         # path -> ((size, mtime, inode), records): see read_db


# -- keys ---------------------------------------------------------------------------------
def n_bucket(n: int) -> int:
    """Output pixels rounded up to a power of two."""
    return 1 << max(0, int(n - 1).bit_length())


def shape_key(node: Node, batch: int = 1, n: Optional[int] = None) -> str:
    """What a conv's best config depends on, with the spatial size bucketed."""
    a = node.attrs
    nb = n_bucket(node.output.h * node.output.w) if n is None else n
    return (f"k{a['size']} s{a['stride_x']}x{a['stride_y']} d{a['dilation']} g{a['groups']} "
            f"c{a['in_c']} f{a['filters']} n{nb} b{batch}")


# A miss tries the buckets with twice and half the pixels, no further: on PoCL a config tuned for
# 4x fewer pixels ran 4.6x slower than the best on yolov3-tiny's last 3x3 conv (recordings).
NEIGHBOUR_BUCKETS = 1


def _neighbour_keys(node: Node, batch: int) -> list:
    nb = n_bucket(node.output.h * node.output.w)
    keys = []
    for step in range(1, NEIGHBOUR_BUCKETS + 1):
        keys += [shape_key(node, batch, nb << step), shape_key(node, batch, max(1, nb >> step))]
    return list(dict.fromkeys(k for k in keys if k != shape_key(node, batch)))


@dataclass(frozen=True)
class DeviceId:
    """The identity a record is filed under."""

    device: str
    driver: str
    vendor: str
    type: str
    precision: str

    @classmethod
    def of(cls, rt, precision: str) -> "DeviceId":
        return cls(rt.device_name, rt.driver, rt.vendor, rt.device_type, precision)

    def matches(self, rec: dict, level: int) -> bool:
        if rec.get("precision") != self.precision or rec.get("type") != self.type:
            return False
        if level == 0:
            return rec.get("device") == self.device and rec.get("driver") == self.driver
        if level == 1:
            return rec.get("device") == self.device and rec.get("driver") != self.driver
        if level == 2:
            return rec.get("vendor") == self.vendor and rec.get("device") != self.device
        return rec.get("vendor") != self.vendor

    def header(self) -> dict:
        return {"device": self.device, "driver": self.driver, "vendor": self.vendor, "type": self.type,
                "precision": self.precision}


# -- files --------------------------------------------------------------------------------
def user_db_path() -> Path:
    return cache_dir() / "tuning.yaml"


def shipped_db_paths() -> list:
    """The tuning files that ship with yolo-cl; none with ``YOLO_CL_NO_SHIPPED_TUNING=1`` (to see
    what the user cache and the heuristic alone give, e.g. on a device nobody has tuned)."""
    if os.environ.get("YOLO_CL_NO_SHIPPED_TUNING", "").strip() == "1":
        return []
    root = resource_dir("configs")
    return sorted(root.glob("*.yaml")) if root.is_dir() else []


MAX_DB_BYTES = 4 << 20      # ~40000 tuned shapes; a 20 MiB file took 98 s and 1.5 GB to parse


def read_db(path: Path) -> list:
    """The records of one database file; a missing file is empty; a corrupt one, or one over
    MAX_DB_BYTES, warns once and is empty. Parsed files are kept by (size, mtime), so a second
    Detector in the same process does not parse the database again."""
    import yaml
    from .userfiles import read_bytes
    path = Path(path)
    try:
        st = path.stat()
    except (OSError, ValueError):
        return []
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    cached = _PARSED.get(str(path))
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        text = read_bytes(path, "tuning database", MAX_DB_BYTES).decode()
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))   # libyaml: 10x
    except YoloClError as e:
        _warn_once(f"corrupt:{path}", f"{e}; ignoring it (run 'yolo-cl tune --db' with a new file)")
        return []
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        _warn_once(f"corrupt:{path}", f"tuning database {path} is unreadable ({str(e).splitlines()[0][:120]}); "
                                      f"ignoring it")
        return []
    if data is None:
        return []
    recs = data.get("records") if isinstance(data, dict) else None
    if not isinstance(recs, list) or not all(isinstance(r, dict) and isinstance(r.get("configs"), dict)
                                             for r in recs):
        _warn_once(f"corrupt:{path}", f"tuning database {path} is not a yolo-cl tuning file; ignoring it")
        return []
    _PARSED[str(path)] = (stamp, recs)
    return recs


def check_db_writable(path: Path) -> None:
    """Refuse, before tuning, a database file that merging would lose (over MAX_DB_BYTES)."""
    try:
        size = Path(path).stat().st_size
    except OSError:
        return
    if size > MAX_DB_BYTES:
        raise YoloClError(f"{path}: tuning database is {size} bytes, more than the {MAX_DB_BYTES} byte limit; "
                          f"give another --db file")


def merge_records(old: list, new: list) -> list:
    """``old`` with ``new`` folded in: same identity -> configs merged (new wins), else appended."""
    out = copy.deepcopy(old)
    ident = ("device", "driver", "vendor", "type", "precision")
    for rec in new:
        same = next((r for r in out if all(r.get(k) == rec.get(k) for k in ident)), None)
        if same is None:
            out.append(copy.deepcopy(rec))
        else:
            same["configs"].update(copy.deepcopy(rec["configs"]))
    return out


def write_db(path: Path, records: list) -> None:
    """Merge ``records`` into the file at ``path`` under an exclusive lock; the write is atomic.

    Concurrent tuners each lock, re-read what is there now, merge and replace, so none loses
    another's entries and a reader never sees half a file.
    """
    import fcntl
    import yaml
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            check_db_writable(path)
            merged = merge_records(read_db(path), records)
            text = "# yolo-cl tuning database: tuned kernel configs per device, layer shape and precision.\n" + \
                yaml.safe_dump({"version": DB_VERSION, "records": merged}, sort_keys=False, default_flow_style=None,
                               width=200)
            atomic_write(path, text.encode())
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _warn_once(key: str, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(msg)


# -- the database -------------------------------------------------------------------------
def _config_fits(node: Node, config: dict, rt) -> bool:
    """Whether a stored config is one this device's family can run on ``node``'s exact shape."""
    if not isinstance(config, dict) or "algo" not in config:
        return False
    fam = config.get("family")
    if config["algo"] == "depthwise":
        return convk.is_depthwise(node)
    try:
        if fam == gemm_cpu.FAMILY:
            M, N, K, _ = gemm_cpu.gemm_shape(node, config)
            return (config["algo"] in gemm_cpu.conv_algos(node)
                    and gemm_cpu.why_illegal(config, M, N, K, gemm_cpu.max_work_group(rt)) is None
                    and gemm_cpu.conv_illegal(node, config) is None)
        if fam == gemm_local.FAMILY:
            return config["algo"] in gemm_local.conv_algos(node) + ["winograd"]
        if fam == gemm_mma.FAMILY:
            return config["algo"] in gemm_mma.conv_algos(node)
    except (KeyError, TypeError, ValueError):
        return False
    return False


class TuningDatabase:
    """Tuned conv configs for one device and precision, with hierarchical fall-back."""

    def __init__(self, rt, precision: str = "fp32", paths: Optional[list] = None,
                 user_path: Optional[Path] = None, mma: str = "") -> None:
        """``mma``: the tensor-core mode in use ("" = none); then only configs of the mma family
        (and depthwise ones) are looked up, since FMA configs tuned for this precision do not compete."""
        self.rt = rt
        self.mma = mma
        self.precision = precision
        self.id = DeviceId.of(rt, precision)
        self.user_path = Path(user_path) if user_path is not None else user_db_path()
        shipped = shipped_db_paths() if paths is None else [Path(p) for p in paths]
        self.sources = [self.user_path] + [p for p in shipped if p != self.user_path]
        self.records = [(p, r) for p in self.sources for r in read_db(p)]
        self.origin: dict = {}        # shape key -> (level name, file) of the last look-up
        self.stale: dict = {}         # shape key -> config found only under another driver

    @classmethod
    def for_runtime(cls, rt, precision: str = "fp32", mma: str = "") -> "TuningDatabase":
        return cls(rt, precision, mma=mma)

    def lookup(self, node: Node, batch: int = 1) -> Optional[dict]:
        """The stored config for ``node`` (a copy), or None; records where it came from."""
        key = shape_key(node, batch)
        keys = [key] + _neighbour_keys(node, batch)
        for level in range(len(LEVELS)):
            for path, rec in self.records:
                if not self.id.matches(rec, level):
                    continue
                for k in keys:
                    cfg = rec["configs"].get(k)
                    if cfg is None:
                        continue
                    cfg = {kk: v for kk, v in cfg.items() if kk not in ("ms", "gflops")} \
                        if isinstance(cfg, dict) else cfg
                    if not _config_fits(node, cfg, self.rt) or \
                            (self.mma and cfg.get("family") in (gemm_local.FAMILY, gemm_cpu.FAMILY)):
                        continue
                    self.origin[key] = (LEVELS[level], str(path))
                    if level == 1:
                        self.stale[key] = cfg
                        _warn_once(f"stale:{self.id.device}:{rec.get('driver')}",
                                   f"tuned configs for {self.id.device} come from driver {rec.get('driver')}, "
                                   f"this is {self.id.driver}: using them; run 'yolo-cl tune' to re-validate")
                    return dict(cfg)
        return None

    def lookup_key(self, key: str, max_level: int = 1) -> Optional[dict]:
        """A config stored under ``key`` for this device (levels 0..max_level: by default the same
        device name, any driver), without timing fields; None if absent. For non-conv users
        (``yolo_cl.ops``), which check the config against their own candidates."""
        for level in range(max_level + 1):
            for _, rec in self.records:
                cfg = rec["configs"].get(key) if self.id.matches(rec, level) else None
                if isinstance(cfg, dict):
                    return {k: v for k, v in cfg.items() if k not in ("ms", "gflops")}
        return None

    def conv_config(self, node: Node, batch: int = 1) -> dict:
        """The config the executor binds: tuned if known at some level, else the heuristic."""
        cfg = self.lookup(node, batch)
        if cfg is None:
            self.origin[shape_key(node, batch)] = ("heuristic", "")
            return convk.heuristic_config(node, self.rt.is_cpu, batch, self.precision == "fp16", self.mma)
        return cfg

    def record(self, entries: dict, path: Optional[Path] = None) -> Path:
        """Store {shape key: config} for this device, driver and precision (merged, locked, atomic)."""
        path = Path(path) if path is not None else self.user_path
        write_db(path, [{**self.id.header(), "configs": entries}])
        self.records = [(p, r) for p in self.sources for r in read_db(p)]
        if path not in self.sources:
            self.sources.append(path)
            self.records += [(path, r) for r in read_db(path)]
        for k in entries:
            self.stale.pop(k, None)
        return path


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
    random ones.
    """

    def __init__(self, rt, node: Node, batch: int, half: bool, queue, seed: int = 0, reference: bool = True,
                 mma: str = "") -> None:
        self.rt, self.batch, self.half, self.queue = rt, batch, half, queue
        rng = np.random.default_rng(seed)
        a = dict(node.attrs)
        a.pop("read_through", None)        # a folded producer's input is not part of this bench
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
        self.node = Node("conv", list(node.layers), [View(tin, 0, x0.c)], View(tout, 1, o0.c), a, node.flops)
        offsets, total = {}, 0
        for t in tensors:
            offsets[t.id] = total
            total += -(-t.size * batch // 64) * 64
        item = 2 if half else 4
        self.dtype = np.float16 if half else np.float32
        self.arena = rt.alloc(total * item, "tuner arena")
        ws = max(convk.workspace_elems(self.node, batch), gemm_cpu.workspace_elems(self.node, batch))
        self.ctx = BindContext(rt, self.arena, _Plan(offsets), batch, half, mma=mma)
        self.ctx.workspace = rt.alloc(ws * item, "tuner workspace") if ws else self.arena
        self.offsets, self.tensors, self.total = offsets, tensors, total
        x = rng.standard_normal((batch, x0.c, x0.h, x0.w)).astype(np.float32)
        r = rng.standard_normal((batch, o0.c, o0.h, o0.w)).astype(np.float32) if res is not None else None
        self.x, self.r = x.astype(self.dtype).astype(np.float32), None if r is None else \
            r.astype(self.dtype).astype(np.float32)
        # float32 is plenty for a 1e-4 relative gate, and 5-10x faster to compare than float64
        self.ref = reference_conv(self.x, self.node, self.r).astype(np.float32) if reference else None
        self._out = np.empty(tout.size * batch, self.dtype)
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
        return convk.bind(self.ctx, self.node, config)

    def check(self, launches: list) -> float:
        """Run once on poisoned output memory; relative error vs NumPy (inf if it wrote outside its slice)."""
        self._upload()
        for l in launches:
            self.rt.cl.enqueue_nd_range_kernel(self.queue, l.kernel, l.gsize, l.lsize)
        self.rt.cl.enqueue_copy(self.queue, self._out, self.arena, src_offset=self.offsets[1] * self.ctx.itemsize)
        self.queue.finish()
        t = self.tensors[1]
        out = self._out.astype(np.float32, copy=False).reshape(self.batch, t.c, t.h, t.w)
        if not (np.isnan(out[:, 0]).all() and np.isnan(out[:, -1]).all()):
            return math.inf
        return rel_error(out[:, 1:-1], self.ref)

    def time(self, launches: list, reps: int, clock: str = "events") -> float:
        """Fastest of ``reps`` runs in milliseconds.

        ``events``: device time, the sum of the launches' OpenCL profiling events, over one
        warm-up run and then ``reps`` runs enqueued back to back with a single wait, so no timed
        run starts on a GPU left idle by a host round trip (a bind, a check). Kernels of 15-30 us
        timed once per round trip varied by up to 20% between two timings on an H200, enough to
        rank a config above one that is faster; in live searches re-timed against the traversal
        (BENCHMARKS.md) the winners' spread fell from 0.954-1.047 to 0.983-1.016.

        ``cpu``: the process's CPU time over the run divided by the device's compute units -- for
        a CPU device in this process (PoCL) on a machine shared with other work, where wall-clock
        device time mostly measures the other work; it does not see idle threads, so it flatters
        launches with too few work-groups.
        """
        cl = self.rt.cl
        if clock == "events":
            runs = [[cl.enqueue_nd_range_kernel(self.queue, l.kernel, l.gsize, l.lsize) for l in launches]
                    for _ in range(reps + 1)]
            self.queue.finish()
            return min(sum(e.profile.end - e.profile.start for e in evs) for evs in runs[1:]) * 1e-6
        best = math.inf
        units = max(1, int(self.rt.device.max_compute_units))
        for _ in range(reps):
            c0 = time.process_time()
            for l in launches:
                cl.enqueue_nd_range_kernel(self.queue, l.kernel, l.gsize, l.lsize)
            self.queue.finish()
            best = min(best, (time.process_time() - c0) * 1e3 / units)
        return best


# -- search -------------------------------------------------------------------------------
def _cost_fn(node: Node, batch: int, rt) -> Callable:
    """The family's cost model for ordering candidates (lower = try first)."""
    def cost(cfg: dict) -> float:
        if cfg.get("family") == gemm_cpu.FAMILY:
            return gemm_cpu.conv_cost(node, cfg, batch)
        if cfg.get("family") == gemm_local.FAMILY:
            return _local_cost(node, cfg, batch, rt)
        if cfg.get("family") == gemm_mma.FAMILY:     # same tile economics, warps instead of work-items
            return _local_cost(node, cfg, batch, rt)
        return 0.0
    return cost


def _local_cost(node: Node, cfg: dict, batch: int, rt) -> float:
    """A coarse prior for the GPU family: padding waste, occupancy, tile size, one pass saved by no im2col."""
    if cfg["algo"] == "winograd":
        M, N, K, Z = convk.winograd.gemm_shape(node, cfg.get("m", 2))     # Z = T2 GEMMs in one launch
    else:
        M, N, K, Z = conv_gemm_shape(node)                                # Z = conv groups
    work = Z * M * N * K * batch
    waste = gemm_local.waste(cfg, M, N)
    groups = -(-M // cfg["MWG"]) * -(-N // cfg["NWG"]) * Z * batch * gemm_local.split_k(cfg)
    units = int(rt.device.max_compute_units)
    fill = min(1.0, groups / (2 * units))
    tile = (cfg["MWG"] * cfg["NWG"]) ** 0.5
    reuse = 1.0 + 16.0 / tile + (0.0 if cfg.get("SA", 1) and cfg.get("SB", 1) else 0.3)
    extra = (1.1 if cfg["algo"] == "im2col" else 1.0) * (1.05 if gemm_local.split_k(cfg) > 1 else 1.0)
    return work / max(fill, 1e-3) / (1 - waste + 1e-6) * reuse * extra


def _tunables(cfg: dict) -> dict:
    """The knobs a neighbour step may turn: not the family, nor what the GPU family derives from
    the tile and work-group (its vector widths), or a step from one work-group shape to the next
    would change three keys and never count as a neighbour."""
    return {k: v for k, v in cfg.items() if k not in ("family",) + gemm_local.DERIVED}


SEED_SHARE = 0.5            # share of the search budget spent on per-group seeds, the rest near the best
SCHEDULE_KEYS = ("KU", "WG", "ORD", "PF")   # knobs that do not change the register block or tiles
# The local phase walks around this many of the fastest configs so far. Four, not two: a second
# basin (another Winograd tile, another vector shape) a little slower after the seeds still gets
# explored. Replayed on the 66 recorded shapes (tools/recordings): 61 -> 62 within 5% at a quarter
# timed, worst 1.391 -> 1.070; at 15% timed 56 -> 60, worst 1.672 -> 1.334.
ANCHORS = 4


def _neighbours(cfg: dict, pool: list) -> tuple:
    """(siblings, neighbours) of ``cfg`` in ``pool``: siblings share everything but the schedule
    knobs (k unroll, work-group, prefetch), neighbours differ in exactly one other tunable."""
    base = _tunables(cfg)
    sib, near = [], []
    for c in pool:
        t = _tunables(c)
        if t.keys() != base.keys() or t == base:
            continue
        diff = [k for k in base if t[k] != base[k]]
        if all(k in SCHEDULE_KEYS for k in diff):
            sib.append(c)
        elif len(diff) == 1:
            near.append(c)
    return sib, near


def _diverse(ranked: list) -> list:
    """``ranked`` reordered so the cheapest config of each vector shape (VW x NV on a CPU) or tile
    (MWG x NWG on a GPU) comes first, in cost order, then the rest: the seeds then cover shapes
    the cost model ranks close together instead of several variants of its one favourite.
    (Replayed on the PoCL recordings: yolov4 256 from 29 to 34 of 37 shapes within 5%, network
    1.038 -> 1.024; yolov3-tiny 1.000 -> 1.007, one shape at 1.061.)"""
    seen, first, rest = set(), [], []
    for c in ranked:
        shape = tuple(c.get(k) for k in ("VW", "NV", "MWG", "NWG", "m"))
        (rest if shape in seen else first).append(c)
        seen.add(shape)
    return first + rest


def _group(cfg: dict) -> tuple:
    return cfg.get("family"), cfg.get("algo"), cfg.get("kernel", cfg.get("m"))


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

    def __init__(self, rt, precision: str = "fp32", batch: int = 1, fraction: float = TIMED_FRACTION,
                 reps: int = 2, progress: Optional[Callable] = None, seed: int = 0, clock: str = "events",
                 jobs: Optional[int] = None, build: str = "processes") -> None:
        if clock not in CLOCKS:
            raise YoloClError(f"clock '{clock}' is not one of {', '.join(CLOCKS)}")
        if clock == "cpu" and not rt.is_cpu:
            raise YoloClError("the cpu clock only measures CPU devices")
        if build not in BUILDS:
            raise YoloClError(f"build '{build}' is not one of {', '.join(BUILDS)}")
        self.rt, self.precision, self.batch, self.clock = rt, precision, batch, clock
        self.half = precision == "fp16"
        self.mma = gemm_mma.mode_for(rt, precision)     # tensor cores: the mma family alone is searched
        self.fraction, self.reps, self.seed = fraction, reps, seed
        self.progress = progress
        self.deadline: Optional[float] = None
        self.tol = TOLERANCE[gemm_mma.db_precision(precision, self.mma)]
        self.jobs = max(1, jobs if jobs is not None else min(16, os.cpu_count() or 1))
        # Worker processes compile into the on-disk binary cache, which this process then loads
        # from: without that cache they would compile for nothing.
        self.build = build if rt.binary_cache else "threads"
        self._pool = None
        self._built: set = set()        # (program key, config key) already built in this process
        cl = rt.cl
        self.queue = rt.queue if rt.profiling else cl.CommandQueue(
            rt.context, rt.device, properties=cl.command_queue_properties.PROFILING_ENABLE)

    # -- candidates ---------------------------------------------------------------------------
    def candidates(self, node: Node) -> list:
        if convk.is_depthwise(node):
            return [{"algo": "depthwise"}]
        if self.mma:
            return convk.gpu_candidates(node, self.rt, self.batch, self.mma)
        if self.rt.is_cpu:
            return gemm_cpu.candidates(node, self.rt, self.batch, self.half)
        return [c for c in convk.gpu_candidates(node, self.rt, self.batch)
                if not (self.half and c.get("algo") == "winograd" and c.get("m", 2) != 2)]

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
        pk = _program_key(bench.node, self.batch, self.half, self.mma)
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
            list(self._pool.map(_worker_bind, *zip(*[(spec, bench.node, self.batch, self.half, p, self.mma)
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

    def _measure(self, bench: ConvBench, cfg: dict, reps: int, state: dict) -> float:
        """Check then time one candidate; inf if it fails to build, bind or match the reference."""
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

    def search(self, node: Node) -> TuneResult:
        """Guided search: time at most ``fraction`` of the legal candidates (see module doc)."""
        t0 = time.perf_counter()
        cands = self.candidates(node)
        bench = ConvBench(self.rt, node, self.batch, self.half, self.queue, self.seed, mma=self.mma)
        state = new_state()
        n = len(cands)
        budget = max(1, int(self.fraction * n)) if n > 1 else 1
        # Keys, costs and neighbourhoods computed once: GPU spaces have ~4500 configs per shape,
        # and recomputing them per step cost more than the timings themselves.
        keys = {id(c): config_key(c) for c in cands}
        costs = {id(c): v for c, v in zip(cands, map(_cost_fn(node, self.batch, self.rt), cands))}
        cost = lambda c: costs[id(c)]         # noqa: E731
        ranked = sorted(cands, key=cost)
        timed: dict = {}
        hoods: dict = {}

        def around(c: dict) -> tuple:
            if keys[id(c)] not in hoods:
                hoods[keys[id(c)]] = _neighbours(c, cands)
            return hoods[keys[id(c)]]

        def try_(c: dict, reps: int) -> None:
            k = keys[id(c)]
            if k in timed or len(state["timed"]) >= budget and k not in state["timed"] or self.expired():
                return
            timed[k] = (self._measure(bench, c, reps, state), c)

        # 1. seeds: the cost model's best per (algorithm, kernel) group, round-robin.
        groups: dict = {}
        for c in ranked:
            groups.setdefault(_group(c), []).append(c)
        groups = {g: _diverse(cs) for g, cs in groups.items()}
        seeds = list(itertools.islice(_round_robin(list(groups.values())), max(1, int(SEED_SHARE * budget))))
        self._bind_many(bench, seeds, state)
        for c in seeds:
            try_(c, self.reps)
        # 2. around the fastest ANCHORS so far: their schedule siblings, then one-tunable neighbours,
        #    cheapest (by cost) first, until the budget is spent.
        for _ in range(budget):
            if len(state["timed"]) >= budget or self.expired():
                break
            best = sorted((v for v in timed.values() if v[0] < math.inf), key=lambda v: v[0])[:ANCHORS]
            hood = [around(b[1]) for b in best]
            fresh = lambda cs: [c for c in cs if keys[id(c)] not in timed]   # noqa: E731
            nb = fresh(c for sib, _ in hood for c in sib) or fresh(c for _, near in hood for c in near)
            if not nb:
                nb = fresh(ranked)
                if not nb:
                    break
            nb = sorted(nb, key=cost)
            if keys[id(nb[0])] not in state["bound"]:     # compile the next few ahead, in parallel
                self._bind_many(bench, nb[:min(self.jobs, budget - len(state["timed"]))], state)
            try_(nb[0], self.reps)
        result = self._finish(node, bench, timed, state, n, t0)
        return result

    def traverse(self, node: Node) -> TuneResult:
        """Full traversal: check and time every legal candidate (the baseline the search is judged by)."""
        t0 = time.perf_counter()
        cands = self.candidates(node)
        bench = ConvBench(self.rt, node, self.batch, self.half, self.queue, self.seed, mma=self.mma)
        state = new_state()
        timed = {}
        for i in range(0, len(cands), TRAVERSE_CHUNK):
            if self.expired():
                break
            chunk = cands[i:i + TRAVERSE_CHUNK]
            self._bind_many(bench, chunk, state)
            for c in chunk:
                timed[config_key(c)] = (self._measure(bench, c, self.reps, state), c)
        return self._finish(node, bench, timed, state, len(cands), t0)

    def _finish(self, node: Node, bench: ConvBench, timed: dict, state: dict, n: int, t0: float) -> TuneResult:
        """Successive halving over the finalists: re-time the best 4 with more runs, then the best 2."""
        ok = sorted((v for v in timed.values() if v[0] < math.inf), key=lambda v: v[0])
        if not ok:
            cfg = convk.heuristic_config(node, self.rt.is_cpu, self.batch, self.half, self.mma)
            return TuneResult(shape_key(node, self.batch), cfg, math.inf, node.flops * self.batch, n,
                              len(state["timed"]), state["rejected"], time.perf_counter() - t0)
        finalists = [c for _, c in ok[:4]]
        for keep, reps in ((4, 3), (2, 5)):
            finalists = finalists[:keep]
            scored = [(self._measure(bench, c, reps, state), c) for c in finalists]
            finalists = [c for _, c in sorted(scored, key=lambda v: v[0])]
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
        """Tune every unique conv shape (largest FLOPs first, so a time budget goes where it pays)."""
        nodes = sorted(self.unique_convs(graph), key=lambda n: -n.flops)
        results = []
        t0 = time.perf_counter()
        for node in nodes:
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                log.warning("tuning budget of %.0f s spent: %d of %d shapes left on the heuristic",
                            budget_s, len(nodes) - len(results), len(nodes))
                break
            results.append(self.traverse(node) if exhaustive else self.search(node))
        return results


_WORKER: dict = {}      # in a compile worker: its runtime, and the bench of the shape it last bound


def _worker_bind(device: str, node: Node, batch: int, half: bool, cfgs: list, mma: str = "") -> int:
    """In a compile worker process: bind (and so build into the binary cache) and run once each config."""
    from .runtime import Runtime
    if "rt" not in _WORKER:
        _WORKER["rt"] = Runtime(device)
    rt = _WORKER["rt"]
    key = _program_key(node, batch, half, mma)
    if _WORKER.get("key") != key:
        _WORKER["bench"] = None         # free the last shape's buffers first
        _WORKER["bench"] = ConvBench(rt, node, batch, half, rt.queue, reference=False, mma=mma)
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


def _program_key(node: Node, batch: int, half: bool, mma: str = "") -> tuple:
    """What, besides the config, decides which programs binding a conv builds."""
    a = node.attrs
    return shape_key(node, batch), a.get("activation"), a.get("activation2"), a.get("residual") is not None, half, mma


def device_spec(device) -> str:
    """The "P:D" index of ``device`` (for another process to open the same one)."""
    from .runtime import list_devices
    for pi, di, _, d in list_devices():
        if d == device:
            return f"{pi}:{di}"
    return device.name


def config_key(cfg: dict) -> str:
    """A config's identity in the tuner's tables (and in tools/tune_eval.py's recordings)."""
    return repr(sorted(cfg.items()))


def new_state() -> dict:
    """A search's bookkeeping: launches checked (None: rejected), bound ahead (launches or why
    not), keys timed, best times, rejections."""
    return {"launches": {}, "bound": {}, "timed": set(), "times": {}, "rejected": 0,
            "seconds": {"compile": 0.0, "check": 0.0, "time": 0.0}}


def _round_robin(lists: list) -> Iterable:
    for row in itertools.zip_longest(*lists):
        for c in row:
            if c is not None:
                yield c


def entries(results: list) -> dict:
    """Database entries {shape key: config + measured ms and GFLOP/s} from tuning results."""
    out = {}
    for r in results:
        if r.ms < math.inf:
            out[r.key] = {**r.config, "ms": round(r.ms, 4), "gflops": round(r.gflops, 2)}
    return out


def expected_timings(results: list) -> int:
    """How many timings ``search`` may make: its budget per shape (for progress bars)."""
    return sum(max(1, int(TIMED_FRACTION * r)) + 6 for r in results)


# -- the command line -------------------------------------------------------------------------
class ProgressBar:
    """Progress of a tuning run on stderr: tqdm's bar on a terminal; elsewhere (a log, CI) a plain
    line every ``interval`` seconds, so a long run is visibly alive without flooding the log."""

    def __init__(self, total: int, label: str, stream=None, interval: float = 30.0) -> None:
        import sys
        from tqdm import tqdm
        self.total, self.label, self.done = max(total, 1), label, 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval, self.t0 = interval, time.perf_counter()
        self._last = -math.inf                      # the first update prints at once
        self._bar = tqdm(total=self.total, desc=label, unit="timing", file=self.stream, leave=False,
                         dynamic_ncols=True) if self.tty else None

    def __call__(self, n: int = 1, label: Optional[str] = None) -> None:
        self.done = min(self.total, self.done + n)
        if label is not None:
            self.label = label
        if self._bar is not None:
            if label is not None:
                self._bar.set_description_str(label[:60], refresh=False)
            self._bar.update(n)
            return
        now = time.perf_counter()
        if now - self._last < self.interval and self.done < self.total:
            return
        self._last = now
        spent = now - self.t0
        eta = f", about {spent / self.done * (self.total - self.done):.0f} s left" if self.done else ""
        self.stream.write(f"tuning: {self.done}/{self.total} timings ({100 * self.done / self.total:.0f}%), "
                          f"{spent:.0f} s{eta}  {self.label}"[:200] + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def tune_model(model: str, size=None, batch: int = 1, precision: str = "fp32", device=None,
               budget_s: Optional[float] = None, db_path: Optional[str] = None, clock: str = "events",
               exhaustive: bool = False, progress: bool = True, out=None, jobs: Optional[int] = None) -> list:
    """Tune every conv shape of a model on one device and store the results (``yolo-cl tune``).

    Shapes already tuned for this device, driver and precision (under their own key) are kept;
    those found only under another driver or in a neighbouring bucket are tuned.
    """
    import sys
    from .cfg import parse_cfg
    from .graph import build_graph
    from .layers import build_layers, parse_net
    from .runtime import Runtime
    from .zoo import resolve
    out = out if out is not None else sys.stdout
    z = None if Path(model).is_file() else resolve(model)
    cfg_path = Path(model) if z is None else z[0]
    if z is None and not cfg_path.is_file():
        raise YoloClError(f"'{model}' is neither a cfg file nor a zoo model")
    sections = parse_cfg(cfg_path)
    net = parse_net(sections[0], size)
    graph = build_graph(net, build_layers(sections, net), None)
    rt = Runtime(device, profiling=True)
    tuner = Tuner(rt, precision, batch, clock=clock, jobs=jobs)
    db = TuningDatabase(rt, gemm_mma.db_precision(precision, tuner.mma), user_path=Path(db_path) if db_path else None,
                        mma=tuner.mma)
    nodes = sorted(tuner.unique_convs(graph), key=lambda n: -n.flops)
    todo = []
    for node in nodes:
        known = db.lookup_key(shape_key(node, batch), max_level=0)
        if (known is not None and _config_fits(node, known, rt)
                and (not tuner.mma or known.get("family") == gemm_mma.FAMILY)):
            continue        # tuned on this device and driver (a neighbouring bucket's entry does not count;
                            # with tensor cores in use, neither does an FMA family's)
        todo.append(node)
    print(f"tuning {model} {net.width}x{net.height} batch {batch} {precision} on {rt.device_name} "
          f"(driver {rt.driver}): {len(todo)} of {len(nodes)} conv shapes need tuning"
          + (f", budget {budget_s:.0f} s" if budget_s else ""), file=out, flush=True)
    if not todo:
        return []
    counts = [len(tuner.candidates(n)) for n in todo]
    total = sum((c if exhaustive else max(1, int(tuner.fraction * c))) + 6 for c in counts)   # + finalists
    bar = ProgressBar(total, "", sys.stderr) if progress else None
    tuner.progress = bar
    results, t0 = [], time.perf_counter()
    tuner.deadline = t0 + budget_s if budget_s is not None else None   # a shape in progress stops there too
    try:
        for node in todo:
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                log.warning("tuning budget of %.0f s spent: %d shapes left on the heuristic", budget_s,
                            len(todo) - len(results))
                break
            if bar:
                bar(0, f"layer {node.label} {node.describe()}")
            r = tuner.traverse(node) if exhaustive else tuner.search(node)
            results.append(r)
            db.record(entries([r]))          # saved shape by shape: an interrupted run keeps its work
    finally:
        tuner.close()
    if bar:
        bar.close()
    for r in results:
        print(f"  {r.key:<42} {r.ms:8.3f} ms {r.gflops:7.1f} GFLOP/s  timed {r.timed}/{r.candidates}  "
              f"{_short(r.config)}", file=out)
    print(f"saved {sum(r.ms < math.inf for r in results)} configs to {db.user_path}", file=out, flush=True)
    return results


def _short(cfg: dict) -> str:
    return " ".join(str(v) if k in ("family", "algo", "kernel") else f"{k}{v}" for k, v in cfg.items())
