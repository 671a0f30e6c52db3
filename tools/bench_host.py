#!/usr/bin/env python3
"""Where a frame's time goes on the host path, in one run: device time vs what the user waits.

For each MODEL:SIZE:BATCH (``--models``):
  device      sum of kernel times from OpenCL profiling events (a separate profiled runtime)
  run         ``Executor.run`` wall on the default queue (no profiling, no per-launch events)
  run steps   one ``run`` taken apart (``Executor.run_steps``: the queue waited on after each step):
              upload, enqueue, device (the wait once enqueued), read, return; and copy, what
              copying the heads would add (``run`` lends the arrays it read them into instead);
              and ``run`` from a pinned input (``Executor.input_array``) instead of the caller's array
  forward     ``Detector.forward(blob)`` wall
  enqueue     microseconds per launch to enqueue the plan (queue not waited on)
  resident    the plan alone, its input already on the device: enqueue + wait (what the PyTorch
              harness's graph_ms times: a CUDA graph's replay + synchronize)
  detect      ``detect_batch`` wall on BATCH 1280x720 BGR frames, device and host pre/post-processing
              (a plain frame and a ``frame_array`` one on the device path, a plain one on the host's:
              the three take ``--reps`` turns of ``--detect-block`` calls in a row, the median call)
  inflight    frames per second of submit(N+1) / result(N) over 1280x720 frames (device path)
  launches    kernel launches per frame: network, and the whole device-path frame
For ``--video`` (default: ../shared/videos/library1.mp4 when present), with the first model:
  decode-only, draw-only, encode-only (mp4v), inference-only (in flight) and the CLI pipeline
  (``--jsonl`` alone, and ``--out`` + ``--jsonl``) in frames per second.
``--fold-compare`` times the plans with and without folding side by side (see ``fold_compare``).
``--lend-compare`` times ``Executor.run`` lending its head arrays against returning copies of them
(the path before lending) side by side (see ``lend_compare``).
``--branches-compare`` times one queue against side branches on a second one (``run`` from a pinned
input, and ``detect`` of a 1280x720 ``frame_array`` frame at batch 1), see ``branches_compare``.
``--per-image-compare`` times ``Executor.run`` from a pinned input with the batch's first and last
layers batch-wide, per image at one end, and at both (``per_image.py``), see ``per_image_compare``.
``--profile-detect`` adds where ``detect_batch`` spends its wall (cProfile's top functions by own
time) and the floor of a synchronous call (the frames' copy into pinned memory, their DMA).
``--zoo`` counts launches per frame for the zoo networks at their cfg size, by kernel; ``--no-fold``
binds the plans without folding maxpool/upsample into the convs' input reads (the count before it).

Random weights unless the model ships real ones. Runs from the source tree on the GPU machine:
    . tools/gpu-setup.sh && python3 tools/bench_host.py --json $OUT/host.json
and on PoCL:  PYTHONPATH=.src python tools/bench_host.py --models yolov3-tiny:416:1 --json host.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from yolo_cl import Detector, hostsets
from yolo_cl.draw import draw
from yolo_cl.runtime import atomic_write
from yolo_cl.video_cli import run_detect_stream
from yolo_cl.zoo import resolve

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from bench_gpu import write_weights             # noqa: E402  (random weights with finite heads)

VIDEO = ROOT.parent / "shared" / "videos" / "library1.mp4"


def log(*a) -> None:
    print(*a, flush=True)


def median_ms(fn, reps: int, warm: int = 2) -> float:
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ts))


def interleaved_ms(fns: list, reps: int, block: int = 1) -> list:
    """Median ms of one call of each function: the functions take turns ``reps`` times after a
    warm-up, each turn ``block`` calls back to back (as a program's loop calls it: a call does
    not follow another path's call, whose host work and frames are still in the caches),
    each call timed."""
    for fn in fns:
        fn()
    ts: list = [[] for _ in fns]
    for _ in range(reps):
        for t, fn in zip(ts, fns):
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                t.append((time.perf_counter() - t0) * 1e3)
    return [float(np.median(t)) for t in ts]


def model_files(name: str, tmp: Path) -> tuple:
    """(cfg, weights) of a zoo model: its shipped weights, else random ones written once."""
    z = resolve(name)
    if z is None:
        raise SystemExit(f"unknown model {name}")
    cfg, wts = z
    if wts is not None and Path(wts).is_file():
        return cfg, wts
    wts = tmp / f"{name}.weights"
    if not wts.exists():
        write_weights(Path(cfg), wts)
    return cfg, wts


def enqueue_us(det: Detector, ex, reps: int) -> float:
    """Microseconds per launch to enqueue the network's launch list on the default queue, the
    way ``run`` enqueues it (``Executor.launch_way``)."""
    q = det.runtime.queue
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ex.enqueue()
        ts.append((time.perf_counter() - t0) * 1e6 / max(1, len(ex.launches)))
        q.finish()
    return float(np.median(ts))


def resident_ms(det: Detector, ex, reps: int) -> float:
    """Median ms of the plan alone with its input already in the arena: enqueue it, wait for the
    queue (no upload, no head read). What a CUDA graph's ``replay()`` + ``synchronize()`` times,
    so the like-for-like figure for the PyTorch harness's ``graph_ms``; unlike the device time (a
    sum of profiled kernels) it counts the gaps between kernels and no profiling overhead."""
    q = det.runtime.queue
    ex.run(np.zeros(ex.input_array().shape, np.float32))        # something in the input region
    ts = []
    for _ in range(reps + 2):
        t0 = time.perf_counter()
        ex.enqueue()
        q.finish()
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ts[2:]))


def run_steps(ex, blob: np.ndarray, reps: int) -> dict:
    """Median ms of each step of ``Executor.run_steps``, their sum, and ``copy``: the time a copy
    of the returned heads takes (the per-frame cost of returning copies)."""
    steps: dict = {}
    copies = []
    for i in range(reps + 2):
        outs, ms = ex.run_steps(blob)
        t0 = time.perf_counter()
        copied = [o.copy() for o in outs]
        t1 = time.perf_counter()
        del outs, copied
        if i >= 2:
            for k, v in ms.items():
                steps.setdefault(k, []).append(v)
            copies.append((t1 - t0) * 1e3)
    out = {k: float(np.median(v)) for k, v in steps.items()}
    out["sum"] = sum(out.values())
    out["copy"] = float(np.median(copies))
    return out


def frame_launches(det: Detector, ex) -> dict:
    """Commands per frame: the network's launches, and the whole frame on the host path (upload,
    network, one read per head) and on the device path (per image upload + preprocess, network,
    the decode with the NMS (one launch), and one candidate read per image, the first bringing the
    counters too)."""
    net = len(ex.launches)
    kinds: dict = {}
    for l in ex.launches:
        kinds[l.name] = kinds.get(l.name, 0) + 1
    return {"network": net, "by_kind": kinds, "folded": sum(1 for l in ex.launches if l.config.get("through")),
            "command_buffer": ex.command_buffer is not None,
            "host_path_frame": 1 + net + len(ex.graph.outputs),
            "device_path_frame": 2 * ex.batch + net + 1 + ex.batch}


def frame_1280x720(seed: int = 0) -> np.ndarray:
    img = cv2.imread(str(ROOT / "models" / "images" / "dog.jpg"))
    if img is None:
        img = np.random.default_rng(seed).integers(0, 256, (576, 768, 3), dtype=np.uint8)
    return cv2.resize(img, (1280, 720))


def model_spec(spec: str, precision: str, tmp: Path) -> tuple:
    """(name, size, batch, cfg, weights, row) of a MODEL:SIZE:BATCH spec (size 416 and batch 1 by
    default); ``row`` starts the figures reported for it."""
    name, size, batch = (spec.split(":") + ["416", "1"])[:3]
    size, batch = int(size), int(batch)
    cfg, wts = model_files(name, tmp)
    return name, size, batch, cfg, wts, {"model": name, "size": size, "batch": batch, "precision": precision}


def device_ms(cfg, wts, size: int, batch: int, precision: str, blob: np.ndarray, reps: int) -> float:
    """Median device time (sum of kernel events) of ``reps`` profiled runs after two, batch-wide
    (a separate profiling Detector)."""
    prof = Detector(cfg, wts, input_size=size, precision=precision, profiling=True,
                    device_preprocess=False, device_decode=False, per_image=False)
    pex = prof.executor(batch)
    dev = []
    for i in range(reps + 2):
        pex.run(blob, profile=True)
        if i >= 2:
            dev.append(sum(t.ms for t in pex.layer_times()))
    return float(np.median(dev))


def run_figures(row: dict) -> str:
    """``run`` from the caller's array, from ``input_array()`` and (half plans) from a half one, and
    with the heads handed out as half too (``outputs_as``)."""
    half = f", a half one {row['run_half_input_ms']:.2f}" if "run_half_input_ms" in row else ""
    half += f", half in and out {row['run_half_ms']:.2f}" if "run_half_ms" in row else ""
    return f"run {row['run_ms']:.2f} (from input_array() {row['run_pinned_input_ms']:.2f}{half})"


def bench_model(spec: str, precision: str, tmp: Path, reps: int, flushes: tuple = (),
                profile_detect: bool = False, detect_block: int = 10) -> tuple:
    name, size, batch, cfg, wts, row = model_spec(spec, precision, tmp)
    shipped = resolve(name)[1] is not None
    blob = np.random.default_rng(0).random((batch, 3, size, size), dtype=np.float32)
    row["device_ms"] = device_ms(cfg, wts, size, batch, precision, blob, reps)
    det = Detector(cfg, wts, input_size=size, precision=precision, device_preprocess=True, device_decode=True)
    ex = det.executor(batch)
    row["device"] = det.runtime.device_name
    row["run_ms"] = median_ms(lambda: ex.run(blob), reps)
    pinned_blob = ex.input_array()
    pinned_blob[...] = blob
    row["run_pinned_input_ms"] = median_ms(lambda: ex.run(pinned_blob), reps)
    row["run_steps_ms"] = st = run_steps(ex, blob, reps)
    row["run_steps_pinned_input_ms"] = sp = run_steps(ex, pinned_blob, reps)
    del pinned_blob
    if ex.half:                     # the blob in the plan's own half type: half the bytes, no conversion
        half_blob = ex.input_array(np.float16)
        half_blob[...] = blob
        row["run_half_input_ms"] = median_ms(lambda: ex.run(half_blob), reps)
        ex.outputs_as(np.float16)   # and the heads back in it too
        row["run_half_ms"] = median_ms(lambda: ex.run(half_blob), reps)
        ex.outputs_as(np.float32)
        del half_blob
    log(f"  {name} {size} b{batch} {precision} run {row['run_ms']:.2f} ms; one step at a time: "
        + ", ".join(f"{k} {v:.2f}" for k, v in st.items() if k not in ("sum", "copy"))
        + f" (sum {st['sum']:.2f}); copying the heads would add {st['copy']:.2f} ms; from a pinned input "
        f"(Executor.input_array) run {row['run_pinned_input_ms']:.2f} ms, upload {sp['upload']:.2f}")
    if flushes:
        row["run_ms_by_flush_every"] = {}
        for every in flushes:
            ex.flush_every = every
            row["run_ms_by_flush_every"][every] = median_ms(lambda: ex.run(blob), reps)
        ex.flush_every = 0
        log(f"  Executor.run ms by flush_every: {row['run_ms_by_flush_every']}")
    row["forward_ms"] = median_ms(lambda: det.forward(blob), reps)
    row["enqueue_us_per_launch"] = enqueue_us(det, ex, reps)
    row["resident_ms"] = resident_ms(det, ex, reps)
    row["launch_way"] = ex.launch_way
    row["launches"] = frame_launches(det, ex)
    if not shipped:        # random weights detect thousands of boxes: detect and in-flight figures need real ones
        d = row["device_ms"]
        row["ratios"] = {"run/device": row["run_ms"] / d, "forward/device": row["forward_ms"] / d,
                         "host_overhead_run_ms": row["run_ms"] - d}
        log(f"{name} {size} b{batch} {precision} on {row['device']}: device {d:.2f} ms | resident "
            f"{row['resident_ms']:.2f} | {run_figures(row)} | forward {row['forward_ms']:.2f} | "
            f"{row['launches']['network']} launches, "
            f"{row['enqueue_us_per_launch']:.1f} us each ({ex.launch_way}; random weights: no detect figures)")
        return row, det
    frames = [frame_1280x720(i) for i in range(batch)]
    pinned_frames = [det.frame_array(720, 1280) for _ in range(batch)]    # decoded straight into pinned memory
    for f, src in zip(pinned_frames, frames):
        f[...] = src

    def on_path(device: bool, imgs: list):
        def run() -> None:
            det.device_preprocess = device
            det.detect_batch(imgs)
        return run

    # The paths take turns, so a machine whose load changes treats them alike; each turn is
    # detect_block calls in a row, as a program's loop calls detect.
    row["detect_block"] = detect_block
    row["detect_device_ms"], row["detect_pinned_frame_ms"], row["detect_host_ms"] = interleaved_ms(
        [on_path(True, frames), on_path(True, pinned_frames), on_path(False, frames)], reps, detect_block)
    det.device_preprocess = True
    n = max(8, reps)

    def inflight_fps(imgs: list) -> float:
        t0 = time.perf_counter()
        prev = None
        for _ in range(n):
            h = det.submit(imgs)
            if prev is not None:
                det.result(prev)
            prev = h
        det.result(prev)
        return n * batch / (time.perf_counter() - t0)
    row["inflight_fps"] = inflight_fps(frames)
    row["inflight_pinned_frame_fps"] = inflight_fps(pinned_frames)     # unchanged frames: safe to resubmit
    if profile_detect:
        row["detect_profile"] = detect_profile(det, frames, reps)
    d = row["device_ms"]
    row["ratios"] = {"run/device": row["run_ms"] / d, "forward/device": row["forward_ms"] / d,
                     "detect_device/device": row["detect_device_ms"] / d,
                     "detect_pinned_frame/device": row["detect_pinned_frame_ms"] / d,
                     "host_overhead_run_ms": row["run_ms"] - d}
    log(f"{name} {size} b{batch} {precision} on {row['device']}: device {d:.2f} ms | resident "
        f"{row['resident_ms']:.2f} | {run_figures(row)} | forward {row['forward_ms']:.2f} | "
        f"detect 1280x720 device-path {row['detect_device_ms']:.2f} "
        f"(from a frame_array {row['detect_pinned_frame_ms']:.2f}) / host-path "
        f"{row['detect_host_ms']:.2f} ms | in flight {row['inflight_fps']:.1f} fps "
        f"({row['inflight_pinned_frame_fps']:.1f} from frame_arrays) | "
        f"{row['launches']['network']} launches ({row['launches']['host_path_frame']} / "
        f"{row['launches']['device_path_frame']} commands a host / device-path frame), "
        f"{row['enqueue_us_per_launch']:.1f} us each ({ex.launch_way})")
    return row, det


def detect_profile(det, frames: list, reps: int, top: int = 14) -> dict:
    """Where ``detect_batch`` on the device path spends its wall time: the functions with the most
    own time under cProfile (ms per call; cProfile's own cost inflates Python-heavy rows), and the
    floor a synchronous call cannot go under: copying the frames into pinned memory and their DMA."""
    import cProfile
    import pstats
    det.device_preprocess = True
    det.detect_batch(frames)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        det.detect_batch(frames)
    prof.disable()
    st = pstats.Stats(prof)
    rows = sorted(((v[2] * 1e3 / reps, f"{Path(k[0]).name}:{k[1]}({k[2]})") for k, v in st.stats.items()),
                  reverse=True)[:top]
    rt = det.runtime
    cl = rt.cl
    nbytes = sum(f.nbytes for f in frames)
    pinned = cl.Buffer(rt.context, cl.mem_flags.ALLOC_HOST_PTR | cl.mem_flags.READ_ONLY, nbytes)
    host, _ = cl.enqueue_map_buffer(rt.queue, pinned, cl.map_flags.WRITE, 0, (nbytes,), np.uint8)
    dev = cl.Buffer(rt.context, cl.mem_flags.READ_ONLY, nbytes)
    flat = np.concatenate([f.reshape(-1) for f in frames])

    def copy() -> None:
        np.copyto(host, flat)

    def dma() -> None:
        cl.enqueue_copy(rt.queue, dev, host, is_blocking=True)
    from concurrent.futures import ThreadPoolExecutor
    pool = ThreadPoolExecutor(4)
    quarters = [slice(i * nbytes // 4, (i + 1) * nbytes // 4) for i in range(4)]

    def copy4() -> None:          # would threads fill the (possibly write-combined) pinned pages faster?
        for f in [pool.submit(np.copyto, host[q], flat[q]) for q in quarters]:
            f.result()
    floor = {"copy_to_pinned_ms": median_ms(copy, reps), "dma_ms": median_ms(dma, reps),
             "copy_to_pinned_4_threads_ms": median_ms(copy4, reps)}
    pool.shutdown()
    log(f"  detect_batch under cProfile, own ms per call: " + "; ".join(f"{n} {ms:.3f}" for ms, n in rows))
    log(f"  floor of a synchronous detect: frames into pinned memory {floor['copy_to_pinned_ms']:.3f} ms "
        f"({floor['copy_to_pinned_4_threads_ms']:.3f} ms on 4 threads), their DMA {floor['dma_ms']:.3f} ms "
        f"({nbytes / 1e6:.1f} MB)")
    return {"top": [[n, ms] for ms, n in rows], **floor}


def fold_compare(spec: str, precision: str, tmp: Path, reps: int) -> dict:
    """The default plan (folding as the device does by default: reading and writing through on a
    GPU, writing through on a CPU) against the unfolded one (Detector(fold=False)), one process:
    launches by kind, device time (from profiled runtimes) and ``Executor.run`` wall and process CPU
    time (default queue), the four runs called in turn each repetition, so a machine whose load
    changes treats both plans alike."""
    name, size, batch, cfg, wts, row = model_spec(spec, precision, tmp)
    blob = np.random.default_rng(0).random((batch, 3, size, size), dtype=np.float32)
    exs, pexs, keep = {}, {}, []
    for fold in (False, None):
        key = "no_fold" if fold is False else "fold"
        prof = Detector(cfg, wts, input_size=size, precision=precision, profiling=True, fold=fold)
        det = Detector(cfg, wts, input_size=size, precision=precision, fold=fold)
        pexs[key], exs[key] = prof.executor(batch), det.executor(batch)
        keep += [prof, det]
        row[key] = {"launches": frame_launches(det, exs[key])}
        row["device"] = det.runtime.device_name
    devs: dict = {k: [] for k in exs}
    walls: dict = {k: [] for k in exs}
    cpus: dict = {k: [] for k in exs}
    for k in exs:
        pexs[k].run(blob, profile=True)
        exs[k].run(blob)
    for _ in range(reps):
        for k in exs:
            pexs[k].run(blob, profile=True)
            devs[k].append(sum(t.ms for t in pexs[k].layer_times()))
            t0, c0 = time.perf_counter(), time.process_time()
            exs[k].run(blob)
            walls[k].append((time.perf_counter() - t0) * 1e3)
            cpus[k].append((time.process_time() - c0) * 1e3)
    for k in exs:
        r = row[k]
        r["device_ms"] = float(np.median(devs[k]))
        r["run_ms"], r["run_cpu_ms"] = float(np.median(walls[k])), float(np.median(cpus[k]))
        r["host_overhead_ms"] = r["run_ms"] - r["device_ms"]
        log(f"{name} {size} b{batch} {precision} {k}: {r['launches']['network']} launches | device {r['device_ms']:.2f} ms "
            f"| run {r['run_ms']:.2f} ms (process CPU {r['run_cpu_ms']:.1f} ms) | host overhead {r['host_overhead_ms']:.2f} ms")
    return row


def branches_compare(spec: str, precision: str, tmp: Path, reps: int) -> dict:
    """One queue against side branches on a second one (``Detector(branches=False/True)``, one
    process): whether the outputs and detections are equal, then ``Executor.run`` from each one's
    ``input_array()`` and (batch 1) ``detect`` of a 1280x720 ``frame_array`` frame, the two taking
    turns of 100 calls ``reps`` times (``interleaved_ms``)."""
    name, size, batch, cfg, wts, row = model_spec(spec, precision, tmp)
    dets = {k: Detector(cfg, wts, input_size=size, precision=precision, branches=k == "two") for k in ("one", "two")}
    exs = {k: d.executor(batch) for k, d in dets.items()}
    row["device"] = dets["one"].runtime.device_name
    row["side_layers"] = exs["two"].side_layers
    blob = np.random.default_rng(0).random((batch, 3, size, size), dtype=np.float32)
    ins = {k: ex.input_array() for k, ex in exs.items()}
    for k in ins:
        ins[k][...] = blob
    outs = {k: [o.copy() for o in ex.run(ins[k])] for k, ex in exs.items()}
    row["equal"] = all(np.array_equal(a, b) for a, b in zip(outs["one"], outs["two"]))
    runs = interleaved_ms([lambda k=k: exs[k].run(ins[k]) for k in exs], reps, 100)
    row["run_ms"] = dict(zip(exs, runs))
    text = f"run {runs[0]:.4f} / {runs[1]:.4f} ms"
    if batch == 1:
        frames = {k: d.frame_array(720, 1280) for k, d in dets.items()}
        for f in frames.values():
            f[...] = frame_1280x720()
        found = {k: [(x.class_id, x.confidence, x.box) for x in dets[k].detect(frames[k])] for k in dets}
        row["equal"] = row["equal"] and found["one"] == found["two"]
        detects = interleaved_ms([lambda k=k: dets[k].detect(frames[k]) for k in dets], reps, 100)
        row["detect_ms"] = dict(zip(dets, detects))
        text += f", detect {detects[0]:.4f} / {detects[1]:.4f} ms"
    log(f"{name} {size} b{batch} {precision}, one queue / two (layers {', '.join(row['side_layers']) or 'none'} "
        f"on the second): {text}; outputs equal: {row['equal']}")
    return row


def per_image_compare(spec: str, precision: str, tmp: Path, reps: int) -> dict:
    """The batch-wide plan against its first span, its last span and both run image by image
    (``Detector(per_image="0"|"first"|"last"|"1")``, one process): whether the
    outputs are equal, the arena, launches per frame, then ``Executor.run`` from each one's
    ``input_array()``, taking turns of 20 calls ``reps`` times (``interleaved_ms``), against the
    device time of the batch-wide plan (profiled, median of ``reps``)."""
    name, size, batch, cfg, wts, row = model_spec(spec, precision, tmp)
    blob = np.random.default_rng(0).random((batch, 3, size, size), dtype=np.float32)
    row["device_ms"] = d = device_ms(cfg, wts, size, batch, precision, blob, reps)
    exs, keep, ins = {}, [], {}
    for key in ("0", "first", "last", "1"):
        det = Detector(cfg, wts, input_size=size, precision=precision, per_image=key)
        exs[key] = det.executor(batch)
        keep.append(det)
        ins[key] = exs[key].input_array()
        ins[key][...] = blob
        row["device"] = det.runtime.device_name
    outs = {k: [o.copy() for o in ex.run(ins[k])] for k, ex in exs.items()}
    row["equal"] = all(np.array_equal(a, b) for k in outs for a, b in zip(outs[k], outs["0"]))
    row["split"] = {k: ex.split is not None for k, ex in exs.items()}
    row["arena_mb"] = {k: ex.arena_bytes / 2**20 for k, ex in exs.items()}
    row["launches"] = {k: ex.launches_per_frame for k, ex in exs.items()}
    runs = interleaved_ms([lambda k=k: exs[k].run(ins[k]) for k in exs], reps, 20)
    row["run_ms"] = dict(zip(exs, runs))
    log(f"{name} {size} b{batch} {precision}, device {d:.3f} ms (batch-wide plan); run from input_array() "
        + ", ".join(f"{k}: {r:.3f} ms ({r / d:.3f}x, {row['launches'][k]} launches, arena {row['arena_mb'][k]:.0f} MiB"
                    f"{'' if row['split'][k] or k == '0' else ', no split'})" for k, r in zip(exs, runs))
        + f"; outputs equal: {row['equal']}")
    return row


def lend_compare(spec: str, precision: str, tmp: Path, reps: int) -> dict:
    """``Executor.run`` returning the arrays it read the heads into (``lend``) against one whose
    pool holds no set (``hostsets.CAP = 0`` when its pool is made), so it reads into a spare set
    and returns copies (``copy``: the path before lending); one Detector each, called in turn
    every repetition (a machine whose load changes treats both alike): wall and process CPU ms,
    and ``run_steps`` of each."""
    name, size, batch, cfg, wts, row = model_spec(spec, precision, tmp)
    blob = np.random.default_rng(0).random((batch, 3, size, size), dtype=np.float32)
    exs, keep = {}, []
    for key in ("lend", "copy"):
        det = Detector(cfg, wts, input_size=size, precision=precision)
        exs[key] = ex = det.executor(batch)
        keep.append(det)
        cap, hostsets.CAP = hostsets.CAP, (0 if key == "copy" else hostsets.CAP)
        try:
            ex.run(blob)
        finally:
            hostsets.CAP = cap
        row["device"] = det.runtime.device_name
    row["heads_mb"] = sum(o.nbytes for o in exs["lend"].run(blob)) / 2**20
    walls: dict = {k: [] for k in exs}
    cpus: dict = {k: [] for k in exs}
    for _ in range(reps):
        for k, ex in exs.items():
            t0, c0 = time.perf_counter(), time.process_time()
            ex.run(blob)
            walls[k].append((time.perf_counter() - t0) * 1e3)
            cpus[k].append((time.process_time() - c0) * 1e3)
    for k, ex in exs.items():
        r = row[k] = {"run_ms": float(np.median(walls[k])), "run_cpu_ms": float(np.median(cpus[k]))}
        r["steps_ms"] = st = run_steps(ex, blob, max(3, reps // 2))
        log(f"{name} {size} b{batch} {precision} {k} ({row['heads_mb']:.1f} MB of heads): run {r['run_ms']:.2f} ms "
            f"(process CPU {r['run_cpu_ms']:.1f} ms); steps: "
            + ", ".join(f"{s} {v:.2f}" for s, v in st.items() if s not in ("sum", "copy")))
    return row


def bench_video(det: Detector, clip: Path, tmp: Path, max_frames: int) -> dict:
    """Stage-alone and pipeline frame rates for one clip."""
    res: dict = {"clip": str(clip)}
    cap = cv2.VideoCapture(str(clip))
    fps_in = cap.get(cv2.CAP_PROP_FPS) or 30.0
    frames = []
    t0 = time.perf_counter()
    while len(frames) < max_frames:
        ok, f = cap.read()
        if not ok:
            break
        frames.append(f)
    res["decode_fps"] = len(frames) / (time.perf_counter() - t0)
    cap.release()
    if not frames:
        return res
    if len(frames) < max_frames:
        cut = clip
    else:                         # the pipeline runs read the same prefix as the stage-alone ones
        cut = tmp / "clip.mp4"
        w = cv2.VideoWriter(str(cut), cv2.VideoWriter_fourcc(*"mp4v"), fps_in, frames[0].shape[1::-1])
        for f in frames:
            w.write(f)
        w.release()
    n = len(frames)
    res["frames"] = n
    res["size"] = list(frames[0].shape[1::-1])
    t0 = time.perf_counter()
    prev, dets = None, []
    for f in frames:
        h = det.submit(f)
        if prev is not None:
            dets.append(det.result(prev))
        prev = h
    dets.append(det.result(prev))
    res["inference_fps"] = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    drawn = [draw(f, d, det.names) for f, d in zip(frames, dets)]
    res["draw_fps"] = n / (time.perf_counter() - t0)
    w = cv2.VideoWriter(str(tmp / "enc.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), fps_in, frames[0].shape[1::-1])
    t0 = time.perf_counter()
    for f in drawn:
        w.write(f)
    w.release()
    res["encode_fps"] = n / (time.perf_counter() - t0)
    del drawn
    for label, out in (("pipeline_jsonl_fps", None), ("pipeline_out_fps", tmp / "out.mp4")):
        args = argparse.Namespace(out=str(out) if out else None, jsonl=str(tmp / "det.jsonl"), quiet=True)
        t0 = time.perf_counter()
        run_detect_stream(det, str(cut), args)
        res[label] = n / (time.perf_counter() - t0)
    lo = min(res["decode_fps"], res["inference_fps"])
    res["jsonl_vs_min(decode,inference)"] = res["pipeline_jsonl_fps"] / lo
    res["out_vs_min(decode,inference,encode)"] = res["pipeline_out_fps"] / min(lo, res["encode_fps"])
    log("video {clip} {size[0]}x{size[1]} ({frames} frames): decode {decode_fps:.0f} fps, inference {inference_fps:.0f}, "
        "draw {draw_fps:.0f}, encode {encode_fps:.0f}; pipeline --jsonl {pipeline_jsonl_fps:.0f} fps, "
        "--out {pipeline_out_fps:.0f} fps".format(**res))
    return res


def zoo_launches(names: list, tmp: Path) -> dict:
    out = {}
    for name in names:
        cfg, wts = model_files(name, tmp)
        det = Detector(cfg, wts)
        ex = det.executor(1)
        out[name] = frame_launches(det, ex)
        out[name]["size"] = list(det.input_size)
        log(f"{name} {det.input_size[0]}x{det.input_size[1]}: {out[name]['network']} launches "
            f"({', '.join(f'{k} {n}' for k, n in sorted(out[name]['by_kind'].items()))}; "
            f"{out[name]['folded']} input reads fold a maxpool/upsample), commands a "
            f"frame: {out[name]['host_path_frame']} host path, {out[name]['device_path_frame']} device path")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="yolov3-tiny:416:1,yolov3:416:1,yolov3:608:8",
                    help="MODEL:SIZE:BATCH,... (zoo names)")
    ap.add_argument("--precision", default="fp32", help="fp32, fp16 or fp32,fp16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--detect-block", type=int, default=10, help="detect calls in a row per turn of each path "
                    "(the paths take --reps turns)")
    ap.add_argument("--video", default=str(VIDEO) if VIDEO.is_file() else "", help="clip for the video rates ('' skips)")
    ap.add_argument("--video-frames", type=int, default=300)
    ap.add_argument("--zoo", default="", help="zoo names to count launches of, e.g. yolov3-tiny,yolov4-tiny,yolov3,yolov4")
    ap.add_argument("--json", default="", help="write every figure here")
    ap.add_argument("--fold-compare", default="", help="MODEL:SIZE:BATCH,...: time the plans with and without "
                    "folding side by side (launches, device, run wall and process CPU, host overhead), then exit")
    ap.add_argument("--lend-compare", default="", help="MODEL:SIZE:BATCH,...: time run lending its head arrays "
                    "against returning copies, side by side (wall, process CPU, steps), then exit")
    ap.add_argument("--branches-compare", default="", help="MODEL:SIZE:BATCH,...: time one queue against side "
                    "branches on a second one (run from a pinned input, detect of a frame_array frame), then exit")
    ap.add_argument("--per-image-compare", default="", help="MODEL:SIZE:BATCH,...: time run from a pinned input "
                    "with the first/last layers batch-wide, per image at one end, and at both, then exit")
    ap.add_argument("--no-fold", action="store_true", help="plans without folded maxpool/upsample reads "
                    "(sets YOLO_CL_FOLD=0: the launch counts and host times before the folding)")
    ap.add_argument("--profile-detect", action="store_true", help="also profile detect_batch (cProfile) and time "
                    "its floor: the frames' copy into pinned memory and their DMA")
    ap.add_argument("--flush", default="", help="also time Executor.run flushing every N launches, e.g. 4,16,64")
    args = ap.parse_args()
    if args.no_fold:
        os.environ["YOLO_CL_FOLD"] = "0"
    np.seterr(all="ignore")      # random weights may saturate a head: no warnings in the figures
    data: dict = {"argv": sys.argv[1:], "models": []}

    def save() -> None:
        if args.json:
            atomic_write(args.json, json.dumps(data, indent=1).encode())

    with tempfile.TemporaryDirectory(prefix="bench-host-") as td:
        tmp = Path(td)
        compares = [(key, fn, specs) for key, fn, specs in (("fold_compare", fold_compare, args.fold_compare),
                                                            ("lend_compare", lend_compare, args.lend_compare),
                                                            ("branches_compare", branches_compare,
                                                             args.branches_compare),
                                                            ("per_image_compare", per_image_compare,
                                                             args.per_image_compare)) if specs]
        for key, fn, specs in compares:
            data[key] = []
            for prec in args.precision.split(","):
                for spec in filter(None, specs.split(",")):
                    data[key].append(fn(spec, prec, tmp, args.reps))
                    save()
        if compares:
            return
        first = None
        for prec in args.precision.split(","):
            for spec in filter(None, args.models.split(",")):
                row, det = bench_model(spec, prec, tmp, args.reps, tuple(int(v) for v in args.flush.split(",") if v),
                                       args.profile_detect, args.detect_block)
                data["models"].append(row)
                save()
                if first is None and row["batch"] == 1:
                    first = det
                else:
                    del det
        if args.video and first is not None:
            data["video"] = bench_video(first, Path(args.video), tmp, args.video_frames)
            save()
        if args.zoo:
            data["zoo_launches"] = zoo_launches(args.zoo.split(","), tmp)
            save()


if __name__ == "__main__":
    main()
