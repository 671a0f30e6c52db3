"""Suite-wide setup: the Ctrl-C the SIGINT tests send reaches the processes they start, and the
long test files are collected first (for the two workers' balance).

A suite run in the background by a shell without job control (``cmd &`` in a script) starts with
SIGINT ignored, and an ignored signal stays ignored across exec: every yolo-cl process a test
started would shrug off the test's Ctrl-C (exit 0 instead of 130, servers that never stop). A
handler does not survive exec, so installing Python's own here gives those processes the default.
"""
import signal

signal.signal(signal.SIGINT, signal.default_int_handler)

# Files that take minutes on a 2-core PoCL host (BENCHMARKS.md, "The suite on two workers"). The
# suite runs with --dist loadfile, which hands files to the two workers in collection order, so
# these go first: a long file started last would leave the other worker idle until it ends.
LONG_FILES = ("test_gemm_wgmma.py", "test_gemm_mma.py", "test_winograd.py", "test_write_through.py",
              "test_layers.py", "test_opencv_parity.py")


def pytest_collection_modifyitems(session, config, items) -> None:
    """Long files first, in the order above; the rest as collected (a stable sort)."""
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))
