"""The immutable numerical model of a planar mechanism in natural coordinates.

A `Mechanism` is built once from a `MechanismSpec` (or a YAML file) and never changes; every
per-step number lives in plain numpy arrays owned by the caller (the Pinocchio model/data split).

Generalized coordinates: q = [x, y of every moving point, in point order] + [relative angles] + [joint angles]
(the relative angles include the absolute body angles the loader adds for joint angles).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import numpy as np

from mbfg_ros.model.constraints import (ConstraintSet, DistanceConstraints, FixedSliderConstraints,
                                        JointAngleConstraints, MobileSliderConstraints, RelativeAngleConstraints,
                                        numerical_rank)
from mbfg_ros.model.friction import Friction
from mbfg_ros.model.spec import MechanismError, MechanismSpec
from mbfg_ros.share import share_folders


@dataclass(frozen=True)
class Sensor:
    """A sensor resolved against the coordinates: `kind` is 'encoder' or 'gyroscope'."""
    name: str
    kind: str
    sigma: float
    coordinate: int = -1        # encoder: index in q
    body: int = -1              # gyroscope: body index
    single_turn: bool = False   # encoder of an angle that reads it modulo one turn (YAML `turns: single`)


def _readonly(a) -> np.ndarray:
    a = np.array(a, dtype=float)
    a.setflags(write=False)
    return a


class Mechanism:
    """Topology, constant mass matrix, gravity forces and constraint equations of one mechanism."""

    def __init__(self, spec: MechanismSpec):
        self.spec = spec
        self.name = spec.name
        self.gravity = _readonly(spec.gravity)
        pts = spec.points
        self.n_points = len(pts)

        # --- coordinate layout -------------------------------------------------------------
        names, point_columns = [], -np.ones((self.n_points, 2), dtype=np.intp)
        for i, p in enumerate(pts):
            if not p.fixed:
                point_columns[i] = (len(names), len(names) + 1)
                names += [f"x{i}", f"y{i}"]
        self.n_point_coordinates = len(names)
        names += list(spec.angle_names)
        self.coordinate_names: Tuple[str, ...] = tuple(names)
        self.n = len(names)
        if len(set(names)) != len(names):
            raise MechanismError(f"{spec.source}: coordinate names are not unique: {names}")
        self._name_to_index: Dict[str, int] = {nm: k for k, nm in enumerate(names)}
        point_columns.setflags(write=False)
        self.point_columns = point_columns
        # every angle coordinate (absolute body angles, then joint angles): the columns after the point coordinates
        self.relative_angle_columns = np.arange(self.n_point_coordinates, self.n, dtype=np.intp)
        self.relative_angle_columns.setflags(write=False)
        # per joint angle: (its column, θ_child's column, θ_parent's column or −1 for the ground, offset), parents'
        # joints before their children's where the joints form a tree (see `joint_order`)
        self.joint_angle_rows = tuple(
            (self._name_to_index[j.name], self._name_to_index[j.child_angle],
             -1 if j.parent_angle is None else self._name_to_index[j.parent_angle], float(j.offset))
            for j in self.joint_order(spec))

        # Extended coordinate vector qe = [q, coordinates of fixed points]: constraint instances
        # index into it, so a fixed point is just a constant entry.
        fixed_values, ext = [], point_columns.copy()
        for i, p in enumerate(pts):
            if p.fixed:
                ext[i] = (self.n + len(fixed_values), self.n + len(fixed_values) + 1)
                fixed_values += [p.x, p.y]
        self._extended_point_index = ext
        self.fixed_values = _readonly(fixed_values)

        # --- initial pose (the YAML drawing) ---------------------------------------------------
        xy = np.array([[p.x, p.y] for p in pts], dtype=float).reshape(self.n_points, 2)
        q0 = np.zeros(self.n)
        for i in range(self.n_points):
            if point_columns[i, 0] >= 0:
                q0[point_columns[i]] = xy[i]
        for k, r in enumerate(spec.relative_angles):
            d = xy[r.points[1]] - xy[r.points[0]]
            q0[self.n_point_coordinates + k] = math.atan2(d[1], d[0])
        for col, child, parent, offset in self.joint_angle_rows:
            q0[col] = q0[child] - (q0[parent] if parent >= 0 else 0.0) + offset
        self.q0 = _readonly(q0)

        self.constraints = self._build_constraints(xy)
        self.m = self.constraints.m
        self.independent_rows = self._independent_rows(q0)
        self.mass_matrix, self.gravity_forces = self._build_inertia()
        self.total_mass = float(sum(b.mass for b in spec.bodies))

        # --- actuators and sensors -----------------------------------------------------------
        self.actuated = np.array([self.coordinate_index(a.coordinate, "actuators") for a in spec.actuators],
                                 dtype=np.intp)
        self.actuated.setflags(write=False)
        # the same as a slice when consecutive (the usual layout: relative angles last): Q[actuated_index] += τ
        # is then a view's update, cheaper than a fancy-indexed one in a 1-kHz step
        act = self.actuated
        self.actuated_index = (slice(int(act[0]), int(act[-1]) + 1)
                               if act.size and np.array_equal(act, np.arange(act[0], act[-1] + 1)) else act)
        self.actuator_names = tuple(a.joint for a in spec.actuators)
        # per actuator: its declared effort kind (model.spec.EFFORT_KINDS), or None: as the estimator's mode says
        self.actuator_efforts = tuple(a.effort for a in spec.actuators)
        # per actuator: [s] from a command to its application (`estimation.actuator_delay`)
        self.actuator_delays = tuple(float(a.delay) for a in spec.actuators)
        # per actuator: [s] the time constant of its lag after the delay (0: none)
        self.actuator_time_constants = tuple(float(a.time_constant) for a in spec.actuators)
        # per actuator: 1σ of its applied effort about its response to the command, unresolved by any reading
        self.actuator_effort_sigmas = tuple(float(a.effort_sigma) for a in spec.actuators)
        # the actuators' joint friction (None without: the dynamics then skip it at no cost)
        self.friction: Optional[Friction] = Friction.of_actuators(act, spec.actuators)
        sensors = [Sensor(e.name, "encoder", float(e.sigma), coordinate=self.coordinate_index(e.coordinate, "sensors"),
                          single_turn=e.turns == "single") for e in spec.encoders]
        sensors += [Sensor(g.name, "gyroscope", float(g.sigma), body=int(g.body)) for g in spec.gyroscopes]
        self.sensors = tuple(sensors)
        self.assembly_mode_names = tuple(a.name for a in spec.assembly_modes)
        self.assembly_mode_points = np.array([a.points for a in spec.assembly_modes], dtype=np.intp).reshape(-1, 3)
        # per indicator: extended-coordinate columns (x, y) of points i, j, k (for the per-step `assembly_mode`)
        P = self._extended_point_index
        self._mode_cols = [tuple(int(c) for p in pts for c in P[p]) for pts in self.assembly_mode_points.tolist()]
        self._fixed_list = [float(x) for x in self.fixed_values]

    # ------------------------------------------------------------------------------------------
    @staticmethod
    def joint_order(spec: MechanismSpec):
        """The joint angles with every joint whose child is body b before the joints whose parent is b (file order
        otherwise; a loop of joints keeps the file order of its remaining joints)."""
        pending, out = list(spec.joint_angles), []
        while pending:
            children = {j.child for j in pending}
            ready = [j for j in pending if j.parent not in children] or pending[:1]
            for j in ready:
                pending.remove(j)
            out += ready
        return out

    @classmethod
    def from_yaml(cls, path) -> "Mechanism":
        from mbfg_ros.model.loader import load_spec
        return cls(load_spec(path))

    def coordinate_index(self, name: str, where: str = "coordinate") -> int:
        try:
            return self._name_to_index[name]
        except KeyError:
            raise MechanismError(f"{self.spec.source}: {where}: unknown coordinate '{name}' "
                                 f"(known: {', '.join(self.coordinate_names)})") from None

    def point_positions(self, q: np.ndarray) -> np.ndarray:
        """(n_points, 2) positions of all points (fixed ones included) at q."""
        qe = np.concatenate((q, self.fixed_values))
        return qe[self._extended_point_index]

    def position_difference(self, q_a: np.ndarray, q_b: np.ndarray) -> np.ndarray:
        """q_a − q_b with the relative angles' differences in [−π, π): a turn more is the same pose (for
        errors against a reference: an estimate that went once around is not 2π off)."""
        d = np.asarray(q_a, dtype=float) - np.asarray(q_b, dtype=float)
        ang = self.relative_angle_columns
        d[..., ang] = np.remainder(d[..., ang] + np.pi, 2.0 * np.pi) - np.pi
        return d

    def point_velocities(self, v: np.ndarray) -> np.ndarray:
        ve = np.concatenate((v, np.zeros(self.fixed_values.size)))
        return ve[self._extended_point_index]

    # ------------------------------------------------------------------------------------------
    def _build_constraints(self, xy: np.ndarray) -> ConstraintSet:
        spec, P = self.spec, self._extended_point_index
        d_idx, d_names, d_len = [], [], []
        for b, body in enumerate(spec.bodies):
            p = body.points
            pairs = [(0, 1)] + [(a, j) for j in range(2, len(p)) for a in (0, 1)]
            for a, c in pairs:
                i, j = p[a], p[c]
                if self.point_columns[i, 0] < 0 and self.point_columns[j, 0] < 0:
                    continue  # both fixed: the distance holds by construction
                length = body.length if (a, c) == (0, 1) else float(np.linalg.norm(xy[j] - xy[i]))
                d_idx.append([*P[i], *P[j]])
                d_names.append(f"{body.name or 'body%d' % b}:distance({i},{j})")
                d_len.append(length)

        f_idx, f_names, f_org, f_dir = [], [], [], []
        for s in spec.fixed_sliders:
            a, b = np.asarray(s.line[0], float), np.asarray(s.line[1], float)
            f_idx.append(P[s.point])
            f_names.append(f"{s.name}:fixed_slider({s.point})")
            f_org.append(a)
            f_dir.append(b - a)

        m_idx, m_names, m_scale = [], [], []
        for s in spec.mobile_sliders:
            r0, r1 = s.line_points
            m_idx.append([*P[r0], *P[r1], *P[s.point]])
            m_names.append(f"{s.name}:mobile_slider({s.point} on {r0}-{r1})")
            m_scale.append(float(np.linalg.norm(xy[r1] - xy[r0])))

        r_idx, r_names, r_len = [], [], []
        for k, r in enumerate(spec.relative_angles):
            i0, i1 = r.points
            r_idx.append([*P[i0], *P[i1], self.n_point_coordinates + k])
            r_names.append(f"{r.name}:angle({i0}->{i1})")
            r_len.append(float(np.linalg.norm(xy[i1] - xy[i0])))

        joint_rows = {True: ([], [], []), False: ([], [], [])}       # grounded? → (index, names, offsets)
        for col, child, parent, offset in self.joint_angle_rows:
            idx, nm, off = joint_rows[parent < 0]
            idx.append([col, child] if parent < 0 else [col, child, parent])
            nm.append(f"{self.coordinate_names[col]}:joint_angle({self.coordinate_names[child]}"
                      + (f" - {self.coordinate_names[parent]})" if parent >= 0 else ")"))
            off.append(offset)

        types = [
            DistanceConstraints(np.reshape(d_idx, (-1, 4)), d_names, d_len),
            FixedSliderConstraints(np.reshape(f_idx, (-1, 2)), f_names, np.reshape(f_org, (-1, 2)),
                                   np.reshape(f_dir, (-1, 2))),
            MobileSliderConstraints(np.reshape(m_idx, (-1, 6)), m_names, m_scale),
            RelativeAngleConstraints(np.reshape(r_idx, (-1, 5)), r_names, r_len),
        ] + [JointAngleConstraints(np.reshape(idx, (-1, 2 if grounded else 3)), nm, off, grounded)
             for grounded, (idx, nm, off) in joint_rows.items()]
        return ConstraintSet(types, self.n, self.fixed_values)

    def _independent_rows(self, q0: np.ndarray) -> np.ndarray:
        """Rows of Φq kept by the dynamics: redundant rows (e.g. of parallelograms) are dropped.

        A redundant row is implied by the others on the constraint manifold, but a small step off it
        turns the zero singular value into a tiny one, so q̈ through the full Φq would jump.  With a
        full-row-rank subset q̈(q, q̇) is smooth and its derivatives are exact."""
        J = self.constraints.jacobian(q0)
        keep, basis = [], np.zeros((0, self.n))
        for i in range(self.m):
            trial = np.vstack([basis, J[i]])
            if numerical_rank(np.linalg.svd(trial, compute_uv=False)) > len(keep):
                keep.append(i)
                basis = trial
        rows = np.array(keep, dtype=np.intp)
        rows.setflags(write=False)
        return rows

    @staticmethod
    def _body_shape(L: float, xi: float, eta: float) -> np.ndarray:
        """C with r(ξ, η) = (I − C) r_i + C r_j for a material point at (ξ, η) in the body frame."""
        return np.array([[xi, -eta], [eta, xi]]) / L

    def _build_inertia(self):
        """Constant mass matrix and gravity forces: only points[0] and points[1] carry a body's mass,
        which is exact because those two points fix the pose of the rigid body.  A geared motor's rotor adds
        Ir·a·aᵀ, its angle being φ = θ_stator + gear_ratio·q_actuated = aᵀq + const (its kinetic energy
        ½·Ir·(aᵀq̇)², constant in q: exact, coupling included; a balanced rotor adds no gravity force)."""
        n, P = self.n, self.point_columns
        M = np.zeros((n, n))
        Qg = np.zeros(n)
        g = np.asarray(self.spec.gravity, dtype=float)
        I2 = np.eye(2)
        for body in self.spec.bodies:
            i, j = body.points[0], body.points[1]
            L, m, I0 = body.length, body.mass, body.I0
            xg, yg = body.cog
            Cg = self._body_shape(L, xg, yg)
            blocks = {
                (i, i): (m - 2.0 * m * xg / L + I0 / L ** 2) * I2,
                (j, j): (I0 / L ** 2) * I2,
                (i, j): (m / L) * np.array([[xg, -yg], [yg, xg]]) - (I0 / L ** 2) * I2,
            }
            blocks[(j, i)] = blocks[(i, j)].T
            for (a, b), blk in blocks.items():
                if P[a, 0] >= 0 and P[b, 0] >= 0:
                    M[np.ix_(P[a], P[b])] += blk
            if P[i, 0] >= 0:
                Qg[P[i]] += (I2 - Cg).T @ (m * g)
            if P[j, 0] >= 0:
                Qg[P[j]] += Cg.T @ (m * g)
        for act in self.spec.actuators:
            if act.rotor_inertia > 0.0:
                a = np.zeros(n)
                a[self._name_to_index[act.coordinate]] += act.gear_ratio
                if act.stator_angle is not None:
                    a[self._name_to_index[act.stator_angle]] += 1.0
                M += act.rotor_inertia * np.outer(a, a)
        return _readonly(M), _readonly(Qg)

    # ------------------------------------------------------------------------------------------
    def generalized_forces(self, efforts=None, point_forces=None) -> np.ndarray:
        """Q = gravity + actuator efforts (in actuator order) + forces {point index: (Fx, Fy)}: the applied forces,
        without the actuators' friction (a force of the rates, which the dynamics add: `model.friction`)."""
        Q = np.array(self.gravity_forces)
        if efforts is not None:
            efforts = np.asarray(efforts, dtype=float)
            if efforts.shape != (len(self.actuated),):
                raise ValueError(f"expected {len(self.actuated)} actuator efforts, got shape {efforts.shape}")
            Q[self.actuated] += efforts
        for point, force in (point_forces or {}).items():
            cols = self.point_columns[point]
            if cols[0] < 0:
                raise ValueError(f"point {point} is fixed: a force on it does no work")
            Q[cols] += np.asarray(force, dtype=float)
        return Q

    def body_centres_of_mass(self, q: np.ndarray) -> np.ndarray:
        xy = self.point_positions(q)
        out = np.zeros((len(self.spec.bodies), 2))
        for k, body in enumerate(self.spec.bodies):
            ri, rj = xy[body.points[0]], xy[body.points[1]]
            C = self._body_shape(body.length, *body.cog)
            out[k] = ri + C @ (rj - ri)
        return out

    def kinetic_energy(self, v: np.ndarray) -> float:
        return 0.5 * float(v @ self.mass_matrix @ v)

    def potential_energy(self, q: np.ndarray) -> float:
        masses = np.array([b.mass for b in self.spec.bodies])
        return -float(masses @ (self.body_centres_of_mass(q) @ self.gravity))

    def energy(self, q, v) -> float:
        return self.kinetic_energy(v) + self.potential_energy(q)

    def body_angular_rate(self, body: int, q: np.ndarray, v: np.ndarray) -> float:
        """ω of a body from its first two points: (Δ × Δ̇) / |Δ|²."""
        b = self.spec.bodies[body]
        xy, vv = self.point_positions(q), self.point_velocities(v)
        d = xy[b.points[1]] - xy[b.points[0]]
        dd = vv[b.points[1]] - vv[b.points[0]]
        return float((d[0] * dd[1] - d[1] * dd[0]) / (d @ d))

    @property
    def extended_point_index(self) -> np.ndarray:
        """(n_points, 2) columns of each point's x, y in the extended coordinates qe = [q, fixed values]."""
        return self._extended_point_index

    def assembly_mode(self, q: np.ndarray) -> np.ndarray:
        """±1 per assembly-mode indicator: sign of (p_j − p_i) × (p_k − p_i)."""
        if not self._mode_cols:
            return np.zeros(0, dtype=int)
        qe = np.asarray(q, dtype=float).tolist() + self._fixed_list      # a handful of indicators: plain floats
        out = []
        for xi, yi, xj, yj, xk, yk in self._mode_cols:
            x0, y0 = qe[xi], qe[yi]
            ax, ay, bx, by = qe[xj] - x0, qe[yj] - y0, qe[xk] - x0, qe[yk] - y0
            out.append(1 if ax * by - ay * bx >= 0.0 else -1)
        return np.array(out)

    def constraint_rank(self, q: Optional[np.ndarray] = None) -> int:
        """The numerical rank of Φq at q (default: the drawn pose q0)."""
        if not self.m:
            return 0
        J = self.constraints.jacobian(np.array(self.q0 if q is None else q, dtype=float))
        return numerical_rank(np.linalg.svd(J, compute_uv=False))

    def degrees_of_freedom(self, q: Optional[np.ndarray] = None) -> int:
        """n minus the rank of Φq at q (default: the drawn pose q0)."""
        return self.n - self.constraint_rank(q)

    def describe(self) -> dict:
        """Summary used by `mbfg info`."""
        from mbfg_ros.model.plausibility import InputLimits, mechanism_scale   # (it reads a Mechanism)
        limits = InputLimits(self)
        Phi, J = self.constraints.phi_and_jacobian(np.array(self.q0))
        rank = self.constraint_rank()
        return {
            "name": self.name,
            "source": self.spec.source,
            "n": self.n,
            "m": self.m,
            "rank": rank,
            "dof": self.n - rank,
            "coordinates": list(self.coordinate_names),
            "actuated": [self.coordinate_names[i] for i in self.actuated],
            "actuator_joints": list(self.actuator_names),
            "actuator_efforts": list(self.actuator_efforts),     # declared kinds (None: the estimator's mode)
            "actuator_delays": list(self.actuator_delays),       # [s] from a command to its application
            "actuator_time_constants": list(self.actuator_time_constants),   # [s] its lag after the delay
            "actuator_effort_sigmas": list(self.actuator_effort_sigmas),     # its command's precision as an effort
            # per actuator: {viscous, coulomb, coulomb_velocity} of its friction, or None
            "actuator_friction": [None if self.friction is None else self.friction.describe(int(c))
                                  for c in self.actuated],
            # per actuator: {gear_ratio, rotor_inertia} of a geared motor with a rotor inertia, or None
            "actuator_motor": [{"gear_ratio": a.gear_ratio, "rotor_inertia": a.rotor_inertia}
                               if a.rotor_inertia > 0.0 or a.gear_ratio != 1.0 else None for a in self.spec.actuators],
            "effort_limits": limits.effort_limits.tolist(),      # the YAML's effort_limit or the default
            "effort_units": list(limits.effort_units),
            "sensors": [{"name": s.name, "type": s.kind, "sigma": s.sigma,
                         **({"coordinate": self.coordinate_names[s.coordinate],
                             "turns": "single" if s.single_turn else "multi"} if s.kind == "encoder"
                            else {"body": s.body, "max_rate": limits.max_rates[s.name]})} for s in self.sensors],
            "assembly_modes": {nm: int(v) for nm, v in zip(self.assembly_mode_names, self.assembly_mode(self.q0))},
            "mass": self.total_mass,
            "scale": dict(zip(("effort", "time"), mechanism_scale(self.spec))),
            "gravity": list(map(float, self.gravity)),
            "constraint_residual": float(np.abs(Phi).max(initial=0.0)),
            "pose_consistent": bool(np.abs(Phi).max(initial=0.0) < 1e-9),
        }


def load_mechanism(path) -> Mechanism:
    """Load a mechanism YAML file; a bare name looks in the package's `mechanisms/` folder."""
    return Mechanism.from_yaml(resolve_mechanism_path(path))


def resolve_mechanism_path(path) -> Path:
    p = Path(path)
    if p.exists():
        return p
    for folder in _mechanism_folders():
        for cand in (folder / p.name, folder / f"{p.name}.yaml"):
            if cand.exists():
                return cand
    raise MechanismError(f"{path}: mechanism file not found (looked in the current folder and "
                         f"{', '.join(str(f) for f in _mechanism_folders())})")


def _mechanism_folders():
    return [f for f in share_folders("mechanisms") if f.is_dir()]
