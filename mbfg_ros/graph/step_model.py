"""Linearization of one step's units outside GTSAM: all units of step k (which read X_k and possibly X_{k−1})
linearized at once, whitened and stacked into the rows of one linear factor (`linearize_step`, and
`StepModel`, which pre-arranges a fixed set of units for fast repeated linearization, in the compiled kernel
where it can, `mbfg_ros.native`; the window hands the rows to GTSAM).  GTSAM never calls back into Python for
these factors."""

from __future__ import annotations

from operator import itemgetter
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mbfg_ros import native
from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.factors.base import SINGULAR_RETRIES, Factor
from mbfg_ros.graph.layout import StateLayout

__all__ = ["linearize_step", "StepModel", "StepValues"]

#: a step's per-step factor parameters: unit -> {parameter name: value} (see `Factor.params`)
StepValues = Dict[Factor, Dict[str, object]]


def _getter(indices):
    """A function of a list returning its items at `indices` as a tuple (`operator.itemgetter`, which returns a
    single item bare)."""
    if len(indices) == 1:
        i = indices[0]
        return lambda items: (items[i],)
    return itemgetter(*indices)


def _blocks_for(unit, slot_map, vprev, vcur):
    out = []
    for s in unit.slots:
        which, name, _ = slot_map[s]
        out.append(vcur[name] if which else vprev[name])
    return out


def linearize_step(units: Sequence[Factor], layout: StateLayout, x_prev: Optional[np.ndarray], x_cur: np.ndarray,
                   ctx: Optional[EvalContext] = None, *, params: Sequence[tuple]):
    """Whitened linearization of all `units` of one step at (X_{k−1}, X_k) = (x_prev, x_cur), with `params` the
    per-step values of each unit (one tuple per unit, `Factor.params`):
    returns (A_prev or None, A_cur, r) with e_w(X) ≈ r + A_prev (X_{k−1} − x_prev) + A_cur (X_k − x_cur)."""
    rows = 0
    need_prev = False
    for u in units:
        rows += u.dim
        if not need_prev:
            for s in u.slots:
                if s.endswith("_prev"):
                    need_prev = True
                    break
    D = layout.dim
    A_cur = np.zeros((rows, D))
    A_prev = np.zeros((rows, D)) if need_prev else None
    r = np.empty(rows)
    slot_map = layout.slot_map
    vcur = layout.views(x_cur)
    vprev = layout.views(x_prev) if need_prev else None
    row = 0
    for i, u in enumerate(units):
        d = u.dim
        if d == 0:
            continue
        e, Js = u.evaluate(*_blocks_for(u, slot_map, vprev, vcur), params=params[i], ctx=ctx)
        w = 1.0 / u.sigmas
        r[row:row + d] = e * w
        wc = w[:, None]
        for s, J in zip(u.slots, Js):
            which, _, cols = slot_map[s]
            (A_cur if which else A_prev)[row:row + d, cols] += J * wc
        row += d
    return A_prev, A_cur, r


# ----------------------------------------------------------------------------------------------
class StepModel:
    """All units of one step, pre-arranged for fast repeated linearization.

    Units flagged ``static`` (affine with zero offset and fixed parameters: integrators, soft equality,
    random walks) are whitened and stacked once; the others are evaluated at each linearization.
    ``linear`` units are exact as linear factors, so only the remaining (nonlinear) rows are kept for
    the relinearization check (`check_rows`, weighted by the units' ``check_weight``; weight 0 = unchecked).
    `linearize` returns internal buffers: they stay valid until the next call (gtsam copies them).

    A step's per-step parameters (`params_of`: the readings, the forces) are passed with each call, on both
    paths.  Where every non-static unit has a compiled form (`mbfg_ros.native.unit_form`) and the context has
    the mechanism's compiled kernel, `native_linearize` and `native_mismatch` do a whole linearization and a
    whole relinearization check in one C call each; the window uses them first (`form` says which path runs).
    """

    def __init__(self, layout: StateLayout, units: Sequence[Factor]):
        layout.check(units)
        self.layout = layout
        self.units = list(units)
        static = [u for u in self.units if getattr(u, "static", False) and u.dim]
        dynamic = [u for u in self.units if not getattr(u, "static", False) and u.dim]
        self.static_units, self.dynamic_units = static, dynamic
        self.need_prev = any(s.endswith("_prev") for u in self.units for s in u.slots)
        D = layout.dim
        rows_s = sum(u.dim for u in static)
        self.rows = rows_s + sum(u.dim for u in dynamic)
        self.A_cur = np.zeros((self.rows, D))
        self.A_prev = np.zeros((self.rows, D)) if self.need_prev else None
        self.r = np.zeros(self.rows)
        row = 0
        for u in static:
            w = (1.0 / u.sigmas)[:, None]
            for s, J in zip(u.slots, u.jacobians):
                which, _, cols = layout.slot_map[s]
                (self.A_cur if which else self.A_prev)[row:row + u.dim, cols] += J * w
            row += u.dim
        self._S_cur = self.A_cur[:rows_s].copy()
        self._S_prev = None if self.A_prev is None else self.A_prev[:rows_s].copy()
        self._S = self._S_cur if self.A_prev is None else np.hstack((self._S_prev, self._S_cur))
        self.static_rows = rows_s
        # per dynamic unit: (unit, first row, inverse sigmas, [(which, block name, cols)] per slot, assign?)
        self._plan = []
        check_rows, weights = [], []
        for u in dynamic:
            slots = [layout.slot_map[s] for s in u.slots]
            distinct = len({(w, n) for w, n, _ in slots}) == len(slots)
            self._plan.append((u, row, 1.0 / u.sigmas, [(w, c) for w, _, c in slots], distinct))
            if not u.linear and u.check_weight > 0.0:
                check_rows.extend(range(row, row + u.dim))
                weights.extend([float(u.check_weight)] * u.dim)
            row += u.dim
        self._all_distinct = all(p[4] for p in self._plan)
        self._unit_rows = {id(p[0]): (p[1], p[1] + p[0].dim) for p in self._plan}
        self.check_rows = np.array(check_rows, dtype=np.intp)
        # the checked rows as a slice when contiguous (the usual case: cheaper copies)
        cr = self.check_rows
        self.check_slice = (slice(int(cr[0]), int(cr[-1]) + 1)
                             if cr.size and np.array_equal(cr, np.arange(cr[0], cr[-1] + 1)) else None)
        self.check_weights = None if all(w == 1.0 for w in weights) else np.array(weights)
        self.check_units = [u for u in dynamic if not u.linear and u.check_weight > 0.0]
        self.param_units = [(u, u.params) for u in dynamic if u.params]
        self._single_params = ([(u, names[0]) for u, names in self.param_units]
                               if all(len(names) == 1 for _, names in self.param_units) else None)
        self._check_plan = [(u, slots, 1.0 / u.sigmas) for (u, _, _, slots, _) in self._plan
                            if not u.linear and u.check_weight > 0.0]
        param_of = {id(u): i for i, (u, _) in enumerate(self.param_units)}
        # do the checked rows read X_{k−1}?  (If not, the check needs no estimate of the previous state.)
        self.check_prev = any(not which for _, slots, _ in self._check_plan for which, _ in slots)
        self._check_buf = np.zeros(len(check_rows))
        # do the non-static rows read X_{k−1}?
        self.dynamic_prev = any(not which for p in self._plan for which, _ in p[3])
        offs = np.cumsum([0] + [u.dim for u, _, _ in self._check_plan])
        self._check_plan = [(u, slots, w, int(a), int(b), param_of.get(id(u), -1)) for (u, slots, w), a, b in
                            zip(self._check_plan, offs[:-1], offs[1:])]
        # The dynamic units write their raw errors and Jacobians into buffers of their own, whitened with one
        # product per buffer after all are written (a product per Jacobian block was a visible share of a
        # 1-kHz step; the numbers are the same, except for blocks that several slots of a unit share, whose
        # terms are now summed before the whitening).  Blocks no unit writes stay zero.
        rd = self.rows - rows_s
        self._e_raw = np.zeros(rd)
        self._J_raw_cur = np.zeros((rd, D))
        self._J_raw_prev = np.zeros((rd, D)) if self.dynamic_prev else None
        self._w_dyn = np.concatenate([p[2] for p in self._plan]) if self._plan else np.zeros(0)
        self._w_dyn_col = self._w_dyn[:, None]
        # the Jacobian block last written to each (unit, slot) region (distinct layout): a unit returning the
        # same (constant) array object again needs no rewrite
        self._last_J = [[None] * len(p[3]) for p in self._plan]
        # The blocks the dynamic units read, each sliced once per linearization ((which, columns): several units
        # read q and q̇); per unit: a getter of its blocks among them (in slot order), its raw error rows, the raw
        # views of the blocks it writes (made once: slicing at every linearization costs a visible share of a
        # 1-kHz step), whether those are distinct
        self._blocks = []
        for _, _, _, slots, _ in self._plan:
            for which, cols in slots:
                if not any(w == which and c == cols for w, c in self._blocks):
                    self._blocks.append((which, cols))
        self._views = []
        param_index = {id(u): i for i, (u, _) in enumerate(self.param_units)}
        for (u, row, w, slots, distinct), last in zip(self._plan, self._last_J):
            a, b = row - rows_s, row - rows_s + u.dim
            outs = [(self._J_raw_cur if which else self._J_raw_prev)[a:b, cols] for which, cols in slots]
            self._views.append((u, _getter([self._block_index(which, cols) for which, cols in slots]),
                                self._e_raw[a:b], outs, last, distinct, param_index.get(id(u), -1)))
        self._b = np.zeros(self.rows)
        self._no_form = ""                # why the units have no compiled program ('' where they have)
        self._native_forms = self._unit_forms()
        self._native = None               # (the context's mechanism kernel, the StepKernel built for it)

    def _unit_forms(self) -> Optional[list]:
        """The step program of the compiled kernel (one entry per non-static unit), or None when a unit has no
        compiled form (``_no_form`` then says why)."""
        forms, kindless, missing = [], [], []
        param_index = {id(u): i for i, (u, _) in enumerate(self.param_units)}
        check_ids = {id(u) for u in self.check_units}
        for u, row, w, slots, _ in self._plan:
            form = native.unit_form(u)
            if form is None:
                (kindless if u.kernel_kind is None else missing).append(u.name if u.kernel_kind is None
                                                                       else native.no_form_reason(u))
                continue
            code, ints, floats = form
            forms.append((code, row, u.dim, param_index.get(id(u), -1), id(u) in check_ids,
                          [(which, cols.start, cols.stop - cols.start) for which, cols in slots],
                          np.ascontiguousarray(w, dtype=float), ints, floats))
        if kindless:
            missing.insert(0, f"no compiled form of {', '.join(dict.fromkeys(kindless))}")
        if missing:
            self._no_form = "; ".join(dict.fromkeys(missing))
            return None
        return forms

    def _kernel(self, ctx: Optional[EvalContext]):
        """The compiled step kernel for `ctx`'s mechanism kernel, or None."""
        mk = None if ctx is None or self._native_forms is None else ctx.native
        if mk is None:
            return None
        held = self._native
        if held is None or held[0] is not mk:
            S = self._S if self.static_rows else np.zeros((0, self.layout.dim * (2 if self.A_prev is not None else 1)))
            held = self._native = (mk, native.step_kernel(mk, self.layout.dim, S, self.A_prev is not None,
                                                          self._native_forms, self.A_cur, self.A_prev, self.r,
                                                          self._b))
        return held[1]

    def form(self, ctx: Optional[EvalContext]) -> str:
        """Which path linearizes this model with `ctx`: 'compiled', or 'numpy (why)': a unit without a compiled
        form, or no compiled kernel of the mechanism.  (At a singular point of the dynamics a compiled step takes
        the null-space solver's linearization of q̈ there: still compiled.)"""
        if self._native_forms is None:
            return f"numpy ({self._no_form})"
        return native.mechanism_form(ctx.mech, ctx.native) if ctx is not None else "numpy (no evaluation context)"

    @property
    def compiled(self) -> bool:
        """Has this model linearized through the compiled kernel (see `native_linearize`)?"""
        return self._native is not None

    def native_linearize(self, x_prev: Optional[np.ndarray], x_cur: np.ndarray, ctx: Optional[EvalContext],
                         static_at: Tuple[Optional[np.ndarray], np.ndarray], params: list):
        """`linearize` with the step's `params` (`params_of`) in one compiled call, and the right-hand side of
        the factor in δ = X − θ about θ = ``static_at``: (A_prev or None, A_cur, r, b) with
        b = −r − A (θ − x) on the non-static rows (internal buffers); None where there is no compiled kernel or
        the null-space solver fails at a singular point of the dynamics (then `linearize`)."""
        kernel = self._kernel(ctx)
        if kernel is None:
            return None
        for _ in range(SINGULAR_RETRIES):
            if kernel.linearize(x_prev, x_cur, static_at[0], static_at[1], params):
                return self.A_prev, self.A_cur, self.r, self._b
            if not ctx.supply_singular():
                return None
        return None

    def native_mismatch(self, ctx: Optional[EvalContext], params: list, A_cur, r, A_prev, lin_cur, lin_prev,
                        x_cur, x_prev) -> Optional[float]:
        """max weighted |r + A_cur (x_cur − lin_cur) + A_prev (x_prev − lin_prev) − e(x)| over `check_rows` (the
        relinearization check of a step linearized at (lin_prev, lin_cur) whose checked rows' linear model is
        (A_cur, A_prev, r)) in one compiled call; NaN where not finite; None where there is no compiled kernel
        or the null-space solver fails at a singular point of the dynamics."""
        kernel = self._kernel(ctx)
        if kernel is None:
            return None
        for _ in range(SINGULAR_RETRIES):
            m = kernel.mismatch(A_cur, r, A_prev, lin_cur, lin_prev, x_cur, x_prev, params, self.check_weights)
            if m is not None or not ctx.supply_singular():
                return m
        return None

    def _block_index(self, which, cols) -> int:
        return next(i for i, (w, c) in enumerate(self._blocks) if w == which and c == cols)

    def whitened_rows(self, unit) -> np.ndarray:
        """The rows of a (non-static) `unit` in the last linearization's whitened residual (a view of the
        internal buffer: valid until the next `linearize`)."""
        a, b = self._unit_rows[id(unit)]
        return self.r[a:b]

    def params_of(self, values: StepValues) -> list:
        """This model's per-step parameters, one tuple per unit that has any (``param_units``), passed with each
        linearization and check of the step: from `values` (unit -> {name: value}) where given, else the
        unit's defaults (`Factor.own_params`)."""
        single = self._single_params
        if single is not None:         # (the usual case: one parameter per unit)
            get = values.get
            return [(given[name],) if (given := get(u)) is not None and name in given else (getattr(u, name),)
                    for u, name in single]
        out = []
        for u, names in self.param_units:
            given = values.get(u)
            if given is None:
                out.append(tuple([getattr(u, p) for p in names]))
            elif len(given) == len(names):
                out.append(tuple([given[p] for p in names]))
            else:
                out.append(tuple([given[p] if p in given else getattr(u, p) for p in names]))
        return out

    def linearize(self, x_prev: Optional[np.ndarray], x_cur: np.ndarray, ctx: Optional[EvalContext] = None,
                  static_at: Optional[Tuple[Optional[np.ndarray], np.ndarray]] = None, *, params: list):
        """(A_prev or None, A_cur, r): whitened linearization at (x_prev, x_cur) (internal buffers) with the
        step's per-step parameters `params` (`params_of`).
        With ``static_at`` = (x_prev', x_cur') the rows of the static (affine) units are evaluated there
        instead (their linear model is exact, so this is the same model expressed about another point)."""
        A_cur, A_prev, r = self.A_cur, self.A_prev, self.r
        rs = self.static_rows
        if rs:
            xp, xc = (x_prev, x_cur) if static_at is None else static_at
            self._S.dot(xc if A_prev is None else np.concatenate((xp, xc)), out=r[:rs])
        if not self._all_distinct:
            self._J_raw_cur[:] = 0.0
            if self._J_raw_prev is not None:
                self._J_raw_prev[:] = 0.0
            for last in self._last_J:
                last[:] = [None] * len(last)
        xs = (x_prev, x_cur)
        blocks = [xs[which][c] for which, c in self._blocks]
        for u, take, e_rows, outs, last, distinct, p in self._views:
            e, Js = u.evaluate(*take(blocks), params=params[p] if p >= 0 else (), ctx=ctx)
            e_rows[:] = e
            if distinct:         # every block of these rows is overwritten; the others stay zero
                i = 0
                for J in Js:
                    if J is not last[i]:
                        outs[i][:] = J
                        last[i] = J
                    i += 1
            else:                # (blocks shared by several slots: the sum of their terms)
                for out, J in zip(outs, Js):
                    out += J
        if self._views:
            mul = np.multiply
            mul(self._e_raw, self._w_dyn, out=r[rs:])
            mul(self._J_raw_cur, self._w_dyn_col, out=A_cur[rs:])
            if self._J_raw_prev is not None:
                mul(self._J_raw_prev, self._w_dyn_col, out=A_prev[rs:])
        return A_prev, A_cur, r

    @property
    def check_blocks(self) -> List[Tuple[Factor, int, int]]:
        """(unit, first, end) of each checked unit's rows in `check_residual`'s output."""
        return [(u, a, b) for u, _, _, a, b, _ in self._check_plan]

    def check_residual(self, x_prev: Optional[np.ndarray], x_cur: np.ndarray, ctx: Optional[EvalContext] = None, *,
                       params: list):
        """Whitened nonlinear error of the rows in `check_rows` at (x_prev, x_cur) with the step's per-step
        parameters `params` (`params_of`) (an internal buffer, valid until the next call)."""
        buf = self._check_buf
        mul = np.multiply
        for u, slots, w, a, b, p in self._check_plan:
            mul(u.error(*[x_cur[c] if which else x_prev[c] for which, c in slots], params=params[p] if p >= 0 else (),
                        ctx=ctx), w, out=buf[a:b])
        return buf
