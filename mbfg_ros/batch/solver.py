"""Batch (whole-trajectory) factor-graph solvers: forward dynamics and the paper's staged inverse dynamics.

A batch problem is a `Problem`: named vector variables (``("q", k)``, ``("v", k)`` ...) and factors,
each a factor *unit* of `mbfg_ros.factors` (closed-form Jacobians) applied to a list of variable
keys.  Two Levenberg–Marquardt engines solve the same `Problem`:

* ``engine="sparse"`` (default): LM written here over the units directly.  Factors are grouped by
  kind (`Problem.add_factors` adds a whole series in bulk); the Jacobians of exactly linear units
  (integrators, priors, soft equalities) are built once per stage (one whitened Jacobian when the
  group shares it); the nonlinear units are evaluated once per iteration, vectorized over all the
  steps of a group (`mbfg_ros.batch.vectorized`: Φ, Φq, Φ̇q for all steps from the constraint set's quadratic
  form, the dynamics by batched solves of the augmented systems) or, for other unit kinds, step by
  step with a shared `factors.EvalContext` (one evaluation gives errors and Jacobians).  The graphs
  are chains in time, so the damped normal equations are accumulated directly in LAPACK band storage
  (columns ordered by time step; half bandwidth from the structural nonzeros), solved by a banded
  Cholesky and refined against the Jacobians until the residual of the Jacobi-scaled system is below
  1e-10 (at most twice; this recovers the accuracy that forming JᵀJ loses in weakly determined
  directions).  Convergence is judged on the Gauss–Newton model (predicted decrease ≤ 1e-10 × cost),
  tested with the previous factorization, so a converged stage costs no extra evaluation or
  factorization.
* ``engine="gtsam"``: the same factors as `gtsam.CustomFactor` (via `mbfg_ros.graph.gtsam_adapters.custom_factor`)
  and `gtsam.LevenbergMarquardtOptimizer` with multifrontal QR and tolerances that converge.  The
  paper's structure literally; two orders of magnitude slower (a Python callback per factor and
  linearization, and 4–7 LM iterations per stage).

Staged inverse dynamics (paper §7.2, `staged_inverse_dynamics`): for a prescribed trajectory of the
actuated coordinates, stage 1 solves q only (trajectory priors on the actuated entries, position
constraints, soft equality between consecutive q), stage 2 adds q̇, q̈ and the trapezoidal
integrators, stage 3 the velocity constraints, stage 4 the efforts τ_k as real variables of the
inverse-dynamics factor (error q̈(q, q̇; Qg + Eτ) − q̈ over the keys q_k, q̇_k, q̈_k, τ_k).  Each
stage starts from the previous result; stage 1 from per-step position problems with continuation
(the separable part of stage 1: every 16th step in sequence, the steps between all at once by
batched Newton from a cubic interpolation), stage 2 from finite differences, stage 4 from the
closed-form efforts at the stage-3 motion.  With τ free, the trapezoidal rule leaves a sawtooth (−1)^k in q̈
(and τ) undetermined; a weak second-difference prior on q̇ and q̈ (`SecondDifference`) fixes it
without biasing the ends (a soft equality q̈_k → q̈_k+1 pulls the end values by O(Δt·jerk)).

Batch forward dynamics (`batch_forward_dynamics`): the whole trajectory under given efforts as one
LM problem, dependent (paper Fig. 2) or independent coordinates (Fig. 3), from an RK4 initial guess.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from mbfg_ros.batch import vectorized as batched
from mbfg_ros.dynamics import constrained as dynamics
from mbfg_ros.dynamics import kinematics
from mbfg_ros.model.mechanism import Mechanism

__all__ = ["Problem", "LMSettings", "LMReport", "solve", "InverseDynamicsResult", "StageReport",
           "staged_inverse_dynamics", "closed_form_motion", "closed_form_efforts", "quintic_move",
           "ForwardDynamicsResult", "batch_forward_dynamics"]

Key = Tuple[str, int]
_DEBUG = False
_REFINE = 2                 # at most this many refinement steps of a banded solve
_REFINE_TOLERANCE = 1e-10   # ... stopping once the relative residual of the normal equations is below this
_COARSE_MOTION = 0.25  # position continuation: largest move of an actuated coordinate per coarse interval
_VECTORIZE = True     # evaluate supported nonlinear units over all steps at once (`mbfg_ros.batch.vectorized`)


# ----------------------------------------------------------------------------------------------
# problem description
# ----------------------------------------------------------------------------------------------
def _unit_is_linear(unit) -> bool:
    return bool(getattr(unit, "linear", False) or getattr(unit, "is_linear", False))


class Problem:
    """Variables (ordered as added) and factors of one batch least-squares problem."""

    def __init__(self, mech: Optional[Mechanism] = None):
        self.mech = mech            # enables a shared factors.EvalContext during evaluations
        self.keys: List[Key] = []
        self.dims: Dict[Key, int] = {}
        self.values: Dict[Key, np.ndarray] = {}
        self.factors: List[Tuple[object, Tuple[Key, ...]]] = []
        # factors grouped (incrementally) by unit type, dimension and key pattern, with the first
        # step of each factor's keys (chunks: ints or arrays, in the order of the group's factors)
        self.groups: Dict[tuple, list] = {}
        self.group_steps: Dict[tuple, list] = {}

    def add_variable(self, key: Key, value) -> None:
        value = np.array(value, dtype=float).reshape(-1)
        if key not in self.dims:
            self.keys.append(key)
            self.dims[key] = value.size
        elif self.dims[key] != value.size:
            raise ValueError(f"variable {key}: dimension {value.size} != {self.dims[key]}")
        self.values[key] = value

    def add_factor(self, unit, keys: Sequence[Key]) -> None:
        keys = tuple(keys)
        for k in keys:
            if k not in self.dims:
                raise KeyError(f"factor {type(unit).__name__} uses unknown variable {k}")
        self.factors.append((unit, keys))
        k0 = min(k[1] for k in keys) if keys else 0
        sig = (type(unit), unit.dim, tuple((k[0], k[1] - k0, self.dims[k]) for k in keys))
        self.groups.setdefault(sig, []).append((unit, keys))
        self.group_steps.setdefault(sig, []).append(k0)

    def add_variables(self, name: str, values, steps=None) -> None:
        """Variables (name, k) for the steps k (default 0, 1, ...) with the rows of `values` (N, d)."""
        values = np.array(values, dtype=float)
        values = values.reshape(len(values), -1)
        steps = range(len(values)) if steps is None else [int(k) for k in steps]
        dim = values.shape[1]
        for k, row in zip(steps, values):
            key = (name, k)
            old = self.dims.get(key)
            if old is None:
                self.keys.append(key)
                self.dims[key] = dim
            elif old != dim:
                raise ValueError(f"variable {key}: dimension {dim} != {old}")
            self.values[key] = row

    def add_factors(self, units, pattern: Sequence[Tuple[str, int]], steps) -> None:
        """One factor per step k of `steps` over the keys (name, k + offset) for (name, offset) in
        `pattern`: `units` is one shared unit or a list with one unit per step.  The same as calling
        `add_factor` for each step, in bulk."""
        steps = [int(k) for k in steps]
        shared = not isinstance(units, (list, tuple))
        unit_list = [units] * len(steps) if shared else list(units)
        if len(unit_list) != len(steps):
            raise ValueError("add_factors: one unit per step")
        if not steps:
            return
        pattern = [(str(nm), int(off)) for nm, off in pattern]
        dims = self.dims
        slot_keys = [[(nm, k + off) for k in steps] for nm, off in pattern]
        for keys in slot_keys:
            missing = [key for key in keys if key not in dims]
            if missing:
                raise KeyError(f"factor {type(unit_list[0]).__name__} uses unknown variable {missing[0]}")
        keys_list = list(zip(*slot_keys)) if pattern else [()] * len(steps)
        unit0 = unit_list[0]
        slot_dims = [{dims[key] for key in keys} for keys in slot_keys]
        uniform = all(len(d) == 1 for d in slot_dims) and (
            shared or all(type(u) is type(unit0) and u.dim == unit0.dim for u in unit_list))
        if not uniform:
            for unit, keys in zip(unit_list, keys_list):
                self.add_factor(unit, keys)
            return
        off0 = min((off for _, off in pattern), default=0)
        sig = (type(unit0), unit0.dim, tuple((nm, off - off0, next(iter(d))) for (nm, off), d
                                             in zip(pattern, slot_dims)))
        pairs = list(zip(unit_list, keys_list))
        self.factors.extend(pairs)
        self.groups.setdefault(sig, []).extend(pairs)
        self.group_steps.setdefault(sig, []).append(np.asarray(steps, dtype=np.intp) + off0)

    def _first_steps(self, sig) -> np.ndarray:
        chunks = self.group_steps[sig]
        if all(isinstance(c, int) for c in chunks):
            return np.array(chunks, dtype=np.intp)
        return np.concatenate([np.atleast_1d(np.asarray(c, dtype=np.intp)) for c in chunks])

    def error(self, values: Optional[Dict[Key, np.ndarray]] = None) -> float:
        """½ Σ |whitened error|² (GTSAM's graph error)."""
        values = self.values if values is None else values
        total = 0.0
        for unit, keys in self.factors:
            e, _ = unit.evaluate(*[values[k] for k in keys])
            total += 0.5 * float(np.sum((np.asarray(e) / unit.sigmas) ** 2))
        return total


@dataclass
class LMSettings:
    max_iterations: int = 50
    relative_tolerance: float = 1e-10   # stop when the Gauss–Newton model predicts less decrease than this × cost
    absolute_tolerance: float = 1e-14
    lambda_initial: float = 1e-12       # relative to diag(JᵀJ) (Marquardt scaling); 0 after good steps
    lambda_factor: float = 10.0


@dataclass
class LMReport:
    iterations: int          # accepted steps
    evaluations: int         # evaluations of the nonlinear factors
    initial_error: float
    final_error: float
    converged: bool
    seconds: float


# ----------------------------------------------------------------------------------------------
# sparse Levenberg–Marquardt over factor units
# ----------------------------------------------------------------------------------------------
class _Group:
    """Factors of one shape: whitened residuals r (F, d) and Jacobians J (F, d, w) over the columns
    `cols` (F, w) of the stacked variable vector (the factor's slots side by side)."""

    def __init__(self, factors, dims, offset, linear: bool, offsets_by_step=None, first_steps=None):
        self.factors = factors
        unit0, keys0 = factors[0]
        self.F, self.d = len(factors), unit0.dim
        self.widths = [dims[k] for k in keys0]
        self.w = int(sum(self.widths))
        self.bounds = np.cumsum([0] + self.widths)
        local = np.concatenate([np.arange(wi) for wi in self.widths]) if self.widths else np.zeros(0, int)
        k_first = min((k[1] for k in keys0), default=0)
        self.rel = np.array([k[1] - k_first for k in keys0], dtype=np.intp)      # slot steps − first step
        if first_steps is None:
            first_steps = np.array([min((k[1] for k in keys), default=0) for _, keys in factors], dtype=np.intp)
        self.first_steps = np.asarray(first_steps, dtype=np.intp)
        if offsets_by_step is not None:
            starts = np.column_stack([offsets_by_step[name][self.first_steps + r] for (name, _), r
                                      in zip(keys0, self.rel)]) if keys0 else np.zeros((self.F, 0), dtype=np.intp)
        else:
            starts = np.array([[offset[k] for k in keys] for _, keys in factors], dtype=np.intp).reshape(self.F, -1)
        self.cols = np.repeat(starts, self.widths, axis=1) + local[None, :]
        units = [u for u, _ in factors]
        self.shared_unit = all(u is unit0 for u in units)
        if self.shared_unit:
            self.inv_sigma = np.repeat(1.0 / np.asarray(unit0.sigmas, float).reshape(1, self.d), self.F, axis=0)
        else:
            self.inv_sigma = 1.0 / np.array([np.asarray(u.sigmas, float).reshape(self.d) for u in units])
        self.linear = linear
        self.J_shared = None
        self.J = np.zeros((self.F, self.d, self.w))
        self.r = np.zeros((self.F, self.d))
        if linear and self._linear_bulk(units, dims, keys0):
            pass
        elif linear:
            cache = {}
            self.b = np.zeros((self.F, self.d))
            for i, (unit, keys) in enumerate(factors):
                hit = cache.get(id(unit))
                if hit is None:
                    e, Js = unit.evaluate(*[np.zeros(dims[k]) for k in keys])
                    hit = (np.concatenate([np.asarray(J, float).reshape(self.d, -1) for J in Js], axis=1),
                           np.asarray(e, float).reshape(self.d))
                    cache[id(unit)] = hit
                self.J[i] = hit[0]
                self.b[i] = -hit[1]
            self.J *= self.inv_sigma[:, :, None]
            self.b *= self.inv_sigma

    def _linear_bulk(self, units, dims, keys0) -> bool:
        """J and b of a linear group without a per-factor loop: one shared unit, or priors that differ
        only in their means.  False when neither applies."""
        import mbfg_ros.factors as F
        unit0 = units[0]
        if self.shared_unit:
            e, Js = unit0.evaluate(*[np.zeros(dims[k]) for k in keys0])
            J0 = np.concatenate([np.asarray(J, float).reshape(self.d, -1) for J in Js], axis=1)
            self.b = np.repeat(-np.asarray(e, float).reshape(1, self.d), self.F, axis=0)
        elif (type(unit0) is F.Prior and getattr(unit0, "_J", None) is not None
              and all(type(u) is F.Prior and getattr(u, "_J", None) is unit0._J and u.size == unit0.size
                      and u.select is unit0.select for u in units)):
            J0 = np.asarray(unit0._J, float).reshape(self.d, self.w)
            self.b = np.array([u.mean for u in units], dtype=float).reshape(self.F, self.d)
        else:
            return False
        self.b *= self.inv_sigma
        if np.all(self.inv_sigma == self.inv_sigma[:1]):
            # one whitened Jacobian for all factors (J is a read-only broadcast view of it)
            self.J_shared = J0 * self.inv_sigma[0][:, None]
            self.J = np.broadcast_to(self.J_shared, (self.F, self.d, self.w))
        else:
            self.J[:] = J0
            self.J *= self.inv_sigma[:, :, None]
        return True

    def reach(self) -> int:
        """Largest column distance between two entries that JᵀJ of this group couples: over the
        structural nonzeros of the (constant) Jacobians of a linear group, the whole extent of the
        factors otherwise."""
        if not self.w:
            return 0
        if self.linear:
            nz = (self.J_shared != 0 if self.J_shared is not None else np.any(self.J != 0, axis=0)).astype(np.intp)
            I, Jc = np.nonzero(np.triu(nz.T @ nz))
            return int(np.abs(self.cols[:, Jc] - self.cols[:, I]).max(initial=0)) if I.size else 0
        return int((self.cols.max(axis=1) - self.cols.min(axis=1)).max(initial=0))

    def set_linear_residual(self, x):
        self.r = self.times(x) - self.b

    def times(self, x):
        """J x, (F, d)."""
        if self.J_shared is not None:
            return x[self.cols] @ self.J_shared.T
        return np.einsum("fdw,fw->fd", self.J, x[self.cols])

    def transpose_times(self, y, n):
        """Jᵀ y for y (F, d), as an n-vector."""
        Jty = y @ self.J_shared if self.J_shared is not None else np.einsum("fdw,fd->fw", self.J, y)
        return np.bincount(self.cols.ravel(), Jty.ravel(), minlength=n)

    def normal_blocks(self):
        """JᵀJ per factor, (F, w, w) (a broadcast view when all factors share one Jacobian)."""
        if self.J_shared is not None:
            return np.broadcast_to(self.J_shared.T @ self.J_shared, (self.F, self.w, self.w))
        if self.linear and self.F and np.array_equal(self.J, np.broadcast_to(self.J[0], self.J.shape)):
            return np.broadcast_to(self.J[0].T @ self.J[0], (self.F, self.w, self.w))
        return np.swapaxes(self.J, 1, 2) @ self.J


class _Assembly:
    """The least-squares problem of a `Problem` in stacked form (columns ordered by time step), with
    the normal equations accumulated directly in LAPACK band storage (the graphs here are chains)."""

    def __init__(self, prob: Problem):
        self.prob = prob
        self.factor = None          # last banded Cholesky factorization (cb, d, λ)
        all_steps = np.array([k[1] for k in prob.keys], dtype=np.intp)
        order = np.argsort(all_steps, kind="stable")              # by step, then as added
        self.keys = [prob.keys[i] for i in order.tolist()]
        key_steps = all_steps[order]
        key_dims = np.array([prob.dims[k] for k in self.keys], dtype=np.intp)
        starts = np.concatenate(([0], np.cumsum(key_dims)))
        self.n = int(starts[-1])
        self.offset: Dict[Key, int] = dict(zip(self.keys, starts[:-1].tolist()))
        self.slices = list(zip(self.keys, starts[:-1].tolist(), starts[1:].tolist()))
        # offsets by variable name and step, for vectorized column lookups
        key_names = [k[0] for k in self.keys]
        names = list(dict.fromkeys(key_names))
        name_index = np.array([names.index(nm) for nm in key_names] if len(names) > 1 else
                              [0] * len(key_names), dtype=np.intp)
        self._by_name = {}
        for i, name in enumerate(names):
            mask = name_index == i
            self._by_name[name] = (key_steps[mask], starts[:-1][mask], key_dims[mask])
        by_step: Optional[Dict[str, np.ndarray]] = None
        if not key_steps.size or key_steps.min() >= 0:
            max_step = int(key_steps.max(initial=0))
            by_step = {}
            for name, (st, off, _) in self._by_name.items():
                arr = by_step[name] = np.full(max_step + 1, -1, dtype=np.intp)
                arr[st] = off
        # (negative steps: the columns are looked up key by key)
        groups = list(prob.groups.items())
        # the linear part is reused from the previous assembly of this problem when neither the
        # variables nor the linear factors changed (stage 3 only adds velocity constraints)
        n_lin = sum(len(g) for _, g in groups if _unit_is_linear(g[0][0]))
        signature = (len(self.keys), n_lin)
        cached = getattr(prob, "_linear_cache", None)
        reuse = cached is not None and cached[0] == signature
        make = lambda sig, g, linear: _Group(g, prob.dims, self.offset, linear, by_step, prob._first_steps(sig))
        self.lin_groups = cached[1] if reuse else [make(sig, g, True) for sig, g in groups
                                                   if _unit_is_linear(g[0][0])]
        self.nl_groups = [make(sig, g, False) for sig, g in groups if not _unit_is_linear(g[0][0])]
        self.groups = self.lin_groups + self.nl_groups
        # groups of supported units are evaluated over all their factors at once (`batched`)
        for G in self.nl_groups:
            G.batched = batched.evaluator([u for u, _ in G.factors]) if _VECTORIZE else None
            if G.batched is not None:
                G.mech = G.factors[0][0].mech
                G.slot_cols = [G.cols[:, G.bounds[s]:G.bounds[s + 1]] for s in range(len(G.widths))]
                G.starts = [c[:, 0] for c in G.slot_cols]
        self._batch_cache: dict = {}
        # the others step by step so the units of one step share an EvalContext (Φq, dynamics)
        # within a step, units with more slots first: the dynamics linearization then supplies
        # Φq and Φ̇q to the constraint units through the context
        order = [(min(k[1] for k in keys), -len(G.widths), gi, i) for gi, G in enumerate(self.nl_groups)
                 if G.batched is None for i, (_, keys) in enumerate(G.factors)]
        order.sort()
        self.eval_order = [(gi, i) for _, _, gi, i in order]
        # band storage: H[i, j] (i ≤ j) at ab[u + i − j, j]
        # (the half bandwidth counts only the entries JᵀJ can fill: for the linear groups the structural
        # nonzeros of their Jacobians — a second difference of q̇ couples q̇ᵢ at k−1 and k+1, not
        # all of their neighbours — and the whole extent of each nonlinear factor)
        self.u = int(max((G.reach() for G in self.groups if G.w), default=0))
        self.band_ok = (self.u + 1) * max(self.n, 1) <= 60_000_000
        self.blocks = self._block_layout(prob) if self.band_ok else None
        if self.band_ok:
            if self.blocks is None:          # general layout: scatter every entry (slower)
                u1 = self.u + 1
                for G in self.groups:
                    I, Jc = G.cols[:, :, None], G.cols[:, None, :]
                    G.upper = np.broadcast_to((I <= Jc) & (Jc - I <= self.u), (G.F, G.w, G.w))
                    G.band_index = ((self.u + I - Jc) + u1 * Jc)[G.upper]
            ok = reuse and cached[2] is not None and cached[2].shape == (self.u + 1, self.n)
            self.H_lin_band = cached[2] if ok else self._band(self.lin_groups)
        prob._linear_cache = (signature, self.lin_groups, self.H_lin_band if self.band_ok else None)

    def _block_layout(self, prob):
        """(N, P, b) when every step holds the same variables (block b) and every factor of a group
        touches the same relative steps at the same in-block positions: the normal equations are then
        accumulated as dense b×b blocks H[k, k + dk], dk < P, with slice additions."""
        if not self.keys:
            return None
        # every name at every step of one range, with one dimension, at one position within the step
        lo = min(int(st.min()) for st, _, _ in self._by_name.values())
        hi = max(int(st.max()) for st, _, _ in self._by_name.values())
        n_steps = hi - lo + 1
        b = 0
        for st, off, dm in self._by_name.values():
            if st.size != n_steps or np.any(st != np.arange(lo, hi + 1)) or np.any(dm != dm[0]):
                return None
            b += int(dm[0])
        for st, off, dm in self._by_name.values():
            if np.any(off - (st - lo) * b != off[0]):
                return None
        k_base = lo
        P = 1
        for G in self.groups:
            # the slots of a group sit at the same relative steps (G.rel: part of the group's
            # signature); their in-block positions must agree too
            k0 = G.first_steps
            pos = G.cols[:, G.bounds[:-1]] - (k0[:, None] + G.rel[None, :] - k_base) * b
            if np.any(pos != pos[:1]):
                return None
            G.k0 = k0 - k_base
            G.pos = pos[0]
            G.unique = len(np.unique(G.k0)) == G.F
            G.contiguous = bool(G.F and np.all(np.diff(G.k0) == 1))
            P = max(P, int(G.rel.max(initial=0)) + 1)
        return n_steps, P, b

    def _band(self, groups, ab=None):
        """Σ JᵀJ of `groups` in band storage (u+1, n), Fortran order: H[i, j] (i ≤ j) at ab[u + i − j, j];
        added into `ab` when given (Fortran-ordered, shape (u+1, n))."""
        n, u = self.n, self.u
        if ab is None:
            ab = np.zeros((u + 1, n), order="F")
        flat = ab.reshape(-1, order="F")          # a view: ab is Fortran-contiguous
        if self.blocks is None:
            for G in groups:
                if G.F and G.w:
                    flat += np.bincount(G.band_index, G.normal_blocks()[G.upper], minlength=flat.size)
            return ab
        b = self.blocks[2]
        for G in groups:
            if not (G.F and G.w):
                continue
            NB = G.normal_blocks()
            if self._single_step(G):
                # every slot in the factor's own step, consecutive steps: the upper triangle of each
                # factor's block goes to a strided view W[k, i, j] = H[kb + i, kb + j] (valid for i ≤ j)
                from numpy.lib.stride_tricks import as_strided
                S = b * (u + 1)
                start = u + int(G.k0[0]) * S
                W = as_strided(flat[start:], shape=(G.F, b, b),
                               strides=(S * flat.itemsize, flat.itemsize, u * flat.itemsize))
                for c1, p1, sel, targets in G.scatter:
                    W[:, p1, targets] += NB[:, c1, sel]
                continue
            nslots = len(G.widths)
            for s_ in range(nslots):
                for t_ in range(nslots):
                    rs, rt = G.rel[s_], G.rel[t_]
                    if rs > rt:
                        continue
                    blk = NB[:, G.bounds[s_]:G.bounds[s_ + 1], G.bounds[t_]:G.bounds[t_ + 1]]
                    shared = blk.strides[0] == 0          # one block for all factors
                    nz = blk[0] != 0 if shared else np.any(blk != 0, axis=0)
                    for p_, q_ in zip(*np.nonzero(nz)):
                        dist = (rt - rs) * b + G.pos[t_] + q_ - G.pos[s_] - p_
                        if dist < 0 or dist > u:     # lower triangle; beyond the band only zeros
                            continue
                        vals = blk[0, p_, q_] if shared else blk[:, p_, q_]
                        if G.contiguous:
                            j0 = (int(G.k0[0]) + rt) * b + G.pos[t_] + q_
                            ab[u - dist, j0:j0 + b * G.F:b] += vals
                        else:
                            j = (G.k0 + rt) * b + G.pos[t_] + q_
                            if G.unique:
                                ab[u - dist, j] += vals
                            else:
                                np.add.at(ab[u - dist], j, np.broadcast_to(vals, j.shape))
        return ab

    def _single_step(self, G) -> bool:
        """Is G a group of one-step factors on consecutive steps (the strided scatter of `_band`)?
        Prepares G.scatter: per column c1 of the factor, its in-block position p1 and the columns
        `sel` (in-block positions `targets` ≥ p1) of its upper-triangle entries."""
        ok = getattr(G, "scatter", None)
        if ok is None:
            good = bool(G.contiguous and G.unique and np.all(G.rel == 0))
            if good:
                P = np.concatenate([G.pos[s_] + np.arange(G.widths[s_]) for s_ in range(len(G.widths))])
                good = len(np.unique(P)) == P.size and self.u >= self.blocks[2] - 1
            G.scatter = False
            if good:
                G.scatter = []
                for c1 in range(G.w):
                    sel = np.nonzero(P >= P[c1])[0]
                    G.scatter.append((c1, int(P[c1]), sel, P[sel]))
            ok = G.scatter
        return ok is not False

    def pack(self, values) -> np.ndarray:
        return np.concatenate([values[k] for k in self.keys]) if self.keys else np.zeros(0)

    def unpack(self, x) -> Dict[Key, np.ndarray]:
        return {k: x[a:b] for k, a, b in self.slices}

    def evaluate(self, x) -> float:
        """Residuals and Jacobians of every group at x; returns the cost ½ Σ |r|²."""
        groups = self.nl_groups
        contexts = {}
        for G in groups:
            if G.batched is None:
                continue
            bctx = contexts.get(id(G.mech))
            if bctx is None:
                bctx = contexts[id(G.mech)] = batched.BatchContext(G.mech, self._batch_cache)
            e, Js = G.batched(bctx, G.starts, *[x[c] for c in G.slot_cols])
            G.r[:] = e
            for s, Jb in enumerate(Js):
                G.J[:, :, G.bounds[s]:G.bounds[s + 1]] = Jb
        vals = self.unpack(x) if self.eval_order else None
        ctx = _eval_context(self.prob) if self.eval_order else None
        for gi, i in self.eval_order:
            G = groups[gi]
            unit, keys = G.factors[i]
            blocks = [vals[k] for k in keys]
            e, Js = unit.evaluate(*blocks, ctx=ctx) if ctx is not None else unit.evaluate(*blocks)
            G.r[i] = e
            Ji = G.J[i]
            for s, Jb in enumerate(Js):
                Ji[:, G.bounds[s]:G.bounds[s + 1]] = Jb
        for G in groups:
            G.r *= G.inv_sigma
            G.J *= G.inv_sigma[:, :, None]
        for G in self.lin_groups:
            G.set_linear_residual(x)
        return 0.5 * float(sum(np.sum(G.r * G.r) for G in self.groups))

    def gradient(self):
        g = np.zeros(self.n)
        for G in self.groups:
            g += G.transpose_times(G.r, self.n)
        return g

    def hessian_times(self, x):
        out = np.zeros(self.n)
        for G in self.groups:
            out += G.transpose_times(G.times(x), self.n)
        return out

    def model_decrease(self, g, dx) -> float:
        """Decrease of the Gauss–Newton model for the step dx: −gᵀdx − ½ |J dx|²."""
        return float(-(g @ dx) - 0.5 * sum(np.sum(G.times(dx) ** 2) for G in self.groups))

    def step(self, g, lam: float) -> np.ndarray:
        """dx = −(H + λ diag H)⁻¹ g (banded Cholesky + up to two refinement steps)."""
        import scipy.linalg as sla
        n, u = self.n, self.u
        self.factor = None
        if not self.band_ok:
            return self._step_sparse(g, lam)
        ab = self._band(self.nl_groups, self.H_lin_band.copy(order="F"))
        diag = ab[u].copy()
        d2 = np.maximum(diag, 1e-300 + 1e-14 * max(1.0, float(diag.max(initial=1.0))))
        d = np.sqrt(d2)
        # H + λ D² with D² = diag H: the Jacobi-scaled system D⁻¹HD⁻¹ + λI without forming it (Cholesky
        # is invariant under diagonal scaling; the residuals are measured in the scaled variables)
        ab[u] += lam * d2
        try:
            cb = sla.cholesky_banded(ab, lower=False, overwrite_ab=True, check_finite=False)
        except (np.linalg.LinAlgError, ValueError):
            self.factor = None
            return self._step_sparse(g, lam)
        self.factor = (cb, d, lam)
        return self.refined_step(g)

    def refined_step(self, g, with_residual: bool = False):
        """The step for gradient g with the last factorization, refined (up to twice) against the
        current Jacobians, so a factorization from the previous iterate gives a good step too; the
        refinement stops once the relative residual |H dx + g| / |g| of the scaled system is below
        1e-10 (a fresh factorization is usually there at once).  With `with_residual`, also that
        residual."""
        import scipy.linalg as sla
        cb, d, lam = self.factor
        gs = g / d
        hs = lambda y: self.hessian_times(y / d) / d + lam * y
        solve_s = lambda r: sla.cho_solve_banded((cb, False), r * d, check_finite=False) * d
        y = solve_s(-gs)
        scale = max(float(np.linalg.norm(gs)), 1e-300)
        res = math.inf
        for i in range(_REFINE + 1):
            if i == _REFINE and not with_residual:
                break
            r = -gs - hs(y)
            res = float(np.linalg.norm(r)) / scale
            if res <= _REFINE_TOLERANCE or i == _REFINE:
                break
            y += solve_s(r)
        return (y / d, res) if with_residual else y / d

    def _step_sparse(self, g, lam: float) -> np.ndarray:
        rows, cols, vals = [], [], []
        for G in self.groups:
            if G.F and G.w:
                B = G.normal_blocks()
                rows.append(np.broadcast_to(G.cols[:, :, None], B.shape).ravel())
                cols.append(np.broadcast_to(G.cols[:, None, :], B.shape).ravel())
                vals.append(B.ravel())
        H = sp.csc_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                          shape=(self.n, self.n))
        diag = H.diagonal()
        D = sp.diags(np.maximum(diag, 1e-12 * max(1.0, float(diag.max(initial=1.0)))))
        try:
            return spla.spsolve((H + lam * D).tocsc(), -g)
        except RuntimeError:
            return np.full(self.n, np.nan)


class _single_threaded_blas:
    """Run OpenBLAS single-threaded inside the block: the banded Cholesky is a long chain of small
    BLAS calls, which threads only slow down (10× on a busy 2-core machine)."""

    _libs = None

    @classmethod
    def _find(cls):
        if cls._libs is not None:
            return cls._libs
        import ctypes
        libs = []
        try:
            with open("/proc/self/maps") as f:
                paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
        except OSError:
            paths = set()
        for path in sorted(paths):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for prefix in ("scipy_openblas", "openblas"):
                found = False
                for suffix in ("64_", ""):
                    try:
                        setter = getattr(lib, f"{prefix}_set_num_threads{suffix}")
                        getter = getattr(lib, f"{prefix}_get_num_threads{suffix}")
                    except AttributeError:
                        continue
                    getter.restype = ctypes.c_int
                    libs.append((setter, getter))
                    found = True
                    break
                if found:
                    break
        cls._libs = libs
        return libs

    def __enter__(self):
        self._saved = []
        try:
            for setter, getter in self._find():
                self._saved.append((setter, getter()))
                setter(1)
        except Exception:
            pass
        return self

    def __exit__(self, *exc):
        for setter, n in self._saved:
            try:
                setter(n)
            except Exception:
                pass
        return False


def _eval_context(prob: Problem):
    """A fresh `factors.EvalContext` for the problem's mechanism (None without one)."""
    mech = getattr(prob, "mech", None)
    if mech is None:
        return None
    from mbfg_ros.dynamics.cache import EvalContext
    return EvalContext(mech)


def _solve_sparse(prob: Problem, settings: LMSettings) -> LMReport:
    t0 = time.perf_counter()
    asm = _Assembly(prob)
    x = asm.pack(prob.values)
    cost = asm.evaluate(x)
    evaluations = 1
    initial = cost
    lam = settings.lambda_initial
    iterations = 0
    converged = False
    g = asm.gradient()
    saved = None
    while iterations < settings.max_iterations:
        _t = time.perf_counter()
        dx = asm.step(g, lam)
        if _DEBUG:
            print(f"   solve {time.perf_counter() - _t:.3f} s (n {asm.n}, band {asm.u})")
        if not np.all(np.isfinite(dx)):
            lam = max(lam * settings.lambda_factor, settings.lambda_initial)
            if lam > 1e12:
                break
            continue
        predicted = asm.model_decrease(g, dx)
        if _DEBUG:
            print(f"  it {iterations} cost {cost:.6g} pred {predicted:.3g} lam {lam:.1g} |dx| {np.abs(dx).max():.3g}")
        if predicted <= settings.relative_tolerance * cost + settings.absolute_tolerance:
            converged = True
            break
        saved = [(G.r.copy(), G.J if G.linear else G.J.copy()) for G in asm.groups]
        x_new = x + dx
        _t = time.perf_counter()
        cost_new = asm.evaluate(x_new)
        evaluations += 1
        if _DEBUG:
            print(f"   evaluate {time.perf_counter() - _t:.3f} s")
        if np.isfinite(cost_new) and cost_new < cost:
            decrease = cost - cost_new
            x, cost = x_new, cost_new
            iterations += 1
            g = asm.gradient()
            rho = decrease / max(predicted, 1e-300)
            if rho > 0.25:
                lam = lam / settings.lambda_factor ** 2 if lam > 1e-16 else 0.0
            if decrease <= settings.relative_tolerance * cost + settings.absolute_tolerance:
                converged = True
                break
            if asm.factor is not None and 0.5 < rho < 2.0:
                # convergence test without a new factorization: the step from the previous one,
                # refined against the new Jacobians, is (nearly) the Gauss–Newton step
                dx_test, residual = asm.refined_step(g, with_residual=True)
                if (residual < 1e-2 and np.all(np.isfinite(dx_test)) and asm.model_decrease(g, dx_test)
                        <= settings.relative_tolerance * cost + settings.absolute_tolerance):
                    converged = True
                    break
        else:
            for G, (r, J) in zip(asm.groups, saved):      # back to the linearization at x
                G.r, G.J = r, J
            lam = max(lam * settings.lambda_factor, settings.lambda_initial)
            if lam > 1e12:
                break
    prob.values.update(asm.unpack(x.copy()))      # views into one private copy
    return LMReport(iterations, evaluations, initial, cost, converged, time.perf_counter() - t0)


# ----------------------------------------------------------------------------------------------
# GTSAM Levenberg–Marquardt (paper structure: one CustomFactor per unit and time step)
# ----------------------------------------------------------------------------------------------
_SYMBOLS = {"q": "q", "v": "v", "a": "a", "tau": "t", "j": "j", "z": "z", "zd": "y", "zdd": "w"}


def _gtsam_key(key: Key) -> int:
    import gtsam
    name, k = key
    return gtsam.symbol(_SYMBOLS.get(name, name[0]), int(k))


def _solve_gtsam(prob: Problem, settings: LMSettings) -> LMReport:
    import gtsam
    from mbfg_ros.graph.gtsam_adapters import custom_factor
    t0 = time.perf_counter()
    graph = gtsam.NonlinearFactorGraph()
    for unit, keys in prob.factors:
        graph.add(custom_factor(unit, [_gtsam_key(k) for k in keys]))
    values = gtsam.Values()
    for k in prob.keys:
        values.insert(_gtsam_key(k), np.asarray(prob.values[k], float))
    params = gtsam.LevenbergMarquardtParams()
    params.setLinearSolverType("MULTIFRONTAL_QR")
    params.setMaxIterations(settings.max_iterations)
    params.setRelativeErrorTol(settings.relative_tolerance)
    params.setAbsoluteErrorTol(settings.absolute_tolerance)
    params.setlambdaInitial(1e-5)
    params.setlambdaUpperBound(1e12)
    initial = graph.error(values)
    opt = gtsam.LevenbergMarquardtOptimizer(graph, values, params)
    result = opt.optimize()
    for k in prob.keys:
        prob.values[k] = np.asarray(result.atVector(_gtsam_key(k)), float).copy()
    final = graph.error(result)
    its = opt.iterations()
    return LMReport(its, its + 1, initial, final, its < settings.max_iterations, time.perf_counter() - t0)


def solve(prob: Problem, settings: Optional[LMSettings] = None, engine: str = "sparse") -> LMReport:
    """Levenberg–Marquardt on `prob` from `prob.values`; the result is written back into `prob.values`."""
    settings = settings or LMSettings()
    if engine == "sparse":
        with _single_threaded_blas():
            return _solve_sparse(prob, settings)
    if engine == "gtsam":
        return _solve_gtsam(prob, settings)
    raise ValueError(f"engine must be 'sparse' or 'gtsam' (got '{engine}')")


# ----------------------------------------------------------------------------------------------
# trajectories and closed-form references
# ----------------------------------------------------------------------------------------------
def quintic_move(t, start, end, t0: float, t1: float):
    """Smooth rest-to-rest move (5th-order polynomial) from `start` at t0 to `end` at t1.

    Returns (value, rate, acceleration) arrays of shape (len(t), len(start)); constant outside [t0, t1].
    """
    t = np.asarray(t, dtype=float).reshape(-1, 1)
    start, end = np.atleast_1d(np.asarray(start, float)), np.atleast_1d(np.asarray(end, float))
    T = t1 - t0
    s = np.clip((t - t0) / T, 0.0, 1.0)
    inside = ((t > t0) & (t < t1)).astype(float)
    p = 10 * s ** 3 - 15 * s ** 4 + 6 * s ** 5
    dp = (30 * s ** 2 - 60 * s ** 3 + 30 * s ** 4) / T * inside
    ddp = (60 * s - 180 * s ** 2 + 120 * s ** 3) / T ** 2 * inside
    d = end - start
    return start + p * d, dp * d, ddp * d


def _position_continuation(mech: Mechanism, values: np.ndarray, q_start=None, assembly_mode=None,
                           tol: float = 1e-12, stride: int = 16):
    """Per-step position problems with the actuated coordinates at `values` (N, n_actuated).

    Step 0 is the full position problem (`kinematics.solve_positions[_on_mode]`).  Then every
    `stride`-th step is solved in sequence by a few Newton iterations from the quadratic extrapolation
    of the previous solutions (continuation: keeps the branch, the assembly mode); where that fails
    (no convergence, another branch) the steps since the last solved one are solved one by one
    instead.  The steps in between start from the cubic interpolation of the solved ones and are
    solved all at once (`batched.newton_positions`); any that do not converge, land on another
    branch or on a point mirrored across a relative angle's direction are redone in sequence from
    their predecessors.  `stride` = 1 solves every step in sequence
    (each from the extrapolation of the three before it).
    """
    act = list(mech.actuated)
    free = np.setdiff1d(np.arange(mech.n), act)
    N = len(values)
    q = np.empty((N, mech.n))
    guess = np.array(mech.q0 if q_start is None else q_start, dtype=float)
    guess[act] = values[0]
    first = (kinematics.solve_positions_on_mode(mech, guess, fixed=act, assembly_mode=assembly_mode)
             if assembly_mode is not None else kinematics.solve_positions(mech, guess, fixed=act))
    q[0] = first.q
    mode0 = mech.assembly_mode(q[0])
    bc = batched.BatchConstraints(mech.constraints)
    solved = [0]
    # the coarse grid: the actuated coordinates move by at most _COARSE_MOTION per interval
    while stride > 1 and N > stride and np.abs(values[stride:] - values[:-stride]).max(initial=0.0) > _COARSE_MOTION:
        stride //= 2
    if stride <= 1 or N < 4 * stride or not bc.supported:
        for k in range(1, N):
            _position_step(mech, values, q, k, solved[-3:], free, mode0, tol, fallback=True)
            solved.append(k)
        return q

    def spaced(k_last):            # up to three solved steps about `stride` apart, the last one first
        out = [solved[-1]]
        for j in reversed(solved[:-1]):
            if len(out) == 3:
                break
            if out[-1] - j >= stride:
                out.append(j)
        return out

    for c in np.unique(np.r_[np.arange(stride, N, stride), N - 1]).tolist():
        if _position_step(mech, values, q, c, spaced(c), free, mode0, tol, fallback=False):
            solved.append(c)
            continue
        for k in range(solved[-1] + 1, c + 1):           # hard stretch: step by step
            _position_step(mech, values, q, k, solved[-3:], free, mode0, tol, fallback=True)
            solved.append(k)
    grid = np.array(solved)
    others = np.setdiff1d(np.arange(N), grid)
    if not others.size:
        return q
    guess = _cubic_interpolation(grid, q[grid], others)
    guess[:, act] = values[others]
    x = guess.copy()
    ok = batched.newton_positions(bc, x, free, tol) & batched.angles_consistent(mech, x)
    if len(mode0):
        ok &= np.all(batched.assembly_modes(mech, x) == mode0, axis=1)
    # a Newton correction that is not small against the motion over the grid interval means the
    # interpolation was poor there (near a singular pose): solve those steps in sequence instead
    j = np.searchsorted(grid, others)
    motion = np.abs(q[grid[j]] - q[grid[j - 1]]).max(axis=1)
    ok &= np.abs(x - guess).max(axis=1) <= 0.1 * motion + 1e-12
    q[others] = x
    for k in others[~ok].tolist():              # in order: their predecessors are solved by then
        _position_step(mech, values, q, k, [j for j in (k - 3, k - 2, k - 1) if j >= 0], free, mode0, tol,
                       fallback=True)
    return q


def _position_step(mech, values, q, k, prev, free, mode0, tol, fallback: bool) -> bool:
    """Solve the position problem of step k into q[k]: Newton on the free coordinates from the
    Lagrange extrapolation through the solved steps `prev` (any spacing).  Returns whether Newton
    converged on the branch `mode0`; if not, with `fallback` q[k] is the full position problem from
    the nearest solved step (as `kinematics.solve_positions`), else q[k] is left unset."""
    act = list(mech.actuated)
    C = mech.constraints
    x = np.zeros(mech.n)
    for a_ in prev:
        w = 1.0
        for b_ in prev:
            if b_ != a_:
                w *= (k - b_) / (a_ - b_)
        x += w * q[a_]
    x[act] = values[k]
    x0 = x.copy()
    ok = False
    for _ in range(8):
        phi, J = C.phi_and_jacobian(x)
        if np.abs(phi).max(initial=0.0) <= tol:
            ok = True
            break
        Jf = J[:, free]
        try:
            step = np.linalg.solve(Jf.T @ Jf, -(Jf.T @ phi))
        except np.linalg.LinAlgError:
            break
        x[free] += step
    ok = ok and not (len(mode0) and np.any(mech.assembly_mode(x) != mode0))
    if ok and not fallback:
        # a coarse step: also reject a point mirrored across a relative angle's direction, and a
        # Newton correction that is not small against the motion since the last solved step
        ok = (bool(batched.angles_consistent(mech, x[None, :])[0]) and
              np.abs(x - x0).max() <= 0.5 * np.abs(x0 - q[prev[0]]).max() + 1e-12)
    if ok:
        q[k] = x
    elif fallback:
        guess = q[max(prev)].copy()
        guess[act] = values[k]
        q[k] = kinematics.solve_positions(mech, guess, fixed=act, tol=tol).q
    return ok


def _cubic_interpolation(grid, values, at):
    """Values at the points `at` of the cubic through the four grid points around each (Lagrange)."""
    G = len(grid)
    j = np.clip(np.searchsorted(grid, at) - 2, 0, max(G - 4, 0))          # first of the 4 points
    idx = j[:, None] + np.arange(min(4, G))[None, :]
    xs = grid[idx].astype(float)                                          # (P, 4)
    t = np.asarray(at, float)[:, None]
    w = np.ones_like(xs)
    for a_ in range(xs.shape[1]):
        for b_ in range(xs.shape[1]):
            if a_ != b_:
                w[:, a_] *= (t[:, 0] - xs[:, b_]) / (xs[:, a_] - xs[:, b_])
    return np.einsum("pa,pan->pn", w, values[idx])


def closed_form_motion(mech: Mechanism, values, rates, accelerations, q_start=None, assembly_mode=None):
    """Exact (q, q̇, q̈) per step for prescribed actuated coordinates and their exact derivatives:
    position problems with continuation, then the velocity and acceleration problems."""
    values = np.asarray(values, float).reshape(len(values), -1)
    rates = np.asarray(rates, float).reshape(values.shape)
    accelerations = np.asarray(accelerations, float).reshape(values.shape)
    act = list(mech.actuated)
    q = _position_continuation(mech, values, q_start, assembly_mode)
    v = np.empty_like(q)
    a = np.empty_like(q)
    for k in range(len(q)):
        v[k] = kinematics.solve_velocities(mech, q[k], act, rates[k])
        a[k] = kinematics.solve_accelerations(mech, q[k], v[k], act, accelerations[k])
    return q, v, a


def closed_form_efforts(mech: Mechanism, q, v, a, Q_known=None) -> np.ndarray:
    """τ_k = closed-form inverse dynamics (`dynamics.inverse_dynamics`) at every step, (N, n_actuated)."""
    return np.array([dynamics.inverse_dynamics(mech, q[k], v[k], a[k], Q_known) for k in range(len(q))]
                    ).reshape(len(q), len(mech.actuated))


# ----------------------------------------------------------------------------------------------
# staged inverse dynamics (paper §7.2)
# ----------------------------------------------------------------------------------------------
@dataclass
class InverseDynamicsSigmas:
    """Noise sigmas of the staged inverse-dynamics graph (only ratios matter)."""
    trajectory: float = 1e-5            # prior on the actuated coordinates (the prescribed trajectory)
    position_constraints: float = 1e-3  # Φ(q)
    velocity_constraints: float = 1e-3  # Φq q̇
    integrator: float = 1e-3            # trapezoidal q–q̇ and q̇–q̈
    dynamics: float = 1e-3              # inverse-dynamics factor q̈(q, q̇; Qg + Eτ) − q̈
    soft_equality: float = 10.0         # q_k → q_k+1 (keeps the branch)
    smoothness: float = 1e3             # second differences of q̇ and q̈ (fix the trapezoid's sawtooth modes)


@dataclass
class StageReport:
    stage: int
    variables: int
    factors: int
    iterations: int
    evaluations: int
    initial_error: float
    final_error: float
    converged: bool
    seconds: float            # whole stage: initial guess, graph construction and LM


@dataclass
class InverseDynamicsResult:
    t: np.ndarray             # (N,)
    q: np.ndarray             # (N, n)
    v: np.ndarray             # (N, n)
    a: np.ndarray             # (N, n)
    tau: np.ndarray           # (N, n_actuated), actuator order
    stages: List[StageReport] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return float(sum(s.seconds for s in self.stages))


class SecondDifference:
    """e = x_{k−1} − 2 x_k + x_{k+1} (slots x_prev2, x_prev, x): a smoothness prior that vanishes on
    linear trends.  The trapezoidal rule leaves a sawtooth (−1)^k in q̈ (and the efforts) undetermined
    when the efforts are free; a soft equality x_{k+1} − x_k would fix it too but drags the end
    values toward their neighbours (an O(Δt·jerk) error at both ends), this one does not.
    Same unit interface as `mbfg_ros.factors` (exactly linear)."""

    linear = True

    def __init__(self, x: str, d: int, sigma: float):
        self.slots = (x + "_prev2", x + "_prev", x)
        self.dim = int(d)
        self.sigmas = np.full(self.dim, float(sigma))
        I = np.eye(self.dim)
        self._J = [I, -2.0 * I, I]
        self.name = f"second_difference({x})"

    def evaluate(self, x0, x1, x2, ctx=None):
        return x0 - 2.0 * x1 + x2, self._J

    def error(self, x0, x1, x2, ctx=None):
        return x0 - 2.0 * x1 + x2

    def copy(self):
        return self


class _LibraryUnits:
    """Factor units of `mbfg_ros.factors` for the staged inverse-dynamics graph (one shared unit
    object per kind; the trajectory priors differ per step)."""

    def __init__(self, mech: Mechanism, dt: float, sigmas: InverseDynamicsSigmas):
        import mbfg_ros.factors as F
        self.F, self.mech, self.dt, self.s = F, mech, dt, sigmas
        n = mech.n
        self._position = F.PositionConstraints(mech, sigmas.position_constraints)
        self._velocity = F.VelocityConstraints(mech, sigmas.velocity_constraints)
        self._idyn = F.InverseDynamics(mech, sigma=sigmas.dynamics)
        self._trap_q = F.TrapezoidalIntegrator("q", "v", n, dt, sigmas.integrator)
        self._trap_v = F.TrapezoidalIntegrator("v", "a", n, dt, sigmas.integrator)
        self._eq_q = F.SoftEquality("q", n, sigmas.soft_equality)
        self._sd_v = SecondDifference("v", n, sigmas.smoothness)
        self._sd_a = SecondDifference("a", n, sigmas.smoothness)

    def prior(self, target):
        return self.F.Prior("q", target, self.s.trajectory, select=self.mech.actuated, size=self.mech.n)

    def priors(self, targets):
        """`prior` for every row of targets: shallow copies of one prior with their own means (they
        share the selection and the Jacobian, so the batch engine stacks them without a loop)."""
        import copy
        base = self.prior(targets[0])
        out = []
        for row in np.asarray(targets, float):
            p = copy.copy(base)
            p.mean = row.copy()
            out.append(p)
        return out

    def position(self):
        return self._position

    def velocity(self):
        return self._velocity

    def inverse_dynamics(self):
        return self._idyn

    def trapezoidal(self, which="q"):
        return self._trap_q if which == "q" else self._trap_v

    def soft_equality(self):
        return self._eq_q

    def smoothness(self, which="v"):
        return self._sd_v if which == "v" else self._sd_a


def _finite_difference(x, dt):
    return np.gradient(x, dt, axis=0, edge_order=2)


def staged_inverse_dynamics(mech: Mechanism, trajectory, dt: float, t0: float = 0.0,
                            sigmas: Optional[InverseDynamicsSigmas] = None,
                            settings: Optional[LMSettings] = None, engine: str = "sparse",
                            assembly_mode=None, q_start=None, stages: int = 4,
                            progress: Optional[Callable[[int], None]] = None,
                            units=None) -> InverseDynamicsResult:
    """The paper's four-stage batch inverse dynamics for prescribed actuated coordinates.

    trajectory: (N, n_actuated) values of the actuated coordinates (actuator order) at t0 + k·dt.
    Returns q, q̇, q̈ (N, n) and the efforts τ (N, n_actuated); `stages` < 4 stops early (τ is NaN).
    `assembly_mode` (±1 per indicator) picks the branch of the first position problem, whose
    initial guess is `q_start` (default: the YAML pose).
    """
    mech_act = list(mech.actuated)
    traj = np.asarray(trajectory, dtype=float)
    traj = traj.reshape(len(traj), -1)
    N = len(traj)
    if traj.shape[1] != len(mech_act) or len(mech_act) == 0:
        raise ValueError(f"trajectory must have one column per actuated coordinate ({len(mech_act)}), "
                         f"got shape {traj.shape}")
    if N < 3:
        raise ValueError("the trajectory needs at least 3 samples")
    if not (dt > 0 and math.isfinite(dt)):
        raise ValueError(f"dt must be > 0 (got {dt})")
    sigmas = sigmas or InverseDynamicsSigmas()
    settings = settings or LMSettings()
    U = units if units is not None else _LibraryUnits(mech, dt, sigmas)
    t = t0 + dt * np.arange(N)
    n = mech.n
    prob = Problem(mech if units is None else None)
    reports: List[StageReport] = []

    def run(stage, t_start):
        rep = solve(prob, settings, engine)
        reports.append(StageReport(stage, len(prob.keys), len(prob.factors), rep.iterations, rep.evaluations,
                                   rep.initial_error, rep.final_error, rep.converged,
                                   time.perf_counter() - t_start))
        if progress is not None:
            progress(stage)

    # --- stage 1: q only ----------------------------------------------------------------------
    ts = time.perf_counter()
    q_init = _position_continuation(mech, traj, q_start, assembly_mode)
    eq = U.soft_equality()
    pos = U.position()
    steps = np.arange(N)
    prob.add_variables("q", q_init)
    priors = U.priors(traj) if hasattr(U, "priors") else [U.prior(traj[k]) for k in range(N)]
    prob.add_factors(priors, [("q", 0)], steps)
    prob.add_factors(pos, [("q", 0)], steps)
    prob.add_factors(eq, [("q", -1), ("q", 0)], steps[1:])
    run(1, ts)
    get = lambda name: np.array([prob.values[(name, k)] for k in range(N)])
    q = get("q")
    if stages < 2:
        nan = np.full((N, n), np.nan)
        return InverseDynamicsResult(t, q, nan, nan.copy(), np.full((N, len(mech_act)), np.nan), reports)

    # --- stage 2: q̇, q̈ with trapezoidal integrators --------------------------------------------
    ts = time.perf_counter()
    v_init = _finite_difference(q, dt)
    a_init = _finite_difference(v_init, dt)
    trap_q, trap_v = U.trapezoidal("q"), U.trapezoidal("v")
    sd_v, sd_a = U.smoothness("v"), U.smoothness("a")
    prob.add_variables("v", v_init)
    prob.add_variables("a", a_init)
    prob.add_factors(trap_q, [("q", 0), ("q", 1), ("v", 0), ("v", 1)], steps[:-1])
    prob.add_factors(trap_v, [("v", 0), ("v", 1), ("a", 0), ("a", 1)], steps[:-1])
    prob.add_factors(sd_v, [("v", -1), ("v", 0), ("v", 1)], steps[1:-1])
    prob.add_factors(sd_a, [("a", -1), ("a", 0), ("a", 1)], steps[1:-1])
    run(2, ts)

    # --- stage 3: velocity constraints --------------------------------------------------------------
    if stages >= 3:
        ts = time.perf_counter()
        prob.add_factors(U.velocity(), [("q", 0), ("v", 0)], steps)
        run(3, ts)

    # --- stage 4: efforts as variables of the inverse-dynamics factor -------------------------------
    tau = np.full((N, len(mech_act)), np.nan)
    if stages >= 4:
        ts = time.perf_counter()
        idyn = U.inverse_dynamics()
        q3, v3, a3 = get("q"), get("v"), get("a")
        tau0 = batched.inverse_dynamics_many(mech, q3, v3, a3)
        redo = ~np.all(np.isfinite(tau0), axis=1)
        if redo.any():
            tau0[redo] = closed_form_efforts(mech, q3[redo], v3[redo], a3[redo])
        prob.add_variables("tau", tau0)
        prob.add_factors(idyn, [("q", 0), ("v", 0), ("a", 0), ("tau", 0)], steps)
        run(4, ts)
        tau = get("tau")
    return InverseDynamicsResult(t, get("q"), get("v"), get("a"), tau, reports)


# ----------------------------------------------------------------------------------------------
# batch forward dynamics
# ----------------------------------------------------------------------------------------------
@dataclass
class ForwardDynamicsResult:
    t: np.ndarray             # (N,)
    q: np.ndarray             # (N, n)
    v: np.ndarray             # (N, n)
    a: np.ndarray             # (N, n)
    efforts: np.ndarray       # (N, n_actuated) applied efforts
    report: LMReport
    z: Optional[np.ndarray] = None   # independent coordinates (N, d) (independent formulation)


def _choose_independent(mech: Mechanism, q, independent):
    if independent is not None and len(independent):
        return [mech.coordinate_index(c) if isinstance(c, str) else int(c) for c in independent]
    dof = mech.n - np.linalg.matrix_rank(mech.constraints.jacobian(q), tol=1e-9)
    for cand in (list(mech.actuated), list(mech.relative_angle_columns)):
        if len(cand) == dof:
            return cand
    # greedy: the coordinates along which the null space of Φq is best conditioned
    solver = dynamics.solver_at(mech, q)
    Nsp, chosen = solver.N, []
    for _ in range(dof):
        best = max((i for i in range(mech.n) if i not in chosen),
                   key=lambda i: abs(np.linalg.det(Nsp[chosen + [i]][:, :len(chosen) + 1] @
                                                   Nsp[chosen + [i]][:, :len(chosen) + 1].T)) ** 0.5
                   if len(chosen) + 1 <= Nsp.shape[1] else 0.0)
        chosen.append(best)
    return chosen


def batch_forward_dynamics(mech: Mechanism, dt: float, steps: int, efforts=None, q0=None, v0=None,
                           formulation: str = "dependent", independent=None,
                           sigmas: Optional[Dict[str, float]] = None, settings: Optional[LMSettings] = None,
                           engine: str = "sparse") -> ForwardDynamicsResult:
    """Forward dynamics of the whole trajectory t_k = k·dt, k = 0..steps, as ONE batch LM problem.

    efforts: (steps+1, n_actuated) actuator efforts per step (default zero).  q0 (default the YAML
    pose, made consistent by the position problem) and v0 (default rest) are pinned by priors.
    formulation 'dependent': variables q, q̇, q̈ per step; factors f_pc, f_vc, f_dyn, trapezoidal
    q–q̇ and q̇–q̈ (paper Fig. 2).  'independent': variables q, q̇, q̈ and z, ż, z̈ per step; factors
    f_pc^i, f_vc^i, f_ac^i, f_dyn^i, trapezoidal on z, soft equality on q (paper Fig. 3).
    The initial guess is a semi-implicit Euler pass with the closed-form q̈.
    """
    import mbfg_ros.factors as F
    from mbfg_ros.factors.noise import default_sigmas
    sig = default_sigmas()
    sig.update(sigmas or {})
    settings = settings or LMSettings()
    N = int(steps) + 1
    if N < 2:
        raise ValueError("need at least one step")
    na = len(mech.actuated)
    E = np.zeros((N, na)) if efforts is None else np.asarray(efforts, float).reshape(N, na)
    n = mech.n
    q_start = np.array(mech.q0 if q0 is None else q0, dtype=float)
    q_start = kinematics.solve_positions(mech, q_start).q
    v_start = np.zeros(n) if v0 is None else kinematics.solve_velocities(mech, q_start, v_guess=v0)
    Qs = [mech.generalized_forces(E[k]) for k in range(N)]

    # initial guess: classical RK4 with the closed-form q̈ and projection onto the constraints.  Its
    # O(dt⁴) error is far below the trapezoidal graph's own O(dt²), so LM only has to apply that
    # small correction (from a crude guess the whole-trajectory problem converges very slowly).
    q = np.empty((N, n))
    v = np.empty((N, n))
    a = np.empty((N, n))
    q[0], v[0] = q_start, v_start
    fd = lambda qq, vv, QQ: dynamics.forward_dynamics(mech, qq, vv, QQ)
    a[0] = fd(q[0], v[0], Qs[0])
    for k in range(1, N):
        Qm = 0.5 * (Qs[k - 1] + Qs[k])
        q1, v1, a1 = q[k - 1], v[k - 1], a[k - 1]
        q2, v2 = q1 + 0.5 * dt * v1, v1 + 0.5 * dt * a1
        a2 = fd(q2, v2, Qm)
        q3, v3 = q1 + 0.5 * dt * v2, v1 + 0.5 * dt * a2
        a3 = fd(q3, v3, Qm)
        q4, v4 = q1 + dt * v3, v1 + dt * a3
        a4 = fd(q4, v4, Qs[k])
        qn = q1 + dt / 6.0 * (v1 + 2 * v2 + 2 * v3 + v4)
        vn = v1 + dt / 6.0 * (a1 + 2 * a2 + 2 * a3 + a4)
        q[k] = _newton_polish(mech, qn)
        v[k] = kinematics.solve_velocities(mech, q[k], v_guess=vn)
        a[k] = fd(q[k], v[k], Qs[k])

    prob = Problem(mech)
    t = dt * np.arange(N)
    for k in range(N):
        prob.add_variable(("q", k), q[k])
        prob.add_variable(("v", k), v[k])
        prob.add_variable(("a", k), a[k])
    prob.add_factor(F.Prior("q", q_start, sig["prior_q0"]), [("q", 0)])
    prob.add_factor(F.Prior("v", v_start, sig["prior_v0"]), [("v", 0)])
    trap_q = F.TrapezoidalIntegrator("q", "v", n, dt, sig["integrator"])
    trap_v = F.TrapezoidalIntegrator("v", "a", n, dt, sig["integrator"])
    z_idx = None
    if formulation == "dependent":
        pos = F.PositionConstraints(mech, sig["position_constraints"])
        vel = F.VelocityConstraints(mech, sig["velocity_constraints"])
        for k in range(N):
            dyn = F.ForwardDynamics(mech, Qs[k], sig["dynamics"])
            prob.add_factor(pos, [("q", k)])
            prob.add_factor(vel, [("q", k), ("v", k)])
            prob.add_factor(dyn, [("q", k), ("v", k), ("a", k)])
            if k:
                prob.add_factor(trap_q, [("q", k - 1), ("q", k), ("v", k - 1), ("v", k)])
                prob.add_factor(trap_v, [("v", k - 1), ("v", k), ("a", k - 1), ("a", k)])
    elif formulation == "independent":
        z_idx = _choose_independent(mech, q_start, independent)
        d = len(z_idx)
        for k in range(N):
            prob.add_variable(("z", k), q[k, z_idx])
            prob.add_variable(("zd", k), v[k, z_idx])
            prob.add_variable(("zdd", k), a[k, z_idx])
        pos = F.PositionConstraintsIndep(mech, z_idx, sig["position_constraints"])
        vel = F.VelocityConstraintsIndep(mech, z_idx, sig["velocity_constraints"])
        acc = F.AccelerationConstraintsIndep(mech, z_idx, sig["acceleration_constraints"])
        eq = F.SoftEquality("q", n, sig["soft_equality"])
        trap_z = F.TrapezoidalIntegrator("z", "zd", d, dt, sig["integrator"])
        trap_zd = F.TrapezoidalIntegrator("zd", "zdd", d, dt, sig["integrator"])
        for k in range(N):
            dyn = F.ForwardDynamicsIndep(mech, z_idx, Qs[k], sig["dynamics"])
            prob.add_factor(pos, [("q", k), ("z", k)])
            prob.add_factor(vel, [("q", k), ("v", k), ("zd", k)])
            prob.add_factor(acc, [("q", k), ("v", k), ("a", k), ("zdd", k)])
            prob.add_factor(dyn, [("q", k), ("v", k), ("zdd", k)])
            if k:
                prob.add_factor(eq, [("q", k - 1), ("q", k)])
                prob.add_factor(trap_z, [("z", k - 1), ("z", k), ("zd", k - 1), ("zd", k)])
                prob.add_factor(trap_zd, [("zd", k - 1), ("zd", k), ("zdd", k - 1), ("zdd", k)])
    else:
        raise ValueError(f"formulation must be 'dependent' or 'independent' (got '{formulation}')")
    report = solve(prob, settings, engine)
    get = lambda name: np.array([prob.values[(name, k)] for k in range(N)])
    return ForwardDynamicsResult(t, get("q"), get("v"), get("a"), E, report,
                                 get("z") if z_idx is not None else None)


def _newton_polish(mech: Mechanism, q, iterations: int = 3):
    """A few minimum-norm Newton steps onto Φ(q) = 0 (q is already close)."""
    C = mech.constraints
    for _ in range(iterations):
        phi, J = C.phi_and_jacobian(q)
        if np.abs(phi).max(initial=0.0) < 1e-13:
            break
        q = q + np.linalg.lstsq(J, -phi, rcond=None)[0]
    return q
