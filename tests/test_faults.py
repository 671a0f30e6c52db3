"""OpenCL faults: bad kernel configs, out-of-memory, no platform, absurd sizes, garbage weights.

Faults are injected (a tuning database that returns broken configs, a runtime whose
builds or allocations fail, pyopencl without platforms); each must end in the fallback
result or in one clear yolo_cl error, never a crash or a wrong answer.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pyopencl as cl
import pytest

from yolo_cl import Detector
from yolo_cl.errors import DeviceError, LimitError
from yolo_cl.kernels.conv import heuristic_config
from yolo_cl.runtime import Runtime

ROOT = Path(__file__).resolve().parents[1]
TINY_CFG = ROOT / "models" / "yolov3-tiny.cfg"
TINY_WEIGHTS = ROOT / "models" / "yolov3-tiny.weights"
SIZE = 64


class HeuristicTuning:
    """A tuning database that always answers the heuristic (the reference)."""

    def __init__(self, rt):
        self.rt = rt

    def conv_config(self, node, batch=1):
        return heuristic_config(node, self.rt, batch)


class BrokenTuning(HeuristicTuning):
    """A tuning database whose every answer is ``bad(node)`` (or raises it, if it is an exception)."""

    def __init__(self, rt, bad):
        super().__init__(rt)
        self.bad = bad
        self.asked = 0

    def conv_config(self, node, batch=1):
        self.asked += 1
        out = self.bad(node, self.heuristic(node, batch))
        if isinstance(out, BaseException):
            raise out
        return out

    def heuristic(self, node, batch):
        return heuristic_config(node, self.rt, batch)


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


@pytest.fixture(scope="module")
def blob():
    rng = np.random.default_rng(0)
    return rng.random((1, 3, SIZE, SIZE), dtype=np.float32)


@pytest.fixture(scope="module")
def reference(runtime, blob):
    det = Detector(TINY_CFG, TINY_WEIGHTS, input_size=SIZE, device=runtime.device,
                   tuning=HeuristicTuning(runtime))
    return det.forward(blob)


def _detector(runtime, make_tuning):
    """A yolov3-tiny Detector on ``runtime``'s device with the tuning database ``make_tuning(runtime)``."""
    return Detector(TINY_CFG, TINY_WEIGHTS, input_size=SIZE, device=runtime.device, tuning=make_tuning(runtime))


def _gemm_with_tm3_fails_to_build(monkeypatch):
    """Make every program specialised with TM=3 fail to build, as a driver bug would."""
    real = Runtime.program

    def program(self, source, defines=None):
        if (defines or {}).get("TM") == 3:
            raise DeviceError(f"kernel {source} -DTM=3 failed to build on {self.device_name}: error: injected")
        return real(self, source, defines)

    monkeypatch.setattr(Runtime, "program", program)


def test_tuned_config_that_fails_to_build_falls_back_to_the_heuristic(runtime, blob, reference, monkeypatch, caplog):
    _gemm_with_tm3_fails_to_build(monkeypatch)
    tm3 = lambda node, h: dict(h, TM=3) if "TM" in h else h   # noqa: E731
    caplog.set_level(logging.WARNING, logger="yolo_cl.kernels")
    det = _detector(runtime, lambda rt: BrokenTuning(rt, tm3))
    out = det.forward(blob)
    for a, b in zip(out, reference):
        np.testing.assert_array_equal(a, b)
    warned = [r for r in caplog.records if "failed" in r.getMessage() and "using the heuristic" in r.getMessage()]
    assert warned, "the fallback must be reported"
    assert all("\n" not in r.getMessage() for r in warned)
    # Once per layer and config: a second executor (batch 2) binds the same choices without new warnings.
    n = len(warned)
    det.forward(np.concatenate([blob, blob]))
    again = [r for r in caplog.records if "using the heuristic" in r.getMessage()]
    assert len(again) == n


@pytest.mark.parametrize("bad", [
    lambda node, h: dict(h, TM="(1/0)"),                       # a define value that is not a number
    lambda node, h: dict(h, VW=3),                              # not a vector width the kernel has
    lambda node, h: {"algo": "gemm1x1", "TM": 4, "VW": 8, "KU": 1} if node.attrs["size"] > 1 else h,  # wrong algo
    lambda node, h: {"algo": "no-such-algorithm"},
    lambda node, h: {},
    lambda node, h: None,
    lambda node, h: KeyError("entry vanished"),
    lambda node, h: ValueError("corrupt entry"),
], ids=["bad_define", "bad_vector_width", "wrong_algorithm", "unknown_algorithm", "empty", "none", "lookup_raises",
        "lookup_raises_value"])
def test_malformed_tuned_configs_are_rejected(runtime, blob, reference, bad, caplog):
    caplog.set_level(logging.WARNING, logger="yolo_cl.kernels")
    det = _detector(runtime, lambda rt: BrokenTuning(rt, bad))
    out = det.forward(blob)
    for a, b in zip(out, reference):
        np.testing.assert_array_equal(a, b)


def test_heuristic_that_fails_to_build_is_one_clear_error(runtime, monkeypatch):
    """No fallback left: a DeviceError naming the layer and the build failure (not a loop, not a traceback)."""
    real = Runtime.program

    def program(self, source, defines=None):
        if source in ("gemm.cl", "winograd.cl"):      # layer 0's heuristic kernel, whichever it is
            raise DeviceError(f"kernel {source} failed to build on {self.device_name}: error: injected")
        return real(self, source, defines)

    monkeypatch.setattr(Runtime, "program", program)
    with pytest.raises(DeviceError, match=r"layer 0 \(conv 3x3/1 leaky\).*failed to build.*injected") as e:
        _detector(runtime, HeuristicTuning)
    assert "\n" not in str(e.value)


def test_a_compiler_that_does_not_know_the_cpu_says_what_to_install(runtime, monkeypatch):
    """A PoCL whose LLVM predates the CPU (pip's PoCL 3.0 on a Zen 5) refuses every kernel with
    "unknown target CPU 'generic'": the one line says so and what to install instead."""
    def refuse(self, options=None):
        raise cl.RuntimeError("clBuildProgram failed: BUILD_PROGRAM_FAILURE\nBuild on <device>:\n\n"
                              "error: unknown target CPU 'generic'\n")
    monkeypatch.setattr(cl.Program, "build", refuse)
    with pytest.raises(DeviceError) as e:
        runtime._compile("ops.cl", "__kernel void k() {}", "-DX=1")
    msg = str(e.value)
    assert "\n" not in msg and "ops.cl -DX=1 failed to build" in msg
    assert "unknown target CPU" in msg and "apt install pocl-opencl-icd" in msg


def test_the_default_device_passes_over_a_cpu_driver_that_builds_nothing(monkeypatch):
    """Two CPU drivers (pip's PoCL and the system's): the first that builds is picked; a GPU or a
    lone device is picked without building anything."""
    from yolo_cl import runtime as rtmod

    class Dev:
        def __init__(self, name, kind):
            self.name, self.type = name, kind
    old, new = Dev("old pocl", cl.device_type.CPU), Dev("new pocl", cl.device_type.CPU)
    monkeypatch.delenv("YOLO_CL_DEVICE", raising=False)
    asked = []
    monkeypatch.setattr(rtmod, "builds", lambda d: asked.append(d.name) or d is new)
    monkeypatch.setattr(rtmod, "list_devices", lambda: [(0, 0, None, old), (1, 0, None, new)])
    assert rtmod.select_device() is new and asked == ["old pocl", "new pocl"]
    monkeypatch.setattr(rtmod, "builds", lambda d: False)
    assert rtmod.select_device() is old          # none builds: the first, whose error then says why
    gpu = Dev("gpu", cl.device_type.GPU)
    asked.clear()
    monkeypatch.setattr(rtmod, "builds", lambda d: asked.append(d.name) or True)
    monkeypatch.setattr(rtmod, "list_devices", lambda: [(0, 0, None, old), (1, 0, None, gpu)])
    assert rtmod.select_device() is gpu and not asked
    monkeypatch.setattr(rtmod, "list_devices", lambda: [(0, 0, None, old)])
    assert rtmod.select_device() is old and not asked


def test_builds_tells_a_working_compiler(runtime):
    from yolo_cl.runtime import builds
    assert builds(runtime.device)


# -- out of memory --------------------------------------------------------------------------------
def test_out_of_device_memory_names_what_and_how_much(runtime, monkeypatch):
    def no_memory(*args, **kwargs):
        raise cl.MemoryError("clCreateBuffer failed: MEM_OBJECT_ALLOCATION_FAILURE")

    monkeypatch.setattr(cl, "Buffer", no_memory)
    with pytest.raises(DeviceError, match=r"out of device memory: activation pool \(\d+ tensors\) needs [\d.]+ MiB"):
        Detector(TINY_CFG, TINY_WEIGHTS, input_size=SIZE, device=runtime.device, tuning=HeuristicTuning(runtime))


def test_allocation_beyond_the_device_limit_is_refused_with_its_size(runtime):
    too_big = runtime.device.max_mem_alloc_size + (1 << 20)
    with pytest.raises(DeviceError, match=rf"test buffer needs {too_big / 2**20:.1f} MiB, more than the device's"):
        runtime.alloc(too_big, "test buffer")


class SmallDevice:
    """What the executor reads from a device before its guard: a 2 GiB GPU (its size, and the
    limits the kernel families choose configs by, which decide the workspace)."""

    name = "Tiny GPU"
    global_mem_size = 2 << 30
    max_mem_alloc_size = 1 << 30
    max_work_group_size = 1024
    local_mem_size = 48 << 10
    max_compute_units = 16


class NoAllocRuntime:
    """A runtime whose allocations fail the test: the guard must stop the executor first."""

    device = SmallDevice()
    device_name = SmallDevice.name
    is_cpu = False

    def alloc(self, nbytes, what):
        pytest.fail(f"allocated {nbytes} bytes for {what} despite the memory guard")


def test_executor_refuses_a_model_larger_than_the_device(monkeypatch):
    """yolov3-tiny at 4096x4096 fits the 16 GiB default cap per layer, not a 2 GiB device."""
    from yolo_cl.cfg import parse_cfg
    from yolo_cl.executor import Executor
    from yolo_cl.graph import build_graph
    from yolo_cl.layers import build_layers, parse_net
    sections = parse_cfg(TINY_CFG)
    net = parse_net(sections[0], 4096)
    layers = build_layers(sections, net)
    graph = build_graph(net, layers, None)
    with pytest.raises(LimitError, match=r"layer \d+ \[convolutional\] would need [\d.]+ GiB of a batch-1 total "
                                         r"[\d.]+ GiB .*more than the 2.0 GiB limit \(global memory of Tiny GPU"):
        Executor(NoAllocRuntime(), graph, 1)


def test_absurd_input_size_is_refused_before_allocating(runtime, monkeypatch):
    """16384x16384: a LimitError naming a layer, before any device allocation."""
    allocs = []
    monkeypatch.setattr(Runtime, "alloc", lambda self, n, what: allocs.append(n))
    with pytest.raises(LimitError, match=r"layer \d+ \[convolutional\] would need"):
        Detector(TINY_CFG, TINY_WEIGHTS, input_size=16384, device=runtime.device, tuning=HeuristicTuning(runtime))
    assert not allocs


def test_memory_cap_env_var_guards_the_executor(runtime, monkeypatch):
    """A cap above every single layer but below the whole model stops the Executor, not build_layers."""
    monkeypatch.setenv("YOLO_CL_MAX_BYTES", "40M")
    allocs = []
    monkeypatch.setattr(Runtime, "alloc", lambda self, n, what: allocs.append(n))
    with pytest.raises(LimitError, match=r"would need .*more than the 40.0 MiB limit \(YOLO_CL_MAX_BYTES\)"):
        Detector(TINY_CFG, TINY_WEIGHTS, input_size=416, device=runtime.device, tuning=HeuristicTuning(runtime))
    assert not allocs


# -- no OpenCL at all -----------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["empty", "raises"])
def test_no_opencl_platform_says_how_to_install_pocl(monkeypatch, how):
    def get_platforms():
        if how == "raises":
            raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")
        return []

    monkeypatch.setattr(cl, "get_platforms", get_platforms)
    with pytest.raises(DeviceError, match="pip install pocl-binary-distribution") as e:
        Detector("yolov3-tiny", input_size=SIZE)
    assert "\n" not in str(e.value)


def test_no_opencl_platform_in_the_cli(monkeypatch, capsys):
    from yolo_cl.cli import main
    monkeypatch.setattr(cl, "get_platforms", lambda: [])
    code = main(["detect", str(ROOT / "models" / "images" / "dog.jpg"), "--size", "64"])
    err = capsys.readouterr().err
    assert code == 2
    assert "pocl-binary-distribution" in err and len(err.strip().splitlines()) == 1


# -- garbage that is finite ----------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # folding 3e38 weights overflows, as intended
def test_finite_but_absurd_weights_do_not_crash_detection(runtime, tmp_path):
    """Finite weights of +-3e38 overflow to inf/NaN on the device: detect returns a list, never raises."""
    from yolo_cl.cfg import parse_cfg
    from yolo_cl.layers import build_layers, parse_net
    sections = parse_cfg(TINY_CFG)
    layers = build_layers(sections, parse_net(sections[0], SIZE))
    rng = np.random.default_rng(1)
    parts = []
    for l in layers:
        if l.kind != "convolutional":
            continue
        n, k = l.p["filters"], (l.p["in_c"] // l.p["groups"]) * l.p["size"] ** 2
        huge = lambda m: rng.choice(np.array([3e38, -3e38, 1.0], np.float32), m)   # noqa: E731
        parts.append(huge(n))                                                      # biases
        if l.p["bn"]:
            parts += [huge(n), np.zeros(n, np.float32), np.full(n, 1e-30, np.float32)]  # scales, mean, variance
        parts.append(huge(n * k))                                                  # weights
    path = tmp_path / "absurd.weights"
    path.write_bytes(TINY_WEIGHTS.read_bytes()[:20] + np.concatenate(parts).astype("<f4").tobytes())
    det = Detector(TINY_CFG, path, input_size=SIZE, device=runtime.device, tuning=HeuristicTuning(runtime))
    heads = det.forward(rng.random((1, 3, SIZE, SIZE), dtype=np.float32))
    assert any(not np.all(np.isfinite(h)) for h in heads), "the weights should overflow"
    img = (rng.random((48, 80, 3)) * 255).astype(np.uint8)
    out = det.detect(img)
    assert isinstance(out, list)
    for d in out:
        assert np.all(np.isfinite(d.box)) and 0 <= d.confidence <= 1


# -- the on-disk kernel cache ---------------------------------------------------------------------
CACHE_PROBE = """
import numpy as np
from yolo_cl import Detector
det = Detector("yolov3-tiny", input_size=64)
heads = det.forward(np.full((1, 3, 64, 64), 0.5, np.float32))
print("builds", det.runtime.builds, "sum", float(sum(h.sum() for h in heads)))
"""


def _probe(cache: Path, export: bool = True) -> tuple:
    """Run a Detector in a child process (a driver crash must not take pytest down): (builds, checksum).
    ``export=False``: YOLO_CL_EXPORT_BINARIES=0 (where the driver caches its builds itself, no binaries)."""
    import subprocess
    import sys
    env = dict(os.environ, YOLO_CL_CACHE=str(cache), YOLO_CL_EXPORT_BINARIES="1" if export else "0")
    env.pop("YOLO_CL_NO_BINARY_CACHE", None)
    r = subprocess.run([sys.executable, "-c", CACHE_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    words = r.stdout.split()
    return int(words[words.index("builds") + 1]), float(words[words.index("sum") + 1])


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A kernel cache filled by one cold run, and the heads' checksum."""
    cache = tmp_path_factory.mktemp("kcache") / "cache"
    builds, ref = _probe(cache)
    assert builds > 0
    assert _probe(cache) == (0, ref)             # warm start: everything from the cache
    return cache, ref


@pytest.mark.parametrize("damage", ["truncate", "flip_bytes", "foreign"])
def test_damaged_kernel_cache_is_rebuilt_not_loaded(tmp_path, warm_cache, damage):
    """A truncated binary crashes PoCL if loaded: damaged cache files must be detected and rebuilt."""
    import shutil
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache[0], cache)
    ref = warm_cache[1]
    bins = sorted((cache / "binaries").glob("*.bin"))
    assert len(bins) > 2
    bins = bins[:2]      # two damaged among sound ones: each rebuild exports again, which costs PoCL seconds
    rng = np.random.default_rng(0)
    for f in bins:
        data = bytearray(f.read_bytes())
        if damage == "truncate":
            data = data[:len(data) // 2]
        elif damage == "flip_bytes":
            for i in rng.integers(0, len(data), 20):
                data[i] ^= 0xFF
        else:   # a raw driver binary without yolo-cl's seal (e.g. an older cache)
            data = data[len(b"yolo-cl binary 1\n") + 32:]
        f.write_bytes(bytes(data))
    assert _probe(cache) == (len(bins), ref)     # every damaged binary rebuilt from source, same answer
    if damage == "truncate":
        assert _probe(cache) == (0, ref)         # and the cache is healthy again


def test_driver_cached_builds_are_recorded_not_exported(tmp_path):
    """With YOLO_CL_EXPORT_BINARIES=0, where the driver caches its own builds (PoCL), no binary is
    exported (exporting one compiles every kernel of the program), yet a warm start counts no
    build and gives the same answer."""
    from yolo_cl.runtime import Runtime, driver_caches_builds
    cache = tmp_path / "cache"
    builds, ref = _probe(cache, export=False)
    assert builds > 0
    if driver_caches_builds(Runtime().device):
        assert not list((cache / "binaries").glob("*.bin"))
        assert len(list((cache / "binaries").glob("*.held"))) == builds
    else:
        assert len(list((cache / "binaries").glob("*.bin"))) == builds
    assert _probe(cache, export=False) == (0, ref)
