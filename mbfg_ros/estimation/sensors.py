"""The readings: one sensor unit per sensor of the mechanism and per generic observation name, and the
innovation gate that judges on-time and late readings alike.

Readings are a dict name → value: a sensor's name (encoder, gyroscope) or a generic ``'q:<coordinate>'``,
``'v:<coordinate>'``, ``'a:<coordinate>'`` (sigma from ``sensor_sigmas`` or ``observed_coordinate``).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import numpy as np

import mbfg_ros.factors as F
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.deflection import EncoderDeflection
from mbfg_ros.estimation.reading_timing import ReadingTiming
from mbfg_ros.factors.priors import wrapped_angle
from mbfg_ros.graph.step_model import StepValues
from mbfg_ros.model.mechanism import Mechanism
from mbfg_ros.model.plausibility import mechanism_reach

__all__ = ["Sensors", "InnovationGate", "TrackMonitor", "ReadingsDisagree", "observations_in", "UNCONFIRMED_REJECTIONS",
           "LOST_TRACK_SCALE"]

_max = np.maximum.reduce
UNCONFIRMED_REJECTIONS = 2  # readings of a sensor not yet confirmed after a guessed seed: believed at the third
#: an estimate nearer its encoder's reading than this share of the mechanism's scale (1 rad on an angle, the reach on
#: a length) follows it, whatever the sensor's σ (a very precise encoder and a slightly wrong model)
LOST_TRACK_SCALE = 1e-3


class ReadingsDisagree(Exception):
    """The estimate stopped following its readings (they kept disagreeing with the prediction, or the
    estimate stayed far from them): re-initialize from them.  `turns`: a multi-turn encoder read whole turns
    from the prediction (see `stepping`); else the estimate lost track (`Estimate.recovery` "lost_track")."""

    def __init__(self, message: str, turns: bool = False):
        super().__init__(message)
        self.turns = turns


def observations_in(observations) -> Dict[str, float]:
    """The finite readings of an observations argument (None, NaN and non-numbers dropped)."""
    out = {}
    if observations:
        for name, val in observations.items():
            if type(val) is not float:      # (the usual float needs no conversion)
                try:
                    val = float(val)
                except (TypeError, ValueError):
                    continue
            if math.isfinite(val):
                out[name if type(name) is str else str(name)] = val
    return out


class Sensors:
    """The sensor units of one estimator (persistent: a step sets their readings)."""

    def __init__(self, mech: Mechanism, config: EstimatorConfig, sigmas: dict,
                 deflection: Optional[EncoderDeflection] = None):
        self.mech = mech
        self.config = config
        self.sigmas = sigmas
        self.deflection = deflection
        self.active = config.mode != "forward_dynamics"     # the digital twin ignores readings
        self.units: Dict[str, F.Factor] = {}
        for s in mech.sensors:
            sigma = float(config.sensor_sigmas.get(s.name, s.sigma))
            if s.kind == "encoder":
                self.units[s.name] = self._encoder(s.name, s.coordinate, sigma)
            else:
                self.units[s.name] = F.Gyroscope(mech, s.body, 0.0, sigma)
        self._order = list(self.units)
        # how well each encoder reading's time is known (`timed_unit`)
        self.timing = ReadingTiming([name for name, u in self.units.items() if isinstance(u, F.Encoder)])
        self._timed: Dict[tuple, F.Encoder] = {}
        self._generic: Dict[str, F.ObservedCoordinate] = {}
        # coordinates read by single-turn encoders (mechanism YAML `turns: single`): their readings' turns say
        # nothing, a seed puts them on the guess's turn
        self.single_turn_coordinates = frozenset(s.coordinate for s in mech.sensors
                                                 if s.kind == "encoder" and s.single_turn)

    def set_sigma(self, name: str, sigma: float):
        """A new σ of the named sensor for the readings from now on: a new unit (the step models, Python and
        compiled, hold their units' σ; the steps in the window keep the units they were made with)."""
        old = self.units[name]
        self._timed = {key: u for key, u in self._timed.items() if key[0] != name}
        if isinstance(old, F.Encoder):
            self.units[name] = self._encoder(name, old.coordinate, float(sigma))
        else:
            self.units[name] = F.Gyroscope(self.mech, old.body, 0.0, float(sigma))

    def _encoder(self, name: str, coordinate: int, sigma: float) -> F.Encoder:
        """The unit of a named encoder of σ (through its deflection where the state has one)."""
        j = None if self.deflection is None else self.deflection.index[name]
        return F.Encoder(self.mech, coordinate, 0.0, sigma, deflection=j)

    def sigma(self, name: str) -> float:
        """The σ in use of a named sensor."""
        return float(self.units[name].sigmas[0])

    def unit(self, name: str) -> Optional[F.Factor]:
        """The unit of a reading name (None: unknown)."""
        return self.units.get(name) or self.generic(name)

    def generic(self, name: str) -> Optional[F.ObservedCoordinate]:
        """The unit of a generic ``'q:' | 'v:' | 'a:' <coordinate>`` name (None: not one)."""
        u = self._generic.get(name)
        if u is None and ":" in name:
            kind, coord = name.split(":", 1)
            order = {"q": 0, "v": 1, "a": 2}.get(kind.strip())
            if order is None or coord.strip() not in self.mech.coordinate_names:
                return None
            sigma = float(self.config.sensor_sigmas.get(name, self.sigmas["observed_coordinate"]))
            u = self._generic[name] = F.ObservedCoordinate(
                self.mech, self.mech.coordinate_index(coord.strip()), order, 0.0, sigma)
        return u

    def timed_unit(self, name: str, spread: float) -> F.Factor:
        """The named encoder's unit for a reading whose time is uncertain by `spread` of its coordinate
        (`reading_timing`): σ² + spread², rounded up to a quarter octave of σ (a step model per unit: a few)."""
        u = self.units[name]
        sigma = float(u.sigmas[0])
        level = math.ceil(2.0 * math.log2(1.0 + (spread / sigma) ** 2)) if spread > 0.0 else 0
        if level <= 0:
            return u
        timed = self._timed.get((name, level))
        if timed is None:
            timed = self._timed[(name, level)] = self._encoder(name, u.coordinate, sigma * 2.0 ** (level / 4))
        return timed

    def step_units(self, obs: Dict[str, float], values: StepValues, spreads: Optional[Dict[str, float]] = None) -> list:
        """The units of this step's readings (named sensors in the mechanism's order, then generic names
        sorted); their readings go to `values`, the step's per-step values.  `spreads`: encoders whose reading's
        time is uncertain, name → the 1σ that adds to the reading (`timed_unit`)."""
        if not self.active or not obs:
            return []
        units = []
        for name in self._order:
            val = obs.get(name)
            if val is not None:
                u = self.units[name] if not spreads or name not in spreads else self.timed_unit(name, spreads[name])
                values[u] = {"value": val}
                units.append(u)
        if len(units) == len(obs):          # only named sensors
            return units
        for name in sorted(obs):
            if name in self.units:
                continue
            u = self.generic(name)
            if u is not None:
                values[u] = {"value": obs[name]}
                units.append(u)
        return units

    def unknown(self, obs) -> List[str]:
        return [k for k in obs if k not in self.units and self.generic(k) is None]

    def observed(self, obs) -> bool:
        """Are there readings the estimator uses in obs?"""
        return self.active and any(n in self.units or self.generic(n) is not None for n in obs)

    def silent(self, obs) -> set:
        """The names of the sensors without a reading in obs."""
        return {u.name for name, u in self.units.items() if name not in obs}

    def read_coordinates(self, obs) -> List[Tuple[int, float]]:
        """(coordinate, value) of the encoder / 'q:' readings in obs."""
        out = []
        for name, val in obs.items():
            u = self.units.get(name)
            if isinstance(u, F.Encoder):
                out.append((u.coordinate, val))
            elif name.startswith("q:"):
                g = self.generic(name)
                if g is not None:
                    out.append((g.coordinate, val))
        return out

    def read_coordinate_indices(self, obs) -> List[int]:
        """The coordinates the encoder / 'q:' readings in obs observe (sorted, once each)."""
        return sorted({c for c, _ in self.read_coordinates(obs)})

    def read_velocities(self, obs) -> List[Tuple[int, float]]:
        """(coordinate, value) of the 'v:' readings in obs."""
        out = []
        for name, val in obs.items():
            if name.startswith("v:"):
                g = self.generic(name)
                if g is not None:
                    out.append((g.coordinate, val))
        return out


class InnovationGate:
    """Drops readings whose whitened residual at the prediction exceeds ``outlier_gate`` (a sensor glitch
    would otherwise be traded against the constraints, which have comparable sigmas); after
    ``max_rejections`` consecutive rejections of a sensor it is believed again (the prediction is the
    likelier culprit, e.g. after an outage): `screen` then raises `ReadingsDisagree` so that the window is
    re-initialized from the readings (the position problem with the encoder coordinates fixed) instead of
    adding a factor whose innovation no linearization could absorb.  After an outage of a sensor longer
    than ``outage_steps`` the prediction has run on the model alone, so a reading outside the gate
    re-initializes at once rather than being rejected ``max_rejections`` times.  A sensor that the
    window's seed had no reading of, when that seed was a guess (start-up, a skip or a disagreement), is
    believed after UNCONFIRMED_REJECTIONS rejections until one of its readings is accepted: the guess is
    then the likelier culprit, and one glitch is still not believed.

    Late readings (`screen_late`) go through the same gate and bookkeeping: a sensor read late is not
    silent, and refusals count towards ``max_rejections``, but they never re-initialize by themselves."""

    def __init__(self, config: EstimatorConfig, deflection=None):
        self.gate = config.outlier_gate
        self.enabled = bool(self.gate)           # 0: off
        # an encoder read through the deflection (`estimation.deflection`): its residual at the prediction has
        # the deflection's σ_b beside its own σ (with the encoder's σ alone, 100σ was 5.5 mrad against a fitted
        # σ_b of ~1 mrad on the DFKI motors)
        self.deflection = deflection
        self.max_rejections = config.max_rejections
        self.outage_steps = config.outage_steps
        self.reset()

    def reset(self):
        self.rejections: Dict[str, int] = {}     # consecutive rejections per sensor
        self.rejected: List[str] = []            # this step's rejections, for the message
        self.seen: Dict[str, int] = {}           # step of each sensor's last reading (accepted or not)
        self.unconfirmed: set = set()            # sensors the seed (a guess) had no reading of, none accepted yet

    def restart(self, unconfirmed: set):
        """A new window (step 0 = its seed); `unconfirmed`: see the class docstring."""
        self.seen = {}
        self.unconfirmed = unconfirmed

    def screen(self, units: list, whitened, k: int) -> list:
        """The units of step k's readings that pass (`whitened(unit)`: its rows of the whitened residual at
        the prediction)."""
        gate = self.gate
        rejections, seen, unconfirmed = self.rejections, self.seen, self.unconfirmed
        kept = []
        for u in units:
            name = u.name
            w = whitened(u)
            m = abs(w.item()) if w.size == 1 else float(_max(np.abs(w)))      # (one row: a plain float)
            m *= self._through_deflection(u)
            since = k - seen.get(name, k)
            seen[name] = k
            if m > gate:
                if since > self.outage_steps:
                    rejections.clear()
                    raise ReadingsDisagree(f"{name} disagreed with the prediction by {m:.3g} σ "
                                           f"({m * float(u.sigmas[0]) / self._through_deflection(u):.3g}) after "
                                           f"{since} steps without a reading")
                limit = self.max_rejections
                if name in unconfirmed:
                    limit = min(limit, UNCONFIRMED_REJECTIONS)
                if rejections.get(name, 0) >= limit:
                    rejections.clear()
                    raise ReadingsDisagree(f"{name} disagreed with the prediction by {m:.3g} σ "
                                           f"({m * float(u.sigmas[0]) / self._through_deflection(u):.3g}) for "
                                           f"{limit + 1} steps"
                                           + (" (the start was a guess)" if name in unconfirmed else ""))
                rejections[name] = rejections.get(name, 0) + 1
                self.rejected.append(f"{name} ({m:.3g} σ)")
                continue
            rejections.pop(name, None)
            unconfirmed.discard(name)
            kept.append(u)
        return kept

    def _through_deflection(self, u) -> float:
        """σ / √(σ² + σ_b²) for an encoder read through the deflection (its whitened residual to the gate's
        scale), else 1."""
        if self.deflection is None or getattr(u, "deflection", None) is None:
            return 1.0
        sigma = float(u.sigmas[0])
        return sigma / math.sqrt(sigma * sigma + self.deflection.sigma ** 2)

    def screen_late(self, units: list, whitened: np.ndarray, j: int) -> List[bool]:
        """Which of the late readings of step j pass (`whitened`: their stacked whitened residual rows at
        the estimate of step j, in the order of `units`)."""
        gate, rejections, seen = self.gate, self.rejections, self.seen
        passed, row = [], 0
        for u in units:
            block = whitened[row:row + u.dim]
            row += u.dim
            if gate and float(_max(np.abs(block))) * self._through_deflection(u) > gate:
                rejections[u.name] = rejections.get(u.name, 0) + 1
                passed.append(False)
            else:
                rejections.pop(u.name, None)
                seen[u.name] = max(seen.get(u.name, j), j)
                passed.append(True)
        return passed

    def take_rejected(self) -> List[str]:
        """This step's rejections (for the step's message), then forget them."""
        out, self.rejected = self.rejected, []
        return out


class TrackMonitor:
    """Says when the estimate stopped following its encoders although their readings passed the gate: after a
    step, an encoder whose reading is farther from the new estimate of its coordinate than both
    ``lost_track_sigmas`` of its σ in use (fitted online: `sigma_adaptation`) and `LOST_TRACK_SCALE` of the
    mechanism's scale, for more than ``max_rejections`` of its readings in a row, raises `ReadingsDisagree`:
    the facade re-initializes from the readings (`Estimate.recovery` "lost_track").  A tracking estimate sits
    within a few σ of its readings (it weighs them with their σ against the model's densities); one that many σ
    off for several steps in a row is held there by a prediction the readings no longer move.  (Readings
    outside the gate are the gate's: it re-initializes after the same number of rejections.)  The distance
    of an angle is taken modulo a turn (whole turns: `stepping.Stepper._check_turns`)."""

    def __init__(self, mech: Mechanism, config: EstimatorConfig, sensors: Sensors,
                 deflection_start: Optional[int] = None):
        # (an encoder read through a deflection is compared with its coordinate plus its deflection:
        # `deflection_start` is the deflection block's first column in the state)
        self.mech, self.sensors = mech, sensors
        self.deflection_start = deflection_start
        self.sigmas = float(config.lost_track_sigmas)
        self.enabled = self.sigmas > 0 and sensors.active
        self.limit = int(config.max_rejections)
        self.reach = float(mechanism_reach(mech.spec))
        self.far: Dict[str, int] = {}
        self.worst: Dict[str, float] = {}
        self.refresh()

    def refresh(self):
        """The encoders' thresholds from the σ now in use (after `Sensors.set_sigma`)."""
        self.encoders = []
        for name, u in self.sensors.units.items():
            if isinstance(u, F.Encoder):
                scale = 1.0 if u.angle else self.reach
                offset = None if u.deflection is None else self.deflection_start + u.deflection
                self.encoders.append((name, u.coordinate, offset, u.angle,
                                      max(self.sigmas * float(u.sigmas[0]), LOST_TRACK_SCALE * scale),
                                      float(u.sigmas[0]), u.name))

    def restart(self):
        self.far = {}

    def check(self, obs: Dict[str, float], x: np.ndarray):
        """After a step whose readings are `obs` and new estimate x: raise `ReadingsDisagree` when an encoder's
        reading has been too far from the estimate for too long (see the class docstring)."""
        far = self.far
        for name, c, offset, angle, threshold, sigma, unit_name in self.encoders:
            y = obs.get(name)
            if y is None:
                continue
            d = y - x.item(c) - (0.0 if offset is None else x.item(offset))
            if angle:
                d = wrapped_angle(d)
            d = abs(d)
            if d > threshold:
                n = far[name] = far.get(name, 0) + 1
                if n > self.limit:
                    far.clear()
                    raise ReadingsDisagree(f"{unit_name}'s reading stayed {d:.3g} ({d / sigma:.3g} σ) from the estimate "
                                           f"for {n} steps (more than {threshold:.3g})")
            elif name in far:
                del far[name]
