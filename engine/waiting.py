"""Waiting for the device without holding a host core the whole time.

A thread in ``clWaitForEvents`` on NVIDIA's OpenCL driver stays busy until the event completes:
in process, ``detect_batch`` on an H100 used as much CPU time as wall time (1.4 ms of each per
image, BENCHMARKS.md, "Tenth GPU session"). One process per GPU can afford that; a host serving
several GPUs or running several server workers per GPU spends those cores on waiting while the
JPEG decodes and the HTTP wait for a core. ``Waiter`` sleeps through most of a wait it can
predict, a share of the recent short waits of the same executor, then looks at the event every
tenth of the prediction until it is over, so no core spins in the driver for long. Waits
predicted shorter than ``floor_s`` are left to the driver: there a late wake-up would cost more
latency than the spin costs CPU.

The prediction follows the short end of what was seen: a shorter wait replaces it at once, a
longer one moves it up by an eighth of the difference, and a wait found already over on waking
(the sleep may have been too long) shrinks it.

``YOLO_CL_WAIT=callback`` instead asks the driver to call back when the event completes
(``clSetEventCallback``) and blocks on a ``threading.Event`` until then: no prediction and no
polling, but the wake-up costs whatever the driver's callback delivery costs (on NVIDIA as much
CPU as the spin, and a slower wake-up). ``YOLO_CL_WAIT=driver``, the default, leaves every wait
to the driver; ``serve --workers N`` (N > 1) asks for ``sleep`` (``workers.worker_environment``),
where it cut the server's CPU by 40% on two H100s at the same throughput.
"""
from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Callable

WAIT_ENV = "YOLO_CL_WAIT"        # "driver" (default), "sleep" or "callback"
MODES = ("driver", "sleep", "callback")
FLOOR_S = 0.002                  # shorter predicted waits are left to the driver alone
SHARE = 0.8                      # the part of the predicted wait slept through
RISE = 0.125                     # how far a longer wait moves the prediction up
SHRINK = 0.8                     # the prediction after a wait found over on waking
STEP = 0.1                       # after the first sleep, look again every this share of the prediction


def wanted() -> str:
    """The wait mode ``YOLO_CL_WAIT`` asks for (one of ``MODES``; unknown values: the driver's)."""
    mode = os.environ.get(WAIT_ENV, "").strip().lower()
    return mode if mode in MODES else "driver"


def _settled(event) -> bool:
    """Whether ``event`` is over: complete, or failed (a negative status)."""
    import pyopencl as cl
    return event.command_execution_status <= cl.command_execution_status.COMPLETE


def _on_complete(event, fn: Callable[[], None]) -> None:
    """Have the driver call ``fn`` once ``event`` completes (or fails)."""
    import pyopencl as cl
    event.set_callback(cl.command_execution_status.COMPLETE, lambda status: fn())


class Waiter:
    """Waits for OpenCL events, each keyed by what it waits for (an executor). Mode ``sleep``:
    when the wait predicted for that key is long enough, sleeping through ``share`` of it, then
    looking every ``STEP`` of it until the event is over, before the driver's wait. Mode
    ``callback``: blocking until the driver's completion callback. Mode ``driver``: the driver's
    wait alone."""

    def __init__(self, mode: str = "driver", floor_s: float = FLOOR_S, share: float = SHARE,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 settled: Callable[[object], bool] = _settled,
                 on_complete: Callable[[object, Callable[[], None]], None] = _on_complete) -> None:
        if mode not in MODES:
            raise ValueError(f"wait mode {mode!r}: expected one of {', '.join(MODES)}")
        self.mode, self.floor_s, self.share = mode, floor_s, share
        self._clock, self._sleep, self._settled, self._on_complete = clock, sleep, settled, on_complete
        self._predicted: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.waits = 0                   # waits asked of this waiter (for tests and benchmarks)
        self.slept = 0                   # waits that began with a sleep
        self.called_back = 0             # waits ended by the driver's callback (not over when asked)

    def predicted(self, key) -> float:
        """The wait predicted for ``key`` in seconds (0 before the first; always 0 in ``driver`` mode,
        which predicts nothing)."""
        return self._predicted.get(key, 0.0)

    def wait(self, event, key, since: float) -> None:
        """Return once ``event`` is complete; ``since`` is when its work was enqueued (``clock``)."""
        self.waits += 1
        if self.mode == "driver":       # nothing to predict: the wait is a synchronous detect's last step
            event.wait()
            return
        if self.mode == "callback":
            self._wait_for_callback(event)
            return
        guess = self._predicted.get(key)
        if guess is not None and guess >= self.floor_s:
            left = since + self.share * guess - self._clock()
            if left > 0:
                self.slept += 1
                self._sleep(left)
                if self._settled(event):         # over already: the prediction may be long
                    self._predicted[key] = guess * SHRINK
                    event.wait()                 # raises if the work failed
                    return
            while not self._settled(event):
                self._sleep(STEP * guess)
        event.wait()
        took = self._clock() - since
        self._predicted[key] = took if guess is None or took < guess else guess + RISE * (took - guess)

    def _wait_for_callback(self, event) -> None:
        """Block until the driver calls back that ``event`` is over; a callback that never comes
        (a driver that drops it) only costs a look at the event every 50 ms."""
        if not self._settled(event):
            done = threading.Event()
            self._on_complete(event, done.set)
            while not done.wait(0.05) and not self._settled(event):
                pass
            self.called_back += done.is_set()
        event.wait()
