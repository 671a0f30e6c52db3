"""Host arrays to the device through pinned memory, copied by several threads.

A GPU driver copies an array from ordinary (pageable) memory by staging it through pinned
buffers of its own, on one thread: NVIDIA's OpenCL does so at 6-7 GB/s, 5.6 ms for a 608x608
batch of 8. From memory it can DMA from (``ALLOC_HOST_PTR``, mapped), it copies at the bus's
speed. So a large array is copied into pinned memory in chunks by a few threads (numpy's copy
releases the GIL), and each chunk's DMA is enqueued as soon as that chunk has landed: the
host copy runs at several cores' bandwidth and the transfer overlaps it.

On a CPU device the driver's copy is a plain ``memcpy`` already, so there one copy is kept
(``YOLO_CL_STAGING=threads`` forces the threaded path, for tests; ``=off`` turns it off).
"""
from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np

CHUNK = 1 << 20          # bytes per thread's copy and per DMA; smaller arrays take one plain copy
MAX_THREADS = 4          # beyond this a host's memory bandwidth, not the cores, bounds a copy

_pool: Optional[ThreadPoolExecutor] = None
_pool_lock = threading.Lock()
_pinned: dict = {}       # start address -> end address of every live pinned array


def pinned(rt, shape: tuple, dtype) -> tuple:
    """(buffer, array): host memory the driver can copy to and from by DMA (``ALLOC_HOST_PTR``),
    mapped once for the life of the buffer; the array keeps the mapping alive."""
    cl = rt.cl
    nbytes = max(4, int(np.prod(shape)) * np.dtype(dtype).itemsize)
    buf = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
    host, _ = cl.enqueue_map_buffer(rt.queue, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0, shape, dtype)
    start = host.__array_interface__["data"][0]
    _pinned[start] = start + nbytes
    weakref.finalize(host, _pinned.pop, start, None)
    return buf, host


def is_pinned(array: np.ndarray) -> bool:
    """Whether ``array`` lies in memory made by :func:`pinned` (the driver DMAs from it as it is)."""
    start = array.__array_interface__["data"][0]
    end = start + array.nbytes
    return any(s <= start and end <= e for s, e in list(_pinned.items()))


def mode() -> str:
    """``YOLO_CL_STAGING``: ``auto`` (threads on GPUs and accelerators), ``threads`` or ``off``."""
    value = os.environ.get("YOLO_CL_STAGING", "auto").strip().lower()
    return value if value in ("auto", "threads", "off") else "auto"


def threaded(rt) -> bool:
    """Whether uploads to ``rt``'s device go through the threaded copy."""
    m = mode()
    return m == "threads" or (m == "auto" and not rt.is_cpu)


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            n = max(1, min(MAX_THREADS, (os.cpu_count() or 2) - 1))
            _pool = ThreadPoolExecutor(n, thread_name_prefix="yolo-cl-staging")
        return _pool


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src)`` for C-contiguous arrays of the same size, split over the threads
    when it is large enough to pay (``dst`` and ``src`` flat views of the same byte count)."""
    d, s = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
    if s.nbytes < 2 * CHUNK:
        np.copyto(d, s)
        return
    parts = [_threads().submit(np.copyto, d[i:i + CHUNK], s[i:i + CHUNK]) for i in range(0, s.nbytes, CHUNK)]
    for p in parts:
        p.result()


def upload(rt, dst, src: np.ndarray, host: np.ndarray, dst_offset: int = 0, wait_for=None):
    """Enqueue ``src`` (C-contiguous) into the device buffer ``dst`` at ``dst_offset`` through the
    pinned array ``host`` (at least ``src.nbytes``, flat uint8): a threaded copy into ``host``
    whose chunks each leave by a non-blocking DMA as soon as they land. ``host`` must not be
    written again until the returned event (the last DMA) has completed."""
    cl, q = rt.cl, rt.queue
    s = src.reshape(-1).view(np.uint8)
    n = s.nbytes
    if n < 2 * CHUNK:
        np.copyto(host[:n], s)
        return cl.enqueue_copy(q, dst, host[:n], dst_offset=dst_offset, is_blocking=False, wait_for=wait_for)
    pool = _threads()
    parts = [(i, pool.submit(np.copyto, host[i:i + CHUNK], s[i:i + CHUNK])) for i in range(0, n, CHUNK)]
    event = None
    for i, part in parts:
        part.result()
        event = cl.enqueue_copy(q, dst, host[i:i + CHUNK], dst_offset=dst_offset + i, is_blocking=False,
                                wait_for=wait_for)
    return event
