"""``yolo-cl serve --workers N``: N server processes on one port, each with its own Detector.

One Python process parses every request, decodes its JPEG, batches, post-processes and writes
the JSON under one GIL; past a few hundred requests a second (a GPU) that process, not the
device, is the limit. Here a supervisor starts N worker processes (``multiprocessing``'s spawn:
no OpenCL state is ever forked). Worker K builds its own Detector on device ``K mod len(devices)``
(two workers on one device: two contexts) and its own uvicorn, listening on the same port with
SO_REUSEPORT, so the kernel spreads new connections over the workers. Worker 0 also runs the
``--source`` streams; the others pass ``GET /streams...`` to it over a Unix socket, and whichever
worker is asked ``GET /metrics`` gathers every worker's figures (label ``worker``).

Several workers share each device, so a thread that spins in the driver's wait (NVIDIA's does,
for as long as the device works) takes a core the others' JPEG decodes need: workers wait by
sleeping through most of a predictable wait (``YOLO_CL_WAIT=sleep``, ``engine/waiting.py``)
unless ``YOLO_CL_WAIT`` says otherwise (worker 0, when it runs streams, keeps the driver's).
On two H100s that cut the server's CPU from 11.9 to 7.0 ms an image at the same or better
throughput (BENCHMARKS.md, "Eleventh GPU session").

A worker listens only once its executors are built. One that dies is started again (after a
pause that grows while it keeps dying young); SIGTERM and SIGINT stop every worker and end
the supervisor (exit status 0 and 130, as the single-process server).
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import secrets
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

from .errors import YoloClError
from .noise import for_children

START_TIMEOUT_S = 600.0       # a cold start compiles every kernel
STOP_TIMEOUT_S = 15.0
YOUNG_S = 10.0                # a worker that dies younger than this is restarted after a growing pause


@dataclass
class WorkerPlan:
    """Everything a worker process needs (it is pickled to the worker)."""

    detector: dict                  # Detector(**detector, device=...)
    devices: list                   # device specs; worker K takes devices[K % len(devices)]
    workers: int
    host: str = "127.0.0.1"
    port: int = 8080
    limits: object = None           # serve.Limits
    max_batch: int = 8
    max_wait_ms: float = 0.0
    max_queue: int = 64
    sources: list = field(default_factory=list)
    thresh: float = 0.25
    nms: float = 0.45
    sockdir: str = ""
    token: str = ""


class _Worker:
    """One worker process and the pipe it reports on."""

    def __init__(self, plan: WorkerPlan, index: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.index = index
        self.conn, child = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=worker_main, args=(plan, index, child), name=f"yolo-cl-worker-{index}")
        with for_children():                # the worker's own lines (a failed request) reach the real stderr
            self.proc.start()
        child.close()
        self.started = time.monotonic()

    def report(self) -> Optional[tuple]:
        """The worker's message, ("ready", pid) or ("error", text), if one has arrived."""
        try:
            return self.conn.recv() if self.conn.poll() else None
        except (EOFError, OSError):
            return None


def run_workers(plan: WorkerPlan, announce=sys.stderr) -> None:
    """Start ``plan.workers`` workers on one port, keep them running until SIGTERM (returns) or
    SIGINT (KeyboardInterrupt), then stop them all. YoloClError if a worker cannot start."""
    from .serve import _Terminated, _terminated, address, listen
    probe = listen(plan.host, plan.port)        # fails if anyone holds the port, even with SO_REUSEPORT
    port = probe.getsockname()[1]
    probe.close()
    reserve = listen(plan.host, port, reuseport=True)      # holds the port while workers come and go
    old = signal.signal(signal.SIGTERM, _terminated)
    workers: list = []
    try:
        with tempfile.TemporaryDirectory(prefix="yolo-cl-serve-") as sockdir:
            plan.port = port
            plan.sockdir, plan.token = sockdir, secrets.token_hex(16)
            try:
                workers = [_Worker(plan, k) for k in range(plan.workers)]
                _wait_ready(workers)
                if announce is not None:
                    devices = len({plan.devices[k % len(plan.devices)] for k in range(plan.workers)})
                    print(f"yolo-cl serve: listening on {address(plan.host, plan.port)} ({plan.workers} workers on "
                          f"{devices} device(s), {len(plan.sources)} stream(s))", file=announce, flush=True)
                _watch(plan, workers, announce)
            except _Terminated:
                pass
            finally:
                _stop(workers)
    finally:
        signal.signal(signal.SIGTERM, old)
        reserve.close()


def _wait_ready(workers: list) -> None:
    """Until every worker says ready; YoloClError with the first failure's message."""
    waiting = list(workers)
    deadline = time.monotonic() + START_TIMEOUT_S
    while waiting:
        for w in list(waiting):
            msg = w.report()
            if msg is not None and msg[0] == "error":
                raise YoloClError(msg[1])
            if msg is not None:
                waiting.remove(w)
            elif not w.proc.is_alive():
                raise YoloClError(f"server worker {w.index} ended with status {w.proc.exitcode} while starting")
        if time.monotonic() > deadline:
            raise YoloClError(f"server workers not ready after {START_TIMEOUT_S:.0f} s")
        multiprocessing.connection.wait([w.proc.sentinel for w in waiting] + [w.conn for w in waiting], 0.5)


def _watch(plan: WorkerPlan, workers: list, announce) -> None:
    """Restart workers that end, forever (until a signal)."""
    pause = {w.index: 0.0 for w in workers}
    while True:
        multiprocessing.connection.wait([w.proc.sentinel for w in workers], 1.0)
        for k, w in enumerate(workers):
            w.report()                            # drop "ready" notes of restarted workers
            if w.proc.is_alive():
                continue
            young = time.monotonic() - w.started < YOUNG_S
            pause[k] = min(30.0, max(1.0, 2 * pause[k])) if young else 0.0
            if announce is not None:
                print(f"yolo-cl serve: worker {k} (pid {w.proc.pid}) ended with status {w.proc.exitcode}; "
                      f"starting it again{f' in {pause[k]:.0f} s' if pause[k] else ''}", file=announce, flush=True)
            w.conn.close()
            time.sleep(pause[k])
            workers[k] = _Worker(plan, k)


def _stop(workers: list) -> None:
    """SIGTERM to every worker, then wait for them (SIGKILL for one that does not end)."""
    for w in workers:
        if w.proc.is_alive():
            try:
                os.kill(w.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for w in workers:
        w.proc.join(max(0.1, deadline - time.monotonic()))
        if w.proc.is_alive():
            w.proc.kill()
            w.proc.join(5.0)
        w.conn.close()


def _end_with_parent() -> None:
    """SIGTERM this worker when the supervisor is gone (killed outright), so no orphan keeps the port."""
    import threading
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="yolo-cl-parent-watch", daemon=True).start()


def worker_environment(plan: WorkerPlan, index: int, environ=os.environ) -> None:
    """What worker ``index`` sets in its own environment before building its Detector: sleeping
    device waits when there are several workers, unless the user chose a wait mode, or this is
    worker 0 running ``--source`` streams (whose short back-to-back waits sleeping slowed: eight
    streams on two H100s ran 1026 frames/s with it against 1383 without)."""
    from .waiting import WAIT_ENV
    if plan.workers > 1 and not (index == 0 and plan.sources):
        environ.setdefault(WAIT_ENV, "sleep")


def worker_main(plan: WorkerPlan, index: int, conn) -> None:
    """A worker process: its Detector and Fleet, worker 0's streams, then uvicorn on the shared
    port and its own Unix socket until SIGTERM/SIGINT."""
    import socket
    from .detector import Detector
    from .fleet import Fleet
    from .noise import routed
    from .serve import Peers, build_app, listen, run_app
    sock = unix = fleet = None
    _end_with_parent()
    worker_environment(plan, index)
    try:
        with routed(False):
            try:
                det = Detector(**plan.detector, device=plan.devices[index % len(plan.devices)])
                fleet = Fleet([det], max_batch=plan.max_batch, max_wait_ms=plan.max_wait_ms, max_queue=plan.max_queue)
                if index == 0:
                    for src in plan.sources:
                        fleet.add_stream(src, thresh=plan.thresh, nms=plan.nms, loop=True, live=True)
                while not fleet.ready:
                    time.sleep(0.02)
                peers = Peers(index, plan.workers, plan.sockdir, plan.token)
                app = build_app(fleet, plan.limits, peers=peers)
                sock = listen(plan.host, plan.port, reuseport=True)
                sock.listen(1024)
                path = peers.path(index)
                if os.path.exists(path):
                    os.unlink(path)             # left by this worker's previous life
                unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                unix.bind(path)
                unix.listen(64)
            except YoloClError as e:
                conn.send(("error", f"server worker {index}: {e}"))
                sys.exit(2)
            conn.send(("ready", os.getpid()))
            conn.close()
            run_app(app, [sock, unix])
    except KeyboardInterrupt:
        pass
    finally:
        for s in (sock, unix):
            if s is not None:
                s.close()
        if fleet is not None:
            fleet.close()
