"""Side branches (issues 14, 17): the layers only one head needs, on a second queue
(``YOLO_CL_BRANCHES=1``; off by default).

``branches.side_branches`` finds them from the graph alone; the planner keeps what they touch
apart from what runs beside them; the executor forks them onto a queue of their own and joins
it after the plan. The outputs must be those of the one-queue plan, bit for bit, whichever
queue finishes first (PoCL runs two queues' kernels at once on its threads).
"""
from __future__ import annotations

import numpy as np
import pytest

from tiny_cfgs import conv, net_header, route, yolo
from tiny_graphs import graph_of, write_model
from yolo_cl import Detector, branches
from yolo_cl.executor import Executor
from yolo_cl.planner import lifetimes, plan_memory

SIZE = 128


pytestmark = pytest.mark.usefixtures("launch_list_plans")      # see conftest.py


# Two heads; the first head's 3x3 conv (layer 1) is also routed into the second head, so the
# first head's branch is only its 1x1 conv (layer 2).
HEAD = conv(18, 1, bn=0, act="linear") + yolo([0, 1, 2], 1, num=3, anchors="10,14, 23,27, 37,58")
SHARED_HEAD = net_header(64, 64) + conv(16, stride=2) + conv(32) + HEAD + route(-3) + HEAD


def labels(graph, branch) -> list:
    return sorted(graph.nodes[i].label for i in branch.nodes)


def test_yolov3_tiny_runs_its_13x13_head_beside_the_26x26_scale():
    det = Detector("yolov3-tiny", input_size=SIZE)
    g = det.executor(1).graph
    found = branches.side_branches(g)
    assert [labels(g, b) for b in found] == [["14", "15"]]
    assert g.nodes[found[0].fork].label == "14"


def test_yolov3_runs_two_heads_beside_the_rest():
    g = graph_of("models/cfg/yolov3.cfg")
    found = branches.side_branches(g)
    assert [labels(g, b) for b in found] == [["80", "81"], ["92", "93"]]


def test_a_branch_stops_where_the_rest_reads_its_tensors(tmp_path):
    """The first head's 3x3 conv is routed into the second scale: only the 1x1 head conv runs beside."""
    cfg, _ = write_model(str(tmp_path), "shared", SHARED_HEAD, 1)
    g = graph_of(cfg)
    assert [labels(g, b) for b in branches.side_branches(g)] == [["2"]]


def test_no_branch_where_one_head_or_none():
    g = graph_of("models/yolov3-tiny.cfg")
    last_head_only = type(g)(g.net, g.layers, g.nodes, g.input, g.outputs[-1:], g.heads[-1:], g.tensors, g.kept)
    assert branches.side_branches(last_head_only) == []


def test_the_plan_keeps_branch_tensors_apart_from_what_runs_beside_them():
    g = graph_of("models/cfg/yolov3.cfg")
    found = branches.side_branches(g)
    plan = plan_memory(g, 1, True, True, found)
    sizes = {t.id: t.size for t in g.tensors}
    life = plan.lifetimes
    for b in found:
        reads, writes = b.reads_writes(g, True, True)
        mine = reads | writes
        beside = set()
        for i in range(b.fork + 1, len(g.nodes)):
            if i not in b.nodes:
                r, w = branches._touches(g.nodes[i], True, True)
                beside |= r | w
        for t in mine:
            assert life[t][1] == len(g.nodes)
            for u in beside - mine:
                a0, b0 = plan.offsets[t], plan.offsets[u]
                assert a0 + sizes[t] <= b0 or b0 + sizes[u] <= a0, (t, u)
    # without branches the same graph does share those places: the lifetimes are what keeps them apart
    assert lifetimes(g) != lifetimes(g, branches=found)


@pytest.fixture(scope="module", params=["fp32", "fp16"])
def det(request):
    return Detector("yolov3-tiny", input_size=SIZE, precision=request.param)


def executors(det, batch: int) -> tuple:
    g = det.executor(batch).graph
    one = Executor(det.runtime, g, batch, det.precision, det.tuning, branches=False)
    two = Executor(det.runtime, g, batch, det.precision, det.tuning, branches=True)
    assert not one.branches and two.branches
    return one, two


@pytest.mark.parametrize("batch", [1, 2])
def test_two_queues_give_the_one_queue_outputs(det, batch):
    one, two = executors(det, batch)
    rng = np.random.default_rng(batch)
    for _ in range(4):
        x = rng.random((batch, 3, SIZE, SIZE), dtype=np.float32)
        want = [o.copy() for o in one.run(x)]
        got = two.run(x)
        assert all(np.array_equal(a, b) for a, b in zip(want, got))


def test_frames_in_flight_on_two_queues(det):
    one, two = executors(det, 1)
    rng = np.random.default_rng(7)
    xs = [rng.random((1, 3, SIZE, SIZE), dtype=np.float32) for _ in range(6)]
    want = [[o.copy() for o in one.run(x)] for x in xs]
    for k in range(0, len(xs), 3):
        for s in range(3):
            two.submit(xs[k + s], s)
        for s in range(3):
            got = two.collect(s)
            assert all(np.array_equal(a, b) for a, b in zip(want[k + s], got))


def test_pyopencl_launches_fork_and_join_too(det, monkeypatch):
    monkeypatch.setenv("YOLO_CL_LAUNCH", "pyopencl")
    one, two = executors(det, 1)
    assert two.launch_way == "pyopencl"
    x = np.random.default_rng(3).random((1, 3, SIZE, SIZE), dtype=np.float32)
    want = [o.copy() for o in one.run(x)]
    assert all(np.array_equal(a, b) for a, b in zip(want, two.run(x)))


def test_the_device_path_detects_the_same_on_two_queues():
    import cv2
    img = cv2.imread("models/images/dog.jpg")
    found = []
    for on in (False, True):
        d = Detector("yolov3-tiny", input_size=SIZE, device_preprocess=True, device_decode=True, branches=on)
        assert bool(d.executor(1).branches) == on
        found.append([(x.class_id, round(x.confidence, 6), tuple(round(v, 3) for v in x.box)) for x in d.detect(img)])
    assert found[0] and found[0] == found[1]


def test_one_queue_unless_asked(monkeypatch):
    monkeypatch.delenv(branches.ENV, raising=False)
    assert not branches.wanted() and branches.wanted(True)
    monkeypatch.setenv(branches.ENV, "1")
    assert branches.wanted() and not branches.wanted(False)
    monkeypatch.setenv(branches.ENV, "0")
    assert not branches.wanted()
    monkeypatch.delenv(branches.ENV)
    assert not Detector("yolov3-tiny", input_size=SIZE).executor(1).branches
