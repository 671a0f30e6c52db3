"""Video files, cameras and streams through a Detector, as a pipeline of threads.

``open_source`` turns a video file, a camera index, a stream URL or an iterable of frames
into numbered frames. ``Pipeline`` runs decode -> preprocess -> inference -> postprocess in
their own threads joined by small bounded channels, so throughput approaches the slowest
stage rather than the sum of all stages. Files keep every frame, in order (a full channel
blocks its producer). Live sources keep only the newest frame in front of inference (a full
channel drops its oldest item and counts it), so latency stays bounded when the camera is
faster than the network. ``stream`` is the library's iterator over a source's detections.
The command line's driver (drawing, output files, progress, Ctrl-C) is ``video_cli``.
"""
from __future__ import annotations

import collections
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Union

import cv2
import numpy as np

from .errors import ImageError, YoloClError
from .preprocess import check_image, to_blob

log = logging.getLogger("yolo_cl.video")

VIDEO_EXTS = {".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".mpg", ".mpeg", ".wmv", ".flv", ".ts",
              ".mts", ".3gp", ".ogv", ".gif"}
URL_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
MAX_BACKOFF_S = 30.0
MAX_BAD_GRABS = 25          # failed grabs in a row inside a file before it counts as its end


# -- sources ------------------------------------------------------------------------------------
@dataclass
class Frame:
    """One decoded frame: its index in the source, BGR pixels, time stamp (s) and when it was read."""

    index: int
    image: np.ndarray
    timestamp: float
    read_at: float


class Source:
    """Numbered frames from somewhere. ``read`` returns the next Frame, or None at the end
    (``end_reason`` then says why). ``corrupt`` counts frames that could not be decoded."""

    name = "<source>"
    live = False
    fps: Optional[float] = None
    size: Optional[tuple] = None        # (width, height) if known before the first frame
    frame_count: Optional[int] = None   # frames in a file, if the container says
    corrupt = 0
    reconnects = 0
    end_reason = ""
    # (height, width) -> an array to decode the next frame into, e.g. Detector.frame_array (pinned
    # memory the device path DMAs from without a host copy); None: the decoder allocates
    frame_array: Optional[Callable] = None

    def read(self) -> Optional[Frame]:
        raise NotImplementedError

    def interrupt(self) -> None:
        """Ask a blocked or backing-off ``read`` to give up soon (safe from any thread)."""

    def close(self) -> None:
        """Release the source (only once no thread is reading it)."""


class IterableSource(Source):
    """Frames from any iterable of images (a list, a generator, another library's frames).

    Items that are not usable images (None, empty or wrongly shaped arrays) are skipped and
    counted as corrupt. Time stamps are ``index / fps`` when ``fps`` is given, else seconds
    since the first frame.
    """

    def __init__(self, frames: Iterable, live: bool = False, fps: Optional[float] = None,
                 name: str = "<frames>") -> None:
        self._it = iter(frames)
        self.live, self.fps, self.name = bool(live), fps, name
        self._next = 0
        self._t0: Optional[float] = None
        self._stop = threading.Event()

    def read(self) -> Optional[Frame]:
        for item in self._it:
            if self._stop.is_set():
                break
            try:
                image = check_image(item)
            except ImageError:
                self.corrupt += 1
                continue
            now = time.monotonic()
            if self._t0 is None:
                self._t0 = now
            index, self._next = self._next, self._next + 1
            ts = index / self.fps if self.fps else now - self._t0
            return Frame(index, image, ts, now)
        self.end_reason = "interrupted" if self._stop.is_set() else "end of frames"
        return None

    def interrupt(self) -> None:
        self._stop.set()

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            try:
                close()
            except (RuntimeError, ValueError):   # a generator still running in another thread
                pass


def _open_capture(target: Union[int, str], kind: str, timeout_s: float):
    """A ``cv2.VideoCapture`` for ``target``, or None if OpenCV cannot open it."""
    level = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)   # no WARN spam for a bad index
    try:
        if kind == "url":
            ms = int(timeout_s * 1000)
            params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, ms, cv2.CAP_PROP_READ_TIMEOUT_MSEC, ms]
            # FFmpeg honours the timeouts; retrying a failed URL with another backend (or FFmpeg's
            # 30 s default) would overrun them, so only a build without FFmpeg tries the others
            has_ffmpeg = cv2.videoio_registry.hasBackend(cv2.CAP_FFMPEG)
            cap = cv2.VideoCapture(target, cv2.CAP_FFMPEG if has_ffmpeg else cv2.CAP_ANY, params)
        else:
            cap = cv2.VideoCapture(target)
    finally:
        cv2.utils.logging.setLogLevel(level)
    if not cap.isOpened():
        cap.release()
        return None
    return cap


class CaptureSource(Source):
    """A video file, camera or stream URL read through ``cv2.VideoCapture``.

    A frame that fails to decode is skipped and counted. A live source that stops delivering
    is reopened up to ``reconnect`` times, waiting ``backoff`` seconds, doubling each try
    (at most 30 s); a frame arriving resets the count. After that the source ends and
    ``end_reason`` says so.
    """

    def __init__(self, target: Union[int, str], kind: str, name: str, live: Optional[bool] = None,
                 reconnect: int = 5, backoff: float = 1.0, timeout: float = 10.0) -> None:
        self.target, self.kind, self.name = target, kind, name
        self.reconnect, self.backoff, self.timeout = max(0, int(reconnect)), max(0.0, float(backoff)), timeout
        self._stop = threading.Event()
        self._cap = _open_capture(target, kind, timeout)
        if self._cap is None:
            what = {"camera": f"camera {target}: cannot open (no such camera, or it is busy)",
                    "url": f"{name}: cannot open the stream (unreachable, or not a format OpenCV reads)",
                    "file": f"{name}: cannot open as a video (not a format OpenCV can decode)"}[kind]
            raise ImageError(what)
        fps = self._cap.get(cv2.CAP_PROP_FPS)
        self.fps = fps if 0 < fps < 1000 else None
        w, h = int(self._cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(self._cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        self.size = (w, h) if w > 0 and h > 0 else None
        count = int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT))
        self.frame_count = count if count > 0 and kind != "camera" else None
        if live is None:   # a URL with a known length is a file served over the network
            live = kind == "camera" or (kind == "url" and self.frame_count is None)
        self.live = bool(live)
        self._next = 0
        self._t0 = time.monotonic()
        self._bad_grabs = 0

    def read(self) -> Optional[Frame]:
        while not self._stop.is_set():
            if not self._cap.grab():
                if self._more_in_file():
                    continue
                if self.live and self.kind != "file" and self._reopen():
                    continue
                if not self.end_reason:
                    self.end_reason = "end of file" if not self.live else "stream ended"
                return None
            into = self.frame_array(self.size[1], self.size[0]) if self.frame_array and self.size else None
            ok, image = self._cap.retrieve(into) if into is not None else self._cap.retrieve()
            if not ok or image is None or image.size == 0:
                self.corrupt += 1
                continue
            self.corrupt += self._bad_grabs   # failed grabs followed by a good one were bad frames
            self._bad_grabs = 0
            now = time.monotonic()
            index, self._next = self._next, self._next + 1
            return Frame(index, image, self._timestamp(index, now), now)
        self.end_reason = "interrupted"
        return None

    def _timestamp(self, index: int, now: float) -> float:
        """Container time for files (CAP_PROP_POS_MSEC, else index / fps); wall time for live sources."""
        if self.live:
            return now - self._t0
        ms = self._cap.get(cv2.CAP_PROP_POS_MSEC)
        if ms > 0 or index == 0:
            return ms / 1000.0
        return index / self.fps if self.fps else now - self._t0

    def _more_in_file(self) -> bool:
        """Whether a failed grab inside a file is worth retrying (a damaged packet, not the end)."""
        if self.live or self.frame_count is None or self._bad_grabs >= MAX_BAD_GRABS:
            return False
        if self._next + self._bad_grabs >= self.frame_count:
            return False
        self._bad_grabs += 1
        return True

    def _reopen(self) -> bool:
        """Reconnect with exponential backoff; False once every attempt has failed."""
        self._cap.release()
        for attempt in range(1, self.reconnect + 1):
            delay = min(self.backoff * 2 ** (attempt - 1), MAX_BACKOFF_S)
            log.warning("%s: no frame, reconnecting in %.1f s (attempt %d/%d)", self.name, delay, attempt,
                        self.reconnect)
            if self._stop.wait(delay):
                break
            cap = _open_capture(self.target, self.kind, self.timeout)
            if cap is not None:
                self._cap = cap
                self.reconnects += 1
                return True
        self._cap = _ClosedCapture()
        if self._stop.is_set():
            self.end_reason = "interrupted"
        elif self.reconnect:
            self.end_reason = f"stream lost: no frames after {self.reconnect} reconnect attempts"
        else:
            self.end_reason = "stream lost (reconnect disabled)"
        return False

    def interrupt(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._cap.release()


class _ClosedCapture:
    """Stands in for a capture that is gone, so ``read`` and ``close`` need no None checks."""

    def grab(self) -> bool:
        return False

    def release(self) -> None:
        pass


def source_kind(spec) -> str:
    """'camera', 'url', 'file' or 'frames' for a source spec (no I/O)."""
    if isinstance(spec, (int, np.integer)) or (isinstance(spec, str) and spec.strip().isdigit()):
        return "camera"
    if isinstance(spec, (str, Path)):
        return "url" if URL_RE.match(str(spec)) else "file"
    return "frames"


def is_stream_source(spec) -> bool:
    """True for what the CLI should hand to ``run_detect_stream``: a camera, a URL, a video file."""
    kind = source_kind(spec)
    if kind in ("camera", "url"):
        return True
    return kind == "file" and Path(str(spec)).suffix.lower() in VIDEO_EXTS


def open_source(spec, live: Optional[bool] = None, reconnect: int = 5, backoff: float = 1.0,
                timeout: float = 10.0, fps: Optional[float] = None) -> Source:
    """A Source for ``spec``: a video file path, a camera index (``0`` or ``"0"``), a URL
    (``rtsp://``, ``http(s)://``, anything OpenCV's FFmpeg opens), an iterable of BGR frames,
    or a Source (returned as is). ``live`` defaults to True for cameras and URLs without a
    known length, False otherwise. ``reconnect`` and ``backoff`` apply to live cameras and
    URLs; ``timeout`` (s) bounds opening and reading a URL; ``fps`` times an iterable.
    Raises ImageError, naming the source, if it cannot be opened.
    """
    if isinstance(spec, Source):
        return spec
    kind = source_kind(spec)
    if kind == "frames":
        if not hasattr(spec, "__iter__") or isinstance(spec, (bytes, np.ndarray)):
            raise ImageError(f"cannot use a {type(spec).__name__} as a video source "
                             "(give a path, camera index, URL or iterable of frames)")
        return IterableSource(spec, live=bool(live), fps=fps)
    if kind == "camera":
        return CaptureSource(int(spec), "camera", f"camera {int(spec)}", live, reconnect, backoff, timeout)
    name = str(spec)
    if kind == "file" and not Path(name).is_file():
        raise ImageError(f"{name}: no such video file")
    return CaptureSource(name, kind, name, live, reconnect, backoff, timeout)


# -- statistics ---------------------------------------------------------------------------------
class StageTimes:
    """Durations of one stage: mean over all samples, 95th percentile over the most recent ones."""

    CAPACITY = 4096

    def __init__(self) -> None:
        self._ring = np.zeros(self.CAPACITY)
        self.count = 0
        self.total = 0.0

    def add(self, seconds: float) -> None:
        self._ring[self.count % self.CAPACITY] = seconds
        self.count += 1
        self.total += seconds

    @property
    def mean_ms(self) -> float:
        return 1000.0 * self.total / self.count if self.count else 0.0

    @property
    def p95_ms(self) -> float:
        n = min(self.count, self.CAPACITY)
        return 1000.0 * float(np.percentile(self._ring[:n], 95)) if n else 0.0


STAGES = ("decode", "preprocess", "inference", "postprocess", "output")


class StreamStats:
    """What a stream run did: frames out, frames dropped / corrupt, fps, per-stage times."""

    def __init__(self, source: str = "", batch: int = 1) -> None:
        self.source, self.batch = source, batch
        self.stages = {name: StageTimes() for name in STAGES}
        self.latency = StageTimes()    # frame read -> detections ready
        self.read = 0
        self.frames = 0
        self.dropped = 0
        self.corrupt = 0
        self.reconnects = 0
        self.end = ""
        self.started = time.monotonic()
        self.finished: Optional[float] = None
        self._lock = threading.Lock()

    def count_drop(self, n: int = 1) -> None:
        with self._lock:
            self.dropped += n

    @property
    def seconds(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    @property
    def fps(self) -> float:
        s = self.seconds
        return self.frames / s if s > 0 else 0.0

    def as_dict(self) -> dict:
        """The summary as plain data (what the CLI prints, what benchmarks record)."""
        stages = {name: {"mean_ms": round(t.mean_ms, 3), "p95_ms": round(t.p95_ms, 3), "count": t.count}
                  for name, t in self.stages.items() if t.count}
        return {"source": self.source, "frames": self.frames, "dropped": self.dropped, "corrupt": self.corrupt,
                "reconnects": self.reconnects, "fps": round(self.fps, 3), "seconds": round(self.seconds, 3),
                "batch": self.batch, "end": self.end, "stages": stages,
                "latency": {"mean_ms": round(self.latency.mean_ms, 3), "p95_ms": round(self.latency.p95_ms, 3)}}

    def format(self) -> str:
        """A short human summary: one headline and one line per stage."""
        lines = [f"{self.source}: {self.frames} frames, {self.dropped} dropped, {self.corrupt} corrupt, "
                 f"{self.fps:.1f} fps in {self.seconds:.1f} s ({self.end or 'done'})"]
        if self.reconnects:
            lines[0] += f", {self.reconnects} reconnects"
        lines.append(f"  {'stage':<12}{'mean ms':>9}{'p95 ms':>9}")
        for name, t in self.stages.items():
            if t.count:
                label = f"{name} x{self.batch}" if name == "inference" and self.batch > 1 else name
                lines.append(f"  {label:<12}{t.mean_ms:>9.1f}{t.p95_ms:>9.1f}")
        if self.latency.count:
            lines.append(f"  {'latency':<12}{self.latency.mean_ms:>9.1f}{self.latency.p95_ms:>9.1f}")
        return "\n".join(lines)


# -- channels -----------------------------------------------------------------------------------
_END = object()


class Channel:
    """A bounded FIFO between two threads.

    ``drop_stale=False``: ``put`` waits while the channel is full (every item arrives).
    ``drop_stale=True``: ``put`` evicts the oldest item instead and hands it to ``on_drop``
    (the newest item wins). ``close`` marks the end of the items; ``stop`` aborts both ends.
    """

    def __init__(self, capacity: int, drop_stale: bool = False, on_drop=None) -> None:
        self.capacity, self.drop_stale, self.on_drop = max(1, capacity), drop_stale, on_drop
        self._items: collections.deque = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._stopped = False

    def put(self, item) -> bool:
        """Add ``item``; False if the channel was stopped."""
        with self._cond:
            while len(self._items) >= self.capacity and not self._stopped:
                if self.drop_stale:
                    old = self._items.popleft()
                    if self.on_drop is not None:
                        self.on_drop(old)
                else:
                    self._cond.wait(0.1)
            if self._stopped:
                return False
            self._items.append(item)
            self._cond.notify_all()
            return True

    def get(self, abort=None):
        """The next item, or ``_END`` once the channel is closed and empty, or stopped, or
        (while waiting) once the ``abort`` callable returns True."""
        with self._cond:
            while not self._items and not self._closed and not self._stopped:
                if abort is not None and abort():
                    return _END
                self._cond.wait(0.1)
            if self._stopped or not self._items:
                return _END
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()


# -- pipeline -----------------------------------------------------------------------------------
@dataclass
class Result:
    """One processed frame: source index, BGR frame, detections, time stamp (s) and read time."""

    index: int
    frame: np.ndarray
    detections: list
    timestamp: float
    read_at: float
    trails: Optional[dict] = None     # tracks' recent centres (``Tracker.trails``), for drawing


@dataclass
class _Batch:
    frames: list
    places: list     # each frame's Placement in the network input
    blob: np.ndarray
    size: tuple      # network input (width, height) the blob was made for


class Pipeline:
    """decode -> preprocess -> inference -> postprocess on four threads; iterate for Results.

    For files (``source.live`` False) every frame comes out, in order, and ``batch`` frames
    share one forward pass (the last batch is padded, so no new executor is built). For live
    sources ``batch`` is 1 and the channels in front of inference hold one item each and drop
    the older one, so inference always takes the newest frame; drops are counted in
    ``stats.dropped``. Blobs come from a fixed pool per network input size (one size for a
    whole video, unless frame sizes change under ``fit="crop"``), so nothing is allocated
    per frame beyond the decoded image itself.
    """

    def __init__(self, detector, source: Source, *, thresh: float = 0.25, nms: float = 0.45, batch: int = 1,
                 depth: int = 2) -> None:
        self.detector, self.source, self.thresh, self.nms = detector, source, thresh, nms
        self.live = source.live
        self.batch = 1 if self.live else max(1, int(batch))
        self.stats = StreamStats(source.name, self.batch)
        if self.live:
            self._decoded = Channel(1, True, lambda _: self.stats.count_drop())
            self._blobs = Channel(1, True, self._drop_batch)
            self._heads, self._results = Channel(1), Channel(1)
        else:
            self._decoded, self._blobs = Channel(depth), Channel(depth)
            self._heads, self._results = Channel(depth * self.batch), Channel(depth)
        self._pools: dict = {}          # network size -> deque of free (batch, C, H, W) blobs
        self._pool_cond = threading.Condition()
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        self._interrupted = False       # a plain flag: safe to set from a signal handler
        self._threads: list = []
        if source.size is not None:     # compile for this batch and size now, not on the first frame
            ex = detector.executor(self.batch, detector.net_size_for(*source.size))
            if detector.device_preprocess:
                detector.device_path.decoder(ex)
        if detector.device_preprocess and source.frame_array is None:
            source.frame_array = detector.frame_array     # frames decoded into pinned memory

    # The four stages. Each ends by closing its output channel, so the end flows downstream.
    def _decode(self) -> None:
        src, times = self.source, self.stats.stages["decode"]
        try:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                frame = src.read()
                if frame is None:
                    break
                times.add(time.perf_counter() - t0)
                self.stats.read += 1
                if not self._decoded.put(frame):
                    break
        finally:
            self.stats.corrupt, self.stats.reconnects = src.corrupt, src.reconnects
            if not self.stats.end:      # the reader may already have ended the run
                self.stats.end = src.end_reason
            self._decoded.close()

    def _preprocess(self) -> None:
        times, det = self.stats.stages["preprocess"], self.detector
        batch: Optional[_Batch] = None
        try:
            while True:
                frame = self._decoded.get()
                if frame is _END:
                    break
                t0 = time.perf_counter()
                h, w = frame.image.shape[:2]
                place = det.placement(w, h)
                size = (place.net_w, place.net_h)
                if batch is not None and batch.size != size:   # a batch shares one network size
                    if not self._blobs.put(batch):
                        return
                    batch = None
                if batch is None:
                    blob = None if det.device_preprocess else self._take_blob(size)
                    if blob is None and not det.device_preprocess:
                        return
                    batch = _Batch([], [], blob, size)
                if batch.blob is not None:  # else the device resizes it, after submit
                    to_blob(frame.image, size[0], size[1], out=batch.blob[len(batch.frames)], place=place)
                times.add(time.perf_counter() - t0)
                batch.frames.append(frame)
                batch.places.append(place)
                if len(batch.frames) == self.batch:
                    if not self._blobs.put(batch):
                        return
                    batch = None
            if batch is not None:
                self._blobs.put(batch)
        finally:
            self._blobs.close()

    def _infer(self) -> None:
        times = self.stats.stages["inference"]
        try:
            while True:
                item = self._blobs.get()
                if item is _END:
                    break
                t0 = time.perf_counter()
                if item.blob is None:       # device path: enqueue only; postprocess waits for it
                    images = [f.image for f in item.frames]
                    images += images[-1:] * (self.batch - len(images))   # pad: no new executor for the last batch
                    pending = self.detector.submit(images, self.thresh, self.nms)
                    times.add(time.perf_counter() - t0)
                    for i, (frame, place) in enumerate(zip(item.frames, item.places)):
                        if not self._heads.put((frame, (pending, i), place)):
                            return
                    continue
                outs = self.detector.forward(item.blob)
                times.add(time.perf_counter() - t0)
                self._give_blob(item)
                for i, (frame, place) in enumerate(zip(item.frames, item.places)):
                    if not self._heads.put((frame, [o[i] for o in outs], place)):
                        return
        finally:
            self._heads.close()

    def _postprocess(self) -> None:
        times = self.stats.stages["postprocess"]
        try:
            while True:
                item = self._heads.get()
                if item is _END:
                    break
                frame, heads, place = item
                t0 = time.perf_counter()
                h, w = frame.image.shape[:2]
                if isinstance(heads, tuple):    # a frame in flight on the device path
                    dets = self.detector.result(heads[0])[heads[1]]
                else:
                    dets = self.detector.postprocess(heads, w, h, self.thresh, self.nms, place)
                times.add(time.perf_counter() - t0)
                if not self._results.put(Result(frame.index, frame.image, dets, frame.timestamp, frame.read_at)):
                    return
        finally:
            self._results.close()

    # Blob pools: per network size, enough batch buffers for every item that can be in flight
    # (one being filled, a full channel, one in inference), made when the size is first seen.
    def _take_blob(self, size: tuple) -> Optional[np.ndarray]:
        with self._pool_cond:
            pool = self._pools.get(size)
            if pool is None:
                shape = (self.batch, self.detector.net.channels, size[1], size[0])
                pool = self._pools[size] = collections.deque(
                    np.zeros(shape, np.float32) for _ in range(self._blobs.capacity + 3))
            while not pool and not self._stop.is_set():
                self._pool_cond.wait(0.1)
            return pool.popleft() if pool else None

    def _give_blob(self, item: _Batch) -> None:
        if item.blob is None:
            return
        with self._pool_cond:
            self._pools[item.size].append(item.blob)
            self._pool_cond.notify_all()

    def _drop_batch(self, item: _Batch) -> None:
        self.stats.count_drop(len(item.frames))
        self._give_blob(item)

    def _guard(self, stage):
        """Run one stage; an exception stops the whole pipeline and is re-raised to the reader."""
        def run() -> None:
            try:
                stage()
            except BaseException as e:   # noqa: B902 - handed to the consuming thread
                if self._error is None:
                    self._error = e
                self.stop()
        return run

    # -- control -------------------------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            return
        self.stats.started = time.monotonic()
        for name, stage in (("decode", self._decode), ("preprocess", self._preprocess),
                            ("inference", self._infer), ("postprocess", self._postprocess)):
            t = threading.Thread(target=self._guard(stage), name=f"yolo-cl-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def interrupt(self) -> None:
        """End the iteration at the next frame boundary without waiting for the next result.
        Only sets a flag, so a signal handler may call it."""
        self._interrupted = True

    def stop(self) -> None:
        """Ask every stage to finish now (frames in flight are abandoned)."""
        self._stop.set()
        self.source.interrupt()
        for ch in (self._decoded, self._blobs, self._heads, self._results):
            ch.stop()

    def close(self, timeout: float = 30.0) -> None:
        """Stop and wait for the stage threads; the stats are final afterwards.

        The decode thread gets at most 2 s: a camera or stream stuck inside OpenCV cannot be
        woken, and Ctrl-C should not wait for it (it is a daemon thread; ``reading`` then
        stays True and the source must not be released under it)."""
        self.stop()
        deadline = time.monotonic() + timeout
        for t in self._threads[1:] + self._threads[:1]:
            limit = deadline - time.monotonic()
            t.join(max(0.0, min(limit, 2.0) if t is self._threads[0] else limit))
        if self.stats.finished is None:
            self.stats.finished = time.monotonic()

    @property
    def reading(self) -> bool:
        """Whether the decode thread may still be inside ``source.read``."""
        return bool(self._threads) and self._threads[0].is_alive()

    def __iter__(self) -> Iterator[Result]:
        self.start()
        lat = self.stats.latency
        interrupted = lambda: self._interrupted   # noqa: E731
        try:
            while not self._interrupted:
                r = self._results.get(interrupted)
                if r is _END:
                    break
                self.stats.frames += 1
                lat.add(time.monotonic() - r.read_at)
                yield r
            if self._error is not None:
                raise self._error
            if self._interrupted:
                self.stats.end = "interrupted"
            self.stats.finished = time.monotonic()
        finally:
            self.close()


class OutputStages:
    """Drawing and writing beside inference: ``put`` hands a Result to a draw thread, which
    passes (result, annotated frame) in order to a write thread calling ``write``. A video
    output then runs at the rate of the slower of drawing and encoding (OpenCV releases the
    GIL in both), not at the rate of their sum in the thread that also collects results."""

    def __init__(self, write, names, drawing: bool, times: Optional[StageTimes] = None, depth: int = 4) -> None:
        self._write, self._names, self._drawing, self._times = write, names, drawing, times
        self._todo, self._drawn = Channel(depth), Channel(depth)
        self._error: Optional[BaseException] = None
        self._threads = [threading.Thread(target=self._guard(f), name=f"yolo-cl-{n}", daemon=True)
                         for n, f in (("draw", self._draw), ("write", self._writer))]
        for t in self._threads:
            t.start()

    _guard = Pipeline._guard     # a failing stage records its error and stops the others

    def _draw(self) -> None:
        from .draw import draw
        try:
            while True:
                r = self._todo.get()
                if r is _END:
                    break
                t0 = time.perf_counter()
                annotated = draw(r.frame, r.detections, self._names, r.trails) if self._drawing else None
                if not self._drawn.put((r, annotated, time.perf_counter() - t0)):
                    return
        finally:
            self._drawn.close()

    def _writer(self) -> None:
        while True:
            item = self._drawn.get()
            if item is _END:
                break
            r, annotated, drawn_s = item
            t0 = time.perf_counter()
            self._write(r, annotated)
            if self._times is not None:
                self._times.add(drawn_s + time.perf_counter() - t0)

    def put(self, r: "Result") -> bool:
        """Queue one result (waits while both stages are ``depth`` frames behind); False after a failure."""
        if self._error is not None:
            return False
        return self._todo.put(r)

    def stop(self) -> None:
        """Abandon the frames still queued."""
        self._todo.stop()
        self._drawn.stop()

    def close(self) -> None:
        """Finish the queued frames and wait for both threads; re-raises a stage's failure."""
        self._todo.close()
        for t in self._threads:
            t.join()
        if self._error is not None:
            raise self._error


def stream(detector, source, *, thresh: float = 0.25, nms: float = 0.45, batch: int = 1,
           live: Optional[bool] = None, reconnect: int = 5, backoff: float = 1.0, timeout: float = 10.0,
           fps: Optional[float] = None, stats: Optional[list] = None, track: bool = False,
           track_age: int = 30) -> Iterator[tuple]:
    """Yield ``(frame_index, frame, detections)`` for every frame the pipeline processes.

    See ``open_source`` for ``source``, ``live``, ``reconnect``, ``backoff``, ``timeout`` and
    ``fps``. Pass a list as ``stats`` to receive the run's StreamStats when it ends. ``track``
    gives each detection a ``track_id`` that stays with its object across frames (a track
    survives ``track_age`` frames without a detection; see ``yolo_cl.track``).
    """
    tracker = tracker_for(track, track_age)
    src = open_source(source, live=live, reconnect=reconnect, backoff=backoff, timeout=timeout, fps=fps)
    pipe = None
    try:
        pipe = Pipeline(detector, src, thresh=thresh, nms=nms, batch=batch)
        if stats is not None:
            stats.append(pipe.stats)
        for r in pipe:
            if tracker is not None:
                r.detections = tracker.update(r.detections, r.index)
            yield r.index, r.frame, r.detections
    finally:
        if pipe is not None:
            pipe.close()
        if src is not source and not (pipe is not None and pipe.reading):
            src.close()


def tracker_for(track: bool, max_age: int):
    """A Tracker for ``track=True`` (scipy is needed: the ``track`` extra), else None."""
    if not track:
        return None
    try:
        import scipy.optimize  # noqa: F401
    except ImportError:
        raise YoloClError("tracking needs scipy: pip install 'yolo-cl[track]'") from None
    from .track import Tracker
    return Tracker(max_age=max_age)
