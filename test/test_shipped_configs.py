"""The shipped parameter files (config/*.yaml) against the simulated plant their launch files start beside the
estimator: fused mode with the file's estimator settings (as `mbfg estimate --params` reads them) on the readings
and commands of the plant its own section describes (its actuator's gain error and friction).  The effort's 1σ
must describe its error and the online density fit must not sit at the top of its range: config/pick_and_place.yaml
once set a disturbance density of 1.0 from before the online fit, which held the fit at its top with the effort's
NEES at 36–75 (the launch file warned within 3 s)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import yaml

from ros_helpers import REPO
from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.model.mechanism import load_mechanism
from mbfg_ros.ros.package_files import plant_node_name
from mbfg_ros.sim.plant import Actuator, SimulatedPlant
from mbfg_ros.tuning.params_file import node_parameters, read_params

sys.path.insert(0, str(REPO / "bench"))
from estimation_quality import estimator_config_from_file  # noqa: E402  (what the bench's --params reads)

SECONDS = 4.0
SCORED_FROM = 1.0     # [s] after the fit's first estimates


@pytest.mark.parametrize("config", ["four_bar.yaml", "pick_and_place.yaml"])
def test_a_shipped_parameter_file_fits_the_plant_its_launch_file_starts(config):
    path = REPO / "config" / config
    _, node = node_parameters(path)
    mech = load_mechanism(str(node["mechanism"]))
    dt = float(node["dt"])
    read_params(path, mech)                     # (the file's estimator settings are valid for its mechanism)
    cfg = estimator_config_from_file(str(path), dt, "fused")
    doc = yaml.safe_load(path.read_text())
    values = dict(doc[f"/**/{plant_node_name(path)}"]["ros__parameters"]["actuator"])
    # (as the plant node reads its section: `ideal` applies the commands exactly, whatever the other values)
    actuator = Actuator.ideal(mech) if values.pop("ideal", False) else Actuator.from_values(mech, values)
    encoders = [s.name for s in mech.sensors if s.kind == "encoder"]
    traj = SimulatedPlant(mech, dt=dt, seed=5, actuator=actuator, sensors=encoders).simulate(SECONDS)
    est = FixedLagEstimator(mech, cfg)
    err, std = [], []
    for k, t in enumerate(traj.t):
        e = est.step(float(t), traj.efforts[k], {n: float(traj.readings[n][k]) for n in encoders})
        if t >= SCORED_FROM:
            err.append(np.asarray(e.efforts, float) - traj.applied[k])
            std.append(np.asarray(e.efforts_std, float))
    err, std = np.array(err), np.array(std)
    nees = float(np.mean((err / std) ** 2))
    limits = est.density_fit_limits() or {}
    print(f"\n  {config}: effort RMSE {np.sqrt(np.mean(err ** 2, axis=0))}, NEES {nees:.2f}, "
          f"fitted {est.fitted_densities()}, at an edge {limits}")
    assert 0.3 < nees < 3.0, nees
    assert "top" not in limits.values(), limits
