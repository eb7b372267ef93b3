"""The stop signals of the package's node processes, without rclpy (imported before anything heavy).

SIGINT (Ctrl-C; `ros2 launch` forwarding it), SIGTERM (launch's escalation, `docker stop`, systemd) and
SIGHUP (the terminal or ssh session closed) each ask a node process to stop: exit code 0, one `stopping`
line, no traceback.  A handler only sets a flag (`StopRequest`); the node's main loop polls it.

The handlers must be in place before the slow imports (rclpy, numpy, GTSAM: most of a node's start-up):
a signal during an import otherwise raised `KeyboardInterrupt` inside it (exit −2 and a traceback) or,
for SIGTERM and SIGHUP, killed the process (exit −15, −1, no `stopping` line).  So the programs
(`mbfg_ros.ros.programs` for the installed executables, the top of `node.py` / `sim_node.py` for
`python -m`) call `install()` first; `lifecycle.init_ros` calls it again and gets the same request.
Only the interpreter's own start, before the first line of the package runs (a few tens of ms), keeps
Python's defaults.

A signal that was ignored when the process started (`nohup` ignores SIGHUP) stays ignored.
"""

from __future__ import annotations

import signal
from typing import List, Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequest:
    """The stop flag set by the stop signals (`is_set()`); `received` names the signals that came (the
    first few), for the log."""

    KEPT = 8

    def __init__(self):
        # a plain attribute, not a `threading.Event`: `Event.set()` takes a lock, and a second signal that
        # arrives while the main thread is inside the first handler's `set()` runs its handler nested there,
        # which then waits for the lock its own thread holds (a storm of signals recursed until the
        # interpreter gave up: exit −2 and "Exception ignored").  Assigning a bool takes no lock.
        self._requested = False
        self.received: List[str] = []
        self.handled: List[signal.Signals] = []

    def install(self) -> None:
        self.handled = []
        for s in STOP_SIGNALS:
            if s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN:
                continue        # nohup: the user wants the node to outlive the terminal
            signal.signal(s, self._on_signal)
            self.handled.append(s)

    def _on_signal(self, signum, frame) -> None:   # the main thread, between two bytecodes: only set a flag
        if len(self.received) < self.KEPT:
            self.received.append(signal.Signals(signum).name)
        self._requested = True

    def is_set(self) -> bool:
        return self._requested

    def reason(self) -> str:
        return ", ".join(self.received) if self.received else "no signal"

    def ignore_further(self) -> None:
        """After the clean-up: ignore the stop signals for the rest of the exit.  (Python's finalization
        puts the default action back for a signal with a Python handler, which would end the process with
        −2 on a signal arriving in its last moments; an ignored signal stays ignored.)"""
        for s in self.handled:
            signal.signal(s, signal.SIG_IGN)


_process_request: Optional[StopRequest] = None


def install() -> StopRequest:
    """The process's stop request, its handlers installed at the first call (main thread only)."""
    global _process_request
    if _process_request is None:
        _process_request = StopRequest()
        _process_request.install()
    return _process_request


def forget() -> None:
    """Drop the process's stop request (a process that runs a node's `main()` more than once, e.g. a
    test: each run starts with no signal received)."""
    global _process_request
    _process_request = None
