"""tools/plan_list.py: a GPU's plan bound here, from that GPU's tuning records (emulated families)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_h200_plan_of_the_bundled_model_is_listed_from_its_records():
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "plan_list.py"), "yolov3-tiny", "--size", "416"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert "with NVIDIA H200's records" in lines[0] and "tensor cores: f16" in lines[0]
    n = int(lines[0].rsplit(":", 1)[1].split()[0])
    listed = [l for l in lines[1:] if l[:4].strip().isdigit()]
    assert len(listed) == n > 0
    convs = [l for l in listed if " gemm_" in l]       # the GEMM launches (not their transposes or sums)
    # the records bound most convs (a stored config names its family), the rest are marked
    assert sum("(heuristic)" not in l for l in convs) > len(convs) // 2
    assert all("family=" in l for l in convs)
    assert lines[-1].startswith("by kind: ") and "gemm_mma" in lines[-1]
