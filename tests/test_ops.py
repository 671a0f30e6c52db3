"""yolo_cl.ops against NumPy/SciPy references: conv2d (tiled correlation kernel and im2col + GEMM),
row-band tiling, device arrays, and the causal depthwise 1-D convolution with its backward."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.signal

import yolo_cl
from yolo_cl import ops


@pytest.fixture(scope="module", autouse=True)
def private_tuning_db(tmp_path_factory):
    """The ops save tuned configs in the user tuning database: keep this module's in a fresh one,
    so a config remembered by an earlier run cannot stand in for a search a test expects."""
    mp = pytest.MonkeyPatch()
    mp.setenv("YOLO_CL_CACHE", str(tmp_path_factory.mktemp("ops-cache")))
    yield
    mp.undo()

RNG = np.random.default_rng(20240607)


def rand(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def np_conv2d(x, w, bias=None, stride=(1, 1), pad=(0, 0), dilation=(1, 1), groups=1) -> np.ndarray:
    """Cross-correlation by shifted slices, in float64: the definition, not a copy of the kernels."""
    n, c, h, wd = x.shape
    f, cg, kh, kw = w.shape
    (sy, sx), (py, px), (dy, dx) = (pair(v) for v in (stride, pad, dilation))
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (py, py), (px, px)))
    oh = (h + 2 * py - dy * (kh - 1) - 1) // sy + 1
    ow = (wd + 2 * px - dx * (kw - 1) - 1) // sx + 1
    out = np.zeros((n, f, oh, ow))
    m = f // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        for ky in range(kh):
            for kx in range(kw):
                patch = xs[:, :, ky * dy:ky * dy + (oh - 1) * sy + 1:sy, kx * dx:kx * dx + (ow - 1) * sx + 1:sx]
                out[:, g * m:(g + 1) * m] += np.einsum("ncij,fc->nfij", patch, w[g * m:(g + 1) * m, :, ky, kx])
    if bias is not None:
        out += np.asarray(bias, np.float64)[None, :, None, None]
    return out


def close(y, ref, taps: int) -> None:
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=2e-5 * taps ** 0.5 + 1e-5)


# -- 2-D correlation kernel ----------------------------------------------------------------------

def test_reference_matches_scipy():
    x, w = rand(1, 1, 19, 23), rand(1, 1, 4, 7)
    ref = scipy.signal.correlate2d(x[0, 0].astype(np.float64), w[0, 0].astype(np.float64), "valid")
    np.testing.assert_allclose(np_conv2d(x, w)[0, 0], ref, rtol=1e-12, atol=1e-12)


SIZES = [(k, k) for k in range(1, 17)] + [(14, 15), (15, 14), (1, 9), (9, 1), (3, 16), (16, 5), (2, 7)]


@pytest.mark.parametrize("kh,kw", SIZES)
def test_corr2d_every_kernel_size(kh, kw):
    x, w = rand(2, 1, 37, 53), rand(1, 1, kh, kw)
    y = ops.conv2d(x, w)
    assert y.shape == (2, 1, 38 - kh, 54 - kw) and y.dtype == np.float32
    for i in range(2):
        ref = scipy.signal.correlate2d(x[i, 0].astype(np.float64), w[0, 0].astype(np.float64), "valid")
        close(y[i, 0], ref, kh * kw)


def test_corr2d_flat_images_and_padding():
    x, w = rand(41, 29), rand(6, 5)
    y = ops.conv2d(x, w, pad=(3, 2))
    ref = scipy.signal.correlate2d(x.astype(np.float64), w.astype(np.float64), "full")[2:-2, 2:-2]   # full = pad (5, 4)
    assert y.shape == (42, 29)
    close(y, ref, 30)


def test_corr2d_not_flipped():
    x = np.zeros((9, 9), np.float32)
    x[4, 4] = 1.0
    w = np.arange(9, dtype=np.float32).reshape(3, 3)
    y = ops.conv2d(x, w, pad=1)
    np.testing.assert_array_equal(y[3:6, 3:6], w[::-1, ::-1])   # correlation mirrors an impulse


def test_corr2d_depthwise_multiplier_bias_batch():
    x, w, b = rand(3, 4, 23, 31), rand(8, 1, 5, 6), rand(8)
    y = ops.conv2d(x, w, b, pad=(2, 1), groups=4)
    close(y, np_conv2d(x, w, b, pad=(2, 1), groups=4), 30)


def test_corr2d_many_filters_on_one_channel():
    x, w = rand(2, 1, 30, 17), rand(5, 1, 3, 4)
    close(ops.conv2d(x, w), np_conv2d(x, w), 12)


# The GPU variant (scalar register blocks, float4 local reads, taps compiled in or not), run on
# PoCL, and a 4-wide CPU variant with multi-item work-groups.
RUNTIME_TAPS = [dict(VEC=0, RX=4, RY=2, LX=8, LY=4), dict(VEC=4, NV=2, RY=3, LX=2, LY=2)]
STATIC_TAPS = [dict(VEC=0, RX=4, RY=4, LX=8, LY=4, STATIC=True), dict(VEC=0, RX=1, RY=3, LX=8, LY=2, STATIC=True),
               dict(VEC=0, RX=4, RY=3, LX=8, LY=4, STATIC=True, ROLL_R=True)]


@pytest.mark.parametrize("kh,kw,configs", [(1, 1, RUNTIME_TAPS), (16, 16, RUNTIME_TAPS), (3, 3, RUNTIME_TAPS),
                                           (14, 15, RUNTIME_TAPS + STATIC_TAPS)])
def test_corr2d_kernel_variants(kh, kw, configs):
    x, w = rand(2, 1, 45, 77), rand(1, 1, kh, kw)
    ref = np_conv2d(x, w, pad=(1, 2))
    for cfg in configs:
        close(ops.conv2d(x, w, pad=(1, 2), config=cfg), ref, kh * kw)


def test_corr2d_gpu_variant_every_size():
    cfg = RUNTIME_TAPS[0]                     # taps at run time: one build for every size
    for kh, kw in SIZES:
        x, w = rand(1, 1, 29, 40), rand(1, 1, kh, kw)
        close(ops.conv2d(x, w, config=cfg), np_conv2d(x, w), kh * kw)


def test_corr2d_every_candidate_config():
    x, w = rand(1, 2, 61, 70), rand(2, 1, 7, 9)
    ref = np_conv2d(x, w, pad=3, groups=2)
    for cfg in ops.corr2d_candidates(None, 7, 9):
        close(ops.conv2d(x, w, pad=3, groups=2, config=cfg), ref, 63)


def test_corr2d_gpu_candidates_on_this_device():
    """What the tuner may pick on a GPU, run here (a small kernel keeps PoCL's builds short)."""
    x, w = rand(2, 1, 70, 150), rand(1, 1, 3, 4)
    ref = np_conv2d(x, w, pad=(1, 0))
    cands = ops.corr2d_candidates(None, 3, 4, gpu=True)
    assert len(cands) >= 4 and all(c["VEC"] == 0 and c["STATIC"] for c in cands)
    for cfg in cands:
        close(ops.conv2d(x, w, pad=(1, 0), config=cfg), ref, 12)


# -- general conv2d (im2col + GEMM) --------------------------------------------------------------

@pytest.mark.parametrize("stride,pad,dilation,groups,cin,f,k", [
    (2, 1, 1, 1, 3, 5, (3, 3)),
    (1, 0, 2, 1, 2, 4, (3, 3)),
    (1, 1, 1, 2, 4, 6, (3, 5)),
    ((2, 1), (1, 2), (1, 2), 2, 4, 6, (3, 2)),
    (3, 2, 1, 1, 1, 1, (5, 5)),
    (2, 0, 1, 3, 3, 3, (2, 2)),
    (1, 0, 1, 1, 8, 16, (1, 1)),
])
def test_conv2d_general(stride, pad, dilation, groups, cin, f, k):
    x, w, b = rand(2, cin, 19, 23), rand(f, cin // groups, *k), rand(f)
    y = ops.conv2d(x, w, b, stride=stride, pad=pad, dilation=dilation, groups=groups)
    ref = np_conv2d(x, w, b, stride, pad, dilation, groups)
    close(y, ref, w[0].size)


# -- tiling --------------------------------------------------------------------------------------

@pytest.mark.parametrize("host_memory", [True, False])
def test_forced_row_tiling_is_exact_direct(host_memory, monkeypatch):
    """Bands with halos, through buffers wrapping the NumPy arrays (CPU devices) or copies (GPUs)."""
    monkeypatch.setattr(ops._context(), "host_memory", host_memory)
    x, w, b = rand(3, 2, 97, 131), rand(2, 1, 14, 15), rand(2)
    whole = ops.conv2d(x, w, b, pad=(7, 3), groups=2)
    tiled = ops.conv2d(x, w, b, pad=(7, 3), groups=2, max_tile_bytes=48 * 1024)   # bands of a few rows
    np.testing.assert_array_equal(tiled, whole)
    close(whole, np_conv2d(x, w, b, pad=(7, 3), groups=2), 210)


def test_forced_tiling_is_exact_gemm():
    x, w = rand(2, 3, 40, 33), rand(4, 3, 3, 4)
    whole = ops.conv2d(x, w, stride=2, pad=(1, 2), dilation=(2, 1))
    tiled = ops.conv2d(x, w, stride=2, pad=(1, 2), dilation=(2, 1), max_tile_bytes=8 * 1024)
    np.testing.assert_array_equal(tiled, whole)
    close(whole, np_conv2d(x, w, None, (2, 2), (1, 2), (2, 1)), 36)


def test_bands_cover_the_image():
    p = ops._Conv(5, 1, 1000, 300, 1, 9, 9, 1, 1, 4, 4, 1, 1, 1, True)
    nb, rows = ops._bands(p, 200_000, host_io=True)
    assert nb == 1 and 1 <= rows < p.oh
    assert ops._band_bytes(p, 1, rows, True) <= 200_000 < ops._band_bytes(p, 1, rows + 1, True)
    with pytest.raises(yolo_cl.LimitError):
        ops._bands(p, 1024, host_io=True)


# -- device arrays -------------------------------------------------------------------------------

def test_device_arrays_stay_on_device():
    import pyopencl.array as cla
    q = ops.runtime().queue
    x, w = rand(2, 2, 33, 28), rand(2, 1, 5, 3)
    y = ops.conv2d(cla.to_device(q, x), w, pad=1, groups=2)
    assert isinstance(y, cla.Array) and y.shape == (2, 2, 31, 28)
    np.testing.assert_array_equal(y.get(), ops.conv2d(x, w, pad=1, groups=2))
    x2, w2 = rand(1, 2, 20, 20), rand(3, 2, 3, 3)
    tiled = ops.conv2d(cla.to_device(q, x2), w2, stride=2, max_tile_bytes=2048)   # GEMM workspace in bands
    np.testing.assert_array_equal(tiled.get(), ops.conv2d(x2, w2, stride=2))


def test_device_outputs_come_from_the_pool_and_free_memory_returns_it():
    """A repeated call reuses the freed output buffer instead of allocating (on a GPU, allocating
    hundreds of MB per call cost more than the kernel); free_memory hands held blocks back."""
    import pyopencl.array as cla
    import pyopencl.tools as cl_tools
    rt = ops.runtime()
    pool = ops._context(rt).pool
    xd, w = cla.to_device(rt.queue, rand(1, 1, 40, 50)), rand(1, 1, 3, 3)
    first = ops.conv2d(xd, w)
    assert isinstance(first.base_data, cl_tools.PooledBuffer)
    ref = first.get()
    del first
    assert pool.held_blocks >= 1
    again = ops.conv2d(xd, w)
    np.testing.assert_array_equal(again.get(), ref)
    del again
    ops.free_memory()
    assert pool.held_blocks == 0


def test_tuned_config_is_saved_and_read_back_without_a_search(monkeypatch):
    from yolo_cl.precision import FP32
    from yolo_cl.tuning_db import TuningDatabase
    rt = ops.runtime()
    ctx = ops._context(rt)
    x, w = rand(1, 1, 60, 90), rand(1, 1, 5, 6)
    ref = ops.conv2d(x, w, tune=True)
    key = next(k for k in ctx.configs if k[:3] == ("corr2d", 5, 6))
    saved = TuningDatabase(rt, FP32).lookup_key(ops._db_key(key))
    assert saved == ctx.configs[key]                 # in the user database, under this device
    ctx.configs.clear()                              # as a new process would start
    ctx.not_in_db.clear()
    monkeypatch.setattr(ops, "_search", lambda *a, **k: pytest.fail("searched again"))
    np.testing.assert_array_equal(ops.conv2d(x, w, tune=True), ref)
    assert ctx.configs[key] == saved


def test_arrays_from_a_foreign_context():
    import pyopencl as cl
    import pyopencl.array as cla
    ctx = cl.Context([ops.runtime().device])
    q = cl.CommandQueue(ctx)
    x, w = rand(1, 1, 25, 26), rand(1, 1, 4, 4)
    y = ops.conv2d(cla.to_device(q, x), w)
    assert y.queue is q
    close(y.get(), np_conv2d(x, w), 16)


# -- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("x,w,kw", [
    ((1, 3, 10, 10), (2, 2, 3, 3), {}),
    ((1, 4, 10, 10), (3, 2, 3, 3), {"groups": 2}),
    ((1, 1, 4, 4), (1, 1, 5, 3), {}),
    ((1, 1, 8, 8), (1, 1, 3, 3), {"stride": 0}),
    ((1, 1, 8, 8), (1, 1, 3, 3), {"pad": (1, 2, 3)}),
    ((8, 8, 8), (1, 1, 3, 3), {}),
])
def test_bad_arguments(x, w, kw):
    with pytest.raises(ops.OpError) as e:
        ops.conv2d(np.zeros(x, np.float32), np.zeros(w, np.float32), **kw)
    assert isinstance(e.value, ValueError) and isinstance(e.value, yolo_cl.YoloClError)
    assert "\n" not in str(e.value)


def test_bias_size_checked():
    with pytest.raises(ops.OpError):
        ops.conv2d(rand(1, 1, 8, 8), rand(2, 1, 3, 3), bias=rand(3))


# -- tuning --------------------------------------------------------------------------------------

def test_tuning_search_remembers_the_winner(monkeypatch):
    ctx = ops._context()
    cands = ops.corr2d_candidates(ctx, 5, 5)[:2]
    monkeypatch.setattr(ops, "corr2d_candidates", lambda *a, **k: [dict(c) for c in cands])
    monkeypatch.setattr(ctx, "configs", {})
    x, w = rand(1, 1, 64, 64), rand(1, 1, 5, 5)
    y = ops.conv2d(x, w, tune=True)
    close(y, np_conv2d(x, w), 25)
    (key, cfg), = ctx.configs.items()
    assert key[:3] == ("corr2d", 5, 5) and cfg in cands
    ops.conv2d(x, w, tune=True)
    assert len(ctx.configs) == 1


def test_set_tuning_validates():
    with pytest.raises(ops.OpError):
        ops.set_tuning("sometimes")


# -- causal depthwise 1-D convolution ------------------------------------------------------------

def np_causal(w, k, eps=0.0) -> np.ndarray:
    """out[b][c][t] = eps + sum_{u<=t} w[c][T-1-(t-u)] * k[b][c][u], in float64."""
    b, c, t = k.shape
    out = np.full((b, c, t), eps, np.float64)
    for tt in range(t):
        out[:, :, tt] += np.einsum("cu,bcu->bc", w[:, t - 1 - tt:].astype(np.float64), k[:, :, :tt + 1])
    return out


def np_causal_backward(w, k, g):
    """grad_k[b][c][u] = sum_{t>=u} g[b][c][t] w[c][T-1-(t-u)];
    grad_w[c][T-1-s] = sum_b sum_{t>=s} g[b][c][t] k[b][c][t-s]."""
    w, k, g = (a.astype(np.float64) for a in (w, k, g))
    b, c, t = k.shape
    gk, gw = np.zeros((b, c, t)), np.zeros((c, t))
    for u in range(t):
        ts = np.arange(u, t)
        gk[:, :, u] = np.einsum("bct,ct->bc", g[:, :, u:], w[:, t - 1 - (ts - u)])
    for s in range(t):
        gw[:, t - 1 - s] = np.einsum("bct,bct->c", g[:, :, s:], k[:, :, :t - s])
    return gw, gk


CAUSAL_SHAPES = [(3, 5, 37), (1, 1, 1), (9, 3, 100), (2, 4, 64), (17, 2, 8)]


@pytest.mark.parametrize("shape", CAUSAL_SHAPES)
def test_causal_forward_and_backward(shape):
    b, c, t = shape
    w, k, g = rand(c, t), rand(b, c, t), rand(b, c, t)
    y = ops.causal_depthwise_conv1d(w, k, eps=0.25)
    gw, gk = ops.causal_depthwise_conv1d_backward(w, k, g)
    assert y.shape == (b, c, t) and gw.shape == (c, t) and gk.shape == (b, c, t)
    close(y, np_causal(w, k, 0.25), t)
    gw_ref, gk_ref = np_causal_backward(w, k, g)
    close(gk, gk_ref, t)
    close(gw, gw_ref, t * b)


def causal_configs():
    """Every tuning candidate on one shape; the GPU variant (scalar blocks, a float4 window rotating
    through registers) and a 4-wide CPU variant on shapes of their own (PoCL builds the GPU variant
    once per work-group size, which follows T)."""
    gpu = {cfg["R"] for cfg in ops.causal1d_candidates(None, 2, gpu=True)}
    assert gpu == {4, 8}                  # the two shapes of the rotating window tested here
    return [(cfg, (3, 5, 37)) for cfg in ops.causal1d_candidates(None, 2)] + [
        (dict(VEC=0, R=4, RB=4, S=2), (3, 5, 37)), (dict(VEC=0, R=8, RB=3, S=1), (9, 3, 100)),
        (dict(VEC=4, R=3, S=3), (9, 3, 100))]


@pytest.mark.parametrize("cfg,shape", causal_configs())
def test_causal_every_config(cfg, shape):
    b, c, t = shape
    w, k, g = rand(c, t), rand(b, c, t), rand(b, c, t)
    close(ops.causal_depthwise_conv1d(w, k, eps=-1.0, config=cfg), np_causal(w, k, -1.0), t)
    gw, gk = ops.causal_depthwise_conv1d_backward(w, k, g, config=cfg)
    gw_ref, gk_ref = np_causal_backward(w, k, g)
    close(gk, gk_ref, t)
    close(gw, gw_ref, t * b)


def test_causal_gradient_reference_is_the_gradient():
    """The NumPy gradient formulas against central differences of the NumPy forward."""
    b, c, t = 2, 2, 6
    w, k, g = (RNG.standard_normal(s) for s in ((c, t), (b, c, t), (b, c, t)))
    gw, gk = np_causal_backward(w, k, g)
    h = 1e-6
    for arr, grad in ((w, gw), (k, gk)):
        for idx in np.ndindex(arr.shape):
            old = arr[idx]
            arr[idx] = old + h
            up = (np_causal(w, k) * g).sum()
            arr[idx] = old - h
            down = (np_causal(w, k) * g).sum()
            arr[idx] = old
            assert abs((up - down) / (2 * h) - grad[idx]) < 1e-6


def test_causal_backward_finite_differences():
    """Gradients from the device against central differences of the device forward (the op is
    linear in w and in k, so a large step loses nothing but float32 rounding)."""
    b, c, t = 2, 3, 7
    w, k, g = rand(c, t), rand(b, c, t), rand(b, c, t)
    gw, gk = ops.causal_depthwise_conv1d_backward(w, k, g)
    h = 0.5

    def loss(w_, k_):
        return float((ops.causal_depthwise_conv1d(w_, k_, eps=0.1).astype(np.float64) * g).sum())

    for arr, grad, is_w in ((w, gw, True), (k, gk, False)):
        for idx in np.ndindex(arr.shape):
            up, down = arr.copy(), arr.copy()
            up[idx] += h
            down[idx] -= h
            fd = (loss(up, k) - loss(down, k)) / (2 * h) if is_w else (loss(w, up) - loss(w, down)) / (2 * h)
            assert abs(fd - grad[idx]) < 1e-4 * (1 + abs(grad[idx])), (is_w, idx)


def test_causal_device_arrays_and_row_chunks():
    import pyopencl.array as cla
    q = ops.runtime().queue
    b, c, t = 11, 3, 29
    w, k, g = rand(c, t), rand(b, c, t), rand(b, c, t)
    y = ops.causal_depthwise_conv1d(w, cla.to_device(q, k), eps=1.5)
    assert isinstance(y, cla.Array)
    close(y.get(), np_causal(w, k, 1.5), t)
    gw, gk = ops.causal_depthwise_conv1d_backward(w, cla.to_device(q, k), cla.to_device(q, g))
    gw_ref, gk_ref = np_causal_backward(w, k, g)
    close(gw.get(), gw_ref, t * b)
    close(gk.get(), gk_ref, t)
    small = 4 * c * t * 12            # a few rows per chunk
    np.testing.assert_array_equal(ops.causal_depthwise_conv1d(w, k, max_tile_bytes=small),
                                  ops.causal_depthwise_conv1d(w, k))
    gw2, gk2 = ops.causal_depthwise_conv1d_backward(w, k, g, max_tile_bytes=small)
    close(gw2, gw_ref, t * b)
    np.testing.assert_array_equal(gk2, gk.get())


def test_causal_rows_beyond_local_memory(monkeypatch):
    """Rows too long for local memory fall back to the global-memory kernel."""
    ctx = ops._context()
    monkeypatch.setattr(ctx, "local_mem", 512)
    b, c, t = 3, 2, 37
    w, k, g = rand(c, t), rand(b, c, t), rand(b, c, t)
    close(ops.causal_depthwise_conv1d(w, k), np_causal(w, k), t)
    gw, gk = ops.causal_depthwise_conv1d_backward(w, k, g)
    gw_ref, gk_ref = np_causal_backward(w, k, g)
    close(gw, gw_ref, t * b)
    close(gk, gk_ref, t)


def test_causal_bad_shapes():
    with pytest.raises(ops.OpError):
        ops.causal_depthwise_conv1d(rand(3, 5), rand(2, 3, 6))
    with pytest.raises(ops.OpError):
        ops.causal_depthwise_conv1d_backward(rand(3, 5), rand(2, 3, 5), rand(2, 3, 4))
