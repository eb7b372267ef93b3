"""The scaling bench's generated mechanisms (bench/ladder.py): ladders of four-bars of 20, 40 and 80
coordinates load, are assembled in the drawn pose with one degree of freedom, and the estimator steps
them (fused mode) close to the simulated truth; sizes a ladder cannot have are refused."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from ladder import ladder_yaml  # noqa: E402
from mbfg_ros.estimation.config import EstimatorConfig  # noqa: E402
from mbfg_ros.estimation.estimator import FixedLagEstimator  # noqa: E402
from mbfg_ros.model.mechanism import load_mechanism  # noqa: E402
from mbfg_ros.sim.plant import Actuator, SimulatedPlant  # noqa: E402


def _ladder(tmp_path, n):
    path = tmp_path / f"ladder_{n}.yaml"
    path.write_text(ladder_yaml(n))
    return load_mechanism(path)


@pytest.mark.parametrize("n", [20, 40, 80])
def test_ladder_loads_assembled_with_one_degree_of_freedom(tmp_path, n):
    mech = _ladder(tmp_path, n)
    assert mech.n == n
    assert mech.degrees_of_freedom() == 1
    assert np.abs(mech.constraints.phi(np.array(mech.q0))).max() < 1e-12
    assert list(mech.actuator_names) == ["crank"]
    assert [s.name for s in mech.sensors] == ["crank", "last_rocker", "coupler_gyro"]


@pytest.mark.parametrize("n, steps", [(20, 60), (40, 20), (80, 8)])
def test_ladder_steps(tmp_path, n, steps):
    mech = _ladder(tmp_path, n)
    dt = 1e-3
    plant = SimulatedPlant(mech, dt=dt, seed=2, actuator=Actuator.ideal(mech))
    samples = [plant.step() for _ in range(steps)]
    est = FixedLagEstimator(mech, EstimatorConfig(dt=dt, window=5, mode="fused", max_substeps=1))
    for k, s in enumerate(samples):
        e = est.step(k * dt, efforts=s.efforts, observations=s.readings)
        assert e.status in ("initialized", "ok"), e.message
    # the last rocker turns with the crank (parallelograms): both near the truth
    assert np.abs(e.q - samples[-1].q).max() < 5e-3
    # (the constraint rows are numerical tolerances of σ 1e-3: on the 20-coordinate ladder the residual after 60
    # steps is 9e-7 with the crank four-bar's densities, 1.2e-6 with the ladder's own scaled defaults)
    assert e.constraint_residual < 1e-5


@pytest.mark.parametrize("bad", [4, 21, 0, -2])
def test_ladder_sizes_refused(bad):
    with pytest.raises(ValueError, match="even number of coordinates, at least 6"):
        ladder_yaml(bad)
