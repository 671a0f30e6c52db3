"""The tuning database (keys, bucketing, hierarchical fall-back, stale drivers, corrupt files,
locked atomic merges) and the tuner (legal, reference-checked choices within its timing budget)."""
from __future__ import annotations

import logging
import multiprocessing
import types
from typing import Optional

import numpy as np
import pytest
import yaml

from yolo_cl import search
from yolo_cl import tuner as tmod
from yolo_cl import tuning_db as dbm
from yolo_cl.kernels import family, gemm_cpu, gemm_local
from yolo_cl.precision import FP16, FP32
from yolo_cl.runtime import Runtime

from tiny_cfgs import conv, net_header, shortcut
from tiny_graphs import conv_nodes


def net_cfg(w: int, h: int) -> str:
    """Four convs (3x3 leaky, 1x1 linear, 3x3/2 mish, 1x1 leaky) and a shortcut, at ``w`` x ``h``."""
    return (net_header(w, h) + conv(8) + conv(12, 1, pad=0, bn=0, act="linear") + conv(6, stride=2, act="mish")
            + conv(6, 1, pad=0, bn=0) + shortcut(-2))


def convs(tmp_path, w=24, h=20):
    return conv_nodes(tmp_path / f"net{w}x{h}.cfg", net_cfg(w, h))


def fake_rt(device="Dev X", driver="1.0", vendor="Acme", kind="CPU"):
    dev = types.SimpleNamespace(max_work_group_size=4096, native_vector_width_float=8, max_compute_units=2)
    return types.SimpleNamespace(device_name=device, driver=driver, vendor=vendor, device_type=kind,
                                 is_cpu=kind == "CPU", device=dev)


CFG_A = {"family": "cpu", "algo": "im2col", "kernel": "nv", "TM": 4, "VW": 8, "NV": 1, "KU": 1, "WG": 0}
CFG_B = {"family": "cpu", "algo": "im2col", "kernel": "mv", "TN": 3, "VW": 8, "NV": 1, "KU": 4, "WG": 0}
CFG_C = {"family": "cpu", "algo": "winograd", "m": 2, "kernel": "nv", "TM": 2, "VW": 8, "NV": 1, "KU": 1, "WG": 0}
CFG_D = {"family": "cpu", "algo": "im2col", "kernel": "nv", "TM": 2, "VW": 8, "NV": 2, "KU": 1, "WG": 0}


def database(rt, **kw):
    """The engine's view of a database for ``rt``'s device: fp32, stored configs checked by the families."""
    return dbm.TuningDatabase(rt, FP32, fits=family.stored_config_fits(rt, ""), **kw)


def record(device="Dev X", driver="1.0", vendor="Acme", kind="CPU", precision="fp32", configs=None):
    return {"device": device, "driver": driver, "vendor": vendor, "type": kind, "precision": precision,
            "configs": configs or {}}


# -- keys -----------------------------------------------------------------------------------
def test_bucketing(tmp_path):
    assert [dbm.n_bucket(n) for n in (1, 2, 3, 169, 256, 257)] == [1, 2, 4, 256, 256, 512]
    a = convs(tmp_path, 24, 20)[0]          # 480 output pixels
    b = convs(tmp_path, 22, 22)[0]          # 484: same bucket, same key
    c = convs(tmp_path, 40, 40)[0]          # 1600: another bucket
    assert dbm.shape_key(a) == dbm.shape_key(b) != dbm.shape_key(c)
    assert "n512" in dbm.shape_key(a) and dbm.shape_key(a, 4).endswith("b4")


# -- the database -----------------------------------------------------------------------------
def test_round_trip_and_merge(tmp_path):
    path = tmp_path / "db.yaml"
    dbm.write_db(path, [record(configs={"k1": CFG_A})])
    dbm.write_db(path, [record(configs={"k2": CFG_B}), record(driver="2.0", configs={"k1": CFG_B})])
    dbm.write_db(path, [record(configs={"k1": CFG_D})])          # same identity: k1 replaced, k2 kept
    recs = dbm.read_db(path)
    assert len(recs) == 2
    one = next(r for r in recs if r["driver"] == "1.0")
    assert one["configs"] == {"k1": CFG_D, "k2": CFG_B}
    assert not list(tmp_path.glob(".db.yaml.*.tmp")), "a temp file was left behind"


def test_fallback_order(tmp_path):
    """device+driver -> device (stale) -> vendor -> type -> no entry; the user file first within a level."""
    node = convs(tmp_path)[0]
    key = dbm.shape_key(node)
    user, shipped = tmp_path / "user.yaml", tmp_path / "shipped.yaml"
    levels = [record(configs={key: CFG_A}),                                    # exact
              record(driver="0.9", configs={key: CFG_B}),                      # same device, old driver
              record(device="Dev Y", configs={key: CFG_C}),                    # same vendor
              record(device="Other", vendor="Else", configs={key: CFG_D})]     # same type only
    expect = [CFG_A, CFG_B, CFG_C, CFG_D]
    for start in range(4):
        shipped.write_text(yaml.safe_dump({"version": 1, "records": levels[start:]}))
        db = database(fake_rt(), paths=[shipped], user_path=user)
        assert db.conv_config(node) == expect[start]
        assert db.origin[key][0] == dbm.LEVELS[start]
        assert (key in db.stale) == (start == 1)
    shipped.write_text(yaml.safe_dump({"version": 1, "records": [record(kind="GPU", configs={key: CFG_A}),
                                                                 record(precision="fp16", configs={key: CFG_A})]}))
    db = database(fake_rt(), paths=[shipped], user_path=user)
    assert db.conv_config(node) is None
    assert db.origin[key][0] == "heuristic"
    # Within a level the user's file wins over the shipped one.
    shipped.write_text(yaml.safe_dump({"version": 1, "records": [record(configs={key: CFG_A})]}))
    dbm.write_db(user, [record(configs={key: CFG_B})])
    assert database(fake_rt(), paths=[shipped], user_path=user).conv_config(node) == CFG_B


def test_a_cpu_takes_entries_of_its_own_vector_width_only(tmp_path):
    """A CPU record says how wide its device's float vectors were; a CPU with 16-float vectors skips
    a narrower device's record at every level and a narrower CPU an AVX-512 one (PoCL names a Zen 3
    and a Zen 5 alike, and AVX2 blocks ran 9-15% slower than the untuned pick on an AVX-512 CPU),
    either takes a record that does not say, and files what it tunes with its width. A GPU has no
    width and takes any record."""
    node = convs(tmp_path)[0]
    key = dbm.shape_key(node)
    user, shipped = tmp_path / "user.yaml", tmp_path / "shipped.yaml"
    wide = fake_rt()
    wide.device.native_vector_width_float = 16

    def found(records, rt) -> Optional[dict]:
        shipped.write_text(yaml.safe_dump({"version": 1, "records": records}))
        return database(rt, paths=[shipped], user_path=user).conv_config(node)
    avx2 = {**record(configs={key: CFG_A}), "lanes": 8}                      # this device's name and driver
    avx512 = {**record(device="Dev Y", configs={key: CFG_C}), "lanes": 16}   # another device of its vendor
    assert found([avx2, avx512], wide) == CFG_C and found([avx2], wide) is None
    assert found([avx2, avx512], fake_rt()) == CFG_A                         # an 8-float CPU: its own
    assert found([record(device="Dev Y", configs={key: CFG_D})], wide) == CFG_D    # a record that does not say
    neon = fake_rt()
    neon.device.native_vector_width_float = 4      # narrower than AVX-512: the narrow records, as before
    assert found([avx2, avx512], neon) == CFG_A
    gpu = fake_rt(kind="GPU")
    assert found([{**record(kind="GPU", configs={key: CFG_B}), "lanes": 8}], gpu) == CFG_B
    db = database(wide, paths=[], user_path=user)
    db.record({key: CFG_B})
    assert [r.get("lanes") for r in dbm.read_db(user)] == [16]
    dbm.write_db(user, [{**record(device="Dev X", configs={"k9": CFG_A}), "lanes": 16}])    # merged, kept
    assert dbm.read_db(user)[0]["lanes"] == 16 and set(dbm.read_db(user)[0]["configs"]) == {key, "k9"}


def test_neighbour_bucket_and_illegal_entries(tmp_path):
    """A new input size finds the neighbouring bucket's entry; an entry illegal for the exact shape is skipped."""
    small, big = convs(tmp_path, 24, 20)[0], convs(tmp_path, 30, 30)[0]   # 480 -> n512, 900 -> n1024
    path = tmp_path / "db.yaml"
    dbm.write_db(path, [record(configs={dbm.shape_key(small): CFG_B})])
    db = database(fake_rt(), paths=[], user_path=path)
    assert db.conv_config(big) == CFG_B
    far = convs(tmp_path, 48, 40)[0]                                     # 1920 -> n2048: two buckets up
    assert db.conv_config(far) is None        # too far to trust
    dbm.write_db(path, [record(configs={dbm.shape_key(big): CFG_D})])  # one bucket away: used
    assert database(fake_rt(), paths=[], user_path=path).conv_config(far) == CFG_D
    bad = dict(CFG_A, WG=7)           # 7 does not divide the column blocks of 900 pixels
    dbm.write_db(path, [record(configs={dbm.shape_key(big): bad, dbm.shape_key(small): bad})])
    db = database(fake_rt(), paths=[], user_path=path)
    assert db.conv_config(big) is None


def test_stale_driver_warns_once(tmp_path, caplog):
    node = convs(tmp_path)[0]
    path = tmp_path / "db.yaml"
    dbm.write_db(path, [record(driver="0.1", configs={dbm.shape_key(node): CFG_A})])
    dbm._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="yolo_cl.tuner"):
        db = database(fake_rt(), paths=[], user_path=path)
        db.conv_config(node)
        db.conv_config(node)
    msgs = [r.getMessage() for r in caplog.records if "re-validate" in r.getMessage()]
    assert len(msgs) == 1 and "0.1" in msgs[0]
    # Recording the shape under the current driver clears it.
    db.record({dbm.shape_key(node): CFG_A})
    assert not db.stale


@pytest.mark.parametrize("text", ["records: [oops\n  - {", "just a string", "records: 5\n",
                                  "records:\n- device: x\n  configs: nope\n", "\x00\xff garbage"])
def test_corrupt_database_warns_and_is_ignored(tmp_path, caplog, text):
    node = convs(tmp_path)[0]
    path = tmp_path / "db.yaml"
    path.write_bytes(text.encode("latin-1"))
    dbm._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="yolo_cl.tuner"):
        db = database(fake_rt(), paths=[], user_path=path)
        assert db.conv_config(node) is None
    assert any("ignoring it" in r.getMessage() for r in caplog.records)
    db.record({dbm.shape_key(node): CFG_A})           # writing replaces the unreadable file
    assert dbm.read_db(path)[0]["configs"] == {dbm.shape_key(node): CFG_A}


def _writer(path: str, i: int) -> None:
    for j in range(5):
        dbm.write_db(path, [record(configs={f"w{i}-{j}": dict(CFG_A, TM=1 + j)})])


def test_concurrent_writers_merge(tmp_path):
    """Four processes writing at once: every entry survives, the file always parses."""
    path = str(tmp_path / "db.yaml")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    configs = dbm.read_db(path)[0]["configs"]
    assert sorted(configs) == sorted(f"w{i}-{j}" for i in range(4) for j in range(5))


# -- the tuner --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rt():
    return Runtime(profiling=True)


def test_search_is_legal_correct_and_within_budget(rt, tmp_path):
    nodes = convs(tmp_path, 20, 16)
    fraction = 0.1                   # of each space: its candidates compile one by one on PoCL
    tuner = tmod.Tuner(rt, FP32, fraction=fraction, reps=1)
    for node in nodes[:2]:
        r = tuner.search(node)
        assert 0 < r.timed <= max(1, int(fraction * r.candidates)), (r.timed, r.candidates)
        assert r.config in tuner.candidates(node)
        assert gemm_cpu.KERNEL_FAMILY.why_illegal(node, r.config, rt) is None
        bench = tmod.ConvBench(rt, node, 1, FP32, tuner.queue, seed=5)
        assert bench.check(bench.bind(r.config)) < 1e-4
        assert 0 < r.ms < float("inf")
    # The tuned config round-trips through the database and is what the executor binds.
    path = tmp_path / "tuned.yaml"
    db = database(rt, paths=[], user_path=path)
    db.record(dbm.entries([r]))
    assert database(rt, paths=[], user_path=path).conv_config(node) == r.config


def test_reference_gate_rejects_wrong_kernels(rt, tmp_path, monkeypatch):
    """A candidate that computes the wrong thing is rejected before timing and never chosen, even
    when the cost model ranks it first (here: its weights are packed with the wrong sign)."""
    node = convs(tmp_path, 12, 12)[0]
    tuner = tmod.Tuner(rt, FP32, fraction=1.0, reps=1)
    good = [CFG_A, CFG_D]
    wrong = dict(CFG_A, TM=3)
    pack = gemm_cpu.pack_weights
    monkeypatch.setattr(gemm_cpu, "pack_weights", lambda w, G, rows, dtype=np.float32:
                        pack(-w if rows == 3 else w, G, rows, dtype))
    monkeypatch.setattr(tuner, "candidates", lambda n: [wrong] + good)
    monkeypatch.setattr(family, "cost", lambda node, c, batch, rt: 0.0 if c is wrong else 1.0)
    for r in (tuner.traverse(node), tuner.search(node)):
        assert r.rejected == 1 and r.config in good
        assert search.config_key(wrong) not in r.times


@pytest.mark.parametrize("build", ["processes", "threads"])
def test_parallel_compile_matches_serial(tmp_path, monkeypatch, build):
    """Candidates compiled ahead in worker processes (into the binary cache, which this process
    then loads: it builds nothing itself) or in threads are checked, rejected and timed exactly
    as when each is built on first use."""
    monkeypatch.setenv("YOLO_CL_CACHE", str(tmp_path / "cache"))
    node = convs(tmp_path, 12, 10)[0]
    cands = [CFG_A, CFG_D, dict(CFG_A, TM=3), dict(CFG_A, injected=1)]   # the last one cannot be bound

    def run(jobs):
        rt = Runtime(profiling=True)
        tuner = tmod.Tuner(rt, FP32, fraction=1.0, reps=1, jobs=jobs, build=build)
        monkeypatch.setattr(tuner, "candidates", lambda n: cands)
        real = tmod.ConvBench.bind
        monkeypatch.setattr(tmod.ConvBench, "bind", lambda self, c: (_ for _ in ()).throw(ValueError("injected"))
                            if c.get("injected") else real(self, c))
        try:
            return tuner.traverse(node), rt.builds
        finally:
            tuner.close()
            monkeypatch.undo()
            monkeypatch.setenv("YOLO_CL_CACHE", str(tmp_path / "cache" / str(jobs)))

    serial, _ = run(1)
    parallel, builds = run(2)
    assert parallel.rejected == serial.rejected == 1
    assert sorted(parallel.times) == sorted(serial.times) and len(serial.times) == 3
    assert parallel.config in cands[:3]
    if build == "processes":
        assert builds == 0, "the main process compiled what the workers had built"


def test_broken_compile_workers_fall_back(rt, tmp_path, monkeypatch, caplog):
    """Workers that cannot start (here: they are sent to a device that does not exist) cost a
    warning; the candidates are then compiled in this process."""
    monkeypatch.setattr(tmod, "device_spec", lambda device: "no such device")
    node = convs(tmp_path, 12, 10)[0]
    tuner = tmod.Tuner(rt, FP32, fraction=1.0, reps=1, jobs=2, build="processes")
    monkeypatch.setattr(tuner, "candidates", lambda n: [CFG_A, CFG_D])
    with caplog.at_level(logging.WARNING, logger="yolo_cl.tuner"):
        r = tuner.traverse(node)
    assert "parallel compile failed" in caplog.text and tuner.build == "threads"
    assert r.config in (CFG_A, CFG_D) and len(r.times) == 2


def test_gpu_cost_model_counts_winograd_batch(tmp_path):
    """The GPU family's cost model sees the T2 GEMMs of a Winograd launch as work-groups: on a
    52x52 3x3 layer (64 -> 128 channels) an F(4x4) 64x64 tile does 4x fewer multiplies than the
    implicit GEMM with the same tile and keeps 132 compute units as busy, so it must rank first.
    (Counting one GEMM's 6 tiles instead of 6 x 36, the model ranked it 4557th of 4862 on an H100,
    where it was the fastest.)"""
    node, = conv_nodes(tmp_path / "w.cfg", net_header(52, 52, 64) + conv(128, bn=0))
    rt = types.SimpleNamespace(device=types.SimpleNamespace(max_compute_units=132), is_cpu=False)
    tile = {"family": "local", "MWG": 64, "NWG": 64, "KWG": 16, "MDIMC": 8, "NDIMC": 32, "SA": 1, "SB": 1, "PF": 1}
    wino = gemm_local.conv_cost(node, dict(tile, algo="winograd", m=4), 1, rt)
    implicit = gemm_local.conv_cost(node, dict(tile, algo="implicit"), 1, rt)
    assert wino < implicit / 2, (wino, implicit)


def test_event_timing_discards_the_warm_up_and_waits_once():
    """The events clock enqueues one warm-up run and ``reps`` runs back to back, waits once, and
    reports the fastest timed run: a first run on an idle GPU (here the fastest, so a timing that
    kept it would show) is discarded, and there is no host round trip between the timed runs."""
    durations = iter([1000, 9000, 7000, 8000, 6000, 9500, 7500, 9500])     # ns, one per launch
    finishes = []

    class Event:
        def __init__(self, ns):
            self.profile = types.SimpleNamespace(start=0, end=ns)

    cl = types.SimpleNamespace(enqueue_nd_range_kernel=lambda q, k, g, l: Event(next(durations)))
    bench = object.__new__(tmod.ConvBench)
    bench.rt = types.SimpleNamespace(cl=cl, device=types.SimpleNamespace(max_compute_units=1))
    bench.queue = types.SimpleNamespace(finish=lambda: finishes.append(1))
    bench.through = None                # a conv that writes through no layer
    bench.input_channels_last = False   # nor transposes an input the network stores channels-last
    launch = types.SimpleNamespace(kernel=None, gsize=(1,), lsize=None)
    # two launches a run: warm-up 1000 + 9000, then runs of 15000, 15500, 17000 ns
    assert bench.time([launch, launch], reps=3) == pytest.approx(0.015)
    assert len(finishes) == 1


SPIN = """__kernel void spin(__global float* out, const int n) {
    float x = (float)get_global_id(0);
    for (int i = 0; i < n; ++i) x = x * 0.999999f + 1.0f;
    out[get_global_id(0)] = x;
}"""


def test_cpu_clock_sees_a_core_left_idle(rt, monkeypatch):
    """The ``cpu`` clock charges a launch the on-CPU time of the busiest thread: one work-item
    (one core busy, the others idle) costs about that thread's time, not the process's CPU time
    divided by the compute units as the process's CPU time alone said; work spread over several
    threads costs its busiest thread's share, not the process's total. Needs Linux's per-thread
    schedstat, as the clock does.

    Both cases read the threads' own counters around each timed run rather than comparing with a
    wall time: how the work splits depends on whether the cores are free, and under pytest-xdist
    the other worker holds one (a CI run saw one thread do 86% of it; another saw the lone
    work-item's thread on a CPU for 4.0 of its 6.9 ms of wall)."""
    from yolo_cl import measure
    units = int(rt.device.max_compute_units)
    if units < 2 or not measure.thread_cpu_ns():
        pytest.fail("this test needs a CPU device of at least 2 compute units on Linux")
    cl = rt.cl
    prg = cl.Program(rt.context, SPIN).build()
    out = rt.alloc(4 * 64 * units, "spin out")
    one, spread = cl.Kernel(prg, "spin"), cl.Kernel(prg, "spin")
    n = 1 << 22
    one.set_args(out, np.int32(n))
    spread.set_args(out, np.int32(n // (16 * units)))          # the same work over 16 items a core
    launch = types.SimpleNamespace
    lone = [launch(kernel=one, gsize=(1,), lsize=(1,))]
    wide = [launch(kernel=spread, gsize=(16 * units,), lsize=(1,))]
    q = cl.CommandQueue(rt.context, rt.device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    counters = measure.thread_cpu_ns

    def charged_and_runs(launches):
        """The clock's charge and each timed run's {thread: ns on a CPU}."""
        snapshots = []
        monkeypatch.setattr(measure, "thread_cpu_ns", lambda: snapshots.append(counters()) or snapshots[-1])
        charged = measure.time_launches(rt, q, launches, 3, "cpu")
        runs = [{t: after[t] - before.get(t, 0) for t in after}
                for before, after in zip(snapshots[::2], snapshots[1::2])]
        assert len(runs) == 3
        return charged, runs

    measure.time_launches(rt, q, lone, 1, "cpu")       # warm-up: the first launch costs the host 1.5 ms
    charged, runs = charged_and_runs(lone)
    busiest = [max(r.values()) for r in runs]          # nanoseconds
    total = [sum(r.values()) for r in runs]
    assert all(b > 0.8 * t for b, t in zip(busiest, total)), "the lone work-item was not one thread's"
    assert charged >= 0.98e-6 * min(busiest)            # the busy thread's time ...
    assert charged > 1.5e-6 * min(total) / units        # ... not the process's share per unit

    for _ in range(5):      # a loaded machine may run every work-item on one thread: then again
        charged, runs = charged_and_runs(wide)
        busiest = [max(r.values()) for r in runs]
        total = [sum(r.values()) for r in runs]
        if any(sum(v > 0.05 * t for v in r.values()) >= 2 for r, t in zip(runs, total)):
            break
    else:
        pytest.fail("the spread launch ran on one thread in five tries")
    per_run = [max(b, t / units) * 1e-6 for b, t in zip(busiest, total)]
    assert 0.98e-6 * min(busiest) <= charged <= 1.02 * min(per_run)     # not the threads' total


def test_fp16_gate(rt, tmp_path):
    """Half storage: no F(4x4) candidates, and real kernels land between the fp32 and fp16 gates."""
    nodes = convs(tmp_path, 12, 12)
    tuner = tmod.Tuner(rt, FP16, reps=1)
    assert all(not (c["algo"] == "winograd" and c.get("m") == 4) for c in tuner.candidates(nodes[0]))
    assert any(c["algo"] == "winograd" for c in tuner.candidates(nodes[0]))
    pointwise = dict(CFG_B, algo="gemm1x1")
    for node, cfg in ((nodes[2], CFG_D), (nodes[3], pointwise)):       # 3x3/2 mish; 1x1 + fused residual
        assert node.attrs["residual"] is not None or node.attrs["stride_x"] == 2
        bench = tmod.ConvBench(rt, node, 2, FP16, tuner.queue)
        err = bench.check(bench.bind(cfg))
        assert 1e-5 < err < FP16.tolerance


# -- the commands -----------------------------------------------------------------------------
def test_tune_and_bench_commands(tmp_path, capsys, monkeypatch):
    """`yolo-cl tune` writes checked configs to --db with a progress bar on stderr, `yolo-cl bench`
    then reports them per layer next to OpenCV DNN (random weights, same network)."""
    from yolo_cl.cli import main
    monkeypatch.setenv("YOLO_CL_CACHE", str(tmp_path / "cache"))
    # A small space keeps this quick: the search itself is tested above.
    monkeypatch.setattr(gemm_cpu, "_NV_BLOCKS", [(4, 8, 1), (2, 8, 2)])
    monkeypatch.setattr(gemm_cpu, "_MV_BLOCKS", [(4, 8, 1), (3, 4, 2)])
    monkeypatch.setattr(gemm_cpu, "KUS", (1,))
    cfg = tmp_path / "net.cfg"
    cfg.write_text(net_cfg(16, 16))
    db = tmp_path / "cache" / "tuning.yaml"
    assert main(["tune", str(cfg), "--db", str(db), "--budget", "600"]) == 0
    out, err = capsys.readouterr()
    assert "4 of 4 conv shapes need tuning" in out and "saved 4 configs" in out
    assert "timings" in err and "%" in err
    configs = dbm.read_db(db)[0]["configs"]
    assert len(configs) == 4 and all(c["ms"] > 0 for c in configs.values())
    assert main(["tune", str(cfg), "--db", str(db)]) == 0            # already tuned: nothing to do
    assert "0 of 4 conv shapes need tuning" in capsys.readouterr().out
    assert main(["bench", str(cfg), "--repeat", "2", "--compare", "opencv", "--peak", "100"]) == 0
    out = capsys.readouterr().out
    assert "conv configs: 4 device+driver" in out          # the user cache (YOLO_CL_CACHE) was read
    assert "OpenCV DNN" in out and "yolo-cl / OpenCV latency" in out and "host overhead" in out
    assert "default queue" in out and "resident (the plan alone" in out
    assert out.count("conv ") >= 4 and "peak 100.0 GFLOP/s (given)" in out
    table = out[out.index("per node against OpenCV"):].splitlines()
    rows = [l.split() for l in table[2:] if l.split() and l.split()[0][0].isdigit()]
    assert len(rows) >= 4 and all(float(r[-2]) > 0 for r in rows), table   # OpenCV's ms per node
    assert "total" in table[-1]


def test_bench_times_the_wall_on_the_default_path_and_the_device_on_a_profiled_one(tmp_path, monkeypatch):
    """The wall (and the resident figure) come from an executor on a queue without profiling, the
    device times from a second, profiled one of the same plan: a profiling queue and its
    per-launch events would add their own cost to the wall (issue 14)."""
    from yolo_cl import bench, runtime
    monkeypatch.setenv("YOLO_CL_CACHE", str(tmp_path / "cache"))
    made, real = [], runtime.Runtime.__init__

    def spy(self, device=None, profiling=False, **kw):
        made.append(profiling)
        real(self, device, profiling, **kw)
    monkeypatch.setattr(runtime.Runtime, "__init__", spy)
    cfg = tmp_path / "net.cfg"
    cfg.write_text(net_cfg(16, 16))
    rep = bench.run_bench(str(cfg), repeat=3, peak=100.0)
    assert made[0] is False and made.count(True) == 1           # the wall's runtime first, then the profiled one
    assert len(rep.wall_ms) == len(rep.resident_ms) == len(rep.device_ms) == 3
    assert all(t > 0 for t in rep.resident_ms + rep.device_ms) and len(rep.launches) >= 4


def test_bench_report_says_the_peak_is_the_fma_units_where_tensor_cores_ran():
    """A plan with tensor-core GEMMs reports %peak against the FMA peak, which those exceed: the
    report says so, and only then."""
    from yolo_cl.bench import BenchReport, LaunchStat

    def report(name: str, family: str) -> str:
        launch = LaunchStat("0", "conv 3x3/1 leaky", name, 0.01, 10 ** 9, {"family": family, "algo": "nhwc"})
        return BenchReport("net", (416, 416), 1, "fp16", "GPU", "P", "1", "GPU", 100.0, "given", "random",
                           [launch], [0.02], [0.01]).render()
    tensor, fma = report("gemm_wgmma", "wgmma"), report("gemm_local", "local")
    assert "100000.0" in tensor and "gemm_wgmma run on the tensor cores" in tensor
    assert "tensor cores" not in fma


def test_no_shipped_tuning_switch(monkeypatch):
    """YOLO_CL_NO_SHIPPED_TUNING=1 hides the shipped files (the heuristic-alone measurement)."""
    monkeypatch.delenv("YOLO_CL_NO_SHIPPED_TUNING", raising=False)
    assert any(p.name == "pocl-cpu.yaml" for p in dbm.shipped_db_paths())
    monkeypatch.setenv("YOLO_CL_NO_SHIPPED_TUNING", "1")
    assert dbm.shipped_db_paths() == []


# -- convs that write through a pool or upsample ------------------------------------------------
def _through_node(op: str, c: int, h: int, w: int, **attrs):
    """A bare max-pool/upsample node over a c x h x w input (shape and attrs only)."""
    from yolo_cl.graph import Node, Tensor, View
    if op == "upsample":
        oh, ow = h * attrs["stride"], w * attrs["stride"]
    else:
        oh = (h + attrs["padding"] - attrs["size"]) // attrs["stride_y"] + 1
        ow = (w + attrs["padding"] - attrs["size"]) // attrs["stride_x"] + 1
    return Node(op, [1], [View(Tensor(0, c, h, w, "x"), 0, c)], View(Tensor(1, c, oh, ow, "y"), 0, c), attrs)


@pytest.mark.parametrize("size,stride,padding", [(2, 2, 1), (2, 1, 1), (3, 1, 2), (3, 2, 1), (5, 1, 4), (3, 2, 3)])
def test_the_written_pools_reference_is_darknets(size, stride, padding):
    from np_darknet import Options, maxpool
    x = np.random.default_rng(size * 10 + stride).standard_normal((2, 3, 9, 7)).astype(np.float32)
    node = _through_node("maxpool", 3, 9, 7, size=size, stride_x=stride, stride_y=stride, padding=padding)
    opts = Options(types.SimpleNamespace(options={"size": [str(size)], "stride": [str(stride)],
                                                  "padding": [str(padding)]}))
    assert np.array_equal(tmod.reference_through(x, node), maxpool(opts, x).astype(np.float32))
    up = _through_node("upsample", 3, 9, 7, stride=2, scale=1.0)
    assert np.array_equal(tmod.reference_through(x, up), x.repeat(2, 2).repeat(2, 3))


POOLED = net_header(16, 16) + conv(16) + "\n[maxpool]\nsize=2\nstride=2\n"
FUSED_CFG = {"family": "cpu", "algo": "winograd", "m": 4, "kernel": "fused", "KB": 8, "KS": 1}
IMPLICIT_CFG = {"family": "cpu", "algo": "implicit", "kernel": "nv", "TM": 4, "VW": 8, "NV": 2, "KU": 1, "WG": 0}


def test_a_conv_that_writes_its_pool_is_checked_on_the_pool_and_others_pay_its_launch(rt, tmp_path, monkeypatch):
    """The tuner benches a conv as the network runs it: the fused Winograd stores the 2x2 pool
    after it (checked on the pooled values), the implicit GEMM cannot and is charged the pool's
    own launch, which the network would run after it."""
    node = conv_nodes(tmp_path / "pooled.cfg", POOLED)[0]
    assert node.attrs["write_through"].op == "maxpool"
    bench = tmod.ConvBench(rt, node, 1, FP32, rt.queue, seed=3)
    fused, implicit = bench.bind(FUSED_CFG), bench.bind(IMPLICIT_CFG)
    assert tmod.writes_through(fused) and not tmod.writes_through(implicit)
    assert bench.check(fused) < 1e-5 and bench.check(implicit) < 1e-5
    bench.ref_through = bench.ref_through + 1.0          # the pooled values are what a writer is checked on
    assert bench.check(fused) > 0.1 and bench.check(implicit) < 1e-5
    monkeypatch.setattr(tmod.measure, "time_launches", lambda rt, q, launches, reps, clock: float(len(launches)))
    assert bench.time(fused, 1) == len(fused)
    assert bench.time(implicit, 1) == len(implicit) + 1     # + the max-pool's one launch


def test_a_written_layer_that_cannot_be_timed_is_not_charged(rt, tmp_path, monkeypatch, caplog):
    node = conv_nodes(tmp_path / "pooled.cfg", POOLED)[0]
    bench = tmod.ConvBench(rt, node, 1, FP32, rt.queue, seed=3)
    implicit = bench.bind(IMPLICIT_CFG)

    def refuse(ctx, n):
        raise tmod.YoloClError("no kernel for it here")
    monkeypatch.setattr(tmod, "bind_node", refuse)
    monkeypatch.setattr(tmod.measure, "time_launches", lambda rt, q, launches, reps, clock: float(len(launches)))
    with caplog.at_level(logging.WARNING, logger="yolo_cl.tuner"):
        assert bench.time(implicit, 1) == len(implicit)
    assert "cannot time the maxpool it writes through (no kernel for it here)" in caplog.text
