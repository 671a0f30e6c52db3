"""What the tests read about a process's memory (Linux /proc): resident and mapped bytes."""
from __future__ import annotations

import os


def _statm(pid) -> list:
    with open(f"/proc/{pid}/statm") as f:
        return [int(v) * os.sysconf("SC_PAGE_SIZE") for v in f.read().split()[:2]]


def rss_bytes(pid="self") -> int:
    """Resident set size of process ``pid`` (this one by default)."""
    return _statm(pid)[1]


def mapped_bytes(pid="self") -> int:
    """Size of the address space process ``pid`` has mapped (what RLIMIT_AS bounds)."""
    return _statm(pid)[0]
