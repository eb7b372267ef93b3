#!/usr/bin/env python3
"""Real-hardware bench: the estimator on recordings of the DFKI Underactuated Lab double pendulum.

    PYTHONPATH=. python bench/real_hardware.py [--recording NAME ...] [--seconds T] [--params PARAMS.yaml]
                                               [--passive] [--without-deflection] [--data DIR] [--json OUT.json]
    PYTHONPATH=. python bench/real_hardware.py --make-excerpt SOURCE_DIR      # rebuild bench/data/ from the source
    PYTHONPATH=. python bench/real_hardware.py --held-out DFKI_CHECKOUT   # the runs nothing here was developed on

Data: `bench/data/dfki_double_pendulum/` (BSD-3-Clause, see its README: every recording of the source set, cut to
time, measured positions, commanded and measured torques).  Mechanisms: `mechanisms/double_pendulum_a0.yaml`,
`..._c0.yaml` (DFKI's identified rigid-body parameters, gear ratio and rotor inertia; DFKI's joint angles q1, q2 —
q2 relative to link 1 — as joint-angle coordinates, actuated by τ1, τ2 and read by the encoders; the motors'
response, each command applied 4.5 / 3 ms after its row (A.0 / C.0), interpolated between its rows, through a
first-order lag of 3 / 4 ms: the delay and time constant after which the commands come closest to the measured
torque where they move fast enough to time it on the design's own fast run, `command_delay`, the recordings
table's last column; the held-out runs check them).

How the recordings are fed: one `FixedLagEstimator.step(t, ...)` per recorded row at the row's own time stamp (as
recorded: jittery, with overruns), `EstimatorConfig(dt=<median step>, mode=...)` and nothing else, as `mbfg
estimate` builds it (shipped defaults: window 10, trapezoidal, default densities, the effort density fitted
online in estimation mode; the encoder σ of the mechanism file, the readings' quantization, as the floor of
the σ fitted online from the readings' scatter, both modes).  The core makes one
factor-graph step of the actual gap when the gap is under 1.5 median steps, else round(gap/dt) equal sub-steps.
Fused mode gets the commanded torques `tau_con`; estimation mode gets no torque.  The same runs also give the
`smoothed` rows: each row's estimate once the window holds `SMOOTHED_LAG` steps after it (`mbfg estimate
--smoothed-lag`, the node's ~/smoothed/ topics: 18 ms later at 2 ms).  With `--passive`, the runs
of an underactuated machine (pendubot: elbow passive; acrobot: shoulder passive; `PASSIVE_JOINT`) get three
more rows with the passive joint's actuator declared (`EstimatorConfig.actuator_efforts`): `passive` (its
effort known zero) in estimation and fused mode, and `commanded` in estimation mode (its command known: on these
runs the controller commands the passive motor's friction compensation, so it is not zero, and the measured
torque is not either).

Scored per joint (shoulder q1, elbow q2), from 0.5 s to the end less the reference's half-width:
* rate: against a non-causal reference, the centred local cubic on the measured positions over ±25 ms with the
  real time stamps (`local_polynomial`), fitted again without the readings far off it (stamped late after a
  logger's overrun: `reference_polynomial`);
* effort: against the measured torque minus DFKI's identified friction b·q̇ + cf·atan(100·q̇) at the reference
  rate, or, on a joint whose friction the mechanism file models (actuator keys `viscous_friction`,
  `coulomb_friction`: `friction_modelled`), against the measured torque itself: the estimate is then the motor's
  torque; also both low-passed at 5 Hz (zero-phase 4th-order Butterworth on a uniform grid): the motor encoders
  sit behind the gear, above ~5 Hz the measured torque does not follow the positions;
* lag: the delay (0–300 ms) by which the low-passed effort estimate best correlates with the low-passed measured
  torque (`effort_lag`): how late a causal estimate's torque is;
* 2σ coverage: share of steps whose effort error is within twice the estimator's own 1σ (90–98 % is
  consistent), at full band and ≤ 5 Hz (the low-passed estimate against the low-passed reference, the same σ:
  above 5 Hz the measured torque holds what no position reading sees, and where the command explains the
  positions but not the measured torque, as on the pendubot's shoulder and the acrobot's elbow, no estimate
  consistent with the positions can cover it);  lost track: share of steps where an estimated joint angle is
  > 0.01 rad from its reading and from the reference.  The recordings table gives the share of steps whose
  reading is itself > 0.01 rad from the reference (a reading stamped late at speed): an estimate that follows
  the motion is that far from those readings without having lost them.

Anchors on the same readings:
* EKF: a textbook EKF on DFKI's equations with the friction the mechanism file models (the mechanism files'
  model), state (q, q̇, e), e a random
  walk: the torque (estimation) or the command's disturbance (fused, τ = command + e); mean by RK4, covariance
  by the first three terms of the discretization series; encoders read q (σ: the quantization).  Its density is
  the one of a decade grid, refined by half decades, with the smallest effort RMSE (both joints, full band) on
  ANOTHER recording of the same design (`TUNING_RUN`), scored as above: the best this filter can do, never
  tuned on the scored run (the log also names the density the readings' innovation likelihood would choose);
* the same EKF smoothed (Rauch–Tung–Striebel over the whole run, its density as tuned): each step's estimate given
  every reading before and after it, which no causal estimator has; where it is no better than the command or
  the EKF, that part of the reference is what no estimate consistent with the positions reaches (the measured
  torque's own error);
* causal Savitzky–Golay (cubic over the last 0.1 s, real time stamps) + inverse dynamics of the same model;
* the command itself (tau_con, the controller's friction compensation included), as the model applies it (after
  the actuators' delay) and as logged; zero.
The anchors' model is the mechanism file's, its commands applied after the actuators' delay too.

Left out of the model: the friction of a joint whose actuator has no friction keys (none in the shipped files);
the recordings table gives the friction's and the rotor-inertia torques' size on each run (at the reference
motion) next to the scale of the torque being estimated, the time steps' jitter and the readings' scatter
about the reference.
Held out (`--held-out DFKI_CHECKOUT`, a clone of github.com/dfki-ric-underactuated-lab/double_pendulum, read
at commit 1e8544e): `HELD_OUT`, 16 more recordings of the same two pendulums from the same days (A.0: five more
identification runs, one of them at 1.5 ms with 22 % of its steps off; two more pendubot runs; C.0: seven more
identification runs, two of them at 1.6 ms with 40 % of their steps off and their commands far outside the motors'
bandwidth; an LQR balancing acrobot run and another swing-up), read from DFKI's own files, not shipped (too large).
The shipped defaults, the mechanism files and every choice in docs/decisions.md were made on the eight runs above;
these say whether they carry to runs they were not made on.  Every estimator and anchor as above (the EKF tuned on
the design's first identification run of the excerpt), and a summary table (`held_out_table`).

test/test_real_hardware.py checks the parts and runs the bench on a 1-s excerpt (behaviour, not numbers).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import yaml
from numpy.lib.stride_tricks import sliding_window_view
from scipy.signal import butter, filtfilt

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from mbfg_ros.dynamics import constrained, kinematics  # noqa: E402
from mbfg_ros.estimation.actuator_delay import command_response, delayed_commands  # noqa: E402
from mbfg_ros.estimation.config import EstimatorConfig  # noqa: E402
from mbfg_ros.estimation.estimator import FixedLagEstimator  # noqa: E402
from mbfg_ros.model.mechanism import Mechanism, load_mechanism  # noqa: E402

DATA = ROOT / "data" / "dfki_double_pendulum"
MECHANISMS = ROOT.parent / "mechanisms"
SETTLE = 0.5                 # [s] scored from here on
REFERENCE_HALF_WIDTH = 0.025 # [s] the centred local cubic's half-width
OUTLIER = 6.0                # a reading this many times the local scatter off the reference is left out of it
SG_SPAN = 0.1                # [s] the causal Savitzky–Golay window (as bench/estimation_quality.py)
BAND = 5.0                   # [Hz] the low-pass band of the effort score
SMOOTHED_LAG = 9              # the smoothed rows' lag [steps]: the default window's longest (10 − 1)
LOST = 0.01                  # [rad] an estimated angle this far from its reading has lost track
LAG_LONGEST = 0.3            # [s] the longest delay of an effort estimate looked for (`effort_lag`)
POSITION_STEP = 12.5 / 65535 # [rad] the recorded positions' quantum
TORQUE_STEP = 12.0 / 4095    # [N·m] the recorded measured torques' quantum
COLUMNS = ("t", "pos_meas1", "pos_meas2", "tau_con1", "tau_con2", "tau_meas1", "tau_meas2")
EKF_DECADES = tuple(10.0 ** k for k in range(-6, 6))    # the EKF densities tried [(N·m)²/s]


@dataclass(frozen=True)
class Design:
    mechanism: str           # file in mechanisms/
    parameters: str          # DFKI's identified parameter file in the data folder


DESIGNS = {"A.0": Design("double_pendulum_a0.yaml", "design_A.0__model_2.0.yml"),
           "C.0": Design("double_pendulum_c0.yaml", "design_C.0__model_3.0.yml")}

# file stem (the source's path with / → __) → (design, short name, what it is)
RECORDINGS = {
    "design_A.0__20220815__sys_id__trajectory_00": ("A.0", "A0 sysid 00", "system identification, both motors"),
    "design_A.0__20220815__sys_id__trajectory_01": ("A.0", "A0 sysid 01", "system identification, both motors"),
    "design_A.0__20220815__sys_id__trajectory_02": ("A.0", "A0 sysid 02", "system identification, both motors"),
    "design_A.0__20220815__sys_id__trajectory_03": ("A.0", "A0 sysid 03", "system identification, both motors"),
    "design_A.0__20220819__174435-pendubot_tvlqr_lqr__trajectory": ("A.0", "A0 pendubot",
                                                                    "pendubot swing-up + balance, elbow passive"),
    "design_C.0__20220914__184506_acrobot_tvlqr_video__trajectory": ("C.0", "C0 acrobot",
                                                                     "acrobot swing-up, shoulder passive"),
    "design_C.0__20220914__sys_id__trajectory_00": ("C.0", "C0 sysid 00", "system identification, both motors"),
    "design_C.0__20220914__sys_id__trajectory_01": ("C.0", "C0 sysid 01", "system identification, both motors"),
}

# the recording the EKF's density is tuned on (against its truth) for each scored recording: same design, never itself
# the runs with a passive joint (the `--passive` rows): its actuator's joint name
PASSIVE_JOINT = {"design_A.0__20220819__174435-pendubot_tvlqr_lqr__trajectory": "q2",
                 "design_C.0__20220914__184506_acrobot_tvlqr_video__trajectory": "q1",
                 "design_A.0__20220819__174932-pendubot_tvlqr_lqr__trajectory": "q2",
                 "design_A.0__20220819__175617-pendubot_tvlqr_lqr_VIDEO__trajectory": "q2",
                 "design_C.0__20220914__172144_acrobot_lqr_video__trajectory": "q1",
                 "design_C.0__20220914__180839_acrobot_tvlqr_video__trajectory": "q1"}

TUNING_RUN = {
    "design_A.0__20220815__sys_id__trajectory_00": "design_A.0__20220815__sys_id__trajectory_01",
    "design_A.0__20220815__sys_id__trajectory_01": "design_A.0__20220815__sys_id__trajectory_02",
    "design_A.0__20220815__sys_id__trajectory_02": "design_A.0__20220815__sys_id__trajectory_03",
    "design_A.0__20220815__sys_id__trajectory_03": "design_A.0__20220815__sys_id__trajectory_00",
    "design_A.0__20220819__174435-pendubot_tvlqr_lqr__trajectory": "design_A.0__20220815__sys_id__trajectory_00",
    "design_C.0__20220914__184506_acrobot_tvlqr_video__trajectory": "design_C.0__20220914__sys_id__trajectory_00",
    "design_C.0__20220914__sys_id__trajectory_00": "design_C.0__20220914__sys_id__trajectory_01",
    "design_C.0__20220914__sys_id__trajectory_01": "design_C.0__20220914__sys_id__trajectory_00",
}

# recordings of the same pendulums nothing here was developed on (`--held-out`): file stem (DFKI's
# data/experiment_records/ path with / → __) → (design, short name, what it is)
HELD_OUT = {
    "design_A.0__20220815__sys_id__trajectory_04": ("A.0", "A0 sysid 04", "system identification, both motors"),
    "design_A.0__20220815__sys_id__trajectory_05": ("A.0", "A0 sysid 05", "system identification, both motors"),
    "design_A.0__20220815__sys_id__trajectory_11": ("A.0", "A0 sysid 11", "system identification, 1.5 ms"),
    "design_A.0__20220815__sys_id__trajectory_12": ("A.0", "A0 sysid 12", "system identification, both motors"),
    "design_A.0__20220815__sys_id__trajectory_13": ("A.0", "A0 sysid 13", "system identification, both motors"),
    "design_A.0__20220819__174932-pendubot_tvlqr_lqr__trajectory": ("A.0", "A0 pendubot 2",
                                                                    "pendubot swing-up + balance, elbow passive"),
    "design_A.0__20220819__175617-pendubot_tvlqr_lqr_VIDEO__trajectory": ("A.0", "A0 pendubot 3",
                                                                          "pendubot swing-up + balance, elbow passive"),
    "design_C.0__20220914__172144_acrobot_lqr_video__trajectory": ("C.0", "C0 acrobot LQR",
                                                                   "acrobot balancing (LQR), shoulder passive"),
    "design_C.0__20220914__180839_acrobot_tvlqr_video__trajectory": ("C.0", "C0 acrobot 2",
                                                                     "acrobot swing-up, shoulder passive"),
    "design_C.0__20220914__sys_id__trajectory_02": ("C.0", "C0 sysid 02", "system identification, both motors"),
    "design_C.0__20220914__sys_id__trajectory_03": ("C.0", "C0 sysid 03", "system identification, both motors"),
    "design_C.0__20220914__sys_id__trajectory_04": ("C.0", "C0 sysid 04", "system identification, both motors"),
    "design_C.0__20220914__sys_id__trajectory_05": ("C.0", "C0 sysid 05", "system identification, both motors"),
    "design_C.0__20220914__sys_id__trajectory_06": ("C.0", "C0 sysid 06", "system identification, both motors"),
    "design_C.0__20220914__sys_id__trajectory_12": ("C.0", "C0 sysid 12", "system identification, 1.6 ms"),
    "design_C.0__20220914__sys_id__trajectory_13": ("C.0", "C0 sysid 13", "system identification, 1.6 ms"),
}
HELD_OUT_TUNING = {"A.0": "design_A.0__20220815__sys_id__trajectory_00",    # (of the excerpt)
                   "C.0": "design_C.0__20220914__sys_id__trajectory_00"}
HELD_OUT_COMMIT = "1e8544e"      # the DFKI commit the held-out table was measured on


# -- data -----------------------------------------------------------------------------------------------------
@dataclass
class Recording:
    name: str
    design: str
    t: np.ndarray            # (N,) s, as recorded
    q: np.ndarray            # (N, 2) measured joint angles (DFKI: q1 from hanging, q2 relative) [rad]
    tau_con: np.ndarray      # (N, 2) commanded joint torques [N·m]
    tau_meas: np.ndarray     # (N, 2) measured joint torques (motor current) [N·m]

    def rows(self, keep) -> "Recording":
        """The rows `keep` (a mask or a slice) of the recording."""
        return Recording(self.name, self.design, self.t[keep], self.q[keep], self.tau_con[keep], self.tau_meas[keep])

    def cut(self, seconds: Optional[float]) -> "Recording":
        return self if seconds is None else self.rows(self.t <= self.t[0] + seconds)

    def as_applied(self, mech: Mechanism) -> "Recording":
        """The recording with its commands as the mechanism's actuators apply them (each `delay` later: the
        anchors' model, as the estimator applies them, through their lag)."""
        return replace(self, tau_con=delayed_commands(self.t, self.tau_con, mech.actuator_delays,
                                                      mech.actuator_time_constants))


def command_delay(rec: Recording) -> tuple:
    """Per joint, `command_response` of the commands against the measured torque from `SETTLE`: the delay and the
    lag's time constant after which the command comes closest to it, and that RMS over the undelayed command's
    (the motor's response where the command moves fast enough to time it: a fraction well under 1)."""
    return command_response(rec.t, rec.tau_con, rec.tau_meas, rows=rec.t >= rec.t[0] + SETTLE)


def load_recording(name: str, data: Path = DATA) -> Recording:
    path = data / f"{name}.csv.gz"
    if name not in RECORDINGS:
        raise SystemExit(f"real_hardware.py: unknown recording '{name}' (known: {', '.join(RECORDINGS)})")
    d = np.loadtxt(path, delimiter=",", skiprows=1)
    return Recording(name, RECORDINGS[name][0], d[:, 0], d[:, 1:3], d[:, 3:5], d[:, 5:7])


def dfki_columns(path: Path) -> np.ndarray:
    """The columns of COLUMNS (time first) of one of DFKI's recording files, found by its header."""
    with open(path) as f:
        header = f.readline().strip().split(",")
    missing = [c for c in ("time",) + COLUMNS[1:] if c not in header]
    if missing:
        raise SystemExit(f"real_hardware.py: {path}: no column {', '.join(missing)} (its header: {','.join(header)})")
    d = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
    return d[:, [header.index("time")] + [header.index(c) for c in COLUMNS[1:]]]


def load_held_out(name: str, checkout: Path) -> Recording:
    """A `HELD_OUT` recording from a checkout of DFKI's repository (its data/experiment_records/ file)."""
    path = checkout / "data" / "experiment_records" / (name.replace("__", "/") + ".csv")
    if not path.is_file():
        raise SystemExit(f"real_hardware.py: --held-out: {path} is not a file (a clone of "
                         f"github.com/dfki-ric-underactuated-lab/double_pendulum, commit {HELD_OUT_COMMIT} or later?)")
    d = dfki_columns(path)
    return Recording(name, HELD_OUT[name][0], d[:, 0], d[:, 1:3], d[:, 3:5], d[:, 5:7])


def make_excerpt(source: Path, target: Path = DATA) -> None:
    """The shipped excerpt from the source set: every recording, the columns of COLUMNS, compactly printed
    (positions and measured torques are whole quanta; 8 significant digits keep them exact)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in RECORDINGS:
        rows = [",".join(COLUMNS)]
        for r in dfki_columns(source / f"{name}.csv"):
            rows.append("%.6f,%.8g,%.8g,%.6g,%.6g,%.8g,%.8g" % tuple(r))
        with gzip.GzipFile(target / f"{name}.csv.gz", "wb", mtime=0) as g:   # mtime 0: reproducible bytes
            g.write(("\n".join(rows) + "\n").encode())
    for design in DESIGNS.values():
        (target / design.parameters).write_bytes((source / "params" / design.parameters).read_bytes())
    (target / "LICENSE").write_bytes((source / "LICENSE").read_bytes())


def dfki_parameters(design: str, data: Path = DATA) -> Dict[str, float]:
    with open(data / DESIGNS[design].parameters) as f:
        return {k: float(v) for k, v in yaml.safe_load(f).items()}


def design_mechanism(design: str) -> Mechanism:
    return load_mechanism(MECHANISMS / DESIGNS[design].mechanism)


# -- DFKI's equations of motion, written from their documentation (not from the mechanism model) --------------
class DfkiModel:
    """M(q) q̈ + c(q, q̇) = G(q) + τ − F(q̇) in DFKI's joint angles (q1 from the downward vertical, q2 relative),
    with their rotor terms (M += [[gr²Ir + Ir, −gr·Ir], [−gr·Ir, gr²Ir]]) and friction F = b·q̇ + cf·atan(100·q̇).
    `friction` (for both joints, or a flag per joint) and `rotor` false drop the friction and the rotor terms:
    `DfkiModel(p, friction=friction_modelled(mech))` is the model of the mechanism files."""

    def __init__(self, p: Dict[str, float], friction=True, rotor: bool = True):
        self.p = p
        self.h = p["m2"] * p["l1"] * p["r2"]
        self.g1 = (p["m1"] * p["r1"] + p["m2"] * p["l1"]) * p["g"]
        self.g2 = p["m2"] * p["r2"] * p["g"]
        Ir = p["Ir"] if rotor else 0.0
        gr = p["gr"]
        self.rotor = np.array([[gr * gr * Ir + Ir, -gr * Ir], [-gr * Ir, gr * gr * Ir]])
        keep = np.broadcast_to(np.asarray(friction, bool), (2,))
        self.frictionless = not keep.any()
        self.b = np.where(keep, [p["b1"], p["b2"]], 0.0)
        self.cf = np.where(keep, [p["cf1"], p["cf2"]], 0.0)

    def mass_matrix(self, q) -> np.ndarray:
        p, c = self.p, math.cos(q[1])
        m12 = p["I2"] + self.h * c
        return np.array([[p["I1"] + p["I2"] + p["m2"] * p["l1"] ** 2 + 2 * self.h * c, m12],
                         [m12, p["I2"]]]) + self.rotor

    def bias(self, q, qd) -> np.ndarray:
        """c(q, q̇) − G(q): Coriolis/centrifugal minus gravity torques."""
        s = math.sin(q[1])
        s12 = math.sin(q[0] + q[1])
        return np.array([-self.h * s * (2 * qd[0] * qd[1] + qd[1] ** 2) + self.g1 * math.sin(q[0]) + self.g2 * s12,
                         self.h * s * qd[0] ** 2 + self.g2 * s12])

    def friction(self, qd) -> np.ndarray:
        qd = np.asarray(qd, float)
        return self.b * qd + self.cf * np.arctan(100.0 * qd)

    def accelerations(self, q, qd, tau) -> np.ndarray:
        r = np.asarray(tau, float) - self.bias(q, qd)
        if self.frictionless:
            r0, r1 = float(r[0]), float(r[1])
        else:
            r0, r1 = r - self.friction(qd)
        M = self.mass_matrix(q)
        det = M[0, 0] * M[1, 1] - M[0, 1] * M[1, 0]         # 2 × 2: Cramer's rule (the EKF calls this a lot)
        return np.array([(M[1, 1] * r0 - M[0, 1] * r1) / det, (M[0, 0] * r1 - M[1, 0] * r0) / det])

    def torques(self, q, qd, qdd) -> np.ndarray:
        return self.mass_matrix(q) @ np.asarray(qdd, float) + self.bias(q, qd) + self.friction(qd)


# -- DFKI's joint angles in the mechanism's coordinates --------------------------------------------------------
JOINTS = ("q1", "q2")        # the mechanism files' joint-angle coordinates, actuators and encoders: DFKI's own


# the mechanism files' coordinate equal to each DFKI joint angle (up to a constant), None where there is none
JOINT_COORDINATES = JOINTS


def friction_modelled(mech: Mechanism) -> np.ndarray:
    """Per DFKI joint: does the mechanism model its friction (an actuator with friction on the joint's angle)?"""
    fr = mech.friction
    return np.array([fr is not None and c is not None and fr.describe(mech.coordinate_index(c)) is not None
                     for c in JOINT_COORDINATES], dtype=bool)


def mechanism_state(mech: Mechanism, q, qd) -> tuple:
    """The mechanism's (q, q̇) for DFKI joint angles and rates: the position and velocity problems with q1, q2
    held."""
    cols = [mech.coordinate_index(j) for j in JOINTS]
    x0 = np.array(mech.q0)
    x0[cols] = q
    x = kinematics.solve_positions(mech, x0, fixed=cols, tol=1e-15).q     # (to rounding: q̈ is compared to 1e-10)
    return x, kinematics.solve_velocities(mech, x, fixed=cols, fixed_values=qd)


def mechanism_accelerations(mech: Mechanism, q, qd, tau) -> np.ndarray:
    """DFKI joint accelerations (q̈1, q̈2) from the mechanism model's constrained forward dynamics."""
    x, v = mechanism_state(mech, q, qd)
    a = constrained.forward_dynamics(mech, x, v, mech.generalized_forces(efforts=tau))
    return a[[mech.coordinate_index(j) for j in JOINTS]]


def equations_mismatch(design: str, states: int = 200, seed: int = 0, data: Path = DATA,
                       max_rate: float = 10.0) -> float:
    """Largest |q̈_mechanism − q̈_DFKI| (DFKI's model with the friction the file models, rotor inertia included) over
    random states and torques [rad/s²]."""
    mech = design_mechanism(design)
    model = DfkiModel(dfki_parameters(design, data), friction=friction_modelled(mech))
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(states):
        q, qd, tau = rng.uniform(-math.pi, math.pi, 2), rng.uniform(-max_rate, max_rate, 2), rng.uniform(-5, 5, 2)
        worst = max(worst, float(np.abs(mechanism_accelerations(mech, q, qd, tau)
                                        - model.accelerations(q, qd, tau)).max()))
    return worst


# -- reference and causal filters on real time stamps ---------------------------------------------------------------
def local_polynomial(t, y, half_width: float, order: int = 3, causal: bool = False, keep=None) -> np.ndarray:
    """(N, 3, ...) value, first and second derivative at each t_i of the least-squares polynomial of `order` through
    the samples with |t_j − t_i| ≤ half_width (centred) or t_i − 2·half_width ≤ t_j ≤ t_i (causal), on the
    real time stamps; fewer samples near the ends (the order drops to fit).  With `keep` (N bools) only the kept
    samples enter the fits (every t_i is still evaluated)."""
    t = np.asarray(t, float)
    y = np.asarray(y, float)
    Y = y.reshape(len(t), -1)
    out = np.full((len(t), 3, Y.shape[1]), np.nan)
    lo = np.searchsorted(t, t - (2 if causal else 1) * half_width, side="left")
    hi = np.searchsorted(t, t if causal else t + half_width, side="right")
    kept = None if keep is None else np.asarray(keep, bool)
    for i in range(len(t)):
        sel = slice(lo[i], hi[i]) if kept is None else lo[i] + np.flatnonzero(kept[lo[i]:hi[i]])
        s = (t[sel] - t[i]) / half_width                    # scaled for conditioning
        k = min(order, len(s) - 1)
        V = np.vander(s, k + 1, increasing=True)
        c, *_ = np.linalg.lstsq(V, Y[sel], rcond=None)
        out[i, 0] = c[0]
        out[i, 1] = c[1] / half_width if k >= 1 else 0.0
        out[i, 2] = 2 * c[2] / half_width ** 2 if k >= 2 else 0.0
    return out.reshape((len(t), 3) + y.shape[1:])


def reference_polynomial(t, q, rounds: int = 8) -> tuple:
    """The reference: `local_polynomial` centred over ±`REFERENCE_HALF_WIDTH`, fitted again without the samples
    farther from the fit than `OUTLIER` times the local scatter (1.4826 × the median absolute residual of the
    samples kept within the window, at least a position quantum; the worst within the window a round), for a few
    `rounds`; returns (its (N, 3, 2) values, the left-out samples (N bools)).  The acrobot's logger stamps the reading after each of its 2.7×
    gaps ~3 ms after it was taken (its residual grows with the speed: 7 mrad at 2 rad/s, 73 at 22): such a reading
    would bend the cubic by ~10 mrad over its neighbours, and estimates that follow the motion, not the stamp,
    would be scored against that bend.  Left out: 130 of the acrobot's 5953 readings (126 of them after a gap
    over 2×), 0–5 on the other runs."""
    q = np.asarray(q, float)
    keep = np.ones(len(t), bool)
    span = int(round(2 * REFERENCE_HALF_WIDTH / float(np.median(np.diff(t))))) | 1
    for _ in range(rounds):
        d = local_polynomial(t, q, REFERENCE_HALF_WIDTH, order=3, keep=None if keep.all() else keep)
        residual = np.abs(q - d[:, 0])
        kept = np.pad(np.where(keep[:, None], residual, np.nan), ((span // 2, span // 2), (0, 0)), mode="edge")
        scatter = np.maximum(1.4826 * np.nanmedian(sliding_window_view(kept, span, axis=0), axis=-1), POSITION_STEP)
        # only the worst within a half-width is left out a round: its bend lifts its neighbours' residuals too
        ratio = np.where(keep, (residual / scatter).max(axis=1), 0.0)
        worst = ratio >= np.max(sliding_window_view(np.pad(ratio, span // 2), span), axis=-1)
        still = keep & ~(worst & (ratio > OUTLIER))
        if np.array_equal(still, keep):
            break
        keep = still
    else:
        d = local_polynomial(t, q, REFERENCE_HALF_WIDTH, order=3, keep=keep)
    return d, ~keep


def low_pass(t, x, cutoff: float = BAND) -> np.ndarray:
    """x (N, …) zero-phase low-passed at `cutoff` Hz: interpolated onto a uniform grid of the median step,
    4th-order Butterworth forwards and backwards, back onto t."""
    t = np.asarray(t, float)
    x = np.asarray(x, float).reshape(len(t), -1)
    dt = float(np.median(np.diff(t)))
    grid = np.arange(t[0], t[-1] + 0.5 * dt, dt)
    b, a = butter(4, cutoff * 2 * dt)
    out = np.empty_like(x)
    for j in range(x.shape[1]):
        out[:, j] = np.interp(t, grid, filtfilt(b, a, np.interp(grid, t, x[:, j])))
    return out


# -- estimators: one common output ----------------------------------------------------------------------------------
@dataclass
class Output:
    """Per step: joint angles, rates, torques (N, 2) and the torques' 1σ (NaN where none)."""
    q: np.ndarray
    qd: np.ndarray
    tau: np.ndarray
    tau_std: np.ndarray
    reinitializations: int = 0
    note: str = ""
    parameters: Optional[np.ndarray] = None     # (N, p) identified parameters (`identify`), NaN where none
    parameter_names: tuple = ()
    parameters_std: Optional[np.ndarray] = None  # (p,) their final 1σ
    smoothed: Optional["Output"] = None          # `run_mbfg` with a smoothed lag: each row's smoothed estimate
    published: Optional[int] = None             # estimates the node published (`real_hardware_node.replay`)


# identified online in the `--identify` rows: each joint's viscous and Coulomb friction, from a prior of 0
IDENTIFY = ("q1.viscous_friction", "q1.coulomb_friction", "q2.viscous_friction", "q2.coulomb_friction")
WITHIN = 0.2                 # "come within ±20 % of the final value"
LEARNT = 5.0                 # [s] the `--identify` table's effort error also from here on: after the learning


def frictionless(mech: Mechanism) -> Mechanism:
    """The mechanism with its actuators' friction removed (its Coulomb rate v_s kept: the identified friction's)."""
    spec = mech.spec
    return Mechanism(replace(spec, name=spec.name + "_frictionless", actuators=tuple(
        replace(a, viscous_friction=0.0, coulomb_friction=0.0) for a in spec.actuators)))


def dfki_friction(params: Dict[str, float]) -> Dict[str, float]:
    """DFKI's identified friction as the identified parameters' values: b, and c = cf·π/2 (their cf·atan(100 q̇))."""
    return {"q1.viscous_friction": params["b1"], "q1.coulomb_friction": params["cf1"] * math.pi / 2,
            "q2.viscous_friction": params["b2"], "q2.coulomb_friction": params["cf2"] * math.pi / 2}


def settling_time(t, x, within: float = WITHIN) -> float:
    """Seconds from the start after which x stays within ±`within` of its final value."""
    final = x[-1]
    outside = np.nonzero(~(np.abs(x - final) <= within * abs(final)))[0]
    return 0.0 if not outside.size else float(t[min(outside[-1] + 1, len(t) - 1)] - t[0])


def run_mbfg(mech: Mechanism, rec: Recording, mode: str, settings: Optional[dict] = None,
             actuator_efforts: Optional[Dict[str, str]] = None, identify: Optional[tuple] = None,
             fitted: Optional[dict] = None, smoothed_lag: int = 0) -> Output:
    """The fixed-lag estimator as `mbfg estimate` runs it, one step per recorded row: shipped defaults, or the
    `settings` of a parameter file (`tuning.params_file.read_params`: window, integrator, sigmas,
    sensor_sigmas, effort_shares, adapt_densities, adapt_sensor_sigmas; its mode is not used); `actuator_efforts`: joint name →
    effort kind (`mbfg estimate --actuator-effort`); `fitted`: a dict that gets the densities fitted online at the
    end; `smoothed_lag` > 0: also each row's estimate smoothed by that many steps after it (`Output.smoothed`, its
    σ the smoothed step's marginal), from the same run (the causal estimates do not depend on it)."""
    dt = float(np.median(np.diff(rec.t)))
    kinds = dict(actuator_efforts or {})
    config = EstimatorConfig(dt=dt, mode=mode, actuator_efforts=kinds, identify=identify)
    commands = mode == "fused" or "commanded" in kinds.values()
    if settings:
        config = EstimatorConfig(dt=dt, mode=mode, window=settings.get("window", config.window),
                                 integrator=settings.get("integrator", config.integrator),
                                 sigmas={**config.sigmas, **settings.get("sigmas", {})},
                                 sensor_sigmas=dict(settings.get("sensor_sigmas", {})),
                                 effort_shares=dict(settings.get("effort_shares", {})),
                                 actuator_delays=dict(settings.get("actuator_delays", {})),
                                 actuator_time_constants=dict(settings.get("actuator_time_constants", {})),
                                 adapt_densities=settings.get("adapt_densities",
                                                                   config.adapt_densities),
                                 adapt_sensor_sigmas=settings.get("adapt_sensor_sigmas", config.adapt_sensor_sigmas),
                                 adapt_deflection=settings.get("adapt_deflection", config.adapt_deflection),
                                 effort_bandwidth=settings.get("effort_bandwidth", config.effort_bandwidth),
                                 actuator_efforts=kinds)
    if smoothed_lag:
        config = replace(config, smoothed_lag=int(smoothed_lag), compute_covariance=True)
    est = FixedLagEstimator(mech, config)
    cols = [mech.coordinate_index(j) for j in JOINTS]
    N = len(rec.t)
    out = Output(*(np.full((N, 2), np.nan) for _ in range(4)))
    if est.parameter_names:
        out.parameter_names = est.parameter_names
        out.parameters = np.full((N, len(est.parameter_names)), np.nan)
    smoothed = Output(*(np.full((N, 2), np.nan) for _ in range(4))) if smoothed_lag else None
    row_of = {float(t): k for k, t in enumerate(rec.t)}
    edges: Dict[tuple, float] = {}        # (density, edge) -> when the online fit first sat there [s into the run]

    def take(estimates):
        for s in estimates:
            k = row_of.get(float(s.t))
            if k is not None:
                smoothed.q[k], smoothed.qd[k], smoothed.tau[k] = s.q[cols], s.v[cols], s.efforts
                if s.efforts_std is not None:
                    smoothed.tau_std[k] = s.efforts_std
    for k in range(N):
        e = est.step(float(rec.t[k]), efforts=rec.tau_con[k] if commands else None,
                     observations={"q1": float(rec.q[k, 0]), "q2": float(rec.q[k, 1])})
        if smoothed is not None:
            take(est.smoothed_estimates())
        if e.status in ("initialized", "recovered") and k > 0:
            out.reinitializations += 1
        for edge in (est.density_fit_limits() or {}).items():
            edges.setdefault(edge, float(rec.t[k] - rec.t[0]))
        if e.status == "waiting":
            continue
        out.q[k], out.qd[k], out.tau[k] = e.q[cols], e.v[cols], e.efforts
        if e.parameters is not None:
            out.parameters[k] = e.parameters
        P = est.joint_covariance(cols)                      # [q1, q2, q̇1, q̇2, τ1, τ2]
        if P is not None:
            out.tau_std[k] = np.sqrt(np.clip(np.diagonal(P)[4:6], 0.0, None))
    notes = []
    if est.fitted_densities() is not None:
        if fitted is not None:
            fitted.update(est.fitted_densities())
        notes.append("fitted online: " + ", ".join(f"{name} {value:.3g}"
                                                   for name, value in est.fitted_densities().items()))
    if edges:
        notes.append("density fit at the edge of its range: " + ", ".join(
            f"{name} {edge} from {t:.2f} s" for (name, edge), t in edges.items()))
    if est.fitted_sensor_sigmas():
        notes.append("encoder σ fitted online at the end: "
                     + ", ".join(f"{name} {1e3 * s:.3g} mrad" for name, s in est.fitted_sensor_sigmas().items()))
    if est.parameter_names:
        out.parameters_std = est.parameters()["std"]
    out.note = "; ".join(notes)
    if smoothed is not None:
        take(est.flush_smoothed())
        out.smoothed = smoothed
    return out


class TextbookEKF:
    """EKF on `model` (DfkiModel: the mechanism file's) in joint coordinates, state x = (q, q̇, e): e a random walk
    of density `density` [(N·m)²/s], τ = e (estimation) or command + e (fused).  See the module docstring."""

    def __init__(self, model: DfkiModel, density: float, sigma: float, fused: bool, keep: bool = False):
        self.model, self.S, self.R, self.fused = model, float(density), sigma ** 2 * np.eye(2), fused
        # with `keep`, per step (F, predicted x, predicted P, updated x, updated P): the smoother's pass
        self.history: Optional[list] = [] if keep else None
        self.x: Optional[np.ndarray] = None
        self.P = np.diag([sigma ** 2, sigma ** 2, 1.0, 1.0, 1.0, 1.0])
        self.log_likelihood = 0.0
        self.H = np.hstack([np.eye(2), np.zeros((2, 4))])

    def f(self, x, u) -> np.ndarray:
        tau = x[4:6] + u if self.fused else x[4:6]
        out = np.zeros(6)
        out[:2] = x[2:4]
        out[2:4] = self.model.accelerations(x[:2], x[2:4], tau)
        return out

    def step(self, h: float, u, z) -> None:
        if self.x is None:
            self.x = np.concatenate([z, np.zeros(4)])
            if self.history is not None:
                self.history.append((np.eye(6), self.x, self.P, self.x, self.P))
            return
        x = self.x
        F = np.eye(6)
        if h > 0:
            k1 = self.f(x, u)
            k2 = self.f(x + 0.5 * h * k1, u)
            k3 = self.f(x + 0.5 * h * k2, u)
            k4 = self.f(x + h * k3, u)
            A = np.zeros((6, 6))
            for j in range(4):                                 # central differences in q, q̇
                d = np.zeros(6)
                d[j] = 1e-6 * max(1.0, abs(x[j]))
                A[:, j] = (self.f(x + d, u) - self.f(x - d, u)) / (2 * d[j])
            A[2:4, 4:6] = np.linalg.inv(self.model.mass_matrix(x[:2]))    # ∂q̈/∂e = M⁻¹
            x = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            Qc = np.zeros((6, 6))
            Qc[4, 4] = Qc[5, 5] = self.S
            F = np.eye(6) + A * h + A @ A * (h * h / 2)
            AQ = A @ Qc
            Qd = Qc * h + (AQ + AQ.T) * (h * h / 2) + A @ Qc @ A.T * (h ** 3 / 3)
            self.P = F @ self.P @ F.T + Qd
        x_pred, P_pred = x, self.P
        r = z - x[:2]
        S = self.P[:2, :2] + self.R
        K = np.linalg.solve(S, self.H @ self.P).T
        self.x = x + K @ r
        IKH = np.eye(6) - K @ self.H
        self.P = IKH @ self.P @ IKH.T + K @ self.R @ K.T
        if self.history is not None:
            self.history.append((F, x_pred, P_pred, self.x, self.P))
        self.log_likelihood += -0.5 * (r @ np.linalg.solve(S, r) + math.log(np.linalg.det(2 * math.pi * S)))

    def torques(self, u) -> np.ndarray:
        return self.x[4:6] + (u if self.fused else 0.0)


def run_ekf(model: DfkiModel, rec: Recording, density: float, sigma: float, fused: bool,
            smoothed: bool = False) -> tuple:
    """(Output, log-likelihood of the readings); `smoothed`: the Rauch–Tung–Striebel pass over the whole run
    instead (each step's estimate given every reading, before and after: not causal)."""
    ekf = TextbookEKF(model, density, sigma, fused, keep=smoothed)
    N = len(rec.t)
    out = Output(*(np.full((N, 2), np.nan) for _ in range(4)))
    for k in range(N):
        h = float(rec.t[k] - rec.t[k - 1]) if k else 0.0
        u = rec.tau_con[k - 1] if k else rec.tau_con[0]      # the command held over the step (zero-order hold)
        ekf.step(h, u, rec.q[k])
        out.q[k], out.qd[k] = ekf.x[:2], ekf.x[2:4]
        out.tau[k] = ekf.torques(rec.tau_con[k])
        out.tau_std[k] = np.sqrt(np.diagonal(ekf.P)[4:6])
    if smoothed:
        # x̂ₖ|N = x̂ₖ|ₖ + Cₖ (x̂ₖ₊₁|N − x̂ₖ₊₁|ₖ), Pₖ|N = Pₖ|ₖ + Cₖ (Pₖ₊₁|N − Pₖ₊₁|ₖ) Cₖᵀ, Cₖ = Pₖ|ₖ Fₖ₊₁ᵀ Pₖ₊₁|ₖ⁻¹
        x_s, P_s = ekf.history[-1][3], ekf.history[-1][4]
        for k in range(N - 2, -1, -1):
            F, x_pred, P_pred = ekf.history[k + 1][:3]
            x, P = ekf.history[k][3:]
            C = np.linalg.solve(P_pred, F @ P).T
            x_s, P_s = x + C @ (x_s - x_pred), P + C @ (P_s - P_pred) @ C.T
            out.q[k], out.qd[k] = x_s[:2], x_s[2:4]
            out.tau[k] = x_s[4:6] + (rec.tau_con[k] if fused else 0.0)
            out.tau_std[k] = np.sqrt(np.clip(np.diagonal(P_s)[4:6], 0.0, None))
    return out, ekf.log_likelihood


_tuned_densities: Dict[tuple, float] = {}


def ekf_density(tuning: Recording, sigma: float, fused: bool, log=lambda s: None) -> float:
    """The EKF density with the smallest effort RMSE on the recording `tuning` (against its own truth): the
    best decade of EKF_DECADES, then its half-decade neighbours."""
    key = (tuning.name, len(tuning.t), fused)
    if key in _tuned_densities:
        return _tuned_densities[key]
    params = dfki_parameters(tuning.design)
    modelled = friction_modelled(design_mechanism(tuning.design))
    model, truth = DfkiModel(params, friction=modelled), truth_of(tuning, params, modelled)
    cost, likelihood = {}, {}

    def evaluate(S):
        if S not in cost:
            out, likelihood[S] = run_ekf(model, tuning, S, sigma, fused)
            cost[S] = float(np.sum(rms((out.tau - truth.tau)[truth.scored])))
        return cost[S]

    best = min(EKF_DECADES, key=evaluate)
    best = min((best / math.sqrt(10), best, best * math.sqrt(10)), key=evaluate)
    # what the readings alone would choose (the innovation likelihood), for comparison: not used
    by_likelihood = max(likelihood, key=likelihood.get)
    log(f"  EKF {'fused' if fused else 'estimation'} tuned on {tuning.name}: density {best:.3g} "
        f"(effort RMSE τ1 + τ2 per density: {', '.join(f'{S:.3g}: {c:.3g}' for S, c in sorted(cost.items()))}; "
        f"the readings' likelihood would choose {by_likelihood:.3g})")
    _tuned_densities[key] = best
    return best


def tuned_ekf(model: DfkiModel, rec: Recording, tuning: Recording, sigma: float, fused: bool, log=lambda s: None,
              smoothed: bool = False):
    S = ekf_density(tuning, sigma, fused, log)
    out, _ = run_ekf(model, rec, S, sigma, fused, smoothed)
    out.note = f"density {S:.3g} (N·m)²/s, tuned on {RECORDINGS[tuning.name][1]}"
    return out


def run_savitzky_golay(model: DfkiModel, rec: Recording) -> Output:
    d = local_polynomial(rec.t, rec.q, SG_SPAN / 2, order=3, causal=True)
    N = len(rec.t)
    tau = np.array([model.torques(d[k, 0], d[k, 1], d[k, 2]) for k in range(N)])
    return Output(d[:, 0], d[:, 1], tau, np.full((N, 2), np.nan))


# -- scoring ------------------------------------------------------------------------------------------------------
@dataclass
class Truth:
    scored: np.ndarray       # boolean mask of scored steps
    rate: np.ndarray         # (N, 2) reference joint rates
    tau: np.ndarray          # (N, 2) measured torque − the identified friction the model leaves out
    tau_band: np.ndarray     # the same low-passed
    friction: np.ndarray     # (N, 2)
    rotor: np.ndarray        # (N, 2) the rotor-inertia torques at the reference motion (in the model)
    position: np.ndarray     # (N, 2) the reference's joint angles (the readings less what it smooths away)
    left_out: Optional[np.ndarray] = None   # (N,) the readings the reference leaves out (`reference_polynomial`)


def truth_of(rec: Recording, params: Dict[str, float], modelled: Sequence[bool] = (False, False)) -> Truth:
    """The reference; the torque to estimate per joint is the measured one, less DFKI's identified friction on the
    joints whose friction the model leaves out (`modelled` false)."""
    d, left_out = reference_polynomial(rec.t, rec.q)
    full = DfkiModel(params)
    friction = full.friction(d[:, 1])
    tau = rec.tau_meas - np.where(modelled, 0.0, friction)
    rotor = d[:, 2] @ full.rotor.T
    scored = (rec.t >= rec.t[0] + SETTLE) & (rec.t <= rec.t[-1] - REFERENCE_HALF_WIDTH)
    return Truth(scored, d[:, 1], tau, low_pass(rec.t, tau), friction, rotor, d[:, 0], left_out)


def rms(x, axis=0):
    return np.sqrt(np.nanmean(np.square(x), axis=axis))


def effort_lag(t, estimate, reference, longest: float = LAG_LONGEST) -> list:
    """Per joint, the delay [s] by which the low-passed `estimate` best follows the low-passed `reference` (the
    largest correlation over delays 0 … `longest` on the median step): how late a causal estimate's torque is."""
    h = float(np.median(np.diff(t)))
    lags = range(0, int(round(longest / h)) + 1)
    out = []
    for j in range(reference.shape[1]):
        x, y = estimate[:, j], reference[:, j]
        if not (np.std(x) > 0 and np.std(y) > 0):
            out.append(float("nan"))
            continue
        best = max(lags, key=lambda L: np.corrcoef(x[L:], y[:len(y) - L])[0, 1])
        out.append(best * h)
    return out


def score(rec: Recording, truth: Truth, out: Output, has_rate: bool = True, has_angle: bool = True) -> dict:
    m = truth.scored
    err = out.tau - truth.tau
    estimate_band = low_pass(rec.t, np.nan_to_num(out.tau))
    band = estimate_band - truth.tau_band
    row = {"rate": rms((out.qd - truth.rate)[m]).tolist() if has_rate else None,
           "effort": rms(err[m]).tolist(),
           "effort_band": rms(band[m]).tolist(),
           "coverage": None, "coverage_band": None, "lost": None, "reinitializations": out.reinitializations, "note": out.note}
    row["effort_lag"] = effort_lag(rec.t[m], estimate_band[m], truth.tau_band[m])
    late = m & (rec.t >= rec.t[0] + LEARNT)
    row["effort_learnt"] = rms(err[late]).tolist() if late.any() else None
    if np.isfinite(out.tau_std[m]).any():
        row["coverage"] = np.mean(np.abs(err[m]) <= 2 * out.tau_std[m], axis=0).tolist()
        row["coverage_band"] = np.mean(np.abs(band[m]) <= 2 * out.tau_std[m], axis=0).tolist()
    if has_angle:
        # (far from the reference too: a reading stamped late at speed is itself that far from the motion, and
        # an estimate that follows the motion is far from it)
        far = (np.abs(out.q - rec.q) > LOST) & (np.abs(out.q - truth.position) > LOST)
        row["lost"] = float(np.mean(far[m].any(axis=1) | ~np.isfinite(out.q[m]).all(axis=1)))
    return row


def identified_row(rec: Recording, truth: Truth, out: Output, params: Dict[str, float]) -> dict:
    """`score`, and per identified parameter its final value and 1σ, DFKI's offline value and the time after which
    it stays within ±20 % of its final value."""
    row = score(rec, truth, out)
    dfki = dfki_friction(params)
    ok = np.isfinite(out.parameters).all(axis=1)
    row["identified"] = {name: {"value": float(out.parameters[ok][-1, j]), "std": float(out.parameters_std[j]),
                                "dfki": dfki.get(name), "settled": settling_time(rec.t[ok], out.parameters[ok][:, j])}
                         for j, name in enumerate(out.parameter_names)}
    return row


def bench_recording(rec: Recording, tuning: Recording, log=print, params_file: Optional[Path] = None,
                    passive: bool = False, identify: bool = False, without_deflection: bool = False) -> dict:
    """Every estimator on one recording, scored (`tuning`: the recording the EKF is tuned on; `params_file`: a
    parameter file for two more rows, the estimator with its settings in both modes; `passive`: on a run with a
    passive joint (`PASSIVE_JOINT`), three more rows with its actuator declared passive or commanded)."""
    params = dfki_parameters(rec.design)
    mech = design_mechanism(rec.design)
    modelled = friction_modelled(mech)
    model = DfkiModel(params, friction=modelled)      # the mechanism file's model
    truth = truth_of(rec, params, modelled)
    sigma = POSITION_STEP / math.sqrt(12)
    rows = {}
    N = len(rec.t)

    def timed(label, fn):
        t0 = time.perf_counter()
        row = fn()
        log(f"  {rec.name}: {label} ({time.perf_counter() - t0:.0f} s)")
        rows[label] = row

    for mode in ("estimation", "fused"):
        # (the causal and the smoothed estimates of one run)
        smoothed = f"mbfg_ros {mode}, defaults, smoothed {SMOOTHED_LAG} steps"

        def both():
            out = run_mbfg(mech, rec, mode, smoothed_lag=SMOOTHED_LAG)
            rows[smoothed] = score(rec, truth, out.smoothed)
            return score(rec, truth, out)
        timed(f"mbfg_ros {mode}, defaults", both)
        rows[smoothed] = rows.pop(smoothed)
    if without_deflection:      # the estimation defaults without the encoders' deflection (`adapt_deflection`)
        timed("mbfg_ros estimation, no deflection",
              lambda: score(rec, truth, run_mbfg(mech, rec, "estimation", {"adapt_deflection": False})))
    joint = PASSIVE_JOINT.get(rec.name) if passive else None
    if joint is not None:
        for mode, kind in (("estimation", "passive"), ("fused", "passive"), ("estimation", "commanded")):
            timed(f"mbfg_ros {mode}, {joint} {kind}",
                  lambda: score(rec, truth, run_mbfg(mech, rec, mode, actuator_efforts={joint: kind})))
    if identify:
        # the friction learnt online from a prior of 0, against none at all and DFKI's offline values (the shipped
        # rows): the estimate is then the motor's torque, scored against the measured one
        bare = frictionless(mech)
        timed("mbfg_ros fused, no friction", lambda: score(rec, truth_of(rec, params), run_mbfg(bare, rec, "fused")))
        timed("mbfg_ros fused, friction identified", lambda: identified_row(
            rec, truth_of(rec, params, (True, True)), run_mbfg(bare, rec, "fused", identify=IDENTIFY), params))
        # the file's friction (DFKI's offline values) as the prior, refined online: a model from a data sheet or an
        # offline identification, the node's usual start
        timed("mbfg_ros fused, DFKI's friction refined", lambda: identified_row(
            rec, truth, run_mbfg(mech, rec, "fused", identify=IDENTIFY), params))
        # (with the efforts unknown too, effort and friction trade off)
        timed("mbfg_ros estimation, no friction",
              lambda: score(rec, truth_of(rec, params), run_mbfg(bare, rec, "estimation")))
        timed("mbfg_ros estimation, friction identified", lambda: score(
            rec, truth_of(rec, params, (True, True)), run_mbfg(bare, rec, "estimation", identify=IDENTIFY)))
    if params_file is not None:
        from mbfg_ros.tuning.params_file import read_params
        settings = read_params(params_file, mech)
        for mode in ("estimation", "fused"):
            timed(f"mbfg_ros {mode}, --params {params_file.name}",
                  lambda: score(rec, truth, run_mbfg(mech, rec, mode, settings)))
    # (the anchors' model is the mechanism file's: its commands applied after the actuators' delay too)
    applied, tuning = rec.as_applied(mech), tuning.as_applied(mech)
    timed("EKF estimation", lambda: score(rec, truth, tuned_ekf(model, applied, tuning, sigma, False, log)))
    timed("EKF fused", lambda: score(rec, truth, tuned_ekf(model, applied, tuning, sigma, True, log)))
    for fused in (False, True):
        timed(f"EKF {'fused' if fused else 'estimation'}, smoothed (not causal)",
              lambda: score(rec, truth, tuned_ekf(model, applied, tuning, sigma, fused, log, smoothed=True)))
    timed("Savitzky–Golay + ID", lambda: score(rec, truth, run_savitzky_golay(model, rec)))
    nan2 = np.full((N, 2), np.nan)
    rows["command"] = score(rec, truth, Output(nan2, nan2, applied.tau_con, nan2), has_rate=False, has_angle=False)
    if np.any(mech.actuator_delays):
        rows["command as logged"] = score(rec, truth, Output(nan2, nan2, rec.tau_con, nan2), has_rate=False,
                                          has_angle=False)
    rows["zero"] = score(rec, truth, Output(nan2, np.zeros((N, 2)), np.zeros((N, 2)), nan2), has_angle=False)
    m = truth.scored
    dt = np.diff(rec.t)
    med = float(np.median(dt))
    info = {"steps": int(N), "seconds": float(rec.t[-1] - rec.t[0]), "dt_median": med,
            "off_steps": float(np.mean(np.abs(dt / med - 1) > 0.1)), "longest_step": float(dt.max() / med),
            "effort_rms": rms(truth.tau[m]).tolist(), "rate_rms": rms(truth.rate[m]).tolist(),
            "friction_rms": rms(truth.friction[m]).tolist(), "rotor_rms": rms(truth.rotor[m]).tolist(),
            "reading_residual_rms": rms((rec.q - truth.position)[m]).tolist(),
            "readings_off": float(np.mean((np.abs(rec.q - truth.position) > LOST)[m].any(axis=1))),
            "left_out": int(np.sum(truth.left_out))}
    info["command_delay"], info["command_lag"], info["command_delay_ratio"] = command_delay(rec)
    return {"recording": rec.name, "short": {**RECORDINGS, **HELD_OUT}[rec.name][1], "info": info, "rows": rows}


# -- tables ---------------------------------------------------------------------------------------------------------
def _pair(v, fmt="{:.3g}", scale=1.0, unit=""):
    if v is None:
        return "–"
    return " / ".join("–" if x != x else fmt.format(x * scale) for x in v) + unit


def results_table(results: List[dict]) -> str:
    lines = ["| run | estimator | rate RMSE q̇1 / q̇2 [rad/s] | effort RMSE τ1 / τ2 [N·m] | ≤ 5 Hz [N·m] | "
             "≤ 5 Hz lag τ1 / τ2 [ms] | 2σ coverage τ1 / τ2 | ≤ 5 Hz | lost track | re-init. |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for label, row in r["rows"].items():
            lost = "–" if row["lost"] is None else f"{100 * row['lost']:.1f} %"
            reinit = str(row["reinitializations"]) if label.startswith("mbfg") else "–"
            label = label.replace(", defaults", ", **defaults**")
            lines.append(f"| {r['short']} | {label} | {_pair(row['rate'])} | {_pair(row['effort'])} | "
                         f"{_pair(row['effort_band'])} | {_pair(row['effort_lag'], '{:.0f}', 1e3)} | "
                         f"{_pair(row['coverage'], '{:.0f}', 100, ' %')} | "
                         f"{_pair(row.get('coverage_band'), '{:.0f}', 100, ' %')} | {lost} | "
                         f"{reinit} |")
    return "\n".join(lines)


def _ratio(a, b) -> str:
    return " / ".join(f"{x / y:.2f}" if y else "–" for x, y in zip(a, b))


def held_out_table(results: List[dict]) -> str:
    """Per run, the shipped defaults against the anchors (ratios: below 1 is better) and the issue's checks
    counted over the joint-runs: effort and rate ≤ 1.2× the EKF's, fused ≤ the command, 2σ coverage 90–98 %."""
    lines = ["| run | effort τ1 / τ2 [N·m]: estimation (× EKF) | fused (× EKF) | fused × the command | "
             "rates q̇1 / q̇2: estimation × EKF | fused × EKF | 2σ coverage: estimation | fused | lost track |",
             "|---" * 9 + "|"]
    checks = {"effort ≤ 1.2× the EKF's": [], "rate ≤ 1.2× the EKF's": [], "fused ≤ the command": [],
              "2σ coverage 90–98 %": [], "2σ coverage ≥ 90 %": []}
    for r in results:
        rows = r["rows"]
        est, fus = rows["mbfg_ros estimation, defaults"], rows["mbfg_ros fused, defaults"]
        ekf_e, ekf_f, cmd = rows["EKF estimation"], rows["EKF fused"], rows["command"]
        lines.append(f"| {r['short']} | {_pair(est['effort'])} ({_ratio(est['effort'], ekf_e['effort'])}) | "
                     f"{_pair(fus['effort'])} ({_ratio(fus['effort'], ekf_f['effort'])}) | "
                     f"{_ratio(fus['effort'], cmd['effort'])} | {_ratio(est['rate'], ekf_e['rate'])} | "
                     f"{_ratio(fus['rate'], ekf_f['rate'])} | {_pair(est['coverage'], '{:.0f}', 100, ' %')} | "
                     f"{_pair(fus['coverage'], '{:.0f}', 100, ' %')} | "
                     f"{100 * est['lost']:.2f} · {100 * fus['lost']:.2f} % |")
        for ours, ekf in ((est, ekf_e), (fus, ekf_f)):
            checks["effort ≤ 1.2× the EKF's"] += [x <= 1.2 * y for x, y in zip(ours["effort"], ekf["effort"])]
            checks["rate ≤ 1.2× the EKF's"] += [x <= 1.2 * y for x, y in zip(ours["rate"], ekf["rate"])]
            checks["2σ coverage 90–98 %"] += [0.9 <= c <= 0.98 for c in ours["coverage"]]
            checks["2σ coverage ≥ 90 %"] += [c >= 0.9 for c in ours["coverage"]]
        checks["fused ≤ the command"] += [x <= y for x, y in zip(fus["effort"], cmd["effort"])]
    lines.append("")
    lines.append("; ".join(f"{name}: {sum(v)} of {len(v)} joint-runs" for name, v in checks.items()))
    return "\n".join(lines)


def recordings_table(results: List[dict]) -> str:
    lines = ["| run | steps | s | median step [ms] | steps off > 10 % | longest step | effort RMS τ1 / τ2 "
             "[N·m] | rate RMS [rad/s] | friction RMS [N·m] | rotor inertia RMS [N·m] | readings about "
             "the reference, RMS [mrad] | readings > 0.01 rad off it | readings left out of it | measured torque "
             "after the command τ1 / τ2: delay · lag [ms] (RMS × the undelayed) |", "|---" * 14 + "|"]
    for r in results:
        i = r["info"]
        lines.append(f"| {r['short']} | {i['steps']} | {i['seconds']:.1f} | {1e3 * i['dt_median']:.2f} | "
                     f"{100 * i['off_steps']:.1f} % | {i['longest_step']:.1f}× | {_pair(i['effort_rms'])} | "
                     f"{_pair(i['rate_rms'])} | {_pair(i['friction_rms'])} | {_pair(i['rotor_rms'])} | "
                     f"{_pair(i['reading_residual_rms'], scale=1e3)} | {100 * i['readings_off']:.1f} % | "
                     f"{i['left_out']} | {_pair(i['command_delay'], '{:.1f}', 1e3)} · "
                     f"{_pair(i['command_lag'], '{:.1f}', 1e3)} ({_pair(i['command_delay_ratio'], '{:.2f}')}) |")
    return "\n".join(lines)


def identified_table(results: List[dict]) -> str:
    lines = ["| run | " + " | ".join(IDENTIFY) + " |", "|---|" + "---|" * len(IDENTIFY)]
    for r in results:
        row = r["rows"].get("mbfg_ros fused, friction identified")
        if row is None:
            continue
        cells = []
        for name in IDENTIFY:
            p = row["identified"][name]
            cells.append(f"{p['value']:.3g} ± {p['std']:.2g} (DFKI {p['dfki']:.3g}; {p['settled']:.1f} s)")
        lines.append(f"| {r['short']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def learnt_table(results: List[dict]) -> str:
    """The `--identify` rows' effort RMSE from `LEARNT` s on beside from the scoring's start: how much of a row's
    error is the identification's learning."""
    labels = ("mbfg_ros fused, no friction", "mbfg_ros fused, friction identified", "mbfg_ros fused, defaults",
              "mbfg_ros fused, DFKI's friction refined", "EKF fused")
    lines = ["| run | " + " | ".join(f"{label.replace('mbfg_ros ', '')}: from 0.5 s · from {LEARNT:g} s"
                                     for label in labels) + " |", "|---|" + "---|" * len(labels)]
    for r in results:
        rows = r["rows"]
        if "mbfg_ros fused, friction identified" not in rows:
            continue
        lines.append(f"| {r['short']} | " + " | ".join(
            f"{_pair(rows[label]['effort'])} · {_pair(rows[label].get('effort_learnt'))}" for label in labels) + " |")
    return "\n".join(lines)


def starts_table(recordings: List[Recording], starts: Sequence[int]) -> str:
    """The shipped defaults on each recording started `starts` rows in, scored as `score` does."""
    lines = ["| run | start row | mode | rate RMSE q̇1 / q̇2 [rad/s] | effort RMSE τ1 / τ2 [N·m] | lost track |",
             "|---|---|---|---|---|---|"]
    for full in recordings:
        params, mech = dfki_parameters(full.design), design_mechanism(full.design)
        for start in starts:
            rec = full.rows(slice(start, None))
            truth = truth_of(rec, params, friction_modelled(mech))
            for mode in ("estimation", "fused"):
                row = score(rec, truth, run_mbfg(mech, rec, mode))
                lines.append(f"| {RECORDINGS[full.name][1]} | {start} | {mode} | {_pair(row['rate'])} | "
                             f"{_pair(row['effort'])} | {100 * row['lost']:.2f} % |")
    return "\n".join(lines)


def density_table(recordings: List[Recording], scales: Sequence[str]) -> str:
    """Estimation mode with the process densities the online fit ends at on each recording, held fixed (no
    adaptation) and scaled: is the fitted pair where the effort error is smallest?"""
    lines = ["| run | effort density × | acceleration density × | effort RMSE τ1 / τ2 [N·m] | ≤ 5 Hz [N·m] | "
             "≤ 5 Hz lag τ1 / τ2 [ms] | rate RMSE q̇1 / q̇2 [rad/s] |", "|---|---|---|---|---|---|---|"]
    for rec in recordings:
        params, mech = dfki_parameters(rec.design), design_mechanism(rec.design)
        truth = truth_of(rec, params, friction_modelled(mech))
        fitted = {}
        run_mbfg(mech, rec, "estimation", fitted=fitted)
        for pair in scales:
            e, a = (float(x) for x in pair.split(":"))
            sigmas = {"effort_density": e * fitted["effort_density"],
                      "acceleration_density": a * fitted["acceleration_density"]}
            row = score(rec, truth, run_mbfg(mech, rec, "estimation", {"sigmas": sigmas, "adapt_densities": False}))
            lines.append(f"| {RECORDINGS[rec.name][1]} | {e:g} | {a:g} | {_pair(row['effort'])} | "
                         f"{_pair(row['effort_band'])} | {_pair(row['effort_lag'], '{:.0f}', 1e3)} | "
                         f"{_pair(row['rate'])} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recording", action="append", choices=list(RECORDINGS), help="only these (default: all)")
    ap.add_argument("--seconds", type=float, help="only the first T seconds of each recording")
    ap.add_argument("--data", type=Path, default=DATA, help="folder of the excerpt (default: bench/data/...)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON")
    ap.add_argument("--params", type=Path, metavar="PARAMS.yaml",
                    help="also the estimator with this parameter file's settings (node format, e.g. from mbfg tune), "
                         "in both modes")
    ap.add_argument("--passive", action="store_true",
                    help="on the pendubot and acrobot runs, also the estimator with the passive joint's actuator "
                         "declared passive (estimation, fused) and commanded (estimation)")
    ap.add_argument("--without-deflection", action="store_true",
                    help="also estimation mode without the encoders' deflection (adapt_deflection false: the "
                         "acceleration noise alone takes the gear's play)")
    ap.add_argument("--identify", action="store_true",
                    help="also fused and estimation mode on the mechanism without friction, with and without "
                         "each joint's viscous and Coulomb friction identified online (IDENTIFY), fused mode with "
                         "them identified from DFKI's values (the shipped file's), and a table of the values "
                         "identified from 0 (fused) against DFKI's")
    ap.add_argument("--starts", type=int, nargs="+", metavar="ROWS",
                    help="instead: only the shipped defaults in both modes, each recording started this many rows in "
                         "(how much a score depends on where a run starts)")
    ap.add_argument("--density-scales", nargs="+", metavar="E:A",
                    help="instead: estimation mode with the densities the defaults fit on each recording, held fixed "
                         "and scaled (E the effort density's factor, A the acceleration density's)")
    ap.add_argument("--held-out", type=Path, metavar="DFKI_CHECKOUT",
                    help="instead: the HELD_OUT recordings, read from a clone of DFKI's repository "
                         "(github.com/dfki-ric-underactuated-lab/double_pendulum): runs the defaults were not "
                         "developed on")
    ap.add_argument("--make-excerpt", type=Path, metavar="SOURCE_DIR",
                    help="rebuild the shipped excerpt from the source recordings (their CSVs, params/, LICENSE)")
    args = ap.parse_args(argv)
    if args.make_excerpt:
        make_excerpt(args.make_excerpt, args.data)
        return 0
    for design in DESIGNS:
        print(f"design {design}: max |q̈ mechanism − q̈ DFKI (the file's friction)| = "
              f"{equations_mismatch(design, data=args.data):.2g} rad/s²", file=sys.stderr)
    if args.density_scales or args.starts:
        recordings = [load_recording(name, args.data).cut(args.seconds) for name in args.recording or list(RECORDINGS)]
        print(density_table(recordings, args.density_scales) if args.density_scales
              else starts_table(recordings, args.starts))
        return 0
    results = []
    if args.held_out is not None:
        runs = [(load_held_out(name, args.held_out).cut(args.seconds),
                 load_recording(HELD_OUT_TUNING[design], args.data).cut(args.seconds))
                for name, (design, _, _) in HELD_OUT.items()]
    else:
        runs = [(load_recording(name, args.data).cut(args.seconds),
                 load_recording(TUNING_RUN[name], args.data).cut(args.seconds))
                for name in args.recording or list(RECORDINGS)]
    for rec, tuning in runs:
        results.append(bench_recording(rec, tuning, log=lambda s: print(s, file=sys.stderr, flush=True),
                                       params_file=args.params, passive=args.passive, identify=args.identify,
                                       without_deflection=args.without_deflection))
    print(f"Recordings ({os.uname().machine}, load {os.getloadavg()[0]:.1f}):\n")
    print(recordings_table(results))
    print("\nEstimates, scored from 0.5 s:\n")
    print(results_table(results))
    if args.held_out is not None:
        print("\nThe shipped defaults against the anchors:\n")
        print(held_out_table(results))
    notes = [f"{r['short']}, {label}: {row['note']}" for r in results for label, row in r["rows"].items()
             if row["note"]]
    print("\n" + "\n".join(notes))
    if args.identify:
        print("\nIdentified online (fused, from a prior of 0), final value ± 1σ, DFKI's offline value, time to stay "
              "within ±20 % of the final value:\n")
        print(identified_table(results))
        print(f"\nEffort RMSE τ1 / τ2 [N·m] from 0.5 s and from {LEARNT:g} s (after the learning):\n")
        print(learnt_table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
