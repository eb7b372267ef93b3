"""graph.window.FixedLagWindow's step protocol: `prepare` linearizes a step without adding it (the caller may
look at its rows and prepare another model of the same step instead), `commit` adds the prepared step."""

import numpy as np
import pytest

import mbfg_ros.factors as F
from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.graph.layout import StateLayout
from mbfg_ros.graph.step_model import StepModel
from mbfg_ros.graph.window import FixedLagWindow


def _window(mech, lag=5):
    n = mech.n
    layout = StateLayout([("q", n), ("v", n), ("a", n)])
    return FixedLagWindow(layout, lag, EvalContext(mech), relinearize_threshold=1e-6), layout


def _seeded(mech):
    """A window holding step 0 (the drawn pose at rest under tight priors): (window, layout, seed model,
    x0, the estimate of step 0)."""
    window, layout = _window(mech)
    n = mech.n
    q0 = np.array(mech.q0, dtype=float)
    x0 = layout.pack(q=q0, v=np.zeros(n), a=np.zeros(n))
    seed = StepModel(layout, [F.Prior("q", q0, 1e-6), F.Prior("v", np.zeros(n), 1e-6),
                              F.PositionConstraints(mech), F.VelocityConstraints(mech), F.ForwardDynamics(mech)])
    return window, layout, seed, x0, window.add_step(0, seed, x0)


def _step_units(mech, h):
    """The units of a forward-dynamics step h after the previous one (no readings)."""
    n = mech.n
    return [F.TrapezoidalIntegrator("q", "v", n, h), F.TrapezoidalIntegrator("v", "a", n, h),
            F.PositionConstraints(mech), F.VelocityConstraints(mech), F.ForwardDynamics(mech)]


def test_prepare_then_commit_a_step_with_or_without_a_reading(crank):
    window, layout, seed, x0, x = _seeded(crank)
    assert window.steps == 1
    core = _step_units(crank, 1e-3)
    c = crank.coordinate_index("crank")
    enc = F.Encoder(crank, c, float(x[c]) + 0.5, 1e-3)            # 500 σ off: an outlier
    with_reading, without = StepModel(layout, core + [enc]), StepModel(layout, core)
    rec = window.prepare(1, with_reading, x, x)
    # the reading's rows of the linearization at x, before anything is added
    assert float(np.abs(rec.model.whitened_rows(enc))[0]) == pytest.approx(500.0, rel=1e-9)
    assert window.steps == 1 and 1 not in window.records
    # prepared again without the reading: that record is the one committed
    rec = window.prepare(1, without, x, x)
    x1 = window.commit(rec)
    assert window.steps == 1 + 1 and window.last is rec and window.records[1] is rec
    assert np.array_equal(x1, window.estimate(1))
    # the same step added in one call (add_step = prepare + commit) gives the same estimate
    other, _ = _window(crank)
    other.add_step(0, seed, x0)
    assert np.allclose(other.add_step(1, without, x, x), x1, rtol=0, atol=1e-12)
    # the ignored reading moved nothing: the estimate keeps the crank where the model puts it
    assert abs(x1[c] - enc.value) > 0.4


@pytest.mark.parametrize("kernel", ["compiled", "numpy"])
def test_each_step_is_evaluated_with_its_own_values(crank, kernel, monkeypatch):
    """A unit shared by the models of several steps (an encoder) gets each step's reading passed with the
    step: the window keeps them per step and evaluates each step with its own, passed with each evaluation on
    both paths; the unit itself keeps the value it was made with."""
    window, layout, _, _, x = _seeded(crank)
    c = crank.coordinate_index("crank")
    enc = F.Encoder(crank, c, 0.0, 1.0)
    model = StepModel(layout, _step_units(crank, 1e-3) + [enc])
    if kernel == "numpy":      # (as a step with a unit of no compiled kind linearizes)
        monkeypatch.setattr(model, "_native_forms", None)
    readings = {1: float(x[c]) + 1e-3, 2: float(x[c]) - 2e-3}
    for k in (1, 2):
        rec = window.prepare(k, model, x, x, values={enc: {"value": readings[k]}})
        # the step's rows are those of its own reading
        assert float(rec.model.whitened_rows(enc)[0]) == pytest.approx(x[c] - readings[k], abs=1e-12)
        x = window.commit(rec)
    i = [u for u, _ in model.param_units].index(enc)
    assert [window.records[k].params[i] for k in (1, 2)] == [(readings[1],), (readings[2],)]
    # re-linearizing step 1 after step 2 was added evaluates it with step 1's reading again
    rec1 = window.records[1]
    assert window.mismatch(rec1, window.estimate(0), window.estimate(1)) < 1e-6
    assert model.compiled == (kernel == "compiled")
    assert enc.value == 0.0
    # without a passed value the unit's own is taken (for parameters fixed at construction)
    assert model.params_of({})[i] == (0.0,)


def test_a_gtsam_without_the_api_the_package_calls_is_named_at_import():
    """gtsam 4.3a1 (the newest wheel for Python 3.10) has IncrementalFixedLagSmoother without getISAM2Result and
    calculateEstimateVector: every step failed on them ("cannot initialize yet (AttributeError ...)"), now the
    import of mbfg_ros.graph says what is missing and what to install."""
    import types

    import gtsam
    import mbfg_ros.graph as graph
    assert graph.missing_gtsam_api() == []                     # the installed one
    smoother = type("IncrementalFixedLagSmoother", (), {"update": None, "marginalCovariance": None,
                                                        "getFactors": None})
    old = types.SimpleNamespace(**{name: getattr(gtsam, name) for name in graph.NEEDED})
    old.IncrementalFixedLagSmoother = smoother
    del old.LinearContainerFactor
    assert graph.missing_gtsam_api(old) == ["IncrementalFixedLagSmoother.getISAM2Result",
                                            "IncrementalFixedLagSmoother.calculateEstimateVector",
                                            "LinearContainerFactor"]
    assert issubclass(graph.GtsamTooOld, ImportError)
