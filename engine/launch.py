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
enqueues through pyopencl instead.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os

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
    where ``YOLO_CL_LAUNCH=pyopencl`` says so or no ICD loader can be called."""

    def __init__(self, queue, launches: list) -> None:
        self.queue, self.launches = queue, launches      # the pyopencl objects stay referenced here
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

    def __len__(self) -> int:
        return len(self.launches)

    def enqueue(self, start: int = 0, stop: int = -1) -> None:
        """Enqueue launches ``start`` up to (not including) ``stop`` (-1: to the end)."""
        stop = len(self.launches) if stop < 0 else stop
        if self._fn is None:
            for i in range(start, stop):
                self._again(i)
            return
        fn, q = self._fn, self._queue
        for i, (kernel, dims, gsize, lsize) in enumerate(self._args[start:stop], start):
            if fn(q, kernel, dims, None, gsize, lsize, 0, None, None):
                self._again(i)

    def _again(self, i: int) -> None:
        """Launch ``i`` through pyopencl (which raises the driver's error as pyopencl does)."""
        import pyopencl as cl
        l = self.launches[i]
        cl.enqueue_nd_range_kernel(self.queue, l.kernel, l.gsize, l.lsize)
