"""Host arrays to the device through pinned memory, the copy and the transfer overlapped.

A GPU driver copies an array from ordinary (pageable) memory by staging it through pinned
buffers of its own; from memory it can DMA from (``ALLOC_HOST_PTR``, mapped) it copies at the
bus's speed. So a large array is copied into pinned memory of our own in chunks, and each
chunk's DMA is enqueued as soon as that chunk has landed: the transfer runs while the host
copies the next chunk, and the whole costs about one host copy. That pays where the driver's
staging is slower than a host copy: on one H100 host NVIDIA staged a 608x608 batch of 8 at
4.4 GB/s (8.0 ms), against ~10 GB/s (3.6 ms) this way; on another both ran at 6-9 GB/s.
Several copying threads were no faster (the host's copy bandwidth is the limit).

Below ``MIN_BYTES`` (a 416x416 input, a 1280x720 frame) the chunking costs more than it saves:
one copy into the pinned array and one DMA. On a CPU device the driver's copy is a plain
``memcpy`` already, so there the callers keep it (``YOLO_CL_STAGING=on`` uses this module
anyway, for tests; ``=off`` never).
"""
from __future__ import annotations

import bisect
import os
import threading
import weakref
from typing import Optional

import numpy as np

CHUNK = 2 << 20          # bytes per copy and per DMA
MIN_BYTES = 8 << 20      # smaller arrays: one copy, one DMA

_pinned: dict = {}       # start address -> end address of every live pinned array
_starts: list = []       # their start addresses, sorted: is_pinned is a bisection, not a scan
_lock = threading.Lock()  # a finalizer may drop an array on any thread


def pinned(rt, shape: tuple, dtype) -> tuple:
    """(buffer, array): host memory the driver can copy to and from by DMA (``ALLOC_HOST_PTR``),
    mapped once for the life of the buffer; the array keeps the mapping alive."""
    cl = rt.cl
    nbytes = max(4, int(np.prod(shape)) * np.dtype(dtype).itemsize)
    buf = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
    host, _ = cl.enqueue_map_buffer(rt.queue, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0, shape, dtype)
    start = host.__array_interface__["data"][0]
    with _lock:
        _pinned[start] = start + nbytes
        bisect.insort(_starts, start)
    weakref.finalize(host, _forget, start)
    return buf, host


def _forget(start: int) -> None:
    with _lock:
        if _pinned.pop(start, None) is not None:
            del _starts[bisect.bisect_left(_starts, start)]


def is_pinned(array: np.ndarray) -> bool:
    """Whether ``array`` lies in memory made by :func:`pinned` (the driver DMAs from it as it is).
    Asked for every frame, with a hundred pinned arrays alive (a stream's frames, stages,
    candidate buffers): the pinned range that starts last at or before the array is the only one
    that can hold it."""
    start = array.__array_interface__["data"][0]
    end = start + array.nbytes
    with _lock:
        i = bisect.bisect_right(_starts, start) - 1
        return i >= 0 and end <= _pinned[_starts[i]]


def wanted(rt) -> bool:
    """Whether uploads to ``rt``'s device should come through :func:`upload` (``YOLO_CL_STAGING``:
    ``auto``, the default, on GPUs and accelerators; ``on``; ``off``)."""
    value = os.environ.get("YOLO_CL_STAGING", "auto").strip().lower()
    return value == "on" or (value not in ("on", "off") and not rt.is_cpu)


def _chunk(rt, nbytes: int) -> int:
    """Bytes per copy and DMA for an upload of ``nbytes``: ``CHUNK`` where chunking pays, else all."""
    return CHUNK if nbytes >= MIN_BYTES and wanted(rt) else nbytes


def upload(rt, dst, src: np.ndarray, host: np.ndarray, dst_offset: int = 0, src_pinned: Optional[bool] = None,
           queue=None, after: Optional[list] = None):
    """Enqueue ``src`` (C-contiguous) into the device buffer ``dst`` at ``dst_offset`` through the
    pinned array ``host`` (flat uint8, at least ``src.nbytes``): chunk by chunk, each chunk's
    non-blocking DMA enqueued as soon as it is in ``host``. ``host`` must not be written again
    until the last of the returned DMA events has completed; keep the list until then (pyopencl
    waits for a transfer whose event is dropped). In one piece where :func:`wanted` says no or
    the array is under ``MIN_BYTES``; a ``src`` already in pinned memory (``is_pinned``) goes by
    DMA as it is, without ``host`` (the caller then keeps ``src`` unchanged as long); a caller that
    asked already passes the answer as ``src_pinned``. ``queue``: where the copies go (default
    ``rt.queue``); ``after``: events the first copy waits for (what still reads ``dst``)."""
    cl, q = rt.cl, queue if queue is not None else rt.queue
    if is_pinned(src) if src_pinned is None else src_pinned:
        return [cl.enqueue_copy(q, dst, src, dst_offset=dst_offset, is_blocking=False, wait_for=after or None)]
    s = src.reshape(-1).view(np.uint8)
    n = s.nbytes
    step = max(1, _chunk(rt, n))
    events = []
    for i in range(0, n, step):
        np.copyto(host[i:i + step], s[i:i + step])
        events.append(cl.enqueue_copy(q, dst, host[i:i + step], dst_offset=dst_offset + i, is_blocking=False,
                                      wait_for=None if events else after or None))
    return events


def upload_rows(rt, dst, src: np.ndarray, rows: np.ndarray, host: np.ndarray, queue=None,
                after: Optional[list] = None):
    """Enqueue only the rows ``rows`` (indices along axis 0, ascending) of ``src``, packed one
    after another, into ``dst`` through the pinned array ``host``: chunked as :func:`upload`,
    each chunk gathered into ``host`` and its DMA enqueued at once. A frame the network input
    is resized down from reads two source rows per input row, so a tall frame sends a fraction
    of its bytes (a 1920x1080 frame resized to 234 rows: 468 of 1080). Returns the DMA events,
    kept as :func:`upload`'s are; ``queue`` and ``after`` as :func:`upload`'s."""
    cl, q = rt.cl, queue if queue is not None else rt.queue
    row = src[0].nbytes
    n = len(rows) * row
    per = max(1, _chunk(rt, n) // row)
    packed = host[:n].reshape((len(rows),) + src.shape[1:])
    events = []
    for i in range(0, len(rows), per):
        j = min(len(rows), i + per)
        np.take(src, rows[i:j], axis=0, out=packed[i:j])
        events.append(cl.enqueue_copy(q, dst, packed[i:j], dst_offset=i * row, is_blocking=False,
                                      wait_for=None if events else after or None))
    return events
