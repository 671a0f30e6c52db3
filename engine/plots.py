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


def bench_figure(path, rows: list, peak_gflops: float, bandwidth_gbs: Optional[float], title: str) -> None:
    """Per-launch device time as bars coloured by algorithm, and a roofline of the convolutions.

    ``rows``: dicts with ``label`` (layer), ``algo``, ``ms``, ``flops`` and ``bytes`` (the bytes the
    launch must move at least: inputs, weights, output); launches without FLOPs appear only as bars."""
    plt = _pyplot()
    fig, (bars, roof) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [2.2, 1]})
    algos = list(dict.fromkeys(r["algo"] for r in rows))
    colours = {a: plt.cm.tab10(i % 10) for i, a in enumerate(algos)}
    xs = range(len(rows))
    bars.bar(xs, [r["ms"] for r in rows], color=[colours[r["algo"]] for r in rows])
    bars.set_xticks(list(xs))
    bars.set_xticklabels([r["label"] for r in rows], rotation=90, fontsize=6)
    bars.set(ylabel="device time (ms)", title=f"{title}: {sum(r['ms'] for r in rows):.2f} ms in {len(rows)} launches")
    bars.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colours[a]) for a in algos], labels=algos, fontsize=7)
    pts = [r for r in rows if r["flops"] > 0 and r["bytes"] > 0 and r["ms"] > 0]
    if pts:
        ai = [r["flops"] / r["bytes"] for r in pts]
        perf = [r["flops"] / (r["ms"] * 1e6) for r in pts]
        lo, hi = min(ai + [0.1]) / 2, max(ai + [100.0]) * 2
        roof.scatter(ai, perf, c=[colours[r["algo"]] for r in pts], s=18)
        grid = [lo * (hi / lo) ** (i / 100) for i in range(101)]
        if bandwidth_gbs:
            roof.plot(grid, [min(peak_gflops, bandwidth_gbs * x) for x in grid], "k-", lw=1,
                      label=f"peak {peak_gflops:.0f} GFLOP/s, {bandwidth_gbs:.0f} GB/s")
        else:
            roof.axhline(peak_gflops, color="k", lw=1, label=f"peak {peak_gflops:.0f} GFLOP/s")
        roof.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)", ylabel="GFLOP/s",
                 title="roofline (direct-convolution FLOPs)")
        roof.legend(fontsize=7)
    _save(fig, Path(path))


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
