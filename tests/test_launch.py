"""The plan's launches enqueued through ctypes without events (engine/launch.py) against pyopencl's enqueue."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyopencl as cl
import pytest

from yolo_cl import Detector, launch
from yolo_cl.executor import Executor
from yolo_cl.precision import FP16, FP32


@pytest.fixture(scope="module")
def tiny():
    return Detector("yolov3-tiny", input_size=96)


@pytest.mark.parametrize("precision", [FP32, FP16], ids=["fp32", "fp16"])
def test_ctypes_launches_give_pyopencl_launches_outputs(tiny, precision, monkeypatch):
    """run, submit/collect (fp16: heads converted and read between the launches, so the launch
    list is enqueued in spans) and flushing every few launches: bit-equal to pyopencl's enqueue."""
    graph = tiny.graph_for((96, 96))
    ours = Executor(tiny.runtime, graph, 2, precision, tiny.tuning, command_buffer=False)
    monkeypatch.setenv("YOLO_CL_LAUNCH", "pyopencl")
    theirs = Executor(tiny.runtime, graph, 2, precision, tiny.tuning, command_buffer=False)
    assert (ours.launch_way, theirs.launch_way) == ("ctypes", "pyopencl")
    rng = np.random.default_rng(1)
    for flush in (0, 3):
        ours.flush_every = theirs.flush_every = flush
        for _ in range(2):
            blob = rng.random((2, 3, 96, 96), dtype=np.float32)
            want = [a.copy() for a in theirs.run(blob)]
            for a, b in zip(ours.run(blob), want):
                np.testing.assert_array_equal(a, b)
            ours.submit(blob, 1)
            for a, b in zip(ours.collect(1), want):
                np.testing.assert_array_equal(a, b)


def test_a_refused_launch_raises_pyopencls_error(tiny):
    """A launch the driver refuses (a work-group larger than the device allows) raises the error
    pyopencl raises for it, not a silent skip."""
    rt = tiny.runtime
    prg = cl.Program(rt.context, "__kernel void k(__global float* a) { a[get_global_id(0)] = 1.0f; }").build()
    k = cl.Kernel(prg, "k")
    buf = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE, 4 * 1024 * 1024)
    k.set_args(buf)
    too_big = rt.device.max_work_group_size * 2
    good = SimpleNamespace(kernel=k, gsize=(64,), lsize=None)
    bad = SimpleNamespace(kernel=k, gsize=(too_big,), lsize=(too_big,))
    launches = launch.LaunchList(rt.queue, [good, bad, good])
    assert len(launches) == 3
    launches.enqueue(0, 1)
    with pytest.raises(cl.Error, match="WORK_GROUP_SIZE|WORK_ITEM_SIZE"):
        launches.enqueue()
    rt.queue.finish()
