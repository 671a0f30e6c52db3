#!/usr/bin/env python3
"""Check the configs a model would bind against NumPy: the tuner's correctness gate, no timing.

For every unique conv shape of each model it looks the config up as the executor would
(the user cache and shipped files, with their fall-back levels and neighbouring buckets), binds
it on the device and compares one run with the NumPy convolution (relative error 1e-4 fp32,
1e-2 fp16). Use it after merging records into ``configs/*.yaml`` from another size or run.

    PYTHONPATH=... python tools/check_db.py yolov4:416 yolov3:416 yolov4:608
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tune_eval import graph_of   # noqa: E402  (a sibling tool)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="+", metavar="NAME:SIZE")
    p.add_argument("--precision", choices=("fp32", "fp16"), default="fp32")
    p.add_argument("--device")
    args = p.parse_args(argv)
    from yolo_cl.kernels.conv import heuristic_config
    from yolo_cl.kernels.family import tuning_database
    from yolo_cl.precision import precision_named
    from yolo_cl.runtime import Runtime
    from yolo_cl.tuner import ConvBench, Tuner
    from yolo_cl.tuning_db import shape_key
    rt = Runtime(args.device, profiling=True)
    precision = precision_named(args.precision)
    tuner = Tuner(rt, precision, jobs=1)
    db = tuning_database(rt, precision, tuner.mma)
    tol, bad = tuner.tol, 0
    for spec in args.model:
        for node in tuner.unique_convs(graph_of(spec)):
            cfg = db.conv_config(node) or heuristic_config(node, rt, 1, precision, tuner.mma)
            level = db.origin[shape_key(node)][0]
            bench = ConvBench(rt, node, 1, precision, tuner.queue, mma=tuner.mma)
            err = bench.check(bench.bind(cfg))
            ok = err < tol
            bad += not ok
            print(f"[{spec}] {shape_key(node):<38} {level:<14} error {err:.1e} {'ok' if ok else 'FAILED'}  "
                  f"{' '.join(f'{k}={v}' for k, v in cfg.items() if k != 'family')}", flush=True)
    tuner.close()
    print("all configs pass" if not bad else f"{bad} configs FAILED")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
