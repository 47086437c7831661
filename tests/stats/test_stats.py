"""Statistics of one tensor and the mergeable accumulator (tb_introspect.stats / stats_np)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tb_introspect import slots, stats, stats_np
from tests.stats.stats_testlib import COUNT_FIELDS, as_dict, assert_stats_close, reference_stats

RNG = np.random.default_rng(1234)
Q = slots.DEFAULT_QUANTILES


def tf_stats(x, view="output", **kw):
    return as_dict(stats.tensor_stats(x, view, **kw).numpy(), view)


def np_stats(x, view="output", **kw):
    return as_dict(stats_np.tensor_stats(x, view, **kw), view)


def relu(shape):
    return np.maximum(RNG.normal(size=shape), 0).astype(np.float32)


EDGE_CASES = {
    "empty": np.zeros((0,), np.float32),
    "zero_sized_dim": np.ones((4, 0, 2, 3), np.float32),
    "zero_channels": np.ones((5, 0), np.float32),
    "scalar": np.float32(-2.5),
    "scalar_zero": np.float32(0.0),
    "all_nan": np.full((3, 4), np.nan, np.float32),
    "inf_mix": np.array([np.nan, np.inf, -np.inf, 0.0, 2.0, -5.0, np.inf], np.float32),
    "only_inf": np.array([np.inf, -np.inf], np.float64),
    "float32_limits": np.array([3.4e38, -3.4e38, 3.3e38, 1e-37], np.float32),
    "float16_limits": np.array([65504, -65504, 6e-8, 1.0], np.float16),
    "float64_limits": np.array([1.7e308, -1.7e308, 1e308, 1e-300]),
    "int32": np.array([[1, -2], [3, 0]], np.int32),
    "int64_big": np.array([2**40, -(2**40), 7], np.int64),
    "uint8": np.array([0, 255, 7], np.uint8),
    "bool": np.array([True, False, False]),
    "constant": np.full((50, 3), 0.7, np.float32),
    "all_zero": np.zeros((6, 2, 2, 3), np.float32),
    "narrow_cluster": (1.0 + 1e-4 * RNG.normal(size=400)).astype(np.float32),
    "relu_conv": relu((3, 4, 4, 5)),
    "negative_only": -np.abs(RNG.normal(size=(20, 3))),
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
def test_edge_cases_match_reference(case):
    x = EDGE_CASES[case]
    want = reference_stats(x, "output")
    got = tf_stats(x)
    assert_stats_close(got, want)
    assert_stats_close(np_stats(x), want)
    for key in COUNT_FIELDS:
        assert np.isfinite(got[key]), key


def test_bfloat16_and_float16_inputs():
    vals = np.array([[1.5, -2.0, 0.0], [4.0, 0.25, -8.0]], np.float32)
    for dt in (tf.bfloat16, tf.float16):
        got = tf_stats(tf.constant(vals, dt))
        assert_stats_close(got, reference_stats(vals, "output"))
        # numpy twin: TensorFlow's bfloat16 arrays are ml_dtypes arrays
        assert_stats_close(np_stats(tf.constant(vals, dt).numpy()), reference_stats(vals, "output"))


def test_values_near_float_limits_do_not_overflow():
    x = np.full(1000, 3.0e38, np.float32)
    got = tf_stats(x)
    assert got["l2"] == pytest.approx(3.0e38 * np.sqrt(1000), rel=1e-6)
    assert got["rms"] == pytest.approx(3.0e38, rel=1e-6)
    assert got["std"] == 0.0
    y = np.array([1.6e308, -1.6e308, 1.6e308])
    g = tf_stats(y)
    assert np.isfinite(g["std"]) and np.isfinite(g["rms"]) and np.isfinite(g["mean"])
    assert g["l2"] == np.inf  # the true L2 (2.8e308) is not representable


def test_documented_empty_results():
    got = tf_stats(np.zeros((0, 3), np.float32))
    assert [got[k] for k in COUNT_FIELDS] == [0, 0, 0, 0, 0]
    rest = [k for k in got if k not in COUNT_FIELDS]
    assert all(np.isnan(got[k]) for k in rest)  # nothing to describe: NaN, not 0
    nan = tf_stats(np.full(4, np.nan))
    assert nan["nan_count"] == 4 and nan["dead_rate"] == 1.0 and np.isnan(nan["mean"])


def test_dead_rates_of_a_conv_output():
    x = relu((8, 5, 6, 7)) + 0.01
    x[..., [1, 4]] = 0.0  # 2 of 7 channels dead
    x[:, 2, 3, :] = 0.0  # 1 of 30 positions dead
    x[0, 0, 0, 0] = np.nan  # non-finite values are not activity
    got = tf_stats(x)
    assert got["dead_rate"] == pytest.approx(2 / 7)
    assert got["spatial_dead_rate"] == pytest.approx(1 / 30)
    assert got["nan_count"] == 1


def test_dead_rate_by_rank():
    assert tf_stats(np.float32(0.0))["dead_rate"] == 1.0
    assert np.isnan(tf_stats(np.float32(0.0))["spatial_dead_rate"])
    assert tf_stats(np.array([0, 1, 0, 2], np.float32))["dead_rate"] == 0.5
    dense = np.array([[0, 1, 0], [0, 2, 0]], np.float32)
    assert tf_stats(dense)["dead_rate"] == pytest.approx(2 / 3)
    assert np.isnan(tf_stats(dense)["spatial_dead_rate"])


def test_view_extras_and_epoch_are_nan():
    for view in slots.VIEWS:
        vec = stats.tensor_stats(np.ones(3), view).numpy()
        fields = slots.tensor_stats_fields(view)
        assert vec.shape == (len(fields),)
        assert np.isnan(vec[0])
        assert np.all(np.isnan(vec[len(fields) - len(slots.VIEW_EXTRA_FIELDS[view]):]))


def test_custom_quantiles_layout():
    q = (5, 50, 95)
    x = RNG.normal(size=500)
    vec = stats.tensor_stats(x, "gradient", quantiles=q).numpy()
    got = as_dict(vec, "gradient", q)
    assert [got[f"q{p}"] for p in q] == pytest.approx(np.percentile(x, q), rel=1e-12)


def test_bad_input_errors():
    with pytest.raises(TypeError, match="my_layer/kernel"):
        stats.tensor_stats(tf.constant(["a", "b"]), "variable", name="my_layer/kernel")
    with pytest.raises(TypeError, match="complex"):
        stats.tensor_stats(tf.constant([1 + 2j]), "variable")
    with pytest.raises(TypeError, match="words"):
        stats_np.tensor_stats(np.array(["x"]), "variable", name="words")
    with pytest.raises(ValueError, match="unknown view"):
        stats.tensor_stats(np.ones(3), "weights")
    with pytest.raises(ValueError, match="quantiles"):
        stats.tensor_stats(np.ones(3), "output", quantiles=(50, 101))
    with pytest.raises(ValueError, match="sample_size"):
        stats.tensor_stats(np.ones(3), "output", sample_size=0)


def test_string_tensor_in_graph_names_the_tensor():
    @tf.function
    def f(s):
        return stats.tensor_stats(s, "output")

    with pytest.raises(TypeError, match="dtype string"):
        f(tf.constant(["a"]))


def test_graph_xla_and_dynamic_batch_agree_with_eager():
    x = relu((6, 4, 4, 3))
    x[0, 0, 0, 0] = np.inf
    want = tf_stats(x)
    spec = [tf.TensorSpec([None, 4, 4, 3], tf.float32)]
    graph = tf.function(lambda t: stats.tensor_stats(t, "output"), input_signature=spec)
    xla = tf.function(
        lambda t: stats.tensor_stats(t, "output"), input_signature=spec, jit_compile=True
    )
    assert_stats_close(as_dict(graph(x).numpy(), "output"), want)
    assert_stats_close(as_dict(xla(x).numpy(), "output"), want)
    empty = np.zeros((0, 4, 4, 3), np.float32)  # dynamic batch of size 0
    assert_stats_close(as_dict(xla(empty).numpy(), "output"), reference_stats(empty, "output"))


def test_seeded_sampling_is_deterministic_and_fills_nothing_with_nan():
    x = RNG.normal(size=50_000).astype(np.float32)
    a = stats.tensor_stats(x, "output", sample_size=1000, seed=7).numpy()
    b = stats.tensor_stats(x, "output", sample_size=1000, seed=7).numpy()
    c = stats.tensor_stats(x, "output", sample_size=1000, seed=8).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    got = as_dict(a, "output")
    unknown = ("epoch", "spatial_dead_rate", *slots.VIEW_EXTRA_FIELDS["output"])
    assert all(np.isfinite(v) for k, v in got.items() if k not in unknown)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hnp.arrays(
        dtype=st.sampled_from([np.float32, np.float64, np.float16]),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
        elements=st.one_of(
            st.floats(allow_nan=True, allow_infinity=True, width=16),
            st.sampled_from([0.0, -0.0, 1.0, -1.0]),
        ),
    )
)
def test_property_tf_and_numpy_match_reference(x):
    want = reference_stats(x, "variable")
    assert_stats_close(tf_stats(x, "variable"), want, rtol=1e-7)
    assert_stats_close(np_stats(x, "variable"), want, rtol=1e-7)


# --------------------------------------------------------------------------- accumulator


#: The in-step accumulator sums float32 tensors in float32 (one cheap pass each):
#: moments agree with the float64 reference to about 1e-7, not 1e-9.
ACCUMULATOR_RTOL = 1e-6


def fold(batches, sample_size=stats.DEFAULT_SAMPLE_SIZE, seed=None):
    """The training step's accumulation: each batch's state in canonical shape
    (``batch_state``) merged into the window's (``merge_pair``)."""
    canonical = stats.canonical_shape(batches[0].shape)
    state = stats.empty_state([None, *batches[0].shape[1:]], sample_size=sample_size)
    for i, b in enumerate(batches):
        x = stats.as_canonical(tf.constant(b), canonical)
        pair = None if seed is None else tf.constant([seed, i], tf.int64)
        state = stats.merge_pair(state, stats.batch_state(x, sample_size, pair))
    return state


def test_state_over_batches_equals_stats_of_the_concatenation():
    x = relu((40, 3, 3, 4))
    x[:, :, :, 2] = 0.0
    x[3, 1, 1, 1] = -np.inf
    batches = [x[:10], x[10:25], x[25:]]
    got = as_dict(stats.finalize(fold(batches), "output").numpy(), "output")
    assert_stats_close(got, reference_stats(x, "output"), rtol=ACCUMULATOR_RTOL)


def test_merge_is_associative_and_commutative_in_the_exact_regime():
    parts = [RNG.normal(size=(n, 3)) * s for n, s in [(7, 1.0), (20, 1e6), (3, 1e-6)]]
    a, b, c = (fold([p]) for p in parts)
    left = stats.finalize(stats.merge_pair(stats.merge_pair(a, b), c), "output").numpy()
    right = stats.finalize(stats.merge_pair(a, stats.merge_pair(c, b)), "output").numpy()
    np.testing.assert_allclose(left, right, rtol=1e-12, equal_nan=True)
    assert_stats_close(as_dict(left, "output"), reference_stats(np.concatenate(parts), "output"))


def test_empty_state_finalizes_to_zero_counts():
    got = as_dict(stats.finalize(stats.empty_state([None, 4]), "variable").numpy(), "variable")
    assert [got[k] for k in COUNT_FIELDS] == [0, 0, 0, 0, 0]
    assert np.isnan(got["mean"]) and np.isnan(got["q50"]) and np.isnan(got["dead_rate"])


def test_finalize_rejects_foreign_dicts():
    with pytest.raises(ValueError, match="missing"):
        stats.finalize({"count": tf.constant(1.0)}, "output")


def test_bottom_k_merge_keeps_population_proportions():
    # 10k values near -10 and 90k near +10 in 3 batches; a 4096 sample must hold
    # them 1:9 (binomial sd ~ 0.5 pp), whatever the batch sizes.
    low = RNG.normal(-10, 1, size=10_000)
    high = RNG.normal(10, 1, size=90_000)
    batches = [low[:, None], high[:60_000, None], high[60_000:, None]]
    state = fold(batches, sample_size=4096, seed=3)
    values = state["sample_values"].numpy()
    assert np.isfinite(state["sample_keys"].numpy()).all()
    frac_low = np.mean(values < 0)
    assert abs(frac_low - 0.1) < 0.02, frac_low
    got = as_dict(stats.finalize(state, "output").numpy(), "output")
    assert got["count"] == 100_000 and got["min"] == low.min() and got["max"] == high.max()


def test_state_in_variables_under_xla():
    x = relu((12, 4, 4, 3))
    empty = stats.empty_state([None, 4, 4, 3], sample_size=512)
    variables = {k: tf.Variable(v) for k, v in empty.items()}
    canonical = stats.canonical_shape(x.shape)

    @tf.function(jit_compile=True)
    def step(batch):
        new = stats.merge_pair(variables,
                               stats.batch_state(stats.as_canonical(batch, canonical), 512))
        for k, v in variables.items():
            v.assign(new[k])

    step(x[:5])
    step(x[5:])
    got = as_dict(stats.finalize(variables, "output").numpy(), "output")
    assert_stats_close(got, reference_stats(x, "output"), rtol=ACCUMULATOR_RTOL)
