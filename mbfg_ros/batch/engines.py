"""The two Levenberg–Marquardt engines over a `batch.problem.Problem`.

* ``engine="sparse"`` (default): LM written here over the `Assembly` (banded normal equations, see
  `batch.problem`).  Convergence is judged on the Gauss–Newton model (predicted decrease ≤ 1e-10 ×
  cost), tested with the previous factorization, so a converged stage costs no extra evaluation or
  factorization.  OpenBLAS runs single-threaded meanwhile: the banded Cholesky is a long chain of small
  BLAS calls, which threads only slow down.
* ``engine="gtsam"``: the same factors as `gtsam.CustomFactor` (via `mbfg_ros.graph.gtsam_adapters.custom_factor`)
  and `gtsam.LevenbergMarquardtOptimizer` with multifrontal QR and tolerances that converge.  The
  paper's structure literally; two orders of magnitude slower (a Python callback per factor and
  linearization, and 4–7 LM iterations per stage).
"""

from __future__ import annotations

import time
from typing import Optional

import numpy as np

from mbfg_ros.batch.problem import Assembly, Key, LMReport, LMSettings, Problem
from mbfg_ros.blas import single_threaded_blas

__all__ = ["solve"]


def _solve_sparse(prob: Problem, settings: LMSettings) -> LMReport:
    t0 = time.perf_counter()
    asm = Assembly(prob)
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
        dx = asm.step(g, lam)
        if not np.all(np.isfinite(dx)):
            lam = max(lam * settings.lambda_factor, settings.lambda_initial)
            if lam > 1e12:
                break
            continue
        predicted = asm.model_decrease(g, dx)
        if predicted <= settings.relative_tolerance * cost + settings.absolute_tolerance:
            converged = True
            break
        saved = [(G.r.copy(), G.J if G.linear else G.J.copy()) for G in asm.groups]
        x_new = x + dx
        cost_new = asm.evaluate(x_new)
        evaluations += 1
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
    for unit, keys, params in prob.factors:
        graph.add(custom_factor(unit, [_gtsam_key(k) for k in keys], params))
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
        with single_threaded_blas():
            return _solve_sparse(prob, settings)
    if engine == "gtsam":
        return _solve_gtsam(prob, settings)
    raise ValueError(f"engine must be 'sparse' or 'gtsam' (got '{engine}')")
