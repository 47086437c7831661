"""Activity (activation rate, dead rate, spatial dead rate) counts every row of every batch."""

from __future__ import annotations

import keras
import numpy as np

from tb_introspect import metadata
from tb_introspect.keras import Introspect
from tests.keras import collect_testlib as lib

SIDE, CHANNELS, SAMPLES, BATCH = 16, 64, 512, 64


def one_hot_activations() -> np.ndarray:
    """Sample i switches on exactly one channel at one position; all of them fire somewhere."""
    x = np.zeros((SAMPLES, SIDE, SIDE, CHANNELS), np.float32)
    i = np.arange(SAMPLES)
    x[i, i % SIDE, (i // SIDE) % SIDE, i % CHANNELS] = 1.0 + (i % 7)
    return x


def test_dead_rate_is_exact_over_every_sample(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((SIDE, SIDE, CHANNELS))
    h = keras.layers.ReLU(name="wide")(inp)
    h = keras.layers.Conv2D(2, 1, name="mix")(h)
    h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
    out = keras.layers.Dense(3, name="head")(h)
    model = keras.Model(inp, out)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = one_hot_activations()
    y = np.arange(SAMPLES) % 3
    # Each channel fires in 8 of the 512 samples, one sample per step at most for
    # most channels: any subsample of rows would report some of them dead.
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[Introspect(str(tmp_path), views=("output",), stats_every=8,
                                         overhead=None)])
    run = lib.read_run(str(tmp_path))
    wide = run[metadata.stats_tag("output", "wide")].at(SAMPLES // BATCH)
    # Moments and percentiles come from the statistics steps: the first of the 8 here.
    assert wide["count"] == x.size / (SAMPLES // BATCH)
    assert wide["dead_rate"] == 0.0
    assert wide["spatial_dead_rate"] == 0.0
    assert wide["activation_rate"] == SAMPLES / x.size
    # The epoch's activity map: every channel fired in 8 samples at one position each.
    amap = run[metadata.activity_tag("wide")]
    assert amap.steps == [SAMPLES // BATCH]
    v = amap.at(SAMPLES // BATCH)
    assert v["epoch"] == 0 and v["samples"] == SAMPLES
    nz = x != 0
    per_channel = nz.mean(axis=(0, 1, 2))
    per_position = nz.mean(axis=(0, 3)).reshape(-1)
    np.testing.assert_array_equal([v[f"c{c}"] for c in range(CHANNELS)], per_channel)
    np.testing.assert_array_equal([v[f"s{p}"] for p in range(SIDE * SIDE)], per_position)
    assert min(per_channel) > 0  # so "no dead channel" is a statement about every channel


def test_activity_map_counts_every_step_of_the_epoch_at_step_cadence(tmp_path):
    """With every=N the statistics are per window, the map still one per epoch."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((4, 3))
    h = keras.layers.ReLU(name="act")(inp)
    out = keras.layers.Dense(2, name="head")(keras.layers.Flatten()(h))
    model = keras.Model(inp, out)
    model.compile("sgd", "mse")
    x = np.random.default_rng(1).normal(size=(96, 4, 3)).astype("float32")
    y = np.zeros((96, 2), np.float32)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
              callbacks=[Introspect(str(tmp_path), every=1, views=("output",))])
    run = lib.read_run(str(tmp_path))
    amap = run[metadata.activity_tag("act")]
    assert amap.steps == [6, 12]
    for step, epoch in ((6, 0), (12, 1)):
        v = amap.at(step)
        assert v["epoch"] == epoch and v["samples"] == 96
        np.testing.assert_allclose([v[f"c{c}"] for c in range(3)], (x > 0).mean(axis=(0, 1)))
        np.testing.assert_allclose([v[f"s{p}"] for p in range(4)], (x > 0).mean(axis=(0, 2)))


def _wide_model() -> keras.Model:
    """Its first layer's output is its input (ReLU of non-negative data): independent of
    the weights, so of the NaN that training makes of them."""
    inp = keras.Input((SIDE, SIDE, CHANNELS))
    h = keras.layers.ReLU(name="wide")(inp)
    out = keras.layers.Dense(3, name="head")(keras.layers.GlobalAveragePooling2D()(h))
    model = keras.Model(inp, out)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_statistics_steps_are_each_windows_first_and_every_nth(tmp_path):
    """stats_every=3 over 8-step epochs: steps 0, 3 and 6 of each epoch give the moments,
    extremes and counts; activity still counts all 8."""
    keras.utils.set_random_seed(0)
    x = one_hot_activations()
    x[np.arange(SAMPLES) // BATCH == 1] *= 100.0  # step 1 only: not a statistics step
    steps = SAMPLES // BATCH
    _wide_model().fit(x, np.arange(SAMPLES) % 3, batch_size=BATCH, epochs=2, shuffle=False,
                      verbose=0, callbacks=[Introspect(str(tmp_path), views=("output",),
                                                       stats_every=3, overhead=None)])
    run = lib.read_run(str(tmp_path))
    batches = x.reshape(steps, BATCH, -1)
    taken = batches[[0, 3, 6]]
    for step in (steps, 2 * steps):  # the window starts again at each epoch
        wide = run[metadata.stats_tag("output", "wide")].at(step)
        assert wide["count"] == taken.size
        assert wide["max"] == taken.max() < x.max()
        np.testing.assert_allclose(wide["mean"], taken.mean(), rtol=1e-6)
        assert wide["activation_rate"] == (x != 0).mean()
        assert wide["dead_rate"] == 0.0


def test_a_step_with_nan_outputs_is_always_a_statistics_step(tmp_path):
    keras.utils.set_random_seed(0)
    x = one_hot_activations()
    last = SAMPLES // BATCH - 1  # a step that stats_every=8 would skip; the last, because
    x[last * BATCH + 5, 0, 0, 0] = np.nan  # the NaN weights make every later step NaN
    _wide_model().fit(x, np.arange(SAMPLES) % 3, batch_size=BATCH, epochs=1, shuffle=False,
                      verbose=0, callbacks=[Introspect(str(tmp_path), views=("output",),
                                                       stats_every=8, overhead=None)])
    wide = lib.read_run(str(tmp_path))[metadata.stats_tag("output", "wide")].at(
        SAMPLES // BATCH)
    assert wide["nan_count"] == 1
    assert wide["count"] == 2 * x.size / (SAMPLES // BATCH)  # steps 0 and 7
    assert wide["dead_rate"] == 0.0


def test_a_step_with_an_infinite_rectifier_output_is_a_statistics_step(tmp_path):
    """An infinity that leaves the loss finite (a capped ReLU follows) still makes its step
    a statistics step, where it is counted."""
    keras.utils.set_random_seed(0)
    x = one_hot_activations()
    x[3 * BATCH + 5, 0, 0, 0] = np.inf  # step 3, which stats_every=8 would skip
    inp = keras.Input((SIDE, SIDE, CHANNELS))
    h = keras.layers.ReLU(name="wide")(inp)
    h = keras.layers.ReLU(max_value=1.0, name="cap")(h)
    out = keras.layers.Dense(3, name="head")(keras.layers.GlobalAveragePooling2D()(h))
    model = keras.Model(inp, out)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, np.arange(SAMPLES) % 3, batch_size=BATCH, epochs=1,
                        shuffle=False, verbose=0,
                        callbacks=[Introspect(str(tmp_path), views=("output",),
                                              stats_every=8, overhead=None)])
    assert np.isfinite(history.history["loss"][0])
    run = lib.read_run(str(tmp_path))
    wide = run[metadata.stats_tag("output", "wide")].at(SAMPLES // BATCH)
    assert wide["posinf_count"] == 1
    assert wide["count"] == 2 * x.size / (SAMPLES // BATCH)  # steps 0 and 3
    finite = np.isfinite(x)  # the activity of a statistics step is that of its finite values
    assert wide["activation_rate"] == (finite & (x != 0)).sum() / finite.sum()
    assert run[metadata.stats_tag("output", "cap")].at(SAMPLES // BATCH)["posinf_count"] == 0


def test_only_rectifier_outputs_count_activity_on_every_step(tmp_path):
    """A ReLU's output is counted on every step (exact); a convolution's output before any
    activation is counted on the statistics steps only, and is written as sampled."""
    keras.utils.set_random_seed(0)
    x = one_hot_activations()
    steps = SAMPLES // BATCH
    inp = keras.Input((SIDE, SIDE, CHANNELS))
    h = keras.layers.ReLU(name="wide")(inp)
    h = keras.layers.Conv2D(4, 1, name="mix")(h)
    h = keras.layers.Conv2D(4, 1, activation="relu", name="mix_relu")(h)
    out = keras.layers.Dense(3, name="head")(keras.layers.GlobalAveragePooling2D()(h))
    model = keras.Model(inp, out)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, np.arange(SAMPLES) % 3, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[Introspect(str(tmp_path), stats_every=4, overhead=None)])
    run = lib.read_run(str(tmp_path))
    point = {name: run[metadata.stats_tag("output", name)].at(steps)
             for name in ("wide", "mix", "mix_relu", "head")}
    for name, v in point.items():
        assert v["steps"] == steps and v["stats_steps"] == 2, name  # steps 0 and 4
    for name in ("wide", "mix_relu"):
        assert point[name]["activity_steps"] == steps, name
    for name in ("mix", "head"):
        assert point[name]["activity_steps"] == 2, name
    # The exact one still sees every sample; the sampled one only the statistics steps'.
    assert point["wide"]["activation_rate"] == (x != 0).mean()
    amap = run[metadata.activity_tag("mix")].at(steps)
    assert amap["samples"] == 2 * BATCH
    assert run[metadata.activity_tag("wide")].at(steps)["samples"] == SAMPLES
    grad = run[metadata.stats_tag("output_gradient", "mix")].at(steps)
    assert grad["stats_steps"] == 2 and grad["steps"] == steps


def test_the_governor_keeps_each_epochs_first_step_and_times_the_counts(tmp_path):
    """With a budget no statistics step fits, each epoch keeps its first statistics step;
    after the first epoch that paid only that one, three steps leave the rectifier counts
    out to time them (``pipeline/governor.py``), and the activity written is that of the
    steps that counted, marked sampled. Later epochs count on every step or, where the
    counts cost more than the budget gives a step, on the statistics step only."""
    keras.utils.set_random_seed(0)
    x = one_hot_activations()
    steps = SAMPLES // BATCH
    cb = Introspect(str(tmp_path), views=("output", "output_gradient"), stats_every=2,
                    overhead=1e-9)
    _wide_model().fit(x, np.arange(SAMPLES) % 3, batch_size=BATCH, epochs=4, shuffle=False,
                      verbose=0, callbacks=[cb])
    run = lib.read_run(str(tmp_path))
    counted = []
    for epoch in range(4):
        end = steps * (epoch + 1)
        wide = run[metadata.stats_tag("output", "wide")].at(end)
        assert wide["steps"] == steps
        counted.append(wide["activity_steps"])
        # The steps that counted: the first of each epoch and, where it counted, a later one.
        samples = run[metadata.activity_tag("wide")].at(end)["samples"]
        assert samples == counted[-1] * BATCH
        # Epoch 0 learns the two step times: statistics on steps 0 and 2.
        if epoch:
            assert wide["stats_steps"] == 1
            assert wide["count"] == x.size / steps
    assert counted[:3] == [steps, steps, steps - 3]
    assert counted[3] in (1, steps)
    # Counted every step: every sample's activity, exactly.
    assert run[metadata.stats_tag("output", "wide")].at(steps)["activation_rate"] == (
        x != 0).mean()
    assert set(cb.governor.compile_seconds) == {True, False}  # both functions compiled once
