"""A re-entrant lock that a busy loop hands to a waiting thread before it takes the lock again.

The fast loop takes the node's lock for each batch of work and, while it is behind (an overloaded node always
has another step ready), takes it again at once.  Python's locks are not fair: the thread that releases a lock
and asks for it again a few bytecodes later usually wins over one that was waiting, which must first be woken
up.  A parameter, service or diagnostics callback of the main executor then waited for seconds on an
overloaded node (docs/decisions.md).  The loop calls `yield_to_waiters()` before each batch, which returns at
once unless another thread waits for the lock, and then returns once that thread has it (or after `longest_s`).
"""

from __future__ import annotations

import threading
import time

POLL_S = 0.0001    # how often the yielding thread looks whether the waiter got the lock (sleeping: no GIL held)


class HandOffLock:
    """A re-entrant lock (`with lock:`, `acquire`, `release`) with `yield_to_waiters()` for its busy user."""

    def __init__(self):
        self._lock = threading.RLock()
        self._count = threading.Lock()
        self._waiting = 0          # threads blocked in `acquire` (not yet holding the lock)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):      # free, or held by this thread (re-entered)
            return True
        if not blocking:
            return False
        with self._count:
            self._waiting += 1
        try:
            return self._lock.acquire(timeout=timeout)
        finally:
            with self._count:
                self._waiting -= 1

    def release(self):
        self._lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()

    @property
    def waiting(self) -> int:
        """How many threads wait for the lock now."""
        return self._waiting

    def yield_to_waiters(self, longest_s: float = 0.005) -> bool:
        """Call without holding the lock, before taking it: if another thread waits for it, give it the lock
        first (return once it has it, at most after `longest_s`).  True if there was a waiter."""
        if not self._waiting:
            return False
        deadline = time.monotonic() + longest_s
        while self._waiting and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return True
