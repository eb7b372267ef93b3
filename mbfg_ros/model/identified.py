"""Actuator parameters identified online: a gain, viscous and Coulomb friction, as generalized forces linear in them.

A parameter θ of the actuator on coordinate c (command u, rate q̇_c) acts on the dynamics as the generalized force it
adds beyond what the mechanism file declares (θ₀: the declared friction; a gain of 1):

    gain               (θ − θ₀) · u                        applied effort = gain × command
    viscous_friction  −(θ − θ₀) · q̇_c                      friction b q̇
    coulomb_friction  −(θ − θ₀) · (2/π) atan(q̇_c / v_s) · g  friction c (2/π) atan(q̇/v_s), v_s the actuator's,
                                                            while sliding: g = q̇⁴/(q̇⁴ + v_d⁴), v_d = SLIDING_RATIO v_s

(the identified part of the Coulomb friction acts on sliding only: at rest the estimated rates jitter about 0 by
more than v_s, and the smooth sign's steep slope there, a stiff damper, would be "learnt" from a mechanism that does
not move; the quartic gate at 6 v_s costs the least bias in sliding among those tried: docs/decisions.md), and a
body's payload mass m at a point r = C q + r₀ of it (`at` in the body frame; C constant in natural coordinates)
adds m (Cᵀ g − CᵀC q̈) — its weight and its inertia, exactly: at a solution q̈ = the state's q̈, so the dynamics
factor's (M + m CᵀC) q̈ + Φqᵀλ = Q + m Cᵀ g is the mechanism with the payload; the force then depends on the state's q̈.
Every dynamics path keeps applying the declared friction itself (`model.friction`) and an estimate θ equal to θ₀
changes nothing.  The force is linear in θ: ΔQ = Y(q̇, u) (θ − θ₀), Y one column per parameter (its regressor),
nonzero only in its coordinate's row (a payload's in every row); ∂ΔQ/∂q̇ is diagonal.

ΔQ and its derivatives are the compiled kernel's (`native/_kernel.c`: `identified_add_forces`, the
``identified_dynamics`` unit), their only implementation: this module describes the parameters to it
(`kernel_layout`) and asks it for the forces (`forces`: the prediction's, the seeder's and the reported
efforts'); the numpy reference is in the tests (`test/dynamics_reference.py`).

The prior of a parameter not given in the mechanism's ``identify:`` (value, σ) follows the mechanism's scale
(`default_prior`); its random walk lets it drift by its prior σ in `DRIFT_TIME` seconds (`default_density`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from mbfg_ros import native
from mbfg_ros.model.mechanism import Mechanism
from mbfg_ros.model.plausibility import STANDARD_GRAVITY, mechanism_reach
from mbfg_ros.model.spec import BODY_IDENTIFIABLE, IDENTIFIABLE, IdentifySpec

__all__ = ["IdentifiedParameters", "default_prior", "default_density", "parse_identify", "kind_codes", "KIND_CODES",
           "DRIFT_TIME"]

SLIDING_RATIO = 6.0      # the identified Coulomb part is gated off below ~this many v_s (module docstring)
DRIFT_TIME = 1e5         # [s] a parameter's random walk moves it by its prior σ in this time (default density): a day;
                         # a faster walk forgets what the motion told (docs/decisions.md)
GAIN_SIGMA = 0.2         # a motor's torque constant and gear are known to some 20 %


def kind_codes(table: Dict[str, dict]) -> Dict[str, int]:
    """{kind name: code} from the compiled kernel's table of parameter kinds (`native.parameter_kinds`), whose
    functions give each kind its force; ValueError where the table's actuator and body kinds are not model.spec's
    IDENTIFIABLE and BODY_IDENTIFIABLE (a kind added on one side only)."""
    def listed(kinds):
        return "; ".join(f"{on}: {', '.join(sorted(names)) or 'none'}" for on, names in kinds.items())
    declared = {"actuator": IDENTIFIABLE, "body": BODY_IDENTIFIABLE}
    compiled = {on: tuple(name for name, entry in table.items() if entry["on"] == on) for on in declared}
    if ({on: sorted(names) for on, names in compiled.items()} != {on: sorted(names) for on, names in declared.items()}
            or len(table) != sum(len(names) for names in declared.values())):
        raise ValueError(f"the compiled kernel's parameter kinds ({listed(compiled)}; all: {', '.join(table)}) are "
                         f"not model.spec's ({listed(declared)}): a kind is added to both, _kernel.c's "
                         f"parameter_kinds and model/spec.py, and the kernel rebuilt")
    return {name: int(entry["code"]) for name, entry in table.items()}


KIND_CODES = kind_codes(native.parameter_kinds())     # the compiled kernel's codes of the parameter kinds


def _readonly(a, dtype=float) -> np.ndarray:
    a = np.array(a, dtype=dtype)
    a.setflags(write=False)
    return a


def default_prior(mech: Mechanism, actuator: int, parameter: str) -> Tuple[float, float]:
    """(value, σ) of a parameter without a stated prior: the declared value (a gain: 1, a payload: 0), and σ from the
    mechanism's scale — a payload the mechanism's whole mass; a gain 0.2; Coulomb friction 0.1·M·g·R (a tenth of the whole mass's gravity torque at
    full reach, M·g for a force on a point coordinate); viscous friction that divided by the pendulum rate
    √(g/R) (torque) or √(g·R) (force)."""
    spec = mech.spec
    if parameter == "payload_mass":
        return 0.0, mech.total_mass
    a = spec.actuators[actuator]
    if parameter == "gain":
        return 1.0, GAIN_SIGMA
    reach = mechanism_reach(spec)
    angle = a.coordinate in spec.angle_names
    effort = 0.1 * mech.total_mass * STANDARD_GRAVITY * (reach if angle else 1.0)
    if parameter == "coulomb_friction":
        return float(a.coulomb_friction), effort
    rate = math.sqrt(STANDARD_GRAVITY / reach) if angle else math.sqrt(STANDARD_GRAVITY * reach)
    return float(a.viscous_friction), effort / rate


def default_density(sigma: float) -> float:
    """The random-walk density [unit²/s] of a parameter with prior σ: σ²/DRIFT_TIME."""
    return sigma * sigma / DRIFT_TIME


def parse_identify(entries: Sequence[str], mech: Mechanism) -> Tuple[IdentifySpec, ...]:
    """The estimator's ``identify`` (node parameter, ``mbfg estimate --identify``): ``JOINT.PARAMETER`` entries,
    optionally ``=SIGMA``, as specs: the mechanism's own entry for that parameter where it has one (σ replaced
    where given), else the default prior.  ValueError naming the entry, the actuators and the parameters."""
    declared = {(s.joint, s.parameter): s for s in mech.spec.identify}
    out = []
    seen = set()
    for entry in entries:
        text = str(entry).strip()
        name, sep, sigma_text = text.partition("=")
        joint, dot, parameter = name.strip().rpartition(".")
        if not dot or not joint or parameter not in IDENTIFIABLE + BODY_IDENTIFIABLE:
            raise ValueError(f"identify: '{text[:80]}' is not JOINT.PARAMETER[=SIGMA] with PARAMETER one of "
                             f"{', '.join(IDENTIFIABLE)} (or BODY.{', '.join(BODY_IDENTIFIABLE)})")
        if parameter in BODY_IDENTIFIABLE and (joint, parameter) not in declared:
            raise ValueError(f"identify: '{text[:80]}': a {parameter} is identified where the mechanism's identify: "
                             f"section declares it (its body and point); mechanism '{mech.name}' declares "
                             f"{', '.join(f'{j}.{p}' for j, p in declared if p in BODY_IDENTIFIABLE) or 'none'}")
        if parameter in IDENTIFIABLE and joint not in mech.actuator_names:
            raise ValueError(f"identify: '{text[:80]}': no actuator with joint '{joint[:80]}' in mechanism "
                             f"'{mech.name}' (actuators: {', '.join(mech.actuator_names) or 'none'})")
        if (joint, parameter) in seen:
            raise ValueError(f"identify: '{joint}.{parameter}' is given twice")
        seen.add((joint, parameter))
        spec = declared.get((joint, parameter), IdentifySpec(joint=joint, parameter=parameter))
        if sep:
            try:
                sigma = float(sigma_text)
            except ValueError:
                sigma = float("nan")
            if not (sigma > 0 and math.isfinite(sigma)):
                raise ValueError(f"identify: '{text[:80]}': SIGMA must be a positive number")
            spec = replace(spec, sigma=sigma)
        out.append(spec)
    return tuple(out)


def _payload_selector(mech: Mechanism, body: int, at) -> np.ndarray:
    """C (2, n): the point `at` (body frame: from the body's first point, +X toward its second, +Y to its left, [m])
    of body `body` as r = C q + r₀ (its fixed points in r₀)."""
    b = mech.spec.bodies[body]
    i, j = b.points[0], b.points[1]
    alpha, beta = float(at[0]) / b.length, float(at[1]) / b.length
    P = mech.extended_point_index
    C = np.zeros((2, mech.n))
    # r = (1 − α) p_i + α p_j + β perp(p_j − p_i), perp(x, y) = (−y, x)
    for (cx, cy), w_own, w_perp in ((P[i], 1.0 - alpha, beta), (P[j], alpha, -beta)):
        if cx < mech.n:
            C[0, cx] += w_own
            C[1, cx] -= w_perp
        if cy < mech.n:
            C[1, cy] += w_own
            C[0, cy] += w_perp
    return C


class IdentifiedParameters:
    """The identified parameters of a mechanism (immutable), in the order given: per parameter its name
    (``joint.parameter``), kind, actuator index, coordinate, declared value θ₀, Coulomb rate v_s, prior (value, σ)
    and random-walk density."""

    def __init__(self, mech: Mechanism, specs: Sequence[IdentifySpec]):
        self.mech = mech
        self.specs = tuple(specs)
        names, kinds, actuators, coords, nominal, velocity, mean, sigma, density = ([] for _ in range(9))
        payloads = []
        for j, s in enumerate(specs):
            if s.parameter in BODY_IDENTIFIABLE:
                value, std = default_prior(mech, -1, s.parameter)
                value = value if s.value is None else float(s.value)
                std = std if s.sigma is None else float(s.sigma)
                names.append(f"{s.joint}.{s.parameter}")
                kinds.append(s.parameter)
                actuators.append(0)
                coords.append(0)
                nominal.append(0.0)
                velocity.append(1.0)
                mean.append(value)
                sigma.append(std)
                density.append(default_density(std) if s.density is None else float(s.density))
                payloads.append((j, _payload_selector(mech, s.body, s.at)))
                continue
            i = mech.actuator_names.index(s.joint)
            a = mech.spec.actuators[i]
            value, std = default_prior(mech, i, s.parameter)
            if s.value is not None:
                value = float(s.value)
            if s.sigma is not None:
                std = float(s.sigma)
            names.append(f"{s.joint}.{s.parameter}")
            kinds.append(s.parameter)
            actuators.append(i)
            coords.append(int(mech.actuated[i]))
            nominal.append(1.0 if s.parameter == "gain" else float(getattr(a, s.parameter)))
            velocity.append(float(a.coulomb_velocity))
            mean.append(value)
            sigma.append(std)
            density.append(default_density(std) if s.density is None else float(s.density))
        self.names = tuple(names)
        self.kinds = tuple(kinds)
        self.size = len(names)
        self.actuators = _readonly(actuators, np.intp)
        self.coordinates = _readonly(coords, np.intp)
        self.nominal = _readonly(nominal)
        self.velocity = _readonly(velocity)
        self.gate_velocity = _readonly(SLIDING_RATIO * self.velocity)      # v_d of the Coulomb part's gate
        self.prior_mean = _readonly(mean)
        self.prior_sigma = _readonly(sigma)
        self.density = _readonly(density)
        self.codes = _readonly([KIND_CODES[k] for k in kinds], np.intp)
        self.uses_commands = "gain" in kinds
        #: per payload parameter (its index in θ, C (2, n)): r = C q + r₀ its point
        self.payloads = tuple((j, _readonly(C)) for j, C in payloads)
        self.gravity = _readonly(np.array(mech.spec.gravity, dtype=float))
        # the compiled kernel's description of the parameters (`kernel_layout`)
        self._par = tuple(int(x) for row in zip(self.codes.tolist(), self.coordinates.tolist(),
                                                self.actuators.tolist()) for x in row)
        doubles = [x for row in zip(self.nominal.tolist(), self.velocity.tolist(), self.gate_velocity.tolist())
                   for x in row]
        for _, C in self.payloads:
            doubles += self.gravity.tolist() + C.reshape(-1).tolist()
        self._doubles = _readonly(doubles)

    def __len__(self):
        return self.size

    def describe(self) -> Dict[str, dict]:
        return {n: {"prior": float(m), "sigma": float(s), "density": float(d)}
                for n, m, s, d in zip(self.names, self.prior_mean, self.prior_sigma, self.density)}

    def kernel_layout(self) -> Tuple[tuple, np.ndarray]:
        """(integers, doubles): the parameters as the compiled kernel takes them (an ``identified_dynamics`` unit
        after its efforts' integers, `native.identified_forces`): per parameter its kind code, coordinate and
        actuator; per parameter θ₀, v_s and v_d, then per payload (in θ order) gravity and C's two rows."""
        return self._par, self._doubles

    def _commands(self, commands) -> np.ndarray:
        if not self.uses_commands:
            return np.zeros(0)
        u = np.ascontiguousarray(commands, dtype=float)
        return u if u.size else np.zeros(len(self.mech.actuated))      # (none known: 0)

    def forces(self, theta, v, commands, a=None) -> np.ndarray:
        """ΔQ (n): the parameters' generalized forces beyond the declared model at θ, rates v, commands (actuator
        order; a gain's actuator must have one) and accelerations a (a payload's inertia; None: 0), by the
        compiled kernel (the dynamics unit's own formula)."""
        n = self.mech.n
        out = np.empty(n)
        native.identified_forces(self._par, self._doubles, np.ascontiguousarray(theta, dtype=float),
                                 np.ascontiguousarray(v, dtype=float),
                                 self._commands(commands),
                                 np.zeros(n) if a is None else np.ascontiguousarray(a, dtype=float), out)
        return out
