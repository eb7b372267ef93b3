"""The estimator's collaborators, each on its own concern: the effort models, the sensors and the
innovation gate, the seed value and the seeder, the step factors (layout, predictor, model cache)."""

import copy

import numpy as np
import pytest

from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.dynamics.coordinates import choose_independent
from mbfg_ros.estimation.config import Estimate, EstimatorConfig
from mbfg_ros.estimation.efforts import CommandedEfforts, FusedEfforts, UnknownEfforts, effort_model
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.estimation.seeding import MAX_EXTRAPOLATION, Seed, Seeder, extrapolated
from mbfg_ros.estimation.sensors import (UNCONFIRMED_REJECTIONS, InnovationGate, ReadingsDisagree, Sensors,
                                         observations_in)
from mbfg_ros.estimation.step_factors import (DependentFactors, DependentHermiteFactors, IndependentFactors,
                                              IndependentHermiteFactors, step_factors)
from mbfg_ros.factors.noise import default_sigmas


def _sigmas():
    return default_sigmas()


# -- effort models ---------------------------------------------------------------------------------
def test_effort_model_per_mode(crank):
    s = _sigmas()
    assert type(effort_model("forward_dynamics", crank, s, False)) is CommandedEfforts
    assert type(effort_model("estimation", crank, s, False)) is UnknownEfforts
    assert type(effort_model("fused", crank, s, False)) is FusedEfforts
    with pytest.raises(ValueError):
        effort_model("bogus", crank, s, False)


def test_commanded_efforts_are_forces_and_rates_are_backward_differences(crank):
    m = CommandedEfforts(crank, _sigmas(), rates=True)
    E = crank.actuated
    h, slope = 1e-3, 3.0
    Q, Qdot, prior = m.forces(np.array([np.nan]), h)           # unknown = 0
    assert prior is None and np.array_equal(Q, crank.gravity_forces)
    assert np.array_equal(Qdot, np.zeros(crank.n))             # no history yet
    m.restart()
    rates = []
    for k in range(4):
        Q, Qdot, _ = m.forces(np.array([1.0 + slope * k * h]), h)
        assert Q[E][0] == pytest.approx(crank.gravity_forces[E][0] + 1.0 + slope * k * h)
        rates.append(Qdot[E][0])
    # a ramp: 0 (no history), first order, then second order: all but the first are exact
    assert rates[0] == 0.0 and rates[1:] == pytest.approx([slope] * 3, rel=1e-9)
    assert CommandedEfforts(crank, _sigmas(), rates=False).forces(np.array([1.0]), h)[1] is None


def test_early_rates_correct_the_first_steps_of_a_ramp(crank):
    m = CommandedEfforts(crank, _sigmas(), rates=True)
    E, h, slope = crank.actuated, 1e-3, -2.0
    m.restart()
    m.forces(np.array([0.5]), h)          # the seed
    m.seeded()
    m.forces(np.array([0.5 + slope * h]), h)
    (r0,) = m.early_rates(1, h)
    assert r0[E][0] == pytest.approx(slope)
    m.forces(np.array([0.5 + 2 * slope * h]), h)
    r0, r1 = m.early_rates(2, h)
    assert r0[E][0] == pytest.approx(slope) and r1[E][0] == pytest.approx(slope)
    m.forces(np.array([0.5 + 3 * slope * h]), h)
    assert m.early_rates(3, h) is None
    assert UnknownEfforts(crank, _sigmas(), rates=True).early_rates(1, h) is None   # no commanded rates


def test_unknown_efforts_are_an_integrated_random_walk_state(crank):
    s = _sigmas()
    m = UnknownEfforts(crank, s, rates=False)
    assert m.has_state
    Q, Qdot, prior = m.forces(np.array([5.0]), 1e-3)          # commanded efforts ignored
    assert prior is None and Qdot is None and np.array_equal(Q, crank.gravity_forces)
    (walk,) = m.transition_units(4e-3)
    assert walk.slots == ("tau_prev", "tau", "tau_rate_prev", "tau_rate")
    assert walk.dt == 4e-3 and np.array_equal(walk.density, [s["effort_density"]])
    tau0, Q0 = m.seed(np.array([5.0]), None)
    assert np.array_equal(tau0, [0.0]) and np.array_equal(Q0, crank.gravity_forces)
    tau0, _ = m.seed(np.array([5.0]), np.array([np.nan]))     # a non-finite guess counts as 0
    assert np.array_equal(tau0, [0.0])
    p, pr = m.seed_units(np.array([1.5]))
    assert p.slots == ("tau",) and p.sigmas[0] == s["initial_effort"]
    assert pr.slots == ("tau_rate",) and pr.sigmas[0] == s["initial_effort_rate"] and np.array_equal(pr.mean, [0])
    assert np.array_equal(m.reported(np.array([2.0]), np.array([5.0])), [2.0])
    assert m.disturbance(np.array([2.0])) is None


def test_fused_efforts_are_commands_plus_a_disturbance_state(robot):
    s = _sigmas()
    m = FusedEfforts(robot, s, rates=False)
    E = robot.actuated
    na = len(E)
    assert na >= 2 and m.has_state
    efforts = np.full(na, np.nan)
    efforts[1] = 0.7
    Q, Qdot, prior = m.forces(efforts, 1e-3)                  # the known forces: gravity + commands (unknown 0)
    assert prior is None and Qdot is None
    expected = robot.gravity_forces.copy()
    expected[E[1]] += 0.7
    assert np.array_equal(Q, expected)
    (walk,) = m.transition_units(1e-3)
    assert walk.slots == ("tau_prev", "tau", "tau_rate_prev", "tau_rate")
    assert np.array_equal(walk.density, [s["disturbance_density"]] * na)
    assert walk.time_constant == s["disturbance_time_constant"]
    d = np.arange(1.0, na + 1)
    assert np.array_equal(m.reported(d, efforts), np.where(np.isfinite(efforts), efforts, 0.0) + d)
    assert np.array_equal(m.disturbance(d), d)
    # a seed from an estimate's applied efforts: the disturbance is applied − commanded
    d0, Q0 = m.seed(efforts, np.ones(na))
    assert d0[1] == pytest.approx(0.3) and np.all(np.delete(d0, 1) == 1.0)
    assert np.allclose(Q0[E], 1.0) and np.allclose(np.delete(Q0, E), np.delete(robot.gravity_forces, E))


def test_efforts_argument_is_checked(crank):
    m = CommandedEfforts(crank, _sigmas(), rates=False)
    assert np.isnan(m.efforts_in(None)).all()
    with pytest.raises(ValueError, match="expected 1 efforts"):
        m.efforts_in([1.0, 2.0])
    given = np.array([0.5])
    e = m.efforts_in(given)
    assert e.tolist() == [0.5] and e is not given             # the estimator's own copy
    assert m.efforts_in(0.25).tolist() == [0.25] and m.efforts_in([[0.75]]).tolist() == [0.75]


@pytest.mark.parametrize("mech", ["crank", "robot"])
def test_added_efforts_are_the_sums_on_the_actuated_coordinates(mech, request):
    """`add_efforts` (entry by entry) gives exactly the numbers of numpy's indexed add on the actuated entries,
    which the estimates were made with before, non-finite ones included."""
    mech = request.getfixturevalue(mech)
    m = FusedEfforts(mech, _sigmas(), rates=False)
    rng = np.random.default_rng(3)
    for scale in (1e-300, 1e-3, 1.0, 1e5, 1e300):
        base = rng.normal(size=mech.n) * scale
        tau = rng.normal(size=m.na) * scale
        expected = base.copy()
        expected[mech.actuated] += tau
        got = m.add_efforts(base, tau)
        assert got.tolist() == expected.tolist() and got is not base
    tau = np.full(m.na, np.inf)
    tau[0] = np.nan
    expected = np.zeros(mech.n)
    expected[mech.actuated] += tau
    np.testing.assert_array_equal(m.add_efforts(np.zeros(mech.n), tau), expected)


# -- sensors and the innovation gate ---------------------------------------------------------------
def test_sensor_units_of_a_step(crank):
    sensors = Sensors(crank, EstimatorConfig(mode="estimation"), _sigmas())
    obs = {"q:x1": 0.1, "coupler_gyro": 0.2, "crank": 0.3, "bogus": 1.0, "v:nothing": 2.0}
    values = {}
    units = sensors.step_units(obs, values)
    # named sensors in the mechanism's order, then generic readings sorted; unknown names left out
    assert [u.name for u in units] == ["encoder(crank)", "gyroscope(body 1)", "observed_q(x1)"]
    assert [values[u]["value"] for u in units] == [0.3, 0.2, 0.1]
    assert [u.value for u in units] == [0.0, 0.0, 0.0]          # the readings are passed, not set
    assert sensors.unknown(obs) == ["bogus", "v:nothing"]
    assert sensors.unknown({"crank": 0.3, "coupler_gyro": 0.2}) == [] == sensors.unknown({"q:x1": 0.1})
    assert sensors.read_coordinate_indices(obs) == sorted({crank.coordinate_index("crank"),
                                                          crank.coordinate_index("x1")})
    twin = Sensors(crank, EstimatorConfig(mode="forward_dynamics"), _sigmas())
    assert twin.step_units(obs, {}) == [] and not twin.observed(obs)
    assert observations_in({"a": None, "b": float("nan"), "c": "x", "d": 1}) == {"d": 1.0}
    got = observations_in({"e": np.float64(0.5), "f": float("inf"), 7: 2.5, "g": True, "h": "3.5"})
    assert got == {"e": 0.5, "7": 2.5, "g": 1.0, "h": 3.5} and all(type(v) is float for v in got.values())


def test_substeps_of_a_gap(crank):
    est = FixedLagEstimator(crank, EstimatorConfig(dt=1e-3, window=5))
    est.step(0.0)
    stepper = est.stepper
    assert stepper.substeps(1e-3) == (1, 1e-3)                 # the usual step: exactly dt
    assert stepper.substeps(1e-3 + 1e-10) == (1, 1e-3)         # jitter within 1e-6 dt
    assert stepper.substeps(1.2e-3) == (1, 1.2e-3)
    nsub, h = stepper.substeps(3.1e-3)
    assert nsub == 3 and h == pytest.approx(3.1e-3 / 3, rel=1e-15)


def _encoder_gate(crank, **config):
    cfg = EstimatorConfig(mode="estimation", **config)
    sensors = Sensors(crank, cfg, _sigmas())
    enc = sensors.units["crank"]
    gate = InnovationGate(cfg)
    c = enc.coordinate

    def whitened_at(q_c):
        q = np.zeros(crank.n)
        q[c] = q_c
        return lambda u: u.error(q, params=(0.0,)) / u.sigmas

    return gate, enc, whitened_at


def test_gate_rejects_outliers_then_believes_a_persistent_sensor(crank):
    gate, enc, whitened_at = _encoder_gate(crank, outlier_gate=100.0, max_rejections=3)
    sigma = enc.sigmas[0]
    assert enc.value == 0.0
    assert gate.screen([enc], whitened_at(10 * sigma), 1) == [enc]
    for k in range(2, 5):                     # three rejections ...
        assert gate.screen([enc], whitened_at(500 * sigma), k) == []
    assert gate.take_rejected() == [f"{enc.name} (500 σ)"] * 3 and gate.take_rejected() == []
    with pytest.raises(ReadingsDisagree, match="for 4 steps"):      # ... then the readings win
        gate.screen([enc], whitened_at(500 * sigma), 5)
    assert gate.rejections == {}
    # an accepted reading resets the count
    gate.screen([enc], whitened_at(500 * sigma), 6)
    gate.screen([enc], whitened_at(0.0), 7)
    assert gate.rejections == {}


def test_gate_after_an_outage_and_for_unconfirmed_sensors(crank):
    gate, enc, whitened_at = _encoder_gate(crank, outlier_gate=100.0, max_rejections=50, outage_steps=20)
    sigma = enc.sigmas[0]
    assert enc.value == 0.0
    gate.screen([enc], whitened_at(0.0), 1)
    with pytest.raises(ReadingsDisagree, match="after 30 steps without a reading"):
        gate.screen([enc], whitened_at(500 * sigma), 31)
    gate.reset()
    gate.restart({enc.name})                  # the seed was a guess without this sensor's reading
    for k in range(1, UNCONFIRMED_REJECTIONS + 1):
        gate.screen([enc], whitened_at(500 * sigma), k)
    with pytest.raises(ReadingsDisagree, match="the start was a guess"):
        gate.screen([enc], whitened_at(500 * sigma), UNCONFIRMED_REJECTIONS + 1)
    gate.restart({enc.name})
    gate.screen([enc], whitened_at(0.0), 1)   # confirmed: the full max_rejections apply again
    assert enc.name not in gate.unconfirmed


def test_late_readings_share_the_gate_bookkeeping(crank):
    gate, enc, whitened_at = _encoder_gate(crank, outlier_gate=100.0, max_rejections=2, outage_steps=20)
    sigma = enc.sigmas[0]
    assert enc.value == 0.0
    gate.screen([enc], whitened_at(0.0), 1)
    # refused late readings count towards max_rejections of the on-time ones
    assert gate.screen_late([enc], np.array([500.0]), 2) == [False]
    assert gate.screen_late([enc], np.array([500.0]), 3) == [False]
    with pytest.raises(ReadingsDisagree):
        gate.screen([enc], whitened_at(500 * sigma), 4)
    # a sensor read late is not silent: no outage
    gate.reset()
    gate.screen([enc], whitened_at(0.0), 1)
    assert gate.screen_late([enc], np.array([3.0]), 25) == [True]
    assert gate.screen([enc], whitened_at(500 * sigma), 30) == []      # rejected, not an outage
    off = InnovationGate(EstimatorConfig(outlier_gate=0.0))
    assert not off.enabled and off.screen_late([enc], np.array([1e9]), 1) == [True]


# -- seeds -------------------------------------------------------------------------------------------
def _estimate(t, q, v, a):
    n = q.size
    return Estimate(t, q, v, a, np.zeros(n), np.zeros(1), np.ones(1), 0.0, 0.0)


def test_seed_values():
    q, v, a = np.array([1.0, 2.0]), np.array([0.5, -1.0]), np.array([2.0, 0.0])
    last = _estimate(1.0, q, v, a)
    gap = 0.5 * MAX_EXTRAPOLATION
    s = Seed.extrapolated(last, 1.0 + gap)
    assert np.allclose(s.q, q + gap * v + 0.5 * gap ** 2 * a) and np.allclose(s.v, v + gap * a)
    assert s.v_uncertain and s.fix_readings and not s.from_estimate
    qf, vf = extrapolated(last, 1.0 + 2 * MAX_EXTRAPOLATION)      # too long a gap: the last estimate
    assert qf is q and vf is v
    assert extrapolated(last, 0.5)[0] is q                          # (backwards too)
    s = Seed.at_estimate(last)
    assert s.from_estimate and not s.v_uncertain and s.q is q and s.tau is last.efforts
    r = Seed.requested(q + 1.0, last, None)
    assert r.from_estimate and not r.fix_readings and np.array_equal(r.q, q + 1.0) and r.v is v


def _seeder(mech, cfg):
    cfg = cfg.validated()
    s = _sigmas()
    ctx = EvalContext(mech)
    efforts = effort_model(cfg.mode, mech, s, cfg.integrator == "hermite")
    sensors = Sensors(mech, cfg, s)
    gate = InnovationGate(cfg)
    factors = step_factors(mech, cfg, s, efforts, ctx)
    return Seeder(mech, cfg, s, sensors, gate, factors, efforts, ctx, 1e-3), gate, factors


def test_seeder_holds_the_readings_and_marks_silent_sensors_unconfirmed(crank):
    seeder, gate, factors = _seeder(crank, EstimatorConfig(mode="estimation"))
    c = crank.coordinate_index("crank")
    reading = 0.4
    window, x = seeder.seed(Seed(np.array(crank.q0, dtype=float)), np.full(1, np.nan), {"crank": reading}, None)
    q = factors.layout.get(x, "q")
    assert q[c] == pytest.approx(reading, abs=1e-6)
    assert np.abs(crank.constraints.phi(q)).max() < 1e-6 and seeder.init_residual < 1e-9
    assert window.steps == 1 and gate.unconfirmed == {"gyroscope(body 1)"}
    # a seed at an estimate keeps the gate's confidence; without fix_readings the reading does not move q
    window, x = seeder.seed(Seed(q, fix_readings=False, from_estimate=True), np.full(1, np.nan),
                            {"crank": reading + 0.2}, None)
    assert gate.unconfirmed == set()
    assert factors.layout.get(x, "q")[c] == pytest.approx(reading, abs=1e-3)


def test_seeder_start_guesses(crank):
    seeder, _, _ = _seeder(crank, EstimatorConfig())
    seeder.v0 = np.ones(crank.n)
    assert np.array_equal(seeder.initial_guess(), crank.q0)
    assert seeder.fresh(True).v is seeder.v0 and seeder.fresh(False).v is None
    seeder.pending_q = np.full(crank.n, 0.25)
    assert np.array_equal(seeder.initial_guess(), seeder.pending_q) and seeder.initial_guess() is not seeder.pending_q


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if a is None or b is None:
        return a is b
    return np.array_equal(a, b)


# -- step factors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("formulation,integrator,cls,blocks", [
    ("dependent", "trapezoidal", DependentFactors, ["q", "v", "a", "tau", "tau_rate"]),
    ("dependent", "hermite", DependentHermiteFactors, ["q", "v", "a", "tau", "tau_rate"]),
    ("independent", "euler", IndependentFactors, ["q", "v", "a", "z", "zd", "zdd", "tau", "tau_rate"]),
    ("independent", "hermite", IndependentHermiteFactors, ["q", "v", "a", "z", "zd", "zdd", "zj", "tau", "tau_rate"])])
def test_step_factors_per_formulation_and_integrator(crank, formulation, integrator, cls, blocks):
    est = FixedLagEstimator(crank, EstimatorConfig(mode="fused", formulation=formulation, integrator=integrator))
    e = est.step(0.0, efforts=[0.5], observations={"crank": 0.3})
    factors = est.factors
    assert type(factors) is cls and [b for b, _ in factors.layout.blocks] == blocks
    est.step(1e-3, efforts=[0.5], observations={"crank": 0.3})
    x = est.stepper.x
    x_before = x.copy()
    units = factors.integrators(1e-3) + factors.kinematics + [factors.dynamics]
    params = copy.deepcopy([[getattr(u, p) for p in u.params] for u in units])
    values, prior = factors.step_values(np.array([0.5]), 1e-3, est.window)
    p1, offset1 = factors.predict(x, 1e-3, est.stepper.a_prev, est.stepper.h_prev, values)
    p2, offset2 = factors.predict(x, 1e-3, est.stepper.a_prev, est.stepper.h_prev, values)
    # neither the step values nor the predictor change anything: not the state, not a unit's parameters
    assert np.array_equal(x, x_before) and np.array_equal(p1, p2)
    assert _same(params, [[getattr(u, p) for p in u.params] for u in units])
    n = crank.n
    assert (offset1 is None) == (formulation == "dependent")
    if offset1 is not None:
        assert np.allclose(offset1, p1[:n] - x[:n])
    # one step ahead at dt: close to the estimate that follows
    e2 = est.step(2e-3, efforts=[0.5], observations={"crank": 0.3})
    assert np.abs(p1[:n] - e2.q).max() < 1e-4
    # the model of a combination of units is built once
    readings = est.sensors.step_units({"crank": 0.3}, values)
    assert factors.model(1e-3, prior, readings) is factors.model(1e-3, prior, readings)
    assert factors.model(1e-3, prior, []) is not factors.model(1e-3, prior, readings)
    assert e.status == "initialized"


def test_independent_coordinates_better_conditioned_elsewhere(crank):
    est = FixedLagEstimator(crank, EstimatorConfig(formulation="independent"))
    est.step(0.0)
    factors = est.factors
    q = est.last.q
    assert factors.better_coordinates(q) is None          # chosen here: the best
    best, N = choose_independent(crank, q, return_basis=True)
    worst = int(np.argmin(np.abs(N[:, 0])))               # (x1 at the drawn pose: N[x1] = 0)
    factors.restart(np.array([worst]))
    assert np.array_equal(np.sort(factors.better_coordinates(q)), np.sort(best))
    assert FixedLagEstimator(crank, EstimatorConfig(formulation="independent", independent=("x1",))
                             ).factors.better_coordinates(q) is None      # given coordinates stay
