"""The nodes' stop request under a storm of signals (no rclpy: `stop_signals` is imported before it).

A second SIGINT can reach a node while the main thread is still inside the handler of the first (a
terminal's Ctrl-C and launch's SIGINT together; the handler held off while another thread has the GIL).
The handler must then neither wait for anything its own thread holds nor recurse: a handler that set a
`threading.Event` (which takes a lock) hung for good under such a storm, deaf to SIGTERM too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mbfg_ros.ros import stop_signals

REPO = Path(__file__).resolve().parents[1]
STORM = textwrap.dedent("""
    import os, signal, sys, threading, time
    from mbfg_ros.ros import stop_signals
    sys.setswitchinterval(1e-5)      # the main thread loses the GIL inside a handler as often as possible
    stop = stop_signals.install()
    pid = os.getpid()
    busy = True

    def storm():
        for _ in range(3000):
            os.kill(pid, signal.SIGINT)
            time.sleep(0.0002)

    def hog():                       # another Python thread wanting the GIL, as the node's fast loop does
        n = 0
        while busy:
            n += 1

    sender = threading.Thread(target=storm)
    other = threading.Thread(target=hog)
    sender.start()
    other.start()
    while sender.is_alive():
        stop.is_set()
    sender.join()
    busy = False
    other.join()
    stop.ignore_further()
    print("stopped:", stop.is_set(), stop.reason())
""")


@pytest.mark.parametrize("run", range(3))
def test_a_storm_of_sigints_sets_the_request_and_nothing_else(run):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH")] if p))
    try:
        out = subprocess.run([sys.executable, "-c", STORM], capture_output=True, text=True, env=env, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the process hung in its signal handlers")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("stopped: True SIGINT"), out.stdout
    for bad in ("Traceback", "Exception ignored", "RecursionError", "lost sys.stderr"):
        assert bad not in out.stderr, out.stderr[-3000:]


def test_the_request_names_the_first_signals_and_keeps_a_few():
    request = stop_signals.StopRequest()
    assert not request.is_set() and request.reason() == "no signal"
    for s in [signal.SIGTERM] + [signal.SIGINT] * 20:
        request._on_signal(s, None)
    assert request.is_set()
    names = request.reason().split(", ")
    assert names[0] == "SIGTERM" and len(names) == stop_signals.StopRequest.KEPT
