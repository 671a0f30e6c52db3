"""The outside suite (tools/outside_suite.py over tests/outside/): Darknet data nobody here wrote."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import outside_suite  # noqa: E402


def test_outside_cases():
    results = {r.name: r for r in outside_suite.run_suite()}
    assert len(results) == len(json.loads(outside_suite.DEFAULT_CASES.read_text())["cases"])
    assert results["darknet-yolov2/region"].status == "PASS", results["darknet-yolov2/region"].why
    assert results["darknet-yolov2/reorg"].status == "PASS", results["darknet-yolov2/reorg"].why
    for name, r in results.items():
        assert r.status in ("PASS", "SHAPE"), (name, r.status, r.why)


def test_the_suite_fails_on_a_wrong_expectation(tmp_path):
    """Flip one expected value and one expected shape: both cases must FAIL (and the tool exit 1)."""
    src = ROOT / "tests" / "outside"
    dst = tmp_path / "outside"
    shutil.copytree(src, dst)
    ref = np.fromfile(dst / "darknet_yolov2" / "reorg_ref.data", "<f4")
    ref[12345] += 1e-3
    ref.tofile(dst / "darknet_yolov2" / "reorg_ref.data")
    spec = json.loads((dst / "cases.json").read_text())
    spec["cases"] = [c for c in spec["cases"] if c["name"] in ("darknet-yolov2/reorg", "opencv/upsample")]
    spec["cases"][1]["expected_shape"] = [2, 3, 8, 11]
    (dst / "cases.json").write_text(json.dumps(spec))
    results = outside_suite.run_suite(dst / "cases.json")
    assert [r.status for r in results] == ["FAIL", "FAIL"]
    assert "max |diff| 0.001" in results[0].why and "expected (2, 3, 8, 11)" in results[1].why
    assert outside_suite.main(["--cases", str(dst / "cases.json")]) == 1
