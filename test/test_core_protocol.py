"""The estimation core the node is given satisfies `mbfg_ros.ros.core.EstimatorCore`: every call the node
makes exists on `FixedLagEstimator` with the parameters the node passes (by name where it passes them
by name), and the attribute it reads too, so a change of the core's API shows here rather than in a running node."""

import importlib.util
import inspect
from pathlib import Path

import pytest

from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.ros.core import EstimatorCore

CALLS = [name for name, member in vars(EstimatorCore).items()
         if callable(member) and not name.startswith("_")]


def test_the_protocol_lists_the_node_calls():
    assert sorted(CALLS) == sorted(["step", "prepare_next_step", "reinitialize", "apply_reinitialization",
                                    "add_late_observations", "correct_commands", "reset",
                                    "joint_covariance", "fitted_densities", "density_fit_limits",
                                    "fitted_sensor_sigmas", "numerics", "parameters", "freeze_parameters",
                                    "reset_parameters", "smoothed_estimates"])


def test_the_attributes_the_node_reads_are_properties_of_the_core():
    attributes = [name for name, member in vars(EstimatorCore).items() if isinstance(member, property)]
    assert attributes == ["parameter_names"]
    for name in attributes:
        assert isinstance(inspect.getattr_static(FixedLagEstimator, name), property), name


@pytest.mark.parametrize("name", CALLS)
def test_fixed_lag_estimator_has_each_call(name):
    wanted = inspect.signature(getattr(EstimatorCore, name))
    got = inspect.signature(getattr(FixedLagEstimator, name))
    assert list(got.parameters)[:len(wanted.parameters)] == list(wanted.parameters), (name, got)
    extra = list(got.parameters.values())[len(wanted.parameters):]
    assert all(p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in extra), (name, got)


def test_the_bench_stand_in_core_has_every_call_and_attribute():
    """bench/stub_core_node.py's StubCore stands in for the core in a running node: a call it lacks would fail
    there (in the diagnostics, a service), not here, without this check."""
    pytest.importorskip("rclpy")
    path = Path(__file__).resolve().parents[1] / "bench" / "stub_core_node.py"
    spec = importlib.util.spec_from_file_location("stub_core_node", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    members = [name for name, member in vars(EstimatorCore).items()
               if not name.startswith("_") and (callable(member) or isinstance(member, property))]
    assert [name for name in members if not hasattr(module.StubCore, name)] == []
    assert module.StubCore.parameter_names == ()
