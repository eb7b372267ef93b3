"""A tuning recording from a rosbag2 bag (MCAP or SQLite, read with the pure-Python `rosbags`): encoder
readings from sensor_msgs/JointState `position` (by joint name = sensor name, NaN = no reading; as
bench/make_bags.py and the node's ~/joint_observations) and commanded efforts from sensor_msgs/JointState
`effort` (by actuator joint name), both stamped by their headers."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from mbfg_ros.excerpt import excerpt, excerpts
from mbfg_ros.model.mechanism import Mechanism
from mbfg_ros.model.plausibility import InputLimits
from mbfg_ros.tuning.likelihood import Recording, TuningError, encoder_layout

JOINT_STATE = "sensor_msgs/msg/JointState"


def _topic(name: str) -> str:
    return name if name.startswith("/") else "/" + name


def _check(path, topic: str, index: int, stamp: float, problems) -> None:
    """TuningError naming the message of the first problem (`model.plausibility`) among `problems`."""
    for problem in problems:
        if problem is not None:
            kind, detail = problem
            raise TuningError(f"{path}: {topic} message {index + 1} (stamp {stamp:.9f} s): "
                              f"{kind.replace('_', ' ')}: {detail}")


def recording_from_bag(mech: Mechanism, path, observations_topic: str = "joint_observations",
                       torques_topic: Optional[str] = None) -> Recording:
    """The encoders' readings at the observation messages' stamps, as stamped (jitter, drift and gaps are
    taken as they are; an encoder a message does not read, or reads as NaN, is a missing reading; two
    messages with the same stamp are an error) and, with `torques_topic`, the newest command at or before
    each (zero-order hold)."""
    try:
        from rosbags.highlevel import AnyReader
        from rosbags.typesys import Stores, get_typestore
    except ImportError as exc:       # pragma: no cover - rosbags is a dependency
        raise TuningError(f"reading a bag needs the 'rosbags' package ({exc})") from None
    path = Path(path)
    if not path.exists():
        raise TuningError(f"{path}: no such bag")
    names, coords, _ = encoder_layout(mech)
    limits = InputLimits(mech)
    obs_topic = _topic(observations_topic)
    cmd_topic = _topic(torques_topic) if torques_topic else None
    obs_t, obs_y, cmd_t, cmd_u = [], [], [], []
    try:
        reader = AnyReader([path], default_typestore=get_typestore(Stores.ROS2_HUMBLE))
        reader.open()
    except Exception as exc:        # rosbags raises its own error types for a folder that is not a bag
        raise TuningError(f"{path}: not a readable rosbag2 bag ({excerpt(exc, 120)})") from None
    try:
        topics = {c.topic: c.msgtype for c in reader.connections}
        for topic in filter(None, (obs_topic, cmd_topic)):
            if topic not in topics:
                raise TuningError(f"{path}: no topic {topic} (topics: {excerpts(sorted(topics)) or 'none'})")
            if topics[topic] != JOINT_STATE:
                raise TuningError(f"{path}: topic {topic} is {topics[topic]}, expected {JOINT_STATE}")
        conns = [c for c in reader.connections if c.topic in (obs_topic, cmd_topic)]
        actuators = list(mech.actuator_names)
        for conn, _, raw in reader.messages(connections=conns):
            msg = reader.deserialize(raw, conn.msgtype)
            stamp = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
            index = {n: i for i, n in enumerate(msg.name)}
            if conn.topic == obs_topic:
                row = [float(msg.position[index[n]]) if n in index and index[n] < len(msg.position) else np.nan
                       for n in names]
                _check(path, obs_topic, len(obs_t), stamp,
                       [limits.reading_problem(n, v) for n, v in zip(names, row) if not np.isnan(v)])
                obs_t.append(stamp)
                obs_y.append(row)
            else:
                missing = [a for a in actuators if a not in index or index[a] >= len(msg.effort)]
                if missing:
                    raise TuningError(f"{path}: a {cmd_topic} message has no effort for {', '.join(missing)}")
                u = [float(msg.effort[index[a]]) for a in actuators]
                _check(path, cmd_topic, len(cmd_t), stamp, [limits.effort_problem(k, v) for k, v in enumerate(u)])
                cmd_t.append(stamp)
                cmd_u.append(u)
    finally:
        reader.close()
    if len(obs_t) < 10:
        raise TuningError(f"{path}: {len(obs_t)} message(s) on {obs_topic}, need at least 10")
    order = np.argsort(obs_t, kind="stable")
    t = np.asarray(obs_t)[order]
    y = np.asarray(obs_y)[order]
    repeated = np.nonzero(np.diff(t) <= 0)[0]
    if repeated.size:
        i = int(repeated[0])
        first, second = sorted((int(order[i]) + 1, int(order[i + 1]) + 1))
        raise TuningError(f"{path}: {obs_topic} messages {first} and {second} have the same stamp "
                          f"({t[i]:.9f} s)")
    commands = None
    if cmd_topic:
        if not cmd_t:
            raise TuningError(f"{path}: no messages on {cmd_topic}")
        co = np.argsort(cmd_t, kind="stable")
        ct, cu = np.asarray(cmd_t)[co], np.asarray(cmd_u)[co]
        idx = np.searchsorted(ct, t + 1e-9, side="right") - 1
        if idx[0] < 0:
            raise TuningError(f"{path}: the first command on {cmd_topic} comes after the first observation")
        commands = cu[idx]
    return Recording(t, y, names, coords, commands, f"{path} ({obs_topic}{', ' + cmd_topic if cmd_topic else ''})")
