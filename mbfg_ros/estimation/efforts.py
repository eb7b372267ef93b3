"""How the actuator efforts enter the estimator: one strategy per mode, chosen once (`effort_model`).

* `CommandedEfforts` (forward_dynamics, and any mode of a mechanism without actuators): the commanded
  efforts are known forces (unknown entries count as 0); τ is not a state.
* `UnknownEfforts` (estimation): τ and its rate τ̇ are state blocks under an integrated random walk (white
  noise on τ̈ of density ``effort_density`` [(N·m)²/s³ or N²/s³ per actuator], its rate optionally damped with
  ``effort_rate_time_constant``, exactly discretized: `factors.IntegratedRandomWalk`); the commanded efforts are
  ignored.
* `FusedEfforts` (fused): applied efforts = commands + disturbance d; the dynamics' known forces include
  the commands (per step), d and ḋ are the state's τ blocks under an integrated random walk of density
  ``disturbance_density``, damped back to 0 with ``disturbance_time_constant`` [s]; the reported efforts are
  command + d, the disturbance is reported too.

Per actuator a kind (`effort_kinds`: the mechanism's `effort` keys, overridden by the configuration's
``actuator_efforts``; default: as the mode says) narrows what its effort is: ``estimated`` (a state: its
command is ignored), ``commanded`` (its command is a known force), ``passive`` (known zero: an underactuated
joint whose motor is off; its friction still acts).  The state's τ block covers only the actuators whose τ
(estimation: ``estimated``, ``prescribed``) or disturbance (fused: every one but ``passive``) is estimated
(``state_actuators``); the others enter the dynamics' known forces.  ``prescribed`` is ``estimated`` whose
coordinate's motion comes as readings 'q:<coordinate>' (a position-controlled joint: the caller passes its set-points
with the readings; `sensors.Sensors`).  In fused mode an ``estimated``
actuator's command is ignored (the disturbance carries its whole effort, as for an unknown command); in
forward-dynamics mode ``estimated`` counts as ``commanded``.  With no actuator left to estimate, the
estimator runs as forward dynamics on the known efforts (`effort_model`).

A model answers, per step, the forces of the dynamics factors, the effort rate Q̇ of the 4th-order
integrator's jerk, and the extra effort units (the integrated random walk between steps); per window, the seed's efforts and their prior; per estimate, the efforts reported.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import mbfg_ros.factors as F
from mbfg_ros.model.mechanism import Mechanism

from mbfg_ros.excerpt import excerpt
from mbfg_ros.model.spec import EFFORT_KINDS

__all__ = ["EffortModel", "CommandedEfforts", "UnknownEfforts", "FusedEfforts", "effort_model", "effort_kinds",
           "parse_actuator_efforts", "EARLY_RATE_STEPS"]

EARLY_RATE_STEPS = 2     # the window's steps after which `EffortModel.early_rates` may correct earlier ones

#: the kind of an actuator that declares none, per mode
DEFAULT_KINDS = {"forward_dynamics": "commanded", "estimation": "estimated", "fused": "commanded"}


def effort_kinds(mode: str, mech: Mechanism, overrides: Optional[Dict[str, str]] = None) -> Tuple[str, ...]:
    """Each actuator's effort kind (actuator order, one of `model.spec.EFFORT_KINDS`): `overrides` (joint name →
    kind, e.g. the node's ``actuator_efforts``), else the mechanism's declared one, else the mode's default."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(mech.actuator_names))
    if unknown:
        raise ValueError(f"actuator efforts: no actuator named {', '.join(repr(excerpt(n)) for n in unknown)} in mechanism "
                         f"'{mech.name}' (actuators: {', '.join(mech.actuator_names) or 'none'})")
    for name, kind in overrides.items():
        if kind not in EFFORT_KINDS:
            raise ValueError(f"actuator efforts: actuator '{name}': kind must be one of {', '.join(EFFORT_KINDS)} "
                             f"(got '{excerpt(kind)}')")
    return tuple(overrides.get(name) or declared or DEFAULT_KINDS.get(mode, "commanded")
                 for name, declared in zip(mech.actuator_names, mech.actuator_efforts))


def parse_actuator_efforts(entries, mech: Mechanism) -> Dict[str, str]:
    """The `actuator_efforts` parameter (or `mbfg estimate --actuator-effort`), ``NAME=KIND`` entries, as
    {actuator joint name: kind}; ValueError naming the entry, the actuators and the kinds."""
    out: Dict[str, str] = {}
    for entry in list(entries or []):
        name, sep, kind = str(entry).partition("=")
        name, kind = name.strip(), kind.strip()
        if not sep or not name:
            raise ValueError(f"'{excerpt(str(entry))}' is not NAME=KIND (KIND one of {', '.join(EFFORT_KINDS)})")
        if name in out:
            raise ValueError(f"actuator '{excerpt(name)}' is given twice")
        out[name] = kind
    effort_kinds("estimation", mech, out)        # the names and kinds (ValueError: which is wrong)
    return out


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

    def __init__(self, mech: Mechanism, sigmas: dict, rates: bool, kinds: Optional[Sequence[str]] = None):
        self.mech = mech
        self.na = len(mech.actuated)
        self.kinds = tuple(kinds) if kinds is not None else (self.default_kind,) * self.na
        if len(self.kinds) != self.na:
            raise ValueError(f"expected {self.na} effort kinds (actuators {list(mech.actuator_names)}), "
                             f"got {len(self.kinds)}")
        # the actuators (actuator order) whose τ or disturbance is a state, and whose command is a known force
        state = [i for i, kind in enumerate(self.kinds) if self._in_state(kind)] if self.has_state else []
        self.state_actuators = np.array(state, dtype=np.intp)
        self.state_actuators.flags.writeable = False
        self.n_state = len(state)
        #: each state effort's multiplier of the density (its share, geometric mean 1, given or fitted, × its boost:
        #: the estimator sets it); None: the density alone
        self.shares: Optional[np.ndarray] = None
        self.state_coordinates = np.array(mech.actuated, dtype=np.intp)[self.state_actuators]
        self.state_coordinates.flags.writeable = False
        #: the state covers only some actuators: its τ block is scattered into actuator order
        self.partial_state = self.has_state and self.n_state < self.na
        self._state_pairs = tuple(zip(range(self.n_state), (int(c) for c in self.state_coordinates)))
        takes = [self._takes_command(kind) for kind in self.kinds]
        self._all_commands = all(takes)
        self._any_command = any(takes)
        self._command_mask = np.array(takes, dtype=bool)
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

    default_kind = "commanded"

    @staticmethod
    def _in_state(kind: str) -> bool:
        return False

    def takes_command(self, actuator: int) -> bool:
        """Does the command of `actuator` (actuator order) enter the dynamics as a known force?"""
        return bool(self._command_mask[actuator])

    @staticmethod
    def _takes_command(kind: str) -> bool:
        return kind != "passive"

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

    def known(self, efforts: np.ndarray, copy: bool = True) -> np.ndarray:
        """The known efforts in actuator order: the commands of the actuators that take theirs (unknown entries 0),
        0 for the others (`copy`: as in `commanded`)."""
        if self._all_commands:
            return self.commanded(efforts, copy)
        if not self._any_command:
            return np.zeros(self.na)
        return np.where(self._command_mask & np.isfinite(efforts), efforts, 0.0)

    def scattered(self, x_tau: np.ndarray) -> np.ndarray:
        """The state's τ block (`state_actuators`) in actuator order, 0 for the other actuators."""
        if not self.partial_state:
            return x_tau.copy()
        out = np.zeros(self.na)
        out[self.state_actuators] = x_tau
        return out

    def add_state(self, base: np.ndarray, x_tau: np.ndarray) -> np.ndarray:
        """The generalized forces `base` plus the state's τ block on its coordinates, as a new array."""
        Q = base.copy()
        for i, c in self._state_pairs:
            Q[c] += x_tau[i]
        return Q

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
        """The seed's priors on τ₀ and τ̇₀ (weak: the efforts are not known when the window starts; the rate is not
        kept across windows)."""
        if tau0 is None:
            return []
        return [F.Prior("tau", tau0, self.sigmas["initial_effort"]),
                F.Prior("tau_rate", np.zeros(self.n_state), self.sigmas["initial_effort_rate"])]

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

    def __init__(self, mech: Mechanism, sigmas: dict, rates: bool, kinds: Optional[Sequence[str]] = None):
        super().__init__(mech, sigmas, rates, kinds)
        self.rates_from_commands = self._any_command

    def seed(self, efforts, tau_guess):
        return None, self.add_efforts(self.gravity, self.known(efforts))

    def forces(self, efforts, h):
        if self.na:
            tau = self.known(efforts)
            Q = self.add_efforts(self.gravity, tau)
        else:
            tau, Q = efforts, self.gravity
        return Q, (self._rate(tau, h) if self.rates else None), None

    def reported(self, x_tau, efforts):
        return self.known(efforts) if self.na else np.zeros(0)


class UnknownEfforts(EffortModel):
    """τ and its rate τ̇ are states under an integrated random walk (see the module docstring)."""

    has_state = True
    uses_commands = False
    density_name = "effort_density"
    default_kind = "estimated"

    def __init__(self, mech: Mechanism, sigmas: dict, rates: bool, kinds: Optional[Sequence[str]] = None):
        super().__init__(mech, sigmas, rates, kinds)
        # commanded actuators: their commands are known forces of each step
        self.uses_commands = self.known_forces_vary = self.rates_from_commands = self._any_command

    @staticmethod
    def _in_state(kind):
        return kind in ("estimated", "prescribed")

    @staticmethod
    def _takes_command(kind):
        return kind == "commanded"

    def seed(self, efforts, tau_guess):
        known = self.known(efforts)
        if tau_guess is None:
            tau0 = np.zeros(self.n_state)
        else:
            tau0 = np.array(tau_guess, dtype=float)[self.state_actuators] if self.partial_state else \
                np.array(tau_guess, dtype=float)
        tau0 = np.where(np.isfinite(tau0), tau0, 0.0)
        return tau0, self.add_efforts(self.gravity, known + self.scattered(tau0))

    def forces(self, efforts, h):
        if not self._any_command:
            # the effort's rate is a state: the (hermite) jerk's Q̇ neglects it (a Δt²/12 term)
            return self.gravity, (self.zero_rate if self.rates else None), None
        known = self.known(efforts)
        Q = self.add_efforts(self.gravity, known)
        return Q, (self._rate(known, h) if self.rates else None), None

    def transition_units(self, h):
        return [F.IntegratedRandomWalk("tau", "tau_rate", self.n_state, h, self.densities(),
                                       rate_time_constant=self.sigmas["effort_rate_time_constant"])]

    def densities(self):
        """The density of each state effort's walk: the configured (fitted) one, × its multiplier where it has
        one (its share, given or fitted, and its boost: `FixedLagEstimator._shares_fit`, `_boost_fit`)."""
        density = self.sigmas[self.density_name]
        return density if self.shares is None else density * self.shares

    def reported(self, x_tau, efforts):
        if not self.partial_state:
            return x_tau.copy()
        tau = self.known(efforts)
        tau[self.state_actuators] = x_tau
        return tau


class FusedEfforts(UnknownEfforts):
    """The applied efforts are the commands plus a disturbance d, d and ḋ states under an integrated random
    walk (``disturbance_density``) damped back to 0 (``disturbance_time_constant``): the dynamics' known
    forces are gravity + E·command (per step) and the
    state's τ block is d.  Unknown commands count as 0 (the disturbance then takes the whole effort)."""

    density_name = "disturbance_density"
    default_kind = "commanded"

    @staticmethod
    def _in_state(kind):
        return kind != "passive"

    def transition_units(self, h):
        # damped back to 0 (the command is right on average): without readings the disturbance's prediction
        # stays bounded instead of following its last rate (an undamped walk drifted over robot steps without
        # readings in bag replays)
        return [F.IntegratedRandomWalk("tau", "tau_rate", self.n_state, h, self.densities(),
                                       self.sigmas["disturbance_time_constant"])]

    def seed(self, efforts, tau_guess):
        cmd = self.known(efforts)
        d0 = np.zeros(self.na) if tau_guess is None else np.array(tau_guess, dtype=float) - cmd
        d0 = np.where(np.isfinite(d0), d0, 0.0)
        if self.partial_state:
            d0 = d0[self.state_actuators]
        return d0, self.add_efforts(self.gravity, cmd + self.scattered(d0))

    def forces(self, efforts, h):
        cmd = self.known(efforts, copy=False)
        Q = self.add_efforts(self.gravity, cmd)
        Qdot = self._rate(cmd.copy(), h) if self.rates else None    # (the history keeps its own copy)
        return Q, Qdot, None

    def reported(self, x_d, efforts):
        return self.known(efforts, copy=False) + (self.scattered(x_d) if self.partial_state else x_d)

    def disturbance(self, x_d):
        return self.scattered(x_d)


def effort_model(mode: str, mech: Mechanism, sigmas: dict, rates: bool,
                 overrides: Optional[Dict[str, str]] = None) -> EffortModel:
    """The strategy of `mode` (forward_dynamics | estimation | fused) with each actuator's kind
    (`effort_kinds`: `overrides` by joint name, the mechanism's declared kinds, the mode's default); without
    actuators, or with none left to estimate (estimation: none ``estimated``; fused: all ``passive``):
    commanded (the known efforts)."""
    if mode not in DEFAULT_KINDS:
        raise ValueError(f"unknown mode {mode!r}")
    kinds = effort_kinds(mode, mech, overrides)
    if mode == "estimation" and ("estimated" in kinds or "prescribed" in kinds):
        return UnknownEfforts(mech, sigmas, rates, kinds)
    if mode == "fused" and any(kind != "passive" for kind in kinds):
        return FusedEfforts(mech, sigmas, rates, kinds)
    if mode == "estimation":      # no estimated actuator: the rest are known
        return CommandedEfforts(mech, sigmas, rates, ["passive" if k == "passive" else "commanded" for k in kinds])
    return CommandedEfforts(mech, sigmas, rates, kinds)


def configured_shares(mech: Mechanism, efforts: "EffortModel", given: Dict[str, float],
                      mode: str) -> Optional[np.ndarray]:
    """The state efforts' shares of the density from `EstimatorConfig.effort_shares` (state order, geometric
    mean 1; 1 where not given), None when none is given; a ValueError naming a joint whose effort is not a
    state."""
    if not given:
        return None
    names = [mech.actuator_names[j] for j in efforts.state_actuators]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"effort_shares: {', '.join(unknown)} {'is not an actuator' if len(unknown) == 1 else 'are not actuators'}"
                         f" whose effort is estimated in {mode} mode (those are: {', '.join(names) or 'none'})")
    log10 = np.log10([float(given.get(n, 1.0)) for n in names])
    return 10.0 ** (log10 - np.mean(log10))
