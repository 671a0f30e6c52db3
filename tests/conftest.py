"""Suite-wide setup: the Ctrl-C the SIGINT tests send reaches the processes they start; and the
``launch_list_plans`` fixture the modules that test launch-list features ask for.

A suite run in the background by a shell without job control (``cmd &`` in a script) starts with
SIGINT ignored, and an ignored signal stays ignored across exec: every yolo-cl process a test
started would shrug off the test's Ctrl-C (exit 0 instead of 130, servers that never stop). A
handler does not survive exec, so installing Python's own here gives those processes the default.
"""
import signal

import pytest

signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="module")
def launch_list_plans():
    """Plans enqueued launch by launch in this module: side branches, per-image ends and early
    head reads cut the launch list, and a device that offers command buffers (Debian's PoCL)
    would record the plan whole instead."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("YOLO_CL_COMMAND_BUFFER", "0")
        yield
