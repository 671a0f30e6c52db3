"""The tensor-core tests' setup: one runtime per module, and the mma emulation where the device
has no tensor cores (PoCL in CI), the real instruction where it has. A test module imports both
fixtures (``from mma_env import emulate, rt``)."""
from __future__ import annotations

import pytest

from yolo_cl.kernels import gemm_mma as gm
from yolo_cl.runtime import Runtime


@pytest.fixture(scope="module")
def rt():
    return Runtime()


@pytest.fixture(autouse=True)
def emulate(rt, monkeypatch):
    """Emulated mma where the device has no tensor cores; the real instruction where it has."""
    if not gm.tensor_cores(rt):
        monkeypatch.setenv(gm.EMULATE_ENV, "1")


@pytest.fixture
def emulate_hopper(rt, monkeypatch):
    """Emulated wgmma and mma where the device is not a Hopper GPU; the real instructions where it
    is (the wgmma family's tests: ``from mma_env import emulate_hopper, rt``, used autouse)."""
    from yolo_cl.kernels import gemm_wgmma as gw
    if not gw.hopper(rt):
        monkeypatch.setenv(gw.EMULATE_ENV, "1")
        monkeypatch.setenv(gm.EMULATE_ENV, "1")
