"""Replaying the plan through cl_khr_command_buffer (engine/cmdbuf.py) against the launch list.

The pip PoCL that CI uses does not list the extension; Debian's PoCL (pocl-opencl-icd, 3.1 and
later) does, so the replay tests run where such a device is visible and are skipped elsewhere.
"""
from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from yolo_cl import cmdbuf
from yolo_cl.precision import FP32
from yolo_cl.detector import Detector
from yolo_cl.errors import DeviceError
from yolo_cl.executor import Executor


def _device_with_command_buffers():
    for p in cl.get_platforms():
        for d in p.get_devices():
            if cmdbuf.supported(d):
                return d
    return None


@pytest.fixture(scope="module")
def tiny_default():
    return Detector("yolov3-tiny", input_size=96)


@pytest.fixture(scope="module")
def det_with_command_buffers():
    """yolov3-tiny at 96 on a device listing the extension (skipped where none does)."""
    dev = _device_with_command_buffers()
    if dev is None:
        pytest.skip("no OpenCL device here lists cl_khr_command_buffer (Debian's pocl-opencl-icd does)")
    return Detector("yolov3-tiny", input_size=96, device=dev)


def test_command_buffer_replay_equals_the_launch_list(det_with_command_buffers, monkeypatch):
    det = det_with_command_buffers
    graph = det.graph_for((96, 96))
    with_cb = Executor(det.runtime, graph, 2, FP32, det.tuning, command_buffer=True)
    without = Executor(det.runtime, graph, 2, FP32, det.tuning, command_buffer=False)
    assert with_cb.command_buffer is not None and without.command_buffer is None
    assert with_cb.command_buffer.commands == len(with_cb.launches)
    rng = np.random.default_rng(0)
    for _ in range(3):                     # new inputs each frame: the replay reads the arena afresh
        blob = rng.random((2, 3, 96, 96), dtype=np.float32)
        for a, b in zip(with_cb.run(blob), without.run(blob)):
            np.testing.assert_array_equal(a, b)
    assert Executor(det.runtime, graph, 1, FP32, det.tuning).command_buffer is not None   # auto: used
    monkeypatch.setenv("YOLO_CL_COMMAND_BUFFER", "0")
    assert Executor(det.runtime, graph, 1, FP32, det.tuning).command_buffer is None


def test_a_device_without_the_extension_replays_the_launch_list(tiny_default, monkeypatch):
    monkeypatch.setattr(cmdbuf, "supported", lambda device: False)
    graph = tiny_default.graph_for((96, 96))
    ex = Executor(tiny_default.runtime, graph, 1, FP32, tiny_default.tuning)
    assert ex.command_buffer is None
    ex.run(np.zeros((1, 3, 96, 96), np.float32))
    with pytest.raises(DeviceError, match="cl_khr_command_buffer"):
        Executor(tiny_default.runtime, graph, 1, FP32, tiny_default.tuning, command_buffer=True)


def test_a_pass_enqueued_while_the_last_replay_is_pending_takes_the_launch_list(det_with_command_buffers):
    """Frames in flight enqueue a pass while the last one still runs; a buffer recorded without
    the simultaneous-use flag may not be replayed then (PoCL 3.1: CL_INVALID_OPERATION), so that
    pass goes launch by launch, and both passes compute what the launch list computes."""
    det = det_with_command_buffers
    graph = det.graph_for((96, 96))
    ex = Executor(det.runtime, graph, 1, FP32, det.tuning, command_buffer=True)
    ref = Executor(det.runtime, graph, 1, FP32, det.tuning, command_buffer=False)
    blob = np.random.default_rng(1).random((1, 3, 96, 96), dtype=np.float32)
    want = ref.run(blob)
    ex.run(blob)                                     # the input in the arena; the replay over
    q = det.runtime.queue
    gate = cl.UserEvent(det.runtime.context)
    cl.enqueue_marker(q, wait_for=[gate])            # holds the queue until the gate opens
    assert not ex.command_buffer.pending()
    ex.enqueue()                                     # replayed, and pending behind the gate
    assert ex.command_buffer.pending()
    launched = []
    real = ex._launch_list.enqueue
    ex._launch_list.enqueue = lambda *a: launched.append(a) or real(*a)
    ex.enqueue()                                     # pending: the launch list instead, no error
    assert launched
    gate.set_status(cl.command_execution_status.COMPLETE)
    q.finish()
    assert not ex.command_buffer.pending()
    launched.clear()
    for a, b in zip(ex.run(blob), want):             # and replays again once the last is over
        np.testing.assert_array_equal(a, b)
    assert not launched
