"""Talk to OpenCL: pick a device, own a context and queue, build and cache programs.

Programs are ``cl/*.cl`` sources specialised with ``-D`` defines. Each (source, defines)
pair is built once per process; built binaries are also cached on disk per device,
driver and source hash, so a warm start skips the compiler entirely. Where the driver keeps
an on-disk cache of its own source builds (PoCL), that cache serves the warm start and yolo-cl
records only which programs it holds: exporting a PoCL binary generates machine code for every
kernel of the program, which triples the cost of a first run (``YOLO_CL_EXPORT_BINARIES=1``
exports anyway).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np

from .errors import DeviceError
from .resources import resource_dir

INSTALL_HINT = ("no OpenCL device found. Install a driver for your GPU, or the CPU device from PyPI: "
                "pip install pocl-binary-distribution")
# A PoCL whose LLVM predates the host CPU (pip's pocl-binary-distribution 3.0 on an AMD Zen 5) names
# it "generic", which its own compiler then refuses: no kernel builds on that device.
UNKNOWN_CPU = "unknown target CPU"
UNKNOWN_CPU_HINT = ("this PoCL's compiler does not know this CPU: install a newer PoCL, e.g. Debian/Ubuntu's "
                    "'apt install pocl-opencl-icd', or pick another device with --device")
COPY_QUEUE_ENV = "YOLO_CL_COPY_QUEUE"   # "0": uploads on the kernels' queue; "1": a copy queue on a CPU too


def _cl():
    try:
        import pyopencl as cl
    except ImportError as e:   # pragma: no cover - pyopencl is a hard dependency
        raise DeviceError(f"pyopencl is not importable ({e}); pip install pyopencl") from None
    return cl


def list_devices() -> list:
    """All OpenCL devices as (platform index, device index, platform, device)."""
    cl = _cl()
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        return []
    out = []
    for pi, p in enumerate(platforms):
        try:
            devs = p.get_devices()
        except cl.Error:
            continue
        for di, d in enumerate(devs):
            out.append((pi, di, p, d))
    return out


def select_device(spec: Optional[Union[str, int]] = None):
    """Pick a device: ``"P:D"`` indices, an index into the flat list, or a name substring.

    Default (None): the ``YOLO_CL_DEVICE`` environment variable, else the first GPU, else the first
    device whose compiler builds for it (see :func:`builds`, asked only where there is a choice).
    """
    devices = list_devices()
    if not devices:
        raise DeviceError(INSTALL_HINT)
    spec = os.environ.get("YOLO_CL_DEVICE") if spec is None else spec
    if spec is None or spec == "":
        cl = _cl()
        gpus = [d for d in devices if d[3].type & cl.device_type.GPU]
        if gpus or len(devices) == 1:
            return (gpus or devices)[0][3]
        return next((d[3] for d in devices if builds(d[3])), devices[0][3])
    s = str(spec).strip()
    if ":" in s and all(part.isdigit() for part in s.split(":", 1)):
        pi, di = (int(v) for v in s.split(":", 1))
        for d in devices:
            if d[0] == pi and d[1] == di:
                return d[3]
        raise DeviceError(f"no OpenCL device {s}; run 'yolo-cl devices' to list them")
    if s.isdigit():
        i = int(s)
        if i < len(devices):
            return devices[i][3]
        raise DeviceError(f"no OpenCL device {s}; there are {len(devices)} (run 'yolo-cl devices')")
    for d in devices:
        if s.lower() in d[3].name.lower() or s.lower() in d[2].name.lower():
            return d[3]
    raise DeviceError(f"no OpenCL device matches '{s}'; run 'yolo-cl devices' to list them")


def build_error(device) -> Optional[str]:
    """Why ``device``'s compiler does not build a one-line kernel (the compiler's error line, with
    ``UNKNOWN_CPU_HINT`` for a PoCL that cannot target the host CPU), or None where it does. None
    without building where PoCL's kernel cache cannot be written: some PoCL builds end the process
    on a full disk (LLVM's "IO failure on output stream"), and the build that follows then reports
    the full disk in one line."""
    cl = _cl()
    if is_pocl(device) and unwritable(pocl_cache_dir()) is not None:
        return None
    try:
        ctx = cl.Context([device])
        cl.Program(ctx, "__kernel void k(__global int *a) { a[0] = 1; }").build()
        return None
    except cl.Error as e:
        return build_failure(e, 200)


def build_failure(e: Exception, limit: int) -> str:
    """The line of a failed build's log that names the error (up to ``limit`` characters), with
    ``UNKNOWN_CPU_HINT`` where the compiler does not know the host CPU."""
    log = str(e).strip().splitlines()
    line = next((l for l in log if "error" in l.lower()), log[-1] if log else "").strip()
    return line[:limit] + (f" ({UNKNOWN_CPU_HINT})" if UNKNOWN_CPU in line else "")


def builds(device) -> bool:
    """Whether ``device``'s compiler builds a one-line kernel (:func:`build_error`): False for a
    PoCL that cannot target the host CPU, so the default pick passes over it to a second CPU driver."""
    return build_error(device) is None


def cache_dir() -> Path:
    """Per-user cache root (program binaries, user tuning database)."""
    root = os.environ.get("YOLO_CL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "yolo-cl")
    return Path(root)


def wide_vectors(lanes) -> bool:
    """Whether a CPU whose OpenCL device reports ``lanes`` native float lanes has 16-float vectors
    (AVX-512): the line the CPU family's untuned pick and the tuning database's CPU records are
    drawn at (AVX2 and narrower units keep the 8-float rules and share records)."""
    return isinstance(lanes, int) and lanes >= 16


def atomic_write(path: Union[str, Path], data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file + rename, so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # mkstemp makes 0600; outputs get the user's usual mode
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def is_pocl(device) -> bool:
    """A PoCL device (False for a stand-in device without a platform)."""
    try:
        return "portable computing language" in device.platform.name.lower()
    except Exception:       # noqa: BLE001 - a stand-in device without a platform
        return False


def driver_caches_builds(device) -> bool:
    """True where the driver caches source builds on disk itself, for later processes: PoCL, unless
    ``POCL_KERNEL_CACHE=0``. There exporting a program binary costs more than the build: PoCL
    compiles every kernel of the program to machine code to export it (yolov3-tiny: 19 s of CPU
    time on top of 3 s of building), while a rebuild from source in a later process is a hit in
    PoCL's cache (which, unlike loading a binary, writes a temp file: it fails on a full disk)."""
    return is_pocl(device) and os.environ.get("POCL_KERNEL_CACHE", "1").strip() != "0"


def pocl_cache_dir() -> Path:
    """PoCL's own kernel cache (``POCL_CACHE_DIR``, default ``~/.cache/pocl/kcache``)."""
    root = os.environ.get("POCL_CACHE_DIR")
    return Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or
                                        os.path.join(os.path.expanduser("~"), ".cache")) / "pocl" / "kcache"


def unwritable(folder: Path, probe_bytes: int = 1 << 20) -> Optional[str]:
    """Why ``folder`` cannot take a file of ``probe_bytes`` (the reason, e.g. "No space left on
    device"), or None if it can. PoCL's cache writes each build's files, so a full disk there looks
    like a compile error with an empty log (pip's PoCL 3.0), or ends the process (Debian's 3.1):
    asked before the first build that goes through PoCL's cache, and after a build failed."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder) as f:
            f.write(b"\0" * probe_bytes)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return e.strerror or str(e)
    return None


class Runtime:
    """One device, one context, one in-order queue, and the programs built for them."""

    def __init__(self, device=None, profiling: bool = False, binary_cache: bool = True,
                 export_binaries: Optional[bool] = None) -> None:
        """``export_binaries``: write built binaries to the on-disk cache; None (the default) does,
        unless the driver caches its builds itself (PoCL, see :func:`driver_caches_builds`) and
        ``YOLO_CL_EXPORT_BINARIES=1`` does not ask for them anyway. Exported binaries load without
        writing anything, so cached programs still load on a full disk; PoCL's own cache writes a
        temp file per build, and a build that fails for want of space says so."""
        cl = _cl()
        self.cl = cl
        self.device = device if device is not None and not isinstance(device, (str, int)) else select_device(device)
        try:
            self.context = cl.Context([self.device])
            props = cl.command_queue_properties.PROFILING_ENABLE if profiling else 0
            self.queue = cl.CommandQueue(self.context, self.device, properties=props)
        except cl.Error as e:
            raise DeviceError(f"cannot open OpenCL device '{self.device.name}': {e}") from None
        self.profiling = profiling
        self.binary_cache = binary_cache and os.environ.get("YOLO_CL_NO_BINARY_CACHE") != "1"
        if export_binaries is None:
            export_binaries = os.environ.get("YOLO_CL_EXPORT_BINARIES", "0").strip() not in ("", "0") \
                or not driver_caches_builds(self.device)
        self.export_binaries = export_binaries
        self._cache_checked = False   # whether PoCL's kernel cache took a probe file (before the first build)
        self._programs: dict = {}
        self._lock = threading.Lock()
        self._building: dict = {}     # (source, options) -> the lock its builder holds
        self.fp16 = "cl_khr_fp16" in self.device.extensions     # half arithmetic (precision.half_math)
        self.is_cpu = bool(self.device.type & cl.device_type.CPU)
        asked = os.environ.get(COPY_QUEUE_ENV, "").strip()
        self._copies = asked == "1" or (asked != "0" and not self.is_cpu)    # copy_queue, made on first use
        self.builds = 0          # programs compiled from source (not from a cache) in this process
        # compiler options added to every build (e.g. NVIDIA's -cl-nv-maxrregcount=N), for experiments
        self.build_options = os.environ.get("YOLO_CL_BUILD_OPTIONS", "").strip()
        self.on_first_build = None   # called once, before the first compile from source (a notice)

    # -- identity ----------------------------------------------------------------------------
    @property
    def device_name(self) -> str:
        return self.device.name.strip()

    @property
    def driver(self) -> str:
        return self.device.driver_version.strip()

    @property
    def vendor(self) -> str:
        return self.device.vendor.strip()

    @property
    def device_type(self) -> str:
        return "CPU" if self.is_cpu else ("GPU" if self.device.type & self.cl.device_type.GPU else "ACCELERATOR")

    @property
    def program_cache(self) -> Path:
        """The folder where this device's compiled programs are kept between runs: yolo-cl's binary
        cache, or PoCL's kernel cache where no binaries are exported (PoCL, unless ``YOLO_CL_EXPORT_BINARIES=1``)."""
        if self.export_binaries:
            return cache_dir() / "binaries"
        return pocl_cache_dir()

    @property
    def copy_queue(self):
        """A second in-order queue for the frames' and inputs' host-to-device copies, so the next
        frame's DMA runs on the copy engine while ``queue`` still computes the previous frame
        (on one queue it waits for that frame's last kernel); made on first use. None where the
        copies stay on ``queue``: a CPU device, whose copy is a ``memcpy`` on the cores the
        kernels run on, or ``YOLO_CL_COPY_QUEUE=0``; ``=1`` makes one on a CPU device too (tests)."""
        with self._lock:
            if "_copy_queue" not in self.__dict__:
                self._copy_queue = self.cl.CommandQueue(self.context, self.device) if self._copies else None
            return self._copy_queue

    def finish(self) -> None:
        """Wait for everything enqueued on ``queue`` and on the copy queue."""
        copies = self.__dict__.get("_copy_queue")
        if copies is not None:
            copies.finish()
        self.queue.finish()

    # -- memory ------------------------------------------------------------------------------
    def alloc(self, nbytes: int, what: str):
        """A device buffer; a failure names what it was for and how much was asked."""
        cl = self.cl
        nbytes = max(int(nbytes), 4)
        if nbytes > self.device.max_mem_alloc_size:
            raise DeviceError(f"{what} needs {nbytes / 2**20:.1f} MiB, more than the device's largest "
                              f"allocation ({self.device.max_mem_alloc_size / 2**20:.0f} MiB) on {self.device_name}")
        try:
            buf = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes)
            # Touch it so an out-of-memory device fails here, not mid-inference.
            cl.enqueue_fill_buffer(self.queue, buf, np.zeros(1, np.float32), 0, nbytes - nbytes % 4)
            self.queue.finish()
        except cl.Error as e:
            raise DeviceError(f"out of device memory: {what} needs {nbytes / 2**20:.1f} MiB on "
                              f"{self.device_name} ({e})") from None
        return buf

    def upload(self, array: np.ndarray, what: str):
        buf = self.alloc(array.nbytes, what)
        self.cl.enqueue_copy(self.queue, buf, np.ascontiguousarray(array))
        return buf

    @property
    def pool(self):
        """A pyopencl ``MemoryPool`` on this queue, made on first use: buffers freed into it are
        reused by the next allocation of a similar size (``ops``' scratch and outputs, which come
        and go with every call)."""
        pool = self.__dict__.get("_pool")
        if pool is None:
            import pyopencl.tools as clt
            pool = self.__dict__.setdefault("_pool", clt.MemoryPool(clt.ImmediateAllocator(self.queue)))
        return pool

    def pooled(self, nbytes: int, what: str):
        """A buffer from ``pool`` (not touched, nothing waited for: unlike ``alloc``, for buffers
        that live for one call); a failure names what it was for and how much was asked."""
        nbytes = max(int(nbytes), 4)
        largest = int(self.device.max_mem_alloc_size)
        if nbytes > largest:
            raise DeviceError(f"{what} needs {nbytes / 2**20:.1f} MiB, more than the largest allocation "
                              f"({largest / 2**20:.0f} MiB) on {self.device_name}")
        try:
            return self.pool.allocate(nbytes)
        except self.cl.Error as e:
            raise DeviceError(f"out of device memory: {what} needs {nbytes / 2**20:.1f} MiB on "
                              f"{self.device_name} ({e})") from None

    # -- programs ----------------------------------------------------------------------------
    @property
    def build_threads(self) -> int:
        """Threads an executor binds its layers on, so that their programs compile at once:
        ``YOLO_CL_BUILD_THREADS`` if set, else 1 where the driver compiles one program at a time
        (PoCL 3 runs all its LLVM work under one process-wide lock) and up to 8 elsewhere (NVIDIA's
        compiler: 1.8x with 16 threads, BENCHMARKS.md)."""
        v = os.environ.get("YOLO_CL_BUILD_THREADS", "").strip()
        if v.isdigit() and int(v) > 0:
            return int(v)
        return 1 if is_pocl(self.device) else max(1, min(8, os.cpu_count() or 1))

    def program(self, source: str, defines: Optional[dict] = None,
                patch: Optional[Callable[[bytes], bytes]] = None):
        """Build (or fetch from cache) ``cl/<source>`` specialised with ``defines``.

        With ``patch``, the built program's binary goes through ``patch`` and the program is loaded
        again from what it returns (``yolo_cl.ptx.raise_to_sm90a``: instructions the compiler will
        not emit); such programs are kept for the process only, not in the binary cache.
        Thread-safe, and threads building different programs do not wait for each other (the
        tuner compiles its candidates in parallel: compiling, not timing, dominates a search)."""
        defines = defines or {}
        unoptimised = "-cl-opt-disable" if self.is_cpu and any(defines.get(k) for k in UNOPTIMISED) else ""
        opts = " ".join(o for o in (_options(defines), unoptimised, self.build_options) if o)
        key = (source, opts, patch)
        prg = self._programs.get(key)
        if prg is not None:
            return prg
        with self._lock:            # one lock per program: other threads build other programs meanwhile
            lock = self._building.setdefault(key, threading.Lock())
        with lock:
            prg = self._programs.get(key)
            if prg is None:
                prg = self._build(source, opts) if patch is None else self._patched(source, opts, patch)
                self._programs[key] = prg
        return prg

    def _counted_compile(self, source: str, text: str, opts: str):
        """:meth:`_compile`, told to ``on_first_build`` the first time and counted in ``builds``."""
        with self._lock:
            notify, self.on_first_build = self.on_first_build, None
        if notify is not None:
            notify()
        prg = self._compile(source, text, opts)
        with self._lock:
            self.builds += 1
        return prg

    def _patched(self, source: str, opts: str, patch: Callable[[bytes], bytes]):
        """``cl/<source>`` built, its binary patched, and loaded from the patched binary."""
        cl = self.cl
        built = self._counted_compile(source, _source_text(source), opts)
        try:
            binary = patch(built.get_info(cl.program_info.BINARIES)[0])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return cl.Program(self.context, [self.device], [binary]).build()
        except (cl.Error, ValueError) as e:
            detail = next((l for l in str(e).splitlines() if "error" in l.lower()), str(e).splitlines()[0] if str(e) else "")
            raise DeviceError(f"kernel {source} {opts} could not be loaded patched on {self.device_name}: "
                              f"{detail.strip()[:300]}") from None

    def kernel(self, source: str, name: str, defines: Optional[dict] = None):
        """A fresh kernel object (each has its own bound arguments)."""
        return getattr(self.program(source, defines), name)

    def _build(self, source: str, opts: str):
        cl = self.cl
        text = _source_text(source)
        digest = hashlib.sha256("\0".join([text, opts, self.device_name, self.driver, self.vendor,
                                           cl.VERSION_TEXT]).encode()).hexdigest()[:32]
        path = cache_dir() / "binaries" / f"{digest}.bin"
        # No binary exported: a marker that the driver's cache (this folder of it) holds the build.
        held = path.with_name(hashlib.sha256(f"{digest}\0{self.program_cache}".encode()).hexdigest()[:32] + ".held")
        if self.binary_cache and path.is_file():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    binary = unseal_binary(path.read_bytes())
                    if binary is not None:   # a truncated or altered binary can crash the driver: never load one
                        return cl.Program(self.context, [self.device], [binary]).build(options=opts)
            except (cl.Error, OSError):
                pass   # stale or corrupt binary: rebuild from source below
        if self.binary_cache and not self.export_binaries and held.is_file():
            return self._compile(source, text, opts)    # a hit in the driver's cache: no build counted
        prg = self._counted_compile(source, text, opts)
        if self.binary_cache:
            try:
                if self.export_binaries:
                    atomic_write(path, seal_binary(prg.get_info(cl.program_info.BINARIES)[0]))
                else:
                    atomic_write(held, b"")
            except OSError:
                pass   # a read-only cache is not an error
        return prg

    def _cache_full(self, source: str, reason: str) -> DeviceError:
        return DeviceError(f"kernel {source} cannot be built on {self.device_name}: the driver's kernel cache "
                           f"{self.program_cache} cannot be written ({reason}: disk full or file size limit reached)")

    def _compile(self, source: str, text: str, opts: str):
        """The program built from source (one line naming the kernel and options if it fails)."""
        cl = self.cl
        if not self.export_binaries and not self._cache_checked:    # PoCL's cache: see unwritable
            full = unwritable(self.program_cache)
            if full is not None:
                raise self._cache_full(source, full)
            self._cache_checked = True
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # compiler chatter (e.g. ABI notes) is not the user's concern
                return cl.Program(self.context, text).build(options=opts)
        except cl.Error as e:
            full = None if self.export_binaries else unwritable(self.program_cache)
            if full is not None:
                raise self._cache_full(source, full) from None
            raise DeviceError(f"kernel {source} {opts} failed to build on {self.device_name}: "
                              f"{build_failure(e, 300)}") from None


BINARY_MAGIC = b"yolo-cl binary 1\n"


def seal_binary(binary: bytes) -> bytes:
    """A program binary prefixed with a magic line and its SHA-256, for :func:`unseal_binary`."""
    return BINARY_MAGIC + hashlib.sha256(binary).digest() + bytes(binary)


def unseal_binary(data: bytes) -> Optional[bytes]:
    """The binary inside ``data`` if it is complete and unaltered, else None (rebuild from source)."""
    head = len(BINARY_MAGIC) + 32
    if len(data) <= head or not data.startswith(BINARY_MAGIC):
        return None
    binary = data[head:]
    return binary if hashlib.sha256(binary).digest() == data[len(BINARY_MAGIC):head] else None


_SOURCES: dict = {}


def _source_text(name: str) -> str:
    """The kernel source with local #includes inlined (so the build needs no include path)."""
    if name not in _SOURCES:
        root = resource_dir("cl")
        seen: set = set()

        def expand(fname: str) -> str:
            if fname in seen:
                return ""
            seen.add(fname)
            out = []
            for line in (root / fname).read_text().splitlines():
                s = line.strip()
                if s.startswith("#include \"") and s.endswith("\""):
                    out.append(expand(s[len("#include \""):-1]))
                else:
                    out.append(line)
            return "\n".join(out)

        _SOURCES[name] = expand(name)
    return _SOURCES[name]


# Defines that build a kernel for correctness tests only: the tensor-core families' emulations
# (each mma / wgmma computed in plain OpenCL C, so CI on PoCL checks their tiling, indexing and
# epilogues). Such a build skips the compiler's optimisations: PoCL spent about 5x longer
# optimising the unrolled emulation than the tests spend running it (BENCHMARKS.md, "Emulated
# builds without optimisation"), and nothing is timed on it. On a CPU device only: NVIDIA's
# compiler fails to build the emulated wgmma kernel so (an H200, driver 580, twenty-third session).
UNOPTIMISED = ("MMA_EMULATE", "WGMMA_EMULATE")


def _options(defines: dict) -> str:
    parts = []
    for k in sorted(defines):
        v = defines[k]
        if v is None or v is False:
            continue
        parts.append(f"-D{k}" if v is True else f"-D{k}={v}")
    return " ".join(parts)
