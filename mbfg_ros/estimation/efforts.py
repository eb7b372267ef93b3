"""How the actuator efforts enter the estimator: one strategy per mode, chosen once (`effort_model`).

* `CommandedEfforts` (forward_dynamics, and any mode of a mechanism without actuators): the commanded
  efforts are known forces (unknown entries count as 0); τ is not a state.
* `UnknownEfforts` (estimation): τ and its rate τ̇ are state blocks under an integrated random walk (white
  noise on τ̈ of density ``effort_density`` [(N·m)²/s³ or N²/s³ per actuator], exactly discretized:
  `factors.IntegratedRandomWalk`); the commanded efforts are ignored.
* `FusedEfforts` (fused): applied efforts = commands + disturbance d; the dynamics' known forces include
  the commands (per step), d and ḋ are the state's τ blocks under an integrated random walk of density
  ``disturbance_density``, damped back to 0 with ``disturbance_time_constant`` [s]; the reported efforts are
  command + d, the disturbance is reported too.

A model answers, per step, the forces of the dynamics factors, the effort rate Q̇ of the 4th-order
integrator's jerk, and the extra effort units (the integrated random walk between steps); per window, the seed's efforts and their prior; per estimate, the efforts reported.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import numpy as np

import mbfg_ros.factors as F
from mbfg_ros.model.mechanism import Mechanism

__all__ = ["EffortModel", "CommandedEfforts", "UnknownEfforts", "FusedEfforts", "effort_model", "EARLY_RATE_STEPS"]

EARLY_RATE_STEPS = 2     # the window's steps after which `EffortModel.early_rates` may correct earlier ones


class EffortModel:
    """Base of the effort strategies (see the module docstring).

    ``has_state``: τ is a block of the stacked state; ``rates_from_commands``: the effort rate Q̇ of the
    jerk comes from the commanded efforts (backward differences over the last steps, see `early_rates`)."""

    has_state = False
    rates_from_commands = False
    #: do the commanded efforts enter the dynamics' forces?  (estimation: no, τ is estimated)
    uses_commands = True
    #: with τ a state, do the dynamics' known forces change from step to step (with the commands)?
    known_forces_vary = False

    def __init__(self, mech: Mechanism, sigmas: dict, rates: bool):
        self.mech = mech
        self.na = len(mech.actuated)
        self.sigmas = sigmas
        self.rates = bool(rates)          # the integrator needs Q̇ (hermite)
        g = np.array(mech.gravity_forces, dtype=float)
        g.flags.writeable = False         # shared by units and estimates: never modified
        self.gravity = g
        z = np.zeros(mech.n)
        z.flags.writeable = False
        self.zero_rate = z                # Q̇ = 0 (compared by identity: "no rate")
        self.no_efforts = np.full(self.na, np.nan)
        self.no_efforts.flags.writeable = False
        # (actuator, its coordinate) pairs (`add_efforts`)
        self._actuated_pairs = tuple(enumerate(int(c) for c in mech.actuated))
        self._history: List[np.ndarray] = []     # the commanded efforts of the last two steps
        self._first: List[np.ndarray] = []       # the commanded efforts of the window's first steps

    # -- inputs --------------------------------------------------------------------------------
    def efforts_in(self, efforts) -> np.ndarray:
        """The efforts argument of a step as an array in actuator order (None: all unknown)."""
        if efforts is None:
            return self.no_efforts
        e = np.array(efforts, dtype=float)
        if e.ndim != 1:             # (the usual 1-D array skips numpy's reshape)
            e = e.reshape(-1)
        if e.size != self.na:
            raise ValueError(f"expected {self.na} efforts (actuators {list(self.mech.actuator_names)}), "
                             f"got {e.size}")
        return e

    def commanded(self, efforts: np.ndarray, copy: bool = True) -> np.ndarray:
        """The commanded efforts with unknown entries 0 (`copy` false: `efforts` itself when they are all known,
        for a caller that keeps only what it computes from them)."""
        if not self.na:
            return efforts
        if all(map(math.isfinite, efforts.tolist())):   # the usual case (plain floats: cheaper than numpy's calls)
            return efforts.copy() if copy else efforts
        return np.where(np.isfinite(efforts), efforts, 0.0)

    def add_efforts(self, base: np.ndarray, tau: np.ndarray) -> np.ndarray:
        """The generalized forces `base` plus the efforts τ (actuator order) on their coordinates, as a new array.
        (Entry by entry: the sums of numpy's indexed add, at a quarter of its cost for a mechanism's few
        actuators.)"""
        Q = base.copy()
        for i, c in self._actuated_pairs:
            Q[c] += tau[i]
        return Q

    # -- per window ----------------------------------------------------------------------------
    def restart(self):
        """A new window: no effort history."""
        self._history = []

    def seed(self, efforts: np.ndarray, tau_guess: Optional[np.ndarray]) -> Tuple[Optional[np.ndarray], np.ndarray]:
        """(τ₀ or None, Q₀): the seed's efforts (a state) and generalized forces."""
        raise NotImplementedError

    def seed_at(self, efforts: np.ndarray, x_tau: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(τ₀, Q₀) of a seed whose τ block is known (an estimate's state, `Seed.efforts_prior`)."""
        Q0 = self.add_efforts(self.gravity, self.reported(x_tau, efforts))
        return np.array(x_tau, dtype=float), Q0

    def seed_units(self, tau0) -> list:
        """The seed's prior on τ₀ (weak: the efforts are not known at the start)."""
        return [] if tau0 is None else [F.Prior("tau", tau0, self.sigmas["initial_effort"])]

    def seeded(self):
        """The seed step's forces are set: remember its efforts for `early_rates`."""
        self._first = list(self._history[-1:])

    # -- per step ------------------------------------------------------------------------------
    def forces(self, efforts: np.ndarray, h: float
               ) -> Tuple[np.ndarray, Optional[np.ndarray], Optional[Tuple[F.Factor, np.ndarray]]]:
        """(Q, Q̇ or None, the commanded-effort prior and its mean, or None) of a step: Q the generalized
        forces of the dynamics factors (with τ a state: the known part Q_known), Q̇ the effort rate (only with
        ``rates``).  The prior unit is shared by the steps with the same known entries: its mean is this
        step's value, passed with the step (`StepFactors.step_values`)."""
        raise NotImplementedError

    def transition_units(self, h: float) -> list:
        """Units between consecutive steps h apart (the random walk of τ)."""
        return []

    def reported(self, x_tau: Optional[np.ndarray], efforts: np.ndarray) -> np.ndarray:
        """The efforts of an estimate: the state's τ block, or the commanded efforts (+ the disturbance)."""
        raise NotImplementedError

    def disturbance(self, x_tau: Optional[np.ndarray]) -> Optional[np.ndarray]:
        """The estimated disturbance (applied − commanded efforts), or None (not estimated in this mode)."""
        return None

    def _rate(self, tau: np.ndarray, h: float) -> np.ndarray:
        """Q̇ from the commanded efforts: second-order backward differences."""
        if not self.na:
            return self.zero_rate
        hist = self._history
        if len(hist) >= 2:
            tdot = (3.0 * tau - 4.0 * hist[-1] + hist[-2]) / (2.0 * h)
        elif len(hist) == 1:
            tdot = (tau - hist[-1]) / h
        else:
            tdot = np.zeros(self.na)
        hist.append(tau)
        if len(hist) > 2:
            del hist[0]
        Qdot = np.zeros(self.mech.n)
        Qdot[self.mech.actuated] = tdot
        return Qdot

    def early_rates(self, k: int, h: float) -> Optional[List[np.ndarray]]:
        """Better Q̇ of the window's steps 0 … k − 1 once step k (1 or 2) has its efforts: the backward
        differences do not exist yet at steps 0 and 1 (0, then first order); with τ₁, τ₂ known they get
        second-order differences (forward at 0, central at 1), which keeps the 4th-order integrator
        4th-order under time-varying efforts.  None: no correction applies to this step (or model); [] none
        yet."""
        if not (self.rates and self.rates_from_commands) or k > EARLY_RATE_STEPS:
            return None
        taus = self._first
        taus.append(self._history[-1])
        E = self.mech.actuated

        def qdot(tdot):
            Q = np.zeros(self.mech.n)
            Q[E] = tdot
            return Q

        if k == 1 and len(taus) == 2:
            return [qdot((taus[1] - taus[0]) / h)]
        if k == 2 and len(taus) == 3:
            return [qdot((-3.0 * taus[0] + 4.0 * taus[1] - taus[2]) / (2.0 * h)),
                    qdot((taus[2] - taus[0]) / (2.0 * h))]
        return []


class CommandedEfforts(EffortModel):
    """The commanded efforts are known forces (see the module docstring)."""

    def __init__(self, mech: Mechanism, sigmas: dict, rates: bool):
        super().__init__(mech, sigmas, rates)
        self.rates_from_commands = self.na > 0

    def seed(self, efforts, tau_guess):
        return None, self.add_efforts(self.gravity, self.commanded(efforts))

    def forces(self, efforts, h):
        if self.na:
            tau = self.commanded(efforts)
            Q = self.add_efforts(self.gravity, tau)
        else:
            tau, Q = efforts, self.gravity
        return Q, (self._rate(tau, h) if self.rates else None), None

    def reported(self, x_tau, efforts):
        return self.commanded(efforts) if self.na else np.zeros(0)


class UnknownEfforts(EffortModel):
    """τ and its rate τ̇ are states under an integrated random walk (see the module docstring)."""

    has_state = True
    uses_commands = False
    density_name = "effort_density"

    def seed(self, efforts, tau_guess):
        tau0 = np.zeros(self.na) if tau_guess is None else np.array(tau_guess, dtype=float)
        tau0 = np.where(np.isfinite(tau0), tau0, 0.0)
        return tau0, self.add_efforts(self.gravity, tau0)

    def seed_units(self, tau0):
        # weak priors: the efforts are not known when the window starts (the rate is not kept across windows)
        return [F.Prior("tau", tau0, self.sigmas["initial_effort"]),
                F.Prior("tau_rate", np.zeros(self.na), self.sigmas["initial_effort_rate"])]

    def forces(self, efforts, h):
        # the effort's rate is a state: the (hermite) jerk's Q̇ neglects it (a Δt²/12 term)
        return self.gravity, (self.zero_rate if self.rates else None), None

    def transition_units(self, h):
        return [F.IntegratedRandomWalk("tau", "tau_rate", self.na, h, self.sigmas[self.density_name])]

    def reported(self, x_tau, efforts):
        return x_tau.copy()


class FusedEfforts(UnknownEfforts):
    """The applied efforts are the commands plus a disturbance d, d and ḋ states under an integrated random
    walk (``disturbance_density``) damped back to 0 (``disturbance_time_constant``): the dynamics' known
    forces are gravity + E·command (per step) and the
    state's τ block is d.  Unknown commands count as 0 (the disturbance then takes the whole effort)."""

    rates_from_commands = True
    known_forces_vary = True
    uses_commands = True
    density_name = "disturbance_density"

    def transition_units(self, h):
        # damped back to 0 (the command is right on average): without readings the disturbance's prediction
        # stays bounded instead of following its last rate (an undamped walk drifted over robot steps without
        # readings in bag replays)
        return [F.IntegratedRandomWalk("tau", "tau_rate", self.na, h, self.sigmas[self.density_name],
                                       self.sigmas["disturbance_time_constant"])]

    def seed(self, efforts, tau_guess):
        cmd = self.commanded(efforts)
        d0 = np.zeros(self.na) if tau_guess is None else np.array(tau_guess, dtype=float) - cmd
        d0 = np.where(np.isfinite(d0), d0, 0.0)
        return d0, self.add_efforts(self.gravity, cmd + d0)

    def seed_units(self, d0):
        return [F.Prior("tau", d0, self.sigmas["initial_effort"]),
                F.Prior("tau_rate", np.zeros(self.na), self.sigmas["initial_effort_rate"])]

    def forces(self, efforts, h):
        cmd = self.commanded(efforts, copy=False)
        Q = self.add_efforts(self.gravity, cmd)
        Qdot = self._rate(cmd.copy(), h) if self.rates else None    # (the history keeps its own copy)
        return Q, Qdot, None

    def reported(self, x_d, efforts):
        return self.commanded(efforts, copy=False) + x_d

    def disturbance(self, x_d):
        return x_d.copy()


def effort_model(mode: str, mech: Mechanism, sigmas: dict, rates: bool) -> EffortModel:
    """The strategy of `mode` (forward_dynamics | estimation | fused); without actuators: commanded (none)."""
    if mode == "forward_dynamics" or not len(mech.actuated):
        return CommandedEfforts(mech, sigmas, rates)
    if mode == "estimation":
        return UnknownEfforts(mech, sigmas, rates)
    if mode == "fused":
        return FusedEfforts(mech, sigmas, rates)
    raise ValueError(f"unknown mode {mode!r}")
