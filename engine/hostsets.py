"""Host arrays handed to a caller and reused once the caller has let go of them.

``Executor.run`` returns its heads in the very arrays the device wrote them into, instead of
fresh copies (at 608x608 and batch 8 the heads are 62 MB: a new allocation page-faults in and a
copy costs milliseconds every frame). A set of arrays is reused only when nothing outside the
pool refers to it any more: no array of the set and no view of one (a view keeps its base
referenced), judged by reference counts measured once, when the set is made. A caller who keeps
a result therefore never sees it change; a caller who drops it lets the next frame reuse it.
"""
from __future__ import annotations

import sys
import threading
from typing import Callable, Optional

import numpy as np

CAP = 4        # sets per pool: a caller holding the previous frame, two in flight, one being filled


def _counts(arrays: list) -> tuple:
    """Reference counts of the arrays and of their bases (a view of a mapped array may refer to
    the mapping rather than to the array)."""
    return (tuple(sys.getrefcount(a) for a in arrays)
            + tuple(sys.getrefcount(a.base) for a in arrays if a.base is not None))


class _Set:
    def __init__(self, arrays: list) -> None:
        self.arrays = arrays
        self.idle = _counts(self.arrays)      # the counts while only the pool holds them
        self.busy = True


class HostSets:
    """Up to ``cap`` (default ``CAP``) sets of arrays from ``make()``; ``take`` lends one no caller holds."""

    def __init__(self, make: Callable[[], list], cap: Optional[int] = None) -> None:
        self._make, self.cap = make, CAP if cap is None else cap
        self._sets: list = []
        self._lock = threading.Lock()

    def take(self) -> Optional[list]:
        """A set that nothing outside the pool refers to (made while fewer than ``cap`` exist),
        reserved until ``release``; None when the caller holds every set."""
        with self._lock:
            for s in self._sets:
                if not s.busy and _counts(s.arrays) == s.idle:
                    s.busy = True
                    return s.arrays
            if len(self._sets) < self.cap:
                self._sets.append(_Set(self._make()))
                return self._sets[-1].arrays
        return None

    def lend(self, fallback: Callable[[], np.ndarray]) -> np.ndarray:
        """The first array of a set nobody holds, given out under the reference-count rule (the
        caller's until nothing refers to it: ``take`` then ``release`` at once), or ``fallback()``
        while the caller holds every set."""
        got = self.take()
        if got is None:
            return fallback()
        self.release(got)
        return got[0]

    def release(self, arrays: list) -> None:
        """End the reservation of ``take``: from now on the set is free once nobody refers to it."""
        with self._lock:
            for s in self._sets:
                if s.arrays is arrays:
                    s.busy = False
