"""A lean wait loop for the 1 kHz hot path of an rclpy node.

rclpy's stock executors rebuild a wait set over every entity of the node, wrap each callback in a
Task and walk several generators on every wake-up: for a 1 kHz estimator that wakes for two inputs
and a timer per step, that alone would eat most of the 1 ms budget.  `FastLoop` waits on a fixed, small
set of subscriptions and timers with one reusable rcl wait set in its own thread (the GIL is released
while waiting) and calls plain Python handlers.  Services may be served by the loop too: a request is
then handled between two steps, without waiting for a lock held by the hot path or for the GIL held
by another thread, which is what keeps a service's answer within a timestep.  Everything else of the
node (parameters, /clock for use_sim_time, diagnostics) stays on a normal rclpy executor in the main
thread; handlers of both sides share a lock.

The entities must be created in `DETACHED` callback groups (`detached_group()`) so the normal
executor never waits on them.  The loop relies on rclpy's pybind11 layer (`WaitSet`,
`take_message`, `service_take_request`, `call_timer`), identical in Humble, Jazzy and Kilted; `available()` checks it and
callers fall back to the stock executor when it is missing.

With `thread_priority` > 0 the loop's thread runs under SCHED_FIFO at that priority (as ros2_control's
controller_manager runs its update thread): an input then preempts the ordinary (CFS) processes of the
machine at once, instead of waiting for the end of another process's time slice while a controller, a
recorder and the plant share the cores.  Such a thread must never spin: the short non-blocking poll for
the rest of a step's inputs (`poll_window`) is then replaced by the blocking wait (which a real-time
thread wakes from without delay), so the loop only uses the CPU for real work.  The process's Fast DDS
receive threads (through which the inputs arrive) get SCHED_FIFO one priority below the loop.
"""

from __future__ import annotations

import collections
import ctypes
import os
import threading
import time
from contextlib import ExitStack
from typing import Callable, List, Optional, Tuple

from rclpy.callback_groups import CallbackGroup

from mbfg_ros.ros.handoff_lock import HandOffLock

try:
    from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
except ImportError:  # pragma: no cover
    _rclpy = None


class DetachedCallbackGroup(CallbackGroup):
    """A callback group that stock executors never execute (its entities are served by a FastLoop)."""

    def can_execute(self, entity) -> bool:
        return False

    def beginning_execution(self, entity) -> bool:
        return False

    def ending_execution(self, entity) -> None:
        pass


PR_SET_NAME = 15          # prctl(2): the calling thread's name (comm), at most 15 bytes


def name_this_thread(name: str) -> None:
    """Give the calling thread an OS-visible name (`ps -eLo tid,comm,cls,rtprio`, `top -H`, `chrt -p TID`),
    so its scheduling can be checked from outside.  Best effort: a no-op where prctl is unavailable."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


# Fast DDS names the threads that receive from its transports after the transport and port (dds.shm.7411,
# dds.udp.7411): the inputs reach the loop through them, so a real-time loop waiting behind a normal
# receive thread would gain nothing when the cores are busy.
DDS_RECEIVE_THREAD_PREFIXES = ("dds.shm.", "dds.udp.", "dds.tcp.")


def dds_receive_threads() -> List[int]:
    """Thread ids of this process's Fast DDS receive threads (none with another RMW)."""
    found = []
    try:
        entries = os.listdir("/proc/self/task")
    except OSError:                   # not Linux
        return found
    for entry in entries:
        try:
            with open(f"/proc/self/task/{entry}/comm") as f:
                name = f.read().strip()
        except OSError:               # a thread that just ended
            continue
        if name.startswith(DDS_RECEIVE_THREAD_PREFIXES) and not name.startswith("dds.shm.wdog"):
            found.append(int(entry))
    return found


def make_thread_realtime(priority: int, native_id: int) -> Optional[str]:
    """Put thread `native_id` under SCHED_FIFO at `priority` (1..99).  None when done, else why not (the
    process lacks CAP_SYS_NICE and its RLIMIT_RTPRIO is below `priority`, or the OS has no SCHED_FIFO)."""
    if not hasattr(os, "sched_setscheduler"):
        return "this OS has no sched_setscheduler (SCHED_FIFO is Linux/POSIX only)"
    try:
        os.sched_setscheduler(native_id, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as e:
        return f"sched_setscheduler(SCHED_FIFO, {priority}) failed: {e.strerror or e}"
    return None


def available() -> bool:
    if _rclpy is None:
        return False
    need = {"WaitSet": ("wait", "add_subscription", "add_timer", "add_guard_condition", "get_ready_entities",
                        "clear_entities"),
            "Subscription": ("take_message",),
            "Service": ("service_take_request",),
            "Timer": ("is_timer_ready",)}
    for cls, attrs in need.items():
        c = getattr(_rclpy, cls, None)
        if c is None or not all(hasattr(c, a) for a in attrs):
            return False
    return hasattr(_rclpy.Timer, "call_timer") or hasattr(_rclpy.Timer, "call_timer_with_info")


class FastLoop:
    """Serve `subscriptions` [(Subscription, handler(msg))], `timers` [(Timer, handler())] and `services`
    [(Service, handler(request, response) -> response)] in a thread.
    A subscription given as (Subscription, handler, True) has its handler called as handler(msg, info)
    with the rmw message info (`source_timestamp`: when the publisher wrote it, `received_timestamp`).

    Each wake-up drains every ready subscription (all queued messages, in arrival order per topic),
    then calls `after_batch()` once (e.g. to run the estimator on everything that arrived together),
    then the ready services' handlers (requests are looked for at each blocking wait, not while
    polling), then the ready timers' handlers.  When `after_batch` or a timer handler returns True ("more work
    is ready"), the loop only polls for new messages and calls `after_batch` again, so work split into
    short slices is finished without waiting for the next event.  `poll_window()`, if given, is asked
    after each batch for how long (ns) an input is expected imminently (e.g. the second half of a step's
    inputs): the loop then polls without blocking for that long, since a blocking wait's sleep and
    wake-up cost more than a short poll (not under a real-time policy: see the module doc).
    `thread_priority` > 0: run the thread under SCHED_FIFO at that priority; if the process may not,
    `on_priority_refused(reason)` is called once from the thread, which goes on under the normal policy
    (`realtime` tells which it got once started).  Exceptions in handlers are passed to `on_error` and
    never stop the loop."""

    def __init__(self, node, subscriptions: List[Tuple[object, Callable]], timers: List[Tuple[object, Callable]],
                 after_batch: Optional[Callable[[], None]] = None, lock=None,
                 on_error: Optional[Callable[[BaseException], None]] = None, name: str = "mbfg_fastloop",
                 poll_window: Optional[Callable[[], int]] = None,
                 services: Optional[List[Tuple[object, Callable]]] = None, thread_priority: int = 0,
                 on_priority_refused: Optional[Callable[[str], None]] = None):
        if not 0 <= thread_priority <= 99:
            raise ValueError(f"thread_priority must be 0 (normal scheduling) or 1..99 (got {thread_priority})")
        self.node = node
        self.poll_window = poll_window
        self.name = name
        self.thread_priority = int(thread_priority)
        self.on_priority_refused = on_priority_refused or (lambda reason: node.get_logger().warning(reason))
        self.realtime = False
        self.receive_threads: List[int] = []    # DDS receive threads put under SCHED_FIFO with the loop
        self._started = threading.Event()
        self.subs = list(subscriptions)
        self.timers = list(timers)
        self.services = list(services or ())
        self.after_batch = after_batch
        # (a HandOffLock: the loop hands it to a waiting callback of another thread before each batch)
        self.lock = lock or HandOffLock()
        user_on_error = on_error or (lambda e: node.get_logger().error(f"fast loop handler: {e!r}"))

        def report(e):   # errors while the context shuts down (SIGINT) are expected: stay quiet
            if not self._stop.is_set() and node.context.ok():
                user_on_error(e)
        self.on_error = report
        self._stop = threading.Event()
        self._calls: collections.deque = collections.deque()
        self._wake = node.create_guard_condition(lambda: None, callback_group=DetachedCallbackGroup())
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        t = _rclpy.Timer
        self._call_timer = "call_timer" if hasattr(t, "call_timer") else "call_timer_with_info"

    def start(self):
        """Start the thread; returns once it has its name and scheduling policy (`realtime`)."""
        self._thread.start()
        self._started.wait(5.0)

    def _set_up_thread(self):
        name_this_thread(self.name)
        if self.thread_priority > 0:
            refused = make_thread_realtime(self.thread_priority, threading.get_native_id())
            self.realtime = refused is None
            if self.realtime:
                # the receive threads one below the loop: the inputs arrive, then the loop preempts them
                below = max(1, self.thread_priority - 1)
                self.receive_threads = [t for t in dds_receive_threads() if make_thread_realtime(below, t) is None]
            if refused:
                try:
                    self.on_priority_refused(refused)
                except Exception as e:  # noqa: BLE001
                    self.on_error(e)
        self._started.set()

    def call_soon(self, fn: Callable[[], None]):
        """Run `fn()` in the loop's thread (under the lock) after its current work, e.g. a periodic report
        that would otherwise compete with the hot path for the GIL from another thread for milliseconds
        (Python hands the GIL over only every switch interval).  Thread-safe; wakes the loop."""
        self._calls.append(fn)
        try:
            self._wake.trigger()
        except Exception:  # noqa: BLE001 - shutting down
            pass

    def stop(self, timeout: float = 2.0):
        self._stop.set()
        try:
            self._wake.trigger()
        except Exception:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _serve(self, sh, srv, handler):
        """Answer every queued request of one service."""
        while True:
            got = sh.service_take_request(srv.srv_type.Request)
            if got is None or got[1] is None:
                return
            request, header = got
            try:
                response = handler(request, srv.srv_type.Response())
                srv.send_response(response, header)
            except Exception as e:  # noqa: BLE001 - the client times out; the loop goes on
                self.on_error(e)

    def _run(self):
        self._set_up_thread()
        ctx = self.node.context
        try:
            with ExitStack() as stack:
                stack.enter_context(ctx.handle)
                for e in self.subs:
                    stack.enter_context(e[0].handle)
                for t, _ in self.timers:
                    stack.enter_context(t.handle)
                for srv, _ in self.services:
                    stack.enter_context(srv.handle)
                stack.enter_context(self._wake.handle)
                ws = _rclpy.WaitSet(len(self.subs), 1, len(self.timers), 0, len(self.services), 0, ctx.handle)
                subs = [(e[0].handle, e[0].msg_type, e[0].raw, e[1], len(e) > 2 and bool(e[2])) for e in self.subs]
                timers = [(t.handle, h) for t, h in self.timers]
                services = [(srv.handle, srv, h) for srv, h in self.services]
                call = self._call_timer
                more = False
                poll_until = 0
                poll_window = None if self.realtime else self.poll_window   # a real-time thread never spins
                wake = self._wake.handle
                stop = self._stop
                yield_to_waiters = getattr(self.lock, "yield_to_waiters", None)
                yielding = yield_to_waiters is not None
                while not stop.is_set():
                    if more or (poll_until and time.monotonic_ns() < poll_until):
                        # polling: try every subscription and timer directly (no wait set to rebuild)
                        ready_subs = ready_timers = None
                        ready_services = ()
                    else:
                        if not ctx.ok():     # (checked before blocking only: it takes a lock)
                            break
                        ws.clear_entities()
                        for sh, _, _, _, _ in subs:
                            ws.add_subscription(sh)
                        for th, _ in timers:
                            ws.add_timer(th)
                        for sh, _, _ in services:
                            ws.add_service(sh)
                        ws.add_guard_condition(wake)
                        ws.wait(200_000_000)   # 0.2 s: re-check the stop flag now and then
                        if stop.is_set():
                            break
                        ready_subs = ws.get_ready_entities("subscription")
                        ready_timers = ws.get_ready_entities("timer")
                        ready_services = ws.get_ready_entities("service") if services else ()
                        poll_until = 0
                    took = more
                    more = False
                    if yielding:
                        # a callback of the main executor waiting for the lock gets it before this batch
                        yield_to_waiters()
                    with self.lock:
                        for sh, mtype, raw, handler, with_info in subs:
                            if ready_subs is not None and sh.pointer not in ready_subs:
                                continue
                            while True:
                                got = sh.take_message(mtype, raw)
                                if got is None:
                                    break
                                took = True
                                try:
                                    if with_info:
                                        handler(got[0], got[1])
                                    else:
                                        handler(got[0])
                                except Exception as e:  # noqa: BLE001 - never let a handler kill the loop
                                    self.on_error(e)
                        if took and self.after_batch is not None:
                            try:
                                more = bool(self.after_batch())
                            except Exception as e:  # noqa: BLE001
                                self.on_error(e)
                        if took and poll_window is not None:
                            try:
                                w = poll_window()
                            except Exception as e:  # noqa: BLE001
                                w = 0
                                self.on_error(e)
                            poll_until = time.monotonic_ns() + w if w > 0 else 0
                        for sh, srv, handler in services:
                            if sh.pointer in ready_services:
                                self._serve(sh, srv, handler)
                        for th, handler in timers:
                            if (ready_timers is None or th.pointer in ready_timers) and th.is_timer_ready():
                                getattr(th, call)()
                                try:
                                    more = bool(handler()) or more
                                except Exception as e:  # noqa: BLE001
                                    self.on_error(e)
                        calls = self._calls
                        while calls:
                            try:
                                calls.popleft()()
                            except Exception as e:  # noqa: BLE001
                                self.on_error(e)
        except Exception as e:  # context shut down under us, handle destroyed...
            if not self._stop.is_set() and ctx.ok():
                self.on_error(e)
