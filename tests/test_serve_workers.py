"""``yolo-cl serve --workers N``: several server processes on one port, over real sockets.

PoCL offers one device, so both workers open it (two contexts); what is tested is the
process layer: both answer on the one port, worker 0's streams and every worker's metrics are
reachable through either, a killed worker comes back, a bounded load loses no request, and
SIGTERM / SIGINT end everything with status 0 / 130.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest

pytest.importorskip("starlette", reason="the serve extra (pip install 'yolo-cl[serve]') is a test dependency")
httpx = pytest.importorskip("httpx")

from test_serve import CLIP, DOG, Server, _burst, call, cli_json  # noqa: E402,F401 - cli_json is a fixture

SEEN_PIDS: set = set()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/status") as f:          # a zombie counts as gone
        return "zombie" not in f.read()


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"PPid:\s+(\d+)", f.read()).group(1))


def workers_seen(url: str, want: int, tries: int = 60) -> dict:
    """worker index -> pid, from /healthz over new connections (the kernel spreads them) until
    ``want`` distinct workers answered."""
    seen: dict = {}
    for _ in range(tries):
        status, _, body = call(url + "/healthz")
        if status == 200:
            h = json.loads(body)
            seen[h["worker"]] = h["pid"]
            if len(seen) >= want:
                break
    SEEN_PIDS.update(seen.values())
    return seen


@pytest.fixture(scope="module")
def workers():
    s = Server("--workers", "2", "--source", str(CLIP), "--max-batch", "2", "--max-queue", "16")
    yield s
    s.stop()
    assert s.proc.returncode == 0, "SIGTERM should end the supervisor cleanly"
    assert SEEN_PIDS and not any(alive(p) for p in SEEN_PIDS), "every worker should have ended with it"


def test_workers_answer_on_one_port(workers, cli_json):
    seen = workers_seen(workers.url, 2)
    assert set(seen) == {0, 1} and len(set(seen.values())) == 2
    assert all(parent_of(pid) == workers.proc.pid for pid in seen.values())
    for _ in range(6):                              # new connections: both workers answer, alike
        status, headers, body = call(workers.url + "/detect", DOG.read_bytes())
        assert status == 200 and json.loads(body)["objects"] == cli_json["objects"]
        timing = dict(re.findall(r"(\w+);dur=([\d.]+)", headers["server-timing"]))
        assert set(timing) == {"body", "decode", "queue", "batch", "reply"} and float(timing["batch"]) > 0


def test_workers_share_streams_and_metrics(workers):
    relayed = None
    for _ in range(40):                             # until a connection lands on worker 1
        with httpx.stream("GET", workers.url + "/streams/0.mjpg", timeout=60) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "multipart/x-mixed-replace; boundary=frame"
            buf = b""
            for chunk in r.iter_bytes():
                buf += chunk
                if buf.count(b"--frame") >= 2:
                    break
            if r.headers.get("x-yolo-cl-relayed-by") == "1":
                relayed = buf
                break
    assert relayed is not None, "no connection reached worker 1"
    head, jpg = relayed.split(b"--frame\r\n")[1].split(b"\r\n\r\n", 1)
    n = int(re.search(rb"Content-Length: (\d+)", head).group(1))
    assert cv2.imdecode(np.frombuffer(jpg[:n], np.uint8), cv2.IMREAD_COLOR).shape[:2] == (1280, 720)
    for _ in range(10):                             # every worker lists worker 0's stream, or names it missing
        streams = json.loads(call(workers.url + "/streams")[2])
        assert [s["id"] for s in streams] == ["0"] and streams[0]["running"]
        status, _, body = call(workers.url + "/streams/9.mjpg")
        assert status == 404 and "no stream '9'" in json.loads(body)["error"]
    for _ in range(4):
        call(workers.url + "/detect", DOG.read_bytes())
    text = call(workers.url + "/metrics")[2].decode()
    assert 'yolo_cl_workers{state="answering"} 2' in text
    assert text.count("# TYPE yolo_cl_requests_total counter") == 1      # one family, every worker's samples
    ok = [int(v) for v in re.findall(r'yolo_cl_requests_total\{worker="\d",code="200"\} (\d+)', text)]
    assert sum(ok) >= 4
    assert re.search(r'yolo_cl_devices\{worker="0"\} 1', text) and re.search(r'yolo_cl_devices\{worker="1"\} 1', text)
    assert re.search(r'yolo_cl_stream_fps\{worker="0",stream="0",[^}]*\} [\d.]+', text)


def test_workers_refuse_a_port_in_use(workers):
    port = workers.url.rsplit(":", 1)[1]
    r = subprocess.run([sys.executable, "-m", "yolo_cl", "serve", "--workers", "2", "--port", port, "--size", "128"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Address already in use" in r.stderr and "Traceback" not in r.stderr


def test_killed_worker_is_started_again(workers, cli_json):
    seen = workers_seen(workers.url, 2)
    os.kill(seen[1], signal.SIGKILL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            now = workers_seen(workers.url, 2, tries=20)
        except OSError:                               # a connection the dying worker had accepted
            continue
        if now.get(1) not in (None, seen[1]):
            break
        time.sleep(0.5)
    assert now.get(1) not in (None, seen[1]), "worker 1 was not started again"
    assert now[0] == seen[0] and parent_of(now[1]) == workers.proc.pid
    for _ in range(6):
        status, _, body = call(workers.url + "/detect", DOG.read_bytes())
        assert status == 200 and json.loads(body)["objects"] == cli_json["objects"]


def test_workers_load_every_request_answered(workers):
    data = cv2.imencode(".jpg", cv2.resize(cv2.imread(str(DOG)), (320, 240)))[1].tobytes()
    codes: dict = {}
    for _ in range(2):
        for status, body in asyncio.run(_burst(workers.url, data, 200)):
            codes[status] = codes.get(status, 0) + 1
            assert status == 200 and isinstance(body["objects"], list) or status == 503 and "error" in body
    assert sum(codes.values()) == 400 and set(codes) <= {200, 503} and codes.get(200, 0) >= 20, codes


def stopped_pair(stop) -> tuple:
    """Start a two-worker server, end its supervisor with ``stop(proc)``: (exit status, worker pids)."""
    s = Server("--workers", "2", "--max-batch", "1")
    try:
        pids = list(workers_seen(s.url, 2).values())
        assert len(pids) == 2
    finally:
        stop(s.proc)
        s.proc.wait(60)
    return s.proc.returncode, pids


def test_workers_sigint_ends_all_with_130():
    status, pids = stopped_pair(lambda p: p.send_signal(signal.SIGINT))
    assert status == 130
    assert not any(alive(p) for p in pids)


def test_workers_end_when_the_supervisor_is_killed():
    _, pids = stopped_pair(lambda p: p.kill())
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids), "orphaned workers kept running"


def test_several_workers_wait_by_sleeping_unless_told_otherwise():
    from yolo_cl.waiting import Waiter, wanted
    from yolo_cl.workers import WorkerPlan, worker_environment
    for n, index, sources, env, want in ((2, 0, [], {}, "sleep"), (1, 0, [], {}, None),
                                         (4, 0, [], {"YOLO_CL_WAIT": "driver"}, "driver"),
                                         (4, 3, [], {"YOLO_CL_WAIT": "callback"}, "callback"),
                                         (2, 0, ["cam.mp4"], {}, None),       # worker 0 runs the streams
                                         (2, 1, ["cam.mp4"], {}, "sleep")):
        environ = dict(env)
        worker_environment(WorkerPlan(detector={}, devices=["0:0"], workers=n, sources=sources), index, environ)
        assert environ.get("YOLO_CL_WAIT") == want, (n, index, sources, env)
    os.environ.pop("YOLO_CL_WAIT", None)
    worker_environment(WorkerPlan(detector={}, devices=["0:0"], workers=2), 1)
    try:
        assert wanted() == "sleep" and Waiter(wanted()).mode == "sleep"
    finally:
        os.environ.pop("YOLO_CL_WAIT", None)
