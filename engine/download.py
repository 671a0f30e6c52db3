"""Fetch a zoo model's published weights into the user cache: resumable, verified, atomic.

``models/zoo.yaml`` names each model's published URL and, where a published source gives one,
its checksum. A download goes to ``<cache>/weights/NAME.weights.part``; an interrupted one is
resumed with an HTTP ``Range`` request; the finished file is checked (the published SHA-256 or
SHA-1, else the SHA-256 recorded at the first download: trust on first use) and only then
renamed to ``NAME.weights``. HTTP is Python's own ``urllib`` (redirects, proxies from the
environment), so no dependency is added for it; the progress bar is tqdm's.
"""
from __future__ import annotations

import hashlib
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

import yaml

from .errors import YoloClError
from .resources import resource_dir
from .runtime import atomic_write, cache_dir

CHUNK = 1 << 20
HASHES_FILE = "checksums.yaml"      # the SHA-256 of each first download without a published checksum


class DownloadError(YoloClError):
    """A download that failed, was refused or did not match its checksum."""


def zoo_entry(name: str) -> dict:
    """The ``models/zoo.yaml`` entry of a zoo model."""
    with open(resource_dir("models") / "zoo.yaml", encoding="utf-8") as f:
        models = yaml.safe_load(f)["models"]
    for m in models:
        if m["name"] == name:
            return m
    raise DownloadError(f"'{name}' is not a zoo model ({', '.join(m['name'] for m in models)})")


def weights_dir() -> Path:
    """Where downloaded weights live: ``<cache>/weights`` (``YOLO_CL_CACHE``, else ``~/.cache/yolo-cl``)."""
    return cache_dir() / "weights"


def cached_weights(name: str) -> Optional[Path]:
    """The downloaded weights of zoo model ``name``, if they are in the cache."""
    p = weights_dir() / f"{name}.weights"
    return p if p.is_file() else None


def _recorded(name: str) -> Optional[str]:
    path = weights_dir() / HASHES_FILE
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return None
    value = data.get(name) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def _record(name: str, checksum: str) -> None:
    path = weights_dir() / HASHES_FILE
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, yaml.YAMLError):
        data = {}
    data = data if isinstance(data, dict) else {}
    data[name] = checksum
    atomic_write(path, yaml.safe_dump(data, sort_keys=True).encode())


def _digest(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _parse_checksum(text: str) -> tuple:
    algorithm, _, hexdigest = text.partition(":")
    if algorithm not in ("sha256", "sha1") or not hexdigest or any(c not in "0123456789abcdef" for c in hexdigest):
        raise DownloadError(f"checksum '{text}' is not 'sha256:HEX' or 'sha1:HEX'")
    return algorithm, hexdigest


def _fetch(url: str, part: Path, timeout: float, progress: bool, label: str) -> None:
    """Append the rest of ``url`` to ``part`` (resuming with Range when it already holds bytes)."""
    from tqdm import tqdm
    have = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"User-Agent": "yolo-cl", **({"Range": f"bytes={have}-"} if have else {})})
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:          # nothing left to send: the part file is complete
            return
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise DownloadError(f"{url}: {getattr(e, 'reason', None) or e}") from None
    with resp:
        if have and resp.status != 206:     # the server ignored Range: start again
            have = 0
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else None
        bar = tqdm(total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024, desc=label,
                   file=sys.stderr, disable=None if progress else True, leave=False)
        try:
            with open(part, "ab" if have else "wb") as f:
                while True:
                    try:
                        block = resp.read(CHUNK)
                    except (OSError, ValueError) as e:
                        raise DownloadError(f"{url}: connection lost after {f.tell()} bytes ({e}); "
                                            "run the same command again to resume") from None
                    if not block:
                        break
                    f.write(block)
                    bar.update(len(block))
                got = f.tell()
        except OSError as e:
            raise DownloadError(f"{part}: cannot write ({e.strerror or e})") from None
        finally:
            bar.close()
    if total is not None and got < total:
        raise DownloadError(f"{url}: connection closed after {got} of {total} bytes; "
                            "run the same command again to resume")


def download(name: str, url: Optional[str] = None, checksum: Optional[str] = None, dest: Optional[Path] = None,
             timeout: float = 30.0, progress: bool = True, log=None) -> Path:
    """Download zoo model ``name``'s weights (or ``url``) to ``dest`` (default: the user cache) and verify them.

    ``checksum`` ("sha256:HEX" / "sha1:HEX") overrides the zoo's. A file already in place is checked
    and kept. On a checksum mismatch the download is deleted and nothing is left under the final
    name. ``log(line)`` receives the one-line notes (default: stderr)."""
    say = log or (lambda line: print(f"yolo-cl: {line}", file=sys.stderr))
    entry = zoo_entry(name) if url is None or checksum is None else {}
    url = url or entry.get("url")
    if not url:
        raise DownloadError(f"{name}: no published weights to download; pass --weights FILE")
    checksum = checksum or entry.get("checksum") or _recorded(name)
    expected = _parse_checksum(checksum) if checksum else None
    dest = Path(dest) if dest is not None else weights_dir() / f"{name}.weights"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DownloadError(f"{dest.parent}: cannot create ({e.strerror or e})") from None
    part = dest.with_name(dest.name + ".part")
    if not dest.is_file():
        _fetch(url, part, timeout, progress, name)
        source = part
    else:
        source = dest
    if expected is not None:
        algorithm, hexdigest = expected
        got = _digest(source, algorithm)
        if got != hexdigest:
            source.unlink(missing_ok=True)
            raise DownloadError(f"{url}: {algorithm} {got} does not match the expected {hexdigest}; "
                                "the download was deleted")
    else:
        got = _digest(source, "sha256")
        _record(name, f"sha256:{got}")
        say(f"note: no published checksum for {name}; recorded sha256 {got} of this download, "
            "later downloads are checked against it")
    if source is part:
        os.replace(part, dest)
    return dest
