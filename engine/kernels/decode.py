"""[yolo] heads -> a short candidate list on the device (cl/decode.cl).

One kernel per head decodes every anchor-cell of every image, keeps those whose objectness
passes the threshold and appends them through an atomic counter to a bounded buffer per
image, so a frame reads back its candidates (usually tens of rows), not its head tensors.
The buffers come in ``slots`` sets so that one frame's candidates can be read while the next
frame's are written. The per-class NMS (``yc_nms``, a work-group per image) can run over up to
``NMS_MAX`` candidates in place, zeroing suppressed probabilities, so the host only maps the
survivors to pixels; longer lists get the host's NMS. With the NMS on the device, decode and NMS
are one launch (``yc_decode_nms``: the work-group that finishes an image's decode last runs its
NMS), one kernel boundary less at the end of every frame. That kernel also lists what it
keeps (g, class, probability, box, row: up to ``LIST_MAX`` entries an image), read back with the
counters, so a frame's detections are a few rows to map, not a pass over every candidate.
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
LIST_MAX = 128  # kept (candidate, class) entries per image the device NMS lists; more: the host maps the rows
LIST_COLS = 8   # a listed entry: g and class (int bits), probability, x, y, w, h, row (int bits)
NMS_LOCAL = 128  # work-items of the NMS's work-group (its passes over the probabilities are split among them)


def nms_local(rt) -> int:
    """The NMS kernel's work-group size on ``rt``'s device."""
    return int(min(NMS_LOCAL, rt.device.max_work_group_size))


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
                                          "NMS_CLASSES": NMS_CLASSES, "NV_MEMBAR": "NVIDIA" in rt.vendor.upper()})
        self.cells = base                  # anchor-cells of all heads: the decode's first global size
        self._zero = np.zeros(1, np.int32)
        self.cap = max(1, min(base, CAP))
        self.first = min(self.cap, FIRST)
        self._sets = []
        # The counters, the NMS's lists and the rows share one buffer (sub-buffers for the
        # kernels), in that order, so one read brings back every image's count and list (with
        # image 0's first rows where the host runs the NMS).
        align = max(4, rt.device.mem_base_addr_align // 8)       # where a sub-buffer may start, in bytes

        def up(n: int) -> int:
            return -(-n // align) * align
        list_bytes = B * LIST_MAX * LIST_COLS * 4
        at_listed = up(B * 4)
        at_dets = at_listed + up(B * 8)
        head = at_dets + up(list_bytes)
        row_bytes = B * self.cap * self.rowlen * 4
        self._head_read = head + self.first * self.rowlen * 4      # bytes of that read
        self._list_read = head                                     # with the device NMS: no rows
        for _ in range(slots):
            whole = rt.alloc(head + row_bytes, "candidate buffer")
            count = whole.get_sub_region(0, B * 4)
            listed = whole.get_sub_region(at_listed, B * 8)
            dets = whole.get_sub_region(at_dets, list_bytes)
            rows = whole.get_sub_region(head, row_bytes)
            # both kernels' first arguments (YC_DECODE_ARGS); the threshold, argument 8, set per frame
            decode_args = (executor.arena, *self._tables, np.int32(len(heads)), np.int32(self.classes),
                           np.int32(g.input.w), np.int32(g.input.h), np.float32(0.0), count, rows, np.int32(self.cap))
            k = cl.Kernel(prg, "yc_decode_yolo")
            k.set_args(*decode_args)
            # the decode and the NMS in one launch (yc_decode_nms): its per-image counts of finished
            # work-groups start at zero and are left at zero by every launch
            done = rt.alloc(B * 4, "decode work-group counts")
            nk = cl.Kernel(prg, "yc_decode_nms")
            nk.set_args(*decode_args, np.int32(base), np.float32(0), np.int32(0), np.float32(0), np.float32(1),
                        np.float32(1), listed, dets, np.int32(LIST_MAX), done)
            host = pinned(rt, (head + row_bytes,), np.uint8)[1]           # the same layout on the host
            host_count = host[:B * 4].view(np.int32)
            host_count[:] = 0
            # every sub-buffer kept here: a kernel argument does not keep its buffer alive
            self._sets.append({"whole": whole, "count": count, "rows": rows, "listed": listed, "dets": dets,
                               "done": done, "host": host, "host_count": host_count,
                               "host_listed": host[at_listed:at_listed + B * 8].view(np.int32).reshape(B, 2),
                               "host_dets": host[at_dets:at_dets + list_bytes].view(np.float32)
                               .reshape(B, LIST_MAX, LIST_COLS),
                               "host_rows": host[head:].view(np.float32).reshape(B, self.cap, self.rowlen),
                               "kernel": k, "thresh": None, "reads": [], "decode_nms": nk, "nms": None,
                               "decode_nms_thresh": None, "nms_done": False})
        self.nms_local = nms_local(rt)
        self._fused_cells = -(-base // self.nms_local) * self.nms_local   # the fused launch's first global size

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
        if zero:
            cl.enqueue_fill_buffer(q, st["count"], self._zero, 0, n * 4)
        if self.classes > NMS_CLASSES:
            nms = None
        st["nms_done"] = nms is not None
        if nms is None:
            if st["thresh"] != thresh:
                st["kernel"].set_arg(8, np.float32(thresh))
                st["thresh"] = thresh
            cl.enqueue_nd_range_kernel(q, st["kernel"], (self.cells, n), None)
        else:                           # decode and NMS in one launch
            nk = st["decode_nms"]
            if st["decode_nms_thresh"] != thresh:
                nk.set_arg(8, np.float32(thresh))
                st["decode_nms_thresh"] = thresh
            if st["nms"] != nms:
                iou, kind, beta, sx, sy = nms
                for i, v in ((13, np.float32(iou)), (14, np.int32(NMS_KINDS[kind])), (15, np.float32(beta)),
                             (16, np.float32(sx)), (17, np.float32(sy))):
                    nk.set_arg(i, v)
                st["nms"] = nms
            cl.enqueue_nd_range_kernel(q, nk, (self._fused_cells, n), (self.nms_local, 1))
        # Keep the read events until the slot's next use: pyopencl waits for a dropped read
        # event (it guards the host array) holding the GIL, which would stall this thread and
        # every other until the forward pass is done.
        size = self._list_read if nms is not None else self._head_read
        reads = st["reads"] = [cl.enqueue_copy(q, st["host"][:size], st["whole"], is_blocking=False)]
        rows, stride = st["host_rows"], self.cap * self.rowlen * 4
        for b in range(1, n if nms is None else 0):   # the counters' read brought image 0's first rows
            reads.append(cl.enqueue_copy(q, rows[b, :self.first], st["rows"], src_offset=b * stride,
                                         is_blocking=False))
        return reads[-1]

    def listed(self, slot: int, index: int) -> Optional[tuple]:
        """(entries, candidates left out as non-finite) of image ``index`` in set ``slot`` as the
        device NMS listed them (``LIST_COLS`` float32 columns: g and class as int bits,
        probability, x, y, w, h relative to the network input, row as int bits; in no particular order), after
        the set's reads completed; None where the NMS did not list them (it ran on the host,
        or the list overflowed): then ``collect`` gives the rows."""
        st = self._sets[slot]
        if not st["nms_done"]:
            return None
        d, dropped = st["host_listed"][index].tolist()
        if not 0 <= d <= LIST_MAX:
            return None
        return st["host_dets"][index, :d], dropped

    def collect(self, slot: int, index: int) -> Optional[tuple]:
        """(boxes xywh float32, probs float32, whether the device ran the NMS) of image ``index``
        in set ``slot``, in the host decode's order, after the set's reads completed; None when
        the candidates overflowed."""
        st = self._sets[slot]
        n = int(st["host_count"][index])
        if n > self.cap:
            return None
        rows = st["host_rows"][index]
        have = 0 if st["nms_done"] else self.first        # rows read with the counters
        if n > have:            # a long list, or the device NMS's (rare): read the rest (waits)
            self.rt.cl.enqueue_copy(self.rt.queue, rows[have:n], st["rows"],
                                    src_offset=(index * self.cap + have) * self.rowlen * 4, is_blocking=True)
        r = rows[:n]
        r = r[np.argsort(r[:, 0].view(np.int32), kind="stable")]
        return r[:, 1:5], r[:, 6:], st["nms_done"] and n <= NMS_MAX
