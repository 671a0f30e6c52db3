"""Many streams and many requests over every device of a host: ``Fleet``.

A Fleet holds one Detector per OpenCL device (the same device may be listed twice: two
contexts, each with its own queue). Two kinds of work run on it:

* **streams** (``add_stream``): each source gets its own ``yolo_cl.video`` Pipeline on a
  thread of its own, placed on the device with the fewest streams. Files keep every frame,
  live sources keep the newest one, as with ``Detector.stream``. On the device path the
  streams of one device share a ``SharedDevice``, which runs their frames together as one batch. Each stream keeps its
  latest frame, a short ring of per-frame events and its StreamStats, and can write a JSONL
  and an annotated video.
* **single images** (``submit``): one ``Batcher`` per device gathers concurrent requests for
  up to ``max_wait_ms`` into one ``Detector.detect_batch`` call of at most ``max_batch``
  images, on one worker thread. The waiting requests of all devices are bounded by
  ``max_queue``: past it ``submit`` raises ``QueueFull`` at once instead of queueing.

``ProcessFleet`` runs streams with one process per device instead, each with a Fleet of its own,
so the devices' per-frame Python does not share one GIL. The CLI's many-source ``detect`` and
``yolo-cl serve`` are both thin layers over these.
"""
from __future__ import annotations

import collections
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Union

import numpy as np

from . import stopping
from .darknet_json import json_frame
from .errors import YoloClError
from .executor import batch_bucket
from .noise import for_children
from .preprocess import check_image

EVENT_RING = 256          # per-frame events a stream keeps for slow readers


class QueueFull(YoloClError):
    """Every device's request queue is full: try again later (HTTP 503)."""


def device_specs(spec: Optional[str]) -> list:
    """``--devices`` -> a list of device specs for ``Detector(device=...)``.

    ``None`` or ``""``: the default device only. ``all``: every OpenCL device. Otherwise a
    comma-separated list of ``P:D``, flat indices or name substrings; repeating one
    (``0,0``) opens that device twice, in two contexts."""
    if spec is None or not str(spec).strip():
        return [None]
    if str(spec).strip().lower() == "all":
        from .runtime import INSTALL_HINT, list_devices
        from .errors import DeviceError
        devices = list_devices()
        if not devices:
            raise DeviceError(INSTALL_HINT)
        return [f"{pi}:{di}" for pi, di, _, _ in devices]
    parts = [p.strip() for p in str(spec).split(",")]
    if not all(parts):
        raise YoloClError(f"--devices '{spec}': empty device in the list (use e.g. 'all', '0,1' or '0:0,0:1')")
    return parts


# -- single images: dynamic batching ------------------------------------------------------------
class Request:
    """One queued image; ``started``/``finished`` (monotonic s) bracket the batch that ran it,
    ``inline`` says it ran on the caller's thread (``Batcher.run_claimed``) rather than the worker's."""

    __slots__ = ("image", "thresh", "nms", "future", "queued_at", "started", "finished", "batch", "inline")

    def __init__(self, image: np.ndarray, thresh: float, nms: float) -> None:
        self.image, self.thresh, self.nms = image, thresh, nms
        self.future: Future = Future()
        self.queued_at = time.monotonic()
        self.started = self.finished = 0.0
        self.batch = 0
        self.inline = False


class Batcher:
    """Single-image requests for one Detector, batched on one worker thread.

    The worker takes the oldest request, waits until ``max_batch`` are queued or ``max_wait_ms``
    has passed since that request arrived, and runs what it has as one ``detect_batch`` per
    (thresh, nms) pair. A request whose future was cancelled (its client gave up) is skipped.
    ``on_batch(size, seconds)`` is called after each batch (metrics). Before taking requests
    the worker builds the executors for every batch size up to ``max_batch`` (``ready`` is set
    then), so no request waits for a kernel compile.

    ``claim`` and ``run_claimed`` run a lone request on the caller's thread instead when the
    Batcher is idle: nothing to batch it with, and it saves the two thread hand-offs (to the
    worker and back), a few tenths of a millisecond each, much of what a server adds to one request.
    """

    def __init__(self, detector, max_batch: int = 8, max_wait_ms: float = 0.0,
                 on_batch: Optional[Callable[[int, float], None]] = None) -> None:
        self.detector = detector
        self.max_batch, self.max_wait = max(1, int(max_batch)), max(0.0, float(max_wait_ms)) / 1000.0
        self.on_batch = on_batch
        self._queue: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self.busy = 0             # requests in the batch being run
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._work, name="yolo-cl-batcher", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Requests queued and not yet taken into a batch."""
        return len(self._queue)

    def put(self, req: Request) -> None:
        with self._cond:
            if self._closed:
                raise YoloClError("the detector is shutting down")
            self._queue.append(req)
            self._cond.notify_all()

    def _take(self) -> Optional[list]:
        with self._cond:
            while (not self._queue and not self._closed) or self.busy:   # busy: a run_claimed
                self._cond.wait()
            if not self._queue:
                return None
            deadline = self._queue[0].queued_at + self.max_wait
            while len(self._queue) < self.max_batch and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            n = min(self.max_batch, len(self._queue))
            batch = [self._queue.popleft() for _ in range(n)]
            self.busy = n
            return batch

    def _warm(self) -> None:
        try:
            for b in range(1, self.max_batch + 1):
                if self._closed:
                    break
                self.detector.executor(b)
        except YoloClError:
            pass                  # the same error reaches the first request of that size
        finally:
            self.ready.set()

    def _work(self) -> None:
        self._warm()
        while True:
            batch = self._take()
            if batch is None:
                return
            self._run(batch)
            with self._cond:
                self.busy = 0
                self._cond.notify_all()

    def _run(self, batch: list) -> None:
        """One detect_batch per (thresh, nms) over the requests not cancelled; results to their futures."""
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        t0 = time.perf_counter()
        started = time.monotonic()
        groups: dict = {}
        for r in live:
            groups.setdefault((r.thresh, r.nms), []).append(r)
        for (thresh, nms), reqs in groups.items():
            try:
                results = self.detector.detect_batch([r.image for r in reqs], thresh, nms)
            except BaseException as e:   # noqa: B902 - every waiting client gets the error
                for r in reqs:
                    r.future.set_exception(e)
                continue
            finished = time.monotonic()
            for r, dets in zip(reqs, results):
                r.started, r.finished, r.batch = started, finished, len(live)
                r.future.set_result(dets)
        if self.on_batch is not None and live:
            self.on_batch(len(live), time.perf_counter() - t0)

    def claim(self) -> bool:
        """Take the detector for one ``run_claimed`` if the Batcher is idle (nothing queued or
        running, executors built); False otherwise. The worker waits until that run is over."""
        with self._cond:
            if self._queue or self.busy or self._closed or not self.ready.is_set():
                return False
            self.busy = 1
            return True

    def run_claimed(self, req: Request) -> None:
        """Run ``req`` on this thread as a batch of one (after ``claim``); its future is then done."""
        req.inline = True
        try:
            self._run([req])
        finally:
            with self._cond:
                self.busy = 0
                self._cond.notify_all()

    def close(self) -> None:
        """Finish the queued requests, then stop the worker."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(30.0)


# -- streams ------------------------------------------------------------------------------------
class _Share:
    """One stream's submission to a SharedDevice: its frames, and a Future of their detections."""

    __slots__ = ("images", "thresh", "nms", "future")

    def __init__(self, images: list, thresh: float, nms: float) -> None:
        self.images, self.thresh, self.nms = images, thresh, nms
        self.future: Future = Future()


class SharedDevice:
    """A Detector shared by several streams, whose frames it runs together.

    Each stream's Pipeline calls ``submit``/``result`` as it would on the Detector (everything else
    is the Detector's own). A submit thread takes every submission waiting, up to ``max_batch``
    frames, and makes them one ``Detector.submit`` (one upload set, one network enqueue, one head
    decode for all); a collect thread waits for each merged batch in order and hands every stream
    its frames' detections. Four streams then cost the device and the host about one batch of four
    instead of four batches of one, and no more than ``depth`` merged batches are in flight, so they
    never outrun the device path's frame slots (which would make a submit wait for an older frame).
    The device path only: the host path has no frames in flight to merge.
    """

    def __init__(self, detector, max_batch: int = 8, depth: int = 2, start: bool = True) -> None:
        self.det = detector
        self.max_batch, self.depth = max(1, int(max_batch)), max(1, int(depth))
        self.batches = self.frames = 0      # merged submits made, frames they carried
        self._queue: collections.deque = collections.deque()
        self._flight: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=t, name=f"yolo-cl-shared-{n}", daemon=True)
                         for n, t in (("submit", self._submit_loop), ("collect", self._collect_loop))]
        for b in dict.fromkeys(batch_bucket(n) for n in range(1, self.max_batch + 1)):
            self.det.device_path.decoder(self.det.executor(b))     # built now, not on a merged frame
        if start:
            self.start()

    def __getattr__(self, name: str):
        return getattr(self.det, name)

    def start(self) -> None:
        for t in self._threads:
            if t.ident is None:
                t.start()

    def submit(self, images: list, thresh: float = 0.25, nms: float = 0.45) -> _Share:
        share = _Share(list(images), thresh, nms)
        with self._cond:
            if self._closed:
                raise YoloClError("the detector is shutting down")
            self._queue.append(share)
            self._cond.notify_all()
        return share

    def result(self, share: _Share) -> list:
        """Detections per frame of ``share`` (waits until its merged batch is read)."""
        return share.future.result()

    def _take(self) -> Optional[list]:
        with self._cond:
            while not self._closed and (not self._queue or len(self._flight) >= self.depth):
                self._cond.wait()
            if not self._queue:
                return None
            first = self._queue[0]
            taken, n = [], 0
            while self._queue and n + len(self._queue[0].images) <= self.max_batch \
                    and (self._queue[0].thresh, self._queue[0].nms) == (first.thresh, first.nms):
                share = self._queue.popleft()
                taken.append(share)
                n += len(share.images)
            if not taken:                   # one submission larger than max_batch: on its own
                taken.append(self._queue.popleft())
            return taken

    def _submit_loop(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                break
            try:
                merged = [(self.det.submit([im for s in taken for im in s.images], taken[0].thresh, taken[0].nms),
                           taken)]
            except BaseException as e:      # noqa: B902 - find whose frame it was: each on its own
                if len(taken) == 1:
                    self._finish(taken[0], error=e)
                    continue
                merged = []
                for share in taken:
                    try:
                        merged.append((self.det.submit(share.images, share.thresh, share.nms), [share]))
                    except BaseException as e1:     # noqa: B902 - this stream's error only
                        self._finish(share, error=e1)
            with self._cond:
                for handle, shares in merged:
                    self.batches += 1
                    self.frames += sum(len(s.images) for s in shares)
                    self._flight.append((handle, shares))
                self._cond.notify_all()
        with self._cond:
            self._flight.append(None)
            self._cond.notify_all()

    def _collect_loop(self) -> None:
        while True:
            with self._cond:
                while not self._flight:
                    self._cond.wait()
                item = self._flight[0]
            if item is None:
                return
            handle, taken = item
            try:
                results, error = self.det.result(handle), None
            except BaseException as e:      # noqa: B902 - every frame of the batch gets it
                results, error = None, e
            with self._cond:
                self._flight.popleft()
                self._cond.notify_all()
            at = 0
            for share in taken:
                k = len(share.images)
                self._finish(share, None if results is None else results[at:at + k], error)
                at += k

    @staticmethod
    def _finish(share: _Share, results: Optional[list] = None, error: Optional[BaseException] = None) -> None:
        share.images = None
        if error is not None:
            share.future.set_exception(error)
        else:
            share.future.set_result(results)

    def close(self) -> None:
        """Run what is queued, then stop both threads."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:
            if t.ident is not None:
                t.join(30.0)


def paced_frames(path: Union[str, Path], loop: bool = True, stop: Optional[threading.Event] = None) -> Iterator:
    """The frames of a video file at the file's own frame rate, from the start again at its end
    when ``loop``: a file that behaves like a camera (for demos, tests and the server)."""
    import cv2
    from .errors import ImageError
    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise ImageError(f"{path}: cannot open as a video (not a format OpenCV can decode)")
    fps = cap.get(cv2.CAP_PROP_FPS)
    period = 1.0 / fps if 0 < fps < 1000 else 1.0 / 25.0
    try:
        next_at = time.monotonic()
        empty = True
        while stop is None or not stop.is_set():
            ok, frame = cap.read()
            if not ok:
                if not loop or empty:
                    return
                cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
                empty = True
                continue
            empty = False
            next_at += period
            wait = next_at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                next_at = time.monotonic()
            yield frame
    finally:
        cap.release()


class StreamRun:
    """One source running through its own Pipeline on one of the Fleet's devices.

    ``latest`` is the newest ``(seq, Result)``; ``events_since(seq)`` the per-frame Darknet
    JSON objects after ``seq`` still in the ring; ``stats`` the pipeline's StreamStats (fps,
    latency, drops). ``error`` holds the message if the stream failed.
    """

    def __init__(self, stream_id: str, source, device: int, detector, *, thresh: float = 0.25, nms: float = 0.45,
                 batch: int = 1, live: Optional[bool] = None, loop: bool = False, out=None, jsonl=None,
                 name: Optional[str] = None) -> None:
        from .video import StreamStats
        self.id, self.source, self.device, self.detector = stream_id, source, device, detector
        self.name = name or str(source)
        self.thresh, self.nms, self.batch, self.live, self.loop = thresh, nms, batch, live, loop
        self.out, self.jsonl = out, jsonl
        self.stats = StreamStats(self.name, batch)
        self.seq = 0
        self.latest = None
        self.error: Optional[str] = None
        self.written: list = []
        self._events: collections.deque = collections.deque(maxlen=EVENT_RING)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._pipe = None
        self._done = threading.Event()      # set when _run has finished, outputs included
        self._thread = threading.Thread(target=self._run, name=f"yolo-cl-stream-{stream_id}", daemon=True)

    # -- running ---------------------------------------------------------------------------------
    def start(self) -> "StreamRun":
        self._thread.start()
        return self

    def _open(self):
        from .video import IterableSource, open_source, source_kind
        if self.loop and isinstance(self.source, (str, Path)) and source_kind(str(self.source)) == "file":
            frames = paced_frames(self.source, True, self._stop)
            return IterableSource(frames, live=True, name=self.name)
        return open_source(self.source, live=self.live)

    def _run(self) -> None:
        try:
            self._stream()
        finally:
            with self._cond:
                self._done.set()
                self._cond.notify_all()

    def _stream(self) -> None:
        from .draw import draw
        from .video import Pipeline
        from .writers import OutputSink
        sink = src = None
        try:
            sink = OutputSink(self.out, self.jsonl)
            src = self._open()
            sink.open_video(src.fps, src.size)
            self._pipe = Pipeline(self.detector, src, thresh=self.thresh, nms=self.nms, batch=self.batch)
            self.stats = self._pipe.stats
            self.stats.source = self.name
            if self._stop.is_set():
                self._pipe.interrupt()
            for r in self._pipe:
                if sink.wants_drawing:
                    sink.write(r, draw(r.frame, r.detections, self.detector.names))
                elif sink.jsonl is not None:
                    sink.write(r, None)
                self._publish(r)
                if self._stop.is_set():
                    break
        except YoloClError as e:
            self.error = str(e)
        except Exception as e:          # noqa: BLE001 - a stream's failure must not end the others
            self.error = f"{self.name}: {type(e).__name__}: {e}"
        finally:
            if self._pipe is not None:
                self._pipe.close()
                if self._stop.is_set() and self.stats.end in ("", "end of frames"):
                    self.stats.end = "stopped"
            if src is not None and not (self._pipe is not None and self._pipe.reading):
                src.close()
            if sink is not None:
                try:
                    if self.error is None:
                        self.written = sink.finish()
                    else:
                        sink.discard()
                except OSError as e:
                    self.error = self.error or f"{self.name}: cannot write output ({e})"
            if self.error is not None:
                self.stats.end = self.error
            if self.stats.finished is None:
                self.stats.finished = time.monotonic()
            with self._cond:
                self._cond.notify_all()

    def _publish(self, r) -> None:
        h, w = r.frame.shape[:2]
        event = json_frame(r.index, self.name, r.detections, w, h, self.detector.fit)
        event["timestamp"] = round(float(r.timestamp), 6)
        with self._cond:
            self.seq += 1
            self.latest = (self.seq, r)
            self._events.append((self.seq, event))
            self._cond.notify_all()

    # -- reading -----------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        # Not Thread.is_alive: a join interrupted by Ctrl-C can leave a live thread marked stopped
        # (CPython before 3.13), and the outputs must still be finished then.
        return self._thread.ident is not None and not self._done.is_set()

    def wait(self, after_seq: int, timeout: float) -> int:
        """Block until a frame newer than ``after_seq`` arrives, the stream ends, or ``timeout``; the current seq."""
        with self._cond:
            if self.seq <= after_seq and self.running:
                self._cond.wait(timeout)
            return self.seq

    def events_since(self, seq: int) -> list:
        """``(seq, event)`` for every frame after ``seq`` still kept (older ones are skipped)."""
        with self._cond:
            return [(s, e) for s, e in self._events if s > seq]

    def summary(self) -> dict:
        """What ``GET /streams`` shows: identity, state and the figures."""
        st = self.stats
        return {"id": self.id, "source": self.name, "device": self.device, "running": self.running,
                "frames": st.frames, "fps": round(st.fps, 2), "dropped": st.dropped, "corrupt": st.corrupt,
                "latency_ms": round(st.latency.mean_ms, 2), "latency_p95_ms": round(st.latency.p95_ms, 2),
                "end": st.end, "error": self.error}

    def stop(self) -> None:
        """Ask the stream to end at the next frame (outputs are finished as for a normal end)."""
        self._stop.set()
        if self._pipe is not None:
            self._pipe.interrupt()

    def join(self, timeout: Optional[float] = None) -> None:
        if self._thread.ident is not None:
            self._done.wait(timeout)


# -- the fleet ----------------------------------------------------------------------------------
class Fleet:
    """One Detector per device; streams and single-image requests spread over them.

    ``Fleet.open("yolov3-tiny", devices="all", input_size=416)`` builds the Detectors;
    ``Fleet(detectors)`` takes ready ones. Use as a context manager or call ``close``.
    """

    def __init__(self, detectors: Sequence, *, max_batch: int = 8, max_wait_ms: float = 0.0, max_queue: int = 64,
                 on_batch: Optional[Callable[[int, float], None]] = None, merge_streams: bool = True) -> None:
        if not detectors:
            raise YoloClError("a Fleet needs at least one Detector")
        self.detectors = list(detectors)
        self.merge_streams = merge_streams
        self.shared: list = [None] * len(self.detectors)     # per device: its SharedDevice, once a stream needs it
        self.max_queue = max(1, int(max_queue))
        self.batchers = [Batcher(d, max_batch, max_wait_ms, on_batch) for d in self.detectors]
        self.streams: dict = {}
        self._lock = threading.Lock()
        self._next_id = 0

    @classmethod
    def open(cls, model: Union[str, Path] = "yolov3-tiny", weights=None, *, devices: Optional[str] = None,
             max_batch: int = 8, max_wait_ms: float = 0.0, max_queue: int = 64, **detector_opts) -> "Fleet":
        """Build one Detector per device of ``devices`` (see ``device_specs``) and a Fleet over them."""
        from .detector import Detector
        dets = [Detector(model, weights, device=spec, **detector_opts) for spec in device_specs(devices)]
        return cls(dets, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue)

    # -- single images -----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Whether every device has built its executors for every batch size."""
        return all(b.ready.is_set() for b in self.batchers)

    @property
    def queued(self) -> int:
        """Requests waiting on every device."""
        return sum(b.pending for b in self.batchers)

    def submit(self, image: np.ndarray, thresh: float = 0.25, nms: float = 0.45) -> Future:
        """Queue one BGR image; the Future's result is its detections. Raises QueueFull when
        ``max_queue`` requests already wait, ImageError for an unusable image."""
        return self.enqueue(image, thresh, nms).future

    def enqueue(self, image: np.ndarray, thresh: float = 0.25, nms: float = 0.45, inline: bool = False) -> Request:
        """``submit``, returning the queued Request: its ``future`` and, once done, its stage times.

        ``inline``: if the chosen device is idle (no request queued or running, no stream on it),
        run the request here and now (``Batcher.run_claimed``) and return it done; the answer is the
        same, without the hand-offs to the batch thread and back."""
        image = check_image(image)
        with self._lock:
            if self.queued >= self.max_queue:
                raise QueueFull(f"the request queue is full ({self.max_queue} waiting); try again later")
            k = min(range(len(self.batchers)), key=self._request_load)
            req = Request(image, thresh, nms)
            batcher = self.batchers[k]
            if not (inline and not self._streams_on(k) and batcher.claim()):
                batcher.put(req)
                return req
        batcher.run_claimed(req)                # outside the lock: other devices go on meanwhile
        return req

    def detect(self, image: np.ndarray, thresh: float = 0.25, nms: float = 0.45,
               timeout: Optional[float] = None) -> list:
        """Detections in one image, batched with whatever else is being asked at the same time
        (on this thread when the device is idle)."""
        return self.enqueue(image, thresh, nms, inline=True).future.result(timeout)

    def _request_load(self, k: int) -> tuple:
        b = self.batchers[k]
        return (b.pending + b.busy) / b.max_batch, self._streams_on(k), k

    # -- streams -------------------------------------------------------------------------------------
    def _streams_on(self, k: int) -> int:
        return sum(1 for s in self.streams.values() if s.device == k and s.running)

    def add_stream(self, source, *, name: Optional[str] = None, thresh: float = 0.25, nms: float = 0.45,
                   batch: int = 1, live: Optional[bool] = None, loop: bool = False, out=None, jsonl=None) -> StreamRun:
        """Start ``source`` (a video file, camera index, URL or iterable of frames) on the device
        with the fewest running streams. ``loop`` plays a video file at its own frame rate, over
        and over, as a live source; ``out``/``jsonl`` write an annotated video / one JSON line per frame."""
        with self._lock:
            k = min(range(len(self.detectors)), key=lambda i: (self._streams_on(i), i))
            sid = str(self._next_id)
            self._next_id += 1
            run = StreamRun(sid, source, k, self._stream_detector(k), thresh=thresh, nms=nms, batch=batch, live=live,
                            loop=loop, out=out, jsonl=jsonl, name=name)
            self.streams[sid] = run
            return run.start()           # running before the next placement counts it

    def _stream_detector(self, k: int):
        """What device k's streams run on: its SharedDevice (frames of all its streams merged into
        batches) on the device path with ``merge_streams``, else the Detector itself."""
        det = self.detectors[k]
        if not (self.merge_streams and det.device_preprocess):
            return det
        if self.shared[k] is None:
            self.shared[k] = SharedDevice(det, self.batchers[k].max_batch)
        return self.shared[k]

    def total_fps(self) -> float:
        """Frames per second summed over the streams still running (or all, once all ended)."""
        runs = list(self.streams.values())
        live = [s for s in runs if s.running] or runs
        return sum(s.stats.fps for s in live)

    def wait_streams(self, timeout: Optional[float] = None, tick: Optional[Callable[[], None]] = None,
                     interval: float = 0.5) -> bool:
        """Wait for every stream to end, calling ``tick`` every ``interval`` s; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while any(s.running for s in self.streams.values()):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            for s in list(self.streams.values()):
                s.join(interval / max(1, len(self.streams)))
            if tick is not None:
                tick()
        return True

    def close(self) -> None:
        """Stop every stream (finishing its outputs) and every batch worker."""
        for s in list(self.streams.values()):
            s.stop()
        for s in list(self.streams.values()):
            s.join(30.0)
        for b in self.batchers:
            b.close()
        for sh in self.shared:
            if sh is not None:
                sh.close()

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- one process per device ---------------------------------------------------------------------
class _Figures:
    """A stream's figures as a device process reported them (the parts of StreamStats the CLI reads)."""

    def __init__(self, name: str) -> None:
        self.source, self.fps, self.frames, self.seconds, self.text = name, 0.0, 0, 0.0, f"{name}: not started"

    def format(self) -> str:
        return self.text


class StreamReport:
    """One stream of a ProcessFleet, as seen from the parent: id, name, device, ``stats`` (fps,
    frames, seconds, ``format()``), ``error`` and the ``written`` output paths once it ended."""

    def __init__(self, stream_id: str, name: str, device: int) -> None:
        self.id, self.name, self.device = stream_id, name, device
        self.stats = _Figures(name)
        self.error: Optional[str] = None
        self.written: list = []
        self.running = True


class ProcessFleet:
    """Fleet's streams with one process per device (``multiprocessing`` spawn), so each device's
    frames pass through a Python of their own instead of sharing one GIL. Stream K goes to device
    K mod len(devices); each process runs a Fleet on its one Detector (``Detector(**detector_opts,
    device=spec)``) and reports every stream's figures back. Same reading interface as Fleet for
    streams: ``add_stream``, ``streams``, ``total_fps``, ``wait_streams``, ``close``."""

    def __init__(self, detector_opts: dict, devices: Sequence, interval: float = 0.5) -> None:
        if not devices:
            raise YoloClError("a ProcessFleet needs at least one device")
        self.detector_opts, self.devices, self.interval = dict(detector_opts), list(devices), interval
        self.streams: dict = {}
        self._plans: list = [[] for _ in self.devices]
        self._procs: list = []

    def add_stream(self, source, *, name: Optional[str] = None, out=None, jsonl=None, **opts) -> StreamReport:
        """Plan ``source`` (options as Fleet.add_stream) on the next device; it starts with ``wait_streams``."""
        sid = str(len(self.streams))
        k = len(self.streams) % len(self.devices)
        report = StreamReport(sid, name or str(source), k)
        self.streams[sid] = report
        self._plans[k].append((sid, source, report.name, out, jsonl, opts))
        return report

    def total_fps(self) -> float:
        return sum(s.stats.fps for s in self.streams.values())

    def _start(self) -> None:
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")
        for k, plan in enumerate(self._plans):
            if not plan:
                continue
            conn, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_device_main, name=f"yolo-cl-device-{k}",
                               args=(self.detector_opts, self.devices[k], k, plan, self.interval, child))
            with for_children():            # the process's own messages reach the real stderr
                proc.start()
            child.close()
            self._procs.append((k, proc, conn))

    def _receive(self, timeout: float) -> None:
        import multiprocessing.connection
        live = [conn for _, proc, conn in self._procs if not conn.closed]
        for conn in multiprocessing.connection.wait(live, timeout):
            k = next(i for i, _, c in self._procs if c is conn)
            try:
                kind, data = conn.recv()
            except (EOFError, OSError):
                conn.close()
                for s in self.streams.values():
                    if s.device == k and s.running:
                        s.running, s.error = False, s.error or f"device {k}'s process ended without a report"
                continue
            for sid, fig in data.items():
                s = self.streams[sid]
                s.stats.fps, s.stats.frames, s.stats.seconds = fig["fps"], fig["frames"], fig["seconds"]
                if kind == "done":
                    s.stats.text, s.error, s.written, s.running = fig["text"], fig["error"], fig["written"], False

    def wait_streams(self, timeout: Optional[float] = None, tick: Optional[Callable[[], None]] = None,
                     interval: float = 0.5) -> bool:
        """Start the device processes (once) and wait for every stream to end; False on timeout."""
        if not self._procs:
            self._start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while any(s.running for s in self.streams.values()):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            self._receive(interval)
            if tick is not None:
                tick()
        return True

    def close(self) -> None:
        """Interrupt the device processes still running (they finish their outputs and report), then reap them."""
        import signal
        for _, proc, _ in self._procs:
            if proc.is_alive():
                try:
                    os.kill(proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 60.0
        while any(s.running for s in self.streams.values()) and time.monotonic() < deadline:
            self._receive(0.5)
        for _, proc, conn in self._procs:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
            conn.close()

    def __enter__(self) -> "ProcessFleet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _figures(run: StreamRun, final: bool) -> dict:
    st = run.stats
    fig = {"fps": st.fps, "frames": st.frames, "seconds": st.seconds}
    if final:
        fig.update(text=st.format(), error=run.error, written=[str(p) for p in run.written])
    return fig


def _device_main(detector_opts: dict, spec, k: int, plan: list, interval: float, conn) -> None:
    """A ProcessFleet's device process: one Detector, a Fleet running ``plan``'s streams, figures
    to ``conn`` every ``interval`` s and once at the end (also after Ctrl-C or SIGTERM)."""
    from .detector import Detector
    from .noise import routed
    fleet = None
    runs: dict = {}
    with routed(False), stopping.interrupted_once():     # Ctrl-C or SIGTERM, from the group and the parent
        try:
            try:
                det = Detector(**detector_opts, device=spec)
                w, h = det.input_size
                det.detect(np.zeros((h, w, 3), np.uint8))   # first launches (driver code generation) before any frame
                fleet = Fleet([det])
                for sid, source, name, out, jsonl, opts in plan:
                    runs[sid] = fleet.add_stream(source, name=name, out=out, jsonl=jsonl, **opts)
                fleet.wait_streams(tick=lambda: conn.send(("tick", {sid: _figures(r, False) for sid, r in runs.items()})),
                                   interval=interval)
            except KeyboardInterrupt:
                pass
            except YoloClError as e:
                conn.send(("done", {sid: {"fps": 0.0, "frames": 0, "seconds": 0.0, "text": "", "error": str(e),
                                          "written": []} for sid, *_ in plan}))
                return
            finally:
                stopping.ignore_stops()         # a Ctrl-C or SIGTERM now must not cut the outputs short
                if fleet is not None:
                    fleet.close()
            conn.send(("done", {sid: _figures(r, True) for sid, r in runs.items()}))
        finally:
            conn.close()
