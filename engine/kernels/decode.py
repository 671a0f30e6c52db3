"""[yolo] heads -> a short candidate list on the device (cl/decode.cl).

One kernel per head decodes every anchor-cell of every image, keeps those whose objectness
passes the threshold and appends them through an atomic counter to a bounded buffer per
image, so a frame reads back its candidates (usually tens of rows), not its head tensors.
The buffers come in ``slots`` sets so that one frame's candidates can be read while the next
frame's are written. A second kernel (``yc_nms``, a work-group per image) can run the per-class
NMS over up to ``NMS_MAX`` candidates in place, zeroing suppressed probabilities, so the host
only maps the survivors to pixels; longer lists get the host's NMS.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..staging import pinned

CAP = 4096      # candidate rows per image; more (a very low threshold) falls back to the host decode
FIRST = 128     # rows read back with the counters, before the count is known
NMS_MAX = 128   # candidates per image the device NMS takes (one work-group's local tables); more: the host's
NMS_CLASSES = 1024  # classes the device NMS takes (a local bit per class); more: the host's NMS
NMS_KINDS = {"default": 0, "greedynms": 1, "diounms": 2}     # postprocess.nms kinds -> yc_nms's kind


class DeviceDecoder:
    """The [yolo] decode of one executor's heads (``heads``: its Layer objects, in output order)."""

    def __init__(self, rt, executor, heads: list, slots: int = 2) -> None:
        self.rt, self.batch = rt, executor.batch   # no reference to the executor: it owns this decoder
        classes = {h.p["classes"] for h in heads}
        if len(classes) != 1 or any(h.kind != "yolo" for h in heads) or len(heads) != len(executor.graph.outputs):
            raise ValueError("device decode needs [yolo] heads of one class count, one per output")
        self.classes = classes.pop()
        self.rowlen = self.classes + 6
        B = executor.batch
        cl = rt.cl
        g = executor.graph
        ints, floats, anchors = [], [], []
        base = 0
        for h, v in zip(heads, g.outputs):
            p = h.p
            s = float(p["scale_x_y"])
            ints += [executor.plan.offset(v.tensor) + v.c0 * v.h * v.w, v.tensor.size, v.w, v.h,
                     int(bool(p["new_coords"])), base, len(anchors), 0]
            floats += [s, 0.5 * (s - 1)]
            anchors += np.asarray(p["anchors"], np.float32).reshape(-1, 2)[np.asarray(p["mask"])].ravel().tolist()
            base += len(p["mask"]) * v.h * v.w
        self._tables = [rt.upload(np.asarray(ints, np.int32), "head table"),
                        rt.upload(np.asarray(floats, np.float32), "head scales"),
                        rt.upload(np.asarray(anchors, np.float32), "anchors")]
        prg = rt.program("decode.cl", {"HALF_STORAGE": executor.half, "NMS_MAX": NMS_MAX,
                                          "NMS_CLASSES": NMS_CLASSES})
        self.cells = base                  # anchor-cells of all heads: the decode's first global size
        self._zero = np.zeros(1, np.int32)
        self.cap = max(1, min(base, CAP))
        self.first = min(self.cap, FIRST)
        self._sets = []
        # The counters and the rows share one buffer (sub-buffers for the kernels), the counters
        # first, so one read brings back every image's count with image 0's first rows.
        align = max(4, rt.device.mem_base_addr_align // 8)       # where a sub-buffer may start, in bytes
        head = -(-B * 4 // align) * align
        row_bytes = B * self.cap * self.rowlen * 4
        self._head_read = head + self.first * self.rowlen * 4      # bytes of that read
        for _ in range(slots):
            whole = rt.alloc(head + row_bytes, "candidate buffer")
            count = whole.get_sub_region(0, B * 4)
            rows = whole.get_sub_region(head, row_bytes)
            k = cl.Kernel(prg, "yc_decode_yolo")
            k.set_args(executor.arena, *self._tables, np.int32(len(heads)), np.int32(self.classes),
                       np.int32(g.input.w), np.int32(g.input.h), np.float32(0.0), count, rows, np.int32(self.cap))
            nk = cl.Kernel(prg, "yc_nms")
            nk.set_args(count, rows, np.int32(self.cap), np.int32(self.classes), np.float32(0), np.int32(0),
                        np.float32(0), np.float32(1), np.float32(1))
            host = pinned(rt, (head + row_bytes,), np.uint8)[1]           # the same layout on the host
            host_count = host[:B * 4].view(np.int32)
            host_count[:] = 0
            self._sets.append({"whole": whole, "count": count, "rows": rows, "host": host, "host_count": host_count,
                               "host_rows": host[head:].view(np.float32).reshape(B, self.cap, self.rowlen),
                               "kernel": k, "thresh": None, "reads": [], "nms_kernel": nk, "nms": None,
                               "nms_done": False})
        self.nms_local = int(min(64, rt.device.max_work_group_size))

    def counter(self, slot: int):
        """The candidate counters of set ``slot``: the preprocessing kernel zeroes them, so a
        frame needs no separate fill."""
        return self._sets[slot]["count"]

    def enqueue(self, thresh: float, slot: int = 0, zero: bool = True, nms: Optional[tuple] = None,
                images: Optional[int] = None):
        """Decode the heads now in the arena (queue order) into candidate set ``slot`` and start
        reading the counters and the first rows back (the counters with image 0's rows in one
        read); returns the event of the last read.
        ``zero=False``: the frame's preprocessing kernels already zeroed the counters (of its
        images only). ``nms``: (IoU threshold, kind, beta_nms, sx, sy) to run the NMS on the
        device too, ``sx``/``sy`` being what ``correct_boxes`` scales x/w and y/h by for every
        image of the batch. ``images``: how many of the batch's inputs hold images (the rest are
        padding up to the executor's batch: not decoded, since their counters were not zeroed
        and would pile up frame after frame; default the whole batch)."""
        cl, q = self.rt.cl, self.rt.queue
        st = self._sets[slot]
        n = self.batch if images is None else max(1, min(int(images), self.batch))
        if st["thresh"] != thresh:
            st["kernel"].set_arg(8, np.float32(thresh))
            st["thresh"] = thresh
        if zero:
            cl.enqueue_fill_buffer(q, st["count"], self._zero, 0, n * 4)
        cl.enqueue_nd_range_kernel(q, st["kernel"], (self.cells, n), None)
        if self.classes > NMS_CLASSES:
            nms = None
        st["nms_done"] = nms is not None
        if nms is not None:
            if st["nms"] != nms:
                iou, kind, beta, sx, sy = nms
                nk = st["nms_kernel"]
                for i, v in ((4, np.float32(iou)), (5, np.int32(NMS_KINDS[kind])), (6, np.float32(beta)),
                             (7, np.float32(sx)), (8, np.float32(sy))):
                    nk.set_arg(i, v)
                st["nms"] = nms
            cl.enqueue_nd_range_kernel(q, st["nms_kernel"], (self.nms_local * n,), (self.nms_local,))
        # Keep the read events until the slot's next use: pyopencl waits for a dropped read
        # event (it guards the host array) holding the GIL, which would stall this thread and
        # every other until the forward pass is done.
        reads = st["reads"] = [cl.enqueue_copy(q, st["host"][:self._head_read], st["whole"], is_blocking=False)]
        rows, stride = st["host_rows"], self.cap * self.rowlen * 4
        for b in range(1, n):        # the counters' read brought image 0's first rows
            reads.append(cl.enqueue_copy(q, rows[b, :self.first], st["rows"], src_offset=b * stride,
                                         is_blocking=False))
        return reads[-1]

    def collect(self, slot: int, index: int) -> Optional[tuple]:
        """(boxes xywh float32, probs float32, whether the device ran the NMS) of image ``index``
        in set ``slot``, in the host decode's order, after the set's reads completed; None when
        the candidates overflowed."""
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
        return r[:, 1:5], r[:, 6:], st["nms_done"] and n <= NMS_MAX
