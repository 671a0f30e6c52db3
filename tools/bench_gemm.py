#!/usr/bin/env python3
"""Our GEMM against CLBlast's SGEMM on YOLOv2's conv shapes (M, K, N) and 1024^3, same device,
same context and queue, same process.

Ours is the device family's kernel (``cl/gemm.cl`` on a CPU device, ``cl/gemm_local.cl`` on a
GPU) with the config a short search picks: the cost model's (CPU) or heuristic's (GPU) best
``--candidates`` configs are each checked against NumPy and timed, the fastest kept. CLBlast
runs through pyclblast when it is installed, else through ctypes on ``libclblast.so.1``
(``LD_LIBRARY_PATH`` may point at a carried copy, e.g. ``/tmp/ocl`` on the GPU machine).
Both sides are timed the same way: ``--clock events`` (OpenCL profiling events; CLBlast's one
returned event, so its wall time is also shown) or ``--clock cpu`` (process CPU time per
compute unit, for a CPU device on a machine busy with other work). Prints GFLOP/s per shape,
the ratio ours/CLBlast and the geometric mean.

    PYTHONPATH=... python tools/bench_gemm.py [--device pthread] [--clock cpu] [--reps 5]
"""
from __future__ import annotations

import argparse
import ctypes
import math
import sys
import time
import warnings

import numpy as np

YOLOV2 = [(32, 27, 173056), (64, 288, 43264), (128, 576, 10816), (256, 1152, 2704), (512, 2304, 676),
          (1024, 4608, 169), (1024, 9216, 169), (425, 1024, 169), (1024, 27648, 169), (1024, 1024, 1024)]


class ClblastCtypes:
    """CLBlastSgemm (row-major, no transposes) on pyopencl buffers and queue."""

    def __init__(self, queue) -> None:
        lib = ctypes.CDLL("libclblast.so.1")
        f = lib.CLBlastSgemm
        sz, vp = ctypes.c_size_t, ctypes.c_void_p
        f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, sz, sz, sz, ctypes.c_float, vp, sz, sz, vp, sz, sz,
                      ctypes.c_float, vp, sz, sz, ctypes.POINTER(vp), ctypes.POINTER(vp)]
        f.restype = ctypes.c_int
        self.f, self.queue = f, queue
        self.name = "CLBlast (ctypes)"

    def __call__(self, M, N, K, a, b, c):
        import pyopencl as cl
        q, ev = ctypes.c_void_p(self.queue.int_ptr), ctypes.c_void_p()
        st = self.f(101, 111, 111, M, N, K, 1.0, a.int_ptr, 0, K, b.int_ptr, 0, N, 0.0, c.int_ptr, 0, N,
                    ctypes.byref(q), ctypes.byref(ev))
        if st != 0:
            raise RuntimeError(f"CLBlastSgemm returned status {st}")
        return cl.Event.from_int_ptr(ev.value, retain=False)


class ClblastPy:
    def __init__(self, queue) -> None:
        import pyclblast
        self.mod, self.queue = pyclblast, queue
        self.name = f"CLBlast (pyclblast {getattr(pyclblast, '__version__', '')})".replace(" )", ")")

    def __call__(self, M, N, K, a, b, c):
        import pyopencl.array as cla
        wrap = [cla.Array(self.queue, (r, cols), np.float32, data=buf) for buf, r, cols in ((a, M, K), (b, K, N), (c, M, N))]
        return self.mod.gemm(self.queue, M, N, K, *wrap, a_ld=K, b_ld=N, c_ld=N)


def clblast(queue):
    try:
        return ClblastPy(queue)
    except ImportError:
        return ClblastCtypes(queue)


class Ours:
    """The device family's GEMM on one shape: candidates, their launches, a NumPy check."""

    def __init__(self, rt, M, K, N, A, bias, Bb, Cb) -> None:
        self.rt, self.M, self.K, self.N = rt, M, K, N
        self.A, self.bias, self.Bb, self.Cb = A, bias, Bb, Cb
        self._packed = {}

    def candidates(self, count: int) -> list:
        from yolo_cl.kernels import gemm_cpu as gc
        from yolo_cl.kernels import gemm_local as gl
        M, K, N = self.M, self.K, self.N
        if self.rt.is_cpu:
            space = gc.space(M, N, K, gc.max_work_group(self.rt), *gc.simd(self.rt))
            return [("cpu", c) for c in sorted(space, key=lambda c: gc.cost(c, M, N, K))[:count]]
        lim = gl.device_limits(self.rt)
        best = gl.heuristic(M, N, K, 1, False, lim)
        space = sorted(gl.space(M, N, K, False, lim), key=lambda c: (gl.waste(c, M, N), -c["MWG"] * c["NWG"]))
        return [("local", c) for c in [best] + [c for c in space if c != best][:count - 1]]

    def launch(self, family: str, cfg: dict):
        """A zero-argument callable enqueueing the GEMM, returning its events (two with split-K)."""
        from yolo_cl.kernels import gemm_cpu as gc
        from yolo_cl.kernels import gemm_local as gl
        cl, rt, i = self.rt.cl, self.rt, np.int32
        M, K, N = self.M, self.K, self.N
        if family == "cpu":
            rows = gc.pack_rows(cfg)
            if rows not in self._packed:
                self._packed[rows] = rt.upload(gc.pack_weights(self.A, 1, rows), "A")
            d = gc.defines({}, cfg, M, N)
            k = cl.Kernel(rt.program("gemm.cl", d), gc.kernel_name(cfg))
            k.set_args(self._packed[rows], self.bias, self.Bb, i(0), i(K * N), i(K * N), i(N), self.Cb, i(0),
                       i(M * N), i(N), self.Cb, i(0), i(0), i(M), i(N), i(K), i(1))
            launches, partial = [(k, gc.grid(cfg, M, N, 1), gc.local_size(cfg))], None
        else:
            if "local" not in self._packed:
                self._packed["local"] = rt.upload(gl.pack_weights(self.A, 1), "A")
            partial = rt.alloc(max(gl.partial_bytes(cfg, M, N, 1), 4), "split-K partial sums")
            launches = []
            for name, d, args, gs, ls, _ in gl.launch_specs(
                    cfg, gl.defines({}, cfg, M, N, K), M, N, K, 1, 1, [self._packed["local"], self.bias],
                    [self.Bb, i(0), i(K * N), i(K * N), i(N)], [self.Cb, i(0), i(M * N), i(N)], [self.Cb, i(0), i(0)],
                    [], partial):
                k = cl.Kernel(rt.program("gemm_local.cl", d), name)
                k.set_args(*args)
                launches.append((k, gs, ls))

        def enqueue(keep=partial) -> list:         # holds the partial buffer: kernels do not keep args alive
            return [cl.enqueue_nd_range_kernel(rt.queue, k, gs, ls) for k, gs, ls in launches]
        return enqueue


def timed(fn, queue, reps: int, clock: str, units: int) -> tuple:
    """(best ms by the clock, best wall ms) over ``reps`` runs of ``fn`` (returns an event or a list)."""
    best, wall = math.inf, math.inf
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        ev = fn()
        evs = ev if isinstance(ev, list) else [ev]
        queue.finish()
        w = (time.perf_counter() - t0) * 1e3
        ms = (time.process_time() - c0) * 1e3 / units if clock == "cpu" else \
            sum((e.profile.end - e.profile.start) for e in evs) * 1e-6
        best, wall = min(best, ms), min(wall, w)
    return best, wall


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", help="OpenCL device (P:D, index or name substring)")
    p.add_argument("--clock", choices=("events", "cpu"), default="events")
    p.add_argument("--reps", type=int, default=5, help="timed runs per kernel (best of)")
    p.add_argument("--candidates", type=int, default=8, help="our configs tried per shape")
    p.add_argument("--shapes", help="comma-separated indices into the shape list (default: all)")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message="Non-empty compiler output")
    from yolo_cl.runtime import Runtime
    rt = Runtime(args.device, profiling=True)
    if args.clock == "cpu" and not rt.is_cpu:
        p.error("--clock cpu only measures CPU devices")
    units = int(rt.device.max_compute_units)
    blast = clblast(rt.queue)
    print(f"device: {rt.device_name} ({rt.device.platform.name.strip()}, driver {rt.driver}); clock {args.clock}; "
          f"vs {blast.name}")
    print(f"{'M':>5} {'K':>6} {'N':>7}  {'ours GF/s':>9} {'CLBlast GF/s':>12} {'ratio':>6}  "
          f"{'CLBlast wall GF/s':>17}  our config")
    shapes = YOLOV2 if not args.shapes else [YOLOV2[int(s)] for s in args.shapes.split(",")]
    ratios = []
    rng = np.random.default_rng(0)
    for M, K, N in shapes:
        A = rng.standard_normal((M, K)).astype(np.float32)
        B = rng.standard_normal((K, N)).astype(np.float32)
        ref = A.astype(np.float64) @ B.astype(np.float64)
        Ab, Bb = rt.upload(A, "A"), rt.upload(B, "B")
        Cb = rt.alloc(M * N * 4, "C")
        bias = rt.upload(np.zeros(M, np.float32), "bias")
        flops = 2.0 * M * N * K
        ours, best = Ours(rt, M, K, N, A, bias, Bb, Cb), None
        for fam, cfg in ours.candidates(args.candidates):
            try:
                fn = ours.launch(fam, cfg)
            except Exception as e:   # noqa: BLE001 - a config this device cannot build is skipped
                print(f"    skip {cfg}: {str(e).splitlines()[0][:100]}", file=sys.stderr)
                continue
            out = np.full((M, N), np.nan, np.float32)
            fn()
            rt.cl.enqueue_copy(rt.queue, out, Cb)
            rt.queue.finish()
            err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
            if not err < 1e-4:
                print(f"    reject {cfg}: relative error {err:.2e}", file=sys.stderr)
                continue
            ms, _ = timed(fn, rt.queue, args.reps, args.clock, units)
            if best is None or ms < best[0]:
                best = (ms, cfg)
        fn = lambda: blast(M, N, K, Ab, Bb, Cb)   # noqa: E731
        fn()
        out = np.empty((M, N), np.float32)
        rt.cl.enqueue_copy(rt.queue, out, Cb)
        rt.queue.finish()
        berr = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        bms, bwall = timed(fn, rt.queue, args.reps, args.clock, units)
        ours_gf = flops / best[0] / 1e6 if best else 0.0
        blast_gf = flops / bms / 1e6
        ratio = ours_gf / blast_gf
        ratios.append(ratio)
        cfg = " ".join(f"{k}{v}" if k not in ("kernel",) else str(v) for k, v in best[1].items()) if best else "-"
        print(f"{M:>5} {K:>6} {N:>7}  {ours_gf:>9.1f} {blast_gf:>12.1f} {ratio:>6.2f}  {flops / bwall / 1e6:>17.1f}  "
              f"{cfg}{'' if berr < 1e-4 else f'  (CLBlast error {berr:.1e})'}", flush=True)
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"geometric mean ratio ours/CLBlast: {geo:.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}) over "
          f"{len(ratios)} shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
