#!/usr/bin/env python3
"""The real double-pendulum recordings replayed as bags through the estimator NODE over DDS, scored as
`bench/real_hardware.py` scores the core.

    PYTHONPATH=. python bench/real_hardware_node.py [--recording NAME]... [--mode fused|estimation]...
                                                    [--seconds S] [--rate 0.5] [--json OUT.json]

What a user does with a robot's bag: each recording of bench/data (`bench/real_hardware.py`'s RECORDINGS) is
written as a rosbag2 with every row at the stamp its logger gave it (`bench/make_bags.py --recording`: jitter,
overruns and the clock's drift kept; /clock ticking at each row), played into the node with `use_sim_time` at
`--rate` of real time, and the node's `~/joint_states` (and `~/joint_states_stddev`) are read back.  The node
keeps its own grid of `dt` = the median step and moves each reading onto its step by the estimate's motion
(`ros/alignment.py`); `mbfg estimate` and the core bench make a factor-graph step at each reading's stamp
instead (docs/decisions.md, "The node keeps its grid ...").  The node's estimates are interpolated to the
rows' stamps (angles by cubic Hermite through the estimated rates, rates and torques linearly) and scored
against the same reference as the core (`real_hardware.score`: the centred local cubic's rate, the measured
torque less the friction the file leaves out, full band and ≤ 5 Hz, 2σ coverage with the node's published σ,
lost track), next to the core run on the same rows (`real_hardware.run_mbfg`).  Shipped defaults in both: a
parameter file with only the mechanism, `dt`, `mode` and what a replay needs (`use_sim_time`, never skipping
steps: `max_backlog` 0, a generous `max_input_delay`: the playback's clock may run ahead of its inputs on a
busy machine, and sim time makes the wait invisible to the estimates).  Needs rclpy and `rosbags`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "test"))

import make_bags  # noqa: E402
import real_hardware as rh  # noqa: E402

MODES = ("fused", "estimation")
JOINTS = rh.JOINTS
RATE = 0.5                   # the playback's speed [× real time]
INPUT_WAIT = 1.0             # [s of bag time] the node's `max_input_delay`: a step waits this long for its inputs
NS = 1_000_000_000


def node_parameters(mech_path: Path, dt: float, mode: str) -> Dict[str, object]:
    return {"mechanism": str(mech_path), "dt": float(dt), "mode": mode, "use_sim_time": True,
            "max_backlog": 0.0, "max_input_delay": INPUT_WAIT, "publish_stddev": True, "publish_markers": False,
            "diagnostics_period": 0.5, "thread_priority": 0}


def interpolate(stamps: np.ndarray, grid: np.ndarray, q: np.ndarray, qd: np.ndarray, tau: np.ndarray,
                tau_std: np.ndarray) -> rh.Output:
    """The node's estimates on its grid (`grid` [ns], increasing) at the rows' `stamps` [ns]: angles by cubic
    Hermite through the estimated rates, rates, torques and σ linearly; NaN outside the grid."""
    N = len(stamps)
    out = rh.Output(*(np.full((N, 2), np.nan) for _ in range(4)))
    inside = (stamps >= grid[0]) & (stamps <= grid[-1])
    i = np.clip(np.searchsorted(grid, stamps, side="right") - 1, 0, len(grid) - 2)
    h = (grid[i + 1] - grid[i]) / NS
    s = np.where(h > 0, (stamps - grid[i]) / NS / np.where(h > 0, h, 1.0), 0.0)[:, None]
    hh = h[:, None]
    h00, h10, h01, h11 = 2 * s ** 3 - 3 * s ** 2 + 1, s ** 3 - 2 * s ** 2 + s, -2 * s ** 3 + 3 * s ** 2, s ** 3 - s ** 2
    qi = h00 * q[i] + h10 * hh * qd[i] + h01 * q[i + 1] + h11 * hh * qd[i + 1]
    for target, value in ((out.q, qi), (out.qd, (1 - s) * qd[i] + s * qd[i + 1]),
                          (out.tau, (1 - s) * tau[i] + s * tau[i + 1]),
                          (out.tau_std, (1 - s) * tau_std[i] + s * tau_std[i + 1])):
        target[inside] = value[inside]
    return out


def _settled(probe, near_end: int, quiet: float = 3.0, timeout: float = 120.0) -> bool:
    """Wait until the node's newest published stamp is past `near_end` [ns] and has not moved for `quiet` s: on a
    busy machine the node works through its backlog after the bag's end, and its last steps come seconds later."""
    from ros_helpers import stamp_ns
    end = time.monotonic() + timeout
    newest, since = None, time.monotonic()
    while time.monotonic() < end:
        js = probe.snapshot("js")
        stamp = stamp_ns(js[-1][1].header.stamp) if js else None
        if stamp != newest:
            newest, since = stamp, time.monotonic()
        elif newest is not None and newest >= near_end and time.monotonic() - since >= quiet:
            return True
        time.sleep(0.05)
    return newest is not None and newest >= near_end


def replay(rec: rh.Recording, mode: str, workdir: Path, rate: float = RATE, log=print) -> rh.Output:
    """`rec` as a bag through a fresh estimator node in `mode`: the node's estimates at the rows (`interpolate`),
    `reinitializations` = its diagnostics' lost_track + solver_recoveries + reinitializations, `note` its final
    counters."""
    from ros_helpers import BagPlayer, Probe, estimator_process, fresh_domain_id, stamp_ns
    mech_path = rh.MECHANISMS / rh.DESIGNS[rec.design].mechanism
    dt = float(np.median(np.diff(rec.t)))
    bag = workdir / rec.name
    info = make_bags.write_recording_bag(bag, rec.t, rec.q, rec.tau_con, rec.tau_meas)
    params_file = workdir / "params.yaml"
    params_file.write_text(yaml.safe_dump({"/**/mbfg_estimator": {"ros__parameters":
                                                                   node_parameters(mech_path, dt, mode)}}))
    dom = fresh_domain_id()
    est = estimator_process(dom, workdir / f"{rec.name}.{mode}.log", config=params_file)
    probe = Probe(dom)
    try:
        if not probe.wait_for_node(60):
            raise RuntimeError("the estimator node did not come up:\n" + est.output()[-3000:])
        player = BagPlayer(probe, bag, topics=["/clock", "/joint_observations", "/commanded_effort"], rate=rate)
        player.start()
        player.join(timeout=10 * (rec.t[-1] - rec.t[0]) / rate + 60)
        if not _settled(probe, int(info["stamps_ns"][-1]) - int(20 * dt * NS)):
            log(f"  {rec.name} {mode}: the node's outputs stopped before the bag's end")
        diag = probe.wait_diag(lambda d: True, 5.0) or {}
        js = {stamp_ns(m.header.stamp): m for _, m in probe.snapshot("js")}
        sd = {stamp_ns(m.header.stamp): m for _, m in probe.snapshot("stddev")}
    finally:
        probe.close()
        code = est.stop()
    if code != 0:
        raise RuntimeError(f"the estimator node exited with {code}:\n" + est.output()[-3000:])
    grid = np.array(sorted(js), dtype=np.int64)
    cols = [list(js[grid[0]].name).index(j) for j in JOINTS]

    def field(msgs, stamp, name):
        m = msgs.get(stamp)
        return np.array(getattr(m, name))[cols] if m is not None and len(getattr(m, name)) else np.full(2, np.nan)
    q, qd, tau, std = (np.array([field(src, g, name) for g in grid])
                       for src, name in ((js, "position"), (js, "velocity"), (js, "effort"), (sd, "effort")))
    out = interpolate(info["stamps_ns"], grid, q, qd, tau, std)
    counters = ("steps", "predicted_steps", "lost_track", "solver_recoveries", "reinitializations", "late_steps",
                "skipped_steps")
    out.reinitializations = sum(int(diag.get(k, 0)) for k in ("lost_track", "solver_recoveries", "reinitializations"))
    out.note = ", ".join(f"{k} {diag[k]}" for k in counters if k in diag)
    out.published = len(grid)
    return out


def bench(recordings: Sequence[rh.Recording], modes: Sequence[str], rate: float = RATE, log=print) -> List[dict]:
    rows = []
    for rec in recordings:
        params = rh.dfki_parameters(rec.design)
        mech = rh.design_mechanism(rec.design)
        truth = rh.truth_of(rec, params, rh.friction_modelled(mech))
        for mode in modes:
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.time()
                node = replay(rec, mode, Path(tmp), rate, log)
                log(f"  {rec.name}: node {mode} ({time.time() - t0:.0f} s; {node.note})")
            t0 = time.time()
            core = rh.run_mbfg(mech, rec, mode)
            log(f"  {rec.name}: core {mode} ({time.time() - t0:.0f} s)")
            for way, out in (("node, bag replay", node), ("core (mbfg estimate)", core)):
                row = rh.score(rec, truth, out)
                row.update(run=rh.RECORDINGS[rec.name][1], estimator=f"mbfg_ros {mode}, {way}",
                           published=out.published, steps=len(rec.t))
                rows.append(row)
    return rows


def table(rows: List[dict]) -> str:
    lines = ["| run | estimator | rate RMSE q̇1 / q̇2 [rad/s] | effort RMSE τ1 / τ2 [N·m] | ≤ 5 Hz [N·m] | "
             "2σ coverage τ1 / τ2 | lost track | re-init. | estimates / rows |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cov = "–" if r["coverage"] is None else f"{100 * r['coverage'][0]:.0f} / {100 * r['coverage'][1]:.0f} %"
        pub = "–" if r["published"] is None else f"{r['published']} / {r['steps']}"
        lines.append(f"| {r['run']} | {r['estimator']} | {rh._pair(r['rate'])} | {rh._pair(r['effort'])} | "
                     f"{rh._pair(r['effort_band'])} | {cov} | {100 * r['lost']:.1f} % | {r['reinitializations']} | "
                     f"{pub} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recording", action="append", metavar="NAME", help="a recording (default: every one)")
    ap.add_argument("--mode", action="append", choices=MODES, help="fused and/or estimation (default: both)")
    ap.add_argument("--seconds", type=float, help="only the first S seconds of each recording")
    ap.add_argument("--rate", type=float, default=RATE, help=f"playback speed (default {RATE} × real time)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    a = ap.parse_args(argv)
    if a.rate <= 0:
        ap.error(f"--rate must be positive, not {a.rate}")
    recordings = [rh.load_recording(n).cut(a.seconds) for n in (a.recording or list(rh.RECORDINGS))]
    rows = bench(recordings, a.mode or list(MODES), a.rate)
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
