"""Run tools/tune_eval.py on several GPUs of one host at once, one process per GPU.

A GPU traversal is bound by compiling (NVIDIA's compiler takes ~0.44 s per GEMM variant), so
one host's GPUs and cores together finish a model's traversal several times sooner. The
model's unique conv shapes are dealt to the GPUs by candidate count (largest first, each to the
least-loaded GPU); each process gets ``cores / GPUs`` compile workers and its own binary caches;
their results are merged into one file that ``tune_eval.py --summary`` and ``--replay`` read.

    python3 tools/tune_eval_gpus.py --model yolov4:416 --gpus 8 --out te.json \
        [--skip earlier.json ...] -- --first traverse --verify 7 --inner 20 --deadline 400
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tune_eval import graph_of, read_json, summary  # noqa: E402


def deal(sizes: dict, bins: int) -> list:
    """Longest-processing-time-first: shape indices into ``bins`` lists of near-equal total size."""
    load, out = [0] * bins, [[] for _ in range(bins)]
    for i in sorted(sizes, key=lambda i: -sizes[i]):
        b = load.index(min(load))
        out[b].append(i)
        load[b] += sizes[i]
    return out


def merge(parts: list) -> dict:
    """One report from several tune_eval results files of the same model(s)."""
    report = None
    for p in parts:
        r = read_json(p)
        if report is None:
            report = dict(r, models={})
        for spec, rows in r["models"].items():
            report["models"].setdefault(spec, []).extend(rows)
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="NAME:SIZE")
    p.add_argument("--gpus", type=int, required=True, help="devices 0..N-1 of the runtime's list")
    p.add_argument("--skip", action="append", default=[], help="results file whose shapes are done")
    p.add_argument("--out", required=True, help="merged results JSON")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="-- then arguments for every tune_eval.py")
    args = p.parse_args(argv)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest

    from yolo_cl.runtime import Runtime
    from yolo_cl.tuner import Tuner
    from yolo_cl.tuning_db import shape_key
    tuner = Tuner(Runtime(0), jobs=1, build="threads")
    nodes = tuner.unique_convs(graph_of(args.model))
    done = {r["key"] for f in args.skip for rows in read_json(f)["models"].values() for r in rows}
    sizes = {i: len(tuner.candidates(n)) for i, n in enumerate(nodes) if shape_key(n, 1) not in done}
    jobs = max(1, (os.cpu_count() or 1) // args.gpus)
    procs, outs, logs = [], [], []
    out = Path(args.out)
    for gpu, shapes in enumerate(deal(sizes, args.gpus)):
        if not shapes:
            continue
        part = out.with_suffix(f".gpu{gpu}.json")
        env = dict(os.environ, YOLO_CL_CACHE=f"/tmp/yolo-cl-cache-gpu{gpu}",
                   CUDA_CACHE_PATH=f"/tmp/cuda-cache-gpu{gpu}")
        cmd = [sys.executable, str(Path(__file__).with_name("tune_eval.py")), "--model", args.model,
               "--device", str(gpu), "--shapes", ",".join(map(str, shapes)), "--jobs", str(jobs),
               "--out", str(part), *rest]
        print(f"gpu {gpu}: shapes {shapes} ({sum(sizes[i] for i in shapes)} candidates)", flush=True)
        logs.append(open(out.with_suffix(f".gpu{gpu}.log"), "w"))
        procs.append(subprocess.Popen(cmd, env=env, stdout=logs[-1], stderr=subprocess.STDOUT))
        outs.append(part)
    t0 = time.perf_counter()
    codes = [pr.wait() for pr in procs]
    for f in logs:
        f.close()
    print(f"all done in {time.perf_counter() - t0:.0f} s, exit codes {codes}", flush=True)
    present = [o for o in outs if o.exists()]
    if present:
        report = merge(present)
        out.write_text(json.dumps(report, indent=1))
        print(summary(report))
    return max(codes, default=0)


if __name__ == "__main__":
    sys.exit(main())
