"""Every file yolo-cl writes for a user: checked before any input is read, checked on every
write, and renamed into place only when complete and readable.

- :func:`check_output_file` / :func:`check_output_dir` fail at once (one line) for a path
  that is a folder, a device, FIFO or socket (``/dev/full``: a rename would replace it), lies
  under a file, or is in a folder we cannot write to, by creating and removing a probe file
  there — the only test that also holds for root and read-only mounts.
- :class:`AtomicFile` writes under a hidden temp name beside the final one; a failed write
  (disk full, file size limit, I/O error) removes the temp file and raises one
  :class:`OutputError`; ``commit`` flushes, fsyncs and renames.
- Every temp name is recorded before its file is created and forgotten once it is renamed or
  removed; at exit the process removes what is still recorded, so a Ctrl-C that lands between
  two steps of a write (where no ``except`` can see it) leaves no hidden file behind.
- :class:`VideoFile` does the same for a ``cv2.VideoWriter``, which reports no write errors:
  before the rename it reopens the finished file and checks that its index is there, that it
  holds the frames written and that the first one decodes.
"""
from __future__ import annotations

import atexit
import errno
import json
import os
import secrets
from pathlib import Path
from typing import Optional, Union

from .errors import YoloClError
from .userfiles import display

PathLike = Union[str, "os.PathLike[str]"]
FRAME_COUNT_SLACK = 2       # containers that estimate their length (mkv) may be off by a frame or two


class OutputError(YoloClError):
    """An output file cannot be created or written (folder, read-only, disk full …)."""


def _reason(e: OSError) -> str:
    if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return f"{e.strerror}: disk full or file size limit reached"
    return e.strerror or str(e)


def _probe(folder: Path, what: str, name: str) -> None:
    """Create and remove a file in ``folder``: the one reliable 'can I write here' test."""
    probe = folder / f".yolo-cl-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise OutputError(f"{name}: cannot write {what} ({_reason(e)})") from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass


def _existing_ancestor(p: Path) -> Path:
    """The nearest part of ``p`` (itself or a parent) that exists."""
    q = p
    while not os.path.lexists(q) and q != q.parent:
        q = q.parent
    return q


def check_output_file(path: PathLike, what: str = "output") -> Path:
    """Fail now, with one line, unless a file can be created at ``path`` (its folders are made)."""
    p = Path(path)
    name = display(p)
    try:
        if p.is_dir():
            raise OutputError(f"{name}: {what} is a folder; give a file name")
        if os.path.lexists(p) and not p.is_file():     # never rename a file over a device, FIFO or socket
            raise OutputError(f"{name}: {what} exists and is not a regular file (outputs are written to a "
                              f"temp file and renamed over it)")
        base = _existing_ancestor(p.parent if str(p.parent) else Path("."))
        if not base.is_dir():
            raise OutputError(f"{name}: cannot write {what} ({display(base)} is a file, not a folder)")
        if len(p.name.encode(errors="surrogateescape")) > os.pathconf(base, "PC_NAME_MAX"):
            raise OutputError(f"{name}: cannot write {what} (file name too long)")
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{name}: cannot write {what} ({_reason(e)})") from None
    _probe(p.parent, what, name)
    return p


def check_output_dir(path: PathLike, what: str = "output folder") -> Path:
    """Create the folder ``path`` if needed and fail now, with one line, unless we can write in it."""
    p = Path(path)
    name = display(p)
    try:
        if os.path.lexists(p) and not p.is_dir():
            raise OutputError(f"{name}: {what} is a file, not a folder")
        base = _existing_ancestor(p)
        if not base.is_dir():
            raise OutputError(f"{name}: cannot create {what} ({display(base)} is a file, not a folder)")
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{name}: cannot create {what} ({_reason(e)})") from None
    _probe(p, what, name)
    return p


_LIVE: dict = {}        # temp file -> pid of the process that may have created it and not yet renamed it


def _forget(path: Path) -> None:
    _LIVE.pop(path, None)


@atexit.register
def remove_leftovers() -> None:
    """Remove every temp file this process created and never renamed (an interrupted write);
    a forked child leaves its parent's alone."""
    me = os.getpid()
    for path, pid in list(_LIVE.items()):
        if pid == me:
            _unlink(path)


def temp_beside(path: Path, what: str = "output") -> Path:
    """Reserve a hidden temp file next to ``path`` (same folder, same suffix) or fail now."""
    tmp = path.with_name(f".{path.name[:100]}.{os.getpid()}-{secrets.token_hex(4)}.part{path.suffix[:16]}")
    _LIVE[tmp] = os.getpid()         # before it exists: an interrupt from here on is cleaned at exit
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        open(tmp, "xb").close()      # unlike mkstemp, keeps the user's umask permissions
    except OSError as e:
        _forget(tmp)
        raise OutputError(f"{display(path)}: cannot write {what} ({_reason(e)})") from None
    return tmp


def _unlink(path: Optional[Path]) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except OSError:
            pass
        _forget(path)


class AtomicFile:
    """A text or binary file that appears under ``path`` only when :meth:`commit` succeeds."""

    def __init__(self, path: PathLike, what: str = "output", binary: bool = False) -> None:
        self.path, self.what = Path(path), what
        self.tmp: Optional[Path] = temp_beside(self.path, what)
        try:
            self._f = open(self.tmp, "wb" if binary else "w", encoding=None if binary else "utf-8")
        except OSError as e:
            self.abort()
            raise self._error(e) from None
        except BaseException:        # Ctrl-C mid-write: no temp file stays behind
            self.abort()
            raise

    def _error(self, e: OSError) -> OutputError:
        return OutputError(f"{display(self.path)}: cannot write {self.what} ({_reason(e)})")

    def write(self, data, flush: bool = False) -> None:
        """Write (and optionally flush) ``data``; on any error remove the temp file and raise."""
        try:
            self._f.write(data)
            if flush:
                self._f.flush()
        except OSError as e:
            self.abort()
            raise self._error(e) from None
        except BaseException:        # Ctrl-C mid-write: no temp file stays behind
            self.abort()
            raise

    def commit(self) -> Path:
        """Flush, fsync, close and rename into place; on any error remove the temp file and raise."""
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            os.replace(self.tmp, self.path)
            _forget(self.tmp)
        except OSError as e:
            self.abort()
            raise self._error(e) from None
        except BaseException:        # Ctrl-C mid-write: no temp file stays behind
            self.abort()
            raise
        self.tmp = None
        return self.path

    def abort(self) -> None:
        """Close and remove the temp file (safe to call twice)."""
        f = getattr(self, "_f", None)
        if f is not None and not f.closed:
            try:
                f.close()
            except OSError:
                pass
        _unlink(self.tmp)
        self.tmp = None


def write_file(path: PathLike, data: bytes, what: str = "output") -> Path:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename), or raise one OutputError."""
    f = AtomicFile(path, what, binary=True)
    f.write(data)
    return f.commit()


class VideoFile:
    """An mp4v video written through ``cv2.VideoWriter`` under a temp name, verified, then renamed."""

    def __init__(self, path: PathLike, what: str = "output video") -> None:
        self.path, self.what = Path(path), what
        self.tmp: Optional[Path] = temp_beside(self.path, what)
        self.fps = 30.0
        self.size: Optional[tuple] = None
        self.frames = 0
        self._writer = None

    def open(self, size: tuple, fps: Optional[float] = None) -> None:
        """(Re)open the writer for frames of ``size`` (width, height); fail if OpenCV cannot write this file."""
        import cv2
        if fps:
            self.fps = float(fps)
        if self._writer is not None:
            self._writer.release()
        self._writer = cv2.VideoWriter(str(self.tmp), cv2.VideoWriter_fourcc(*"mp4v"), self.fps, size)
        if not self._writer.isOpened():
            self._writer = None
            self.abort()
            raise OutputError(f"{display(self.path)}: OpenCV cannot write this video file (use .mp4, .avi or .mkv)")
        self.size = size

    def write(self, frame) -> None:
        """Append one BGR frame (resized to the video's size if it differs)."""
        import cv2
        h, w = frame.shape[:2]
        if self._writer is None or (self.frames == 0 and self.size != (w, h)):
            self.open((w, h))
        if (w, h) != self.size:
            frame = cv2.resize(frame, self.size, interpolation=cv2.INTER_AREA)
        self._writer.write(frame)
        self.frames += 1

    def commit(self) -> Path:
        """Finalise the container, check it is complete and readable, rename it into place."""
        try:
            if self._writer is not None:
                self._writer.release()
                self._writer = None
            why = self._verify()
        except BaseException:
            self.abort()
            raise
        if why:
            self.abort()
            raise OutputError(f"{display(self.path)}: cannot write {self.what} ({why})")
        try:
            os.replace(self.tmp, self.path)
            _forget(self.tmp)
        except OSError as e:
            self.abort()
            raise OutputError(f"{display(self.path)}: cannot write {self.what} ({_reason(e)})") from None
        except BaseException:
            self.abort()
            raise
        self.tmp = None
        return self.path

    def _verify(self) -> str:
        """Why the finished temp file is not a complete video ('' if it is)."""
        import cv2
        try:
            fd = os.open(self.tmp, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        except OSError as e:
            return _reason(e)
        cap = cv2.VideoCapture(str(self.tmp))
        try:
            if not cap.isOpened():
                return "the finished file cannot be opened: disk full or file size limit reached?"
            count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
            ok, _ = cap.read()
        finally:
            cap.release()
        if not ok:
            return "the finished file has no readable frame: disk full or file size limit reached?"
        if abs(count - self.frames) > FRAME_COUNT_SLACK:
            return f"the finished file holds {count} of {self.frames} frames: disk full or file size limit reached?"
        return ""

    def abort(self) -> None:
        """Release the writer and remove the temp file (safe to call twice)."""
        if self._writer is not None:
            self._writer.release()
            self._writer = None
        _unlink(self.tmp)
        self.tmp = None


# -- a detection run's outputs ----------------------------------------------------------------
class OutputSink:
    """Annotated video and/or JSONL, written under temp names and renamed into place at the end.

    The constructor reserves both temp files, so an unwritable path fails before any work.
    Every write is checked (yolo_cl.writers): the first failure removes both temp files and
    raises one OutputError; ``finish`` verifies the video is complete before the rename.
    """

    def __init__(self, out: Optional[Union[str, Path]], jsonl: Optional[Union[str, Path]]) -> None:
        self.out = Path(out) if out else None
        self.jsonl = Path(jsonl) if jsonl else None
        self._video: Optional[VideoFile] = None
        self._jf: Optional[AtomicFile] = None
        self.frames = 0
        try:
            if self.out is not None:
                self._video = VideoFile(self.out)
            if self.jsonl is not None:
                self._jf = AtomicFile(self.jsonl, "JSON lines")
        except BaseException:
            self.discard()
            raise

    def open_video(self, fps: Optional[float], size: Optional[tuple]) -> None:
        """Open the VideoWriter now if the size is known; raise if OpenCV cannot write that file."""
        if self._video is not None:
            self._video.fps = fps or 30.0
            if size is not None:
                self._guarded(self._video.open, size)

    def _guarded(self, fn, *a) -> None:
        try:
            fn(*a)
        except BaseException:
            self.discard()
            raise

    @property
    def wants_drawing(self) -> bool:
        return self.out is not None

    def write(self, r, annotated) -> None:
        """Append one frame (``r``: a ``video.Result``): the annotated image (an array, or None)
        to the video, a JSON line to the JSONL."""
        if self._video is not None and annotated is not None:
            self._guarded(self._video.write, annotated)
        if self._jf is not None:
            rec = {"frame_id": r.index, "timestamp": round(float(r.timestamp), 6),
                   "objects": [d.to_dict() for d in r.detections]}
            self._guarded(self._jf.write, json.dumps(rec, allow_nan=False) + "\n", True)
        self.frames += 1

    def finish(self) -> list:
        """Finalise, verify and rename the files into place; with no frames written, leave nothing."""
        if self.frames == 0:
            self.discard()
            return []
        done = []
        for f in (self._video, self._jf):
            if f is not None:
                self._guarded(lambda: done.append(f.commit()))
        self._video = self._jf = None
        return done

    def discard(self) -> None:
        """Drop the temp files (nothing useful was written, or a write failed)."""
        for f in (self._video, self._jf):
            if f is not None:
                f.abort()
        self._video = self._jf = None
