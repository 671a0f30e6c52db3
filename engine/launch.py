"""A plan's pre-bound launches enqueued through ctypes, without an event per launch.

pyopencl's ``enqueue_nd_range_kernel`` asks the driver for an event on every launch and
releases it when the returned object is dropped; the plan never waits on those events. Calling
``clEnqueueNDRangeKernel`` of the same ICD loader through ctypes with no event costs the host
less: on an H100 (NVIDIA OpenCL, driver 580) 7.9 against 9.1 us for a trivial kernel, and
yolov3 416's 143 launches enqueued and finished in 2.46 against 2.71 ms, because there the GPU
runs them faster than the host enqueues them (``tools/bench_launch.py``). The kernels, their
arguments and sizes are the plan's, fixed at bind time; ``LaunchList`` only holds their raw
handles. A launch the driver refuses is enqueued again through pyopencl, which raises its usual
error (or, for a transient out-of-memory, succeeds after its own retry). ``YOLO_CL_LAUNCH=pyopencl``
enqueues through pyopencl instead. Side branches (branches.py) go to a second queue, forked
from and joined to the first with markers and barriers, through ctypes too.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
from typing import Optional

from .errors import DeviceError


@functools.lru_cache(maxsize=1)
def loader() -> ctypes.CDLL:
    """The OpenCL ICD loader pyopencl is linked with (its wheel bundles one), else the system's."""
    import pyopencl
    here = os.path.dirname(pyopencl.__file__)
    for pattern in (os.path.join(here, ".libs", "libOpenCL*"), os.path.join(here + ".libs", "libOpenCL*")):
        found = sorted(glob.glob(pattern))
        if found:
            return ctypes.CDLL(found[0])
    name = ctypes.util.find_library("OpenCL")
    if name is None:
        raise DeviceError("no OpenCL ICD loader found")
    return ctypes.CDLL(name)


def wanted() -> bool:
    """Whether plans enqueue through ctypes (``YOLO_CL_LAUNCH`` is not ``pyopencl``)."""
    return os.environ.get("YOLO_CL_LAUNCH", "").strip().lower() != "pyopencl"


class LaunchList:
    """Enqueues ``launches`` (objects with ``kernel``, ``gsize``, ``lsize``) on ``queue``, in order:
    through ctypes without events (``way`` is ``"ctypes"``), or through pyopencl (``"pyopencl"``)
    where ``YOLO_CL_LAUNCH=pyopencl`` says so or no ICD loader can be called.

    ``side`` (a flag per launch) and ``side_queue``: the flagged launches, side branches
    (branches.py), go to ``side_queue`` instead. Each run of them *forks*: a marker on
    ``queue`` and a barrier on ``side_queue`` waiting for it, so the branch starts once
    everything before it is done; after the run a marker on ``side_queue`` is kept, and the
    plan's last launch is followed by a barrier on ``queue`` waiting for every kept marker (the
    *join*), so what ``queue`` does next sees the branches' outputs."""

    def __init__(self, queue, launches: list, side: Optional[list] = None, side_queue=None) -> None:
        self.queue, self.launches = queue, launches      # the pyopencl objects stay referenced here
        self.side = list(side) if side is not None and side_queue is not None and any(side) else None
        self.side_queue = side_queue if self.side is not None else None
        self._joins: list = []         # markers on the side queue the join waits for
        self._fn = None
        if wanted():
            try:
                self._fn = loader().clEnqueueNDRangeKernel
            except (DeviceError, AttributeError, OSError):
                pass
        self.way = "ctypes" if self._fn is not None else "pyopencl"
        if self._fn is None:
            return
        self._fn.restype = ctypes.c_int32
        self._queue = ctypes.c_void_p(queue.int_ptr)
        self._args = []
        for l in launches:
            dims = len(l.gsize)
            gsize = (ctypes.c_size_t * dims)(*l.gsize)
            lsize = (ctypes.c_size_t * dims)(*l.lsize) if l.lsize else None
            self._args.append((ctypes.c_void_p(l.kernel.int_ptr), ctypes.c_uint32(dims), gsize, lsize))
        if self.side is not None:
            self._sync = _Sync(queue, side_queue)

    def __len__(self) -> int:
        return len(self.launches)

    def enqueue(self, start: int = 0, stop: int = -1) -> None:
        """Enqueue launches ``start`` up to (not including) ``stop`` (-1: to the end); with side
        branches, forked and (once ``stop`` is the end) joined as the class says."""
        stop = len(self.launches) if stop < 0 else stop
        if self.side is None:
            self._enqueue(self.queue, start, stop)
            return
        i = start
        while i < stop:
            on_side = self.side[i]
            j = i
            while j < stop and self.side[j] == on_side:
                j += 1
            if on_side:
                self._fork()
                self._enqueue(self.side_queue, i, j)
                self._joins.append(self._marker(self.side_queue))
                self.side_queue.flush()
            else:
                self._enqueue(self.queue, i, j)
            i = j
        if stop == len(self.launches) and self._joins:
            self._join()

    def _enqueue(self, queue, start: int, stop: int) -> None:
        if self._fn is None:
            for i in range(start, stop):
                self._again(i, queue)
            return
        fn, q = self._fn, self._queue if queue is self.queue else self._sync.side
        for i, (kernel, dims, gsize, lsize) in enumerate(self._args[start:stop], start):
            if fn(q, kernel, dims, None, gsize, lsize, 0, None, None):
                self._again(i, queue)

    def _again(self, i: int, queue=None) -> None:
        """Launch ``i`` through pyopencl (which raises the driver's error as pyopencl does)."""
        import pyopencl as cl
        l = self.launches[i]
        cl.enqueue_nd_range_kernel(self.queue if queue is None else queue, l.kernel, l.gsize, l.lsize)

    def _marker(self, queue):
        return self._sync.marker(queue is self.queue) if self._fn is not None else _py_marker(queue)

    def _fork(self) -> None:
        """The side queue waits until the main queue has done everything enqueued so far."""
        if self._fn is not None:
            self._sync.fork()
        else:
            import pyopencl as cl
            cl.enqueue_barrier(self.side_queue, wait_for=[_py_marker(self.queue)])
        self.queue.flush()             # the marker must reach the device for the branch to start

    def _join(self) -> None:
        """The main queue waits for every side run enqueued since the last join."""
        joins, self._joins = self._joins, []
        if self._fn is not None:
            self._sync.join(joins)
        else:
            import pyopencl as cl
            cl.enqueue_barrier(self.queue, wait_for=joins)


def _py_marker(queue):
    import pyopencl as cl
    return cl.enqueue_marker(queue)


class _Sync:
    """Markers and barriers between two queues through ctypes: raw event handles, released as
    soon as the barrier that waits for them is enqueued (the driver keeps what it needs)."""

    def __init__(self, queue, side_queue) -> None:
        lib = loader()
        self._mark, self._bar, self._release = (lib.clEnqueueMarkerWithWaitList, lib.clEnqueueBarrierWithWaitList,
                                                lib.clReleaseEvent)
        for f in (self._mark, self._bar, self._release):
            f.restype = ctypes.c_int32
        self._objs = (queue, side_queue)      # the pyopencl queues stay referenced here
        self.main, self.side = ctypes.c_void_p(queue.int_ptr), ctypes.c_void_p(side_queue.int_ptr)

    def marker(self, main: bool) -> ctypes.c_void_p:
        ev = ctypes.c_void_p()
        err = self._mark(self.main if main else self.side, 0, None, ctypes.byref(ev))
        if err:
            raise DeviceError(f"clEnqueueMarkerWithWaitList failed ({err})")
        return ev

    def fork(self) -> None:
        ev = self.marker(True)
        err = self._bar(self.side, 1, ctypes.byref(ev), None)
        self._release(ev)
        if err:
            raise DeviceError(f"clEnqueueBarrierWithWaitList failed ({err})")

    def join(self, events: list) -> None:
        handles = (ctypes.c_void_p * len(events))(*[e.value for e in events])
        err = self._bar(self.main, len(events), handles, None)
        for e in events:
            self._release(e)
        if err:
            raise DeviceError(f"clEnqueueBarrierWithWaitList failed ({err})")
