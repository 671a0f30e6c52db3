"""tools/retime.py --in-network: each config gated alone, then timed bound into the whole network."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tiny_cfgs import conv, net_header

ROOT = Path(__file__).resolve().parents[1]


def test_in_network_times_each_shape_in_the_bound_plan(tmp_path):
    """Every conv shape of a tiny net (a 3x3, a strided 3x3 that runs as im2col + GEMM, a 1x1) is
    timed in the network for the stored pick and a variant; a variant kept is written as asked."""
    cfg = tmp_path / "tiny.cfg"
    cfg.write_text(net_header(48, 48) + conv(16) + conv(32, stride=2) + conv(18, size=1, bn=0, act="linear"))
    out = tmp_path / "out.yaml"
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "retime.py"), str(cfg), "--size", "48", "--untuned",
                        "--variants", "set:KU=2", "--in-network", "--reps", "3", "--rounds", "1",
                        "--margin", "-1", "--out", str(out)],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "YOLO_CL_CACHE": str(tmp_path / "cache")})
    assert p.returncode == 0, p.stderr[-2000:]
    timed = [l for l in p.stdout.splitlines() if ": stored " in l]
    assert len(timed) == 3 and all(" ms in the network; set:KU=2 " in l for l in timed), p.stdout
    # where the variant was the fastest (by any margin, with -1) its entry is the variant as asked;
    # the lines print 4 decimals, so a tie there may go either way
    written = yaml.safe_load(out.read_text())["records"][0]["configs"] if out.exists() else {}
    assert all(c["KU"] == 2 for c in written.values()), written
    for line in timed:
        key = line.split(": stored ")[0].split(" ", 1)[1]
        stored, variant = float(line.split("stored ")[1].split()[0]), float(line.split("set:KU=2 ")[1])
        assert key in written if variant < stored else (key not in written if variant > stored else True), line
