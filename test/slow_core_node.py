"""Test-only: the `estimator` node whose core step takes at least a fixed wall-clock time.

    MBFG_TEST_STEP_COST_S=0.003 PYTHONPATH=test python -m slow_core_node --ros-args --params-file ...

Everything is the real node and the real core (`FixedLagEstimator`); each `step` of the core is followed by
a busy wait until MBFG_TEST_STEP_COST_S seconds (wall clock) have passed since the step began.  With a cost
above the node's `dt` the node cannot keep up on any machine, however fast: the tests that need an
overloaded node (skip-ahead, overruns) get one on purpose instead of hoping that the machine is too slow
for the step.  Started through `ros_helpers.estimator_process(step_cost=...)` / `overloaded_estimator`.
"""

from __future__ import annotations

import os
import sys
import time

from mbfg_ros.estimation.estimator import FixedLagEstimator
from mbfg_ros.ros import node

STEP_COST_ENV = "MBFG_TEST_STEP_COST_S"


def slowed_core_factory(step_cost_s: float):
    """A core factory for `node.main`: a FixedLagEstimator whose `step` lasts at least `step_cost_s`."""
    if not step_cost_s > 0.0:
        raise ValueError(f"{STEP_COST_ENV} must be a positive number of seconds (got {step_cost_s!r})")

    def build(mech, config):
        core = FixedLagEstimator(mech, config)
        real_step = core.step

        def step(t, efforts=None, observations=None, command_times=None):
            # a wall-clock deadline, not CPU time: preemption by other processes counts, so the step is
            # never shorter than the cost, whatever else the machine does
            deadline = time.perf_counter() + step_cost_s
            estimate = real_step(t, efforts=efforts, observations=observations, command_times=command_times)
            while time.perf_counter() < deadline:
                pass
            return estimate
        core.step = step
        return core
    return build


if __name__ == "__main__":
    text = os.environ.get(STEP_COST_ENV, "")
    try:
        factory = slowed_core_factory(float(text))
    except ValueError:
        sys.exit(f"error: {STEP_COST_ENV} must be a positive number of seconds (got {text!r})")
    sys.exit(node.main(core_factory=factory))
