"""gtsam adapters for the factor units of `mbfg_ros.factors`.

Two ways to hand a unit to GTSAM:

* `custom_factor(unit, keys)` – a `gtsam.CustomFactor` over one vector key per slot (the paper's graph
  structure; used by the tests and by batch solvers).  GTSAM relinearizes it whenever it likes, at the
  price of a Python callback per linearization.
* The fast path: one stacked state variable per step, X_k = [q, q̇, q̈ (, τ) ...] (`StateLayout`),
  and all units of step k (which read X_k and possibly X_{k−1}) linearized ONCE in Python, whitened and
  stacked into one `gtsam.JacobianFactor` wrapped in a `gtsam.LinearContainerFactor` (`linearize_step`,
  `linear_factor`, `StepModel`).  GTSAM never calls back into Python for these factors.  Since such a
  factor is a fixed first-order model, `FixedLagWindow` implements the relinearization safeguard: after
  each update it evaluates the newest step's nonlinear residual at the estimate and, while it departs
  from the linear model by more than a threshold, replaces the factor (`factorsToRemove`) by one
  linearized at the new estimate.  (The window hands iSAM2 its factors in δ = X − θ, θ being each key's
  insertion value, which iSAM2 never changes since nothing is relinearized there: no linearization point
  per factor.)
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable, Deque, Dict, Optional, Sequence, Tuple

import gtsam
import numpy as np

from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.factors.base import Factor

__all__ = ["custom_factor", "StateLayout", "linearize_step", "residual_step", "linear_factor", "StepModel",
           "FixedLagWindow", "StepRecord", "state_key"]


_X_KEY = gtsam.symbol("x", 0)
_EMPTY = np.zeros(0)
_max = np.maximum.reduce
_add_reduce = np.add.reduce


def state_key(k: int) -> int:
    """gtsam key of the stacked state of step k (= gtsam.symbol('x', k))."""
    return _X_KEY + int(k)


# ----------------------------------------------------------------------------------------------
def custom_factor(unit: Factor, keys: Sequence[int], mech=None) -> gtsam.CustomFactor:
    """`gtsam.CustomFactor` for `unit`, one vector key per slot (in slot order), diagonal noise model
    with the unit's sigmas.  The unit is copied: later changes to the original's parameters do not
    affect the factor."""
    keys = [int(k) for k in keys]
    if len(keys) != len(unit.slots):
        raise ValueError(f"{unit.name}: {len(unit.slots)} slots {unit.slots} but {len(keys)} keys")
    u = unit.copy()
    noise = gtsam.noiseModel.Diagonal.Sigmas(np.asarray(u.sigmas, dtype=float))

    def error_function(this, values, H):
        blocks = [values.atVector(k) for k in keys]
        if H is None:
            return u.error(*blocks)
        e, J = u.evaluate(*blocks)
        for i, Ji in enumerate(J):
            H[i] = Ji
        return e

    return gtsam.CustomFactor(noise, keys, error_function)


# ----------------------------------------------------------------------------------------------
class StateLayout:
    """The blocks of the stacked per-step state X = [block₀, block₁, ...] (name, size) in order."""

    def __init__(self, blocks: Sequence[Tuple[str, int]]):
        self.blocks = tuple((str(n), int(s)) for n, s in blocks)
        self.slices: Dict[str, slice] = {}
        off = 0
        for n, s in self.blocks:
            self.slices[n] = slice(off, off + s)
            off += s
        self.dim = off
        # slot name -> (0 = previous step / 1 = this step, block name, columns)
        self.slot_map: Dict[str, Tuple[int, str, slice]] = {}
        for n, _ in self.blocks:
            self.slot_map[n] = (1, n, self.slices[n])
            self.slot_map[n + "_prev"] = (0, n, self.slices[n])

    def __contains__(self, name):
        return name in self.slices

    def size(self, name: str) -> int:
        s = self.slices[name]
        return s.stop - s.start

    def views(self, x: np.ndarray) -> Dict[str, np.ndarray]:
        return {n: x[s] for n, s in self.slices.items()}

    def pack(self, **blocks) -> np.ndarray:
        x = np.zeros(self.dim)
        for n, val in blocks.items():
            x[self.slices[n]] = val
        return x

    def get(self, x: np.ndarray, name: str) -> np.ndarray:
        return x[self.slices[name]]

    def check(self, units: Sequence[Factor]):
        for u in units:
            for s in u.slots:
                if s not in self.slot_map:
                    raise ValueError(f"{u.name}: slot '{s}' is not a block of the state {self.blocks}")

    def __repr__(self):
        return f"StateLayout({', '.join(f'{n}:{s}' for n, s in self.blocks)})"


def _blocks_for(unit, slot_map, vprev, vcur):
    out = []
    for s in unit.slots:
        which, name, _ = slot_map[s]
        out.append(vcur[name] if which else vprev[name])
    return out


def linearize_step(units: Sequence[Factor], layout: StateLayout, x_prev: Optional[np.ndarray], x_cur: np.ndarray,
                   ctx: Optional[EvalContext] = None):
    """Whitened linearization of all `units` of one step at (X_{k−1}, X_k) = (x_prev, x_cur):
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
    for u in units:
        d = u.dim
        if d == 0:
            continue
        e, Js = u.evaluate(*_blocks_for(u, slot_map, vprev, vcur), ctx=ctx)
        w = 1.0 / u.sigmas
        r[row:row + d] = e * w
        wc = w[:, None]
        for s, J in zip(u.slots, Js):
            which, _, cols = slot_map[s]
            (A_cur if which else A_prev)[row:row + d, cols] += J * wc
        row += d
    return A_prev, A_cur, r


def residual_step(units: Sequence[Factor], layout: StateLayout, x_prev: Optional[np.ndarray], x_cur: np.ndarray,
                  ctx: Optional[EvalContext] = None) -> np.ndarray:
    """Whitened nonlinear error of all `units` of one step at (x_prev, x_cur) (no Jacobians)."""
    slot_map = layout.slot_map
    vcur = layout.views(x_cur)
    vprev = layout.views(x_prev) if x_prev is not None else None
    parts = [u.error(*_blocks_for(u, slot_map, vprev, vcur), ctx=ctx) / u.sigmas for u in units if u.dim]
    return np.concatenate(parts) if parts else np.zeros(0)





_UNIT_NOISE: Dict[int, object] = {}


def _unit_noise(rows: int):
    m = _UNIT_NOISE.get(rows)
    if m is None:
        m = _UNIT_NOISE[rows] = gtsam.noiseModel.Unit.Create(rows)
    return m


def linear_factor(A_prev: Optional[np.ndarray], A_cur: np.ndarray, r: np.ndarray, key_prev: Optional[int],
                  key_cur: int, x_prev: Optional[np.ndarray], x_cur: np.ndarray,
                  work: Optional[gtsam.Values] = None) -> gtsam.LinearContainerFactor:
    """The linear model e_w ≈ r + A_prev δ_prev + A_cur δ_cur as a C++ `LinearContainerFactor`
    linearized at (x_prev, x_cur) (unit noise: the rows are already whitened).  `work`: a scratch
    `gtsam.Values` to reuse (the factor keeps its own copy of the linearization point)."""
    if work is None:
        lin = gtsam.Values()
    else:
        lin = work
        lin.clear()
    lin.insert(key_cur, x_cur)
    noise = _unit_noise(r.size)
    if A_prev is None:
        jf = gtsam.JacobianFactor(key_cur, A_cur, -r, noise)
    else:
        lin.insert(key_prev, x_prev)
        jf = gtsam.JacobianFactor(key_prev, A_prev, key_cur, A_cur, -r, noise)
    return gtsam.LinearContainerFactor(jf, lin)


# ----------------------------------------------------------------------------------------------
class StepModel:
    """All units of one step, pre-arranged for fast repeated linearization.

    Units flagged ``static`` (affine with zero offset and fixed parameters: integrators, soft equality,
    random walks) are whitened and stacked once; the others are evaluated at each linearization.
    ``linear`` units are exact as linear factors, so only the remaining (nonlinear) rows are kept for
    the relinearization check (`check_rows`, weighted by the units' ``check_weight``; weight 0 = unchecked).
    `linearize` returns internal buffers: they stay valid until the next call (gtsam copies them).
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
            for s, J in zip(u.slots, u._J):
                which, _, cols = layout.slot_map[s]
                (self.A_cur if which else self.A_prev)[row:row + u.dim, cols] += J * w
            row += u.dim
        self._S_cur = self.A_cur[:rows_s].copy()
        self._S_prev = None if self.A_prev is None else self.A_prev[:rows_s].copy()
        self._S = self._S_cur if self.A_prev is None else np.hstack((self._S_prev, self._S_cur))
        self._rows_s = rows_s
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
        self._check_slice = (slice(int(cr[0]), int(cr[-1]) + 1)
                             if cr.size and np.array_equal(cr, np.arange(cr[0], cr[-1] + 1)) else None)
        self.check_weights = None if all(w == 1.0 for w in weights) else np.array(weights)
        self.check_units = [u for u in dynamic if not u.linear and u.check_weight > 0.0]
        self._param_units = [(u, u.params) for u in dynamic if u.params]
        self._check_plan = [(u, slots, 1.0 / u.sigmas) for (u, _, _, slots, _) in self._plan
                            if not u.linear and u.check_weight > 0.0]
        # do the checked rows read X_{k−1}?  (If not, the check needs no estimate of the previous state.)
        self.check_prev = any(not which for _, slots, _ in self._check_plan for which, _ in slots)
        self._check_buf = np.zeros(len(check_rows))
        # do the non-static rows read X_{k−1}?
        self.dynamic_prev = any(not which for p in self._plan for which, _ in p[3])
        offs = np.cumsum([0] + [u.dim for u, _, _ in self._check_plan])
        self._check_plan = [(u, slots, w, int(a), int(b)) for (u, slots, w), a, b in
                            zip(self._check_plan, offs[:-1], offs[1:])]
        # the Jacobian block last written to each (unit, slot) region (distinct layout): a unit returning the
        # same (constant) array object again needs no rewrite
        self._last_J = [[None] * len(p[3]) for p in self._plan]
        # per unit: its slots, its residual rows, its weights, the views of the blocks it writes (made once:
        # slicing at every linearization was a visible share of a 1-kHz step), whether those are distinct
        self._views = [(u, slots, self.r[row:row + u.dim], w, w[:, None],
                        [(self.A_cur if which else self.A_prev)[row:row + u.dim, cols] for which, cols in slots],
                        last, distinct)
                       for (u, row, w, slots, distinct), last in zip(self._plan, self._last_J)]

    def whitened_rows(self, unit) -> np.ndarray:
        """The rows of a (non-static) `unit` in the last linearization's whitened residual (a view of the
        internal buffer: valid until the next `linearize`)."""
        a, b = self._unit_rows[id(unit)]
        return self.r[a:b]

    def snapshot(self) -> list:
        """The units' current per-step parameters (references: the estimator assigns new objects)."""
        return [tuple(getattr(u, p) for p in names) for u, names in self._param_units]

    def restore(self, snap: list):
        """Put a snapshot back (units may be shared by several models: always set every value)."""
        for (u, names), vals in zip(self._param_units, snap):
            for p, val in zip(names, vals):
                setattr(u, p, val)

    def linearize(self, x_prev: Optional[np.ndarray], x_cur: np.ndarray, ctx: Optional[EvalContext] = None,
                  static_at: Optional[Tuple[Optional[np.ndarray], np.ndarray]] = None):
        """(A_prev or None, A_cur, r): whitened linearization at (x_prev, x_cur) (internal buffers).
        With ``static_at`` = (x_prev', x_cur') the rows of the static (affine) units are evaluated there
        instead (their linear model is exact, so this is the same model expressed about another point)."""
        A_cur, A_prev, r = self.A_cur, self.A_prev, self.r
        rs = self._rows_s
        if rs:
            xp, xc = (x_prev, x_cur) if static_at is None else static_at
            self._S.dot(xc if A_prev is None else np.concatenate((xp, xc)), out=r[:rs])
        if not self._all_distinct:
            A_cur[rs:] = 0.0
            if A_prev is not None:
                A_prev[rs:] = 0.0
            for last in self._last_J:
                last[:] = [None] * len(last)
        mul = np.multiply
        for u, slots, r_rows, w, wc, outs, last, distinct in self._views:
            e, Js = u.evaluate(*[x_cur[c] if which else x_prev[c] for which, c in slots], ctx=ctx)
            mul(e, w, out=r_rows)
            if distinct:         # every block of these rows is overwritten; the others stay zero
                i = 0
                for J in Js:
                    if J is not last[i]:
                        mul(J, wc, out=outs[i])
                        last[i] = J
                    i += 1
            else:                # (blocks shared by several slots: the sum of their terms)
                for out, J in zip(outs, Js):
                    out += J * wc
        return A_prev, A_cur, r

    def check_residual(self, x_prev: Optional[np.ndarray], x_cur: np.ndarray, ctx: Optional[EvalContext] = None):
        """Whitened nonlinear error of the rows in `check_rows` at (x_prev, x_cur) (an internal buffer,
        valid until the next call)."""
        buf = self._check_buf
        mul = np.multiply
        for u, slots, w, a, b in self._check_plan:
            mul(u.error(*[x_cur[c] if which else x_prev[c] for which, c in slots], ctx=ctx), w, out=buf[a:b])
        return buf


# ----------------------------------------------------------------------------------------------
class StepRecord:
    """What the window remembers about a step: its model, its units' parameters, the linearization point
    and the current linear model of its checked (nonlinear) rows (for the relinearization check)."""

    __slots__ = ("k", "model", "x_prev", "x_cur", "A_prev", "A_cur", "r", "factor_index", "relinearizations",
                 "mismatch", "params", "threshold", "_factor")

    def __init__(self, k: int, model: StepModel, x_prev: Optional[np.ndarray], x_cur: np.ndarray,
                 A_prev: Optional[np.ndarray] = None, A_cur: Optional[np.ndarray] = None,
                 r: Optional[np.ndarray] = None, factor_index: int = -1, relinearizations: int = 0,
                 mismatch: float = 0.0, params: Optional[list] = None, threshold: Optional[float] = None):
        self.k = k
        self.model = model
        self.x_prev = x_prev
        self.x_cur = x_cur
        self.A_prev = A_prev              # rows `model.check_rows` only (None when they do not read X_{k−1})
        self.A_cur = A_cur
        self.r = r
        self.factor_index = factor_index
        self.relinearizations = relinearizations
        self.mismatch = mismatch
        self.params = params              # the units' parameters at this step (`StepModel.snapshot`)
        self.threshold = threshold        # this step's relinearization threshold (None: the window's)
        self._factor = None

    def __repr__(self):
        return (f"StepRecord(k={self.k}, factor_index={self.factor_index}, relinearizations={self.relinearizations}, "
                f"mismatch={self.mismatch:.3g})")


class FixedLagWindow:
    """`gtsam.IncrementalFixedLagSmoother` (iSAM2, QR factorization, lag in steps) over stacked states
    with pre-linearized step factors and the relinearization safeguard.

    `relinearize_threshold` is in whitened units (multiples of the factors' sigmas): after each update
    the nonlinear residual of the checked steps is evaluated at the new estimate and, while it departs
    from the step factor's linear model by more than the threshold, the factor is removed
    (`factorsToRemove`) and re-added linearized at the estimate (all such factors in one update), at most
    `max_relinearizations` rounds per step.  `scope` chooses the checked steps:

    * ``"newest"`` – the step just added (enough when later steps do not move earlier states, as in
      forward dynamics);
    * ``"ends"``   – also the oldest step still in the window, i.e. every factor is re-checked at its
      final smoothed estimate just before it is marginalized into the prior;
    * ``"window"`` – every step in the window (the full nonlinear fixed-lag smoother, most expensive).

    With ``check_interval`` > 1 (scope ``"newest"``) the check of a step may be skipped when a quadratic
    bound says it cannot trigger: the mismatch is the second-order Taylor remainder of the step's rows, so
    it grows like ‖δ‖² with δ = estimate − linearization point.  Each check measures the curvature
    c = mismatch / ‖δ‖² (δ scaled per variable by the checked rows' sensitivity to it); a step is
    skipped while ``c_max ‖δ‖² < CHECK_MARGIN × threshold`` (c_max the largest curvature of the last
    ``CURVATURE_MEMORY`` checks) and at most ``check_interval − 1`` steps in a row.

    iSAM2 runs with ``findUnusedFactorSlots`` (the slots of removed and marginalized factors are reused, so
    its factor list stays as long as the window instead of growing by two entries per step).
    """

    SCOPES = ("newest", "ends", "window")
    CHECK_MARGIN = 0.05          # skip only when the bound is 20× below the threshold
    CURVATURE_MEMORY = 16        # the bound uses the largest curvature of this many recent checks

    def __init__(self, layout: StateLayout, lag_steps: int, ctx: EvalContext, relinearize_threshold: float = 1e-3,
                 max_relinearizations: int = 3, factorization: str = "QR", scope: str = "newest",
                 check_interval: int = 1):
        if scope not in self.SCOPES:
            raise ValueError(f"scope must be one of {self.SCOPES} (got {scope!r})")
        self.layout = layout
        self.lag = int(lag_steps)
        self.ctx = ctx
        self.threshold = float(relinearize_threshold)
        self.max_relinearizations = int(max_relinearizations)
        self.scope = scope
        self.check_interval = max(1, int(check_interval))
        self.skipped_checks = 0
        self._curvatures: Deque[float] = deque(maxlen=self.CURVATURE_MEMORY)
        self._curvature = math.inf       # largest recent mismatch / ‖δ‖² (inf: nothing measured yet)
        self._unchecked = 0              # steps in a row whose check was skipped
        params = gtsam.ISAM2Params()
        params.setFactorization(factorization)
        params.enableRelinearization = False      # every factor is linear: nothing for iSAM2 to relinearize
        params.findUnusedFactorSlots = True       # bounded factor list over an unbounded run
        self.smoother = gtsam.IncrementalFixedLagSmoother(float(self.lag), params)
        self.records: Dict[int, StepRecord] = {}
        self.last: Optional[StepRecord] = None
        self.total_relinearizations = 0
        self.steps = 0
        self._graph = gtsam.NonlinearFactorGraph()
        self._values = gtsam.Values()
        self._theta: Dict[int, np.ndarray] = {}      # key index -> the value it was inserted with
        self._empty_values = gtsam.Values()
        self._empty_stamps: Dict[int, float] = {}
        self._no_removals: list = []
        self._index_pending: Optional[StepRecord] = None

    # -- steps ------------------------------------------------------------------------------
    def add_step(self, k: int, model: StepModel, x_pred: np.ndarray, x_prev: Optional[np.ndarray] = None,
                 check: bool = True, threshold: Optional[float] = None,
                 screen: Optional[Callable[[StepModel], Optional[Tuple[StepModel, Optional[float]]]]] = None
                 ) -> np.ndarray:
        """Add step k (state X_k with initial value / linearization point `x_pred`; `x_prev` = the current
        estimate of X_{k−1}, needed when the model has `_prev` slots).  `threshold` overrides the window's
        relinearization threshold for this step.  `screen(model)`, called after the linearization at
        `x_pred` and before the update, may look at the residual rows (`StepModel.whitened_rows`) and return
        (another model, its threshold) to use instead (e.g. without an outlier reading), or raise to
        abandon the step.
        Returns the estimate of X_k."""
        theta = self._theta
        theta[k] = x_pred
        theta.pop(k - self.lag - 2, None)
        rec = self._prepared(k, model, x_pred, x_prev, threshold)
        if screen is not None:
            other = screen(model)
            if other is not None:
                rec = self._prepared(k, other[0], x_pred, x_prev, other[1])
        key = _X_KEY + k
        values = self._values
        values.clear()
        values.insert(key, x_pred)
        self._update1(rec, values, {key: float(k)})
        self.last = rec
        self.steps += 1
        # records whose keys are all still in the window (keys k − lag ... k are kept)
        records = self.records
        records[k] = rec
        # keys k − lag ... k stay: a two-step factor j needs j − 1 ≥ k − lag
        old = records.get(k - self.lag)
        if old is not None and old.x_prev is not None:
            del records[k - self.lag]
        records.pop(k - self.lag - 1, None)
        x_est = self.estimate(k)
        if check:
            x_est = self.safeguard(x_est)
        return x_est

    def _prepared(self, k, model, x_pred, x_prev, threshold) -> StepRecord:
        """The record of step k, linearized at `x_pred`."""
        if not model.need_prev:
            x_prev = None
        elif x_prev is None:
            raise ValueError("this step's units read the previous state: x_prev is required")
        rec = StepRecord(k, model, x_prev, x_pred, params=model.snapshot() if model._param_units else [],
                         threshold=threshold)
        self._linearize(rec, restore=False)
        return rec

    def _linearize(self, rec: StepRecord, restore: bool = True):
        model = rec.model
        if restore:
            model.restore(rec.params)
        # iSAM2 never relinearizes (every factor is linear), so each key's linearization point stays the
        # value θ it was inserted with; the factor is handed over as a linear factor in δ = X − θ, without a
        # linearization point of its own: the static rows are evaluated at θ directly, the others shifted
        # from the factor's own linearization point.
        theta = self._theta
        k = rec.k
        th_cur = theta[k]
        th_prev = theta[k - 1] if rec.x_prev is not None else None
        A_prev, A_cur, r = model.linearize(rec.x_prev, rec.x_cur, self.ctx, static_at=(th_prev, th_cur))
        rows = model._check_slice
        if rows is not None:
            rec.A_cur, rec.r = A_cur[rows].copy(), r[rows].copy()
            rec.A_prev = A_prev[rows].copy() if model.check_prev else None
        elif model.check_rows.size:
            rows = model.check_rows
            rec.A_cur, rec.r = A_cur[rows], r[rows]
            rec.A_prev = A_prev[rows] if model.check_prev else None
        else:
            rec.A_cur = rec.r = _EMPTY
            rec.A_prev = None
        b = np.negative(r)
        rs = model._rows_s
        if th_cur is not rec.x_cur:
            b[rs:] -= A_cur[rs:].dot(th_cur - rec.x_cur)
        if model.dynamic_prev and th_prev is not rec.x_prev:
            b[rs:] -= A_prev[rs:].dot(th_prev - rec.x_prev)
        noise = _unit_noise(r.size)
        if A_prev is None:
            jf = gtsam.JacobianFactor(_X_KEY + k, A_cur, b, noise)
        else:
            jf = gtsam.JacobianFactor(_X_KEY + k - 1, A_prev, _X_KEY + k, A_cur, b, noise)
        rec._factor = gtsam.LinearContainerFactor(jf)

    def _update1(self, rec, values, timestamps):
        g = self._graph
        g.resize(0)
        g.push_back(rec._factor)
        rec._factor = None
        self._index_pending = None
        self.smoother.update(g, values, timestamps, self._no_removals)
        if self.scope == "newest" and self.steps >= 3:
            # only this step's factor can still be replaced (by the safeguard, before the next update):
            # its index is read from iSAM2's result only then (`_index_of`)
            rec.factor_index = -1
            self._index_pending = rec
        else:
            rec.factor_index = int(self.smoother.getISAM2Result().getNewFactorsIndices()[0])

    def _index_of(self, rec: StepRecord) -> int:
        """iSAM2's index of the factor of `rec`."""
        if rec.factor_index < 0:
            if rec is not self._index_pending:
                raise RuntimeError(f"the factor index of step {rec.k} was not recorded (scope 'newest': only the "
                                   f"newest step's factor can be replaced, before the next update)")
            rec.factor_index = int(self.smoother.getISAM2Result().getNewFactorsIndices()[0])
            self._index_pending = None
        return rec.factor_index

    def _update(self, recs, values, timestamps, remove):
        g = self._graph
        g.resize(0)
        for rec in recs:
            g.push_back(rec._factor)
            rec._factor = None
        self._index_pending = None
        self.smoother.update(g, values, timestamps, remove)
        idx = self.smoother.getISAM2Result().getNewFactorsIndices()
        for i, rec in enumerate(recs):
            rec.factor_index = int(idx[i])

    def mismatch(self, rec: StepRecord, x_prev: Optional[np.ndarray], x_cur: np.ndarray, restore: bool = True) -> float:
        """max weighted |nonlinear − linear model| of the step's nonlinear rows at (x_prev, x_cur)."""
        if rec.r.size == 0:
            return 0.0
        model = rec.model
        if restore:
            model.restore(rec.params)
        lin = rec.A_cur.dot(x_cur - rec.x_cur)
        lin += rec.r
        if rec.A_prev is not None:
            lin += rec.A_prev.dot(x_prev - rec.x_prev)
        diff = model.check_residual(x_prev, x_cur, self.ctx)
        lin -= diff
        np.abs(lin, out=lin)
        if model.check_weights is not None:
            lin *= model.check_weights
        m = float(_max(lin))
        if m != m:
            raise FloatingPointError("non-finite residual at the estimate")
        return m

    def _checked(self):
        newest = self.last
        if self.scope == "newest" or len(self.records) == 1:
            return [newest]
        if self.scope == "ends":
            oldest = self.records[min(self.records)]
            return [newest] if oldest is newest else [newest, oldest]
        return [self.records[j] for j in sorted(self.records, reverse=True)]

    def safeguard(self, x_est: Optional[np.ndarray] = None) -> np.ndarray:
        """Re-linearize the checked steps' factors at the estimate while their linear models are off;
        returns the estimate of the newest state."""
        newest = self.last
        newest.relinearizations = 0
        calc = self.estimate
        if x_est is not None and (self.scope == "newest" or len(self.records) == 1) and not newest.model.check_prev:
            # common case: one checked step whose checked rows read only its own state
            thr = self.threshold if newest.threshold is None else newest.threshold
            if self.check_interval > 1:
                # δ scaled by the checked rows' sensitivity to each variable (column norms of A)
                A = newest.A_cur
                d = x_est - newest.x_cur
                d *= np.sqrt(_add_reduce(A * A, 0))
                dd = float(d.dot(d))
                bound = self._curvature * dd if dd > 0.0 else 0.0
                if self._unchecked < self.check_interval - 1 and bound < self.CHECK_MARGIN * thr:
                    self._unchecked += 1
                    self.skipped_checks += 1
                    newest.mismatch = bound
                    return x_est
                self._unchecked = 0
            newest.mismatch = m = self.mismatch(newest, None, x_est, restore=False)
            if self.check_interval > 1 and dd > 0.0:
                curv = self._curvatures
                curv.append(m / dd)
                self._curvature = max(curv)
            if not m > thr or self.max_relinearizations < 1:
                return x_est
        for round_ in range(self.max_relinearizations + 1):
            cache: Dict[int, np.ndarray] = {newest.k: x_est} if x_est is not None else {}
            stale = []
            for rec in self._checked():
                k = rec.k
                x_cur = cache.get(k)
                if x_cur is None:
                    x_cur = cache[k] = calc(k)
                x_prev = None
                if rec.x_prev is not None:
                    # the estimate of X_{k−1}: needed for the checked rows or for a relinearization
                    x_prev = cache.get(k - 1)
                    if x_prev is None and rec.A_prev is not None:
                        x_prev = cache[k - 1] = calc(k - 1)
                # the step just added still has its parameters in place: no restore
                rec.mismatch = self.mismatch(rec, x_prev, x_cur, restore=rec is not newest or round_ > 0)
                thr = self.threshold if rec.threshold is None else rec.threshold
                if rec.mismatch > thr and round_ < self.max_relinearizations:
                    if rec.x_prev is not None and x_prev is None:
                        x_prev = cache[k - 1] = calc(k - 1)
                    rec.x_prev, rec.x_cur = x_prev, x_cur
                    stale.append(rec)
            if not stale:
                x = cache.get(newest.k)
                return x if x is not None else calc(newest.k)
            remove = [self._index_of(rec) for rec in stale]
            for rec in stale:
                rec.relinearizations += 1
                self._linearize(rec)
            self.total_relinearizations += len(stale)
            self._update(stale, self._empty_values, self._empty_stamps, remove)
            x_est = None
        return calc(newest.k)

    def add_factor(self, k: int, A: np.ndarray, r: np.ndarray, x_lin: np.ndarray) -> bool:
        """An extra whitened linear factor on X_k already in the window (e.g. a reading that arrived after
        step k was estimated): e_w ≈ r + A (X_k − x_lin).  False if X_k has left the window."""
        theta = self._theta.get(k)
        if theta is None or k not in self.records:
            return False
        if self._index_pending is not None:      # read before this update replaces iSAM2's result
            self._index_of(self._index_pending)
        b = -(r + A.dot(theta - x_lin))           # the factor in δ = X_k − θ_k (see `_linearize`)
        g = self._graph
        g.resize(0)
        g.push_back(gtsam.LinearContainerFactor(gtsam.JacobianFactor(_X_KEY + k, A, b, _unit_noise(r.size))))
        self.smoother.update(g, self._empty_values, self._empty_stamps, self._no_removals)
        return True

    def reparametrize(self, k: int, unit, **values) -> bool:
        """Change per-step parameters of `unit` in step k's factor (e.g. a rate known only later) and
        re-linearize that factor at the current estimate.  False if step k is no longer in the window."""
        rec = self.records.get(k)
        if rec is None:
            return False
        for i, (u, names) in enumerate(rec.model._param_units):
            if u is unit:
                vals = list(rec.params[i])
                for name, val in values.items():
                    vals[names.index(name)] = val
                rec.params = list(rec.params)
                rec.params[i] = tuple(vals)
                break
        else:
            return False
        rec.x_cur = self.estimate(k)
        rec.x_prev = self.estimate(k - 1) if rec.x_prev is not None else None
        self._linearize(rec)
        self._update([rec], self._empty_values, self._empty_stamps, [self._index_of(rec)])
        return True

    # -- queries ----------------------------------------------------------------------------
    def estimate(self, k: int) -> np.ndarray:
        return self.smoother.calculateEstimateVector(state_key(k))

    def marginal_covariance(self, k: int) -> np.ndarray:
        return self.smoother.marginalCovariance(state_key(k))
