"""Parse Darknet ``.cfg`` files into sections of typed, line-numbered options.

The parser knows which sections exist and reads values lazily through typed getters,
so every error (unknown section, bad number, value out of range) names the file and
the line it came from. Options Darknet uses only for training are accepted and ignored.

Every getter marks its key as heard; after the layers are built, :func:`unheard` lists the
keys nothing read and no Darknet reads either (Darknet's "Unused field"), and keys written
twice (Darknet's ``option_find`` walks the list from the front, so the first value wins).
Keys match case-sensitively, as Darknet's ``strcmp`` does: ``Filters=`` is unused there too.
Encoding follows Darknet, which never decodes text: bytes after ``#`` or ``;`` are ignored
whatever they are; a key, value or section header must be UTF-8.
"""
from __future__ import annotations

import logging
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence, TypeVar, Union

from .darknet_keys import WEIGHT_SKIPS, darknet_reads
from .errors import CfgError

# Darknet's section names and their aliases -> canonical kind.
SECTION_KINDS = {
    "net": "net", "network": "net",
    "convolutional": "convolutional", "conv": "convolutional",
    "maxpool": "maxpool", "max": "maxpool",
    "avgpool": "avgpool", "avg": "avgpool",
    "route": "route",
    "shortcut": "shortcut",
    "upsample": "upsample",
    "reorg": "reorg",
    "scale_channels": "scale_channels",
    "sam": "sam",
    "dropout": "dropout",
    "softmax": "softmax", "soft": "softmax",
    "yolo": "yolo",
    "region": "region",
    "gaussian_yolo": "gaussian_yolo", "detection": "detection",
    "connected": "connected", "conn": "connected",
    "deconvolutional": "deconvolutional", "deconv": "deconvolutional",
    "crop": "crop", "batchnorm": "batchnorm", "activation": "activation", "logistic": "logistic",
    "local_avgpool": "local_avgpool", "local_avg": "local_avgpool",
    "reorg3d": "reorg3d", "l2norm": "l2norm", "empty": "empty", "silence": "empty", "cost": "cost", "local": "local", "normalization": "normalization", "lrn": "normalization",
    "implicit": "implicit", "implicit_add": "implicit_add", "implicit_mul": "implicit_mul",
}
# Sections Darknet has but yolo-cl does not run: named so the error can say so.
UNSUPPORTED = {"crnn", "rnn", "gru", "lstm", "conv_lstm", "history", "contrastive"}

MAX_CFG_BYTES = 4 << 20
MAX_SECTIONS = 10000
MAX_SHOWN = 40   # characters of a user's text quoted in an error message

T = TypeVar("T")
_REQUIRED = object()
log = logging.getLogger("yolo_cl.cfg")


@dataclass
class Section:
    """One ``[kind]`` block: its options as raw strings with the line each came from."""

    kind: str
    path: str
    line: int
    options: dict = field(default_factory=dict)  # key -> (raw value, line number)
    index: int = -1  # layer index (net = -1)
    heard: set = field(default_factory=set)       # keys some getter has read
    repeats: list = field(default_factory=list)   # (key, raw value, line) of keys written again
    notes: dict = field(default_factory=dict)     # key -> what a fork-dependent key does here

    def where(self, key: Optional[str] = None) -> str:
        """``file:line`` of an option (or of the section header)."""
        line = self.options[key][1] if key is not None and key in self.options else self.line
        return f"{self.path}:{line}"

    def error(self, msg: str, key: Optional[str] = None) -> CfgError:
        """A CfgError located at ``key`` (or the header), naming the section."""
        return CfgError(f"{self.where(key)}: [{self.kind}]: {msg}")

    def note(self, key: str, msg: str) -> None:
        """Record a one-line note about ``key`` (reported once with :func:`unheard`'s warnings)."""
        self.notes[key] = msg

    def has(self, key: str) -> bool:
        return key in self.options

    def _get(self, key: str, default, conv: Callable[[str], T], what: str,
             lo: Optional[float], hi: Optional[float]) -> T:
        self.heard.add(key)
        if key not in self.options:
            if default is _REQUIRED:
                raise self.error(f"missing required option '{key}'")
            return default
        raw = self.options[key][0]
        try:
            value = conv(raw)
        except (ValueError, OverflowError):
            raise self.error(f"option '{key}={show(raw)}' is not {what}", key) from None
        if lo is not None and value < lo or hi is not None and value > hi:
            raise self.error(f"option '{key}={show(raw)}' is out of range [{lo}, {hi}]", key)
        return value

    def int(self, key: str, default=_REQUIRED, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
        """Integer option; Darknet's atoi also accepts '3.0', so we do the same only for exact integers."""
        return self._get(key, default, _to_int, "an integer", lo, hi)

    def float(self, key: str, default=_REQUIRED, lo: Optional[float] = None, hi: Optional[float] = None) -> float:
        return self._get(key, default, _to_float, "a number", lo, hi)

    def str(self, key: str, default=_REQUIRED, choices: Optional[Sequence[str]] = None) -> str:
        value = self._get(key, default, lambda s: s.strip(), "text", None, None)
        if choices is not None and value not in choices:
            raise self.error(f"option '{key}={show(value)}' is not one of {', '.join(choices)}", key)
        return value

    def ints(self, key: str, default=_REQUIRED, lo: Optional[int] = None, hi: Optional[int] = None) -> list:
        """Comma-separated integer list."""
        values = self._get(key, default, lambda s: [_to_int(v) for v in s.split(",") if v.strip()],
                           "a list of integers", None, None)
        for v in values:
            if lo is not None and v < lo or hi is not None and v > hi:
                raise self.error(f"option '{key}' has value {show(str(v))} out of range [{lo}, {hi}]", key)
        return values

    def floats(self, key: str, default=_REQUIRED) -> list:
        return self._get(key, default, lambda s: [_to_float(v) for v in s.split(",") if v.strip()],
                         "a list of numbers", None, None)


def show(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` fit to quote in a one-line message: control characters escaped, long text cut."""
    out = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text[:limit])
    return out + "..." if len(text) > limit else out


def regular_file_size(p: Path, shown: str, error: type, what: str) -> int:
    """Size of the regular file ``p``, or ``error`` saying why it cannot be read (so a FIFO never blocks)."""
    try:
        st = p.stat()
    except (FileNotFoundError, ValueError):
        raise error(f"{shown}: {what} not found") from None
    except OSError as e:
        raise error(f"{shown}: cannot read {what} ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{shown}: {what} is not a regular file")
    return st.st_size


def _to_int(s: str) -> int:
    s = s.strip()
    try:
        return int(s)
    except ValueError:
        f = float(s)
        if f != int(f):
            raise
        return int(f)


def _to_float(s: str) -> float:
    v = float(s.strip())
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(s)
    return v


def _lines(path: str, data: Union[bytes, str]):
    """(line number, text without its comment) of each line; only the text before a comment must be UTF-8.

    ``#`` and ``;`` are ASCII, so they never occur inside a UTF-8 sequence: cutting the bytes
    there first and decoding the rest accepts any bytes in comments (a Latin-1 author's name)."""
    sep = b"\n" if isinstance(data, bytes) else "\n"
    for lineno, raw in enumerate(data.split(sep), 1):
        if isinstance(raw, bytes):
            raw = raw.split(b"#", 1)[0].split(b";", 1)[0]
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise CfgError(f"{path}:{lineno}: not valid UTF-8 text (only comments may hold other bytes)") from None
        yield lineno, raw.split("#", 1)[0].split(";", 1)[0].strip().replace("\x00", "")


def parse_cfg(source: Union[str, Path], text: Optional[str] = None) -> list:
    """Parse a cfg file (or ``text`` attributed to ``source``) into sections; the first is ``[net]``."""
    p = Path(source)
    path = show(str(source), 300)
    data: Union[bytes, str]
    if text is None:
        if regular_file_size(p, path, CfgError, "cfg file") > MAX_CFG_BYTES:
            raise CfgError(f"{path}: cfg file is larger than {MAX_CFG_BYTES >> 20} MiB; not a Darknet cfg")
        try:
            data = p.read_bytes()
        except OSError as e:
            raise CfgError(f"{path}: cannot read cfg file ({e.strerror})") from None
    else:
        data = text
    sections: list = []
    for lineno, line in _lines(path, data):
        if not line:
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise CfgError(f"{path}:{lineno}: malformed section header '{show(line)}'")
            name = line[1:-1].strip().lower()
            if name in UNSUPPORTED:
                raise CfgError(f"{path}:{lineno}: section [{show(name)}] is not supported by yolo-cl")
            if name not in SECTION_KINDS:
                raise CfgError(f"{path}:{lineno}: unknown section [{show(name)}]")
            if len(sections) >= MAX_SECTIONS:
                raise CfgError(f"{path}:{lineno}: more than {MAX_SECTIONS} sections")
            sections.append(Section(SECTION_KINDS[name], path, lineno))
            continue
        if "=" not in line:
            raise CfgError(f"{path}:{lineno}: expected 'key=value', got '{show(line)}'")
        if not sections:
            raise CfgError(f"{path}:{lineno}: option before the first [section]")
        key, value = line.split("=", 1)
        key = "".join(key.split())   # Darknet's strip() drops every blank; keys stay case-sensitive (strcmp)
        if not key:
            raise CfgError(f"{path}:{lineno}: empty option name")
        s = sections[-1]
        if key in s.options:
            s.repeats.append((key, value.strip(), lineno))   # Darknet's option_find: the first one wins
        else:
            s.options[key] = (value.strip(), lineno)
    if not sections:
        raise CfgError(f"{path}: no sections; not a Darknet cfg")
    if sections[0].kind != "net":
        raise CfgError(f"{sections[0].where()}: the first section must be [net], not [{sections[0].kind}]")
    for i, s in enumerate(sections[1:]):
        if s.kind == "net":
            raise CfgError(f"{s.where()}: a second [net] section")
        s.index = i
    if len(sections) == 1:
        raise CfgError(f"{path}: the cfg has no layers after [net]")
    for s in sections[1:]:
        for key in WEIGHT_SKIPS:
            if key in s.options and s.int(key) != 0:
                raise s.error(f"'{key}' makes Darknet skip weights of this layer; yolo-cl reads every layer's "
                              "weights, so it is not supported", key)
    return sections


def unheard(sections: list) -> list:
    """One warning line per key that nothing read and no Darknet reads, per repeated key and per note.

    Call it after the layers are built (so every getter has run). Darknet prints "Unused field"
    for the same keys of a layer section; it never checks [net], where yolo-cl warns too so that
    a typo there (``widht=``) is seen."""
    out = []
    for s in sections:
        known = darknet_reads(s.kind)
        spelled = {k.lower(): k for k in known | s.heard}
        what = f"[{s.kind}]" if s.index < 0 else f"layer {s.index} [{s.kind}]"
        for key, (value, line) in s.options.items():
            if key not in s.heard and key not in known:
                why = (f"Darknet matches keys case-sensitively: '{spelled[key.lower()]}'?" if key.lower() in spelled
                       else "no Darknet reads it")
                out.append((line, f"{s.path}:{line}: warning: {what}: unused key '{show(key)}={show(value)}' ({why})"))
        for key, msg in s.notes.items():
            line = s.options[key][1] if key in s.options else s.line
            out.append((line, f"{s.path}:{line}: note: {what}: {msg}"))
        for key, value, line in s.repeats:
            if s.index < 0 and key not in s.heard:
                continue   # a training key repeated in [net] (the "# Testing / # Training" idiom): Darknet is silent
            out.append((line, f"{s.path}:{line}: warning: {what}: '{show(key)}' is repeated (first on line "
                              f"{s.options[key][1]}); Darknet uses the first value, so '{show(value)}' is ignored"))
    return [msg for _, msg in sorted(out, key=lambda t: t[0])]


def warn_unheard(sections: list) -> list:
    """Log :func:`unheard`'s lines on the ``yolo_cl.cfg`` logger (call once per parsed cfg); return them."""
    lines = unheard(sections)
    for msg in lines:
        log.warning(msg)
    return lines
