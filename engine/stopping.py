"""How a command was asked to stop before its work was done, and the status it then ends with.

Ctrl-C (SIGINT) ends a run with 130, its finished outputs in place. SIGTERM (``kill``,
``timeout``, a service manager or a container stopping) is handled the same way and ends with
143, as a shell reports a process ended by that signal: without a handler, Python dies at once
and leaves its outputs' hidden temp files behind. The first of the two to arrive decides the
status; the commands' ``except KeyboardInterrupt`` paths ask :func:`status` for it.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

INTERRUPTED, TERMINATED = 130, 143
STATUSES = (INTERRUPTED, TERMINATED)
SIGNALS = (signal.SIGINT, signal.SIGTERM)      # the stop signals
_first: list = []               # the first stop signal this command received


def reset() -> None:
    """Forget the signals of an earlier command in this process."""
    _first.clear()


def note(signum: int) -> None:
    """Record a stop signal (only the first counts)."""
    if not _first:
        _first.append(signum)


def status() -> int:
    """The exit status of a stopped command: 143 if SIGTERM stopped it first, else 130."""
    return TERMINATED if _first and _first[0] == signal.SIGTERM else INTERRUPTED


def _terminate(signum, frame) -> None:
    note(signum)
    raise KeyboardInterrupt


def _ignore(signum, frame) -> None:
    note(signum)


def ignore_stops() -> None:
    """From now on SIGINT and SIGTERM do nothing (main thread only). A Python handler that does
    nothing, not SIG_IGN: a signal already on its way when the handler changes then runs it,
    where with SIG_IGN Python would print that it ignored the signal "due to race condition"."""
    for s in SIGNALS:
        signal.signal(s, _ignore)


def _stop_once(signum, frame) -> None:
    note(signum)
    ignore_stops()
    raise KeyboardInterrupt


@contextlib.contextmanager
def handling(handler, signals: tuple = SIGNALS) -> Iterator[None]:
    """``handler`` for ``signals`` while active, the previous handlers after; only on the main
    thread (where Python runs signal handlers; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def interrupted_once() -> "contextlib.AbstractContextManager[None]":
    """For a worker process that stops gracefully on its first stop signal: while active, the
    first SIGINT or SIGTERM raises KeyboardInterrupt and every later one is ignored. A ``docker
    stop`` or a terminal's Ctrl-C reaches the whole process group and the parent passes the stop
    on as well, so a worker gets two signals at once; a second KeyboardInterrupt raised while the
    first is being handled (inside a lock's release, say) would cut its outputs short."""
    return handling(_stop_once)


def sigterm_as_interrupt() -> "contextlib.AbstractContextManager[None]":
    """While active, SIGTERM raises KeyboardInterrupt as Ctrl-C does, after noting it."""
    return handling(_terminate, (signal.SIGTERM,))
