#!/usr/bin/env python3
"""GPU benchmarks for the local GEMM family and Winograd (issues 3 and 4), in one process.

Phases (``--phases``, comma-separated; each writes into ``--out`` as it finishes, so a run
cut short still leaves its results):

  env     the device and its limits
  gemm    our GEMM (best of a config sweep, each candidate checked against NumPy first)
          vs CLBlast SGEMM (ctypes, same context and queue) on YOLOv2's nine (M, K, N) + 1024^3
  tune    per-layer search for MODEL (--size, --batch): every unique conv shape times the
          legal candidates (implicit / im2col / 1x1 GEMM / Winograd F(2x2), F(4x4)), each first
          checked against the heuristic kernel's output; writes tuning-gpu.yaml
  e2e     MODEL end to end with the tuned table: device time (sum of OpenCL profiling events),
          per-layer times vs the roofline, wall time per frame, heads vs OpenCV DNN (OpenCL
          target, same GPU, same run) and OpenCV's latency
  matrix  fp32 vs fp16 latency and memory for yolov3/yolov4 at 416/608, batch 1/4/8 throughput
  warm    time to first detection in a fresh process: cold (empty binary cache) vs warm

Random weights (no zoo weights ship); the same file feeds yolo-cl and OpenCV.
Run on the GPU machine:  . tools/gpu-setup.sh && python3 tools/bench_gpu.py --out $OUT
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from yolo_cl.bench import random_params
from yolo_cl.cfg import parse_cfg
from yolo_cl.executor import Executor
from yolo_cl.kernels import conv as convk
from yolo_cl.kernels import gemm_local as gl
from yolo_cl.kernels import winograd
from yolo_cl.layers import build_layers, parse_net
from yolo_cl.model import load_model
from yolo_cl.precision import FP16, FP32
from yolo_cl.runtime import Runtime, atomic_write
from yolo_cl.weights import save_weights

ROOT = Path(__file__).resolve().parents[1]

YOLOV2_SHAPES = [(32, 27, 173056), (64, 288, 43264), (128, 576, 10816), (256, 1152, 2704), (512, 2304, 676),
                 (1024, 4608, 169), (1024, 9216, 169), (425, 1024, 169), (1024, 27648, 169), (1024, 1024, 1024)]
PEAK_TFLOPS = {"H100": 67.0, "H200": 63.6}   # fp32 FMA peaks: H200 measured (shared/gpu/README.md), H100 datasheet
BANDWIDTH_TBS = {"H100": 3.0, "H200": 4.3}   # device-to-device copy, measured here (KINDS.md)


def log(*a) -> None:
    print(*a, flush=True)


class Results:
    """Everything measured, saved to JSON after each phase."""

    def __init__(self, out: Path) -> None:
        self.out, self.data = out, {}

    def put(self, key: str, value) -> None:
        self.data[key] = value
        atomic_write(self.out / "bench.json", json.dumps(self.data, indent=1, default=str).encode())


# -- helpers ----------------------------------------------------------------------------------
def device_key(rt) -> str:
    n = rt.device_name
    return next((k for k in PEAK_TFLOPS if k in n), "H200")


_FAILED: set = set()      # program keys (program_key) the compiler rejected


def program_key(source: str, d: dict) -> tuple:
    return source, tuple(sorted(d.items()))


def prebuild(rt, items: list, threads: int = 16) -> float:
    """Compile (source, defines) pairs in parallel threads (``Runtime.program``, which is
    thread-safe and caches them); returns seconds. Failures go to ``_FAILED``."""
    todo = list({program_key(s, d): (s, d) for s, d in items}.values())
    t0 = time.perf_counter()

    def build(item):
        try:
            rt.program(*item)
            return None
        except Exception as e:        # a config the compiler rejects is reported, not fatal
            return item, e

    with cf.ThreadPoolExecutor(threads) as pool:
        for failed in pool.map(build, todo):
            if failed is not None:
                (source, d), e = failed
                _FAILED.add(program_key(source, d))
                log(f"  build failed {source} {d}: {str(e)[:200]}")
    return time.perf_counter() - t0


def event_ms(ev) -> float:
    return (ev.profile.end - ev.profile.start) * 1e-6


def time_launches(rt, launches: list, reps: int = 5, warm: int = 2) -> float:
    """Median over reps of the summed device time of ``launches`` (OpenCL events)."""
    cl, q = rt.cl, rt.queue
    for _ in range(warm):
        for l in launches:
            cl.enqueue_nd_range_kernel(q, l.kernel, l.gsize, l.lsize)
    ts = []
    for _ in range(reps):
        evs = [cl.enqueue_nd_range_kernel(q, l.kernel, l.gsize, l.lsize) for l in launches]
        q.finish()
        ts.append(sum(event_ms(e) for e in evs))
    return float(np.median(ts))


# -- random weights, written as a Darknet file both engines read -----------------------------
def write_weights(cfg: Path, path: Path, seed: int = 0) -> None:
    """The engine's random speed-run parameters (``yolo_cl.bench.random_params``: activations stay
    O(1), heads finite) written by its Darknet writer (``yolo_cl.weights.save_weights``)."""
    sections = parse_cfg(cfg)
    layers = build_layers(sections, parse_net(sections[0], None))
    save_weights(path, layers, random_params(layers, seed))


def model_files(name: str, size: int, tmp: Path) -> tuple:
    """(cfg at the wanted size, weights) for a zoo cfg."""
    src = ROOT / "models" / "cfg" / f"{name}.cfg"
    if not src.exists():
        src = ROOT / "models" / f"{name}.cfg"
    text = src.read_text()
    lines = []
    for line in text.splitlines():
        s = line.replace(" ", "")
        if s.startswith("width="):
            line = f"width={size}"
        elif s.startswith("height="):
            line = f"height={size}"
        elif s.startswith("batch="):
            line = "batch=1"
        elif s.startswith("subdivisions="):
            line = "subdivisions=1"
        lines.append(line)
    cfg = tmp / f"{name}-{size}.cfg"
    cfg.write_text("\n".join(lines) + "\n")
    wts = tmp / f"{name}.weights"
    if not wts.exists():
        write_weights(cfg, wts)
    return cfg, wts


def load_graph(cfg: Path, wts: Path):
    return load_model(cfg, wts).graph


class Table:
    """Conv configs by shape key; untuned shapes get the GPU heuristic."""

    def __init__(self, rt, entries: dict = None, half: bool = False) -> None:
        self.rt, self.entries, self.half = rt, dict(entries or {}), half
        self.lim = gl.device_limits(rt)
        self.hits = 0

    def conv_config(self, node, batch: int = 1) -> dict:
        if convk.is_depthwise(node):
            return {"algo": "depthwise"}
        c = self.entries.get(shape_key(node, batch))
        if c is not None and self.half and c.get("algo") == "winograd" and c.get("m") == 4:
            Mw, Nw, Kw, _ = winograd.gemm_shape(node, 2)       # F(4x4) fails the fp16 gate: same GEMM, F(2x2)
            c = {"algo": "winograd", "m": 2, "family": gl.FAMILY,
                 **gl.complete({k: c[k] for k in ("MWG", "NWG", "KWG", "MDIMC", "NDIMC", "SA", "SB", "PF")},
                               Mw, Nw, Kw)}
            if gl.why_illegal(c, Mw, Nw, Kw, False, self.lim) is not None:
                c = None
        if c is not None:
            self.hits += 1
            return dict(c)
        return gl.heuristic_config(node, batch, self.lim)


def tuner_key(node, batch: int):
    """The key engine/tuning_db.py files this shape under (None if that module is not there)."""
    try:
        from yolo_cl.tuning_db import shape_key as tk
        return tk(node, batch)
    except Exception:
        return None


def shape_key(node, batch: int) -> str:
    a = node.attrs
    return (f"conv k{a['size']} s{a['stride_x']}x{a['stride_y']} p{a['pad']} d{a['dilation']} g{a['groups']} "
            f"c{a['in_c']} f{a['filters']} {node.inputs[0].h}x{node.inputs[0].w} b{batch}")


# -- CLBlast through ctypes ----------------------------------------------------------------------
class CLBlast:
    """CLBlastSgemm on pyopencl buffers and queue (row-major, no transposes)."""

    def __init__(self, rt) -> None:
        self.lib = ctypes.CDLL("libclblast.so.1")
        f = self.lib.CLBlastSgemm
        sz, vp = ctypes.c_size_t, ctypes.c_void_p
        f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, sz, sz, sz, ctypes.c_float, vp, sz, sz, vp, sz, sz,
                      ctypes.c_float, vp, sz, sz, ctypes.POINTER(vp), ctypes.POINTER(vp)]
        f.restype = ctypes.c_int
        self.f, self.rt = f, rt
        self.q = ctypes.c_void_p(rt.queue.int_ptr)

    def sgemm(self, M, N, K, a, b, c):
        ev = ctypes.c_void_p()
        st = self.f(101, 111, 111, M, N, K, 1.0, a.int_ptr, 0, K, b.int_ptr, 0, N, 0.0, c.int_ptr, 0, N,
                    ctypes.byref(self.q), ctypes.byref(ev))
        if st != 0:
            raise RuntimeError(f"CLBlastSgemm status {st}")
        return self.rt.cl.Event.from_int_ptr(ev.value, retain=False)


# -- phase: GEMM vs CLBlast -------------------------------------------------------------------
def gemm_space(M, N, K, lim) -> list:
    """The GEMM sweep: staged configs with 64..256 work-items plus the barrier-free ones."""
    out = []
    for c in gl.space(M, N, K, False, lim):
        t, mwi, nwi = c["MDIMC"] * c["NDIMC"], c["MWG"] // c["MDIMC"], c["NWG"] // c["NDIMC"]
        if c["SA"] and c["SB"]:
            ok = c["PF"] and c["KWG"] in (16, 32) and 64 <= t <= 256 and mwi in (2, 4, 8) and nwi in (2, 4, 8) \
                and mwi * nwi >= 8
        else:       # a few barrier-free / A-only-staged variants, to see whether staging pays at all
            ok = c["SA"] == c["SB"] == 0 and t in (64, 256) and mwi * nwi in (32, 64)
        if ok:
            out.append(c)
    return out


def phase_gemm(rt, res: Results, args) -> None:
    cl = rt.cl
    lim = gl.device_limits(rt)
    peak = PEAK_TFLOPS[device_key(rt)]
    try:
        blast = CLBlast(rt)
    except OSError as e:
        blast = None
        log(f"CLBlast unavailable: {e}")
    rows = []
    rng = np.random.default_rng(0)
    for (M, K, N) in YOLOV2_SHAPES[args.gemm_from: args.gemm_shapes]:
        t_shape = time.perf_counter()
        A = rng.standard_normal((M, K)).astype(np.float32)
        B = rng.standard_normal((K, N)).astype(np.float32)
        ref = (A.astype(np.float64) @ B.astype(np.float64)) if M * N * K < 3e10 else (A @ B).astype(np.float64)
        bias = np.zeros(M, np.float32)
        Ab = rt.upload(gl.pack_weights(A, 1), "A")
        Araw = rt.upload(A, "A raw")
        Bb = rt.upload(B, "B")
        Cb = rt.alloc(M * N * 4, "C")
        biasb = rt.upload(bias, "bias")
        flops = 2.0 * M * N * K
        cands = gemm_space(M, N, K, lim)[: args.max_cands]
        items = [("gemm_local.cl", gl.defines({"HALF_STORAGE": False, "ACT": 0}, c, M, N, K)) for c in cands]
        tb = prebuild(rt, items)
        best = None
        timed = 0
        Pb = rt.alloc(max(gl.partial_bytes({"SK": max(gl.split_k(c) for c in cands)}, M, N, 1), 4), "P")
        for c, (src, d) in zip(cands, items):
            if program_key(src, d) in _FAILED:
                continue
            ls_ = gemm_launches(rt, c, d, M, N, K, Ab, biasb, Bb, Cb, Pb)
            cl.enqueue_fill_buffer(rt.queue, Cb, np.float32(np.nan), 0, M * N * 4)
            for l in ls_:
                cl.enqueue_nd_range_kernel(rt.queue, l.kernel, l.gsize, l.lsize)
            out = np.empty((M, N), np.float32)
            cl.enqueue_copy(rt.queue, out, Cb)
            err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref)) if np.isfinite(out).all() else float("inf")
            if err > 1e-4:
                log(f"  REJECT {c}: rel err {err:.1e}")
                continue
            ms = time_launches(rt, ls_, reps=5, warm=1)
            timed += 1
            if best is None or ms < best[0]:
                best = (ms, c, err)
        row = {"M": M, "K": K, "N": N, "candidates": len(cands), "timed": timed, "build_s": round(tb, 1)}
        if best:
            ms, c, err = best
            row.update(ours_ms=round(ms, 4), ours_tflops=round(flops / ms / 1e9, 2), ours_peak_pct=round(
                100 * flops / ms / 1e9 / peak, 1), config=c, rel_err=err)
        if blast is not None:
            try:
                blast.sgemm(M, N, K, Araw, Bb, Cb).wait()
                out = np.empty((M, N), np.float32)
                cl.enqueue_copy(rt.queue, out, Cb)
                berr = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
                ts = []
                for _ in range(7):
                    ev = blast.sgemm(M, N, K, Araw, Bb, Cb)
                    ev.wait()
                    ts.append(event_ms(ev))
                bms = float(np.median(ts[2:]))
                row.update(clblast_ms=round(bms, 4), clblast_tflops=round(flops / bms / 1e9, 2), clblast_err=berr)
                if best:
                    row["speedup"] = round(bms / best[0], 2)
            except Exception as e:
                row["clblast_error"] = str(e)[:200]
        row["shape_s"] = round(time.perf_counter() - t_shape, 1)
        rows.append(row)
        log(f"GEMM M={M} K={K} N={N}: ours {row.get('ours_tflops')} TF/s ({row.get('ours_ms')} ms, "
            f"{timed}/{len(cands)} timed, build {tb:.1f}s) clblast {row.get('clblast_tflops')} TF/s "
            f"speedup {row.get('speedup')} cfg {row.get('config')}")
        res.put("gemm", rows)
        for buf in (Ab, Araw, Bb, Cb, biasb, Pb):
            buf.release()
        if time.perf_counter() > args.deadline:
            log("gemm: deadline reached")
            break
    sp = [r["speedup"] for r in rows if "speedup" in r]
    if sp:
        res.put("gemm_geomean_speedup", float(np.exp(np.mean(np.log(sp)))))


def wall_ms(rt, enqueue, reps: int = 20) -> float:
    """Mean wall time of ``reps`` back-to-back calls of ``enqueue`` (one finish at the end), after a warm-up."""
    enqueue()
    rt.queue.finish()
    t0 = time.perf_counter()
    for _ in range(reps):
        enqueue()
    rt.queue.finish()
    return (time.perf_counter() - t0) * 1e3 / reps


def phase_gemmcheck(rt, res: Results, args) -> None:
    """Re-time the sweep's winners against CLBlast by wall clock as well as events.

    CLBlast may run several kernels per call (padding/transposing copies); its returned event
    covers only the last, so the wall-clock figure (back-to-back calls, one finish) is the fair one.
    """
    cl = rt.cl
    best = {}
    for f in args.gemm_best:
        for r in json.loads(Path(f).read_text()).get("gemm", []):
            if "config" in r:
                best[(r["M"], r["K"], r["N"])] = r["config"]
    blast = CLBlast(rt)
    rows = []
    rng = np.random.default_rng(5)
    for (M, K, N) in YOLOV2_SHAPES:
        c = best.get((M, K, N))
        if c is None:
            continue
        A = rng.standard_normal((M, K)).astype(np.float32)
        B = rng.standard_normal((K, N)).astype(np.float32)
        ref = A.astype(np.float64) @ B.astype(np.float64)
        Ab, Araw, Bb = rt.upload(gl.pack_weights(A, 1), "A"), rt.upload(A, "A raw"), rt.upload(B, "B")
        Cb, biasb = rt.alloc(M * N * 4, "C"), rt.upload(np.zeros(M, np.float32), "bias")
        Pb = rt.alloc(max(gl.partial_bytes(c, M, N, 1), 4), "P")
        ours = gemm_launches(rt, c, gl.defines({"HALF_STORAGE": False, "ACT": 0}, c, M, N, K), M, N, K,
                             Ab, biasb, Bb, Cb, Pb)

        def run_ours():
            for l in ours:
                cl.enqueue_nd_range_kernel(rt.queue, l.kernel, l.gsize, l.lsize)
        errs = {}
        for name, go in (("ours", run_ours),
                         ("clblast", lambda: blast.sgemm(M, N, K, Araw, Bb, Cb))):
            cl.enqueue_fill_buffer(rt.queue, Cb, np.float32(np.nan), 0, M * N * 4)
            go()
            out = np.empty((M, N), np.float32)
            cl.enqueue_copy(rt.queue, out, Cb)
            errs[name] = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        flops = 2.0 * M * N * K
        ev = time_launches(rt, ours, reps=10, warm=2)
        ow = wall_ms(rt, run_ours)
        bw = wall_ms(rt, lambda: blast.sgemm(M, N, K, Araw, Bb, Cb))
        row = {"M": M, "K": K, "N": N, "ours_event_ms": ev, "ours_wall_ms": ow, "clblast_wall_ms": bw,
               "ours_tflops": flops / ev / 1e9, "ours_wall_tflops": flops / ow / 1e9,
               "clblast_wall_tflops": flops / bw / 1e9, "speedup_wall": bw / ow, "errors": errs, "config": c}
        rows.append(row)
        log(f"GEMM check M={M} K={K} N={N}: ours {row['ours_tflops']:.2f} TF/s (event) {row['ours_wall_tflops']:.2f} "
            f"(wall) | CLBlast {row['clblast_wall_tflops']:.2f} (wall) | speedup {row['speedup_wall']:.2f}x | err {errs}")
        res.put("gemmcheck", rows)
        for buf in (Ab, Araw, Bb, Cb, biasb, Pb):
            buf.release()
    sp = [r["speedup_wall"] for r in rows]
    if sp:
        res.put("gemmcheck_geomean", float(np.exp(np.mean(np.log(sp)))))
        log(f"GEMM check: geometric-mean speedup over CLBlast {res.data['gemmcheck_geomean']:.2f}x, "
            f"min {min(sp):.2f}x")


class _L:
    """A bare launch for timing (kernel, global size, local size)."""

    def __init__(self, kernel, gsize, lsize) -> None:
        self.kernel, self.gsize, self.lsize = kernel, gsize, lsize


def gemm_launches(rt, cfg, defines, M, N, K, A, bias, B, C, P) -> list:
    """C = A.B + bias under ``cfg`` (with its split-K sum when SK > 1), as bare launches."""
    cl = rt.cl
    out = []
    for name, d, args, gs, ls, _ in gl.launch_specs(cfg, defines, M, N, K, 1, 1, [A, bias],
                                                    [B] + [np.int32(v) for v in (0, 0, 0, N)],
                                                    [C, np.int32(0), np.int32(0), np.int32(N)],
                                                    [C, np.int32(0), np.int32(0)], [], P):
        k = cl.Kernel(rt.program("gemm_local.cl", d), name)
        k.set_args(*args)
        out.append(_L(k, gs, ls))
    return out


# -- phase: per-layer tuning ---------------------------------------------------------------------
def node_shape(node):
    a = node.attrs
    return a["filters"] // a["groups"], node.output.h * node.output.w, (a["in_c"] // a["groups"]) * a["size"] ** 2


def tune_candidates(node, rt, batch, pool: list, half: bool, args_fast: bool = False) -> list:
    """Algorithms x GEMM configs for one conv: the sweep pool, filtered to what is legal here."""
    lim = gl.device_limits(rt)
    M, N, K = node_shape(node)
    out = []
    for algo in gl.conv_algos(node):
        imp = algo == "implicit"
        if algo == "im2col" and (gl.is_pointwise(node) or winograd.applicable(node)) and args_fast:
            continue            # never won on yolov3 416 (H100): the implicit GEMM or Winograd always beat it
        for c in pool:
            c2 = gl.complete({k: c[k] for k in ("MWG", "NWG", "KWG", "MDIMC", "NDIMC", "SA", "SB", "PF")}, M, N, K, imp)
            if gl.why_illegal(c2, M, N, K, imp, lim) is None:
                out.append({"algo": algo, "family": gl.FAMILY, **c2})
    if winograd.applicable(node):
        for m in (winograd.TILE_SIZES[:1] if half else winograd.TILE_SIZES):
            Mw, Nw, Kw, t2 = winograd.gemm_shape(node, m)
            for c in pool:
                c2 = gl.complete({k: c[k] for k in ("MWG", "NWG", "KWG", "MDIMC", "NDIMC", "SA", "SB", "PF")},
                                 Mw, Nw, Kw)
                if gl.why_illegal(c2, Mw, Nw, Kw, False, lim) is None:
                    out.append({"algo": "winograd", "m": m, "family": gl.FAMILY, **c2})
    uniq, seen = [], set()
    for c in out:
        key = json.dumps(c, sort_keys=True)
        if key not in seen:
            seen.add(key)
            uniq.append(c)
    return uniq


def default_pool() -> list:
    """Configs worth trying on a big GPU when no GEMM sweep ran first."""
    base = [(128, 128, 16, 16, 16), (128, 64, 16, 16, 8), (64, 128, 16, 8, 16), (64, 64, 16, 8, 8),
            (64, 64, 16, 16, 16), (64, 32, 16, 8, 8), (32, 64, 16, 8, 8), (32, 32, 16, 8, 8), (128, 128, 16, 8, 32),
            (128, 64, 32, 16, 8), (64, 64, 32, 8, 8), (128, 32, 16, 16, 8), (32, 128, 16, 8, 16), (16, 64, 16, 4, 16)]
    return [{"MWG": a, "NWG": b, "KWG": k, "MDIMC": m, "NDIMC": n, "SA": 1, "SB": 1, "PF": 1} for a, b, k, m, n in base]


def node_output(rt, ex, node) -> np.ndarray:
    """The node's output for the first and last image of the batch (enough to catch batch indexing)."""
    v = node.output
    item = 2 if ex.half else 4
    images = sorted({0, ex.batch - 1})
    out = np.empty((len(images), v.c * v.h * v.w), np.float16 if ex.half else np.float32)
    base = (ex.plan.offset(v.tensor) + v.c0 * v.h * v.w) * item
    for i, b in enumerate(images):
        rt.cl.enqueue_copy(rt.queue, out[i], ex.arena, src_offset=base + b * v.tensor.size * item)
    rt.queue.finish()
    return out.astype(np.float32)


def proxy(node):
    """The node with a fixed epilogue (leaky, no residual): candidates of all shapes then share programs.

    The epilogue costs next to nothing beside the GEMM, so timings carry over to the real node.
    """
    import dataclasses
    return dataclasses.replace(node, attrs={**node.attrs, "residual": None, "activation": "leaky"})


def phase_tune(rt, res: Results, args, model: str, size: int, batch: int, pool: list, half: bool = False,
               deadline: float = None) -> dict:
    deadline = deadline or args.deadline
    tmp = Path(args.tmp)
    cfg, wts = model_files(model, size, tmp)
    graph = load_graph(cfg, wts)
    table = Table(rt)
    prebuild(rt, [it for n in graph.nodes if n.op == "conv" for it in _programs_of_node(rt, n, batch, half, table)])
    ex = Executor(rt, graph, batch, FP16 if half else FP32, table)
    blob = np.random.default_rng(1).random((batch, 3, size, size), dtype=np.float32)
    ex.run(blob)
    groups: dict = {}
    for node in graph.nodes:
        if node.op == "conv" and not convk.is_depthwise(node):
            groups.setdefault(shape_key(node, batch), []).append(node)
    log(f"tune {model} {size} b{batch} {'fp16' if half else 'fp32'}: {len(groups)} unique conv shapes")
    plan = {}
    items = []
    for key, nodes in groups.items():
        node = proxy(nodes[0])
        cands = tune_candidates(node, rt, batch, pool, half, args.fast)[: args.max_cands]
        plan[key] = (node, cands)
        items.extend(programs_of(ex.ctx, node, table.conv_config(node, batch)))
        items.extend(programs_of(ex.ctx, node, direct_config(node, batch, table.lim)))
        for c in cands:
            items.extend(programs_of(ex.ctx, node, c))
    tb = prebuild(rt, items)
    log(f"  {len({program_key(s_, d) for s_, d in items})} programs compiled in {tb:.1f}s")
    results = {}
    total_best = total_heur = 0.0
    for key, (node, cands) in plan.items():
        direct = direct_config(node, batch, table.lim)          # the gate's reference: no Winograd
        for l in convk.bind(ex.ctx, node, direct):
            rt.cl.enqueue_nd_range_kernel(rt.queue, l.kernel, l.gsize, l.lsize)
        ref = node_output(rt, ex, node)
        heur = table.conv_config(node, batch)
        hl = convk.bind(ex.ctx, node, heur)
        t_h = time_launches(rt, hl, reps=5, warm=1)
        scale = max(float(np.abs(ref).max()), 1e-6)
        herr = float(np.abs(node_output(rt, ex, node) - ref).max()) / scale
        best = (t_h, heur) if herr <= (1e-2 if half else 1e-4) else (float("inf"), direct)
        timed = rejected = 0
        for c in cands:
            try:
                ls = convk.bind(ex.ctx, node, c)
            except Exception as e:
                log(f"  bind failed {c}: {str(e)[:120]}")
                continue
            for l in ls:
                rt.cl.enqueue_nd_range_kernel(rt.queue, l.kernel, l.gsize, l.lsize)
            got = node_output(rt, ex, node)
            err = float(np.abs(got - ref).max()) / scale if np.isfinite(got).all() else float("inf")
            if err > (1e-2 if half else 1e-4):
                rejected += 1
                continue
            t = time_launches(rt, ls, reps=3, warm=1)
            timed += 1
            if t < best[0]:
                best = (t, c)
        n = len(groups[key])
        results[key] = {"config": best[1], "ms": round(best[0], 5), "heuristic_ms": round(t_h, 5), "count": n,
                        "tuner_key": tuner_key(node, batch),
                        "gflop": node.flops * batch / 1e9, "timed": timed, "rejected": rejected,
                        "candidates": len(cands)}
        total_best += best[0] * n
        total_heur += t_h * n
        log(f"  {key} x{n}: best {best[0]:.4f} ms ({node.flops * batch / best[0] / 1e9:.1f} TF/s) "
            f"{best[1]['algo']}{best[1].get('m', '')} {_short(best[1])} heur {t_h:.4f} ms; "
            f"timed {timed}/{len(cands)} rejected {rejected}")
        if time.perf_counter() > deadline:
            log("tune: deadline reached")
            break
    log(f"  conv total: tuned {total_best:.3f} ms vs heuristic {total_heur:.3f} ms")
    res.put(f"tune {model} {size} b{batch} {'fp16' if half else 'fp32'}", results)
    ex.arena.release()
    return {k: v["config"] for k, v in results.items()}


def direct_config(node, batch, lim) -> dict:
    """The plain GEMM (implicit or 1x1) heuristic: every candidate is checked against its output."""
    M, N, K = node_shape(node)
    algo = gl.conv_algos(node)[0]
    return {"algo": algo, "family": gl.FAMILY, **gl.heuristic(M, N, K, batch, algo == "implicit", lim)}


def _short(c: dict) -> str:
    return "{MWG}x{NWG}x{KWG} wg{NDIMC}x{MDIMC} S{SA}{SB} PF{PF} V{VA}{VB}/{VWA}{VWB}".format(**c)


def _programs_of_node(rt, node, batch, half, table) -> list:
    """Programs a real node will build under ``table`` (for a parallel prebuild before binding)."""
    from yolo_cl.kernels import BindContext
    ctx = BindContext(rt, None, None, batch, FP16 if half else FP32)
    cfg = table.conv_config(node, batch)
    if convk.is_depthwise(node) or cfg.get("family") != gl.FAMILY and cfg["algo"] != "winograd":
        return []
    return programs_of(ctx, node, cfg)


def programs_of(ctx, node, cfg) -> list:
    """(source, defines) pairs that binding ``cfg`` for ``node`` will build: the public helper that
    tools/bench_build.py times builds with, and this tool prebuilds in parallel before binding."""
    a = node.attrs
    M, N, K = node_shape(node)
    ep = gl.epilogue_defines(ctx, node)
    if cfg["algo"] == "winograd":
        m = cfg["m"]
        Mw, Nw, Kw, t2 = winograd.gemm_shape(node, m)
        return [("winograd.cl", ctx.defines(WINO_M=m)), ("winograd.cl", {**ep, "WINO_M": m}),
                ("gemm_local.cl", gl.defines(ctx.defines(NO_BIAS=True), cfg, Mw, Nw, Kw))]
    d = gl.defines(ep, cfg, M, N, K)
    if cfg["algo"] == "implicit":
        d.update(IMPLICIT=True, KS=a["size"], SX=a["stride_x"], SY=a["stride_y"], PAD=a["pad"], DIL=a["dilation"])
    return [("gemm_local.cl", d)]


def write_yaml(rt, entries: dict, path: Path, precision: str = "fp32", extra: dict = None) -> None:
    """configs/tuning-gpu.yaml: device identity, then shape key -> config (and its measured time)."""
    import yaml
    doc = {"format": "yolo-cl tuning 1", "device": rt.device_name, "driver": rt.driver, "vendor": rt.vendor,
           "type": "GPU", "precision": precision, "tool": "tools/bench_gpu.py", "entries": entries}
    if extra:
        doc.update(extra)
    atomic_write(path, yaml.safe_dump(doc, sort_keys=False, width=200).encode())


# -- phase: end to end ---------------------------------------------------------------------------
def run_model(rt, model, size, batch, half, table, args, reps=20, opencv=False, label=""):
    tmp = Path(args.tmp)
    cfg, wts = model_files(model, size, tmp)
    graph = load_graph(cfg, wts)
    t0 = time.perf_counter()
    prebuild(rt, [it for n in graph.nodes if n.op == "conv" for it in _programs_of_node(rt, n, batch, half, table)])
    ex = Executor(rt, graph, batch, FP16 if half else FP32, table)
    t_build = time.perf_counter() - t0
    blob = np.random.default_rng(2).random((batch, 3, size, size), dtype=np.float32)
    outs = ex.run(blob)
    ex.run(blob, profile=True)
    dev = []
    for _ in range(5):
        ex.run(blob, profile=True)
        dev.append(sum(t.ms for t in ex.layer_times()))
    times = ex.layer_times()
    wall = []
    for _ in range(reps):
        t1 = time.perf_counter()
        ex.run(blob)
        wall.append((time.perf_counter() - t1) * 1e3)
    r = {"model": model, "size": size, "batch": batch, "precision": "fp16" if half else "fp32",
         "device_ms": float(np.median(dev)), "wall_ms": float(np.median(wall)), "build_s": t_build,
         "gflop": graph.flops * batch / 1e9, "arena_MiB": ex.arena_bytes / 2**20,
         "workspace_MiB": ex.workspace_bytes / 2**20,
         "weights_MiB": sum(n.attrs["weights"].size for n in graph.nodes if n.op == "conv") * (2 if half else 4) / 2**20}
    conv_ms = sum(t.ms for t in times if t.op.startswith("conv"))
    conv_flops = sum(l.flops for l in ex.launches if l.flops)
    r["conv_ms"] = conv_ms
    r["conv_tflops"] = conv_flops / conv_ms / 1e9 if conv_ms else 0
    r["images_per_s"] = batch / (r["wall_ms"] / 1e3)
    r["layers"] = [{"label": t.label, "op": t.op, "kernel": t.name, "ms": round(t.ms, 4), "gflop": t.flops / 1e9,
                    "algo": (t.config or {}).get("algo"), "m": (t.config or {}).get("m")} for t in times]
    if opencv:
        r.update(opencv_compare(cfg, wts, blob, outs, args))
    log(f"{label}{model} {size} b{batch} {r['precision']}: device {r['device_ms']:.3f} ms, wall {r['wall_ms']:.3f} ms, "
        f"conv {conv_ms:.3f} ms at {r['conv_tflops']:.1f} TF/s, {r['images_per_s']:.0f} img/s, arena "
        f"{r['arena_MiB']:.0f} MiB weights {r['weights_MiB']:.0f} MiB ws {r['workspace_MiB']:.0f} MiB"
        + (f"; OpenCV OpenCL {r['opencv_ms']:.2f} ms -> {r['opencv_ms'] / r['device_ms']:.1f}x (device), "
           f"{r['opencv_ms'] / r['wall_ms']:.1f}x (wall), heads rel err {r['opencv_head_err']:.1e}"
           if 'opencv_ms' in r else (f"; opencv: {r.get('opencv_error')}" if opencv else "")))
    for buf in (ex.arena,):
        buf.release()
    return r


def opencv_compare(cfg, wts, blob, outs, args) -> dict:
    try:
        import cv2
        net = cv2.dnn.readNetFromDarknet(str(cfg), str(wts))
        net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
        net.setPreferableTarget(cv2.dnn.DNN_TARGET_OPENCL)
        names = net.getUnconnectedOutLayersNames()
        t0 = time.perf_counter()
        net.setInput(blob[:1])
        net.forward(names)
        first = time.perf_counter() - t0
        for _ in range(2):
            net.setInput(blob[:1])
            net.forward(names)
        ts = []
        for _ in range(8):
            t1 = time.perf_counter()
            net.setInput(blob[:1])
            net.forward(names)
            ts.append((time.perf_counter() - t1) * 1e3)
        # OpenCV decodes its yolo layers; the raw heads are the outputs just before each permute_k
        all_names = list(net.getLayerNames())
        head_names = [all_names[all_names.index(n) - 1] for n in all_names if n.startswith("permute_")]
        net.setInput(blob[:1])
        heads = net.forward(head_names)
        err = max(float(np.abs(h - o2[:1]).max() / max(np.abs(h).max(), 1e-6)) for h, o2 in zip(heads, outs))
        return {"opencv_ms": float(np.median(ts)), "opencv_first_s": first, "opencv_head_err": err, "opencv_ocl": cv2.ocl.useOpenCL(), "opencv_version": cv2.__version__}
    except Exception as e:
        return {"opencv_error": str(e)[:300]}


# -- phase: warm start ---------------------------------------------------------------------------
WARM_SNIPPET = r"""
import sys, time, json
t0 = time.perf_counter()
import numpy as np, cv2
from yolo_cl.detector import Detector
t1 = time.perf_counter()
d = Detector(sys.argv[1], sys.argv[2] if sys.argv[2] != "-" else None)
t2 = time.perf_counter()
img = cv2.imread(sys.argv[3])
dets = d.detect(img, float(sys.argv[4]))
t3 = time.perf_counter()
print("TTFD", json.dumps({"import_s": t1 - t0, "init_s": t2 - t1, "first_detect_s": t3 - t2, "ttfd_s": t3 - t0,
                          "builds": d.runtime.builds, "detections": len(dets)}))
"""


def phase_warm(rt, res: Results, args) -> None:
    """Fresh processes: the first with an empty binary cache (cold), then two warm ones."""
    dog = str(ROOT / "models" / "images" / "dog.jpg")
    cases = [("yolov3-tiny", "yolov3-tiny", "-", "0.25")]
    if not args.warm_tiny_only:
        cfg, wts = model_files("yolov3", 416, Path(args.tmp))
        cases.append(("yolov3 (random weights)", str(cfg), str(wts), "0.999"))
    out = {}
    for name, c, w, thresh in cases:
        cache = Path(tempfile.mkdtemp(prefix="yccache"))
        for run in ("cold", "warm", "warm2"):
            env = dict(os.environ, YOLO_CL_CACHE=str(cache))
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-c", WARM_SNIPPET, c, w, dog, thresh], env=env, capture_output=True,
                               text=True, timeout=300)
            wall = time.perf_counter() - t0
            line = next((l for l in p.stdout.splitlines() if l.startswith("TTFD")), "")
            r = json.loads(line[5:]) if line else {"stderr": p.stderr[-400:]}
            r["process_s"] = wall
            out[f"{name} {run}"] = r
            log(f"warm start {name} {run}: {r}")
    res.put("warm_start", out)


# -- export: tuning results -> the engine's tuning database (engine/tuning_db.py's format) -------------
def export_db(bench_files: list, path: Path) -> int:
    """Fold every 'tune MODEL SIZE bB fp32' result of earlier runs into a tuning database file.

    fp16 gets the same GEMM configs with Winograd F(4x4) replaced by F(2x2) (F(4x4) fails the
    fp16 accuracy gate); those fp16 entries are derived from the fp32 search, not searched.
    """
    from yolo_cl import tuning_db
    records = {}
    for f in bench_files:
        data = json.loads(Path(f).read_text())
        dev = data["device"]
        for name, results in data.items():
            if not name.startswith("tune "):
                continue
            _, model, size, b, prec = name.split()
            batch = int(b[1:])
            graph = load_model(model_cfg(model, int(size)), params="none").graph
            nodes = {shape_key(n, batch): n for n in graph.nodes if n.op == "conv"}
            for key, r in results.items():
                node = nodes[key]
                cfg = dict(r["config"])
                for precision in ("fp32", "fp16"):
                    c = dict(cfg)
                    if precision == "fp16" and c.get("algo") == "winograd" and c.get("m") == 4:
                        Mw, Nw, Kw, _ = winograd.gemm_shape(node, 2)
                        c = {"algo": "winograd", "m": 2, "family": gl.FAMILY, **gl.complete(
                            {k: c[k] for k in ("MWG", "NWG", "KWG", "MDIMC", "NDIMC", "SA", "SB", "PF")}, Mw, Nw, Kw)}
                        if gl.why_illegal(c, Mw, Nw, Kw) is not None:
                            continue
                    elif precision == "fp32":
                        c["ms"] = r["ms"]
                    ident = (dev["name"], dev["driver"], dev["vendor"], "GPU", precision)
                    records.setdefault(ident, {})[tuning_db.shape_key(node, batch)] = c
    recs = [{"device": d, "driver": v, "vendor": ven, "type": t, "precision": p, "configs": cfgs}
            for (d, v, ven, t, p), cfgs in records.items()]
    tuning_db.write_db(path, recs)
    return sum(len(r["configs"]) for r in recs)


def model_cfg(name: str, size: int) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="ycexport"))
    src = ROOT / "models" / "cfg" / f"{name}.cfg"
    text = "\n".join(f"width={size}" if l.replace(" ", "").startswith("width=") else
                     f"height={size}" if l.replace(" ", "").startswith("height=") else l
                     for l in src.read_text().splitlines())
    (tmp / "m.cfg").write_text(text + "\n")
    return tmp / "m.cfg"


# -- main ------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--phases", default="env,gemm,tune,e2e")
    ap.add_argument("--gemm-shapes", type=int, default=len(YOLOV2_SHAPES))
    ap.add_argument("--budget", type=float, default=480, help="seconds; phases stop early past it")
    ap.add_argument("--tune", default="yolov3:416:1", help="MODEL:SIZE:BATCH,... to tune")
    ap.add_argument("--matrix", default="yolov3:416,yolov3:608,yolov4:416,yolov4:608")
    ap.add_argument("--gemm-frac", type=float, default=0.3, help="share of the budget for the GEMM sweep")
    ap.add_argument("--tune-frac", type=float, default=0.75, help="tuning stops at this share of the budget")
    ap.add_argument("--e2e", default="yolov3:416:1:opencv:heur", help="MODEL:SIZE:BATCH[:opencv][:heur],...")
    ap.add_argument("--fast", action="store_true", help="skip algorithms that never won in earlier runs")
    ap.add_argument("--warm-tiny-only", action="store_true", help="warm phase: yolov3-tiny only")
    ap.add_argument("--gemm-from", type=int, default=0, help="first of YOLOv2's shapes to sweep")
    ap.add_argument("--max-cands", type=int, default=100000, help="cap per shape (smoke tests on a CPU)")
    ap.add_argument("--yaml", nargs="*", default=[], help="tuning-gpu.yaml files of earlier runs to start from")
    ap.add_argument("--gemm-best", nargs="*", default=[], help="bench.json files whose GEMM winners gemmcheck re-times")
    ap.add_argument("--export-db", nargs="+", metavar=("DB", "BENCH_JSON"),
                    help="write the tuning results of earlier runs' bench.json files to DB and exit (no device)")
    args = ap.parse_args()
    if args.export_db:
        n = export_db(args.export_db[1:], Path(args.export_db[0]))
        log(f"{n} entries written to {args.export_db[0]}")
        return
    args.deadline = time.perf_counter() + args.budget
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.tmp = tempfile.mkdtemp(prefix="ycbench")
    res = Results(out)
    rt = Runtime(profiling=True)
    phases = args.phases.split(",")
    lim = gl.device_limits(rt)
    res.put("device", {"name": rt.device_name, "driver": rt.driver, "vendor": rt.vendor, "compute_units":
                       lim.compute_units, "local_mem": lim.local_mem, "max_wg": lim.max_wg,
                       "clock_mhz": rt.device.max_clock_frequency, "fp16": rt.fp16})
    log(f"device: {res.data['device']}")
    pool = default_pool()
    try:      # fail fast, with the compiler's words, if the family does not build here
        rt.program("gemm_local.cl", gl.defines({"ACT": 1}, gl.complete(pool[0], 100, 100, 100), 100, 100, 100))
        rt.program("winograd.cl", {"WINO_M": 4, "ACT": 1, "RESIDUAL": True})
    except Exception as e:
        log(f"SANITY BUILD FAILED: {e}")
        raise
    entries = {}
    t_start = time.perf_counter()
    if args.yaml:
        import yaml
        for f in args.yaml:
            entries.update(yaml.safe_load(Path(f).read_text()).get("entries", {}))

    def guarded(name, fn):
        if name not in phases:
            return
        try:
            fn()
        except Exception:
            import traceback
            log(f"PHASE {name} FAILED:\n{traceback.format_exc()}")

    def gemm():
        nonlocal pool
        args.deadline = t_start + args.gemm_frac * args.budget
        phase_gemm(rt, res, args)
        args.deadline = t_start + args.budget
        tops = []
        for r in res.data.get("gemm", []):
            if "config" in r and r["config"] not in tops:
                tops.append(r["config"])
        pool = tops + [p for p in pool if all(any(p[k] != t[k] for k in p) for t in tops)]

    def tune():
        for spec in args.tune.split(","):
            model, size, batch = spec.split(":")
            entries.update(phase_tune(rt, res, args, model, int(size), int(batch), pool,
                                      deadline=t_start + args.tune_frac * args.budget))
            write_yaml(rt, entries, out / "tuning-gpu.yaml")

    def e2e():
        table = Table(rt, entries)
        for spec in args.e2e.split(","):
            model, size, batch, *flags = spec.split(":")
            size, batch = int(size), int(batch)
            r = run_model(rt, model, size, batch, False, table, args, opencv="opencv" in flags, label="tuned: ")
            res.put(f"e2e tuned {model} {size} b{batch}", r)
            if "heur" in flags:
                r2 = run_model(rt, model, size, batch, False, Table(rt), args, label="heuristic: ")
                res.put(f"e2e heuristic {model} {size} b{batch}", {k: v for k, v in r2.items() if k != "layers"})

    def matrix():
        rows = []
        for spec in args.matrix.split(","):
            model, size = spec.split(":")
            for half in (False, True):
                for batch in (1, 4, 8):
                    if time.perf_counter() > args.deadline:
                        log("matrix: deadline reached")
                        return
                    try:
                        r = run_model(rt, model, int(size), batch, half, Table(rt, entries, half), args, reps=10)
                        rows.append({k: v for k, v in r.items() if k != "layers"})
                    except Exception as e:
                        log(f"{model} {size} b{batch} half={half}: {e}")
                        rows.append({"model": model, "size": size, "batch": batch, "half": half, "error": str(e)[:200]})
                    res.put("matrix", rows)

    res.put("pool", pool)
    for name, fn in (("gemmcheck", lambda: phase_gemmcheck(rt, res, args)), ("gemm", gemm), ("tune", tune),
                     ("e2e", e2e), ("warm", lambda: phase_warm(rt, res, args)), ("matrix", matrix)):
        guarded(name, fn)
    log(f"done in {args.budget - (args.deadline - time.perf_counter()):.0f} s; results in {out}/bench.json")


if __name__ == "__main__":
    main()
