"""``yolo-cl serve`` over a real socket: the real server in a subprocess, spoken to with HTTP."""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest

pytest.importorskip("starlette", reason="the serve extra (pip install 'yolo-cl[serve]') is a test dependency")
httpx = pytest.importorskip("httpx")

from procmem import rss_bytes  # noqa: E402 - after the skips for a missing extra

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
CLIP = SHARED / "videos" / "library1.mp4"
DOG = SHARED / "images" / "dog.jpg"
SIZE = 160


class Server:
    """``python -m yolo_cl serve --port 0 ...`` as a subprocess; ``url`` once it listens."""

    def __init__(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "yolo_cl", "serve", "--port", "0", "--size", str(SIZE), *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + 180
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                threading.Thread(target=self.proc.stderr.read, daemon=True).start()   # keep the pipe from filling
                while time.monotonic() < deadline:      # executors for every batch size built
                    if call(self.url + "/healthz")[0] == 200:
                        return
                    time.sleep(0.2)
                break
            if not line and self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"the server did not start: {line}")

    def rss_mib(self) -> float:
        return rss_bytes(self.proc.pid) / 2**20

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def server():
    s = Server("--source", str(CLIP), "--max-batch", "4", "--max-queue", "16")
    yield s
    s.stop()
    assert s.proc.returncode == 0, "the server should end cleanly on SIGTERM"


@pytest.fixture(scope="module")
def plain():
    """A server without streams and a short queue: a lone request runs inline on an idle device."""
    s = Server("--max-batch", "2", "--max-queue", "2")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tight():
    """A server with small limits: 60 KB bodies, 100k pixels, and no time to answer."""
    s = Server("--max-body-mb", "0.06", "--max-pixels", "100000", "--timeout", "0.000001")
    yield s
    s.stop()


def call(url: str, data: bytes = None, headers: dict = None, method: str = None, timeout: float = 60) -> tuple:
    """(status, headers, body bytes) of one HTTP request; HTTP errors are answers too."""
    req = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def assert_error(status: int, body: bytes, want: int, words: str) -> None:
    assert status == want, body
    text = body.decode()
    assert text.count("\n") <= 1 and "Traceback" not in text
    assert words in json.loads(text)["error"]


def png_header(w: int, h: int) -> bytes:
    """A PNG that declares w x h pixels (its data is a single tiny IDAT): a decompression-bomb shape."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def cli_json():
    """``yolo-cl detect --json`` for dog.jpg at the same size: what /detect must answer."""
    r = subprocess.run([sys.executable, "-m", "yolo_cl", "detect", str(DOG), "--json", "--size", str(SIZE)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]


# -- POST /detect -------------------------------------------------------------------------------
def test_detect_raw_body_is_darknet_json(server, cli_json):
    status, headers, body = call(server.url + "/detect", DOG.read_bytes())
    assert status == 200 and headers["content-type"].startswith("application/json")
    got = json.loads(body)
    assert got["objects"] == cli_json["objects"] and got["objects"]
    assert got["resize"] == cli_json["resize"] and isinstance(got["frame_id"], int)


def test_detect_multipart_and_thresholds(server, cli_json):
    r = httpx.post(server.url + "/detect", files={"file": ("dog.jpg", DOG.read_bytes(), "image/jpeg")}, timeout=60)
    assert r.status_code == 200
    assert r.json()["filename"] == "dog.jpg" and r.json()["objects"] == cli_json["objects"]
    high = httpx.post(server.url + "/detect?thresh=0.8&nms=0.3", content=DOG.read_bytes(), timeout=60).json()
    assert all(o["confidence"] >= 0.8 for o in high["objects"])
    assert len(high["objects"]) < len(cli_json["objects"])
    png = cv2.imencode(".png", cv2.imread(str(DOG)))[1].tobytes()
    assert httpx.post(server.url + "/detect", content=png, timeout=60).json()["objects"] == cli_json["objects"]


@pytest.mark.parametrize("data,want,words", [
    (b"", 400, "empty body"),
    (b"GIF89a not an image we take", 415, "not a JPEG, PNG, BMP, WebP or PNM"),
    (DOG.read_bytes()[:DOG.read_bytes().index(b"\xff\xc0") + 30], 400, "cannot be decoded"),
    (png_header(30000, 30000), 413, "more than the limit"),
])
def test_detect_bad_bodies(server, data, want, words):
    status, _, body = call(server.url + "/detect", data, method="POST")
    assert_error(status, body, want, words)


def test_detect_bad_queries_and_routes(server):
    assert_error(*call(server.url + "/detect?thresh=2", DOG.read_bytes())[::2], 400, "not in [0, 1]")
    assert_error(*call(server.url + "/detect?nms=abc", DOG.read_bytes())[::2], 400, "not a number")
    r = httpx.post(server.url + "/detect", files={"photo": ("a.jpg", DOG.read_bytes())}, timeout=60)
    assert_error(r.status_code, r.content, 400, "no field 'file'")
    assert_error(*call(server.url + "/detect")[::2], 405, "Method Not Allowed")
    assert_error(*call(server.url + "/../../etc/passwd")[::2], 404, "Not Found")
    assert_error(*call(server.url + "/streams/nope.mjpg")[::2], 404, "no stream 'nope'")


def test_limits(tight):
    big = os.urandom(70_000)
    assert_error(*call(tight.url + "/detect", big)[::2], 413, "over the limit")
    small = cv2.imencode(".jpg", np.zeros((400, 400, 3), np.uint8))[1].tobytes()
    assert_error(*call(tight.url + "/detect", small)[::2], 413, "400x400 pixels")
    ok = cv2.imencode(".jpg", np.zeros((100, 100, 3), np.uint8))[1].tobytes()
    assert_error(*call(tight.url + "/detect", ok)[::2], 504, "no answer within")


def test_idle_path_answers_as_the_batched_path_and_a_full_queue_503(plain, cli_json):
    status, headers, body = call(plain.url + "/detect", DOG.read_bytes())
    assert status == 200 and "path;desc=inline" in headers["server-timing"], headers["server-timing"]
    assert json.loads(body)["objects"] == cli_json["objects"]
    codes: dict = {}
    for status, answer in asyncio.run(_burst(plain.url, DOG.read_bytes(), 40)):
        codes[status] = codes.get(status, 0) + 1
        if status == 200:
            assert answer["objects"] == cli_json["objects"]
        else:
            assert status == 503 and "error" in answer
    assert set(codes) == {200, 503}, codes                  # a queue of 2 refuses most of 40 at once
    paths = {call(plain.url + "/detect", DOG.read_bytes())[1]["server-timing"].rsplit("desc=", 1)[1]}
    assert paths == {"inline"}                               # idle again after the burst


# -- streams, page, health, metrics --------------------------------------------------------------
def test_streams_list_events_and_mjpeg(server):
    deadline = time.monotonic() + 60
    while True:
        streams = json.loads(call(server.url + "/streams")[2])
        if streams[0]["frames"] >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    s = streams[0]
    assert s["id"] == "0" and s["running"] and s["source"] == str(CLIP) and s["frames"] >= 3
    assert s["fps"] > 0 and s["latency_ms"] > 0 and s["dropped"] >= 0

    with httpx.stream("GET", server.url + "/streams/0/events", timeout=60) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        events = []
        for line in r.iter_lines():
            events.append(json.loads(line))
            if len(events) == 3:
                break
    ids = [e["frame_id"] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert all(set(e) >= {"frame_id", "filename", "objects", "timestamp"} for e in events)

    with httpx.stream("GET", server.url + "/streams/0.mjpg", timeout=60) as r:
        assert r.headers["content-type"] == "multipart/x-mixed-replace; boundary=frame"
        buf = b""
        for chunk in r.iter_bytes():
            buf += chunk
            if buf.count(b"--frame") >= 3:
                break
    parts = [p for p in buf.split(b"--frame\r\n") if p][:2]
    for part in parts:
        head, jpg = part.split(b"\r\n\r\n", 1)
        n = int(re.search(rb"Content-Length: (\d+)", head).group(1))
        img = cv2.imdecode(np.frombuffer(jpg[:n], np.uint8), cv2.IMREAD_COLOR)
        assert img is not None and img.shape[:2] == (1280, 720)


def test_page_health_and_metrics(server):
    status, headers, body = call(server.url + "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    page = body.decode()
    assert "streams/" in page and ".mjpg" in page and "viewport" in page
    assert "://" not in page          # self-contained: no CDN, no other host
    health = json.loads(call(server.url + "/healthz")[2])
    assert health["status"] == "ok" and health["streams"] == 1 and len(health["devices"]) == 1
    call(server.url + "/detect", DOG.read_bytes())
    text = call(server.url + "/metrics")[2].decode()
    ok = int(re.search(r'yolo_cl_requests_total\{code="200"\} (\d+)', text).group(1))
    assert ok >= 1
    assert int(re.search(r"yolo_cl_batch_size_count (\d+)", text).group(1)) >= 1
    assert re.search(r"yolo_cl_request_seconds_bucket\{le=\"\+Inf\"\} (\d+)", text)
    assert re.search(r"yolo_cl_queue_length \d+", text) and "yolo_cl_queue_capacity 16" in text
    fps = float(re.search(r'yolo_cl_stream_fps\{stream="0",[^}]*\} ([\d.]+)', text).group(1))
    assert fps > 0


# -- load -----------------------------------------------------------------------------------------
async def _burst(url: str, data: bytes, n: int) -> list:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        async def one():
            r = await client.post(url + "/detect", content=data)
            return r.status_code, r.json()
        return await asyncio.gather(*(one() for _ in range(n)))


def test_load_every_request_answered_memory_flat(server):
    img = cv2.resize(cv2.imread(str(DOG)), (320, 240))
    data = cv2.imencode(".jpg", img)[1].tobytes()
    asyncio.run(_burst(server.url, data, 100))          # warm up: every batch size compiled, pools filled
    before = server.rss_mib()
    codes: dict = {}
    for _ in range(2):
        for status, body in asyncio.run(_burst(server.url, data, 300)):
            codes[status] = codes.get(status, 0) + 1
            if status == 200:
                assert isinstance(body["objects"], list)
            else:
                assert status == 503 and "error" in body
    after = server.rss_mib()
    assert sum(codes.values()) == 600 and set(codes) <= {200, 503}
    assert codes.get(200, 0) >= 20 and codes.get(503, 0) > 0, codes
    assert after - before < 150, f"server memory grew from {before:.0f} to {after:.0f} MiB"


# -- a real browser -------------------------------------------------------------------------------
def _browser():
    """A headless Chromium through Selenium, or a skip naming what is missing."""
    webdriver = pytest.importorskip("selenium.webdriver")
    chrome = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not chrome or not driver:
        pytest.skip("no headless browser here (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=800,900"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(driver), options=opts)


def test_page_in_a_browser_shows_the_stream_updating(server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    b = _browser()
    try:
        b.get(server.url + "/")
        wait = WebDriverWait(b, 60)
        img = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#stream-0 img"))
        wait.until(lambda d: d.execute_script("return arguments[0].naturalWidth", img) > 0)
        assert b.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight]", img) == [720, 1280]
        wait.until(lambda d: "fps" in d.find_element(By.CSS_SELECTOR, "#stream-0 .fig").text)
        first = img.screenshot_as_png
        shots = []
        for _ in range(20):
            time.sleep(0.5)
            shots.append(img.screenshot_as_png)
            if shots[-1] != first:
                break
        assert shots[-1] != first, "the stream's picture did not change in 10 s"
        assert "stream(s)" in b.find_element(By.ID, "total").text
    finally:
        b.quit()


# -- a request the server fails ------------------------------------------------------------------
def test_a_failed_batch_is_a_500_on_an_open_connection_and_one_stderr_line(capsys):
    """A batch that raises (here a RuntimeError, as a driver failure would) answers each of its
    requests a one-line JSON 500 on the same keep-alive connection (uvicorn closes a connection
    whose request escaped the app), and the server writes one line saying what failed; the
    next request is answered normally."""
    import socket as socketlib
    import uvicorn
    from yolo_cl import Detector
    from yolo_cl.fleet import Fleet
    from yolo_cl.serve import build_app, listen

    det = Detector("yolov3-tiny", input_size=SIZE)
    real = det.detect_batch
    fails = {"left": 1}

    def sometimes(*a, **k):
        if fails["left"]:
            fails["left"] -= 1
            raise RuntimeError("clEnqueueNDRangeKernel failed: OUT_OF_RESOURCES")
        return real(*a, **k)
    det.detect_batch = sometimes
    fleet = Fleet([det], max_batch=2)
    sock = listen("127.0.0.1", 0)
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(build_app(fleet), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        data = DOG.read_bytes()
        req = (f"POST /detect HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data
        with socketlib.create_connection(sock.getsockname()) as conn:
            answers = []
            for _ in range(2):
                conn.sendall(req)
                f = conn.makefile("rb")
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    head += f.read(1)
                length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
                answers.append((int(head[9:12]), json.loads(f.read(length))))
        (s500, err), (s200, ok) = answers
        assert s500 == 500 and err == {"error": "internal error: RuntimeError"}
        assert s200 == 200 and isinstance(ok["objects"], list)
        lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("yolo-cl serve:")]
        assert lines == ["yolo-cl serve: POST /detect: RuntimeError: clEnqueueNDRangeKernel failed: OUT_OF_RESOURCES"]
    finally:
        server.should_exit = True
        thread.join(10)
        fleet.close()
        sock.close()


def test_failure_log_keeps_to_a_line_a_second():
    import io
    from yolo_cl.serve import FailureLog
    now = [0.0]
    out = io.StringIO()
    log = FailureLog(out, clock=lambda: now[0])
    for t, what in ((0.0, "a"), (0.3, "b"), (0.6, "c"), (1.2, "d"), (1.5, "e\nsecond line")):
        now[0] = t
        log.note(what)
    assert out.getvalue().splitlines() == ["yolo-cl serve: a", "yolo-cl serve: d (2 more failed since the last line)"]
