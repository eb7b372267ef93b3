"""Never losing track silently (issue 21, point 3) and the encoders' σ fitted online (point 2): the fit
(`estimation/sigma_adaptation.py`) recovers a known σ from simulated readings, keeps the stated σ for readings
exact to their quantization, reaches the estimator's units (compiled step models included); an estimate that is
knocked off its readings (a reading jump, a wrong command burst) is re-initialized from them, counted
(`Estimate.recovery == "lost_track"`) and its message names the encoder and the distance; a reading stamped
late after an overrun of the logging loop (`estimation/reading_timing.py`) does not drag the estimate off
the motion."""

from __future__ import annotations

import math

import numpy as np
import pytest

import mbfg_ros.factors as F
from mbfg_ros import native
from mbfg_ros.estimation import reading_timing as RT
from mbfg_ros.estimation import sigma_adaptation as SA
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.estimation.sensors import LOST_TRACK_SCALE, ReadingsDisagree, Sensors, TrackMonitor

DT = 1e-3


def jittered(t, seed=0):
    """t with 5 % of the stamps late by up to 1.7 steps (a logger's jitter), still increasing."""
    rng = np.random.default_rng(seed)
    late = rng.random(t.size) < 0.05
    return t + late * rng.uniform(0.0, 0.4, t.size) * DT


# -- the fit ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("true_sigma", [1e-3, 3e-3])
def test_the_fit_recovers_a_known_sigma_from_noisy_readings_on_jittered_stamps(driven, true_sigma):
    """Readings of the swinging crank with white noise of a known σ, stamped with jitter, the stated σ 10–30×
    too small: the fitted σ is within 10 % of the truth (measured: 1–4 %) once a second of blocks is in."""
    rng = np.random.default_rng(1)
    t = jittered(driven.t)
    y = np.interp(t, driven.t, driven.theta) + rng.normal(0.0, true_sigma, t.size)   # (1e-5 rad from the truth)
    fit = SA.SensorSigmaAdaptation([("crank", True, 1e-4)])
    changed = {}
    for k in range(t.size):
        changed.update(fit.observe(float(t[k]), {"crank": float(y[k])}))
    assert fit.blocks >= SA.MEMORY_BLOCKS
    assert abs(fit.sigmas["crank"] / true_sigma - 1.0) < 0.1, fit.sigmas
    assert changed and abs(changed["crank"] / fit.sigmas["crank"] - 1.0) < 0.13     # passed on within CHANGE


def test_readings_exact_to_their_quantization_keep_the_stated_sigma(driven):
    """The crank's angle quantized to a step q (σ = q/√12 stated, as a mechanism file states an encoder's
    resolution), every block moving several steps: the fit stays at the stated σ and never passes a change."""
    step = 2e-3
    floor = step / math.sqrt(12)
    y = step * np.round(driven.theta / step)
    fit = SA.SensorSigmaAdaptation([("crank", True, floor)])
    changes = [fit.observe(float(t), {"crank": float(v)}) for t, v in zip(driven.t, y)]
    assert fit.blocks >= SA.MEMORY_BLOCKS and not any(changes)
    assert fit.sigmas["crank"] == floor


def test_a_glitch_does_not_move_the_fitted_sigma(driven):
    """One reading 0.5 rad off among exact ones: the block holding it is left out (it scatters thousands of
    times more than the median block)."""
    rng = np.random.default_rng(2)
    y = driven.theta + rng.normal(0.0, 1e-3, driven.t.size)
    y[1000] += 0.5
    fit = SA.SensorSigmaAdaptation([("crank", True, 1e-4)])
    for t, v in zip(driven.t, y):
        fit.observe(float(t), {"crank": float(v)})
    assert abs(fit.sigmas["crank"] / 1e-3 - 1.0) < 0.1, fit.sigmas


def test_the_fit_refuses_a_bad_stated_sigma():
    with pytest.raises(ValueError, match="sensor 'crank': the stated σ must be positive"):
        SA.SensorSigmaAdaptation([("crank", True, 0.0)])


@pytest.mark.parametrize("mode", ["estimation", "fused"])
def test_the_fitted_sigma_reaches_the_estimators_units_and_compiled_step_models(crank, driven, mode):
    """Readings with σ = 2 mrad, the stated σ 0.1 mrad: the estimator fits it, its encoder unit and the step
    model of the newest step (numpy and compiled forms) use it, and it tracks (no re-initialization once the fit
    is in: before, the stated σ may lose the readings at the start); with adapt_sensor_sigmas false the stated σ
    stays."""
    rng = np.random.default_rng(3)
    y = driven.theta + rng.normal(0.0, 2e-3, driven.t.size)
    for adapt in (True, False):
        est = FixedLagEstimator(crank, EstimatorConfig(dt=DT, mode=mode, sensor_sigmas={"crank": 1e-4},
                                                       adapt_sensor_sigmas=adapt))
        out = [est.step(float(t), efforts=[float(tau)] if mode == "fused" else None, observations={"crank": float(v)})
               for t, v, tau in zip(driven.t, y, driven.tau)]
        if not adapt:
            assert est.fitted_sensor_sigmas() is None and est.sensors.sigma("crank") == 1e-4
            continue
        sigma = est.fitted_sensor_sigmas()["crank"]
        assert abs(sigma / 2e-3 - 1.0) < 0.15 and est.sensors.sigma("crank") == sigma
        model = est.window.records[est.stepper.k].model
        encoders = [u for u in model.units if isinstance(u, F.Encoder)]
        assert len(encoders) == 1 and encoders[0].sigmas[0] == sigma and encoders[0] is est.sensors.units["crank"]
        forms = model._native_forms
        assert forms is not None
        w = [f[6] for f in forms if f[0] == native.unit_kinds()[encoders[0].kernel_kind]["code"]]
        assert len(w) == 1 and w[0][0] == pytest.approx(1.0 / sigma, rel=1e-15)
        assert [k for k, e in enumerate(out) if e.status == "recovered" and k > 100] == []
        err = np.abs(np.array([e.q[4] for e in out[500:]]) - driven.theta[500:])
        assert err.max() < 0.02


# -- losing track ------------------------------------------------------------------------------------------------
def test_the_track_monitor_counts_far_readings_in_units_of_sigma_and_of_the_scale(crank):
    """An encoder reading more than lost_track_sigmas σ (and 1e-3 of the mechanism's scale) from the estimate for
    more than max_rejections steps in a row raises ReadingsDisagree naming the encoder and the distance; a near
    reading in between starts the count again."""
    config = EstimatorConfig(mode="estimation", max_rejections=3, lost_track_sigmas=30.0)
    sensors = Sensors(crank, config, {})
    monitor = TrackMonitor(crank, config, sensors)
    c = crank.coordinate_index("crank")
    x = np.zeros(crank.n)
    threshold = max(30.0 * 1e-3, LOST_TRACK_SCALE)
    far, near = {"crank": threshold * 1.01}, {"crank": threshold * 0.99}
    for obs in (far, far, far, near, far, far, far):
        monitor.check(obs, x)
    x[c] = 2.0 * math.pi                 # a whole turn away is a turn, not a distance
    monitor.check(near, x)
    for _ in range(3):
        monitor.check(far, x)
    with pytest.raises(ReadingsDisagree, match=r"encoder\(crank\)'s reading stayed 0\.0303 \(30\.3 σ\) from the "
                                               r"estimate for 4 steps") as why:
        monitor.check(far, x)
    assert not why.value.turns
    # a very precise encoder: the threshold is the scale's share (1 mrad on an angle), not 30 σ
    precise = Sensors(crank, EstimatorConfig(mode="estimation", sensor_sigmas={"crank": 1e-7}), {})
    assert TrackMonitor(crank, config, precise).encoders[0][4] == LOST_TRACK_SCALE


def test_the_track_monitor_compares_a_deflected_reading_with_its_coordinate_plus_its_deflection(crank):
    """An encoder read through a deflection (estimation/deflection.py) is far when its reading is far from the
    coordinate plus the deflection, not from the coordinate alone."""
    from mbfg_ros.estimation.deflection import EncoderDeflection
    config = EstimatorConfig(mode="estimation", max_rejections=1, lost_track_sigmas=30.0)
    sensors = Sensors(crank, config, {}, EncoderDeflection(["crank"], {"deflection_sigma": 1e-3,
                                                                      "deflection_time_constant": 0.05}))
    start = crank.n + 2                  # the deflection block's column in a state laid out past q
    monitor = TrackMonitor(crank, config, sensors, deflection_start=start)
    c = crank.coordinate_index("crank")
    x = np.zeros(crank.n + 3)
    threshold = max(30.0 * 1e-3, LOST_TRACK_SCALE)
    x[start] = 2.0 * threshold           # the reading is the coordinate plus this deflection: followed
    for _ in range(5):
        monitor.check({"crank": 2.0 * threshold}, x)
    x[start] = 0.0                       # the same reading without it: far
    monitor.check({"crank": 2.0 * threshold}, x)
    with pytest.raises(ReadingsDisagree, match=r"deflected_encoder\(crank\)"):
        monitor.check({"crank": 2.0 * threshold}, x)
    assert x[c] == 0.0


def test_a_reading_jump_re_initializes_from_the_readings_counted_as_lost_track(crank, driven):
    """The crank's encoder slips by 0.3 rad for good at 1 s (300 σ: every reading refused by the gate): after
    max_rejections refusals the estimator re-initializes from the readings, once, says so in the status and the
    message (encoder, distance), and follows the readings again."""
    rng = np.random.default_rng(4)
    est = FixedLagEstimator(crank, EstimatorConfig(dt=DT, mode="estimation"))
    out = []
    for k, t in enumerate(driven.t):
        y = driven.theta[k] + 1e-3 * rng.standard_normal() + (0.3 if k >= 1000 else 0.0)
        out.append(est.step(float(t), observations={"crank": float(y)}))
    lost = [k for k, e in enumerate(out) if e.recovery == "lost_track"]
    assert lost == [1000 + est.config.max_rejections]
    e = out[lost[0]]
    assert e.status == "recovered" and "encoder(crank)" in e.message and "re-initialized from the readings" in e.message
    assert "(0.3" in e.message or "(0.29" in e.message or "(0.30" in e.message, e.message     # the distance in rad
    err = np.abs(np.array([o.q[4] for o in out[lost[0] + 100:]]) - (driven.theta[lost[0] + 100:] + 0.3))
    assert err.max() < 0.01


def test_a_wrong_command_burst_in_fused_mode_is_caught_and_counted(crank, driven):
    """Fused mode, the command 300 N·m off for 0.2 s (the plant did not get it): the prediction leaves the
    readings, the estimate is re-initialized from them (lost_track, counted), and after the burst it follows
    them again within 2 mrad."""
    rng = np.random.default_rng(5)
    est = FixedLagEstimator(crank, EstimatorConfig(dt=DT, mode="fused"))
    out = []
    for k, t in enumerate(driven.t):
        command = driven.tau[k] + (300.0 if 800 <= k < 1000 else 0.0)
        y = driven.theta[k] + 1e-3 * rng.standard_normal()
        out.append(est.step(float(t), efforts=[float(command)], observations={"crank": float(y)}))
    lost = [k for k, e in enumerate(out) if e.recovery == "lost_track"]
    assert lost and all(800 < k <= 1100 for k in lost), lost          # (measured: 841, and 1037 as the
    # estimated disturbance, which had taken the burst in, meets the true command again)
    err = np.abs(np.array([o.q[4] for o in out[1300:]]) - driven.theta[1300:])
    assert err.max() < 5e-3, err.max()


def test_lost_track_settings_are_checked():
    with pytest.raises(ValueError, match="lost_track_sigmas must be a finite number ≥ 0"):
        EstimatorConfig(lost_track_sigmas=-1.0).validated()


# -- readings stamped late ---------------------------------------------------------------------------------------
def test_the_usual_interval_is_each_sensors_own_and_only_an_overrun_has_an_excess():
    """A sensor read every 5 ms (slower than any estimator step) is not late; an interval over 1.5 of its usual
    one without steps in between is an overrun, its excess measured from the usual interval; after a step
    without the sensor's reading (its outage) it is not; time going back forgets the intervals."""
    timing = RT.ReadingTiming(["a", "b"])
    t = 0.0
    for _ in range(RT.MIN_INTERVALS + 1):
        timing.observe(t, {"a": 0.0, "b": 0.0})
        assert timing.excess == {}
        t += 5e-3
    timing.observe(t + 1e-3, {"a": 0.0, "b": 0.0})               # 1.2 × the usual: the loop's jitter
    assert timing.excess == {}
    timing.observe(t + 14e-3, {"a": 0.0})                        # 2.6 ×: an overrun of a alone
    assert list(timing.excess) == ["a"]
    assert timing.excess["a"] == pytest.approx((8e-3, 13e-3))
    timing.observe(t + 20e-3, {"b": 0.0})                        # a step without a: its outage ...
    timing.observe(t + 24e-3, {"a": 0.0, "b": 0.0})              # ... not an overrun
    assert timing.excess == {}
    timing.observe(t + 10e-3, {"a": 0.0})                        # back in time
    timing.observe(t + 30e-3, {"a": 0.0})
    assert timing.excess == {}


def test_on_a_grid_that_steps_on_through_an_overrun_the_silence_is_the_overrun():
    """The node steps its grid whether readings come or not: steps in between without any reading, up to
    `BRIDGED` usual intervals, are the logger's overrun (its excess from the usual interval, as without the steps);
    a longer silence is an outage, and so are steps at which another sensor read."""
    timing = RT.ReadingTiming(["a", "b"])
    t = 0.0
    for _ in range(RT.MIN_INTERVALS + 1):
        timing.observe(t, {"a": 0.0, "b": 0.0})
        t += 2e-3
    t -= 2e-3
    timing.observe(t + 2e-3, {})                                 # the grid's steps, nothing read ...
    timing.observe(t + 4e-3, {})
    timing.observe(t + 6e-3, {"a": 0.0, "b": 0.0})               # ... 3 × the usual: an overrun of both
    assert sorted(timing.excess) == ["a", "b"]
    assert all(timing.excess[n] == pytest.approx((4e-3, 6e-3)) for n in "ab")
    t += 6e-3
    for k in range(1, 5):
        timing.observe(t + 2e-3 * k, {"a": 0.0, "b": 0.0})
    t += 8e-3
    for k in range(1, 5):
        timing.observe(t + 2e-3 * k, {})                         # 5 × silent: longer than BRIDGED, an outage
    timing.observe(t + 10e-3, {"a": 0.0, "b": 0.0})
    assert 10e-3 > RT.BRIDGED * 2e-3 and timing.excess == {}
    t += 10e-3
    timing.observe(t + 2e-3, {"b": 0.0})                         # b read in between: a's outage (b's 2 × its
    timing.observe(t + 4e-3, {})                                 # usual, all silent in between: b's overrun)
    timing.observe(t + 6e-3, {"a": 0.0, "b": 0.0})
    assert list(timing.excess) == ["b"]


def test_a_late_stamp_explains_a_reading_that_lags_along_the_motion_only():
    """Moving at +10 rad/s over an interval of 3 ms, 2 ms beyond the usual: a reading more than 3 σ and up to
    30 mrad (and 3 σ) behind the prediction is late, weighed with the overrun's reach 20 mrad; one within 3 σ is
    on time as far as it can tell, one ahead of it or farther behind is not late (the estimate is off: the reading
    keeps its σ); the same backwards."""
    sigma = 1e-4
    for direction in (1.0, -1.0):
        def spread(lag):
            return RT.late_spread(direction * lag, direction * 10.0, 2e-3, 3e-3, sigma)
        assert spread(0.01) == pytest.approx(0.02) and spread(0.03 + 2.9 * sigma) == pytest.approx(0.02)
        assert spread(-0.001) == 0.0 and spread(0.031 + 3 * sigma) == 0.0 and spread(2.9 * sigma) == 0.0
    assert RT.late_spread(0.0, 0.0, 2e-3, 3e-3, sigma) == 0.0      # at rest a timing error moves nothing


@pytest.mark.parametrize("grid", [False, True], ids=["step per reading", "node grid"])
@pytest.mark.parametrize("mode", ["estimation", "fused"])
def test_a_reading_stamped_late_after_an_overrun_does_not_drag_the_estimate_off_the_motion(crank, driven, mode, grid):
    """The swinging crank (up to 7.7 rad/s) read every step, every 20th interval an overrun of 3 steps whose
    reading was taken on schedule, one step after the previous, and stamped late (as on the DFKI acrobot run,
    bench/real_hardware.py): 2 ms stale, up to 15 mrad behind the motion at its stamp.  The estimate stays
    within 1 mrad of the motion at every step after 0.5 s (measured 0.77 / 0.58 mrad, estimation / fused;
    believing the stale readings at their σ: 2.0 / 1.7 mrad, up to 1.9 mrad on the next steps), and most such
    readings' units in their steps are weighed with a larger σ (not those within 3 σ of the prediction).  The
    same where the overrun's steps are stepped without readings (`grid`: the node's grid goes on; measured
    0.77 / 0.58 mrad; taken for an outage, as before: 2.0 / 1.7 mrad)."""
    idx, taken = [], []
    i = 0
    while i < driven.t.size:
        idx.append(i)
        taken.append(i)
        if len(idx) % 20 == 0 and i + 3 < driven.t.size:
            idx.append(i + 3)
            taken.append(i + 1)
            i += 4
        else:
            i += 1
    idx, taken = np.array(idx), np.array(taken)
    rng = np.random.default_rng(6)
    y = driven.theta[taken] + 2e-4 * rng.standard_normal(idx.size)
    est = FixedLagEstimator(crank, EstimatorConfig(dt=DT, mode=mode))
    q, timed = [], []
    previous = -1
    for k, v in zip(idx, y):
        for j in range(previous + 1, k) if grid else ():
            est.step(float(driven.t[j]), efforts=[float(driven.tau[j])] if mode == "fused" else None)
        previous = k
        e = est.step(float(driven.t[k]), efforts=[float(driven.tau[k])] if mode == "fused" else None,
                     observations={"crank": float(v)})
        q.append(e.q[4])
        if est.sensors.timing.excess:
            encoder = [u for u in est.window.records[est.stepper.k].model.units if isinstance(u, F.Encoder)]
            timed.append(encoder[0].sigmas[0] > est.sensors.sigma("crank"))
    scored = driven.t[idx] > 0.5
    err = np.abs(np.array(q) - driven.theta[idx])[scored]
    assert err.max() < 1e-3, err.max()
    assert len(timed) >= 90 and np.mean(timed) > 0.5
