"""Ctrl-C (or SIGTERM) a running yolo-cl process once it has made some progress (the stop tests' one step)."""
from __future__ import annotations

import signal
import subprocess
import time
from typing import Callable


def interrupt_when(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float = 120,
                   sig: int = signal.SIGINT):
    """Wait until ``ready()`` (or ``timeout`` seconds), require ``proc`` still running, send it
    ``sig`` (SIGINT) and return its stderr; the process is killed if it outlives the test."""
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if ready():
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        return proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
