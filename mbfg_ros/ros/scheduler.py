"""The estimator node's time grid, without ROS: stamped inputs → grid steps → when a step can be estimated.

The first accepted input after a (re)start anchors the grid t_k = t_0 + k·dt; every input is assigned to
the nearest grid step.  Step k is ready as soon as every input stream that is currently delivering at the
timestep rate has delivered data for step k, or, at the latest, when the node clock reaches t_k + the
input wait (max_input_delay, longer while the inputs are seen arriving later: `adaptive_input_delay`).
All times are integer nanoseconds on the node clock.  Never imports rclpy (test/test_scheduler.py checks).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

import numpy as np

NS = 1_000_000_000
DELAY_MEMORY_NS = NS           # time constant of the inputs' recent largest delay (adaptive input wait)
DELAY_FACTOR = 1.5             # the adaptive wait: this × the recent largest delay
EVERY_STEP_PERIOD = 1.5        # a stream whose mean period is at most this × dt delivers every step
POLL_NS = 300_000              # longest poll for the second half of a step's inputs (see FastLoop.poll_window)

# The input streams each estimator mode uses (at start-up, each is waited for up to startup_wait).
EXPECTED_STREAMS = {"forward_dynamics": ("efforts",), "estimation": ("observations",),
                    "fused": ("efforts", "observations")}


def expected_streams(mode: str, kinds) -> tuple:
    """The input streams a step waits for in `mode` with these actuator effort kinds: estimation mode waits for the
    commands too when an actuator's command is a known force (`commanded`), else a step would be estimated with the
    previous command held."""
    if mode == "estimation" and "commanded" in tuple(kinds):
        return EXPECTED_STREAMS["fused"]
    return EXPECTED_STREAMS[mode]


class Stream:
    """Bookkeeping of one input kind ('observations' or 'efforts')."""

    def __init__(self, name: str):
        self.name = name
        self.total = 0
        self.clear()

    def clear(self):
        self.last_k: Optional[int] = None
        self.last_stamp_ns: Optional[int] = None
        self.last_rx_ns: Optional[int] = None
        self.period_ns: Optional[float] = None
        self.delay_hi_ns = 0.0       # largest recent delay (receipt − stamp), decaying (DELAY_MEMORY_NS)
        self.delay_at_ns = 0
        # the newest input received, admitted or not: how far its stamp was behind the node clock, and when
        # (a publisher that falls behind is seen here even when all its inputs are refused as stale)
        self.arrival_lag_ns: Optional[int] = None
        self.arrived_ns: Optional[int] = None

    def note_delay(self, delay_ns: int, rx_ns: int):
        """Every admitted input, on time or late: the late ones are what the adaptive wait learns from."""
        self.delay_hi_ns = max(float(delay_ns), self.recent_delay_ns(rx_ns))
        self.delay_at_ns = rx_ns

    def recent_delay_ns(self, now_ns: int) -> float:
        hi = self.delay_hi_ns
        if hi <= 0.0:
            return 0.0
        return hi * math.exp(-max(0, now_ns - self.delay_at_ns) / DELAY_MEMORY_NS)

    def note(self, k: int, stamp_ns: int, rx_ns: int):
        if self.last_stamp_ns is not None and stamp_ns > self.last_stamp_ns:
            d = stamp_ns - self.last_stamp_ns
            self.period_ns = d if self.period_ns is None else 0.9 * self.period_ns + 0.1 * d
        if self.last_stamp_ns is None or stamp_ns > self.last_stamp_ns:
            self.last_stamp_ns = stamp_ns
        self.last_k = k if self.last_k is None else max(self.last_k, k)
        self.last_rx_ns = rx_ns
        self.total += 1


class InputScheduler:
    """ROS-free: assigns stamped inputs to grid steps and decides when a step can be estimated.

    All times are integer nanoseconds on the node clock."""

    def __init__(self, dt: float, window: int, n_actuators: int):
        self.dt_ns = int(round(dt * NS))
        self.window = int(window)
        self.n_actuators = n_actuators
        self.streams = {"observations": Stream("observations"), "efforts": Stream("efforts")}
        # acceptance policy (seconds → ns), set by the node
        self.future_tolerance_ns = NS // 2
        self.max_input_age_ns = NS
        self.sensor_timeout_ns = NS // 10
        self.input_delay_ns = 2 * self.dt_ns
        self.adaptive_input_delay = True
        self.startup_wait_ns = NS
        self.max_backlog_ns = NS // 10           # 0: never skip ahead
        self.max_prediction_ns = NS // 2         # 0: predict without readings for ever
        self.reset_stamp_ns = 0
        self.clear()

    def clear(self, reset_stamp_ns: int = 0):
        self.t0_ns: Optional[int] = None
        self.k_next = 0
        self.started = False                     # a step has been handed out since the (re)start
        self.first_rx_ns: Optional[int] = None   # receipt of the first accepted input
        self.obs: Dict[int, Dict[str, float]] = {}
        # (stamp, value) of the reading each sensor has for each step of the window and the pending ones: one
        # reading per sensor and step, so that a repeated one is counted and dropped, never fused twice
        self.obs_seen: Dict[int, Dict[str, Tuple[int, float]]] = {}
        # commands by stamp within the window (insertion order), to tell a repeated command from a new one
        self.command_seen: Dict[int, list] = {}
        self.pending_efforts: List = []          # (k, stamp_ns, tau) not yet applied
        self.held_effort = np.full(self.n_actuators, np.nan)
        self.held_effort_stamp = np.full(self.n_actuators, -1, dtype=np.int64)
        # the commands each step of the window was handed (a zero-order hold, see `pop`): (step, efforts, their
        # stamps), so that a command arriving after its step was estimated can replace the stale hold in the
        # steps it covers (`command_corrections`)
        self.used_commands: Deque[Tuple[int, list, list]] = deque(maxlen=max(1, self.window))
        # step -> its whole new command, until the node takes them (one smoother update for all the late
        # commands of a burst: each step once, with the newest command that covers it)
        self.command_corrections: Dict[int, np.ndarray] = {}
        self.deferred_corrections: Dict[int, np.ndarray] = {}   # steps covered, not yet due (`_late_efforts`)
        self.own_command = False                 # the step `pop` handed out last had a command of its own
        self.reading_k: Optional[int] = None     # the newest step readings were taken for (on time or late)
        self.reset_stamp_ns = reset_stamp_ns
        for s in self.streams.values():
            s.clear()

    @property
    def anchored(self) -> bool:
        return self.t0_ns is not None

    def t_of(self, k: int) -> int:
        return self.t0_ns + k * self.dt_ns

    def _admit(self, stamp_ns: int, now_ns: int) -> Optional[str]:
        if stamp_ns <= 0:
            return "bad_stamp"
        if now_ns <= 0:
            return "no_clock"
        if stamp_ns > now_ns + self.future_tolerance_ns:
            return "future"
        if stamp_ns < now_ns - self.max_input_age_ns:
            return "stale"
        if stamp_ns < self.reset_stamp_ns:
            return "before_reset"
        return None

    def _k_of(self, stamp_ns: int) -> int:
        if self.t0_ns is None:
            self.t0_ns = stamp_ns
            self.k_next = 0
        return int(math.floor((stamp_ns - self.t0_ns) / self.dt_ns + 0.5))

    def step_of(self, stamp_ns: int) -> int:
        """The grid step of a stamp (the scheduler must be anchored)."""
        return self._k_of(stamp_ns)

    def _late_kind(self, k: int) -> str:
        return "late" if self.k_next - k <= self.window else "too_old"

    def _step_of_input(self, stamp_ns: int, now_ns: int, stream: Stream) -> Tuple[Optional[str], int]:
        """(why it is refused, or None; its grid step) for an input stamped stamp_ns received at now_ns."""
        if stamp_ns > 0 and now_ns > 0:
            stream.arrival_lag_ns, stream.arrived_ns = now_ns - stamp_ns, now_ns
        bad = self._admit(stamp_ns, now_ns)
        if bad:
            return bad, -1
        stream.note_delay(now_ns - stamp_ns, now_ns)
        if self.first_rx_ns is None:
            self.first_rx_ns = now_ns
        return None, self._k_of(stamp_ns)

    def add_observations(self, stamp_ns: int, values: Dict[str, float], now_ns: int) -> Optional[str]:
        """Readings stamped stamp_ns: None if all are taken for their step, else why (not) all: the kind of
        a refused stamp ('stale', ..., 'late' for a step already estimated: the node then tries to fuse
        what is left in `values` into the window), or the kind of the readings dropped because their sensor
        already has one for that step (removed from `values`; the others are taken):

        * 'duplicate': the same stamp and value again (a republished message);
        * 'conflicting': the same stamp, another value: neither can be told right, so while the step is
          pending both are dropped (a publisher racing the sensor cannot put its value in), else the second;
        * 'same_step': another stamp rounding to the same step (a sensor faster than the timestep): while
          the step is pending the reading stamped nearest its time is kept, afterwards the first."""
        bad, k = self._step_of_input(stamp_ns, now_ns, self.streams["observations"])
        if bad:
            return bad
        if k < self.k_next - self.window:
            return "too_old"
        repeated = None
        seen = self.obs_seen.get(k)
        if seen is None:
            self.obs_seen[k] = {name: (stamp_ns, v) for name, v in values.items()}
        else:
            pending = self.obs.get(k) if k >= self.k_next else None
            t_k = self.t_of(k)
            for name in list(values):
                prev = seen.get(name)
                v = values[name]
                if prev is None:
                    seen[name] = (stamp_ns, v)
                    continue
                if prev[0] == stamp_ns:
                    kind = "duplicate" if prev[1] == v else "conflicting"
                    if kind == "conflicting" and pending is not None:
                        pending.pop(name, None)
                        seen[name] = (stamp_ns, math.nan)    # (a third one conflicts as well)
                else:
                    kind = "same_step"
                    if pending is not None and name in pending and abs(stamp_ns - t_k) < abs(prev[0] - t_k):
                        seen[name] = (stamp_ns, v)     # nearer the step's time: this one is used instead
                        pending[name] = v
                repeated = repeated or kind
                del values[name]
        if values and (self.reading_k is None or k > self.reading_k):
            self.reading_k = k
        if k < self.k_next:
            return self._late_kind(k) if values else repeated
        if values:
            self.obs.setdefault(k, {}).update(values)
            self.streams["observations"].note(k, stamp_ns, now_ns)
        return repeated

    def add_efforts(self, stamp_ns: int, tau: np.ndarray, now_ns: int) -> Optional[str]:
        """A command stamped stamp_ns: None if used, else why not (a refused stamp, 'late' / 'too_old',
        or 'duplicate' / 'conflicting': every actuator it names already has a command of the same stamp,
        with the same / another value).  Actuators it repeats are not applied again; on a conflict the
        earlier command of that stamp is withdrawn too while it is pending (neither can be told right: the
        held one goes on), else it stays."""
        bad, k = self._step_of_input(stamp_ns, now_ns, self.streams["efforts"])
        if bad:
            return bad
        repeated = None
        if k >= self.k_next - self.window:     # (older: `_late_efforts` tells a hold replaced from too_old)
            vals = tau.tolist()
            prev = self.command_seen.get(stamp_ns)
            if prev is None:
                self.command_seen[stamp_ns] = vals
                if len(self.command_seen) > 4 * self.window + 64:      # only the window's stamps matter
                    del self.command_seen[next(iter(self.command_seen))]
            else:
                for i, v in enumerate(vals):
                    if v != v:
                        continue
                    if prev[i] != prev[i]:
                        prev[i] = v               # an actuator this stamp had not named yet
                        continue
                    if prev[i] != v:
                        repeated = "conflicting"
                        prev[i] = math.inf            # (no finite command matches it: a third conflicts too)
                        for _, st, pending_tau in self.pending_efforts:
                            if st == stamp_ns:
                                pending_tau[i] = math.nan
                    elif repeated is None:
                        repeated = "duplicate"
                    vals[i] = math.nan
                if repeated is not None:
                    if all(v != v for v in vals):
                        return repeated
                    tau = np.array(vals)
        if k < self.k_next:
            return self._late_efforts(k, stamp_ns, tau, now_ns) or repeated
        self.pending_efforts.append((k, stamp_ns, tau))
        self.streams["efforts"].note(k, stamp_ns, now_ns)
        return repeated

    def _late_efforts(self, k: int, stamp_ns: int, tau: np.ndarray, now_ns: int) -> Optional[str]:
        """A command for step k that was already estimated.  A command is valid until replaced (zero-order
        hold): it applies from step k to the step before the next command, so every step of the window from
        k on that was handed an older command for an actuator (the stale hold, or "unknown" when the hold
        was too old) gets this one instead, within the age a held command may have (sensor_timeout).  The
        whole new command of step k goes to `command_corrections` (the node has the core replace it in that
        step's factor).  So do the later steps it covers, unless the command stream delivers every step: then
        their own commands are on their way (a stream late by d steps would otherwise re-make d steps for
        every command) and such a step is corrected with this one only if its own has not come when it is
        about to leave the window (`deferred_corrections`).  The command is also held for the next steps if
        newer than the held one.  None if it was used anywhere, else why not ('late': older than what its
        steps used; 'too_old': its step left the window)."""
        vals = tau.tolist()
        known = [i for i, v in enumerate(vals) if v == v]
        used = False
        t0, dt, max_age = self.t0_ns, self.dt_ns, self.sensor_timeout_ns
        period = self.streams["efforts"].period_ns
        per_step = period is not None and period <= EVERY_STEP_PERIOD * dt
        for j, eff, stamps in self.used_commands:
            if j < k or t0 + j * dt - stamp_ns > max_age:
                continue
            changed = False
            for i in known:
                if stamps[i] < stamp_ns:
                    eff[i], stamps[i] = vals[i], stamp_ns
                    changed = True
            if changed:
                if j == k or not per_step:
                    self.command_corrections[j] = np.array(eff)
                    self.deferred_corrections.pop(j, None)
                else:
                    self.deferred_corrections[j] = np.array(eff)
                used = True
        newer = ~np.isnan(tau) & (stamp_ns > self.held_effort_stamp)
        if newer.any():
            self.held_effort[newer] = tau[newer]
            self.held_effort_stamp[newer] = stamp_ns
            used = True
        if used:
            self.streams["efforts"].note(self.k_next - 1, stamp_ns, now_ns)
            return None
        return self._late_kind(k)

    def take_command_corrections(self) -> List[Tuple[int, np.ndarray]]:
        """The (step, whole command in actuator order) pairs that late commands replaced since the last call,
        and the deferred ones of steps about to leave the window (the two oldest), in step order, each step
        once (its newest command)."""
        out, self.command_corrections = self.command_corrections, {}
        deferred = self.deferred_corrections
        if deferred:
            due = self.k_next - self.window + 1
            for j in [j for j in deferred if j <= due]:
                out[j] = deferred.pop(j)
        return sorted(out.items())

    def waited_streams(self, now_ns: int, expected) -> List[Stream]:
        out = []
        for name, s in self.streams.items():
            if s.last_rx_ns is None:
                if name in expected and not self.started:
                    out.append(s)      # at start-up: wait (≤ startup_wait) for every input the mode uses
                continue
            if now_ns - s.last_rx_ns > self.sensor_timeout_ns:
                continue               # gone quiet: do not wait for it
            if s.period_ns is not None and s.period_ns > EVERY_STEP_PERIOD * self.dt_ns:
                continue               # slower than the timestep: held (efforts) or sparse (sensors)
            out.append(s)
        return out

    def start_step(self, now_ns: int, expected) -> Optional[int]:
        """At start-up, once every waited input has been heard from: the newest step all of them have
        reached.  The steps before it hold only part of the inputs (one topic was still being discovered)
        and are already old: estimating them first would start with a backlog."""
        if self.started:
            return None
        waited = self.waited_streams(now_ns, expected)
        if not waited or any(s.last_k is None for s in waited):
            return None
        k0 = min(s.last_k for s in waited)
        if "observations" in expected:
            # the first step with readings from there (or from the next step, after a skip ahead to a newer
            # command): the start is never a guess (`ready`)
            k0 = max(k0, self.k_next)
            k0 = min((k for k in self.obs if k >= k0), default=k0)
        return k0

    def ready(self, now_ns: int, expected) -> bool:
        if self.t0_ns is None:
            return False
        k = self.k_next
        if self.awaits_first_readings(expected):
            return False
        waited = self.waited_streams(now_ns, expected)
        if waited and all(s.last_k is not None and s.last_k >= k for s in waited):
            return True
        if not self.started and any(s.last_rx_ns is None for s in waited):
            # an input the mode uses has not been heard from yet (e.g. its topic is still being
            # discovered): initializing without it would start from a guess.  (Commands are waited for at
            # most startup_wait, then held as unknown; readings as long as it takes, above)
            return now_ns >= self.first_rx_ns + self.startup_wait_ns
        return now_ns >= self.t_of(k) + self.wait_ns(now_ns, waited)

    def awaits_first_readings(self, expected) -> bool:
        """Not started in a mode that uses readings, and the next step has none: the first step has readings,
        however long they take (started without them, the estimate would publish the drawn pose as the angles
        of encoded joints, whole turns from their encoders' readings, until the readings re-initialize it;
        `start_step` moves the start onto the first step with readings)."""
        return not self.started and "observations" in expected and self.k_next not in self.obs

    def beyond_prediction(self, k: int, expected) -> bool:
        """Step k would be more than max_prediction past the newest step with readings, in a mode that uses
        readings: a prediction that long without them no longer tells which turn an encoded angle is on (nor
        much else), so the node stops estimating there and starts again from the next readings."""
        if not self.max_prediction_ns or "observations" not in expected or self.reading_k is None:
            return False
        # (never less than the window: readings that come within it are fused into steps already predicted)
        return (k - self.reading_k) * self.dt_ns > max(self.max_prediction_ns, self.window * self.dt_ns)

    @staticmethod
    def recent_delay_ns(now_ns: int, waited: List[Stream]) -> float:
        """The largest recent delay (receipt − stamp) of the waited inputs."""
        return max((s.recent_delay_ns(now_ns) for s in waited), default=0.0)

    def wait_ns(self, now_ns: int, waited: List[Stream]) -> int:
        """How long after a step's time its missing inputs are waited for: `input_delay_ns`; adaptive, once
        the largest recent delay of the waited inputs is more than the window can absorb: DELAY_FACTOR ×
        that delay, at most max_input_age (older inputs are refused as stale anyway).  A stream that keeps
        arriving, however late, is waited for: estimating ahead of it would predict every step open loop and
        then drop its readings as too old, so a feed that fell behind by more than the window would never
        be fused again and the estimate would drift freely (through whole turns of an encoded angle).  Its
        cost is latency, which /diagnostics reports (input.<stream>.behind_s, inputs_behind).  A stream
        silent for sensor_timeout is not waited for at all (`waited_streams`).

        Delays up to input_delay + (window − 2)·dt cost nothing to wait out in accuracy: the step is
        predicted, its readings are fused into the window when they come (and a late command replaces the
        one the step was estimated with: `command_corrections`), and the latency stays low.  Longer ones would be dropped as too old."""
        base = self.input_delay_ns
        if not self.adaptive_input_delay:
            return base
        hi = self.recent_delay_ns(now_ns, waited)
        if hi <= base + max(0, self.window - 2) * self.dt_ns:
            return base
        return int(min(max(base, DELAY_FACTOR * hi), max(base, self.max_input_age_ns)))

    def pop(self):
        """Inputs of step k_next: (k, efforts in actuator order or None, observations or None); advances.

        Efforts are commands, held (zero-order hold, as an actuator holds its last command) until replaced
        or older than sensor_timeout, also when a command stream that delivers every step misses one (its
        command is late): in fused mode "unknown" would be a zero command, the disturbance having to take the
        whole effort, while the held one is off by one step's change (and the late command replaces it when
        it comes: `command_corrections`)."""
        k = self.k_next
        t_k = self.t_of(k)
        fresh = False
        if self.pending_efforts:
            keep = []
            for (ke, st, tau) in self.pending_efforts:
                if ke <= k:
                    known = ~np.isnan(tau)
                    newer = known & (st >= self.held_effort_stamp)
                    self.held_effort[newer] = tau[newer]
                    self.held_effort_stamp[newer] = st
                    fresh = fresh or ke == k
                else:
                    keep.append((ke, st, tau))
            self.pending_efforts = keep
        # a handful of actuators: plain Python is faster than numpy here (this runs at every step)
        max_age = self.sensor_timeout_ns
        stamps = self.held_effort_stamp.tolist()
        eff = [v if st >= 0 and t_k - st <= max_age else math.nan
               for v, st in zip(self.held_effort.tolist(), stamps)]
        efforts = np.array(eff) if any(v == v for v in eff) else None
        self.used_commands.append((k, eff, stamps))
        self.own_command = fresh
        self.started = True
        obs = self.obs.pop(k, None)
        self.obs_seen.pop(k - self.window - 1, None)
        self.k_next = k + 1
        return k, efforts, (obs or None)

    def skip_to(self, k: int) -> int:
        """Drop the steps before k (observations discarded, commands applied); return how many."""
        skipped = k - self.k_next
        for kk in [kk for kk in self.obs if kk < k]:
            del self.obs[kk]
        for kk in [kk for kk in self.obs_seen if kk < k - self.window]:
            del self.obs_seen[kk]
        keep = []
        for (ke, st, tau) in self.pending_efforts:
            if ke < k:
                known = ~np.isnan(tau)
                newer = known & (st >= self.held_effort_stamp)
                self.held_effort[newer] = tau[newer]
                self.held_effort_stamp[newer] = st
            else:
                keep.append((ke, st, tau))
        self.pending_efforts = keep
        self.k_next = k
        return skipped

    def stamp_detail(self, stamp_ns: int, now_ns: int) -> str:
        """An input's stamp, how far it is behind (or ahead of) the node clock, and the next step's time, for
        the log of a refused input."""
        lag = (now_ns - stamp_ns) / NS
        s = (f"stamp {stamp_ns / NS:.6f} s is {abs(lag):.3f} s {'behind' if lag >= 0 else 'ahead of'} the node "
             f"clock ({now_ns / NS:.6f} s)")
        if self.t0_ns is not None:
            s += f", next step {self.t_of(self.k_next) / NS:.6f} s"
        return s

    def backlog_ns(self, now_ns: int) -> int:
        return 0 if self.t0_ns is None else now_ns - self.t_of(self.k_next)

    def overloaded(self, now_ns: int) -> bool:
        """Estimation is more than max_backlog behind the clock (solves slower than dt)."""
        return self.max_backlog_ns > 0 and self.t0_ns is not None and self.backlog_ns(now_ns) > self.max_backlog_ns

    def skip_target(self, now_ns: int, expected) -> int:
        """The step to skip ahead to when overloaded: the newest step with inputs, at most the newest step
        whose input wait is over."""
        k_clock = (now_ns - self.wait_ns(now_ns, self.waited_streams(now_ns, expected)) - self.t0_ns) // self.dt_ns
        readings = self.streams["observations"].last_k
        if "observations" in expected and readings is not None and readings >= self.k_next:
            # the newest step with readings, not a newer command whose readings are on their way: the core
            # re-seeds there from its last estimate, extrapolated over the skip, and its readings correct the
            # guess at once (a skip to a command alone published the guess, up to 3 rad from the crank's
            # encoder at 10 kHz, until the readings re-initialized it)
            return int(min(readings, k_clock))
        newest = [s.last_k for s in self.streams.values() if s.last_k is not None and s.last_k >= self.k_next]
        return int(min(max(newest), k_clock) if newest else k_clock)

    def skip_ahead(self, now_ns: int, expected) -> Tuple[int, int]:
        """When overloaded: skip to `skip_target`.  (steps skipped, how far behind the clock estimation was
        in ns); (0, 0) if there is nothing to skip, or before the first step (then the steps whose inputs
        are waited for at start-up are only kept recent)."""
        target = self.skip_target(now_ns, expected)
        if target <= self.k_next:
            return 0, 0
        behind = self.backlog_ns(now_ns)
        skipped = self.skip_to(target)
        return (skipped, behind) if self.started else (0, 0)

    def poll_window_ns(self) -> int:
        """ns to poll for the rest of the next step's inputs when part of them has arrived (they are
        published together, so the rest follows within microseconds)."""
        k = self.k_next
        if self.t0_ns is None or not any(s.last_k is not None and s.last_k >= k for s in self.streams.values()):
            return 0
        return POLL_NS

