"""Maximum-likelihood fit of the process densities (and optionally the encoder sigmas) from one recording.

Method (Mehra's innovation likelihood): for given parameters θ, `ReducedEKF` — the exact reduced model with the
estimator's stochastic model: ë white of the effort density (estimation) or disturbance density (fused, damped
with the disturbance time constant), z̈
white of the acceleration density, encoders with σ — runs over the recording; its innovations ν_k with
covariances S_k factor the readings' likelihood, log p(y | θ) = Σ_k log N(ν_k; 0, S_k), summed from the
filter's `SETTLING_STEPS`-th step (the readings before it pin the filter's state down and are conditioned on: a
diffuse likelihood).  θ is searched in log10 space (densities span decades; the likelihood is smooth there but
for a ruggedness of a few tenths where the filter nearly loses track, as on the acrobot), within
± `SEARCH_DECADES` of the start.

The search evaluates its candidates in batches, each batch one pass of a bank of filters over the recording
(`filter_bank.ReducedEKFBank`: the same filter for K parameter vectors at once, at about the cost of one): a
Newton iteration with a trust region, each batch the central-difference stencil of the gradient and Hessian at
the candidate centre (2n² + 1 points for n parameters, `CURVATURE_STEP` apart) plus points along the last step;
the centre moves to the best point, the step is the Newton step of the stencil's quadratic (its Hessian made
positive definite, |eigenvalues| floored) limited to the trust radius; it stops when the step is under
`STEP_TOLERANCE` decades, the quadratic promises under `GAIN_TOLERANCE` of log-likelihood, or the search has
stalled at the likelihood's ruggedness (`STALL_GAIN`).  The stencil at the optimum gives the 1σ of each fitted
log10 value, the curvature of the log-likelihood (the inverse Hessian).  The search runs first on the
recording's first eighth, quarter and half (`HEAD_FRACTIONS`, a few batches each, each starting where the
shorter one ended: the long moves from a start decades off at a fraction of the cost), then on the whole recording, where
it typically needs 3–7 batches; test_tuning_speed.py checks the maximum against Nelder–Mead on the same
likelihood.  The likelihood can have more than one maximum (fused: a disturbance of a time constant of a
fraction of a second, or one nearly white beside a large acceleration density): the search ends in the one
its path from the start leads to.

Only encoders on a set of independent coordinates enter (the EKF's measurement model: one encoder per degree of
freedom); gyroscopes are left out and keep their sigmas.  The filter steps by each actual interval between the
samples (stamps that jitter or drift are taken as they are) and updates with the readings present (a missing
one, NaN, adds nothing to the likelihood); it starts at the first sample where every encoder reads.

Commands are applied as the mechanism's actuators apply them, each its `delay` after it is given, through its
lag (`Recording.as_applied`, the estimator's rule).

Long recordings are decimated (every m-th reading, the commands averaged over each interval) to at most
`max_steps` filter steps: the densities are continuous-time quantities (per second, not per step) and the
encoder σ is per reading, so a coarser grid estimates the same numbers, with less information about the fastest
effort variations.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from mbfg_ros.blas import single_threaded_blas
from mbfg_ros.dynamics.kinematics import AssemblyError
from mbfg_ros.estimation.actuator_delay import delayed_commands
from mbfg_ros.estimation.reduced_ekf import ReducedEKF
from mbfg_ros.tuning.filter_bank import ReducedEKFBank, ReducedModelBank
from mbfg_ros.factors.noise import default_sigmas
from mbfg_ros.model.mechanism import Mechanism

MODES = ("estimation", "fused")
SEARCH_DECADES = 6.0     # a fitted log10 value is searched within ± this of its starting value
CURVATURE_STEP = 0.05    # [decades] of the central differences giving the log-likelihood's curvature
TRUST_RADIUS = 1.0       # [decades] the first Newton step's longest length (then doubled or halved)
STEP_TOLERANCE = 0.005   # [decades] a shorter Newton step ends the search ...
GAIN_TOLERANCE = 0.005   # ... and so does a promised log-likelihood gain under this, ...
STALL_GAIN = 0.1         # ... or one under STALL_PROMISE when the last STALL_BATCHES steps gained less than
STALL_PROMISE = 2.0      # STALL_GAIN together (the acrobot's likelihood is rugged at a few tenths: its quadratic
STALL_BATCHES = 2        # promised ~1 batch after batch and the centre moved by 0.001)
MAX_BATCHES = 40
HEAD_FRACTIONS = (8, 4, 2)   # the first searches run on the first eighth, quarter and half of the recording ...
MIN_HEAD_STEPS = 100     # ... when that has this many steps, ...
HEAD_BATCHES = 6         # ... for at most this many batches ...
HEAD_GAIN_TOLERANCE = 0.5   # ... or until its quadratic promises under this (a step of 1σ of the head's fit)
MAX_BANK_THREADS = 4    # the filter banks of one batch of candidates run in this many threads at most ...
MIN_BANK_SIZE = 8       # ... each of at least this many candidates, ...
MIN_THREADED_STATES = 6  # ... where a filter has this many states (`bank_threads`)
FAILED = 1e300           # the cost of a candidate whose filter fails
# The disturbance's time constant is searched from this many (decimated) sample intervals up: one shorter
# makes the disturbance white between samples, where its density and time constant trade against the sensor σ
# (docs/decisions.md).
MIN_TIME_CONSTANT_SAMPLES = 4.0
# An encoder's σ is searched down to this many decades below its given (or the mechanism file's) value.  Far
# below it the filter stops filtering: it follows each reading and explains the motion by acceleration noise,
# a second maximum of the likelihood (on the C0 acrobot run, fused: σ 1e-7 rad and an acceleration density of
# 50 against σ 8.5e-4 and 0.94, 1200 below the other on the whole run but above it on its first quarter, where
# the search starts).
SENSOR_SIGMA_DECADES_BELOW = 1.0
# The innovations of the first filter steps are left out of the likelihood (a diffuse likelihood: the readings
# that pin the state down are conditioned on, not scored): the filter starts at rest with effort and rate priors
# of a hundred N·m and N·m/s, and until the readings have settled its state the innovations are chaotic in the
# densities.  On the C0 acrobot run (6-ms steps) a change of 0.01 decades in one value moved the total by up to
# 100 (either sign) through the first 0.1 s and by a few units through steps 25–50, where the rest of the run
# varies smoothly; the search then ends on such a spike, many of its 1σ from the smooth maximum.
SETTLING_STEPS = 100


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

    def as_applied(self, mech: Mechanism) -> "Recording":
        """The recording with its commands as the mechanism's actuators apply them (each its `delay` after it is
        given, through its lag: `estimation.actuator_delay`, as the estimator applies them)."""
        if self.commands is None or not any(mech.actuator_delays + mech.actuator_time_constants):
            return self
        return Recording(self.t, self.readings, self.encoders, self.coordinates,
                         delayed_commands(self.t, self.commands, mech.actuator_delays, mech.actuator_time_constants),
                         self.source)

    def head(self, n: int) -> "Recording":
        """The first n samples."""
        return Recording(self.t[:n], self.readings[:n], self.encoders, self.coordinates,
                         None if self.commands is None else self.commands[:n], self.source)

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
    threads: int = 1                    # the threads its filter banks ran in (`bank_threads`)


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
        elif k == "deflection_sigma" and k in fitted:
            f = fitted[k]
            # none where the recording does not determine it (a flat log-likelihood down to the search's bound)
            if not (f.at_bound or not math.isfinite(f.log10_std) or f.log10_std > 3.0):
                out[k] = v
                out["deflection_time_constant"] = result.sigmas["deflection_time_constant"]
    return out


#: a fitted encoder σ below the given one is kept only where the recording determines it to this (1σ of log10)
SENSOR_SIGMA_DETERMINED = 0.5


def file_sensor_sigmas(result: "TuningResult", given: Dict[str, float]) -> Dict[str, float]:
    """The encoders' σ a parameter file gets: the fitted ones, but the given σ (the mechanism file's, typically
    the resolution's) where the fit went below it without the recording determining it (1σ over
    `SENSOR_SIGMA_DETERMINED` decades, or at the search's bound): with the encoders' deflection fitted beside it,
    the white σ of motor encoders is barely determined (the DFKI shoulder's 8e-6 rad ×/÷ 6.6 against a
    quantization of 5.5e-5), and a file must not make the estimator trust its readings below their resolution."""
    fitted = {f.name: f for f in result.fitted}
    out = {}
    for name, value in result.sensor_sigmas.items():
        f = fitted.get(f"sensor_sigmas.{name}")
        undetermined = f is not None and (f.at_bound or not math.isfinite(f.log10_std)
                                          or f.log10_std > SENSOR_SIGMA_DETERMINED)
        out[name] = float(given[name]) if undetermined and name in given and value < given[name] else value
    return out


def parameter_names(mech: Mechanism, mode: str, fit_sensor_sigmas: bool, fit_acceleration_density: bool,
                    fit_deflection: bool = False):
    """What `mbfg tune` fits: the effort density (estimation), or the disturbance's density and time constant
    (fused: together they are its prior, stationary σ √(S T³/4); on the four-bar with a mismatched actuator the
    likelihood peaks near T = 0.3 s, and so does the error), optionally the acceleration density, the encoders'
    deflection σ (estimation/deflection.py; its time constant held) and the encoders' σ."""
    names = [density_name(mode)]
    if mode == "fused":
        names.append("disturbance_time_constant")
    if fit_acceleration_density:
        names.append("acceleration_density")
    if fit_deflection:
        names.append("deflection_sigma")
    if fit_sensor_sigmas:
        names += [f"sensor_sigmas.{n}" for n in encoder_layout(mech)[0]]
    return names


def settling_steps(n_samples: int) -> int:
    """How many first filter steps' innovations the likelihood leaves out (`SETTLING_STEPS`, at most a quarter
    of a short recording)."""
    return min(SETTLING_STEPS, n_samples // 4)


def log_likelihoods(mech: Mechanism, rec: Recording, mode: str, candidates: Sequence[Dict[str, float]],
                    threads: int = 1) -> np.ndarray:
    """log p(readings | values) by the EKF's innovations for each of `candidates` (every value the filter needs,
    `rec`'s commands as applied: `Recording.as_applied`, which `fit` calls;
    as `initial_values` gives them) after its first `settling_steps`, in one pass of a filter bank, or of one per
    thread (`bank_groups` of `threads`: the same numbers); −inf where a filter fails (a density so wrong that the
    mean leaves the mechanism's workspace)."""
    if not ReducedModelBank.supports(mech):
        return np.array([single_log_likelihood(mech, rec, mode, v) for v in candidates])
    deflected = any(v.get("deflection_sigma", 0.0) > 0.0 for v in candidates)
    groups = bank_groups(len(candidates), threads)
    if len(groups) == 1:
        return _bank_log_likelihoods(mech, rec, mode, candidates, deflected)
    # each group a bank of its own (its own compiled kernel: a kernel's work buffers are one caller's) in a thread
    # of its own; the kernels run their rows without the GIL, so the banks' compiled parts run side by side
    with ThreadPoolExecutor(len(groups)) as pool:
        parts = list(pool.map(lambda g: _bank_log_likelihoods(mech, rec, mode, [candidates[i] for i in g], deflected),
                              groups))
    return np.concatenate(parts)


def bank_groups(k: int, threads: int) -> List[range]:
    """The candidates 0..k−1 split into consecutive groups, one filter bank and thread each: `threads` of them (at
    most `MAX_BANK_THREADS`), each of at least `MIN_BANK_SIZE` filters."""
    count = max(1, min(threads, MAX_BANK_THREADS, k // MIN_BANK_SIZE))
    edges = [round(i * k / count) for i in range(count + 1)]
    return [range(a, b) for a, b in zip(edges[:-1], edges[1:])]


def available_processors() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                    # pragma: no cover (not Linux)
        return os.cpu_count() or 1


def bank_threads(mech: Mechanism, rec: Recording, k: int, threads: int) -> int:
    """How many threads `fit` runs its banks of `k` candidates in: `threads` (`bank_groups`) where each filter
    has at least `MIN_THREADED_STATES` states (z, ż and the efforts' two per actuator), else 1.  The banks' Python
    runs one thread at a time and only their compiled loops side by side, whose cost per filter grows with the
    cube of its states: on two processors two threads take the double pendulum's fits (8 states) in ~0.65×
    the wall time, the four-bar's (4 states) in 1.2–1.6× (bench/tune_speed.py).  The numbers are the same either
    way."""
    states = 2 * len(rec.coordinates) + 2 * len(mech.actuated)
    if states < MIN_THREADED_STATES:
        return 1
    return len(bank_groups(k, threads))


def _bank_log_likelihoods(mech: Mechanism, rec: Recording, mode: str, candidates: Sequence[Dict[str, float]],
                          deflected: bool) -> np.ndarray:
    """`log_likelihoods` of `candidates` by one `ReducedEKFBank`."""
    fused = mode == "fused"
    sigma = np.array([[v[f"sensor_sigmas.{n}"] for n in rec.encoders] for v in candidates])
    steps = np.diff(rec.t, prepend=rec.t[0])
    try:
        with np.errstate(all="ignore"):       # a failing filter's numbers are flagged by the bank, not raised
            bank = ReducedEKFBank(mech, rec.coordinates, sigma, [v[density_name(mode)] for v in candidates],
                                  fused=fused, acceleration_density=[v["acceleration_density"] for v in candidates],
                                  time_constant=[v["disturbance_time_constant"] if fused else math.inf
                                                 for v in candidates],
                                  deflection_sigma=[v.get("deflection_sigma", 0.0) for v in candidates]
                                  if deflected else None,
                                  deflection_time_constant=candidates[0].get("deflection_time_constant", 0.05))
            settled = np.zeros(len(candidates))
            settle = settling_steps(len(rec.t))
            for k in range(len(rec.t)):
                if k == settle:
                    settled = bank.log_likelihood.copy()
                bank.step(rec.readings[k], rec.commands[k] if fused else None, steps[k])
            ll = bank.log_likelihood - settled
    except np.linalg.LinAlgError:             # a singular matrix in one filter stops the batched solve of all
        return np.array([single_log_likelihood(mech, rec, mode, v) for v in candidates])
    ll[bank.failed | ~np.isfinite(ll)] = -math.inf
    return ll


def log_likelihood(mech: Mechanism, rec: Recording, mode: str, values: Dict[str, float]) -> float:
    """`log_likelihoods` of one candidate."""
    return float(log_likelihoods(mech, rec, mode, [values])[0])


def single_log_likelihood(mech: Mechanism, rec: Recording, mode: str, values: Dict[str, float]) -> float:
    """The same likelihood by one `ReducedEKF` (the reference the bank is checked against, and the fallback for
    constraints the bank cannot evaluate in batches; without the encoders' deflection, which only the bank
    models)."""
    if values.get("deflection_sigma", 0.0) > 0.0:
        raise TuningError("fitting the encoders' deflection needs the filter bank, which this mechanism's "
                          "constraints are beyond")
    sigma = [values[f"sensor_sigmas.{n}"] for n in rec.encoders]
    ekf = ReducedEKF(mech, rec.coordinates, rec.dt, sigma, values[density_name(mode)], fused=mode == "fused",
                     acceleration_density=values["acceleration_density"],
                     time_constant=values["disturbance_time_constant"] if mode == "fused" else math.inf)
    fused = mode == "fused"
    settled, settle = 0.0, settling_steps(len(rec.t))
    try:
        with np.errstate(all="raise"):
            steps = np.diff(rec.t, prepend=rec.t[0])
            for k in range(len(rec.t)):
                if k == settle:
                    settled = ekf.log_likelihood
                ekf.step(rec.readings[k], rec.commands[k] if fused else None, steps[k])
    except (AssemblyError, FloatingPointError, np.linalg.LinAlgError, ValueError):
        return -math.inf
    ll = ekf.log_likelihood - settled
    return ll if math.isfinite(ll) else -math.inf


def fit(mech: Mechanism, rec: Recording, mode: str, initial: Dict[str, float], names: Sequence[str],
        max_steps: int = 2000, progress: Optional[Callable[[int], None]] = None,
        threads: Optional[int] = None) -> TuningResult:
    """Maximize the innovation log-likelihood over log10 of `names` (keys of `initial`, which holds every
    value the filter needs: the densities by name and 'sensor_sigmas.<encoder>'); the others stay fixed.
    `threads`: at most this many threads for the filter banks (default: the processors this process may run
    on; `bank_threads` decides)."""
    if mode not in MODES:
        raise TuningError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    if mode == "fused" and rec.commands is None:
        raise TuningError("--mode fused needs the commanded efforts")
    rec = rec.as_applied(mech).from_first_complete_reading()
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
    lo, hi = x0 - SEARCH_DECADES, x0 + SEARCH_DECADES
    for i, name in enumerate(names):
        if name.startswith("sensor_sigmas."):
            lo[i] = x0[i] - SENSOR_SIGMA_DECADES_BELOW
    if "disturbance_time_constant" in names:
        i = names.index("disturbance_time_constant")
        lo[i] = max(lo[i], math.log10(MIN_TIME_CONSTANT_SAMPLES * rec.dt))
        hi[i] = max(hi[i], lo[i])
        x0 = np.clip(x0, lo, hi)
    evaluations = 0

    def batch_costs(rec: Recording) -> Callable[[np.ndarray], np.ndarray]:
        cache: Dict[tuple, float] = {}

        def costs(points: np.ndarray) -> np.ndarray:
            """−log-likelihood at each row of `points` (log10 values of `names`), the new ones in one batch."""
            nonlocal evaluations
            keys = [tuple(np.round(p, 10)) for p in points]
            new = list(dict.fromkeys(k for k in keys if k not in cache))
            if new:
                candidates = []
                for key in new:
                    values = dict(initial)
                    values.update({n: 10.0 ** v for n, v in zip(names, key)})
                    candidates.append(values)
                ll = log_likelihoods(mech, rec, mode, candidates, chosen_threads)
                for key, v in zip(new, ll):
                    cache[key] = -float(v) if math.isfinite(v) else FAILED
                evaluations += len(new)
                if progress is not None:
                    progress(evaluations)
            return np.array([cache[k] for k in keys])
        return costs

    costs = batch_costs(rec)
    with single_threaded_blas():      # BLAS worker threads on 8×8 matrices cost more than the arithmetic
        # (a batch is the stencil and a few trial points)
        chosen_threads = bank_threads(mech, rec, len(stencil(x0)),
                                      available_processors() if threads is None else threads)
        start, probe = x0, True
        for fraction in HEAD_FRACTIONS:
            # near the optimum first on the recording's first part (a fraction of the cost, the same steps: the
            # same optimum but for the scatter of less data), each longer part's search starting where the
            # shorter one's ended, the whole recording's last
            head = len(rec.t) // fraction
            if head >= MIN_HEAD_STEPS:
                start = newton_search(batch_costs(rec.head(head)), start, lo, hi, probe=probe,
                                      max_batches=HEAD_BATCHES, gain_tolerance=HEAD_GAIN_TOLERANCE)[0]
                probe = False
        x_best, H = newton_search(costs, start, lo, hi, probe=probe)
    best = float(costs(x_best[None])[0])
    if best >= FAILED:
        raise TuningError(f"{rec.source}: the filter fails for every value tried: is this the mechanism that "
                          f"was recorded, and are the encoders in its units?")
    at_bound = (x_best < lo + 0.01) | (x_best > hi - 0.01)
    log10_std = std_from_hessian(H, at_bound)
    values = dict(initial)
    values.update({n: float(10.0 ** v) for n, v in zip(names, x_best)})
    fitted = [FittedValue(n, values[n], float(s), bool(b)) for n, s, b in zip(names, log10_std, at_bound)]
    sigmas = {k: v for k, v in values.items() if not k.startswith("sensor_sigmas.")}
    sensor = {k[len("sensor_sigmas."):]: v for k, v in values.items() if k.startswith("sensor_sigmas.")}
    held = {k: v for k, v in initial.items() if k not in names}
    return TuningResult(mode, fitted, sigmas, sensor, -best, evaluations, len(rec.t), rec.dt,
                        max(1, full_len // len(rec.t)), held, chosen_threads)


def stencil(x: np.ndarray, h: float = CURVATURE_STEP) -> np.ndarray:
    """The points of the central differences of the gradient and Hessian at x (2n² + 1 rows): x, x ± h eᵢ and
    x ± h eᵢ ± h eⱼ (i > j)."""
    n = len(x)
    E = np.eye(n) * h
    rows = [x]
    for i in range(n):
        rows += [x + E[i], x - E[i]]
        for j in range(i):
            rows += [x + E[i] + E[j], x + E[i] - E[j], x - E[i] + E[j], x - E[i] - E[j]]
    return np.array(rows)


def stencil_derivatives(f: np.ndarray, n: int, h: float = CURVATURE_STEP):
    """(gradient, Hessian) by central differences from the values f at the points of `stencil`."""
    g, H = np.zeros(n), np.zeros((n, n))
    f0, k = f[0], 1
    for i in range(n):
        fp, fm = f[k], f[k + 1]
        k += 2
        g[i] = (fp - fm) / (2 * h)
        H[i, i] = (fp - 2 * f0 + fm) / h ** 2
        for j in range(i):
            pp, pm, mp, mm = f[k:k + 4]
            k += 4
            H[i, j] = H[j, i] = (pp - pm - mp + mm) / (4 * h ** 2)
    return g, H


def std_from_hessian(H: np.ndarray, held=None) -> np.ndarray:
    """1σ from the inverse Hessian of cost (= −log-likelihood); nan where the Hessian is not positive definite
    (a flat or bounded direction).  `held` (a mask): values the search's bound holds (the readings ask for more):
    nan, and the others' 1σ given them (the rows and columns of the rest, as of the values flat in their own
    direction, a curvature ≤ 0: one value at its bound or flat leaves the others determined)."""
    H = np.asarray(H, float)
    out = np.full(len(H), math.nan)
    free = np.isfinite(np.diag(H)) & (np.diag(H) > 0)
    if held is not None:
        free &= ~np.asarray(held, bool)
    if not free.any():
        return out
    sub = H[np.ix_(free, free)]
    try:
        np.linalg.cholesky(sub)
    except np.linalg.LinAlgError:
        return out
    out[free] = np.sqrt(np.diag(np.linalg.inv(sub)))
    return out


def newton_step(g: np.ndarray, H: np.ndarray, radius: float, lo: np.ndarray, hi: np.ndarray):
    """(p, its promised decrease) for the quadratic g·p + ½ pᵀH̃p, H̃ = H with its eigenvalues made positive
    (|λ|, at least 1e-3 of the largest and 1e-6: a flat or concave direction gets a long step down its slope),
    p its minimizer cut to length `radius` and to the box [lo, hi] (offsets from the centre)."""
    lam, V = np.linalg.eigh(H)
    lam = np.maximum(np.abs(lam), max(1e-3 * float(np.abs(lam).max(initial=0.0)), 1e-6))
    p = -V @ ((V.T @ g) / lam)
    length = float(np.linalg.norm(p))
    if length > radius:
        p *= radius / length
    p = np.clip(p, lo, hi)
    return p, -(g @ p + 0.5 * p @ (V * lam) @ V.T @ p)


def newton_search(costs: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                  radius: float = TRUST_RADIUS, probe: bool = True, max_batches: int = MAX_BATCHES,
                  gain_tolerance: float = GAIN_TOLERANCE):
    """(x, Hessian of the cost there) minimizing `costs` over the box [lo, hi] (see the module docstring).
    `costs` takes a batch of points (rows) and returns their costs (`FAILED`: the filter failed).

    Each batch is the stencil at a candidate centre c plus trial points on the line of the last move (a
    quarter, half, 2, 4 and 8 times it: the quadratic can overshoot, or be timid where the cost grows
    exponentially in log space, as it does for an encoder σ far too small).  c becomes the centre when it is
    the best of the batch and no worse than the centre so far; else the best trial that beats the centre does
    (its stencil is the next batch, with trials further along the same line); else the best point of c's
    stencil that beats the centre by `STALL_GAIN` does (a likelihood rugged on the stencil's scale); else the
    step is cut to a quarter from the centre, whose stencil is known.  It ends at `max_batches`, or when the
    step is under `STEP_TOLERANCE`, or its promised gain under `gain_tolerance`, or under `STALL_PROMISE` while
    the last `STALL_BATCHES` steps gained under `STALL_GAIN` together (the ruggedness defeats the quadratic).
    `probe`: the first batch also tries each parameter one and two decades either way (a start decades off
    moves at once)."""
    n = len(x0)
    m = 2 * n * n + 1
    x = np.clip(np.asarray(x0, float), lo, hi)
    f_x, g, H = math.inf, None, None
    promised = 0.0
    candidate = x
    history: List[float] = []            # the centre's cost at each Newton step (the stall rule)
    trials = [x + s * e for e in np.eye(n) for s in (-2.0, -1.0, 1.0, 2.0)] if probe else []
    for _ in range(max_batches):
        trials = [np.clip(t, lo, hi) for t in trials]
        points = np.vstack([stencil(candidate)] + [t[None] for t in trials])
        f = costs(points)
        best_trial = int(np.argmin(f[m:])) + m if len(f) > m else None
        f_trial = f[best_trial] if best_trial is not None else math.inf
        # the same point in another batch may differ in the last digits (the batch's common series scaling)
        slack = 1e-9 * (1.0 + abs(f_x)) if math.isfinite(f_x) else 0.0
        if f[0] <= f_trial and f[0] <= f_x + slack and f[0] < FAILED:
            if np.any(f[1:m] >= FAILED):            # the filter fails next to the centre: no derivatives here
                return candidate, np.full((n, n), math.nan)
            if g is not None and promised > 0 and f_x - f[0] > 0.5 * promised:
                radius = min(2.0 * radius, SEARCH_DECADES)
            x, f_x = candidate, float(f[0])
            g, H = stencil_derivatives(f[:m], n)
        elif f_trial < f_x - slack and f_trial < FAILED:
            move = points[best_trial] - x
            radius = max(radius, float(np.linalg.norm(move)))
            x = candidate = points[best_trial]
            f_x, g, H = float(f_trial), None, None
            trials = [x + b * move for b in (0.5, 1.0, 2.0, 4.0)]    # its stencil next, the line further on
            continue
        elif float(np.min(f[1:m])) < min(f_x - STALL_GAIN, FAILED):
            # the candidate lost but a point of its stencil beats the centre by more than the ruggedness (a
            # likelihood rugged on the scale of the step, as the acrobot's is, by ~6 there): the centre moves
            # there, its stencil next, the line further on
            near = int(np.argmin(f[1:m])) + 1
            move = points[near] - x
            x = candidate = points[near]
            f_x, g, H = float(f[near]), None, None
            trials = [x + b * move for b in (1.0, 2.0)]
            continue
        elif g is None:
            if not (np.array_equal(candidate, x) and f[0] < FAILED and not np.any(f[1:m] >= FAILED)):
                return x, np.full((n, n), math.nan)          # the start and every probe failed
            # the stencil is the centre's own (after a move to a trial, whose stencil came next) and a trial along
            # the line came within the batches' rounding of it: its derivatives are the centre's
            g, H = stencil_derivatives(f[:m], n)
        else:                                        # nothing beat the centre: a quarter of the last step
            radius = 0.25 * min(radius, float(np.linalg.norm(candidate - x)))
        step, promised = newton_step(g, H, radius, lo - x, hi - x)
        history.append(f_x)
        stalled = len(history) > STALL_BATCHES and history[-1 - STALL_BATCHES] - f_x < STALL_GAIN
        if np.abs(step).max(initial=0.0) < STEP_TOLERANCE or promised < gain_tolerance or \
                (stalled and promised < STALL_PROMISE):
            return x, H
        candidate = x + step
        trials = [x + a * step for a in (0.25, 0.5, 2.0, 4.0, 8.0)]
    return x, H


def initial_values(mech: Mechanism, sigmas: Optional[Dict[str, float]] = None,
                   sensor_sigmas: Optional[Dict[str, float]] = None) -> Dict[str, float]:
    """Every value the filter needs: the estimator's default densities (updated by `sigmas`) and the encoders'
    σ from the mechanism file (updated by `sensor_sigmas`)."""
    d = default_sigmas(mech.spec)
    d.update(sigmas or {})
    out = {k: float(d[k]) for k in ("acceleration_density", "effort_density", "disturbance_density",
                                    "disturbance_time_constant", "deflection_sigma", "deflection_time_constant")}
    names, _, sig = encoder_layout(mech)
    ss = dict(sensor_sigmas or {})
    for n, s in zip(names, sig):
        out[f"sensor_sigmas.{n}"] = float(ss.get(n, s))
    return out


def evaluations_budget(n_parameters: int) -> int:
    """A progress bar's length: the search's typical evaluations, ~15 batches on the recording's first parts
    and ~5 on the whole, each the stencil (2n² + 1 points) and a few more, and the first batch's probes."""
    return 20 * (2 * n_parameters * n_parameters + 6) + 4 * n_parameters
