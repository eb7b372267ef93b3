"""The compiled kernel of the fast path: the per-step numerics in C (`_kernel.c`, a C extension that setup.py
builds with the package; no dependency beyond a C compiler at build time).

* `mechanism_kernel(mech)`: the mechanism's constrained dynamics (Φ, Φq, Φ̇q, q̈ and its exact first
  derivatives, the actuators' friction included), the continuity predictor and an estimate's summary (residual,
  norm, speed, assembly mode), used by `dynamics.cache.EvalContext`;
* `unit_form(unit)`: how a factor unit is written in the kernel's step program (`graph.step_model.StepModel`
  builds one `StepKernel` per step model from these: the whitened linearization and the relinearization
  mismatch of a whole step in one call each): the unit names its kind of the kernel's table (`unit_kinds`)
  and gives its integers and floats, so this module knows no factor class;
* `scaled_distance2()`: the relinearization check's quadratic bound (`graph.window.FixedLagWindow`).

The Python forms stay the reference and the fallback: where the extension is not built (``AVAILABLE`` false,
``UNAVAILABLE_REASON`` says why), is switched off (environment ``MBFG_ROS_NATIVE=0``), a mechanism has a
constraint type or a step a unit the kernel does not know, or the augmented matrix is singular at a point,
the same numbers come from numpy (to rounding: the tests compare both).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Dict, Optional, Tuple

import numpy as np

__all__ = ["AVAILABLE", "UNAVAILABLE_REASON", "SOURCE_SHA256", "ENVIRONMENT", "enabled", "disabled_reason", "describe",
           "mechanism_form", "module",
           "mechanism_kernel", "unit_kinds", "unit_form", "no_form_reason", "step_kernel", "scaled_distance2"]

if importlib.util.find_spec("mbfg_ros.native._kernel") is None:
    # not built (no C compiler or Python headers at install): the numpy forms do the work.  The reason names the
    # folder looked in: a source tree that shadows an installed package shows here as the source folder.
    _kernel = None
    UNAVAILABLE_REASON = (f"the C kernel mbfg_ros.native._kernel is not built in {os.path.dirname(__file__)} "
                          "(install the package where a C compiler and Python's headers are: build-essential, "
                          "python3-dev)")
else:
    try:
        from mbfg_ros.native import _kernel
        UNAVAILABLE_REASON = ""
    except ImportError as exc:      # built for another Python, or damaged
        _kernel = None
        UNAVAILABLE_REASON = f"the C kernel mbfg_ros.native._kernel does not load ({exc})"
AVAILABLE = _kernel is not None
# The SHA-256 of the `_kernel.c` the kernel was compiled from (setup.py passes it in), None where it is not built.
SOURCE_SHA256: Optional[str] = getattr(_kernel, "SOURCE_SHA256", None)

ENVIRONMENT = "MBFG_ROS_NATIVE"


def enabled() -> bool:
    """Is the compiled kernel used (built, and not switched off by ``MBFG_ROS_NATIVE=0``)?  Read when an
    estimator is built."""
    return AVAILABLE and os.environ.get(ENVIRONMENT, "1").strip() not in ("0", "false", "no", "off")


def disabled_reason() -> str:
    """Why the compiled kernel is not used ('' where it is: `enabled`)."""
    if enabled():
        return ""
    if not AVAILABLE:
        return UNAVAILABLE_REASON
    return f"switched off by {ENVIRONMENT}={os.environ.get(ENVIRONMENT, '')}"


def describe() -> str:
    """What does the per-step numerics now: 'compiled', or 'numpy (why)' (the node's log; per model, the
    estimator's `numerics`)."""
    return "compiled" if enabled() else f"numpy ({disabled_reason()})"


def mechanism_form(mech, kernel) -> str:
    """'compiled' where `kernel` (`mechanism_kernel(mech)`) is one, else 'numpy (why)'."""
    if kernel is not None:
        return "compiled"
    if not enabled():
        return describe()
    return f"numpy (the kernel does not know a constraint type of mechanism {mech.name})"


def module():
    """The extension module (`MechanismKernel`, `StepKernel`, `UNIT_KINDS`), or None where it is not built."""
    return _kernel


def mechanism_kernel(mech):
    """A `_kernel.MechanismKernel` of `mech` (a new one: its work buffers belong to one caller), or None when the
    kernel is not enabled or does not know one of the mechanism's constraint types."""
    if not enabled():
        return None
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


def unit_kinds() -> Dict[str, dict]:
    """The kernel's table of unit kinds, {name: {"code", "rows", "slots"}} (`_kernel.c`'s ``unit_kinds``: rows
    "constraints" (m), "coordinates" (n), "one" or "per index"), empty where the kernel is not built.  A factor
    names its kind in ``kernel_kind`` (`factors.base.Factor`)."""
    return {} if _kernel is None else _kernel.UNIT_KINDS


def unit_form(unit) -> Optional[Tuple[int, list, list]]:
    """(kernel code, integers, floats) of a factor unit in the step program, or None when the kernel does not know
    its kind (`no_form_reason` says why; the step model then linearizes in Python)."""
    kind = unit.kernel_kind
    if _kernel is None or kind is None:
        return None
    entry = _kernel.UNIT_KINDS.get(kind)
    if entry is None:
        return None
    ints, floats = unit.kernel_arguments()
    return entry["code"], ints, floats


def no_form_reason(unit) -> str:
    """Why `unit_form` of `unit` is None."""
    if _kernel is None:
        return UNAVAILABLE_REASON
    if unit.kernel_kind is None:
        return f"{unit.name} has no compiled form"
    return f"the kernel does not know the unit kind {unit.kernel_kind!r} of {unit.name}"


def _scaled_distance2(A: np.ndarray, x: np.ndarray, lin: np.ndarray) -> float:
    d = x - lin
    d *= np.sqrt(np.add.reduce(A * A, 0))
    return float(d.dot(d))


def scaled_distance2():
    """The function (A, x, lin) -> Σⱼ (‖A[:, j]‖ (xⱼ − linⱼ))² (the distance of x from lin, each variable scaled by
    the column norm of A, i.e. the sensitivity of A's rows to it): compiled where the kernel is enabled (chosen
    now, once per caller)."""
    return _kernel.scaled_distance2 if enabled() else _scaled_distance2


def step_kernel(mech_kernel, D: int, S: np.ndarray, static_prev: bool, units: list, A_cur, A_prev, r, b):
    """A `_kernel.StepKernel` (see `graph.step_model.StepModel`)."""
    return _kernel.StepKernel(mech_kernel, D, np.ascontiguousarray(S, dtype=float), static_prev, units, A_cur,
                              A_prev, r, b)
