"""``yolo-cl bench``: where the time goes, layer by layer, and how it compares with OpenCV DNN.

One run reports, for a model at a size, batch and precision on one device:
- per launch: device time (OpenCL profiling events, median over the runs), the algorithm and
  kernel config chosen, GFLOP/s and the share of the device's FMA peak;
- end to end: the wall time of ``Executor.run`` (upload, kernels, download) on the default path
  (a second executor of the same plan on a queue without profiling: a profiling queue and its
  per-launch events cost the host several microseconds a launch), the host overhead per frame
  (wall minus device time), and ``resident``: the plan alone with its input already on the device,
  enqueued and waited for -- what a CUDA graph's replay times, the like-for-like figure for a
  PyTorch peer;
- with ``compare="opencv"``: OpenCV DNN on the same network and weights in the same process,
  repetitions interleaved with ours (its OpenCL target on a GPU, its CPU backend on a CPU);
  ``compare="opencv-opencl"`` always uses its OpenCL target (on a CPU device: OpenCV's OpenCL
  kernels on the OpenCL CPU driver, e.g. PoCL, with OPENCV_DNN_OPENCL_ALLOW_ALL_DEVICES=1).

Zoo models without bundled weights get random ones (built in memory; written to a temporary
Darknet file only for OpenCV). The peak is measured once per device and driver with a small
FMA-throughput kernel and cached (``cache_dir()/peak.yaml``), or given by the caller.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from .errors import YoloClError
from .measure import event_ms, profiling_queue
from .precision import precision_named
from .weights import ConvParams, param_count, read_layer, save_weights

COMPARE = (None, "opencv", "opencv-opencl")   # opencv: the device's natural OpenCV target; -opencl: always OpenCL

PEAK_VERSION = 2       # bumped when the probe changes (v1 let NVIDIA drop half the lanes as dead code)
PEAK_SOURCE = """
__kernel void yc_fma_peak(__global float* out, const int iters, const float mv, const float cv) {
    VT a0 = (VT)(get_global_id(0) * 1e-9f), m = (VT)(mv), c = (VT)(cv);
    VT a1 = a0 + 1e-9f, a2 = a0 + 2e-9f, a3 = a0 + 3e-9f, a4 = a0 + 4e-9f, a5 = a0 + 5e-9f;
    VT a6 = a0 + 6e-9f, a7 = a0 + 7e-9f, a8 = a0 + 8e-9f, a9 = a0 + 9e-9f;
    for (int i = 0; i < iters; ++i) {   /* 10 independent chains hide the FMA latency */
        a0 = a0 * m + c; a1 = a1 * m + c; a2 = a2 * m + c; a3 = a3 * m + c; a4 = a4 * m + c;
        a5 = a5 * m + c; a6 = a6 * m + c; a7 = a7 * m + c; a8 = a8 * m + c; a9 = a9 * m + c;
    }
    VT s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9;
    float lanes[LANES], r = 0.0f;      /* every lane reaches the output: none is dead code */
    *(VT*)lanes = s;
    for (int i = 0; i < LANES; ++i) r += lanes[i];
    out[get_global_id(0)] = r;
}
"""


# -- peak -----------------------------------------------------------------------------------
def measure_peak(rt, seconds: float = 0.2) -> float:
    """The device's fp32 FMA throughput in GFLOP/s: best of a few runs of 10 independent FMA chains
    per work-item, in its native vector width, written ``a * b + c`` (some drivers compile the
    ``fma()`` builtin to a call). On a CPU device each run is also timed by the process's CPU time
    per compute unit, so other work on the machine does not lower the figure."""
    cl = rt.cl
    lanes = max(4, min(16, int(rt.device.native_vector_width_float or 4)))
    vt = f"float{max(lanes, 4)}"
    prg = cl.Program(rt.context, PEAK_SOURCE.replace("VT", vt)).build(options=f"-DLANES={lanes}")
    k = prg.yc_fma_peak
    units = int(rt.device.max_compute_units)
    n = units * (64 if rt.is_cpu else 2048)
    out = cl.Buffer(rt.context, cl.mem_flags.WRITE_ONLY, 4 * n)
    queue = profiling_queue(rt)
    iters, best = 256, 0.0
    for _ in range(12):
        k.set_args(out, np.int32(iters), np.float32(0.999999), np.float32(1e-7))
        c0 = time.process_time()
        ev = cl.enqueue_nd_range_kernel(queue, k, (n,), None)
        ev.wait()
        t = event_ms(ev) * 1e-3
        if rt.is_cpu:   # a shared CPU: also credit the CPU time this process got (see Tuner's cpu clock)
            t = min(t, (time.process_time() - c0) / units)
        best = max(best, n * iters * 10 * lanes * 2 / max(t, 1e-9) / 1e9)
        if t < seconds / 4:
            iters *= 2
    return best


def device_peak(rt, refresh: bool = False) -> tuple:
    """(GFLOP/s, 'measured' | 'cached'): the cached peak of this device and driver, measured if absent."""
    import yaml
    from .runtime import atomic_write, cache_dir
    from .userfiles import read_text
    path = cache_dir() / "peak.yaml"
    key = f"{rt.device_name} | {rt.driver} | {PEAK_VERSION}"
    data = {}
    try:
        loaded = yaml.safe_load(read_text(path, "peak cache", 1 << 20)) if path.is_file() else {}
        data = loaded if isinstance(loaded, dict) else {}
    except (YoloClError, yaml.YAMLError):
        data = {}
    v = data.get(key)
    if isinstance(v, (int, float)) and v > 0 and not refresh:
        return float(v), "cached"
    peak = measure_peak(rt)
    data[key] = round(peak, 1)
    try:
        atomic_write(path, yaml.safe_dump(data, sort_keys=True).encode())
    except OSError:
        pass
    return peak, "measured"


# -- random weights -------------------------------------------------------------------------
def random_params(layers: list, seed: int = 0) -> dict:
    """Parameters of every weighted layer for a speed run ({layer index: ConvParams}, as
    ``load_weights`` returns and ``weights.save_weights`` writes): random conv weights scaled a
    little below He's gain (1.2 / sqrt(fan-in) before rectifiers, 0.8 before linear), batch-norm
    statistics near identity, small biases, so activations stay finite through yolov4's residual
    stacks (with He's sqrt(2) they overflow to inf there, in OpenCV as here); small positive
    constants for the other weighted layers."""
    rng = np.random.default_rng(seed)
    out = {}
    f = np.float32
    for l in layers:
        if l.kind != "convolutional":
            if param_count(l):
                out[l.index] = read_layer(l, _filler, False)
            continue
        p = l.p
        n, cin = p["filters"], p["in_c"] // p["groups"]
        fan_in = cin * p["size"] ** 2
        gain = 1.2 if p["activation"] in ("leaky", "relu", "mish", "swish") else 0.8
        bias = (rng.standard_normal(n) * 0.05).astype(f)
        bn = (rng.uniform(0.8, 1.2, n).astype(f), (rng.standard_normal(n) * 0.05).astype(f),
              rng.uniform(0.8, 1.2, n).astype(f)) if p["bn"] else (None, None, None)
        w = (rng.standard_normal((n, cin, p["size"], p["size"])) * gain / math.sqrt(fan_in)).astype(f)
        out[l.index] = ConvParams(bias, w, *bn)
    return out


def _filler(n: int) -> np.ndarray:
    """A non-conv layer's parameter block for speed runs: small and positive (variances must be)."""
    return np.full(n, 1 / math.sqrt(n), np.float32)


# -- the report -----------------------------------------------------------------------------
def _on_tensor_cores(cfg: dict) -> bool:
    """Whether a launch's config belongs to a family that computes on tensor cores."""
    from .kernels.family import family_of
    try:
        return family_of(cfg).tensor_cores
    except ValueError:              # a launch of no family (a max-pool, a transpose)
        return False


@dataclass
class LaunchStat:
    """Median device time of one launch over the profiled runs."""

    node: str
    op: str
    name: str
    ms: float
    flops: int
    config: dict
    bytes: int = 0        # the least its node moves: inputs, weights and output (for the roofline)


def node_bytes(node, itemsize: int) -> int:
    """Bytes a node must at least read and write: its inputs, its weights and its output."""
    views = list(node.inputs) + [node.output]
    n = sum(v.c * v.h * v.w for v in views if hasattr(v, "c"))
    w = node.attrs.get("weights")
    return (n + (w.size if hasattr(w, "size") else 0)) * itemsize


def memory_bandwidth(rt, nbytes: int = 64 << 20, runs: int = 5) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read plus written), best of ``runs``."""
    cl = rt.cl
    src, dst = rt.alloc(nbytes, "bandwidth probe"), rt.alloc(nbytes, "bandwidth probe")
    queue = profiling_queue(rt)
    best = 0.0
    for _ in range(runs):
        ev = cl.enqueue_copy(queue, dst, src)
        ev.wait()
        best = max(best, 2 * nbytes / max(event_ms(ev) * 1e-3, 1e-9) / 1e9)
    src.release()
    dst.release()
    return best


@dataclass
class BenchReport:
    model: str
    size: tuple
    batch: int
    precision: str
    device: str
    platform: str
    driver: str
    device_type: str
    peak: float
    peak_source: str
    weights: str
    launches: list
    wall_ms: list
    device_ms: list
    cpu_ms: list = field(default_factory=list)
    tuned: dict = field(default_factory=dict)       # origin level -> conv node count
    opencv: Optional[dict] = None
    span_ms: list = field(default_factory=list)     # first kernel's start to last kernel's end, per run
    resident_ms: list = field(default_factory=list)  # the plan alone, input on the device, no profiling
    bandwidth: Optional[float] = None                # device memory GB/s (copy), for the roofline
    side: list = field(default_factory=list)         # layers the wall runs on a second queue (branches.py)

    @property
    def gflop(self) -> float:
        return sum(l.flops for l in self.launches) / 1e9

    def render(self) -> str:
        """The human-readable report."""
        lines = [f"yolo-cl bench: {self.model} {self.size[0]}x{self.size[1]} batch {self.batch} {self.precision} "
                 f"on {self.device} ({self.platform}, driver {self.driver}, {self.device_type})",
                 f"weights: {self.weights}; peak {self.peak:.1f} GFLOP/s ({self.peak_source}); conv configs: " +
                 ", ".join(f"{n} {k}" for k, n in sorted(self.tuned.items())),
                 "",
                 f"{'node':>8}  {'op':<24} {'kernel':<12} {'ms':>8} {'GFLOP/s':>8} {'%peak':>6}  config"]
        for l in self.launches:
            rate = l.flops / (l.ms * 1e6) if l.flops and l.ms > 0 else 0.0
            cfg = _config_text(l.config)
            lines.append(f"{l.node:>8}  {l.op[:24]:<24} {l.name[:12]:<12} {l.ms:>8.3f} "
                         f"{(f'{rate:.1f}' if rate else ''):>8} {(f'{100 * rate / self.peak:.1f}' if rate else ''):>6}"
                         f"  {cfg}")
        dev = float(np.median(self.device_ms))
        conv = sum(l.ms for l in self.launches if l.op.startswith("conv"))
        wall = float(np.median(self.wall_ms))
        lines += ["",
                  f"device time (sum of kernels, median): {dev:.2f} ms (convolutions {conv:.2f} ms, other "
                  f"{dev - conv:.2f} ms); {self.gflop / dev * 1e3 if dev else 0:.1f} GFLOP/s = "
                  f"{100 * self.gflop / dev * 1e3 / self.peak if dev else 0:.1f}% of peak",
                  f"end to end (Executor.run wall on the default queue, {len(self.wall_ms)} runs): median {wall:.2f} "
                  f"ms, min {min(self.wall_ms):.2f} ms; host overhead "
                  f"{float(np.median(np.subtract(self.wall_ms, self.device_ms))):.2f} ms/frame (wall - device)"]
        if self.span_ms:
            span = float(np.median(self.span_ms))
            lines.append(f"  of which between kernels (the driver starting each one): {span - dev:.2f} ms over "
                         f"{len(self.launches)} launches; outside the kernels' span (enqueue, copies, Python): "
                         f"{wall - span:.2f} ms")
        if self.resident_ms:
            lines.append(f"  resident (the plan alone, its input on the device: enqueue + wait, no profiling; what a "
                         f"CUDA graph's replay times): median {float(np.median(self.resident_ms)):.2f} ms")
        if self.side:
            lines.append(f"  the wall runs layers {', '.join(self.side)} (side branches) on a second queue beside "
                         "the rest; the device time is of one queue (YOLO_CL_BRANCHES=0 runs one queue)")
        kinds: dict = {}
        for l in self.launches:
            kinds[l.name] = kinds.get(l.name, 0) + 1
        lines.append(f"launches per frame: {len(self.launches)} (" +
                     ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])) + ")")
        cores = sorted({l.name for l in self.launches if l.flops and _on_tensor_cores(l.config)})
        if cores:
            lines.append(f"(the peak is the FMA units'; {', '.join(cores)} run on the tensor cores, whose rate is "
                         "several times higher, so their %peak may exceed 100)")
        if any(l.name.startswith("wino") for l in self.launches):
            lines.append("(GFLOP/s count a conv's direct-convolution FLOPs: Winograd does fewer multiplies, so its "
                         "rates are effective ones and may exceed the peak)")
        if self.cpu_ms:
            lines.append(f"process CPU time per run: median {float(np.median(self.cpu_ms)):.1f} ms")
        if self.opencv is not None:
            o = self.opencv
            ow = float(np.median(o["wall_ms"]))
            lines.append(f"OpenCV DNN {o['version']} ({o['target']}, interleaved): median {ow:.2f} ms, min "
                         f"{min(o['wall_ms']):.2f} ms" +
                         (f"; process CPU time median {float(np.median(o['cpu_ms'])):.1f} ms" if o.get("cpu_ms") else ""))
            lines.append(f"yolo-cl / OpenCV latency: {wall / ow:.3f} (median), {min(self.wall_ms) / min(o['wall_ms']):.3f} "
                         f"(min){'  -> yolo-cl is faster' if wall < ow else ''}")
            if self.cpu_ms and o.get("cpu_ms"):
                lines.append(f"yolo-cl / OpenCV CPU time: {float(np.median(self.cpu_ms)) / float(np.median(o['cpu_ms'])):.3f}")
            if o.get("layer_ms"):
                lines += [""] + self.layer_comparison()
        return "\n".join(lines)

    def layer_comparison(self) -> list:
        """Lines of the per-node table against OpenCV: our device ms (all launches of the node) next
        to OpenCV's ms for the same Darknet layers (its ``getPerfProfile``, median over the runs)."""
        o = self.opencv["layer_ms"]
        rows, seen = [], set()
        for l in self.launches:
            if rows and rows[-1][0] == l.node:
                rows[-1][2] += l.ms
                continue
            rows.append([l.node, l.op, l.ms])
        lines = ["per node against OpenCV (device ms; OpenCV's layers it fused into a neighbour count 0):",
                 f"{'node':>8}  {'op':<24} {'yolo-cl':>8} {'OpenCV':>8} {'ratio':>6}"]
        for node, op, ms in rows:
            idx = [int(i) for i in node.split("+")]
            seen.update(idx)
            ocv = sum(o.get(i, 0.0) for i in idx)
            lines.append(f"{node:>8}  {op[:24]:<24} {ms:>8.3f} {ocv:>8.3f} {(f'{ms / ocv:.2f}' if ocv > 0 else ''):>6}")
        rest = sum(v for k, v in o.items() if k not in seen)
        ours = sum(r[2] for r in rows)
        lines.append(f"{'':>8}  {'layers without a launch':<24} {0.0:>8.3f} {rest:>8.3f}")
        total = sum(o.values())
        lines.append(f"{'':>8}  {'total':<24} {ours:>8.3f} {total:>8.3f} {(f'{ours / total:.2f}' if total else ''):>6}")
        return lines


def _config_text(cfg: dict) -> str:
    """``cpu winograd nv m4 TM6 VW8 NV2 KU1 WG0``: names as words, tunables as name+value, and
    what the launch does beyond its conv as ``writes:upsample``, ``stores:nhwc``, ``reads:nhwc``."""
    words, marks = ("family", "algo", "kernel"), ("writes", "stores", "reads")
    head = [str(cfg[k]) for k in words if k in cfg]
    return " ".join(head + [f"{k}:{v}" if k in marks else f"{k}{v}" for k, v in cfg.items() if k not in words])


# -- running it -----------------------------------------------------------------------------
def run_bench(model: str, size=None, batch: int = 1, precision: str = "fp32", device=None,
              compare: Optional[str] = None, repeat: int = 20, weights: Optional[str] = None,
              peak: Optional[float] = None, warmup: int = 2, progress=None, plot: bool = False) -> BenchReport:
    """Benchmark ``model`` (zoo name or cfg path); see the module doc. ``plot`` also measures the
    device's memory bandwidth (``BenchReport.bandwidth``) for a roofline."""
    from .executor import Executor
    from .kernels.family import tuning_database
    from .kernels.gemm_mma import mode_for
    from .model import load_model
    from .runtime import Runtime

    precision = precision_named(precision)
    if compare not in COMPARE:
        raise YoloClError(f"--compare '{compare}' is not one of {', '.join(c for c in COMPARE if c)}")
    m = load_model(model, weights or None, size, params="optional", make_params=random_params)
    cfg_path, weights_path, net, layers, params, graph = m.cfg_path, m.weights_path, m.net, m.layers, m.params, m.graph
    wdesc = str(weights_path) if weights_path is not None else "random (bench.random_params, in memory)"

    rt = Runtime(device)                         # the wall: the default path, no profiling
    mma = mode_for(rt, precision)
    db = tuning_database(rt, precision, mma)
    ex = Executor(rt, graph, batch, precision, db, mma=mma)
    tuned: dict = {}
    for level, _ in db.origin.values():
        tuned[level] = tuned.get(level, 0) + 1
    the_peak, peak_src = (float(peak), "given") if peak else device_peak(rt)

    rng = np.random.default_rng(0)
    blob = rng.random((batch, net.channels, net.height, net.width), dtype=np.float32)
    ocv = opencv_net(cfg_path, weights_path, layers, params, rt.is_cpu and compare == "opencv", rt.is_cpu) \
        if compare else None
    for _ in range(warmup):
        ex.run(blob)
        if ocv is not None:
            ocv.run(blob)
    if ocv is not None:
        ocv.reset()
    wall, cpu, resident = [], [], []
    for i in range(repeat):                      # the wall, interleaved with OpenCV
        c0, t0 = time.process_time(), time.perf_counter()
        ex.run(blob)
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
        t0 = time.perf_counter()
        ex.enqueue()                             # the input is the run's: already in the arena
        rt.queue.finish()
        resident.append((time.perf_counter() - t0) * 1e3)
        if ocv is not None:
            ocv.run(blob)
        if progress:
            progress(i + 1, 2 * repeat)
    side = ex.side_layers
    del ex                                       # its memory, before the profiled plan's
    # Device times: the same plan again on a profiling queue, every launch with its event.
    prt = Runtime(rt.device, profiling=True)
    pex = Executor(prt, graph, batch, precision, db, mma=mma)       # the same records: the same plan
    for _ in range(warmup):
        pex.run(blob)
    dev, per, span = [], [], []
    for i in range(repeat):
        pex.run(blob, profile=True)
        times = pex.layer_times()
        if pex.events:
            span.append((pex.events[-1].profile.end - pex.events[0].profile.start) * 1e-6)   # first start to last end
        per.append([t.ms for t in times])
        dev.append(sum(t.ms for t in times))
        if progress:
            progress(repeat + i + 1, 2 * repeat)
    med = np.median(np.array(per), axis=0)
    item = precision.itemsize
    launches = [LaunchStat(t.label, t.op, t.name, float(m), t.flops, t.config, node_bytes(l.node, item))
                for t, m, l in zip(pex.layer_times(), med, pex.launches)]
    plat = rt.device.platform.name.strip()
    report = BenchReport(str(model), (net.width, net.height), batch, precision.name, rt.device_name, plat, rt.driver,
                         rt.device_type, the_peak, peak_src, wdesc, launches, wall, dev,
                         cpu if rt.is_cpu else [], tuned, span_ms=span, side=side, resident_ms=resident)
    if plot:
        report.bandwidth = memory_bandwidth(prt)
    if ocv is not None:
        report.opencv = ocv.summary(rt.is_cpu and ocv.target == "CPU backend")
        ocv.close()
    return report


class OpenCVNet:
    """OpenCV DNN on the same cfg and weights: its CPU backend for CPU devices, its OpenCL target otherwise."""

    def __init__(self, cfg: Path, weights: Path, cpu: bool, tmp: Optional[str], device_is_cpu: bool) -> None:
        if not cpu:
            os.environ.setdefault("OPENCV_DNN_OPENCL_ALLOW_ALL_DEVICES", "1")
            if device_is_cpu:
                os.environ.setdefault("OPENCV_OPENCL_DEVICE", ":CPU:")   # OpenCV's default is a GPU
        import cv2
        if not cpu:
            cv2.ocl.setUseOpenCL(True)
            if not cv2.ocl.haveOpenCL() or not cv2.ocl.Device.getDefault().name():
                raise YoloClError("OpenCV sees no OpenCL device: its ICD loader (libOpenCL.so) must find the "
                                  "driver (OCL_ICD_VENDORS: a folder of .icd files naming it by absolute path)")
        self.cv2 = cv2
        self.tmp = tmp
        self.net = cv2.dnn.readNetFromDarknet(str(cfg), str(weights))
        self.net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
        self.target = "CPU backend" if cpu else "OpenCL target"
        self.net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU if cpu else cv2.dnn.DNN_TARGET_OPENCL)
        self.names = self.net.getUnconnectedOutLayersNames()
        self.layer_of = [_darknet_index(n) for n in self.net.getLayerNames()]
        self.wall, self.cpu, self.per_layer = [], [], []

    def run(self, blob: np.ndarray) -> None:
        c0, t0 = time.process_time(), time.perf_counter()
        self.net.setInput(blob)
        self.net.forward(self.names)
        self.wall.append((time.perf_counter() - t0) * 1e3)
        self.cpu.append((time.process_time() - c0) * 1e3)
        self.per_layer.append(self._layer_ms())

    def _layer_ms(self) -> dict:
        """This run's time per Darknet layer index (-1: OpenCV layers of no Darknet layer), from
        ``getPerfProfile``: OpenCV times each of its layers; layers it fused into a neighbour read 0."""
        _, ticks = self.net.getPerfProfile()
        scale = 1e3 / self.cv2.getTickFrequency()
        out: dict = {}
        for idx, t in zip(self.layer_of, np.asarray(ticks, dtype=np.float64).ravel()):
            out[idx] = out.get(idx, 0.0) + float(t) * scale
        return out

    def reset(self) -> None:
        """Forget the warm-up runs."""
        self.wall, self.cpu, self.per_layer = [], [], []

    def summary(self, cpu: bool) -> dict:
        keys = sorted({k for run in self.per_layer for k in run})
        layer_ms = {k: float(np.median([run.get(k, 0.0) for run in self.per_layer])) for k in keys}
        return {"version": self.cv2.__version__, "target": self.target, "wall_ms": list(self.wall),
                "cpu_ms": list(self.cpu) if cpu else [], "layer_ms": layer_ms if self.per_layer else {}}

    def close(self) -> None:
        if self.tmp:
            try:
                os.unlink(self.tmp)
            except OSError:
                pass


def _darknet_index(name: str) -> int:
    """The Darknet layer index in an OpenCV layer name (``conv_12``, ``bn_12``, ``shortcut_4``), else -1."""
    tail = name.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def opencv_net(cfg: Path, weights: Optional[Path], layers: list, params: dict, cpu: bool,
               device_is_cpu: bool) -> OpenCVNet:
    """The same network in OpenCV DNN, to run beside ours (``run(blob)``, per-layer times): from
    ``weights``, or without a file from ``params`` written to a temporary one. ``cpu``: OpenCV's
    CPU backend (else its OpenCL target)."""
    tmp = None
    if weights is None:
        fd, tmp = tempfile.mkstemp(suffix=".weights", prefix="yolo-cl-bench-")
        os.close(fd)
        save_weights(Path(tmp), layers, params)
        weights = Path(tmp)
    try:
        return OpenCVNet(cfg, weights, cpu, tmp, device_is_cpu)
    except YoloClError:
        if tmp:
            os.unlink(tmp)
        raise
    except Exception as e:   # cv2.error and friends: OpenCV cannot read this network
        if tmp:
            os.unlink(tmp)
        raise YoloClError(f"OpenCV DNN cannot load {cfg}: {str(e).strip().splitlines()[-1][:200]}") from None
