"""Benchmark ``yolo-cl serve`` and Fleet against the bare Detector on the same device.

Measures, in this order:

1. ``Detector.detect_batch`` throughput at ``--batch`` (images/s), and ``Detector.detect``
   latency (ms, p50) — the device-bound references, in this process;
2. ``POST /detect`` on a real ``yolo-cl serve`` subprocess (``--max-batch`` = ``--batch``):
   latency one request at a time (p50; minus 1.'s p50 = the added latency per request), then
   throughput with ``--concurrency`` clients (images/s, p50/p99, 503s). 1. and 2. alternate in
   ``--rounds`` slices of ``--seconds`` in all, so both see the same load on a shared machine;
3. ``--streams`` N copies of a video file through one Fleet (every frame, as fast as the
   device allows) vs one copy alone: total fps and the ratio.

    python tools/bench_serve.py --size 160 --batch 4 --concurrency 32 --seconds 20 --streams 4
    python tools/bench_serve.py --size 416 --batch 8 --devices all        # on a GPU host
    python tools/bench_serve.py --size 160 --batch 4 --ray --skip streams  # the same load on Ray Serve

Prints one line per figure and, with ``--json FILE``, writes them all.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np

import yolo_cl
from yolo_cl.fleet import Fleet, device_specs

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


def paired_latency(det, client, url: str, data: bytes, image: np.ndarray, seconds: float) -> tuple:
    """detect, decoding the encoded image, and POST /detect one at a time, alternating (same
    conditions): three lists of ms. The POST includes the decode, as a client's request does."""
    dl, sl, cl = [], [], []
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
            r = client.post(url + "/detect", content=data)
            assert r.status_code == 200, r.text
            sl.append((time.perf_counter() - t) * 1000)
    return dl, sl, cl


def start_server(args) -> tuple:
    port = "0"
    if args.ray:                             # Ray Serve needs the port named
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
    cmd = [sys.executable, "-m", "yolo_cl", "serve", "--port", port, "--max-batch", str(args.batch),
           "--max-queue", str(max(64, 2 * args.concurrency)), "--max-wait-ms", str(args.max_wait_ms)]
    for name in ("size", "precision", "model", "device", "devices"):
        v = getattr(args, name)
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
            import httpx
            threading.Thread(target=proc.stderr.read, daemon=True).start()    # keep the pipe from filling
            while httpx.get(m.group(1) + "/healthz", timeout=60).status_code != 200:   # executors built
                time.sleep(0.2)
            return proc, m.group(1)
        if not line and proc.poll() is not None:
            raise SystemExit(f"the server did not start (exit {proc.returncode})")


async def _load(url: str, data: bytes, concurrency: int, seconds: float) -> tuple:
    """(answered, seconds, latencies ms, 503s) of ``concurrency`` clients posting back to back."""
    import httpx
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    lat, busy = [], 0
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        end = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal busy
            while time.perf_counter() < end:
                t = time.perf_counter()
                r = await client.post(url + "/detect", content=data)
                if r.status_code == 200:
                    lat.append((time.perf_counter() - t) * 1000)
                elif r.status_code == 503:
                    busy += 1
                else:
                    raise SystemExit(f"unexpected answer {r.status_code}: {r.text[:200]}")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return len(lat), wall, lat, busy


def bench_requests(args, det, image: np.ndarray, data: bytes, skip: set) -> dict:
    """Detector and server measured in alternating rounds, so both see the same machine load."""
    import httpx
    proc = url = client = None
    if "serve" not in skip:
        proc, url = start_server(args)
        client = httpx.Client(timeout=120)
    try:
        det.detect_batch([image] * args.batch)
        if client is not None:
            asyncio.run(_load(url, data, args.concurrency, 1.0))          # warm-up
        slice_s = args.seconds / args.rounds
        dn = dt = sn = st = busy = 0
        dl, sl, cl, load_lat = [], [], [], []
        for _ in range(args.rounds):
            n, t = detector_throughput(det, image, args.batch, slice_s)
            dn, dt = dn + n, dt + t
            a, b, c = paired_latency(det, client, url, data, image, slice_s / 2)
            dl += a
            sl += b
            cl += c
            if client is not None:
                n, t, lat, b503 = asyncio.run(_load(url, data, args.concurrency, slice_s))
                sn, st, busy = sn + n, st + t, busy + b503
                load_lat += lat
        res = {"detect_batch_ips": dn / dt, "detect_p50_ms": statistics.median(dl),
               "decode_p50_ms": statistics.median(cl)}
        if client is not None:
            res.update({"serve_single_p50_ms": statistics.median(sl), "serve_ips": sn / st,
                        "serve_p50_ms": pct(load_lat, 50), "serve_p99_ms": pct(load_lat, 99), "serve_503": busy,
                        "concurrency": args.concurrency})
        return res
    finally:
        if client is not None:
            client.close()
        if proc is not None:
            proc.terminate()
            proc.wait(60)


def bench_streams(dets: list, clip: Path, n: int) -> dict:
    """Total fps of n copies of ``clip`` on the Fleet vs one copy alone (every frame, device-bound)."""
    def run(k: int) -> float:
        with Fleet(dets) as fleet:
            runs = [fleet.add_stream(str(clip), live=False) for _ in range(k)]
            fleet.wait_streams()
        frames = sum(r.stats.frames for r in runs)
        wall = max(r.stats.seconds for r in runs)
        return frames / wall
    run(1)                                  # warm-up: compile and cache
    one = run(1)
    many = run(n)
    return {"stream_1_fps": one, f"streams_{n}_total_fps": many, "streams_ratio": many / one, "streams": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--size", default="160")
    ap.add_argument("--precision", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--devices", default=None, help="serve and streams on several devices ('all', '0,1')")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-wait-ms", type=float, default=0.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3, help="alternate detector and server this many times")
    ap.add_argument("--streams", type=int, default=4)
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
        res.update(bench_requests(args, dets[0], image, data, skip))
        print(f"detect_batch x{args.batch}: {res['detect_batch_ips']:.1f} img/s; detect p50 "
              f"{res['detect_p50_ms']:.2f} ms (device 0)")
    if "serve" not in skip:
        print(f"POST /detect one at a time: p50 {res['serve_single_p50_ms']:.2f} ms "
              f"(+{res['serve_single_p50_ms'] - res['detect_p50_ms']:.2f} ms over detect, of which "
              f"{res['decode_p50_ms']:.2f} ms decoding the JPEG; measured alternately)")
        print(f"POST /detect x{args.concurrency} clients: {res['serve_ips']:.1f} img/s, p50 {res['serve_p50_ms']:.1f} "
              f"ms, p99 {res['serve_p99_ms']:.1f} ms, {res['serve_503']} answered 503; "
              f"{res['serve_ips'] / res['detect_batch_ips']:.2f} x detect_batch")
    if "streams" not in skip:
        res.update(bench_streams(dets, args.clip, args.streams))
        print(f"streams: 1 alone {res['stream_1_fps']:.1f} fps; {args.streams} together "
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
