#!/usr/bin/env python3
"""Untuned vs tuned in one process: the heuristic's network time against the tuning database's.

Builds two executors of one model on one device -- one binding the tuning database's configs
(user cache and shipped files, with their fall-backs), one binding the heuristic alone -- and
runs them alternately, so load on a shared machine hits both alike. Reports the median wall
time and process CPU time per frame of each and their ratio (untuned / tuned), and, with
``--opencv``, OpenCV DNN's CPU backend interleaved as a third.

    PYTHONPATH=... python tools/bench_untuned.py yolov4:416 --repeat 9 --opencv
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np



class _Heuristic:
    """A tuning database that knows nothing: every conv gets the heuristic."""

    def conv_config(self, node, batch: int = 1) -> None:
        return None


def timed(fn) -> tuple:
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", metavar="NAME:SIZE")
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--device")
    p.add_argument("--opencv", action="store_true", help="also OpenCV DNN's CPU backend, interleaved")
    args = p.parse_args(argv)
    from yolo_cl.bench import opencv_net, random_params
    from yolo_cl.executor import Executor
    from yolo_cl.kernels.family import tuning_database
    from yolo_cl.model import load_model
    from yolo_cl.precision import FP32
    from yolo_cl.runtime import Runtime
    name, _, size = args.model.partition(":")
    m = load_model(name, None, int(size or 416), params="made", make_params=random_params)
    cfg, net, layers, params, graph = m.cfg_path, m.net, m.layers, m.params, m.graph
    rt = Runtime(args.device)
    db = tuning_database(rt, FP32)
    runs = {"tuned": Executor(rt, graph, 1, FP32, db), "heuristic": Executor(rt, graph, 1, FP32, _Heuristic())}
    levels: dict = {}
    for level, _ in db.origin.values():
        levels[level] = levels.get(level, 0) + 1
    blob = np.random.default_rng(0).random((1, net.channels, net.height, net.width), dtype=np.float32)
    fns = {k: (lambda ex=ex: ex.run(blob)) for k, ex in runs.items()}
    if args.opencv:
        ocv = opencv_net(cfg, None, layers, params, True, rt.is_cpu)
        fns["opencv"] = lambda: ocv.run(blob)
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(args.repeat):
        for k, fn in fns.items():
            times[k].append(timed(fn))
    print(f"{args.model} on {rt.device_name}: tuned conv configs by origin {levels}; {args.repeat} interleaved runs")
    med = {k: np.median(np.array(v), axis=0) for k, v in times.items()}
    for k, (w, c) in med.items():
        print(f"  {k:<10} wall {w:8.2f} ms   process CPU {c:8.2f} ms")
    h, t = med["heuristic"], med["tuned"]
    print(f"  heuristic / tuned: wall {h[0] / t[0]:.3f}, CPU {h[1] / t[1]:.3f}")
    if args.opencv:
        o = med["opencv"]
        print(f"  tuned / OpenCV: wall {t[0] / o[0]:.3f}, CPU {t[1] / o[1]:.3f};  heuristic / OpenCV: wall "
              f"{h[0] / o[0]:.3f}, CPU {h[1] / o[1]:.3f}")
        ocv.close()
    return 0


if __name__ == "__main__":
    from yolo_cl import YoloClError
    try:
        sys.exit(main())
    except YoloClError as e:            # a model or peer that cannot run: one line, not a traceback
        sys.exit(f"bench_untuned: {e}")
