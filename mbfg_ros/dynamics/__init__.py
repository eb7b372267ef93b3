"""Multibody dynamics of a `Mechanism`: `constrained` (forward/inverse dynamics and the one formula of the
dynamics linearization), `kinematics` (position, velocity and acceleration problems), `coordinates`
(degrees of freedom, choice of independent coordinates), and the two evaluation caches the factors read:
`cache.EvalContext` (one step) and `batched.BatchContext` (all steps of a trajectory at once).
"""
