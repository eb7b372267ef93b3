"""A ROS-free simulated plant: the "real" mechanism that the estimator watches.

`SimulatedPlant` integrates a `Mechanism` with RK4 on `dynamics.forward_dynamics`, projecting the
positions and velocities back onto the constraint manifold after every substep, under a known
effort law `EffortProfile` (PD tracking of sinusoidal joint references plus gravity compensation,
so the crank swings widely but can never run away), sampled and held once per dt like a digital
controller.  The commanded effort reaches the mechanism through an `Actuator` (gain, Coulomb and
viscous friction, bias), by default a realistic mismatch (`Actuator.default_mismatch`: 0.9 × command
minus friction), since no real motor applies exactly what it is told; `Actuator.ideal` applies the
command exactly; an actuator with a `delay` (the mechanism's) acts on the command given that long before, and with
`ripple` one with an `effort_sigma` adds white effort of that σ, held over each step.  Each
step yields a `PlantSample` with the truth (q, q̇, q̈, the commanded efforts
`efforts`, the `applied` efforts, Q) and noisy sensor readings (σ from the mechanism's sensors, seeded
RNG).

`efforts` is what a controller sends and what an estimator is given (the commands); `applied` is what
acts on the mechanism (the truth an effort estimate is scored against); Q is made of `applied`.  The mechanism's
own joint friction (its actuators' friction keys, `model.friction`) is part of its dynamics: `forward_dynamics`
applies it at every RK4 stage at that stage's rates (unlike the `Actuator`'s mismatch, held over the step), and
it is not in `applied` or Q, as an estimator with the same mechanism does not count it in its efforts.

Used by the `four_bar_sim` node, by `bench/make_bags.py`, `bench/estimation_quality.py` and by the tests::

    plant = SimulatedPlant(load_mechanism("four_bar_crank"), dt=1e-3, seed=1)
    traj = plant.simulate(5.0)          # arrays t, q, v, a, efforts (commanded), applied, Q, readings
    exact = SimulatedPlant(mech, actuator=Actuator.ideal(mech))   # applied == commanded
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, Optional, Sequence, Union

import numpy as np

from mbfg_ros import native
from mbfg_ros.blas import limit_blas_threads
from mbfg_ros.dynamics import constrained as dynamics
from mbfg_ros.dynamics import kinematics
from mbfg_ros.model.mechanism import Mechanism
from mbfg_ros.estimation.actuator_delay import actuator_delay


@dataclass
class EffortProfile:
    """Known effort law on the actuated coordinates (actuator order).

    τ(t, q, q̇) = τ_g(q) + kp (r(t) − θ) + kd (ṙ(t) − θ̇) + bias,
    r(t) = θ0 + amplitude · sin(2π f t + phase),

    where θ are the actuated coordinates, θ0 their initial values and τ_g(q) the static
    gravity-compensation effort (inverse dynamics at rest).  Smooth in t, q and q̇, so the applied
    effort at a sample time is exactly the one published for it.
    """
    amplitude: np.ndarray
    frequency: np.ndarray
    phase: np.ndarray
    kp: np.ndarray
    kd: np.ndarray
    bias: np.ndarray
    theta0: np.ndarray
    gravity_compensation: bool = True

    @classmethod
    def default_for(cls, mech: Mechanism, q0=None) -> "EffortProfile":
        k = len(mech.actuated)
        q0 = np.asarray(mech.q0 if q0 is None else q0, dtype=float)
        if k == 1:   # a crank: wide swings (±1.2 rad around the drawn pose at 0.5 Hz)
            amp, freq, phase = np.full(1, 1.2), np.full(1, 0.5), np.zeros(1)
            kp, kd = np.full(1, 120.0), np.full(1, 15.0)
        else:        # a parallel robot: moderate motions that stay far from singular poses
            amp = np.full(k, 0.25)
            freq = 0.4 + 0.15 * np.arange(k)
            phase = np.linspace(0.0, math.pi / 2, k)
            kp, kd = np.full(k, 400.0), np.full(k, 40.0)
        return cls(amplitude=amp, frequency=freq, phase=phase, kp=kp, kd=kd, bias=np.zeros(k),
                   theta0=q0[mech.actuated].copy())

    def reference(self, t: float):
        w = 2.0 * math.pi * self.frequency
        arg = w * t + self.phase
        return self.theta0 + self.amplitude * np.sin(arg), self.amplitude * w * np.cos(arg)

    def __call__(self, mech: Mechanism, t: float, q: np.ndarray, v: np.ndarray) -> np.ndarray:
        r, rd = self.reference(t)
        th, thd = q[mech.actuated], v[mech.actuated]
        tau = self.kp * (r - th) + self.kd * (rd - thd) + self.bias
        if self.gravity_compensation:
            tau = tau + dynamics.inverse_dynamics(mech, q, np.zeros(mech.n), np.zeros(mech.n))
        return tau


@dataclass(frozen=True)
class Actuator:
    """How the commanded efforts become the applied ones, per actuator (actuator order):

        applied = gain · command − coulomb · tanh(rate / coulomb_rate_scale) − viscous · rate + bias,

    `rate` the actuated coordinate's rate.  Units: coulomb and bias in the effort's unit (N·m on an angle,
    N on a length), viscous in effort·s per coordinate unit (N·m·s/rad), coulomb_rate_scale in the
    coordinate's rate unit (rad/s): the smooth tanh keeps the plant's dynamics differentiable (an RK4 step
    across a sign change of a discontinuous friction would be inaccurate)."""
    gain: np.ndarray
    coulomb: np.ndarray
    coulomb_rate_scale: np.ndarray
    viscous: np.ndarray
    bias: np.ndarray

    FIELDS = ("gain", "coulomb", "coulomb_rate_scale", "viscous", "bias")
    #: the default mismatch, every actuator (issue 12's numbers; see `default_mismatch`)
    MISMATCH = {"gain": 0.9, "coulomb": 1.5, "coulomb_rate_scale": 0.05, "viscous": 0.3, "bias": 0.0}
    IDEAL = {"gain": 1.0, "coulomb": 0.0, "coulomb_rate_scale": 0.05, "viscous": 0.0, "bias": 0.0}

    @classmethod
    def from_values(cls, mech: Mechanism, values: Optional[Mapping[str, object]] = None,
                    base: Optional[Mapping[str, float]] = None, label: str = "actuator {}") -> "Actuator":
        """Each field from `values` (a number for every actuator, or one per actuator in actuator order),
        the others from `base` (default: `MISMATCH`).  ValueError naming the field and the actuator for a
        wrong length, a non-finite value, a gain ≤ 0 (a reversed or dead motor is not a mismatch), a
        negative friction or a coulomb_rate_scale ≤ 0; `label` names a field in the messages (e.g.
        "parameter 'actuator.{}'")."""
        k = len(mech.actuated)
        values = dict(values or {})
        base = dict(cls.MISMATCH if base is None else base)
        unknown = sorted(set(values) - set(cls.FIELDS))
        if unknown:
            raise ValueError(f"unknown actuator fields {unknown} (known: {', '.join(cls.FIELDS)})")
        names = list(mech.actuator_names)
        out = {}
        for f in cls.FIELDS:
            raw = values.get(f, base[f])
            try:
                arr = np.array(raw, dtype=float).reshape(-1)
            except (TypeError, ValueError):
                raise ValueError(f"{label.format(f)} must be a number or a list of numbers (got {raw!r})") from None
            if arr.size == 1:
                arr = np.full(k, arr[0])
            if arr.size != k:
                raise ValueError(f"{label.format(f)} must be one number or {k} (one per actuator {names}); "
                                 f"got {arr.size}")
            for name, x in zip(names, arr):
                if not math.isfinite(x):
                    raise ValueError(f"{label.format(f)} of '{name}' must be finite (got {x})")
                if f == "gain" and not x > 0:
                    raise ValueError(f"{label.format(f)} of '{name}' must be > 0 (got {x})")
                if f in ("coulomb", "viscous") and x < 0:
                    raise ValueError(f"{label.format(f)} of '{name}' must be >= 0 (got {x})")
                if f == "coulomb_rate_scale" and not x > 0:
                    raise ValueError(f"{label.format(f)} of '{name}' must be > 0 (got {x})")
            arr.setflags(write=False)
            out[f] = arr
        return cls(**out)

    @classmethod
    def ideal(cls, mech: Mechanism) -> "Actuator":
        """applied = command exactly."""
        return cls.from_values(mech, base=cls.IDEAL)

    @classmethod
    def default_mismatch(cls, mech: Mechanism) -> "Actuator":
        """A realistic motor: 90 % of the command reaches the joint, Coulomb friction 1.5 (N·m) smoothed
        over ±0.05 (rad/s), viscous friction 0.3 (N·m·s/rad), no bias, the same on every actuator.  The
        gain term scales with the effort itself; the friction terms are a few % of the efforts the
        plant's controller uses (RMS ≈ 46 N·m on the crank four-bar, 55 N·m on the slider-crank,
        110–125 N·m on the robot motors)."""
        return cls.from_values(mech, base=cls.MISMATCH)

    @property
    def is_ideal(self) -> bool:
        return bool(np.all(self.gain == 1.0) and not np.any(self.coulomb) and not np.any(self.viscous)
                    and not np.any(self.bias))

    def applied(self, command: np.ndarray, rate: np.ndarray) -> np.ndarray:
        """The applied efforts for `command` at the actuated coordinates' `rate` (actuator order)."""
        rate = np.asarray(rate, dtype=float)
        return (self.gain * np.asarray(command, dtype=float) - self.coulomb * np.tanh(rate / self.coulomb_rate_scale)
                - self.viscous * rate + self.bias)

    def describe(self) -> str:
        if self.is_ideal:
            return "ideal (applied = command)"
        fmt = lambda a: f"{a[0]:g}" if np.all(a == a[0]) else "[" + ", ".join(f"{x:g}" for x in a) + "]"  # noqa: E731
        return (f"applied = {fmt(self.gain)}·command − {fmt(self.coulomb)}·tanh(rate/{fmt(self.coulomb_rate_scale)})"
                f" − {fmt(self.viscous)}·rate + {fmt(self.bias)}")


@dataclass
class PlantSample:
    t: float
    q: np.ndarray
    v: np.ndarray
    a: np.ndarray
    efforts: np.ndarray          # commanded efforts, actuator order (what an estimator is given)
    Q: np.ndarray                # generalized forces of the applied efforts, gravity included
    readings: Dict[str, float]   # noisy sensor readings by sensor name
    applied: np.ndarray          # applied efforts, actuator order (the actuator's output: the truth)


@dataclass
class Trajectory:
    t: np.ndarray
    q: np.ndarray
    v: np.ndarray
    a: np.ndarray
    efforts: np.ndarray                  # commanded efforts (N, actuators)
    Q: np.ndarray
    readings: Dict[str, np.ndarray] = field(default_factory=dict)
    applied: Optional[np.ndarray] = None   # applied efforts (N, actuators); None: the commanded ones

    def __post_init__(self):
        if self.applied is None:
            self.applied = self.efforts

    def __len__(self):
        return len(self.t)

    def head(self, n: int) -> "Trajectory":
        """The first n samples."""
        return Trajectory(self.t[:n], self.q[:n], self.v[:n], self.a[:n], self.efforts[:n], self.Q[:n],
                          {k: v[:n] for k, v in self.readings.items()}, self.applied[:n])


#: an effort law: (mechanism, t, q, q̇) -> commanded efforts (actuator order); `EffortProfile` is one
EffortLaw = Callable[[Mechanism, float, np.ndarray, np.ndarray], np.ndarray]


class SimulatedPlant:
    """RK4 (with projection) at `substeps` per `dt` under an effort law (`EffortProfile` by default, or any
    callable (mech, t, q, q̇) -> commands) whose commands act through `actuator` (default
    `Actuator.default_mismatch`); noisy readings."""

    def __init__(self, mech: Mechanism, dt: float = 1e-3, substeps: int = 2,
                 profile: Optional[Union[EffortProfile, EffortLaw]] = None, seed: int = 0, q0=None, v0=None,
                 noise: bool = True, t0: float = 0.0, sensors: Optional[Sequence[str]] = None,
                 actuator: Optional[Actuator] = None, ripple: bool = False):
        if not (dt > 0 and math.isfinite(dt)):
            raise ValueError(f"dt must be > 0 (got {dt})")
        if int(substeps) < 1:
            raise ValueError(f"substeps must be >= 1 (got {substeps})")
        self.mech = mech
        self.dt = float(dt)
        self.substeps = int(substeps)
        # a few-row solve per substep: OpenBLAS worker threads only cost (docs/decisions.md), as in the estimator
        # (EstimatorConfig.blas_threads)
        limit_blas_threads(1)
        q = kinematics.solve_positions(mech, mech.q0 if q0 is None else q0).q
        v = kinematics.solve_velocities(mech, q, v_guess=np.zeros(mech.n) if v0 is None else v0)
        self.q, self.v = q, v
        self.t0 = self.t = float(t0)
        self.k = 0
        self.profile = profile or EffortProfile.default_for(mech, q)
        self.actuator = Actuator.default_mismatch(mech) if actuator is None else actuator
        if self.actuator.gain.shape != (len(mech.actuated),):
            raise ValueError(f"the actuator model has {self.actuator.gain.size} actuators, {mech.name} has "
                             f"{len(mech.actuated)}")
        self.delay = actuator_delay(mech.actuator_delays, self.dt, 0, mech.actuator_time_constants)
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        # with `ripple`, the actuators' stated ripple (the mechanism's `effort_sigma`): white effort held over each
        # step, from its own stream (the readings' noise stays the seed's whatever the ripple); none in a noise-free
        # simulation
        sigmas = np.asarray(mech.actuator_effort_sigmas, dtype=float)
        self.ripple = sigmas if ripple and noise and sigmas.size and sigmas.any() else None
        self.ripple_rng = np.random.default_rng([seed, 1])
        names = [s.name for s in mech.sensors]
        if sensors is not None:
            unknown = set(sensors) - set(names)
            if unknown:
                raise ValueError(f"unknown sensors {sorted(unknown)} (mechanism has {names})")
        self.sensors = [s for s in mech.sensors if sensors is None or s.name in sensors]
        self._kernel = native.mechanism_kernel(mech)

    # ------------------------------------------------------------------------------------------
    def _accel(self, q, v, Q):
        # the compiled kernel's one LU solve of the augmented system (the estimator's own: 45 % of the plant's CPU
        # in numpy, which a 1-kHz plant beside the estimator could not spare on two cores); numpy where it fails
        # (a singular system at a dead point: its null-space solver)
        if self._kernel is not None:
            a = np.empty(self.mech.n)
            if self._kernel.acceleration(q, v, Q, a):
                return a
        return dynamics.forward_dynamics(self.mech, q, v, Q)

    def _project(self, q, v):
        q = kinematics.solve_positions(self.mech, q, tol=1e-13).q
        v = kinematics.solve_velocities(self.mech, q, v_guess=v)
        return q, v

    def measure(self, q, v) -> Dict[str, float]:
        out = {}
        for s in self.sensors:
            if s.kind == "encoder":
                val = float(q[s.coordinate])
            elif s.kind == "gyroscope":
                val = self.mech.body_angular_rate(s.body, q, v)
            else:  # pragma: no cover - model only defines these two kinds
                continue
            if self.noise:
                val += float(self.rng.normal(0.0, s.sigma))
            out[s.name] = val
        return out

    def step(self) -> PlantSample:
        """The truth and readings at the current time, then integrate one dt.

        The effort law is sampled at t_k and held over [t_k, t_k+1) (a digital controller's zero-order
        hold), and so is the actuator's output at t_k (its friction at the rate of t_k: a model of the
        torque a current loop holds over the sample), so the published applied effort is exactly the one
        that acted over the step and q̈_k = f(q_k, q̇_k, τ_applied,k)."""
        q, v, t = self.q, self.v, self.t
        command = np.asarray(self.profile(self.mech, t, q, v), dtype=float)
        # (an actuator with a `delay` acts on the command given that long before: estimation/actuator_delay.py)
        given = command if self.delay is None else self.delay.applied(t, command)
        applied = self.actuator.applied(given, v[self.mech.actuated])
        if self.ripple is not None:
            applied = applied + self.ripple_rng.normal(0.0, self.ripple)
        Q = self.mech.generalized_forces(applied)
        a = self._accel(q, v, Q)
        sample = PlantSample(t, q.copy(), v.copy(), a, command, Q, self.measure(q, v), applied)
        h = self.dt / self.substeps
        a1 = a
        for i in range(self.substeps):
            if i:
                a1 = self._accel(q, v, Q)
            q2, v2 = q + 0.5 * h * v, v + 0.5 * h * a1
            a2 = self._accel(q2, v2, Q)
            q3, v3 = q + 0.5 * h * v2, v + 0.5 * h * a2
            a3 = self._accel(q3, v3, Q)
            q4, v4 = q + h * v3, v + h * a3
            a4 = self._accel(q4, v4, Q)
            q = q + h / 6.0 * (v + 2 * v2 + 2 * v3 + v4)
            v = v + h / 6.0 * (a1 + 2 * a2 + 2 * a3 + a4)
            q, v = self._project(q, v)
        self.k += 1
        self.q, self.v = q, v
        self.t = self.t0 + self.k * self.dt   # no accumulated round-off in the time grid
        return sample

    def simulate(self, duration: float) -> Trajectory:
        """Samples at t0, t0+dt, ... for `duration` seconds (inclusive of both ends)."""
        n = int(round(duration / self.dt)) + 1
        samples = [self.step() for _ in range(n)]
        return stack(samples)


def stack(samples: Sequence[PlantSample]) -> Trajectory:
    names = list(samples[0].readings) if samples else []
    return Trajectory(
        t=np.array([s.t for s in samples]),
        q=np.array([s.q for s in samples]),
        v=np.array([s.v for s in samples]),
        a=np.array([s.a for s in samples]),
        efforts=np.array([s.efforts for s in samples]),
        Q=np.array([s.Q for s in samples]),
        readings={nm: np.array([s.readings[nm] for s in samples]) for nm in names},
        applied=np.array([s.applied for s in samples]),
    )
