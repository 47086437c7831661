"""Accuracy of the reported percentiles against exact ones (numpy, tfp.stats.percentile).

The requirement (docs/statistics.md): every value and log10-magnitude percentile
lies within 0.5 percentile points of rank of the exact one, i.e. between the
exact (q - 0.5)-th and (q + 0.5)-th percentiles, for tensors of 1 to 10 million
elements; min and max are exact.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tb_introspect import slots, stats, stats_np
from tb_introspect.stats import quantiles
from tests.stats.stats_testlib import as_dict, rank_error_violations

Q = slots.DEFAULT_QUANTILES


def make(kind: str, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.normal(size=n).astype(np.float32)
    if kind == "cauchy":
        return rng.standard_cauchy(size=n).astype(np.float32)
    if kind == "bimodal":  # two narrow modes far apart, unequal weights
        x = np.where(rng.random(n) < 0.3, rng.normal(-50, 0.01, n), rng.normal(3, 1e-4, n))
        return x.astype(np.float32)
    if kind == "relu":  # mostly exact zeros, like a sparse ReLU output
        x = np.abs(rng.normal(size=n)) * (rng.random(n) < 0.12)
        return x.astype(np.float32)
    if kind == "constant":
        return np.full(n, -0.37, np.float32)
    raise ValueError(kind)


def check(x: np.ndarray, vec: np.ndarray) -> None:
    got = as_dict(vec, "output")
    flat = x.astype(np.float64).reshape(-1)
    fin = flat[np.isfinite(flat)]
    nz = fin[fin != 0]
    vq = [got[slots.quantile_field(q)] for q in Q]
    lq = [got[slots.quantile_field(q, log=True)] for q in Q]
    bad = rank_error_violations(fin, vq, Q)
    assert not bad, f"value percentiles: {bad}"
    assert got["min"] == fin.min() and got["max"] == fin.max()
    assert got["q0"] == fin.min() and got["q100"] == fin.max()
    if nz.size:
        logs = np.log10(np.abs(nz))
        bad = rank_error_violations(logs, lq, Q)
        assert not bad, f"log10-magnitude percentiles: {bad}"
        assert got["logq0"] == pytest.approx(logs.min(), rel=1e-14, abs=1e-14)
        assert got["logq100"] == pytest.approx(logs.max(), rel=1e-14, abs=1e-14)
    else:
        assert np.isnan(lq).all()


KINDS = ["normal", "cauchy", "bimodal", "relu", "constant"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 2, 9, 1000, 150_000])
def test_exact_regime_equals_numpy(kind, n):
    """Up to sample_size finite non-zero values the percentiles are numpy's, exactly."""
    x = make(kind, n, seed=n)
    vec = stats.tensor_stats(x, "output").numpy()
    got = as_dict(vec, "output")
    flat = x.astype(np.float64)
    np.testing.assert_allclose(
        [got[slots.quantile_field(q)] for q in Q], np.percentile(flat, Q), rtol=1e-12
    )
    nz = flat[flat != 0]
    if nz.size:
        np.testing.assert_allclose(
            [got[slots.quantile_field(q, log=True)] for q in Q],
            np.percentile(np.log10(np.abs(nz)), Q),
            rtol=1e-12,
            atol=1e-12,
        )
    check(x, vec)


@pytest.mark.parametrize("kind", KINDS)
def test_sampled_regime_within_half_a_percentile_point(kind):
    n = 1_200_000  # > sample_size finite non-zero values except for relu/constant
    x = make(kind, n, seed=11)
    check(x, stats.tensor_stats(x, "output").numpy())


def test_ten_million_elements():
    x = make("cauchy", 10_000_000, seed=5)
    x[::1000] = 0.0
    x[7] = np.nan
    check(x, stats.tensor_stats(x, "output").numpy())


#: One XLA function for the tests below, fed one shape: XLA compiles the engine once for both
#: (about 11 CPU-seconds a compile, whatever the size).
XLA_SHAPE = (1000, 3000)
xla_stats = tf.function(lambda t: stats.tensor_stats(t, "output"), jit_compile=True)


def test_xla_sampled_relu_and_state_accumulation():
    x = make("relu", 3_000_000, seed=8).reshape(XLA_SHAPE)  # ~360k non-zero values
    check(x, xla_stats(x).numpy())
    # Same accuracy after folding 4 batches into a state (bottom-k merges), as a training
    # step does: each batch's state (``batch_state``) merged into the window's (``merge_pair``).
    state = stats.empty_state([None, 3000])
    for part in np.split(x, 4):
        state = stats.merge_pair(state, stats.batch_state(part, stats.DEFAULT_SAMPLE_SIZE))
    check(x, stats.finalize(state, "output").numpy())


def test_agrees_with_tfp_percentile():
    tfp = pytest.importorskip("tensorflow_probability")
    x = make("cauchy", 20_000, seed=3)
    got = as_dict(stats.tensor_stats(x, "output").numpy(), "output")
    want = tfp.stats.percentile(tf.constant(x, tf.float64), Q, interpolation="linear").numpy()
    np.testing.assert_allclose([got[slots.quantile_field(q)] for q in Q], want, rtol=1e-12)
    logs = tf.math.log(tf.abs(tf.constant(x, tf.float64))) / np.log(10.0)
    want_log = tfp.stats.percentile(logs, Q, interpolation="linear").numpy()
    np.testing.assert_allclose(
        [got[slots.quantile_field(q, log=True)] for q in Q], want_log, rtol=1e-10
    )


def test_rank_error_scales_as_documented_with_sample_size():
    """docs/statistics.md: rank error sd <= 50 / sqrt(sample_size) percentile points."""
    k = 1024
    x = make("normal", 200_000, seed=2)
    logs = np.sort(np.log10(np.abs(x.astype(np.float64))))
    errors = []
    for seed in range(30):
        got = as_dict(stats.tensor_stats(x, "output", sample_size=k, seed=seed).numpy(), "output")
        rank = np.searchsorted(logs, got["logq50"]) / logs.size * 100
        errors.append(rank - 50)
    sd = float(np.std(errors))
    bound = 50 / np.sqrt(k)  # 1.56 pp: the binomial sd at the median
    assert 0.5 * bound < sd < 1.4 * bound, (sd, bound)
    assert abs(np.mean(errors)) < 3 * bound / np.sqrt(30)  # unbiased


def test_xla_sampled_all_nonzero():
    x = make("normal", 3_000_000, seed=12).reshape(XLA_SHAPE)  # > 2 * sample_size
    check(x, xla_stats(x).numpy())


@pytest.mark.parametrize("negatives", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("jit", [False, True])
def test_order_statistics_from_one_sort_are_exact(negatives, jit):
    """The magnitudes' order statistics come from the value order (the negatives read
    backwards merged with the positives): equal to sorting the magnitudes, with ties,
    empty slots, all-negative and all-positive samples."""
    rng = np.random.default_rng(4)
    n = 5_000
    x = np.concatenate([rng.standard_cauchy(n) * 1e30, rng.integers(1, 4, n) * 1.0])
    x *= np.where(rng.random(x.size) < negatives, -1.0, 1.0)
    x[rng.random(x.size) < 0.3] = np.inf  # empty slots
    finite = x[np.isfinite(x)]
    m = finite.size
    ranks = np.array([0, 1, 7, m // 3, m // 2, m - 2, m - 1], np.int32)
    fn = tf.function(lambda v, r: quantiles.order_statistics(v, r, r), jit_compile=jit)
    values, mags = (t.numpy() for t in fn(tf.constant(x), tf.constant(ranks)))
    np.testing.assert_array_equal(values, np.sort(finite)[ranks])
    np.testing.assert_array_equal(mags, np.sort(np.abs(finite))[ranks])


@pytest.mark.parametrize("negatives", [0.0, 0.3, 1.0])
def test_numpy_magnitudes_sorted_or_searched_are_exact(monkeypatch, negatives):
    """The numpy twin's magnitudes' order statistics, by a second sort (small groups) or
    by the binary search over the value order (large ones), equal sorting the magnitudes:
    rows of several widths padded in one group, ties, all-negative and all-positive rows."""
    rng = np.random.default_rng(5)
    rows = []
    for size in (3, 700, 1000, 1024, 5):
        r = np.concatenate([rng.standard_cauchy(size) * 1e30, rng.integers(1, 4, size) * 1.0])
        rows.append(r * np.where(rng.random(r.size) < negatives, -1.0, 1.0))
    m = np.array([r.size for r in rows], dtype=np.float64)[:, None]
    at = np.floor(np.array([0.0, 0.01, 0.3, 0.5, 0.99, 1.0]) * (m - 1))
    want = np.stack([np.sort(np.abs(r))[a.astype(int)] for r, a in zip(rows, at, strict=True)])
    for bound in (0, 2**62):  # every group searched, then every group sorted
        monkeypatch.setattr(stats_np.quantiles, "SORT_MAGNITUDES_UP_TO", bound)
        got = stats_np.Sorted(rows).magnitudes().select(at)
        np.testing.assert_array_equal(got, want)


def test_sample_visits_every_channel():
    """A sparse [rows, C] tensor whose channels differ in scale by 10x each: a sample that
    favoured some channels (a stride sharing a factor with C would) would miss whole decades."""
    rng = np.random.default_rng(5)
    rows, channels, k = 25_000, 8, 4096
    x = np.abs(rng.normal(size=(rows, channels))) * 10.0 ** np.arange(channels)
    # About 72k non-zero values: a stride of 16 before the coprime adjustment.
    x = (x * (rng.random((rows, channels)) < 0.36)).astype(np.float32)
    nz = np.sort(np.log10(x[x != 0].astype(np.float64)))
    for seed in range(5):
        got = as_dict(stats.tensor_stats(x, "output", sample_size=k, seed=seed).numpy(), "output")
        for q in Q[1:-1]:
            rank = np.searchsorted(nz, got[slots.quantile_field(q, log=True)]) / nz.size * 100
            assert abs(rank - q) < 6 * 50 / np.sqrt(k), (seed, q, rank)


@pytest.mark.parametrize("seed", range(8))
def test_just_over_the_sample_size_with_one_zero_is_exact(seed):
    """65 values, one of them zero, and a 64-value sample: every non-zero value fits, so the
    percentiles are numpy's exactly. Position draws find 64 non-zero values about a third of
    the time, with repeats; the sampler must not take those for the whole tensor."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=65)
    x[7] = 0.0
    got = as_dict(stats.tensor_stats(x, "output", sample_size=64, seed=seed).numpy(), "output")
    want = stats_np.tensor_stats(x, "output")
    fields = slots.tensor_stats_fields("output")
    for q in Q:
        for log in (False, True):
            name = slots.quantile_field(q, log=log)
            assert got[name] == pytest.approx(want[fields.index(name)], rel=1e-12), name
