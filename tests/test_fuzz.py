"""Property-based fuzzing of everything that reads a user's cfg or weights file.

Each case mutates a real file (the zoo cfgs, the bundled yolov3-tiny weights) and runs
it through parse_cfg -> parse_net -> build_layers -> build_graph (shapes only) ->
plan_memory -> the executor's memory check, or through load_weights. The property: the
result is a valid model or exactly one yolo_cl error with a short one-line printable
message; never another exception, never more than a few seconds, never a large
allocation (each case runs under an address-space limit a little above the process's
current size, so a big allocation fails with MemoryError, which the property rejects).

YOLO_CL_FUZZ_EXAMPLES scales the number of cases per property (default sized for CI).
"""
from __future__ import annotations

import os
import re
import resource
import signal
import struct
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from procmem import mapped_bytes
from yolo_cl.cfg import MAX_CFG_BYTES, parse_cfg
from yolo_cl.errors import CfgError, LimitError, WeightsError, YoloClError
from yolo_cl.graph import build_graph
from yolo_cl.kernels.nodes import largest_workspace_elems
from yolo_cl.layers import build_layers, parse_net
from yolo_cl.limits import check_executor
from yolo_cl.planner import plan_memory
from yolo_cl.weights import load_weights, param_count

ROOT = Path(__file__).resolve().parents[1]
CFGS = sorted((ROOT / "models" / "cfg").glob("*.cfg")) + [ROOT / "models" / "yolov3-tiny.cfg"]
TINY_CFG = ROOT / "models" / "yolov3-tiny.cfg"
TINY_WEIGHTS = ROOT / "models" / "yolov3-tiny.weights"
EXAMPLES = int(os.environ.get("YOLO_CL_FUZZ_EXAMPLES", "0")) or None
CASE_SECONDS = 10            # a case running longer than this counts as a hang
CASE_PEAK_BYTES = 512 << 20  # the most one case may allocate (the real weights are 34 MiB)


def fuzz_settings(default: int):
    """Hypothesis settings: ``default`` cases unless YOLO_CL_FUZZ_EXAMPLES says otherwise."""
    return settings(max_examples=EXAMPLES or default, deadline=None, derandomize=EXAMPLES is None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


@contextmanager
def bounded(seconds: float = CASE_SECONDS, peak: int = CASE_PEAK_BYTES):
    """Fail the case if it runs past ``seconds`` or maps more than ``peak`` new bytes."""
    def alarm(signum, frame):
        raise TimeoutError(f"case ran longer than {seconds} s")
    old = signal.signal(signal.SIGALRM, alarm)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped_bytes() + peak
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, old)


def assert_clean_error(e: BaseException) -> None:
    """A yolo_cl error whose message is one short printable line."""
    assert isinstance(e, YoloClError), f"{type(e).__name__} escaped: {e!r}"
    msg = str(e)
    assert msg and "\n" not in msg and "\r" not in msg, repr(msg)
    assert msg.isprintable(), repr(msg)
    assert len(msg) <= 600, f"message of {len(msg)} characters: {msg[:200]!r}..."


def build_model(path, input_size=None):
    """The whole shape pipeline up to (not including) device allocation."""
    sections = parse_cfg(path)
    net = parse_net(sections[0], input_size)
    layers = build_layers(sections, net)
    graph = build_graph(net, layers, None)
    plan = plan_memory(graph, 1)
    ws = max((largest_workspace_elems(n, 1) for n in graph.nodes), default=0)
    check_executor(graph, plan.arena_elems, ws, 1, 4, None)
    return graph, plan


def outcome(fn, *args):
    """Run ``fn``; return its result or the yolo_cl error it raised (after checking the error is clean)."""
    try:
        return fn(*args)
    except Exception as e:   # the property under test: only clean yolo_cl errors come out
        assert_clean_error(e)
        return e


# -- cfg mutations -------------------------------------------------------------------------------
CFG_LINES = {p.name: p.read_bytes().split(b"\n") for p in CFGS}

HUGE_NUMBERS = ["0", "-1", "-2147483649", "2147483648", "4294967296", "99999999999999999999", "1e308", "1e400",
                "-1e400", "nan", "inf", "-inf", "1.5", "0x10", "1_000", "9" * 5000, "65537", "16385", "-0"]
WRONG_TYPES = ["", "abc", "1,2,3", ",,,", "=", "==1", "leaky,linear", "\u00e9\u00e8", "\u0661\u0662", "[net]",
               "1 2", "True", "None", "\x1b[31mred", "\u202e", "#", ";"]
JUNK = [b"\x00\x00\x00", b"\xff\xfe\xfd", b"\x80abc", b"\xc3\x28", b"\x1b[2J", b"\r\r\r", b"\x0b\x0c\x1c\x85",
        "\u2028x=1\u2029".encode(), b"[", b"]", b"[]", b"[ ]", b"[convolutional", b"x" * 5000]
KEYS = ["filters", "size", "stride", "pad", "padding", "groups", "layers", "from", "classes", "num", "mask",
        "anchors", "width", "height", "channels", "activation", "batch_normalize", "dilation", "stride_x",
        "stride_y", "maxpool_depth", "out_channels", "scale_x_y", "group_id", "scale_wh", "temperature", "reverse",
        "coords", "letter_box", "weights_type", "bogus_key", "\u00fcber", "", " "]
SECTIONS = ["net", "convolutional", "maxpool", "avgpool", "route", "shortcut", "upsample", "reorg",
            "scale_channels", "sam", "dropout", "softmax", "yolo", "region", "connected", "lstm", "nonsense",
            "NET", " conv ", "\u00e9"]

values = st.one_of(st.sampled_from(HUGE_NUMBERS), st.sampled_from(WRONG_TYPES),
                   st.integers(-2**70, 2**70).map(str), st.floats(allow_nan=True).map(repr),
                   st.text(max_size=12))
lines_op = st.one_of(
    st.tuples(st.just("delete"), st.integers(0, 10**6)),
    st.tuples(st.just("duplicate"), st.integers(0, 10**6)),
    st.tuples(st.just("swap"), st.integers(0, 10**6), st.integers(0, 10**6)),
    st.tuples(st.just("value"), st.integers(0, 10**6), values),
    st.tuples(st.just("key"), st.integers(0, 10**6), st.sampled_from(KEYS), values),
    st.tuples(st.just("section"), st.integers(0, 10**6), st.sampled_from(SECTIONS)),
    st.tuples(st.just("junk"), st.integers(0, 10**6), st.one_of(st.sampled_from(JUNK), st.binary(max_size=16))),
    st.tuples(st.just("truncate"), st.integers(0, 10**6)),
    st.tuples(st.just("repeat_block"), st.integers(0, 10**6), st.integers(1, 40)),
)


def mutate(lines: list, ops: list) -> bytes:
    """Apply line-level mutations to a cfg's lines."""
    lines = list(lines)
    for op in ops:
        n = len(lines)
        if n == 0:
            break
        i = op[1] % n
        kind = op[0]
        if kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        elif kind == "swap":
            j = op[2] % n
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "value":
            if b"=" in lines[i]:
                lines[i] = lines[i].split(b"=", 1)[0] + b"=" + op[2].encode("utf-8", "surrogatepass")
        elif kind == "key":
            lines.insert(i, f"{op[2]}={op[3]}".encode("utf-8", "surrogatepass"))
        elif kind == "section":
            lines.insert(i, f"[{op[2]}]".encode())
        elif kind == "junk":
            lines.insert(i, op[2])
        elif kind == "truncate":
            lines = lines[:i]
        elif kind == "repeat_block":
            # Repeat a section-sized block many times: long, deep networks.
            block = lines[i:i + 12]
            lines[i:i] = block * op[2]
    return b"\n".join(lines)


@fuzz_settings(1500)
@given(name=st.sampled_from(sorted(CFG_LINES)), ops=st.lists(lines_op, min_size=1, max_size=4),
       size=st.sampled_from([None, None, 32, 64, (96, 32), 608]))
def test_mutated_cfgs_give_a_model_or_one_clean_error(tmp_path, name, ops, size):
    path = tmp_path / name
    path.write_bytes(mutate(CFG_LINES[name], ops))
    with bounded():
        result = outcome(build_model, path, size)
    if not isinstance(result, Exception):
        graph, plan = result
        assert graph.nodes and plan.arena_elems > 0
        for t in graph.tensors:
            assert t.c >= 1 and t.h >= 1 and t.w >= 1


@fuzz_settings(400)
@given(data=st.binary(max_size=4096))
def test_random_bytes_are_rejected_cleanly(tmp_path, data):
    path = tmp_path / "random.cfg"
    path.write_bytes(data)
    with bounded():
        result = outcome(build_model, path)
    assert isinstance(result, CfgError)


@fuzz_settings(300)
@given(text=st.text(alphabet=st.sampled_from(list("[]=,#;-0123456789 \n\tnetconvlutiaskyrofmwhdgp_")), max_size=600))
def test_cfg_shaped_text_gives_a_model_or_one_clean_error(tmp_path, text):
    path = tmp_path / "shaped.cfg"
    path.write_text("[net]\nwidth=64\nheight=64\n" + text)
    with bounded():
        outcome(build_model, path)


@pytest.mark.parametrize("cfg", CFGS, ids=lambda p: p.name)
def test_every_zoo_cfg_builds_unmutated(cfg):
    """The fuzzer's seeds are valid models, so mutations start from the interesting side of the border."""
    graph, _ = build_model(cfg, 64 if "efficientnet" not in cfg.name else 224)
    assert graph.nodes


# -- targeted hostile cfgs: each must be a LimitError/CfgError, fast and without allocating --------
HOSTILE = {
    "wide_input": "[net]\nwidth=16384\nheight=16384\nchannels=4096\n[convolutional]\nfilters=1\n",
    "huge_conv": "[net]\nwidth=16384\nheight=16384\n[convolutional]\nfilters=65536\nsize=64\npad=1\n",
    "upsample_blowup": "[net]\nwidth=16384\nheight=16384\n" + "[upsample]\nstride=64\n" * 3,
    "reorg_channels": "[net]\nwidth=4096\nheight=4096\nchannels=4096\n[reorg]\nstride=64\n",
    "many_routes": "[net]\nwidth=32\nheight=32\n[convolutional]\nfilters=1\n[route]\nlayers=" + ",".join(["0"] * 100000),
    "long_number": "[net]\nwidth=" + "9" * 100000 + "\n[maxpool]\n",
    "weights_1e12": "[net]\nwidth=1\nheight=1\nchannels=4096\n" + "[convolutional]\nfilters=65536\nsize=64\npad=1\n",
    "im2col_overflow": "[net]\nwidth=2048\nheight=2048\nchannels=512\n[convolutional]\nfilters=1\nsize=9\npad=1\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_cfgs_are_refused_before_allocating(tmp_path, name):
    path = tmp_path / f"{name}.cfg"
    path.write_text(HOSTILE[name])
    with bounded(seconds=5, peak=64 << 20):
        result = outcome(build_model, path)
    assert isinstance(result, (LimitError, CfgError)), result


def test_limit_error_names_the_layer_and_size(tmp_path):
    path = tmp_path / "big.cfg"
    path.write_text("[net]\nwidth=2048\nheight=2048\n[convolutional]\nfilters=64\nsize=3\npad=1\n"
                    "[convolutional]\nfilters=4096\nsize=3\npad=1\n")
    with pytest.raises(LimitError, match=r"layer 1 \[convolutional\] would need [\d.]+ GiB"):
        build_model(path)


def test_memory_cap_env_var(tmp_path, monkeypatch):
    """YOLO_CL_MAX_BYTES lowers the cap: yolov3-tiny at 416 fits 16 GiB, not 1 MiB."""
    build_model(TINY_CFG)
    monkeypatch.setenv("YOLO_CL_MAX_BYTES", "1M")
    with pytest.raises(LimitError, match="YOLO_CL_MAX_BYTES"):
        build_model(TINY_CFG)
    monkeypatch.setenv("YOLO_CL_MAX_BYTES", "lots")
    with pytest.raises(LimitError, match="not a size"):
        build_model(TINY_CFG)


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo", "oversized", "empty", "bad_input_size",
                                  "name_too_long", "control_chars_in_name"])
def test_cfg_files_that_are_not_files(tmp_path, kind):
    path = tmp_path / "x.cfg"
    size = None
    if kind == "name_too_long":
        path = tmp_path / ("x" * 5000)
    elif kind == "control_chars_in_name":
        path = tmp_path / "evil\n\x1b[2J.cfg"
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)            # reading it would block forever
    elif kind == "oversized":
        with open(path, "wb") as f:
            f.truncate(MAX_CFG_BYTES + 1)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "bad_input_size":
        path.write_bytes(TINY_CFG.read_bytes())
        size = "416"
    with bounded(seconds=5):
        result = outcome(build_model, path, size)
    assert isinstance(result, CfgError)


# -- weights mutations ---------------------------------------------------------------------------
def tiny_prefix(n_convs: int) -> tuple:
    """The first ``n_convs`` conv layers of yolov3-tiny (cfg text, layers) and their exact weights bytes."""
    text = TINY_CFG.read_text()
    blocks = re.split(r"(?m)^(?=\[)", text)
    out, convs = [], 0
    for b in blocks:
        if b.startswith("[convolutional]"):
            if convs == n_convs:
                break
            convs += 1
        if b.startswith("[yolo]") or b.startswith("[route]"):
            break
        out.append(b)
    cfg = "".join(out)
    sections = parse_cfg("prefix.cfg", cfg)
    layers = build_layers(sections, parse_net(sections[0], 32))
    header = TINY_WEIGHTS.open("rb").read(20)
    nbytes = 4 * sum(param_count(l) for l in layers if l.kind == "convolutional")
    with TINY_WEIGHTS.open("rb") as f:
        f.seek(20)
        body = f.read(nbytes)
    return layers, header + body


PREFIXES = {n: tiny_prefix(n) for n in (1, 2, 4)}
SPECIAL_FLOATS = [float("nan"), float("inf"), float("-inf"), -1.0, 3.4e38, -3.4e38, 1e-45, 0.0]

weights_op = st.one_of(
    st.tuples(st.just("float"), st.integers(0, 10**9), st.sampled_from(SPECIAL_FLOATS)),
    st.tuples(st.just("byte"), st.integers(0, 10**9), st.integers(0, 255)),
    st.tuples(st.just("header"), st.integers(0, 4), st.integers(-2**31, 2**31 - 1)),
    st.tuples(st.just("truncate"), st.integers(0, 10**9)),
    st.tuples(st.just("extend"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("replace"), st.binary(max_size=64)),
)


def mutate_weights(data: bytes, ops: list) -> bytes:
    buf = bytearray(data)
    for op in ops:
        kind = op[0]
        if kind == "float" and len(buf) >= 24:
            i = 20 + 4 * (op[1] % ((len(buf) - 20) // 4))
            buf[i:i + 4] = struct.pack("<f", op[2])
        elif kind == "byte" and buf:
            buf[op[1] % len(buf)] = op[2]
        elif kind == "header" and len(buf) >= 20:
            off = 4 * op[1]
            buf[off:off + 4] = struct.pack("<i", op[2])
        elif kind == "truncate":
            del buf[op[1] % (len(buf) + 1):]
        elif kind == "extend":
            buf += op[1]
        elif kind == "replace":
            buf = bytearray(op[1])
    return bytes(buf)


@fuzz_settings(1500)
@given(n=st.sampled_from(sorted(PREFIXES)), ops=st.lists(weights_op, min_size=1, max_size=3))
def test_garbled_weights_load_or_fail_cleanly(tmp_path, n, ops):
    layers, good = PREFIXES[n]
    path = tmp_path / "w.weights"
    path.write_bytes(mutate_weights(good, ops))
    with bounded():
        result = outcome(load_weights, path, layers)
    if isinstance(result, dict):
        convs = [l for l in layers if l.kind == "convolutional"]
        assert sorted(result) == [l.index for l in convs]
        for l in convs:
            p = result[l.index]
            assert p.weights.shape == (l.p["filters"], l.p["in_c"] // l.p["groups"], l.p["size"], l.p["size"])
            assert np.all(np.isfinite(p.weights)) and np.all(np.isfinite(p.biases))
            if p.variance is not None:
                assert np.all(p.variance >= 0)


@pytest.fixture(scope="module")
def tiny_layers():
    sections = parse_cfg(TINY_CFG)
    return build_layers(sections, parse_net(sections[0]))


@fuzz_settings(300)
@given(length=st.one_of(st.integers(0, 64), st.integers(0, TINY_WEIGHTS.stat().st_size + 4096),
                        st.integers(TINY_WEIGHTS.stat().st_size, 2**36)))
def test_real_weights_truncated_or_extended(tmp_path, tiny_layers, length):
    """Any length but the exact one is refused before the data is read (sparse files: no copying)."""
    path = tmp_path / "tiny.weights"
    with open(path, "wb") as f:
        f.write(TINY_WEIGHTS.open("rb").read(min(length, 20)))
        f.truncate(length)
    exact = length == TINY_WEIGHTS.stat().st_size
    with bounded(seconds=5, peak=CASE_PEAK_BYTES if exact else 64 << 20):
        result = outcome(load_weights, path, tiny_layers)
    if exact:
        assert isinstance(result, (dict, WeightsError))
    else:
        assert isinstance(result, WeightsError)
        if length >= 20:
            assert f"{length} bytes" in str(result)


@pytest.mark.parametrize("where,value,match", [
    (-1, float("nan"), r"layer 22 \[convolutional\] .* non-finite weights"),
    (24, float("inf"), r"layer 0 \[convolutional\] .* non-finite biases"),
])
def test_real_weights_garbled_name_the_layer(tmp_path, tiny_layers, where, value, match):
    data = bytearray(TINY_WEIGHTS.read_bytes())
    i = len(data) - 4 if where < 0 else where
    data[i:i + 4] = struct.pack("<f", value)
    path = tmp_path / "tiny.weights"
    path.write_bytes(bytes(data))
    with pytest.raises(WeightsError, match=match):
        load_weights(path, tiny_layers)
    assert load_weights(TINY_WEIGHTS, tiny_layers)   # the pristine file loads


def test_weights_cap_refuses_before_reading(tmp_path, tiny_layers, monkeypatch):
    """A cfg asking for more weights than the cap is refused without touching the data."""
    monkeypatch.setenv("YOLO_CL_MAX_BYTES", "16M")
    monkeypatch.setattr(np, "fromfile", lambda *a, **k: pytest.fail("weights data read despite the cap"))
    with pytest.raises(LimitError, match="weights"):
        load_weights(TINY_WEIGHTS, tiny_layers)


def test_weights_for_1e12_floats(tmp_path, monkeypatch):
    """Layers that pass shape checks under a raised cap still cannot make load_weights read 4 TB."""
    monkeypatch.setenv("YOLO_CL_MAX_BYTES", str(1 << 50))
    path = tmp_path / "w.cfg"
    path.write_text("[net]\nwidth=1\nheight=1\nchannels=4096\n" + "[convolutional]\nfilters=65536\nsize=64\npad=1\n")
    sections = parse_cfg(path)
    layers = build_layers(sections, parse_net(sections[0]))
    monkeypatch.delenv("YOLO_CL_MAX_BYTES")
    weights = tmp_path / "w.weights"
    with open(weights, "wb") as f:
        f.write(TINY_WEIGHTS.open("rb").read(20))
        f.truncate(1 << 40)   # sparse: 1 TiB of nothing
    monkeypatch.setattr(np, "fromfile", lambda *a, **k: pytest.fail("weights data read despite the cap"))
    with bounded(seconds=5, peak=64 << 20), pytest.raises(LimitError, match="weights"):
        load_weights(weights, layers)


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo", "empty", "short_header", "name_too_long"])
def test_weights_files_that_are_not_files(tmp_path, tiny_layers, kind):
    path = tmp_path / "x.weights"
    if kind == "name_too_long":
        path = tmp_path / ("x" * 5000)
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "short_header":
        path.write_bytes(b"\x00" * 10)
    with bounded(seconds=5):
        result = outcome(load_weights, path, tiny_layers)
    assert isinstance(result, WeightsError)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_cli_reports_hostile_cfgs_in_one_line(tmp_path, capsys, name):
    from yolo_cl.cli import main
    path = tmp_path / f"{name}.cfg"
    path.write_text(HOSTILE[name])
    with bounded(seconds=5, peak=64 << 20):
        code = main(["info", "--cfg", str(path)])
    out, err = capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("yolo-cl: error: "), err


@pytest.mark.parametrize("conv,ok", [
    ("size=3\npad=1\ndilation=2", True),          # odd size, pad = size/2: Darknet's and the dilated size agree
    ("size=7\npadding=3\ndilation=2", True),
    ("size=2\npad=1\ndilation=2", False),         # even size: Darknet allocates one size and writes another
    ("size=3\npadding=0\ndilation=2", False),
])
def test_dilated_convs_whose_size_darknet_gets_wrong_are_refused(tmp_path, conv, ok):
    path = tmp_path / "dil.cfg"
    path.write_text(f"[net]\nwidth=16\nheight=16\nchannels=3\n[convolutional]\nfilters=4\n{conv}\n")
    result = outcome(build_model, path)
    if ok:
        graph, _ = result
        assert graph.nodes[0].output.shape == (4, 16, 16)
    else:
        assert isinstance(result, CfgError) and "dilation=2" in str(result)


# -- the command line ----------------------------------------------------------------------------
# Generated argument lists run through the CLI's main() in-process (what a fresh process would do
# with the same argv), with every model path drawn from files that cannot load, so a case ends
# before any OpenCL work: thousands of cases in seconds. A few real subprocess runs follow.
CLI_OPTIONS = {
    "detect": ["--model", "--cfg", "--weights", "--names", "--thresh", "--nms", "--out", "--jsonl", "--device",
               "--size", "--fit", "--precision", "--batch", "--reconnect", "--json", "--letterbox", "--show",
               "--live", "--verbose"],
    "info": ["--cfg", "--size", "--batch", "--precision", "--verbose"],
    "tune": ["--size", "--batch", "--precision", "--device", "--budget", "--db", "--clock", "--jobs", "--verbose"],
    "bench": ["--size", "--batch", "--precision", "--device", "--weights", "--repeat", "--peak", "--compare"],
}
FLAGS = {"--json", "--letterbox", "--show", "--live", "--verbose"}
NUMBERS = ["0", "1", "-1", "0.5", "nan", "inf", "-inf", "1e309", "416", "608x352", "0x0", "99999999999", "", " ",
           "3.7", "x"]
PRINTABLE_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory):
    """Inputs that can never load a model: missing, a FIFO, a folder, empty, garbage, a device."""
    d = tmp_path_factory.mktemp("cli")
    fifo = d / "pipe.cfg"
    os.mkfifo(fifo)
    (d / "empty.cfg").write_bytes(b"")
    (d / "garbage.cfg").write_bytes(b"\xff\x00[net\n=\n")
    (d / "folder").mkdir()
    (d / "file").write_bytes(b"x")
    return d, [str(d / "missing.cfg"), str(fifo), str(d / "folder"), str(d / "empty.cfg"), str(d / "garbage.cfg"),
               "/dev/zero", "/dev/null"]


name_bytes = st.binary(min_size=1, max_size=300).map(lambda b: b.replace(b"\0", b"_").replace(b"/", b"_"))


@st.composite
def cli_argv(draw, d: Path, bad: list):
    """A random argv whose model-like arguments all fail to load; names under ``d`` only."""
    def path_arg() -> str:
        kind = draw(st.sampled_from(["bad", "bytes", "nested", "file_under", "special"]))
        if kind == "bad":
            return draw(st.sampled_from(bad))
        raw = os.fsdecode(draw(name_bytes))
        if raw in (".", ".."):
            raw = "_"
        if kind == "nested":
            return str(d / "out" / raw / "x.mp4")
        if kind == "file_under":
            return str(d / "file" / raw)
        if kind == "special":
            return draw(st.sampled_from(["/dev/full", str(d / "folder"), str(d), "/proc/self/status"]))
        return str(d / raw)

    command = draw(st.sampled_from(sorted(CLI_OPTIONS) + ["", "nonsense", "--version"]))
    argv = [command] if command else []
    if command in ("detect", "info", "tune", "bench"):
        model_opt = {"detect": "--cfg", "info": None, "tune": None, "bench": None}[command]
        if model_opt:
            argv += [model_opt, draw(st.sampled_from(bad))]
        else:
            argv.append(draw(st.sampled_from(bad)))
        if command == "detect":
            argv += [path_arg() for _ in range(draw(st.integers(1, 3)))]
        for opt in draw(st.lists(st.sampled_from(CLI_OPTIONS[command]), max_size=5)):
            if opt in ("--model", "--cfg"):
                continue                  # the model argument above stays one that cannot load
            argv.append(opt)
            if opt not in FLAGS:
                argv.append(draw(st.one_of(st.sampled_from(NUMBERS), st.builds(path_arg))))
    else:
        argv += draw(st.lists(st.text(max_size=20), max_size=3))
    return argv


def _run_main(argv: list, cwd) -> tuple:
    """``main(argv)`` run in ``cwd``: outputs that generated arguments name relatively ("--out 0")
    land there, not in the clone, where a folder "0" would turn a later run's camera 0 into a folder."""
    import contextlib
    import io
    from yolo_cl.cli import main
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
    finally:
        os.chdir(here)
    return rc, out.getvalue(), err.getvalue()


def assert_clean_cli(rc, err: str, argv) -> None:
    """Exit 0/1/2, and stderr only one-line messages with no control characters or raw bytes."""
    assert rc in (0, 1, 2), (rc, argv, err)
    for line in err.splitlines():
        assert not PRINTABLE_CONTROL.search(line) and line.isprintable(), (argv, line)
        assert "Traceback" not in line, (argv, err)
    if rc == 2 and err:
        assert err.splitlines()[-1].startswith(("yolo-cl: error:", "yolo-cl ")), (argv, err)


@fuzz_settings(2000)
@given(data=st.data())
def test_cli_argument_combinations_fail_fast_and_cleanly(cli_files, data):
    d, bad = cli_files
    argv = data.draw(cli_argv(d, bad))
    with bounded(seconds=10):
        rc, _, err = _run_main(argv, d)
    assert_clean_cli(rc, err, argv)


@pytest.mark.parametrize("seed", range(4))
def test_cli_subprocess_with_arbitrary_file_names(cli_files, seed):
    """Real processes (argv as bytes, a strict-UTF-8 stderr): random byte names, special files."""
    import subprocess
    import sys
    d, bad = cli_files
    rng = np.random.default_rng(seed)
    names = []
    for _ in range(3):
        raw = bytes(rng.integers(1, 256, int(rng.integers(1, 400)), dtype=np.uint8)).replace(b"/", b"_")
        names.append(os.fsencode(d) + b"/" + raw[:250])
    names.append(b"/dev/zero")
    argv = [sys.executable, "-m", "yolo_cl", "detect", *names, "--cfg", bad[seed % len(bad)].encode(),
            "--out", os.fsencode(d) + b"/out-" + names[0][-20:].replace(b"/", b"_")]
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict", "LC_ALL": "C.UTF-8"}
    p = subprocess.run(argv, capture_output=True, timeout=60, env=env)
    err = p.stderr.decode("utf-8", "strict")
    assert_clean_cli(p.returncode, err, argv)
    assert p.returncode in (1, 2) and err.count("yolo-cl: error:") >= 1, err
