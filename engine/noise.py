"""Keep third-party chatter off the user's terminal unless ``--verbose``.

Native libraries write to file descriptor 2 behind Python's back: libpng's ``libpng error:``,
OpenCV's ``[ WARN:0@…]`` lines, FFmpeg's decoder complaints, OpenCL compiler output. Python
libraries raise warnings (NumPy's RuntimeWarning on an overflow). While :func:`routed` is
active, descriptor 2 points at ``/dev/null`` and ``sys.stderr`` at a duplicate of the real
stderr, so yolo-cl's own one-line errors, notes and progress still reach the user and
nothing else does; Python warnings are ignored and OpenCV's log is silenced.

A process started inside :func:`routed` inherits descriptor 2, ``/dev/null``: start it inside
:func:`for_children` so its own messages reach the real stderr (it routes its own chatter).
"""
from __future__ import annotations

import os
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator


def _stderr_is_fd2() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):   # replaced by a test harness or an IDE
        return False


_REAL: list = []          # while routed: a descriptor of the real stderr (innermost last)


@contextmanager
def for_children() -> Iterator[None]:
    """Within this block descriptor 2 is the real stderr again (when routed), so the processes
    started in it write their messages where the user sees them."""
    if not _REAL:
        yield
        return
    sys.stderr.flush()
    hidden = os.dup(2)
    os.dup2(_REAL[-1], 2)
    try:
        yield
    finally:
        os.dup2(hidden, 2)
        os.close(hidden)


@contextmanager
def routed(verbose: bool = False) -> Iterator[None]:
    """Within this block only yolo-cl's own messages reach stderr (everything, with ``verbose``)."""
    if verbose:
        yield
        return
    import cv2
    import numpy as np
    level = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    old_err = np.seterr(all="ignore")
    saved = own = None
    old_stderr = sys.stderr
    if _stderr_is_fd2():
        try:
            sys.stderr.flush()
            saved = os.dup(2)
            own = os.fdopen(os.dup(saved), "w", buffering=1, encoding=getattr(old_stderr, "encoding", None),
                            errors="backslashreplace")
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)
            sys.stderr = own
            _REAL.append(saved)
        except OSError:
            if saved is not None:
                os.close(saved)
            saved = own = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if saved is not None:
            _REAL.remove(saved)
            try:
                own.flush()
            except (OSError, ValueError):
                pass
            sys.stderr = old_stderr
            os.dup2(saved, 2)
            os.close(saved)
            try:
                own.close()
            except OSError:
                pass
        np.seterr(**old_err)
        cv2.utils.logging.setLogLevel(level)
