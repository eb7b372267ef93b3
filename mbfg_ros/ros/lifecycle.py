"""How the package's nodes start and stop (the estimator, the simulated plant, the benches' node variants).

A node process must end with exit code 0 and no traceback however it is asked to stop: one Ctrl-C, a
second one a few milliseconds later (impatience, or `ros2 launch` forwarding its own SIGINT after the
terminal's to the same process group), a third, a SIGTERM (launch's escalation, `docker stop`, systemd),
or any of these while the node is still starting.  rclpy's own handlers turn the first SIGINT into a
context shutdown and then hand it on to Python's default handler, which raises `KeyboardInterrupt` in
whatever the main thread is doing; a second signal raised it again inside the clean-up (`destroy_node`)
or in an atexit callback: exit code −2 or a traceback, depending on the spacing.

So the nodes take the signals over (`stop_signals`: SIGINT, SIGTERM and SIGHUP): handlers that only set a
flag (`StopRequest`), installed before the slow imports and before rclpy is initialized without its own
handlers; the main loop polls the flag, the first signal ends the loop (or the start-up, at whatever stage
it came), and every further one only sets the flag again while `close_node` cleans up (node thread
stopped, node destroyed, context shut down once).  Nothing ever raises out of a signal handler.

`StartupTimes` stamps a node's start-up stages for one log line (where start-up time goes).
"""

from __future__ import annotations

import gc
import os
import sys
import time
from typing import Callable, List, Optional, Tuple

import rclpy
import rclpy.executors
from rclpy._rclpy_pybind11 import RCLError   # rcl's failures (init, node creation)
from rclpy.signals import SignalHandlerOptions

from mbfg_ros.ros import stop_signals
from mbfg_ros.ros.stop_signals import STOP_SIGNALS, StopRequest  # noqa: F401  (the nodes' names for them)

# Humble's rclpy has no ExternalShutdownException (another part of the process shut the context down)
try:
    from rclpy.executors import ExternalShutdownException
except ImportError:  # pragma: no cover
    class ExternalShutdownException(Exception):
        pass

SPIN_PERIOD_S = 0.1     # the main loop looks at the stop flag at least this often (a signal does not
                        # interrupt rcl_wait: Python runs its handler when the main thread is back in Python)


def process_start_monotonic() -> Optional[float]:
    """When this process was started (its start time in /proc/self/stat, one clock tick = 10 ms
    resolution), on `time.monotonic()`'s clock, which is system-wide: another process's stamps compare
    with it.  None where /proc is not there."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")     # field 22: clock ticks after boot
        return time.monotonic() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, IndexError, ValueError, AttributeError):
        return None


class StartupTimes:
    """A node's start-up stages, each stamped (monotonic clock) when first marked, and logged once in one
    line as seconds after the process started (`process_start_monotonic`; where that is unknown, after
    `fallback_origin`, e.g. when the node's module began to import)."""

    def __init__(self, fallback_origin: float):
        start = process_start_monotonic()
        self.origin_name = "the process started" if start is not None else "the node's module began to import"
        self.origin = start if start is not None else fallback_origin
        self.stages: List[Tuple[str, float]] = []

    def mark(self, stage: str, at: Optional[float] = None) -> None:
        """Stamp `stage` now (or at monotonic time `at`); a stage already stamped keeps its first stamp."""
        if all(name != stage for name, _ in self.stages):
            self.stages.append((stage, time.monotonic() if at is None else at))

    def summary(self) -> str:
        """`start-up, s after the process started: imports 0.52, ..., first estimate 1.23`."""
        return (f"start-up, s after {self.origin_name}: "
                + ", ".join(f"{name} {at - self.origin:.2f}" for name, at in self.stages))


def init_ros(args=None) -> StopRequest:
    """The stop handlers (if not installed yet), then rclpy (default context) without its own handlers."""
    stop = stop_signals.install()   # (already, if the program installed it before its imports)
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
    served until a signal (or `done(node)()`), closed once; exit code 0, also when the signal came at any
    stage of the start-up."""
    try:
        stop = init_ros(args)   # a stop signal from here on (or since the program's first line): exit code 0
    except RCLError as e:       # e.g. ROS_SECURITY_* naming a keystore that is not there
        print(f"[{name}] error: ROS 2 did not initialize: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    node = executor = None
    try:
        if stop.is_set():   # during the imports or rclpy's initialization: no node to build
            rclpy.logging.get_logger(name).info(f"stopping ({stop.reason()}) during start-up, before the node "
                                                f"was built")
            return 0
        try:
            node = build(stop)
        except config_errors as e:
            print(f"[{name}] error: {e}", file=sys.stderr)
            return 2
        except RCLError as e:   # the middleware refused the node (e.g. security asked of a DDS built without it)
            print(f"[{name}] error: ROS 2 could not create the node: {' '.join(str(e).split())}", file=sys.stderr)
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
        stop_signals.forget()
