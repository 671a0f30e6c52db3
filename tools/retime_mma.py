#!/usr/bin/env python3
"""Re-time a network's stored tensor-core configs against the implicit gathers, and keep the faster.

A full re-tune searches every shape again (tens of minutes on a GPU); when a new schedule option
appears (here the mma family's implicit B gather, ``GA``), this times, for every implicit conv of
the network whose config comes from the tuning database, the stored config against the same
config with each gather of ``--gathers`` (``ST`` raised to 2, which the gathers need), every one
first checked against NumPy with the precision's gate, and writes the faster per shape key
(by at least ``--margin``) into a tuning file (``--out``, default the user database)::

    python3 tools/retime_mma.py yolov3 yolov4 --size 416 --precision fp16 --out $OUT/retimed.yaml
"""
from __future__ import annotations

import argparse

from yolo_cl.bench import random_params
from yolo_cl.kernels.family import tuning_database
from yolo_cl.kernels.gemm_mma import mode_for
from yolo_cl.model import load_model
from yolo_cl.precision import precision_named
from yolo_cl.runtime import Runtime
from yolo_cl.tuner import ConvBench
from yolo_cl.tuning_db import shape_key


def retime(models: list, size: int, precision_name: str, gathers: list, reps: int, margin: float) -> tuple:
    """(entries {shape key: config + ms}, report lines)."""
    rt = Runtime(None, profiling=True)
    precision = precision_named(precision_name)
    mma = mode_for(rt, precision)
    db = tuning_database(rt, precision, mma)
    entries, lines, seen = {}, [], set()
    for model in models:
        graph = load_model(model, None, size, params="optional", make_params=random_params).graph
        for node in graph.nodes:
            if node.op != "conv":
                continue
            key, cfg = shape_key(node, 1), db.lookup(node, 1)
            if key in seen or not cfg or cfg.get("family") != "mma" or cfg.get("algo") != "implicit":
                continue
            seen.add(key)
            bench = ConvBench(rt, node, 1, precision, rt.queue, seed=1, mma=mma)
            timed = {}
            for ga in [None] + gathers:
                c = dict(cfg) if ga is None else {**cfg, "GA": ga, "ST": max(int(cfg.get("ST", 1)), 2)}
                try:
                    launches = bench.bind(c)
                    err = bench.check(launches)
                except Exception as e:     # noqa: BLE001 - a variant that does not build: not a candidate
                    lines.append(f"{key}: GA {ga} failed: {str(e).splitlines()[0][:120]}")
                    continue
                if not err <= precision.tolerance:
                    lines.append(f"{key}: GA {ga} rejected, relative error {err:.2e}")
                    continue
                timed[ga] = (bench.time(launches, reps), c)
            if None not in timed:
                continue
            best = min(timed, key=lambda g: timed[g][0])
            base = timed[None][0]
            lines.append(f"{model} {key}: stored {base:.4f} ms; " +
                         ", ".join(f"GA {g} {t:.4f}" for g, (t, _) in timed.items() if g is not None))
            if best is not None and timed[best][0] < base * (1 - margin):
                ms, c = timed[best]
                flops = node.flops
                entries[key] = {**c, "ms": round(ms, 4), "gflops": round(flops / (ms * 1e6), 2)}
    return entries, lines, db


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--size", type=int, default=416)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--gathers", default="1", help="comma-separated GA values to try")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--margin", type=float, default=0.03, help="keep a variant only this much faster")
    ap.add_argument("--out", default="", help="tuning file to write (default: the user database)")
    a = ap.parse_args(argv)
    entries, lines, db = retime(a.models, a.size, a.precision, [int(g) for g in a.gathers.split(",")], a.reps,
                                a.margin)
    for line in lines:
        print(line, flush=True)
    if entries:
        path = db.record(entries, a.out or None)
        print(f"{len(entries)} shapes re-timed faster, written to {path}")
    else:
        print("no variant faster by the margin: nothing written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
