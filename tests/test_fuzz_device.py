"""Random small networks on the device: whatever the parsers accept runs and computes the right thing.

Hypothesis draws networks from a grammar of Darknet sections (convolutions with odd sizes,
strides, groups and dilation, pools with padding, routes with groups, shortcuts, upsample,
reorg, softmax, scale_channels, sam, maxpool_depth ...). Each one ends in one clean
yolo_cl error, or it is bound on the device and its heads are compared with the independent
NumPy forward pass in ``darknet_io`` (batch 1 and batch 2). Cases the NumPy reference does not
model (dilation, which it pads without; shapes it refuses) are still run, for crashes only.

YOLO_CL_FUZZ_EXAMPLES scales the number of networks.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import darknet_io as dio
from yolo_cl.cfg import parse_cfg
from yolo_cl.errors import YoloClError
from yolo_cl.executor import Executor
from yolo_cl.graph import build_graph
from yolo_cl.layers import build_layers, parse_net
from yolo_cl.runtime import Runtime
from yolo_cl.weights import load_weights

EXAMPLES = int(os.environ.get("YOLO_CL_FUZZ_EXAMPLES", "0")) or None
ACTS = ["linear", "leaky", "relu", "logistic", "mish", "swish", "tanh", "relu6", "hard_mish"]


@st.composite
def section(draw, i: int) -> str:
    back = lambda: draw(st.integers(1, max(1, i)))   # noqa: E731  (a relative reference to an earlier layer)
    kind = draw(st.sampled_from(["conv"] * 6 + ["maxpool", "maxpool_depth", "upsample", "route", "shortcut",
                                                 "avgpool", "reorg", "dropout", "softmax", "scale_channels", "sam"]))
    if kind == "conv":
        f = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
        lines = ["[convolutional]", f"filters={f}", f"size={draw(st.sampled_from([1, 1, 2, 3, 3, 5, 7]))}",
                 f"stride={draw(st.sampled_from([1, 1, 1, 2, 3]))}", f"pad={draw(st.sampled_from([0, 1, 1]))}",
                 f"activation={draw(st.sampled_from(ACTS))}"]
        if draw(st.booleans()):
            lines.append("batch_normalize=1")
        if draw(st.integers(0, 5)) == 0:
            lines.append(f"groups={draw(st.sampled_from([2, 4, f]))}")
        if draw(st.integers(0, 7)) == 0:
            lines.append("dilation=2")
        if draw(st.integers(0, 7)) == 0:
            lines.append(f"stride_x={draw(st.sampled_from([1, 2]))}\nstride_y={draw(st.sampled_from([1, 2]))}")
        if draw(st.integers(0, 7)) == 0:
            lines.append(f"padding={draw(st.sampled_from([0, 1, 2, 3]))}")
        return "\n".join(lines)
    if kind == "maxpool":
        lines = ["[maxpool]", f"size={draw(st.sampled_from([1, 2, 3, 5]))}", f"stride={draw(st.sampled_from([1, 2, 3]))}"]
        if draw(st.integers(0, 3)) == 0:
            lines.append(f"padding={draw(st.sampled_from([0, 1, 2, 4]))}")
        return "\n".join(lines)
    if kind == "maxpool_depth":
        return f"[maxpool]\nmaxpool_depth=1\nout_channels={draw(st.sampled_from([1, 2, 4]))}\nsize=1\nstride=1"
    if kind == "upsample":
        return f"[upsample]\nstride={draw(st.sampled_from([1, 2, 3]))}"
    if kind == "route":
        refs = sorted({-back() for _ in range(draw(st.integers(1, 3)))})
        extra = f"\ngroups=2\ngroup_id={draw(st.integers(0, 1))}" if draw(st.integers(0, 4)) == 0 else ""
        return "[route]\nlayers=" + ",".join(map(str, refs)) + extra
    if kind == "shortcut":
        return f"[shortcut]\nfrom=-{back()}\nactivation={draw(st.sampled_from(ACTS))}"
    if kind == "reorg":
        return f"[reorg]\nstride={draw(st.sampled_from([1, 2]))}"
    if kind == "softmax":
        return f"[softmax]\ngroups={draw(st.sampled_from([1, 1, 2]))}"
    if kind in ("scale_channels", "sam"):
        return f"[{kind}]\nfrom=-{back()}"
    return {"avgpool": "[avgpool]", "dropout": "[dropout]\nprobability=.5"}[kind]


@st.composite
def networks(draw) -> str:
    w, h = draw(st.sampled_from([8, 12, 16, 24, 32])), draw(st.sampled_from([8, 16, 20, 32]))
    head = f"[net]\nwidth={w}\nheight={h}\nchannels={draw(st.sampled_from([1, 3, 4]))}\n"
    n = draw(st.integers(1, 8))
    return head + "\n".join("\n" + draw(section(i)) + "\n" for i in range(n))


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


def random_weights(layers: list, rng) -> bytes:
    """A Darknet weights file for ``layers``: tame random values (unit BN statistics, fan-in scaled weights)."""
    parts = [np.array([0, 2, 0], "<i4").tobytes(), np.zeros(1, "<u8").tobytes()]
    for l in layers:
        if l.kind != "convolutional":
            continue
        p = l.p
        n, k = p["filters"], (p["in_c"] // p["groups"]) * p["size"] ** 2
        arrays = [rng.standard_normal(n) * 0.1]
        if p["bn"]:
            arrays += [rng.uniform(0.5, 1.5, n), rng.standard_normal(n) * 0.1, rng.uniform(0.5, 2.0, n)]
        arrays.append(rng.standard_normal(n * k) / np.sqrt(k))
        parts += [a.astype("<f4").tobytes() for a in arrays]
    return b"".join(parts)


@settings(max_examples=EXAMPLES or 50, deadline=None, derandomize=EXAMPLES is None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(text=networks(), seed=st.integers(0, 2**16))
def test_random_networks_run_and_match_the_reference(runtime, tmp_path, text, seed):
    cfg = tmp_path / "net.cfg"
    cfg.write_text(text)
    try:
        sections = parse_cfg(cfg)
        net = parse_net(sections[0])
        layers = build_layers(sections, net)
    except YoloClError as e:
        assert "\n" not in str(e)
        return
    rng = np.random.default_rng(seed)
    weights = tmp_path / "net.weights"
    weights.write_bytes(random_weights(layers, rng))
    graph = build_graph(net, layers, load_weights(weights, layers))
    blob = rng.random((2, net.channels, net.height, net.width), dtype=np.float32)
    one = Executor(runtime, graph, 1).run(blob[:1])
    two = Executor(runtime, graph, 2).run(blob)
    for a, b in zip(one, two):                          # batching changes nothing but the summation order
        np.testing.assert_allclose(a[0], b[0], rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(a).max(initial=0))))
    if any(l.kind == "convolutional" and l.p["dilation"] > 1 for l in layers):
        return                                           # the reference pads dilated convs differently
    try:
        ref = list(dio.forward_numpy(str(cfg), str(weights), blob[:1], keep="heads").values())
    except (NotImplementedError, IndexError, ValueError):
        return                                           # a network the reference does not model
    if any(not np.all(np.isfinite(r)) or np.abs(r).max(initial=0) > 1e30 for r in ref):
        return                                           # -FLT_MAX from empty pools: nothing to compare
    assert [r.shape for r in ref] == [o.shape for o in one]
    for got, want in zip(one, ref):
        scale = max(1.0, float(np.abs(want).max(initial=0)))
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * scale)
