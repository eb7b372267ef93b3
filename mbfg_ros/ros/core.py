"""What the estimator node needs of its estimation core: the few calls it makes, as a `typing.Protocol`.

`mbfg_ros.estimation.estimator.FixedLagEstimator` is the core; a stand-in (bench/stub_core_node.py)
satisfies the same protocol.  The node builds its core with a `CoreFactory` called as
`factory(mech, config)`, at start-up and whenever it must rebuild it (changed noise sigmas or mode, a
failed reset).  The node reads one attribute of the core, `parameter_names`; what it publishes at every
step comes in the `Estimate` that `step` returns, the rest (diagnostics, ~/parameters) from the calls below at
their own, lower rates.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from mbfg_ros.estimation.config import Estimate, EstimatorConfig
from mbfg_ros.model.mechanism import Mechanism


class EstimatorCore(Protocol):
    def step(self, t: float, efforts: Optional[np.ndarray] = None,
             observations: Optional[Dict[str, float]] = None,
             command_times: Optional[Sequence[float]] = None) -> Estimate:
        """The estimate at time t (seconds since the start) from the efforts (actuator order, NaN: unknown; each
        given at its `command_times` entry, same clock, NaN or None: at t) and the readings of that step; raises
        on a numerical failure it could not recover from."""

    def smoothed_estimates(self) -> List[Estimate]:
        """With `EstimatorConfig.smoothed_lag` > 0: the earlier steps' estimates now smoothed by that many steps
        after them, each once, in time order (the node publishes them on ~/smoothed/); else empty."""

    def prepare_next_step(self) -> bool:
        """Do now the input-free part of the next step (the node calls it while waiting for the inputs)."""

    def reinitialize(self, assembly_mode: Optional[Sequence[int]] = None) -> Tuple[np.ndarray, float]:
        """Re-solve the position problem on the requested branch: (assembly mode, constraint residual)."""

    def apply_reinitialization(self) -> bool:
        """Re-seed the window now if `reinitialize` asked for it (else the next step does it)."""

    def add_late_observations(self, step: int, observations: Dict[str, float]) -> Tuple[List[str], List[str]]:
        """Fuse readings of the earlier step `Estimate.step`; (fused, refused) reading names."""

    def correct_commands(self, corrections: Sequence[tuple]) -> List[int]:
        """Replace the commands (actuator order, NaN: unknown) that the earlier steps `Estimate.step` were
        estimated with: (step, whole command[, when each was given, as `step`'s command_times]); the step ids
        corrected."""

    def reset(self) -> None:
        """Forget everything: the next step initializes."""

    def numerics(self) -> Dict[str, str]:
        """Which form computes each of the core's models: {model: 'compiled' or 'numpy (why)'} (reported in the
        diagnostics where they differ from the kernel's global state)."""

    def fitted_densities(self) -> Optional[Dict[str, float]]:
        """The process densities in use (name → value) when they are fitted online, else None (reported in the
        diagnostics)."""

    def density_fit_limits(self) -> Optional[Dict[str, str]]:
        """The fitted densities whose online estimate sits at the edge of its range (name → "bottom" or "top"), {}
        where none does, None when they are not fitted online (reported in the diagnostics; a top edge warns)."""

    def fitted_sensor_sigmas(self) -> Optional[Dict[str, float]]:
        """The σ in use of each encoder when they are fitted online, else None (reported in the diagnostics)."""

    def joint_covariance(self, coordinates: Sequence[int]) -> Optional[np.ndarray]:
        """The newest estimate's covariance of [angles, rates, efforts] of the coordinate columns (3m × 3m), or
        None before the first estimate (used only with publish_covariance)."""

    @property
    def parameter_names(self) -> Tuple[str, ...]:
        """The identified actuator parameters (``joint.parameter``); () when nothing is identified."""

    def parameters(self) -> Optional[Dict[str, object]]:
        """The identified parameters now: {'names', 'values', 'std' (1σ), 'prior_std', 'excitation'
        (1 − σ/σ_prior in [0, 1]), 'frozen'}, or None when nothing is identified.  Computes a marginal of the
        window: the node asks at ~/parameters' and the diagnostics' rates, never at every step."""

    def freeze_parameters(self, frozen: bool) -> bool:
        """Hold the identified parameters at their newest values (`frozen`) or let them learn again; False when
        nothing is identified."""

    def reset_parameters(self) -> bool:
        """The identified parameters back to their priors (and learning); False when nothing is identified."""


CoreFactory = Callable[[Mechanism, EstimatorConfig], EstimatorCore]
