#!/usr/bin/env python3
"""Are two versions of the estimator's code giving the same estimates?  Runs a fixed set of scenarios (the
three modes x formulations x integrators on the four-bar, the crank four-bar and the robot, with glitches,
outages, late readings, gaps, re-initializations and the covariance) and saves every estimate (q, q̇, q̈, Q,
efforts, the covariance, status and message) to an .npz; `--compare` reports the largest relative
difference between two such files.  For refactorings that must not change a number:

    git worktree add /tmp/before <commit>
    (cd /tmp/before && PYTHONPATH=. python bench/estimate_identity.py --out /tmp/before.npz)
    PYTHONPATH=. python bench/estimate_identity.py --out /tmp/after.npz
    python bench/estimate_identity.py --compare /tmp/before.npz /tmp/after.npz

`--perturb 1e-15` shows how much a scenario's estimates move when one step's readings change at the level of
rounding (e.g. on the numpy path, `MBFG_ROS_NATIVE=0`): differences of that size between two versions are
the scenario's sensitivity, not a change of the model.

Changes of the estimates on purpose (compare across them only with that in mind): the fused scenarios
change where the disturbance became damped back to 0 (`disturbance_time_constant`, default 1 s; before: an
undamped integrated random walk), and again where the online density fit began to fit that time constant too
(`estimation/density_adaptation.py`; the estimation and forward-dynamics scenarios unchanged), and where the
efforts' boosts began (`DensityAdaptation(boosts=True)`: the crank's estimation scenarios, within 0.9 %).
"""
import argparse
import sys
from pathlib import Path
import numpy as np

def imports():
    from mbfg_ros.estimation.config import EstimatorConfig
    from mbfg_ros.estimation.estimator import FixedLagEstimator
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.sim.plant import Actuator, SimulatedPlant
    return EstimatorConfig, FixedLagEstimator, load_mechanism, SimulatedPlant, Actuator

def run(out, perturb=0.0):
    EstimatorConfig, FixedLagEstimator, load_mechanism, Plant, Actuator = imports()

    def SimulatedPlant(mech, dt, seed):        # exact commands: the scenarios compare code, not plants
        return Plant(mech, dt=dt, seed=seed, actuator=Actuator.ideal(mech))
    import mbfg_ros
    root = Path(list(mbfg_ros.__path__)[0]).parent
    res = {}
    crank = load_mechanism(str(root / "mechanisms" / "four_bar_crank.yaml"))
    robot = load_mechanism(str(root / "mechanisms" / "pick_and_place_robot.yaml"))
    four = load_mechanism(str(root / "mechanisms" / "four_bar.yaml"))
    dt = 1e-3
    traj_c = SimulatedPlant(crank, dt=dt, seed=3).simulate(1.0)
    traj_r = SimulatedPlant(robot, dt=dt, seed=5).simulate(0.4)

    def go(name, mech, traj, cfg, use_obs=True, use_eff=True, glitch=None, outage=None, late=False,
           reinit_every=None, gap_at=None):
        est = FixedLagEstimator(mech, cfg)
        rows, stat = [], []
        outs = []
        for k in range(len(traj.t)):
            obs = {n: float(v[k]) for n, v in traj.readings.items()} if use_obs else None
            if obs is not None and perturb and k == 5:
                obs = {n: v + perturb for n, v in obs.items()}
            if obs is not None and glitch is not None and k == glitch:
                obs = {n: v + 0.5 for n, v in obs.items()}
            if obs is not None and glitch is not None and 700 <= k < 780:
                obs = {n: v + 0.3 for n, v in obs.items()}
            if obs is not None and outage is not None and outage[0] <= k < outage[1]:
                obs = {}
            if late and obs:
                obs_now = {}
            else:
                obs_now = obs
            t = float(traj.t[k])
            if gap_at is not None and gap_at[0] <= k < gap_at[1]:
                continue
            e = est.step(t, efforts=traj.efforts[k] if use_eff else None, observations=obs_now)
            outs.append(e)
            if late and k >= 3 and use_obs:
                prev = outs[-4] if len(outs) >= 4 else None
                if prev is not None:
                    est.add_late_observations(prev.step, {n: float(v[k - 3]) for n, v in traj.readings.items()})
            if reinit_every and k and k % reinit_every == 0:
                est.reinitialize()
            cov = e.covariance if e.covariance is not None else np.zeros((0,))
            rows.append(np.concatenate([e.q, e.v, e.a, e.Q, e.efforts, np.ravel(cov)]))
            stat.append(f"{e.status}|{e.message}")
        res[name] = np.array(rows)
        res[name + ":status"] = np.array(stat)
        res[name + ":relin"] = np.array([est.relinearizations, est.recoveries])

    C = EstimatorConfig
    for integ in ("trapezoidal", "hermite", "euler"):
        go(f"fd_dep_{integ}", four, SimulatedPlant(four, dt=dt, seed=1).simulate(1.0),
           C(dt=dt, window=10, integrator=integ), use_obs=False, use_eff=False)
        go(f"fd_ind_{integ}", four, SimulatedPlant(four, dt=dt, seed=1).simulate(1.0),
           C(dt=dt, window=10, integrator=integ, formulation="independent"), use_obs=False, use_eff=False)
        go(f"est_{integ}", crank, traj_c, C(dt=dt, window=10, mode="estimation", integrator=integ), use_eff=False,
           glitch=300, outage=(500, 540))
        go(f"fused_{integ}", crank, traj_c, C(dt=dt, window=10, mode="fused", integrator=integ), glitch=300)
        go(f"fused_ind_{integ}", crank, traj_c, C(dt=dt, window=5, mode="fused", integrator=integ,
                                                   formulation="independent"))
        go(f"robot_fd_{integ}", robot, traj_r, C(dt=dt, window=10, integrator=integ), use_obs=False)
        go(f"robot_est_{integ}", robot, traj_r, C(dt=dt, window=10, mode="estimation", integrator=integ),
           use_eff=False, reinit_every=100)
    go("est_late", crank, traj_c, C(dt=dt, window=10, mode="estimation"), use_eff=False, late=True)
    go("est_cov_gap", crank, traj_c, C(dt=dt, window=10, mode="fused", compute_covariance=True),
       gap_at=(400, 420))
    go("robot_fused_reinit", robot, traj_r, C(dt=dt, window=10, mode="fused"), reinit_every=50)
    np.savez(out, **res)
    print("wrote", out, len(res), "arrays")

def compare(a, b):
    A, B = np.load(a), np.load(b)
    worst = 0.0
    bad = []
    for k in A.files:
        if k not in B.files:
            bad.append(f"{k}: missing"); continue
        x, y = A[k], B[k]
        if x.dtype.kind in "US":
            if not np.array_equal(x, y):
                i = next(i for i in range(min(len(x), len(y))) if x[i] != y[i]) if len(x) == len(y) else -1
                bad.append(f"{k}: status/message differ (first at {i}: {x[i] if i >= 0 else len(x)!r} vs {y[i] if i >= 0 else len(y)!r})")
            continue
        if x.shape != y.shape:
            bad.append(f"{k}: shape {x.shape} vs {y.shape}"); continue
        d = float(np.max(np.abs(x - y) / (1.0 + np.abs(x)))) if x.size else 0.0
        worst = max(worst, d)
        if d > 1e-9:
            bad.append(f"{k}: max rel diff {d:.3g}")
    print(f"{len(A.files)} arrays; worst relative difference {worst:.3g}")
    for line in bad:
        print("  DIFF", line)
    return 1 if bad else 0

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2)
    ap.add_argument("--perturb", type=float, default=0.0,
                    help="add this to every reading of step 5 (a scenario's sensitivity to rounding: compare "
                         "against an unperturbed run of the same code)")
    a = ap.parse_args()
    if a.compare:
        sys.exit(compare(*a.compare))
    run(a.out, a.perturb)
