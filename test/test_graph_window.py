"""graph.window.FixedLagWindow's step protocol: `prepare` linearizes a step without adding it (the caller may
look at its rows and prepare another model of the same step instead), `commit` adds the prepared step."""

import numpy as np
import pytest

import mbfg_ros.factors as F
from mbfg_ros.dynamics.cache import EvalContext
from mbfg_ros.graph.layout import StateLayout
from mbfg_ros.graph.step_model import StepModel
from mbfg_ros.graph.window import FixedLagWindow
from mbfg_ros.model.mechanism import load_mechanism


@pytest.fixture(scope="module")
def crank():
    return load_mechanism("mechanisms/four_bar_crank.yaml")


def _window(mech, lag=5):
    n = mech.n
    layout = StateLayout([("q", n), ("v", n), ("a", n)])
    return FixedLagWindow(layout, lag, EvalContext(mech), relinearize_threshold=1e-6), layout


def test_prepare_then_commit_a_step_with_or_without_a_reading(crank):
    window, layout = _window(crank)
    n, h = crank.n, 1e-3
    q0 = np.array(crank.q0, dtype=float)
    x0 = layout.pack(q=q0, v=np.zeros(n), a=np.zeros(n))
    seed = StepModel(layout, [F.Prior("q", q0, 1e-6), F.Prior("v", np.zeros(n), 1e-6),
                              F.PositionConstraints(crank), F.VelocityConstraints(crank), F.ForwardDynamics(crank)])
    x = window.add_step(0, seed, x0)
    assert window.steps == 1
    core = [F.TrapezoidalIntegrator("q", "v", n, h), F.TrapezoidalIntegrator("v", "a", n, h),
            F.PositionConstraints(crank), F.VelocityConstraints(crank), F.ForwardDynamics(crank)]
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
