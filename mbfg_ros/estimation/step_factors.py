"""The factors of one step per formulation × integrator, chosen once (`step_factors`):

* `DependentFactors` (trapezoidal | euler): X_k = [q, q̇, q̈ (, τ)]; integrators on (q, q̇, q̈), f_pc, f_vc;
* `DependentHermiteFactors`: the same state, the 4th-order integrator's velocity row computing the jerk at
  both ends from the states (`factors.HermiteVelocityIntegrator`, no jerk variable);
* `IndependentFactors` (trapezoidal | euler): X_k = [q, q̇, q̈, z, ż, z̈ (, τ)]; integrators on (z, ż, z̈), the
  predictive soft equality f_eq(q_{k−1}, q_k), f_pc^i, f_vc^i, f_ac^i;
* `IndependentHermiteFactors`: X_k = [q, q̇, q̈, z, ż, z̈, z⃛ (, τ)] with the jerk factor.

Each owns the stacked state's layout, the persistent units of the current window (`restart`), the
per-step forces (from the `EffortModel`), the continuity predictor, the seed's state and the cached
`StepModel` of each combination of units.  Every step: integrators (+ the effort model's units between
steps), constraints, dynamics (f_dyn with commanded forces or f_idyn with τ a state; + the jerk factor;
+ the commanded-effort prior) and the readings' units.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

import mbfg_ros.factors as F
from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.dynamics.coordinates import choose_independent
from mbfg_ros.estimation.config import EstimatorConfig
from mbfg_ros.estimation.deflection import EncoderDeflection
from mbfg_ros.estimation.efforts import EffortModel
from mbfg_ros.estimation.identification import Identification
from mbfg_ros.graph.layout import StateLayout
from mbfg_ros.graph.step_model import StepModel, StepValues
from mbfg_ros.graph.window import FixedLagWindow
from mbfg_ros.model.mechanism import Mechanism

__all__ = ["StepFactors", "DependentFactors", "DependentHermiteFactors", "IndependentFactors",
           "IndependentHermiteFactors", "step_factors"]

MAX_CACHED_MODELS = 64         # combinations of units kept (bounded over an unbounded run)
MAX_CACHED_STEP_SIZES = 16


class StepFactors:
    """Base of the per-formulation × integrator step factors (see the module docstring)."""

    independent = False          # the state has independent coordinates z (chosen per window)
    # does the prediction read the dynamics' derivatives at the predicted state (`_predicted`'s d)?  If not,
    # and the step's forces may differ from the prediction's (fused), it takes q̈ alone, and the step's
    # dynamics factor linearizes there under its own forces on the same factorization
    prediction_uses_linearization = False
    #: the step models have compiled forms (`graph.step_model.StepModel.native_linearize`) where the kernel is on
    compiled_step_models = False
    soft_equality: Optional[F.Factor] = None     # f_eq(q_{k−1}, q_k) (independent formulation)

    def __init__(self, mech: Mechanism, config: EstimatorConfig, sigmas: dict, efforts: EffortModel,
                 ctx: EvalContext, identification: Optional[Identification] = None,
                 deflection: Optional[EncoderDeflection] = None):
        self.mech = mech
        self.identification = identification
        self.deflection = deflection
        self.dof = mech.degrees_of_freedom()
        # the independent coordinates given in the configuration (else chosen per window; also the
        # velocities held in a seed's velocity problem)
        self.z_user: Optional[np.ndarray] = None
        if config.independent:
            z = [mech.coordinate_index(name, "independent coordinates") for name in config.independent]
            if len(z) != self.dof:
                raise ValueError(f"{len(z)} independent coordinates {list(config.independent)} given for "
                                 f"{self.dof} degrees of freedom")
            self.z_user = np.array(z, dtype=np.intp)
        self.sigmas = sigmas
        self.integrator = config.integrator
        self.default_h = config.dt        # the seed step's forces use the nominal step
        self.efforts = efforts
        self.ctx = ctx
        n = mech.n
        blocks = [("q", n), ("v", n), ("a", n)] + self._extra_blocks()
        if efforts.has_state:
            blocks += [("tau", efforts.n_state), ("tau_rate", efforts.n_state)]
        if identification is not None:
            blocks.append(("theta", identification.size))
        if deflection is not None:
            blocks.append(("deflection", deflection.size))
        self.layout = StateLayout(blocks)
        self._theta = self.layout.slices.get("theta")
        self.a_slice = self.layout.slices["a"]
        self._tau = self.layout.slices.get("tau")
        self._tau_start = -1 if self._tau is None else self._tau.start
        # with τ a state, the dynamics' forces are its known part (gravity, and the commands in fused mode)
        self._forces_name = "Q_known" if efforts.has_state else "Q"
        # does the prediction linearize the dynamics (`predict`), or take q̈ alone?  The whole linearization
        # pays where the step's dynamics factor then finds it in the context, under the same forces; not in
        # fused mode (the step's own commands differ; its factor reuses the factorization for them) nor where
        # the step models are compiled (the kernel linearizes the step itself)
        self._predict_linearizes = self.prediction_uses_linearization or (
            (not efforts.has_state or not efforts.known_forces_vary)
            and not (self.compiled_step_models and ctx.native is not None))
        self.z: Optional[np.ndarray] = None
        self._models: Dict[tuple, StepModel] = {}
        self._step_models: Dict[tuple, StepModel] = {}
        #: which path linearizes the step models built so far, per role ('seed', 'step'): 'compiled' or
        #: 'numpy (why)' (`StepModel.form`; a role's numpy model is kept over its compiled ones)
        self.forms: Dict[str, str] = {}
        self._int_cache: Dict[float, list] = {}
        self.jerk: Optional[F.Factor] = None
        self._known_newest = self._known_before = None
        self._commands_newest = self._commands_before = None
        self._identification_generation = -1 if identification is None else identification.generation

    def _extra_blocks(self) -> list:
        return []

    # -- per window ------------------------------------------------------------------------------
    def restart(self, z: Optional[np.ndarray]):
        """Persistent units of a new window (independent coordinates z; their per-step parameters come with
        each step: `step_values`), and a new effort history."""
        self.z = None if z is None else np.asarray(z, dtype=np.intp)
        self._build()
        self._models.clear()
        self._step_models.clear()
        self._int_cache.clear()
        self.efforts.restart()
        self._known_newest = self._known_before = None   # Q_known of the newest step and of the one before
        self._commands_newest = self._commands_before = None   # (the same for the known commands: identification)

    def _build(self):
        raise NotImplementedError

    def set_process_densities(self, densities: Dict[str, float]):
        """New densities (effort or disturbance random walk, unmodelled accelerations) for the steps added from
        now on (the steps in the window keep theirs): the units between steps are rebuilt with them."""
        for name, value in densities.items():
            self.sigmas[name] = float(value)
        self._int_cache.clear()
        self._step_models.clear()

    def readings_changed(self):
        """The readings' units were replaced (a new σ): the step models made with the old ones are not kept (the
        steps in the window keep theirs)."""
        self._step_models.clear()

    def seed_state(self, q0, v0, Q0, tau0, tau_rate0=None, theta0=None) -> np.ndarray:
        """The stacked seed state at (q0, q̇0) with q̈0 (and the jerk) from the dynamics under Q0 (the identified
        parameters' forces at theta0 included)."""
        self.ctx.clear()
        d = self.ctx.dynamics(q0, v0, Q0)
        blocks = dict(q=q0, v=v0, a=d.a.copy())
        self._seed_blocks(blocks, d)
        if tau0 is not None:
            blocks["tau"] = tau0
            if tau_rate0 is not None:
                blocks["tau_rate"] = tau_rate0
        if theta0 is not None:
            blocks["theta"] = theta0
        return self.layout.pack(**blocks)

    def _seed_blocks(self, blocks: dict, d):
        pass

    def seed_model(self, priors: list, effort_prior, readings: list) -> StepModel:
        """The first step of a window: its priors, constraints, dynamics and readings."""
        return self._noted("seed", StepModel(self.layout, priors + self.kinematics
                                             + self._dynamic_units(effort_prior) + readings))

    def _noted(self, role: str, model: StepModel) -> StepModel:
        """`model`, its form noted in ``forms`` under `role`."""
        if self.forms.get(role, "compiled") == "compiled":
            self.forms[role] = model.form(self.ctx)
        return model

    # -- per step --------------------------------------------------------------------------------
    def integrators(self, h: float) -> list:
        """The units between consecutive steps h apart (cached per h)."""
        units = self._int_cache.get(h)
        if units is None:
            units = self._integrator_units(h)
            if self.soft_equality is not None:
                units.append(self.soft_equality)
            units += self.efforts.transition_units(h)
            if self.identification is not None:
                units.append(self.identification.transition_unit(h))
            if self.deflection is not None:
                units.append(self.deflection.transition_unit(h))
            if len(self._int_cache) > MAX_CACHED_STEP_SIZES:
                self._int_cache.clear()
            self._int_cache[h] = units
        return units

    def _integrator_units(self, h: float) -> list:
        x, xd, xdd, dim = self._integrated
        sx, sxd = self.integrator_sigmas(h)
        integrator = F.EulerIntegrator if self.integrator == "euler" else F.TrapezoidalIntegrator
        return [integrator(x, xd, dim, h, sx), integrator(xd, xdd, dim, h, sxd)]

    def integrator_sigmas(self, h: float) -> Tuple[float, float]:
        """(σ of the position rows, σ of the velocity rows) of the integrators over a step h.  With the
        efforts estimated (estimation, fused) the motion's accelerations are the model's plus white noise
        of density ``acceleration_density`` (`factors.white_acceleration_sigmas`): the integrators carry
        that noise exactly.  Forward dynamics keeps its tight numerical sigma (the model is exact)."""
        si = self.sigmas["integrator"]
        if self.efforts.has_state:
            sq, sv = F.white_acceleration_sigmas(self.sigmas["acceleration_density"], h, self.integrator)
            if self.integrator == "euler" and not self.independent:
                # Euler's own truncation error (h²/2 q̈ in the position rows) is systematic and far above the
                # noise's σ at the default density; in dependent coordinates it fights the constraints (crank
                # four-bar: NEES of the angle 550, angle RMSE 0.66 vs 0.54 mrad before; with the numerical
                # tolerance as a floor 0.50 mrad, NEES 0.59).  (Independent coordinates: better without it,
                # 0.56 vs 0.77 mrad.)
                sq, sv = max(sq, si), max(sv, si)
            return sq, sv
        return si, si

    def step_values(self, efforts: np.ndarray, h: Optional[float], window: Optional[FixedLagWindow]
                    ) -> Tuple[StepValues, Optional[F.Factor]]:
        """This step's forces as per-step values of its units (h: the step from the previous one; None: a
        seed), and the commanded-effort prior unit (or None).  Nothing is set on the units: the window puts
        a step's values on them whenever it evaluates that step."""
        Q, Qdot, prior = self.efforts.forces(efforts, self.default_h if h is None else h)
        self._known_before, self._known_newest = self._known_newest, Q
        values: StepValues = {self.dynamics: {self._forces_name: Q}}
        if self.identification is not None:
            u = self.efforts.known(efforts)
            self._commands_before, self._commands_newest = self._commands_newest, u
            values[self.dynamics]["commands"] = u
        jerk = self.jerk
        if jerk is not None:
            values[jerk] = {"Q": Q}
        if jerk is not None and Qdot is not None:
            values.setdefault(jerk, {})["Qdot"] = Qdot
        unit = None
        if prior is not None:
            unit, mean = prior
            values[unit] = {"mean": mean}
        self._forces_values(values, Q, Qdot, h, window)
        return values, unit

    def _forces_values(self, values: StepValues, Q, Qdot, h, window):
        pass

    def command_values(self, efforts: np.ndarray) -> Optional[StepValues]:
        """The per-step values through which a step's commanded efforts (actuator order, NaN: unknown) enter
        its factor, for a step whose commands are replaced after it was estimated (`Stepper.correct_commands`):
        the dynamics' forces.  None where the commands do not enter (estimation: τ is estimated), or not
        through that step's factor alone: the hermite integrators also read the commands' rate (backward
        differences over three steps) and the previous step's forces."""
        if not self.efforts.uses_commands or self.efforts.rates or self.jerk is not None:
            return None
        Q, _, _ = self.efforts.forces(efforts, self.default_h)      # (pure without rates)
        if self.identification is not None:
            return {self.dynamics: {self._forces_name: Q, "commands": self.efforts.known(efforts)}}
        return {self.dynamics: {self._forces_name: Q}}

    def newest_commands_replaced(self, values: StepValues):
        """The newest step's commands were replaced (`command_values`): the next step's prediction, which uses
        the known forces of the step it predicts from (`predict`), takes the new ones."""
        self._known_newest = values[self.dynamics][self._forces_name]
        if self.identification is not None:
            self._commands_newest = values[self.dynamics]["commands"]

    def _dynamic_units(self, prior) -> list:
        units = [self.dynamics]
        if self.identification is not None:
            units += self.identification.step_units()
        if self.jerk is not None:
            units.append(self.jerk)
        if prior is not None:
            units.append(prior)
        return units

    def model(self, h: float, prior, readings: list) -> StepModel:
        """The step model of a step h after the previous one with these (effort-prior and reading) units;
        cached by unit identity."""
        ident = self.identification
        if ident is not None and ident.generation != self._identification_generation:
            # frozen or thawed: the steps from now on have other units
            self._identification_generation = ident.generation
            self._step_models.clear()
        key = (h, prior, *readings)
        model = self._step_models.get(key)
        if model is None:
            units = list(self.integrators(h)) + self.kinematics + self._dynamic_units(prior) + readings
            ukey = tuple(map(id, units))
            model = self._models.get(ukey)
            if model is None:
                if len(self._models) > MAX_CACHED_MODELS:
                    self._models.clear()
                model = self._models[ukey] = self._noted("step", StepModel(self.layout, units))
            if len(self._step_models) > MAX_CACHED_MODELS:
                self._step_models.clear()
            self._step_models[key] = model
        return model

    def predict(self, x: np.ndarray, h: float, a_prev: Optional[np.ndarray], h_prev: float,
                values: Optional[StepValues] = None) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """Continuity predictor of the state h after x: Taylor expansion of q, q̇ (through q̈ and the jerk:
        a backward difference with the previous q̈ `a_prev` h_prev earlier, or the model's) from x, then
        q̈ from the dynamics at the predicted (q, q̇), through the same factorization the step's dynamics
        factor then uses there (shared through the context), so it costs little extra.  `values`: the step's
        `step_values` (the forces; not needed with estimated efforts and a jerk-free integrator: the
        prediction is then input-free).  Returns (prediction, the soft equality's offset or None); changes nothing."""
        n = self.mech.n
        n2, n3 = 2 * n, 3 * n
        xp = np.empty(x.size)                       # the layout starts with q, q̇, q̈
        h2 = 0.5 * h * h
        h3 = h * h2 / 3.0
        self.ctx.native.taylor(x, h, a_prev, h_prev, self._model_jerk(x, h, values), xp)
        qp, vp = xp[:n], xp[n:n2]
        Q = self._prediction_forces(values)
        if self._tau is not None:
            Q = self.efforts.add_state(Q, xp[self._tau])
        if self._theta is not None:
            Q = Q + self._identified_forces(x, values)
        if self._predict_linearizes:
            # the step's dynamics factor linearizes under these same forces: the whole linearization now
            d = self.ctx.dynamics(qp, vp, Q)
            ap = d.a
        else:
            d, ap = None, self.ctx.predicted_acceleration(qp, vp, Q)
        xp[n2:n3] = ap
        return xp, self._predicted(xp, x, qp, vp, ap, d, h, h2, h3, values)

    def _prediction_forces(self, values: Optional[StepValues]) -> np.ndarray:
        """The generalized forces of the prediction's q̈ (`predict`), without the estimated efforts: the step's
        forces (`values`), or with τ a state the known forces of the step predicted from (gravity; in fused mode
        + its commands), not the new step's: the prediction is then input-free and can be made before the
        step's inputs arrive (`Stepper.prepare_next`), and it is only the linearization point (a command
        change moves it by ∂q̈/∂Q Δτ, far inside the relinearization threshold)."""
        if self._tau is None:
            return values[self.dynamics]["Q"]
        known = self._known_before if values is not None else self._known_newest
        return self.dynamics.Q_known if known is None else known

    def _identified_forces(self, x: np.ndarray, values: Optional[StepValues]) -> np.ndarray:
        """The identified parameters' forces of the prediction: at x's θ and rates (the prediction is only the
        linearization point) with the commands of the step predicted from (as `_prediction_forces`)."""
        u = self._commands_before if values is not None else self._commands_newest
        if u is None:
            u = np.zeros(self.efforts.na)
        # (a payload's force at q̈ = 0, its weight: with the previous q̈ its inertia too, which moved the simulated
        # pendulum's payload estimate from 0.304 ± 0.003 to 0.219 ± 0.003 kg for 0.3 (test_identification): the
        # fast path linearizes each step once, here)
        return self.identification.forces(x[self._theta], x[self.layout.slices["v"]], u)

    def _model_jerk(self, x, h, values) -> Optional[np.ndarray]:
        """The jerk at x where the step factors' model has one, else None: the predictor's Taylor step takes the
        backward difference of q̈ (none before a previous q̈)."""
        return None

    def _predicted(self, xp, x, qp, vp, ap, d, h, h2, h3, values) -> Optional[np.ndarray]:
        return None

    def prediction_values(self, offset: Optional[np.ndarray], values: StepValues):
        """The step is linearized at a prediction: its soft equality expects the predicted displacement."""
        if offset is not None:
            values[self.soft_equality] = {"offset": offset}

    def correct_early_rates(self, window: FixedLagWindow, k: int, h: float, rates: list):
        """Re-linearize the window's first steps with better effort rates Q̇ of steps 0 … k − 1
        (`EffortModel.early_rates`)."""

    def better_coordinates(self, q: np.ndarray) -> Optional[np.ndarray]:
        """Independent coordinates much better conditioned than the current ones at q, or None."""
        return None


class DependentFactors(StepFactors):
    """X_k = [q, q̇, q̈ (, τ)], trapezoidal or Euler integrators on (q, q̇, q̈), f_pc, f_vc."""

    compiled_step_models = True        # every unit has a compiled form (`mbfg_ros.native.unit_form`)

    def predict(self, x, h, a_prev, h_prev, values=None):
        # the whole prediction in one compiled call (`MechanismKernel.predict`: the same Taylor step, q̈ by one LU
        # solve); the general form where the kernel finds the dynamics singular (the null-space solver)
        native = self.ctx.native
        if self.compiled_step_models:
            xp = np.empty(x.size)
            Q, tau_start = self._prediction_forces(values), self._tau_start
            if self.efforts.partial_state:
                # the kernel adds a τ block over every actuator: this one covers some, added here (τ is not predicted)
                Q, tau_start = self.efforts.add_state(Q, x[self._tau]), -1
            if self._theta is not None:
                Q = Q + self._identified_forces(x, values)
            if native.predict(x, h, a_prev, h_prev, Q, tau_start, xp):
                return xp, None
        return super().predict(x, h, a_prev, h_prev, values)

    def _build(self):
        mech, s = self.mech, self.sigmas
        self._integrated = ("q", "v", "a", mech.n)
        self.kinematics = [F.PositionConstraints(mech, s["position_constraints"]),
                           F.VelocityConstraints(mech, s["velocity_constraints"])]
        if self.identification is not None:
            self.dynamics = F.IdentifiedDynamics(mech, self.identification.parameters, sigma=s["dynamics"],
                                                 actuated=self.efforts.state_coordinates)
        elif self.efforts.has_state:
            self.dynamics = F.InverseDynamics(mech, sigma=s["dynamics"], actuated=self.efforts.state_coordinates)
        else:
            self.dynamics = F.ForwardDynamics(mech, sigma=s["dynamics"])
        self.jerk = None


class DependentHermiteFactors(DependentFactors):
    """The velocity integrator's forces at both ends, and the previous step's linearization point (its
    jerk's linear model: see factors.HermiteVelocityIntegrator), are set every step."""

    compiled_step_models = False       # (the hermite velocity integrator has no compiled form)

    def _build(self):
        super()._build()
        self._forces_last = None        # (Q or Q_known, Q̇) of the newest step

    def _integrator_units(self, h):
        sq, sv = self.integrator_sigmas(h)
        return [F.HermiteIntegrator("q", "v", "a", self.mech.n, h, sq),
                F.HermiteVelocityIntegrator(self.mech, h, sigma=sv, efforts=self.efforts.has_state,
                                            actuated=self.efforts.state_coordinates)]

    def _forces_values(self, values, Q, Qdot, h, window):
        if h is not None:
            hv = self.integrators(h)[1]
            Q0, Qd0 = self._forces_last
            zero = self.efforts.zero_rate
            x = window.last.x_cur
            n = self.mech.n
            values[hv] = {"Q_prev": Q0, "Qdot_prev": None if Qd0 is zero else Qd0,
                          "Q": Q, "Qdot": None if Qdot is zero else Qdot,
                          "lin_prev": (x[:n], x[n:2 * n], x[self._tau] if self._tau is not None else None)}
        self._forces_last = (Q, Qdot)

    def _model_jerk(self, x, h, values):
        # the jerk at the previous estimate, on the linear model the step factors use for it
        n = self.mech.n
        hv = self.integrators(h)[1]
        own = values[hv]
        d = hv.dynamics_at(self.ctx, own["Q_prev"], own["lin_prev"], x[:n], x[n:2 * n])
        return np.ascontiguousarray(hv.jerk(d, x[n:2 * n], x[2 * n:3 * n], own["Qdot_prev"]), dtype=float)

    def correct_early_rates(self, window, k, h, rates):
        # step j's velocity integrator reads Q̇ at steps j − 1 and j
        hv = self.integrators(h)[1]
        for j in range(1, k + 1):
            if j < k:
                window.reparametrize(j, hv, Qdot_prev=rates[j - 1], Qdot=rates[j])
            else:
                window.reparametrize(j, hv, Qdot_prev=rates[j - 1])


class IndependentFactors(StepFactors):
    """X_k = [q, q̇, q̈, z, ż, z̈ (, τ)], trapezoidal or Euler integrators on (z, ż, z̈), the predictive soft
    equality on q, f_pc^i, f_vc^i, f_ac^i."""

    independent = True

    def _extra_blocks(self):
        d = self.dof
        return [("z", d), ("zd", d), ("zdd", d)]

    def _build(self):
        mech, s, z = self.mech, self.sigmas, self.z
        self._integrated = ("z", "zd", "zdd", self.dof)
        self.kinematics = [F.PositionConstraintsIndep(mech, z, s["position_constraints"]),
                           F.VelocityConstraintsIndep(mech, z, s["velocity_constraints"]),
                           F.AccelerationConstraintsIndep(mech, z, s["acceleration_constraints"])]
        self.dynamics = (F.InverseDynamics(mech, sigma=s["dynamics"], z=z, actuated=self.efforts.state_coordinates)
                         if self.efforts.has_state
                         else F.ForwardDynamics(mech, sigma=s["dynamics"], z=z))
        self.soft_equality = F.SoftEquality("q", mech.n, s["soft_equality"], offset=np.zeros(mech.n))
        self.jerk = None

    def _seed_blocks(self, blocks, d):
        z = self.z
        blocks.update(z=blocks["q"][z], zd=blocks["v"][z], zdd=blocks["a"][z])

    def _predicted(self, xp, x, qp, vp, ap, d, h, h2, h3, values):
        sl, z = self.layout.slices, self.z
        xp[sl["z"]] = qp[z]
        xp[sl["zd"]] = vp[z]
        xp[sl["zdd"]] = ap[z]
        return qp - x[:self.mech.n]            # predictive soft equality (see factors.SoftEquality)

    def better_coordinates(self, q):
        """When the current z has become much worse conditioned than the best choice here (σ_min of N[z], N
        the orthonormal null space of Φq, 25 % hysteresis).  The integrators act on z, so a badly
        conditioned z costs accuracy long before it becomes singular."""
        if self.z_user is not None:
            return None
        z_best, N = choose_independent(self.mech, q, return_basis=True)
        if np.array_equal(np.sort(z_best), np.sort(self.z)):
            return None
        s_cur = np.linalg.svd(N[self.z], compute_uv=False)[-1]
        s_best = np.linalg.svd(N[z_best], compute_uv=False)[-1]
        if s_cur * 1.25 >= s_best:
            return None
        return z_best


class IndependentHermiteFactors(IndependentFactors):
    """X_k = [q, q̇, q̈, z, ż, z̈, z⃛ (, τ)], the 4th-order integrators on (z, ż, z̈, z⃛) and the jerk factor."""

    prediction_uses_linearization = True     # the predicted jerk z⃛

    def _extra_blocks(self):
        return super()._extra_blocks() + [("zj", self.dof)]

    def _build(self):
        super()._build()
        self.jerk = F.Jerk(self.mech, sigma=self.sigmas["dynamics"], select=self.z, efforts=self.efforts.has_state,
                           actuated=self.efforts.state_coordinates)

    def _integrator_units(self, h):
        (sz, szd), d = self.integrator_sigmas(h), self.dof
        return [F.HermiteIntegrator("z", "zd", "zdd", d, h, sz), F.HermiteIntegrator("zd", "zdd", "zj", d, h, szd)]

    def _seed_blocks(self, blocks, d):
        v0, a0 = blocks["v"], blocks["a"]
        j0 = d.da_dq @ v0 + d.da_dv @ a0
        blocks["zj"] = j0[self.z]
        super()._seed_blocks(blocks, d)

    def _predicted(self, xp, x, qp, vp, ap, d, h, h2, h3, values):
        sl, z = self.layout.slices, self.z
        own = values.get(self.jerk) if values else None
        Qdot = own["Qdot"] if own and "Qdot" in own else self.jerk.Qdot
        jp = d.da_dq @ vp + d.da_dv @ ap + d.da_dQ @ Qdot
        zz, zd, zdd, zj = x[sl["z"]], x[sl["zd"]], x[sl["zdd"]], x[sl["zj"]]
        xp[sl["z"]] = zz + h * zd + h2 * zdd + h3 * zj
        xp[sl["zd"]] = zd + h * zdd + h2 * zj
        xp[sl["zdd"]] = ap[z]
        xp[sl["zj"]] = jp[z]
        return qp - x[:self.mech.n]

    def correct_early_rates(self, window, k, h, rates):
        for j in range(k):
            window.reparametrize(j, self.jerk, Qdot=rates[j])


def step_factors(mech: Mechanism, config: EstimatorConfig, sigmas: dict, efforts: EffortModel,
                 ctx: EvalContext, identification: Optional[Identification] = None,
                 deflection: Optional[EncoderDeflection] = None) -> StepFactors:
    """The step factors of ``config.formulation`` × ``config.integrator``."""
    hermite = config.integrator == "hermite"
    if config.formulation == "independent":
        cls = IndependentHermiteFactors if hermite else IndependentFactors
    else:
        cls = DependentHermiteFactors if hermite else DependentFactors
    return cls(mech, config, sigmas, efforts, ctx, identification, deflection)
