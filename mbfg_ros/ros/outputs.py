"""The estimator node's outputs: ~/joint_states, ~/state, ~/markers, ~/disturbance (fused mode) (each
estimate, written into serialized templates), optionally ~/joint_states_stddev and ~/joint_states_covariance,
~/smoothed/joint_states and ~/smoothed/state (each estimate again, `smoothed_lag` steps later),
~/parameters (the identified actuator parameters, at their own period) and /diagnostics."""

from __future__ import annotations

import numpy as np

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, MultiArrayDimension
from trajectory_msgs.msg import JointTrajectory
from visualization_msgs.msg import MarkerArray

from mbfg_ros.estimation.config import Estimate
from mbfg_ros.model.mechanism import Mechanism
from mbfg_ros.ros import conversions as rc
from mbfg_ros.ros.parameters import Settings
from mbfg_ros.ros.scheduler import NS

# Reliable, 10 deep; overridable with the qos_overrides.<topic>.* parameters.
OUTPUT_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST,
                        durability=DurabilityPolicy.VOLATILE)
LISTENER_CHECK_NS = 50_000_000   # how often the outputs' subscriber counts are refreshed (node clock)


def joint_state_layout(mech: Mechanism):
    """~/joint_states: the actuated and encoded relative coordinates, named after their actuator / encoder:
    (coordinate indices, names, index of each one's effort among the actuators or -1)."""
    names_by_coord = {}
    for i, c in enumerate(mech.actuated):
        names_by_coord[int(c)] = mech.actuator_names[i]
    for s in mech.sensors:
        if s.kind == "encoder":
            names_by_coord.setdefault(int(s.coordinate), s.name)
    coords = np.array(sorted(names_by_coord), dtype=np.intp)
    names = [names_by_coord[int(c)] for c in coords]
    act_pos = {int(c): i for i, c in enumerate(mech.actuated)}
    effort_index = np.array([act_pos.get(int(c), -1) for c in coords], dtype=np.intp)
    return coords, names, effort_index


def covariance_message(joint_names) -> Float64MultiArray:
    """~/joint_states_covariance's message without its data: a 3m × 3m row-major matrix whose rows and columns
    are the m joints' position, then velocity, then effort (~/joint_states' names and order), each dimension
    labelled with that order: 'position/crank,velocity/crank,effort/crank'."""
    order = ",".join(f"{field}/{name}" for field in ("position", "velocity", "effort") for name in joint_names)
    size = 3 * len(joint_names)
    msg = Float64MultiArray()
    msg.layout.dim = [MultiArrayDimension(label=order, size=size, stride=size * size),
                      MultiArrayDimension(label=order, size=size, stride=size)]
    return msg


class Outputs:
    """The node's publishers and what they publish."""

    def __init__(self, node, mech: Mechanism, settings: Settings, qos_overriding: dict):
        self.mech = mech
        self.pub_js = node.create_publisher(JointState, "~/joint_states", OUTPUT_QOS, **qos_overriding)
        self.pub_state = node.create_publisher(JointTrajectory, "~/state", OUTPUT_QOS, **qos_overriding)
        self.pub_markers = node.create_publisher(MarkerArray, "~/markers", OUTPUT_QOS, **qos_overriding)
        # fused mode: the estimated disturbance (applied − commanded effort) by actuator joint name, in `effort`
        self.pub_disturbance = node.create_publisher(JointState, "~/disturbance", OUTPUT_QOS, **qos_overriding)
        # with publish_stddev: the 1σ of ~/joint_states' angle, rate and effort (same names and order)
        self.pub_stddev = (node.create_publisher(JointState, "~/joint_states_stddev", OUTPUT_QOS, **qos_overriding)
                           if settings.publish_stddev else None)
        # the identified actuator parameters by name (joint.parameter): value, 1σ and excitation in position,
        # velocity and effort, so that any JointState plotter shows them
        self.pub_parameters = node.create_publisher(JointState, "~/parameters", OUTPUT_QOS, **qos_overriding)
        self.pub_diag = node.create_publisher(DiagnosticArray, "/diagnostics", OUTPUT_QOS)
        # with smoothed_lag > 0: each estimate again, smoothed by the readings of that many steps after it, with
        # the stamp of its own step (the same messages as ~/joint_states and ~/state)
        self.pub_smoothed = None
        if settings.smoothed_lag:
            self.pub_smoothed = (
                node.create_publisher(JointState, "~/smoothed/joint_states", OUTPUT_QOS, **qos_overriding),
                node.create_publisher(JointTrajectory, "~/smoothed/state", OUTPUT_QOS, **qos_overriding))
        self.js_coords, self.js_names, self.js_effort_index = joint_state_layout(mech)
        # with publish_covariance: the full covariance of ~/joint_states' angle, rate and effort, asked of the
        # node's current core (`EstimatorCore.joint_covariance`) after each estimate
        self.node = node
        self.pub_covariance = None
        if settings.publish_covariance:
            self.pub_covariance = node.create_publisher(Float64MultiArray, "~/joint_states_covariance", OUTPUT_QOS,
                                                        **qos_overriding)
            self._covariance_msg = covariance_message(self.js_names)
        self._listeners_checked_ns = -10 ** 19
        self._listened = (True, True, True)    # (~/state, ~/joint_states, ~/disturbance) have subscribers
        self.forget_markers()
        self.frame_id = None
        self.configure(settings)

    def configure(self, settings: Settings):
        self.publish_markers = settings.publish_markers
        self.marker_period = settings.marker_period
        if settings.frame_id != self.frame_id:
            self.frame_id = settings.frame_id
            self._make_templates()

    def forget_markers(self):
        """After a reset: the next estimate's markers are published."""
        self._last_marker_ns = -10 ** 19

    def _make_templates(self):
        """Serialized templates of the outputs (see `conversions.SerializedTemplate`)."""
        mech, n, nj, frame = self.mech, self.mech.n, len(self.js_coords), self.frame_id
        names, coords = self.js_names, mech.coordinate_names

        def joints():        # ~/joint_states and its 1σ: angle, rate and effort of the same joints
            return rc.SerializedTemplate(lambda st, x: rc.joint_state(st, names, x[:nj], x[nj:2 * nj], x[2 * nj:]),
                                         3 * nj)
        self._templates = (
            joints(),
            rc.SerializedTemplate(lambda st, x: rc.trajectory_state(st, frame, coords, x[:n], x[n:2 * n],
                                                                    x[2 * n:3 * n], x[3 * n:]), 4 * n),
            rc.SerializedTemplate(lambda st, x: rc.mechanism_markers(mech, None, st, frame, xy=x.reshape(-1, 2)),
                                  2 * len(mech.spec.points)),
            rc.SerializedTemplate(lambda st, x: rc.joint_state(st, mech.actuator_names, (), (), x),
                                  len(mech.actuator_names)),
            joints())

    def publish(self, est: Estimate, t_k: int):
        """The estimate of the step at t_k (ns) on ~/state, ~/joint_states, ~/disturbance (when the estimate has
        one: fused mode) and (at most every marker_period) ~/markers."""
        q, v = est.q, est.v
        markers = self.publish_markers and t_k - self._last_marker_ns >= self.marker_period * NS
        if markers:
            self._last_marker_ns = t_k
        if t_k - self._listeners_checked_ns >= LISTENER_CHECK_NS or t_k < self._listeners_checked_ns:
            # a topic nobody subscribes to is not built and written at every step (a new subscriber is
            # served within LISTENER_CHECK_NS)
            self._listeners_checked_ns = t_k
            self._listened = (self.pub_state.get_subscription_count() > 0,
                              self.pub_js.get_subscription_count() > 0,
                              self.pub_disturbance.get_subscription_count() > 0)
        to_state, to_js, to_disturbance = self._listened
        js_tpl, state_tpl, markers_tpl, disturbance_tpl, stddev_tpl = self._templates
        if to_state:
            self.pub_state.publish(state_tpl.fill(t_k, np.concatenate((q, v, est.a, est.Q))))
        if to_js:
            c = self.js_coords
            self.pub_js.publish(js_tpl.fill(t_k, np.concatenate((q[c], v[c], self._joint_efforts(est.efforts)))))
        if self.pub_stddev is not None and est.std is not None:
            c, n = self.js_coords, self.mech.n
            self.pub_stddev.publish(stddev_tpl.fill(t_k, np.concatenate(
                (est.std[c], est.std[n + c], self._joint_efforts(est.efforts_std)))))
        if self.pub_covariance is not None:
            P = self.node.core.joint_covariance(self.js_coords)
            if P is not None:
                msg = self._covariance_msg
                msg.data = P.ravel().tolist()
                self.pub_covariance.publish(msg)
        if to_disturbance and est.disturbance is not None and len(est.disturbance):
            self.pub_disturbance.publish(disturbance_tpl.fill(t_k, np.asarray(est.disturbance, dtype=float)))
        if markers:
            self.pub_markers.publish(markers_tpl.fill(t_k, self.mech.point_positions(q).ravel()))

    def publish_smoothed(self, est: Estimate, t_k: int):
        """The smoothed estimate of the step at t_k (ns) on ~/smoothed/joint_states and ~/smoothed/state."""
        js_tpl, state_tpl = self._templates[0], self._templates[1]
        c = self.js_coords
        js, state = self.pub_smoothed
        js.publish(js_tpl.fill(t_k, np.concatenate((est.q[c], est.v[c], self._joint_efforts(est.efforts)))))
        state.publish(state_tpl.fill(t_k, np.concatenate((est.q, est.v, est.a, est.Q))))

    def _joint_efforts(self, efforts) -> np.ndarray:
        """Per-actuator values (actuator order) on the published joints (0 on an unactuated one)."""
        idx = self.js_effort_index
        eff = np.zeros(len(idx))
        has = idx >= 0
        if np.any(has):
            eff[has] = np.asarray(efforts, dtype=float)[idx[has]]
        return eff

    def parameters_listened(self) -> bool:
        return self.pub_parameters.get_subscription_count() > 0

    def publish_parameters(self, parameters: dict, t_k: int):
        """The identified parameters (`EstimatorCore.parameters`) of the estimate at t_k (ns) on ~/parameters."""
        self.pub_parameters.publish(rc.joint_state(rc.ns_to_stamp(t_k), parameters["names"], parameters["values"],
                                                   parameters["std"], parameters["excitation"]))

    def publish_diagnostics(self, stamp_ns: int, statuses):
        self.pub_diag.publish(rc.encode_diagnostic_array(stamp_ns, statuses))
