"""One bounded reader for every file a user hands us, and safe display of their names.

Class-name files, tuning databases, image files and any other data file go through
:func:`read_bytes` / :func:`read_text`: the path must be a regular file (a FIFO, a device
such as ``/dev/zero`` or a folder is a one-line error, never a hang or a MemoryError),
no larger than a cap, and text is decoded by one policy. The file is opened
non-blocking and checked with ``fstat`` on the open descriptor, so what is checked is
what is read.

:func:`display` turns any path into a printable one-line string: control characters
(terminal escapes included) and the bytes of non-UTF-8 names are escaped, and very long
names are shortened, so an error line can neither inject terminal codes nor fail to print.
"""
from __future__ import annotations

import os
import stat
from typing import Union

from .errors import YoloClError

MAX_TEXT_BYTES = 4 << 20          # names files and other small text files
MAX_IMAGE_FILE_BYTES = 1 << 30    # an encoded image file
DISPLAY_CHARS = 160               # a longer name is shown as its start and end

PathLike = Union[str, bytes, "os.PathLike[str]"]


def display(path: PathLike, limit: int = DISPLAY_CHARS) -> str:
    """``path`` as one printable line: control characters and undecodable bytes escaped
    (``\\x1b``, ``\\udcff`` -> ``\\xff``), the middle of a very long name replaced by ``…``."""
    text = os.fsdecode(path) if isinstance(path, bytes) else str(path)
    return escape(text, limit)


def escape(text: str, limit: int = 0) -> str:
    """Escape every character that is not printable: C0/C1 controls and DEL, bidi and other format
    characters, unassigned code points, surrogates (a non-UTF-8 byte, kept by Python as ``\\udcXX``,
    is shown as ``\\xXX``); cut to ``limit`` characters (0: no cut) keeping both ends."""
    out = []
    for ch in text:
        o = ord(ch)
        if ch.isprintable():
            out.append(ch)
        elif 0xDC80 <= o <= 0xDCFF:               # os.fsdecode's stand-in for a raw byte
            out.append(f"\\x{o - 0xDC00:02x}")
        elif o <= 0xFF:
            out.append(f"\\x{o:02x}")
        elif o <= 0xFFFF:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    s = "".join(out)
    if limit and len(s) > limit:
        keep = (limit - 1) // 2
        s = f"{s[:keep]}…{s[-keep:]}"
    return s


def read_bytes(path: PathLike, what: str, cap: int, error: type = YoloClError) -> bytes:
    """The whole content of a regular file of at most ``cap`` bytes; ``error`` (one line) otherwise.

    ``what`` names the file's role in messages (``names file``, ``image``)."""
    name = display(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"{name}: cannot read {what} ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise error(f"{name}: {what} is {kind}")
        if st.st_size > cap:
            raise error(f"{name}: {what} is {st.st_size} bytes, more than the {cap} byte limit")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, cap + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > cap:              # the file grew while we read it
                raise error(f"{name}: {what} is more than the {cap} byte limit")
        return b"".join(chunks)
    except OSError as e:
        raise error(f"{name}: cannot read {what} ({e.strerror or e})") from None
    finally:
        os.close(fd)


def read_text(path: PathLike, what: str, cap: int = MAX_TEXT_BYTES, error: type = YoloClError) -> str:
    """A text file under the encoding policy: UTF-8, a leading BOM dropped, invalid bytes
    replaced by U+FFFD (Darknet reads names as raw bytes and never refuses them)."""
    return read_bytes(path, what, cap, error).decode("utf-8-sig", errors="replace")
