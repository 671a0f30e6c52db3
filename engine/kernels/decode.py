"""[yolo] heads -> a short candidate list on the device (cl/decode.cl).

One kernel per head decodes every anchor-cell of every image, keeps those whose objectness
passes the threshold and appends them through an atomic counter to a bounded buffer per
image, so a frame reads back its candidates (usually tens of rows), not its head tensors.
The buffers come in ``slots`` sets so that one frame's candidates can be read while the next
frame's are written. NMS stays on the host, over the candidates.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .preprocess import pinned

CAP = 4096      # candidate rows per image; more (a very low threshold) falls back to the host decode
FIRST = 128     # rows read back with the counters, before the count is known


class DeviceDecoder:
    """The [yolo] decode of one executor's heads (``heads``: its Layer objects, in output order)."""

    def __init__(self, rt, executor, heads: list, slots: int = 2) -> None:
        self.rt, self.executor = rt, executor
        classes = {h.p["classes"] for h in heads}
        if len(classes) != 1 or any(h.kind != "yolo" for h in heads) or len(heads) != len(executor.graph.outputs):
            raise ValueError("device decode needs [yolo] heads of one class count, one per output")
        self.classes = classes.pop()
        self.rowlen = self.classes + 6
        B = executor.batch
        cells = sum(len(h.p["mask"]) * v.h * v.w for h, v in zip(heads, executor.graph.outputs))
        self.cap = max(1, min(cells, CAP))
        self.first = min(self.cap, FIRST)
        cl = rt.cl
        half = executor.half
        self._sets = []
        for _ in range(slots):
            count = rt.alloc(B * 4, "candidate counters")
            rows = rt.alloc(B * self.cap * self.rowlen * 4, "candidate buffer")
            self._sets.append({"count": count, "rows": rows, "host_count": pinned(rt, (B,), np.int32)[1],
                               "host_rows": pinned(rt, (B, self.cap, self.rowlen), np.float32)[1],
                               "kernels": [], "thresh": None, "reads": []})
        self._anchors = []
        base = 0
        for h, v in zip(heads, executor.graph.outputs):
            p = h.p
            nm = len(p["mask"])
            anchors = np.asarray(p["anchors"], np.float32).reshape(-1, 2)[np.asarray(p["mask"])]
            abuf = rt.upload(np.ascontiguousarray(anchors), "anchors")
            self._anchors.append(abuf)
            prg = rt.program("decode.cl", {"HALF_STORAGE": half, "NEW_COORDS": bool(p["new_coords"])})
            s = float(p["scale_x_y"])
            g = executor.graph
            x_off = executor.plan.offset(v.tensor) + v.c0 * v.h * v.w
            for st in self._sets:
                k = cl.Kernel(prg, "yc_decode_yolo")
                k.set_args(executor.arena, np.int32(x_off), np.int32(v.tensor.size), np.int32(v.w), np.int32(v.h),
                           np.int32(self.classes), abuf, np.float32(s), np.float32(0.5 * (s - 1)),
                           np.int32(g.input.w), np.int32(g.input.h), np.float32(0.0), np.int32(base),
                           st["count"], st["rows"], np.int32(self.cap))
                st["kernels"].append((k, (v.h * v.w, nm, B)))
            base += nm * v.h * v.w
        self._zero = np.zeros(1, np.int32)

    def enqueue(self, thresh: float, slot: int = 0):
        """Decode the heads now in the arena (queue order) into candidate set ``slot`` and start
        reading the counters and the first rows back; returns the event of the last read."""
        cl, q = self.rt.cl, self.rt.queue
        st = self._sets[slot]
        if st["thresh"] != thresh:
            for k, _ in st["kernels"]:
                k.set_arg(11, np.float32(thresh))
            st["thresh"] = thresh
        cl.enqueue_fill_buffer(q, st["count"], self._zero, 0, self.executor.batch * 4)
        for k, gsize in st["kernels"]:
            cl.enqueue_nd_range_kernel(q, k, gsize, None)
        # Keep the read events until the slot's next use: pyopencl waits for a dropped read
        # event (it guards the host array) holding the GIL, which would stall this thread and
        # every other until the forward pass is done.
        reads = st["reads"] = [cl.enqueue_copy(q, st["host_count"], st["count"], is_blocking=False)]
        rows, stride = st["host_rows"], self.cap * self.rowlen * 4
        for b in range(self.executor.batch):
            reads.append(cl.enqueue_copy(q, rows[b, :self.first], st["rows"], src_offset=b * stride,
                                         is_blocking=False))
        return reads[-1]

    def collect(self, slot: int, index: int) -> Optional[tuple]:
        """(boxes xywh float32, probs float32) of image ``index`` in set ``slot``, in the host
        decode's order, after the set's reads completed; None when the candidates overflowed."""
        st = self._sets[slot]
        n = int(st["host_count"][index])
        if n > self.cap:
            return None
        rows = st["host_rows"][index]
        if n > self.first:      # a rare long list: read the rest (waits for the queue)
            self.rt.cl.enqueue_copy(self.rt.queue, rows[self.first:n], st["rows"],
                                    src_offset=(index * self.cap + self.first) * self.rowlen * 4, is_blocking=True)
        r = rows[:n]
        r = r[np.argsort(r[:, 0].view(np.int32), kind="stable")]
        return r[:, 1:5], r[:, 6:]
