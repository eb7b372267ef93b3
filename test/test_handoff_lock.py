"""HandOffLock: a thread that takes the lock again and again (the fast loop of an overloaded node) hands it to
a thread waiting for it (a parameter or service callback) before its next batch."""

from __future__ import annotations

import threading
import time

from mbfg_ros.ros.handoff_lock import HandOffLock


def busy_user(lock: HandOffLock, stop: threading.Event, batches: list, yielding: bool):
    """Take the lock for a batch of work, at once again, until stopped (what FastLoop does while behind)."""
    while not stop.is_set():
        if yielding:
            lock.yield_to_waiters(longest_s=5.0)
        with lock:
            batches[0] += 1
            # a batch's work with the GIL released (the core's compiled kernel, numpy, rcl calls): the waiter is
            # then blocked on the lock itself, and a plain lock goes to this thread again and again (measured:
            # up to 42 batches before the waiter got it, 4 on average)
            time.sleep(0.001)


def test_a_waiting_thread_gets_the_lock_before_the_busy_users_next_batch():
    lock = HandOffLock()
    stop = threading.Event()
    batches = [0]
    user = threading.Thread(target=busy_user, args=(lock, stop, batches, True), daemon=True)
    user.start()
    try:
        while batches[0] < 50:
            pass
        gaps = []
        for _ in range(20):
            asked = batches[0]
            with lock:
                gaps.append(batches[0] - asked)
                assert lock.waiting == 0
        # the batch running when it asked may finish, and the next one may have started before the waiter
        # was counted: never more
        assert max(gaps) <= 2, gaps
    finally:
        stop.set()
        user.join(5.0)


def test_the_lock_is_re_entrant_and_yielding_without_waiters_returns_at_once():
    lock = HandOffLock()
    with lock:
        with lock:
            assert lock.acquire(blocking=False)
            lock.release()
    assert lock.yield_to_waiters() is False
    got = []

    def other():
        got.append(lock.acquire(blocking=False))

    with lock:
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert got == [False]                    # held by another thread: a non-blocking acquire fails
    assert lock.acquire(timeout=0.1)
    lock.release()
