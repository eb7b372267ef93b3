"""Factor units of the multibody factor graphs, one module per family (see `mbfg_ros.factors.base`)."""

from mbfg_ros.factors.base import Factor, prev, sigma_or_default
from mbfg_ros.factors.constraints import (AccelerationConstraints, AccelerationConstraintsIndep, PositionConstraints,
                                          PositionConstraintsIndep, VelocityConstraints, VelocityConstraintsIndep)
from mbfg_ros.factors.dynamics import ForwardDynamics, IdentifiedDynamics, InverseDynamics, Jerk
from mbfg_ros.factors.integrators import (EulerIntegrator, HermiteIntegrator, HermiteVelocityIntegrator,
                                          SecondDifference, SoftEquality, TrapezoidalIntegrator)
from mbfg_ros.factors.noise import default_sigmas
from mbfg_ros.factors.priors import CorrelatedPrior, Prior
from mbfg_ros.factors.processes import GaussMarkov, IntegratedRandomWalk, RandomWalk, white_acceleration_sigmas
from mbfg_ros.factors.sensors import Encoder, Gyroscope, ObservedCoordinate

__all__ = [
    "Factor", "prev", "sigma_or_default", "default_sigmas", "Prior", "CorrelatedPrior",
    "EulerIntegrator", "TrapezoidalIntegrator", "HermiteIntegrator", "HermiteVelocityIntegrator", "SoftEquality",
    "SecondDifference", "IntegratedRandomWalk", "RandomWalk", "GaussMarkov", "white_acceleration_sigmas",
    "PositionConstraints", "VelocityConstraints", "AccelerationConstraints", "PositionConstraintsIndep",
    "VelocityConstraintsIndep", "AccelerationConstraintsIndep", "ForwardDynamics", "InverseDynamics", "IdentifiedDynamics", "Jerk",
    "Encoder", "Gyroscope", "ObservedCoordinate",
]
