#!/usr/bin/env python3
"""Could the compiled kernel be the batch's only implementation too?  The measurement behind the plan of keeping
each formula once (docs/decisions.md, "Where each formula lives"): the batch solvers evaluate Φ, Φq and the
dynamics linearization over all steps of a trajectory with numpy's batched forms (`dynamics.batched`, a third
hand-kept copy beside the per-step numpy and C forms); here the same numbers from the compiled kernel, one C call
per step in a Python loop, against the batched numpy forms, on every shipped mechanism the kernel knows.

    PYTHONPATH=. python bench/single_source.py [--steps 2000] [--repeat 5]

Per mechanism: the median wall time of each form over `--repeat` runs, their ratio, and the largest difference of
their numbers relative to the largest entry (the two forms round differently).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def states(mech, N, seed=0):
    from mbfg_ros.dynamics.kinematics import solve_positions
    rng = np.random.default_rng(seed)
    base = [solve_positions(mech, np.array(mech.q0) + 0.02 * rng.standard_normal(mech.n)).q for _ in range(8)]
    q = np.array([base[k % len(base)] for k in range(N)])
    v = rng.standard_normal((N, mech.n))
    Q = mech.gravity_forces + rng.standard_normal((N, mech.n))
    return q, v, Q


def batched(mech, q, v, Q):
    from mbfg_ros.dynamics.batched import BatchContext
    ctx = BatchContext(mech)
    cols = np.arange(mech.n)
    phi, J = ctx.phi_and_jacobian("q", q)
    a, dq, dv, dQ = ctx.dynamics("q", "v", q, v, Q, cols)
    return phi, J, a, dq, dv, dQ


def compiled_loop(mech, q, v, Q):
    from mbfg_ros import native
    k = native.mechanism_kernel(mech)
    N, n, m = q.shape[0], mech.n, mech.m
    phi, J = np.empty((N, m)), np.empty((N, m, n))
    a, dq, dv, dQ = np.empty((N, n)), np.empty((N, n, n)), np.empty((N, n, n)), np.empty((N, n, n))
    lam, Jl, Jd = np.empty(m), np.empty((m, n)), np.empty((m, n))
    for i in range(N):
        k.phi_and_jacobian(q[i], phi[i], J[i])
        if not k.linearize(q[i], v[i], Q[i], a[i], dq[i], dv[i], dQ[i], lam, Jl, Jd):
            raise RuntimeError(f"singular dynamics at step {i}")
    return phi, J, a, dq, dv, dQ


def median_time(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    from mbfg_ros import native
    from mbfg_ros.blas import limit_blas_threads
    from mbfg_ros.model.mechanism import load_mechanism
    if not native.AVAILABLE:
        print(native.UNAVAILABLE_REASON, file=sys.stderr)
        return 1
    limit_blas_threads(1)
    print(f"| mechanism | n | m | batched numpy [ms] | compiled, a call per step [ms] | ratio | max relative difference |")
    print("|---|---|---|---|---|---|---|")
    for name in ("four_bar", "four_bar_crank", "slider_crank", "pick_and_place_robot", "double_pendulum_a0"):
        mech = load_mechanism(name)
        q, v, Q = states(mech, a.steps)
        tb, ob = median_time(lambda: batched(mech, q, v, Q), a.repeat)
        tc, oc = median_time(lambda: compiled_loop(mech, q, v, Q), a.repeat)
        diff = max(float(np.abs(x - y).max()) / max(1.0, float(np.abs(y).max())) for x, y in zip(oc, ob))
        print(f"| {name} | {mech.n} | {mech.m} | {1e3 * tb:.1f} | {1e3 * tc:.1f} | {tc / tb:.2f} | {diff:.1e} |")
    print(f"\n{a.steps} states per mechanism: Φ, Φq and q̈ with ∂q̈/∂q, ∂q̈/∂q̇, ∂q̈/∂Q at each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
