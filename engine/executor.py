"""Run a planned graph: one arena, pre-bound launches, one upload and one download per call.

Everything that can be decided once is decided in the constructor (memory plan, buffers,
kernel choice, compiled programs, bound arguments). ``run`` only copies the input in,
enqueues the launch list and reads the outputs back into host arrays it lends the caller and
reuses once the caller lets go of them (hostsets.py): no allocation, no compilation. Where the
device offers ``cl_khr_command_buffer`` the launch list is recorded once into a command
buffer and a frame enqueues that one object (``YOLO_CL_COMMAND_BUFFER=0`` turns it off).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from . import branches as side, cmdbuf, staging
from .errors import DeviceError, YoloClError
from .graph import Graph, folding_default
from .hostsets import HostSets
from .kernels import BindContext, layout, written_layers
from .kernels.nodes import bind_node, workspace_bytes
from .launch import LaunchList
from .measure import event_ms
from .limits import LimitError, check_executor
from .per_image import ImageSplit, ends_wanted, spans as image_spans
from .planner import plan_memory
from .precision import FP32, Precision
from .staging import pinned


def batch_bucket(n: int) -> int:
    """The batch an n-image ``detect_batch`` runs at: n rounded up to a power of two, so that
    any mix of batch lengths builds at most log2(longest) + 1 executors."""
    return 1 << max(0, int(n - 1).bit_length())


@dataclass
class LayerTime:
    """Device time of one launch, from OpenCL profiling events."""

    label: str
    op: str
    name: str
    ms: float
    flops: int
    config: dict


class Executor:
    """A graph bound to a runtime for one batch size and storage precision."""

    def __init__(self, rt, graph: Graph, batch: int = 1, precision: Precision = FP32, tuning=None,
                 weight_cache: Optional[dict] = None, command_buffer: Optional[bool] = None,
                 progress: bool = False, mma: str = "", fold: Optional[bool] = None,
                 branches: Optional[bool] = None, per_image=None) -> None:
        """``precision``: storage and arithmetic (``precision.FP32``, ``FP16``, ``TF32``);
        ``tuning``: a table with ``conv_config(node, batch)`` (None: heuristics). ``command_buffer``:
        None uses one where the device offers it (and YOLO_CL_COMMAND_BUFFER
        is not 0), True requires one, False replays the launch list with one enqueue each.
        ``progress``: a progress bar over the layers on stderr when binding them takes more than a
        second (it is compiling) and stderr is a terminal. ``mma``: the tensor-core mode convs
        compute in ("f16", "tf32"; see kernels.gemm_mma.mode_for), "" for the FMA families.
        ``fold``: convs compute the max-pools, upsamples and copies the graph marked as they read
        them (graph.mark_read_fusions) or as they store their own output (graph.mark_write_fusions),
        so those layers cost no launch; None: YOLO_CL_FOLD if set, else writing through everywhere
        (it costs nothing) and reading through on a GPU only (on a CPU device the redundant reads
        cost more than a launch). ``branches``: run each side branch (branches.py: the layers only
        one head needs) on a second queue beside the rest, where no command buffer records the
        plan; None: ``YOLO_CL_BRANCHES=1`` (off by default: ``branches.wanted``). ``per_image``: at
        batch > 1 on a device with a copy queue (and no command buffer or side branch), run the
        first and last layers image by image so that each image's upload and head read overlap the
        others' compute (per_image.py); ``"first"`` or ``"last"``: that end only; None:
        ``YOLO_CL_PER_IMAGE`` (the same words; on unless ``0``)."""
        self.rt, self.graph, self.batch, self.precision = rt, graph, batch, precision
        asked = folding_default() if fold is None else fold
        write = asked is not False              # writing through costs no extra reads anywhere
        # reading through costs a CPU more compute than the launch it saves
        fold = not getattr(rt, "is_cpu", False) if asked is None else asked
        recorded = self._records(command_buffer)
        self.branches = side.side_branches(graph, fold, write) \
            if side.wanted(branches) and not recorded and len(graph.outputs) > 1 else []
        ends = ends_wanted(per_image) if batch > 1 and not recorded and not self.branches \
            and getattr(rt, "copy_queue", None) is not None else (False, False)
        node_spans = image_spans(graph, write, batch, ends) if any(ends) else []
        self.plan = plan_memory(graph, batch, fold, write, self.branches, node_spans)
        item = precision.itemsize
        self.ctx = BindContext(rt, None, self.plan, batch, precision, tuning=tuning, mma=mma,
                               weight_cache=weight_cache if weight_cache is not None else {}, fold=fold,
                               write=write)
        self.ctx.sole_edges = layout.sole_conv_edges(graph, fold, write)
        self.ctx.nhwc = layout.nhwc_tensors(self.ctx)    # stored channels-last for their nhwc reader
        # One workspace for the main queue and one for the side branches (they run at the same
        # time), each as large as the configs about to be bound need (not the worst of any family)
        on_side = set().union(*(b.nodes for b in self.branches))
        need = [workspace_bytes(self.ctx, n) for n in graph.nodes]
        ws = max((b for i, b in enumerate(need) if i not in on_side), default=0)
        ws_side = max((b for i, b in enumerate(need) if i in on_side), default=0)
        limit = (-(-ws // item) - (-ws_side // item), batch, item, getattr(rt, "device", None))
        try:
            check_executor(graph, self.plan.arena_elems, *limit)   # refuse before allocating anything
        except LimitError:
            if not node_spans:
                raise
            node_spans = []            # the spans' longer lifetimes do not fit: batch-wide it is
            self.plan = self.ctx.plan = plan_memory(graph, batch, fold, write, self.branches)
            check_executor(graph, self.plan.arena_elems, *limit)
        self.arena = self.ctx.arena = rt.alloc(self.plan.arena_elems * item,
                                               f"activation pool ({len(graph.tensors)} tensors)")
        self.ctx.workspace = rt.alloc(ws, "workspace (im2col, Winograd, split-K)") if ws else None
        self._side_ctx = replace(self.ctx, workspace=rt.alloc(ws_side, "side branches' workspace")
                                 if ws_side else None) if on_side else None
        self._on_side = {id(graph.nodes[i]) for i in on_side}
        self.workspace_bytes = ws + ws_side
        # > 0: flush the queue after every this many launches, so that a GPU starts computing while
        # the rest of the plan is still being enqueued (tools/bench_host.py --flush measures it)
        self.flush_every = 0
        from tqdm import tqdm
        bar = tqdm(total=len(graph.nodes), desc="compiling kernels", unit="layer", delay=1.0, leave=False,
                   disable=None if progress else True, file=sys.stderr)
        with bar:
            self.launches = self._bind(graph.nodes, rt.build_threads, bar.update)
        dtype = precision.dtype
        self._host_in = np.empty((batch,) + (graph.input.c, graph.input.h, graph.input.w), dtype)
        self._host_out = [np.empty((batch,) + v.shape, dtype) for v in graph.outputs]
        self._out_offsets = [(self.plan.offset(v.tensor) + v.c0 * v.h * v.w) * item for v in graph.outputs]
        self._out_bstride = [v.tensor.size * item for v in graph.outputs]
        self._in_offset = self.plan.offset(graph.input) * item
        self.events: list = []
        self._slots: dict = {}         # submit/collect: pinned input, events and output set per slot
        self._outs: Optional[HostSets] = None   # the head sets run and collect lend (hostsets.py)
        self._spare: Optional[list] = None      # run reads here when the caller holds every set
        self._ins: dict = {}                   # dtype -> the pinned inputs input_array lends
        self._f32_input = None         # half executors: float32 staging buffer + conversion kernel
        self._f32_read: list = []      # with a copy queue: the last conversion, which reads that buffer
        self._staged: Optional[list] = None    # [pinned uint8 array, the DMA events out of it]: see _send
        # Heads leave as dense float32 (or, where the caller asks, the half plan's own float16:
        # outputs_as) through pinned memory where that pays: half storage (no host conversion) and
        # GPUs (DMA from pinned memory; one read per head, not one per image).
        # (per-image head reads need them too)
        self._out_dtype = np.dtype(np.float32)
        self._head_staging = self._output_conversions() if self.half or not self.rt.is_cpu or node_spans else None
        self.command_buffer = self._record(command_buffer) if recorded else None
        # how _launch enqueues the plan (launch.py): side branches' launches on a queue of their own
        flags = [id(l.node) in self._on_side for l in self.launches]
        self._side_queue = rt.cl.CommandQueue(rt.context, rt.device) if any(flags) else None
        self._launch_list = LaunchList(rt.queue, self.launches, flags, self._side_queue)
        # the first span's launches per image, run where the input arrives image by image
        # (_upload_images), and the last span's per group (per_image.py); None: all batch-wide
        self.split = self._image_split(node_spans) if node_spans else None
        self._arrivals: Optional[list] = None    # per image, the event of its upload (_upload_images)
        # Launch index -> the heads complete after it: run and submit convert each head there and
        # read it on a second queue, so the first heads travel while the rest of the network runs
        # (yolov3 608 batch 8: a quarter of 62 MB of heads). Off: every head converted and read
        # after the last launch, on the one queue.
        self.early_reads = self._head_staging is not None and self.command_buffer is None
        self._read_marks = self._head_marks() if self.early_reads else {}
        self._read_queue = None
        self._last_reads: dict = {}    # output index -> done when its staging buffer's last read is

    @property
    def half(self) -> bool:
        """Activations stored as half."""
        return self.precision.half

    def _bind(self, nodes: list, threads: int = 1, done=None) -> list:
        """The launches of ``nodes`` in order, less those of layers a conv computed: producers it
        read through (its input transform did: its launch's ``config["through"]`` says so) and the
        layer it wrote through (its epilogue stored that layer's output: ``config["writes"]``).
        Where a conv wrote through a layer that the next conv read through, the writer wins: the
        reader is bound again reading through the other layers only, so it reads the written
        layer's stored output. ``threads`` > 1 binds layers on that many threads, so their
        programs compile at once where the driver can; ``done(1)`` is called per layer bound."""
        def one(node, ctx=None, tick=done):
            ctx = ctx or self.ctx_for(node)
            try:
                launches = bind_node(ctx, node)
            except YoloClError as e:
                raise type(e)(f"layer {node.label} ({node.describe()}): {e}") from None
            if tick is not None:
                tick(1)
            return node, launches
        if threads > 1 and len(nodes) > 1:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(threads, thread_name_prefix="yolo-cl-bind") as pool:
                bound = list(pool.map(one, nodes))    # in order; the first failing layer's error
        else:
            bound = [one(n) for n in nodes]
        def reads_through(launches: list) -> bool:
            return any(l.config.get("through") for l in launches)
        written = written_layers(l for _, ls in bound for l in ls)

        def reread(node, launches: list) -> tuple:
            """``node`` bound again where it read through a layer its producer wrote."""
            stale = reads_through(launches) and any(id(p) in written for p in node.attrs.get("read_through") or ())
            return one(node, replace(self.ctx_for(node), written=written), None) if stale else (node, launches)
        bound = [reread(n, ls) for n, ls in bound]
        bad = layout.disagreeing(self.ctx.nhwc, bound)
        if bad:     # a config fell back to one that stores or reads planes: both ends bound again so
            self.ctx.nhwc = self.ctx.nhwc - bad
            if self._side_ctx is not None:
                self._side_ctx.nhwc = self.ctx.nhwc
            bound = [one(n, replace(self.ctx_for(n), written=written), None) if n.output.tensor.id in bad or
                     (n.op == "conv" and n.inputs[0].tensor.id in bad) else (n, ls) for n, ls in bound]
        folded = written | {id(p) for n, ls in bound if reads_through(ls) for p in n.attrs.get("read_through") or ()}
        return [l for n, ls in bound if id(n) not in folded for l in ls]

    def ctx_for(self, node) -> BindContext:
        """The context ``node`` binds in: the side branches' own workspace for a node of one."""
        return self._side_ctx if id(node) in self._on_side else self.ctx

    def _records(self, wanted: Optional[bool]) -> bool:
        """Whether the plan is to be recorded into a command buffer (``command_buffer``'s rule)."""
        device = getattr(self.rt, "device", None)
        if wanted is False or device is None:
            return False
        return bool(wanted) or (os.environ.get("YOLO_CL_COMMAND_BUFFER", "1").strip() != "0"
                                and cmdbuf.supported(device))

    def _image_split(self, node_spans: list) -> Optional[ImageSplit]:
        """The spans' per-image launches; None (all batch-wide) where a node binds another layout
        per image than batch-wide, which the plan cannot mix."""
        try:
            return ImageSplit(self.ctx, self.graph, self.launches, node_spans, self.rt.queue)
        except (ValueError, YoloClError):
            return None

    @property
    def launches_per_frame(self) -> int:
        """Kernel launches one ``run`` from a pinned input enqueues (the plan's, with the spans'
        per-image and per-group launches)."""
        if self.split is None:
            return len(self.launches)
        return len(self.split.launches) + self.split.last_start - self.split.first_end

    def _record(self, wanted: Optional[bool]) -> Optional[cmdbuf.CommandBuffer]:
        """The plan recorded into a command buffer (where ``_records`` said so); None where the
        device lists the extension but cannot record it, unless ``wanted`` requires one."""
        try:
            return cmdbuf.CommandBuffer(self.rt.queue, self.launches)
        except DeviceError:
            if wanted:
                raise
            return None            # listed but not usable: the launch list works everywhere

    @property
    def side_layers(self) -> list:
        """Labels of the nodes whose launches run on the side queue (branches.py), in plan order."""
        return list(dict.fromkeys(l.node.label for l in self.launches if id(l.node) in self._on_side))

    @property
    def launch_way(self) -> str:
        """How a frame's launches reach the queue: ``command buffer``, ``ctypes`` or ``pyopencl``."""
        return "command buffer" if self.command_buffer is not None else self._launch_list.way

    @property
    def arena_bytes(self) -> int:
        return self.plan.arena_elems * self.precision.itemsize

    @property
    def naive_bytes(self) -> int:
        return self.plan.naive_elems * self.precision.itemsize

    def run(self, blob: np.ndarray, profile: bool = False, eager: bool = False) -> list:
        """Forward ``blob`` (batch, C, H, W) float32 (or float16 on a half plan: ``input_array``);
        returns the output views as float32 arrays (or float16 ones: ``outputs_as``).

        The arrays are the ones the device wrote the heads into, not copies: a later ``run`` reuses
        them only once nothing refers to them any more (neither they nor a view of them), so a
        result the caller keeps never changes, and a loop that drops its results allocates nothing
        after the first frames. While the caller holds all ``hostsets.CAP`` sets, ``run`` returns
        copies instead. The default replays the pre-bound launch list. ``eager=True`` re-binds every node
        (kernel objects and arguments) first, as a runtime without a plan would do per
        frame: the baseline that host-overhead measurements and tests compare against."""
        expect = self._host_in.shape
        if blob.shape != expect:
            raise YoloClError(f"input blob has shape {tuple(blob.shape)}, expected {expect}")
        # kept until the queue is done: dropping it would wait for the copy now
        uploaded = self._upload(blob, split=not (profile or eager))
        outs = self._run_pass(profile, eager)
        del uploaded
        return outs

    def input_array(self, dtype=np.float32) -> np.ndarray:
        """A (batch, C, H, W) array in pinned memory to write the next input into and pass to
        ``run``: the blob is written once, where the device copies it from by DMA. It is the
        caller's until nothing refers to it any more (``run``'s rule for its outputs), and holds
        whatever its last user left there; a plain array while the caller holds every pinned one.
        ``dtype``: float32, or on a half-storage executor float16, the network's own input type:
        a caller that has its blob in half sends half the bytes and no conversion runs."""
        dt = np.dtype(dtype)
        if dt != np.float32 and dt != self._host_in.dtype:
            raise YoloClError(f"input_array: dtype {dt} is not float32 or this {self.precision.name} plan's "
                              f"input type ({self._host_in.dtype})")
        if dt.str not in self._ins:
            self._ins[dt.str] = HostSets(lambda: [pinned(self.rt, self._host_in.shape, dt)[1]], cap=2)
        return self._ins[dt.str].lend(lambda: np.empty(self._host_in.shape, dt))

    def _upload(self, blob: np.ndarray, split: bool = True):
        """Enqueue the copy of ``blob`` into the arena's input region (non-blocking: the caller
        keeps ``blob`` unchanged until the queue has passed it); returns the copy's event(s),
        to keep until then. Image by image where ``split`` and the plan's first span runs per image
        (``_upload_images``): the next pass enqueued must then be the default one (no profiling)."""
        self._arrivals = None
        if split and self.split is not None and self.split.first_groups and staging.is_pinned(blob) \
                and blob.flags.c_contiguous and blob.dtype == (np.float32 if self.half else self._host_in.dtype):
            return self._upload_images(blob)
        if self.half and blob.dtype == np.float32 and blob.flags.c_contiguous:
            return self._upload_to_half(blob)
        if blob.dtype != self._host_in.dtype or not blob.flags.c_contiguous:
            np.copyto(self._host_in, blob, casting="unsafe")
            blob = self._host_in
        return self._send(self.arena, blob, self._in_offset)

    def _send(self, dst, blob: np.ndarray, offset: int = 0, queue=None, after: Optional[list] = None) -> list:
        """One non-blocking copy of a pinned blob (the driver DMAs it as it is), of a small one or
        where ``staging.wanted`` says no; else chunks through pinned memory of our own, each
        chunk's DMA overlapping the next one's copy (``staging.upload``). On ``queue`` (default
        the kernels' queue), the first copy after the events ``after``; returns the copies' events."""
        cl, q = self.rt.cl, queue if queue is not None else self.rt.queue
        if blob.nbytes < staging.MIN_BYTES or staging.is_pinned(blob) or not staging.wanted(self.rt):
            return [cl.enqueue_copy(q, dst, blob, dst_offset=offset, is_blocking=False, wait_for=after or None)]
        if self._staged is None or self._staged[0].nbytes < blob.nbytes:
            self._staged = [pinned(self.rt, (max(blob.nbytes, self._host_in.size * 4),), np.uint8)[1], []]
        elif self._staged[1]:
            self._staged[1][-1].wait()  # the last copy out of it has left
        self._staged[1] = staging.upload(self.rt, dst, blob, self._staged[0], offset, queue=queue, after=after)
        return self._staged[1]

    def _upload_images(self, blob: np.ndarray) -> list:
        """One DMA per image of a pinned ``blob`` on the copy queue, into the float32 staging buffer
        (half storage: the pass converts each image as it lands) or the arena's input region
        (which earlier passes may use for other tensors: the copies wait for them). The pass
        (``_enqueue_first``) starts each image's first span once its copy is done."""
        cl, q, cq = self.rt.cl, self.rt.queue, self.rt.copy_queue
        if self.half:
            dst, base, after = self._f32_staging()[0], 0, self._f32_read
        else:
            dst, base, after = self.arena, self._in_offset, [cl.enqueue_marker(q)]
            q.flush()                  # the copies wait for it: it must reach the device
        n = blob[0].nbytes
        copies = [cl.enqueue_copy(cq, dst, blob[b], dst_offset=base + b * n, is_blocking=False,
                                  wait_for=(after or None) if b == 0 else None) for b in range(self.batch)]
        cq.flush()
        self._arrivals = copies
        return copies

    def _enqueue_first(self) -> None:
        """The first span, group by group of images (``ImageSplit.first_groups``), each after its
        images' uploads by ``_upload_images`` (and their half conversion)."""
        cl, q = self.rt.cl, self.rt.queue
        arrivals, self._arrivals = self._arrivals, None
        for g, (image, count) in enumerate(self.split.first_groups):
            # the copy queue is in order: the group's last copy means all of them
            cl.enqueue_barrier(q, wait_for=[arrivals[image + count - 1]])
            if self.half:
                _, k, (n,) = self._f32_staging()
                per = n // self.batch
                self._f32_read = [cl.enqueue_nd_range_kernel(q, k, (per * count,), None,
                                                             global_work_offset=(per * image,))]
            self.split.enqueue_first(g)
            q.flush()                  # this group computes while the next is enqueued

    def _f32_staging(self) -> tuple:
        """(float32 staging buffer, the kernel that stores it as half into the input region, its
        global size): a half executor's input path, made on first use."""
        if self._f32_input is None:
            cl, n = self.rt.cl, self._host_in.size
            buf = self.rt.alloc(n * 4, "float32 input staging")
            k = cl.Kernel(self.rt.program("preprocess.cl", {"HALF_STORAGE": True}), "yc_store_input")
            k.set_args(buf, self.arena, np.int32(self._in_offset // 2))
            self._f32_input = (buf, k, (n,))
        return self._f32_input

    def _upload_to_half(self, blob: np.ndarray) -> list:
        """Send a float32 blob as it is and let a kernel store it as half into the input region:
        no host-side float16 conversion (tens of ms for a 608x608 batch of 8). With a copy queue
        (``Runtime.copy_queue``) the copy waits only for the previous pass's conversion, the one
        reader of the staging buffer, and so runs while that pass's network computes (``submit``).
        Returns the copy's events."""
        cl, q, cq = self.rt.cl, self.rt.queue, self.rt.copy_queue
        buf, k, gsize = self._f32_staging()
        copied = self._send(buf, blob, queue=cq, after=self._f32_read)
        if cq is None:
            cl.enqueue_nd_range_kernel(q, k, gsize, None)
            return copied
        cq.flush()                      # the conversion waits for the copy: it must reach the device
        self._f32_read = [cl.enqueue_nd_range_kernel(q, k, gsize, None, wait_for=copied)]
        return copied

    def outputs_as(self, dtype=np.float32) -> None:
        """The type ``run`` and ``collect`` hand the heads out in: float32 (the default) or, on a
        half-storage plan, float16, its own type: the heads then cross the bus as they are, half
        the bytes and no conversion (yolov3 608 batch 8's are 62 MB as float32, 47 MB of them read
        after the last layers). Asked between passes: it waits for the queue, and the head sets
        made for the other type are dropped (those a caller holds stay the caller's)."""
        dt = np.dtype(dtype)
        if dt != np.float32 and not (self.half and dt == np.float16):
            raise YoloClError(f"outputs_as: dtype {dt} is not float32 or this {self.precision.name} plan's "
                              f"head type ({self._host_out[0].dtype})")
        if dt == self._out_dtype:
            return
        if any(st["out"] is not None for st in self._slots.values()):
            raise YoloClError("outputs_as: a submitted pass is not collected yet")
        self.rt.finish()
        self._out_dtype = dt
        self._head_staging = self._output_conversions()
        self._outs, self._spare, self._last_reads = None, None, {}
        for st in self._slots.values():
            st["spare"] = None

    def _output_conversions(self) -> list:
        """Per output, a device buffer of the heads' output type (``outputs_as``) and the kernel
        that fills it from the arena (converting half to float32, or copying the half as it is;
        packing batch-strided heads); ``_enqueue_reads`` reads the buffer into pinned host memory.
        Host-side half -> float32 conversion of a 608x608 batch of 8 heads (15.5 M values) costs
        tens of ms, and so do pageable reads of them on a GPU; the kernel costs microseconds."""
        cl, item = self.rt.cl, self.precision.itemsize
        prg = self.rt.program("preprocess.cl", {"HALF_STORAGE": self.half})
        as_is = self._out_dtype != np.float32          # the half plan's own type: copied, not converted
        conversions = []
        for host, off, bs in zip(self._host_out, self._out_offsets, self._out_bstride):
            n = host[0].size
            buf = self.rt.alloc(host.size * self._out_dtype.itemsize, f"{self._out_dtype.name} output staging")
            k = cl.Kernel(prg, "yc_pack_output" if as_is else "yc_load_output")
            k.set_args(self.arena, np.int32(off // item), np.int32(bs // item), buf, np.int32(n))
            conversions.append((k, (n, self.batch), buf))
        return conversions

    def _head_marks(self) -> dict:
        """{launch index: [output indices]}: each head after the last launch that writes its tensor;
        a side branch's head after the plan's last launch (the join: its queue is the other one)."""
        marks: dict = {}
        end = len(self.launches) - 1
        for o, v in enumerate(self.graph.outputs):
            last = max((j for j, l in enumerate(self.launches) if l.node.output.tensor is v.tensor), default=end)
            if id(self.launches[last].node) in self._on_side:
                last = end
            marks.setdefault(last, []).append(o)
        return marks

    def _enqueue_with_reads(self, hosts: list) -> list:
        """The launch list with each head converted right after the launch that completes it and
        read into ``hosts`` on the read queue once converted; returns the read events (in the order
        produced: the read queue is in order, so the last one done means all are)."""
        cl, q = self.rt.cl, self.rt.queue
        if self._read_queue is None:
            self._read_queue = cl.CommandQueue(self.rt.context, self.rt.device)
        rq, reads, start, end, split = self._read_queue, [], 0, len(self.launches), self.split
        if split is not None:
            if self._arrivals:         # else the input is all there: the first span batch-wide
                self._enqueue_first()
                start = split.first_end
            end = split.last_start
        last = [o for i in sorted(self._read_marks) if i >= end for o in self._read_marks[i]]
        for i in sorted(self._read_marks):
            if i >= end:
                break
            self._launch(start, i + 1)
            start = i + 1
            for o in self._read_marks[i]:
                self._read_head(o, hosts[o], reads)
        self._launch(start, end)
        groups = split.last_groups if last else []
        for g, images in enumerate(groups):          # the last span group by group, each read once done
            split.enqueue_last(g)
            for o in last:
                self._read_head(o, hosts[o], reads, images, g == len(groups) - 1)
        q.flush()
        rq.flush()
        return reads

    def _read_head(self, o: int, host: np.ndarray, reads: list, images: Optional[tuple] = None,
                   final: bool = True) -> None:
        """Convert head ``o`` (of ``images``, (first, count); default all) into its float32 staging
        buffer and read it into ``host`` on the read queue, appending the read's event to ``reads``;
        ``final``: the pass's last read of that buffer, which the next pass's conversion waits for."""
        cl, q, rq = self.rt.cl, self.rt.queue, self._read_queue
        k, gsize, buf = self._head_staging[o]
        # buf is read by the previous pass's read (submit keeps passes in flight): after it
        prior = self._last_reads.get(o)
        wait = [prior] if prior else None
        offset = 0
        if images is None:
            converted = cl.enqueue_nd_range_kernel(q, k, gsize, None, wait_for=wait)
        else:
            image, count = images
            converted = cl.enqueue_nd_range_kernel(q, k, (gsize[0], count), None, global_work_offset=(0, image),
                                                   wait_for=wait)
            offset, host = image * host[0].nbytes, host[image:image + count]
        q.flush()                          # the read queue waits on it: it must reach the device
        reads.append(cl.enqueue_copy(rq, host, buf, src_offset=offset, is_blocking=False, wait_for=[converted]))
        if final:
            # a marker, not the read itself: a read's event keeps its host array referenced,
            # which would keep the set from going back to the pool
            self._last_reads[o] = cl.enqueue_marker(rq)

    def _output_set(self) -> list:
        """One set of host arrays for the heads (float32, or what ``outputs_as`` asked), (batch,)
        + shape each: pinned where the heads leave through the staging buffers, plain arrays where
        they are read from the arena as they are (float32 storage on a CPU device)."""
        if self._head_staging is None:
            return [np.empty(h.shape, np.float32) for h in self._host_out]
        return [pinned(self.rt, h.shape, self._out_dtype)[1] for h in self._host_out]

    def _enqueue_reads(self, hosts: list) -> list:
        """Enqueue the heads' way out of the arena into ``hosts`` (from ``_output_set``); returns
        the read events, to be kept until they are complete (pyopencl waits for a dropped one
        holding the GIL, which would stall every other Python thread for the whole pass)."""
        cl, q = self.rt.cl, self.rt.queue
        reads = []
        if self._head_staging is not None:
            for (k, gsize, buf), host in zip(self._head_staging, hosts):
                cl.enqueue_nd_range_kernel(q, k, gsize, None)
                reads.append(cl.enqueue_copy(q, host, buf, is_blocking=False))
            return reads
        for host, off, bs, v in zip(hosts, self._out_offsets, self._out_bstride, self.graph.outputs):
            n = v.c * v.h * v.w
            if bs == n * host.itemsize or self.batch == 1:
                reads.append(cl.enqueue_copy(q, host, self.arena, src_offset=off, is_blocking=False))
            else:
                flat = host.reshape(self.batch, -1)
                for b in range(self.batch):
                    reads.append(cl.enqueue_copy(q, flat[b], self.arena, src_offset=off + b * bs, is_blocking=False))
        return reads

    def _take_set(self, spare: Optional[list]) -> tuple:
        """(arrays to read the heads into, whether they are lent to the caller as they are): a set
        of the pool that nobody holds, else (the caller holds every set) ``spare`` or a new spare
        set, whose contents the caller gets as copies."""
        if self._outs is None:
            self._outs = HostSets(self._output_set)
        hosts = self._outs.take()
        if hosts is not None:
            return hosts, True
        return (spare if spare is not None else self._output_set()), False

    def _hand_out(self, hosts: list, lent: bool) -> list:
        """What ``run``/``collect`` return for heads read into ``hosts``: the lent set itself
        (referenced by the returned list before the pool lets go of it), else copies."""
        if not lent:
            return [h.copy() for h in hosts]
        out = list(hosts)
        self._outs.release(hosts)
        return out

    def enqueue(self, profile: bool = False, eager: bool = False) -> list:
        """Enqueue the forward pass over whatever the arena's input region holds (in queue order);
        returns the per-launch events when ``profile`` (none otherwise: no per-launch objects)."""
        cl, q = self.rt.cl, self.rt.queue
        if profile or eager:
            launches = self._bind(self.graph.nodes) if eager else self.launches
            events = [cl.enqueue_nd_range_kernel(q, l.kernel, l.gsize, l.lsize) for l in launches]
            return events if profile else []
        # per-launch events need the launch list; so does a command buffer whose last replay is
        # still pending (frames in flight)
        if self.command_buffer is None or not self.command_buffer.enqueue():
            self._launch(0, len(self.launches))
        return []

    def _launch(self, start: int, stop: int) -> None:
        """Enqueue launches ``start`` to ``stop`` (not included) of the plan without events (the
        ``LaunchList``), flushing after every ``flush_every``-th launch."""
        every, q = self.flush_every, self.rt.queue
        cuts = [stop] if not every else [*range(every * (start // every + 1), stop, every), stop]
        for b in cuts:
            self._launch_list.enqueue(start, b)
            if every and b % every == 0:
                q.flush()                          # hand the launches so far to the device: it starts early
            start = b

    def run_staged(self, profile: bool = False, eager: bool = False) -> list:
        """``run`` for an input already written into the arena (by the preprocessing kernel)."""
        self._arrivals = None          # no upload of this pass to wait for
        return self._run_pass(profile, eager)

    def _run_pass(self, profile: bool, eager: bool) -> list:
        """Enqueue a pass over the input uploaded or written, wait for it and hand its heads out."""
        hosts, lent = self._run_set()
        try:
            events, reads = self._enqueue_pass(hosts, profile, eager)
            self.rt.queue.finish()
            reads[-1].wait()
        except BaseException:
            if lent:                   # a failed pass keeps no set from the pool
                self._outs.release(hosts)
            raise
        del reads
        self.events = events
        return self._hand_out(hosts, lent)

    def _enqueue_pass(self, hosts: list, profile: bool = False, eager: bool = False) -> tuple:
        """Enqueue the plan and the heads' way into ``hosts``: (per-launch events when ``profile``,
        read events). Each head leaves as soon as it is complete where ``early_reads``, except
        under ``profile``/``eager``, which time or re-bind the plain launch list; else all after it."""
        if self.early_reads and not (profile or eager):
            return [], self._enqueue_with_reads(hosts)
        return self.enqueue(profile, eager), self._enqueue_reads(hosts)

    def _run_set(self) -> tuple:
        """(set, lent): the set ``run`` reads into, lent from the pool or the spare one."""
        hosts, lent = self._take_set(self._spare)
        if not lent:
            self._spare = hosts
        return hosts, lent

    def run_steps(self, blob: np.ndarray) -> tuple:
        """``run`` with the queue waited on after each step, for a breakdown of where its wall time
        goes: (outputs, {step: ms}) for ``upload`` (blob into the arena), ``enqueue`` (host time
        to enqueue the plan), ``device`` (the wait for the plan once enqueued), ``read`` (heads
        into host memory) and ``return`` (handing the set out, or copies of it). ``run`` overlaps
        the upload and the device with the enqueue, so its wall is at most the sum."""
        if blob.shape != self._host_in.shape:
            raise YoloClError(f"input blob has shape {tuple(blob.shape)}, expected {self._host_in.shape}")
        q, ms = self.rt.queue, {}
        t0 = time.perf_counter()

        def lap(step: str) -> None:
            nonlocal t0
            t1 = time.perf_counter()
            ms[step], t0 = (t1 - t0) * 1e3, t1

        uploaded = self._upload(blob, split=False)
        q.finish()
        del uploaded
        lap("upload")
        self.enqueue()
        lap("enqueue")
        q.finish()
        lap("device")
        hosts, lent = self._run_set()
        reads = self._enqueue_reads(hosts)
        q.finish()
        del reads
        lap("read")
        outs = self._hand_out(hosts, lent)
        lap("return")
        return outs, ms

    def submit(self, blob: np.ndarray, slot: int = 0):
        """Start a forward pass of ``blob`` without waiting: the blob goes through pinned memory
        of ``slot`` and the outputs are read into a set ``collect(slot)`` returns. While the
        device runs one slot the host can fill another."""
        if blob.shape != self._host_in.shape:
            raise YoloClError(f"input blob has shape {tuple(blob.shape)}, expected {self._host_in.shape}")
        st = self._slot(slot)
        self._settle(st)                # the slot's previous pass is done (and its set free if never collected)
        np.copyto(st["in"], blob, casting="unsafe")
        st["write"] = self._upload(st["in"])
        st["out"], st["lent"] = self._take_set(st["spare"])
        if not st["lent"]:
            st["spare"] = st["out"]
        # Read events are kept until collected: pyopencl waits for a dropped one holding the GIL.
        st["reads"] = self._enqueue_pass(st["out"])[1]
        self.rt.queue.flush()          # a driver may hold commands back until a flush or a wait
        return st["reads"][-1]

    def collect(self, slot: int = 0) -> list:
        """The outputs (float32, or ``outputs_as``'s type) of the last ``submit`` to ``slot``, once
        they have arrived; the same lifetime rule as ``run``'s."""
        st = self._slot(slot)
        if st["out"] is None:
            raise YoloClError(f"collect({slot}): nothing was submitted to slot {slot} since its last collect")
        hosts, lent = st["out"], st["lent"]
        st["out"] = None
        self._settle(st)
        return self._hand_out(hosts, lent)

    def _settle(self, st: dict) -> None:
        """Wait for a slot's reads and drop them; a set it still has goes back to the pool."""
        if st["reads"]:
            st["reads"][-1].wait()
        st["write"], st["reads"] = None, []
        if st["out"] is not None and st["lent"]:
            self._outs.release(st["out"])
        st["out"] = None

    def _slot(self, slot: int) -> dict:
        st = self._slots.get(slot)
        if st is None:
            dtype = np.float32 if self.half else self._host_in.dtype   # half: a kernel converts on the device
            st = self._slots[slot] = {"in": pinned(self.rt, self._host_in.shape, dtype)[1], "write": None,
                                      "reads": [], "out": None, "lent": False, "spare": None}
        return st

    def layer_times(self) -> list:
        """Per-launch device times of the last ``run(profile=True)`` (needs a profiling queue)."""
        out = []
        for l, ev in zip(self.launches, self.events):
            ms = event_ms(ev)
            out.append(LayerTime(l.node.label, l.node.describe(), l.name, ms, l.flops, l.config))
        return out

    def time_run(self, blob: np.ndarray, repeats: int = 10) -> float:
        """Median wall-clock ms of ``run`` after one warm-up."""
        self.run(blob)
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            self.run(blob)
            ts.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(ts))
