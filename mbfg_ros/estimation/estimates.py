"""The estimate of a step from the window's newest state, its sanity checks and the assembly mode it is
on (the requested one, the current one)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.estimation.actuator_delay import configured_effort_sigmas
from mbfg_ros.estimation.config import Estimate, EstimatorConfig
from mbfg_ros.estimation.efforts import EffortModel
from mbfg_ros.estimation.step_factors import StepFactors
from mbfg_ros.graph.window import FixedLagWindow
from mbfg_ros.model.mechanism import Mechanism

__all__ = ["StepFailure", "Estimates", "copy_estimate", "COORDINATE_CHECK_INTERVAL"]

COORDINATE_CHECK_INTERVAL = 10   # steps between checks of the independent coordinates' conditioning


class StepFailure(RuntimeError):
    """A numerical failure detected after a step (non-finite, |Φ| too large, divergence...)."""


def copy_estimate(e: Estimate) -> Estimate:
    out = Estimate(e.t, e.q.copy(), e.v.copy(), e.a.copy(), e.Q.copy(), e.efforts.copy(),
                   np.array(e.assembly_mode), e.constraint_residual, 0.0, e.status, e.message,
                   None if e.covariance is None else e.covariance.copy(), e.step,
                   *(None if x is None else x.copy()
                     for x in (e.disturbance, e.std, e.efforts_std, e.disturbance_std)))
    if e.parameters is not None:
        out.parameters = e.parameters.copy()
    return out


def ripple_variances(mech: Mechanism, config: EstimatorConfig, efforts: EffortModel) -> Optional[np.ndarray]:
    """Per actuator (actuator order) the variance its published effort's σ adds for what no reading resolves of
    it: the square of its `effort_sigma` (the configuration's over the mechanism's), the white part of the effort it
    applies about its command's response, whatever the mode makes of the command (used, or estimated from the
    motion: the estimate is of the response either way); 0 for a passive one (its effort is known: 0); None where
    that is 0 for every one."""
    sigmas = np.array(configured_effort_sigmas(mech, config.actuator_effort_sigmas), dtype=float)
    active = np.array([kind != "passive" for kind in efforts.kinds], dtype=bool)
    out = np.where(active, sigmas ** 2, 0.0)
    return out if out.size and out.any() else None


class Estimates:
    """Makes the estimates (`make`), checks them (`check`) and tracks the assembly mode: ``requested`` (a
    step leaving it is a failure), ``mode`` (the current one: a change is reported).  With automatic
    independent coordinates it notes when they have become poorly conditioned (``switch_pending``)."""

    def __init__(self, mech: Mechanism, config: EstimatorConfig, efforts: EffortModel, factors: StepFactors,
                 ctx: EvalContext):
        self.mech, self.config, self.efforts, self.factors, self.ctx = mech, config, efforts, factors, ctx
        # identified gains: (θ index, actuator) — the applied effort is gain × command, reported so
        ident = factors.identification
        self._gains = [] if ident is None else [
            (j, int(i)) for j, (kind, i) in enumerate(zip(ident.parameters.kinds, ident.parameters.actuators))
            if kind == "gain"]
        self.requested = (None if config.assembly_mode is None
                          else np.array(self.check_mode(config.assembly_mode), dtype=int))
        self._tau = factors.layout.slices.get("tau")
        self._theta = factors.layout.slices.get("theta")
        self._n = mech.n
        self._covariance = config.compute_covariance
        self._qv = np.r_[factors.layout.slices["q"], factors.layout.slices["v"]]
        # each actuator's stated ripple about its command's response, squared (None: none stated)
        self.ripple_variances = ripple_variances(mech, config, efforts)
        self._mode_arrays: dict = {}         # assembly mode (tuple) -> its read-only array, shared by estimates
        self.reset()

    def reset(self):
        self.mode: Optional[np.ndarray] = None if self.requested is None else self.requested.copy()
        self.switch_pending = False
        self._x_norm2 = self._speed = 0.0

    def check_mode(self, mode) -> np.ndarray:
        m = np.array(mode, dtype=int).reshape(-1)
        k = len(self.mech.assembly_mode_points)
        if m.shape != (k,) or not np.all(np.isin(m, (-1, 1))):
            raise ValueError(f"assembly_mode must be {k} values of +1/-1 (indicators: "
                             f"{', '.join(self.mech.assembly_mode_names) or 'none'}), got {list(mode)}")
        return m

    def mode_text(self, mode) -> str:
        return "{" + ", ".join(f"{n}: {int(m):+d}" for n, m in zip(self.mech.assembly_mode_names, mode)) + "}"

    def make(self, t: float, x: np.ndarray, efforts: np.ndarray, status: str, messages: list,
             window: Optional[FixedLagWindow], k: int, step: int, newest: bool = True) -> Estimate:
        """The estimate of state x (step k of `window`, id `step`); `messages` joined into its message.
        `newest` false: an earlier step's smoothed estimate (`FixedLagEstimator.smoothed`), which neither
        checks nor moves what the newest estimates are checked against (the assembly mode, the state's size)."""
        n = self._n
        qva = x[:3 * n].copy()                     # the layout starts with q, q̇, q̈
        q, v, a = qva[:n], qva[n:2 * n], qva[2 * n:]
        x_tau = None if self._tau is None else x[self._tau]
        efforts_model = self.efforts
        tau = efforts_model.reported(x_tau, efforts)
        if self._gains:           # (tau is the model's new array)
            known, theta = efforts_model.known(efforts, copy=False).tolist(), x[self._theta].tolist()
            for j, i in self._gains:
                tau[i] += (theta[j] - 1.0) * known[i]
        Q = efforts_model.add_efforts(efforts_model.gravity, tau)
        # (a NaN or inf in q or q̇ is caught by the norm of x in `check` before the residual and speed are looked at)
        residual, x_norm2, speed, indicators = self.ctx.state_summary(x)
        mode = self._mode_arrays.get(indicators)
        if mode is None:
            mode = self._mode_arrays[indicators] = np.array(indicators, dtype=int)
            mode.flags.writeable = False
        if newest:
            self._x_norm2, self._speed = x_norm2, speed
        if newest and self.mode is not None and mode is not self.mode and mode.size and mode.tolist() != self.mode.tolist():
            if self.requested is not None and not np.array_equal(mode, self.requested):
                raise StepFailure(f"assembly mode left the requested {self.mode_text(self.requested)} "
                                  f"(now {self.mode_text(mode)})")
            messages.append(f"assembly mode changed from {self.mode_text(self.mode)} to {self.mode_text(mode)}")
        if newest and mode.size:
            self.mode = mode
        cov = std = efforts_std = disturbance_std = None
        if self._covariance and window is not None:
            try:
                P = window.marginal_covariance(k)
                cov = P[np.ix_(self._qv, self._qv)]
                sd = np.sqrt(np.clip(np.diagonal(P), 0.0, None))
                std = sd[:3 * n].copy()                  # the layout starts with q, q̇, q̈
                # the commands are known: the efforts' uncertainty is the τ block's (estimated τ or disturbance)
                # (0 for a known actuator: commanded or passive)
                efforts_std = (self.efforts.scattered(sd[self._tau]) if self._tau is not None
                               else np.zeros(self.efforts.na))
                if self.efforts.disturbance(x_tau) is not None:
                    disturbance_std = efforts_std.copy()
                if self.ripple_variances is not None:
                    efforts_std = np.sqrt(efforts_std ** 2 + self.ripple_variances)
            except Exception as exc:      # covariance is a by-product: report, do not fail
                messages.append(f"covariance unavailable ({exc})")
        if newest and k % COORDINATE_CHECK_INTERVAL == 0:
            self._check_coordinates(q, messages)
        est = Estimate(t, q, v, a, Q, tau, mode, residual, 0.0, status, "; ".join(messages), cov, step,
                       efforts_model.disturbance(x_tau), std, efforts_std, disturbance_std)
        if self._theta is not None:
            est.parameters = x[self._theta].copy()
        return est

    def waiting(self, t: float, q: np.ndarray, message: str) -> Estimate:
        """The answer before any estimate: the guess q at rest."""
        n = self.mech.n
        return Estimate(t, q, np.zeros(n), np.zeros(n), self.efforts.gravity.copy(), np.zeros(self.efforts.na),
                        self.mech.assembly_mode(q), self.ctx.constraint_residual(q),
                        0.0, "waiting", message)

    def _check_coordinates(self, q, messages):
        """Automatic independent coordinates: when the current ones have become much worse conditioned
        than the best choice here, the window is re-seeded with the new ones at the next step."""
        z_best = self.factors.better_coordinates(q)
        if z_best is None:
            return
        names = self.mech.coordinate_names
        messages.append(f"independent coordinates {[names[i] for i in self.factors.z]} are poorly conditioned "
                        f"here: switching to {[names[i] for i in z_best]} at the next step")
        self.switch_pending = True

    def check(self, est: Estimate):
        """Raise StepFailure for a non-finite estimate, |Φ| over ``max_constraint_residual`` or |q̇| over
        ``max_speed``."""
        if (not self._x_norm2 < math.inf or not all(map(math.isfinite, est.efforts.tolist()))
                or (est.parameters is not None and not all(map(math.isfinite, est.parameters.tolist())))):
            raise StepFailure("non-finite estimate")
        if est.constraint_residual > self.config.max_constraint_residual:
            raise StepFailure(f"constraint residual max |Φ| = {est.constraint_residual:.3g} exceeds "
                              f"{self.config.max_constraint_residual:g}")
        if self._speed > self.config.max_speed:
            raise StepFailure(f"diverged: max |q̇| = {self._speed:.3g} exceeds {self.config.max_speed:g}")
