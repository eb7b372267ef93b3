"""The estimation core the node is given satisfies `mbfg_ros.ros.core.EstimatorCore`: every call the node
makes exists on `FixedLagEstimator` with the parameters the node passes (by name where it passes them
by name), and the attribute it reads too, so a change of the core's API shows here rather than in a running node."""

import inspect

import pytest

from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.ros.core import EstimatorCore

CALLS = [name for name, member in vars(EstimatorCore).items()
         if callable(member) and not name.startswith("_")]


def test_the_protocol_lists_the_node_calls():
    assert sorted(CALLS) == sorted(["step", "prepare_next_step", "reinitialize", "apply_reinitialization",
                                    "add_late_observations", "correct_commands", "reset",
                                    "joint_covariance", "fitted_densities", "fitted_sensor_sigmas", "numerics",
                                    "parameters", "freeze_parameters", "reset_parameters"])


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
