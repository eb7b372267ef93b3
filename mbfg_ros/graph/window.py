"""The fixed-lag window of the fast path: one stacked state variable per step (`graph.layout.StateLayout`),
each step's units linearized once outside GTSAM (`graph.step_model.StepModel`: the compiled kernel, or numpy)
and handed to iSAM2 as one linear C++ factor.  Since such a factor is a fixed first-order model, `FixedLagWindow`
implements the relinearization safeguard: after each update it evaluates the newest step's nonlinear
residual at the estimate and, while it departs from the linear model by more than a threshold, replaces
the factor (`factorsToRemove`) by one linearized at the new estimate.  (The window hands iSAM2 its
factors in δ = X − θ, θ being each key's insertion value, which iSAM2 never changes since nothing is
relinearized there: no linearization point per factor.)
"""

from __future__ import annotations

import math
from collections import deque
from typing import Deque, Dict, List, Optional

import gtsam
import numpy as np

from mbfg_ros import native
from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.graph.gtsam_adapters import STATE_KEY_0, state_key, unit_noise
from mbfg_ros.graph.layout import StateLayout
from mbfg_ros.graph.step_model import StepModel, StepValues

__all__ = ["FixedLagWindow", "StepRecord"]

_EMPTY = np.zeros(0)
_NO_VALUES: StepValues = {}
_max = np.maximum.reduce


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
        self.params = params              # the units' parameters at this step (`StepModel.params_of`)
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
    CONTRACTION = 0.5            # a relinearization that does not shrink the mismatch this much is halved,
    FAR = 100.0                  # where the mismatch is more than this many thresholds

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
        self._scaled_distance2 = native.scaled_distance2
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
                 values: Optional[StepValues] = None) -> np.ndarray:
        """`prepare` step k and `commit` it; returns the estimate of X_k."""
        return self.commit(self.prepare(k, model, x_pred, x_prev, threshold, values), check)

    def prepare(self, k: int, model: StepModel, x_pred: np.ndarray, x_prev: Optional[np.ndarray] = None,
                threshold: Optional[float] = None, values: Optional[StepValues] = None) -> StepRecord:
        """Linearize step k's `model` (state X_k with initial value / linearization point `x_pred`; `x_prev` =
        the current estimate of X_{k−1}, needed when the model has `_prev` slots) without adding it: until
        the next `prepare`, the caller may look at its residual rows (``record.model.whitened_rows``) and
        prepare another model of the same step instead (e.g. without an outlier reading).  `threshold`
        overrides the window's relinearization threshold for this step; `values` are its units' per-step
        parameters (readings, forces, ...: `StepModel.params_of`), kept with the step for every later
        re-linearization."""
        theta = self._theta
        theta[k] = x_pred
        theta.pop(k - self.lag - 2, None)
        return self._prepared(k, model, x_pred, x_prev, threshold, values)

    def commit(self, rec: StepRecord, check: bool = True) -> np.ndarray:
        """Add the prepared step to the window (one iSAM2 update) and, with `check`, run the relinearization
        safeguard; returns the estimate of X_k."""
        k = rec.k
        key = STATE_KEY_0 + k
        values = self._values
        values.clear()
        values.insert(key, rec.x_cur)
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

    def _prepared(self, k, model, x_pred, x_prev, threshold, values=None) -> StepRecord:
        """The record of step k, linearized at `x_pred`."""
        if not model.need_prev:
            x_prev = None
        elif x_prev is None:
            raise ValueError("this step's units read the previous state: x_prev is required")
        params = model.params_of(values or _NO_VALUES) if model.param_units else []
        rec = StepRecord(k, model, x_prev, x_pred, params=params, threshold=threshold)
        self._linearize(rec)
        return rec

    def _linearize(self, rec: StepRecord):
        model = rec.model
        # iSAM2 never relinearizes (every factor is linear), so each key's linearization point stays the
        # value θ it was inserted with; the factor is handed over as a linear factor in δ = X − θ, without a
        # linearization point of its own: the static rows are evaluated at θ directly, the others shifted
        # from the factor's own linearization point.
        theta = self._theta
        k = rec.k
        th_cur = theta[k]
        th_prev = theta[k - 1] if rec.x_prev is not None else None
        compiled = model.native_linearize(rec.x_prev, rec.x_cur, self.ctx, (th_prev, th_cur), rec.params)
        if compiled is not None:
            A_prev, A_cur, r, b = compiled
        else:
            A_prev, A_cur, r = model.linearize(rec.x_prev, rec.x_cur, self.ctx, static_at=(th_prev, th_cur),
                                               params=rec.params)
            b = np.negative(r)
            rs = model.static_rows
            if th_cur is not rec.x_cur:
                b[rs:] -= A_cur[rs:].dot(th_cur - rec.x_cur)
            if model.dynamic_prev and th_prev is not rec.x_prev:
                b[rs:] -= A_prev[rs:].dot(th_prev - rec.x_prev)
        rows = model.check_slice
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
        noise = unit_noise(r.size)
        if A_prev is None:
            jf = gtsam.JacobianFactor(STATE_KEY_0 + k, A_cur, b, noise)
        else:
            jf = gtsam.JacobianFactor(STATE_KEY_0 + k - 1, A_prev, STATE_KEY_0 + k, A_cur, b, noise)
        rec._factor = gtsam.LinearContainerFactor(jf)

    def _update1(self, rec, values, timestamps):
        g = self._graph
        g.resize(0)
        # (the factor stays with its record: `_index_of` finds it again in iSAM2's factor list; `add`, not
        # `push_back`, whose dozens of pybind11 overloads are tried in turn)
        g.add(rec._factor)
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
            if rec is self._index_pending:
                rec.factor_index = int(self.smoother.getISAM2Result().getNewFactorsIndices()[0])
                self._index_pending = None
            else:
                rec.factor_index = self._find_index(rec)
        return rec.factor_index

    def _find_index(self, rec: StepRecord) -> int:
        """The index of an older step's factor (scope 'newest' records only the newest step's: reading it at
        every update would cost every step for the rare replacement of an older one).  pybind11 hands back
        the Python object it already has for a C++ factor, and the record keeps the one it pushed."""
        factor = rec._factor
        graph = self.smoother.getFactors()
        for i in range(graph.size()):
            if graph.at(i) is factor:
                return i
        raise RuntimeError(f"the factor of step {rec.k} is not in the smoother")

    def _update(self, recs, values, timestamps, remove):
        g = self._graph
        g.resize(0)
        for rec in recs:
            g.add(rec._factor)
        self._index_pending = None
        self.smoother.update(g, values, timestamps, remove)
        idx = self.smoother.getISAM2Result().getNewFactorsIndices()
        for i, rec in enumerate(recs):
            rec.factor_index = int(idx[i])

    def mismatch(self, rec: StepRecord, x_prev: Optional[np.ndarray], x_cur: np.ndarray) -> float:
        """max weighted |nonlinear − linear model| of the step's nonlinear rows at (x_prev, x_cur)."""
        if rec.r.size == 0:
            return 0.0
        model = rec.model
        m = model.native_mismatch(self.ctx, rec.params, rec.A_cur, rec.r, rec.A_prev, rec.x_cur, rec.x_prev, x_cur,
                                  x_prev)
        if m is None:
            m = float(_max(self.row_mismatches(rec, x_prev, x_cur)))
        if m != m:
            raise FloatingPointError("non-finite residual at the estimate")
        return m

    def row_mismatches(self, rec: StepRecord, x_prev: Optional[np.ndarray], x_cur: np.ndarray) -> np.ndarray:
        """Per checked row (`StepModel.check_blocks`), the weighted |nonlinear − linear model| at (x_prev, x_cur)."""
        lin = rec.A_cur.dot(x_cur - rec.x_cur)
        lin += rec.r
        if rec.A_prev is not None:
            lin += rec.A_prev.dot(x_prev - rec.x_prev)
        model = rec.model
        lin -= model.check_residual(x_prev, x_cur, self.ctx, params=rec.params)
        np.abs(lin, out=lin)
        if model.check_weights is not None:
            lin *= model.check_weights
        return lin

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
                dd = self._scaled_distance2(newest.A_cur, x_est, newest.x_cur)
                bound = self._curvature * dd if dd > 0.0 else 0.0
                if self._unchecked < self.check_interval - 1 and bound < self.CHECK_MARGIN * thr:
                    self._unchecked += 1
                    self.skipped_checks += 1
                    newest.mismatch = bound
                    return x_est
                self._unchecked = 0
            newest.mismatch = m = self.mismatch(newest, None, x_est)
            if self.check_interval > 1 and dd > 0.0:
                curv = self._curvatures
                curv.append(m / dd)
                self._curvature = max(curv)
            if not m > thr or self.max_relinearizations < 1:
                return x_est
        previous: Dict[int, float] = {}       # each checked step's mismatch in the round before
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
                rec.mismatch = self.mismatch(rec, x_prev, x_cur)
                thr = self.threshold if rec.threshold is None else rec.threshold
                if rec.mismatch > thr and round_ < self.max_relinearizations:
                    if rec.x_prev is not None and x_prev is None:
                        x_prev = cache[k - 1] = calc(k - 1)
                    before, previous[k] = previous.get(k), rec.mismatch
                    if (before is not None and rec.mismatch > self.CONTRACTION * before
                            and rec.mismatch > self.FAR * thr):
                        # Far off and not contracting: the estimate jumps across a steep stretch of a row (a
                        # smooth Coulomb sign near zero speed) and back; halfway between it and the point the
                        # row was linearized at, the iteration settles where the full step oscillates.  (Near
                        # the threshold the full step is kept: there the mismatch is rounding's floor.)
                        x_cur = 0.5 * (x_cur + rec.x_cur)
                        if x_prev is not None and rec.x_prev is not None:
                            x_prev = 0.5 * (x_prev + rec.x_prev)
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
        g.add(gtsam.LinearContainerFactor(gtsam.JacobianFactor(STATE_KEY_0 + k, A, b, unit_noise(r.size))))
        self.smoother.update(g, self._empty_values, self._empty_stamps, self._no_removals)
        return True

    def reparametrize(self, k: int, unit, **values) -> bool:
        """Change per-step parameters of `unit` in step k's factor (e.g. a rate known only later) and
        re-linearize that factor at the current estimate.  False if step k is no longer in the window."""
        rec = self.records.get(k)
        if rec is None or not self._set_params(rec, {unit: values}):
            return False
        rec.x_cur = self.estimate(k)
        rec.x_prev = self.estimate(k - 1) if rec.x_prev is not None else None
        self._linearize(rec)
        self._update([rec], self._empty_values, self._empty_stamps, [self._index_of(rec)])
        return True

    @staticmethod
    def _set_params(rec: StepRecord, values: StepValues) -> bool:
        """Set per-step parameters of `rec`'s units (unit -> {parameter: value}); whether any unit had them."""
        params, changed = list(rec.params), False
        for i, (u, names) in enumerate(rec.model.param_units):
            given = values.get(u)
            if given:
                vals = list(params[i])
                for name, val in given.items():
                    vals[names.index(name)] = val
                params[i] = tuple(vals)
                changed = True
        if changed:
            rec.params = params
        return changed

    def replace_values(self, changes: Dict[int, StepValues]) -> List[int]:
        """Change per-step parameters of steps already in the window (`changes`: step -> unit -> {parameter:
        value}; e.g. the commands of a step, known only after it was estimated).  Each changed step's factor
        is linearized again at its own linearization point with the new values, i.e. it becomes the factor
        the step would have had with them from the start, and all replace the old ones in one iSAM2 update
        (`factorsToRemove`); then the relinearization check runs on those steps at the new estimate (their
        own thresholds, at most `max_relinearizations` rounds).  Returns the steps changed (steps no longer
        in the window, or whose units have none of these parameters, are left out)."""
        recs = []
        for k in sorted(changes):
            rec = self.records.get(k)
            if rec is None:
                continue
            if self._set_params(rec, changes[k]):
                recs.append(rec)
        if not recs:
            return []
        if self._index_pending is not None:      # read before this update replaces iSAM2's result
            self._index_of(self._index_pending)
        changed_steps = [rec.k for rec in recs]
        for round_ in range(self.max_relinearizations + 1):
            remove = [self._index_of(rec) for rec in recs]
            for rec in recs:
                self._linearize(rec)
            self._update(recs, self._empty_values, self._empty_stamps, remove)
            if round_ == self.max_relinearizations:
                break
            stale = []
            for rec in recs:
                x_cur = self.estimate(rec.k)
                x_prev = self.estimate(rec.k - 1) if rec.x_prev is not None else None
                rec.mismatch = self.mismatch(rec, x_prev, x_cur)
                if rec.mismatch > (self.threshold if rec.threshold is None else rec.threshold):
                    rec.x_prev, rec.x_cur = x_prev, x_cur
                    rec.relinearizations += 1
                    stale.append(rec)
            if not stale:
                break
            self.total_relinearizations += len(stale)
            recs = stale
        return changed_steps

    # -- queries ----------------------------------------------------------------------------
    def estimate(self, k: int) -> np.ndarray:
        return self.smoother.calculateEstimateVector(state_key(k))

    def marginal_covariance(self, k: int) -> np.ndarray:
        return self.smoother.marginalCovariance(state_key(k))
