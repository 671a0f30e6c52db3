"""Files users own: the tuning database survives corruption and concurrent writers.

A corrupt database (garbage, truncated YAML, the wrong shape, non-UTF-8, bogus entries) is
ignored with one warning and the model still runs on heuristic configs. Writes land
atomically (a failed write leaves the old file and no temp file), and several processes
merging into the same file at once lose none of each other's entries.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from yolo_cl import Detector
from yolo_cl import tuning_db
from yolo_cl.kernels.family import stored_config_fits
from yolo_cl.precision import FP32
from yolo_cl.runtime import Runtime
from yolo_cl.tuning_db import TuningDatabase, read_db, write_db

ROOT = Path(__file__).resolve().parents[1]
TINY_CFG = ROOT / "models" / "yolov3-tiny.cfg"
TINY_WEIGHTS = ROOT / "models" / "yolov3-tiny.weights"
SIZE = 64
IDENT = {"device": "Test Device", "driver": "1.0", "vendor": "Test", "type": "GPU", "precision": "fp32"}


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


@pytest.fixture(scope="module")
def reference(runtime, tmp_path_factory):
    """Heads of yolov3-tiny with an empty database (heuristic configs everywhere)."""
    empty = tmp_path_factory.mktemp("db") / "none.yaml"
    det = Detector(TINY_CFG, TINY_WEIGHTS, input_size=SIZE, device=runtime.device,
                   tuning=TuningDatabase(runtime, FP32, paths=[], user_path=empty, fits=stored_config_fits(runtime, "")))
    return det.forward(_blob())


def _blob() -> np.ndarray:
    return np.random.default_rng(0).random((1, 3, SIZE, SIZE), dtype=np.float32)


@pytest.fixture(autouse=True)
def fresh_warnings():
    """The database warns once per file and process; forget earlier tests' warnings."""
    tuning_db._WARNED.clear()
    yield


def _device_record(runtime, configs) -> dict:
    return {"device": runtime.device_name, "driver": runtime.driver, "vendor": runtime.vendor,
            "type": runtime.device_type, "precision": "fp32", "configs": configs}


CORRUPT = {
    "garbage": b"\x00\xff\xfe binary junk \x80\x81",
    "truncated": b"version: 1\nrecords:\n- device: 'Some GPU\n  configs: {k3: {algo: im2c",
    "not_utf8": b"version: 1\nrecords: []\n# \xff\xfe\n",
    "a_list": b"- 1\n- 2\n",
    "a_string": b"just some text\n",
    "records_not_list": b"version: 1\nrecords: {a: 1}\n",
    "configs_not_dict": b"version: 1\nrecords:\n- {device: x, configs: [1, 2]}\n",
    "python_tag": b"!!python/object/apply:os.system ['echo pwned > /tmp/yolo-cl-pwned']\n",
    "alias_bomb": b"a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                  b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                  b"records: [*d]\n",
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_corrupt_database_is_ignored_with_one_warning(runtime, reference, tmp_path, name, caplog):
    path = tmp_path / "tuning.yaml"
    path.write_bytes(CORRUPT[name])
    caplog.set_level(logging.WARNING, logger="yolo_cl.tuner")
    db = TuningDatabase(runtime, FP32, paths=[path], user_path=path, fits=stored_config_fits(runtime, ""))
    det = Detector(TINY_CFG, TINY_WEIGHTS, input_size=SIZE, device=runtime.device, tuning=db)
    for a, b in zip(det.forward(_blob()), reference):
        np.testing.assert_array_equal(a, b)
    warnings = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "\n" not in warnings[0]
    assert not Path("/tmp/yolo-cl-pwned").exists()


def test_bogus_entries_for_this_device_fall_back(runtime, reference, tmp_path):
    """Entries filed under this very device but unusable (wrong algorithm, garbage values) never break a run."""
    probe = Detector(TINY_CFG, TINY_WEIGHTS, input_size=SIZE, device=runtime.device,
                     tuning=TuningDatabase(runtime, FP32, paths=[], user_path=tmp_path / "none.yaml", fits=stored_config_fits(runtime, "")))
    keys = [tuning_db.shape_key(n) for n in probe.graph.nodes if n.op == "conv"]
    bogus = [{"algo": "gemm1x1", "TM": 4, "VW": 8}, {"algo": "im2col", "TM": "x", "VW": -1},
             {"algo": "winograd", "family": "nonsense"}, {"algo": "depthwise"}, "not a dict", None, 42]
    configs = {k: bogus[i % len(bogus)] for i, k in enumerate(keys)}
    path = tmp_path / "tuning.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "records": [_device_record(runtime, configs)]}))
    det = Detector(TINY_CFG, TINY_WEIGHTS, input_size=SIZE, device=runtime.device,
                   tuning=TuningDatabase(runtime, FP32, paths=[path], user_path=path, fits=stored_config_fits(runtime, "")))
    for a, b in zip(det.forward(_blob()), reference):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_write_is_atomic_when_the_rename_fails(tmp_path, monkeypatch):
    path = tmp_path / "tuning.yaml"
    write_db(path, [dict(IDENT, configs={"k1": {"algo": "im2col"}})])
    before = path.read_bytes()

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        write_db(path, [dict(IDENT, configs={"k2": {"algo": "im2col"}})])
    monkeypatch.undo()
    assert path.read_bytes() == before
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("tuning.yaml", "tuning.yaml.lock")]
    assert not leftovers, f"temp files left behind: {leftovers}"


def _writer(path: str, worker: int, n: int) -> None:
    """One tuner process: ``n`` separate merges of its own entries into the shared file."""
    for i in range(n):
        write_db(Path(path), [dict(IDENT, configs={f"w{worker} e{i}": {"algo": "im2col", "TM": i % 8 + 1}})])


def _reader(path: str, stop, bad) -> None:
    """Reads the file as fast as it can; counts any read that is not a complete database."""
    while not stop.is_set():
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            continue
        try:
            data = yaml.safe_load(text)
            if not isinstance(data, dict) or not isinstance(data.get("records"), list):
                bad.value += 1
        except yaml.YAMLError:
            bad.value += 1


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "tuning.yaml"
    workers, per_worker = 4, 15
    ctx = mp.get_context("spawn")
    stop, bad = ctx.Event(), ctx.Value("i", 0)
    reader = ctx.Process(target=_reader, args=(str(path), stop, bad))
    reader.start()
    procs = [ctx.Process(target=_writer, args=(str(path), w, per_worker)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    stop.set()
    reader.join(timeout=30)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    recs = read_db(path)
    assert len(recs) == 1
    expected = {f"w{w} e{i}" for w in range(workers) for i in range(per_worker)}
    assert set(recs[0]["configs"]) == expected
    assert bad.value == 0, f"a reader saw {bad.value} incomplete databases"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_annotated_image_is_written_atomically(tmp_path, monkeypatch):
    """A failed write (disk full at the rename) leaves no file under the final name and no temp file."""
    from yolo_cl.cli import write_image
    from yolo_cl.writers import OutputError
    img = np.zeros((8, 8, 3), np.uint8)
    final = tmp_path / "out.jpg"

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OutputError, match="out.jpg: cannot write annotated image .No space left"):
        write_image(final, img)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    write_image(final, img)
    assert [p.name for p in tmp_path.iterdir()] == ["out.jpg"]


@pytest.mark.parametrize("where", ["reserved", "opened", "written"])
def test_interrupt_between_the_steps_of_a_write_leaves_no_temp_file(tmp_path, where):
    """Ctrl-C can land between two steps of a write, where no ``except`` of the writer sees it
    (CI once found ``.img0011.jpg.<pid>-<hex>.part.jpg`` after one): the process removes it at exit."""
    import subprocess
    import sys
    script = f"""
from pathlib import Path
from yolo_cl.writers import AtomicFile, temp_beside
final = Path({str(tmp_path / 'out.jpg')!r})
if {where!r} == "reserved":
    temp_beside(final)
else:
    f = AtomicFile(final, binary=True)
    if {where!r} == "written":
        f.write(b"half")
raise KeyboardInterrupt
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "KeyboardInterrupt" in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_forked_child_leaves_its_parents_temp_files_alone(tmp_path):
    """The exit-time cleanup removes only the exiting process's own temp files: a child forked
    mid-write (which runs the parent's exit handlers) must not delete the file the parent is
    still writing."""
    import subprocess
    import sys
    script = f"""
import os, sys
from pathlib import Path
from yolo_cl.writers import temp_beside
tmp = temp_beside(Path({str(tmp_path / 'out.jpg')!r}))
pid = os.fork()
if pid == 0:
    sys.exit(0)
os.waitpid(pid, 0)
print("kept" if tmp.exists() else "gone")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "kept", proc.stderr
    assert list(tmp_path.iterdir()) == []       # and the parent's own exit removed it
