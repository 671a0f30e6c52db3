"""The command line's video path: ``yolo-cl detect`` on a video file, camera or stream URL.

The library (``video``) yields detections; this module adds what only a command-line run
wants: drawing, the annotated video and JSONL written atomically (``writers.OutputSink``), an
optional window, a progress bar on stderr, Ctrl-C finishing the files, and a summary.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import time
from typing import Optional

import cv2

from . import stopping
from .userfiles import display, escape
from .video import OutputStages, Pipeline, StreamStats, open_source, tracker_for
from .writers import OutputSink

log = logging.getLogger("yolo_cl.video")


class Progress:
    """A one-line status on stderr while it is a terminal (nothing otherwise): tqdm's bar with
    rate and ETA for a file of known length; frames, fps, latency and drops for a live source."""

    def __init__(self, stream, total: Optional[int], live: bool, interval: float = 0.25) -> None:
        from tqdm import tqdm
        self.live = live or not total
        enabled = hasattr(stream, "isatty") and stream.isatty()
        self._bar = tqdm(total=None if self.live else total, file=stream, unit="frame", mininterval=interval,
                         dynamic_ncols=True, leave=True, disable=not enabled,
                         bar_format="{n_fmt} frames{postfix}" if self.live else None)

    def update(self, stats: StreamStats, force: bool = False) -> None:
        """Show ``stats`` (frames done, fps; latency and drops when live)."""
        bar = self._bar
        if bar.disable:
            return
        if self.live:
            bar.set_postfix_str(f"{stats.fps:5.1f} fps  latency {stats.latency.mean_ms:5.0f} ms  "
                                f"dropped {stats.dropped}", refresh=False)
        done = stats.frames if self.live else min(stats.frames, bar.total)
        bar.update(done - bar.n)
        if force:
            bar.refresh()

    def finish(self) -> None:
        self._bar.close()


def _display_available() -> bool:
    """Whether cv2.imshow has somewhere to draw (a desktop session; OpenCV with a GUI backend)."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return False
    return "NONE" not in re.findall(r"GUI:\s*(\S+)", cv2.getBuildInformation())[:1]


class _Interrupt:
    """The video path's stop signals (``handle`` installed by ``stopping.handling``): the first
    SIGINT or SIGTERM sets ``hit`` and calls ``on_hit`` (the run then finishes its files) instead
    of raising; a second one raises KeyboardInterrupt."""

    def __init__(self, on_hit=None) -> None:
        self.hit = False
        self.on_hit = on_hit

    def handle(self, signum, frame) -> None:
        stopping.note(signum)
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True
        if self.on_hit is not None:
            self.on_hit()


def run_detect_stream(detector, source, args) -> int:
    """The CLI's video/camera/URL path. Returns the exit status (0, or 130 after Ctrl-C, 143 after SIGTERM).

    ``args`` attributes (all optional): out (annotated video), jsonl (one JSON line per
    frame), show, batch, live, reconnect, backoff, thresh, nms, quiet, track, track_age.
    Outputs appear under their final names only when the run ends, completed or interrupted;
    a write that fails removes both temp files and raises OutputError.
    """
    opt = lambda name, default: default if getattr(args, name, None) is None else getattr(args, name)  # noqa: E731
    quiet = bool(opt("quiet", False))
    tracker = tracker_for(bool(opt("track", False)), opt("track_age", 30))
    sink = OutputSink(opt("out", None), opt("jsonl", None))       # unwritable outputs fail here, first
    src = None
    try:
        src = open_source(source, live=opt("live", None), reconnect=opt("reconnect", 5), backoff=opt("backoff", 1.0))
        sink.open_video(src.fps, src.size)
        pipe = Pipeline(detector, src, thresh=opt("thresh", 0.25), nms=opt("nms", 0.45), batch=opt("batch", 1))
    except BaseException:
        sink.discard()
        if src is not None:
            src.close()
        raise
    show = bool(opt("show", False))
    if show and not _display_available():
        log.warning("--show: no display available, not showing frames")
        show = False
    from .draw import draw
    names = detector.names
    progress = Progress(sys.stderr, src.frame_count, src.live)
    out_times = pipe.stats.stages["output"]
    user_quit = False
    written: list = []
    # Without a window, drawing and writing run in their own threads (--show draws here: the
    # window belongs to this thread).
    outputs = None if show else OutputStages(sink.write, names, sink.wants_drawing, out_times)
    interrupt = _Interrupt(pipe.interrupt)
    with stopping.handling(interrupt.handle):        # also covers finishing the files
        ok = False
        try:
            for r in pipe:
                if tracker is not None:
                    r.detections = tracker.update(r.detections, r.index)
                    r.trails = tracker.trails()
                if outputs is not None:
                    if not outputs.put(r):
                        break
                else:
                    t0 = time.perf_counter()
                    annotated = draw(r.frame, r.detections, names, r.trails)
                    sink.write(r, annotated)
                    cv2.imshow("yolo-cl", annotated)
                    user_quit = (cv2.waitKey(1) & 0xFF) in (27, ord("q"))
                    out_times.add(time.perf_counter() - t0)
                if not quiet:
                    progress.update(pipe.stats)
                if interrupt.hit or user_quit:
                    break
            ok = True
        finally:
            pipe.close()
            failed = None
            if outputs is not None:
                if not ok:
                    outputs.stop()
                try:
                    outputs.close()            # the frames already queued are drawn and written
                except BaseException as e:     # noqa: B902 - re-raised once everything is closed
                    failed, ok = e, False
            if show:
                cv2.destroyAllWindows()
            progress.finish()
            if not pipe.reading:
                src.close()
            if ok:
                written = sink.finish()
            else:
                sink.discard()
            if failed is not None:
                raise failed
        interrupted = interrupt.hit
    if interrupted:
        pipe.stats.end = "interrupted"
    elif user_quit:
        pipe.stats.end = "stopped by user"
    if not quiet:
        print("\n".join(escape(line) for line in pipe.stats.format().splitlines()), file=sys.stderr)
        for path in written:
            print(f"wrote {display(path)}", file=sys.stderr)
    return stopping.status() if interrupted else 0
