#!/usr/bin/env python3
"""What a new user's first ``yolo-cl detect`` costs: cold (empty kernel caches) and warm, as
process wall and CPU time, with program binaries exported (``YOLO_CL_EXPORT_BINARIES=1``) and
without (the default on PoCL: its own kernel cache only), and with the layers bound on one
thread or several (``YOLO_CL_BUILD_THREADS``: programs compile side by side where the driver can).

Each run is a fresh ``python -m yolo_cl detect IMAGE`` with its own empty ``YOLO_CL_CACHE``,
``POCL_CACHE_DIR``, ``XDG_CACHE_HOME`` and ``CUDA_CACHE_PATH`` (NVIDIA's compute cache) (cold), then the same command again on those caches
(warm). The modes alternate within each round, so a machine shared with other work slows both
alike; CPU time (user + system of the child) is the figure to compare where the load varies.

    PYTHONPATH=... python tools/bench_first_run.py --rounds 2 models/images/dog.jpg
    python3 tools/bench_first_run.py --modes threads1,threads8 dog.jpg -- --model yolov3 --weights W
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

MODES = {"export": {"YOLO_CL_EXPORT_BINARIES": "1"}, "default": {},
         "threads1": {"YOLO_CL_BUILD_THREADS": "1"}, "threads8": {"YOLO_CL_BUILD_THREADS": "8"}}


def run(cmd: list, env: dict) -> tuple:
    """(wall s, CPU s) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("image")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--modes", default="export,default", help="comma-separated: " + ", ".join(MODES))
    ap.add_argument("detect_args", nargs="*", help="more arguments of yolo-cl detect (after --)")
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "yolo_cl", "detect", args.image] + args.detect_args
    for rnd in range(1, args.rounds + 1):
        for mode in args.modes.split(","):
            with tempfile.TemporaryDirectory(prefix="yolo-cl-first-run-") as tmp:
                env = dict(os.environ, YOLO_CL_CACHE=os.path.join(tmp, "yolo-cl"),
                           POCL_CACHE_DIR=os.path.join(tmp, "pocl"), XDG_CACHE_HOME=os.path.join(tmp, "xdg"),
                           CUDA_CACHE_PATH=os.path.join(tmp, "nv"),
                           **MODES[mode])
                env.pop("YOLO_CL_NO_BINARY_CACHE", None)
                cold = run(cmd, env)
                warm = run(cmd, env)
            load = os.getloadavg()[0]
            print(f"round {rnd} {mode:9s} cold: wall {cold[0]:6.1f} s, CPU {cold[1]:5.1f} s   "
                  f"warm: wall {warm[0]:5.1f} s, CPU {warm[1]:4.1f} s   (load {load:.1f})", flush=True)


if __name__ == "__main__":
    main()
