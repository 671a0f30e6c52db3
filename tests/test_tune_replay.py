"""The guided search against recorded full traversals (tools/recordings): a change to the search
that loses the target -- within 5% of the traversal's best network time, timing at most a
quarter of the candidates -- fails here, on any machine, without a GPU."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
sys.path.insert(0, str(TOOLS))

import tune_eval  # noqa: E402
import tune_eval_gpus  # noqa: E402


@pytest.mark.parametrize("recording", ["tune_eval_h200_yolov3-tiny_416.json.gz", "tune_eval_pocl_yolov4_256.json.gz"])
def test_search_replayed_on_a_traversal_meets_the_target(recording, tmp_path):
    out = tmp_path / "replay.json"
    assert tune_eval.replay(tune_eval.read_json(str(TOOLS / "recordings" / recording)),
                            types.SimpleNamespace(device=None, out=str(out))) == 0
    rows = next(iter(json.loads(out.read_text())["models"].values()))
    assert rows
    for r in rows:
        assert r["search_timed"] <= max(1, int(0.25 * r["candidates"])), r["key"]
    full = sum(r["full_ms"] * r["count"] for r in rows)
    found = sum(r["search_ms"] * r["count"] for r in rows)
    assert found <= 1.05 * full, (found, full)
    assert sum(r["ratio"] <= 1.05 for r in rows) >= 0.9 * len(rows)


def test_shapes_are_dealt_to_gpus_by_size():
    sizes = {0: 5, 1: 4, 2: 3, 3: 3, 4: 1, 5: 2}
    bins = tune_eval_gpus.deal(sizes, 3)
    assert sorted(i for b in bins for i in b) == sorted(sizes)
    loads = [sum(sizes[i] for i in b) for b in bins]
    assert max(loads) - min(loads) <= 1, loads
