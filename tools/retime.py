#!/usr/bin/env python3
"""Re-time a network's stored conv configs against alternatives, and keep the faster.

A full re-tune searches every shape again (tens of minutes); when something changes the picture
-- a new schedule option, or entries tuned on a loaded machine -- this times, for every conv of
the networks whose config comes from the tuning database, the stored config against each
``--variants`` alternative, every one first checked against NumPy with the precision's gate, and
writes the faster per shape key (by at least ``--margin``) into a tuning file (``--out``, default
the user database). Each config's time is its best over ``--rounds`` round-robin timings. Variants:

  ``heuristic``  the config the heuristic would pick for that conv (any family);
  ``fp32``       at tf32, the config fp32 runs for that conv (its database entry, else its heuristic):
                 IEEE FMA, at least as accurate, and faster than tf32 tensor cores on some layers;
  ``gather:G``   for the tensor-core family's implicit convs, the stored config with the implicit
                 B gather ``GA`` G (``ST`` raised to 2, which the gathers need);
  ``wg:N``       for the CPU family, the stored config with work-groups of N items (``WG``; 0 lets
                 the driver choose, which on PoCL can leave a core idle: a config tuned by CPU
                 time never sees that, the events clock does);
  ``fused:KB``   for a CPU-family conv Winograd applies to, the fused Winograd (one launch) with
                 register block KB, the precision's largest tile and one slice, where legal;
  ``set:K=V/K=V`` the stored config with those tunables set (only those, and its algorithm, where
                 ``family`` names another family than the stored one; the tensor-core family's ``GA`` only
                 where the conv is implicit; ``SK`` dropped unless it or ``SS`` is named -- ``set:SS=1``
                 times a split config with its sum inside the GEMM launch; ``algo=im2col`` switches the
                 algorithm): e.g. the large tiles
                 ``set:MWG=128/NWG=128/KWG=32/WM=2/WN=4/ST=2`` for batched 608 shapes.

``--untuned`` also times the convs that have no stored entry, against the heuristic's pick as the
baseline; ``--batch`` times the shapes at that batch (their own keys in the database).
``--in-network`` times each config (after the same gate) bound into the whole network instead of
alone: the network's convs of that shape, their transposes and sums, from the profiled run of a
plan whose database holds that config for that shape (the shipped records for the rest). A conv
timed alone stores its output as planes; in the network it may store channels-last for an
``nhwc`` reader (``narrow``'s ``TC``: on an H200 0.217 ms in the network against 0.246 for the
stored config, yet the slower of the two timed alone), and only this sees that. Slower: a plan
is bound per config. With ``--only NAME`` only that shape's launches of that name count.
``--only NAME`` times only each config's launches of that name and writes nothing: with
``--only gemm_mma`` an ``algo=im2col`` variant's time is its GEMM alone, i.e. what a conv whose
B needs no gather could take.

    python3 tools/retime.py yolov3 yolov4 --size 416 --precision fp16 --variants gather:1 --out $OUT/r.yaml
    python tools/retime.py yolov3 --size 416 --variants heuristic --out configs/pocl-cpu.yaml
    python3 tools/retime.py yolov3 --size 608 --batch 8 --precision fp16 --untuned \
        --variants set:MWG=128/NWG=128/KWG=32/WM=2/WN=4/ST=2 --out $OUT/b8.yaml
"""
from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

from yolo_cl.bench import random_params
from yolo_cl.executor import Executor
from yolo_cl.kernels.conv import heuristic_config
from yolo_cl.kernels import winograd
from yolo_cl.kernels.family import tuning_database
from yolo_cl.kernels.gemm_cpu import fused_illegal
from yolo_cl.kernels.gemm_mma import mode_for
from yolo_cl.model import load_model
from yolo_cl.precision import FMA_COMPETES, FP32, precision_named
from yolo_cl.runtime import Runtime
from yolo_cl.tuner import ConvBench, inputs_channels_last
from yolo_cl.tuning_db import shape_key


@functools.lru_cache(maxsize=None)
def fp32_database(rt):
    """The tuning database fp32 reads on ``rt``'s device (for the ``fp32`` variant)."""
    return tuning_database(rt, FP32, "")


def variant(name: str, node, cfg: dict, rt, precision, mma: str, batch: int = 1) -> Optional[dict]:
    """The alternative ``name`` to stored ``cfg`` for ``node``, or None where it does not apply."""
    if name == "heuristic":
        h = heuristic_config(node, rt, batch, precision, mma)
        return None if h == cfg else h
    if name == "fp32":
        if mma not in FMA_COMPETES:
            return None
        f = fp32_database(rt).conv_config(node, batch) or heuristic_config(node, rt, batch, FP32, "")
        return None if f == cfg else f
    if name.startswith("set:"):
        sets = dict(kv.split("=", 1) for kv in name[4:].split("/"))
        if "SS" in sets and int(cfg.get("SK", 1)) < 2:
            return None                 # the split sum's schedule: only where K is split
        keep_split = bool({"SK", "SS"} & sets.keys())
        c = {k: v for k, v in cfg.items() if k not in ("ms", "gflops") and (keep_split or k not in ("SK", "SS"))}
        if sets.get("family", c.get("family")) != c.get("family"):
            c = {"algo": c["algo"]}     # another family: none of the stored config's tunables are its own
        c.update({k: int(v) if v.lstrip("-").isdigit() else v for k, v in sets.items()})
        if c.get("algo") != "implicit":
            c.pop("GA", None)
        return None if c == cfg else c
    if name.startswith("gather:"):
        if cfg.get("family") != "mma" or cfg.get("algo") != "implicit":
            return None
        return {**cfg, "GA": int(name.split(":")[1]), "ST": max(int(cfg.get("ST", 1)), 2)}
    if name.startswith("wg:"):
        wg = int(name.split(":")[1])
        if cfg.get("family") != "cpu" or cfg.get("kernel") == "fused" or int(cfg.get("WG", 0)) == wg:
            return None                # (the fused Winograd's work-groups are always of one item)
        return {**cfg, "WG": wg}
    if name.startswith("fused:"):
        c = {"family": "cpu", "algo": "winograd", "m": max(precision.winograd_tiles), "kernel": "fused",
             "KB": int(name.split(":")[1]), "KS": 1}
        if cfg.get("family") != "cpu" or not winograd.applicable(node) or fused_illegal(node, c) is not None:
            return None
        return None if cfg == c else c
    raise SystemExit(f"retime: unknown variant '{name}' (heuristic, fp32, gather:G, wg:N, fused:KB, set:K=V/...)")


def network_times(rt, model, batch: int, precision, mma: str, key: str, configs: dict, reps: int,
                  rounds: int, log=print, only: str = "") -> dict:
    """{name: ms}: each of ``configs`` ({name: config}) bound for shape ``key`` into the whole
    network (a database whose user file holds that config alone, the shipped records behind it),
    the device time of the network's launches of that shape's convs (their transposes and split
    sums too): the median of ``reps`` profiled runs, the best of ``rounds`` round-robin rounds. A
    config the network did not bind as asked (another family or algorithm: a fallback) is left
    out, with a line to ``log``. ``only``: count only the launches of that name."""
    net = model.net
    blob = np.random.default_rng(0).random((batch, net.channels, net.height, net.width), dtype=np.float32)
    plans, out = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, cfg) in enumerate(configs.items()):
            db = tuning_database(rt, precision, mma, user_path=Path(tmp) / f"{i}.yaml")
            db.record({key: cfg})
            ex = Executor(rt, model.graph, batch, precision, db, mma=mma)
            mine = [j for j, l in enumerate(ex.launches) if l.node.op == "conv" and shape_key(l.node, batch) == key]
            asked = {k: cfg.get(k) for k in ("family", "algo")}
            if not mine or any(any(l.config.get(k) != v for k, v in asked.items())
                               for l in (ex.launches[j] for j in mine) if l.config.get("family")):
                log(f"{key}: {name} not bound as asked in the network: left out")
                continue
            ex.run(blob)
            plans[name] = (ex, [j for j in mine if not only or ex.launches[j].name == only])
    for _ in range(rounds):
        for name, (ex, mine) in plans.items():
            runs = []
            for _ in range(reps):
                ex.run(blob, profile=True)
                times = ex.layer_times()
                runs.append(sum(times[j].ms for j in mine))
            out[name] = min(float(np.median(runs)), out.get(name, np.inf))
    return out


def retime(models: list, size: int, precision_name: str, variants: list, reps: int, margin: float,
           clock: str, batch: int = 1, untuned: bool = False, budget: float = 0.0, rounds: int = 3,
           log=print, only: str = "", layers: Optional[set] = None, in_network: bool = False) -> tuple:
    """(entries {shape key: config + ms}, the database); each shape's line goes to ``log`` as it is timed.

    Each config's time is its best over ``rounds`` round-robin timings. Batches above 2 are gated
    against NumPy at batch 2 (the same config and shape: the batch only repeats the tiles along Z,
    and 2 exercises that stride) and timed at the full batch, so that a 608 batch-8 reference does
    not take minutes per shape. ``budget`` > 0 stops starting new shapes after that many seconds.
    ``only``: time only each config's launches of that name (e.g. ``gemm_mma``: an im2col
    variant's GEMM without its im2col), a measurement: no entries are returned. ``layers``: the
    cfg layer numbers (a conv's first layer, as ``yolo-cl bench`` numbers its rows) to time, or all.
    ``in_network``: time each gated config in the whole network (:func:`network_times`)."""
    rt = Runtime(None, profiling=True)
    precision = precision_named(precision_name)
    mma = mode_for(rt, precision)
    db = tuning_database(rt, precision, mma)
    entries, seen, t0 = {}, set(), time.monotonic()
    for model in models:
        loaded = load_model(model, None, size, params="optional", make_params=random_params)
        graph = loaded.graph
        last = inputs_channels_last(graph, batch)       # no transpose charged where the network skips it
        for node in graph.nodes:
            if node.op != "conv" or (layers and node.layers[0] not in layers):
                continue
            if budget and time.monotonic() - t0 > budget:
                log(f"budget of {budget:.0f} s spent: the remaining shapes are not timed")
                return entries, db
            key, cfg = shape_key(node, batch), db.lookup(node, batch)
            if not cfg and untuned:
                cfg = heuristic_config(node, rt, batch, precision, mma)
            if key in seen or not cfg:
                continue
            seen.add(key)
            alts = {v: variant(v, node, cfg, rt, precision, mma, batch) for v in variants}
            alts = {v: c for v, c in alts.items() if c is not None}
            if not alts:
                continue
            gate = ConvBench(rt, node, min(batch, 2), precision, rt.queue, seed=1, mma=mma,
                             input_channels_last=last[key])
            bench = gate if batch <= 2 else ConvBench(rt, node, batch, precision, rt.queue, seed=1,
                                                      reference=False, mma=mma, input_channels_last=last[key])
            bound = {}
            for name, c in [("stored", cfg)] + list(alts.items()):
                try:
                    launches = gate.bind(c)
                    err = gate.check(launches)
                    if bench is not gate:
                        launches = bench.bind(c)
                except Exception as e:     # noqa: BLE001 - a variant that does not build: not a candidate
                    log(f"{key}: {name} failed: {str(e).splitlines()[0][:120]}")
                    continue
                if not err <= precision.tolerance:
                    log(f"{key}: {name} rejected, relative error {err:.2e}")
                    continue
                bound[name] = (launches, c)
            # Round-robin rounds, each config's best kept: on a CPU a config timed once, right
            # after binding, read up to 2x slower than the same config a few rounds later.
            timed = {}
            if in_network:
                ms = network_times(rt, loaded, batch, precision, mma, key, {n: c for n, (_, c) in bound.items()},
                                   reps, rounds, log, only)
                timed = {n: (t, bound[n][1]) for n, t in ms.items()}
            for _ in range(0 if in_network else rounds):
                for name, (launches, c) in bound.items():
                    t = bench.time([l for l in launches if l.name == only] if only else launches, reps, clock)
                    timed[name] = (min(t, timed.get(name, (t,))[0]), c)
            if "stored" not in timed:
                continue
            best = min(timed, key=lambda n: timed[n][0])
            base = timed["stored"][0]
            log(f"{model} {key}: stored {base:.4f} ms{' in the network' if in_network else ''}; " +
                ", ".join(f"{n} {t:.4f}" for n, (t, _) in timed.items() if n != "stored"))
            if best != "stored" and timed[best][0] < base * (1 - margin) and not only:
                ms, c = timed[best]
                entries[key] = {**c, "ms": round(ms, 4), "gflops": round(batch * node.flops / (ms * 1e6), 2)}
    return entries, db


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--size", type=int, default=416)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--untuned", action="store_true", help="also time convs without a stored entry (baseline: the heuristic)")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--variants", default="heuristic", help="comma-separated: heuristic, fp32, gather:G, wg:N, fused:KB, set:K=V/K=V")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="times each config is timed, round-robin; the best counts")
    ap.add_argument("--clock", default="events", choices=("events", "cpu"))
    ap.add_argument("--margin", type=float, default=0.03, help="keep a variant only this much faster")
    ap.add_argument("--budget", type=float, default=0.0, help="seconds after which no new shape is started (0: none)")
    ap.add_argument("--out", default="", help="tuning file to write (default: the user database)")
    ap.add_argument("--only", default="", help="time only the launches of this name (gemm_mma: an im2col "
                    "variant's GEMM alone, the bound of a gather-free conv); writes nothing")
    ap.add_argument("--layers", default="", help="comma-separated layer numbers (bench's node column): "
                    "time only these convs")
    ap.add_argument("--in-network", action="store_true", help="time each config bound into the whole network "
                    "(its shape's launches there), not alone: sees channels-last stores for an nhwc reader")
    a = ap.parse_args(argv)
    layers = {int(v) for v in a.layers.split(",") if v.strip()}
    entries, db = retime(a.models, a.size, a.precision, a.variants.split(","), a.reps, a.margin, a.clock,
                         a.batch, a.untuned, a.budget, a.rounds, lambda line: print(line, flush=True), a.only,
                         layers, a.in_network)
    if entries:
        path = db.record(entries, a.out or None)
        print(f"{len(entries)} shapes re-timed faster, written to {path}")
    else:
        print("no variant faster by the margin: nothing written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
