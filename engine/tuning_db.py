"""The tuning database: tuned kernel configs per (device, layer shape, precision, batch).

It only stores and looks up, as CLBlast's database does, and never runs kernel code: a miss is
"no entry" (None), and the caller (``kernels.conv``) falls back to the kernel families'
heuristic. Which stored configs can run a layer is the caller's to say (``fits``).

YAML files hold *records*, one per (device name, driver, vendor, device type, precision), each
mapping shape keys to configs. The shipped files are ``configs/*.yaml`` (devices we have tuned);
new tunings go to the user cache ``cache_dir()/tuning.yaml``. A look-up falls back level by
level:

    0 device name + driver version  (exact)
    1 device name, another driver   (used, but marked stale: ``yolo-cl tune`` re-validates it)
    2 vendor + device type
    3 device type
    -> no entry

A CPU record also says how wide its device's float vectors were (``lanes``: 8 for AVX2, 16 for
AVX-512, as OpenCL reports them), and a CPU with 16-float vectors takes entries only from a
record of such a device, a narrower CPU only from a record of a narrower one (a record that does
not say serves both): AVX2 entries ran 9-15% slower than the untuned pick on an AVX-512 CPU, and
PoCL names different CPUs alike ("pthread-AMD EPYC" on a Zen 3 and a Zen 5).

Within a level the user cache wins over the shipped files. Spatial size is bucketed (N, the
output pixels, rounded up to a power of two) and a miss tries the neighbouring buckets, so a
new input size does not force a retune. A config ``fits`` rejects for the actual shape (e.g. a
work-group width that does not divide it) is skipped. A corrupt file is a warning, then ignored;
writes merge into the current file under an ``fcntl`` lock and land atomically.
"""
from __future__ import annotations

import copy
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .errors import YoloClError
from .graph import Node
from .precision import Precision
from .resources import resource_dir
from .runtime import atomic_write, cache_dir, wide_vectors

log = logging.getLogger("yolo_cl.tuner")

DB_VERSION = 1
LEVELS = ("device+driver", "device", "vendor", "type")
NO_ENTRY = "heuristic"      # the origin of a shape the database has no entry for
_WARNED: set = set()
_PARSED: dict = {}         # path -> ((size, mtime, inode), records): see read_db


# -- keys ---------------------------------------------------------------------------------
def n_bucket(n: int) -> int:
    """Output pixels rounded up to a power of two."""
    return 1 << max(0, int(n - 1).bit_length())


def shape_key(node: Node, batch: int = 1, n: Optional[int] = None) -> str:
    """What a conv's best config depends on, with the spatial size bucketed."""
    a = node.attrs
    nb = n_bucket(node.output.h * node.output.w) if n is None else n
    return (f"k{a['size']} s{a['stride_x']}x{a['stride_y']} d{a['dilation']} g{a['groups']} "
            f"c{a['in_c']} f{a['filters']} n{nb} b{batch}")


# A miss tries the buckets with twice and half the pixels, no further: on PoCL a config tuned for
# 4x fewer pixels ran 4.6x slower than the best on yolov3-tiny's last 3x3 conv (recordings).
NEIGHBOUR_BUCKETS = 1


def _neighbour_keys(node: Node, batch: int) -> list:
    nb = n_bucket(node.output.h * node.output.w)
    keys = []
    for step in range(1, NEIGHBOUR_BUCKETS + 1):
        keys += [shape_key(node, batch, nb << step), shape_key(node, batch, max(1, nb >> step))]
    return list(dict.fromkeys(k for k in keys if k != shape_key(node, batch)))


@dataclass(frozen=True)
class DeviceId:
    """The identity a record is filed under."""

    device: str
    driver: str
    vendor: str
    type: str
    precision: str
    lanes: int = 0              # a CPU's native float vector width; 0: not a CPU

    @classmethod
    def of(cls, rt, precision: Precision) -> "DeviceId":
        lanes = int(getattr(rt.device, "native_vector_width_float", 0) or 0) if rt.is_cpu else 0
        return cls(rt.device_name, rt.driver, rt.vendor, rt.device_type, precision.name, lanes)

    def matches(self, rec: dict, level: int) -> bool:
        if rec.get("precision") != self.precision or rec.get("type") != self.type:
            return False
        if self.lanes and wide_vectors(rec.get("lanes", self.lanes)) != wide_vectors(self.lanes):
            return False            # blocks tuned for another vector width (even under this name)
        if level == 0:
            return rec.get("device") == self.device and rec.get("driver") == self.driver
        if level == 1:
            return rec.get("device") == self.device and rec.get("driver") != self.driver
        if level == 2:
            return rec.get("vendor") == self.vendor and rec.get("device") != self.device
        return rec.get("vendor") != self.vendor

    def header(self) -> dict:
        out = {"device": self.device, "driver": self.driver, "vendor": self.vendor, "type": self.type,
               "precision": self.precision}
        return {**out, "lanes": self.lanes} if self.lanes else out


# -- files --------------------------------------------------------------------------------
def user_db_path() -> Path:
    return cache_dir() / "tuning.yaml"


def shipped_db_paths() -> list:
    """The tuning files that ship with yolo-cl; none with ``YOLO_CL_NO_SHIPPED_TUNING=1`` (to see
    what the user cache and the heuristic alone give, e.g. on a device nobody has tuned)."""
    if os.environ.get("YOLO_CL_NO_SHIPPED_TUNING", "").strip() == "1":
        return []
    root = resource_dir("configs")
    return sorted(root.glob("*.yaml")) if root.is_dir() else []


MAX_DB_BYTES = 4 << 20      # ~40000 tuned shapes; a 20 MiB file took 98 s and 1.5 GB to parse


def read_db(path: Path) -> list:
    """The records of one database file; a missing file is empty; a corrupt one, or one over
    MAX_DB_BYTES, warns once and is empty. Parsed files are kept by (size, mtime), so a second
    Detector in the same process does not parse the database again."""
    import yaml
    from .userfiles import read_bytes
    path = Path(path)
    try:
        st = path.stat()
    except (OSError, ValueError):
        return []
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    cached = _PARSED.get(str(path))
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        text = read_bytes(path, "tuning database", MAX_DB_BYTES).decode()
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))   # libyaml: 10x
    except YoloClError as e:
        _warn_once(f"corrupt:{path}", f"{e}; ignoring it (run 'yolo-cl tune --db' with a new file)")
        return []
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        _warn_once(f"corrupt:{path}", f"tuning database {path} is unreadable ({str(e).splitlines()[0][:120]}); "
                                      f"ignoring it")
        return []
    if data is None:
        return []
    recs = data.get("records") if isinstance(data, dict) else None
    if not isinstance(recs, list) or not all(isinstance(r, dict) and isinstance(r.get("configs"), dict)
                                             for r in recs):
        _warn_once(f"corrupt:{path}", f"tuning database {path} is not a yolo-cl tuning file; ignoring it")
        return []
    _PARSED[str(path)] = (stamp, recs)
    return recs


def check_db_writable(path: Path) -> None:
    """Refuse, before tuning, a database file that merging would lose (over MAX_DB_BYTES)."""
    try:
        size = Path(path).stat().st_size
    except OSError:
        return
    if size > MAX_DB_BYTES:
        raise YoloClError(f"{path}: tuning database is {size} bytes, more than the {MAX_DB_BYTES} byte limit; "
                          f"give another --db file")


def merge_records(old: list, new: list) -> list:
    """``old`` with ``new`` folded in: same identity -> configs merged (new wins), else appended."""
    out = copy.deepcopy(old)
    ident = ("device", "driver", "vendor", "type", "precision")
    for rec in new:
        same = next((r for r in out if all(r.get(k) == rec.get(k) for k in ident)), None)
        if same is None:
            out.append(copy.deepcopy(rec))
        else:
            same["configs"].update(copy.deepcopy(rec["configs"]))
            if "lanes" in rec:
                same["lanes"] = rec["lanes"]
    return out


def write_db(path: Path, records: list) -> None:
    """Merge ``records`` into the file at ``path`` under an exclusive lock; the write is atomic.

    Concurrent tuners each lock, re-read what is there now, merge and replace, so none loses
    another's entries and a reader never sees half a file.
    """
    import fcntl
    import yaml
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            check_db_writable(path)
            merged = merge_records(read_db(path), records)
            text = "# yolo-cl tuning database: tuned kernel configs per device, layer shape and precision.\n" + \
                yaml.safe_dump({"version": DB_VERSION, "records": merged}, sort_keys=False, default_flow_style=None,
                               width=200)
            atomic_write(path, text.encode())
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _warn_once(key: str, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(msg)


# -- the database -------------------------------------------------------------------------
def _any_config(node: Node, config) -> bool:
    return isinstance(config, dict)


class TuningDatabase:
    """Tuned conv configs for one device and precision, with hierarchical fall-back."""

    def __init__(self, rt, precision: Precision, paths: Optional[list] = None,
                 user_path: Optional[Path] = None, fits: Callable[[Node, object], bool] = _any_config) -> None:
        """``rt``: the runtime whose device the records are filed under; ``precision``: the
        precision they were tuned in; ``paths``: the shipped files (default: ``configs/*.yaml``);
        ``fits(node, config)``: whether a stored config may run ``node`` (default: any dict; the
        engine passes ``kernels.family.stored_config_fits``)."""
        self.fits = fits
        self.precision = precision
        self.id = DeviceId.of(rt, precision)
        self.user_path = Path(user_path) if user_path is not None else user_db_path()
        shipped = shipped_db_paths() if paths is None else [Path(p) for p in paths]
        self.sources = [self.user_path] + [p for p in shipped if p != self.user_path]
        self.records = [(p, r) for p in self.sources for r in read_db(p)]
        self.origin: dict = {}        # shape key -> (level name, file) of the last look-up
        self.stale: dict = {}         # shape key -> config found only under another driver

    def lookup(self, node: Node, batch: int = 1) -> Optional[dict]:
        """The stored config for ``node`` (a copy), or None; records where it came from."""
        key = shape_key(node, batch)
        keys = [key] + _neighbour_keys(node, batch)
        for level in range(len(LEVELS)):
            for path, rec in self.records:
                if not self.id.matches(rec, level):
                    continue
                for k in keys:
                    cfg = rec["configs"].get(k)
                    if cfg is None:
                        continue
                    cfg = {kk: v for kk, v in cfg.items() if kk not in ("ms", "gflops")} \
                        if isinstance(cfg, dict) else cfg
                    if not self.fits(node, cfg):
                        continue
                    self.origin[key] = (LEVELS[level], str(path))
                    if level == 1:
                        self.stale[key] = cfg
                        _warn_once(f"stale:{self.id.device}:{rec.get('driver')}",
                                   f"tuned configs for {self.id.device} come from driver {rec.get('driver')}, "
                                   f"this is {self.id.driver}: using them; run 'yolo-cl tune' to re-validate")
                    return dict(cfg)
        return None

    def lookup_key(self, key: str, max_level: int = 1) -> Optional[dict]:
        """A config stored under ``key`` for this device (levels 0..max_level: by default the same
        device name, any driver), without timing fields; None if absent. For non-conv users
        (``yolo_cl.ops``), which check the config against their own candidates."""
        for level in range(max_level + 1):
            for _, rec in self.records:
                cfg = rec["configs"].get(key) if self.id.matches(rec, level) else None
                if isinstance(cfg, dict):
                    return {k: v for k, v in cfg.items() if k not in ("ms", "gflops")}
        return None

    def conv_config(self, node: Node, batch: int = 1) -> Optional[dict]:
        """The config the executor binds for ``node``, or None ("no entry": the caller uses its
        heuristic); ``origin`` records which."""
        cfg = self.lookup(node, batch)
        if cfg is None:
            self.origin[shape_key(node, batch)] = (NO_ENTRY, "")
        return cfg

    def record(self, entries: dict, path: Optional[Path] = None) -> Path:
        """Store {shape key: config} for this device, driver and precision (merged, locked, atomic)."""
        path = Path(path) if path is not None else self.user_path
        write_db(path, [{**self.id.header(), "configs": entries}])
        self.records = [(p, r) for p in self.sources for r in read_db(p)]
        if path not in self.sources:
            self.sources.append(path)
            self.records += [(path, r) for r in read_db(path)]
        for k in entries:
            self.stale.pop(k, None)
        return path


def entries(results: list) -> dict:
    """Database entries {shape key: config + measured ms and GFLOP/s} from tuning results."""
    out = {}
    for r in results:
        if r.ms < math.inf:
            out[r.key] = {**r.config, "ms": round(r.ms, 4), "gflops": round(r.gflops, 2)}
    return out
