"""A batch (whole-trajectory) least-squares problem and its stacked, banded assembly.

A batch problem is a `Problem`: named vector variables (``("q", k)``, ``("v", k)`` ...) and factors,
each a factor *unit* of `mbfg_ros.factors` (closed-form Jacobians) applied to a list of variable
keys with the values of its per-step parameters there (`Factor.params`: one unit serves every step, each
factor keeps its own values beside it and passes them to every evaluation).  `Assembly` is its
least-squares form for the sparse engine (`batch.engines`): factors grouped by kind (`Problem.add_factors`
adds a whole series in bulk); the Jacobians of exactly linear units (integrators, priors, soft equalities,
second differences) are built once per stage (one whitened
Jacobian when the group shares it); the nonlinear units are evaluated once per iteration, over all the
steps of a group at once where the unit class has a vectorized form (`Factor.vectorized` over a
`dynamics.batched.BatchContext`) or step by step with a shared `EvalContext` (one evaluation gives errors
and Jacobians).  The graphs are chains in time, so the damped normal equations are accumulated
directly in LAPACK band storage (columns ordered by time step; half bandwidth from the structural
nonzeros), solved by a banded Cholesky and refined against the Jacobians until the residual of the
Jacobi-scaled system is below 1e-10 (at most twice; this recovers the accuracy that forming JᵀJ loses in
weakly determined directions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from numpy.lib.stride_tricks import as_strided

import mbfg_ros.factors as F
from mbfg_ros.dynamics.batched import BatchContext
from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.model.mechanism import Mechanism

__all__ = ["Key", "Problem", "LMSettings", "LMReport", "Assembly"]

Key = Tuple[str, int]
_REFINE = 2                 # at most this many refinement steps of a banded solve
_REFINE_TOLERANCE = 1e-10   # ... stopping once the relative residual of the normal equations is below this


# ----------------------------------------------------------------------------------------------
# problem description
# ----------------------------------------------------------------------------------------------
def _is_linear(unit) -> bool:
    return bool(getattr(unit, "linear", False))


def _same_values(a: tuple, b: tuple) -> bool:
    """Are the per-step values `a` and `b` the same objects (a unit's defaults, taken for several factors)?"""
    return a is b or (len(a) == len(b) and all(x is y for x, y in zip(a, b)))

class Problem:
    """Variables (ordered as added) and factors of one batch least-squares problem."""

    def __init__(self, mech: Optional[Mechanism] = None):
        self.mech = mech            # enables a shared EvalContext during evaluations
        self.keys: List[Key] = []
        self.dims: Dict[Key, int] = {}
        self.values: Dict[Key, np.ndarray] = {}
        self.factors: List[Tuple[object, Tuple[Key, ...], tuple]] = []       # (unit, keys, per-step values)
        # factors grouped (incrementally) by unit type, dimension and key pattern, with the first
        # step of each factor's keys (chunks: ints or arrays, in the order of the group's factors)
        self.groups: Dict[tuple, list] = {}
        self.group_steps: Dict[tuple, list] = {}
        # the linear part of the last `Assembly` (signature, linear groups, their normal equations in band
        # storage), reused by the next one while neither the variables nor the linear factors changed
        self.linear_cache = None

    def add_variable(self, key: Key, value) -> None:
        value = np.array(value, dtype=float).reshape(-1)
        if key not in self.dims:
            self.keys.append(key)
            self.dims[key] = value.size
        elif self.dims[key] != value.size:
            raise ValueError(f"variable {key}: dimension {value.size} != {self.dims[key]}")
        self.values[key] = value

    def add_factor(self, unit, keys: Sequence[Key], params: Optional[tuple] = None) -> None:
        """A factor of `unit` over `keys` with the values `params` of its per-step parameters (in the order of
        ``unit.params``; None: the unit's defaults, `Factor.own_params`)."""
        keys = tuple(keys)
        for k in keys:
            if k not in self.dims:
                raise KeyError(f"factor {type(unit).__name__} uses unknown variable {k}")
        factor = (unit, keys, unit.own_params() if params is None else unit.checked_params(params))
        self.factors.append(factor)
        k0 = min(k[1] for k in keys) if keys else 0
        sig = (type(unit), unit.dim, tuple((k[0], k[1] - k0, self.dims[k]) for k in keys))
        self.groups.setdefault(sig, []).append(factor)
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

    def add_factors(self, units, pattern: Sequence[Tuple[str, int]], steps, params=None) -> None:
        """One factor per step k of `steps` over the keys (name, k + offset) for (name, offset) in
        `pattern`: `units` is one shared unit or a list with one unit per step, `params` their per-step values, one
        tuple per step (None: each unit's defaults).  The same as calling `add_factor` for each step, in bulk."""
        steps = [int(k) for k in steps]
        shared = not isinstance(units, (list, tuple))
        unit_list = [units] * len(steps) if shared else list(units)
        if len(unit_list) != len(steps):
            raise ValueError("add_factors: one unit per step")
        if params is None:
            own = units.own_params() if shared else None
            values = [own] * len(steps) if shared else [u.own_params() for u in unit_list]
        else:
            values = [u.checked_params(p) for u, p in zip(unit_list, params)]
            if len(values) != len(steps):
                raise ValueError("add_factors: one tuple of per-step values per step")
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
            for unit, keys, p in zip(unit_list, keys_list, values):
                self.add_factor(unit, keys, p)
            return
        off0 = min((off for _, off in pattern), default=0)
        sig = (type(unit0), unit0.dim, tuple((nm, off - off0, next(iter(d))) for (nm, off), d
                                             in zip(pattern, slot_dims)))
        factors = list(zip(unit_list, keys_list, values))
        self.factors.extend(factors)
        self.groups.setdefault(sig, []).extend(factors)
        self.group_steps.setdefault(sig, []).append(np.asarray(steps, dtype=np.intp) + off0)

    def first_steps(self, sig) -> np.ndarray:
        """The first step of every factor of the group `sig` (in the group's order)."""
        chunks = self.group_steps[sig]
        if all(isinstance(c, int) for c in chunks):
            return np.array(chunks, dtype=np.intp)
        return np.concatenate([np.atleast_1d(np.asarray(c, dtype=np.intp)) for c in chunks])

    def error(self, values: Optional[Dict[Key, np.ndarray]] = None) -> float:
        """½ Σ |whitened error|² (GTSAM's graph error)."""
        values = self.values if values is None else values
        total = 0.0
        for unit, keys, params in self.factors:
            e, _ = unit.evaluate(*[values[k] for k in keys], params=params)
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
    """Factors of one shape ((unit, keys, per-step values) each): whitened residuals r (F, d) and Jacobians
    J (F, d, w) over the columns `cols` (F, w) of the stacked variable vector (the factor's slots side by side)."""

    def __init__(self, factors, dims, offset, linear: bool, offsets_by_step=None, first_steps=None):
        self.factors = factors
        unit0, keys0, _ = factors[0]
        self.F, self.d = len(factors), unit0.dim
        self.widths = [dims[k] for k in keys0]
        self.w = int(sum(self.widths))
        self.bounds = np.cumsum([0] + self.widths)
        local = np.concatenate([np.arange(wi) for wi in self.widths]) if self.widths else np.zeros(0, int)
        k_first = min((k[1] for k in keys0), default=0)
        self.rel = np.array([k[1] - k_first for k in keys0], dtype=np.intp)      # slot steps − first step
        if first_steps is None:
            first_steps = np.array([min((k[1] for k in keys), default=0) for _, keys, _ in factors], dtype=np.intp)
        self.first_steps = np.asarray(first_steps, dtype=np.intp)
        if offsets_by_step is not None:
            starts = np.column_stack([offsets_by_step[name][self.first_steps + r] for (name, _), r
                                      in zip(keys0, self.rel)]) if keys0 else np.zeros((self.F, 0), dtype=np.intp)
        else:
            starts = np.array([[offset[k] for k in keys] for _, keys, _ in factors],
                              dtype=np.intp).reshape(self.F, -1)
        self.cols = np.repeat(starts, self.widths, axis=1) + local[None, :]
        units = [u for u, _, _ in factors]
        self.params = [p for _, _, p in factors]
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
            for i, (unit, keys, params) in enumerate(factors):
                hit = cache.get((id(unit), id(params)))
                if hit is None:
                    e, Js = unit.evaluate(*[np.zeros(dims[k]) for k in keys], params=params)
                    hit = (np.concatenate([np.asarray(J, float).reshape(self.d, -1) for J in Js], axis=1),
                           np.asarray(e, float).reshape(self.d))
                    cache[(id(unit), id(params))] = hit
                self.J[i] = hit[0]
                self.b[i] = -hit[1]
            self.J *= self.inv_sigma[:, :, None]
            self.b *= self.inv_sigma

    def _linear_bulk(self, units, dims, keys0) -> bool:
        """J and b of a linear group without a per-factor loop: one shared unit with one set of per-step values,
        or priors on the same entries (their means differ).  False when neither applies."""
        unit0, params0 = units[0], self.params[0]
        if self.shared_unit and all(_same_values(p, params0) for p in self.params):
            e, Js = unit0.evaluate(*[np.zeros(dims[k]) for k in keys0], params=params0)
            J0 = np.concatenate([np.asarray(J, float).reshape(self.d, -1) for J in Js], axis=1)
            self.b = np.repeat(-np.asarray(e, float).reshape(1, self.d), self.F, axis=0)
        elif type(unit0) is F.Prior and all(type(u) is F.Prior and u.size == unit0.size and
                                            np.array_equal(u.select, unit0.select) for u in units):
            # priors on the same entries differ only in their means: one Jacobian, b = the means
            J0 = np.asarray(unit0.evaluate(np.zeros(unit0.size), params=params0)[1][0], float).reshape(self.d, self.w)
            self.b = np.array([p[0] for p in self.params], dtype=float).reshape(self.F, self.d)
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


class Assembly:
    """The least-squares problem of a `Problem` in stacked form (columns ordered by time step), with
    the normal equations accumulated directly in LAPACK band storage (the graphs here are chains).

    With `vectorize` (default) the groups of a unit class with a vectorized form are evaluated over all
    their factors at once; without, every factor is evaluated on its own (the tests compare both)."""

    def __init__(self, prob: Problem, vectorize: bool = True):
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
        n_lin = sum(len(g) for _, g in groups if _is_linear(g[0][0]))
        signature = (len(self.keys), n_lin)
        cached = prob.linear_cache
        reuse = cached is not None and cached[0] == signature
        make = lambda sig, g, linear: _Group(g, prob.dims, self.offset, linear, by_step, prob.first_steps(sig))
        self.lin_groups = cached[1] if reuse else [make(sig, g, True) for sig, g in groups
                                                   if _is_linear(g[0][0])]
        self.nl_groups = [make(sig, g, False) for sig, g in groups if not _is_linear(g[0][0])]
        self.groups = self.lin_groups + self.nl_groups
        # groups of a unit class with a vectorized form are evaluated over all their factors at once
        for G in self.nl_groups:
            units = [u for u, _, _ in G.factors]
            G.evaluate_many = None
            if vectorize and isinstance(units[0], F.Factor):
                G.evaluate_many = type(units[0]).vectorized(units, G.params)
            if G.evaluate_many is not None:
                G.mech = units[0].mech
                G.slot_cols = [G.cols[:, G.bounds[s]:G.bounds[s + 1]] for s in range(len(G.widths))]
                G.slot_keys = [c[:, 0].tobytes() for c in G.slot_cols]
        self._batch_cache: dict = {}
        # the others step by step so the units of one step share an EvalContext (Φq, dynamics)
        # within a step, units with more slots first: the dynamics linearization then supplies
        # Φq and Φ̇q to the constraint units through the context
        order = [(min(k[1] for k in keys), -len(G.widths), gi, i) for gi, G in enumerate(self.nl_groups)
                 if G.evaluate_many is None for i, (_, keys, _) in enumerate(G.factors)]
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
        prob.linear_cache = (signature, self.lin_groups, self.H_lin_band if self.band_ok else None)

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
            if G.evaluate_many is None:
                continue
            bctx = contexts.get(id(G.mech))
            if bctx is None:
                bctx = contexts[id(G.mech)] = BatchContext(G.mech, self._batch_cache)
            e, Js = G.evaluate_many(bctx, G.slot_keys, *[x[c] for c in G.slot_cols])
            G.r[:] = e
            for s, Jb in enumerate(Js):
                G.J[:, :, G.bounds[s]:G.bounds[s + 1]] = Jb
        vals = self.unpack(x) if self.eval_order else None
        # a fresh per-step memo for the problem's mechanism (a problem without one: no sharing)
        ctx = EvalContext(self.prob.mech) if self.eval_order and self.prob.mech is not None else None
        for gi, i in self.eval_order:
            G = groups[gi]
            unit, keys, params = G.factors[i]
            e, Js = unit.evaluate(*[vals[k] for k in keys], params=params, ctx=ctx)
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
        u = self.u
        self.factor = None
        if not self.band_ok:
            return self.sparse_step(g, lam)
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
            return self.sparse_step(g, lam)
        self.factor = (cb, d, lam)
        return self.refined_step(g)

    def refined_step(self, g, with_residual: bool = False):
        """The step for gradient g with the last factorization, refined (up to twice) against the
        current Jacobians, so a factorization from the previous iterate gives a good step too; the
        refinement stops once the relative residual |H dx + g| / |g| of the scaled system is below
        1e-10 (a fresh factorization is usually there at once).  With `with_residual`, also that
        residual."""
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

    def sparse_step(self, g, lam: float) -> np.ndarray:
        """`step` by a general sparse solve (when the band storage would be too large or not positive
        definite)."""
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
