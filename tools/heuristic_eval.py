#!/usr/bin/env python3
"""How good is the untuned CPU pick? The heuristic judged on recorded full traversals, no timing.

For every shape of a ``tune_eval.py`` recording (every legal config of the CPU family timed on
the device) it looks up the recorded time of the config ``conv.heuristic_config`` picks today
and compares it with the recording's fastest: per shape, and for the network (shape times
weighted by how often each shape occurs). A pick the recording never timed (outside the space
it covered) is reported as such and judged by the recording's nearest config of the same
algorithm and block, if any.

    PYTHONPATH=... python tools/heuristic_eval.py tools/recordings/tune_eval_pocl_yolov4_256.json.gz
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tune_eval import graph_of   # noqa: E402  (a sibling tool)


def read_recording(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def evaluate(report: dict, pick, verbose: bool = True, report_totals: bool = True) -> dict:
    """{model spec: (heuristic ms, best ms)} network totals of ``pick(node, batch)`` on the recording."""
    from yolo_cl.search import config_key
    from yolo_cl.tuning_db import shape_key
    batch = report["batch"]
    out = {}
    for spec, rows in report["models"].items():
        nodes = {}
        for n in graph_of(spec).nodes:
            if n.op == "conv":
                nodes.setdefault(shape_key(n, batch), n)
        tot_h = tot_b = 0.0
        for r in rows:
            times = r["all_times"]
            if isinstance(times, str):
                times = json.loads(times)
            node = nodes[r["key"]]
            cfg = pick(node, batch)
            best = min(times.values())
            got = times.get(config_key(cfg))
            note = ""
            if got is None:
                got, note = math.nan, "  (pick not recorded)"
            count = int(r["count"])
            tot_h += count * (got if got == got else best)
            tot_b += count * best
            if verbose:
                print(f"[{spec}] {r['key']:<36} x{count}  pick {got:8.3f} ms  best {best:8.3f} ms  "
                      f"ratio {got / best:5.2f}  {_short(cfg)}{note}")
        out[spec] = (tot_h, tot_b)
        if report_totals:
            print(f"[{spec}] network: heuristic {tot_h:.1f} ms, traversal best {tot_b:.1f} ms, ratio "
                  f"{tot_h / tot_b:.3f}")
    return out


def _short(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items() if k != "family")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recording", nargs="+", help="tune_eval JSON (.gz) of full traversals")
    p.add_argument("--quiet", action="store_true", help="network totals only")
    args = p.parse_args(argv)
    from yolo_cl.kernels import gemm_cpu
    from yolo_cl.precision import precision_named
    for path in args.recording:
        rep = read_recording(path)
        precision = precision_named(rep["precision"])
        evaluate(rep, lambda node, batch: gemm_cpu.heuristic_config(node, batch, precision), not args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
