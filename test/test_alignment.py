"""Readings stamped off the node's grid step are moved onto it by the estimate's motion (ros/alignment.py)."""

import math

import numpy as np
import pytest

from mbfg_ros.model.mechanism import load_mechanism
from mbfg_ros.ros.alignment import MAX_EXTRAPOLATION, NS, ReadingAlignment


@pytest.fixture(scope="module")
def mech():
    return load_mechanism("four_bar_crank")


def _encoder(mech):
    s = next(s for s in mech.sensors if s.kind == "encoder")
    return s.name, s.coordinate


def test_a_reading_of_uniformly_accelerated_motion_is_moved_exactly_onto_its_step(mech):
    name, c = _encoder(mech)
    q0, v0, acc = 0.3, 7.0, -40.0

    def angle(t):
        return q0 + v0 * t + 0.5 * acc * t * t

    dt = 0.001
    t_e, t_k = 0.010, 0.011                 # the estimate one step before the reading's step
    v, a = np.zeros(mech.n), np.zeros(mech.n)
    v[c], a[c] = v0 + acc * t_e, acc
    for delta in (-0.4 * dt, 0.13 * dt, 0.5 * dt):
        stamp = t_k + delta
        out = ReadingAlignment(mech).to_step({name: angle(stamp)}, {name: round(stamp * NS)}, round(t_k * NS),
                                             v, a, round(t_e * NS))
        assert out[name] == pytest.approx(angle(t_k), abs=1e-12)
        # a prescribed actuator's set-point on the same coordinate ('q:<coordinate>', prescribed_motion) alike
        generic = f"q:{mech.coordinate_names[c]}"
        out = ReadingAlignment(mech).to_step({generic: angle(stamp)}, {generic: round(stamp * NS)},
                                             round(t_k * NS), v, a, round(t_e * NS))
        assert out[generic] == pytest.approx(angle(t_k), abs=1e-12)
        # left on the step, the reading is off by about δ·q̇: hundreds of µrad here
        assert abs(angle(stamp) - angle(t_k)) > 1e-4


def test_what_is_not_moved(mech):
    name, c = _encoder(mech)
    al = ReadingAlignment(mech)
    v, a = np.full(mech.n, 5.0), np.full(mech.n, 1.0)
    t_k = 2 * NS
    values = {name: 1.0, "not_an_encoder": 2.0}
    stamps = {name: t_k + 300_000, "not_an_encoder": t_k + 300_000}
    # no estimate yet
    assert al.to_step(values, stamps, t_k, None, None, None) == values
    # an estimate too far from the step to extrapolate its rate
    far = t_k - int((MAX_EXTRAPOLATION + 0.01) * NS)
    assert al.to_step(values, stamps, t_k, v, a, far) == values
    # a reading stamped on its step, or without a stamp
    assert al.to_step(values, {name: t_k}, t_k, v, a, t_k - 1_000_000) == values
    moved = al.to_step(values, stamps, t_k, v, a, t_k - 1_000_000)
    assert moved["not_an_encoder"] == 2.0
    assert moved[name] == pytest.approx(1.0 - 3e-4 * (5.0 + 1e-3 * 1.0) - 0.5 * 9e-8 * 1.0, abs=1e-15)
    # a non-finite estimate moves nothing (the reading is better than a NaN)
    assert al.to_step(values, stamps, t_k, np.full(mech.n, math.nan), a, t_k - 1_000_000)[name] == 1.0
    assert values == {name: 1.0, "not_an_encoder": 2.0}      # the input is not changed


def test_gyroscopes_are_not_moved(mech):
    gyro = next(s.name for s in mech.sensors if s.kind == "gyroscope")
    out = ReadingAlignment(mech).to_step({gyro: 1.0}, {gyro: NS + 400_000}, NS, np.ones(mech.n),
                                         np.ones(mech.n), NS - 1_000_000)
    assert out[gyro] == 1.0
