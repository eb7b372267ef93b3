"""Actuators that apply a command some time after it is given (the mechanism's `actuators: delay:`).

A motor driver on a bus applies a command after the bus's transport, the driver's cycle and its current loop's
rise: the DFKI double pendulum's AK80-6 motors on CAN follow their commands 3 rows (~6 ms) late, and where a
controller's command moves fast (the pendubot's shoulder, the acrobot's elbow) the command as logged is 2.5× and
1.7× farther from the measured torque than the command 3 rows earlier (bench/real_hardware.py).  An estimator
that applies each command at its own stamp reads that latency as a disturbance, or as a model error.

The estimator is given the commands one per step, at the step's time (the node's scheduler holds the last
command between commands; `mbfg estimate` gives each row's), and applies to the step at t the command in force
at t − delay: a zero-order hold, the last one given at or before that time (the first one given, before any),
per actuator.  This happens before anything reads the commands (the window's factors, the density fit, the
seeding, the smoothed estimates), so they all see the same applied efforts; `delayed_commands` applies the same
rule to a recording's columns (`mbfg tune`, the bench's EKF).  A delay between two whole multiples of the step
makes the rule robust to jittering stamps (5 ms on a 2-ms step: always 3 rows back).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["ActuatorDelay", "delayed_commands", "actuator_delay", "configured_delays"]

#: a command stamped this close after t − delay still counts as in force then (rounding of stamps in ns)
STAMP_TOLERANCE = 1e-9


def delayed_commands(t: np.ndarray, commands: np.ndarray, delays: Sequence[float]) -> np.ndarray:
    """The commands (N, na) given at the times t (N,) as applied at those times by actuators with these delays
    [s] (the zero-order hold of the module docstring)."""
    t = np.asarray(t, float)
    commands = np.asarray(commands, float)
    out = commands.copy()
    for j, delay in enumerate(delays):
        if delay > 0.0:
            k = np.searchsorted(t, t - delay + STAMP_TOLERANCE, side="right") - 1
            out[:, j] = commands[np.maximum(k, 0), j]
    return out


class ActuatorDelay:
    """The commands given to the last steps (their times, ids and efforts) and each step's applied efforts."""

    def __init__(self, delays: Sequence[float], keep: int):
        self.delays = np.asarray(delays, float)
        self.delayed = np.nonzero(self.delays > 0.0)[0]
        self._times: Deque[float] = deque(maxlen=keep)
        self._ids: Deque[int] = deque(maxlen=keep)
        self._given: Deque[np.ndarray] = deque(maxlen=keep)
        self._applied: Deque[np.ndarray] = deque(maxlen=keep)

    def reset(self) -> None:
        for d in (self._times, self._ids, self._given, self._applied):
            d.clear()

    def applied(self, t: float, efforts: np.ndarray) -> np.ndarray:
        """The efforts applied at t, `efforts` being the ones given at t (a time before the last one given
        starts over: a reset or a clock that jumped back)."""
        if self._times and t < self._times[-1]:
            self.reset()
        self._times.append(float(t))
        self._ids.append(-1)
        self._given.append(np.array(efforts, float))
        applied = self._applied_at(len(self._times) - 1)
        self._applied.append(applied)
        return applied

    def assign(self, step: int) -> None:
        """The estimator's id of the step the last `applied` was for (-1: none, it waited)."""
        if self._ids:
            self._ids[-1] = int(step)

    def correct(self, corrections: Sequence[Tuple[int, np.ndarray]]) -> List[Tuple[int, np.ndarray]]:
        """Commands that came late: (step id, the efforts that step should have been given) each.  Returns
        (step id, the new applied efforts) of every step whose applied efforts they change (the steps that
        apply them after the delay, and the corrected steps' own undelayed actuators)."""
        index = {step: i for i, step in enumerate(self._ids) if step >= 0}
        first = None
        for step, efforts in corrections:
            i = index.get(int(step))
            if i is not None:
                self._given[i] = np.array(efforts, float)
                first = i if first is None else min(first, i)
        if first is None:
            return []
        out = []
        for i in range(first, len(self._times)):
            new = self._applied_at(i)
            if not _same(new, self._applied[i]):
                self._applied[i] = new
                if self._ids[i] >= 0:
                    out.append((self._ids[i], new))
        return out

    def _applied_at(self, i: int) -> np.ndarray:
        out = self._given[i].copy()
        t = self._times[i]
        for j in self.delayed:
            k = bisect.bisect_right(self._times, t - self.delays[j] + STAMP_TOLERANCE, 0, i + 1) - 1
            out[j] = self._given[max(k, 0)][j]
        return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a, b, equal_nan=True))


def configured_delays(mech, overrides: Optional[Dict[str, float]] = None) -> List[float]:
    """Per actuator its delay [s]: `overrides` (joint name → s, `EstimatorConfig.actuator_delays`) over the
    mechanism's `delay` keys; ValueError naming an unknown joint."""
    overrides = dict(overrides or {})
    unknown = [name for name in overrides if name not in mech.actuator_names]
    if unknown:
        raise ValueError(f"actuator_delays: unknown actuator joint(s) {', '.join(map(repr, unknown))} (known: "
                         f"{', '.join(mech.actuator_names) or 'none'})")
    return [float(overrides.get(name, delay)) for name, delay in zip(mech.actuator_names, mech.actuator_delays)]


def actuator_delay(delays: Sequence[float], dt: float, window: int) -> Optional[ActuatorDelay]:
    """The delays' bookkeeping (None without a delay: it costs nothing), keeping the commands of as many steps as
    the window and the longest delay span, with room for shorter intervals than dt."""
    delays = [float(d) for d in delays]
    if not any(d > 0.0 for d in delays):
        return None
    return ActuatorDelay(delays, keep=2 * (int(window) + math.ceil(max(delays) / dt)) + 16)
