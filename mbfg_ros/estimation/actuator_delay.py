"""Actuators that apply a command some time after it is given (the mechanism's `actuators: delay:`).

A motor driver on a bus applies a command after the bus's transport, the driver's cycle and its current loop's
rise: the DFKI double pendulum's AK80-6 motors on CAN follow their commands ~6.5 ms late, their torque moving
from one command to the next over the command's interval, and where a controller's command moves fast (the
pendubot's shoulder, the acrobot's elbow) the command as logged is 4.1× and 2.2× farther from the measured torque
than the command so delayed (bench/real_hardware.py).  An estimator that applies each command at its own stamp
reads that latency as a disturbance, or as a model error.

The estimator is given the commands one per step, at the step's time (the node's scheduler holds the last
command between commands; `mbfg estimate` gives each row's), and applies to the step at t the command at
t − delay, interpolated linearly between the two given around that time (a first-order hold; the first one given
before any, the last one given where none is yet given after that time), per actuator.  Held from its row
instead (a zero-order hold), the measured torque of the fast runs is 1.6× and 1.1× farther from the command at
every delay: a delay of a fraction of a row is no delay the hold can apply (docs/decisions.md).  This happens
before anything reads the commands (the window's factors, the density fit, the seeding, the smoothed estimates),
so they all see the same applied efforts; `delayed_commands` applies the same rule to a recording's columns
(`mbfg tune`, the bench's EKF).  Interpolated, a command applied does not jump with a stamp's jitter.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["ActuatorDelay", "delayed_commands", "actuator_delay", "configured_delays", "command_latency",
           "latency_timed", "LATENCY_TIMED"]

#: a command stamped this close after t − delay still counts as in force then (rounding of stamps in ns)
STAMP_TOLERANCE = 1e-9
LATENCY_LONGEST = 0.015    # [s] the longest latency `command_latency` looks for, ...
LATENCY_STEP = 0.0005      # ... on this grid
#: a latency is timed where the delayed command comes this much closer to the measured effort (RMS over the
#: undelayed's) inside the grid: the DFKI motors' fast runs 0.39 and 0.56; smooth commands 0.78–1.0, at the grid's
#: top (slow mismatches, no latency)
LATENCY_TIMED = 0.75


def delayed_commands(t: np.ndarray, commands: np.ndarray, delays: Sequence[float]) -> np.ndarray:
    """The commands (N, na) given at the times t (N,) as applied at those times by actuators with these delays
    [s] (the first-order hold of the module docstring; `ActuatorDelay`'s rule)."""
    t = np.asarray(t, float)
    commands = np.asarray(commands, float)
    out = commands.copy()
    n = len(t)
    for j, delay in enumerate(delays):
        if delay > 0.0 and n > 1:
            # `_held_between` for every row at once: a positive delay's time lies before the row's own
            s = t - delay
            k = np.searchsorted(t, s + STAMP_TOLERANCE, side="right") - 1
            kk = np.clip(k, 0, n - 2)
            a, b = commands[np.maximum(k, 0), j], commands[kk + 1, j]
            with np.errstate(invalid="ignore", divide="ignore"):
                w = (s - t[kk]) / (t[kk + 1] - t[kk])
                blend = a + w * (b - a)
            held = ((k < 0) | (k >= np.arange(n)) | (s - t[np.maximum(k, 0)] <= STAMP_TOLERANCE)
                    | ~np.isfinite(a) | ~np.isfinite(b))
            out[:, j] = np.where(held, a, blend)
    return out


def _held_between(times, given, s: float, i: int) -> float:
    """The command at time s from those `given` at `times` up to index i (sorted): interpolated between the last
    given at or before s and the next (at s itself: that one alone), the first before any, the last where none
    after s is given yet; a non-finite neighbour is not interpolated with (the one at or before s is held)."""
    k = bisect.bisect_right(times, s + STAMP_TOLERANCE, 0, i + 1) - 1
    if k < 0:
        return float(given[0])
    a = float(given[k])
    if k >= i or s - times[k] <= STAMP_TOLERANCE:
        return a
    b = float(given[k + 1])
    if not (math.isfinite(a) and math.isfinite(b)):
        return a
    w = (s - times[k]) / (times[k + 1] - times[k])
    return a + w * (b - a)


def command_latency(t: np.ndarray, commands: np.ndarray, measured: np.ndarray, rows=None,
                    longest: float = LATENCY_LONGEST, step: float = LATENCY_STEP) -> Tuple[List[float], List[float]]:
    """Per column of `commands` (N, na) given at the times t: the delay after which the command (`delayed_commands`)
    is closest to the `measured` effort (RMS over `rows`, a mask, and the rows where both are
    known; the shortest such on a grid of `step` up to `longest`), and that RMS over the undelayed command's.  A
    ratio under `LATENCY_TIMED` with the delay inside the grid times the actuator's latency; else its commands move
    too slowly to time it.  NaN where a column has no row with both."""
    t = np.asarray(t, float)
    commands, measured = np.atleast_2d(np.asarray(commands, float).T).T, np.atleast_2d(np.asarray(measured, float).T).T
    keep = np.ones(len(t), bool) if rows is None else np.asarray(rows, bool)
    delays = np.round(np.arange(0.0, longest + step / 2, step), 12)     # (whole µs: 0.0065, not 0.0065000…01)
    out_delay, out_ratio = [], []
    for j in range(commands.shape[1]):
        errors = []
        for d in delays:
            e = measured[:, j] - delayed_commands(t, commands[:, [j]], [d])[:, 0]
            ok = keep & np.isfinite(e)
            errors.append(math.sqrt(float(np.mean(e[ok] ** 2))) if ok.any() else math.nan)
        errors = np.array(errors)
        if not np.isfinite(errors).any() or not errors[0] > 0:
            out_delay.append(math.nan)
            out_ratio.append(math.nan)
            continue
        best = int(np.nanargmin(errors))
        out_delay.append(float(delays[best]))
        out_ratio.append(float(errors[best] / errors[0]))
    return out_delay, out_ratio


def latency_timed(delay: float, ratio: float, longest: float = LATENCY_LONGEST) -> bool:
    """Does `command_latency`'s (delay, ratio) time a latency (see there)?"""
    return bool(ratio < LATENCY_TIMED and delay < longest - 1e-12)


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
            out[j] = _held_between(self._times, _Column(self._given, j), t - self.delays[j], i)
        return out


class _Column:
    """Column j of the given efforts, indexed like them (no copy)."""
    __slots__ = ("rows", "j")

    def __init__(self, rows, j: int):
        self.rows, self.j = rows, j

    def __getitem__(self, k: int) -> float:
        return self.rows[k][self.j]


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
