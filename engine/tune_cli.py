"""``yolo-cl tune``: tune every conv shape of a model on one device, with progress on stderr and
a summary on stdout; the results go to the tuning database."""
from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import Optional

from .kernels.family import tuning_database
from .model import load_model
from .precision import precision_named
from .progress import ProgressBar
from .runtime import Runtime
from .tuner import Tuner
from .tuning_db import entries, shape_key

log = logging.getLogger("yolo_cl.tuner")


def tune_model(model: str, size=None, batch: int = 1, precision="fp32", device=None,
               budget_s: Optional[float] = None, db_path: Optional[str] = None, clock: str = "events",
               exhaustive: bool = False, progress: bool = True, out=None, jobs: Optional[int] = None) -> list:
    """Tune every conv shape of a model on one device and store the results (``yolo-cl tune``).

    Shapes already tuned for this device, driver and precision (under their own key) are kept;
    those found only under another driver or in a neighbouring bucket are tuned.
    """
    out = out if out is not None else sys.stdout
    precision = precision_named(precision)
    m = load_model(model, None, size, params="none")
    net, graph = m.net, m.graph
    rt = Runtime(device, profiling=True)
    tuner = Tuner(rt, precision, batch, clock=clock, jobs=jobs)
    db = tuning_database(rt, precision, tuner.mma, user_path=Path(db_path) if db_path else None)
    nodes = sorted(tuner.unique_convs(graph), key=lambda n: -n.flops)
    todo = []
    for node in nodes:
        known = db.lookup_key(shape_key(node, batch), max_level=0)
        if known is not None and db.fits(node, known):
            continue        # tuned on this device and driver (a neighbouring bucket's entry does not count)
        todo.append(node)
    print(f"tuning {model} {net.width}x{net.height} batch {batch} {precision} on {rt.device_name} "
          f"(driver {rt.driver}): {len(todo)} of {len(nodes)} conv shapes need tuning"
          + (f", budget {budget_s:.0f} s" if budget_s else ""), file=out, flush=True)
    if not todo:
        return []
    counts = [len(tuner.candidates(n)) for n in todo]
    total = sum((c if exhaustive else max(1, int(tuner.fraction * c))) + 6 for c in counts)   # + finalists
    bar = ProgressBar(total, "", sys.stderr) if progress else None
    tuner.progress = bar
    results, t0 = [], time.perf_counter()
    tuner.deadline = t0 + budget_s if budget_s is not None else None   # a shape in progress stops there too
    try:
        for node in todo:
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                log.warning("tuning budget of %.0f s spent: %d shapes left on the heuristic", budget_s,
                            len(todo) - len(results))
                break
            if bar:
                bar(0, f"layer {node.label} {node.describe()}")
            r = tuner.traverse(node) if exhaustive else tuner.search(node)
            results.append(r)
            db.record(entries([r]))          # saved shape by shape: an interrupted run keeps its work
    finally:
        tuner.close()
    if bar:
        bar.close()
    for r in results:
        print(f"  {r.key:<42} {r.ms:8.3f} ms {r.gflops:7.1f} GFLOP/s  timed {r.timed}/{r.candidates}  "
              f"{_short(r.config)}", file=out)
    print(f"saved {sum(r.ms < math.inf for r in results)} configs to {db.user_path}", file=out, flush=True)
    return results


def _short(cfg: dict) -> str:
    return " ".join(str(v) if k in ("family", "algo", "kernel") else f"{k}{v}" for k, v in cfg.items())
