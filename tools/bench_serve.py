"""Benchmark ``yolo-cl serve`` and Fleet against the bare Detector on the same device.

Measures, in this order:

1. ``Detector.detect_batch`` throughput at ``--batch`` (images/s), and ``Detector.detect``
   latency (ms, p50) — the device-bound references, in this process;
2. ``POST /detect`` on a real ``yolo-cl serve`` subprocess (``--max-batch`` = ``--batch``):
   latency one request at a time (p50; minus 1.'s p50 = the added latency per request), then
   throughput with ``--concurrency`` clients for ``--seconds`` (images/s, p50/p99, 503s);
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


def bench_detector(det, image: np.ndarray, batch: int, seconds: float) -> dict:
    """detect_batch images/s at ``batch``, and detect's p50 latency."""
    det.detect_batch([image] * batch)
    det.detect(image)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        det.detect_batch([image] * batch)
        n += batch
    batch_ips = n / (time.perf_counter() - t0)
    lat = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2 or len(lat) < 5:
        t = time.perf_counter()
        det.detect(image)
        lat.append((time.perf_counter() - t) * 1000)
    return {"detect_batch_ips": batch_ips, "detect_p50_ms": statistics.median(lat)}


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


async def _load(url: str, data: bytes, concurrency: int, seconds: float) -> dict:
    import httpx
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    lat, busy = [], 0
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        await asyncio.gather(*(client.post(url + "/detect", content=data) for _ in range(concurrency)))   # warm-up
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
    return {"serve_ips": len(lat) / wall, "serve_p50_ms": pct(lat, 50), "serve_p99_ms": pct(lat, 99),
            "serve_503": busy, "concurrency": concurrency}


def bench_server(args, data: bytes) -> dict:
    import httpx
    proc, url = start_server(args)
    try:
        lat = []
        with httpx.Client(timeout=120) as client:
            for _ in range(3):
                client.post(url + "/detect", content=data)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < args.seconds / 2 or len(lat) < 5:
                t = time.perf_counter()
                r = client.post(url + "/detect", content=data)
                assert r.status_code == 200, r.text
                lat.append((time.perf_counter() - t) * 1000)
        out = {"serve_single_p50_ms": statistics.median(lat)}
        out.update(asyncio.run(_load(url, data, args.concurrency, args.seconds)))
        return out
    finally:
        proc.terminate()
        proc.wait(30)


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
    if "detector" not in skip:
        res.update(bench_detector(dets[0], image, args.batch, args.seconds))
        print(f"detect_batch x{args.batch}: {res['detect_batch_ips']:.1f} img/s; detect p50 "
              f"{res['detect_p50_ms']:.2f} ms (device 0)")
    if "serve" not in skip:
        res.update(bench_server(args, data))
        print(f"POST /detect one at a time: p50 {res['serve_single_p50_ms']:.2f} ms"
              + (f" (+{res['serve_single_p50_ms'] - res['detect_p50_ms']:.2f} ms over detect)"
                 if "detect_p50_ms" in res else ""))
        print(f"POST /detect x{args.concurrency} clients: {res['serve_ips']:.1f} img/s, p50 {res['serve_p50_ms']:.1f} "
              f"ms, p99 {res['serve_p99_ms']:.1f} ms, {res['serve_503']} answered 503"
              + (f"; {res['serve_ips'] / res['detect_batch_ips']:.2f} x detect_batch" if "detect_batch_ips" in res
                 else ""))
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
