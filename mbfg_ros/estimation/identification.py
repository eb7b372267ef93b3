"""Actuator parameters identified online (`model.identified`): a block θ of the stacked state, a random walk between
steps, a prior at each new window, the dynamics factor with their forces (`factors.IdentifiedDynamics`).

What the estimator knows of θ outlives a window: when a window ends (a re-seed, a re-initialization, a recovery) the
next one starts from the old one's estimate of θ and its marginal σ (`carry`), so nothing learnt is lost on any path
but `reset` (back to the priors, on request: `FixedLagEstimator.reset_parameters`).  Frozen (`freeze`), θ is held at
its value by a tight prior on every step and learns nothing; thawed, it goes on from that value with the σ it had.

Restrictions (a clear error at construction, `check`): θ needs a state of the efforts (estimation or fused mode),
the dependent formulation and a trapezoidal or Euler integrator (the hermite integrators and the independent forms
compute the dynamics without θ); a gain needs an actuator whose command is a known force.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

import mbfg_ros.factors as F
from mbfg_ros.model.identified import IdentifiedParameters, parse_identify
from mbfg_ros.model.mechanism import Mechanism

__all__ = ["Identification", "identification", "CONFOUNDED", "BOUND_SIGMAS"]

# why a friction parameter of an actuator whose effort is estimated is weakly determined (`confounded_note`, the
# node's diagnostics)
CONFOUNDED = "the actuator's effort is estimated and takes in its friction as well"
FROZEN_SIGMA_RATIO = 1e-9      # a frozen parameter's per-step prior σ, relative to its prior σ
CONSTANT_SIGMA_RATIO = 1e-6    # `hold_constant`: the random walk's σ over one second, relative to the prior σ
SIGMA_FLOOR_RATIO = 1e-6       # the smallest σ carried into a new window, relative to the prior σ
#: a friction or a payload estimated more than this many of its σ below 0 is moved onto 0 (`below_bound`; checked
#: every few steps, so a rare excursion's: at 3σ a transient friction of A0 sysid 01, −0.28 ± 0.09, was moved and the
#: shoulder's effort error over the run rose 14 %)
BOUND_SIGMAS = 5.0


class Identification:
    """The identified parameters of one estimator (see the module docstring): `parameters` (immutable),
    the belief carried into the next window (`mean`, `sigma`), and whether they are frozen."""

    def __init__(self, parameters: IdentifiedParameters, confounded: Sequence[str] = ()):
        self.parameters = P = parameters
        self.size = P.size
        self.names = P.names
        # friction of an actuator whose effort is estimated: the effort takes it in as well (`confounded_note`)
        self.confounded = tuple(confounded)
        self.mean = P.prior_mean.copy()
        self.sigma = P.prior_sigma.copy()
        self.frozen = False
        # friction and a payload are never negative (`carry`, `below_bound`)
        self.nonnegative = np.array([k != "gain" for k in P.kinds])
        self._pin: Optional[F.Factor] = None
        self.settling = 0            # steps θ is still held while a new window's state settles (`settle`)
        self._walks: Dict[float, F.Factor] = {}
        self._density: Optional[np.ndarray] = None
        self.learning_start = None   # (mean, σ) when θ last started learning after a hold
        self.generation = 0          # bumped whenever the per-step units change (the step models' caches)
        self.projections = np.zeros(self.size, dtype=int)   # per parameter: times moved onto its bound (`project`)

    # -- the units -------------------------------------------------------------------------------
    def transition_unit(self, h: float) -> F.Factor:
        walk = self._walks.get(h)
        if walk is None:
            if len(self._walks) > 16:
                self._walks.clear()
            walk = self._walks[h] = F.RandomWalk("theta", self.size, h, self.density)
        return walk

    @property
    def density(self) -> np.ndarray:
        return self.parameters.density if self._density is None else self._density

    def hold_constant(self):
        """Constant parameters from the next step on (a random walk of density (CONSTANT_SIGMA_RATIO σ_prior)²/s): what the
        offline identification (`mbfg identify`) estimates.  Call before the first step (the transition units built
        so far keep their density)."""
        self._density = (CONSTANT_SIGMA_RATIO * self.parameters.prior_sigma) ** 2
        self._walks.clear()

    def step_units(self) -> list:
        """The units of every step: a frozen θ's tight prior, else none."""
        return [] if self._pin is None else [self._pin]

    def seed_units(self) -> list:
        """The prior of a new window's θ: the belief carried over (a frozen θ's tight prior comes with every step's
        units, the seed's included: `step_units`)."""
        return [F.Prior("theta", self.mean, np.maximum(self.sigma, SIGMA_FLOOR_RATIO * self.parameters.prior_sigma))]

    def forces(self, theta, v, commands, a=None) -> np.ndarray:
        """ΔQ: the parameters' generalized forces at θ, rates v, commands (actuator order, unknown 0) and
        accelerations a (a payload's inertia; None: 0)."""
        return self.parameters.forces(theta, v, commands, a=a)

    # -- the belief ------------------------------------------------------------------------------
    def carry(self, window, k: int, layout) -> None:
        """Keep the estimate of θ at step k of `window` and its marginal σ for the next window (not while frozen:
        the frozen value and the σ before are kept).  A window that cannot give its marginal (it failed) leaves the
        σ as it was; a non-finite estimate leaves everything as it was."""
        if window is None or self.held:
            return
        sl = layout.slices["theta"]
        try:
            theta = np.array(window.estimate(k)[sl], dtype=float)
        except Exception:       # (the window may be what failed)
            return
        if not np.isfinite(theta).all():
            return
        try:
            sd = self.window_std(window, k, layout)
        except Exception:
            sd = None
        self._believe(theta, sd)

    @staticmethod
    def window_std(window, k: int, layout) -> np.ndarray:
        """The marginal 1σ of θ at step k of `window` (raises where the window cannot give it)."""
        return np.sqrt(np.clip(np.diagonal(window.marginal_covariance(k))[layout.slices["theta"]], 0.0, None))

    def _believe(self, theta: np.ndarray, sd: Optional[np.ndarray]):
        """The belief carried into the next window: the estimates `theta` (friction and a payload are never
        negative: an excursion below 0 is not kept) and their 1σ `sd` (at most 10× the prior's; None or not
        finite: the σ as it was)."""
        self.mean = np.where(self.nonnegative, np.maximum(theta, 0.0), theta)
        if sd is not None and np.isfinite(sd).all():
            self.sigma = np.minimum(np.asarray(sd, dtype=float), self.parameters.prior_sigma * 10.0)

    def below_bound(self, theta: np.ndarray, std: np.ndarray) -> np.ndarray:
        """Which of the estimates `theta` (marginal 1σ `std`) lie below their physical bound: a friction or a
        payload more than BOUND_SIGMAS σ below 0.  Such an estimate is not the parameter's but the model's error
        (on the DFKI double pendulum a payload identified in fused mode went to −0.96 kg within 10 ms of learning
        and stayed there, the disturbance taking the opposite force: efforts 12× the command's error), which the
        parameter must not take up (`project`)."""
        return self.nonnegative & (np.asarray(theta) < -BOUND_SIGMAS * np.asarray(std))

    def project(self, theta: np.ndarray, std: np.ndarray, below: np.ndarray):
        """The belief for a new window from the estimates `theta` (1σ `std`): those `below` their bound moved onto
        it (0), their σ kept (they learn on from the bound; the efforts' state takes what they held:
        `FixedLagEstimator._efforts_for_parameters`), each counted in `projections`."""
        self._believe(theta, std)
        self.projections += np.asarray(below, dtype=int)

    def reset(self):
        """Back to the priors (and thawed)."""
        self.mean = self.parameters.prior_mean.copy()
        self.sigma = self.parameters.prior_sigma.copy()
        self.projections[:] = 0
        self.thaw()
        if self.settling:
            self.settling, self._pin = 0, None
            self.generation += 1

    def freeze(self, values: np.ndarray):
        """Hold θ at `values` from now on (the belief's σ is kept for `thaw`)."""
        self.mean = np.array(values, dtype=float)
        self.frozen = True
        self.settling = 0
        self._pin = F.Prior("theta", self.mean, FROZEN_SIGMA_RATIO * self.parameters.prior_sigma)
        self.generation += 1

    def thaw(self):
        if self.frozen:
            self.frozen = False
            self._pin = None
            self.generation += 1

    def settle(self, steps: int):
        """Hold θ at its belief for the next `steps` steps of a window whose state is not settled yet (a fresh
        start, a recovery): what such a window's first steps say of θ is its transient's (the simulated double
        pendulum's payload went to −1.1 kg for 0.3 in 1 s from a fresh start, and took it to lose track)."""
        if not self.frozen:
            self.freeze(self.mean)
            self.frozen = False        # (a hold of its own: not the user's freeze)
            self.settling = int(steps)

    def settled_step(self) -> bool:
        """One more settled step; True when the hold ends now (the window, which holds θ tight, must be re-seeded
        for θ to learn)."""
        if self.settling <= 0:
            return False
        self.settling -= 1
        if self.settling:
            return False
        self.learning_start = (self.mean.copy(), self.sigma.copy())
        self._pin = None
        self.generation += 1
        return True

    def learn_again(self) -> bool:
        """Back to the belief θ had when it last started learning after a hold (what it learnt since is dropped);
        False, changing nothing, while held or before it ever started."""
        if self.held or self.learning_start is None:
            return False
        self.mean, self.sigma = (a.copy() for a in self.learning_start)
        return True

    @property
    def held(self) -> bool:
        """Is θ held (frozen, or settling)?"""
        return self._pin is not None

    def confounded_note(self) -> str:
        """What a user is told when friction of an actuator whose effort is estimated is identified ('' where none
        is): an estimated effort is a random walk that takes in the friction as well, and only its smoothness tells
        the two apart (on the DFKI recordings in estimation mode, identified friction gave 0.87–1.9× the effort error
        of none: docs/benchmarks.md)."""
        if not self.confounded:
            return ""
        return (f"{', '.join(self.confounded)}: {CONFOUNDED} "
                f"(only the effort's smoothness tells them apart, weakly: the effort error may grow); identify "
                f"friction where the effort is known: fused mode, a commanded or passive joint")


def identification(mech: Mechanism, entries: Optional[Sequence[str]], mode: str, formulation: str, integrator: str,
                   efforts) -> Optional[Identification]:
    """The identification of `entries` (``JOINT.PARAMETER[=SIGMA]``; None: the mechanism's ``identify:``), or None
    when there is nothing to identify.  ValueError where it cannot run (see the module docstring)."""
    specs = mech.spec.identify if entries is None else parse_identify(entries, mech)
    if not specs:
        return None
    names = ", ".join(f"{s.joint}.{s.parameter}" for s in specs)
    if not efforts.has_state:
        raise ValueError(f"identifying {names} needs the estimation or fused mode (mode is {mode}, with no actuator "
                         f"effort to estimate)")
    if formulation != "dependent" or integrator == "hermite":
        raise ValueError(f"identifying {names} needs the dependent formulation with the trapezoidal or euler "
                         f"integrator (got {formulation}, {integrator})")
    P = IdentifiedParameters(mech, specs)
    for name, kind, i in zip(P.names, P.kinds, P.actuators.tolist()):
        if kind == "gain" and not efforts.takes_command(i):
            raise ValueError(f"identifying {name}: the command of actuator '{mech.actuator_names[i]}' does not "
                             f"enter the estimate (its effort is {efforts.kinds[i]} in {mode} mode), so it has no gain")
    confounded = [name for name, kind, i in zip(P.names, P.kinds, P.actuators.tolist())
                  if kind in ("viscous_friction", "coulomb_friction") and efforts.kinds[i] == "estimated"]
    return Identification(P, confounded)
