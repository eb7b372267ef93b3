"""How the package's nodes start and stop (the estimator, the simulated plant, the benches' node variants).

A node process must end with exit code 0 and no traceback however it is asked to stop: one Ctrl-C, a
second one a few milliseconds later (impatience, or `ros2 launch` forwarding its own SIGINT after the
terminal's to the same process group), a third, a SIGTERM (launch's escalation, `docker stop`, systemd),
or any of these while the node is still starting.  rclpy's own handlers turn the first SIGINT into a
context shutdown and then hand it on to Python's default handler, which raises `KeyboardInterrupt` in
whatever the main thread is doing; a second signal raised it again inside the clean-up (`destroy_node`)
or in an atexit callback: exit code −2 or a traceback, depending on the spacing.

So the nodes take the signals over: `init_ros` installs SIGINT and SIGTERM handlers that only set a flag
(`StopRequest`) BEFORE initializing rclpy without its handlers; the main loop polls the flag, the first
signal ends the loop, and every further one only sets the flag again while `close_node` cleans up (node
thread stopped, node destroyed, context shut down once).  Nothing ever raises out of a signal handler.
"""

from __future__ import annotations

import gc
import signal
import sys
import threading
from typing import Callable, List, Optional

import rclpy
import rclpy.executors
from rclpy.signals import SignalHandlerOptions

# Humble's rclpy has no ExternalShutdownException (another part of the process shut the context down)
try:
    from rclpy.executors import ExternalShutdownException
except ImportError:  # pragma: no cover
    class ExternalShutdownException(Exception):
        pass

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SPIN_PERIOD_S = 0.1     # the main loop looks at the stop flag at least this often (a signal does not
                        # interrupt rcl_wait: Python runs its handler when the main thread is back in Python)


class StopRequest:
    """The stop flag set by SIGINT and SIGTERM (`is_set()`); `received` names the signals that came (the
    first few), for the log."""

    KEPT = 8

    def __init__(self):
        self._event = threading.Event()
        self.received: List[str] = []

    def install(self) -> None:
        for s in STOP_SIGNALS:
            signal.signal(s, self._on_signal)

    def _on_signal(self, signum, frame) -> None:   # the main thread, between two bytecodes: only set a flag
        if len(self.received) < self.KEPT:
            self.received.append(signal.Signals(signum).name)
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def reason(self) -> str:
        return ", ".join(self.received) if self.received else "no signal"

    @staticmethod
    def ignore_further() -> None:
        """After the clean-up: ignore SIGINT/SIGTERM for the rest of the exit.  (Python's finalization puts
        the default action back for a signal with a Python handler, which would end the process with −2 on a
        signal arriving in its last moments; an ignored signal stays ignored.)"""
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)


def init_ros(args=None) -> StopRequest:
    """Install the stop handlers, then initialize rclpy (default context) without its own handlers."""
    stop = StopRequest()
    stop.install()          # first: a signal while rcl initializes is a stop request too
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    return stop


def spin_until_stopped(executor, stop: StopRequest, done=None) -> None:
    """Serve the executor until a stop is requested, the context is shut down elsewhere, or `done()`."""
    context = executor.context
    while not stop.is_set() and context.ok() and not (done is not None and done()):
        try:
            executor.spin_once(timeout_sec=SPIN_PERIOD_S)
        except ExternalShutdownException:
            return


def start_node(node) -> None:
    """Start a node's own thread after freezing everything built so far out of the garbage collector's
    full collections: it lives as long as the node, and those pauses (growing with it) would stall the
    1 kHz thread; the hot paths make little cyclic garbage."""
    gc.collect()
    gc.freeze()
    node.start()


def close_node(node, executor=None) -> None:
    """Stop a node's thread, destroy the node and shut rclpy down, each once (safe after an external
    shutdown, and whatever signals arrive meanwhile: they only set the stop flag)."""
    if node is not None:
        node.stop()
        if executor is not None:
            executor.remove_node(node)
        node.destroy_node()
    if rclpy.ok():
        rclpy.shutdown()


def run_node(args, build: Callable[[StopRequest], object], config_errors: tuple, name: str,
             done: Optional[Callable[[object], Callable[[], bool]]] = None) -> int:
    """A node's `main()`: rclpy under this module's signal handling, the node built by `build(stop)` (a
    bad configuration, one of `config_errors`: one line `[name] error: ...` on stderr, exit code 2),
    served until a signal (or `done(node)()`), closed once; exit code 0."""
    stop = init_ros(args)   # SIGINT/SIGTERM from here on: an orderly stop, exit code 0
    node = executor = None
    try:
        try:
            node = build(stop)
        except config_errors as e:
            print(f"[{name}] error: {e}", file=sys.stderr)
            return 2
        if not stop.is_set():
            executor = rclpy.executors.SingleThreadedExecutor()
            executor.add_node(node)
            start_node(node)
            spin_until_stopped(executor, stop, done=done(node) if done is not None else None)
        if stop.is_set():
            node.get_logger().info(f"stopping ({stop.reason()})")
        return 0
    finally:
        close_node(node, executor)
        stop.ignore_further()
