"""Actuators that apply a command some time after it is given (the mechanism's `actuators: delay:`).

A motor driver on a bus applies a command after the bus's transport, the driver's cycle and its current loop's
rise: the DFKI double pendulum's AK80-6 motors on CAN follow their commands 3–4.5 ms late through a 3–4-ms lag,
their torque moving from one command to the next over the command's interval, and where a controller's command
moves fast (the pendubot's shoulder, the acrobot's elbow) the command as logged is 6.1× and 3.3× farther from the
measured torque than the command so applied (bench/real_hardware.py).  An estimator that applies each command at
its own stamp reads that latency as a disturbance, or as a model error.

The estimator is given the commands one per step, at the step's time (the node's scheduler holds the last
command between commands; `mbfg estimate` gives each row's), and applies to the step at t the command at
t − delay, interpolated linearly between the two given around that time (a first-order hold; the first one given
before any, the last one given where none is yet given after that time), per actuator.  Held from its row
instead (a zero-order hold), the measured torque of the fast runs is 1.6× and 1.1× farther from the command at
every delay: a delay of a fraction of a row is no delay the hold can apply (docs/decisions.md).  This happens
before anything reads the commands (the window's factors, the density fit, the seeding, the smoothed estimates),
so they all see the same applied efforts; `delayed_commands` applies the same rule to a recording's columns
(`mbfg tune`, the bench's EKF).  Interpolated, a command applied does not jump with a stamp's jitter.

After the delay an actuator with a `time_constant` T follows that command through a first-order lag
(T ẏ = u − y: a current loop's rise, a driver's filter), integrated exactly over each step with the command
taken linear between the steps; it starts where the first command is (at rest: no transient at the start or after
a reset) and a missing (non-finite) command is bridged (the lag runs on from the last finite one to the next;
the step without it applies none).  The DFKI motors follow a ~4-ms delay through T ≈ 3 ms: their fast runs'
measured torque comes ~45 % and ~20 % closer than without the lag (docs/decisions.md).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["ActuatorDelay", "delayed_commands", "actuator_delay", "configured_delays", "configured_time_constants",
           "command_response", "latency_timed", "LATENCY_TIMED", "lag_step", "lagged"]

#: a command stamped this close after t − delay still counts as in force then (rounding of stamps in ns)
STAMP_TOLERANCE = 1e-9
LATENCY_LONGEST = 0.015    # [s] the longest latency `command_response` looks for, ...
LATENCY_STEP = 0.0005      # ... on this grid (and the lag's time constant on it)
LAG_LONGEST = 0.008        # [s] the longest time constant of the lag it looks for
#: [s] `response_sigma` leaves out the departure's running mean over this: what a fused disturbance follows (the
#: real double pendulum's fitted disturbance time constants 0.04–0.3 s)
RESPONSE_SMOOTHING = 0.1
#: a latency is timed where the delayed (and lagged) command comes this much closer to the measured effort (RMS over
#: the undelayed's) inside the grids: the DFKI motors' fast runs 0.39 and 0.56 delayed alone; smooth commands
#: 0.78–1.0, at the grid's top (slow mismatches, no latency)
LATENCY_TIMED = 0.75


def lag_step(y: float, u0: float, u1: float, h: float, time_constant: float) -> float:
    """The output of the first-order lag T ẏ = u − y after h [s] from y, the input going linearly from u0 to u1
    (exact; h ≤ 0: y)."""
    if h <= 0.0:
        return y
    rest = -math.expm1(-h / time_constant)            # 1 − a, a = e^(−h/T)
    # y(h) = u1 − rT + (y − u0 + rT)·a, r = (u1 − u0)/h; written so that T ≫ h and T ≪ h both stay exact
    return (1.0 - rest) * y + rest * u1 - (u1 - u0) * (time_constant / h * rest - (1.0 - rest))


def lagged(t: np.ndarray, u: np.ndarray, time_constant: float) -> np.ndarray:
    """The columns u (N, k) applied at the times t (N,) (NaN: none) through the lag of this time constant
    (`lag_step`, `ActuatorDelay`'s rule: each column from its first finite value, bridging non-finite ones)."""
    u = np.asarray(u, float)
    out = np.full(u.shape, math.nan)
    y = np.full(u.shape[1:], math.nan)
    tu, uu = y.copy(), y.copy()
    for i in range(len(u)):
        ui = u[i]
        h = t[i] - tu
        rest = -np.expm1(-np.maximum(h, 0.0) / time_constant)
        with np.errstate(invalid="ignore", divide="ignore"):
            step = (1.0 - rest) * y + rest * ui - (ui - uu) * (time_constant / h * rest - (1.0 - rest))
        step = np.where(h > 0.0, step, y)
        y = np.where(np.isfinite(ui), np.where(np.isfinite(y), step, ui), y)
        out[i] = np.where(np.isfinite(ui), y, math.nan)
        tu = np.where(np.isfinite(ui), t[i], tu)
        uu = np.where(np.isfinite(ui), ui, uu)
    return out


def delayed_commands(t: np.ndarray, commands: np.ndarray, delays: Sequence[float],
                     time_constants: Optional[Sequence[float]] = None) -> np.ndarray:
    """The commands (N, na) given at the times t (N,) as applied at those times by actuators with these delays
    [s] (the first-order hold of the module docstring; `ActuatorDelay`'s rule) and, given, these time constants
    [s] of their lag after the delay."""
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
    for j, time_constant in enumerate(time_constants or ()):
        if time_constant > 0.0:
            out[:, j] = lagged(t, out[:, [j]], time_constant)[:, 0]
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


def command_response(t: np.ndarray, commands: np.ndarray, measured: np.ndarray, rows=None,
                     longest: float = LATENCY_LONGEST, step: float = LATENCY_STEP,
                     longest_lag: float = LAG_LONGEST) -> Tuple[List[float], List[float], List[float]]:
    """Per column of `commands` (N, na) given at the times t: the delay and the lag's time constant after which
    the command (`delayed_commands`) is closest to the `measured` effort (RMS over `rows`, a mask, and the rows
    where both are known; the shortest such on grids of `step` up to `longest` and `longest_lag`), and that RMS
    over the undelayed command's.  `latency_timed` says whether they time the actuator's response (else its
    commands move too slowly to time it).  NaN where a column has no row with both."""
    t = np.asarray(t, float)
    commands, measured = np.atleast_2d(np.asarray(commands, float).T).T, np.atleast_2d(np.asarray(measured, float).T).T
    keep = np.ones(len(t), bool) if rows is None else np.asarray(rows, bool)
    delays = np.round(np.arange(0.0, longest + step / 2, step), 12)     # (whole µs: 0.0065, not 0.0065000…01)
    lags = np.round(np.arange(0.0, longest_lag + step / 2, step), 12)
    out_delay, out_lag, out_ratio = [], [], []
    for j in range(commands.shape[1]):
        held = np.column_stack([delayed_commands(t, commands[:, [j]], [d])[:, 0] for d in delays])
        errors = np.full((len(lags), len(delays)), math.nan)
        for i, lag in enumerate(lags):
            e = measured[:, [j]] - (held if lag == 0.0 else lagged(t, held, lag))
            ok = keep[:, None] & np.isfinite(e)
            n = ok.sum(axis=0)
            sq = (np.where(ok, e, 0.0) ** 2).sum(axis=0)
            errors[i, n > 0] = np.sqrt(sq[n > 0] / n[n > 0])
        if not np.isfinite(errors).any() or not errors[0, 0] > 0:
            out_delay.append(math.nan)
            out_lag.append(math.nan)
            out_ratio.append(math.nan)
            continue
        best_lag, best_delay = np.unravel_index(int(np.nanargmin(errors)), errors.shape)
        out_delay.append(float(delays[best_delay]))
        out_lag.append(float(lags[best_lag]))
        out_ratio.append(float(errors[best_lag, best_delay] / errors[0, 0]))
    return out_delay, out_lag, out_ratio


def response_sigma(t: np.ndarray, applied: np.ndarray, measured: np.ndarray, rows=None,
                   smoothing: float = RESPONSE_SMOOTHING) -> List[float]:
    """Per column, the 1σ of the `measured` effort about the command's modelled response `applied` (N, k; the
    commands through `delayed_commands`) that no reading resolves: the RMS over `rows` (a mask) of their departure
    less its centred running mean over `smoothing` [s] (the slow part, which a fused estimator's disturbance takes
    in from the positions).  NaN where a column has no row with both."""
    t = np.asarray(t, float)
    e = np.atleast_2d(np.asarray(measured, float).T).T - np.atleast_2d(np.asarray(applied, float).T).T
    keep = np.ones(len(t), bool) if rows is None else np.asarray(rows, bool)
    lo = np.searchsorted(t, t - smoothing / 2, side="left")
    hi = np.searchsorted(t, t + smoothing / 2, side="right")
    out = []
    for j in range(e.shape[1]):
        ok = np.isfinite(e[:, j])
        if not (ok & keep).any():
            out.append(math.nan)
            continue
        x = np.where(ok, e[:, j], 0.0)
        s = np.concatenate(([0.0], np.cumsum(x)))
        n = np.concatenate(([0], np.cumsum(ok)))
        mean = (s[hi] - s[lo]) / np.maximum(n[hi] - n[lo], 1)
        fast = (x - mean)[ok & keep]
        out.append(float(np.sqrt(np.mean(fast ** 2))))
    return out


def latency_timed(delay: float, time_constant: float, ratio: float, longest: float = LATENCY_LONGEST,
                  longest_lag: float = LAG_LONGEST) -> bool:
    """Does `command_response`'s (delay, time constant, ratio) time the actuator's response (see there)?  Not at
    either grid's top: slow mismatches, no latency."""
    return bool(ratio < LATENCY_TIMED and delay < longest - 1e-12 and time_constant < longest_lag - 1e-12)


class ActuatorDelay:
    """The commands given to the last steps (their times, ids and efforts) and each step's applied efforts."""

    def __init__(self, delays: Sequence[float], keep: int, time_constants: Optional[Sequence[float]] = None):
        self.delays = np.asarray(delays, float)
        self.time_constants = np.zeros(len(self.delays)) if time_constants is None else np.asarray(time_constants,
                                                                                                   float)
        self.delayed = np.nonzero(self.delays > 0.0)[0]
        self.lagged = np.nonzero(self.time_constants > 0.0)[0]
        self._times: Deque[float] = deque(maxlen=keep)
        self._ids: Deque[int] = deque(maxlen=keep)
        self._given: Deque[np.ndarray] = deque(maxlen=keep)
        # per step, per actuator: when its command was given (`applied`'s given_at; the step's time by default)
        self._given_at: Deque[np.ndarray] = deque(maxlen=keep)
        self._applied: Deque[np.ndarray] = deque(maxlen=keep)
        # per step, per lagged actuator: (time, delayed command, lag output) of the last finite command so far
        self._lag: Deque[np.ndarray] = deque(maxlen=keep)

    def reset(self) -> None:
        for d in (self._times, self._ids, self._given, self._given_at, self._applied, self._lag):
            d.clear()

    def applied(self, t: float, efforts: np.ndarray, given_at: Optional[Sequence[float]] = None) -> np.ndarray:
        """The efforts applied at t, `efforts` being the commands in force at t (a time before the last one given
        starts over: a reset or a clock that jumped back); `given_at`: per actuator the time each was given (the
        node holds a command from the grid step nearest its stamp: up to half a step off, which the motors'
        response shows, `bench/real_hardware_node.py`), non-finite or None: at t.  A delayed actuator's commands
        are interpolated by these times (never earlier than the one before: a held command keeps its time)."""
        if self._times and t < self._times[-1]:
            self.reset()
        before = self._lag[-1] if self._lag else None       # (read before a full deque drops its oldest)
        n = len(self.delays)
        at = np.full(n, float(t)) if given_at is None else np.array(given_at, float).reshape(n)
        at = np.where(np.isfinite(at), at, float(t))
        if self._given_at:
            at = np.maximum(at, self._given_at[-1])
        self._times.append(float(t))
        self._ids.append(-1)
        self._given.append(np.array(efforts, float))
        self._given_at.append(at)
        applied, lag = self._applied_at(len(self._times) - 1, before)
        self._applied.append(applied)
        self._lag.append(lag)
        return applied

    def assign(self, step: int) -> None:
        """The estimator's id of the step the last `applied` was for (-1: none, it waited)."""
        if self._ids:
            self._ids[-1] = int(step)

    def correct(self, corrections: Sequence[tuple]) -> List[Tuple[int, np.ndarray]]:
        """Commands that came late: (step id, the efforts that step should have been given[, per actuator when each
        was given, as `applied`'s given_at; without, or non-finite: the step keeps its command's time]) each.
        Returns (step id, the new applied efforts) of every step whose applied efforts they change (the steps that
        apply them after the delay, and the corrected steps' own undelayed actuators)."""
        index = {step: i for i, step in enumerate(self._ids) if step >= 0}
        first = None
        for step, efforts, *when in corrections:
            i = index.get(int(step))
            if i is not None:
                self._given[i] = np.array(efforts, float)
                if when and when[0] is not None:
                    at = np.array(when[0], float).reshape(len(self.delays))
                    self._given_at[i] = np.where(np.isfinite(at), at, self._given_at[i])
                first = i if first is None else min(first, i)
        if first is None:
            return []
        for i in range(max(first, 1), len(self._times)):     # (a held command keeps its time: never earlier)
            self._given_at[i] = np.maximum(self._given_at[i], self._given_at[i - 1])
        out = []
        for i in range(first, len(self._times)):
            new, self._lag[i] = self._applied_at(i, self._lag[i - 1] if i > 0 else None)
            if not _same(new, self._applied[i]):
                self._applied[i] = new
                if self._ids[i] >= 0:
                    out.append((self._ids[i], new))
        return out

    def _applied_at(self, i: int, before: Optional[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
        """The efforts applied at step i and the lags' state after it, from `before` (the state after step i − 1;
        None: none kept, the lags start there)."""
        out = self._given[i].copy()
        t = self._times[i]
        for j in self.delayed:
            out[j] = _held_between(_Column(self._given_at, j), _Column(self._given, j), t - self.delays[j], i)
        lag = np.full((len(self.lagged), 3), math.nan) if before is None else before.copy()
        for k, j in enumerate(self.lagged):
            u = out[j]
            if not math.isfinite(u):
                continue
            tu, uu, y = lag[k]
            y = u if not math.isfinite(y) else lag_step(y, uu, u, t - tu, self.time_constants[j])
            lag[k] = (t, u, y)
            out[j] = y
        return out, lag


class _Column:
    """Column j of per-step rows (the given efforts, their times), indexed like them (no copy)."""
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
    return _configured(mech, mech.actuator_delays, overrides, "actuator_delays")


def configured_time_constants(mech, overrides: Optional[Dict[str, float]] = None) -> List[float]:
    """Per actuator its lag's time constant [s]: `overrides` (`EstimatorConfig.actuator_time_constants`) over the
    mechanism's `time_constant` keys; ValueError naming an unknown joint."""
    return _configured(mech, mech.actuator_time_constants, overrides, "actuator_time_constants")


def configured_effort_sigmas(mech, overrides: Optional[Dict[str, float]] = None) -> List[float]:
    """Per actuator the 1σ of its applied effort about its response to the command: `overrides`
    (`EstimatorConfig.actuator_effort_sigmas`) over the mechanism's `effort_sigma` keys; ValueError naming an unknown
    joint."""
    return _configured(mech, mech.actuator_effort_sigmas, overrides, "actuator_effort_sigmas")


def _configured(mech, declared, overrides, key: str) -> List[float]:
    overrides = dict(overrides or {})
    unknown = [name for name in overrides if name not in mech.actuator_names]
    if unknown:
        raise ValueError(f"{key}: unknown actuator joint(s) {', '.join(map(repr, unknown))} (known: "
                         f"{', '.join(mech.actuator_names) or 'none'})")
    return [float(overrides.get(name, x)) for name, x in zip(mech.actuator_names, declared)]


def actuator_delay(delays: Sequence[float], dt: float, window: int,
                   time_constants: Optional[Sequence[float]] = None) -> Optional[ActuatorDelay]:
    """The delays' and lags' bookkeeping (None without either: it costs nothing), keeping the commands of as many
    steps as the window and the longest delay span, with room for shorter intervals than dt."""
    delays = [float(d) for d in delays]
    time_constants = [0.0] * len(delays) if time_constants is None else [float(x) for x in time_constants]
    if not any(d > 0.0 for d in delays + time_constants):
        return None
    return ActuatorDelay(delays, keep=2 * (int(window) + math.ceil(max(delays) / dt)) + 16,
                         time_constants=time_constants)
