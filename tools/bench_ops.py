#!/usr/bin/env python3
"""Benchmark yolo_cl.ops: the 2-D correlation against OpenCV and SciPy, the causal depthwise 1-D
convolution (forward + backward) against PyTorch, with GFLOP/s and % of the device's peak.

    PYTHONPATH=/tmp/src python tools/bench_ops.py [--device SPEC] [--quick] [--peak GFLOPS]

Times are the best of several runs after a warm-up that tunes (a timed config search, once per
shape bucket). "GF/cpu-s" divides by the process's CPU time instead (CPU implementations only):
on a shared machine it shows the work done per core-second, which load does not dilute. "device" rows keep the data on the device (pyopencl arrays): kernel time plus
launch overhead; "numpy" rows include the host<->device copies. FLOPs count useful work only:
2*KH*KW per valid output pixel; B*C*T*(T+1) for the 1-D forward (its causal triangle), twice
that for the backward. Baselines that are not installed are skipped. Every row is checked
against the first result of its case ("err": max abs difference / max abs value).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from yolo_cl import ops
from yolo_cl.measure import event_ms

CPU_PEAK_GFLOPS = 262.0        # the PoCL host: 2 Zen 3 cores x 2 FMA x 8 lanes x 2 flops x ~4.1 GHz
GPU_PEAK_GFLOPS = 63600.0      # NVIDIA H200 fp32


class Timing(float):
    """Best wall seconds of several runs, with the mean process CPU seconds per run as ``cpu``."""

    cpu: float


def best_time(fn, reps: int, sync=None) -> Timing:
    """Best wall time of ``reps`` calls of ``fn`` (``sync`` waits for asynchronous work)."""
    best, cpu0 = float("inf"), time.process_time()
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        if sync:
            sync()
        best = min(best, time.perf_counter() - t)
    out = Timing(best)
    out.cpu = (time.process_time() - cpu0) / reps
    return out


class Table:
    """Rows of (case, implementation, ms, GFLOP/s, % of peak, GF/cpu-s, error), printed as they come."""

    def __init__(self, peak: float, ops_on_cpu: bool) -> None:
        self.peak, self.ops_on_cpu = peak, ops_on_cpu
        print(f"{'case':<28} {'implementation':<30} {'ms':>9} {'GFLOP/s':>9} {'%peak':>6} {'GF/cpu-s':>8} "
              f"{'err':>8}")
        sys.stdout.flush()

    def row(self, case: str, impl: str, t: Timing, flops: float, err: float = float("nan"), note: str = ""):
        gf = flops / t / 1e9
        on_cpu = self.ops_on_cpu or not impl.startswith("yolo_cl") and "cuda" not in impl
        cpu = f"{flops / t.cpu / 1e9:8.1f}" if on_cpu and t.cpu > 0 else f"{'-':>8}"
        print(f"{case:<28} {impl:<30} {t * 1e3:>9.2f} {gf:>9.1f} {100 * gf / self.peak:>6.2f} {cpu} "
              f"{err:>8.1e} {note}")
        sys.stdout.flush()


def rel_err(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(a - ref).max() / max(np.abs(ref).max(), 1e-30))


def interleaved(fns: list, reps: int, sync=None) -> list:
    """Best wall time and mean CPU time of each function, run round-robin so that changes in the
    machine's load during the measurement hit all of them alike."""
    best, cpu = [float("inf")] * len(fns), [0.0] * len(fns)
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t, c = time.perf_counter(), time.process_time()
            fn()
            if sync:
                sync()
            best[i] = min(best[i], time.perf_counter() - t)
            cpu[i] += time.process_time() - c
    out = []
    for b, c in zip(best, cpu):
        tm = Timing(b)
        tm.cpu = c / reps
        out.append(tm)
    return out


def bench_2d(table: Table, rt, h: int, w: int, kh: int, kw: int, batch: int, reps: int, baselines: bool) -> None:
    """One 2-D case: ops on device and from NumPy, cv2.filter2D and scipy fftconvolve (CPU), interleaved."""
    import pyopencl.array as cla
    rng = np.random.default_rng(0)
    x = rng.random((batch, 1, h, w), dtype=np.float32)
    k = rng.random((1, 1, kh, kw), dtype=np.float32) - 0.5
    oh, ow = h - kh + 1, w - kw + 1
    flops = 2.0 * kh * kw * oh * ow * batch
    case = f"{batch}x{h}x{w} * {kh}x{kw}" if batch > 1 else f"{h}x{w} * {kh}x{kw}"
    q = rt.queue
    xd = cla.to_device(q, x)
    t = time.perf_counter()
    yd = ops.conv2d(xd, k, tune=True, device=rt)
    q.finish()
    tune_s = time.perf_counter() - t
    ref = yd.get()
    cfg = ops.tuned_configs(rt).get(("corr2d", kh, kw, min(1 << (ow - 1).bit_length(), 8192), True), "heuristic")
    rows = [("yolo_cl.ops device", lambda: (ops.conv2d(xd, k, device=rt), q.finish()), 0.0,
             f"(first call {tune_s:.1f}s; {cfg})"),
            ("yolo_cl.ops numpy in/out", lambda: ops.conv2d(x, k, device=rt),
             rel_err(ops.conv2d(x, k, device=rt), ref), "")]
    if baselines:
        try:
            import cv2
            ker = k[0, 0]
            y = cv2.filter2D(x[0, 0], -1, ker, anchor=(0, 0), borderType=cv2.BORDER_CONSTANT)[:oh, :ow]
            rows.append((f"cv2.filter2D ({cv2.getNumThreads()} threads)",
                         lambda: [cv2.filter2D(x[i, 0], -1, ker, anchor=(0, 0), borderType=cv2.BORDER_CONSTANT)
                                  for i in range(batch)], rel_err(y, ref[0, 0]), ""))
        except ImportError:
            pass
        try:
            import scipy.signal as ss
            flipped = k[0, 0, ::-1, ::-1]
            rows.append(("scipy fftconvolve", lambda: [ss.fftconvolve(x[i, 0], flipped, mode="valid")
                                                       for i in range(batch)],
                         rel_err(ss.fftconvolve(x[0, 0], flipped, mode="valid"), ref[0, 0]), ""))
        except ImportError:
            pass
    times = interleaved([fn for _, fn, _, _ in rows], reps)
    for (name, _, err, note), tm in zip(rows, times):
        table.row(case, name, tm, flops, err, note)
    if rt.profiling:
        table.row(case, "yolo_cl.ops kernel (events)", kernel_time(rt, lambda: ops.conv2d(xd, k, device=rt), reps),
                  flops, 0.0, "(OpenCL profiling: kernel time only, no launch overhead)")


def kernel_time(rt, fn, reps: int) -> Timing:
    """Best over ``reps`` calls of the summed OpenCL event time of the kernels ``fn`` launches."""
    events = ops.launch_events(rt)
    best = float("inf")
    for _ in range(reps):
        events.clear()
        fn()
        rt.queue.finish()
        best = min(best, sum(event_ms(e) * 1e-3 for e in events))
    out = Timing(best)
    out.cpu = 0.0
    return out


def bench_1d(table: Table, rt, b: int, c: int, t: int, reps: int, torch_baseline: bool) -> None:
    """The causal depthwise 1-D op forward, backward and both, on device; PyTorch conv1d if present."""
    import pyopencl.array as cla
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((c, t), dtype=np.float32) / np.sqrt(t)).astype(np.float32)
    k = rng.standard_normal((b, c, t), dtype=np.float32)
    g = rng.standard_normal((b, c, t), dtype=np.float32)
    q = rt.queue
    kd, gd = cla.to_device(q, k), cla.to_device(q, g)
    fwd = float(b) * c * t * (t + 1)
    case = f"causal1d B={b} C={c} T={t}"
    t0 = time.perf_counter()
    y = ops.causal_depthwise_conv1d(w, kd, eps=1e-3, tune=True, device=rt)
    gw, gk = ops.causal_depthwise_conv1d_backward(w, kd, gd, tune=True, device=rt)
    q.finish()
    tune_s = time.perf_counter() - t0
    y_ref, gw_ref, gk_ref = y.get(), gw.get(), gk.get()
    tf = best_time(lambda: ops.causal_depthwise_conv1d(w, kd, eps=1e-3, device=rt), reps, q.finish)
    tb = best_time(lambda: ops.causal_depthwise_conv1d_backward(w, kd, gd, device=rt), reps, q.finish)
    configs = {key[1]: cfg for key, cfg in ops.tuned_configs(rt).items() if key[0] == "causal1d" and key[2] == t}
    table.row(case, "yolo_cl.ops forward", tf, fwd, 0.0, f"(first calls {tune_s:.1f}s; {configs.get(0)})")
    table.row(case, "yolo_cl.ops backward", tb, 2 * fwd, 0.0, f"(grad_k {configs.get(1)}, grad_w {configs.get(2)})")
    both = Timing(tf + tb)
    both.cpu = tf.cpu + tb.cpu
    table.row(case, "yolo_cl.ops forward+backward", both, 3 * fwd, 0.0)
    if not torch_baseline:
        return
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return
    dev = "cuda" if torch.cuda.is_available() and not rt.is_cpu else "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else None
    kt = torch.tensor(k, device=dev, requires_grad=True)
    wt = torch.tensor(w, device=dev, requires_grad=True)
    gt = torch.tensor(g, device=dev)

    def forward():   # conv1d is a correlation: left padding T-1 makes out[t] read k[<= t] with w[T-1-(t-u)]
        return F.conv1d(F.pad(kt, (t - 1, 0)), wt.unsqueeze(1), groups=c) + 1e-3

    def both():
        kt.grad = wt.grad = None
        forward().backward(gt)

    with torch.no_grad():
        yt = forward()
    both()
    errs = (rel_err(yt.cpu().numpy(), y_ref), rel_err(wt.grad.cpu().numpy(), gw_ref),
            rel_err(kt.grad.cpu().numpy(), gk_ref))
    with torch.no_grad():
        tf_t = best_time(forward, reps, sync)
    tboth = best_time(both, reps, sync)
    name = f"torch conv1d ({dev})"
    table.row(case, f"{name} forward", tf_t, fwd, errs[0])
    table.row(case, f"{name} forward+backward", tboth, 3 * fwd, max(errs),
              f"(yolo_cl.ops is {tboth / (tf + tb):.1f}x faster)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="OpenCL device: index, P:D or name substring (default: first GPU)")
    ap.add_argument("--quick", action="store_true", help="small sizes and few repetitions (a smoke run)")
    ap.add_argument("--peak", type=float, default=None,
                    help=f"device fp32 peak in GFLOP/s (default {CPU_PEAK_GFLOPS:g} on a CPU, {GPU_PEAK_GFLOPS:g} on a GPU)")
    ap.add_argument("--no-baselines", action="store_true", help="skip OpenCV, SciPy and PyTorch")
    ap.add_argument("--no-cpu-baselines", action="store_true", help="skip OpenCV and SciPy (keep PyTorch)")
    args = ap.parse_args(argv)

    from yolo_cl.runtime import Runtime
    rt = Runtime(args.device, profiling=True)        # ops run on it (device=rt), so kernel events can be read
    ops.tuned_configs(rt)                            # registers rt with the ops: arrays on rt.queue use it
    peak = args.peak or (CPU_PEAK_GFLOPS if rt.is_cpu else GPU_PEAK_GFLOPS)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"device: {rt.device_name} ({rt.device_type}, {rt.driver}); peak {peak:g} GFLOP/s; "
          f"host load {load:.1f} on {os.cpu_count()} CPUs")
    table = Table(peak, rt.is_cpu)
    reps = 3 if args.quick else 6
    base = not args.no_baselines
    if args.quick:
        cases_2d = [(1024, 1024, 14, 15, 1), (512, 512, 3, 3, 1)]
        cases_1d = [(8, 128, 768)]
    else:
        cases_2d = [(2048, 2048, 14, 15, 1), (1024, 1024, 3, 3, 1), (1024, 1024, 7, 7, 1),
                    (2048, 2048, 16, 16, 1), (4096, 4096, 14, 15, 1), (1024, 1024, 14, 15, 8),
                    (10128, 11159, 14, 15, 1)]
        cases_1d = [(32, 768, 768)]
    for h, w, kh, kw, batch in cases_2d:
        bench_2d(table, rt, h, w, kh, kw, batch, reps if h * w < 2e7 else 3, base and not args.no_cpu_baselines)
    for b, c, t in cases_1d:
        bench_1d(table, rt, b, c, t, reps, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
