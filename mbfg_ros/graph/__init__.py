"""The fast path's factor graph: `layout` (the stacked per-step state), `step_model` (one step's units
linearized in Python into one whitened linear factor), `window` (the iSAM2 fixed-lag window with the
relinearization safeguard), `gtsam_adapters` (state keys, units as `gtsam.CustomFactor`, noise).

Importing it checks that the installed gtsam has what the package calls (`GtsamTooOld` otherwise): gtsam 4.3a1,
the newest wheel for Python 3.10 (ROS 2 Humble's), lacks `IncrementalFixedLagSmoother.getISAM2Result` and
`calculateEstimateVector`, and every estimator step would fail on them."""

from __future__ import annotations

import importlib.metadata

import gtsam


class GtsamTooOld(ImportError):
    """The installed gtsam lacks classes or methods the package calls: the package cannot run."""


#: what the package calls beyond gtsam 4.2's Python API: {class: methods}
NEEDED = {"IncrementalFixedLagSmoother": ("update", "getISAM2Result", "calculateEstimateVector", "marginalCovariance",
                                          "getFactors"),
          "ISAM2Params": (), "CustomFactor": (), "LinearContainerFactor": (), "JacobianFactor": ()}


def missing_gtsam_api(module=gtsam) -> list:
    """`CLASS.METHOD` (or `CLASS`) of NEEDED that `module` lacks."""
    out = []
    for name, methods in NEEDED.items():
        cls = getattr(module, name, None)
        if cls is None:
            out.append(name)
        else:
            out.extend(f"{name}.{m}" for m in methods if not hasattr(cls, m))
    return out


def gtsam_version() -> str:
    try:
        return importlib.metadata.version("gtsam")
    except importlib.metadata.PackageNotFoundError:
        return "a build without package metadata"


_missing = missing_gtsam_api()
if _missing:
    raise GtsamTooOld(f"mbfg_ros needs gtsam 4.3.0 or later; the installed gtsam ({gtsam_version()}, "
                      f"{gtsam.__file__}) lacks {', '.join(_missing)}: `pip install gtsam==4.3.0` (wheels for Python "
                      f"3.11–3.14); on Python 3.10 (ROS 2 Humble), which has no 4.3.0 wheel, build GTSAM 4.3.0 with "
                      f"its Python wrapper (cmake -DGTSAM_BUILD_PYTHON=ON)")
