"""Actuators that apply a command some time after it is given (`actuators: delay:`,
estimation/actuator_delay.py): the first-order hold of the commands at t − delay, the same in the estimator, in
`mbfg tune` and in the bench's anchors; a late command corrects the steps that apply it; the format, the
configuration and the node's parameters refuse what is not a latency."""

import dataclasses

import numpy as np
import pytest

from mbfg_ros.estimation.actuator_delay import ActuatorDelay, configured_delays, delayed_commands, lag_step, lagged
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.model.mechanism import Mechanism, load_mechanism
from mbfg_ros.model.loader import load_spec_from_string
from mbfg_ros.model.spec import MechanismError
from mbfg_ros.sim.plant import SimulatedPlant

# the crank four-bar's plant and its commands with a jump at LATE_AT (as the late commands' tests use them)
from test_late_commands import LATE_AT, STEPS, commands, motion  # noqa: F401  (fixture)

DELAY = 0.003           # [s] on the crank's 1-ms steps: the command given 3 steps before
ROWS = 3


def jittered_times(n, dt=0.002, seed=0):
    rng = np.random.default_rng(seed)
    return np.cumsum(np.r_[0.0, dt * (1 + rng.uniform(-0.2, 0.2, n - 1))])


def test_the_command_a_delay_earlier_is_applied_interpolated_between_its_rows():
    """On 2-ms stamps jittering by ±20 %, a 5-ms delay applies the command at t − 5 ms interpolated between the
    two rows around that time (the first one before any); at a row's own time that row's command alone; each
    actuator its own delay; no delay: the commands as given; a non-finite neighbour is not interpolated with (the
    row at or before is held); the estimator's bookkeeping gives the same as the columns' rule (`mbfg tune`, the
    bench)."""
    t = jittered_times(400)
    c = np.column_stack([np.sin(np.arange(400.0)), -np.arange(400.0)])
    out = delayed_commands(t, c, [0.005, 0.0])
    np.testing.assert_allclose(out[:, 0], np.interp(t - 0.005, t, c[:, 0]), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(out[:3, 0], c[0, 0])
    np.testing.assert_array_equal(out[:, 1], c[:, 1])
    np.testing.assert_array_equal(delayed_commands(t, c, [0.0, 0.0]), c)
    uniform = 0.002 * np.arange(400)
    np.testing.assert_array_equal(delayed_commands(uniform, c, [0.006, 0.006])[3:], c[:-3])   # 3 rows exactly
    # across an overrun: a gap of 5.4 ms before row 200 (the command ramps over it)
    t2 = t.copy()
    t2[200:] += 0.0034
    out2 = delayed_commands(t2, c, [0.005, 0.005])
    np.testing.assert_allclose(out2[:, 0], np.interp(t2 - 0.005, t2, c[:, 0]), rtol=0, atol=1e-12)
    assert min(c[199, 0], c[200, 0]) < out2[202, 0] < max(c[199, 0], c[200, 0])
    gap = c.copy()
    gap[100, 0] = np.nan
    held = delayed_commands(t2, gap, [0.005, 0.0])
    k = np.searchsorted(t2, t2 - 0.005, side="right") - 1
    beside = (k == 99) | (k == 100)
    np.testing.assert_array_equal(held[beside, 0], gap[k[beside], 0])       # held: row 99's, or NaN (row 100's)
    book = ActuatorDelay([0.005, 0.0], keep=64)
    applied = np.array([book.applied(float(tk), ck) for tk, ck in zip(t2, gap)])
    np.testing.assert_array_equal(applied, delayed_commands(t2, gap, [0.005, 0.0]))


def test_the_lag_after_the_delay_is_exact_and_the_same_in_the_estimator_and_on_the_columns():
    """The first-order lag T ẏ = u − y with u linear between the steps: equal to a tight ODE solution on
    jittering stamps, unchanged by splitting the steps (exact per step), from rest at the first command; T ≫ h
    and T ≪ h stay exact (the input held, the input itself); a missing command is bridged (NaN at its row, the
    lag runs on to the next); `ActuatorDelay` gives the columns' rule (`delayed_commands`) with a delay and a lag,
    a lag alone, and neither."""
    from scipy.integrate import solve_ivp
    t = jittered_times(120)
    u = np.sin(40 * t) + 0.3 * np.sign(np.sin(90 * t))
    y = lagged(t, u[:, None], 0.003)[:, 0]
    ode = solve_ivp(lambda s, x: (np.interp(s, t, u) - x) / 0.003, (t[0], t[-1]), [u[0]], t_eval=t, rtol=1e-12,
                    atol=1e-14, max_step=2e-4)
    np.testing.assert_allclose(y, ode.y[0], rtol=0, atol=1e-8)
    fine = np.sort(np.r_[t, (t[1:] + t[:-1]) / 2])
    np.testing.assert_allclose(lagged(fine, np.interp(fine, t, u)[:, None], 0.003)[np.isin(fine, t), 0], y,
                               rtol=0, atol=1e-13)
    assert y[0] == u[0] and abs(y[30] - u[30]) > 0.05
    assert lag_step(0.5, 1.0, 2.0, 1e-9, 1.0) == pytest.approx(0.5, abs=1e-8)          # T ≫ h: held
    assert lag_step(0.5, 1.0, 2.0, 1.0, 1e-6) == pytest.approx(2.0 - 1e-6, abs=1e-12)   # T ≪ h: the input (− rT)
    gap = np.column_stack([u, -u])
    gap[50, 0] = np.nan
    out = lagged(t, gap, 0.003)
    assert np.isnan(out[50, 0]) and np.isfinite(out[[49, 51], 0]).all()
    np.testing.assert_array_equal(out[:50, 0], y[:50])
    bridged = lagged(np.delete(t, 50), np.delete(u, 50)[:, None], 0.003)[:, 0]
    np.testing.assert_allclose(np.delete(out[:, 0], 50), bridged, rtol=0, atol=1e-15)
    for delays, lags in (([0.005, 0.0], [0.003, 0.002]), ([0.0, 0.0], [0.003, 0.0]), ([0.0, 0.0], [0.0, 0.0])):
        book = ActuatorDelay(delays, keep=8, time_constants=lags)      # (keep < rows: the oldest dropped)
        applied = np.array([book.applied(float(tk), ck) for tk, ck in zip(t, gap)])
        np.testing.assert_allclose(applied, delayed_commands(t, gap, delays, lags), rtol=0, atol=1e-15)
    np.testing.assert_array_equal(delayed_commands(t, gap, [0.0, 0.0], [0.0, 0.0]), gap)


def test_a_late_command_is_run_through_the_lag_from_its_step_on():
    """A command corrected after later steps were applied: every later step's applied effort is that of the
    corrected commands through the delay and the lag (`ActuatorDelay.correct`), as the columns' rule gives it."""
    t = jittered_times(60)
    c = np.sin(30 * t)[:, None]
    book = ActuatorDelay([0.004], keep=64, time_constants=[0.003])
    held = c.copy()
    held[20] = c[19]
    for k, (tk, ck) in enumerate(zip(t, held)):
        book.applied(float(tk), ck)
        book.assign(k)
    done = dict(book.correct([(20, c[20])]))
    right = delayed_commands(t, c, [0.004], [0.003])
    assert min(done) > 20 and max(done) == 59
    for k, new in done.items():
        np.testing.assert_allclose(new, right[k], rtol=0, atol=1e-15)


def test_commands_held_on_a_grid_are_applied_by_the_times_they_were_given():
    """The node's way: commands given at jittering 2-ms stamps, held on a grid offset from them (each from the
    grid step nearest its stamp) and handed with their stamps (`given_at`): a delayed (and lagging) actuator
    applies at each grid step what the columns' rule gives for those stamps, evaluated there; handed without them
    (timed by the grid) it is off by up to half a step's change.  An undelayed actuator takes the held command."""
    t = jittered_times(300)
    c = np.column_stack([np.sin(30 * t), np.cos(20 * t)])
    grid = np.arange(t[0] + 0.0007, t[-1] - 0.01, 0.002)
    k = np.clip(np.searchsorted(t, grid + 0.001, side="right") - 1, 0, None)      # nearest-step rounding
    fine = np.sort(np.r_[t, grid])
    for delays, lags in (([0.005, 0.0], [0.0, 0.0]), ([0.003, 0.0], [0.004, 0.0])):
        book, plain = ActuatorDelay(delays, keep=64, time_constants=lags), ActuatorDelay(delays, keep=64,
                                                                                           time_constants=lags)
        timed = np.array([book.applied(g, c[i], [t[i], t[i]]) for g, i in zip(grid, k)])
        untimed = np.array([plain.applied(g, c[i]) for g, i in zip(grid, k)])
        # the columns' rule on the given commands at their stamps, read at the grid's times (the lag integrated on
        # the union of both, exact for the command linear between its stamps)
        held = np.interp(fine, t, c[:, 0])
        ref = delayed_commands(fine, np.column_stack([held, held]), delays[:1] * 2, lags[:1] * 2)[:, 0]
        ref = np.interp(grid, fine, ref)
        settled = grid > t[0] + 0.02
        assert np.abs(timed[settled, 0] - ref[settled]).max() < 2e-3, np.abs(timed[settled, 0] - ref[settled]).max()
        assert np.abs(untimed[settled, 0] - ref[settled]).max() > 5 * np.abs(timed[settled, 0] - ref[settled]).max()
        np.testing.assert_array_equal(timed[:, 1], c[k, 1])


def test_a_late_command_with_its_time_corrects_as_if_it_had_come_in_time():
    """Commands held on an offset grid with their times, one of them late (the one before held in its place, and
    the late one given with its own time): corrected, every step applies what a book handed it in time does;
    corrected without its time, worse than not at all."""
    t = jittered_times(80)
    c = np.sin(30 * t)[:, None]
    grid = np.arange(t[0] + 0.0007, t[-1] - 0.01, 0.002)
    k = np.clip(np.searchsorted(t, grid + 0.001, side="right") - 1, 0, None)
    late = int(np.nonzero(k == k[30])[0][0])              # the first grid step holding row k[30]'s command
    in_time, book = ActuatorDelay([0.004], keep=128, time_constants=[0.003]), ActuatorDelay([0.004], keep=128,
                                                                                         time_constants=[0.003])
    untimed = ActuatorDelay([0.004], keep=128, time_constants=[0.003])
    right, applied = [], []
    for s, (g, i) in enumerate(zip(grid, k)):
        right.append(in_time.applied(g, c[i], [t[i]]))
        j = i - 1 if i == k[30] else i
        applied.append(book.applied(g, c[j], [t[j]]))
        untimed.applied(g, c[j], [t[j]])
        book.assign(s)
        untimed.assign(s)
    steps = [s for s in range(len(grid)) if k[s] == k[30]]
    done = dict(book.correct([(s, c[k[30]], [t[k[30]]]) for s in steps]))
    assert done and min(done) > late                     # (applied after the delay: later steps)
    corrected = np.array([done.get(s, applied[s]) for s in range(len(grid))])
    np.testing.assert_allclose(corrected, np.array(right), rtol=0, atol=1e-12)
    stale = np.abs(np.array(applied) - np.array(right)).max()
    # corrected without its time the late command is applied from the stale one's time, a command interval early:
    # farther off than the stale hold itself (measured 3.6e-3 against 7.3e-4)
    off = dict(untimed.correct([(s, c[k[30]]) for s in steps]))
    untimed_off = np.abs(np.array([off.get(s, applied[s]) for s in range(len(grid))]) - np.array(right)).max()
    assert stale > 1e-4 and untimed_off > stale, (stale, untimed_off)


def test_the_simulated_plant_applies_each_command_after_its_actuators_delay(crank):
    """The plant of a mechanism whose actuator has a delay (as the estimator applies it): its applied efforts are
    those of the commands given that long before."""
    delayed = Mechanism(dataclasses.replace(crank.spec, actuators=tuple(dataclasses.replace(a, delay=DELAY)
                                                                        for a in crank.spec.actuators)))
    from mbfg_ros.sim.plant import Actuator
    traj = SimulatedPlant(delayed, dt=1e-3, seed=2, actuator=Actuator.ideal(delayed)).simulate(0.1)
    commanded, applied = np.asarray(traj.efforts, float), np.asarray(traj.applied, float)
    np.testing.assert_array_equal(applied, delayed_commands(traj.t, commanded, [DELAY]))
    assert np.abs(applied - commanded).max() > 0.01
    lagging = Mechanism(dataclasses.replace(crank.spec, actuators=tuple(
        dataclasses.replace(a, delay=DELAY, time_constant=0.002) for a in crank.spec.actuators)))
    traj = SimulatedPlant(lagging, dt=1e-3, seed=2, actuator=Actuator.ideal(lagging)).simulate(0.1)
    lagged_applied = np.asarray(traj.applied, float)
    np.testing.assert_allclose(lagged_applied, delayed_commands(traj.t, np.asarray(traj.efforts, float), [DELAY],
                                                                [0.002]), rtol=0, atol=1e-12)
    assert np.abs(lagged_applied - applied).max() > 0.01


def test_time_going_back_starts_the_history_over():
    book = ActuatorDelay([0.005], keep=64)
    for k in range(10):
        book.applied(0.002 * k, np.array([float(k)]))
    assert book.applied(0.001, np.array([42.0]))[0] == 42.0      # (a reset or a clock jump: the first one)


def run(mech, motion, config, handed, correct=None):
    """(q, q̇, efforts) per step with the commands `handed` to each step; `correct`: (after step k, [(step j,
    command)]) late commands given after step k."""
    est = FixedLagEstimator(mech, config)
    out, ids, done = [], [], None
    for k in range(STEPS):
        obs = {name: float(v[k]) for name, v in motion.readings.items()}
        e = est.step(float(motion.t[k]), efforts=handed[k], observations=obs)
        ids.append(e.step)
        if correct is not None and k == correct[0]:
            done = est.correct_commands([(ids[j], c) for j, c in correct[1]])
        out.append(np.concatenate([e.q, e.v, e.efforts]))
    return np.array(out), ids, done


FUSED = EstimatorConfig(window=10, mode="fused")


def shifted(c, rows):
    out = np.empty_like(c)
    out[rows:], out[:rows] = c[:-rows], c[0]
    return out


@pytest.mark.parametrize("mode", ["fused", "forward_dynamics"])
def test_a_delayed_actuator_is_estimated_as_its_commands_given_that_much_later(crank, motion, mode):
    """The crank's actuator delayed by 3 ms (the configuration's override of the mechanism's none): the
    estimates are exactly those of an undelayed actuator handed each command 3 steps later, and differ from
    the undelayed actuator's given the same commands."""
    config = dataclasses.replace(FUSED, mode=mode)
    cmd = commands(motion)
    delayed, _, _ = run(crank, motion, dataclasses.replace(config, actuator_delays={"crank": DELAY}), cmd)
    later, _, _ = run(crank, motion, config, shifted(cmd, ROWS))
    plain, _, _ = run(crank, motion, config, cmd)
    np.testing.assert_array_equal(delayed, later)
    assert np.abs(delayed[LATE_AT:, -1] - plain[LATE_AT:, -1]).max() > 1.0


def test_a_lagging_actuator_is_estimated_as_its_commands_through_the_lag(crank, motion):
    """The crank's actuator 3 ms late through a 2-ms lag (the configuration's overrides): in fused mode the
    estimates are those of a plain actuator handed the commands so applied (`delayed_commands`), and differ from
    the delay's alone."""
    cmd = commands(motion)
    lagging, _, _ = run(crank, motion, dataclasses.replace(FUSED, actuator_delays={"crank": DELAY},
                                                            actuator_time_constants={"crank": 0.002}), cmd)
    applied = delayed_commands(motion.t[:STEPS], cmd, [DELAY], [0.002])
    handed, _, _ = run(crank, motion, FUSED, applied)
    delayed, _, _ = run(crank, motion, dataclasses.replace(FUSED, actuator_delays={"crank": DELAY}), cmd)
    np.testing.assert_allclose(lagging, handed, rtol=0, atol=1e-9 * (1 + np.abs(handed).max()))
    assert np.abs(lagging[LATE_AT:, -1] - delayed[LATE_AT:, -1]).max() > 0.1


def test_a_late_command_corrects_the_step_that_applies_it(crank, motion):
    """Step LATE_AT's command comes late (the previous one held in its place).  Given before the step that
    applies it (LATE_AT + 3) is estimated, nothing is corrected and the estimates are exactly those of the
    command in time; given after, that step is corrected (the only one: the others apply other commands) to
    within 1e-6 of them, where uncorrected they are off by > 1e-3."""
    config = dataclasses.replace(FUSED, actuator_delays={"crank": DELAY})
    cmd = commands(motion)
    reference, ids, _ = run(crank, motion, config, cmd)
    held = cmd.copy()
    held[LATE_AT] = cmd[LATE_AT - 1]
    early, _, done = run(crank, motion, config, held, (LATE_AT + 1, [(LATE_AT, cmd[LATE_AT])]))
    assert done == []
    np.testing.assert_array_equal(early, reference)
    late, ids, done = run(crank, motion, config, held, (LATE_AT + 5, [(LATE_AT, cmd[LATE_AT])]))
    assert done == [ids[LATE_AT + ROWS]]
    stale, _, _ = run(crank, motion, config, held)
    after = slice(LATE_AT + 6, None)
    scale = np.abs(reference[after]).max(axis=0) + 1.0
    off = (np.abs(late[after] - reference[after]) / scale).max()
    off_stale = (np.abs(stale[after] - reference[after]) / scale).max()
    assert off < 1e-6 and off_stale > 1e-3, (off, off_stale)


CRANK = """
name: delayed_crank
points:
  - {x: 0, y: 0, fixed: true}
  - {x: 1, y: 0}
planar_bodies:
  - {points: [0, 1], length: 1, mass: 1, I0: 0.3, cog: [0.5, 0]}
actuators:
  - {coordinate: x1, %s}
"""


def test_the_format_takes_a_delay_and_a_time_constant_in_seconds_and_refuses_what_is_not_one():
    mech = Mechanism(load_spec_from_string(CRANK % "delay: 5e-3, time_constant: 0.003"))
    assert mech.actuator_delays == (0.005,) and mech.describe()["actuator_delays"] == [0.005]
    assert mech.actuator_time_constants == (0.003,) and mech.describe()["actuator_time_constants"] == [0.003]
    plain = Mechanism(load_spec_from_string(CRANK % "effort_limit: 10"))
    assert plain.actuator_delays == (0.0,) and plain.actuator_time_constants == (0.0,)
    for key, bad, why in (("delay", "-0.001", ">= 0"), ("delay", "5", "a driver's latency of 5 ms is 0.005"),
                          ("delay", "'soon'", "delay"), ("time_constant", "-1e-3", ">= 0"),
                          ("time_constant", "3", "a current loop's 3-ms rise is 0.003")):
        with pytest.raises(MechanismError, match=rf"actuators\[0\]\.{key}") as err:
            load_spec_from_string(CRANK % f"{key}: {bad}")
        assert why in str(err.value), str(err.value)


def test_the_configuration_overrides_the_mechanisms_delays_by_joint(crank):
    dp = load_mechanism("double_pendulum_c0")
    assert configured_delays(dp) == [0.003, 0.003]
    assert configured_delays(dp, {"q2": 0.0}) == [0.003, 0.0]
    with pytest.raises(ValueError, match=r"unknown actuator joint\(s\) 'elbow' \(known: q1, q2\)"):
        configured_delays(dp, {"elbow": 0.001})
    with pytest.raises(ValueError, match=r"actuator_delays.crank must be a time in seconds, >= 0 and under 1"):
        EstimatorConfig(actuator_delays={"crank": -1.0}).validated()
    with pytest.raises(ValueError, match="unknown actuator joint"):
        FixedLagEstimator(crank, EstimatorConfig(mode="fused", actuator_delays={"elbow": 0.001}))
    # none: nothing kept, nothing done
    assert FixedLagEstimator(crank, EstimatorConfig(mode="fused")).delay is None


def test_tune_fits_the_commands_as_the_actuators_apply_them():
    """`mbfg tune`'s likelihood on a mechanism with delayed (and lagging) actuators is that of the same mechanism
    without them handed the commands so applied (`Recording.as_applied`)."""
    from mbfg_ros.tuning.likelihood import Recording, encoder_layout, initial_values, log_likelihood
    dp = load_mechanism("double_pendulum_c0")
    undelayed = Mechanism(dataclasses.replace(dp.spec, actuators=tuple(dataclasses.replace(a, delay=0.0,
                                                                                           time_constant=0.0)
                                                                       for a in dp.spec.actuators)))
    names, coords, _ = encoder_layout(dp)
    t = jittered_times(500)
    y = np.column_stack([0.3 * np.sin(2 * np.pi * t), 0.2 * np.sin(3 * np.pi * t)])
    c = np.column_stack([0.5 * np.sin(40 * t), 0.2 * np.cos(30 * t)])
    rec = Recording(t, y, names, coords, c, "sim")
    applied = rec.as_applied(dp)
    np.testing.assert_array_equal(applied.commands, delayed_commands(t, c, [0.003, 0.003], [0.004, 0.004]))
    assert rec.as_applied(undelayed) is rec
    values = initial_values(dp)
    ll = log_likelihood(undelayed, applied, "fused", values)
    assert np.isfinite(ll) and log_likelihood(undelayed, rec, "fused", values) != ll
    from mbfg_ros.tuning.likelihood import fit
    names = ["disturbance_density"]
    assert fit(dp, rec, "fused", values, names).sigmas == fit(undelayed, applied, "fused", values, names).sigmas


def test_the_node_takes_the_delays_as_parameters(tmp_path):
    """`actuator_delays.<joint>` and `actuator_time_constants.<joint>` (default: the mechanism file's) reach the
    core and the diagnostics; changed at run time they rebuild it; a negative one is refused with the reason and
    the node keeps its parameters."""
    pytest.importorskip("rclpy")
    from rclpy.parameter import Parameter
    from ros_helpers import estimator_node_here
    with estimator_node_here("mechanism:=double_pendulum_c0", "mode:=fused", "dt:=0.002",
                             "publish_markers:=false") as node:
        assert node.config.actuator_delays == {}
        assert node.get_parameter("actuator_delays.q1").value == 0.003
        assert list(node.core.delay.delays) == [0.003, 0.003]
        assert list(node.core.delay.time_constants) == [0.004, 0.004]
        assert node.set_parameters([Parameter("actuator_delays.q2", value=0.0)])[0].successful
        assert node.config.actuator_delays == {"q2": 0.0}
        assert list(node.core.delay.delays) == [0.003, 0.0]
        assert node.diagnostic_status()[1][4]["actuator_delays"] == "q1=3 ms, q2=0 ms"
        assert node.diagnostic_status()[1][4]["actuator_time_constants"] == "q1=4 ms, q2=4 ms"
        assert node.get_parameter("actuator_time_constants.q2").value == 0.004
        assert node.set_parameters([Parameter("actuator_time_constants.q1", value=0.001)])[0].successful
        assert node.config.actuator_time_constants == {"q1": 0.001}
        assert list(node.core.delay.time_constants) == [0.001, 0.004]
        assert node.diagnostic_status()[1][4]["actuator_time_constants"] == "q1=1 ms, q2=4 ms"
        for name in ("actuator_delays.q1", "actuator_time_constants.q2"):
            refused = node.set_parameters([Parameter(name, value=-0.001)])[0]
            assert not refused.successful and name in refused.reason, refused.reason
        assert node.config.actuator_delays == {"q2": 0.0}
        assert node.config.actuator_time_constants == {"q1": 0.001}


def test_a_parameter_file_sets_the_delays_for_mbfg_estimate(tmp_path):
    """`actuator_delays` of a node parameter file (the node's `actuator_delays.<joint>`) is applied by `mbfg
    estimate --params`; an unknown actuator or a value that is not a latency is an error naming the key."""
    from mbfg_ros.tuning.params_file import ParamsFileError, read_params
    dp = load_mechanism("double_pendulum_a0")
    p = tmp_path / "p.yaml"
    p.write_text("/**/mbfg_estimator:\n  ros__parameters:\n    actuator_delays:\n      q2: 0.0\n"
                 "    actuator_time_constants:\n      q1: 0.002\n")
    assert read_params(p, dp) == {"actuator_delays": {"q2": 0.0}, "actuator_time_constants": {"q1": 0.002}}
    for key in ("actuator_delays", "actuator_time_constants"):
        for body, match in (("elbow: 0.001", rf"{key}.elbow: unknown actuator of double_pendulum_a0 "
                                             r"\(known: q1, q2\)"),
                            ("q1: 5", rf"{key}.q1 must be a time in seconds, >= 0 and under 1 \(got 5\)"),
                            ("q1: -0.001", rf"{key}.q1 must be a time in seconds")):
            p.write_text(f"/**/mbfg_estimator:\n  ros__parameters:\n    {key}:\n      {body}\n")
            with pytest.raises(ParamsFileError, match=match):
                read_params(p, dp)


def test_mbfg_estimate_takes_a_delay_option(tmp_path, capsys):
    """`mbfg estimate --actuator-delay NAME=SECONDS` and `--actuator-time-constant NAME=SECONDS` win over the
    mechanism file's delay and lag: 0 gives the estimate of the mechanism without them; a bad value or an unknown
    actuator is an error naming it."""
    import yaml
    from mbfg_ros.cli import commands as cli
    from pathlib import Path
    from conftest import DFKI_COLUMNS, dfki_rows
    data = tmp_path / "run.csv"            # (its first 800 rows, 2 s)
    np.savetxt(data, dfki_rows("design_A.0__20220819__174435-pendubot_tvlqr_lqr__trajectory")[:800], delimiter=",",
               header=",".join(DFKI_COLUMNS), comments="")
    doc = yaml.safe_load(Path(load_mechanism("double_pendulum_a0").spec.source).read_text())
    for a in doc["actuators"]:
        a.pop("delay")
        a.pop("time_constant")
    undelayed = tmp_path / "a0.yaml"
    undelayed.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    columns = ["--observations", data, "--reading", "q1=pos_meas1,q2=pos_meas2", "--torques", data,
               "--command", "q1=tau_con1,q2=tau_con2", "--mode", "fused"]

    def estimate(mech, *extra):
        out = tmp_path / "e.csv"
        rc = cli.main([str(a) for a in ["estimate", mech, *columns, *extra, "-o", out]])
        err = capsys.readouterr().err
        return rc, (np.loadtxt(out, delimiter=",", skiprows=1, max_rows=400) if rc == 0 else None), err

    rc, zero, _ = estimate("double_pendulum_a0", "--actuator-delay", "q1=0,q2=0", "--actuator-time-constant",
                           "q1=0", "--actuator-time-constant", "q2=0")
    assert rc == 0
    rc, plain, _ = estimate(undelayed)
    np.testing.assert_array_equal(zero, plain)
    rc, shipped, _ = estimate("double_pendulum_a0")
    assert np.abs(shipped - plain).max() > 1e-3
    rc, unlagged, _ = estimate("double_pendulum_a0", "--actuator-time-constant", "q1=0,q2=0")
    assert rc == 0 and np.abs(shipped - unlagged).max() > 1e-3 and np.abs(unlagged - plain).max() > 1e-3
    for option in ("--actuator-delay", "--actuator-time-constant"):
        for bad, message in (("q1=5", f"{option} takes NAME=SECONDS, 0 <= SECONDS < 1 (5 ms is 0.005; got 'q1=5')"),
                             ("elbow=0.001", "'elbow' is not an actuator of the mechanism (q1, q2)")):
            rc, _, err = estimate("double_pendulum_a0", option, bad)
            assert rc == 2 and message in err, err
