"""How well each encoder reading's time is known: after an overrun of the loop that logs it, its stamp may be
late by the overrun.

A reading is stamped when the loop that logs it gets to it; after an overrun (the loop held up by the operating
system, a bus, a logger) the stamp can be late by the overrun while the reading was taken on schedule.  On the
DFKI acrobot run (bench/real_hardware.py) the readings after its 2.5–2.7× intervals are, joint by joint, either
on time or late by about the interval's excess over the usual one (3–4 ms): at 20 rad/s a reading 60–80 mrad
behind the motion at its stamp.  Believed at its σ, such a reading drags the estimate back and its velocity
down, and the estimate is off the next, on-time, readings for several steps (most of the run's lost-track
steps).  A reading taken δ before its stamp lags the motion by |q̇|·δ, so after an overrun (an interval over
`OVERRUN` usual ones) a reading that lags the prediction along the motion significantly, by no more than the
whole interval explains, is weighed with σ² + (|q̇|·e)², e the interval's excess over the usual one as 1σ of δ,
q̇ the prediction's (`late_spread`): at speed the estimate then follows the model over the late reading, at rest
the reading keeps its σ.  A reading near the prediction keeps its σ (where stamps are true nothing is lost:
bench/jittered_stamps.py unchanged); one ahead of the prediction, or farther behind it, is not explained by a
late stamp (the estimate is off: after an outage, a drift) and keeps its σ to pull the estimate back.  (Rather than
estimating each reading's time, which would put the estimate at a stamp wherever the reading says: the
estimate is of the stamp's time.)

The usual interval is the median of the sensor's `INTERVALS` newest intervals (a sensor slower than the
estimator's dt is not late: its usual interval is its own), used after `MIN_INTERVALS` of them.  An overrun is
an interval with no estimator step in between (the loop did not run: `mbfg estimate`, a step per reading), or
with steps in between but no reading of any sensor at them and no longer than `BRIDGED` usual intervals (the
node's own grid steps on through the logger's overrun: the same readings, the same stamps); after steps without
the sensor's reading while others read, or longer (an outage), the reading is on time and the prediction is the
suspect.  The readings'
σ fitted online (`sigma_adaptation`) still sees the late readings' scatter: left out, the fit drops to the
scatter over 16-ms blocks and the acrobot's effort fit suffers (docs/decisions.md).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Dict, Iterable

__all__ = ["ReadingTiming", "late_spread", "INTERVALS", "MIN_INTERVALS", "OVERRUN", "BRIDGED", "LATE_SIGMAS"]

INTERVALS = 64         # the usual interval of a sensor: the median of its newest intervals ...
MIN_INTERVALS = 8      # ... once it has this many
OVERRUN = 1.5          # an interval longer than this many usual ones is an overrun (a gap the stepper bridges by
                       # sub-steps: `Stepper.substeps`); a shorter one is the loop's ordinary jitter
BRIDGED = 4.0          # an interval with estimator steps in between but no reading at them is an overrun up to
                       # this many usual ones (the DFKI acrobot's logger overruns by 2.5–3.2×), beyond an outage
LATE_SIGMAS = 3.0      # a reading lagging the prediction by more than this many of its σ, and by no more than the
                       # interval's reach and as many σ, is late


class _Sensor:
    __slots__ = ("last", "recent", "ordered")

    def __init__(self):
        self.last = None                 # the time of its last reading
        self.recent: deque = deque()     # its newest intervals, in their order ...
        self.ordered: list = []          # ... and sorted


class ReadingTiming:
    """See the module docstring.  ``observe(t, readings)`` at each estimator step with its readings (name → value)
    sets ``excess``: the readings of this step whose interval is an overrun of their sensor's usual one, name →
    (the excess over the usual interval, the interval) [s].  Only an interval without steps in between, or whose
    steps in between had no reading at all and that is at most `BRIDGED` usual ones, is an overrun: steps without a
    sensor's reading while others read, or a longer silence, are its outage (its next reading is on time, and the
    prediction ran on the model alone: `InnovationGate`)."""

    def __init__(self, names: Iterable[str]):
        self.sensors: Dict[str, _Sensor] = {name: _Sensor() for name in names}
        self.excess: Dict[str, tuple] = {}
        self.step_time = None            # the time of the previous step ...
        self.read_time = None            # ... and of the previous step with a reading of any of the sensors

    def reset(self):
        for s in self.sensors.values():
            s.last = None
            s.recent.clear()
            s.ordered.clear()
        self.excess = {}
        self.step_time = None
        self.read_time = None

    def observe(self, t: float, readings: Dict[str, float]):
        excess = {}
        previous, self.step_time = self.step_time, t
        silent_since = self.read_time
        if any(name in readings for name in self.sensors):
            self.read_time = t
        for name, s in self.sensors.items():
            if name not in readings:
                continue
            last, s.last = s.last, t
            if last is None:
                continue
            h = t - last
            if not h > 0.0:
                if h < 0.0:                      # time went back: the intervals before say nothing
                    s.recent.clear()
                    s.ordered.clear()
                continue
            n = len(s.ordered)
            if n >= MIN_INTERVALS and (last == previous or last == silent_since):
                usual = s.ordered[n // 2] if n % 2 else 0.5 * (s.ordered[n // 2 - 1] + s.ordered[n // 2])
                if h > OVERRUN * usual and (last == previous or h <= BRIDGED * usual):
                    excess[name] = (h - usual, h)
            s.recent.append(h)
            bisect.insort(s.ordered, h)
            if len(s.recent) > INTERVALS:
                del s.ordered[bisect.bisect_left(s.ordered, s.recent.popleft())]
        self.excess = excess


def late_spread(lag: float, speed: float, excess: float, interval: float, sigma: float) -> float:
    """The 1σ a late stamp adds to a reading of a coordinate moving at `speed` (the prediction's) whose `interval`
    since its sensor's previous reading exceeds the usual one by `excess` seconds, or 0 where a late stamp does not
    explain the reading: a reading taken δ before its stamp, and after the previous reading (δ < interval), lags
    the prediction along the motion by `lag` = −sign(q̇)·(reading − prediction) = |q̇|·δ.  Within `LATE_SIGMAS`
    of the reading's σ of the prediction it is on time as far as it can tell (where stamps are true, an overrun's
    reading keeps its weight); ahead of the prediction, or lagging more than |q̇|·interval (to within as much),
    it is not late: the estimate is off (after an outage, a drift) and the reading keeps its σ to pull it back."""
    if speed < 0.0:
        lag = -lag
    speed = math.fabs(speed)
    return speed * excess if LATE_SIGMAS * sigma < lag <= speed * interval + LATE_SIGMAS * sigma else 0.0
