"""Factor units of the multibody factor graphs, with closed-form Jacobians (ROS-free, gtsam-free).

A unit is one small object with

* ``slots``  – names of the variable blocks it reads, in argument order.  A bare name (``"q"``,
  ``"v"``, ``"a"``, ``"j"``, ``"tau"``, ``"z"``, ``"zd"``, ``"zdd"``, ``"zj"``) is the block of the step
  the unit belongs to; the suffix ``_prev`` names the same block one step earlier (integrators,
  soft equality, random walks), twice two steps earlier (second differences).
* ``dim``    – number of error rows,
* ``sigmas`` – (dim,) standard deviations of the rows (the noise model is diagonal),
* ``evaluate(*blocks, ctx=None) -> (error, [J_slot ...])`` – error and one Jacobian per slot,
  ``error(*blocks, ctx=None)`` – error only (cheaper for the dynamics units),
  ``whitened(*blocks, ctx=None)`` – both divided by the sigmas.

Parameters (measured values, known forces, Δt) are attributes set at construction.  A unit shared by
the steps of a window has per-step parameters (``params``: a reading, the forces of a step): the caller
passes each step's values with the step and `graph.step_model.StepModel` puts them on the unit whenever
it evaluates that step; the gtsam adapters take a copy.  Nothing is read from outside the blocks: every
quantity an error depends on is either a slot or a parameter of the unit.

``ctx`` is an optional `EvalContext`: a memo of the expensive per-configuration quantities (Φ, Φq,
q̈ and its Jacobians) keyed by the *values* of the blocks, so several units evaluated at the same
(q, q̇, Q) share one dynamics linearization.  Passing no context gives the same numbers.

The kinematic and dynamics units also evaluate a whole series of factors at once (``vectorized``, over a
`dynamics.batched.BatchContext`), for the batch solvers that apply them at every step of a trajectory.

Notation: n coordinates, m constraint rows, d degrees of freedom (independent coordinates z),
na actuators (efforts τ on the actuated coordinates, E the n×na selector, Q = Q_known + E τ).
"""

from __future__ import annotations

import copy
import math
from typing import Callable, Optional, Sequence

import numpy as np

from mbfg_ros.dynamics.batched import BatchContext
from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.factors.noise import default_sigmas


def prev(name: str) -> str:
    """Slot name of block `name` one step earlier."""
    return name + "_prev"


def sigma_or_default(sigma, key: str) -> float:
    return default_sigmas()[key] if sigma is None else sigma


def sigma_array(sigma, dim: int) -> np.ndarray:
    if isinstance(sigma, float):            # the common case, without numpy's broadcasting machinery
        if not (0.0 < sigma < math.inf):
            raise ValueError(f"sigmas must be positive and finite (got {sigma})")
        return np.full(dim, sigma)
    s = np.broadcast_to(np.asarray(sigma, dtype=float), (dim,)).copy()
    if dim and not (np.all(s > 0) and np.all(np.isfinite(s))):
        raise ValueError(f"sigmas must be positive and finite (got {sigma})")
    return s


def context_or_new(ctx, mech):
    return EvalContext(mech) if ctx is None else ctx


def batch_mechanism(units: Sequence["Factor"]):
    """The mechanism of `units` when they are all of one class and one mechanism whose constraints
    `BatchContext` supports (a series that can be evaluated over all its factors at once), else None."""
    if not units:
        return None
    kind, mech = type(units[0]), units[0].mech
    if any(type(u) is not kind or u.mech is not mech for u in units) or not BatchContext.supports(mech):
        return None
    return mech


# ----------------------------------------------------------------------------------------------
class Factor:
    """Base of all units (see the module docstring)."""

    slots: tuple = ()
    dim: int = 0
    sigmas: np.ndarray = np.zeros(0)
    name: str = "factor"
    #: error is affine in the blocks with constant Jacobians (a pre-linearized factor is exact)
    linear: bool = False
    #: affine with zero offset and parameters fixed at construction: its whitened Jacobian blocks can be
    #: stacked once (`graph.step_model.StepModel`, which reads them from ``jacobians``, one per slot)
    static: bool = False
    #: weight of this unit's rows in the relinearization check of the fast path (see `Jerk`)
    check_weight: float = 1.0
    #: names of the per-step parameters (measured values, known forces): passed with each step
    #: (`graph.step_model.StepValues`) and kept per step, so an older step is re-linearized with its own values
    params: tuple = ()

    def evaluate(self, *blocks, ctx: Optional[EvalContext] = None):
        raise NotImplementedError

    @classmethod
    def vectorized(cls, units: Sequence["Factor"]) -> Optional[Callable]:
        """Evaluation of a series of `units` (one per factor, all of this class) over all its factors at
        once: ``f(ctx, keys, *blocks) -> (errors (F, dim), [Jacobian (F, dim, width) per slot])`` with ctx a
        `BatchContext`, the blocks stacked (F, width) and keys[s] naming where slot s's blocks come from
        (equal keys, equal blocks: the memo of ctx).  The same numbers as `evaluate` factor by factor.
        None when the class (or the series) has no such form: the caller evaluates factor by factor."""
        return None

    def error(self, *blocks, ctx: Optional[EvalContext] = None) -> np.ndarray:
        return self.evaluate(*blocks, ctx=ctx)[0]

    def whitened(self, *blocks, ctx: Optional[EvalContext] = None):
        e, J = self.evaluate(*blocks, ctx=ctx)
        w = 1.0 / self.sigmas
        return e * w, [Ji * w[:, None] for Ji in J]

    def copy(self) -> "Factor":
        """Shallow copy with its own parameter arrays (the mechanism is shared: it is immutable)."""
        c = copy.copy(self)
        for k, val in vars(self).items():
            if isinstance(val, np.ndarray):
                setattr(c, k, val.copy())
        return c

    def __repr__(self):
        return f"{type(self).__name__}(slots={self.slots}, dim={self.dim})"
