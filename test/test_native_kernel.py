"""The compiled kernel (mbfg_ros.native) against the numpy forms it replaces: the mechanism's dynamics
linearization, q̈ and Φ; a whole step's whitened linearization, right-hand side and relinearization mismatch for
every unit type it knows; whole estimator runs with and without it; the fallbacks (unknown units, singular
dynamics) and the errors of wrong inputs."""

import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import mbfg_ros.factors as F
from mbfg_ros import native
from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.dynamics.constrained import forward_dynamics, forward_dynamics_jacobians
from mbfg_ros.dynamics.kinematics import solve_positions
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.graph.layout import StateLayout
from mbfg_ros.graph.step_model import StepModel
from mbfg_ros.model.identified import KIND_CODES, IdentifiedParameters, kind_codes
from mbfg_ros.model.mechanism import load_mechanism
from mbfg_ros.model.spec import BODY_IDENTIFIABLE, IDENTIFIABLE, IdentifySpec
from mbfg_ros.sim.plant import Actuator, SimulatedPlant

sys.path.insert(0, os.path.dirname(__file__))
import dynamics_reference as DR  # noqa: E402

MECHANISMS = ["four_bar", "four_bar_crank", "pendulum", "pendulum_nary", "pick_and_place_robot", "slider_crank",
              "double_pendulum_a0"]

def test_the_kernel_is_compiled_from_this_source():
    # setup.py compiles the SHA-256 of _kernel.c into the kernel: a kernel built from other sources (a stale
    # build, an install of another checkout, a colcon workspace that tests what it did not install) fails here
    source = Path(__file__).resolve().parents[1] / "mbfg_ros" / "native" / "_kernel.c"
    assert native.SOURCE_SHA256 == hashlib.sha256(source.read_bytes()).hexdigest(), (
        f"the kernel {native.module().__file__} was compiled from other sources than {source} "
        f"(rebuild: make venv, pip install -e ., or colcon build)")


class ReferenceContext(EvalContext):
    """The evaluation context with the dynamics of `dynamics.constrained` (the dense null-space solver) instead of
    the kernel's, and the dynamics units' numpy references (test/dynamics_reference.py) instead of their kinds in
    the kernel: the reference the kernel's LU route and step are compared with."""

    __slots__ = ()

    def unit_program(self, unit, widths):
        if unit.kernel_kind in DR.REFERENCES:
            return DR.ReferenceProgram(self, unit)
        return super().unit_program(unit, widths)

    def linearize(self, q, v, Q):
        return forward_dynamics_jacobians(self.mech, q, v, Q)

    def acceleration(self, q, v, Q):
        return forward_dynamics(self.mech, q, v, Q)

    def predicted_acceleration(self, q, v, Q):
        return forward_dynamics(self.mech, q, v, Q)


def _configurations(mech, count, seed):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        q = solve_positions(mech, np.array(mech.q0) + 0.005 * rng.standard_normal(mech.n)).q
        yield q, rng.standard_normal(mech.n), mech.gravity_forces + rng.standard_normal(mech.n)


def _close(a, b, tol=1e-10):
    a, b = np.asarray(a, float), np.asarray(b, float)
    assert a.shape == b.shape
    scale = max(1.0, float(np.abs(b).max(initial=0.0)))
    assert float(np.abs(a - b).max(initial=0.0)) <= tol * scale


@pytest.mark.parametrize("name", MECHANISMS)
def test_dynamics_linearization_matches_numpy(name):
    mech = load_mechanism(name)
    compiled, reference = EvalContext(mech), ReferenceContext(mech)
    assert compiled.native is not None
    for q, v, Q in _configurations(mech, 8, 3):
        d1, d2 = compiled.linearize(q, v, Q), reference.linearize(q, v, Q)
        for field in ("a", "da_dq", "da_dv", "da_dQ", "multipliers", "Phi_q", "Phi_q_dot"):
            _close(getattr(d1, field), getattr(d2, field))
        _close(compiled.acceleration(q, v, Q + 1.0), reference.acceleration(q, v, Q + 1.0))
        _close(compiled.predicted_acceleration(q, v, Q - 1.0), reference.predicted_acceleration(q, v, Q - 1.0))
        off = q + 0.01
        assert compiled.constraint_residual(off) == pytest.approx(np.abs(mech.constraints.phi(off)).max(), rel=1e-12)


def test_kinematics_match_numpy(crank):
    kernel = native.mechanism_kernel(crank)
    for q, v, _ in _configurations(crank, 5, 4):
        phi, J, Jd = np.empty(crank.m), np.empty((crank.m, crank.n)), np.empty((crank.m, crank.n))
        kernel.phi_and_jacobian(q, phi, J)
        kernel.jacobian_dot(q, v, Jd)
        phi_ref, J_ref = crank.constraints.phi_and_jacobian(q)
        _close(phi, phi_ref, 1e-13)
        _close(J, J_ref, 1e-13)
        _close(Jd, crank.constraints.jacobian_dot(q, v), 1e-13)


def _layout(mech, na):
    n = mech.n
    return StateLayout([("q", n), ("v", n), ("a", n), ("tau", na), ("theta", len(native.parameter_kinds())),
                        ("deflection", 2)])


#: how a parameter of each kind of the kernel's table is placed on the crank four-bar, by what it is a parameter of
#: (its actuator; the coupler, off its axis); a new "on" fails `_one_parameter_of_each_kind`
PARAMETER_PLACES = {"actuator": lambda mech, kind: IdentifySpec(joint=mech.actuator_names[0], parameter=kind),
                    "body": lambda mech, kind: IdentifySpec(joint="coupler", parameter=kind, body=1, at=(0.2, -0.05))}


def _one_parameter_of_each_kind(mech):
    """One identified parameter of every kind of the kernel's table (`native.parameter_kinds`), in its order: a kind
    the kernel adds is compared with the numpy reference (test/dynamics_reference.py) too, which refuses a kind it
    does not know."""
    places = {kind: PARAMETER_PLACES.get(entry["on"]) for kind, entry in native.parameter_kinds().items()}
    assert None not in places.values(), f"parameter kinds on something without a place here: {places}"
    return IdentifiedParameters(mech, [place(mech, kind) for kind, place in places.items()])


# One case per unit kind of the kernel's table (`native.unit_kinds`): units of that kind on a mechanism, each with
# its per-step values (or None).  A kind the kernel exports without a case here fails
# `test_every_unit_kind_of_the_kernel_has_a_case`: a new compiled kind comes with its comparison to numpy.
KIND_CASES = {
    "position": lambda mech, rng: [(F.PositionConstraints(mech), None)],
    "velocity": lambda mech, rng: [(F.VelocityConstraints(mech), None)],
    "forward_dynamics": lambda mech, rng: [
        (F.ForwardDynamics(mech, sigma=0.3), {"Q": mech.gravity_forces + rng.standard_normal(mech.n)})],
    "inverse_dynamics": lambda mech, rng: [
        (F.InverseDynamics(mech, sigma=0.2), {"Q_known": mech.gravity_forces + rng.standard_normal(mech.n)})],
    # (the last coordinate of the shipped crank is its angle)
    "selection": lambda mech, rng: [(F.Encoder(mech, 0, sigma=2e-3), {"value": 0.1}),
                                    (F.ObservedCoordinate(mech, 1, order=1, sigma=0.05), {"value": -0.2}),
                                    (F.ObservedCoordinate(mech, mech.n - 1, order=0, sigma=0.05), {"value": 9.0}),
                                    (F.Prior("tau", np.zeros(len(mech.actuated)), 3.0,
                                             select=list(range(len(mech.actuated))), size=len(mech.actuated)),
                                     {"mean": rng.standard_normal(len(mech.actuated))}),
                                    (F.Prior("v", np.zeros(2), 0.5, select=[mech.n - 1, 0], size=mech.n),
                                     {"mean": rng.standard_normal(2)})],
    "wrapped_selection": lambda mech, rng: [(F.Encoder(mech, mech.n - 1, sigma=1e-3), {"value": 3.0}),
                                            (F.Encoder(mech, mech.n - 1, sigma=1e-3), {"value": 3.0 + 4 * np.pi})],
    # an encoder through a deflection (entry 1 of the deflection block; a point coordinate and the crank's angle)
    "offset_selection": lambda mech, rng: [(F.Encoder(mech, 0, sigma=2e-3, deflection=1), {"value": 0.1})],
    "wrapped_offset_selection": lambda mech, rng: [
        (F.Encoder(mech, mech.n - 1, sigma=1e-3, deflection=0), {"value": 3.0}),
        (F.Encoder(mech, mech.n - 1, sigma=1e-3, deflection=1), {"value": 3.0 - 6 * np.pi})],
    "gyroscope": lambda mech, rng: [(F.Gyroscope(mech, 0, sigma=0.01), {"value": 0.5}),
                                    (F.Gyroscope(mech, 1, sigma=0.02), {"value": -0.4})],
    # one parameter of every kind of the kernel's table (rates near a Coulomb friction's v_s included)
    "identified_dynamics": lambda mech, rng: [
        (F.IdentifiedDynamics(mech, _one_parameter_of_each_kind(mech), sigma=0.2),
         {"Q_known": mech.gravity_forces + rng.standard_normal(mech.n),
          "commands": rng.standard_normal(len(mech.actuated))})],
}


def _units_of(mech, h, kinds):
    """The units of `kinds` (`KIND_CASES`) and the static integrators on one step of `mech`, with their per-step
    values."""
    n = mech.n
    rng = np.random.default_rng(7)
    units = [F.TrapezoidalIntegrator("q", "v", n, h), F.TrapezoidalIntegrator("v", "a", n, h)]
    values = {}
    for kind in kinds:
        for unit, given in KIND_CASES[kind](mech, rng):
            assert unit.kernel_kind == kind
            units.append(unit)
            if given is not None:
                values[unit] = given
    return units, values


def test_every_unit_kind_of_the_kernel_has_a_case():
    kinds = native.unit_kinds()
    assert kinds, "the kernel exports no unit kinds"
    assert sorted(kinds) == sorted(KIND_CASES), (
        f"unit kinds of the kernel without a case in KIND_CASES: {sorted(set(kinds) - set(KIND_CASES))}; "
        f"cases of kinds the kernel does not know: {sorted(set(KIND_CASES) - set(kinds))}")
    assert sorted(k["code"] for k in kinds.values()) == list(range(len(kinds)))


def test_the_parameter_kinds_are_the_kernels():
    # model.identified takes the codes of the kernel's table, whose names are model.spec's; a table that is not
    # (a kind added on one side only) is refused, naming both
    table = native.parameter_kinds()
    assert KIND_CODES == {kind: entry["code"] for kind, entry in table.items()}
    assert sorted(KIND_CODES.values()) == list(range(len(table)))
    assert sorted(table) == sorted(IDENTIFIABLE + BODY_IDENTIFIABLE)
    P = _one_parameter_of_each_kind(load_mechanism("four_bar_crank"))
    assert [KIND_CODES[kind] for kind in P.kinds] == P.codes.tolist() == list(P.kernel_layout()[0][::3])
    without_payload = {kind: entry for kind, entry in table.items() if kind != "payload_mass"}
    with pytest.raises(ValueError, match="body: none.*not model.spec's.*body: payload_mass"):
        kind_codes(without_payload)
    with pytest.raises(ValueError, match="all: .*, torque_ripple"):
        kind_codes(dict(table, torque_ripple={"code": len(table), "on": "actuator"}))


@pytest.mark.parametrize("kind", sorted(native.unit_kinds()))
def test_each_unit_kind_matches_numpy(crank, kind):
    units, values = _units_of(crank, 1e-3, [kind])
    entry = native.unit_kinds()[kind]
    rows = {"constraints": crank.m, "coordinates": crank.n, "one": 1}
    for u in units[2:]:
        assert native.unit_form(u)[0] == entry["code"] and len(u.slots) == entry["slots"]
        assert u.dim == rows.get(entry["rows"], len(native.unit_form(u)[1]))
    _compare_step(crank, units, values)


@pytest.mark.parametrize("name", ["four_bar_crank", "pick_and_place_robot"])
def test_the_gyroscope_kind_is_the_bodys_angular_rate(name):
    # the gyroscope's only implementation is its kind in the kernel: its rate and Jacobians against
    # Mechanism.body_angular_rate and central differences of it (a fixed point of a body included)
    mech = load_mechanism(name)
    ctx = EvalContext(mech)
    for q, v, _ in _configurations(mech, 3, 6):
        for b in range(len(mech.spec.bodies)):
            unit = F.Gyroscope(mech, b, 0.0)
            e, (Jq, Jv) = unit.evaluate(q, v, ctx=ctx, params=(0.25,))
            assert e[0] == pytest.approx(mech.body_angular_rate(b, q, v) - 0.25, rel=1e-12, abs=1e-12)
            for J, which in ((Jq, 0), (Jv, 1)):
                fd = np.empty(mech.n)
                for c in range(mech.n):
                    d = np.zeros(mech.n)
                    d[c] = 1e-6
                    args = [(q + d, v), (q - d, v)] if which == 0 else [(q, v + d), (q, v - d)]
                    fd[c] = (mech.body_angular_rate(b, *args[0]) - mech.body_angular_rate(b, *args[1])) / 2e-6
                _close(J[0], fd, 1e-6)


def test_a_whole_step_matches_numpy(crank):
    _compare_step(crank, *_units_of(crank, 1e-3, sorted(native.unit_kinds())))


def _compare_step(mech, units, values, ctx=None):
    """The compiled linearization, right-hand side and relinearization mismatch of one step of `units` against
    the numpy forms."""
    n, na = mech.n, len(mech.actuated)
    layout = _layout(mech, na)
    model = StepModel(layout, units)
    ctx, ref_ctx = ctx or EvalContext(mech), ReferenceContext(mech)
    params = model.params_of(values)
    rng, theta_rng = np.random.default_rng(11), np.random.default_rng(12)
    for q, v, _ in _configurations(mech, 4, 5):
        x_cur = layout.pack(q=q, v=v, a=rng.standard_normal(n), tau=rng.standard_normal(na),
                            theta=theta_rng.standard_normal(len(native.parameter_kinds())),
                            deflection=1e-3 * theta_rng.standard_normal(2))
        x_prev = x_cur + 1e-3 * rng.standard_normal(layout.dim)
        th_prev, th_cur = x_prev + 1e-4, x_cur - 2e-4
        compiled = model.native_linearize(x_prev, x_cur, ctx, (th_prev, th_cur), params)
        assert compiled is not None
        A_prev, A_cur, r, b = [np.array(a) for a in compiled]
        P_prev, P_cur, p_r = [np.array(a) for a in model.linearize(x_prev, x_cur, ref_ctx, static_at=(th_prev, th_cur),
                                                                   params=params)]
        _close(A_prev, P_prev)
        _close(A_cur, P_cur)
        _close(r, p_r)
        rs = model.static_rows
        p_b = -p_r
        p_b[rs:] -= P_cur[rs:].dot(th_cur - x_cur) + P_prev[rs:].dot(th_prev - x_prev)
        _close(b, p_b)
        # the relinearization check at another point, against the numpy form
        rows = model.check_rows
        x_new, x_new_prev = x_cur + 1e-3 * rng.standard_normal(layout.dim), x_prev + 1e-3 * rng.standard_normal(layout.dim)
        lin = P_cur[rows].dot(x_new - x_cur) + p_r[rows] + P_prev[rows].dot(x_new_prev - x_prev)
        expected = np.abs(lin - model.check_residual(x_new_prev, x_new, ref_ctx, params=params))
        if model.check_weights is not None:
            expected *= model.check_weights
        if not rows.size:
            continue
        got = model.native_mismatch(ctx, params, np.ascontiguousarray(P_cur[rows]), np.ascontiguousarray(p_r[rows]),
                                    np.ascontiguousarray(P_prev[rows]), x_cur, x_prev, x_new, x_new_prev)
        assert got == pytest.approx(float(expected.max()), rel=1e-9, abs=1e-12)


def test_the_encoder_residual_is_wrapped(crank):
    n = crank.n
    layout = StateLayout([("q", n)])
    enc = F.Encoder(crank, n - 1, sigma=1.0)
    model = StepModel(layout, [enc])
    x = np.array(crank.q0, dtype=float)
    for reading in (x[n - 1] + 0.3, x[n - 1] + 0.3 + 2 * np.pi, x[n - 1] + 0.3 - 6 * np.pi):
        _, _, r, _ = model.native_linearize(None, x, EvalContext(crank), (None, x), model.params_of({enc: {"value": reading}}))
        assert r[0] == pytest.approx(-0.3, abs=1e-12)


def test_units_without_a_compiled_form_stay_in_python(crank):
    n = crank.n
    layout = StateLayout([("q", n), ("v", n), ("a", n), ("zdd", 1)])
    model = StepModel(layout, [F.PositionConstraints(crank), F.ForwardDynamics(crank, z=[n - 1])])
    x = layout.pack(q=np.array(crank.q0, float), v=np.zeros(n), a=np.zeros(n), zdd=np.zeros(1))
    assert model.native_linearize(None, x, EvalContext(crank), (None, x), model.params_of({})) is None
    assert native.unit_form(F.ForwardDynamics(crank, z=[n - 1])) is None


def test_singular_dynamics_take_a_supplied_linearization():
    # no constraints and a zero mass matrix: K is singular (an exactly zero pivot); the kernel says where, and takes
    # the linearization supplied for exactly that point (the null-space solver's, in the package)
    kernel = native.module().MechanismKernel(1, np.zeros(0), np.ones(1), [], np.zeros(1), [], [], [])
    out = [np.empty(1), np.empty((1, 1)), np.empty((1, 1)), np.empty((1, 1)), np.empty(0), np.empty((0, 1)),
           np.empty((0, 1))]
    q, v, Q = np.zeros(1), np.full(1, 0.5), np.ones(1)
    assert kernel.linearize(q, v, Q, *out) is False
    where = [np.full(1, np.nan), np.full(1, np.nan), np.full(1, np.nan)]
    assert kernel.missed(*where) is True and [float(w[0]) for w in where] == [0.0, 0.5, 1.0]
    assert kernel.missed(*where) is False                                     # told once
    assert kernel.acceleration(q, v, Q, np.empty(1)) is False
    kernel.supply(q, v, Q, np.array([2.0]), np.array([[3.0]]), np.array([[4.0]]), np.array([[5.0]]), np.empty(0))
    assert kernel.linearize(q, v, Q, *out) is True
    assert [float(o.ravel()[0]) for o in out[:4]] == [2.0, 3.0, 4.0, 5.0]
    a = np.empty(1)
    assert kernel.acceleration(q, v, Q, a) is True and a[0] == 2.0
    assert kernel.linearize(q, v, Q + 1e-12, *out) is False                 # only there


def test_a_step_at_singular_dynamics_stays_compiled_with_the_null_space_solver(crank):
    """Where K is singular (here everywhere: the crank's kernel with a zero mass matrix) the compiled step and a
    dynamics unit alone take the null-space solver's linearization (`EvalContext.supply_singular`): the same
    numbers as the numpy references over the null-space solver."""
    Ht, tail, angles = crank.constraints.native_form()
    ctx = EvalContext(crank)
    ctx.native = native.module().MechanismKernel(crank.n, np.ascontiguousarray(Ht), tail, angles,
                                                 np.zeros(crank.n * crank.n), [int(i) for i in crank.independent_rows],
                                                 [int(i) for i in crank.actuated], [])
    kinds = ["forward_dynamics", "inverse_dynamics", "identified_dynamics"]
    _compare_step(crank, *_units_of(crank, 1e-3, kinds), ctx=ctx)
    unit = F.ForwardDynamics(crank, sigma=0.3)
    for q, v, Q in _configurations(crank, 2, 9):
        a = np.full(crank.n, 0.1)
        e, J = unit.evaluate(q, v, a, ctx=ctx, params=(Q,))
        e_ref, J_ref = DR.forward_dynamics(unit, ReferenceContext(crank), q, v, a, Q)
        _close(e, e_ref)
        for got, want in zip(J, J_ref):
            _close(got, want)


def test_wrong_inputs_raise_clear_errors(crank):
    kernel = native.mechanism_kernel(crank)
    n = crank.n
    with pytest.raises(ValueError, match="q: 5 values expected, got 3"):
        kernel.acceleration(np.zeros(3), np.zeros(n), np.zeros(n), np.empty(n))
    with pytest.raises(TypeError, match="a: a contiguous float64 array"):
        kernel.acceleration(np.zeros(n), np.zeros(n), np.zeros(n), np.empty(n, dtype=np.float32))
    with pytest.raises(TypeError, match="takes 4 arguments"):
        kernel.acceleration(np.zeros(n))
    code = native.unit_kinds()["position"]["code"]
    with pytest.raises(ValueError, match="a position unit has 2 rows, not 4"):
        native.step_kernel(kernel, 3 * n, np.zeros((0, 3 * n)), False, [(code, 0, 2, -1, True, [(1, 0, n)],
                                                                          np.ones(2), [], [])],
                           np.zeros((2, 3 * n)), None, np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match="unknown unit code 99"):
        native.step_kernel(kernel, 3 * n, np.zeros((0, 3 * n)), False, [(99, 0, 1, -1, True, [(1, 0, n)],
                                                                          np.ones(1), [], [])],
                           np.zeros((1, 3 * n)), None, np.zeros(1), np.zeros(1))
    with pytest.raises(ValueError, match="columns out of range"):
        native.step_kernel(kernel, 3, np.zeros((0, 3)), False, [(native.unit_kinds()["position"]["code"], 0, crank.m, -1, True,
                                                                    [(1, 0, n)], np.ones(crank.m), [], [])],
                           np.zeros((crank.m, 3)), None, np.zeros(crank.m), np.zeros(crank.m))


@pytest.mark.parametrize("config,step_form", [
    ({}, "compiled"),
    ({"integrator": "hermite"}, "numpy (no compiled form of hermite_velocity)"),
    ({"formulation": "independent", "integrator": "euler"}, "numpy (no compiled form of equality(q), "
     "position_constraints_indep, velocity_constraints_indep, acceleration_constraints_indep, forward_dynamics_indep)"),
])
def test_each_model_says_which_form_runs_it(crank, config, step_form):
    est = FixedLagEstimator(crank, EstimatorConfig(**config))
    for k in range(3):
        est.step(k * 1e-3, observations={"crank": 0.1})
    numerics = est.numerics()
    assert numerics["dynamics"] == "compiled" and numerics["step"] == step_form
    assert numerics["seed"] == ("compiled" if "formulation" not in config else
                                step_form.replace("equality(q), ", ""))
    model = est.window.records[est.stepper.k].model
    assert model.compiled == (step_form == "compiled")


def _run(mech, mode, steps):
    cfg = EstimatorConfig(dt=1e-3, window=10, mode=mode, sensor_sigmas={"crank_encoder": 1e-3}).validated()
    est = FixedLagEstimator(mech, cfg)
    assert est.ctx.native is not None
    plant = SimulatedPlant(mech, dt=1e-3, seed=3, actuator=Actuator.ideal(mech))
    out = []
    for k in range(steps):
        s = plant.step()
        e = est.step(k * 1e-3, efforts=s.efforts, observations=s.readings)
        out.append(np.concatenate([e.q, e.v, e.a, e.efforts, [e.constraint_residual]]))
        est.prepare_next_step()
    return np.array(out), est


def _scaled_distance2(A, x, lin):
    # the reference: Σⱼ (‖A[:, j]‖ (xⱼ − linⱼ))²
    return float(np.sum((np.linalg.norm(A, axis=0) * (x - lin)) ** 2))


def test_scaled_distance_matches_numpy():
    rng = np.random.default_rng(2)
    A, x, lin = rng.standard_normal((7, 9)), rng.standard_normal(9), rng.standard_normal(9)
    compiled = native.scaled_distance2
    assert compiled(A, x, lin) == pytest.approx(_scaled_distance2(A, x, lin), rel=1e-13)
    assert compiled(np.zeros((0, 9)), x, lin) == 0.0
    with pytest.raises(ValueError, match="lin: 9 values expected, got 8"):
        compiled(A, x, lin[:8])


def _reference_prediction(factors, x, h, a_prev, h_prev, values, jerk=None):
    """The continuity predictor in numpy: q + h q̇ + h²/2 q̈ + h³/6 j, q̇ + h q̈ + h²/2 j (j the backward difference
    of q̈, or the model's `jerk`, or none), then q̈ at the predicted (q, q̇) by the dense solve of
    `dynamics.constrained.forward_dynamics` under the prediction's forces."""
    from mbfg_ros.dynamics.constrained import forward_dynamics
    n = factors.mech.n
    q, v, a = x[:n], x[n:2 * n], x[2 * n:3 * n]
    j = jerk if jerk is not None else (a - a_prev) / h_prev if a_prev is not None else np.zeros(n)
    xp = x.copy()
    xp[:n] = q + h * v + (h * h / 2 * a + h ** 3 / 6 * j)
    xp[n:2 * n] = v + h * a + h * h / 2 * j
    Q = factors._prediction_forces(values)
    if factors._tau is not None:
        Q = factors.efforts.add_state(Q, xp[factors._tau])
    xp[2 * n:3 * n] = forward_dynamics(factors.mech, xp[:n], xp[n:2 * n], Q)
    return xp


@pytest.mark.parametrize("mode", ["fused", "estimation", "forward_dynamics"])
def test_the_prediction_is_the_reference_one(crank, mode):
    _, est = _run(crank, mode, 50)
    factors = est.factors
    x, a_prev = est.stepper.x, est.stepper.a_prev
    values = None if mode != "forward_dynamics" else factors.step_values(np.zeros(len(crank.actuated)), 1e-3,
                                                                         est.window)[0]
    for prev in (a_prev, None):
        compiled, _ = factors.predict(x, 1e-3, prev, 1e-3, values)
        _close(compiled, _reference_prediction(factors, x, 1e-3, prev, 1e-3, values), 1e-12)
        # the general route (the step factors without the one-call prediction: the Taylor step, then q̈)
        general, _ = super(type(factors), factors).predict(x, 1e-3, prev, 1e-3, values)
        _close(general, compiled, 1e-13)
    # a model's jerk (the hermite velocity integrator's) replaces the backward difference
    jerk, out = np.linspace(-1.0, 1.0, crank.n), np.empty(x.size)
    est.ctx.native.taylor(x, 1e-3, a_prev, 1e-3, jerk, out)
    want = _reference_prediction(factors, x, 1e-3, a_prev, 1e-3, values, jerk=jerk)
    _close(out[:2 * crank.n], want[:2 * crank.n], 1e-14)
    assert np.array_equal(out[3 * crank.n:], x[3 * crank.n:])


@pytest.mark.parametrize("name", ["four_bar_crank", "pick_and_place_robot"])
def test_state_summary_matches_numpy(name):
    mech = load_mechanism(name)
    compiled = EvalContext(mech)
    rng = np.random.default_rng(8)
    for q, v, _ in _configurations(mech, 4, 9):
        x = np.concatenate([q + 0.01 * rng.standard_normal(mech.n), v, rng.standard_normal(mech.n + 2)])
        got = compiled.state_summary(x)
        qx = x[:mech.n]
        assert got[0] == pytest.approx(np.abs(mech.constraints.phi(qx)).max(initial=0.0), rel=1e-12)
        assert got[1] == pytest.approx(float(x @ x), rel=1e-12)
        assert got[2] == np.abs(x[mech.n:2 * mech.n]).max() and got[3] == tuple(mech.assembly_mode(qx).tolist())
        assert compiled.constraint_residual(qx) == got[0]
    # the drawn pose's indicators, as Mechanism.assembly_mode gives them
    if mech.assembly_mode_points.size:
        q = np.array(mech.q0, dtype=float)
        assert compiled.state_summary(np.concatenate([q, np.zeros(mech.n)]))[3] == tuple(mech.assembly_mode(q))
    bad = np.full(2 * mech.n, np.nan)
    assert all(np.isnan(compiled.state_summary(bad)[:3]))


def test_a_package_without_the_kernel_fails_with_how_to_build_it(tmp_path):
    # the package as a build without a C compiler would leave it: no compiled module beside the sources
    import shutil
    import subprocess
    import sys
    import mbfg_ros
    src = Path(mbfg_ros.__file__).parent
    shutil.copytree(src, tmp_path / "mbfg_ros", ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    code = "from mbfg_ros.estimation.estimator import FixedLagEstimator\n"
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("mbfg_ros.native.KernelMissing: mbfg_ros needs its compiled kernel "
                           f"mbfg_ros.native._kernel, which is not built in {tmp_path / 'mbfg_ros' / 'native'}: "), last
    assert "build-essential python3-dev" in last and "colcon build" in last and "make venv" in last
