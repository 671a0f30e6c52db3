"""Suite-wide setup: the Ctrl-C the SIGINT tests send reaches the processes they start.

A suite run in the background by a shell without job control (``cmd &`` in a script) starts with
SIGINT ignored, and an ignored signal stays ignored across exec: every yolo-cl process a test
started would shrug off the test's Ctrl-C (exit 0 instead of 130, servers that never stop). A
handler does not survive exec, so installing Python's own here gives those processes the default.
"""
import signal

signal.signal(signal.SIGINT, signal.default_int_handler)
