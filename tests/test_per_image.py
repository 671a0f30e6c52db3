"""Issue 14: a batch's first and last layers run image by image (per_image.py), so each image's
upload and head read overlap the other images' compute, and give exactly what the batch-wide plan
gives: from the caller's array, from a pinned one (one DMA per image, the first span waiting for
each), passes in flight, fp32 and half storage, one end or both.

PoCL has no copy queue by default: ``YOLO_CL_COPY_QUEUE=1`` makes one, as on a GPU.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from yolo_cl import Detector, per_image
from yolo_cl import executor as executor_mod
from yolo_cl.executor import Executor
from yolo_cl.graph import reads, writes
from yolo_cl.limits import LimitError
from yolo_cl.model import load_model
from yolo_cl.planner import plan_memory

ROOT = Path(__file__).resolve().parents[1]
SIZE = 96
BATCH = 3
MIN_BYTES = per_image.TAIL_MIN_BYTES


pytestmark = pytest.mark.usefixtures("launch_list_plans")      # see conftest.py


@pytest.fixture(autouse=True)
def small_heads_split(monkeypatch):
    """These small batches' heads are far under the last span's threshold: split them anyway."""
    monkeypatch.setattr(per_image, "TAIL_MIN_BYTES", 0)


@pytest.fixture(scope="module")
def det():
    mp = pytest.MonkeyPatch()
    mp.setenv("YOLO_CL_COPY_QUEUE", "1")
    try:
        yield {p: Detector("yolov3-tiny", input_size=SIZE, precision=p) for p in ("fp32", "fp16")}
    finally:
        mp.undo()


def blobs(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [rng.random((BATCH, 3, SIZE, SIZE), dtype=np.float32) for _ in range(n)]


def pair(d: Detector, asked=True) -> tuple:
    """(executor splitting its ends as ``asked``, batch-wide executor) of one graph."""
    graph, prec = d.executor(BATCH, (SIZE, SIZE)).graph, d.precision
    return (Executor(d.runtime, graph, BATCH, prec, per_image=asked),
            Executor(d.runtime, graph, BATCH, prec, per_image=False))


def same(got: list, want: list) -> bool:
    return len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_per_image_ends_equal_the_batch_plan(det, precision):
    split, plain = pair(det[precision])
    assert det[precision].runtime.copy_queue is not None and plain.split is None
    s = split.split
    assert s is not None and s.first_groups and s.last_start < len(split.launches)
    # the first span's launches once per image, the last's once per group, the middle's once
    assert [c for _, c in s.first_groups] == [1] * BATCH and sum(c for _, c in s.last_groups) == BATCH
    assert split.launches_per_frame == s.first_end * BATCH + (len(split.launches) - s.last_start) * \
        len(s.last_groups) + s.last_start - s.first_end > len(split.launches)
    pinned = split.input_array()
    for blob in blobs(3, 1):
        want = [w.copy() for w in plain.run(blob)]
        assert same(split.run(blob), want)               # pageable: one upload, the spans per image
        pinned[...] = blob
        assert same(split.run(pinned), want)             # one DMA per image, each image's span after it
    assert same(split.run(blobs(1, 1)[0], profile=True), plain.run(blobs(1, 1)[0]))   # the batch-wide launches


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_per_image_passes_in_flight_equal_one_at_a_time(det, precision):
    split, plain = pair(det[precision])
    frames = blobs(5, 2)
    want = [[w.copy() for w in plain.run(b)] for b in frames]
    got = []
    for i, b in enumerate(frames):                        # two slots: a pass runs while the next is enqueued
        split.submit(b, slot=i % 2)
        if i:
            got.append([g.copy() for g in split.collect((i - 1) % 2)])
    got.append(split.collect((len(frames) - 1) % 2))
    assert all(same(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("ends", ["first", "last"])
def test_one_end_per_image(det, monkeypatch, ends):
    monkeypatch.setenv(per_image.ENV, ends)
    assert per_image.ends_wanted(None) == per_image.ends_wanted(ends) == (ends == "first", ends == "last")
    split, plain = pair(det["fp16"], None)
    s = split.split
    assert s is not None and bool(s.first_groups) == (ends == "first")
    assert (s.last_start < len(split.launches)) == (ends == "last")
    pinned = split.input_array()
    for blob in blobs(2, 3):
        pinned[...] = blob
        assert same(split.run(pinned), [w.copy() for w in plain.run(blob)])


def test_variable_turns_it_off(det, monkeypatch):
    monkeypatch.setenv(per_image.ENV, "0")
    assert pair(det["fp32"], None)[0].split is None


def test_spans_are_the_full_resolution_layers_and_the_last_heads_branch():
    g = load_model("yolov3-tiny", None, 416, params="none").graph
    spans = per_image.spans(g, True, BATCH)
    (a, b), (c, d) = spans
    area = g.input.h * g.input.w
    assert a == 0 and b >= 1 and all(v.h * v.w == area for n in g.nodes[:b + 1] for v in n.inputs)
    assert g.nodes[b + 1].inputs[0].h * g.nodes[b + 1].inputs[0].w < area
    done = sorted(max(i for i, n in enumerate(g.nodes) if n.output.tensor is v.tensor) for v in g.outputs)
    assert c == done[-2] + 1 and d == len(g.nodes) - 1 == done[-1]
    # what a span touches lives over the whole span: no two such tensors share memory
    plan = plan_memory(g, BATCH, True, True, (), spans)
    for lo, hi in spans:
        touched = {v.tensor.id: v.tensor for n in g.nodes[lo:hi + 1] for v in (*reads(n), *writes(n))}
        for t in touched:
            assert plan.lifetimes[t][0] <= lo and plan.lifetimes[t][1] >= hi
        places = sorted((plan.offsets[t], plan.offsets[t] + x.size * BATCH) for t, x in touched.items())
        assert all(e <= s for (_, e), (s, _) in zip(places, places[1:]))


def test_the_last_span_needs_heads_worth_hiding(monkeypatch):
    """yolov3 608 batch 8's last head (47 MB of float32) is read per pair of images; yolov3-tiny
    416 batch 4's (2.8 MB) is not worth the launches."""
    monkeypatch.setattr(per_image, "TAIL_MIN_BYTES", MIN_BYTES)
    big = load_model(ROOT / "models" / "cfg" / "yolov3.cfg", None, 608, params="none").graph
    small = load_model("yolov3-tiny", None, 416, params="none").graph
    assert len(per_image.spans(big, True, 8)) == 2 and len(per_image.spans(big, True, 1)) == 1
    assert len(per_image.spans(small, True, 4)) == 1
    monkeypatch.setattr(per_image, "TAIL_MIN_BYTES", 0)
    assert len(per_image.spans(small, True, 3)) == 2
    assert len(per_image.spans(small, True, per_image.LAST_GROUP)) == 1    # one group: nothing to overlap


def test_a_single_head_network_has_no_last_span():
    g = load_model(ROOT / "models" / "cfg" / "efficientnet-lite3.cfg", None, 224, params="none").graph
    assert len(g.outputs) == 1
    assert per_image.last_span(g, True, per_image.first_span(g)) == len(g.nodes)


def test_a_layout_the_image_launches_disagree_on_cancels_the_split(det, monkeypatch):
    real = per_image._signature
    calls = []

    def differs(launches):
        calls.append(1)
        return real(launches) + [len(calls)]       # never equal: every node "binds another layout"
    monkeypatch.setattr(per_image, "_signature", differs)
    split, plain = pair(det["fp32"])
    assert calls and split.split is None
    blob = blobs(1, 4)[0]
    assert same(split.run(blob), [w.copy() for w in plain.run(blob)])


def test_spans_that_do_not_fit_fall_back_to_the_batch_plan(det, monkeypatch):
    """The spans' plan is checked against the memory cap first; refused, the batch-wide plan is
    checked and used."""
    split_once, plain = pair(det["fp32"])
    real = executor_mod.check_executor
    checked = []

    def cap(graph, arena_elems, *rest):
        checked.append(arena_elems)
        if len(checked) == 1:
            raise LimitError("over the cap")
        real(graph, arena_elems, *rest)
    monkeypatch.setattr(executor_mod, "check_executor", cap)
    d = det["fp32"]
    split = Executor(d.runtime, plain.graph, BATCH, d.precision, per_image=True)
    assert checked == [split_once.plan.arena_elems, plain.plan.arena_elems]
    assert split.split is None and split.plan.arena_elems == plain.plan.arena_elems
    blob = blobs(1, 5)[0]
    assert same(split.run(blob), [w.copy() for w in plain.run(blob)])
