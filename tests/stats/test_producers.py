"""The producers of the packed statistics vector agree slot by slot on the same tensors.

Six producers: the TensorFlow engine (``stats``), its numpy twin (``stats_np``, the hub
every other producer is compared with), the TensorFlow summary op (``summary.tensor_stats_summary``:
the engine's in-graph finalize in a ``tf.function`` step, written to a real event file and read
back as the plugin reads it), the Keras point (the training step's TensorFlow states finalized
on the host, ``stats.finalize_rows``) and PyTorch's device segments (``torch/state.fold``,
finalized through ``stats_np``). Each slot
has the tolerance its arithmetic allows: counts, extremes and rates of counts exact, moments
to their floating-point precision, percentiles exact while the sample holds every value.
Where a producer differs on purpose (``docs/statistics.md``), the difference is spelled out
below, case by case.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tb_introspect import slots, stats, stats_np
from tb_introspect.jax import fold as jax_fold
from tb_introspect.stats_np import segments
from tb_introspect.torch import state as torch_state

VIEW = "output"
Q = slots.DEFAULT_QUANTILES
FIELDS = slots.tensor_stats_fields(VIEW, Q)
#: Holds every value of every exact case: percentiles are then numpy's exactly.
K = 8192
RNG = np.random.default_rng(20240611)

COUNTS = {"count", "finite_count", "nan_count", "posinf_count", "neginf_count"}
RATES = {"zero_fraction", "sign_balance", "activation_rate", "dead_rate", "spatial_dead_rate"}
EXTREMES = {"min", "max", slots.quantile_field(0), slots.quantile_field(100)}
MOMENTS = {"mean", "std", "rms", "l2"}
UNSET = {"epoch", *slots.view_extra_fields(VIEW, Q)}


def _relu_conv() -> np.ndarray:
    x = np.maximum(RNG.normal(size=(8, 6, 6, 16)), 0).astype(np.float32) + 0.01
    x[..., [3, 11]] = 0.0  # 2 of 16 channels dead
    x[:, 2, 4, :] = 0.0  # 1 of 36 positions dead
    return x


def _nonfinite_mixed() -> np.ndarray:
    x = RNG.normal(size=(6, 4)).astype(np.float32)
    x[0, 0], x[1, 2], x[2, 1], x[3, 3], x[4, 0] = np.nan, np.inf, -np.inf, np.nan, 0.0
    return x


def _nonfinite_one_sign() -> np.ndarray:
    # No finite zero: a fold that zeroes non-finite values must not read min = 0.
    x = np.abs(RNG.normal(size=(5, 3))).astype(np.float32) + 0.5
    x[0, 1], x[3, 0] = np.nan, np.inf
    return x


#: Channels-last arrays (TensorFlow's and numpy's layout; PyTorch gets channels first).
CASES: dict[str, np.ndarray] = {
    "empty": np.zeros((0, 3), np.float32),
    "all_zero": np.zeros((4, 3, 3, 2), np.float32),
    "all_nan": np.full((3, 4), np.nan, np.float32),
    "nonfinite_mixed": _nonfinite_mixed(),
    "nonfinite_one_sign": _nonfinite_one_sign(),
    "subnormal_float32": np.array([[1e-40, -3e-39, 0.0], [1.0, -2.5, 1e-45]], np.float32),
    "subnormal_float64": np.array([[1e-310, -2e-315, 0.0], [1.0, -2.5, 5e-324]]),
    "huge_float32": np.array([[3.0e38, -3.0e38, 1.0], [-2.0, 0.5, 7.0]], np.float32),
    "huge_float64": np.array([[1.5e308, -1.5e308, 1.0], [-2.0, 0.5, 7.0]]),
    "one_element": np.array([[2.5]], np.float32),
    "ties": RNG.choice(np.array([-1.0, 0.0, 0.5, 2.0], np.float32), size=(64, 4)),
    "random": RNG.normal(size=(64, 16)).astype(np.float32),
    "relu_conv": _relu_conv(),
    "vector": np.array([0.0, 1.5, 0.0, -2.0, 0.0], np.float32),
}


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    """``x`` as TensorFlow's CPU kernels see it (flush-to-zero): subnormals are zeros."""
    return np.where(np.abs(x) < np.finfo(x.dtype).tiny, np.zeros_like(x), x)


def tf_vector(x: np.ndarray, k: int = K) -> np.ndarray:
    return stats.tensor_stats(x, VIEW, quantiles=Q, sample_size=k, seed=5).numpy()


def np_vector(x: np.ndarray, k: int | None = K) -> np.ndarray:
    return stats_np.tensor_stats(x, VIEW, quantiles=Q, sample_size=k, seed=5)


#: What the summary op is given besides the tensor: the ``epoch`` slot it fills is checked,
#: then blanked (NaN) as the other producers leave it.
SUMMARY_STEP, SUMMARY_EPOCH = 7, 3


def summary_vectors(arrays: dict[str, np.ndarray], k: int, logdir) -> dict[str, np.ndarray]:
    """The summary op's producer: ``summary.tensor_stats_summary`` of every array, called in
    one ``tf.function`` step as a custom training loop calls it, written by a file writer to a
    real event file and read back through the read layer (``read.provider``, the plugin's)."""
    import tensorflow as tf

    from tb_introspect import summary
    from tb_introspect.read import provider

    @tf.function(autograph=False)
    def step(tensors):
        return [summary.tensor_stats_summary(name, t, SUMMARY_STEP, view=VIEW, quantiles=Q,
                                             epoch=SUMMARY_EPOCH, sample_size=k, seed=5)
                for name, t in tensors.items()]

    writer = tf.summary.create_file_writer(str(logdir))
    with writer.as_default():
        written = step({name: tf.constant(x) for name, x in arrays.items()})
    writer.close()
    assert all(bool(ok) for ok in written)
    (run,) = provider.read_logdir(str(logdir)).values()
    out = {}
    for series in run.tensors[VIEW]:
        assert series.info.fields == tuple(FIELDS) and series.steps.tolist() == [SUMMARY_STEP]
        vector = series.values[0].copy()
        assert vector[FIELDS.index("epoch")] == SUMMARY_EPOCH
        vector[FIELDS.index("epoch")] = np.nan
        out[series.info.name] = vector
    assert sorted(out) == sorted(arrays)
    return out


def channels_first(x: np.ndarray) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if x.ndim >= 3 else x


def torch_segment(batches: list[np.ndarray], k: int = K, salt: int = 0
                  ) -> tuple[np.ndarray, segments.Segment]:
    """One device segment with every batch (channels-last) folded in as a statistics step."""
    xs = [torch.from_numpy(np.ascontiguousarray(channels_first(b))) for b in batches]
    seg = segments.layout(xs[0].shape, True, k)
    buf = torch.from_numpy(seg.empty())
    arange = torch.arange(k)
    for i, x in enumerate(xs):
        torch_state.fold(buf, seg, x, torch.tensor(salt + i + 1), True, arange)
    return buf.numpy(), seg


def torch_vector(x: np.ndarray, k: int = K) -> np.ndarray:
    segment, seg = torch_segment([x], k)
    return segments.finalize(segment, seg, VIEW, Q, activity_rates=True)


def jax_segment(batches: list[np.ndarray], k: int = K, salt: int = 0
                ) -> tuple[np.ndarray, segments.Segment]:
    """One JAX state with every batch folded in by a jitted statistics step, as a segment."""
    seg = segments.layout(batches[0].shape, False, k)
    step = jax.jit(lambda st, x, key: jax_fold.fold(st, x, seg, key))
    st = jax_fold.empty(seg)
    for i, b in enumerate(batches):
        st = step(st, jnp.asarray(b), jax.random.key(salt + i))
    return jax_fold.to_segment(jax.device_get(st), seg), seg


def jax_vector(x: np.ndarray, k: int = K) -> np.ndarray:
    segment, seg = jax_segment([x], k)
    return segments.finalize(segment, seg, VIEW, Q, activity_rates=True)


# ------------------------------------------------------------------ what differs, and why

def tf_input(case: str, x: np.ndarray) -> np.ndarray:
    """What numpy must see to give TensorFlow's result: TensorFlow's CPU kernels flush
    subnormal values to zero (``docs/statistics.md``, edge cases)."""
    return flush_subnormals(x) if case.startswith("subnormal") else x


def torch_expected(case: str, x: np.ndarray, want: dict[str, float]) -> dict[str, float]:
    """numpy's slots as PyTorch's segments give them (``docs/statistics.md``, PyTorch)."""
    want = dict(want)
    if case.startswith("huge"):
        # The device sums are unscaled, in the tensor's dtype: squares past its range are
        # infinite. A fold's sum of two opposite huge values can lose the small ones.
        want.update(std=math.inf, rms=math.inf, l2=math.inf)
    if x.ndim == 1:
        # A layer output's axis 0 is its batch: a vector is one channel.
        one = dict(zip(FIELDS, np_vector(x[:, None]), strict=True))
        want["dead_rate"] = one["dead_rate"]
    return want


def jax_input(case: str, x: np.ndarray) -> np.ndarray:
    """What numpy must see to give JAX's result: JAX without ``jax_enable_x64`` takes a
    float64 array as float32, and XLA's CPU kernels treat subnormals as zeros."""
    if x.dtype == np.float64:
        with np.errstate(over="ignore"):
            x = x.astype(np.float32)
    return flush_subnormals(x) if case.startswith("subnormal") else x


def jax_expected(case: str, x: np.ndarray, want: dict[str, float]) -> dict[str, float]:
    """numpy's slots of ``jax_input`` as JAX's states give them: PyTorch's rules (float32
    sums, a vector is one channel), but for a float64 array, which JAX took as float32."""
    return want if x.dtype == np.float64 else torch_expected(case, x, want)


# ------------------------------------------------------------------ the comparison


def scale_of(x: np.ndarray) -> float:
    fin = np.asarray(x, np.float64)[np.isfinite(x)]
    return float(np.abs(fin).max()) if fin.size else 0.0


def moment_tol(x: np.ndarray, producer: str) -> float:
    """Relative precision of a producer's sums: float64 everywhere, except PyTorch's device
    sums of float32 tensors."""
    return 1e-6 if producer == "torch" and x.dtype == np.float32 else 1e-12


def mismatches(got: np.ndarray, want: dict[str, float], x: np.ndarray, *, tol: float,
               exact_percentiles: bool = True) -> list[str]:
    """Slots of ``got`` outside their tolerance around ``want``."""
    scale = scale_of(x)
    bad = []
    for name, g in zip(FIELDS, got.tolist(), strict=True):
        w = want[name]
        if name in UNSET:
            ok = math.isnan(g)
        elif math.isnan(w) or math.isnan(g):
            ok = math.isnan(w) and math.isnan(g)
        elif name in COUNTS or name in EXTREMES or math.isinf(w):
            ok = g == w
        elif name in RATES:
            ok = math.isclose(g, w, rel_tol=1e-14, abs_tol=0.0)
        elif name in MOMENTS:
            ok = math.isclose(g, w, rel_tol=tol, abs_tol=tol * scale)
        elif name.startswith("logq"):
            ok = math.isclose(g, w, rel_tol=1e-12, abs_tol=1e-12) or not exact_percentiles
        else:  # value percentiles: numpy's interpolation of the same order statistics
            ok = math.isclose(g, w, rel_tol=1e-12, abs_tol=1e-15 * scale) or not exact_percentiles
        if not ok:
            bad.append(f"{name}: got {g!r}, want {w!r}")
    return bad


def as_dict(vector: np.ndarray) -> dict[str, float]:
    return dict(zip(FIELDS, vector.tolist(), strict=True))


@pytest.mark.parametrize("case", sorted(CASES))
def test_tensorflow_matches_numpy(case):
    x = CASES[case]
    want = as_dict(np_vector(tf_input(case, x)))
    assert not mismatches(tf_vector(x), want, x, tol=1e-12)


@pytest.fixture(scope="module")
def summary_op_vectors(tmp_path_factory) -> dict[str, np.ndarray]:
    return summary_vectors(CASES, K, tmp_path_factory.mktemp("summary_op"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_summary_op_matches_numpy(case, summary_op_vectors):
    """What ``tb_introspect.summary.tensor_stats_summary`` wrote, as the plugin reads it: the
    TensorFlow engine's slots (its flush-to-zero, its float64 moments), every percentile exact."""
    x = CASES[case]
    want = as_dict(np_vector(tf_input(case, x)))
    assert not mismatches(summary_op_vectors[case], want, x, tol=1e-12)


@pytest.mark.parametrize("case", sorted(CASES))
def test_pytorch_matches_numpy(case):
    x = CASES[case]
    want = torch_expected(case, x, as_dict(np_vector(x)))
    assert not mismatches(torch_vector(x), want, x, tol=moment_tol(x, "torch"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_jax_matches_numpy(case):
    x = CASES[case]
    seen = jax_input(case, x)
    want = jax_expected(case, x, as_dict(np_vector(seen)))
    assert not mismatches(jax_vector(x), want, seen, tol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_numpy_matches_its_definitions(case):
    """The hub itself, on the slots that need no reference implementation."""
    x = np.asarray(CASES[case], np.float64)
    got = as_dict(np_vector(x, k=None))
    fin = x[np.isfinite(x)]
    assert got["count"] == x.size and got["finite_count"] == fin.size
    assert got["nan_count"] == np.isnan(x).sum()
    if fin.size:
        assert got["min"] == fin.min() and got["max"] == fin.max()
        # the same interpolation, up to numpy's rounding of it (b - (b - a) * (1 - t))
        assert math.isclose(got["q50"], np.percentile(fin, 50), rel_tol=1e-12,
                            abs_tol=1e-15 * np.abs(fin).max())
        nz = fin[fin != 0]
        if nz.size:
            assert math.isclose(got["logq50"], np.percentile(np.log10(np.abs(nz)), 50),
                                rel_tol=1e-12, abs_tol=1e-12)
    else:
        assert all(math.isnan(got[f]) for f in ("mean", "min", "q50", "zero_fraction"))


def test_the_differences_are_real():
    """Each difference spelled out above shows on its case (else it should go)."""
    sub = CASES["subnormal_float32"]
    assert as_dict(np_vector(sub))["zero_fraction"] != as_dict(tf_vector(sub))["zero_fraction"]
    huge = CASES["huge_float32"]
    assert math.isfinite(as_dict(np_vector(huge))["rms"])
    assert math.isinf(as_dict(torch_vector(huge))["rms"])
    vec = CASES["vector"]
    assert as_dict(np_vector(vec))["dead_rate"] == 0.6
    assert as_dict(torch_vector(vec))["dead_rate"] == 0.0


# ------------------------------------------------------------------ sampled percentiles


def rank_error(data: np.ndarray, value: float, q: float) -> float:
    """Percentile points between ``value`` and the exact ``q``-th percentile's ranks."""
    lo, hi = 100.0 * np.mean(data < value), 100.0 * np.mean(data <= value)
    return max(0.0, lo - q, q - hi)


@pytest.mark.parametrize("producer", ["tensorflow", "summary", "numpy", "pytorch", "jax"])
def test_sampled_percentiles(producer, tmp_path):
    """More values than the sample holds: every slot but the inner percentiles as exact as
    above, those within six sigma of rank (sigma = 50 / sqrt(k) percentile points)."""
    k = 1024
    x = RNG.standard_t(3, size=(200, 100)).astype(np.float32)
    x[x < -1.0] = 0.0
    run = {"tensorflow": lambda: tf_vector(x, k), "numpy": lambda: np_vector(x, k),
           "summary": lambda: summary_vectors({"x": x}, k, tmp_path)["x"],
           "pytorch": lambda: torch_vector(x, k), "jax": lambda: jax_vector(x, k)}[producer]
    got = as_dict(run())
    want = as_dict(np_vector(x, None))
    if producer in ("pytorch", "jax"):
        # The smallest magnitude comes from the sample: at or above the true one.
        assert got["logq0"] >= want["logq0"]
        want["logq0"] = got["logq0"]
    tol = moment_tol(x, "torch" if producer in ("pytorch", "jax") else producer)
    assert not mismatches(np.array(list(got.values())), want, x, tol=tol,
                          exact_percentiles=False)
    fin = x.reshape(-1).astype(np.float64)
    logs = np.log10(np.abs(fin[fin != 0]))
    bound = 6 * 50 / np.sqrt(k)
    for q in Q[1:-1]:
        assert rank_error(fin, got[slots.quantile_field(q)], q) <= bound, q
        assert rank_error(logs, got[slots.quantile_field(q, log=True)], q) <= bound, q


# ------------------------------------------------------------------ merged states


def test_merged_states_match_the_whole():
    """Steps and ranks merged by each producer's own algebra give the statistics of their
    concatenation: numpy's ``merge_states`` (Chan's moments, bottom-k sample), TensorFlow's
    training-step fold (each batch's ``batch_state`` merged by ``merge_pair``), PyTorch's folds
    and ``merge_ranks``, JAX's jitted folds."""
    x = CASES["relu_conv"].copy()
    x[1, 0, 0, 0] = np.nan
    x[5] += 100.0  # one batch far from the others: the spread between steps matters
    parts = np.split(x, 4)
    want = as_dict(np_vector(x))

    st = stats_np.empty_state(x.shape, sample_size=K)
    for p in parts:
        st = stats_np.merge_states(st, stats_np.tensor_state(p, sample_size=K))
    assert not mismatches(stats_np.finalize(st, VIEW, quantiles=Q), want, x, tol=1e-12)

    canonical = stats.canonical_shape(x.shape)
    tf_state = stats.empty_state([None, *x.shape[1:]], sample_size=K)
    for p in parts:
        batch = stats.batch_state(stats.as_canonical(stats.to_float(p), canonical), K)
        tf_state = stats.merge_pair(tf_state, batch)
    # the training step's sums are float32 (docs/statistics.md)
    assert not mismatches(stats.finalize(tf_state, VIEW, quantiles=Q).numpy(), want, x,
                          tol=1e-6)
    on_host = {key: v.numpy()[np.newaxis] for key, v in tf_state.items()}
    assert not mismatches(stats.finalize_rows(on_host, VIEW, quantiles=Q)[0], want, x, tol=1e-6)

    ranks = [torch_segment(parts[:2], salt=0), torch_segment(parts[2:], salt=10)]
    seg = ranks[0][1]
    merged = segments.merge_ranks(np.stack([r[0] for r in ranks]), seg)
    got = segments.finalize(merged, seg, VIEW, Q, activity_rates=True)
    assert not mismatches(got, want, x, tol=1e-6)

    segment, seg = jax_segment(parts)  # a step per part, one state
    got = segments.finalize(segment, seg, VIEW, Q, activity_rates=True)
    assert not mismatches(got, want, x, tol=1e-6)


def test_numpy_and_tensorflow_states_carry_the_same_keys():
    """One algebra: the states both engines build hold the same keys (numpy's also the
    sample's bound, which TensorFlow's fixed shapes carry)."""
    import tensorflow as tf

    tf_state = stats.empty_state(tf.TensorShape([None, 4]), sample_size=8)
    np_state = stats_np.tensor_state(CASES["relu_conv"])
    assert set(tf_state) == set(stats.STATE_MERGE)
    assert set(np_state) == set(stats_np.STATE_MERGE) == set(tf_state) | {"sample_size"}


def keras_vector(x: np.ndarray, k: int = K) -> np.ndarray:
    """The Keras point's producer: the training step's state of ``x`` (``batch_state``, as
    one statistics step takes it) read to the host and finalized there
    (``stats.finalize_rows``)."""
    import tensorflow as tf

    t = tf.constant(x)
    canonical = stats.canonical_shape(t.shape.as_list())
    state = stats.batch_state(stats.as_canonical(t, canonical), k, tf.constant([5, 6], tf.int64))
    if canonical[-1] == 0:  # an empty tensor's rows are not units
        state["channels"] = tf.constant(0.0, tf.float64)
    return stats.finalize_rows({key: v.numpy()[np.newaxis] for key, v in state.items()},
                               VIEW, quantiles=Q)[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_keras_point_matches_numpy(case):
    """A Keras point's vectors: the step's float32 sums (``docs/statistics.md``), every
    other slot as numpy's own."""
    x = CASES[case]
    want = as_dict(np_vector(tf_input(case, x)))
    assert not mismatches(keras_vector(x), want, x, tol=1e-6 if x.dtype == np.float32
                          else 1e-12)


def test_stacked_states_finalize_as_each_alone_and_as_tensorflow():
    """The Keras point's one host call for a model's layer outputs: the step's states of
    every edge case stacked on a leading axis, their counts zero-padded to the widest and
    their samples in fixed slots (+inf where empty), give row by row exactly each state's
    own vector; and the TensorFlow engine's ``stats.finalize`` of each same state gives the
    same slots (one definition in both engines)."""
    import tensorflow as tf

    from tb_introspect.keras import kernels

    names = sorted(CASES)
    seed = tf.constant([3, 4], tf.int64)
    states = []
    for n in names:
        x = tf.constant(CASES[n])
        states.append(stats.batch_state(
            stats.as_canonical(x, stats.canonical_shape(x.shape.as_list())), 64, seed))
    widths = [max(int(st[key].shape[0]) for st in states)
              for key in ("channel_nnz", "spatial_nnz")]
    padded = [kernels.pad_state(st, *widths) for st in states]
    stacked = {key: np.stack([st[key].numpy() for st in padded]) for key in padded[0]}
    together = stats.finalize_rows(stacked, VIEW, quantiles=Q)
    assert together.shape == (len(names), len(FIELDS))
    for i, name in enumerate(names):
        alone = stats.finalize_rows({k: v[i:i + 1] for k, v in stacked.items()}, VIEW,
                                    quantiles=Q)[0]
        np.testing.assert_array_equal(together[i], alone, err_msg=name)
        in_graph = stats.finalize(states[i], VIEW, quantiles=Q).numpy()
        assert not mismatches(together[i], as_dict(in_graph), CASES[name], tol=1e-12), name


def test_numpy_many_at_once_match_each_alone():
    """``stats_np.tensor_stats_many`` (a logged point's weights and gradient sums: segment
    reductions over one concatenation, padded row sorts) gives each array's own vector:
    every edge case at once, beside a sampled array and one past ``BATCH_MAX``. Counts,
    extremes and percentiles bit for bit; the moments are summed in another order."""
    arrays = [CASES[n] for n in sorted(CASES)]
    arrays += [RNG.standard_t(3, size=(200, 100)).astype(np.float32),
               RNG.normal(size=stats_np.BATCH_MAX + 5)]
    together = stats_np.tensor_stats_many(arrays, VIEW, quantiles=Q, sample_size=K)
    assert together.shape == (len(arrays), len(FIELDS))
    for x, got in zip(arrays, together, strict=True):
        want = stats_np.tensor_stats(x, VIEW, quantiles=Q, sample_size=K)  # content-seeded
        assert not mismatches(got, as_dict(want), x, tol=1e-14)
        for f in FIELDS:
            if f not in MOMENTS:
                np.testing.assert_array_equal(got[FIELDS.index(f)], want[FIELDS.index(f)], f)


def test_two_point_slots_match_their_definitions():
    """``update_ratios``, ``cos_prevs`` and ``implicit_lrs`` over a point's variables at once:
    each variable's value is its own formula's (an empty and an all-zero variable too)."""
    ws = [RNG.normal(size=s).astype(np.float32) for s in [(3, 4), (5000,), (0,), (7,)]]
    ws[3][:] = 0.0
    dws = [RNG.normal(size=w.shape) * 1e-3 for w in ws]
    gs = [RNG.normal(size=w.shape).astype(np.float32) for w in ws]
    ratio = stats_np.update_ratios(ws, dws)
    cos = stats_np.cos_prevs(gs, ws)
    ilr = stats_np.implicit_lrs(dws, gs, Q, 2.0, seed=3)
    for i, (w, dw, g) in enumerate(zip(ws, dws, gs, strict=True)):
        w64, dw64, g64 = (np.asarray(a, np.float64).reshape(-1) for a in (w, dw, g))
        with np.errstate(divide="ignore", invalid="ignore"):
            want_ratio = np.linalg.norm(dw64) / np.linalg.norm(w64)
            want_cos = g64 @ w64 / (np.linalg.norm(g64) * np.linalg.norm(w64))
        np.testing.assert_allclose(ratio[i], want_ratio, rtol=1e-12)
        np.testing.assert_allclose(cos[i], want_cos, rtol=1e-12)
        if dw64.size > stats_np.ILR_SAMPLE:
            pick = np.random.default_rng([3, i]).integers(0, dw64.size, stats_np.ILR_SAMPLE)
            dw64, g64 = dw64[pick], g64[pick]
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.abs(dw64) / (np.abs(g64) * 2.0)
        rate = rate[(g64 != 0) & np.isfinite(rate)]
        want_ilr = np.percentile(rate, Q) if rate.size else np.full(len(Q), np.nan)
        np.testing.assert_allclose(ilr[i], want_ilr, rtol=1e-12)


@pytest.mark.parametrize("partition", [False, True])
@pytest.mark.parametrize("n", [stats_np.quantiles.PARTITION_FROM - 1,
                               stats_np.quantiles.PARTITION_FROM * 2])
def test_numpy_percentiles_are_numpys_on_either_side_of_the_partition_threshold(
        monkeypatch, n, partition):
    """Below ``PARTITION_FROM`` values the numpy producer sorts its sample, from it on it
    sorts or partitions at the order statistics it reads, whichever this CPU runs faster:
    each way gives numpy's own percentiles."""
    monkeypatch.setattr(stats_np.quantiles, "PARTITION", partition)
    x = RNG.standard_cauchy(n)
    x[::7] = 0.0
    got = as_dict(stats_np.tensor_stats(x, VIEW, quantiles=Q, sample_size=None))
    nz = np.abs(x[x != 0])
    for q in Q:
        assert got[slots.quantile_field(q)] == pytest.approx(np.percentile(x, q), rel=1e-12)
        assert got[slots.quantile_field(q, log=True)] == pytest.approx(
            np.percentile(np.log10(nz), q), rel=1e-9, abs=1e-12)
