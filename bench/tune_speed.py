#!/usr/bin/env python3
"""CPU and wall time of `mbfg tune` fitting every density and the encoders' σ, and whether a fit on one recording helps
on another.

    python bench/tune_speed.py [--case NAME ...] [--mode M ...] [--repo DIR] [--json OUT.json]
    python bench/tune_speed.py --case "A0 pendubot" --seconds 20   # the 20-s pendubot swing-up run
    python bench/tune_speed.py --transfer [--seconds T]      # tune on run A, score on run B (real_hardware.py)
    python bench/tune_speed.py --reference [--case ...]      # the same maximum as the search before
    python bench/tune_speed.py --bank-step [--repo DIR]      # what a step of the filter bank costs

Each case is a 10-s recording written as `mbfg` CSVs (encoder readings; fused mode: the commanded efforts):
the DFKI double-pendulum runs of bench/data/dfki_double_pendulum (the mechanism files' coordinates, actuators and
encoders are DFKI's joints: positions and commanded torques as recorded) and the crank four-bar simulated with an
effort that is an integrated random walk (as test_tuning.py simulates it).  For each case and mode the script
runs, in a subprocess of its own,

    python -m mbfg_ros.cli tune MECH --observations OBS.csv [--torques CMD.csv] --mode M
                               --fit-sensor-sigmas --fit-acceleration-density -o PARAMS.yaml

(the densities of the mode, the acceleration density and every encoder's σ) with the checkout `--repo` on the
module path (default: this one; e.g. `--repo /work/main` for the tuner before), and prints its wall time, the
evaluations, the log-likelihood and the fitted values with their 1σ as `mbfg tune` printed them.

`--reference`: this checkout's fit against the search `mbfg tune` used before (Nelder–Mead, one likelihood
evaluation at a time) on the same likelihood: the same maximum, in units of the fit's own 1σ.

`--bank-step`: the CPU time of one step of a filter bank (`tuning.filter_bank.ReducedEKFBank`, of the checkout
`--repo`) on the double pendulum (A0 sysid 00, its first 6 s at 6 ms), with 8 and with 64 filters, in each mode and
with the encoders' deflection: the step's fixed part and its part per filter, the best of 3 passes each.

`--transfer`: the tuned parameter files of run A applied to run B through bench/real_hardware.py's estimator
runs (`run_mbfg` with the file's settings, as its `--params`), next to the shipped defaults, scored as its table
(rate and effort RMSE per joint, 2σ coverage).  Pairs: each A.0 system-identification run tuned on the next,
the C.0 runs on each other (`real_hardware.TUNING_RUN`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "test"))      # test_tuning.synthetic: the simulated four-bar's recording

import real_hardware as rh  # noqa: E402

SECONDS = 10.0
DFKI_CASES = {"A0 sysid 00": "design_A.0__20220815__sys_id__trajectory_00",
              "A0 sysid 01": "design_A.0__20220815__sys_id__trajectory_01",
              "C0 sysid 00": "design_C.0__20220914__sys_id__trajectory_00",
              "C0 acrobot": "design_C.0__20220914__184506_acrobot_tvlqr_video__trajectory",
              "A0 pendubot": "design_A.0__20220819__174435-pendubot_tvlqr_lqr__trajectory"}
FOUR_BAR = "four-bar (simulated)"
CASES = list(DFKI_CASES) + [FOUR_BAR]
DEFAULT_CASES = [c for c in CASES if c != "A0 pendubot"]     # the pendubot's run: its 20 s (--case, --seconds 20)
MODES = ("estimation", "fused")


def write_csv(path: Path, t: np.ndarray, columns: Dict[str, np.ndarray]) -> None:
    data = np.column_stack([t] + list(columns.values()))
    np.savetxt(path, data, delimiter=",", header=",".join(["t"] + list(columns)), comments="", fmt="%.17g")


def dfki_case(name: str, folder: Path, seconds: float = SECONDS):
    """(mechanism file, observations CSV, torques CSV) of a DFKI run's first `seconds` (the mechanism's encoders
    and actuators are DFKI's joints: positions and commanded torques as recorded)."""
    from mbfg_ros.tuning.likelihood import encoder_layout
    rec = rh.load_recording(DFKI_CASES[name]).cut(seconds)
    mech = rh.design_mechanism(rec.design)
    obs, cmd = folder / f"{DFKI_CASES[name]}.obs.csv", folder / f"{DFKI_CASES[name]}.cmd.csv"
    write_csv(obs, rec.t, {n: rec.q[:, i] for i, n in enumerate(encoder_layout(mech)[0])})
    write_csv(cmd, rec.t, {f"tau_{a}": rec.tau_con[:, i] for i, a in enumerate(mech.actuator_names)})
    return rh.MECHANISMS / rh.DESIGNS[rec.design].mechanism, obs, cmd


def four_bar_case(folder: Path, seconds: float = SECONDS, seed: int = 4):
    """The crank four-bar at 5 ms, as test_tuning.py simulates it (`synthetic`): the effort an integrated random
    walk of density 3 (N·m)²/s³ (estimation's data) or a PD command plus a damped walk of density 300 (fused's),
    the encoder read with σ 3e-4 rad."""
    from mbfg_ros.model.mechanism import load_mechanism
    from test_tuning import synthetic
    path = ROOT.parent / "mechanisms" / "four_bar_crank.yaml"
    crank = load_mechanism(path)
    out = {}
    for mode, density in (("estimation", 3.0), ("fused", 300.0)):
        t, readings, commands = synthetic(crank, mode, density, 3e-4, seconds, seed)
        obs, cmd = folder / f"four_bar_{mode}.obs.csv", folder / f"four_bar_{mode}.cmd.csv"
        write_csv(obs, t, {"crank": readings})
        write_csv(cmd, t, {"tau_crank": commands[:, 0]})
        out[mode] = (path, obs, cmd)
    return out


def each_case(args, prefix: str):
    """(case, mode, mechanism file, observations CSV, torques CSV) of every case and mode asked for, the files in a
    temporary folder."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        folder = Path(tmp)
        for name in args.case or DEFAULT_CASES:
            for mode in args.mode or MODES:
                files = four_bar_case(folder, args.seconds)[mode] if name == FOUR_BAR else \
                    dfki_case(name, folder, args.seconds)
                yield (name, mode) + tuple(files)


def run_tune(repo: Path, mech: Path, obs: Path, cmd: Path, mode: str, params: Path) -> dict:
    """`mbfg tune` of `repo` in a subprocess: wall time, its printed summary and the fitted values."""
    args = [sys.executable, "-m", "mbfg_ros.cli", "tune", str(mech), "--observations", str(obs), "--mode", mode,
            "--fit-sensor-sigmas", "--fit-acceleration-density", "-o", str(params)]
    if mode == "fused":
        args[7:7] = ["--torques", str(cmd)]
    env = dict(os.environ, PYTHONPATH=str(repo))
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=str(repo))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the child's CPU time: what the tuner costs, where wall time also counts the other load on the machine
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"tune_speed.py: mbfg tune failed ({' '.join(args)}):\n{proc.stderr}")
    fitted = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"\s+(\S+)\s+(\S+) (.*)$", line)
        if m and (m.group(1).endswith(("density", "time_constant", "deflection_sigma"))
                  or m.group(1).startswith("sensor_sigmas")):
            fitted[m.group(1)] = {"value": float(m.group(2)), "describe": m.group(3)}
    ll = re.search(r"log-likelihood (\S+), (\d+) evaluations", proc.stdout)
    return {"wall": wall, "cpu": cpu, "load": load, "log_likelihood": float(ll.group(1)), "evaluations": int(ll.group(2)),
            "fitted": fitted, "stdout": proc.stdout}


def speed(args) -> List[dict]:
    rows = []
    for name, mode, mech, obs, cmd in each_case(args, "tune_speed"):
        r = run_tune(args.repo, mech, obs, cmd, mode, obs.with_name("params.yaml"))
        r.update(case=name, mode=mode)
        rows.append(r)
        print(f"{name}, {mode}: CPU {r['cpu']:.1f} s, wall {r['wall']:.1f} s at load {r['load']:.1f}, "
              f"{r['evaluations']} evaluations, "
              f"log-likelihood {r['log_likelihood']:.6g}", file=sys.stderr, flush=True)
        for k, v in r["fitted"].items():
            print(f"    {k} = {v['value']:.4g} {v['describe']}", file=sys.stderr, flush=True)
    print(f"`mbfg tune --fit-sensor-sigmas --fit-acceleration-density`, {args.seconds:g}-s recordings, checkout "
          f"{args.repo} ({os.uname().machine}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}):\n")
    print("| recording | mode | CPU [s] | wall [s] (load) | evaluations | log-likelihood | fitted (1σ) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        fitted = "; ".join(f"{k.replace('sensor_sigmas.', 'σ ')} {v['value']:.3g}" for k, v in r["fitted"].items())
        print(f"| {r['case']} | {r['mode']} | {r['cpu']:.1f} | {r['wall']:.1f} ({r['load']:.1f}) | {r['evaluations']} | "
              f"{r['log_likelihood']:.6g} | "
              f"{fitted} |")
    return rows


def transfer(args) -> List[dict]:
    """Tune on run A (10 s), score the estimator with that file on run B (the first `args.seconds` s) against
    the shipped defaults."""
    from mbfg_ros.tuning.params_file import read_params
    pairs = [("A0 sysid 01", "A0 sysid 00"), ("C0 sysid 00", "C0 acrobot")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tune_transfer") as tmp:
        folder = Path(tmp)
        for tuned_on, scored_on in pairs:
            rec = rh.load_recording(DFKI_CASES[scored_on]).cut(args.seconds)
            mech = rh.design_mechanism(rec.design)
            truth = rh.truth_of(rec, rh.dfki_parameters(rec.design), rh.friction_modelled(mech))
            for mode in args.mode or MODES:
                mech_file, obs, cmd = dfki_case(tuned_on, folder)
                params = folder / f"{mode}.yaml"
                tuned = run_tune(args.repo, mech_file, obs, cmd, mode, params)
                settings = read_params(params, mech)
                for label, s in (("defaults", None), (f"tuned on {tuned_on}", settings)):
                    row = rh.score(rec, truth, rh.run_mbfg(mech, rec, mode, s))
                    row.update(scored_on=scored_on, mode=mode, label=label, tune_wall=tuned["wall"])
                    rows.append(row)
                    print(f"{scored_on}, {mode}, {label}: effort {row['effort']}, rate {row['rate']}, "
                          f"coverage {row['coverage']}", file=sys.stderr, flush=True)
    print(f"Tune on run A (first {SECONDS:g} s), score on run B (first {args.seconds:g} s, from 0.5 s; "
          f"real_hardware.py's scores):\n")
    print("| scored on | mode | parameters | rate RMSE q̇1 / q̇2 [rad/s] | effort RMSE τ1 / τ2 [N·m] | ≤ 5 Hz [N·m] | "
          "2σ coverage | lost track |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        lost = "–" if r["lost"] is None else f"{100 * r['lost']:.1f} %"
        print(f"| {r['scored_on']} | {r['mode']} | {r['label']} | {rh._pair(r['rate'])} | {rh._pair(r['effort'])} | "
              f"{rh._pair(r['effort_band'])} | {rh._pair(r['coverage'], '{:.0f}', 100, ' %')} | {lost} |")
    return rows


def reference(args) -> List[dict]:
    """The fit of `mbfg tune` (this checkout) against the search it used before — Nelder–Mead over log10 of the
    values from the same start with its options (xatol 0.005, fatol 0.01, ≤ 400 evaluations), one candidate at
    a time — on the same likelihood (`likelihood.log_likelihoods`, which test_tuning_speed.py checks equals one
    ReducedEKF's): each value's difference in units of the fit's own 1σ, and the log-likelihoods."""
    from scipy.optimize import minimize
    from mbfg_ros.blas import single_threaded_blas
    from mbfg_ros.cli import csvio
    from mbfg_ros.model.mechanism import load_mechanism
    from mbfg_ros.tuning import likelihood as tl
    rows = []
    for name, mode, mech_file, obs, cmd in each_case(args, "tune_reference"):
        mech = load_mechanism(mech_file)
        enc, coords, _ = tl.encoder_layout(mech)
        table = csvio.read_table(obs)
        y = np.column_stack([table.column(n) for n in enc])
        u = np.column_stack([csvio.read_table(cmd).column(f"tau_{a}") for a in mech.actuator_names])
        rec = tl.Recording(table.t, y, enc, coords, u, str(obs))
        names = tl.parameter_names(mech, mode, True, True)
        initial = tl.initial_values(mech)
        t0 = time.perf_counter()
        result = tl.fit(mech, rec, mode, initial, names)
        wall_fit = time.perf_counter() - t0
        short = rec.from_first_complete_reading().decimated(2000)

        def cost(x):
            v = dict(initial, **{n: 10.0 ** e for n, e in zip(names, x)})
            ll = tl.log_likelihoods(mech, short, mode, [v])[0]
            return -ll if math.isfinite(ll) else tl.FAILED

        x0 = np.log10([initial[n] for n in names])
        t0 = time.perf_counter()
        with single_threaded_blas():
            nm = minimize(cost, x0, method="Nelder-Mead",
                          options={"initial_simplex": np.vstack([x0] + [x0 + e for e in np.eye(len(x0))]),
                                   "xatol": 0.005, "fatol": 0.01, "maxfev": 400})
        wall_nm = time.perf_counter() - t0
        x_fit = np.log10([f.value for f in result.fitted])
        std = np.array([f.log10_std for f in result.fitted])
        row = {"case": name, "mode": mode, "names": names, "fit": x_fit.tolist(), "std": std.tolist(),
               "nelder_mead": np.asarray(nm.x).tolist(), "ll_fit": result.log_likelihood,
               "ll_nelder_mead": -float(nm.fun), "evaluations_fit": result.evaluations,
               "evaluations_nelder_mead": int(nm.nfev), "wall_fit": wall_fit, "wall_nelder_mead": wall_nm}
        rows.append(row)
        print(f"{name}, {mode}: fit {x_fit.round(3)} ± {std.round(3)} (ll {result.log_likelihood:.3f}, "
              f"{wall_fit:.0f} s), Nelder–Mead {np.round(nm.x, 3)} (ll {-nm.fun:.3f}, {nm.nfev} "
              f"evaluations, {wall_nm:.0f} s)", file=sys.stderr, flush=True)
    print("The batched Newton fit against Nelder–Mead (the search before) on the same likelihood, "
          f"{args.seconds:g}-s recordings, every density and σ (log10 values; Δ in units of the fit's 1σ):\n")
    print("| recording | mode | parameter | fit (log10 ± 1σ) | Nelder–Mead | Δ/σ | log-likelihood fit / NM | "
          "evaluations fit / NM | wall fit / NM [s] |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for i, n in enumerate(r["names"]):
            d = (r["nelder_mead"][i] - r["fit"][i]) / r["std"][i] if r["std"][i] > 0 else math.nan
            tail = (f"{r['ll_fit']:.3f} / {r['ll_nelder_mead']:.3f} | {r['evaluations_fit']} / "
                    f"{r['evaluations_nelder_mead']} | {r['wall_fit']:.0f} / {r['wall_nelder_mead']:.0f}") if i == 0 \
                else " | "
            print(f"| {r['case'] if i == 0 else ''} | {r['mode'] if i == 0 else ''} | {n} | {r['fit'][i]:.3f} ± "
                  f"{r['std'][i]:.3f} | {r['nelder_mead'][i]:.3f} | {d:+.2f} | {tail} |")
    return rows


BANK_STEP_PROGRAM = r"""
import json, sys, time
import numpy as np
from mbfg_ros.blas import single_threaded_blas
from mbfg_ros.model.mechanism import load_mechanism
from mbfg_ros.tuning.filter_bank import ReducedEKFBank
data = np.load(sys.argv[1])
mech = load_mechanism(sys.argv[2])
t, readings, commands, coordinates = data["t"], data["readings"], data["commands"], data["coordinates"]
steps = np.diff(t, prepend=t[0])
rows = []
for mode, deflection in (("estimation", None), ("fused", None), ("estimation", 1e-3)):
    cost = {}
    for K in (8, 64):
        best = float("inf")
        for _ in range(3):
            bank = ReducedEKFBank(mech, coordinates, encoder_sigma=[[3e-4, 3e-4]] * K,
                                  effort_density=np.linspace(1.0, 100.0, K), fused=mode == "fused",
                                  acceleration_density=0.5, time_constant=0.1 if mode == "fused" else np.inf,
                                  deflection_sigma=None if deflection is None else [deflection] * K)
            with single_threaded_blas():
                start = time.process_time()
                for k in range(len(t)):
                    bank.step(readings[k], commands[k] if mode == "fused" else None, steps[k])
                best = min(best, (time.process_time() - start) / len(t))
        cost[K] = best
    per_filter = (cost[64] - cost[8]) / 56
    rows.append({"mode": mode, "deflection": deflection is not None, "steps": len(t),
                 "fixed_us": 1e6 * (cost[8] - 8 * per_filter), "per_filter_us": 1e6 * per_filter})
print(json.dumps(rows))
"""


def bank_step(args) -> List[dict]:
    """`--bank-step`: see the module docstring."""
    from mbfg_ros.tuning.likelihood import encoder_layout
    rec = rh.load_recording(DFKI_CASES["A0 sysid 00"]).cut(6.0)
    mech_file = rh.MECHANISMS / rh.DESIGNS[rec.design].mechanism
    mech = rh.design_mechanism(rec.design)
    _, coordinates, _ = encoder_layout(mech)
    rows = slice(None, None, 3)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "recording.npz"
        np.savez(data, t=rec.t[rows], readings=rec.q[rows], commands=rec.tau_con[rows],
                 coordinates=np.asarray(coordinates))
        env = dict(os.environ, PYTHONPATH=str(args.repo))
        out = subprocess.run([sys.executable, "-c", BANK_STEP_PROGRAM, str(data), str(mech_file)], env=env,
                             capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    print(f"A step of the filter bank, {args.repo} (A0 sysid 00, {result[0]['steps']} steps at 6 ms, CPU, best of 3):")
    print()
    print("| mode | fixed [µs] | per filter [µs] |")
    print("|---|---|---|")
    for r in result:
        print(f"| {r['mode']}{', deflection' if r['deflection'] else ''} | {r['fixed_us']:.0f} | "
              f"{r['per_filter_us']:.1f} |")
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", choices=CASES,
                    help="only these recordings (default: all but the A0 pendubot run)")
    ap.add_argument("--mode", action="append", choices=MODES, help="only these modes (default: both)")
    ap.add_argument("--seconds", type=float, default=SECONDS, help=f"recording length (default {SECONDS:g})")
    ap.add_argument("--repo", type=Path, default=ROOT.parent, help="the checkout whose `mbfg tune` runs")
    ap.add_argument("--transfer", action="store_true", help="tune on one run, score on another")
    ap.add_argument("--reference", action="store_true",
                    help="the fit against Nelder–Mead (the search before) on the same likelihood")
    ap.add_argument("--bank-step", action="store_true", help="what a step of the filter bank costs")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    args.repo = args.repo.resolve()
    rows = (transfer(args) if args.transfer else reference(args) if args.reference else
            bank_step(args) if args.bank_step else speed(args))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
