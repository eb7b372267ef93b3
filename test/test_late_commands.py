"""Commands that arrive after their step was estimated (`FixedLagEstimator.correct_commands`): a step still
in the window is corrected to the estimates of a command that came in time; a step that left the window,
a mode whose factors do not take the commands, and the hermite integrator (whose factors read the
commands of three steps) are left alone."""

import dataclasses

import numpy as np
import pytest

from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.sim.plant import SimulatedPlant

STEPS = 160
LATE_AT = 100          # the step whose command comes late
JUMP = 20.0            # [N·m] the command changes by this much at LATE_AT (so a stale hold is far off)


@pytest.fixture(scope="module")
def motion(crank):
    """The crank four-bar driven by its plant (actuator mismatch: the disturbance is not 0), 1 kHz."""
    return SimulatedPlant(crank, dt=1e-3, seed=2).simulate(STEPS * 1e-3)


def commands(motion):
    """The commands as they were sent: the plant's, with a jump at LATE_AT (the readings stay the plant's:
    the estimator takes the jump for a disturbance, which makes the difference a late command makes large)."""
    c = np.array(motion.efforts, dtype=float).reshape(STEPS + 1, -1)[:STEPS].copy()
    c[LATE_AT:] += JUMP
    return c


def run(crank, motion, config, handed, corrections_at=None):
    """Estimates (q, q̇, efforts stacked per step) with the commands `handed` to each step and, after step
    `corrections_at[0]`, the corrections `corrections_at[1]` as (step index, command) pairs."""
    est = FixedLagEstimator(crank, config)
    out, ids = [], []
    for k in range(STEPS):
        obs = {name: float(v[k]) for name, v in motion.readings.items()}
        e = est.step(float(motion.t[k]), efforts=handed[k], observations=obs)
        ids.append(e.step)
        if corrections_at is not None and k == corrections_at[0]:
            done = est.correct_commands([(ids[j], c) for j, c in corrections_at[1]])
            assert done == [ids[j] for j, _ in corrections_at[1] if k - j < config.window]
        out.append(np.concatenate([e.q, e.v, e.efforts]))
    return np.array(out), est, ids


FUSED = EstimatorConfig(window=10, mode="fused")


@pytest.mark.parametrize("formulation", ["dependent", "independent"])
@pytest.mark.parametrize("delay", [0, 3, 8])
def test_a_late_command_gives_the_estimates_of_one_in_time(crank, motion, formulation, delay):
    """Step LATE_AT is estimated with the previous command held; its own command arrives `delay` steps later
    and replaces it: from then on the estimates are those of the command in time, within 1e-6 (the later
    steps were linearized at the old estimates: a second-order difference); without the correction they are
    off by the jump's effect (~1e-2 and more)."""
    config = dataclasses.replace(FUSED, formulation=formulation)
    cmd = commands(motion)
    reference, _, _ = run(crank, motion, config, cmd)
    held = cmd.copy()
    held[LATE_AT] = cmd[LATE_AT - 1]
    corrected, _, _ = run(crank, motion, config, held, (LATE_AT + delay, [(LATE_AT, cmd[LATE_AT])]))
    stale, _, _ = run(crank, motion, config, held)
    after = slice(LATE_AT + delay + 1, None)
    scale = np.abs(reference[after]).max(axis=0) + 1.0
    off = (np.abs(corrected[after] - reference[after]) / scale).max()
    off_stale = (np.abs(stale[after] - reference[after]) / scale).max()
    assert off < 1e-6 and off_stale > 1e-3, (off, off_stale)
    assert np.array_equal(corrected[:LATE_AT], reference[:LATE_AT])


def test_a_late_command_replaces_the_hold_in_every_step_it_covers(crank, motion):
    """Steps LATE_AT … LATE_AT+3 were estimated with the previous command held, or with no command ("unknown",
    as the node's fused mode hands a step whose command did not come); the late command is valid until
    replaced, so it replaces the stale one in all four: the estimates of that command held in time, within
    2e-5 of each quantity's scale (the steps after them were linearized at estimates made with commands up to
    ~100 N·m off; uncorrected the difference is 1e-2 to 1e-1)."""
    cmd = commands(motion)
    held_in_time = cmd.copy()
    held_in_time[LATE_AT:LATE_AT + 4] = cmd[LATE_AT]
    reference, _, _ = run(crank, motion, FUSED, held_in_time)
    for stale_value in (cmd[LATE_AT - 1], np.full(cmd.shape[1], np.nan)):
        handed = held_in_time.copy()
        handed[LATE_AT:LATE_AT + 4] = stale_value
        fix = (LATE_AT + 5, [(j, cmd[LATE_AT]) for j in range(LATE_AT, LATE_AT + 4)])
        corrected, _, _ = run(crank, motion, FUSED, handed, fix)
        stale, _, _ = run(crank, motion, FUSED, handed)
        after = slice(LATE_AT + 6, None)
        scale = np.abs(reference[after]).max(axis=0) + 1.0
        off = (np.abs(corrected[after] - reference[after]) / scale).max()
        off_stale = (np.abs(stale[after] - reference[after]) / scale).max()
        # (measured: 8e-7 vs 0.012 held, 7e-6 vs 0.083 unknown: ~100 N·m off for four steps)
        assert off < 2e-5 and off_stale > 1e-2, (off, off_stale)


def test_the_newest_step_corrected_predicts_the_next_one_with_the_new_command(crank, motion):
    """The newest step's command replaced right after it was estimated (delay 0), with the next step's
    prediction already prepared from the old one: the same estimates as the command in time, to rounding."""
    cmd = commands(motion)
    reference, _, _ = run(crank, motion, FUSED, cmd)
    held = cmd.copy()
    held[LATE_AT] = cmd[LATE_AT - 1]
    est = FixedLagEstimator(crank, FUSED)
    out = []
    for k in range(STEPS):
        e = est.step(float(motion.t[k]), efforts=held[k],
                     observations={name: float(v[k]) for name, v in motion.readings.items()})
        if k == LATE_AT:
            assert est.prepare_next_step()
            assert est.correct_commands([(e.step, cmd[LATE_AT])]) == [e.step]
        out.append(np.concatenate([e.q, e.v, e.efforts]))
    out = np.array(out)
    assert np.abs(out[LATE_AT + 1:] - reference[LATE_AT + 1:]).max() < 1e-9


def test_steps_that_left_the_window_are_not_corrected(crank, motion):
    cmd = commands(motion)
    held = cmd.copy()
    held[LATE_AT] = cmd[LATE_AT - 1]
    stale, est, ids = run(crank, motion, FUSED, held)
    x_before = est.stepper.x.copy()
    assert est.correct_commands([(ids[LATE_AT], cmd[LATE_AT])]) == []          # 59 steps ago
    assert est.correct_commands([(ids[-1] + 1, cmd[LATE_AT])]) == []           # not estimated yet
    assert est.correct_commands([(ids[-11], cmd[-11])]) == []                  # just out of the window
    assert est.correct_commands([(ids[-11], cmd[-11]), (ids[-2], cmd[-2])]) == [ids[-2]]
    # the step's own command again: the same factor (re-eliminated: equal to rounding)
    np.testing.assert_allclose(est.stepper.x, x_before, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="expected 1 efforts"):
        est.correct_commands([(ids[-2], [1.0, 2.0])])
    est.reset()
    assert est.correct_commands([(ids[-2], cmd[-2])]) == []


@pytest.mark.parametrize("config", [EstimatorConfig(window=10, mode="estimation"),
                                    EstimatorConfig(window=10, mode="fused", integrator="hermite")],
                         ids=["estimation", "fused-hermite"])
def test_no_correction_where_the_command_does_not_enter_one_step_alone(crank, motion, config):
    """Estimation mode ignores the commands; the hermite integrator's factors read the commands' rate over
    three steps and the previous step's forces: neither is corrected (the node then holds the late command
    for the next steps only)."""
    cmd = commands(motion)
    _, est, ids = run(crank, motion, config, cmd)
    x_before = est.stepper.x.copy()
    assert est.correct_commands([(ids[-2], cmd[-2] + 5.0)]) == []
    assert np.array_equal(est.stepper.x, x_before)


def test_forward_dynamics_takes_a_late_command_too(crank, motion):
    """The digital twin (commands are the forces): a late command replaces the held one in its step; the
    step's linearization point was predicted with the held command, so the match is to the
    relinearization threshold rather than to rounding."""
    config = EstimatorConfig(window=10)
    cmd = commands(motion)
    reference, _, _ = run(crank, motion, config, cmd)
    held = cmd.copy()
    held[LATE_AT] = cmd[LATE_AT - 1]
    corrected, _, _ = run(crank, motion, config, held, (LATE_AT + 3, [(LATE_AT, cmd[LATE_AT])]))
    stale, _, _ = run(crank, motion, config, held)
    after = slice(LATE_AT + 4, None)
    off = np.abs(corrected[after] - reference[after]).max()
    off_stale = np.abs(stale[after] - reference[after]).max()
    assert off < 1e-3 * off_stale, (off, off_stale)
