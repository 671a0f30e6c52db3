"""The one way yolo-cl times device work: profiling events, or the process's CPU time on a
shared CPU. The tuner, the executor's per-layer profile, ``yolo-cl bench`` and ``ops`` all
measure through these functions."""
from __future__ import annotations

import math
import os
import time
from typing import Callable

CLOCKS = ("events", "cpu")


def event_ms(event) -> float:
    """Device milliseconds of one finished command, from its OpenCL profiling event."""
    return (event.profile.end - event.profile.start) * 1e-6


def profiling_queue(rt):
    """A queue of ``rt``'s device whose commands carry profiling events (``rt.queue`` if it has them)."""
    cl = rt.cl
    return rt.queue if rt.profiling else cl.CommandQueue(
        rt.context, rt.device, properties=cl.command_queue_properties.PROFILING_ENABLE)


def enqueue(rt, queue, launches: list) -> list:
    """Enqueue bound launches in order; their events."""
    cl = rt.cl
    return [cl.enqueue_nd_range_kernel(queue, l.kernel, l.gsize, l.lsize) for l in launches]


def time_launches(rt, queue, launches: list, reps: int, clock: str = "events") -> float:
    """Fastest of ``reps`` runs of ``launches`` in milliseconds.

    ``events``: device time, the sum of the launches' OpenCL profiling events, over one
    warm-up run and then ``reps`` runs enqueued back to back with a single wait, so no timed
    run starts on a GPU left idle by a host round trip (a bind, a check). Kernels of 15-30 us
    timed once per round trip varied by up to 20% between two timings on an H200, enough to
    rank a config above one that is faster; in live searches re-timed against the traversal
    (BENCHMARKS.md) the winners' spread fell from 0.954-1.047 to 0.983-1.016.

    ``cpu``: for a CPU device in this process (PoCL) on a machine shared with other work, where
    wall-clock device time mostly measures the other work: the on-CPU time of the busiest thread
    of the process over the run (Linux's per-thread ``schedstat``), and at least the process's CPU
    time divided by the device's compute units. The busiest thread is what a launch that leaves a
    core idle waits for: the process's CPU time alone flattered such launches (a stride-2 conv
    whose driver-chosen work-groups ran on one of two cores timed 9.6 ms per core, 18.8 ms of
    wall), and configs tuned by it under load were up to 2x slower on an idle machine.
    """
    if clock == "events":
        runs = [enqueue(rt, queue, launches) for _ in range(reps + 1)]
        queue.finish()
        return min(sum(map(event_ms, evs)) for evs in runs[1:])
    best = math.inf
    units = max(1, int(rt.device.max_compute_units))
    for _ in range(reps):
        t0, c0 = thread_cpu_ns(), time.process_time()
        enqueue(rt, queue, launches)
        queue.finish()
        per_unit = (time.process_time() - c0) * 1e3 / units
        t1 = thread_cpu_ns()
        busiest = max((t1[t] - t0.get(t, 0) for t in t1), default=0) * 1e-6
        best = min(best, max(per_unit, busiest))
    return best


def thread_cpu_ns() -> dict:
    """{thread id: nanoseconds on a CPU so far} for this process's threads (empty where Linux's
    ``/proc/self/task/*/schedstat`` is not readable: then the ``cpu`` clock is process CPU time
    per compute unit alone)."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[tid] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return out


def time_call(fn: Callable[[], None], queue, reps: int = 2) -> float:
    """Fastest wall-clock seconds of ``fn()`` and a wait for ``queue``, over ``reps`` runs after
    one warm-up (which builds what it needs): for work that is not a list of launches."""
    fn()
    queue.finish()
    best = math.inf
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        queue.finish()
        best = min(best, time.perf_counter() - t)
    return best
