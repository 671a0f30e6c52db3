"""``noise.routed`` keeps native chatter off stderr; processes started in ``noise.for_children``
still write their own messages to the real stderr (a server worker's failure line). Run in a
child process whose stderr is a real pipe, as the CLI's is (pytest replaces ``sys.stderr``)."""
from __future__ import annotations

import subprocess
import sys

SAY = "import os, sys; os.write(2, sys.argv[1].encode())"

SCRIPT = f"""
import subprocess, sys
from yolo_cl.noise import for_children, routed
say = {SAY!r}
with routed(False):
    subprocess.run([sys.executable, "-c", say, "hidden,"], check=True)
    with for_children():
        subprocess.run([sys.executable, "-c", say, "shown,"], check=True)
    subprocess.run([sys.executable, "-c", say, "hidden again,"], check=True)
    print("ours,", file=sys.stderr, end="")
with for_children():
    subprocess.run([sys.executable, "-c", say, "plain"], check=True)
"""


def test_children_started_for_children_reach_the_real_stderr():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "shown,ours,plain"
