"""Relative angles stay continuous through every path of the estimator (issue 13): a crank whose encoder
reads several turns from 0 (1.38 + 6·2π, and −3 turns) is estimated on the reading's turn at start-up and
after a re-initialization on request, a disagreement with the readings, a reset, a branch change either
way, a numerical failure and a skipped stretch of steps; an angle without readings stays on the turn of
its own last estimate.  The encoder's residual is wrapped (a reading matches its angle on any turn), so an
estimate a whole turn off would otherwise never come back.  ROS-free; the same over DDS is in
test_node_angles.py."""

import math

import numpy as np
import pytest

from mbfg_ros.dynamics import constrained, kinematics
from mbfg_ros.dynamics.coordinates import unwrap_angles
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.graph import window as G
from mbfg_ros.sim.plant import SimulatedPlant

TWO_PI = 2.0 * math.pi
CRANK_AT = 1.38      # the crank angle of the report (mod 2π)


def crank_pose(mech, angle):
    """The crank four-bar assembled with its crank at `angle` (turns included), on the drawn branch."""
    guess = np.array(mech.q0, dtype=float)
    c = mech.coordinate_index("crank")
    guess[c] = angle
    return kinematics.solve_positions(mech, guess, fixed=[c]).q


@pytest.fixture(scope="module", params=[6, -3], ids=["6turns", "-3turns"])
def plant(request, crank):
    """1.5 s of the crank four-bar swinging around 1.38 + turns·2π (noisy encoder and gyroscope)."""
    q0 = crank_pose(crank, CRANK_AT + request.param * TWO_PI)
    traj = SimulatedPlant(crank, dt=1e-3, q0=q0, seed=7).simulate(1.5)
    assert abs(traj.q[:, crank.coordinate_index("crank")] - q0[4]).max() < 2.0    # it swings, it does not turn
    return traj


@pytest.fixture(scope="module")
def turning(crank):
    """2 s of the crank four-bar turning at about 5 rad/s (PD on a ramp, gravity compensated) from
    1.38 + 6·2π: it goes round 1.6 times."""
    q0 = crank_pose(crank, CRANK_AT + 6 * TWO_PI)
    c = crank.coordinate_index("crank")
    rate = 5.0

    def ramp(mech, t, q, v):
        gravity = constrained.inverse_dynamics(mech, q, np.zeros(mech.n), np.zeros(mech.n))
        return np.array([120.0 * (q0[c] + rate * t - q[c]) + 15.0 * (rate - v[c])]) + gravity

    traj = SimulatedPlant(crank, dt=1e-3, q0=q0, seed=8, profile=ramp).simulate(2.0)
    assert traj.q[-1, c] - q0[c] > 1.5 * TWO_PI
    return traj


def drive(est, traj, steps, actions=None, sensors=("crank", "coupler_gyro"), skip=()):
    """Step `est` over the plant's steps `steps` (those in `skip` left out), with the readings of `sensors`;
    `actions[k](est)` is called before step k.  Returns {k: Estimate}."""
    actions = actions or {}
    out = {}
    for k in steps:
        if k in actions:
            actions[k](est)
        if k in skip:
            continue
        obs = {n: float(traj.readings[n][k]) for n in sensors}
        out[k] = est.step(float(traj.t[k]), observations=obs)
    return out


def assert_on_the_readings_turn(out, traj, crank, tol=0.05, after=0):
    """Every estimate (from step `after` on) within tol of its encoder reading: not 2πk away."""
    c = crank.coordinate_index("crank")
    worst = max(abs(e.q[c] - traj.readings["crank"][k]) for k, e in out.items() if k >= after)
    assert worst < tol, f"crank estimate {worst:.4g} rad from its reading ({worst / TWO_PI:.2f} turns)"


def estimator(crank, **kw):
    return FixedLagEstimator(crank, EstimatorConfig(window=10, mode="estimation", **kw))


def test_unwrap_angles_moves_only_angles_by_whole_turns(crank):
    q = crank_pose(crank, 0.3)
    ref = q.copy()
    ref[4] = 0.3 + 5 * TWO_PI - 3.0     # within half a turn of 0.3 + 5 turns
    ref[:4] += 100.0                    # point coordinates (lengths) are never moved
    out = unwrap_angles(crank, q, ref)
    assert out[4] == pytest.approx(0.3 + 5 * TWO_PI) and np.array_equal(out[:4], q[:4])
    ref[4] = np.nan                     # no reference: as it is
    assert unwrap_angles(crank, q, ref)[4] == q[4]


def test_start_and_reinitialization_on_request(crank, plant):
    """The first position problem used to put the reading on the drawn pose's turn (1.38 for 1.38 + 12π);
    a re-initialization on request (solved at the estimate, or applied before the next step) keeps it."""
    out = drive(estimator(crank), plant, range(1500),
                {400: lambda e: e.reinitialize(), 700: lambda e: (e.reinitialize(), e.apply_reinitialization()),
                 1000: lambda e: [e.reinitialize() for _ in range(5)]})
    assert sum("re-initialized on request" in e.message for e in out.values()) == 3
    assert_on_the_readings_turn(out, plant, crank, tol=0.01)


def test_reinitialization_from_readings_a_turn_and_more_away(crank, plant):
    """The encoder jumps by 2π + 0.5 (outside the gate even modulo 2π) for good: after max_rejections the
    window is re-initialized from the readings, on their turn (it used to be the prediction's turn, 0.5 rad
    from it modulo 2π).  Then the encoder is silent for 0.1 s and comes back a turn further than the
    prediction (the crank went round once more meanwhile): its first reading passes the wrapped gate and
    re-initializes at once on its turn (the estimate used to stay a turn from every reading that followed)."""
    est = estimator(crank)
    readings = plant.readings["crank"].copy()
    readings[500:] += TWO_PI + 0.5
    readings[1100:] += TWO_PI
    out = {}
    c = crank.coordinate_index("crank")
    for k in range(1500):
        out[k] = est.step(float(plant.t[k]), observations={} if 1000 <= k < 1100 else {"crank": float(readings[k])})
    believed = 500 + est.config.max_rejections
    assert [k for k in range(500, 1500) if out[k].status == "recovered"] == [believed, 1100]
    assert "disagreed" in out[believed].message and "turn(s) from the predicted" in out[1100].message
    errors = np.array([out[k].q[c] - readings[k] for k in range(1500) if not 1000 <= k < 1100])
    assert np.abs(errors[:500]).max() < 0.01 and np.abs(errors[believed:]).max() < 0.05
    assert np.abs(errors[believed + 100:1000]).max() < 0.01 and np.abs(errors[-100:]).max() < 0.01
    assert (out[believed].recovery, out[1100].recovery) == ("lost_track", "turn")


def single_turn_crank(crank):
    """The crank four-bar with its crank encoder declared single-turn (`turns: single`)."""
    from mbfg_ros.model.mechanism import Mechanism
    from mbfg_ros.model.loader import load_spec_from_string
    text = open(crank.spec.source).read().replace("{type: encoder, coordinate: crank, sigma: 0.001}",
                                                  "{type: encoder, coordinate: crank, sigma: 0.001, turns: single}")
    mech = Mechanism(load_spec_from_string(text, "four_bar_crank (single-turn encoder)"))
    assert [s.single_turn for s in mech.sensors] == [True, False]
    return mech


def wrapped_readings(traj):
    return {"crank": np.remainder(traj.readings["crank"] + math.pi, TWO_PI) - math.pi,
            "coupler_gyro": traj.readings["coupler_gyro"]}


def test_a_single_turn_encoder_keeps_the_estimate_continuous(crank, turning):
    """An encoder declared single-turn (readings in [-π, π)) on a turning crank: the estimate starts on the
    reading and stays continuous with its own past where the readings wrap (no re-initialization), and a
    re-initialization on request or from the readings and a reset keep it on its own turn."""
    c = crank.coordinate_index("crank")
    wrapped = wrapped_readings(turning)
    est = estimator(single_turn_crank(crank))
    out = {}
    for k in range(2000):
        if k == 900:
            est.reinitialize()
        if k == 1300:
            est.reset()
        obs = {n: float(v[k]) for n, v in wrapped.items()}
        if 1500 <= k < 1510:
            obs["crank"] += 0.5         # 10 glitches: rejected, as on any encoder
        out[k] = est.step(float(turning.t[k]), observations=obs)
    q = np.array([out[k].q[c] for k in range(2000)])
    assert np.abs(np.diff(q)).max() < 0.1                         # continuous: never a jump of a turn
    truth = turning.q[:2000, c]
    offset = q - truth                                            # a whole number of turns, always the same
    assert np.abs(offset - offset[0]).max() < 0.02 and abs(offset[0] - TWO_PI * round(offset[0] / TWO_PI)) < 0.01
    assert [k for k in range(1, 2000) if out[k].status == "recovered"] == []


def test_a_wrapping_encoder_not_declared_single_turn_is_followed_on_its_reading(crank, turning):
    """The same wrapped readings from an encoder left at the default (multi-turn: the reading is the angle):
    nothing guesses that it wrapped; each wrap is a reading a turn from the prediction, which re-initializes
    on the reading's turn (counted as a turn recovery, the message says how to declare the encoder), so every
    estimate is on its reading's turn."""
    c = crank.coordinate_index("crank")
    wrapped = wrapped_readings(turning)
    est = estimator(crank)
    out = {k: est.step(float(turning.t[k]), observations={n: float(v[k]) for n, v in wrapped.items()})
           for k in range(2000)}
    jumps = np.flatnonzero(np.abs(np.diff(wrapped["crank"][:2000])) > math.pi) + 1
    assert len(jumps) >= 1
    turned = [k for k in range(2000) if out[k].recovery == "turn"]
    assert turned == list(jumps), (turned, jumps)
    assert all("turns: single" in out[k].message for k in turned)
    assert max(abs(out[k].q[c] - wrapped["crank"][k]) for k in range(2000)) < 0.05


def test_a_burst_of_readings_whole_turns_off_is_followed_and_left(crank, plant):
    """1 s of readings 50 turns off (a multi-turn encoder's glitch, or a re-homing): the estimate follows the
    readings onto their turn and back (two turn recoveries); the encoder's turns are still checked afterwards
    (a reading a turn off re-initializes again), and a later divergence re-initializes on the reading's turn."""
    c = crank.coordinate_index("crank")
    est = estimator(crank)
    readings = plant.readings["crank"].copy()
    readings[300:1000] += 50 * TWO_PI
    readings[1300:] += TWO_PI
    out = {k: est.step(float(plant.t[k]), observations={"crank": float(readings[k]),
                                                        "coupler_gyro": float(plant.readings["coupler_gyro"][k])})
           for k in range(1500)}
    assert [k for k in range(1500) if out[k].recovery == "turn"] == [300, 1000, 1300]
    assert_on_the_readings_turn({k: e for k, e in out.items()}, type(plant)(plant.t, plant.q, plant.v, plant.a,
                                plant.efforts, plant.Q, {**plant.readings, "crank": readings}), crank)


def test_reset(crank, plant):
    """After a reset the new start is on the reading's turn again (time going backwards resets too)."""
    out = drive(estimator(crank), plant, range(1200), {600: lambda e: e.reset()})
    assert out[600].status == "initialized"
    assert_on_the_readings_turn(out, plant, crank, tol=0.01)
    est = estimator(crank)
    out = drive(est, plant, range(600))
    out.update(drive(est, plant, range(300, 700)))          # a loop of the recording: time goes back 0.3 s
    assert "time went backwards" in out[300].message
    assert_on_the_readings_turn(out, plant, crank, tol=0.01)


@pytest.mark.parametrize("branches", [[(1,), (-1,)], [(-1,)], [(1,)]], ids=["+1then-1", "-1", "+1"])
def test_branch_change(crank, plant, branches):
    """assembly_mode [1] then [-1] (the issue's k = 2), [-1] (set_assembly_mode(false)) and [1] alone: the crank
    is held at its estimate while the rest changes branch; on the plant's own branch (-1) the estimate
    tracks again."""
    actions = {400 + 200 * i: (lambda e, m=m: e.reinitialize(assembly_mode=m)) for i, m in enumerate(branches)}
    out = drive(estimator(crank), plant, range(1400), actions)
    c = crank.coordinate_index("crank")
    off = np.array([out[k].q[c] - plant.readings["crank"][k] for k in sorted(out)])
    turns = np.round(off / TWO_PI)
    # on the other branch the estimate fights the readings (it drifts, up to 4 rad before a re-initialization
    # from them): never where it would agree with them modulo 2π, a whole turn away
    assert not np.any((turns != 0) & (np.abs(off - TWO_PI * turns) < 0.05)), off[turns != 0]
    if branches[-1] == (-1,):
        assert_on_the_readings_turn(out, plant, crank, tol=0.01, after=1000)
        assert all(tuple(out[k].assembly_mode) == (-1,) for k in range(1000, 1400))


def test_recovery_from_numerical_failures(crank, plant, monkeypatch):
    """The window's update fails once in a step (re-seeded at the last estimate), twice (the re-seed fails too:
    re-initialized at the step's time from an extrapolation), at every try (the previous estimate
    extrapolated, re-initialized at the next step), and the estimate is NaN: every estimate stays on the
    reading's turn."""
    commit = G.FixedLagWindow.commit
    failures = {300: 1, 600: 2, 900: 100}
    step = {"k": None}

    def flaky(self, *a, **kw):
        if failures.get(step["k"], 0) > 0:
            failures[step["k"]] -= 1
            raise RuntimeError("Indeterminant linear system detected (injected)")
        return commit(self, *a, **kw)

    monkeypatch.setattr(G.FixedLagWindow, "commit", flaky)
    estimate = G.FixedLagWindow.estimate
    est = estimator(crank)
    out = {}
    for k in range(1300):
        step["k"] = k
        if k == 1100:
            monkeypatch.setattr(G.FixedLagWindow, "estimate", lambda self, j: estimate(self, j) * np.nan)
        obs = {n: float(plant.readings[n][k]) for n in ("crank", "coupler_gyro")}
        out[k] = est.step(float(plant.t[k]), observations=obs)
        monkeypatch.setattr(G.FixedLagWindow, "estimate", estimate)
    recovered = [k for k, e in out.items() if e.status == "recovered"]
    assert recovered == [300, 600, 900, 901, 1100, 1101], recovered
    assert "re-seeded at the last good estimate" in out[300].message
    assert "re-initialized at t=" in out[600].message
    assert "extrapolated previous estimate" in out[900].message and "re-initialized after" in out[901].message
    assert_on_the_readings_turn(out, plant, crank, tol=0.05)
    assert_on_the_readings_turn(out, plant, crank, tol=0.01, after=1200)


@pytest.mark.parametrize("max_substeps", [10000, 50], ids=["integrated", "re-initialized"])
def test_skip_ahead(crank, plant, turning, max_substeps):
    """The node skips steps when it falls behind: a gap of 0.4 s and one of 0.6 s, bridged by integrating
    without readings (the unknown torque lets the prediction drift: the first reading after the gap
    re-initializes from the readings) or, beyond max_substeps, re-initialized from an extrapolation; the
    estimate after each is on the reading's turn, also while the crank turns (2 and 3 rad during the
    gaps)."""
    skip = set(range(300, 700)) | set(range(800, 1400))
    for traj in (plant, turning):
        out = drive(estimator(crank, max_substeps=max_substeps), traj, range(1500), skip=skip)
        assert 700 in out and 1400 in out
        assert_on_the_readings_turn(out, traj, crank, tol=0.05)
        assert_on_the_readings_turn(out, traj, crank, tol=0.01, after=1450)


def test_a_gap_whose_integration_fails_re_initializes_from_the_readings_after_it(crank, plant):
    """The integration across a 0.6-s gap fails numerically (as it may where the unknown torque lets the
    prediction drift far): the recovery re-seeds at the last estimate and integrates again, and the reading
    after the gap, far from that prediction, re-initializes at once as after a usual gap (it was once taken for
    an outlier for 10 steps, the estimate half a turn off)."""
    from mbfg_ros.estimation.estimates import StepFailure
    est = estimator(crank)
    skip = set(range(800, 1400))
    out = drive(est, plant, range(800))
    advance = est.stepper.advance_to
    failed = []

    def fail_once(*args, **kwargs):
        if not failed:
            failed.append(True)
            raise StepFailure("linearization did not converge (injected)")
        return advance(*args, **kwargs)

    est.stepper.advance_to = fail_once
    out.update(drive(est, plant, range(800, 1420), skip=skip))
    assert failed and out[1400].status == "recovered" and out[1400].recovery == "lost_track", out[1400].message
    assert_on_the_readings_turn(out, plant, crank, tol=0.05)


def test_an_unobserved_angle_stays_on_its_own_turn(crank, turning):
    """The crank turns; its encoder goes silent after 0.7 s (the coupler's gyroscope only from then on), when
    the estimate has followed it 0.6 turns on: its turn is then what the estimate has followed.  Re-
    initializations on request, a branch change both ways, a reset (the fresh start's drawn pose is moved
    onto the last estimate's turn; it used to fall back on the drawn pose's turn) and a gap never move it by
    a whole turn.  (From a coupler gyroscope alone the crank's angle drifts: only its continuity is
    asserted.)"""
    c = crank.coordinate_index("crank")
    est = estimator(crank)
    actions = {800: lambda e: e.reinitialize(), 850: lambda e: e.reinitialize(assembly_mode=(1,)),
               900: lambda e: e.reinitialize(assembly_mode=(-1,)), 1000: lambda e: e.reset()}
    out = drive(est, turning, range(700), sensors=("crank", "coupler_gyro"))
    assert abs(out[699].q[c] - turning.q[699, c]) < 0.01
    out.update(drive(est, turning, range(700, 2000), actions, sensors=("coupler_gyro",),
                     skip=set(range(1500, 1600))))
    assert out[1000].status == "initialized" and "re-initialized on request" in out[800].message
    ks = sorted(out)
    jumps = np.array([out[b].q[c] - out[a].q[c] for a, b in zip(ks, ks[1:])])
    assert np.abs(jumps).max() < 0.5 * TWO_PI, np.abs(jumps).max()


def test_with_the_gate_off_a_glitch_is_not_taken_for_a_wrap(crank, plant):
    """Without the innovation gate every reading is fused: a 4-rad glitch (nearer a turn than no turn, but not
    within a quarter turn of one) is neither a wrap nor a turn to re-initialize on (fused wrapped, it
    upsets the estimate for a while, the gate is there for that: the estimate may stop following its readings
    and be re-initialized from them, a lost track, never a turn recovery)."""
    est = estimator(crank, outlier_gate=0.0)
    readings = plant.readings["crank"].copy()
    readings[300] += 4.0
    out = {k: est.step(float(plant.t[k]), observations={"crank": float(readings[k])}) for k in range(600)}
    assert all(e.recovery in ("", "lost_track") for e in out.values())
    assert not any("turn(s) from the predicted" in e.message for e in out.values())
    assert max(abs(out[k].q[4] - readings[k]) for k in range(600) if k != 300) < 1.0


def test_a_late_reading_a_whole_turn_off_moves_the_estimate_onto_its_turn(crank, plant):
    """A starved feed: the estimate runs on the model and the gyroscope alone, on the wrong turn (started from a
    guess a turn off), and the encoder's readings arrive only late.  Its wrapped residual would accept them on any
    turn; instead the first one is refused and the next step re-seeds the estimate moved onto its turn
    (recovery "turn"), and later late readings are fused there."""
    c = crank.coordinate_index("crank")
    q0 = plant.q[0].copy()
    q0[c] += TWO_PI
    est = FixedLagEstimator(crank, EstimatorConfig(dt=1e-3, mode="estimation"), q0=q0)
    seen = {}
    for k in range(200):
        seen[k] = est.step(float(plant.t[k]), observations={"coupler_gyro": float(plant.readings["coupler_gyro"][k])})
    assert round((seen[199].q[c] - plant.q[199, c]) / TWO_PI) == 1           # a whole turn off, nothing noticed
    fused, refused = est.add_late_observations(seen[198].step, {"crank": float(plant.readings["crank"][198])})
    assert (fused, refused) == ([], ["crank"])
    e = est.step(float(plant.t[200]), observations={"coupler_gyro": float(plant.readings["coupler_gyro"][200])})
    assert e.recovery == "turn" and e.status == "recovered" and "1 turn(s) from the estimate" in e.message
    assert abs(e.q[c] - plant.q[200, c]) < 0.05
    fused, refused = est.add_late_observations(e.step, {"crank": float(plant.readings["crank"][200])})
    assert fused == ["crank"]
