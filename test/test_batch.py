"""Batch solvers: the sparse LM engine, batch forward dynamics and the staged inverse dynamics (§7.2)."""

import os
import sys

import numpy as np
import pytest

from mbfg_ros.batch.engines import solve
from mbfg_ros.batch.forward_dynamics import batch_forward_dynamics
from mbfg_ros.batch.inverse_dynamics import InverseDynamicsSigmas, InverseDynamicsUnits, staged_inverse_dynamics
from mbfg_ros.batch.problem import Assembly, Problem
from mbfg_ros.blas import blas_thread_counts, limit_blas_threads, single_threaded_blas
from mbfg_ros.batch.trajectories import closed_form_efforts, closed_form_motion, position_continuation, quintic_move
from mbfg_ros.dynamics import batched
from mbfg_ros.dynamics import constrained as dynamics
import mbfg_ros.factors as F
from mbfg_ros.model.mechanism import Mechanism, load_mechanism

sys.path.insert(0, os.path.dirname(__file__))
import reference_four_bar as R  # noqa: E402

DT = 0.005


def crank_trajectory(N, dt=DT):
    t = np.arange(N) * dt
    return t, 1.2 * (1 - np.cos(2 * t)), 2.4 * np.sin(2 * t), 4.8 * np.cos(2 * t)


@pytest.fixture(scope="module")
def four_bar():
    return load_mechanism("four_bar_crank")


# ----------------------------------------------------------------------------------------------
def test_linear_toy_problem_matches_least_squares():
    """Trapezoid chain x_{k+1} = x_k + dt/2 (v_k + v_{k+1}) with priors: one GN step is exact."""
    prob = Problem()
    trap = F.TrapezoidalIntegrator("x", "v", 2, 1.0, 1e-3)
    for k in range(3):
        prob.add_variable(("x", k), np.zeros(2))
        prob.add_variable(("v", k), np.zeros(2))
        prob.add_factor(F.Prior("v", [1.0, 2.0 + k], 1e-3), [("v", k)])
    prob.add_factor(F.Prior("x", [0.0, 0.0], 1e-3), [("x", 0)])
    for k in range(2):
        prob.add_factor(trap, [("x", k), ("x", k + 1), ("v", k), ("v", k + 1)])
    rep = solve(prob)
    assert rep.converged and rep.final_error < 1e-12
    np.testing.assert_allclose(prob.values[("x", 1)], [1.0, 2.5], atol=1e-9)
    np.testing.assert_allclose(prob.values[("x", 2)], [2.0, 6.0], atol=1e-9)


def test_closed_form_reference_four_bar(four_bar):
    t, th, thd, thdd = crank_trajectory(3)
    q, v, a = closed_form_motion(four_bar, th[:, None], thd[:, None], thdd[:, None])
    tau = closed_form_efforts(four_bar, q, v, a)
    assert tau[0, 0] == pytest.approx(66.0117, abs=1e-3)
    np.testing.assert_allclose(q[0], [1, 0, 1, 2, 0], atol=1e-12)


def test_quintic_move_is_rest_to_rest():
    t = np.linspace(-0.5, 2.5, 301)
    x, xd, xdd = quintic_move(t, [1.0, -1.0], [2.0, 1.0], 0.0, 2.0)
    np.testing.assert_allclose(x[0], [1, -1])
    np.testing.assert_allclose(x[-1], [2, 1])
    assert np.abs(xd[[0, -1]]).max() == 0 and np.abs(xdd[[0, -1]]).max() == 0
    np.testing.assert_allclose(np.gradient(x[:, 1], t), xd[:, 1], atol=2e-3)


# ----------------------------------------------------------------------------------------------
def test_staged_inverse_dynamics_four_bar_full_horizon(four_bar):
    """Paper §7.2: θ(t) = 1.2(1 − cos 2t), dt = 5 ms, 10 s, against the closed form on the exact motion."""
    t, th, thd, thdd = crank_trajectory(2000)
    res = staged_inverse_dynamics(four_bar, th[:, None], DT)
    q, v, a = closed_form_motion(four_bar, th[:, None], thd[:, None], thdd[:, None])
    ref = closed_form_efforts(four_bar, q, v, a)
    err = res.tau - ref
    assert np.sqrt(np.mean(err ** 2)) < 0.02
    assert np.abs(err).max() < 0.1          # the trapezoidal rule's error (docs/cli.md) stays well below
    assert res.tau[0, 0] == pytest.approx(66.01, abs=0.02)
    assert [s.stage for s in res.stages] == [1, 2, 3, 4]
    assert all(s.converged for s in res.stages)
    assert np.abs(res.q[:, 4] - th).max() < 1e-5            # the crank follows the prescription
    assert np.abs(res.q - q).max() < 1e-5
    assert np.all(four_bar.assembly_mode(res.q[-1]) == four_bar.assembly_mode(q[0]))


def test_staged_inverse_dynamics_robot(robot):
    """Smooth rest-to-rest moves of both motors (2 s, 401 samples; the bench runs 5 s, 1001)."""
    N = 401
    t = np.arange(N) * DT
    q0 = np.array(robot.q0)[list(robot.actuated)]
    val, rate, acc = quintic_move(t, q0, q0 + [-0.4, 0.8], 0.0, t[-1])
    res = staged_inverse_dynamics(robot, val, DT)
    q, v, a = closed_form_motion(robot, val, rate, acc)
    ref = closed_form_efforts(robot, q, v, a)
    err = res.tau - ref
    # bounds above the trapezoidal rule's error (docs/cli.md), on torques of 100–250 N·m
    assert np.sqrt(np.mean(err ** 2, axis=0)).max() < 0.01
    assert np.abs(err).max() < 0.1
    assert res.tau[0] == pytest.approx([-117.72, 117.72], abs=0.1)
    assert np.abs(res.q - q).max() < 1e-6


def test_engines_agree_on_a_short_horizon(four_bar):
    t, th, _, _ = crank_trajectory(30)
    a = staged_inverse_dynamics(four_bar, th[:, None], DT, engine="sparse")
    b = staged_inverse_dynamics(four_bar, th[:, None], DT, engine="gtsam")
    np.testing.assert_allclose(a.tau, b.tau, atol=1e-5)
    np.testing.assert_allclose(a.q, b.q, atol=1e-9)


def test_stop_after_stage_3_and_bad_input(four_bar):
    t, th, _, _ = crank_trajectory(20)
    res = staged_inverse_dynamics(four_bar, th[:, None], DT, stages=3)
    assert np.all(np.isnan(res.tau)) and np.all(np.isfinite(res.v))
    with pytest.raises(ValueError):
        staged_inverse_dynamics(four_bar, np.zeros((20, 2)), DT)
    with pytest.raises(ValueError):
        staged_inverse_dynamics(four_bar, th[:2, None], DT)
    with pytest.raises(ValueError):
        staged_inverse_dynamics(four_bar, th[:, None], DT, engine="nope")


# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference_mech():
    return Mechanism(R.four_bar_spec(9.8, crank=True))


@pytest.mark.parametrize("formulation", ["dependent", "independent"])
def test_batch_forward_dynamics_free_fall(reference_mech, formulation):
    dt, steps = 1e-3, 400
    res = batch_forward_dynamics(reference_mech, dt, steps, formulation=formulation)
    ref = R.free_fall(steps * dt, dt, 9.8)
    rmse, worst = R.point_errors(res.q, ref)
    assert res.report.converged
    assert rmse < 5e-6 and worst < 2e-5
    np.testing.assert_allclose(res.a[0], dynamics.forward_dynamics(reference_mech, res.q[0], res.v[0]), atol=1e-3)
    if formulation == "independent":
        np.testing.assert_allclose(res.z[:, 0], res.q[:, 4], atol=1e-6)


def test_batch_forward_dynamics_with_torque_and_gtsam_engine(reference_mech):
    dt, steps = 1e-3, 60
    tau = lambda t: 20.0 * np.sin(3.0 * t)
    efforts = tau(np.arange(steps + 1) * dt)[:, None]
    a = batch_forward_dynamics(reference_mech, dt, steps, efforts=efforts)
    b = batch_forward_dynamics(reference_mech, dt, steps, efforts=efforts, engine="gtsam")
    np.testing.assert_allclose(a.q, b.q, atol=1e-9)
    ref = R.simulate(steps * dt, dt, 9.8, tau_fn=tau)
    assert R.point_errors(a.q, ref)[1] < 1e-5


def _random_chain_problem(uniform: bool):
    """A small nonlinear chain (x_k ∈ R², a bias variable only at step 0 when not uniform)."""
    rng = np.random.default_rng(3)

    class Square(F.Factor):   # e = x ⊙ x − target (nonlinear, closed-form Jacobian)
        def __init__(self, target):
            self.target, self.dim, self.sigmas = np.asarray(target, float), 2, np.full(2, 0.1)
            self.slots = ("x",)

        def evaluate(self, x, *, params, ctx=None):
            return x * x - self.target, [np.diag(2 * x)]

    prob = Problem()
    eq = F.SoftEquality("x", 2, 1.0)
    for k in range(12):
        prob.add_variable(("x", k), np.ones(2))
        prob.add_factor(Square(rng.uniform(1, 4, 2)), [("x", k)])
        if k:
            prob.add_factor(eq, [("x", k - 1), ("x", k)])
    if not uniform:
        prob.add_variable(("b", 0), np.zeros(2))
        prob.add_factor(F.Prior("b", [1.0, -1.0], 1.0), [("b", 0)])
        prob.add_factor(F.SoftEquality("x", 2, 0.5), [("b", 0), ("x", 0)])
    return prob


@pytest.mark.parametrize("layout", ["uniform", "general", "sparse_fallback"])
def test_sparse_engine_layouts_agree_with_gtsam(layout, monkeypatch):
    prob = _random_chain_problem(uniform=layout == "uniform")
    ref = _random_chain_problem(uniform=layout == "uniform")
    if layout == "sparse_fallback":
        monkeypatch.setattr(Assembly, "step", lambda self, g, lam: self.sparse_step(g, lam))
    rep = solve(prob)
    rep_ref = solve(ref, engine="gtsam")
    assert rep.converged
    assert rep.final_error == pytest.approx(rep_ref.final_error, rel=1e-6)
    for k in prob.keys:
        np.testing.assert_allclose(prob.values[k], ref.values[k], atol=1e-6)


# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["four_bar_crank", "pick_and_place_robot", "double_pendulum_c0"])
def test_vectorized_units_match_the_per_step_units(name):
    """`Factor.vectorized` gives the numbers of the units' own `evaluate` (errors and Jacobians, 1e-12 of
    the largest entry) at points near the motion of a trajectory (q off the constraints by ~1e-3, random
    q̇, q̈, τ), where both forms of the relative-angle rows occur.  (Far from the constraint manifold
    the augmented system gets ill-conditioned and the two solution orders differ by ~cond·ε: 4e-12
    for the robot at 0.3 rad/m off.)"""
    mech = load_mechanism(name)
    rng = np.random.default_rng(1)
    N = 40
    start = np.array(mech.q0)[list(mech.actuated)]
    move = {"four_bar_crank": [2.4], "pick_and_place_robot": [-0.4, 0.8]}.get(name, [2.0, -3.0])  # the benchmark's
    values = start + np.linspace(0.0, 1.0, N)[:, None] * np.array(move)
    q_path = position_continuation(mech, values, stride=1)
    blocks = {"q": q_path + 1e-3 * rng.standard_normal((N, mech.n)),
              "v": rng.standard_normal((N, mech.n)), "a": rng.standard_normal((N, mech.n)),
              "tau": 50.0 * rng.standard_normal((N, len(mech.actuated)))}
    sines = np.abs(np.sin(blocks["q"][:, mech.relative_angle_columns]))
    if name == "four_bar_crank":
        assert np.any(sines > 0.75) and np.any(sines < 0.65)
    Q = [(mech.gravity_forces + rng.standard_normal(mech.n),) for _ in range(N)]
    kinds = [([F.PositionConstraints(mech, 1e-3)] * N, [()] * N), ([F.VelocityConstraints(mech, 1e-3)] * N, [()] * N),
             ([F.AccelerationConstraints(mech, 1e-3)] * N, [()] * N), ([F.ForwardDynamics(mech, sigma=1e-3)] * N, Q),
             ([F.InverseDynamics(mech, sigma=1e-3)] * N, Q)]
    for units, params in kinds:
        f = type(units[0]).vectorized(units, params)
        assert f is not None
        slots = units[0].slots
        keys = [(np.arange(N) * 100 + 10 * s).tobytes() for s in range(len(slots))]
        e, Js = f(batched.BatchContext(mech), keys, *[blocks[s] for s in slots])
        for k, (unit, values) in enumerate(zip(units, params)):
            e1, J1 = unit.evaluate(*[blocks[s][k] for s in slots], params=values)
            np.testing.assert_allclose(e[k], e1, rtol=0, atol=1e-12 * max(1.0, np.abs(e1).max()))
            for Jb, Jr in zip(Js, J1):
                np.testing.assert_allclose(Jb[k], Jr, rtol=0, atol=1e-12 * max(1.0, np.abs(Jr).max()))


@pytest.mark.parametrize("name", ["four_bar_crank", "pick_and_place_robot", "double_pendulum_a0"])
def test_dynamics_many_gives_the_per_step_forms_numbers_by_either_route(name):
    """The batch's dynamics are the per-step forms' (no copy of its own): through the compiled kernel and through
    numpy's per-step linearization the same q̈ and derivatives (1e-10 of the largest entry), the force columns
    selected, and a state no form can solve NaN rather than an exception."""
    from mbfg_ros import native
    from mbfg_ros.dynamics.kinematics import solve_positions
    mech = load_mechanism(name)
    rng = np.random.default_rng(4)
    N = 6
    q = np.array([solve_positions(mech, np.array(mech.q0) + 0.01 * rng.standard_normal(mech.n)).q for _ in range(N)])
    v, Q = rng.standard_normal((N, mech.n)), mech.gravity_forces + rng.standard_normal((N, mech.n))
    cols = np.array(mech.actuated)
    ref = batched.dynamics_many(mech, q, v, Q, cols, kernel=None)
    for k in range(N):
        d = dynamics.forward_dynamics_jacobians(mech, q[k], v[k], Q[k])
        for got, want in zip((r[k] for r in ref), (d.a, d.da_dq, d.da_dv, d.da_dQ[:, cols])):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * max(1.0, np.abs(want).max()))
    kernel = native.mechanism_kernel(mech)
    if kernel is not None:
        for got, want in zip(batched.dynamics_many(mech, q, v, Q, cols, kernel=kernel), ref):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-10 * max(1.0, np.abs(want).max()))
        np.testing.assert_allclose(batched.dynamics_many(mech, q, v, Q, kernel=kernel, need_jacobians=False), ref[0],
                                   rtol=0, atol=1e-10 * max(1.0, np.abs(ref[0]).max()))
    bad = q.copy()
    bad[0] = np.nan
    a = batched.dynamics_many(mech, bad, v, Q, cols, kernel=kernel)[0]
    assert np.isnan(a[0]).all() and np.isfinite(a[1:]).all()


def test_vectorized_evaluation_matches_per_step_in_the_assembly(four_bar):
    """The sparse engine's residuals and Jacobians are the same with and without vectorization."""
    t, th, _, _ = crank_trajectory(25)
    res = staged_inverse_dynamics(four_bar, th[:, None], DT)
    prob = Problem(four_bar)
    U = InverseDynamicsUnits(four_bar, DT, InverseDynamicsSigmas())
    for k in range(25):
        prob.add_variable(("q", k), res.q[k] + 1e-3 * np.sin(k))
        prob.add_variable(("v", k), res.v[k])
        prob.add_variable(("a", k), res.a[k])
        prob.add_variable(("tau", k), res.tau[k])
        prob.add_factor(U.position, [("q", k)])
        prob.add_factor(U.velocity, [("q", k), ("v", k)])
        prob.add_factor(U.inverse_dynamics, [("q", k), ("v", k), ("a", k), ("tau", k)], (four_bar.gravity_forces,))
    out = []
    for vec in (True, False):
        asm = Assembly(prob, vectorize=vec)
        assert all((G.evaluate_many is not None) == vec for G in asm.nl_groups)
        x = asm.pack(prob.values)
        cost = asm.evaluate(x)
        out.append((cost, [(G.r.copy(), G.J.copy(), x[G.cols]) for G in asm.nl_groups]))
    assert out[0][0] == pytest.approx(out[1][0], rel=1e-10)
    for (r0, J0, _), (r1, J1, xs) in zip(out[0][1], out[1][1]):
        # residuals like q̈(q, q̇, τ) − q̈ cancel: compare them on the scale of their terms (≈ |J x|)
        terms = np.abs(np.einsum("fdw,fw->fd", J1, xs)).max()
        np.testing.assert_allclose(r0, r1, rtol=0, atol=1e-12 * max(1.0, np.abs(r1).max(), terms))
        np.testing.assert_allclose(J0, J1, rtol=0, atol=1e-12 * max(1.0, np.abs(J1).max()))


def test_vectorized_kinematics_and_efforts_match_per_step(robot):
    """Position continuation on a coarse grid + batched Newton = per-step continuation; the batched
    closed-form efforts and assembly modes = the per-step ones (also for inconsistent q̈)."""
    N = 201
    t = np.arange(N) * DT
    q0 = np.array(robot.q0)[list(robot.actuated)]
    val, rate, acc = quintic_move(t, q0, q0 + [-0.4, 0.8], 0.0, t[-1])
    q_seq = position_continuation(robot, val, stride=1)
    q_vec = position_continuation(robot, val, stride=8)
    np.testing.assert_allclose(q_vec, q_seq, rtol=0, atol=1e-11)
    modes = batched.assembly_modes(robot, q_vec)
    assert np.array_equal(modes, np.array([robot.assembly_mode(x) for x in q_vec]))
    q, v, a = closed_form_motion(robot, val, rate, acc)
    for aa in (a, a + 0.1):
        np.testing.assert_allclose(batched.inverse_dynamics_many(robot, q, v, aa),
                                   closed_form_efforts(robot, q, v, aa), rtol=0, atol=1e-10)


def test_position_continuation_fast_crank_matches_step_by_step(four_bar):
    """A fast crank (40 rad/s, 0.2 rad per step): the coarse grid shrinks, and batched Newton solutions
    mirrored across the crank direction (which satisfy the single relative-angle row) are rejected."""
    N = 400
    values = 40.0 * np.arange(N)[:, None] * DT
    q_seq = position_continuation(four_bar, values, stride=1)
    q_vec = position_continuation(four_bar, values)
    np.testing.assert_allclose(q_vec, q_seq, rtol=0, atol=1e-11)
    assert batched.angles_consistent(four_bar, q_vec).all()
    mirrored = q_vec[5:6].copy()             # crank at 1 rad
    mirrored[0, 1] *= -1.0                     # point 1 reflected across the x axis: Φ's x-form row still holds
    assert not batched.angles_consistent(four_bar, mirrored)[0]


def test_bulk_construction_matches_one_by_one():
    """`Problem.add_variables` / `add_factors` build the same groups as `add_variable` / `add_factor`,
    and the engine gives the same answer (including non-uniform series, which fall back); one unit with each
    step's values beside it is the same as a unit per step holding them."""
    rng = np.random.default_rng(5)
    N = 9
    targets = rng.uniform(1, 4, (N, 2))
    trap = F.TrapezoidalIntegrator("x", "v", 2, 0.1, 1e-2)

    def priors():
        return [F.Prior("x", t, 0.1) for t in targets]

    one = Problem()
    for k in range(N):
        one.add_variable(("x", k), np.ones(2))
        one.add_variable(("v", k), np.zeros(2))
    for k, p in enumerate(priors()):
        one.add_factor(p, [("x", k)])
    for k in range(N - 1):
        one.add_factor(trap, [("x", k), ("x", k + 1), ("v", k), ("v", k + 1)])
    bulk = Problem()
    bulk.add_variables("x", np.ones((N, 2)))
    bulk.add_variables("v", np.zeros((N, 2)))
    bulk.add_factors(priors(), [("x", 0)], range(N))
    bulk.add_factors(trap, [("x", 0), ("x", 1), ("v", 0), ("v", 1)], range(N - 1))
    assert sorted(one.keys) == sorted(bulk.keys) and len(one.factors) == len(bulk.factors)
    assert [[keys for _, keys, _ in g] for g in one.groups.values()] == \
        [[keys for _, keys, _ in g] for g in bulk.groups.values()]
    for sig in one.groups:
        np.testing.assert_array_equal(one.first_steps(sig), bulk.first_steps(sig))
    shared = Problem()
    shared.add_variables("x", np.ones((N, 2)))
    shared.add_variables("v", np.zeros((N, 2)))
    prior = F.Prior("x", np.zeros(2), 0.1)
    shared.add_factors(prior, [("x", 0)], range(N), [(t,) for t in targets])
    shared.add_factors(trap, [("x", 0), ("x", 1), ("v", 0), ("v", 1)], range(N - 1))
    np.testing.assert_array_equal([p for _, _, (p,) in shared.factors[:N]], targets)
    solve(one)
    solve(bulk)
    solve(shared)
    for k in one.keys:
        np.testing.assert_allclose(bulk.values[k], one.values[k], atol=1e-12)
        np.testing.assert_array_equal(shared.values[k], bulk.values[k])
    with pytest.raises(KeyError):
        bulk.add_factors(trap, [("x", 0), ("x", 1), ("v", 0), ("v", 1)], [N - 1])
    with pytest.raises(ValueError, match="per-step values given for the parameters"):
        shared.add_factor(prior, [("x", 0)], ())
    with pytest.raises(ValueError, match="one tuple of per-step values per step"):
        shared.add_factors(prior, [("x", 0)], range(N), [(t,) for t in targets[1:]])


def test_single_threaded_blas_restores_the_thread_counts():
    """`single_threaded_blas` runs OpenBLAS on one thread inside the block and restores the previous
    counts after it, also when the block raises; `limit_blas_threads` sets them for good."""
    before = blas_thread_counts()
    if not before:
        pytest.skip("no OpenBLAS with a thread-count getter in this process")
    try:
        assert limit_blas_threads(2) >= len(before)
        if blas_thread_counts() != [2] * len(before):
            pytest.skip("OpenBLAS built for a single thread")
        with pytest.raises(RuntimeError):
            with single_threaded_blas():
                assert blas_thread_counts() == [1] * len(before)
                raise RuntimeError("inside")
        assert blas_thread_counts() == [2] * len(before)
    finally:
        limit_blas_threads(before[0])
