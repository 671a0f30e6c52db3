#!/usr/bin/env python3
"""fp32 vs fp16 latency and memory, batch 1/4/8 throughput, on any OpenCL device (issue 4's matrix).

For each MODEL:SIZE, precision and batch: device time (sum of OpenCL profiling events of one forward,
median), wall time of ``Executor.run`` (upload, kernels, download; median), images per second from
the wall time, and the device memory the plan holds (activation arena, weights, scratch). Configs
come from the tuning database where it has the shape, the heuristic elsewhere (the count is shown).
Random weights, random input in [0, 1].

    PYTHONPATH=... python tools/bench_matrix.py --model yolov3:416 --model yolov4:608 [--batch 1 4 8]
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", required=True, metavar="NAME:SIZE")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--precision", nargs="+", default=["fp32", "fp16"], choices=("fp32", "fp16"))
    p.add_argument("--repeat", type=int, default=3, help="timed runs per case (after one warm-up)")
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message="Non-empty compiler output")

    from yolo_cl.bench import random_params
    from yolo_cl.executor import Executor
    from yolo_cl.kernels.family import tuning_database
    from yolo_cl.model import load_model
    from yolo_cl.precision import precision_named
    from yolo_cl.runtime import Runtime

    rt = Runtime(args.device, profiling=True)
    print(f"device: {rt.device_name} (driver {rt.driver}, {rt.device_type}, fp16 arithmetic: {rt.fp16})")
    print(f"{'model':<8} {'size':>4} {'batch':>5} {'prec':<5} {'device ms':>10} {'wall ms':>9} {'img/s':>7} "
          f"{'GFLOP/s':>8} {'arena MiB':>9} {'weights MiB':>11} {'ws MiB':>7} {'build s':>7}  configs")
    sys.stdout.flush()
    mib = 2.0 ** 20
    for spec in args.model:
        name, _, size = spec.partition(":")
        m = load_model(name, None, int(size) if size else None, params="made", make_params=random_params)
        net, graph = m.net, m.graph
        gflop = sum(n.flops for n in graph.nodes if n.op == "conv") / 1e9
        for prec in args.precision:
            precision = precision_named(prec)
            for batch in args.batch:
                db = tuning_database(rt, precision)
                t0 = time.perf_counter()
                ex = Executor(rt, graph, batch, precision, db)
                blob = np.random.default_rng(0).random((batch, net.channels, net.height, net.width),
                                                       dtype=np.float32)
                ex.run(blob)                      # builds every program, first-frame costs
                build_s = time.perf_counter() - t0
                wall, dev = [], []
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    ex.run(blob, profile=True)
                    wall.append((time.perf_counter() - t) * 1e3)
                    dev.append(sum(x.ms for x in ex.layer_times()))
                levels: dict = {}
                for level, _ in db.origin.values():
                    levels[level] = levels.get(level, 0) + 1
                item = precision.itemsize
                wbytes = sum(n.attrs["weights"].size for n in graph.nodes if n.op == "conv") * item
                w_ms, d_ms = float(np.median(wall)), float(np.median(dev))
                print(f"{name:<8} {net.width:>4} {batch:>5} {prec:<5} {d_ms:>10.1f} {w_ms:>9.1f} "
                      f"{1e3 * batch / w_ms:>7.2f} {gflop * batch / d_ms * 1e3:>8.1f} {ex.arena_bytes / mib:>9.0f} "
                      f"{wbytes / mib:>11.0f} {ex.workspace_bytes / mib:>7.0f} {build_s:>7.1f}  "
                      + ", ".join(f"{n} {k}" for k, n in sorted(levels.items())))
                sys.stdout.flush()
                del ex                            # frees its buffers before the next case
    return 0


if __name__ == "__main__":
    sys.exit(main())
