"""Online fit of each encoder's σ from its readings (`EstimatorConfig.adapt_sensor_sigmas`).

A mechanism file states an encoder's σ, often its quantization (step/√12); real readings scatter more
(vibration, backlash, the logger's time stamps: on the DFKI double pendulum 0.2–2 mrad about any smooth motion
against a stated 0.055 mrad), and an estimator that believes the stated σ fights its own readings until it
loses them.  The stated σ is a floor, not the truth: the fit never goes below it.

What the readings determine about σ is their scatter about the motion at the readings' own rate: over a few
steps any motion the model can follow is a low-order polynomial in time, while the unknown efforts' random
walk (`density_adaptation`) moves a reading by far less than σ per step (double pendulum at 2 ms: 0.02 mrad)
and by far more over the effort bank's 20-ms step, where σ is invisible in the innovations.  So each
encoder's readings are cut into blocks of `BLOCK` consecutive readings, a cubic in time (the readings' real
time stamps) is fitted to each block by least squares, and the residual sum of squares over its
`BLOCK − 4` degrees of freedom is one sample of σ² (σ²·χ²_4 / 4 for white scatter of σ).  The estimate is
the `QUANTILE` (90 %) quantile of the newest `MEMORY_BLOCKS` samples over that of σ²·χ²_4 / 4: consistent for
white scatter, not moved by an isolated glitch or jump (a block in ten may hold one), but following scatter
that recurs (on real hardware it is heavy-tailed, e.g. readings stamped late by a few ms during a fast swing:
a median would hide what the estimator must absorb, a mean would take a jump for scatter).  It is used after
`MIN_BLOCKS` blocks, and only where it exceeds the stated σ significantly (white scatter of the stated σ gives
a larger estimate with probability about `SIGNIFICANCE`: readings exact to their quantization keep the stated
σ), else the stated σ.  It depends on the readings alone, never on the estimate: an estimate that lost its
readings does not inflate the σ it is judged by (`sensors.TrackMonitor`).  A block longer than
`MAX_BLOCK_SPAN` s (a slow or silent sensor) is dropped: the motion need not be a cubic over it.  Angle
readings are unwrapped within a block.  Cost: one 8 × 8 product per block of each encoder.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Dict, Iterable, Tuple

import numpy as np

from mbfg_ros.estimation.density_adaptation import chi_square_quantile
from mbfg_ros.factors.priors import wrapped_angle

__all__ = ["SensorSigmaAdaptation", "BLOCK", "DEGREE", "MIN_BLOCKS", "SIGNIFICANCE", "MEMORY_BLOCKS", "QUANTILE", "MAX_BLOCK_SPAN", "CHANGE"]

BLOCK = 8              # readings per block
DEGREE = 3             # the polynomial fitted to a block (a cubic: 4 degrees of freedom left of 8)
MIN_BLOCKS = 16        # blocks before the estimate is used ...
SIGNIFICANCE = 1e-3    # ... and only where the readings scatter more than the stated σ at this level (else the floor)
MEMORY_BLOCKS = 64     # the estimate is from this many newest blocks: ...
QUANTILE = 0.9         # ... their 90 % quantile (of σ² samples, over the same quantile of σ²·χ²_4 / 4)
MAX_BLOCK_SPAN = 0.1   # [s] a block spanning longer is not used
CHANGE = 0.1           # [decades] a smaller change of an encoder's σ is not passed on (~26 %): a change rebuilds the
                       # step models
_TIME_KEY = 1e-7       # [s] block time offsets rounded to this for the cache of residual projections


class _Encoder:
    __slots__ = ("name", "angle", "floor", "t", "y", "samples", "ordered", "sigma", "passed")

    def __init__(self, name: str, angle: bool, floor: float):
        self.name, self.angle, self.floor = name, angle, float(floor)
        self.t: list = []
        self.y: list = []
        self.samples: deque = deque()    # σ² samples of the newest blocks, in their order ...
        self.ordered: list = []          # ... and sorted
        self.sigma = self.floor          # the current estimate (the floor until MIN_BLOCKS)
        self.passed = self.floor         # the σ last passed on to the estimator


class SensorSigmaAdaptation:
    """See the module docstring.  ``SensorSigmaAdaptation(encoders)``: (name, reads an angle, stated σ) per
    encoder.  ``observe(t, readings)`` with each step's readings (name → value) returns the encoders whose σ
    moved by at least `CHANGE` decades since last passed on, with their new σ; ``sigmas`` is the current
    estimate of each."""

    def __init__(self, encoders: Iterable[Tuple[str, bool, float]]):
        self.encoders: Dict[str, _Encoder] = {}
        for name, angle, floor in encoders:
            if not (floor > 0 and math.isfinite(floor)):
                raise ValueError(f"sensor '{name}': the stated σ must be positive and finite (got {floor})")
            self.encoders[name] = _Encoder(name, bool(angle), float(floor))
        nu = BLOCK - DEGREE - 1
        c = chi_square_quantile(1.0 - QUANTILE, nu)
        self._quantile_ratio = x = c / nu                            # the QUANTILE of χ²_ν / ν
        # the sample quantile's relative spread √(p(1 − p)) / (f(x) x) per √blocks (f: the density of χ²_ν / ν at x)
        density = nu * c ** (nu / 2 - 1) * math.exp(-c / 2) / (2 ** (nu / 2) * math.gamma(nu / 2))
        self._spread = math.sqrt(QUANTILE * (1.0 - QUANTILE)) / (density * x)
        self._z = math.sqrt(chi_square_quantile(2.0 * SIGNIFICANCE, 1))   # one-sided normal quantile
        self._projections: Dict[tuple, np.ndarray] = {}
        self.blocks = 0                  # blocks used so far (diagnostics, tests)
        self.dropped = 0                 # blocks dropped for spanning too long

    @property
    def sigmas(self) -> Dict[str, float]:
        return {name: e.sigma for name, e in self.encoders.items()}

    def observe(self, t: float, readings: Dict[str, float]) -> Dict[str, float]:
        changed: Dict[str, float] = {}
        for name, e in self.encoders.items():
            y = readings.get(name)
            if y is None:
                continue
            if e.t and not (0.0 < t - e.t[-1] <= MAX_BLOCK_SPAN):
                e.t.clear()               # time went back or the sensor was silent: the block starts again
                e.y.clear()
            e.t.append(t)
            e.y.append(y)
            if len(e.t) == BLOCK:
                if self._add_block(e):
                    changed[name] = e.sigma
                e.t.clear()
                e.y.clear()
        return changed

    def _add_block(self, e: _Encoder) -> bool:
        t0 = e.t[0]
        if e.t[-1] - t0 > MAX_BLOCK_SPAN:
            self.dropped += 1
            return False
        ys = e.y
        y0 = ys[0]
        if e.angle:
            # (plain floats: a block is a handful of readings) unwrapped: each step's change within half a turn
            rel, prev, acc = [0.0], y0, 0.0
            for v in ys[1:]:
                d = v - prev
                acc += wrapped_angle(d)
                rel.append(acc)
                prev = v
        else:
            rel = [v - y0 for v in ys]
        r = self._projection(e.t) @ np.array(rel)
        sample = float(r @ r) / (BLOCK - DEGREE - 1)
        samples, ordered = e.samples, e.ordered
        samples.append(sample)
        bisect.insort(ordered, sample)
        if len(samples) > MEMORY_BLOCKS:
            del ordered[bisect.bisect_left(ordered, samples.popleft())]
        self.blocks += 1
        n = len(ordered)
        if n < MIN_BLOCKS:
            return False
        h = (n - 1) * QUANTILE                 # (numpy's default, linear, quantile of the sorted samples)
        i = int(h)
        quantile = ordered[i] + (h - i) * (ordered[i + 1] - ordered[i]) if i + 1 < n else ordered[i]
        variance = quantile / self._quantile_ratio
        e.sigma = math.sqrt(variance) if variance > e.floor ** 2 * self._bound(n) else e.floor
        if abs(math.log10(e.sigma / e.passed)) >= CHANGE:
            e.passed = e.sigma
            return True
        return False

    def _bound(self, blocks: int) -> float:
        """The estimate of σ² over σ² that white scatter of σ exceeds with probability about SIGNIFICANCE (the
        sample quantile of `blocks` samples, normal to first order)."""
        return 1.0 + self._z * self._spread / math.sqrt(blocks)

    def _projection(self, times: list) -> np.ndarray:
        """I − V V⁺ of the block's cubic in time (its residual maker), cached by the block's time offsets."""
        t0 = times[0]
        key = tuple(int(round((s - t0) / _TIME_KEY)) for s in times)
        M = self._projections.get(key)
        if M is None:
            s = np.array(key, dtype=float) * _TIME_KEY
            span = s[-1] if s[-1] > 0 else 1.0
            V = np.vander(2.0 * s / span - 1.0, DEGREE + 1, increasing=True)     # on [−1, 1]: well conditioned
            Q, _ = np.linalg.qr(V)
            M = np.eye(len(s)) - Q @ Q.T
            if len(self._projections) > 64:
                self._projections.clear()
            self._projections[key] = M
        return M

