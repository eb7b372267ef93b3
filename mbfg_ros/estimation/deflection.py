"""The encoders' deflection: what a motor encoder behind a gear reads beyond the link's coordinate.

An encoder on a motor shaft reads the link's joint through the gear's play and elasticity: its reading is the
coordinate plus a small deflection b that the load winds up and lets go within tens of milliseconds, bounded —
not an acceleration whose integral wanders without bound.  With ``sigmas.deflection_sigma`` σ_b > 0 (units of
each encoder's coordinate: rad, m) the state gets a block ``deflection`` with one b per encoder, each a
first-order Gauss–Markov process of stationary σ_b and time constant T_b = ``sigmas.deflection_time_constant``
(`factors.GaussMarkov`, exact per step), started at its stationary prior N(0, σ_b) in every window; the encoder
reads q[c] + b (`factors.Encoder` with a deflection).

Where it is (`encoder_deflection`): with σ_b > 0 configured; and in estimation mode where the densities are
fitted online (``adapt_densities``, the default), on every mechanism with an encoder on a geared actuator's coordinate
(``gear_ratio`` ≠ ±1: the encoder is the motor's, behind the gear), whose σ_b the fit then chooses among none and
0.1–10 mrad (`density_adaptation.DEFLECTION_GRID`; "none" in the state: σ_b at `FLOOR_RATIO` of the encoders'
σ, where it changes nothing) from the start none; the window itself starts at the grid's middle, 1 mrad, until
the density fit's estimates are used (`FixedLagEstimator._cautious_deflection`: from none, the configured densities
read a real gear's wobble as effort).  Elsewhere (σ_b 0 and no gear, or the fit off): no deflection
block, no extra work.

Why (bench/encoder_deflection.py, the DFKI double pendulum, gear ratio 6, motor-side encoders): the readings'
innovation likelihood prefers this deflection to white acceleration noise alone by 25–220 nats over 5 s on every
run, and the shoulder torque's lag below 5 Hz falls from 98–110 ms to 0–32 ms (docs/decisions.md).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

import mbfg_ros.factors as F

__all__ = ["EncoderDeflection", "encoder_deflection", "geared_encoders", "deflection_floor", "FLOOR_RATIO"]


class EncoderDeflection:
    """The deflection block of a mechanism's encoders (`names`, in the mechanism's order: entry j of the block is
    encoder j's), its process and its prior; σ_b and T_b are read from `sigmas` when units are made (a fit may
    change them: the transition units are rebuilt with the step-size cache)."""

    def __init__(self, names: List[str], sigmas: Dict[str, float]):
        self.names = tuple(names)
        self.index = {name: j for j, name in enumerate(self.names)}
        self.size = len(self.names)
        self.sigmas = sigmas

    @property
    def sigma(self) -> float:
        return float(self.sigmas["deflection_sigma"])

    @property
    def time_constant(self) -> float:
        return float(self.sigmas["deflection_time_constant"])

    def transition_unit(self, h: float) -> F.Factor:
        """The Gauss–Markov process between two steps h apart."""
        return F.GaussMarkov("deflection", self.size, h, self.sigma, self.time_constant)

    def seed_units(self) -> list:
        """A window's first deflection: its stationary prior."""
        return [F.Prior("deflection", np.zeros(self.size), self.sigma)]


FLOOR_RATIO = 1e-2     # "no deflection" in a state that has the block: σ_b this share of the encoders' smallest σ


def geared_encoders(mech) -> List[str]:
    """The encoders on the coordinate of an actuator with a gear (|gear_ratio| ≠ 1)."""
    geared = {int(c) for c, a in zip(mech.actuated, mech.spec.actuators) if abs(float(a.gear_ratio)) != 1.0}
    return [s.name for s in mech.sensors if s.kind == "encoder" and int(s.coordinate) in geared]


def deflection_floor(mech) -> float:
    """σ_b of "none" in a state with a deflection block (`FLOOR_RATIO` of the encoders' smallest σ)."""
    return FLOOR_RATIO * min(float(s.sigma) for s in mech.sensors if s.kind == "encoder")


def encoder_deflection(mech, mode: str, sigmas: Dict[str, float], fitted: bool) -> Optional[EncoderDeflection]:
    """The deflection of the mechanism's encoders in estimation or fused mode (the modes that read encoders):
    with ``deflection_sigma`` > 0, or in estimation mode with `fitted` (the densities fitted online) where an
    encoder reads a geared actuator (its σ_b's fit then starts at none: `deflection_floor`, set in `sigmas`); else
    None.  (Not by default in fused mode: there the commands pin the motion down, and the deflection's freedom
    cost the DFKI runs' shoulder torque up to 45 % and the pendubot's track: docs/decisions.md.)"""
    names = [s.name for s in mech.sensors if s.kind == "encoder"]
    if mode not in ("estimation", "fused") or not names:
        return None
    if not sigmas.get("deflection_sigma", 0.0) > 0.0:
        if not (fitted and mode == "estimation" and geared_encoders(mech)):
            return None
        sigmas["deflection_sigma"] = deflection_floor(mech)
    return EncoderDeflection(names, sigmas)
