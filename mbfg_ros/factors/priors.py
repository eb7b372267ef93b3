"""Priors on the blocks of one step: independent per-coordinate, and correlated (whitened)."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np


from mbfg_ros.factors.base import Factor, sigma_array

TWO_PI = 2.0 * math.pi


class Prior(Factor):
    """f_prior: e = x[select] − x0 (all of x when `select` is None).  Jacobian: rows of I."""

    linear = True
    kernel_kind = "prior"

    params = ('mean',)

    def __init__(self, block: str, mean, sigma, select: Optional[Sequence[int]] = None, size: Optional[int] = None):
        self.mean = np.array(mean, dtype=float).reshape(-1)
        self.slots = (block,)
        self.dim = self.mean.size
        self.size = self.dim if size is None else int(size)
        self.select = None if select is None else np.asarray(select, dtype=np.intp)
        if self.select is not None and self.select.size != self.dim:
            raise ValueError("Prior: len(select) must equal len(mean)")
        self.sigmas = sigma_array(sigma, self.dim)
        self.name = f"prior({block})"
        self._J = np.eye(self.size)[self.select] if self.select is not None else np.eye(self.size)

    def evaluate(self, x, ctx=None, params=None):
        e = (x if self.select is None else x[self.select]) - (self.mean if params is None else params[0])
        return e, [self._J]

    def kernel_arguments(self):
        return [int(i) for i in (range(self.dim) if self.select is None else self.select)], []


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

    def evaluate(self, *blocks, ctx=None, params=None):
        return self._R.dot(np.concatenate(blocks) - (self.mean if params is None else params[0])), self._J
