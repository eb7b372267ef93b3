"""Batch (whole-trajectory) factor-graph solvers.

`problem` (the least-squares problem and its banded assembly) ← `engines` (the sparse and the gtsam
Levenberg–Marquardt) ← `inverse_dynamics` (the paper's staged inverse dynamics) and `forward_dynamics`
(batch forward dynamics); `trajectories` holds the prescribed motions and their closed-form references.
"""
