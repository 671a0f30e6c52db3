#!/usr/bin/env python3
"""The mma family's implicit B gathers side by side on one network, in one process.

For each setting of ``YOLO_CL_MMA_GATHER`` (``tuned``: unset, the tuning database's configs;
``0`` to ``3``: that gather on every implicit conv, ST raised to 2 where it is 1, see
``yolo_cl.kernels.gemm_mma``) this runs ``yolo_cl.bench.run_bench`` and prints the device
time of each 3x3 conv (its GEMM and split-sum launches) under every setting, then the
network's totals (each setting's totals are printed as it finishes, so a run cut short still
says something). Settings run one after another, ``--rounds`` times over, and the per-layer
figure is the better of the rounds' medians, so a clock ramp does not favour one::

    python3 tools/mma_gather_ab.py yolov3 --size 416 --precision fp16 --repeat 20
"""
from __future__ import annotations

import argparse
import os
import sys

from yolo_cl.bench import run_bench
from yolo_cl.kernels import gemm_mma as gm


def conv_rows(report) -> dict:
    """node -> (op, ms of all its launches, its GEMM's config) for the report's conv nodes."""
    rows: dict = {}
    for l in report.launches:
        if not l.op.startswith("conv"):
            continue
        op, ms, cfg = rows.get(l.node, (l.op, 0.0, None))
        rows[l.node] = (op, ms + l.ms, cfg if cfg is not None else l.config)
    return rows


def run(model: str, size: int, precision: str, repeat: int, settings: list, rounds: int) -> dict:
    """setting -> [(device ms median, conv rows)] over the rounds."""
    out: dict = {s: [] for s in settings}
    for _ in range(rounds):
        for s in settings:
            if s == "tuned":
                os.environ.pop(gm.GATHER_ENV, None)
            else:
                os.environ[gm.GATHER_ENV] = s
            try:
                rep = run_bench(model, size, 1, precision, repeat=repeat)
            except Exception as e:      # noqa: BLE001 - a gather that fails to build or run: say so, go on
                print(f"setting {s}: failed: {str(e).splitlines()[0][:300]}", flush=True)
                continue
            dev = sorted(rep.device_ms)[len(rep.device_ms) // 2]
            rows = conv_rows(rep)
            out[s].append((dev, rows))
            three = sum(ms for op, ms, _ in rows.values() if op.startswith("conv 3x3"))
            print(f"setting {s}: device time {dev:.3f} ms, 3x3 convs {three:.3f} ms", flush=True)
    os.environ.pop(gm.GATHER_ENV, None)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="yolov3")
    ap.add_argument("--size", type=int, default=416)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--settings", default="tuned,0,1,2,3", help="comma-separated: tuned, 0, 1, 2, 3")
    args = ap.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    res = run(args.model, args.size, args.precision, args.repeat, settings, args.rounds)
    settings = [s for s in settings if res[s]]
    if not settings:
        return 1
    best = {s: {node: min(r[1][node][1] for r in res[s]) for node in res[s][0][1]} for s in settings}
    first = res[settings[0]][0][1]
    print(f"{args.model} {args.size} {args.precision}: device ms per 3x3 conv (GEMM + split sum, best of "
          f"{args.rounds} medians of {args.repeat}); GA/ST of each setting's config")
    print(f"{'node':>8} {'op':<28}" + "".join(f"{s:>16}" for s in settings))
    three = {s: 0.0 for s in settings}
    for node, (op, _, _) in first.items():
        if not op.startswith("conv 3x3"):
            continue
        cells = []
        for s in settings:
            cfg = res[s][0][1][node][2] or {}
            ms = best[s][node]
            three[s] += ms
            cells.append(f"{ms:7.4f} G{cfg.get('GA', 0)}S{cfg.get('ST', 1)}".rjust(16))
        print(f"{node:>8} {op[:28]:<28}" + "".join(cells))
    print(f"{'':>8} {'3x3 convs':<28}" + "".join(f"{three[s]:>16.3f}" for s in settings))
    print(f"{'':>8} {'all convs':<28}" + "".join(f"{sum(best[s].values()):>16.3f}" for s in settings))
    print(f"{'':>8} {'device time (best median)':<28}" + "".join(f"{min(r[0] for r in res[s]):>16.3f}"
                                                                  for s in settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
