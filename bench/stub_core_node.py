"""The `estimator` node with its core replaced by a stand-in that only burns a fixed CPU time per step.

    python -m bench.stub_core_node --ros-args --params-file config/four_bar.yaml   (from the repository root)

Used by `bench/node_latency.py --core-cost` to measure what the node's latency would be if the
estimator's core step cost that much CPU: everything else is the real node (inputs over DDS, scheduler,
publishing, diagnostics).  The environment chooses the cost: MBFG_STUB_STEP_US (inside `step`, on the
input-to-output path) and MBFG_STUB_PREPARE_US (`prepare_next_step`, after publishing).  The outputs
carry the mechanism's drawn pose, so its estimation errors mean nothing.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mbfg_ros.ros import node                  # noqa: E402
from mbfg_ros.estimation.config import Estimate        # noqa: E402


def _burn(seconds: float):
    """Spin for `seconds` of this thread's CPU time (a preempted thread does not count it)."""
    if seconds <= 0.0:
        return
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class StubCore:
    """An `EstimatorCore` (mbfg_ros.ros.core) standing in for `FixedLagEstimator`: the node's calls, a fixed
    CPU cost, a constant estimate."""

    def __init__(self, mech, config):
        self.mech = mech
        self.step_cost = float(os.environ.get("MBFG_STUB_STEP_US", "0")) * 1e-6
        self.prepare_cost = float(os.environ.get("MBFG_STUB_PREPARE_US", "0")) * 1e-6
        n = mech.n
        self._template = Estimate(0.0, np.array(mech.q0, dtype=float), np.zeros(n), np.zeros(n), np.zeros(n),
                                  np.zeros(len(mech.actuated)), np.ones(len(mech.assembly_mode_names)), 0.0, 0.0)
        self.last = None

    def reset(self):
        self.last = None

    def prepare_next_step(self) -> bool:
        _burn(self.prepare_cost)
        return True

    def smoothed_estimates(self):
        return []              # (no window: nothing is smoothed)

    def reinitialize(self, assembly_mode=None):
        return self._template.assembly_mode, 0.0

    def apply_reinitialization(self) -> bool:
        return False

    def add_late_observations(self, step, observations):
        return list(observations), []

    def correct_commands(self, corrections):
        return [step for step, _ in corrections]

    def fitted_densities(self):
        return None

    def density_fit_limits(self):
        return None

    def fitted_sensor_sigmas(self):
        return None

    def numerics(self):
        return {}                       # no model of its own: the diagnostics report the kernel's state

    def joint_covariance(self, coordinates):
        return None                     # no covariance: ~/joint_states_covariance stays silent

    parameter_names = ()                # nothing identified: no ~/parameters, its services answer so

    def parameters(self):
        return None

    def freeze_parameters(self, frozen):
        return False

    def reset_parameters(self):
        return False

    def step(self, t, efforts=None, observations=None) -> Estimate:
        t0 = time.perf_counter()
        _burn(self.step_cost)
        e = self._template
        self.last = Estimate(t, e.q, e.v, e.a, e.Q, e.efforts, e.assembly_mode, 0.0, time.perf_counter() - t0)
        return self.last


def main(args=None) -> int:
    return node.main(args, core_factory=StubCore)


if __name__ == "__main__":
    sys.exit(main())
