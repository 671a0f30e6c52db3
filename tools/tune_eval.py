#!/usr/bin/env python3
"""Is the guided tuner as good as a full traversal, at a quarter of the timings?

For every unique conv shape of each model it runs, on one device:
  1. a full traversal (every legal candidate checked against NumPy and timed),
  2. the tuner's guided search (at most 25% of the candidates timed),
  3. an interleaved re-timing of the two winners (``--verify`` rounds each),
and reports per shape the candidates, how many the search timed, both winners and the
re-timed ratio search/traversal; then totals weighted by how often each shape occurs.
Results are rewritten to a JSON file after each shape, so a long run can be stopped and read.

``--summary FILE`` prints the totals of a results file. ``--phase traverse`` records only the traversals; ``--phase search --traversal FILE`` then runs
the searches against them (re-timing both winners live). ``--replay FILE`` runs the search
against the recorded times instead of the device: a quick way to study the cost model (its
numbers are a simulation and are labelled so).

    PYTHONPATH=... python tools/tune_eval.py --model yolov3-tiny:416 --model yolov4:256 \\
        --clock cpu --out /tmp/tune_eval.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from collections import Counter
from pathlib import Path


def graph_of(spec: str):
    """The graph of a ``NAME[:SIZE]`` model spec (a zoo name or cfg path; size 416 if none)."""
    from yolo_cl.model import load_model
    model, _, size = spec.partition(":")
    return load_model(model, None, int(size or 416), params="none").graph


def shape_nodes(tuner, spec: str, batch: int) -> dict:
    """{shape key: conv node} of a model spec's unique conv shapes."""
    from yolo_cl.tuning_db import shape_key
    return {shape_key(n, batch): n for n in tuner.unique_convs(graph_of(spec))}


def timed_traverse(tuner, node) -> tuple:
    """The tuner's full traversal of ``node`` and the seconds it took."""
    t = time.perf_counter()
    return tuner.traverse(node), time.perf_counter() - t


def retime(tuner, node, cfgs: list, rounds: int, inner: int = 1) -> list:
    """Best ms of each config over ``rounds`` interleaved passes, on one fresh bench; with
    ``inner`` > 1 (events clock) a pass enqueues the launches ``inner`` times back to back and
    counts the device time from the first start to the last end, divided by ``inner``."""
    from yolo_cl.measure import enqueue
    from yolo_cl.tuner import ConvBench
    bench = ConvBench(tuner.rt, node, tuner.batch, tuner.precision, tuner.queue, seed=1)
    launches = [bench.bind(c) for c in cfgs]
    for l in launches:
        assert bench.check(l) <= tuner.tol
    q = tuner.queue
    best = [math.inf] * len(cfgs)
    for _ in range(rounds):
        for i, ls in enumerate(launches):
            if inner <= 1 or tuner.clock != "events":
                ms = bench.time(ls, 1, tuner.clock)
            else:
                evs = [e for _ in range(inner) for e in enqueue(tuner.rt, q, ls)]
                q.finish()
                ms = (evs[-1].profile.end - evs[0].profile.start) * 1e-6 / inner
            best[i] = min(best[i], ms)
    return best


def verify(report: dict, args) -> int:
    """Re-time each shape's two recorded winners (traversal, search) live, interleaved."""
    from yolo_cl.runtime import Runtime
    from yolo_cl.precision import precision_named
    from yolo_cl.tuner import Tuner
    rt = Runtime(args.device, profiling=True)
    tuner = Tuner(rt, precision_named(report["precision"]), report["batch"], clock=report["clock"].split()[0], jobs=1)
    out = dict(report, clock=f"{tuner.clock}, winners re-timed ({args.verify} rounds x {args.inner})", models={})
    for spec, rows in report["models"].items():
        nodes = shape_nodes(tuner, spec, report["batch"])
        for r in rows:
            f_ms, s_ms = retime(tuner, nodes[r["key"]], [r["full_best"], r["search_best"]], args.verify, args.inner)
            out["models"].setdefault(spec, []).append(dict(r, full_ms=f_ms, search_ms=s_ms, ratio=s_ms / f_ms))
            print(f"[{spec}] {r['key']}: traversal {f_ms:.4f} ms vs search {s_ms:.4f} ms -> {s_ms / f_ms:.3f}",
                  flush=True)
            Path(args.out).write_text(json.dumps(out, indent=1))
    print(summary(out))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, metavar="NAME:SIZE",
                   help="zoo model (or cfg) and input size, e.g. yolov4:256; repeatable")
    p.add_argument("--device", help="OpenCL device (default: the runtime's default)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--precision", choices=("fp32", "fp16"), default="fp32")
    p.add_argument("--clock", choices=("events", "cpu"), default="events",
                   help="events: OpenCL profiling; cpu: process CPU time / compute units (a shared CPU)")
    p.add_argument("--reps", type=int, default=2, help="timed runs per candidate (best of)")
    p.add_argument("--verify", type=int, default=7, help="interleaved re-timing rounds of the two winners")
    p.add_argument("--max-shapes", type=int, default=0, help="stop after this many shapes per model (0: all)")
    p.add_argument("--shapes", help="only these shape indices (in graph order) per model, e.g. 0,3,7")
    p.add_argument("--jobs", type=int, help="parallel builds (default: the tuner's, min(16, CPUs))")
    p.add_argument("--build", choices=("processes", "threads"), default="processes",
                   help="compile in worker processes (default) or threads of this one")
    p.add_argument("--first", choices=("search", "traverse"), default="search",
                   help="which runs first and so pays the cold compiles (traverse: the search then finds "
                        "its programs built, and its time measures timing alone)")
    p.add_argument("--deadline", type=float, default=0, help="stop starting new shapes after this many seconds")
    p.add_argument("--out", help="JSON results file (rewritten after each shape; default tune_eval.json, "
                                 "none for --replay)")
    p.add_argument("--phase", choices=("both", "traverse", "search", "extend", "verify"), default="both",
                   help="extend: time the candidates a --traversal FILE lacks (the space grew) and merge them; "
                        "verify: re-time the two winners of each shape of --traversal FILE (e.g. a --replay "
                        "--out file) on this device, interleaved")
    p.add_argument("--inner", type=int, default=1,
                   help="launches per timed round when re-timing winners (device time from the first "
                        "start to the last end, divided): for kernels near the event timer's resolution")
    p.add_argument("--traversal", help="search phase: JSON of an earlier traverse phase")
    p.add_argument("--replay", help="simulate the search on the recorded times of this JSON (no timing)")
    p.add_argument("--summary", help="print the totals of a results JSON and exit")
    args = p.parse_args(argv)
    if args.summary:
        print(summary(read_json(args.summary)))
        return 0
    if args.replay:
        return replay(read_json(args.replay), args)
    args.out = args.out or "tune_eval.json"
    recorded = {}
    if args.phase == "extend":
        return extend(read_json(args.traversal), args)
    if args.phase == "verify":
        return verify(read_json(args.traversal), args)
    if args.phase == "search":
        if not args.traversal:
            p.error("--phase search needs --traversal FILE")
        prev = read_json(args.traversal)
        recorded = {(spec, r["key"]): r for spec, rows in prev["models"].items() for r in rows}
    warnings.filterwarnings("ignore", message="Non-empty compiler output")

    from yolo_cl.runtime import Runtime
    from yolo_cl.precision import precision_named
    from yolo_cl.tuner import Tuner
    from yolo_cl.tuning_db import shape_key
    rt = Runtime(args.device, profiling=True)
    tuner = Tuner(rt, precision_named(args.precision), args.batch, reps=args.reps, clock=args.clock, jobs=args.jobs,
                  build=args.build)
    report = {"device": rt.device_name, "driver": rt.driver, "precision": args.precision, "batch": args.batch,
              "clock": args.clock, "reps": args.reps, "is_cpu": rt.is_cpu, "limits": device_limits(rt),
              "jobs": tuner.jobs, "build": tuner.build, "first": args.first, "models": {}}
    start = time.perf_counter()
    for spec in args.model:
        graph = graph_of(spec)
        counts = Counter(shape_key(n, args.batch) for n in graph.nodes if n.op == "conv")
        nodes = tuner.unique_convs(graph)
        if args.shapes:
            nodes = [nodes[int(i)] for i in args.shapes.split(",")]
        if args.max_shapes:
            nodes = nodes[:args.max_shapes]
        rows = report["models"].setdefault(spec, [])
        for i, node in enumerate(nodes):
            if args.deadline and time.perf_counter() - start > args.deadline:
                print(f"deadline of {args.deadline:.0f} s reached: {len(nodes) - i} shapes of {spec} not run")
                break
            key = shape_key(node, args.batch)
            full = timed_traverse(tuner, node) if args.phase == "both" and args.first == "traverse" else None
            t0 = time.perf_counter()
            found = tuner.search(node) if args.phase != "traverse" else None   # first unless --first traverse
            t1 = time.perf_counter()
            if args.phase == "search":
                if (spec, key) not in recorded:
                    print(f"[{spec}] {key}: not in {args.traversal}, skipped", flush=True)
                    continue
                old = recorded[(spec, key)]
                full_cfg, cands, full_s, times, rejected, full_phases = (
                    old["full_best"], old["candidates"], old["full_s"], old["all_times"], old["rejected"],
                    old.get("full_phases", {}))
            else:
                res, full_s = full or timed_traverse(tuner, node)
                full_cfg, cands, times, rejected, full_phases = (res.config, res.candidates, res.times,
                                                                 res.rejected, res.phases)
            if found is None:
                found_cfg, timed = full_cfg, 0
            else:
                found_cfg, timed = found.config, found.timed
            f_ms, s_ms = retime(tuner, node, [full_cfg, found_cfg], args.verify, args.inner)
            row = {"key": key, "count": counts[key], "gflop": node.flops * args.batch / 1e9,
                   "candidates": cands, "search_timed": timed, "rejected": rejected,
                   "full_best": full_cfg, "full_ms": f_ms, "search_best": found_cfg, "search_ms": s_ms,
                   "ratio": s_ms / f_ms, "search_s": t1 - t0, "full_s": full_s, "all_times": times,
                   "search_phases": found.phases if found is not None else {},
                   "full_phases": full_phases}
            rows.append(row)
            print(f"[{spec} {i + 1}/{len(nodes)}] {row['key']}: {row['candidates']} candidates, search timed "
                  f"{row['search_timed']} ({100 * row['search_timed'] / max(row['candidates'], 1):.0f}%), "
                  f"traversal {f_ms:.3f} ms vs search {s_ms:.3f} ms -> ratio {row['ratio']:.3f} "
                  f"(search {row['search_s']:.0f} s, traversal {row['full_s']:.0f} s; seconds compiling/checking/"
                  f"timing: traversal {_phases(row['full_phases'])}, search {_phases(row['search_phases'])})",
                  flush=True)
            Path(args.out).write_text(json.dumps(report, indent=1))
    tuner.close()
    print()
    print(summary(report))
    return 0


def _phases(p: dict) -> str:
    return "/".join(f"{p.get(k, 0):.0f}" for k in ("compile", "check", "time")) if p else "-"


def device_limits(rt) -> dict:
    """What the GPU family's space and cost model read from a device (kept so a recording made on
    another machine replays with that machine's space)."""
    d = rt.device
    return {"max_work_group_size": int(d.max_work_group_size), "local_mem_size": int(d.local_mem_size),
            "max_compute_units": int(d.max_compute_units),
            "native_vector_width_float": int(d.native_vector_width_float)}


class RecordedDevice:
    """The device of a recording, as far as candidate enumeration and the cost model ask."""

    def __init__(self, report: dict, rt) -> None:
        self.rt, self.is_cpu = rt, report.get("is_cpu", rt.is_cpu)
        # recordings before the vector width was kept: 8 floats, the AVX2 CPU of the PoCL ones
        # and what the CPU cost model then assumed on every device
        limits = {**device_limits(rt), "native_vector_width_float": 8, **report.get("limits", {})}
        self.device = type("Device", (), limits)()

    def __getattr__(self, name: str):
        return getattr(self.rt, name)


def read_json(path: str) -> dict:
    """A results file, plain or gzipped (the recordings in tools/recordings/ are .json.gz)."""
    import gzip
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def extend(report: dict, args) -> int:
    """Complete a recorded traversal: check and time the candidates it has no time for."""
    import ast
    from yolo_cl.runtime import Runtime
    from yolo_cl.precision import precision_named
    from yolo_cl.search import config_key, new_state
    from yolo_cl.tuner import ConvBench, Tuner
    rt = Runtime(args.device, profiling=True)
    tuner = Tuner(rt, precision_named(report["precision"]), report["batch"], reps=report.get("reps", args.reps),
                  clock=report["clock"])
    for spec, rows in report["models"].items():
        nodes = shape_nodes(tuner, spec, report["batch"])
        for r in rows:
            node = nodes[r["key"]]
            cands = tuner.candidates(node)
            missing = [c for c in cands if config_key(c) not in r["all_times"]]
            t0 = time.perf_counter()
            if missing:
                bench = ConvBench(rt, node, report["batch"], tuner.precision, tuner.queue, tuner.seed)
                state = new_state()
                for c in missing:
                    tuner.measure(bench, c, tuner.reps, state)
                r["all_times"].update(state["times"])
                r["rejected"] += state["rejected"]
            r["candidates"] = len(cands)
            best = min(r["all_times"].items(), key=lambda kv: kv[1])[0]
            r["full_best"] = dict(ast.literal_eval(best))
            r["full_s"] += time.perf_counter() - t0
            print(f"[{spec}] {r['key']}: +{len(missing)} candidates timed, best now {r['full_best']}", flush=True)
            Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


def replay(report: dict, args) -> int:
    """Re-run the search with the recorded traversal times standing in for the device.

    The search sees only the candidates the traversal timed, so a recording of an older (smaller)
    space is still a like-for-like comparison."""
    from yolo_cl import tuner as tmod
    from yolo_cl.precision import precision_named
    from yolo_cl.runtime import Runtime
    from yolo_cl.search import config_key
    rt = Runtime(args.device)
    tuner = tmod.Tuner(rt, precision_named(report["precision"]), report["batch"], clock=report["clock"], jobs=1)
    if report["device"] != rt.device_name or report.get("is_cpu", rt.is_cpu) != rt.is_cpu:
        tuner.rt = RecordedDevice(report, rt)     # e.g. a GPU recording replayed on a CPU
    out = dict(report, clock=report["clock"] + " (replayed)", models={})
    for spec, rows in report["models"].items():
        nodes = shape_nodes(tuner, spec, report["batch"])
        for r in rows:
            times = r["all_times"]
            node = nodes[r["key"]]

            def measure(bench, cfg, reps, state, times=times):
                k = config_key(cfg)
                if k not in state["timed"]:
                    state["timed"].add(k)
                ms = times.get(k, math.inf)
                state["times"][k] = ms
                return ms
            tuner.measure = measure
            # Search the space the traversal recorded (a recording made before the space grew
            # judges the search on that older space, which both then share).
            full_space = tmod.Tuner.candidates
            tuner.candidates = lambda n, times=times, full_space=full_space: [
                c for c in full_space(tuner, n) if config_key(c) in times]
            if not tuner.candidates(node):
                print(f"[{spec}] {r['key']}: none of its recorded configs is in today's space "
                      f"(recorded before the space changed); skipped")
                continue
            tmod_bench, tmod.ConvBench = tmod.ConvBench, lambda *a, **k: None
            try:
                found = tuner.search(node)
            finally:
                tmod.ConvBench = tmod_bench
            best = min(v for v in times.values())
            got = times[config_key(found.config)]
            out["models"].setdefault(spec, []).append(dict(r, search_timed=found.timed, search_best=found.config,
                                                           full_ms=best, search_ms=got, ratio=got / best))
    print(summary(out))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


def summary(report: dict) -> str:
    lines = [f"device {report['device']} ({report['driver']}), {report['precision']}, batch {report['batch']}, "
             f"clock {report['clock']}"]
    for spec, rows in report["models"].items():
        if not rows:
            continue
        cands = sum(r["candidates"] for r in rows)
        timed = sum(r["search_timed"] for r in rows)
        worst = max(rows, key=lambda r: r["ratio"])
        geo = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
        net_full = sum(r["full_ms"] * r["count"] for r in rows)
        net_search = sum(r["search_ms"] * r["count"] for r in rows)
        within = sum(r["ratio"] <= 1.05 for r in rows)
        cold, warm = ("search", "traversal") if report.get("first", "search") == "search" else ("traversal", "search")
        secs = {"search": sum(r["search_s"] for r in rows), "traversal": sum(r["full_s"] for r in rows)}
        lines.append(f"{spec}: {len(rows)} shapes, search timed {timed}/{cands} candidates "
                     f"({100 * timed / cands:.1f}%, max {100 * max(r['search_timed'] / r['candidates'] for r in rows):.0f}% "
                     f"per shape); search/traversal time: network {net_search / net_full:.3f}, geomean "
                     f"{geo:.3f}, worst {worst['ratio']:.3f} ({worst['key']}); {within}/{len(rows)} shapes within 5%; "
                     f"tuning time: {cold} {secs[cold]:.0f} s (cold compiles), {warm} {secs[warm]:.0f} s "
                     f"(compiles cached by the {cold})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
