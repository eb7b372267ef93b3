"""Joint friction of the actuators (`mbfg_ros.model.friction`): the formula, every dynamics path with it (the
Jacobians against finite differences; numpy, the compiled kernel and the all-steps forms agreeing; inverse
dynamics), simulated motions with a known answer, and the estimator's effort being the actuator's own."""

import math

import numpy as np
import pytest
import yaml

import mbfg_ros.factors as F
from mbfg_ros import native
from mbfg_ros.batch.inverse_dynamics import staged_inverse_dynamics
from mbfg_ros.batch.trajectories import closed_form_efforts, closed_form_motion, quintic_move
from mbfg_ros.dynamics import batched
from mbfg_ros.dynamics import constrained as D
from mbfg_ros.dynamics import kinematics as K
from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.model.friction import Friction
from mbfg_ros.model.loader import load_spec_from_string
from mbfg_ros.model.mechanism import Mechanism, load_mechanism, resolve_mechanism_path
from mbfg_ros.sim.plant import Actuator, EffortProfile, SimulatedPlant

# per variant: the shipped file, friction per actuated coordinate, extra actuators
VARIANTS = {
    # a relative angle (third derivatives of the constraints), Coulomb smoothed over 0.3 rad/s
    "crank": ("four_bar_crank", {"crank": {"viscous_friction": 0.7, "coulomb_friction": 2.0,
                                           "coulomb_velocity": 0.3}}, []),
    # a prismatic actuator (a force on the slider's x) beside the crank's torque
    "slider": ("slider_crank", {"crank": {"viscous_friction": 0.2, "coulomb_friction": 0.5},
                                "x2": {"viscous_friction": 1.5, "coulomb_friction": 3.0, "coulomb_velocity": 0.05}},
               [{"coordinate": "x2"}]),
    # redundant constraint rows; friction on one of two actuators
    "robot": ("pick_and_place_robot", {"motor1": {"viscous_friction": 3.0, "coulomb_friction": 8.0,
                                                  "coulomb_velocity": 0.2}}, []),
}
# a friction of about a fifth of the simulated controller's torque (its peak: 117 N·m)
STRONG = ("four_bar_crank", {"crank": {"viscous_friction": 6.0, "coulomb_friction": 10.0,
                                       "coulomb_velocity": 0.3}}, [])


def with_friction(variant) -> Mechanism:
    name, friction, extra = VARIANTS[variant] if isinstance(variant, str) else variant
    doc = yaml.safe_load(resolve_mechanism_path(name).read_text())
    doc["actuators"] = list(doc["actuators"]) + extra
    for a in doc["actuators"]:
        a.update(friction.get(a["coordinate"], {}))
    return Mechanism(load_spec_from_string(yaml.safe_dump(doc, sort_keys=False), f"{name}+friction.yaml"))


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def mech(request):
    return with_friction(request.param)


def states(mech, count, seed, off=1e-3):
    """Poses near the constraint manifold and rates on both sides of the Coulomb smoothing (|q̇| ~ v_s and ≫ v_s),
    with generalized forces."""
    rng = np.random.default_rng(seed)
    for k in range(count):
        q = K.solve_positions(mech, np.array(mech.q0) + 0.05 * rng.standard_normal(mech.n)).q
        q = q + off * rng.standard_normal(mech.n)
        v = rng.standard_normal(mech.n) * (0.1 if k % 2 else 3.0)
        yield q, v, mech.gravity_forces + rng.standard_normal(mech.n)


def _close(a, b, tol=1e-10):
    a, b = np.asarray(a, float), np.asarray(b, float)
    assert a.shape == b.shape
    assert float(np.abs(a - b).max(initial=0.0)) <= tol * max(1.0, float(np.abs(b).max(initial=0.0)))


# -- the formula ------------------------------------------------------------------------------------------------------
def test_friction_formula_slopes_and_the_dfki_form():
    cf, b = 0.093, 0.001
    fr = Friction([1, 3], [b, 0.0], [cf * math.pi / 2, 2.0], [0.01, 0.5])
    rng = np.random.default_rng(0)
    for w in np.concatenate([rng.normal(size=20) * 0.02, rng.normal(size=20) * 5, [0.0]]):
        v = np.array([9.0, w, -9.0, 0.7 * w])
        # DFKI's identified form b·q̇ + cf·atan(100·q̇) is c = cf·π/2, v_s = 0.01
        assert fr.forces(v)[0] == pytest.approx(b * w + cf * math.atan(100 * w), rel=1e-14, abs=1e-300)
        assert fr.forces(v)[1] == pytest.approx(2.0 * (2 / math.pi) * math.atan(0.7 * w / 0.5), rel=1e-14, abs=1e-300)
        h = 1e-7
        dv = np.zeros(4)
        dv[[1, 3]] = h
        fd = (fr.forces(v + dv) - fr.forces(v - dv)) / (2 * h)
        # ∂F/∂q̇ = b + (2c/π)/(v_s (1 + (q̇/v_s)²)), the slope the kernel's dynamics linearization applies
        slopes = np.array([b + cf / 0.01 / (1 + (w / 0.01) ** 2), (4 / math.pi) / 0.5 / (1 + (0.7 * w / 0.5) ** 2)])
        np.testing.assert_allclose(slopes, fd, rtol=1e-6)
    # odd, opposing the motion, and tending to ±c well above v_s
    v = np.array([0.0, 50.0, 0.0, -50.0])
    f = fr.forces(v)
    assert f[0] > 0 > f[1]
    assert fr.forces(np.array([0, 1e9, 0, 1e9]))[1] == pytest.approx(2.0, rel=1e-9)
    # Q − F on the friction coordinates only, one step or many
    Q = rng.normal(size=(5, 4))
    V = rng.normal(size=(5, 4))
    out = fr.applied(Q, V)
    np.testing.assert_array_equal(out[:, [0, 2]], Q[:, [0, 2]])
    np.testing.assert_allclose(out[:, [1, 3]], Q[:, [1, 3]] - fr.forces(V), rtol=1e-15)
    assert fr.describe(3) == {"viscous": 0.0, "coulomb": 2.0, "coulomb_velocity": 0.5} and fr.describe(0) is None


def test_mechanisms_without_friction_have_none():
    for name in ("four_bar", "four_bar_crank", "slider_crank", "pick_and_place_robot", "pendulum"):
        assert load_mechanism(name).friction is None
    mech = with_friction("slider")
    assert mech.friction.columns.tolist() == [mech.coordinate_index("crank"), mech.coordinate_index("x2")]
    assert mech.friction.velocity.tolist() == [0.01, 0.05]          # the documented default, and a given one
    assert mech.describe()["actuator_friction"][1] == {"viscous": 1.5, "coulomb": 3.0, "coulomb_velocity": 0.05}


def test_mbfg_info_prints_each_actuators_friction(tmp_path, capsys):
    from mbfg_ros.cli import commands as cli
    name, friction, extra = VARIANTS["slider"]
    doc = yaml.safe_load(resolve_mechanism_path(name).read_text())
    doc["actuators"] = [dict(a, **friction.get(a["coordinate"], {})) for a in doc["actuators"] + extra]
    path = tmp_path / "slider.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["info", str(path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("actuated"))
    assert ("crank (|effort| ≤ 8971.5 N·m, friction 0.2·q̇ + 0.5·(2/π)·atan(q̇ / 0.01)), "
            "x2 (|effort| ≤ ") in line and "N, friction 1.5·q̇ + 3·(2/π)·atan(q̇ / 0.05))" in line


# -- the dynamics' derivatives ----------------------------------------------------------------------------------------
def _check_fd(J, f, x, h=1e-6):
    """J against central differences of f at x, to 2e-6 of the largest entry plus the differences' rounding
    (f's values of ~1e3 on the robot off its constraints leave ~1e-6 at h = 1e-6; 100 ulps of f: the robot's
    augmented solve loses a few digits to its conditioning, and how many depends on the CPU's OpenBLAS kernels —
    1.6e-5 against 2e-6 + 20 ulps = 9.9e-6 on one machine, within it on another)."""
    cols = []
    for k in range(x.size):
        d = np.zeros(x.size)
        d[k] = h * max(1.0, abs(x[k]))
        cols.append((f(x + d) - f(x - d)) / (2 * d[k]))
    num = np.column_stack(cols)
    rounding = 100 * np.finfo(float).eps * np.abs(f(x)).max() / h
    assert np.abs(J - num).max() <= 2e-6 * max(1.0, np.abs(num).max()) + rounding


@pytest.mark.parametrize("solver", ["augmented", "null_space"])
def test_forward_dynamics_jacobians_match_finite_differences(mech, solver, monkeypatch):
    if solver == "null_space":        # the path taken where the augmented matrix is singular or ill-conditioned
        monkeypatch.setattr(D, "_augmented_solve", lambda *args: None)
    for q, v, Q in states(mech, 6, 1):
        d = D.forward_dynamics_jacobians(mech, q, v, Q)
        _close(d.a, D.forward_dynamics(mech, q, v, Q), 1e-12)
        _check_fd(d.da_dv, lambda w: D.forward_dynamics(mech, q, w, Q), v)
        _check_fd(d.da_dq, lambda p: D.forward_dynamics(mech, p, v, Q), q)
        _check_fd(d.da_dQ, lambda P: D.forward_dynamics(mech, q, v, P), Q)
        # friction is in q̈: without it q̈ differs by ∂q̈/∂Q F
        F_gen = np.zeros(mech.n)
        F_gen[mech.friction.columns] = mech.friction.forces(v)
        _close(D.forward_dynamics(mech, q, v, Q - F_gen), D.forward_dynamics(mech, q, v, Q) - d.da_dQ @ F_gen, 1e-8)


def test_factor_jacobians_match_finite_differences(mech):
    rng = np.random.default_rng(5)
    na = len(mech.actuated)
    for q, v, Q in states(mech, 3, 2):
        a, tau, j = rng.normal(size=mech.n), rng.normal(size=na), rng.normal(size=mech.n)
        units = [(F.ForwardDynamics(mech), [q, v, a], (Q,)), (F.InverseDynamics(mech), [q, v, a, tau], (Q,)),
                 (F.Jerk(mech), [q, v, a, j], (Q, rng.normal(size=mech.n)))]
        for unit, blocks, values in units:
            _, Js = unit.evaluate(*blocks, params=values)
            # the jerk's exact blocks are those of j and q̈ (the others neglect second derivatives of q̈)
            slots = [2, 3] if isinstance(unit, F.Jerk) else range(len(blocks))
            for i in slots:
                def err(x, i=i):
                    b = list(blocks)
                    b[i] = x
                    return unit.evaluate(*b, params=values)[0]
                _check_fd(Js[i], err, blocks[i])


def test_the_compiled_kernel_applies_the_same_friction(mech):
    # the evaluation context (the kernel) against the dense null-space solver of dynamics.constrained
    ctx = EvalContext(mech)
    for q, v, Q in states(mech, 6, 3):
        ref = D.forward_dynamics_jacobians(mech, q, v, Q)
        d = ctx.linearize(q, v, Q)
        for field in ("a", "da_dq", "da_dv", "da_dQ", "multipliers"):
            _close(getattr(d, field), getattr(ref, field))
        _close(ctx.acceleration(q, v, Q + 1.0), D.forward_dynamics(mech, q, v, Q + 1.0))
        _close(ctx.predicted_acceleration(q, v, Q - 1.0), D.forward_dynamics(mech, q, v, Q - 1.0))
        _close(ctx.dynamics(q, v, Q).da_dv, ref.da_dv)


def test_the_kernel_refuses_bad_friction():
    crank = load_mechanism("four_bar_crank")
    form = crank.constraints.native_form()
    args = (crank.n, np.ascontiguousarray(form[0]), np.ascontiguousarray(form[1]), form[2],
            np.ascontiguousarray(crank.mass_matrix), [int(i) for i in crank.independent_rows],
            [int(i) for i in crank.actuated], [])
    with pytest.raises(ValueError, match="friction column out of range or v_s <= 0"):
        native.module().MechanismKernel(*args, [(crank.n, 0.1, 0.2, 0.01)])
    with pytest.raises(ValueError, match="friction column out of range or v_s <= 0"):
        native.module().MechanismKernel(*args, [(0, 0.1, 0.2, 0.0)])
    with pytest.raises(TypeError):
        native.module().MechanismKernel(*args, [(0, 0.1)])


def test_all_steps_forms_match_the_per_step_units(mech):
    N = 12
    qs, vs, Qs = (np.array(x) for x in zip(*states(mech, N, 6)))
    a = np.random.default_rng(7).normal(size=(N, mech.n))
    tau = np.random.default_rng(8).normal(size=(N, len(mech.actuated)))
    keys = [(np.arange(N) * 100 + 10 * s).tobytes() for s in range(4)]
    params = [(Q,) for Q in Qs]
    for units, blocks in (([F.ForwardDynamics(mech)] * N, (qs, vs, a)),
                          ([F.InverseDynamics(mech)] * N, (qs, vs, a, tau))):
        e, Js = type(units[0]).vectorized(units, params)(batched.BatchContext(mech), keys, *blocks)
        for k, unit in enumerate(units):
            e1, J1 = unit.evaluate(*[b[k] for b in blocks], params=params[k])
            _close(e[k], e1, 1e-11)
            for Jb, Jr in zip(Js, J1):
                _close(Jb[k], Jr, 1e-11)


def test_inverse_dynamics_gives_the_actuators_own_efforts(mech):
    rng = np.random.default_rng(9)
    for q, v, _ in states(mech, 4, 10, off=0.0):
        v = K.solve_velocities(mech, q, v_guess=v)
        tau = rng.normal(size=len(mech.actuated)) * 5
        a = D.forward_dynamics(mech, q, v, mech.generalized_forces(tau))
        found = D.inverse_dynamics(mech, q, v, a)
        if len(mech.actuated) == mech.degrees_of_freedom(q):
            _close(found, tau, 1e-8)
            _close(batched.inverse_dynamics_many(mech, q[None], v[None], a[None])[0], tau, 1e-8)
        else:           # more actuators than degrees of freedom: one of the efforts that make the motion
            _close(D.forward_dynamics(mech, q, v, mech.generalized_forces(found)), a, 1e-8)
        z = [int(c) for c in mech.actuated][:mech.degrees_of_freedom(q)]
        _close(D.independent_accelerations(mech, q, v, z, mech.generalized_forces(tau)), a[z], 1e-8)


def test_staged_inverse_dynamics_estimates_the_motor_torque():
    mech = with_friction("crank")
    N, dt = 201, 5e-3
    t = np.arange(N) * dt
    start = np.array(mech.q0)[list(mech.actuated)]
    val, rate, acc = quintic_move(t, start, start + [1.5], 0.0, t[-1])
    res = staged_inverse_dynamics(mech, val, dt)
    q, v, a = closed_form_motion(mech, val, rate, acc)
    ref = closed_form_efforts(mech, q, v, a)                        # with friction (constrained.inverse_dynamics)
    friction = mech.friction.forces(v)
    assert np.abs(friction).max() > 3.0                             # the move is fast enough to matter
    assert np.abs(res.tau - ref).max() < 0.05 * np.abs(friction).max()


# -- simulated motions with a known answer ----------------------------------------------------------------------------
SPINNER = """
name: spinner
gravity: [0, 0]
points:
  - {x: 0, y: 0, fixed: true}
  - {x: 1, y: 0}
planar_bodies:
  - {points: [0, 1], length: 1, mass: 2, I0: 0.8, cog: [0.5, 0]}
relative_coordinates:
  - {type: RelativeAngleAbsoluteDOF, points: [0, 1], name: angle}
actuators:
  - {coordinate: angle, %s}
sensors:
  - {type: encoder, coordinate: angle, sigma: 0.001}
"""


def spin_down(friction_keys: str, omega0: float, seconds: float, dt: float = 1e-3):
    """A bar spinning freely about a fixed point (no gravity, no effort) from ω0: (t, ω)."""
    mech = Mechanism(load_spec_from_string(SPINNER % friction_keys, "spinner.yaml"))
    v0 = np.zeros(mech.n)
    v0[[0, 1, 2]] = [0.0, omega0, omega0]                           # point (1, 0) moving up at ω0·1 m
    profile = EffortProfile(amplitude=np.zeros(1), frequency=np.ones(1), phase=np.zeros(1), kp=np.zeros(1),
                            kd=np.zeros(1), bias=np.zeros(1), theta0=np.zeros(1), gravity_compensation=False)
    plant = SimulatedPlant(mech, dt=dt, seed=0, v0=v0, profile=profile, actuator=Actuator.ideal(mech))
    traj = plant.simulate(seconds)
    return traj.t, traj.v[:, mech.coordinate_index("angle")]


def test_viscous_friction_decays_the_spin_exponentially():
    t, w = spin_down("viscous_friction: 0.4", 3.0, 2.0)
    assert w[0] == pytest.approx(3.0, rel=1e-12)
    np.testing.assert_allclose(w, 3.0 * np.exp(-0.4 / 0.8 * t), rtol=1e-9)


def test_coulomb_friction_decelerates_the_spin_at_a_constant_rate_and_stops_it():
    t, w = spin_down("coulomb_friction: 0.4, coulomb_velocity: 0.001", 2.0, 5.0)
    # c / I0 = 0.5 rad/s²: stops at 4 s (the smoothing's (2/π)·v_s/ω shortfall adds up to ~1e-3 rad/s before)
    moving = t <= 3.5
    np.testing.assert_allclose(w[moving], 2.0 - 0.5 * t[moving], atol=3e-3)
    assert np.abs(w[t >= 4.5]).max() < 1e-3


# -- the estimator --------------------------------------------------------------------------------------------------
def _estimate(mech, traj, mode):
    """The efforts estimated on a simulated run (shipped defaults, the run's commands and readings)."""
    est = FixedLagEstimator(mech, EstimatorConfig(dt=1e-3, mode=mode))
    out = []
    for k in range(len(traj.t)):
        e = est.step(float(traj.t[k]), efforts=traj.efforts[k],
                     observations={nm: float(x[k]) for nm, x in traj.readings.items()})
        out.append(e.efforts.copy())
    return np.array(out)


@pytest.mark.parametrize("mode", ["estimation", "fused"])
def test_the_estimated_effort_is_the_motor_effort(mode):
    """A crank four-bar with joint friction, simulated with an ideal motor: the estimator with the friction in its
    model estimates the motor's torque; one without it estimates the torque left after friction."""
    mech = with_friction(STRONG)
    plain = load_mechanism("four_bar_crank")
    traj = SimulatedPlant(mech, dt=1e-3, seed=2, actuator=Actuator.ideal(mech)).simulate(1.5)
    friction = mech.friction.forces(traj.v)[:, 0]
    motor = traj.applied[:, 0]
    settled = traj.t >= 0.3
    rms = lambda x: float(np.sqrt(np.mean(x[settled] ** 2)))
    with_model = _estimate(mech, traj, mode)[:, 0]
    without = _estimate(plain, traj, mode)[:, 0]
    assert rms(friction) > 10.0
    assert rms(with_model - motor) < 0.25 * rms(friction)
    assert rms(without - (motor - friction)) < 0.25 * rms(friction)
    assert rms(without - motor) > 0.75 * rms(friction)
    # on the same readings the two estimates differ by the friction (their noise is common)
    assert rms(with_model - without - friction) < 0.1 * rms(friction)
