"""Detection with the frame stages on the device and frames in flight.

``DevicePath`` serves a Detector's ``submit``/``result``: ``submit`` copies each image into a
pinned staging buffer and enqueues upload, preprocessing kernel, forward pass, [yolo] decode
and the read of the candidates, all without waiting, and returns a ``Pending``; ``result``
waits for that frame's last read and maps to pixels what the NMS on the device (``yc_nms``,
after the decode) kept and listed, where the list is short; else the candidate rows, NMSed here. Work is
spread over ``slots`` sets of staging and candidate buffers, so the host prepares frame N+1
(and runs NMS on frame N-1) while the device computes frame N. The queue is in order, so the
arena's input region is rewritten only after the previous forward pass has read it.
``result`` waits through a ``waiting.Waiter``: with ``YOLO_CL_WAIT=sleep`` it sleeps through most
of a wait it can predict instead of leaving a host core to the driver's wait.
"""
from __future__ import annotations

import os
import time
import weakref
from typing import Optional

from .executor import batch_bucket
from .kernels.decode import NMS_KINDS, DeviceDecoder
from .kernels.preprocess import DevicePreprocess
from .waiting import Waiter, wanted as wait_mode

SLOTS = 3


class _Part:
    """The images of one submission that share a network size: one batch forward pass."""

    __slots__ = ("slot", "executor", "decoder", "index", "images", "places", "event", "since", "done")

    def __init__(self, slot, executor, decoder, index, images, places) -> None:
        self.slot, self.executor, self.decoder = slot, executor, decoder
        self.index, self.images, self.places = index, images, places
        self.event, self.since, self.done = None, 0.0, False


class Pending:
    """A submitted group of images; pass it to ``Detector.result``."""

    __slots__ = ("parts", "results", "thresh", "nms", "nms_kind")

    def __init__(self, n: int, thresh: float, nms: float, nms_kind: Optional[str] = None) -> None:
        self.parts: list = []
        self.results: list = [None] * n
        self.thresh, self.nms, self.nms_kind = thresh, nms, nms_kind


class DevicePath:
    """A Detector's device pre/post-processing and the slots of frames in flight."""

    def __init__(self, detector, decode: bool, slots: int = SLOTS) -> None:
        self.det = detector
        self.rt = detector.runtime
        self.slots = slots
        self.prep = DevicePreprocess(self.rt, detector.precision, slots)
        self.decode = decode
        # NMS on the device after the decode (YOLO_CL_DEVICE_NMS=0: on the host, as the host path does)
        self.device_nms = os.environ.get("YOLO_CL_DEVICE_NMS", "1").strip() != "0"
        # executor -> its DeviceDecoder; weak, so an executor dropped from a cache takes its decoder along
        self._decoders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._busy: dict = {}            # slot -> (Pending, _Part) not yet collected
        self._next = 0
        self._lock = detector._lock      # one lock per queue: no interleaved enqueues from threads
        self.waiter = Waiter(wait_mode())

    def decoder(self, executor) -> Optional[DeviceDecoder]:
        """The decoder bound to ``executor``'s heads (None when the host decodes)."""
        if not self.decode:
            return None
        d = self._decoders.get(executor)
        if d is None:
            d = self._decoders[executor] = DeviceDecoder(self.rt, executor, self.det.heads, self.slots)
        return d

    def submit(self, images: list, thresh: float, nms: float, nms_kind: Optional[str] = None) -> Pending:
        """Enqueue every stage for ``images`` (checked BGR uint8); returns without waiting."""
        det = self.det
        places = [det.placement(im.shape[1], im.shape[0]) for im in images]
        pending = Pending(len(images), thresh, nms, nms_kind)
        with self._lock:
            for size in dict.fromkeys((p.net_w, p.net_h) for p in places):
                idx = [i for i, p in enumerate(places) if (p.net_w, p.net_h) == size]
                slot = self._free_slot()
                # the frames' DMAs first: the device copies while the launches below are prepared
                staged = [self.prep.upload(images[i], places[i], j, slot) for j, i in enumerate(idx)]
                ex = det.executor(batch_bucket(len(idx)), size)
                part = _Part(slot, ex, self.decoder(ex), idx, [images[i] for i in idx], [places[i] for i in idx])
                counter = part.decoder.counter(slot) if part.decoder is not None else None
                for j, i in enumerate(idx):
                    self.prep.enqueue(ex, images[i], places[i], j, slot, counter, staged[j])
                if part.decoder is None:     # the host decodes: read the heads (waits)
                    self._finish_host(pending, part, ex.run_staged())
                    continue
                self.rt.queue.flush()        # the upload starts while the network is enqueued
                ex.enqueue()
                part.event = part.decoder.enqueue(thresh, slot, zero=False, images=len(idx),
                                                  nms=self._nms_args(part.places, nms, nms_kind))
                part.since = time.monotonic()
                pending.parts.append(part)
                self._busy[slot] = (pending, part)
            self.rt.queue.flush()            # a driver may hold commands back until a flush or a wait
        return pending

    def _nms_args(self, places: list, nms: float, nms_kind: Optional[str]) -> Optional[tuple]:
        """What ``DeviceDecoder.enqueue`` needs to run the NMS on the device for these images, or
        None where the host runs it: NMS off, a kind the kernel lacks, or images whose boxes
        ``correct_boxes`` scales differently (one scale per launch)."""
        kind, beta = self.det.nms_rule(nms_kind)
        scales = {(pl.net_w / pl.new_w, pl.net_h / pl.new_h) for pl in places}
        if not self.device_nms or nms <= 0 or kind not in NMS_KINDS or len(scales) != 1:
            return None
        sx, sy = scales.pop()
        return float(nms), kind, float(beta), sx, sy

    def _free_slot(self) -> int:
        """The next slot, after collecting the frame that still holds it."""
        slot = self._next
        self._next = (self._next + 1) % self.slots
        held = self._busy.get(slot)
        if held is not None:
            self._collect(*held)
        return slot

    def result(self, pending: Pending) -> list:
        """Detections per submitted image (waits for the frames' reads)."""
        for part in pending.parts:
            if not part.done:
                self.waiter.wait(part.event, part.executor, part.since)   # outside the lock: others submit
                with self._lock:
                    self._collect(pending, part, waited=True)
        return pending.results

    def _collect(self, pending: Pending, part: _Part, waited: bool = False) -> None:
        if part.done:
            return
        if not waited:
            part.event.wait()
        det = self.det
        for j, i in enumerate(part.index):
            im, place = part.images[j], part.places[j]
            # the device NMS listed what it kept (probabilities above 0: a negative threshold, which
            # keeps zeros too, takes the rows)
            listed = part.decoder.listed(part.slot, j) if pending.thresh >= 0 else None
            if listed is not None:
                pending.results[i] = det.finish_listed(listed[0], listed[1], im.shape[1], im.shape[0], place)
                continue
            cand = part.decoder.collect(part.slot, j)
            if cand is None:       # more candidates than the buffer holds: decode this image on the host
                ex = det.executor(1, (place.net_w, place.net_h))
                self.prep.enqueue(ex, im, place, 0, part.slot)
                heads = [o[0] for o in ex.run_staged()]
                pending.results[i] = det.postprocess(heads, im.shape[1], im.shape[0], pending.thresh,
                                                     pending.nms, place, pending.nms_kind)
            else:
                pending.results[i] = det.finish_detections(cand[0], cand[1], im.shape[1], im.shape[0],
                                                           pending.thresh, pending.nms, place, pending.nms_kind,
                                                           nms_done=cand[2])
        part.done = True
        part.images = None
        if self._busy.get(part.slot, (None, None))[1] is part:
            del self._busy[part.slot]

    def _finish_host(self, pending: Pending, part: _Part, outs: list) -> None:
        det = self.det
        for j, i in enumerate(part.index):
            im = part.images[j]
            pending.results[i] = det.postprocess([o[j] for o in outs], im.shape[1], im.shape[0], pending.thresh,
                                                 pending.nms, part.places[j], pending.nms_kind)
        part.done = True

