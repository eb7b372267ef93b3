"""Fixtures shared by the test files: the shipped mechanisms most tests run on (loaded once per session;
a Mechanism is immutable)."""

import pytest

from mbfg_ros.model.mechanism import load_mechanism


@pytest.fixture(scope="session")
def crank():
    """The crank four-bar (mechanisms/four_bar_crank.yaml)."""
    return load_mechanism("four_bar_crank")


@pytest.fixture(scope="session")
def robot():
    """The two-motor pick-and-place parallel robot (mechanisms/pick_and_place_robot.yaml)."""
    return load_mechanism("pick_and_place_robot")
