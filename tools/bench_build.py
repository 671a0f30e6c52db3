#!/usr/bin/env python3
"""How fast can the tuner compile candidates? Serial builds vs threads vs worker processes.

Compiling, not timing, is what a tuning traversal waits for. ``Runtime.program`` lets threads
build different programs at once; whether that is parallel depends on the driver (PoCL
serialises its compiler). Worker processes are the alternative: each builds into the on-disk
binary cache, then the main process loads the binaries. Each mode gets its own, distinct
programs (GEMM configs of one yolov3-tiny 416 conv), so no mode profits from another's cache.

    PYTHONPATH=... python tools/bench_build.py --programs 48 --jobs 16
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def programs(count: int) -> list:
    """(source, defines) of ``count`` distinct GEMM programs from one conv's candidates."""
    from bench_gpu import programs_of
    from tune_eval import graph_of
    from yolo_cl.kernels import BindContext, gemm_local
    from yolo_cl.precision import FP32
    from yolo_cl.runtime import Runtime
    rt = Runtime()
    node = [n for n in graph_of("yolov3-tiny:416").nodes if n.op == "conv"][4]
    ctx = BindContext(rt, None, None, 1, FP32)
    out = []
    for c in gemm_local.KERNEL_FAMILY.candidates(node, rt, 1, FP32, ""):
        for source, d in programs_of(ctx, node, c):
            item = (source, d)
            if item not in out:
                out.append(item)
        if len(out) >= count:
            break
    return out[:count]


def _worker(items: list) -> int:
    from yolo_cl.runtime import Runtime
    rt = Runtime()
    for source, opts in items:
        rt.program(source, opts)
    return len(items)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--programs", type=int, default=48, help="programs per mode")
    p.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    args = p.parse_args()
    os.environ["YOLO_CL_CACHE"] = tempfile.mkdtemp(prefix="yolo-cl-build-")
    os.environ["PYOPENCL_NO_CACHE"] = "1"
    from yolo_cl.runtime import Runtime
    n = args.programs
    items = programs(3 * n)
    rt = Runtime()
    print(f"device {rt.device_name} ({rt.driver}), {args.jobs} jobs, {n} programs per mode", flush=True)

    t0 = time.perf_counter()
    for source, opts in items[:n]:
        rt.program(source, opts)
    serial = time.perf_counter() - t0
    print(f"serial:    {serial:6.1f} s  {serial / n * 1e3:7.1f} ms/program", flush=True)

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda it: rt.program(*it), items[n:2 * n]))
    threads = time.perf_counter() - t0
    print(f"threads:   {threads:6.1f} s  {threads / n * 1e3:7.1f} ms/program  ({serial / threads:.1f}x)", flush=True)

    todo = items[2 * n:]
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(_worker, [todo[i::args.jobs] for i in range(args.jobs)]))
    built = time.perf_counter() - t0
    rt2 = Runtime()
    t1 = time.perf_counter()
    for source, opts in todo:
        rt2.program(source, opts)
    load = time.perf_counter() - t1
    print(f"processes: {built + load:6.1f} s  {(built + load) / n * 1e3:7.1f} ms/program  "
          f"({serial / (built + load):.1f}x; workers {built:.1f} s incl. start-up, loading the binaries {load:.1f} s, "
          f"{rt2.builds} rebuilt from source)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
