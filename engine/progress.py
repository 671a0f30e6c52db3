"""Progress of a long command-line run on stderr: tqdm's bar on a terminal; elsewhere (a log, CI)
a plain line every ``interval`` seconds, so a long run is visibly alive without flooding the log."""
from __future__ import annotations

import math
import time
from typing import Optional


class ProgressBar:
    """A count of ``unit`` toward ``total``, with the current ``label`` and an ETA."""

    def __init__(self, total: int, label: str, stream=None, interval: float = 30.0, unit: str = "timing",
                 what: str = "tuning") -> None:
        import sys
        from tqdm import tqdm
        self.total, self.label, self.done, self.unit, self.what = max(total, 1), label, 0, unit, what
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval, self.t0 = interval, time.perf_counter()
        self._last = -math.inf                      # the first update prints at once
        self._bar = tqdm(total=self.total, desc=label, unit=unit, file=self.stream, leave=False,
                         dynamic_ncols=True) if self.tty else None

    def __call__(self, n: int = 1, label: Optional[str] = None) -> None:
        self.done = min(self.total, self.done + n)
        if label is not None:
            self.label = label
        if self._bar is not None:
            if label is not None:
                self._bar.set_description_str(label[:60], refresh=False)
            self._bar.update(n)
            return
        now = time.perf_counter()
        if now - self._last < self.interval and self.done < self.total:
            return
        self._last = now
        spent = now - self.t0
        eta = f", about {spent / self.done * (self.total - self.done):.0f} s left" if self.done else ""
        self.stream.write(f"{self.what}: {self.done}/{self.total} {self.unit}s ({100 * self.done / self.total:.0f}%), "
                          f"{spent:.0f} s{eta}  {self.label}"[:200] + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
