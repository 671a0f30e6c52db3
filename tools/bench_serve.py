"""Benchmark ``yolo-cl serve`` and Fleet against the bare Detector on the same device.

Measures, in this order, and prints every figure the targets of issue 20 are held against:

1. ``Detector.detect_batch`` throughput at ``--batch`` (images/s, and this process's CPU per
   image), ``Detector.detect`` latency (ms, p50) and ``cv2.imdecode`` of the request image — the
   device-bound references, in this process;
2. ``POST /detect`` on a real ``yolo-cl serve`` subprocess (``--max-batch`` = ``--batch``,
   ``--workers`` as given; with ``--ray`` a ``serve --ray`` one too, with as many
   ``--replicas``, both up for the whole run):
   latency one request at a time (p50; minus 1.'s p50 = the added latency per request; the
   server's own ``Server-Timing`` stages split it into body, decode, queue, batch and reply, and
   say whether it ran inline on an idle device), then throughput with ``--concurrency``
   keep-alive clients spread over ``--client-procs`` processes (images/s, p50/p99, 503s, the
   server's CPU time per image, and the ratio to 1.'s ``detect_batch`` at the same batch size;
   with ``--ray`` also Ray's over the embedded server's). 1. and 2. alternate in ``--rounds``
   slices of ``--seconds`` in all, so all see the same load on a shared machine;
3. ``--streams`` N copies of a video file through one Fleet (every frame, as fast as the
   device allows) vs one copy alone, and vs one stream's device-bound rate (``detect`` back to
   back on a decoded frame): total fps and the ratios; with ``--device-processes`` through one
   process per device (``detect --device-processes``) instead.

    python tools/bench_serve.py --size 160 --batch 4 --concurrency 32 --seconds 20 --streams 4
    python tools/bench_serve.py --size 416 --batch 8 --workers 1,2,4,8     # on a GPU host: each in turn
    python tools/bench_serve.py --size 416 --batch 8 --devices all --workers 8
    python tools/bench_serve.py --size 160 --batch 4 --ray --skip streams  # Ray Serve and embedded, alternating
    python tools/bench_serve.py --model models/cfg/yolov3.cfg --weights random.weights --thresh 1 \
        --size 416 --batch 8 --workers 4 --devices all          # a device-bound network (no box passes)

A request whose connection is reset or closed before its answer, or answered neither 200 nor 503, is
counted as lost (the first few are printed with when they happened); the server's
stderr after its start is copied to ours, each line marked ``[server]``.

Prints one line per figure and, with ``--json FILE``, writes them all.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import cv2
import numpy as np

import yolo_cl
from yolo_cl.fleet import Fleet, ProcessFleet, device_specs

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_IMAGE = ROOT.parent / "shared" / "images" / "dog.jpg"
DEFAULT_CLIP = ROOT.parent / "shared" / "videos" / "library1.mp4"


def pct(values: list, q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def detector_throughput(det, image: np.ndarray, batch: int, seconds: float, thresh: float = 0.25) -> tuple:
    """(images, seconds) of back-to-back detect_batch calls at ``batch``."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        det.detect_batch([image] * batch, thresh)
        n += batch
    return n, time.perf_counter() - t0


class RawClient:
    """A minimal HTTP/1.1 keep-alive client on a blocking socket: less client time per request than
    a general client library, so the figures are the server's."""

    def __init__(self, url: str) -> None:
        host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
        self.host, self.port = host.strip("[]"), int(port)
        self.sock = None

    def post(self, path: str, data: bytes) -> tuple:
        """(status, headers bytes, body bytes) of one POST (on a new connection if the server
        closed the idle one)."""
        try:
            return self._post(path, data)
        except OSError:
            self.close()
            return self._post(path, data)

    def _post(self, path: str, data: bytes) -> tuple:
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(request_bytes(path, data))
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buf += chunk
        head, body = buf.split(b"\r\n\r\n", 1)
        n = content_length(head)
        while len(body) < n:
            body += self.sock.recv(1 << 16)
        return int(head[9:12]), head, body

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def detect_path(thresh: float) -> str:
    """The request path of ``POST /detect`` at confidence threshold ``thresh``."""
    return f"/detect?thresh={thresh:g}"


def request_bytes(path: str, data: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: image/jpeg\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def content_length(head: bytes) -> int:
    m = re.search(rb"content-length: *(\d+)", head, re.I)
    return int(m.group(1)) if m else 0


def server_timing(head: bytes) -> dict:
    """The Server-Timing durations of one answer (ms by stage), and ``inline`` 1.0 when the server
    ran it on its event loop's thread (an idle device), 0.0 when it went through the batch queue."""
    m = re.search(rb"server-timing: *([^\r]*)", head, re.I)
    if not m:
        return {}
    stages = {k.decode(): float(v) for k, v in re.findall(rb"(\w+);dur=([\d.]+)", m.group(1))}
    stages["inline"] = float(b"path;desc=inline" in m.group(1))
    return stages


def paired_latency(det, clients: dict, data: bytes, image: np.ndarray, seconds: float,
                   thresh: float = 0.25) -> tuple:
    """detect, decoding the encoded image, and POST /detect to each server one at a time, in turn
    (same conditions): lists of ms for detect and the decode, and per server its list of ms and the
    Server-Timing stages of each answer. The POST includes the decode, as a client's request does."""
    dl, cl = [], []
    per = {k: ([], []) for k in clients}
    buf = np.frombuffer(data, np.uint8)
    path = detect_path(thresh)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or len(dl) < 5:
        t = time.perf_counter()
        det.detect(image, thresh)
        dl.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        cv2.imdecode(buf, cv2.IMREAD_COLOR)
        cl.append((time.perf_counter() - t) * 1000)
        for k, client in clients.items():
            t = time.perf_counter()
            status, head, body = client.post(path, data)
            assert status == 200, body
            per[k][0].append((time.perf_counter() - t) * 1000)
            per[k][1].append(server_timing(head))
    return dl, cl, per


def start_server(args, ray: bool = False) -> tuple:
    port = "0"
    if ray:                                  # Ray Serve needs the port named
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
    cmd = [sys.executable, "-m", "yolo_cl", "serve", "--port", port, "--max-batch", str(args.batch),
           "--max-queue", str(max(64, 2 * args.concurrency)), "--max-wait-ms", str(args.max_wait_ms)]
    for name, v in (("size", args.size), ("precision", args.precision), ("model", args.model), ("weights", args.weights),
                    ("device", args.device), ("devices", args.devices),
                    ("replicas" if ray else "workers", args.server_workers)):
        if v is not None:
            cmd += [f"--{name}", str(v)]
    if ray:
        cmd.append("--ray")
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    while True:
        line = proc.stderr.readline()
        m = re.search(r"listening on (http://[^\s)]+)", line)
        if m:
            import threading
            import urllib.request
            threading.Thread(target=relay, args=(proc.stderr,), daemon=True).start()   # the server's later words
            while True:                                                       # executors built
                try:
                    with urllib.request.urlopen(m.group(1) + "/healthz", timeout=60) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                time.sleep(0.2)
            return proc, m.group(1)
        if not line and proc.poll() is not None:
            raise SystemExit(f"the server did not start (exit {proc.returncode})")


def relay(stream) -> None:
    """Copy a server's stderr to ours, each line marked (a worker that ends says so there)."""
    for line in stream:
        sys.stderr.write("[server] " + line)


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its descendants so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue
    return total


async def _clients(url: str, data: bytes, clients: int, start: float, end: float, path: str) -> tuple:
    """``clients`` keep-alive connections posting back to back from ``start`` to ``end`` (time.time()):
    (latencies ms of the 200s answered by ``end``, 503s, other answers, requests lost: the
    connection reset or closed before their answer, after which the client connects again)."""
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    req = request_bytes(path, data)
    lat, counts = [], {"busy": 0, "other": 0, "lost": 0, "why": []}

    async def connect() -> tuple:
        reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    async def reconnect() -> tuple:
        """A new connection; a refused or reset one counts as lost and is tried again."""
        while True:
            try:
                return await connect()
            except ConnectionError:
                lost(f"connect refused/reset at {time.time() - start:+.2f} s")
                await asyncio.sleep(0.01)

    def lost(why: str) -> None:
        counts["lost"] += 1
        if len(counts["why"]) < 5:
            counts["why"].append(why)

    async def one() -> None:
        reader, writer = await reconnect()
        await asyncio.sleep(max(0.0, start - time.time()))
        try:
            while time.time() < end:
                t = time.perf_counter()
                try:
                    writer.write(req)
                    head = await reader.readuntil(b"\r\n\r\n")
                    body = await reader.readexactly(content_length(head))
                except (ConnectionError, asyncio.IncompleteReadError) as e:
                    lost(f"{type(e).__name__} at {time.time() - start:+.2f} s")
                    writer.close()
                    reader, writer = await reconnect()
                    continue
                status = int(head[9:12])
                if time.time() > end:
                    break
                if status == 200:
                    lat.append((time.perf_counter() - t) * 1000)
                elif status == 503:
                    counts["busy"] += 1
                else:
                    counts["other"] += 1
                    if len(counts["why"]) < 5:
                        counts["why"].append(f"{status} {body[:200].decode(errors='replace')} at {time.time() - start:+.2f} s")
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(clients)))
    if counts["why"]:
        print(f"requests lost or failed (first {len(counts['why'])}, time from the load's start): {'; '.join(counts['why'])}",
              file=sys.stderr, flush=True)
    return lat, counts["busy"], counts["other"], counts["lost"]


def _client_process(url: str, data: bytes, clients: int, start: float, end: float, path: str) -> tuple:
    return asyncio.run(_clients(url, data, clients, start, end, path))


def load(pool, procs: int, url: str, data: bytes, concurrency: int, seconds: float,
         path: str = "/detect") -> tuple:
    """(answered, seconds, latencies ms, 503s, lost) of ``concurrency`` clients spread over the
    processes of ``pool``, all posting back to back for the same ``seconds``; an answer neither
    200 nor 503 counts as lost (its client process prints it)."""
    share = [concurrency // procs + (1 if k < concurrency % procs else 0) for k in range(procs)]
    start = time.time() + 0.5
    jobs = [pool.apply_async(_client_process, (url, data, n, start, start + seconds, path)) for n in share if n]
    lat, busy, lost = [], 0, 0
    for j in jobs:
        part, b503, other, gone = j.get()
        lost += gone + other                 # each "other" answer is printed by its client process
        lat += part
        busy += b503
    return len(lat), seconds, lat, busy, lost


def answered_by_worker(url: str) -> list:
    """200 answers so far per server worker, from /metrics (one entry for a single process)."""
    import urllib.request
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        text = r.read().decode()
    per = {int(k): int(v) for k, v in re.findall(r'yolo_cl_requests_total\{worker="(\d+)",code="200"\} (\d+)', text)}
    if per:
        return [per.get(k, 0) for k in range(max(per) + 1)]
    return [int(v) for v in re.findall(r'yolo_cl_requests_total\{code="200"\} (\d+)', text)]


def bench_requests(args, det, image: np.ndarray, data: bytes, skip: set, kinds: tuple = ("embedded",)) -> dict:
    """Detector and the servers of ``kinds`` ("embedded", "ray") measured in alternating rounds, so
    all see the same machine load. The figures of the first server are at the top level, every
    server's under its kind; the servers' process trees' CPU time while idle is reported too."""
    servers, pool = {}, None
    try:
        if "serve" not in skip:
            for kind in kinds:
                proc, url = start_server(args, ray=kind == "ray")
                servers[kind] = (proc, url, RawClient(url))
            pool = multiprocessing.get_context("spawn").Pool(args.client_procs)
        path = detect_path(args.thresh)
        det.detect_batch([image] * args.batch, args.thresh)
        for _, url, _ in servers.values():
            load(pool, args.client_procs, url, data, args.concurrency, 1.0, path)          # warm-up
        slice_s = args.seconds / args.rounds
        dn = dt = dcpu = 0
        dl, cl = [], []
        acc = {k: {"n": 0, "t": 0.0, "busy": 0, "lost": 0, "cpu": 0.0, "idle_cpu": 0.0, "lat": [], "single": [], "stages": []}
               for k in servers}
        for _ in range(args.rounds):
            idle0 = {k: process_cpu_s(p.pid) for k, (p, _, _) in servers.items()}
            c0 = time.process_time()
            n, t = detector_throughput(det, image, args.batch, slice_s, args.thresh)
            dn, dt, dcpu = dn + n, dt + t, dcpu + time.process_time() - c0
            for k, (p, _, _) in servers.items():
                acc[k]["idle_cpu"] += process_cpu_s(p.pid) - idle0[k]
            a, c, per = paired_latency(det, {k: cl_ for k, (_, _, cl_) in servers.items()}, data, image, slice_s / 2,
                                      args.thresh)
            dl += a
            cl += c
            for k, (single, stages) in per.items():
                acc[k]["single"] += single
                acc[k]["stages"] += stages
            for k, (proc, url, _) in servers.items():
                c0 = process_cpu_s(proc.pid)
                n, t, lat, b503, lost = load(pool, args.client_procs, url, data, args.concurrency, slice_s, path)
                a_ = acc[k]
                a_["cpu"] += process_cpu_s(proc.pid) - c0
                a_["n"], a_["t"], a_["busy"] = a_["n"] + n, a_["t"] + t, a_["busy"] + b503
                a_["lost"] += lost
                a_["lat"] += lat
        res = {"detect_batch_ips": dn / dt, "detect_p50_ms": statistics.median(dl),
               "decode_p50_ms": statistics.median(cl), "detect_cpu_ms_per_image": 1000 * dcpu / dn}
        for k, (_, url, _) in servers.items():
            a_ = acc[k]
            sl, stages = a_["single"], a_["stages"]
            fig = {"serve_single_p50_ms": statistics.median(sl), "serve_ips": a_["n"] / a_["t"],
                   "serve_p50_ms": pct(a_["lat"], 50), "serve_p99_ms": pct(a_["lat"], 99), "serve_503": a_["busy"],
                   "serve_lost": a_["lost"],
                   "concurrency": args.concurrency, "serve_cpu_ms_per_image": 1000 * a_["cpu"] / max(1, a_["n"]),
                   "serve_idle_cpu_share": a_["idle_cpu"] / dt,          # while detect_batch ran
                   "serve_single_stages_ms": {s: statistics.median(x.get(s, 0.0) for x in stages)
                                              for s in ("body", "decode", "queue", "batch", "reply")},
                   "serve_single_inline_share": sum(x.get("inline", 0) for x in stages) / len(stages),
                   "serve_single_outside_ms": statistics.median(t - sum(v for n_, v in x.items() if n_ != "inline")
                                                                for t, x in zip(sl, stages)),
                   "serve_single_added_ms": statistics.median(t - x.get("batch", 0.0) for t, x in zip(sl, stages)),
                   "serve_answered_by_worker": [] if k == "ray" else answered_by_worker(url)}
            res.setdefault("servers", {})[k] = fig
        if servers:
            res.update(res["servers"][kinds[0]])
        return res
    finally:
        for proc, _, client in servers.values():
            client.close()
            proc.terminate()
        if pool is not None:
            pool.terminate()
        for proc, _, _ in servers.values():
            proc.wait(120)


def bench_streams(dets: list, clip: Path, n: int, processes: Optional[tuple] = None, merge: bool = True,
                  rounds: int = 1, thresh: float = 0.25) -> dict:
    """Total fps of n copies of ``clip`` on the Fleet vs one copy alone (every frame, device-bound).
    ``processes`` = (detector options, device specs): a ProcessFleet, one process per device,
    instead (each stream timed on its own clock, from its first frame). ``merge``: a device's
    streams share batches (``Fleet(merge_streams=...)``); the median of ``rounds`` runs."""
    def run(k: int) -> float:
        with (ProcessFleet(*processes) if processes else Fleet(dets, merge_streams=merge)) as fleet:
            runs = [fleet.add_stream(str(clip), live=False, thresh=thresh) for _ in range(k)]
            fleet.wait_streams()
        frames = sum(r.stats.frames for r in runs)
        wall = max(r.stats.seconds for r in runs)
        return frames / wall
    run(1)                                  # warm-up: compile and cache
    one = statistics.median(run(1) for _ in range(rounds))
    many = statistics.median(run(n) for _ in range(rounds))
    bound = device_bound_fps(dets[0], clip, thresh=thresh)
    return {"stream_1_fps": one, f"streams_{n}_total_fps": many, "streams_ratio": many / one, "streams": n,
            "stream_device_bound_fps": bound, "streams_over_device_bound": many / bound}


def repeated_clip(clip: Path, times: int) -> Path:
    """``clip`` played ``times`` times over, as one temporary MPEG-4 file (``clip`` itself for 1)."""
    if times <= 1:
        return clip
    import tempfile
    cap = cv2.VideoCapture(str(clip))
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    cap.release()
    if not frames:
        raise SystemExit(f"{clip}: cannot read a frame")
    out = Path(tempfile.mkdtemp()) / f"{clip.stem}-x{times}.mp4"
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(out), cv2.VideoWriter_fourcc(*"mp4v"), 30.0, (w, h))
    for _ in range(times):
        for f in frames:
            writer.write(f)
    writer.release()
    return out


def device_bound_fps(det, clip: Path, seconds: float = 3.0, thresh: float = 0.25) -> float:
    """One stream's device-bound rate: ``Detector.detect`` back to back on a frame of ``clip``,
    already decoded (what N streams together are held against)."""
    cap = cv2.VideoCapture(str(clip))
    ok, frame = cap.read()
    cap.release()
    if not ok:
        raise SystemExit(f"{clip}: cannot read a frame")
    det.detect(frame, thresh)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        det.detect(frame, thresh)
        n += 1
    return n / (time.perf_counter() - t0)


def print_requests(res: dict, args, workers, devices: int, skip: set) -> None:
    """The request figures of one run, one line each: the Detector, then each server."""
    print(f"detect_batch x{args.batch}: {res['detect_batch_ips']:.1f} img/s ({res['detect_cpu_ms_per_image']:.1f} ms "
          f"of this process's CPU per image); detect p50 {res['detect_p50_ms']:.2f} ms (device 0); cv2.imdecode of "
          f"the request p50 {res['decode_p50_ms']:.2f} ms")
    if "serve" in skip:
        return
    print(f"server stack: {http_stack()}")
    for kind, fig in res["servers"].items():
        name = "Ray Serve" if kind == "ray" else f"embedded, {workers or 'default'} workers"
        single = fig["serve_single_p50_ms"]
        line = (f"[{name}] POST /detect one at a time: p50 {single:.2f} ms (+{single - res['detect_p50_ms']:.2f} ms "
                f"over detect, measured alternately")
        if kind == "ray":
            print(line + ")")
        else:
            st = fig["serve_single_stages_ms"]
            print(line + f"); in the server (p50 ms): " + ", ".join(f"{k} {v:.2f}" for k, v in st.items())
                  + f"; outside it (HTTP, client, scheduling) {fig['serve_single_outside_ms']:.2f}; "
                  f"{100 * fig['serve_single_inline_share']:.0f}% ran inline")
            print(f"[{name}] added latency at low load, all but the batch: {fig['serve_single_added_ms']:.2f} ms = "
                  f"decode {st['decode']:.2f} + the rest {fig['serve_single_added_ms'] - st['decode']:.2f} "
                  f"(target: <= 2 ms over Detector.detect)")
        fig["serve_ratio"] = fig["serve_ips"] / res["detect_batch_ips"]
        print(f"[{name}] POST /detect x{args.concurrency} clients ({args.client_procs} client processes), max batch "
              f"{args.batch}: {fig['serve_ips']:.1f} img/s, p50 {fig['serve_p50_ms']:.1f} ms, p99 "
              f"{fig['serve_p99_ms']:.1f} ms, {fig['serve_503']} answered 503, "
              f"{fig['serve_lost']} lost (reset, closed or failed unanswered), server CPU "
              f"{fig['serve_cpu_ms_per_image']:.1f} ms/image (idle: {100 * fig['serve_idle_cpu_share']:.0f}% of a core); "
              f"{fig['serve_ratio']:.2f} x detect_batch x{args.batch} of one device"
              + (f" ({fig['serve_ratio'] / devices:.2f} x per device)" if devices > 1 else "") + " (target: >= 0.8)")
        if fig["serve_answered_by_worker"]:
            print(f"[{name}] answers per server worker (whole run): {fig['serve_answered_by_worker']}")
    if "ray" in res["servers"] and "embedded" in res["servers"]:
        ray_, emb = res["servers"]["ray"], res["servers"]["embedded"]
        res["ray_over_embedded"] = ray_["serve_ips"] / emb["serve_ips"]
        print(f"Ray Serve / embedded under the same load: {res['ray_over_embedded']:.2f} x (target: >= 0.8)")


def http_stack() -> str:
    """uvicorn's version and the HTTP parser and event loop it picks here ("auto")."""
    import importlib.util
    import uvicorn
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    return f"uvicorn {uvicorn.__version__}, {http}, {loop}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--weights", default=None, help="a Darknet .weights file for --model (e.g. random ones)")
    ap.add_argument("--thresh", type=float, default=0.25,
                    help="confidence threshold of every detect, request (?thresh=) and stream")
    ap.add_argument("--size", default="160")
    ap.add_argument("--precision", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--devices", default=None, help="serve and streams on several devices ('all', '0,1')")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-wait-ms", type=float, default=0.0)
    ap.add_argument("--workers", type=lambda v: [int(w) for w in v.split(",")], default=None,
                    help="serve --workers (and --ray's --replicas); a list (1,2,4) measures each in turn (default: the server's)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--client-procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 4)),
                    help="processes the --concurrency clients are spread over (default: cores/4, 1 to 8)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3, help="alternate detector and server this many times")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--stream-rounds", type=int, default=1, help="streams: median of this many runs")
    ap.add_argument("--clip-repeat", type=int, default=1, help="streams: the clip this many times over, "
                    "re-encoded once into a temporary file (a short clip is mostly start-up)")
    ap.add_argument("--no-merge", action="store_true", help="streams: each stream submits its own frames "
                    "(Fleet(merge_streams=False)) instead of one batch per device")
    ap.add_argument("--device-processes", action="store_true",
                    help="streams: one process per device (detect --device-processes) instead of one Fleet")
    ap.add_argument("--image", type=Path, default=DEFAULT_IMAGE)
    ap.add_argument("--clip", type=Path, default=DEFAULT_CLIP)
    ap.add_argument("--ray", action="store_true",
                    help="also Ray Serve (serve --ray), alternating with the embedded server in every round")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: detector,serve,streams")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    size = int(args.size) if args.size.isdigit() else tuple(int(v) for v in args.size.lower().split("x"))
    opts = {"input_size": size}
    if args.precision:
        opts["precision"] = args.precision
    model = args.model or "yolov3-tiny"
    image = cv2.imread(str(args.image))
    data = args.image.read_bytes()
    specs = device_specs(args.devices) if args.devices else [args.device]
    dets = [yolo_cl.Detector(model, args.weights, device=s, **opts) for s in specs]
    res = {"model": model, "size": args.size, "batch": args.batch, "device": dets[0].runtime.device_name,
           "devices": len(dets), "commit": _commit()}
    if not {"detector", "serve"} <= skip:
        runs = []
        kinds = ("embedded", "ray") if args.ray else ("embedded",)
        for workers in args.workers or [None]:          # each server alternates with its own detect_batch
            args.server_workers = workers
            run = bench_requests(args, dets[0], image, data, skip, kinds)
            print_requests(run, args, workers, len(dets), skip)
            runs.append(dict(run, workers=workers))
        res.update(runs[0])
        if len(runs) > 1:
            res["runs"] = runs
    if "streams" not in skip:
        clip = repeated_clip(args.clip, args.clip_repeat)
        res.update(bench_streams(dets, clip, args.streams,
                                 (dict(cfg=model, weights=args.weights, **opts), specs) if args.device_processes else None,
                                 merge=not args.no_merge, rounds=args.stream_rounds, thresh=args.thresh))
        print(f"streams ({'one process per device' if args.device_processes else 'one Fleet'}): 1 alone "
              f"{res['stream_1_fps']:.1f} fps; {args.streams} together "
              f"{res[f'streams_{args.streams}_total_fps']:.1f} fps total ({res['streams_ratio']:.2f} x one alone, "
              f"{res['streams_over_device_bound']:.2f} x one stream's device-bound rate, detect back to back on a "
              f"decoded frame: {res['stream_device_bound_fps']:.1f} fps; target: >= 0.9)")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return ""


if __name__ == "__main__":
    main()
