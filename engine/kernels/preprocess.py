"""Frames -> network input on the device (cl/preprocess.cl).

A BGR uint8 frame is copied once into a pinned host buffer (``ALLOC_HOST_PTR``, mapped for
the life of the stager; a large one in chunks, see :mod:`yolo_cl.staging`; of a plain frame
whose resize reads at most ``rows_share`` of its rows, only those rows, packed), sent to a device
staging buffer by a non-blocking copy, and one kernel resizes it as ``cv2.resize(INTER_LINEAR)``
does, places it (stretch, letterbox, crop), swaps BGR -> RGB, scales to [0, 1] and writes fp32
or half straight into the executor's input region. Staging buffers are reused and only grow
when a larger frame arrives; each of ``slots`` sets can be filled while the device still works
on another one's frame.
"""
from __future__ import annotations

import weakref
from typing import Optional

import numpy as np

from .. import staging
from ..preprocess import Placement
from ..staging import pinned

COEF = 2048            # OpenCV's INTER_RESIZE_COEF_SCALE (11 fractional bits)
TABLE_CACHE = 64       # coordinate tables kept per source/target length pair
# A plain frame sends only the rows its resize reads when they are at most this share of its rows.
# Gathering rows costs more per byte than one contiguous copy, so packing pays only well under all
# of them: at 43% of the rows it won on PoCL and lost on an H100 host, at 38% it won on both
# (BENCHMARKS.md, "Twelfth GPU session").
ROWS_SHARE_CPU = 0.5
ROWS_SHARE_GPU = 0.4


def rows_share(rt) -> float:
    """The largest share of a plain frame's rows that ``rt``'s device path sends packed."""
    return ROWS_SHARE_CPU if rt.is_cpu else ROWS_SHARE_GPU


def packed_rows(src: int, dst: int) -> tuple:
    """(rows, table): the source rows the vertical resize from ``src`` to ``dst`` rows reads,
    ascending, and its table with each tap renumbered to the tap's place among those rows, so
    the kernel reads a frame of only those rows, packed, exactly as it reads the whole one."""
    table = resize_tables(src, dst)
    rows, taps = np.unique(table[:, :2], return_inverse=True)
    packed = table.copy()
    packed[:, :2] = taps.reshape(-1, 2)
    return rows, packed


def resize_tables(src: int, dst: int) -> np.ndarray:
    """(dst, 4) int32 rows (first tap, second tap, weight0, weight1) of OpenCV's linear resize
    along one axis: half-pixel centres computed in double, rounded to float as OpenCV does,
    clamped at the borders, weights as 11-bit fixed point."""
    f = ((np.arange(dst, dtype=np.float64) + 0.5) * (src / dst) - 0.5).astype(np.float32)
    s = np.floor(f).astype(np.int64)
    f = f - s
    edge = (s < 0) | (s >= src - 1)
    f[edge] = 0.0
    s = np.clip(s, 0, src - 1)
    w0 = np.rint((np.float32(1.0) - f) * COEF).astype(np.int64)
    w1 = np.rint(f * COEF).astype(np.int64)
    return np.stack([s, np.minimum(s + 1, src - 1), w0, w1], 1).astype(np.int32)


class _Stage:
    """One pinned host buffer, its device twin and the event of the last copy out of it."""

    def __init__(self, rt, nbytes: int) -> None:
        self.nbytes = nbytes
        self.pinned, self.host = pinned(rt, (nbytes,), np.uint8)
        self.device = rt.alloc(nbytes, "frame staging buffer")
        self.copied: list = []       # the DMA events of the last frame staged here
        self.read: list = []         # with a copy queue: the kernel that last read ``device``


class DevicePreprocess:
    """Stages frames and enqueues the preprocessing kernel for any executor of one runtime."""

    def __init__(self, rt, precision, slots: int = 2) -> None:
        """``precision``: the executors' (a :class:`~yolo_cl.precision.Precision`: half or float storage)."""
        half = precision.half
        self.rt, self.half, self.slots = rt, half, slots
        self._program = rt.program("preprocess.cl", {"HALF_STORAGE": half})
        self._stages: dict = {}      # (slot, batch index) -> _Stage
        self._tables: dict = {}      # (source length, target length) -> device int4 table
        self._packed: dict = {}      # (source rows, target rows) -> (rows sent, device table) or None
        # executor -> {(batch index, slot): [kernel, last argument key]}: a kernel per slot, so frames
        # that alternate slots keep their arguments set; weak, so a dropped executor's go too
        self._kernels: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._no_counter = rt.alloc(4, "unused counter")

    def _stage(self, key: tuple, nbytes: int) -> _Stage:
        st = self._stages.get(key)
        if st is None or st.nbytes < nbytes:
            self.rt.finish()         # nothing may still read or write the buffer being replaced
            st = self._stages[key] = _Stage(self.rt, nbytes)
        elif st.copied:
            st.copied[-1].wait()     # the previous frame of this slot has left the pinned buffer
        return st

    def _cached(self, cache: dict, key: tuple, make):
        """``cache[key]``, made by ``make()`` the first time; a cache past ``TABLE_CACHE``
        entries is emptied first (once the queue no longer reads what it holds)."""
        if key not in cache:
            if len(cache) >= TABLE_CACHE:
                self.rt.queue.finish()
                cache.clear()
            cache[key] = make()
        return cache[key]

    def _table(self, src: int, dst: int):
        return self._cached(self._tables, (src, dst),
                            lambda: self.rt.upload(resize_tables(src, dst), "resize table"))

    def _rows(self, src: int, dst: int) -> Optional[tuple]:
        """(rows, device table) to send a plain frame of ``src`` rows packed, or None where its
        resize to ``dst`` rows reads more than ``rows_share`` of them (then the whole frame)."""
        def make() -> Optional[tuple]:
            rows, table = packed_rows(src, dst)
            return (rows, self.rt.upload(table, "packed resize table")) if len(rows) <= rows_share(self.rt) * src \
                else None
        return self._cached(self._packed, (src, dst), make)

    def upload(self, image: np.ndarray, place: Placement, index: int = 0, slot: int = 0) -> tuple:
        """Start sending ``image`` (HxWx3 uint8 BGR, C-contiguous) to the device staging buffer of
        input ``index`` in set ``slot``; returns what :meth:`enqueue` needs to write it into a
        network input. Returns once the frame is in pinned memory: copied there, or already
        there (``staging.is_pinned``), then read by the DMA later. Called first, so a frame's DMA
        starts before the rest of its launches are prepared."""
        h, w = image.shape[:2]
        pinned_frame = staging.is_pinned(image)
        packed = None if pinned_frame else self._rows(h, place.new_h)
        cq = self.rt.copy_queue
        # With a copy queue the DMA waits only for the kernel that last read this stage (a frame
        # ``slots`` back) and runs beside the network still computing the previous frame.
        if packed is None:
            st = self._stage((slot, index), image.nbytes)
            st.copied = staging.upload(self.rt, st.device, image, st.host,    # a frame_array frame: no copy
                                       src_pinned=pinned_frame, queue=cq, after=st.read)
            th = self._table(h, place.new_h)
        else:                        # a plain frame resized down: only the rows the resize reads
            rows, th = packed
            st = self._stage((slot, index), len(rows) * w * 3)
            st.copied = staging.upload_rows(self.rt, st.device, image, rows, st.host, queue=cq, after=st.read)
        if cq is not None:
            cq.flush()               # the kernel below waits for these copies: they must reach the device
        return st, th, w, h

    def enqueue(self, executor, image: np.ndarray, place: Placement, index: int = 0, slot: int = 0,
                counter=None, staged: Optional[tuple] = None) -> None:
        """Upload ``image`` (HxWx3 uint8 BGR, C-contiguous; or take what :meth:`upload` returned
        for it as ``staged``) and write it, laid out by ``place``, into input ``index`` of
        ``executor``'s batch; zero ``counter[index]`` (a decode's candidate counters) on the way."""
        st, th, w, h = staged if staged is not None else self.upload(image, place, index, slot)
        cl, q, cq = self.rt.cl, self.rt.queue, self.rt.copy_queue
        g = executor.graph.input
        per_index = self._kernels.get(executor)
        if per_index is None:
            per_index = self._kernels[executor] = {}
        entry = per_index.get((index, slot))
        if entry is None:
            entry = per_index[(index, slot)] = [cl.Kernel(self._program, "yc_preprocess"), None]
        tw = self._table(w, place.new_w)
        # the buffers themselves, not their ids: the key keeps what the kernel's arguments point
        # at alive, and a buffer freed when its stage grew or the table cache was cleared cannot
        # pass for a new one that Python happened to give the same id
        key = (st.device, tw, th, w, h, place, counter)
        if entry[1] != key:
            y_off = executor.plan.offset(g) + index * g.size
            entry[0].set_args(st.device, np.int32(w * 3), tw, th,
                              executor.arena, np.int32(y_off), np.int32(g.w), np.int32(g.h),
                              np.int32(place.new_w), np.int32(place.new_h), np.int32(place.x0), np.int32(place.y0),
                              counter if counter is not None else self._no_counter,
                              np.int32(index if counter is not None else -1))
            entry[1] = key
        done = cl.enqueue_nd_range_kernel(q, entry[0], (g.w, g.h), None, wait_for=st.copied if cq is not None else None)
        if cq is not None:
            st.read = [done]
