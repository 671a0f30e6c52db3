#!/usr/bin/env python3
"""Which register block and fixed tunables should the untuned CPU pick take on this CPU?

For every unique conv shape of the given models whose untuned pick is a GEMM of the CPU family,
times (events clock, best of three interleaved rounds; run it on an idle machine) the pick's own
block and the 16-float-vector blocks 6 x 16 (``nv``) and 16 x 6 (``mv``) with every KU 1/4, WG
0/1 and ORD 0/1, next to the stored entry where there is one. Then the totals, each shape's time
weighted by how often it occurs: the pick as it is, the rule "6 x 16 where N is a multiple of 16,
else 16 x 6" under each fixed KU/WG/ORD, per algorithm, and the stored entries. The thirty-first
session's numbers for the 16-lane rule in ``kernels/gemm_cpu.py`` came from this (BENCHMARKS.md).

    python tools/cpu_block_grid.py yolov3-tiny:416 yolov4:416 ... --out grid.json
"""
from __future__ import annotations

import argparse
import collections
import itertools
import json

COMBOS = list(itertools.product((1, 4), (0, 1), (0, 1)))
BLOCKS = {"nv6": {"kernel": "nv", "TM": 6, "VW": 16, "NV": 1}, "mv6": {"kernel": "mv", "TN": 6, "VW": 16, "NV": 1}}


def name(block: str, ku: int, wg: int, order: int) -> str:
    return f"{block} KU{ku} WG{wg} ORD{order}"


def shapes(specs: list) -> dict:
    """{shape key: [node, count]} over the models' convs (depthwise ones aside)."""
    from yolo_cl.bench import random_params
    from yolo_cl.kernels.gemm_cpu import is_depthwise
    from yolo_cl.model import load_model
    from yolo_cl.tuning_db import shape_key
    out: dict = {}
    for spec in specs:
        model, _, size = spec.partition(":")
        graph = load_model(model, None, int(size or 416), params="made", make_params=random_params).graph
        for n in graph.nodes:
            if n.op == "conv" and not is_depthwise(n):
                out.setdefault(shape_key(n, 1), [n, 0])[1] += 1
    return out


def time_shape(rt, queue, node, pick: dict, stored) -> dict:
    """{config name: ms} of the pick's block, the two 16-float blocks and the stored entry."""
    from yolo_cl.kernels import gemm_cpu
    from yolo_cl.precision import FP32
    from yolo_cl.tuner import ConvBench
    head = {k: pick[k] for k in ("family", "algo", "m") if k in pick}
    blocks = {"pick": {k: pick[k] for k in ("kernel", "TM", "TN", "VW", "NV") if k in pick}, **BLOCKS}
    configs = {"stored": stored} if stored else {}
    for b, (ku, wg, order) in itertools.product(blocks, COMBOS):
        c = {**head, **blocks[b], "KU": ku, "WG": wg, "ORD": order}
        M, N, K = gemm_cpu.gemm_shape(node, c)[:3]
        if gemm_cpu.why_illegal(c, M, N, K) is None and gemm_cpu.conv_illegal(node, c) is None:
            configs[name(b, ku, wg, order)] = c
    bench = ConvBench(rt, node, 1, FP32, queue)
    bound = {}
    for k, c in configs.items():
        launches = bench.bind(c)
        if bench.check(launches) < FP32.tolerance:
            bound[k] = launches
    best: dict = {}
    for _ in range(3):
        for k, launches in bound.items():
            best[k] = min(best.get(k, float("inf")), bench.time(launches, 2))
    return best


def totals(rows: dict) -> dict:
    """{algorithm or "all": {what: weighted ms}} for the pick, the rule's combos and the stored."""
    out: dict = collections.defaultdict(collections.Counter)
    for r in rows.values():
        t, w, N = r["times"], r["count"], r["N"]
        rule = "nv6" if N % 16 == 0 else "mv6"
        rule_t = {c: t.get(name(rule, *c), t.get(name("pick", *c)) if r["pick_block"] == rule else None)
                  for c in COMBOS}
        if any(v is None for v in rule_t.values()):
            continue
        pick = t[name("pick", r["pick"]["KU"], r["pick"]["WG"], r["pick"]["ORD"])]
        for a in (r["algo"], "all"):
            out[a]["pick"] += w * pick
            out[a]["stored"] += w * t.get("stored", min(rule_t.values()))
            for c, v in rule_t.items():
                out[a][f"rule KU{c[0]} WG{c[1]} ORD{c[2]}"] += w * v
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", metavar="NAME:SIZE")
    p.add_argument("--out", help="JSON file for the per-shape times")
    args = p.parse_args(argv)
    import pyopencl as cl
    from yolo_cl.kernels import family, gemm_cpu
    from yolo_cl.kernels.family import tuning_database
    from yolo_cl.precision import FP32
    from yolo_cl.runtime import Runtime
    rt = Runtime(profiling=True)
    queue = cl.CommandQueue(rt.context, rt.device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    db = tuning_database(rt, FP32)
    print(f"{rt.device_name}: native float vectors of {gemm_cpu.simd(rt)[0]}")
    rows = {}
    for key, (node, count) in shapes(args.models).items():
        pick = family.heuristic(node, rt, 1, FP32, "")
        if pick.get("kernel") not in ("nv", "mv"):
            continue
        times = time_shape(rt, queue, node, pick, db.conv_config(node, 1))
        block = next((b for b, v in BLOCKS.items() if all(pick.get(k) == x for k, x in v.items())), "pick")
        rows[key] = {"count": count, "algo": pick["algo"], "N": gemm_cpu.gemm_shape(node, pick)[1], "pick": pick,
                     "pick_block": block, "times": times}
        fastest = sorted(times.items(), key=lambda kv: kv[1])[:3]
        print(f"{key:40s} x{count:<3d} {pick['algo']:9s} " + "  ".join(f"{k} {v:.3f}" for k, v in fastest), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
    for algo, t in totals(rows).items():
        print(f"{algo}: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(t.items(), key=lambda kv: kv[1])))
    return 0


if __name__ == "__main__":
    from yolo_cl import YoloClError
    try:
        raise SystemExit(main())
    except YoloClError as e:
        raise SystemExit(f"cpu_block_grid: {e}")
