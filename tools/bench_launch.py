#!/usr/bin/env python3
"""What one kernel launch costs the host, by way of enqueueing it.

Ways: ``pyopencl`` (``enqueue_nd_range_kernel``, which asks the driver for an event and
releases it when the returned object is dropped), ``ctypes`` (``clEnqueueNDRangeKernel``
through ctypes with no event asked for: ``yolo_cl.launch.LaunchList``, what an executor uses)
and ``ctypes+event`` (the same call, asking for an event and releasing it). Each way enqueues
a trivial kernel and one with 16 arguments, then a network's pre-bound launch list
(``--models``): microseconds per launch to enqueue, and the wall of enqueue + finish. Runs
interleaved, medians over ``--reps``.

    . tools/gpu-setup.sh && python3 tools/bench_launch.py --models yolov3-tiny:416,yolov3:416
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyopencl as cl

from yolo_cl import Detector
from yolo_cl.launch import LaunchList, loader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from bench_host import model_files          # noqa: E402

SRC = """
__kernel void trivial(__global float* a) { if (get_global_id(0) == 0) a[0] += 1.0f; }
__kernel void many(__global float* a, __global float* b, __global float* c, __global float* d,
                   int i0, int i1, int i2, int i3, int i4, int i5, int i6, int i7,
                   float f0, float f1, float f2, float f3)
{ if (get_global_id(0) == 0) a[0] += b[0] + c[0] + d[0] + i0 + i7 + f0 + f3; }
"""


class Ways:
    """The three ways of enqueueing a list of (kernel, gsize, lsize) on ``queue``."""

    def __init__(self, queue, launches: list) -> None:
        self.queue, self.launches = queue, launches
        # the executor's own way (yolo_cl.launch.LaunchList), so this times what a plan does
        self.plan = LaunchList(queue, [SimpleNamespace(kernel=k, gsize=g, lsize=l) for k, g, l in launches])
        lib = loader()
        self.enq = lib.clEnqueueNDRangeKernel
        self.enq.restype = ctypes.c_int32
        self.release = lib.clReleaseEvent
        self.q = ctypes.c_void_p(queue.int_ptr)
        self.args = []
        for k, g, l in launches:
            gs = (ctypes.c_size_t * len(g))(*g)
            ls = (ctypes.c_size_t * len(l))(*l) if l else None
            self.args.append((ctypes.c_void_p(k.int_ptr), ctypes.c_uint32(len(g)), gs, ls))
        self.ev = ctypes.c_void_p()

    def pyopencl(self) -> None:
        q = self.queue
        for k, g, l in self.launches:
            cl.enqueue_nd_range_kernel(q, k, g, l)

    def ctypes(self) -> None:
        self.plan.enqueue()

    def ctypes_event(self) -> None:
        enq, q, ev, ref, rel = self.enq, self.q, self.ev, ctypes.byref(self.ev), self.release
        for k, n, gs, ls in self.args:
            if enq(q, k, n, None, gs, ls, 0, None, ref):
                raise RuntimeError("clEnqueueNDRangeKernel failed")
            rel(ev)


def timed(queue, ways: Ways, reps: int) -> dict:
    """Per way: median microseconds per launch to enqueue, and median ms of enqueue + finish."""
    names = ("pyopencl", "ctypes", "ctypes_event")
    enq = {n: [] for n in names}
    wall = {n: [] for n in names}
    for n in names:                      # warm
        getattr(ways, n)()
    queue.finish()
    for _ in range(reps):
        for n in names:
            fn = getattr(ways, n)
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            queue.finish()
            t2 = time.perf_counter()
            enq[n].append((t1 - t0) * 1e6 / len(ways.launches))
            wall[n].append((t2 - t0) * 1e3)
    return {n: {"us_per_launch": round(statistics.median(enq[n]), 2),
                "wall_ms": round(statistics.median(wall[n]), 3)} for n in names}


def round_trips(queue, kernel, reps: int) -> dict:
    """Microseconds from enqueueing one small kernel to knowing it is done, by way of waiting:
    ``event.wait()`` (clWaitForEvents), ``queue.finish()``, and polling the event's status
    (yielding the GIL between polls). The difference between them is the waiter's wake-up."""
    def wait_event() -> None:
        cl.enqueue_nd_range_kernel(queue, kernel, (256,), None).wait()

    def finish() -> None:
        cl.enqueue_nd_range_kernel(queue, kernel, (256,), None)
        queue.finish()

    def poll() -> None:
        ev = cl.enqueue_nd_range_kernel(queue, kernel, (256,), None)
        queue.flush()
        while ev.command_execution_status != cl.command_execution_status.COMPLETE:
            time.sleep(0)

    ways = {"event.wait": wait_event, "queue.finish": finish, "poll": poll}
    times: dict = {n: [] for n in ways}
    for _ in range(reps):
        for n, fn in ways.items():
            t0 = time.perf_counter()
            fn()
            times[n].append((time.perf_counter() - t0) * 1e6)
    return {n: round(statistics.median(v), 1) for n, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="yolov3-tiny:416,yolov3:416")
    ap.add_argument("--precision", default="fp32,fp16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    out: dict = {}
    tmp = Path(tempfile.mkdtemp())
    first = None
    for spec in a.models.split(","):
        name, size = spec.split(":")
        cfg, weights = model_files(name, tmp)
        for prec in a.precision.split(","):
            det = Detector(cfg, weights, input_size=int(size), precision=prec)
            ex = det.executor(1)
            if first is None:
                first = det
                q = det.runtime.queue
                prg = cl.Program(det.runtime.context, SRC).build()
                buf = cl.Buffer(det.runtime.context, cl.mem_flags.READ_WRITE, 64)
                kt = cl.Kernel(prg, "trivial")
                kt.set_args(buf)
                km = cl.Kernel(prg, "many")
                km.set_args(buf, buf, buf, buf, *[np.int32(i) for i in range(8)], *[np.float32(i) for i in range(4)])
                out["round trip us"] = rt_us = round_trips(q, kt, 10 * a.reps)
                print("one small kernel, enqueue to done: " + "  ".join(f"{n} {v:.1f} us" for n, v in rt_us.items()),
                      flush=True)
                for label, k in (("trivial", kt), ("16 arguments", km)):
                    r = timed(q, Ways(q, [(k, (256,), None)] * 500), a.reps)
                    out[label] = r
                    print(f"{label:28s} " + "  ".join(f"{n} {v['us_per_launch']:.2f} us" for n, v in r.items()), flush=True)
            launches = [(l.kernel, l.gsize, l.lsize) for l in ex.launches]
            r = timed(det.runtime.queue, Ways(det.runtime.queue, launches), a.reps)
            label = f"{name} {size} {prec} ({len(launches)} launches)"
            out[label] = r
            print(f"{label:28s} " + "  ".join(f"{n} {v['us_per_launch']:.2f} us / {v['wall_ms']:.3f} ms"
                                              for n, v in r.items()), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
