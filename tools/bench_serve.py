"""Benchmark ``yolo-cl serve`` and Fleet against the bare Detector on the same device.

Measures, in this order:

1. ``Detector.detect_batch`` throughput at ``--batch`` (images/s), and ``Detector.detect``
   latency (ms, p50) — the device-bound references, in this process;
2. ``POST /detect`` on a real ``yolo-cl serve`` subprocess (``--max-batch`` = ``--batch``,
   ``--workers`` as given): latency one request at a time (p50; minus 1.'s p50 = the added
   latency per request; the server's own ``Server-Timing`` stages say where it went), then
   throughput with ``--concurrency`` keep-alive clients spread over ``--client-procs`` processes
   (images/s, p50/p99, 503s, the server's CPU time per image, and the ratio to 1.'s
   ``detect_batch`` at the same batch size). 1. and 2. alternate in ``--rounds`` slices of
   ``--seconds`` in all, so both see the same load on a shared machine;
3. ``--streams`` N copies of a video file through one Fleet (every frame, as fast as the
   device allows) vs one copy alone: total fps and the ratio; with ``--device-processes`` through
   one process per device (``detect --device-processes``) instead.

    python tools/bench_serve.py --size 160 --batch 4 --concurrency 32 --seconds 20 --streams 4
    python tools/bench_serve.py --size 416 --batch 8 --workers 1,2,4,8     # on a GPU host: each in turn
    python tools/bench_serve.py --size 416 --batch 8 --devices all --workers 8
    python tools/bench_serve.py --size 160 --batch 4 --ray --skip streams  # the same load on Ray Serve

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


def detector_throughput(det, image: np.ndarray, batch: int, seconds: float) -> tuple:
    """(images, seconds) of back-to-back detect_batch calls at ``batch``."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        det.detect_batch([image] * batch)
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


def request_bytes(path: str, data: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: image/jpeg\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def content_length(head: bytes) -> int:
    m = re.search(rb"content-length: *(\d+)", head, re.I)
    return int(m.group(1)) if m else 0


def server_timing(head: bytes) -> dict:
    """The Server-Timing durations of one answer (ms by stage)."""
    m = re.search(rb"server-timing: *([^\r]*)", head, re.I)
    return {k.decode(): float(v) for k, v in re.findall(rb"(\w+);dur=([\d.]+)", m.group(1))} if m else {}


def paired_latency(det, client, data: bytes, image: np.ndarray, seconds: float) -> tuple:
    """detect, decoding the encoded image, and POST /detect one at a time, alternating (same
    conditions): three lists of ms, and the server's Server-Timing stages of each POST. The
    POST includes the decode, as a client's request does."""
    dl, sl, cl, stages = [], [], [], []
    buf = np.frombuffer(data, np.uint8)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or len(dl) < 5:
        t = time.perf_counter()
        det.detect(image)
        dl.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        cv2.imdecode(buf, cv2.IMREAD_COLOR)
        cl.append((time.perf_counter() - t) * 1000)
        if client is not None:
            t = time.perf_counter()
            status, head, body = client.post("/detect", data)
            assert status == 200, body
            sl.append((time.perf_counter() - t) * 1000)
            stages.append(server_timing(head))
    return dl, sl, cl, stages


def start_server(args) -> tuple:
    port = "0"
    if args.ray:                             # Ray Serve needs the port named
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
    cmd = [sys.executable, "-m", "yolo_cl", "serve", "--port", port, "--max-batch", str(args.batch),
           "--max-queue", str(max(64, 2 * args.concurrency)), "--max-wait-ms", str(args.max_wait_ms)]
    for name, v in (("size", args.size), ("precision", args.precision), ("model", args.model),
                    ("device", args.device), ("devices", args.devices), ("workers", args.server_workers)):
        if v is not None:
            cmd += [f"--{name}", str(v)]
    if args.ray:
        cmd.append("--ray")
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    while True:
        line = proc.stderr.readline()
        m = re.search(r"listening on (http://[^\s)]+)", line)
        if m:
            import threading
            import urllib.request
            threading.Thread(target=proc.stderr.read, daemon=True).start()    # keep the pipe from filling
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


async def _clients(url: str, data: bytes, clients: int, start: float, end: float) -> tuple:
    """``clients`` keep-alive connections posting back to back from ``start`` to ``end`` (time.time()):
    (latencies ms of the 200s answered by ``end``, 503s, other answers)."""
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    req = request_bytes("/detect", data)
    lat, counts = [], {"busy": 0, "other": 0}

    async def one() -> None:
        reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.sleep(max(0.0, start - time.time()))
        try:
            while time.time() < end:
                t = time.perf_counter()
                writer.write(req)
                head = await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(content_length(head))
                status = int(head[9:12])
                if time.time() > end:
                    break
                if status == 200:
                    lat.append((time.perf_counter() - t) * 1000)
                elif status == 503:
                    counts["busy"] += 1
                else:
                    counts["other"] += 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(clients)))
    return lat, counts["busy"], counts["other"]


def _client_process(url: str, data: bytes, clients: int, start: float, end: float) -> tuple:
    return asyncio.run(_clients(url, data, clients, start, end))


def load(pool, procs: int, url: str, data: bytes, concurrency: int, seconds: float) -> tuple:
    """(answered, seconds, latencies ms, 503s) of ``concurrency`` clients spread over the
    processes of ``pool``, all posting back to back for the same ``seconds``."""
    share = [concurrency // procs + (1 if k < concurrency % procs else 0) for k in range(procs)]
    start = time.time() + 0.5
    jobs = [pool.apply_async(_client_process, (url, data, n, start, start + seconds)) for n in share if n]
    lat, busy = [], 0
    for j in jobs:
        part, b503, other = j.get()
        if other:
            raise SystemExit(f"{other} answers were neither 200 nor 503")
        lat += part
        busy += b503
    return len(lat), seconds, lat, busy


def answered_by_worker(url: str) -> list:
    """200 answers so far per server worker, from /metrics (one entry for a single process)."""
    import urllib.request
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        text = r.read().decode()
    per = {int(k): int(v) for k, v in re.findall(r'yolo_cl_requests_total\{worker="(\d+)",code="200"\} (\d+)', text)}
    if per:
        return [per.get(k, 0) for k in range(max(per) + 1)]
    return [int(v) for v in re.findall(r'yolo_cl_requests_total\{code="200"\} (\d+)', text)]


def bench_requests(args, det, image: np.ndarray, data: bytes, skip: set) -> dict:
    """Detector and server measured in alternating rounds, so both see the same machine load."""
    proc = url = client = pool = None
    if "serve" not in skip:
        proc, url = start_server(args)
        client = RawClient(url)
        pool = multiprocessing.get_context("spawn").Pool(args.client_procs)
    try:
        det.detect_batch([image] * args.batch)
        if client is not None:
            load(pool, args.client_procs, url, data, args.concurrency, 1.0)          # warm-up
        slice_s = args.seconds / args.rounds
        dn = dt = sn = st = busy = cpu = 0
        dl, sl, cl, load_lat, stages = [], [], [], [], []
        for _ in range(args.rounds):
            n, t = detector_throughput(det, image, args.batch, slice_s)
            dn, dt = dn + n, dt + t
            a, b, c, d = paired_latency(det, client, data, image, slice_s / 2)
            dl += a
            sl += b
            cl += c
            stages += d
            if client is not None:
                c0 = process_cpu_s(proc.pid)
                n, t, lat, b503 = load(pool, args.client_procs, url, data, args.concurrency, slice_s)
                cpu += process_cpu_s(proc.pid) - c0
                sn, st, busy = sn + n, st + t, busy + b503
                load_lat += lat
        res = {"detect_batch_ips": dn / dt, "detect_p50_ms": statistics.median(dl),
               "decode_p50_ms": statistics.median(cl)}
        if client is not None:
            res.update({"serve_single_p50_ms": statistics.median(sl), "serve_ips": sn / st,
                        "serve_p50_ms": pct(load_lat, 50), "serve_p99_ms": pct(load_lat, 99), "serve_503": busy,
                        "concurrency": args.concurrency, "serve_cpu_ms_per_image": 1000 * cpu / max(1, sn),
                        "serve_single_stages_ms": {k: statistics.median(s.get(k, 0.0) for s in stages)
                                                   for k in ("body", "decode", "queue", "batch", "reply")},
                        "serve_single_outside_ms": statistics.median(t - sum(v for k, v in s.items())
                                                                     for t, s in zip(sl, stages)),
                        "serve_single_added_ms": statistics.median(t - s.get("batch", 0.0) for t, s in zip(sl, stages))})
            res["serve_answered_by_worker"] = answered_by_worker(url)
        return res
    finally:
        if client is not None:
            client.close()
            pool.terminate()
        if proc is not None:
            proc.terminate()
            proc.wait(60)


def bench_streams(dets: list, clip: Path, n: int, processes: Optional[tuple] = None) -> dict:
    """Total fps of n copies of ``clip`` on the Fleet vs one copy alone (every frame, device-bound).
    ``processes`` = (detector options, device specs): a ProcessFleet, one process per device,
    instead (each stream timed on its own clock, from its first frame)."""
    def run(k: int) -> float:
        with (ProcessFleet(*processes) if processes else Fleet(dets)) as fleet:
            runs = [fleet.add_stream(str(clip), live=False) for _ in range(k)]
            fleet.wait_streams()
        frames = sum(r.stats.frames for r in runs)
        wall = max(r.stats.seconds for r in runs)
        return frames / wall
    run(1)                                  # warm-up: compile and cache
    one = run(1)
    many = run(n)
    return {"stream_1_fps": one, f"streams_{n}_total_fps": many, "streams_ratio": many / one, "streams": n}


def print_requests(res: dict, args, workers, devices: int, skip: set) -> None:
    """The request figures of one server configuration, one line each."""
    print(f"detect_batch x{args.batch}: {res['detect_batch_ips']:.1f} img/s; detect p50 "
          f"{res['detect_p50_ms']:.2f} ms (device 0)")
    if "serve" in skip:
        return
    st = res["serve_single_stages_ms"]
    print(f"POST /detect one at a time: p50 {res['serve_single_p50_ms']:.2f} ms "
          f"(+{res['serve_single_p50_ms'] - res['detect_p50_ms']:.2f} ms over detect, of which "
          f"{res['decode_p50_ms']:.2f} ms decoding the JPEG; measured alternately); in the server (p50 ms): "
          + ", ".join(f"{k} {v:.2f}" for k, v in st.items())
          + f"; outside it (HTTP, client, scheduling) {res['serve_single_outside_ms']:.2f}; all but the batch "
          f"{res['serve_single_added_ms']:.2f}")
    res["serve_ratio"] = res["serve_ips"] / res["detect_batch_ips"]
    print(f"POST /detect x{args.concurrency} clients ({args.client_procs} client processes), "
          f"{workers or 'default'} workers, max batch {args.batch}: {res['serve_ips']:.1f} img/s, "
          f"p50 {res['serve_p50_ms']:.1f} ms, p99 {res['serve_p99_ms']:.1f} ms, {res['serve_503']} answered 503, "
          f"server CPU {res['serve_cpu_ms_per_image']:.1f} ms/image; {res['serve_ratio']:.2f} x detect_batch "
          f"x{args.batch} of one device" + (f" ({res['serve_ratio'] / devices:.2f} x per device)"
                                             if devices > 1 else ""))
    print(f"answers per server worker (whole run): {res['serve_answered_by_worker']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--size", default="160")
    ap.add_argument("--precision", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--devices", default=None, help="serve and streams on several devices ('all', '0,1')")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-wait-ms", type=float, default=0.0)
    ap.add_argument("--workers", type=lambda v: [int(w) for w in v.split(",")], default=None,
                    help="serve --workers; a list (1,2,4) measures each in turn (default: the server's)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--client-procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 4)),
                    help="processes the --concurrency clients are spread over (default: cores/4, 1 to 8)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3, help="alternate detector and server this many times")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--device-processes", action="store_true",
                    help="streams: one process per device (detect --device-processes) instead of one Fleet")
    ap.add_argument("--image", type=Path, default=DEFAULT_IMAGE)
    ap.add_argument("--clip", type=Path, default=DEFAULT_CLIP)
    ap.add_argument("--ray", action="store_true", help="benchmark the server on Ray Serve (serve --ray)")
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
    dets = [yolo_cl.Detector(model, device=s, **opts) for s in specs]
    res = {"model": model, "size": args.size, "batch": args.batch, "device": dets[0].runtime.device_name,
           "devices": len(dets), "commit": _commit()}
    if not {"detector", "serve"} <= skip:
        runs = []
        for workers in args.workers or [None]:          # each server alternates with its own detect_batch
            args.server_workers = workers
            run = bench_requests(args, dets[0], image, data, skip)
            print_requests(run, args, workers, len(dets), skip)
            runs.append(dict(run, workers=workers))
        res.update(runs[0])
        if len(runs) > 1:
            res["runs"] = runs
    if "streams" not in skip:
        res.update(bench_streams(dets, args.clip, args.streams,
                                 (dict(cfg=model, **opts), specs) if args.device_processes else None))
        print(f"streams ({'one process per device' if args.device_processes else 'one Fleet'}): 1 alone "
              f"{res['stream_1_fps']:.1f} fps; {args.streams} together "
              f"{res[f'streams_{args.streams}_total_fps']:.1f} fps total ({res['streams_ratio']:.2f} x)")
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
