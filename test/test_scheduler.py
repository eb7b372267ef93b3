"""The node's input scheduler (mbfg_ros.ros.scheduler) without ROS: grid assignment, waiting, held
commands, late/too-old inputs, start-up, skip-ahead.  Neither this file nor the module imports rclpy."""

import math
import subprocess
import sys

import numpy as np
import pytest

from mbfg_ros.ros.scheduler import NS, POLL_NS, InputScheduler

MS = 1_000_000
T0 = 1_000_000 * MS          # an arbitrary positive node-clock time


def scheduler(window=5, n_actuators=1):
    s = InputScheduler(dt=1e-3, window=window, n_actuators=n_actuators)
    s.sensor_timeout_ns = 100 * MS
    s.input_delay_ns = 3 * MS
    return s


EXPECTED = ("observations", "efforts")


def test_steps_wait_for_both_streams_then_pop_in_order():
    s = scheduler()
    assert s.add_observations(T0, {"crank": 0.1}, now_ns=T0) is None
    assert s.ready(T0, EXPECTED) is False                 # start-up: waits for the efforts too
    assert s.add_efforts(T0, np.array([2.0]), now_ns=T0) is None
    assert s.ready(T0, EXPECTED)
    k, eff, obs = s.pop()
    assert k == 0 and eff.tolist() == [2.0] and obs == {"crank": 0.1}
    # stamps are rounded to the grid anchored at the first input
    s.add_observations(T0 + MS + 200_000, {"crank": 0.2}, now_ns=T0 + 2 * MS)
    s.add_efforts(T0 + MS - 300_000, np.array([3.0]), now_ns=T0 + 2 * MS)
    k, eff, obs = s.pop()
    assert k == 1 and eff.tolist() == [3.0] and obs == {"crank": 0.2}


def test_missing_input_is_waited_for_at_most_the_input_delay():
    s = scheduler()
    for k in range(3):
        s.add_observations(T0 + k * MS, {"crank": 0.0}, now_ns=T0 + k * MS)
        s.add_efforts(T0 + k * MS, np.array([1.0]), now_ns=T0 + k * MS)
        s.pop()
    s.add_observations(T0 + 3 * MS, {"crank": 0.0}, now_ns=T0 + 3 * MS)   # the command for step 3 is late
    assert not s.ready(T0 + 3 * MS + 100_000, EXPECTED)
    assert s.ready(T0 + 6 * MS, EXPECTED)                                # t_3 + input delay
    k, eff, obs = s.pop()
    assert k == 3 and eff.tolist() == [1.0]                              # the command is held (zero-order hold)


@pytest.mark.parametrize("adaptive", [True, False])
def test_inputs_that_arrive_later_are_waited_for_longer(adaptive):
    """Inputs arriving 8 ms after their stamps (a loaded machine, a slow link; the estimator window is
    5 steps, so they would be too old for it): with the adaptive wait a step whose readings are missing
    is held 1.5 × 8 = 12 ms instead of
    the 3 ms max_input_delay, so the readings still make it; without it the step is predicted at 3 ms and
    the readings are dropped as too old.  Once the delays are over, the wait decays back (~1 s memory), and it
    never exceeds max_input_age."""
    s = scheduler()
    s.adaptive_input_delay = adaptive
    assert s.wait_ns(T0, list(s.streams.values())) == 3 * MS
    # delays the window absorbs (up to max_input_delay + (window − 2) steps = 6 ms) change nothing: the
    # step is predicted at 3 ms and a late reading is fused into the window
    s.add_observations(T0 - 100 * MS, {"crank": 0.0}, now_ns=T0 - 100 * MS + 5 * MS)
    assert s.wait_ns(T0 - 95 * MS, list(s.streams.values())) == 3 * MS
    s.clear()
    late = 8 * MS
    for k in range(20):
        s.add_observations(T0 + k * MS, {"crank": 0.0}, now_ns=T0 + k * MS + late)
        s.add_efforts(T0 + k * MS, np.array([1.0]), now_ns=T0 + k * MS + late)
        assert s.ready(T0 + k * MS + late, EXPECTED)
        s.pop()
    # step 20: the command comes on time, the readings are 8 ms late as before
    t20 = T0 + 20 * MS
    s.add_efforts(t20, np.array([1.0]), now_ns=t20 + 100_000)
    assert not s.ready(t20 + 3 * MS, EXPECTED) if adaptive else s.ready(t20 + 3 * MS, EXPECTED)
    if adaptive:
        assert 11.9 * MS < s.wait_ns(t20 + 3 * MS, list(s.streams.values())) <= 12 * MS
        assert s.add_observations(t20, {"crank": 0.0}, now_ns=t20 + late) is None
        k, _, obs = s.pop()
        assert k == 20 and obs == {"crank": 0.0}
    else:
        for _ in range(7):               # predicted one after the other; their readings come too late
            s.pop()
        assert s.add_observations(t20, {"crank": 0.0}, now_ns=t20 + late) == "too_old"
    # the delays end: the wait decays back to max_input_delay within a few seconds
    t = t20 + 3_000 * MS
    assert s.wait_ns(t, list(s.streams.values())) == 3 * MS
    # a delay beyond sensor_timeout (a feed that fell behind, still arriving) is waited for: 1.5 × 500 ms
    s.add_observations(t - 500 * MS, {"crank": 0.0}, now_ns=t)
    assert s.wait_ns(t, list(s.streams.values())) == (750 * MS if adaptive else 3 * MS)
    # ... at most max_input_age (older inputs are refused as stale)
    s.add_observations(t - 900 * MS, {"crank": 0.0}, now_ns=t)
    assert s.wait_ns(t, list(s.streams.values())) == (s.max_input_age_ns if adaptive else 3 * MS)


def test_commands_are_held_until_the_sensor_timeout_and_unknown_after():
    s = scheduler(n_actuators=2)
    s.add_efforts(T0, np.array([1.0, math.nan]), now_ns=T0)
    s.add_observations(T0, {"crank": 0.0}, now_ns=T0)
    k, eff, _ = s.pop()
    assert eff[0] == 1.0 and math.isnan(eff[1])
    s.skip_to(50)
    _, eff, _ = s.pop()
    assert eff.tolist()[0] == 1.0                                        # 50 ms old: still valid
    s.skip_to(150)
    _, eff, _ = s.pop()
    assert eff is None                                                   # older than sensor_timeout: unknown


def test_a_command_stream_that_misses_a_step_holds_its_last_command():
    """Zero-order hold, as the actuator does: in fused mode "unknown" would be a zero command."""
    s = scheduler()
    for k in range(5):                                                   # a 1 kHz command stream...
        s.add_efforts(T0 + k * MS, np.array([float(k)]), now_ns=T0 + k * MS)
        s.add_observations(T0 + k * MS, {"crank": 0.0}, now_ns=T0 + k * MS)
        s.pop()
        assert s.own_command
    s.add_observations(T0 + 5 * MS, {"crank": 0.0}, now_ns=T0 + 5 * MS)  # ...misses step 5
    k, eff, _ = s.pop()
    assert k == 5 and eff.tolist() == [4.0] and not s.own_command       # (a step without inputs of its own)


def test_late_too_old_and_inadmissible_inputs_are_named():
    s = scheduler(window=5)
    for k in range(20):
        s.add_observations(T0 + k * MS, {"crank": 0.0}, now_ns=T0 + k * MS)
        s.pop()
    now = T0 + 20 * MS
    # (a sensor step 18 has no reading of: the crank's again would be a duplicate)
    assert s.add_observations(T0 + 18 * MS, {"coupler_gyro": 0.0}, now) == "late"
    assert s.add_observations(T0 + 2 * MS, {"crank": 0.0}, now) == "too_old"
    assert s.add_observations(0, {"crank": 0.0}, now) == "bad_stamp"
    assert s.add_observations(now + 10**9, {"crank": 0.0}, now) == "future"
    assert s.add_observations(now - 2 * 10**9, {"crank": 0.0}, now) == "stale"
    # a late command that is newer than the held one still applies from now on
    assert s.add_efforts(T0 + 19 * MS, np.array([7.0]), now) is None
    _, eff, _ = s.pop()
    assert eff.tolist() == [7.0]


def test_skip_to_drops_observations_and_applies_commands():
    s = scheduler()
    s.add_observations(T0, {"crank": 0.0}, now_ns=T0)
    for k in range(1, 10):
        s.add_observations(T0 + k * MS, {"crank": float(k)}, now_ns=T0 + k * MS)
        s.add_efforts(T0 + k * MS, np.array([float(k)]), now_ns=T0 + k * MS)
    assert s.backlog_ns(T0 + 10 * MS) == 10 * MS
    assert s.skip_to(8) == 8
    k, eff, obs = s.pop()
    assert k == 8 and obs == {"crank": 8.0} and eff.tolist() == [8.0]
    assert s.obs.keys() == {9}


def test_start_up_waits_for_every_input_the_mode_uses():
    """Commands arrive but the readings' topic is still being discovered: no step is estimated from a
    guess until the readings come (or startup_wait passes); then steps start at once."""
    s = scheduler()
    s.startup_wait_ns = 1000 * MS
    for k in range(50):
        s.add_efforts(T0 + k * MS, np.array([1.0]), now_ns=T0 + k * MS)
        assert not s.ready(T0 + k * MS + 4 * MS, EXPECTED)        # beyond max_input_delay, still waiting
    assert s.start_step(T0 + 50 * MS, EXPECTED) is None             # not every input heard from yet
    s.add_observations(T0 + 50 * MS, {"crank": 0.1}, now_ns=T0 + 50 * MS)
    s.add_efforts(T0 + 50 * MS, np.array([2.0]), now_ns=T0 + 50 * MS)
    assert not s.ready(T0 + 50 * MS, EXPECTED)       # step 0 holds a command only: never the first step
    # the node starts at the first step with every input (the 50 older ones hold commands only)
    assert s.start_step(T0 + 50 * MS, EXPECTED) == 50
    assert s.skip_to(50) == 50
    assert s.ready(T0 + 50 * MS, EXPECTED)
    k, eff, obs = s.pop()
    assert k == 50 and obs == {"crank": 0.1} and eff.tolist() == [2.0]
    assert s.start_step(T0 + 51 * MS, EXPECTED) is None             # started: no more start-up skipping
    # inputs that come together from the start: nothing to skip
    s = scheduler()
    s.add_observations(T0, {"crank": 0.1}, now_ns=T0)
    s.add_efforts(T0, np.array([2.0]), now_ns=T0)
    assert s.start_step(T0, EXPECTED) == 0
    # commands that never come: estimation starts after startup_wait without them
    s = scheduler()
    s.startup_wait_ns = 200 * MS
    s.add_observations(T0, {"crank": 0.1}, now_ns=T0)
    assert not s.ready(T0 + 199 * MS, EXPECTED) and s.ready(T0 + 200 * MS, EXPECTED)
    # after the first step, a missing input is waited for only max_input_delay
    s.pop()
    assert s.ready(T0 + 201 * MS, EXPECTED)
    # readings that never come are waited for as long as it takes: started from commands alone, the estimate
    # would publish the drawn pose as the encoded angles (whole turns from a multi-turn encoder's reading)
    s = scheduler()
    s.startup_wait_ns = 200 * MS
    s.add_efforts(T0, np.array([1.0]), now_ns=T0)
    assert not s.ready(T0 + 900 * MS, EXPECTED)
    assert s.ready(T0 + 200 * MS, ("efforts",))           # forward dynamics reads no readings
    s.add_observations(T0 + 850 * MS, {"crank": 0.1}, now_ns=T0 + 900 * MS)
    assert s.start_step(T0 + 900 * MS, EXPECTED) == 850
    s.skip_to(850)
    assert s.ready(T0 + 900 * MS, EXPECTED)


def test_the_first_step_has_readings_also_after_a_skip_ahead_to_newer_commands():
    """Overloaded, the node skips to the newest step with readings, not to a newer command whose readings are on
    their way (a start or re-seed from that command alone was a guess: the crank four-bar's drawn pose published
    six turns from its encoder, or 3 rad off after a skip at 10 kHz); where no readings are newer than the next
    step, the start waits for the first step with readings from there."""
    s = scheduler()
    s.max_backlog_ns = 20 * MS
    for k in range(30):
        s.add_efforts(T0 + k * MS, np.array([1.0]), now_ns=T0 + k * MS)
    for k in range(25):
        s.add_observations(T0 + k * MS, {"crank": 0.1}, now_ns=T0 + k * MS)
    now = T0 + 60 * MS
    assert s.overloaded(now)
    s.skip_ahead(now, EXPECTED)
    assert s.k_next == 24                                 # the newest readings, not the newest command (29)
    assert s.start_step(now, EXPECTED) == 24 and s.ready(now, EXPECTED)
    assert s.skip_target(now, ("efforts",)) == 29         # forward dynamics: the newest command
    # readings older than the next step: the start waits for the first step with readings from there
    s.skip_to(27)
    assert s.start_step(now, EXPECTED) == 27 and not s.ready(now, EXPECTED)
    s.add_observations(T0 + 31 * MS, {"crank": 0.1}, now_ns=now)
    assert s.start_step(now, EXPECTED) == 31
    s.skip_to(31)
    assert s.ready(now, EXPECTED)
    k, _, obs = s.pop()
    assert k == 31 and obs == {"crank": 0.1}


def test_steps_further_than_max_prediction_past_the_newest_readings_are_not_estimated():
    """A mode that uses readings predicts at most max_prediction past the newest step with readings (taken on
    time or late, into the window): the node stops there and starts again from the next readings."""
    s = scheduler(window=5)
    s.max_prediction_ns = 50 * MS
    s.add_observations(T0, {"crank": 0.1}, now_ns=T0)
    s.add_efforts(T0, np.array([1.0]), now_ns=T0)
    s.pop()
    assert s.reading_k == 0
    for k in range(1, 51):                              # commands only: steps 1..50 predicted
        s.add_efforts(T0 + k * MS, np.array([1.0]), now_ns=T0 + k * MS)
        assert not s.beyond_prediction(s.k_next, EXPECTED)
        s.pop()
    assert s.beyond_prediction(s.k_next, EXPECTED)      # step 51 is 51 ms past the readings of step 0
    assert not s.beyond_prediction(s.k_next, ("efforts",))     # forward dynamics: no readings expected
    s.max_prediction_ns = 0
    assert not s.beyond_prediction(s.k_next, EXPECTED)  # 0: predict for ever
    s.max_prediction_ns = 50 * MS
    # a late reading of a step still in the window counts: the estimate has readings that recent
    assert s.add_observations(T0 + 48 * MS, {"crank": 0.2}, now_ns=T0 + 52 * MS) == "late"
    assert s.reading_k == 48 and not s.beyond_prediction(s.k_next, EXPECTED)
    # one older than the window does not
    assert s.add_observations(T0 + 40 * MS, {"crank": 0.2}, now_ns=T0 + 52 * MS) == "too_old"
    assert s.reading_k == 48
    s.clear()
    assert s.reading_k is None
    # never less than the window (readings fused late into it count): 100 steps of 1 ms here
    s = scheduler(window=100)
    s.max_prediction_ns = 50 * MS
    s.add_observations(T0, {"crank": 0.1}, now_ns=T0)
    s.add_efforts(T0, np.array([1.0]), now_ns=T0)
    s.pop()
    s.skip_to(100)
    assert not s.beyond_prediction(s.k_next, EXPECTED)
    s.skip_to(101)
    assert s.beyond_prediction(s.k_next, EXPECTED)


def test_overload_skips_to_the_newest_inputs_whose_wait_is_over():
    s = scheduler()
    s.max_backlog_ns = 100 * MS
    s.add_observations(T0, {"crank": 0.0}, now_ns=T0)
    s.add_efforts(T0, np.array([1.0]), now_ns=T0)
    s.pop()
    assert not s.overloaded(T0 + 100 * MS)
    assert s.overloaded(T0 + 102 * MS)                   # step 1 is due at T0 + 1 ms: 101 ms behind
    s.max_backlog_ns = 0
    assert not s.overloaded(T0 + 10 * NS)                # 0: never
    for k in range(1, 200):
        s.add_observations(T0 + k * MS, {"crank": 0.0}, now_ns=T0 + k * MS)
    # inputs up to step 199; the clock's newest step past its 3-ms wait is 196
    assert s.skip_target(T0 + 199 * MS, EXPECTED) == 196
    assert s.skip_target(T0 + 250 * MS, EXPECTED) == 199
    assert s.skip_ahead(T0 + 250 * MS, EXPECTED) == (198, 249 * MS)    # from step 1, 249 ms behind
    assert s.k_next == 199 and s.skip_ahead(T0 + 250 * MS, EXPECTED) == (0, 0)
    # before the first step: only the inputs waited for are kept recent, nothing counts as skipped
    s = scheduler()
    for k in range(200):
        s.add_efforts(T0 + k * MS, np.array([1.0]), now_ns=T0 + k * MS)
    assert s.skip_ahead(T0 + 250 * MS, EXPECTED) == (0, 0) and s.k_next == 199


def test_poll_window_only_while_part_of_the_next_step_has_arrived():
    s = scheduler()
    assert s.poll_window_ns() == 0                       # not anchored
    s.add_observations(T0, {"crank": 0.0}, now_ns=T0)
    assert s.poll_window_ns() == POLL_NS                 # the efforts of step 0 are on their way
    s.add_efforts(T0, np.array([1.0]), now_ns=T0)
    s.pop()
    assert s.poll_window_ns() == 0                       # nothing of step 1 yet


def test_scheduler_never_imports_rclpy():
    code = "import sys, mbfg_ros.ros.scheduler; assert 'rclpy' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def stream_with_late_commands(window=5, n_actuators=1, late=(5, 6, 7), every=1):
    """A command stream (one every `every` ms; values 10 + step) at 1 kHz steps whose commands for the steps
    `late` do not come in time: steps 0 … 8 are popped, the commands of the other steps arrive on time."""
    s = scheduler(window=window, n_actuators=n_actuators)
    handed = {}
    for k in range(9):
        if k % every == 0 and k not in late:
            s.add_efforts(T0 + k * MS, np.full(n_actuators, 10.0 + k), now_ns=T0 + k * MS)
        s.add_observations(T0 + k * MS, {"crank": 0.0}, now_ns=T0 + k * MS)
        j, eff, _ = s.pop()
        handed[j] = None if eff is None else eff.tolist()
    return s, handed


def corrections(s):
    return [(k, c.tolist()) for k, c in s.take_command_corrections()]


def test_a_late_command_replaces_the_hold_in_its_step():
    """Steps 5, 6, 7 were handed step 4's command (held); step 5's arrives after step 8 and replaces it in
    step 5, step 7's in step 7, step 6's in step 6; what was newer than them stays."""
    s, handed = stream_with_late_commands()
    assert handed[5] == handed[6] == handed[7] == [14.0] and handed[8] == [18.0]
    now = T0 + 9 * MS
    assert s.add_efforts(T0 + 5 * MS, np.array([15.0]), now) is None
    assert corrections(s) == [(5, [15.0])]
    assert s.take_command_corrections() == []
    assert s.add_efforts(T0 + 7 * MS, np.array([17.0]), now) is None
    assert s.add_efforts(T0 + 6 * MS, np.array([16.0]), now) is None
    assert corrections(s) == [(6, [16.0]), (7, [17.0])]                 # together: one update
    # the same command again is a duplicate; one older than what its steps have now replaces nothing
    assert s.add_efforts(T0 + 6 * MS, np.array([16.0]), now) == "duplicate"
    assert s.add_efforts(T0 + 4 * MS - 1, np.array([1.0]), now) == "late"
    assert s.take_command_corrections() == [] and not s.deferred_corrections
    _, eff, _ = s.pop()
    assert eff.tolist() == [18.0]                        # the held command is still the newest one


def test_a_late_command_covers_the_later_steps_whose_own_never_came():
    """A stream that delivers every step: the later steps a late command covers (their own commands are on
    their way) are corrected with it only when about to leave the window without their own (window 5)."""
    s, _ = stream_with_late_commands(late=(5, 6, 7))
    assert s.add_efforts(T0 + 5 * MS, np.array([15.0]), T0 + 9 * MS) is None
    assert corrections(s) == [(5, [15.0])]
    assert s.add_efforts(T0 + 7 * MS, np.array([17.0]), T0 + 9 * MS) is None   # step 6's never comes
    assert corrections(s) == [(7, [17.0])]
    due = []
    for k in range(9, 13):
        s.add_efforts(T0 + k * MS, np.array([10.0 + k]), T0 + k * MS)
        s.pop()
        due += corrections(s)
    assert due == [(6, [15.0])]              # while steps 6 … 10 are the window's (due at the two oldest)


def test_a_late_command_of_a_slower_stream_covers_the_later_steps_at_once():
    """A command every 4 steps: the steps after a late one hold it until the next, none of their own."""
    s, handed = stream_with_late_commands(late=(4,), every=4)
    assert handed[4] == handed[5] == handed[6] == handed[7] == [10.0] and handed[8] == [18.0]
    assert s.add_efforts(T0 + 4 * MS, np.array([14.0]), T0 + 9 * MS) is None
    assert corrections(s) == [(4, [14.0]), (5, [14.0]), (6, [14.0]), (7, [14.0])]


def test_a_late_command_replaces_unknown_within_the_sensor_timeout():
    """Steps whose held command had grown older than sensor_timeout were handed "unknown"; a late command
    replaces that in the steps it would have been held in (no older than sensor_timeout)."""
    s = scheduler(window=8)
    s.sensor_timeout_ns = 2 * MS
    for k in range(9):
        if k == 0:
            s.add_efforts(T0, np.array([10.0]), now_ns=T0)
        s.add_observations(T0 + k * MS, {"crank": 0.0}, now_ns=T0 + k * MS)
        _, eff, _ = s.pop()
        assert (eff is None) == (k > 2)
    assert s.add_efforts(T0 + 4 * MS, np.array([14.0]), T0 + 9 * MS) is None
    assert [(k, c.tolist()) for k, c in s.take_command_corrections()] == [(4, [14.0]), (5, [14.0]), (6, [14.0])]


def test_a_late_command_of_one_actuator_keeps_the_others():
    s, handed = stream_with_late_commands(n_actuators=2)
    assert handed[5] == [14.0, 14.0]
    assert s.add_efforts(T0 + 5 * MS, np.array([15.0, math.nan]), T0 + 9 * MS) is None
    assert corrections(s) == [(5, [15.0, 14.0])]


def test_a_command_older_than_the_window_is_too_old_unless_it_replaces_a_hold():
    """Window 5: after step 8 the window holds steps 4 … 8.  Step 2's command (older than what every step of
    the window was handed) is too old; step 3's is too old for its own step but newer than the hold of steps
    4 … 7 (a command is valid until replaced): it covers them, as the steps' own commands would (deferred:
    the stream delivers every step), and is counted as used."""
    s, _ = stream_with_late_commands(late=(3, 5, 6, 7))
    now = T0 + 9 * MS
    assert s.add_efforts(T0 + 2 * MS, np.array([12.0]), now) == "too_old"
    assert s.take_command_corrections() == [] and not s.deferred_corrections
    s2, _ = stream_with_late_commands(late=(3, 4, 5, 6, 7))
    assert s2.add_efforts(T0 + 3 * MS + 1, np.array([13.5]), now) is None
    assert [k for k, _ in s2.take_command_corrections()] == [4, 5]         # the two oldest: due now
    assert sorted(s2.deferred_corrections) == [6, 7]


def test_a_reset_forgets_the_commands_steps_were_handed():
    s, _ = stream_with_late_commands()
    s.clear(reset_stamp_ns=T0 + 9 * MS)
    assert s.add_efforts(T0 + 9 * MS, np.array([19.0]), T0 + 9 * MS) is None      # anchors a new grid
    assert s.take_command_corrections() == []


def test_a_repeated_reading_is_named_and_never_used_twice():
    """One reading per sensor and step: the same reading again is a `duplicate`, the same stamp with another
    value `conflicting` (both dropped while the step is pending), another stamp of the same step `same_step` (the one nearest the
    step's time kept while the step is pending); after the step was estimated, a repeat is dropped the same
    way instead of going to the late fusion (it would be fused a second time)."""
    s = scheduler(window=5)
    assert s.add_observations(T0, {"crank": 0.1, "coupler_gyro": 1.0}, now_ns=T0) is None
    values = {"crank": 0.1}
    assert s.add_observations(T0, values, now_ns=T0) == "duplicate" and values == {}
    assert s.add_observations(T0, {"crank": 0.2}, now_ns=T0) == "conflicting"
    assert s.add_observations(T0, {"crank": 0.1}, now_ns=T0) == "conflicting"     # the first again: still
    # step 1: a reading 0.4 ms after its time, then one 0.1 ms after: the nearer is used
    assert s.add_observations(T0 + MS + 400_000, {"crank": 0.3}, now_ns=T0 + MS) is None
    assert s.add_observations(T0 + MS + 100_000, {"crank": 0.4}, now_ns=T0 + MS) == "same_step"
    assert s.add_observations(T0 + MS + 300_000, {"crank": 0.5}, now_ns=T0 + MS) == "same_step"
    # a message with a repeated and a new reading: the new one is taken
    values = {"crank": 0.4, "coupler_gyro": 2.0}
    assert s.add_observations(T0 + MS + 100_000, values, now_ns=T0 + MS) == "duplicate"
    assert values == {"coupler_gyro": 2.0}
    assert s.pop()[2] == {"coupler_gyro": 1.0}
    assert s.pop()[2] == {"crank": 0.4, "coupler_gyro": 2.0}
    # an estimated step keeps what it used; a conflicting reading is dropped
    assert s.add_observations(T0 + MS + 100_000, {"crank": 0.9}, now_ns=T0 + 2 * MS) == "conflicting"
    # estimated steps: a repeat is named as such, a reading of a sensor the step had none of is late
    assert s.add_observations(T0 + MS + 100_000, {"crank": 0.4}, now_ns=T0 + 2 * MS) == "duplicate"
    assert s.add_observations(T0, {"crank": 0.1}, now_ns=T0 + 2 * MS) == "conflicting"   # (withdrawn at step 0)
    assert s.add_observations(T0 + 10_000, {"crank": 0.7}, now_ns=T0 + 2 * MS) == "same_step"
    s.add_observations(T0 + 2 * MS, {"crank": 0.0}, now_ns=T0 + 2 * MS)
    s.pop()
    values = {"crank": 0.0, "coupler_gyro": 3.0}
    assert s.add_observations(T0 + 2 * MS, values, now_ns=T0 + 3 * MS) == "late" and values == {"coupler_gyro": 3.0}
    # after a reset nothing is remembered
    s.clear()
    assert s.add_observations(T0, {"crank": 0.1}, now_ns=T0) is None


def test_a_repeated_command_is_named_and_not_applied_again():
    """A command with the stamp of an earlier one: `duplicate` (same values) or `conflicting` (other values:
    the earlier one is withdrawn too while pending, the hold goes on); an actuator the earlier one did not
    name is taken."""
    s = scheduler(n_actuators=2)
    assert s.add_efforts(T0 - MS, np.array([0.5, math.nan]), now_ns=T0) is None      # the hold before
    assert s.add_observations(T0 - MS, {"crank": 0.0}, now_ns=T0) is None
    s.pop()
    assert s.add_efforts(T0, np.array([1.0, math.nan]), now_ns=T0) is None
    assert s.add_efforts(T0, np.array([1.0, math.nan]), now_ns=T0) == "duplicate"
    assert s.add_efforts(T0, np.array([5.0, math.nan]), now_ns=T0) == "conflicting"
    assert s.add_efforts(T0, np.array([1.0, 2.0]), now_ns=T0) == "conflicting"    # ...but actuator 2 is new
    assert s.add_observations(T0, {"crank": 0.0}, now_ns=T0) is None
    _, eff, _ = s.pop()
    assert eff.tolist() == [0.5, 2.0]
    # once its step is estimated, a command keeps what it was used for
    assert s.add_efforts(T0 + MS, np.array([3.0, 3.0]), now_ns=T0 + MS) is None
    assert s.add_observations(T0 + MS, {"crank": 0.0}, now_ns=T0 + MS) is None
    assert s.pop()[1].tolist() == [3.0, 3.0]
    assert s.add_efforts(T0 + MS, np.array([4.0, 3.0]), now_ns=T0 + 2 * MS) == "conflicting"
    assert s.add_observations(T0 + 2 * MS, {"crank": 0.0}, now_ns=T0 + 2 * MS) is None
    assert s.pop()[1].tolist() == [3.0, 3.0]


def test_estimation_mode_waits_for_the_commands_of_a_commanded_actuator():
    from mbfg_ros.ros.scheduler import expected_streams
    assert expected_streams("estimation", ("estimated", "estimated")) == ("observations",)
    assert expected_streams("estimation", ("commanded", "prescribed")) == ("efforts", "observations")
    assert expected_streams("fused", ("commanded",)) == ("efforts", "observations")
    assert expected_streams("forward_dynamics", ("commanded",)) == ("efforts",)
