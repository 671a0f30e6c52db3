"""``yolo-cl serve``: a Fleet behind HTTP (Starlette on uvicorn; ``pip install "yolo-cl[serve]"``).

Endpoints:

* ``POST /detect`` — an encoded image (the raw body, or the multipart field ``file``); query
  ``thresh`` and ``nms``. The answer is the image's Darknet ``-out`` JSON object. Requests
  are batched across clients by the Fleet's per-device Batchers.
* ``GET /streams``, ``GET /streams/{id}.mjpg`` (annotated MJPEG, as Darknet's ``-mjpeg_port``),
  ``GET /streams/{id}/events`` (one JSON line per frame, as Darknet's ``-json_port``).
* ``GET /`` (a page showing every stream live), ``GET /healthz``, ``GET /metrics`` (Prometheus).

Each ``/detect`` answer's ``Server-Timing`` header splits its time into body, decode, queue,
batch and reply. ``yolo_cl.workers`` runs several of these servers on one port (``--workers``).

Limits keep memory bounded whatever clients send: a body size cap (checked while reading),
a pixel cap read from the image header *before* decoding (so a small PNG cannot inflate to
gigabytes), only JPEG, PNG, BMP and WebP accepted, at most ``max_queue`` requests waiting plus
one batch per device in progress (past that: 503 at once), and a per-request timeout (504).
Nothing a request says is used as a path: bodies are parsed in memory. Every error answer
is one line of JSON, ``{"error": "..."}``, with its status code.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .darknet_json import json_frame
from .errors import ImageError, YoloClError
from .limits import image_header_size
from .fleet import Fleet, QueueFull

try:
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as _e:          # pragma: no cover - depends on the install
    raise YoloClError(f"yolo-cl serve needs the serve extra: pip install \"yolo-cl[serve]\" ({_e})") from None

MIB = 1 << 20
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
POLL_S = 0.02                      # how often a live HTTP stream looks for a new frame
INLINE_PIXELS = 2_000_000          # largest image decoded on the event loop's thread (a few ms)


@dataclass
class Limits:
    """What one request may cost."""

    max_body: int = 16 * MIB        # bytes of request body
    max_pixels: int = 40_000_000    # width x height of the encoded image
    timeout: float = 30.0           # seconds from arrival to answer


# -- image bodies -------------------------------------------------------------------------------
class LimitExceeded(ImageError):
    """A request over a size limit (HTTP 413)."""


class UnsupportedFormat(ImageError):
    """Not one of the image formats the server decodes (HTTP 415)."""


def check_image_header(data: bytes, max_pixels: int) -> tuple:
    """(width, height) an uploaded image's header declares, within ``max_pixels``; ImageError
    (-> 4xx) otherwise. Reads the header only: cheap enough for any thread."""
    if not data:
        raise ImageError("empty body: send an image (raw bytes, or the multipart field 'file')")
    size = image_header_size(data)
    if size is None:
        raise UnsupportedFormat("not a JPEG, PNG, BMP, WebP or PNM image")
    w, h = size
    if w < 1 or h < 1:
        raise ImageError(f"the image header says {w}x{h} pixels")
    if w * h > max_pixels:
        raise LimitExceeded(f"the image has {w}x{h} pixels, more than the limit of {max_pixels}")
    return w, h


def decode_image(data: bytes) -> np.ndarray:
    """Decode an uploaded image whose header ``check_image_header`` passed; ImageError (-> 400)
    if it is truncated or corrupt."""
    import cv2
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    except cv2.error:
        img = None
    if img is None:
        raise ImageError("the image cannot be decoded (truncated or corrupt)")
    return img


def multipart_file(body: bytes, content_type: str, field: str = "file") -> tuple:
    """(data, filename) of the form field ``field`` in a multipart body, parsed in memory."""
    from python_multipart.multipart import MultipartParser, parse_options_header
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise ImageError("multipart body without a boundary")
    parts: list = []
    cur: dict = {}

    def on_part_begin() -> None:
        cur.clear()
        cur.update(headers={}, data=[], field=b"", value=b"")

    def on_header_field(data, start, end) -> None:
        cur["field"] += data[start:end]

    def on_header_value(data, start, end) -> None:
        cur["value"] += data[start:end]

    def on_header_end() -> None:
        cur["headers"][cur["field"].lower()] = cur["value"]
        cur["field"] = cur["value"] = b""

    def on_part_data(data, start, end) -> None:
        cur["data"].append(data[start:end])

    def on_part_end() -> None:
        parts.append((cur["headers"], b"".join(cur["data"])))

    parser = MultipartParser(boundary, {"on_part_begin": on_part_begin, "on_header_field": on_header_field,
                                        "on_header_value": on_header_value, "on_header_end": on_header_end,
                                        "on_part_data": on_part_data, "on_part_end": on_part_end})
    try:
        parser.write(body)
        parser.finalize()
    except Exception as e:        # noqa: BLE001 - python-multipart raises several kinds
        raise ImageError(f"malformed multipart body ({e})") from None
    for headers, data in parts:
        _, disp = parse_options_header(headers.get(b"content-disposition", b""))
        if disp.get(b"name", b"").decode("latin-1") == field:
            return data, disp.get(b"filename", b"").decode("utf-8", "replace")
    raise ImageError(f"multipart body has no field '{field}'")


# -- metrics ------------------------------------------------------------------------------------
class Histogram:
    """A Prometheus histogram: cumulative bucket counts, sum and count."""

    def __init__(self, buckets: tuple) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0
        self._lock = threading.Lock()

    def observe(self, v: float) -> None:
        with self._lock:
            for i, b in enumerate(self.buckets):
                if v <= b:
                    self.counts[i] += 1
            self.sum += v
            self.count += 1

    def lines(self, name: str) -> list:
        with self._lock:
            out = [f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts)]
            out += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum:.6f}",
                    f"{name}_count {self.count}"]
        return out


def _label(v) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """The server's counters, rendered in the Prometheus text format by ``render``."""

    def __init__(self) -> None:
        self.requests: dict = {}            # status code -> count
        self.latency = Histogram(LATENCY_BUCKETS)
        self.batch = Histogram(BATCH_BUCKETS)
        self.batch_time = Histogram(LATENCY_BUCKETS)
        self.in_flight = 0
        self._lock = threading.Lock()

    def count(self, code: int) -> None:
        with self._lock:
            self.requests[code] = self.requests.get(code, 0) + 1

    def on_batch(self, size: int, seconds: float) -> None:
        self.batch.observe(size)
        self.batch_time.observe(seconds)

    def families(self, fleet: Fleet) -> list:
        """The metric families ``(name, type, help, sample lines)`` of this process."""
        with self._lock:
            codes = sorted(self.requests.items())
        fams = [("yolo_cl_requests_total", "counter", "POST /detect answers by status code.",
                 [f'yolo_cl_requests_total{{code="{c}"}} {n}' for c, n in codes]),
                ("yolo_cl_request_seconds", "histogram",
                 "POST /detect time from arrival to answer (answered requests).",
                 self.latency.lines("yolo_cl_request_seconds")),
                ("yolo_cl_batch_size", "histogram", "Images per detect_batch call.",
                 self.batch.lines("yolo_cl_batch_size")),
                ("yolo_cl_batch_seconds", "histogram", "Time of one batch on its device (detect_batch calls).",
                 self.batch_time.lines("yolo_cl_batch_seconds")),
                ("yolo_cl_queue_length", "gauge", "Requests waiting for a batch.", [f"yolo_cl_queue_length {fleet.queued}"]),
                ("yolo_cl_queue_capacity", "gauge", "Requests that may wait before 503.",
                 [f"yolo_cl_queue_capacity {fleet.max_queue}"]),
                ("yolo_cl_requests_in_flight", "gauge", "POST /detect requests being handled.",
                 [f"yolo_cl_requests_in_flight {self.in_flight}"]),
                ("yolo_cl_devices", "gauge", "Detectors (device contexts) serving.",
                 [f"yolo_cl_devices {len(fleet.detectors)}"])]
        runs = list(fleet.streams.values())
        for name, kind, help_, get in (
                ("yolo_cl_stream_fps", "gauge", "Frames per second of a stream.", lambda s: round(s.stats.fps, 3)),
                ("yolo_cl_stream_frames_total", "counter", "Frames processed.", lambda s: s.stats.frames),
                ("yolo_cl_stream_dropped_total", "counter", "Frames dropped (live sources keep the newest).",
                 lambda s: s.stats.dropped),
                ("yolo_cl_stream_latency_seconds", "gauge", "Mean time from frame read to detections.",
                 lambda s: round(s.stats.latency.mean_ms / 1000.0, 6)),
                ("yolo_cl_stream_running", "gauge", "1 while the stream runs.", lambda s: int(s.running))):
            fams.append((name, kind, help_, [f'{name}{{stream="{s.id}",source="{_label(s.name)}",device="{s.device}"}} '
                                             f"{get(s)}" for s in runs]))
        return fams

    def render(self, fleet: Fleet) -> str:
        return render_families(self.families(fleet))


def render_families(fams: list) -> str:
    """The Prometheus text format of ``(name, type, help, samples)`` families."""
    out: list = []
    for name, kind, help_, samples in fams:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *samples]
    return "\n".join(out) + "\n"


def with_label(sample: str, label: str) -> str:
    """A Prometheus sample line with ``label`` (``key="value"``) added first to its labels."""
    name, _, rest = sample.partition(" ")
    if name.endswith("}"):
        head, _, labels = name.partition("{")
        return f"{head}{{{label},{labels} {rest}"
    return f"{name}{{{label}}} {rest}"


def merge_families(per_worker: list) -> list:
    """Families of several processes as one list: each family once, its samples labelled
    ``worker="K"`` (``per_worker``: ``(K, families)`` pairs)."""
    merged: dict = {}
    for k, fams in per_worker:
        for name, kind, help_, samples in fams:
            entry = merged.setdefault(name, (name, kind, help_, []))
            entry[3].extend(with_label(s, f'worker="{k}"') for s in samples)
    return list(merged.values())


def server_timing(marks: list, batch: int, inline: bool = False) -> str:
    """The ``Server-Timing`` header of one answer: where its milliseconds went, from the monotonic
    ``marks`` arrival, body read, decoded, batch start, batch end, answer built; the batch size,
    and ``path;desc=inline`` when it ran on the event loop's thread (an idle device)."""
    names = ("body", "decode", "queue", "batch", "reply")
    parts = [f"{n};dur={(b - a) * 1000.0:.3f}" for n, a, b in zip(names, marks, marks[1:])]
    return ", ".join(parts + [f"size;desc={batch}", f"path;desc={'inline' if inline else 'queued'}"])


# -- the application ------------------------------------------------------------------------------
class FailureLog:
    """One stderr line per request the server failed (a 500), so an operator sees why; under a
    storm of them at most one line a second, with how many were not shown."""

    def __init__(self, out=None, every_s: float = 1.0, clock=time.monotonic) -> None:
        self.out, self.every_s, self.clock = out, every_s, clock
        self.last = -float("inf")
        self.unshown = 0

    def note(self, what: str) -> None:
        now = self.clock()
        if now - self.last < self.every_s:
            self.unshown += 1
            return
        more = f" ({self.unshown} more failed since the last line)" if self.unshown else ""
        print(f"yolo-cl serve: {' '.join(what.split())}{more}", file=self.out or sys.stderr, flush=True)
        self.last, self.unshown = now, 0


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(message).split())}, status_code=status)


def _fraction(request: Request, name: str, default: float) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise HTTPException(400, f"query {name}='{raw[:40]}' is not a number") from None
    if not 0.0 <= v <= 1.0:
        raise HTTPException(400, f"query {name}={raw[:40]} is not in [0, 1]")
    return v


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"body of {declared} bytes is over the limit of {limit}")
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise HTTPException(413, f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def http_status(e: ImageError) -> int:
    """The HTTP status of a refused image: 413 over a limit, 415 not a format we take, else 400."""
    return 413 if isinstance(e, LimitExceeded) else 415 if isinstance(e, UnsupportedFormat) else 400


async def read_image_body(request: Request, limits: Limits, marks: Optional[list] = None) -> tuple:
    """(encoded image bytes, thresh, nms, filename) of a ``POST /detect`` request, its header
    checked against ``limits`` but not decoded; HTTPException 400, 413 or 415 otherwise.
    ``marks`` gets the monotonic time the body was read."""
    thresh, nms = _fraction(request, "thresh", 0.25), _fraction(request, "nms", 0.45)
    body = await _read_body(request, limits.max_body)
    if marks is not None:
        marks.append(time.monotonic())
    ctype = request.headers.get("content-type", "")
    filename = "request"
    try:
        if ctype.lower().startswith("multipart/form-data"):
            body, filename = multipart_file(body, ctype)
            filename = filename or "request"
        check_image_header(body, limits.max_pixels)
    except ImageError as e:
        raise HTTPException(http_status(e), str(e)) from None
    return body, thresh, nms, filename


async def decode_body(body: bytes, limits: Limits, inline: bool = False) -> np.ndarray:
    """The BGR image of a checked body (``read_image_body``); HTTPException 400 if it is corrupt.
    Decoded on a pool thread (other requests go on meanwhile), or with ``inline`` on this one,
    which saves the hand-off when no other request is waiting for the event loop (only up to
    INLINE_PIXELS, so a huge image never holds up the live streams)."""
    try:
        w, h = check_image_header(body, limits.max_pixels)
        if inline and w * h <= INLINE_PIXELS:
            return decode_image(body)
        # asyncio's own pool: anyio's (run_in_threadpool) scans every task of the loop per call
        return await asyncio.to_thread(decode_image, body)
    except ImageError as e:
        raise HTTPException(http_status(e), str(e)) from None


async def read_image_request(request: Request, limits: Limits, marks: Optional[list] = None,
                             inline: bool = False) -> tuple:
    """(BGR image, thresh, nms, filename) of a ``POST /detect`` request, within ``limits``;
    HTTPException 400, 413 or 415 otherwise (``read_image_body``, then ``decode_body``)."""
    body, thresh, nms, filename = await read_image_body(request, limits, marks)
    return await decode_body(body, limits, inline), thresh, nms, filename


@dataclass
class Peers:
    """This process's place among the ``serve --workers`` processes: worker ``index`` of ``count``.
    Worker K also listens on the Unix socket ``sockdir/K.sock``; worker 0 runs the streams, and
    ``token`` opens the internal route that hands a worker's metrics to the one asked."""

    index: int
    count: int
    sockdir: str
    token: str

    def path(self, k: int) -> str:
        return os.path.join(self.sockdir, f"{k}.sock")


TOKEN_HEADER = "x-yolo-cl-worker"
RELAY_HEADER = "x-yolo-cl-relayed-by"      # names the worker that passed an answer on from worker 0


async def unix_get(path: str, target: bytes, headers: bytes = b"") -> tuple:
    """Start ``GET target`` on the HTTP server at the Unix socket ``path``: (status, response
    headers with lower-case names, async iterator over the body)."""
    reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), 5.0)
    try:
        writer.write(b"GET " + target + b" HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n" + headers + b"\r\n")
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30.0)).decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
    except BaseException:
        writer.close()
        raise
    fields = {}
    for line in head[1:]:
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip().lower()] = value.strip()

    async def body():
        try:
            if fields.get("transfer-encoding", "").lower() == "chunked":
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    if size == 0:
                        return
                    yield await reader.readexactly(size)
                    await reader.readexactly(2)
            else:
                while True:
                    chunk = await reader.read(1 << 16)
                    if not chunk:
                        return
                    yield chunk
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            return
        finally:
            writer.close()

    return status, fields, body()


async def _worker_families(peers: Peers, k: int) -> Optional[list]:
    """Worker ``k``'s metric families, or None when it does not answer (restarting)."""
    try:
        status, _, body = await unix_get(peers.path(k), b"/_worker/metrics",
                                         f"{TOKEN_HEADER}: {peers.token}\r\n".encode())
        data = b"".join([chunk async for chunk in body])
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError):
        return None
    return json.loads(data) if status == 200 else None


def build_app(fleet: Fleet, limits: Optional[Limits] = None, metrics: Optional[Metrics] = None,
              peers: Optional[Peers] = None) -> Starlette:
    """The Starlette application serving ``fleet``. The caller owns the Fleet (and closes it).

    With ``peers`` (``serve --workers``) the stream routes of workers other than 0 are passed
    to worker 0, and ``/metrics`` gathers every worker's figures, labelled ``worker``."""
    limits = limits or Limits()
    metrics = metrics or Metrics()
    relay = peers is not None and peers.index != 0
    for b in fleet.batchers:
        b.on_batch = metrics.on_batch
    # Requests past this are answered 503 before their body is read: queue + one batch per device.
    max_in_flight = fleet.max_queue + sum(b.max_batch for b in fleet.batchers)
    counter = {"n": 0}
    failures = FailureLog()
    jpeg_cache: dict = {}                  # stream id -> (seq, jpeg bytes)
    jpeg_lock = threading.Lock()

    async def detect(request: Request) -> Response:
        t0 = time.monotonic()
        if metrics.in_flight >= max_in_flight:
            metrics.count(503)
            return error_response(503, f"busy: {metrics.in_flight} requests in flight; try again later")
        metrics.in_flight += 1
        try:
            resp = await _detect(request, t0)
        except HTTPException as e:
            resp = error_response(e.status_code, e.detail)
        except Exception as e:               # noqa: BLE001 - answered here, so the connection stays open
            failures.note(f"POST /detect: {type(e).__name__}: {e}")
            resp = error_response(500, f"internal error: {type(e).__name__}")
        finally:
            metrics.in_flight -= 1
        metrics.count(resp.status_code)
        if resp.status_code == 200:
            metrics.latency.observe(time.monotonic() - t0)
        return resp

    async def _detect(request: Request, t0: float) -> Response:
        marks = [t0]
        alone = metrics.in_flight == 1           # nobody else needs the event loop during the decode
        image, thresh, nms, filename = await read_image_request(request, limits, marks, inline=alone)
        marks.append(time.monotonic())
        try:
            # Still alone: an idle device runs it right here (no hand-off to the batch thread and back).
            req = fleet.enqueue(image, thresh, nms, inline=metrics.in_flight == 1)
        except QueueFull as e:
            return error_response(503, str(e))
        left = limits.timeout - (time.monotonic() - t0)
        try:
            if not req.future.done():
                await asyncio.wait_for(asyncio.wrap_future(req.future), max(0.001, left))
            elif left < 0:                       # ran inline, and past the time allowed
                raise asyncio.TimeoutError
            dets = req.future.result()
        except asyncio.TimeoutError:
            return error_response(504, f"no answer within {limits.timeout:g} s")
        except YoloClError as e:
            failures.note(f"POST /detect: {e}")
            return error_response(500, str(e))
        counter["n"] += 1
        h, w = image.shape[:2]
        body = json_frame(counter["n"], filename, dets, w, h, fleet.detectors[0].fit)
        marks += [req.started, req.finished, time.monotonic()]
        return JSONResponse(body, headers={"Server-Timing": server_timing(marks, req.batch, req.inline)})

    async def proxied(request: Request) -> Response:
        """The answer of worker 0 (which runs the streams) to this GET, streamed through."""
        target = request.scope.get("raw_path") or request.url.path.encode()
        if request.url.query:
            target += b"?" + request.url.query.encode("latin-1")
        try:
            status, fields, body = await unix_get(peers.path(0), target)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError):
            return error_response(503, "the streams' worker is restarting; try again")
        keep = {k: v for k, v in fields.items() if k in ("content-type", "cache-control")}
        keep[RELAY_HEADER] = str(peers.index)
        return StreamingResponse(body, status_code=status, headers=keep)

    def _stream(request: Request):
        run = fleet.streams.get(request.path_params["sid"])
        if run is None:
            raise HTTPException(404, f"no stream '{request.path_params['sid'][:40]}'")
        return run

    async def streams(request: Request) -> Response:
        if relay:
            return await proxied(request)
        return JSONResponse([s.summary() for s in fleet.streams.values()])

    def _jpeg(run) -> Optional[tuple]:
        import cv2
        from .draw import draw
        latest = run.latest
        if latest is None:
            return None
        seq, r = latest
        with jpeg_lock:
            hit = jpeg_cache.get(run.id)
            if hit is not None and hit[0] == seq:
                return hit
            ok, buf = cv2.imencode(".jpg", draw(r.frame, r.detections, run.detector.names),
                                   [cv2.IMWRITE_JPEG_QUALITY, 80])
            jpeg_cache[run.id] = (seq, buf.tobytes() if ok else b"")
            return jpeg_cache[run.id]

    async def mjpeg(request: Request) -> Response:
        if relay:
            return await proxied(request)
        run = _stream(request)

        async def parts():
            last = -1
            while True:
                if run.seq != last:
                    got = await run_in_threadpool(_jpeg, run)
                    if got is not None and got[1]:
                        last, jpg = got
                        yield (b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: "
                               + str(len(jpg)).encode() + b"\r\n\r\n" + jpg + b"\r\n")
                        continue
                if not run.running and run.seq == last:
                    return
                await asyncio.sleep(POLL_S)

        return StreamingResponse(parts(), media_type="multipart/x-mixed-replace; boundary=frame",
                                 headers={"Cache-Control": "no-store"})

    async def events(request: Request) -> Response:
        if relay:
            return await proxied(request)
        run = _stream(request)

        async def lines():
            last = max(0, run.seq - 1)           # start with the newest frame
            while True:
                evs = run.events_since(last)
                for seq, ev in evs:
                    last = seq
                    yield json.dumps(ev) + "\n"
                if not evs:
                    if not run.running and run.seq == last:
                        return
                    await asyncio.sleep(POLL_S)

        return StreamingResponse(lines(), media_type="application/x-ndjson", headers={"Cache-Control": "no-store"})

    async def healthz(request: Request) -> Response:
        ready = fleet.ready
        body = {"status": "ok" if ready else "warming", "devices": [d.runtime.device_name for d in fleet.detectors],
                "queued": fleet.queued, "streams": len(fleet.streams)}
        if peers is not None:
            body.update(worker=peers.index, workers=peers.count, pid=os.getpid())
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics_page(request: Request) -> Response:
        if peers is None:
            return PlainTextResponse(metrics.render(fleet), media_type="text/plain; version=0.0.4")
        got = await asyncio.gather(*(_worker_families(peers, k) for k in range(peers.count)))
        fams = merge_families([(k, f) for k, f in enumerate(got) if f is not None])
        fams.append(("yolo_cl_workers", "gauge", "Server processes answering / configured.",
                     [f'yolo_cl_workers{{state="answering"}} {sum(f is not None for f in got)}',
                      f'yolo_cl_workers{{state="configured"}} {peers.count}']))
        return PlainTextResponse(render_families(fams), media_type="text/plain; version=0.0.4")

    async def worker_metrics(request: Request) -> Response:
        if peers is None or request.headers.get(TOKEN_HEADER) != peers.token:
            return error_response(404, "Not Found")
        return JSONResponse(metrics.families(fleet))

    async def index(request: Request) -> Response:
        return HTMLResponse(PAGE)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return error_response(exc.status_code, exc.detail)

    async def server_error(request: Request, exc: Exception) -> Response:
        return error_response(500, f"internal error: {type(exc).__name__}")

    routes = [Route("/", index), Route("/healthz", healthz), Route("/metrics", metrics_page),
              Route("/detect", detect, methods=["POST"]), Route("/streams", streams),
              Route("/streams/{sid}.mjpg", mjpeg), Route("/streams/{sid}/events", events),
              Route("/_worker/metrics", worker_metrics)]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})


# -- running it ---------------------------------------------------------------------------------
def listen(host: str, port: int, reuseport: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``reuseport``: shared with other processes that ask the
    same, the kernel spreading new connections over them); YoloClError if the address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuseport:
        if not hasattr(socket, "SO_REUSEPORT"):
            sock.close()
            raise YoloClError("--workers needs SO_REUSEPORT (Linux, macOS, BSD); leave it out on this system")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise YoloClError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None
    return sock


def address(host: str, port: int) -> str:
    """``http://HOST:PORT`` (IPv6 hosts in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run_app(app: Starlette, sockets: list) -> None:
    """Serve ``app`` on the listening ``sockets`` with uvicorn until SIGINT (KeyboardInterrupt
    once uvicorn has shut down) or SIGTERM (a clean return). uvicorn picks httptools and uvloop
    when installed (the serve extra): 0.3 ms less per request than h11 and asyncio's own loop."""
    import uvicorn
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3, access_log=False)
    server = uvicorn.Server(config)
    old = signal.signal(signal.SIGTERM, _terminated) if threading.current_thread() is threading.main_thread() else None
    try:
        server.run(sockets=sockets)
    except _Terminated:
        pass
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def serve(fleet: Fleet, host: str = "127.0.0.1", port: int = 8080, limits: Optional[Limits] = None,
          announce=sys.stderr) -> None:
    """Serve ``fleet`` until SIGINT/SIGTERM; prints ``listening on http://HOST:PORT`` (the real port if 0)."""
    app = build_app(fleet, limits)
    sock = listen(host, port)
    try:
        sock.listen(1024)
        if announce is not None:
            print(f"yolo-cl serve: listening on {address(host, sock.getsockname()[1])} ({len(fleet.detectors)} "
                  f"device(s), {len(fleet.streams)} stream(s))", file=announce, flush=True)
        run_app(app, [sock])
    finally:
        sock.close()


class _Terminated(Exception):
    """SIGTERM arrived: uvicorn has shut down gracefully and re-raised the signal to us."""


def _terminated(signum, frame) -> None:
    raise _Terminated


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>yolo-cl</title>
<style>
body{font-family:system-ui,sans-serif;margin:0;background:#111;color:#eee}
header{padding:.6em 1em;background:#222;font-weight:600}
main{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,420px),1fr));gap:.8em;padding:.8em}
.card{background:#1c1c1c;border-radius:8px;overflow:hidden}
.card img{width:100%;display:block;background:#000;min-height:120px}
.fig{padding:.4em .7em;font-size:.9em;font-variant-numeric:tabular-nums;word-break:break-all}
.empty{padding:1em;color:#aaa}
</style></head><body>
<header>yolo-cl &middot; <span id="total">&hellip;</span></header>
<main id="streams"><div class="empty">No streams (start the server with --source).
POST an image to /detect for detections.</div></main>
<script>
const shown = {};
function row(s) {
  return s.source + " \\u00b7 device " + s.device + " \\u00b7 " + s.fps.toFixed(1) + " fps \\u00b7 latency " +
    s.latency_ms.toFixed(0) + " ms \\u00b7 dropped " + s.dropped + (s.running ? "" : " \\u00b7 ended: " + s.end);
}
async function refresh() {
  try {
    const list = await (await fetch("streams")).json();
    const main = document.getElementById("streams");
    if (list.length && main.querySelector(".empty")) main.innerHTML = "";
    let total = 0;
    for (const s of list) {
      total += s.running ? s.fps : 0;
      if (!shown[s.id]) {
        const card = document.createElement("div");
        card.className = "card";
        card.id = "stream-" + s.id;
        const img = document.createElement("img");
        img.alt = s.source;
        img.src = "streams/" + encodeURIComponent(s.id) + ".mjpg";
        const fig = document.createElement("div");
        fig.className = "fig";
        card.append(img, fig);
        main.append(card);
        shown[s.id] = fig;
      }
      shown[s.id].textContent = row(s);
    }
    document.getElementById("total").textContent = list.length + " stream(s), " + total.toFixed(1) + " fps total";
  } catch (e) {
    document.getElementById("total").textContent = "server unreachable";
  }
}
refresh();
setInterval(refresh, 1000);
</script></body></html>
"""
