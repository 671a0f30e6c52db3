"""``waiting.Waiter``: sleeping through most of a predictable device wait (``YOLO_CL_WAIT=sleep``),
or blocking until the driver's completion callback (``YOLO_CL_WAIT=callback``).

The prediction, the sleeps and the callback's hand-off are checked on a fake clock and fake
events; then the real network on the device path with each mode gives the same detections as
the driver's wait, and its waits did sleep / were called back.
"""
from __future__ import annotations

from pathlib import Path

import cv2
import pytest

from yolo_cl import Detector
from yolo_cl.waiting import RISE, SHRINK, STEP, Waiter, wanted

from boxes import same_detections

ROOT = Path(__file__).resolve().parents[1]
IMAGES = sorted((ROOT.parent / "shared" / "images").glob("*.jpg")) or sorted((ROOT / "models" / "images").glob("*.jpg"))


class Clock:
    """A clock the fake events and sleeps move forward."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


class Event:
    """Completes ``at`` on ``clock``; ``wait`` moves the clock there if it is not yet."""

    def __init__(self, clock: Clock, at: float) -> None:
        self.clock, self.at, self.waited = clock, at, 0

    def wait(self) -> None:
        self.waited += 1
        self.clock.now = max(self.clock.now, self.at)


class Key:
    """A weak-referenceable stand-in for an executor."""


def waiter(clock: Clock, mode: str = "sleep") -> Waiter:
    return Waiter(mode, floor_s=0.002, share=0.8, clock=clock, sleep=clock.sleep,
                  settled=lambda e: clock.now >= e.at - 1e-12)


def test_first_wait_learns_then_sleeps_most_of_the_next_and_looks_in_steps():
    clock, key = Clock(), Key()
    w = waiter(clock)
    since = clock.now
    w.wait(Event(clock, since + 0.010), key, since)
    assert clock.sleeps == [] and w.predicted(key) == pytest.approx(0.010)
    since = clock.now
    ev = Event(clock, since + 0.0095)
    w.wait(ev, key, since)
    # 80% of the prediction, then a tenth of it at a time until the event is over
    assert clock.sleeps == pytest.approx([0.008, STEP * 0.010, STEP * 0.010]) and ev.waited == 1 and w.slept == 1
    assert clock.now == pytest.approx(since + 0.010)


def test_time_already_spent_since_the_enqueue_is_not_slept_again():
    clock, key = Clock(), Key()
    w = waiter(clock)
    w.wait(Event(clock, clock.now + 0.010), key, clock.now)
    since = clock.now
    clock.now += 0.005                                              # the host did other work meanwhile
    w.wait(Event(clock, since + 0.008), key, since)
    assert clock.sleeps == [pytest.approx(0.003)]
    clock.now += 0.1
    since, guess = clock.now - 0.009, w.predicted(key)             # past the share already: steps only
    w.wait(Event(clock, since + 0.0095), key, since)
    assert clock.sleeps[1:] == pytest.approx([STEP * guess]) and w.slept == 1


def test_prediction_follows_the_short_waits():
    clock, key = Clock(), Key()
    w = waiter(clock)
    for took in (0.010, 0.009):
        since = clock.now
        w.wait(Event(clock, since + took), key, since)
    assert w.predicted(key) == pytest.approx(0.009)                 # a shorter wait replaces it at once
    since = clock.now
    w.wait(Event(clock, since + 0.014), key, since)
    took = clock.now - since                                        # the step that saw it over
    assert 0.014 <= took < 0.014 + STEP * 0.009 + 1e-9
    assert w.predicted(key) == pytest.approx(0.009 + RISE * (took - 0.009))   # a longer one moves it up slowly


def test_a_wait_over_on_waking_shrinks_the_prediction():
    clock, key = Clock(), Key()
    w = waiter(clock)
    since = clock.now
    w.wait(Event(clock, since + 0.010), key, since)
    since = clock.now
    ev = Event(clock, since + 0.004)                                 # the device got faster
    w.wait(ev, key, since)
    assert clock.sleeps == [pytest.approx(0.008)] and ev.waited == 1
    assert w.predicted(key) == pytest.approx(0.010 * SHRINK)


def test_short_waits_unknown_keys_and_a_disabled_waiter_never_sleep():
    clock, key = Clock(), Key()
    w = waiter(clock)
    for _ in range(3):                                               # under the 2 ms floor
        since = clock.now
        w.wait(Event(clock, since + 0.001), key, since)
    since = clock.now
    w.wait(Event(clock, since + 0.010), Key(), since)                # a key seen for the first time
    off = waiter(clock, mode="driver")
    for _ in range(3):
        since = clock.now
        off.wait(Event(clock, since + 0.010), key, since)
    assert clock.sleeps == [] and w.slept == off.slept == 0
    assert off.waits == 3 and off.predicted(key) == 0.0     # the driver's mode predicts nothing


def test_callback_mode_blocks_until_the_driver_calls_back():
    """The waiting thread blocks on the callback, which a driver thread delivers later; an event
    over before the wait asks for no callback; a callback that never comes still ends the wait."""
    import threading
    asked: list = []

    class Real:
        def __init__(self) -> None:
            self.over, self.waited = False, 0

        def wait(self) -> None:
            self.waited += 1

    def later(event, fn) -> None:            # the driver: completes the event on another thread
        asked.append(event)

        def fire() -> None:
            event.over = True
            fn()
        threading.Timer(0.02, fire).start()

    w = Waiter("callback", settled=lambda e: e.over, on_complete=later)
    ev = Real()
    w.wait(ev, Key(), 0.0)
    assert ev.over and ev.waited == 1 and asked == [ev] and w.called_back == 1
    done = Real()
    done.over = True
    w.wait(done, Key(), 0.0)
    assert asked == [ev] and done.waited == 1 and w.called_back == 1
    silent = Real()
    threading.Timer(0.08, lambda: setattr(silent, "over", True)).start()
    Waiter("callback", settled=lambda e: e.over, on_complete=lambda e, fn: None).wait(silent, Key(), 0.0)
    assert silent.over and silent.waited == 1


def test_callback_mode_with_the_real_driver():
    """The driver's own completion callback (clSetEventCallback) ends a wait on an event that
    completes later: a user event, completed by another thread 20 ms after the wait began (the
    waiter looks at the event itself only every 50 ms)."""
    import threading
    from yolo_cl.runtime import Runtime
    rt = Runtime()
    ev = rt.cl.UserEvent(rt.context)
    w = Waiter("callback")
    threading.Timer(0.02, lambda: ev.set_status(rt.cl.command_execution_status.COMPLETE)).start()
    w.wait(ev, Key(), 0.0)
    assert ev.command_execution_status == rt.cl.command_execution_status.COMPLETE
    assert w.waits == 1 and w.called_back == 1


def test_the_mode_comes_from_the_environment(monkeypatch):
    for value, mode in (("sleep", "sleep"), (" Callback ", "callback"), ("driver", "driver"), ("", "driver"),
                        ("spin", "driver")):
        monkeypatch.setenv("YOLO_CL_WAIT", value)
        assert wanted() == mode
    with pytest.raises(ValueError):
        Waiter("spin")


@pytest.mark.parametrize("mode", ["sleep", "callback"])
def test_detect_with_each_wait_mode_gives_the_same_detections(monkeypatch, mode):
    """The real network on the device path: the driver's wait and the mode's give the same
    detections on every shared image, a batch too, and the device path waited through the mode's
    waiter (whether a wait found the work over already depends on the device's speed: on an H100
    the 160x160 network finishes before its last launch is enqueued; the waits themselves are
    tested above, the callback with the real driver)."""
    frames = [cv2.imread(str(p)) for p in IMAGES]
    plain = Detector("yolov3-tiny", input_size=160, device_preprocess=True, device_decode=True)
    monkeypatch.setenv("YOLO_CL_WAIT", mode)
    other = Detector("yolov3-tiny", input_size=160, device_preprocess=True, device_decode=True)
    other._device_path.waiter.floor_s = 0.0          # a GPU's waits at 160 are far under the 2 ms floor
    for _ in range(2):                                               # the second round has predictions
        for img in frames:
            assert same_detections(other.detect(img), plain.detect(img))
        for got, want in zip(other.detect_batch(frames), plain.detect_batch(frames)):
            assert same_detections(got, want)
    ours, theirs = other._device_path.waiter, plain._device_path.waiter
    assert ours.mode == mode and theirs.mode == "driver" and ours.waits > 0 and theirs.waits > 0
    assert theirs.slept == theirs.called_back == 0
