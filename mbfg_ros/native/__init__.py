"""The compiled kernel: the package's per-step numerics in C (`_kernel.c`, a C extension that setup.py builds with
the package; no dependency beyond a C compiler and Python's headers at build time).  It is required: a formula
with a compiled form is written once, in C, and the tests compare it with independent numpy references
(`test/`); the package does not import without it.

* `mechanism_kernel(mech)`: the mechanism's constrained dynamics (Φ, Φq, Φ̇q, q̈ and its exact first
  derivatives, the actuators' friction included), the continuity predictor and an estimate's summary (residual,
  norm, speed, assembly mode), used by `dynamics.cache.EvalContext`;
* `unit_form(unit)`: how a factor unit is written in the kernel's step program (`graph.step_model.StepModel`
  builds one `StepKernel` per step model from these: the whitened linearization and the relinearization
  mismatch of a whole step in one call each): the unit names its kind of the kernel's table (`unit_kinds`)
  and gives its integers and floats, so this module knows no factor class;
* `scaled_distance2`: the relinearization check's quadratic bound (`graph.window.FixedLagWindow`);
  the module's `discretize`, `kalman_step` and `deflected_kalman_step` are the tuner's and the density
  adaptation's Kalman filters' (`estimation.reduced_ekf.discretize`, `tuning.filter_bank`; the last two also set
  each filter's acceleration noise from its pose's tangents, so that a bank step calls no BLAS).

`constraint_kernel` is a `ConstraintSet`'s own kernel (Φ, Φq, Φ̇q and the second-order terms, one state or
many: their only implementation; a constraint set of a type the kernel does not know is refused).
What stays in numpy is what the kernel does not have: units without a kind (the independent formulation's,
the hermite velocity integrator, the jerk) and the null-space solver of a singular augmented matrix, whose
linearization the kernel takes at such a point (`MechanismKernel.missed` says where, `supply` hands it over).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Dict, Optional, Tuple

import numpy as np

__all__ = ["SOURCE_SHA256", "describe", "mechanism_form", "module", "mechanism_kernel", "constraint_kernel",
           "friction_kernel", "unit_kinds", "parameter_kinds", "unit_form", "no_form_reason", "UnitProgram",
           "step_kernel", "scaled_distance2", "identified_forces", "KernelMissing"]


class KernelMissing(ImportError):
    """The compiled kernel is not built (or does not load): the package cannot run."""


_HOW_TO_BUILD = ("build it with the package where a C compiler and Python's headers are (Debian/Ubuntu: "
                 "sudo apt install build-essential python3-dev), then: `make venv` in a source tree, "
                 "`pip install .` (or `pip install -e .`), or `colcon build --packages-select mbfg_ros`")

if importlib.util.find_spec("mbfg_ros.native._kernel") is None:
    # the folder looked in is named: a source tree that shadows an installed package shows here as the source folder
    raise KernelMissing(f"mbfg_ros needs its compiled kernel mbfg_ros.native._kernel, which is not built in "
                        f"{os.path.dirname(__file__)}: {_HOW_TO_BUILD}")
try:
    from mbfg_ros.native import _kernel
except ImportError as exc:      # built for another Python, or damaged
    raise KernelMissing(f"mbfg_ros's compiled kernel mbfg_ros.native._kernel does not load ({exc}): rebuild it; "
                        f"{_HOW_TO_BUILD}") from exc
# The SHA-256 of the `_kernel.c` the kernel was compiled from (setup.py passes it in).
SOURCE_SHA256: Optional[str] = getattr(_kernel, "SOURCE_SHA256", None)


def describe() -> str:
    """What does the per-step numerics (the node's log and `/diagnostics`)."""
    return "compiled"


def mechanism_form(mech, kernel) -> str:
    """'compiled' where `kernel` (`mechanism_kernel(mech)`) is one, else 'numpy (why)'."""
    if kernel is not None:
        return "compiled"
    return f"numpy (the kernel does not know a constraint type of mechanism {mech.name})"


def module():
    """The extension module (`MechanismKernel`, `StepKernel`, `UNIT_KINDS`, `PARAMETER_KINDS`)."""
    return _kernel


def mechanism_kernel(mech):
    """A `_kernel.MechanismKernel` of `mech` (a new one: its work buffers belong to one caller), or None when the
    kernel does not know one of the mechanism's constraint types."""
    form = mech.constraints.native_form()
    if form is None:
        return None
    Ht, tail, angles = form
    fr = mech.friction
    friction = [] if fr is None else [(int(c), float(b), float(cf), float(vs)) for c, b, cf, vs in
                                      zip(fr.columns, fr.viscous, fr.coulomb, fr.velocity)]
    return _kernel.MechanismKernel(mech.n, np.ascontiguousarray(Ht, dtype=float), np.ascontiguousarray(tail, dtype=float),
                                   angles, np.ascontiguousarray(mech.mass_matrix, dtype=float),
                                   [int(i) for i in mech.independent_rows], [int(i) for i in mech.actuated],
                                   [int(c) for pts in mech.assembly_mode_points.tolist() for p in pts
                                    for c in mech.extended_point_index[p]], friction)


def constraint_kernel(n: int, Ht: np.ndarray, tail: np.ndarray, angles: list):
    """A `_kernel.MechanismKernel` of constraints alone (`model.constraints.ConstraintSet.native_form`'s parts): Φ,
    Φq and their derivatives for `ConstraintSet`, whose only implementation it is (no dynamics: unit mass, no
    independent rows)."""
    return _kernel.MechanismKernel(n, np.ascontiguousarray(Ht, dtype=float), np.ascontiguousarray(tail, dtype=float),
                                   angles, np.eye(n), [], [], [], [])


def friction_kernel(viscous, coulomb, velocity):
    """A `_kernel.MechanismKernel` of friction alone, over the friction coordinates' rates (coordinate i is
    friction i): the force F(q̇) for `model.friction.Friction`, whose only implementation it is."""
    rows = [(i, float(b), float(c), float(vs)) for i, (b, c, vs) in enumerate(zip(viscous, coulomb, velocity))]
    k = len(rows)
    return _kernel.MechanismKernel(k, np.zeros(0), np.ones(1), [], np.eye(k), [], [], [], rows)


def unit_kinds() -> Dict[str, dict]:
    """The kernel's table of unit kinds, {name: {"code", "rows", "slots"}} (`_kernel.c`'s ``unit_kinds``: rows
    "constraints" (m), "coordinates" (n), "one" or "per index").  A factor
    names its kind in ``kernel_kind`` (`factors.base.Factor`)."""
    return _kernel.UNIT_KINDS


def parameter_kinds() -> Dict[str, dict]:
    """The kernel's table of identified-parameter kinds, {name: {"code", "on"}} (`_kernel.c`'s ``parameter_kinds``:
    "on" "actuator" or "body"), whose codes an ``identified_dynamics`` unit's integers carry (`model.identified`)."""
    return _kernel.PARAMETER_KINDS


def unit_form(unit) -> Optional[Tuple[int, list, list]]:
    """(kernel code, integers, floats) of a factor unit in the step program, or None when the kernel does not know
    its kind (`no_form_reason` says why; the step model then linearizes in Python)."""
    kind = unit.kernel_kind
    if kind is None:
        return None
    entry = _kernel.UNIT_KINDS.get(kind)
    if entry is None:
        return None
    ints, floats = unit.kernel_arguments()
    return entry["code"], ints, floats


def no_form_reason(unit) -> str:
    """Why `unit_form` of `unit` is None."""
    if unit.kernel_kind is None:
        return f"{unit.name} has no compiled form"
    return f"the kernel does not know the unit kind {unit.kernel_kind!r} of {unit.name}"


#: (A, x, lin) -> Σⱼ (‖A[:, j]‖ (xⱼ − linⱼ))²: the distance of x from lin, each variable scaled by the column norm
#: of A (the sensitivity of A's rows to it)
scaled_distance2 = _kernel.scaled_distance2

#: (par, doubles, theta, v, commands, a, out): out = ΔQ, the identified parameters' forces, the ``identified_dynamics``
#: unit's own formula (`model.identified.IdentifiedParameters.forces`, whose only implementation it is)
identified_forces = _kernel.identified_forces


class UnitProgram:
    """One factor unit alone as a step program of the kernel, for its evaluation outside a compiled step (a step
    with a unit of no compiled kind, the batch, the gtsam adapters): its error and one Jacobian per slot from the
    function of its kind, the unit's only form.  The blocks are laid side by side in slot order, unwhitened."""

    __slots__ = ("_kernel", "_A", "_r", "_cuts", "_params")

    def __init__(self, mech_kernel, unit, widths):
        code, ints, floats = unit_form(unit)
        D = int(sum(widths))
        starts = np.cumsum([0] + list(widths))
        dim = unit.dim
        self._A, self._r = np.zeros((dim, D)), np.zeros(dim)
        self._cuts = [(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]
        self._params = bool(unit.params)
        self._kernel = _kernel.StepKernel(mech_kernel, D, np.zeros((0, D)), False,
                                          [(code, 0, dim, 0 if self._params else -1, False,
                                            [(1, a, b - a) for a, b in self._cuts], np.ones(dim), ints, floats)],
                                          self._A, None, self._r, np.zeros(dim))

    def evaluate(self, blocks, params: tuple):
        """(error, [Jacobian per slot]) at `blocks` with the unit's per-step `params` (new arrays), or None where
        the dynamics are singular."""
        x = np.concatenate(blocks)
        if not self._kernel.linearize(None, x, None, x, [params] if self._params else []):
            return None
        A = self._A
        return self._r.copy(), [A[:, a:b].copy() for a, b in self._cuts]


def step_kernel(mech_kernel, D: int, S: np.ndarray, static_prev: bool, units: list, A_cur, A_prev, r, b):
    """A `_kernel.StepKernel` (see `graph.step_model.StepModel`)."""
    return _kernel.StepKernel(mech_kernel, D, np.ascontiguousarray(S, dtype=float), static_prev, units, A_cur,
                              A_prev, r, b)
