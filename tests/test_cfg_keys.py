"""Keys are heard: unused and repeated cfg keys, comment encodings, fork-dependent keys.

Darknet prints ``Unused field: 'key = value'`` for every key of a layer section that its parser
did not read (option_unused, src/option_list.c) and takes the first of two equal keys
(option_find walks the list from the front). These tests hold yolo-cl to one warning line per
such key, naming file, line and key, and to silence for every key some Darknet reads.
"""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from yolo_cl.cfg import parse_cfg, unheard
from yolo_cl.errors import CfgError
from yolo_cl.layers import build_layers, parse_net

ROOT = Path(__file__).resolve().parents[1]
SHARED_CFGS = sorted((ROOT.parent / "shared" / "cfg").glob("*.cfg")) if (ROOT.parent / "shared" / "cfg").is_dir() else []
BUNDLED = sorted((ROOT / "models").rglob("*.cfg"))

NET = "[net]\nwidth=16\nheight=16\nchannels=3\n"


def warnings_of(path: Path) -> list:
    sections = parse_cfg(path)
    build_layers(sections, parse_net(sections[0]))
    return unheard(sections)


def write(tmp_path: Path, text, name: str = "t.cfg") -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


@pytest.mark.parametrize("cfg", BUNDLED + SHARED_CFGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_cfgs_are_silent(cfg):
    """Every bundled and zoo cfg is full of training keys (jitter, ignore_thresh, burn_in...): Darknet
    reads them all, so yolo-cl calls none of them unused; yolov3-openimages' and efficientnet-lite3's
    repeated training keys in [net] (batch, subdivisions, momentum, decay) are not reported either."""
    assert warnings_of(cfg) == []


def test_repeated_net_keys(tmp_path):
    """A repeated [net] key that inference reads is reported; one only training reads is not."""
    p = write(tmp_path, "[net]\nbatch=1\nbatch=64\nwidth=16\nheight=16\nwidth=32\n\n[maxpool]\nsize=1\n")
    sections = parse_cfg(p)
    assert parse_net(sections[0]).width == 16
    build_layers(sections, parse_net(sections[0]))
    assert unheard(sections) == [f"{p}:6: warning: [net]: 'width' is repeated (first on line 4); Darknet uses the "
                                 "first value, so '32' is ignored"]


def test_one_line_per_unused_key(tmp_path):
    text = (NET + "batch=64\nmomentum=0.9\nwidht=5\n\n"
            "[maxpool]\nsize=2\nstride=2\nactivation=tanh\n\n"
            "[convolutional]\nfilter=8\nsize=3\npad=1\nactivation=leaky\nlearning_rate=0.1\nstopbackward=1\n\n"
            "[convolutional]\nfilters=6\nsize=1\n\n[yolo]\nclasses=1\nnum=1\nmask=0\nanchors=1,1\njitter=.3\nignore_thresh=.7\nrandom=1\n")
    got = warnings_of(write(tmp_path, text))
    p = str(tmp_path / "t.cfg")
    assert got == [
        f"{p}:7: warning: [net]: unused key 'widht=5' (no Darknet reads it)",
        f"{p}:12: warning: layer 0 [maxpool]: unused key 'activation=tanh' (no Darknet reads it)",
        f"{p}:15: warning: layer 1 [convolutional]: unused key 'filter=8' (no Darknet reads it)",
    ]


def test_repeated_key_takes_the_first_value_and_warns_once(tmp_path):
    text = NET + "\n[convolutional]\nfilters=6\nsize=3\nfilters=255\npad=1\nfilters=7\n"
    p = write(tmp_path, text)
    sections = parse_cfg(p)
    layers = build_layers(sections, parse_net(sections[0]))
    assert layers[0].c == 6                       # Darknet's option_find: the first filters= wins
    got = unheard(sections)
    assert got == [
        f"{p}:9: warning: layer 0 [convolutional]: 'filters' is repeated (first on line 7); Darknet uses the "
        "first value, so '255' is ignored",
        f"{p}:11: warning: layer 0 [convolutional]: 'filters' is repeated (first on line 7); Darknet uses the "
        "first value, so '7' is ignored",
    ]


def test_latin1_comment_is_accepted(tmp_path):
    """Darknet skips comment lines without decoding them; so do we, whatever their bytes."""
    text = (b"# auteur: Jos\xe9 M\xfcller\n" + NET.encode() + b"; r\xe9glage\n\n[convolutional]\nfilters=4 # n\xb0 4\n"
            b"size=1\n")
    sections = parse_cfg(write(tmp_path, text))
    layers = build_layers(sections, parse_net(sections[0]))
    assert layers[0].c == 4
    assert unheard(sections) == []


@pytest.mark.parametrize("line", [b"activation=l\xe9aky", b"[convoluti\xf6nal]", b"fil\xe9ters=3"])
def test_non_utf8_outside_comments_names_the_line(tmp_path, line):
    p = write(tmp_path, NET.encode() + b"\n[convolutional]\nsize=1\n" + line + b"\n")
    with pytest.raises(CfgError) as e:
        parse_cfg(p)
    assert str(e.value) == f"{p}:8: not valid UTF-8 text (only comments may hold other bytes)"


@pytest.mark.parametrize("key", ["dontload", "dontloadscales", "numload"])
def test_keys_that_skip_weights_are_refused(tmp_path, key):
    """load_weights_upto skips a layer with dontload (dontloadscales: its batchnorm): the file would
    be read at other offsets than yolo-cl reads it."""
    p = write(tmp_path, NET + f"\n[convolutional]\nfilters=2\nsize=1\n{key}=1\n")
    with pytest.raises(CfgError, match=rf"t.cfg:9: \[convolutional\]: '{key}' makes Darknet skip weights"):
        parse_cfg(p)
    write(tmp_path, NET + f"\n[convolutional]\nfilters=2\nsize=1\n{key}=0\n")
    assert warnings_of(p) == []


def test_shortcut_fork_keys(tmp_path):
    """AlexeyAB's weights_type/weights_normalization are read (weights_normalization alone is inert, as
    in Darknet); pjreddie's alpha/beta get a note saying which fork they follow."""
    base = NET + "\n[convolutional]\nfilters=3\nsize=1\n\n[convolutional]\nfilters=3\nsize=1\n\n[shortcut]\nfrom=-2\n"
    p = write(tmp_path, base + "weights_type=per_channel\nweights_normalization=softmax\n")
    assert warnings_of(p) == []
    write(tmp_path, base + "weights_normalization=relu\n")
    assert warnings_of(p) == []
    write(tmp_path, base + "alpha=0.5\n")
    assert warnings_of(p) == [f"{p}:16: note: layer 2 [shortcut]: alpha=0.5, beta=1 follow pjreddie's Darknet "
                              "(out = alpha*out + beta*from); AlexeyAB's ignores them"]
    write(tmp_path, base.replace("from=-2", "from=-1,-2") + "beta=2\n")
    with pytest.raises(CfgError, match=r"alpha/beta \(pjreddie's weighted shortcut\) take a single 'from'"):
        warnings_of(p)


def test_warnings_reach_the_logger_once(tmp_path, caplog):
    from yolo_cl.cfg import warn_unheard
    p = write(tmp_path, NET + "\n[maxpool]\nsize=2\nstride=2\nactivation=tanh\n")
    sections = parse_cfg(p)
    build_layers(sections, parse_net(sections[0]))
    with caplog.at_level(logging.WARNING, logger="yolo_cl.cfg"):
        lines = warn_unheard(sections)
    assert [r.getMessage() for r in caplog.records] == lines
    assert len(lines) == 1 and "activation=tanh" in lines[0]


def test_cli_info_prints_each_warning_once_on_stderr(tmp_path):
    p = write(tmp_path, NET + "\n[maxpool]\nsize=2\nstride=2\nactivation=tanh\nfilter=3\nsize=5\n")
    r = subprocess.run([sys.executable, "-m", "yolo_cl", "info", str(p)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"{p}:9: warning: layer 0 [maxpool]: unused key 'activation=tanh' (no Darknet reads it)",
        f"{p}:10: warning: layer 0 [maxpool]: unused key 'filter=3' (no Darknet reads it)",
        f"{p}:11: warning: layer 0 [maxpool]: 'size' is repeated (first on line 7); Darknet uses the first value, "
        "so '5' is ignored",
    ]
    assert "warning" not in r.stdout


def test_keys_match_case_sensitively_and_blanks_vanish(tmp_path):
    """Darknet's strip() removes every blank of a line and option_find compares with strcmp:
    ``Filters=16`` is unused (the default, 1 filter, applies) and ``fil ters=3`` means filters."""
    p = write(tmp_path, NET + "adam=1\nB1=0.9\n\n[convolutional]\nFilters=16\nsize=1\n\n[convolutional]\nfil ters=3\n"
                             "size=1\n")
    sections = parse_cfg(p)
    layers = build_layers(sections, parse_net(sections[0]))
    assert [l.c for l in layers] == [1, 3]
    assert unheard(sections) == [f"{p}:9: warning: layer 0 [convolutional]: unused key 'Filters=16' (Darknet "
                                 "matches keys case-sensitively: 'filters'?)"]


def test_route_of_unequal_maps_names_an_input_size_the_strides_do_not_divide(tmp_path):
    """A [route] of a stride-16 map and the stride-32 one upsampled: equal at a multiple of 32, not at
    100 (7 and 8 pixels); the error names the route's line and sizes, and where the input is not a
    multiple of 32 says so. A cfg whose own layers disagree at a good size gets no such hint."""
    net = "[net]\nwidth=32\nheight=32\nchannels=3\n"
    body = (net + "\n[convolutional]\nfilters=4\nsize=3\nstride=2\npad=1\n" * 5 + "\n[upsample]\nstride=2\n"
            "\n[route]\nlayers=-1,-3\n")
    p = write(tmp_path, body)
    for size in (96, 128):
        sections = parse_cfg(p)
        build_layers(sections, parse_net(sections[0], (size, size)))
    sections = parse_cfg(p)
    with pytest.raises(CfgError, match=r"t\.cfg:\d+: \[route\]: layer 3 is 7x7 but layer 5 is 8x8.*"
                                       r"input size 100x100 is not a multiple of 32"):
        build_layers(sections, parse_net(sections[0], (100, 100)))
    p = write(tmp_path, body.replace("layers=-1,-3", "layers=-1,-4"))
    sections = parse_cfg(p)
    with pytest.raises(CfgError, match=r"share a size$"):
        build_layers(sections, parse_net(sections[0], (128, 128)))
