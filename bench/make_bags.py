#!/usr/bin/env python3
"""Generate rosbag2 (MCAP) bags of the simulated plants, without ROS (pure-Python `rosbags`).

    python bench/make_bags.py OUT_DIR [--duration 3] [--distro kilted] [--storage mcap] [--only four_bar_crank]

    python bench/make_bags.py OUT_DIR --recording NAME   # a real recording (bench/real_hardware.py), as stamped

For each mechanism (four_bar_crank at 1 ms, pick_and_place_robot at 5 ms) writes OUT_DIR/<mechanism>/,
a rosbag2 folder (metadata.yaml + one .mcap file) with

    /clock                      rosgraph_msgs/msg/Clock        simulated time, one tick per sample
    /joint_observations         sensor_msgs/msg/JointState     noisy encoders (position), gyroscopes (velocity)
    /commanded_effort           sensor_msgs/msg/JointState     the applied actuator efforts
    /four_bar_sim/truth         sensor_msgs/msg/JointState     truth q, q̇ and efforts, all coordinates
    /four_bar_sim/truth_state   trajectory_msgs/msg/JointTrajectory  truth q, q̇, q̈, Q

Header stamps and bag times are the simulated time, starting at a positive epoch (`--t0`, default
100 s: time 0 means "unset" to a node using sim time).  Replay into the estimator on a ROS 2 machine:

    ros2 bag play OUT_DIR/four_bar_crank --clock 1000 &    # or publish the recorded /clock: --topics ...
    ros2 run mbfg_ros estimator --ros-args --params-file config/four_bar.yaml -p use_sim_time:=true

(see docs/ros2_interfaces.md).  The message definitions are those of ROS 2 Kilted (`--distro`), which
for these types are identical in Humble, Jazzy and Kilted.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Dict, Optional

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mbfg_ros.model.mechanism import load_mechanism  # noqa: E402
from mbfg_ros.sim.plant import Actuator, SimulatedPlant, Trajectory  # noqa: E402

NS = 1_000_000_000
DEFAULT_DT = {"four_bar_crank": 1e-3, "pick_and_place_robot": 5e-3}
TOPICS = ("/clock", "/joint_observations", "/commanded_effort", "/four_bar_sim/truth", "/four_bar_sim/truth_state")


def _typestore(distro: str):
    from rosbags.typesys import Stores, get_typestore
    key = f"ROS2_{distro.upper()}"
    if not hasattr(Stores, key):
        raise SystemExit(f"unknown distro {distro!r} (rosbags knows {[s.name for s in Stores]})")
    return get_typestore(getattr(Stores, key))


def _fresh_folder(path, overwrite: bool) -> Path:
    """`path` for a new bag: an existing one removed (FileExistsError unless `overwrite`), its parent made."""
    path = Path(path)
    if path.exists():
        if not overwrite:
            raise FileExistsError(path)
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _input_connections(writer, ts) -> tuple:
    """The bag's /clock, /joint_observations and /commanded_effort: what the estimator node reads."""
    js = ts.types["sensor_msgs/msg/JointState"].__msgtype__
    return (writer.add_connection("/clock", ts.types["rosgraph_msgs/msg/Clock"].__msgtype__, typestore=ts),
            writer.add_connection("/joint_observations", js, typestore=ts),
            writer.add_connection("/commanded_effort", js, typestore=ts))


def write_bag(path, mechanism: str = "four_bar_crank", duration: float = 3.0, dt: Optional[float] = None,
              seed: int = 1, t0: float = 100.0, distro: str = "kilted", storage: str = "mcap",
              overwrite: bool = True) -> Dict[str, object]:
    """Simulate `mechanism` and write the bag to `path` (a folder).  Returns {path, dt, t0_ns, trajectory}."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    path = _fresh_folder(path, overwrite)
    mech = load_mechanism(mechanism)
    dt = float(dt if dt is not None else DEFAULT_DT.get(mech.name, 1e-3))
    # exact commands (ideal actuator): test/test_bag_replay.py checks the fused-mode effort against the truth
    traj: Trajectory = SimulatedPlant(mech, dt=dt, seed=seed, actuator=Actuator.ideal(mech)).simulate(duration)
    ts = _typestore(distro)
    T = ts.types
    Time, Header = T["builtin_interfaces/msg/Time"], T["std_msgs/msg/Header"]
    Duration = T["builtin_interfaces/msg/Duration"]
    JointState, Clock = T["sensor_msgs/msg/JointState"], T["rosgraph_msgs/msg/Clock"]
    JT, JTP = T["trajectory_msgs/msg/JointTrajectory"], T["trajectory_msgs/msg/JointTrajectoryPoint"]
    sensors = list(traj.readings)
    gyro = np.array([s.kind == "gyroscope" for s in mech.sensors if s.name in traj.readings])
    names = list(mech.coordinate_names)
    t0_ns = int(round(t0 * NS))
    dt_ns = int(round(dt * NS))
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    empty = np.zeros(0)
    with Writer(path, version=9, storage_plugin=plugin) as w:
        c_clock, c_obs, c_eff = _input_connections(w, ts)
        c_truth = w.add_connection("/four_bar_sim/truth", JointState.__msgtype__, typestore=ts)
        c_state = w.add_connection("/four_bar_sim/truth_state", JT.__msgtype__, typestore=ts)
        for k in range(len(traj)):
            t_ns = t0_ns + k * dt_ns
            stamp = Time(sec=t_ns // NS, nanosec=t_ns % NS)
            hdr = Header(stamp=stamp, frame_id="")
            w.write(c_clock, t_ns, ts.serialize_cdr(Clock(clock=stamp), Clock.__msgtype__))
            vals = np.array([traj.readings[s][k] for s in sensors])
            obs = JointState(header=hdr, name=sensors, position=np.where(gyro, np.nan, vals),
                             velocity=np.where(gyro, vals, np.nan) if gyro.any() else empty, effort=empty)
            w.write(c_obs, t_ns, ts.serialize_cdr(obs, JointState.__msgtype__))
            eff = JointState(header=hdr, name=list(mech.actuator_names), position=empty, velocity=empty,
                             effort=np.asarray(traj.efforts[k], dtype=float))
            w.write(c_eff, t_ns, ts.serialize_cdr(eff, JointState.__msgtype__))
            e_all = np.zeros(mech.n)
            e_all[mech.actuated] = traj.efforts[k]
            truth = JointState(header=hdr, name=names, position=traj.q[k], velocity=traj.v[k], effort=e_all)
            w.write(c_truth, t_ns, ts.serialize_cdr(truth, JointState.__msgtype__))
            pt = JTP(positions=traj.q[k], velocities=traj.v[k], accelerations=traj.a[k], effort=traj.Q[k],
                     time_from_start=Duration(sec=0, nanosec=0))
            st = JT(header=Header(stamp=stamp, frame_id="world"), joint_names=names, points=[pt])
            w.write(c_state, t_ns, ts.serialize_cdr(st, JT.__msgtype__))
    return {"path": path, "dt": dt, "t0_ns": t0_ns, "trajectory": traj, "mechanism": mech}


def write_recording_bag(path, t, positions, commands, measured=None, sensors=("q1", "q2"), actuators=("q1", "q2"),
                        t0: float = 100.0, distro: str = "kilted", storage: str = "mcap",
                        overwrite: bool = True) -> Dict[str, object]:
    """A robot's recording as a bag, as its logger would have recorded it: each row at its own stamp (`t` [s],
    jitter, overruns and drift kept), t0 + (t − t[0]) in bag time.  Per row a /clock tick, the encoders'
    `positions` (N × sensors) on /joint_observations, the `commands` (N × actuators) on /commanded_effort and,
    given, the `measured` torques on /measured_effort (a reference, not an input of the node).  Returns {path,
    t0_ns, stamps_ns}."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    path = _fresh_folder(path, overwrite)
    t = np.asarray(t, dtype=float)
    ts = _typestore(distro)
    T = ts.types
    Time, Header = T["builtin_interfaces/msg/Time"], T["std_msgs/msg/Header"]
    JointState, Clock = T["sensor_msgs/msg/JointState"], T["rosgraph_msgs/msg/Clock"]
    t0_ns = int(round(t0 * NS))
    stamps = t0_ns + np.round((t - t[0]) * NS).astype(np.int64)
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    empty = np.zeros(0)
    with Writer(path, version=9, storage_plugin=plugin) as w:
        c_clock, c_obs, c_eff = _input_connections(w, ts)
        c_meas = (w.add_connection("/measured_effort", JointState.__msgtype__, typestore=ts)
                  if measured is not None else None)
        for k, t_ns in enumerate(int(x) for x in stamps):
            stamp = Time(sec=t_ns // NS, nanosec=t_ns % NS)
            hdr = Header(stamp=stamp, frame_id="")
            w.write(c_clock, t_ns, ts.serialize_cdr(Clock(clock=stamp), Clock.__msgtype__))
            obs = JointState(header=hdr, name=list(sensors), position=np.asarray(positions[k], dtype=float),
                             velocity=empty, effort=empty)
            w.write(c_obs, t_ns, ts.serialize_cdr(obs, JointState.__msgtype__))
            eff = JointState(header=hdr, name=list(actuators), position=empty, velocity=empty,
                             effort=np.asarray(commands[k], dtype=float))
            w.write(c_eff, t_ns, ts.serialize_cdr(eff, JointState.__msgtype__))
            if c_meas is not None:
                meas = JointState(header=hdr, name=list(actuators), position=empty, velocity=empty,
                                  effort=np.asarray(measured[k], dtype=float))
                w.write(c_meas, t_ns, ts.serialize_cdr(meas, JointState.__msgtype__))
    return {"path": path, "t0_ns": t0_ns, "stamps_ns": stamps}


def read_bag(path, distro: str = "kilted"):
    """(topic, bag time ns, deserialized message) in bag order, with rosbags' AnyReader."""
    from rosbags.highlevel import AnyReader
    ts = _typestore(distro)
    with AnyReader([Path(path)], default_typestore=ts) as r:
        for conn, t, raw in r.messages():
            yield conn.topic, t, r.deserialize(raw, conn.msgtype)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output folder (one sub-folder per bag)")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--distro", default="kilted", help="message definitions: humble | jazzy | kilted (default)")
    ap.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--t0", type=float, default=100.0, help="simulated time of the first sample [s]")
    ap.add_argument("--only", action="append", help="mechanism(s) to write (default: both)")
    ap.add_argument("--recording", action="append", metavar="NAME",
                    help="a real double-pendulum recording of bench/data (bench/real_hardware.py's RECORDINGS) as its "
                         "logger stamped it, written to OUT/NAME (then the simulated plants only with --only)")
    a = ap.parse_args(argv)
    if a.recording:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import real_hardware as rh
    for name in a.recording or []:
        rec = rh.load_recording(name)
        info = write_recording_bag(Path(a.out) / name, rec.t, rec.q, rec.tau_con, rec.tau_meas, t0=a.t0,
                                   distro=a.distro, storage=a.storage)
        print(f"{info['path']}: {rh.RECORDINGS[name][1]}, {len(rec.t)} rows as stamped, {a.storage}, topics "
              "/clock, /joint_observations, /commanded_effort, /measured_effort")
    for mech in a.only or ([] if a.recording else list(DEFAULT_DT)):
        info = write_bag(Path(a.out) / mech, mech, a.duration, seed=a.seed, t0=a.t0, distro=a.distro,
                         storage=a.storage)
        print(f"{info['path']}: {mech}, {len(info['trajectory'])} samples at dt = {info['dt']} s, "
              f"{a.storage}, topics {', '.join(TOPICS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
