"""Priors on the blocks of one step: independent per-coordinate, and correlated (whitened)."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np


from mbfg_ros.factors.base import Factor, sigma_array

TWO_PI = 2.0 * math.pi


def wrapped_angle(d: float) -> float:
    """An angle difference d moved by whole turns into [−π, π): the same difference of two angles read in any 2π
    range (plain floats: it runs per encoder reading)."""
    return d - TWO_PI * math.floor((d + math.pi) / TWO_PI)


class Selection(Factor):
    """e = x[select] − values: chosen entries of one block minus given values (a prior's mean, a reading), the
    one formula of the priors (`Prior`) and of the coordinate readings (`factors.sensors`); with ``wrap`` (one row
    read as an angle) the difference is moved by whole turns into [−π, π).  Jacobian: rows of I.  Compiled kinds
    ``selection`` and ``wrapped_selection`` (one function of `_kernel.c`).  A subclass sets its single per-step
    parameter (``params``) and calls `_select`."""

    linear = True
    kernel_kind = "selection"

    def _select(self, block: str, size: int, select: Optional[Sequence[int]], dim: int, wrap: bool = False,
                one: Optional[int] = None):
        """`select` (None: all `size` entries) of block `block`; `one`: the single entry of a one-row selection
        whose value is a float (evaluated on plain floats: it runs per reading)."""
        self.slots = (block,)
        self.dim = dim
        self.size = int(size)
        self.select = None if select is None else np.array(select, dtype=np.intp)
        if self.select is not None and self.select.size != dim:
            raise ValueError(f"{type(self).__name__}: len(select) must equal the number of rows ({dim})")
        if wrap and one is None:
            raise ValueError(f"{type(self).__name__}: only a one-row selection is wrapped")
        self.wrap = bool(wrap)
        self._one = one
        self._J = np.eye(self.size)[self.select] if self.select is not None else np.eye(self.size)
        self.kernel_kind = "wrapped_selection" if wrap else "selection"
        if wrap:
            self.linear = False         # the wrap makes it piecewise affine

    def evaluate(self, x, *, params, ctx=None):
        values = params[0]
        one = self._one
        if one is not None:
            d = x.item(one) - values
            if self.wrap:
                d = wrapped_angle(d)
            return np.array([d]), [self._J]
        return (x if self.select is None else x[self.select]) - values, [self._J]

    def kernel_arguments(self):
        return [int(i) for i in (range(self.dim) if self.select is None else self.select)], []


class Prior(Selection):
    """f_prior: e = x[select] − x0 (all of x when `select` is None).  Jacobian: rows of I."""

    params = ('mean',)

    def __init__(self, block: str, mean, sigma, select: Optional[Sequence[int]] = None, size: Optional[int] = None):
        self.mean = np.array(mean, dtype=float).reshape(-1)
        dim = self.mean.size                # (`_select` checks that `select` has as many entries)
        self._select(block, dim if size is None else size, select, dim)
        self.sigmas = sigma_array(sigma, self.dim)
        self.name = f"prior({block})"


class CorrelatedPrior(Factor):
    """A Gaussian prior on several blocks jointly: e = R (x − mean), x = the blocks stacked in slot order and
    R a square root of the information (Rᵀ R = P⁻¹), so e is whitened already (unit sigmas).  Jacobians:
    R's column blocks."""

    linear = True

    params = ('mean',)

    def __init__(self, blocks: Sequence[str], sizes: Sequence[int], mean, sqrt_information):
        self.mean = np.array(mean, dtype=float).reshape(-1)
        R = np.array(sqrt_information, dtype=float)
        sizes = [int(z) for z in sizes]
        if len(sizes) != len(blocks) or sum(sizes) != self.mean.size or R.shape != (self.mean.size,) * 2:
            raise ValueError(f"CorrelatedPrior: blocks {list(blocks)} of sizes {sizes}, a mean of "
                             f"{self.mean.size} and a {R.shape} square root of the information do not match")
        if not np.isfinite(R).all():
            raise ValueError("CorrelatedPrior: non-finite square root of the information")
        self.slots = tuple(blocks)
        self.dim = self.mean.size
        self.sigmas = np.ones(self.dim)
        self._R = R
        ends = np.cumsum(sizes)
        self._J = [R[:, b - z:b].copy() for z, b in zip(sizes, ends)]
        self.name = f"prior({', '.join(blocks)})"

    @classmethod
    def from_covariance(cls, blocks: Sequence[str], sizes: Sequence[int], mean, P, floor: float) -> "CorrelatedPrior":
        """The prior of covariance P, its eigenvalues raised to at least floor² (never tighter than that: a
        marginal of a constrained state is nearly singular across the constraints)."""
        lam, V = np.linalg.eigh(0.5 * (P + P.T))
        lam = np.maximum(lam, floor * floor)
        return cls(blocks, sizes, mean, (V / np.sqrt(lam)).T)

    def evaluate(self, *blocks, params, ctx=None):
        return self._R.dot(np.concatenate(blocks) - params[0]), self._J
