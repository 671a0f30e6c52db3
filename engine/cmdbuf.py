"""Record an execution plan's launches once into a ``cl_khr_command_buffer`` and replay it.

pyopencl has no binding for the extension, so this calls it through ctypes: the entry points
come from ``clGetExtensionFunctionAddressForPlatform`` of the ICD loader pyopencl itself uses,
and take pyopencl's raw handles (``int_ptr``). Kernel arguments are captured when a command is
recorded, which is exactly the plan's contract: arguments are bound once and never change.

A replay is one ``clEnqueueCommandBufferKHR`` instead of one enqueue per launch. A buffer
recorded without the simultaneous-use flag may not be enqueued again while a previous replay is
pending (PoCL 3.1 refuses with ``CL_INVALID_OPERATION``): ``Executor.run`` finishes its queue every
frame, but frames in flight (``Detector.submit``, the device path) enqueue the next pass while the
last one runs. So each replay keeps its event, and :meth:`CommandBuffer.enqueue` replays only once
the last one is complete; the caller enqueues the launch list otherwise.
Written against the provisional extension's revision 0.9.x (PoCL 3.1 and later list it).
"""
from __future__ import annotations

import ctypes
from typing import Optional

from .errors import DeviceError
from .launch import loader

EXTENSION = "cl_khr_command_buffer"

_vp, _u32, _i32 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32
_SIZES = ctypes.POINTER(ctypes.c_size_t)
_SIGNATURES = {   # name -> (return type, argument types), from cl_ext.h
    "clCreateCommandBufferKHR": (_vp, (_u32, ctypes.POINTER(_vp), _vp, ctypes.POINTER(_i32))),
    "clCommandNDRangeKernelKHR": (_i32, (_vp, _vp, _vp, _vp, _u32, _SIZES, _SIZES, _SIZES, _u32, _vp, _vp, _vp)),
    "clFinalizeCommandBufferKHR": (_i32, (_vp,)),
    "clEnqueueCommandBufferKHR": (_i32, (_u32, _vp, _vp, _u32, _vp, _vp)),
    "clReleaseCommandBufferKHR": (_i32, (_vp,)),
}
_EVENT_STATUS = 0x11D3       # CL_EVENT_COMMAND_EXECUTION_STATUS: CL_COMPLETE (0) once the replay is over


def supported(device) -> bool:
    """Whether ``device`` (a pyopencl Device) lists the extension."""
    return EXTENSION in (getattr(device, "extensions", "") or "").split()


def _entry_points(platform) -> dict:
    lib = loader()
    get = lib.clGetExtensionFunctionAddressForPlatform
    get.restype, get.argtypes = _vp, [_vp, ctypes.c_char_p]
    out = {}
    for name, (res, args) in _SIGNATURES.items():
        addr = get(platform.int_ptr, name.encode())
        if not addr:
            raise DeviceError(f"{EXTENSION} is listed but {name} is missing on {platform.name.strip()}")
        out[name] = ctypes.CFUNCTYPE(res, *args)(addr)
    return out


def _event_calls() -> tuple:
    """(clGetEventInfo, clReleaseEvent) of the ICD loader, typed."""
    lib = loader()
    info, release = lib.clGetEventInfo, lib.clReleaseEvent
    info.restype, info.argtypes = _i32, [_vp, _u32, ctypes.c_size_t, _vp, _vp]
    release.restype, release.argtypes = _i32, [_vp]
    return info, release


class CommandBuffer:
    """The launches of a plan recorded into one command buffer on ``queue``."""

    def __init__(self, queue, launches: list) -> None:
        device = queue.device
        if not supported(device):
            raise DeviceError(f"{device.name.strip()} does not offer {EXTENSION}")
        self._fn = _entry_points(device.platform)
        self._queue = queue
        self._event_info, self._release_event = _event_calls()
        self._last = _vp()           # the last replay's event (None before the first)
        self._status = _i32(0)
        queues = (_vp * 1)(queue.int_ptr)
        err = _i32(0)
        self._handle: Optional[int] = self._fn["clCreateCommandBufferKHR"](1, queues, None, ctypes.byref(err))
        if err.value or not self._handle:
            raise DeviceError(f"clCreateCommandBufferKHR failed ({err.value}) on {device.name.strip()}")
        try:
            for l in launches:
                gsize = (ctypes.c_size_t * len(l.gsize))(*l.gsize)
                lsize = (ctypes.c_size_t * len(l.lsize))(*l.lsize) if l.lsize else None
                code = self._fn["clCommandNDRangeKernelKHR"](self._handle, None, None, l.kernel.int_ptr,
                                                             len(l.gsize), None, gsize, lsize, 0, None, None, None)
                if code:
                    raise DeviceError(f"recording {l.name} of layer {l.node.label} into a command buffer "
                                      f"failed ({code})")
            code = self._fn["clFinalizeCommandBufferKHR"](self._handle)
            if code:
                raise DeviceError(f"clFinalizeCommandBufferKHR failed ({code})")
        except DeviceError:
            self.release()
            raise
        self.commands = len(launches)

    def pending(self) -> bool:
        """Whether the last replay has not completed yet (a failed one counts as over)."""
        if not self._last.value:
            return False
        code = self._event_info(self._last, _EVENT_STATUS, ctypes.sizeof(self._status),
                                ctypes.byref(self._status), None)
        return not code and self._status.value > 0

    def enqueue(self) -> bool:
        """Replay every recorded launch, in order, on the queue it was recorded for; False (and
        nothing enqueued) while the last replay is still pending: then the caller enqueues the
        launches one by one."""
        if self.pending():
            return False
        event = _vp()
        code = self._fn["clEnqueueCommandBufferKHR"](0, None, self._handle, 0, None, ctypes.byref(event))
        if code:
            raise DeviceError(f"clEnqueueCommandBufferKHR failed ({code})")
        if self._last.value:
            self._release_event(self._last)
        self._last = event
        return True

    def release(self) -> None:
        if self._last.value:
            self._release_event(self._last)
            self._last = _vp()
        if self._handle:
            self._fn["clReleaseCommandBufferKHR"](self._handle)
            self._handle = None

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:   # noqa: BLE001 - interpreter shutdown: the driver may be gone already
            pass
