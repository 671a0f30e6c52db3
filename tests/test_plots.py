"""Plots (``bench --plot``, ``tune --plot``) and the tuning budget bounding a run, as subprocesses."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from yolo_cl.plots import recorded_bests

RECORDINGS = Path(__file__).resolve().parents[1] / "tools" / "recordings"


def _cli(*args, cache: Path):
    env = dict(os.environ, YOLO_CL_CACHE=str(cache))
    return subprocess.run([sys.executable, "-m", "yolo_cl", *map(str, args)], capture_output=True, text=True,
                          timeout=900, env=env)


def test_bench_plot_writes_a_png(tmp_path):
    png = tmp_path / "bench.png"
    r = _cli("bench", "yolov3-tiny", "--size", 64, "--repeat", 2, "--plot", png, cache=tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in r.stdout
    bad = _cli("bench", "yolov3-tiny", "--size", 64, "--plot", tmp_path, cache=tmp_path / "cache")
    assert bad.returncode == 2 and "is a folder" in bad.stderr          # refused before benchmarking


def test_tune_budget_bounds_the_run_and_plots_it(tmp_path):
    """A 5 s budget stops inside the first shape (keeping what it timed) instead of finishing it."""
    png, db = tmp_path / "tune.png", tmp_path / "t.yaml"
    t0 = time.monotonic()
    r = _cli("tune", "yolov3-tiny", "--size", 64, "--budget", 5, "--db", db, "--jobs", 1, "--plot", png,
             cache=tmp_path / "cache")
    spent = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert "tuning budget of 5 s spent" in r.stderr and spent < 240, (spent, r.stderr)
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "tuning: " in r.stderr or "timings" in r.stderr          # progress shows without a terminal


def test_recorded_bests_reads_a_traversal():
    bests = recorded_bests(RECORDINGS / "tune_eval_pocl_yolov3-tiny_416.json.gz")
    assert len(bests) == 12 and all(v > 0 for v in bests.values())
    assert "k3 s1x1 d1 g1 c3 f16 n262144 b1" in bests
