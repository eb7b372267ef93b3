#!/usr/bin/env python3
"""The batch's dynamics without a copy of its own: what one kernel call per step costs and what a machine without
the compiled kernel gets.  The batch solvers evaluate q̈ and its derivatives over all steps of a trajectory; they
did so with a batched numpy copy of the formulas (`BatchDynamics`, removed: one kernel call per step took
0.47–0.82× its time on the shipped mechanisms, the same numbers to 6e-14, measured with this script at commit
c8b23e9) and now step by step through the per-step forms (`dynamics.batched.dynamics_many`): the compiled
kernel, else numpy's.  Here both routes and their difference, with Φ and Φq (the kernel's many-state call).

    PYTHONPATH=. python bench/single_source.py [--steps 2000] [--repeat 5]

Per mechanism: the median wall time of each route over `--repeat` runs, their ratio, and the largest difference of
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


def through(mech, q, v, Q, kernel):
    from mbfg_ros.dynamics.batched import dynamics_many
    phi, J = mech.constraints.phi_and_jacobian(q)
    return (phi, J) + dynamics_many(mech, q, v, Q, kernel=kernel)


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
    limit_blas_threads(1)
    print(f"| mechanism | n | m | numpy per step [ms] | compiled, a call per step [ms] | ratio | max relative difference |")
    print("|---|---|---|---|---|---|---|")
    for name in ("four_bar", "four_bar_crank", "slider_crank", "pick_and_place_robot", "double_pendulum_a0"):
        mech = load_mechanism(name)
        q, v, Q = states(mech, a.steps)
        tb, ob = median_time(lambda: through(mech, q, v, Q, None), a.repeat)
        tc, oc = median_time(lambda: through(mech, q, v, Q, native.mechanism_kernel(mech)), a.repeat)
        diff = max(float(np.abs(x - y).max()) / max(1.0, float(np.abs(y).max())) for x, y in zip(oc, ob))
        print(f"| {name} | {mech.n} | {mech.m} | {1e3 * tb:.1f} | {1e3 * tc:.1f} | {tc / tb:.2f} | {diff:.1e} |")
    print(f"\n{a.steps} states per mechanism: Φ, Φq and q̈ with ∂q̈/∂q, ∂q̈/∂q̇, ∂q̈/∂Q at each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
