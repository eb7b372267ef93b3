"""gtsam adapters of the factor units: the key of a step's stacked state, a unit as a `gtsam.CustomFactor`
(one vector key per slot: the paper's graph structure, used by the tests and the batch solvers; GTSAM
relinearizes it whenever it likes, at the price of a Python callback per linearization), and the unit
noise model of pre-whitened rows."""

from __future__ import annotations

from typing import Dict, Sequence

import gtsam
import numpy as np

from mbfg_ros.factors.base import Factor

__all__ = ["STATE_KEY_0", "state_key", "custom_factor", "unit_noise"]

#: gtsam key of the stacked state of step 0; step k's is STATE_KEY_0 + k
STATE_KEY_0 = gtsam.symbol("x", 0)


def state_key(k: int) -> int:
    """gtsam key of the stacked state of step k (= gtsam.symbol('x', k))."""
    return STATE_KEY_0 + int(k)


def custom_factor(unit: Factor, keys: Sequence[int], params: tuple) -> gtsam.CustomFactor:
    """`gtsam.CustomFactor` for `unit` with its per-step values `params` (`Factor.params`; the factor holds both,
    immutable), one vector key per slot (in slot order), diagonal noise model with the unit's sigmas."""
    keys = [int(k) for k in keys]
    if len(keys) != len(unit.slots):
        raise ValueError(f"{unit.name}: {len(unit.slots)} slots {unit.slots} but {len(keys)} keys")
    u, values_of_step = unit, unit.checked_params(params)
    noise = gtsam.noiseModel.Diagonal.Sigmas(np.asarray(u.sigmas, dtype=float))

    def error_function(this, values, H):
        blocks = [values.atVector(k) for k in keys]
        if H is None:
            return u.error(*blocks, params=values_of_step)
        e, J = u.evaluate(*blocks, params=values_of_step)
        for i, Ji in enumerate(J):
            H[i] = Ji
        return e

    return gtsam.CustomFactor(noise, keys, error_function)


_UNIT_NOISE: Dict[int, object] = {}


def unit_noise(rows: int):
    """The (cached) unit noise model of `rows` already whitened rows."""
    m = _UNIT_NOISE.get(rows)
    if m is None:
        m = _UNIT_NOISE[rows] = gtsam.noiseModel.Unit.Create(rows)
    return m
