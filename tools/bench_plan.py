"""Issue 4 measurements: aspect-ratio cropping vs letterbox latency, and host overhead per frame
of the pre-bound plan vs an eager re-bind of every layer.

    python tools/bench_plan.py --model yolov3 --size 416 [--device SPEC] [--repeat 20]

Models without bundled weights run with random weights (timing does not depend on values).
Latency is wall time of Detector.forward on a blob of the network size (upload, kernels,
download); device time is the sum of OpenCL profiling events; host overhead is measured at a
tiny input (32x32), where device work is negligible, as wall time per frame. Where the device
lists cl_khr_command_buffer, the plan replayed as one command buffer is compared with the same
plan as a launch list, at 32x32 and at the full size.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import yolo_cl
from yolo_cl.zoo import resolve


def detector(model: str, size, device, profiling=True, fit="letterbox"):
    cfg, weights = resolve(model)
    if weights is None:      # random weights: a speed run
        from yolo_cl.bench import random_params
        from yolo_cl.model import load_model
        from yolo_cl.weights import save_weights
        m = load_model(cfg, None, size, params="made", make_params=random_params)
        weights = os.path.join(tempfile.mkdtemp(prefix="yolo-cl-plan-"), "random.weights")
        save_weights(weights, m.layers, m.params)
    return yolo_cl.Detector(str(cfg), str(weights), input_size=size, device=device, profiling=profiling, fit=fit)


def timed(ex, blob, repeat: int) -> tuple:
    ex.run(blob)
    walls, devs = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        ex.run(blob, profile=True)
        walls.append((time.perf_counter() - t0) * 1e3)
        devs.append(sum(t.ms for t in ex.layer_times()))
    return float(np.median(walls)), float(np.median(devs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="yolov3-tiny")
    ap.add_argument("--size", type=int, default=416)
    ap.add_argument("--device")
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    det = detector(a.model, a.size, a.device, fit="crop")
    print(f"device: {det.runtime.device_name} ({det.runtime.driver}); model {a.model} {a.size}")
    print(f"{'input':>10} {'network':>9} {'GFLOP':>7} {'wall ms':>8} {'device ms':>9}")
    for label, (iw, ih) in (("square", (a.size, a.size)), ("16:9", (1280, 720)), ("9:16", (720, 1280))):
        w, h = (a.size, a.size) if label == "square" else det.net_size_for(iw, ih)
        blob = np.random.default_rng(0).random((1, 3, h, w), dtype=np.float32)
        ex = det.executor(1, (w, h))
        wall, dev = timed(ex, blob, a.repeat)
        print(f"{label:>10} {w:>4}x{h:<4} {ex.graph.flops / 1e9:7.2f} {wall:8.2f} {dev:9.2f}")
    tiny = detector(a.model, 32, a.device, profiling=False)
    ex = tiny.executor(1)
    blob = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    for eager in (True, False, True, False):
        ex.run(blob, eager=eager)
    n = max(a.repeat * 5, 50)
    res = {}
    for eager in (True, False):
        t0 = time.perf_counter()
        for _ in range(n):
            ex.run(blob, eager=eager)
        res[eager] = (time.perf_counter() - t0) * 1e3 / n
    print(f"host overhead per frame at 32x32 ({len(ex.launches)} launches): "
          f"eager re-bind {res[True]:.3f} ms, pre-bound plan {res[False]:.3f} ms "
          f"({res[True] / res[False]:.1f}x less)")
    if ex.command_buffer is not None:        # the plan ran through it above; now the launch list
        from yolo_cl.executor import Executor
        plain = Executor(ex.rt, ex.graph, 1, ex.precision, tiny.tuning, command_buffer=False)
        net = det.executor(1, (a.size, a.size))
        net_plain = Executor(net.rt, net.graph, 1, net.precision, det.tuning, command_buffer=False)
        big = np.random.default_rng(0).random((1, 3, a.size, a.size), dtype=np.float32)
        for label, pair, b, reps in (("32x32", (ex, plain), blob, n), (f"{a.size}x{a.size}", (net, net_plain), big,
                                                                       a.repeat)):
            for e in pair:
                e.run(b)
            t = {}
            for _ in range(2):                  # interleaved rounds, best of two
                for name, e in zip(("cmdbuf", "list"), pair):
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        e.run(b)
                    t[name] = min(t.get(name, 1e9), (time.perf_counter() - t0) * 1e3 / reps)
            print(f"cl_khr_command_buffer at {label}: one replay {t['cmdbuf']:.3f} ms/frame vs the launch "
                  f"list {t['list']:.3f} ms/frame ({t['list'] / t['cmdbuf']:.2f}x)")
    else:
        print("cl_khr_command_buffer: not offered by this device (the plan is a flat enqueue loop)")


if __name__ == "__main__":
    main()
