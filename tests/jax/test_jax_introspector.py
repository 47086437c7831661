"""The JAX front-end on a real training: a Flax Linen MLP on digits under a jitted optax
step, and a Flax NNX model under ``nnx.capture``. What is written is checked against what a
user computes by hand from the same step's arrays."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tb_introspect import slots, stats_np
from tb_introspect.read.provider import read_logdir
from tests.jax.jax_support import BATCH, train

EVERY = 4
STEPS, EPOCHS = 20, 2
POINTS = list(range(EVERY, STEPS * EPOCHS + 1, EVERY))
#: Exact slots: counts and extremes and rates of counts; the moments are float32 sums.
EXACT = ("count", "finite_count", "nan_count", "min", "max", "zero_fraction",
         "activation_rate", "dead_rate")
MOMENTS = ("mean", "std", "rms", "l2")


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    """``every=4`` over two epochs, the arrays of every point's step kept; the steps between
    points run ``Introspector.step`` where a device-to-host transfer raises."""
    log_dir = tmp_path_factory.mktemp("jax_sampled")
    between = set(range(1, STEPS * EPOCHS + 1)) - set(POINTS)
    record = train(str(log_dir), epochs=EPOCHS, steps=STEPS, every=EVERY, keep=set(POINTS),
                   guard=between)
    (run,) = read_logdir(str(log_dir)).values()
    return record, run


def series(run, view: str) -> dict:
    return {s.info.name: s for s in run.tensors[view]}


def by_name(tree, calls: bool = False) -> dict[str, np.ndarray]:
    from tb_introspect.jax.trees import named_leaves

    out: dict[str, np.ndarray] = {}
    for name, leaf in named_leaves(tree, calls=calls):
        out.setdefault(name, np.asarray(leaf))
    return out


def check(got: np.ndarray, fields: tuple, want: np.ndarray, where: str) -> None:
    at = {f: i for i, f in enumerate(fields)}
    for f in EXACT:
        assert got[at[f]] == want[at[f]] or (math.isnan(got[at[f]]) and math.isnan(want[at[f]])), \
            (where, f, got[at[f]], want[at[f]])
    for f in MOMENTS:
        assert math.isclose(got[at[f]], want[at[f]], rel_tol=1e-5, abs_tol=1e-7), \
            (where, f, got[at[f]], want[at[f]])
    # every value sampled (fewer than the sample's bound): the percentiles are exact
    for q in slots.DEFAULT_QUANTILES:
        f = slots.quantile_field(q)
        assert math.isclose(got[at[f]], want[at[f]], rel_tol=1e-6, abs_tol=1e-7), (where, f)


def test_four_views_are_the_steps_arrays(sampled):
    """Each point's variable, gradient, layer-output and output-gradient statistics are
    those of the sampled step's own arrays, the parameter and layer names their paths."""
    record, run = sampled
    views = {v: series(run, v) for v in slots.VIEWS}
    assert sorted(views["variable"]) == ["Dense_0/bias", "Dense_0/kernel", "Dense_1/bias",
                                         "Dense_1/kernel", "Dense_2/bias", "Dense_2/kernel"]
    assert sorted(views["output"]) == ["Dense_0", "Dense_1", "Dense_2", "relu_0", "relu_1"]
    assert sorted(views["output_gradient"]) == sorted(views["output"])
    # depth: the order the layers ran in
    depth = {s.info.layer: s.info.depth for s in run.tensors["output"]}
    assert sorted(depth, key=depth.get) == ["Dense_0", "relu_0", "Dense_1", "relu_1", "Dense_2"]
    for view, arrays, calls in (("variable", record.params, False),
                                ("gradient", record.grads, False),
                                ("output", record.outputs, True),
                                ("output_gradient", record.output_grads, True)):
        fields = slots.tensor_stats_fields(view, slots.DEFAULT_QUANTILES)
        for name, s in views[view].items():
            assert s.steps.tolist() == POINTS, (view, name)
            for row, step in enumerate(POINTS):
                x = by_name(arrays[step], calls)[name]
                want = stats_np.tensor_stats(x, view, sample_size=None)
                check(s.values[row], fields, want, f"{view} {name} step {step}")


def test_losses_and_no_transfer_between_points(sampled):
    """Every step's loss is written as it was returned; the steps between points ran
    ``step`` under a device-to-host transfer guard (the fixture): nothing was read back."""
    record, run = sampled
    loss = run.metrics["loss"]
    assert loss.steps.tolist() == list(range(1, STEPS * EPOCHS + 1))
    np.testing.assert_allclose(loss.field("value"), [record.losses[s] for s in loss.steps],
                               rtol=1e-6)


def test_epoch_windows_and_exact_rectifier_activity(tmp_path):
    """``every="epoch"``, ``overhead=None``: one point per epoch; the first step and every
    ``stats_every``-th after it are statistics steps; a ReLU's activity counts every row of
    every step, the gradient sum every step."""
    steps = 20
    record = train(str(tmp_path), epochs=2, steps=steps, stats_every=8, overhead=None,
                   keep=set(range(1, 2 * steps + 1)))
    (run,) = read_logdir(str(tmp_path)).values()
    out = series(run, "output")
    relu, dense = out["relu_0"], out["Dense_0"]
    assert relu.steps.tolist() == [steps, 2 * steps]
    stats_steps = 3  # steps 1, 9, 17 of each epoch
    assert relu.field("stats_steps").tolist() == [stats_steps] * 2
    assert relu.field("activity_steps").tolist() == [steps] * 2  # exact: every step
    assert dense.field("activity_steps").tolist() == [stats_steps] * 2  # sampled
    assert dense.field("count").tolist() == [stats_steps * BATCH * 32] * 2
    for e in range(2):
        acts = np.concatenate([by_name(record.outputs[e * steps + i + 1], True)["relu_0"]
                               for i in range(steps)])
        assert relu.field("activation_rate")[e] == pytest.approx(np.mean(acts != 0), rel=1e-12)
        gsum = sum(by_name(record.grads[e * steps + i + 1])["Dense_0/kernel"].astype(np.float64)
                   for i in range(steps))
        got = series(run, "gradient")["Dense_0/kernel"]
        assert got.field("mean")[e] == pytest.approx(gsum.mean(), rel=1e-5)


def test_nnx_capture(tmp_path):
    """An NNX model under ``nnx.capture``: every layer's output (``method_outputs``), the
    tapped ReLU's output gradient, the parameters by attribute path."""
    import optax
    from flax import nnx

    from tb_introspect.jax import Introspector, tap
    from tests.jax.jax_support import digits

    class Net(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.hidden = nnx.Linear(64, 16, rngs=rngs)
            self.head = nnx.Linear(16, 10, rngs=rngs)

        def __call__(self, x):
            return self.head(tap(self, nnx.relu(self.hidden(x)), "relu"))

    x, y = digits()
    model = Net(nnx.Rngs(0))
    _, perturbations = nnx.capture(model, nnx.Perturbation)(x[:BATCH])
    _, outputs = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)(
        x[:BATCH])
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    intro = Introspector(str(tmp_path), nnx.state(model, nnx.Param), outputs=outputs, every=2)

    def loss_fn(model, perturbations, xb, yb):
        logits, outs = nnx.capture(model, nnx.Intermediate, init=perturbations,
                                   method_outputs=nnx.Intermediate)(xb)
        return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean(), outs

    @nnx.jit
    def step(model, optimizer, perturbations, stats, xb, yb):
        (g, og), outs = nnx.grad(loss_fn, argnums=(0, 1), has_aux=True)(
            model, perturbations, xb, yb)
        stats = intro.fold(stats, grads=g, outputs=outs, output_grads=og)
        optimizer.update(model, g)
        return stats

    stats = intro.init()
    with intro:
        for i in range(6):
            stats = step(model, optimizer, perturbations, stats, x[i * BATCH:(i + 1) * BATCH],
                         y[i * BATCH:(i + 1) * BATCH])
            stats = intro.step(stats, nnx.state(model, nnx.Param))
    (run,) = read_logdir(str(tmp_path)).values()
    assert sorted(series(run, "variable")) == ["head/bias", "head/kernel", "hidden/bias",
                                               "hidden/kernel"]
    assert sorted(series(run, "output")) == ["head", "hidden", "model", "relu"]
    assert sorted(series(run, "output_gradient")) == ["relu"]
    assert series(run, "output")["relu"].steps.tolist() == [2, 4, 6]
    weights = np.asarray(model.hidden.kernel[...])
    last = series(run, "variable")["hidden/kernel"]
    assert last.field("mean")[-1] == pytest.approx(weights.mean(), rel=1e-6)
    # Called outside nnx.capture (an evaluation), the taps do nothing and keep nothing.
    before = nnx.state(model)
    logits = model(x[:BATCH])
    assert logits.shape == (BATCH, 10)
    assert jax.tree.structure(nnx.state(model)) == jax.tree.structure(before)


def test_nnx_outputs_give_the_layers_depth_in_the_order_they_ran(tmp_path):
    """NNX's captured state is sorted by name; ``nnx_outputs`` keeps the order the layers
    ran, so a model whose ``classifier`` sorts before ``dense1`` still has it last: its
    layer outputs and parameters are written at the depths of the calls."""
    import optax
    from flax import nnx

    from tb_introspect.jax import Introspector, nnx_outputs, tap
    from tests.jax.jax_support import digits

    class Net(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.dense1 = nnx.Linear(64, 16, rngs=rngs)
            self.classifier = nnx.Linear(16, 10, rngs=rngs)

        def __call__(self, x):
            h = tap(self.dense1, nnx.relu(self.dense1(x)))
            return tap(self.classifier, self.classifier(h))

    x, y = digits()
    model = Net(nnx.Rngs(0))
    taps, outputs = nnx_outputs(model, x[:BATCH])
    assert list(outputs) == ["dense1", "classifier"]
    _, state = nnx.capture(model, nnx.Intermediate)(x[:BATCH])
    assert list(state) == ["classifier", "dense1"]  # what nnx_outputs is for
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
    intro = Introspector(str(tmp_path), nnx.state(model, nnx.Param), outputs=outputs, every=1)

    def loss_fn(model, taps, xb, yb):
        logits, outs = nnx.capture(model, nnx.Intermediate, init=taps)(xb)
        return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean(), outs

    @nnx.jit
    def step(model, optimizer, taps, stats, xb, yb):
        (g, og), outs = nnx.grad(loss_fn, argnums=(0, 1), has_aux=True)(model, taps, xb, yb)
        optimizer.update(model, g)
        return intro.fold(stats, grads=g, outputs=outs, output_grads=og)

    with intro:
        intro.step(step(model, optimizer, taps, intro.init(), x[:BATCH], y[:BATCH]),
                   nnx.state(model, nnx.Param))
    (run,) = read_logdir(str(tmp_path)).values()
    for view in ("output", "output_gradient", "variable"):
        depth = {name: s.info.depth for name, s in series(run, view).items()}
        first = [d for name, d in depth.items() if name.startswith("dense1")]
        last = [d for name, d in depth.items() if name.startswith("classifier")]
        assert first and last and max(first) < min(last), (view, depth)


def test_a_tree_it_was_not_made_with_is_a_clear_error(tmp_path):
    from tb_introspect.jax import Introspector

    params = {"w": jnp.ones((4, 2))}
    with Introspector(str(tmp_path), params, outputs={"h": jnp.ones((8, 2))}) as intro:
        stats = intro.init()
        with pytest.raises(ValueError, match="'g'.*outputs= does not name"):
            jax.jit(lambda st: intro.fold(st, outputs={"g": jnp.ones((8, 2))}))(stats)
        with pytest.raises(ValueError, match="params: 2 arrays"):
            intro.step(stats, {"w": jnp.ones((4, 2)), "b": jnp.ones(2)})


def test_pacing_spaces_the_statistics_steps_by_their_measured_cost():
    """The first steps of each kind compile and are not counted; then three lean steps of
    1 s and two statistics steps of 1.4 and 1.6 s: 0.5 s extra at a 5 % budget of 1 s is a
    statistics step every 10 steps, and nothing is timed (waited for) after that."""
    from tb_introspect.jax.pacing import Pacing
    from tb_introspect.pipeline.governor import HEADROOM, Governor

    five = 0.05 / HEADROOM  # the overhead of which the pacing plans to spend 5 %
    governor = Governor(None, 8)
    now = [0.0]
    pacing = Pacing(governor, five, clock=lambda: (now[0], 2 * now[0]))
    waits = []
    for full, seconds in ((True, 30.0), (False, 20.0), (False, 1.0), (False, 1.0),
                          (False, 1.0), (True, 1.4), (True, 1.6), (False, 1.0)):
        now[0] += seconds
        pacing.timed(full, lambda f=full: waits.append(f))
    assert governor.spacing == 10
    assert len(waits) == 7  # the last step ran without a wait
    # Each point's host work comes off the same budget: 2 s of the worker's CPU over a
    # 40-step window of 2 CPU-s steps is 2.5 %, half the budget: a statistics step every 20.
    governor.worked("point", 2.0)
    pacing.repace(40)
    assert governor.spacing == 20
    cheap = Governor(None, 8)
    cpu = [0.0]
    pacing = Pacing(cheap, five, clock=lambda: (now[0], cpu[0]))
    for full, seconds, cpu_seconds in ((True, 3.0, 3.0), (False, 2.0, 2.0), (False, 1.0, 2.0),
                                       (False, 1.0, 2.0), (False, 1.0, 2.0), (True, 1.01, 2.2),
                                       (True, 1.01, 2.2)):
        now[0] += seconds
        cpu[0] += cpu_seconds
        pacing.timed(full, lambda: None)
    assert cheap.spacing == 8  # never closer than stats_every (wall 1 %, CPU 10 %: 2 steps)
    dear = Governor(None, 8)
    now, cpu = [0.0], [0.0]
    pacing = Pacing(dear, five, clock=lambda: (now[0], cpu[0]))
    for full, seconds, cpu_seconds in ((True, 3.0, 3.0), (False, 2.0, 2.0), (False, 1.0, 2.0),
                                       (False, 1.0, 2.0), (False, 1.0, 2.0), (True, 1.1, 3.1),
                                       (True, 1.1, 3.3)):
        now[0] += seconds
        cpu[0] += cpu_seconds
        pacing.timed(full, lambda: None)
    assert dear.spacing == 12  # CPU: 1.2 s more of 2 s is 60 %, at 5 % one step in 12
    # The lean steps' own work, timed apart (20 ms of a 1 s lean step, 40 ms of its 2 CPU-s),
    # is paid first: 2 % of the plain step, leaving 3 % to a statistics step's 51 %.
    paced = Governor(None, 8)
    now = [0.0]
    pacing = Pacing(paced, five, clock=lambda: (now[0], 2 * now[0]),
                    lean_work=lambda: (0.02, 0.04))
    for full, seconds in ((True, 30.0), (False, 20.0), (False, 1.0), (False, 1.0),
                          (False, 1.0), (True, 1.4), (True, 1.6)):
        now[0] += seconds
        pacing.timed(full, lambda: None)
    assert pacing.lean_share == pytest.approx(0.02 / 0.98)
    assert paced.spacing == math.ceil((0.5 / 0.98) / (0.05 - 0.02 / 0.98))  # 18


def test_every_window_starts_with_a_statistics_step(tmp_path):
    """``window=5``: a point every 5 steps, each window's first step a statistics step (the
    pipeline's window ends start the next), none other at ``stats_every=8``."""
    train(str(tmp_path), epochs=1, steps=20, window=5, stats_every=8, overhead=None)
    (run,) = read_logdir(str(tmp_path)).values()
    relu = series(run, "output")["relu_0"]
    assert relu.steps.tolist() == [5, 10, 15, 20]
    assert relu.field("stats_steps").tolist() == [1, 1, 1, 1]
    assert relu.field("activity_steps").tolist() == [5, 5, 5, 5]
