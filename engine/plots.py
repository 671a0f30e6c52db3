"""Figures for people who would rather look than read: bench, tune and evaluation plots (PNG).

matplotlib is an optional extra (``pip install "yolo-cl[plot]"``); :func:`require` says so in one
line before any work starts. Figures are drawn off-screen (Agg) and written atomically.
"""
from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Optional

from .errors import YoloClError
from .writers import write_file


def require() -> None:
    """Fail early, in one line, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise YoloClError("plots need matplotlib: pip install 'yolo-cl[plot]'") from None


def _pyplot():
    require()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> None:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    write_file(path, buf.getvalue(), "figure")


def bench_figure(path, report) -> None:
    """Per-launch device time as bars coloured by algorithm, and a roofline of the layers: each node's
    FLOPs per byte it must move (inputs, weights, output) against its achieved GFLOP/s, under the
    device's measured FMA peak and copy bandwidth. ``report``: a ``yolo_cl.bench.BenchReport``."""
    plt = _pyplot()
    launches = report.launches
    algo = [str(l.config.get("algo") or l.name) if l.config else l.name for l in launches]
    fig, (bars, roof) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [2.2, 1]})
    kinds = list(dict.fromkeys(algo))
    colours = {a: plt.cm.tab10(i % 10) for i, a in enumerate(kinds)}
    xs = range(len(launches))
    bars.bar(xs, [l.ms for l in launches], color=[colours[a] for a in algo])
    bars.set_xticks(list(xs))
    bars.set_xticklabels([l.node for l in launches], rotation=90, fontsize=6)
    title = f"{report.model} {report.size[0]}x{report.size[1]} b{report.batch} {report.precision} on {report.device}"
    bars.set(ylabel="device time (ms)", xlabel="layer",
             title=f"{title}: {sum(l.ms for l in launches):.2f} ms in {len(launches)} launches")
    bars.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colours[a]) for a in kinds], labels=kinds, fontsize=7)
    nodes: dict = {}
    for l, a in zip(launches, algo):           # a node's launches (e.g. Winograd's three) count together
        n = nodes.setdefault(l.node, {"ms": 0.0, "flops": 0, "bytes": l.bytes, "algo": a, "top": -1})
        n["ms"] += l.ms
        n["flops"] += l.flops
        if l.flops > n["top"]:                 # coloured by the launch that does the arithmetic
            n["top"], n["algo"] = l.flops, a
    pts = [n for n in nodes.values() if n["flops"] > 0 and n["bytes"] > 0 and n["ms"] > 0]
    if pts:
        ai = [n["flops"] / n["bytes"] for n in pts]
        perf = [n["flops"] / (n["ms"] * 1e6) for n in pts]
        roof.scatter(ai, perf, c=[colours[n["algo"]] for n in pts], s=18)
        lo, hi = min(ai) / 2, max(ai) * 2
        grid = [lo * (hi / lo) ** (i / 100) for i in range(101)]
        if report.bandwidth:
            roof.plot(grid, [min(report.peak, report.bandwidth * x) for x in grid], "k-", lw=1,
                      label=f"peak {report.peak:.0f} GFLOP/s, {report.bandwidth:.0f} GB/s")
        else:
            roof.axhline(report.peak, color="k", lw=1, label=f"peak {report.peak:.0f} GFLOP/s")
        roof.set(xscale="log", yscale="log", xlabel="FLOPs per byte moved", ylabel="GFLOP/s",
                 title="roofline (direct-convolution FLOPs)")
        roof.legend(fontsize=7)
    _save(fig, Path(path))


def recorded_bests(path) -> dict:
    """``{shape key: best ms}`` of the full traversals in a ``tools/tune_eval.py`` recording (.json or .json.gz)."""
    import gzip
    import json
    try:
        raw = Path(path).read_bytes()
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        return {s["key"]: float(s["full_ms"]) for shapes in data["models"].values() for s in shapes
                if s.get("full_ms") is not None}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise YoloClError(f"{path}: not a tune_eval recording ({e})") from None


def tune_figure(path, results: list, traversal: Optional[dict] = None) -> None:
    """One panel per tuned shape: every timed candidate in the order the search timed it, the best so
    far, and, where ``traversal`` (shape key -> best ms of a full traversal) has the shape, its best."""
    plt = _pyplot()
    n = max(1, len(results))
    cols = min(4, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, r in zip(axes.flat, results):
        times = list(r.times.values())
        best = [min(times[:i + 1]) for i in range(len(times))]
        ax.plot(range(1, len(times) + 1), times, ".", ms=3, alpha=0.5, label="timed")
        ax.plot(range(1, len(best) + 1), best, "-", lw=1.2, label="best so far")
        if traversal and r.key in traversal:
            ax.axhline(traversal[r.key], color="k", ls="--", lw=1, label="full traversal's best")
        ax.set_title(r.key, fontsize=7)
        ax.set(xlabel=f"candidates timed ({r.timed} of {r.candidates})", ylabel="ms")
        if times and max(times) > 20 * min(times):
            ax.set_yscale("log")
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(results):]:
        ax.set_visible(False)
    _save(fig, Path(path))


def pr_figures(folder, result) -> list:
    """One precision-recall PNG per class with objects or detections (``yolo-cl map --plot``)."""
    plt = _pyplot()
    folder = Path(folder)
    written = []
    for c in result.classes:
        if c.objects == 0 and len(c.recall) == 0:
            continue
        fig, ax = plt.subplots(figsize=(5, 4), dpi=100)
        ax.plot(c.recall, c.precision, drawstyle="steps-post")
        ax.set(xlim=(0, 1.02), ylim=(0, 1.02), xlabel="recall", ylabel="precision",
               title=f"{c.name}: AP {c.ap * 100:.2f}% (IoU {result.iou_thresh:.2f}, {c.objects} objects)")
        ax.grid(alpha=0.3)
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", c.name)[:60] or "class"
        out = folder / f"pr_{c.class_id:03d}_{safe}.png"
        _save(fig, out)
        written.append(out)
    return written
