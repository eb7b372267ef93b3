"""The stacked per-step state X_k = [q, q̇, q̈ (, τ) ...] of the fast path: its blocks, their columns and the
map from a unit's slot names to (previous / this step, block, columns)."""

from __future__ import annotations

from typing import Dict, Sequence, Tuple

import numpy as np

from mbfg_ros.factors.base import Factor

__all__ = ["StateLayout"]


class StateLayout:
    """The blocks of the stacked per-step state X = [block₀, block₁, ...] (name, size) in order."""

    def __init__(self, blocks: Sequence[Tuple[str, int]]):
        self.blocks = tuple((str(n), int(s)) for n, s in blocks)
        self.slices: Dict[str, slice] = {}
        off = 0
        for n, s in self.blocks:
            self.slices[n] = slice(off, off + s)
            off += s
        self.dim = off
        # slot name -> (0 = previous step / 1 = this step, block name, columns)
        self.slot_map: Dict[str, Tuple[int, str, slice]] = {}
        for n, _ in self.blocks:
            self.slot_map[n] = (1, n, self.slices[n])
            self.slot_map[n + "_prev"] = (0, n, self.slices[n])

    def __contains__(self, name):
        return name in self.slices

    def views(self, x: np.ndarray) -> Dict[str, np.ndarray]:
        return {n: x[s] for n, s in self.slices.items()}

    def pack(self, **blocks) -> np.ndarray:
        x = np.zeros(self.dim)
        for n, val in blocks.items():
            x[self.slices[n]] = val
        return x

    def get(self, x: np.ndarray, name: str) -> np.ndarray:
        return x[self.slices[name]]

    def check(self, units: Sequence[Factor]):
        for u in units:
            for s in u.slots:
                if s not in self.slot_map:
                    raise ValueError(f"{u.name}: slot '{s}' is not a block of the state {self.blocks}")

    def __repr__(self):
        return f"StateLayout({', '.join(f'{n}:{s}' for n, s in self.blocks)})"
