"""The factors' default noise sigmas (paper Table 2: relative weights chosen for simulation)."""

from __future__ import annotations

from typing import Dict


def default_sigmas() -> Dict[str, float]:
    """Noise sigmas; defaults from the paper's Table 2 (only relative weights matter)."""
    return {
        "prior_q0": 1e-5,            # f_prior on q0 (covariance 1e-10)
        "prior_v0": 1e-5,
        "integrator": 1e-3,          # f_ti (q–q̇ and q̇–q̈)
        "dynamics": 1e-3,            # f_dyn / f_idyn
        "position_constraints": 1e-3,
        "velocity_constraints": 1e-3,
        "acceleration_constraints": 1e-3,
        "soft_equality": 10.0,       # f_eq (covariance 1e2)
        "commanded_effort": 1e-3,    # how well the commanded efforts are applied (fused mode)
        "effort_random_walk": 50.0,  # N·m/s/√s: how fast unknown efforts may change
        "initial_effort": 100.0,     # weak prior on the unknown efforts at the first step (estimation, fused)
        "initial_velocity": 10.0,    # weak prior on an unknown initial velocity (estimation, fused; no v0 given)
        "observed_coordinate": 1e-3, # generic observations 'q:<name>', 'v:<name>', 'a:<name>' (unless in sensor_sigmas)
    }
