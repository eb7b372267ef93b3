"""Maximum-likelihood fit of the process densities (and optionally the encoder sigmas) from one recording.

Method (Mehra's innovation likelihood): for given parameters θ, `ReducedEKF` — the exact reduced model with the
estimator's stochastic model: ë white of the effort density (estimation) or disturbance density (fused, damped
with the disturbance time constant), z̈
white of the acceleration density, encoders with σ — runs over the recording; its innovations ν_k with
covariances S_k factor the readings' likelihood, log p(y | θ) = Σ_k log N(ν_k; 0, S_k).  θ is searched in
log10 space (densities span decades; the likelihood is smooth there): a bounded Brent search for one
parameter, Nelder–Mead for several.  The 1σ of each fitted log10 value comes from the curvature of the
log-likelihood at the optimum (the inverse Hessian, central differences of 0.05 decade).

Only encoders on a set of independent coordinates enter (the EKF's measurement model: one encoder per degree of
freedom); gyroscopes are left out and keep their sigmas.  The filter steps by each actual interval between the
samples (stamps that jitter or drift are taken as they are) and updates with the readings present (a missing
one, NaN, adds nothing to the likelihood); it starts at the first sample where every encoder reads.

Long recordings are decimated (every m-th reading, the commands averaged over each interval) to at most
`max_steps` filter steps: the EKF costs ~1 ms a step in Python and the search needs ~20 passes, while the
densities are continuous-time quantities (per second, not per step) and the encoder σ is per reading, so a
coarser grid estimates the same numbers, with less information about the fastest effort variations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
from scipy.optimize import minimize, minimize_scalar

from mbfg_ros.blas import single_threaded_blas
from mbfg_ros.dynamics.kinematics import AssemblyError
from mbfg_ros.estimation.reduced_ekf import ReducedEKF
from mbfg_ros.factors.noise import default_sigmas
from mbfg_ros.model.mechanism import Mechanism

MODES = ("estimation", "fused")
SEARCH_DECADES = 6.0     # a fitted log10 value is searched within ± this of its starting value
CURVATURE_STEP = 0.05    # [decades] of the central differences giving the log-likelihood's curvature


class TuningError(ValueError):
    """A recording or request the fit cannot use; the message says what and where."""


@dataclass
class Recording:
    """Encoder readings (N, d) on the independent coordinates `coordinates` (NaN: no reading) at the strictly
    increasing times t (as stamped: jitter and drift are taken as they are), the commanded efforts
    (N, n_actuated) or None, and where they came from (for messages and the file header)."""
    t: np.ndarray
    readings: np.ndarray
    encoders: List[str]
    coordinates: List[int]
    commands: Optional[np.ndarray] = None
    source: str = ""

    @property
    def dt(self) -> float:
        """The median interval (the nominal step of jittery stamps)."""
        return float(np.median(np.diff(self.t)))

    def from_first_complete_reading(self) -> "Recording":
        """The recording from its first sample with every encoder read (the filter starts there)."""
        complete = np.nonzero(np.all(np.isfinite(self.readings), axis=1))[0]
        if complete.size == 0:
            raise TuningError(f"{self.source}: no sample has a reading of every encoder ({', '.join(self.encoders)}): "
                              f"the fit needs one to start from")
        k = int(complete[0])
        if k == 0:
            return self
        return Recording(self.t[k:], self.readings[k:], self.encoders, self.coordinates,
                         None if self.commands is None else self.commands[k:], self.source)

    def decimated(self, max_steps: int) -> "Recording":
        """At most `max_steps` samples: every m-th reading, each command the mean over its interval (what the
        interval's integral sees of a command held per sample)."""
        m = max(1, math.ceil(len(self.t) / max(int(max_steps), 2)))
        if m == 1:
            return self
        n = len(self.t) // m
        commands = None
        if self.commands is not None:
            commands = self.commands[:n * m].reshape(n, m, -1).mean(axis=1)
        return Recording(self.t[:n * m:m], self.readings[:n * m:m], self.encoders, self.coordinates, commands,
                         self.source)


def encoder_layout(mech: Mechanism):
    """(encoder names, their coordinates, their σ) — one encoder per degree of freedom, else TuningError."""
    enc = [s for s in mech.sensors if s.kind == "encoder"]
    coords = [int(s.coordinate) for s in enc]
    dof = int(mech.degrees_of_freedom())
    if len(enc) != dof or len(set(coords)) != dof:
        raise TuningError(f"{mech.spec.source}: tuning needs one encoder per degree of freedom on distinct "
                          f"coordinates ({dof} DOF, encoders: {', '.join(s.name for s in enc) or 'none'})")
    return [s.name for s in enc], coords, np.array([float(s.sigma) for s in enc])


def density_name(mode: str) -> str:
    """The estimator's density of the filter's e: the effort's (estimation) or the disturbance's (fused)."""
    return "disturbance_density" if mode == "fused" else "effort_density"


@dataclass
class FittedValue:
    name: str                 # 'effort_density', 'sensor_sigmas.crank', ...
    value: float
    log10_std: float          # 1σ of log10(value) from the curvature (nan: not positive definite)
    at_bound: bool = False    # the search stopped at its bound: the recording does not determine the value

    def describe(self) -> str:
        """'1.2e+04 ± 9 %' (1σ), '×/÷ 3.1' when the uncertainty is a large factor, with the bound flagged."""
        if not math.isfinite(self.log10_std) or self.log10_std > 3.0:
            sd = "(1σ unknown or over 3 decades: the log-likelihood is flat here)"
        elif self.relative_std < 0.5:
            sd = f"± {100 * self.relative_std:.0f} % (1σ)"
        else:
            sd = f"×/÷ {10 ** self.log10_std:.3g} (1σ)"
        bound = "  at the search bound: the recording does not determine it" if self.at_bound else ""
        return f"{self.value:.4g} {sd}{bound}"

    @property
    def relative_std(self) -> float:
        """1σ as a fraction of the value (the log-normal's σ ln 10, to first order)."""
        return self.log10_std * math.log(10.0)


@dataclass
class TuningResult:
    mode: str
    fitted: List[FittedValue]
    sigmas: Dict[str, float]            # the densities the file gets (fitted ones and the ones held)
    sensor_sigmas: Dict[str, float]     # the encoders' σ (fitted or held)
    log_likelihood: float
    evaluations: int
    steps: int                          # filter steps per evaluation (after decimation)
    dt: float                           # their step
    decimation: int
    held: Dict[str, float] = field(default_factory=dict)   # the values held fixed during the fit


def file_values(result: "TuningResult", default_acceleration_density: float) -> Dict[str, float]:
    """The densities a parameter file gets from a fit: the mode's fitted ones (fused: with the time constant
    below the node's range limit) and the acceleration density, which is fitted when asked but kept at
    `default_acceleration_density` when the recording does not determine it (a flat log-likelihood: on the
    crank four-bar and the slider-crank the search then wanders to 1e-12, where it changes nothing but the
    integrators' conditioning)."""
    fitted = {f.name: f for f in result.fitted}
    out = {}
    for k, v in result.sigmas.items():
        if k == "acceleration_density":
            f = fitted.get(k)
            undetermined = f is not None and (f.at_bound or not math.isfinite(f.log10_std) or f.log10_std > 3.0)
            out[k] = float(default_acceleration_density) if undetermined else v
        elif k == density_name(result.mode) or (k == "disturbance_time_constant" and k in fitted and v < 1e15):
            out[k] = v
    return out


def parameter_names(mech: Mechanism, mode: str, fit_sensor_sigmas: bool, fit_acceleration_density: bool):
    """What `mbfg tune` fits: the effort density (estimation), or the disturbance's density and time constant
    (fused: together they are its prior, stationary σ √(S T³/4); on the four-bar with a mismatched actuator the
    likelihood peaks near T = 0.3 s, and so does the error), optionally the acceleration density and the
    encoders' σ."""
    names = [density_name(mode)]
    if mode == "fused":
        names.append("disturbance_time_constant")
    if fit_acceleration_density:
        names.append("acceleration_density")
    if fit_sensor_sigmas:
        names += [f"sensor_sigmas.{n}" for n in encoder_layout(mech)[0]]
    return names


def log_likelihood(mech: Mechanism, rec: Recording, mode: str, values: Dict[str, float]) -> float:
    """log p(readings | values) by the EKF's innovations; −inf where the filter fails (a density so wrong that
    the mean leaves the mechanism's workspace)."""
    sigma = [values[f"sensor_sigmas.{n}"] for n in rec.encoders]
    ekf = ReducedEKF(mech, rec.coordinates, rec.dt, sigma, values[density_name(mode)], fused=mode == "fused",
                     acceleration_density=values["acceleration_density"],
                     time_constant=values["disturbance_time_constant"] if mode == "fused" else math.inf)
    fused = mode == "fused"
    try:
        with np.errstate(all="raise"):
            steps = np.diff(rec.t, prepend=rec.t[0])
            for k in range(len(rec.t)):
                ekf.step(rec.readings[k], rec.commands[k] if fused else None, steps[k])
    except (AssemblyError, FloatingPointError, np.linalg.LinAlgError, ValueError):
        return -math.inf
    return ekf.log_likelihood if math.isfinite(ekf.log_likelihood) else -math.inf


def fit(mech: Mechanism, rec: Recording, mode: str, initial: Dict[str, float], names: Sequence[str],
        max_steps: int = 2000, progress: Optional[Callable[[int], None]] = None) -> TuningResult:
    """Maximize the innovation log-likelihood over log10 of `names` (keys of `initial`, which holds every
    value the filter needs: the densities by name and 'sensor_sigmas.<encoder>'); the others stay fixed."""
    if mode not in MODES:
        raise TuningError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    if mode == "fused" and rec.commands is None:
        raise TuningError("--mode fused needs the commanded efforts")
    rec = rec.from_first_complete_reading()
    if len(rec.t) < 10:
        raise TuningError(f"{rec.source}: need at least 10 samples to fit (got {len(rec.t)})")
    if not np.all(np.diff(rec.t) > 0):
        raise TuningError(f"{rec.source}: the sample times must be strictly increasing")
    full_len = len(rec.t)
    rec = rec.decimated(max_steps)
    names = list(names)
    bad = [n for n in names if not (0 < initial[n] < math.inf)]
    if bad:
        raise TuningError(f"cannot fit {', '.join(bad)} from a start that is not a positive finite number "
                          f"({', '.join(f'{n} = {initial[n]}' for n in bad)})")
    x0 = np.log10([initial[n] for n in names])
    cache: Dict[tuple, float] = {}

    def cost(x) -> float:
        x = np.atleast_1d(x)
        key = tuple(np.round(x, 10))
        if key not in cache:
            values = dict(initial)
            values.update({n: 10.0 ** v for n, v in zip(names, x)})
            ll = log_likelihood(mech, rec, mode, values)
            cache[key] = -ll if math.isfinite(ll) else 1e300
            if progress is not None:
                progress(len(cache))
        return cache[key]

    with single_threaded_blas():      # BLAS worker threads on 8×8 matrices: expm costs 3 ms instead of 8 µs
        return _search(mech, rec, mode, initial, names, cost, x0, full_len, cache)


def _search(mech, rec, mode, initial, names, cost, x0, full_len, cache) -> TuningResult:
    if len(names) == 1:
        res = minimize_scalar(lambda v: cost([v]), bounds=(x0[0] - SEARCH_DECADES, x0[0] + SEARCH_DECADES),
                              method="bounded", options={"xatol": 0.005})
        x_best = np.array([res.x])
        at_bound = [abs(res.x - x0[0]) > SEARCH_DECADES - 0.01]
    else:
        simplex = np.vstack([x0] + [x0 + np.eye(len(x0))[i] for i in range(len(x0))])
        res = minimize(cost, x0, method="Nelder-Mead",
                       options={"initial_simplex": simplex, "xatol": 0.005, "fatol": 0.01, "maxfev": 400})
        x_best = np.asarray(res.x, float)
        at_bound = [False] * len(names)
    best = cost(x_best)
    if best >= 1e300:
        raise TuningError(f"{rec.source}: the filter fails for every value tried: is this the mechanism that "
                          f"was recorded, and are the encoders in its units?")
    log10_std = curvature_std(cost, x_best)
    values = dict(initial)
    values.update({n: float(10.0 ** v) for n, v in zip(names, x_best)})
    fitted = [FittedValue(n, values[n], float(s), bool(b)) for n, s, b in zip(names, log10_std, at_bound)]
    sigmas = {k: v for k, v in values.items() if not k.startswith("sensor_sigmas.")}
    sensor = {k[len("sensor_sigmas."):]: v for k, v in values.items() if k.startswith("sensor_sigmas.")}
    held = {k: v for k, v in initial.items() if k not in names}
    return TuningResult(mode, fitted, sigmas, sensor, -best, len(cache), len(rec.t), rec.dt,
                        max(1, full_len // len(rec.t)), held)


def curvature_std(cost: Callable, x: np.ndarray, h: float = CURVATURE_STEP) -> np.ndarray:
    """1σ of x from the inverse Hessian of cost (= −log-likelihood) by central differences; nan where the
    Hessian is not positive definite (a flat or bounded direction)."""
    n = len(x)
    f0 = cost(x)
    H = np.zeros((n, n))
    E = np.eye(n) * h
    for i in range(n):
        H[i, i] = (cost(x + E[i]) - 2 * f0 + cost(x - E[i])) / h ** 2
        for j in range(i):
            H[i, j] = H[j, i] = (cost(x + E[i] + E[j]) - cost(x + E[i] - E[j]) - cost(x - E[i] + E[j])
                                 + cost(x - E[i] - E[j])) / (4 * h ** 2)
    try:
        np.linalg.cholesky(H)
        return np.sqrt(np.diag(np.linalg.inv(H)))
    except np.linalg.LinAlgError:
        return np.full(n, math.nan)


def initial_values(mech: Mechanism, sigmas: Optional[Dict[str, float]] = None,
                   sensor_sigmas: Optional[Dict[str, float]] = None) -> Dict[str, float]:
    """Every value the filter needs: the estimator's default densities (updated by `sigmas`) and the encoders'
    σ from the mechanism file (updated by `sensor_sigmas`)."""
    d = default_sigmas(mech.spec)
    d.update(sigmas or {})
    out = {k: float(d[k]) for k in ("acceleration_density", "effort_density", "disturbance_density",
                                    "disturbance_time_constant")}
    names, _, sig = encoder_layout(mech)
    ss = dict(sensor_sigmas or {})
    for n, s in zip(names, sig):
        out[f"sensor_sigmas.{n}"] = float(ss.get(n, s))
    return out


def evaluations_budget(n_parameters: int) -> int:
    """A progress bar's length: the search's typical evaluations plus the curvature's."""
    return (25 if n_parameters == 1 else 60 * n_parameters) + 2 * n_parameters * n_parameters + 1
