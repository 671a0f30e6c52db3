"""``yolo-cl download``: against a real HTTP server on 127.0.0.1 that serves a file, honours Range,
can cut a connection half-way and answers 404 (no other network is reachable here)."""
from __future__ import annotations

import hashlib
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

PAYLOAD = os.urandom(3 << 20)              # 3 MiB: several read blocks


class _Handler(http.server.BaseHTTPRequestHandler):
    cut_next = False                          # send half of the file, then close the connection
    ranges: list = []

    def log_message(self, *a):                # keep the test output clean
        pass

    def do_GET(self):
        if self.path != "/w.weights":
            self.send_error(404, "Not Found")
            return
        start = 0
        rng = self.headers.get("Range")
        type(self).ranges.append(rng)
        if rng:
            start = int(rng.split("=")[1].rstrip("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(PAYLOAD) - 1}/{len(PAYLOAD)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(PAYLOAD) - start))
        self.end_headers()
        body = PAYLOAD[start:]
        if type(self).cut_next:
            type(self).cut_next = False
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    _Handler.ranges = []
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _cli(cache: Path, *args):
    env = dict(os.environ, YOLO_CL_CACHE=str(cache))
    return subprocess.run([sys.executable, "-m", "yolo_cl", "download", *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=env)


def test_resume_after_a_cut_and_verify(server, tmp_path):
    sha = hashlib.sha256(PAYLOAD).hexdigest()
    _Handler.cut_next = True
    r = _cli(tmp_path, "yolov4", "--url", f"{server}/w.weights", "--checksum", f"sha256:{sha}")
    assert r.returncode == 2 and "connection closed after" in r.stderr and "resume" in r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    final = tmp_path / "weights" / "yolov4.weights"
    part = final.with_name("yolov4.weights.part")
    assert not final.exists() and 0 < part.stat().st_size < len(PAYLOAD)
    r = _cli(tmp_path, "yolov4", "--url", f"{server}/w.weights", "--checksum", f"sha256:{sha}")
    assert r.returncode == 0, r.stderr
    assert _Handler.ranges == [None, f"bytes={len(PAYLOAD) // 2}-"]     # the second request resumed
    assert final.read_bytes() == PAYLOAD and not part.exists()
    assert r.stdout.strip() == str(final)


def test_wrong_checksum_leaves_nothing(server, tmp_path):
    r = _cli(tmp_path, "yolov4", "--url", f"{server}/w.weights")       # the zoo's published SHA-1 of yolov4
    assert r.returncode == 2 and "does not match the expected 0143deb6" in r.stderr
    assert list((tmp_path / "weights").iterdir()) == []


def test_404_and_unknown_model(server, tmp_path):
    r = _cli(tmp_path, "yolov4", "--url", f"{server}/missing.weights")
    assert r.returncode == 2 and "HTTP 404" in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "weights" / "yolov4.weights").exists()
    r = _cli(tmp_path, "yolov9")
    assert r.returncode == 2 and "'yolov9' is not a zoo model" in r.stderr
    r = _cli(tmp_path, "efficientnet-lite3")
    assert r.returncode == 2 and "no published weights" in r.stderr


def test_first_download_records_its_hash(server, tmp_path):
    """yolov4-csp has no published checksum: the first download's SHA-256 is recorded (said once) and a
    later download of different bytes is refused."""
    from yolo_cl import download as dl
    r = _cli(tmp_path, "yolov4-csp", "--url", f"{server}/w.weights")
    assert r.returncode == 0 and "no published checksum for yolov4-csp" in r.stderr
    assert hashlib.sha256(PAYLOAD).hexdigest() in (tmp_path / "weights" / dl.HASHES_FILE).read_text()
    os.remove(tmp_path / "weights" / "yolov4-csp.weights")
    r = _cli(tmp_path, "yolov4-csp", "--url", f"{server}/w.weights")
    assert r.returncode == 0 and "no published checksum" not in r.stderr
    (tmp_path / "weights" / "yolov4-csp.weights").write_bytes(b"tampered")
    r = _cli(tmp_path, "yolov4-csp", "--url", f"{server}/w.weights")
    assert r.returncode == 2 and "does not match" in r.stderr
    assert not (tmp_path / "weights" / "yolov4-csp.weights").exists()


def test_downloaded_weights_are_found_by_the_zoo(tmp_path, monkeypatch):
    from yolo_cl.zoo import resolve
    monkeypatch.setenv("YOLO_CL_CACHE", str(tmp_path))
    assert resolve("yolov4")[1] is None
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "yolov4.weights").write_bytes(b"x")
    assert resolve("yolov4")[1] == tmp_path / "weights" / "yolov4.weights"


def test_detect_with_a_zoo_model_fetches_its_weights_once(tmp_path, monkeypatch, capsys):
    """``yolo-cl detect --model NAME`` without weights downloads them (here: a stand-in for the network
    that writes random weights), then finds them in the cache the next time."""
    import darknet_io
    from yolo_cl import cli, download as dl
    from yolo_cl.zoo import resolve
    monkeypatch.setenv("YOLO_CL_CACHE", str(tmp_path))
    calls = []

    def fake_download(name, *a, **k):
        calls.append(name)
        out = tmp_path / "weights" / f"{name}.weights"
        out.parent.mkdir(parents=True, exist_ok=True)
        darknet_io.write_random_weights(str(resolve(name)[0]), str(out))
        return out

    monkeypatch.setattr(dl, "download", fake_download)
    img = Path(__file__).resolve().parents[1] / "models" / "images" / "dog.jpg"
    for _ in range(2):
        assert cli.main(["detect", str(img), "--model", "yolov2-tiny", "--size", "64", "--thresh", "0.9"]) == 0
    assert calls == ["yolov2-tiny"]
    assert "downloading its published weights" in capsys.readouterr().err
