"""Factor units of the multibody factor graphs, with closed-form Jacobians (ROS-free, gtsam-free).

A unit is one small object with

* ``slots``  – names of the variable blocks it reads, in argument order.  A bare name (``"q"``,
  ``"v"``, ``"a"``, ``"j"``, ``"tau"``, ``"z"``, ``"zd"``, ``"zdd"``, ``"zj"``) is the block of the step
  the unit belongs to; the suffix ``_prev`` names the same block one step earlier (integrators,
  soft equality, random walks), twice two steps earlier (second differences).
* ``dim``    – number of error rows,
* ``sigmas`` – (dim,) standard deviations of the rows (the noise model is diagonal),
* ``evaluate(*blocks, params, ctx=None) -> (error, [J_slot ...])`` – error and one Jacobian per slot,
  ``error(*blocks, params, ctx=None)`` – error only (cheaper for the dynamics units),
  ``whitened(*blocks, params, ctx=None)`` – both divided by the sigmas.

Units are immutable, deeply: every attribute is set at construction (setting one afterwards raises) and every
array they hold is read-only, so a unit is shared freely (by the step models of a window, the batch's steps, the
gtsam adapters, threads).  Its constants (Δt, sigmas, selections) are fixed at construction; its per-step
parameters (``params`` names them: a reading, a mean, the forces of a step) are not: every evaluation is given
the values of its step as the tuple ``params`` (in the order of the names; () for a unit without any), a
required argument, on the numpy path as in the compiled kernel.  The values given at construction are the
unit's defaults (`own_params`), for a caller that has no others; the unit never falls back to them itself.
Nothing is read from outside the blocks: every quantity an error depends on is either a slot or a parameter.

``ctx`` is an optional `EvalContext`: a memo of the expensive per-configuration quantities (Φ, Φq,
q̈ and its Jacobians) keyed by the *values* of the blocks, so several units evaluated at the same
(q, q̇, Q) share one dynamics linearization.  Passing no context gives the same numbers.

The kinematic and dynamics units also evaluate a whole series of factors at once (``vectorized``, over a
`dynamics.batched.BatchContext`), for the batch solvers that apply them at every step of a trajectory.

Notation: n coordinates, m constraint rows, d degrees of freedom (independent coordinates z),
na actuators (efforts τ on the actuated coordinates, E the n×na selector, Q = Q_known + E τ).
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.factors.noise import default_sigmas


class _FrozenAfterInit(type):
    """Freezes a unit once its construction (every ``__init__`` of its classes) is done."""

    def __call__(cls, *args, **kwargs):
        unit = super().__call__(*args, **kwargs)
        unit._freeze()
        return unit


def prev(name: str) -> str:
    """Slot name of block `name` one step earlier."""
    return name + "_prev"


def _read_only(value):
    """`value` as a frozen unit holds it: an array made read-only (in place: a unit's arrays are its own, made at
    construction), a list or tuple (of Jacobians, say) a tuple of frozen items."""
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif isinstance(value, (list, tuple)):
        value = tuple([_read_only(item) for item in value])
    return value


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


#: kernel calls at most per evaluation: each may stop at one more point where the dynamics are singular, whose
#: linearization the null-space solver then supplies (`EvalContext.supply_singular`)
SINGULAR_RETRIES = 8


def compiled_evaluation(unit: "Factor", blocks, ctx, params):
    """(error, [Jacobian per slot]) of `unit` by the function of its kind in the compiled kernel
    (`native.UnitProgram`: the unit's only implementation; where its dynamics are singular, with the null-space
    solver's linearization), or None where that fails too."""
    ctx = context_or_new(ctx, unit.mech)
    program = ctx.unit_program(unit, tuple([b.size for b in blocks]))
    for _ in range(SINGULAR_RETRIES):
        out = program.evaluate(blocks, params)
        if out is not None or not ctx.supply_singular():
            return out
    return None


def batch_mechanism(units: Sequence["Factor"]):
    """The mechanism of `units` when they are all of one class and one mechanism (a series that can be evaluated
    over all its factors at once), else None."""
    if not units:
        return None
    kind, mech = type(units[0]), units[0].mech
    if any(type(u) is not kind or u.mech is not mech for u in units):
        return None
    return mech


# ----------------------------------------------------------------------------------------------
class Factor(metaclass=_FrozenAfterInit):
    """Base of all units (see the module docstring)."""

    slots: tuple = ()
    dim: int = 0
    sigmas: np.ndarray = _read_only(np.zeros(0))
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
    #: the kind of this unit in the compiled kernel's table (`mbfg_ros.native.unit_kinds`; None: no compiled form,
    #: the step linearizes in numpy), whose integers and floats `kernel_arguments` gives
    kernel_kind: Optional[str] = None

    def evaluate(self, *blocks, params: tuple, ctx: Optional[EvalContext] = None):
        raise NotImplementedError

    @classmethod
    def vectorized(cls, units: Sequence["Factor"], params: Sequence[tuple]) -> Optional[Callable]:
        """Evaluation of a series of `units` (one per factor, all of this class) with their per-step values
        `params` (one tuple per factor) over all its factors at once: ``f(ctx, keys, *blocks) -> (errors (F, dim),
        [Jacobian (F, dim, width) per slot])`` with ctx a `BatchContext`, the blocks stacked (F, width) and keys[s]
        naming where slot s's blocks come from (equal keys, equal blocks: the memo of ctx).  The same numbers as
        `evaluate` factor by factor.  None when the class (or the series) has no such form: the caller evaluates
        factor by factor."""
        return None

    def kernel_arguments(self) -> Tuple[list, list]:
        """(integers, floats) of this unit's compiled form (see `kernel_kind`): what its kind in `_kernel.c`
        reads besides the blocks and the per-step parameters."""
        return [], []

    def error(self, *blocks, params: tuple, ctx: Optional[EvalContext] = None) -> np.ndarray:
        return self.evaluate(*blocks, params=params, ctx=ctx)[0]

    def whitened(self, *blocks, params: tuple, ctx: Optional[EvalContext] = None):
        e, J = self.evaluate(*blocks, params=params, ctx=ctx)
        w = 1.0 / self.sigmas
        return e * w, [Ji * w[:, None] for Ji in J]

    def own_params(self) -> tuple:
        """The per-step parameters given at construction, in the order of ``params``: the unit's defaults, for a
        caller that has no values of its own to pass."""
        return tuple(getattr(self, name) for name in self.params)

    def checked_params(self, params) -> tuple:
        """`params` as this unit's per-step values (a tuple, one per name of ``params``); ValueError otherwise.  For
        the holders of values beside a unit (the batch, the gtsam adapter), at the time they take them."""
        params = tuple(params)
        if len(params) != len(self.params):
            raise ValueError(f"{self.name}: {len(params)} per-step values given for the parameters "
                             f"{list(self.params)}")
        return params

    def _freeze(self):
        for name, value in list(self.__dict__.items()):
            object.__setattr__(self, name, _read_only(value))
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name, value):
        if self.__dict__.get("_frozen", False):
            raise AttributeError(f"{type(self).__name__} units are immutable (setting {name!r}): per-step values "
                                 f"are passed with each evaluation (params=)")
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        if self.__dict__.get("_frozen", False):
            raise AttributeError(f"{type(self).__name__} units are immutable (deleting {name!r})")
        object.__delattr__(self, name)

    def __repr__(self):
        return f"{type(self).__name__}(slots={self.slots}, dim={self.dim})"
