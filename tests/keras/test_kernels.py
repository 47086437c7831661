"""The batched in-step kernels (``collect/kernels.Segments``: one nested call per group of
tensors) give each tensor exactly what its own kernel call gives: the statistics state of
``stats.batch_state``, padded to the layout's widths, and the transformer probes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tb_introspect.keras import kernels, probe_values, probes
from tb_introspect.keras.accumulators import BatchLayout

SAMPLE = 64


def _tensors() -> dict[int, tf.Tensor]:
    """Canonical layer outputs of several ranks, widths, dtypes and contents (by row)."""
    rng = np.random.default_rng(0)
    relu = np.maximum(rng.normal(size=(8, 5, 3)), 0).astype(np.float32)
    relu[:, :, 0] = 0  # a dead channel
    nan = rng.normal(size=(8, 6)).astype(np.float32)
    nan[1, 2], nan[3, 0] = np.nan, np.inf
    return {
        0: tf.constant(relu),
        1: tf.constant(rng.normal(size=(8, 6)).astype(np.float16)),  # computed in float32
        2: tf.constant(nan),
        # row 3: not stashed this step (the empty state)
        4: tf.constant(rng.normal(size=(8, 2, 7)), tf.float64),
        # more than SAMPLE, and than the probes' MEDIAN_SAMPLE
        5: tf.constant(rng.normal(size=(8, 40, 16)).astype(np.float32)),
        6: tf.constant(np.zeros((8, 1), np.float32)),
    }


def _layout(tensors):
    shapes = [(None, *tensors[j].shape[1:]) if j in tensors else (None, 1) for j in range(7)]
    return BatchLayout(shapes, SAMPLE)


def test_one_call_per_group_gives_each_tensor_its_own_kernels_state():
    """Every exact part equal to the tensor's own kernel's; its sample drawn in the one
    call (other random numbers): a sample of its own finite non-zero values, every one of
    them where it has at most ``SAMPLE``."""
    tensors = _tensors()
    layout = _layout(tensors)
    base = tf.constant([40, 7], tf.int64)
    groups = kernels.group_by_dtype(tensors)
    assert [g.dtype for g in groups] == ["float32", "float64"]
    assert [g.rows for g in groups] == [[0, 1, 2, 5, 6], [4]]
    sampled = ("sample_keys", "sample_values", "min_abs")
    for group in groups:
        fn = kernels.activation_states_fn(group.dtype, SAMPLE, layout.max_channels,
                                          layout.max_positions)
        got = fn(group.values, group.sizes, group.units, group.seed(base, 2))
        for n, j in enumerate(group.rows):
            t = tensors[j]
            own = kernels.activation_parts_fn(t.shape.rank, t.dtype.name, SAMPLE, False)
            want = layout.pad(own(t, base + tf.constant([2, j], tf.int64)), j)
            for k in layout.keys:
                if k not in sampled:
                    np.testing.assert_array_equal(got[k][n].numpy(), want[k].numpy(),
                                                  err_msg=f"row {j}, {k}")
            keys, vals = got["sample_keys"][n].numpy(), got["sample_values"][n].numpy()
            kept = np.isfinite(keys)
            x = t.numpy().astype(np.float64).ravel()
            x = x[np.isfinite(x) & (x != 0)]
            assert np.all((keys[kept] > 0) & (keys[kept] < 1)), f"row {j}"
            assert np.isin(vals[kept], x).all(), f"row {j}"
            assert np.all(vals[~kept] == np.inf), f"row {j}"
            if x.size <= SAMPLE:
                np.testing.assert_array_equal(np.sort(vals[kept]), np.sort(x), f"row {j}")
            else:
                assert kept.sum() > SAMPLE / 2, f"row {j}"
            assert got["min_abs"][n].numpy() == (np.abs(vals[kept]).min() if kept.any()
                                                 else np.inf), f"row {j}"


def test_one_call_per_group_gives_each_tensor_its_own_probes():
    """The kurtosis equal to the tensor's own kernel's; the median |a| too where the sample
    holds every value, else (drawn in the one call: other random numbers) the lower median
    of a sample of the tensor's own magnitudes."""
    tensors = _tensors()
    seed = tf.constant([12, 3], tf.int64)
    for group in kernels.group_by_dtype(tensors):
        got = probe_values.output_probes_many_fn(group.dtype)(group.values, group.sizes,
                                                              seed).numpy()
        for n, j in enumerate(group.rows):
            t = tensors[j]
            own = probe_values.output_probes_fn(t.shape.rank, t.dtype.name, False)
            want = own(t, seed + tf.constant([0, 7919 * (j + 1)], tf.int64)).numpy()
            np.testing.assert_array_equal(got[n, 1], want[1], err_msg=f"row {j}")
            a = np.abs(t.numpy().astype(np.float64).ravel())
            a = a[np.isfinite(a)]
            if t.shape.num_elements() <= probe_values.MEDIAN_SAMPLE:
                np.testing.assert_array_equal(got[n, 0], want[0], err_msg=f"row {j}")
            else:
                assert got[n, 0] in a, f"row {j}"
                lo, hi = np.quantile(a, [0.45, 0.55])
                assert lo <= got[n, 0] <= hi, f"row {j}"


@pytest.mark.parametrize("rows", [[2], [0, 5, 1]])
def test_probe_updates_are_scattered_to_their_rows(rows):
    states = probes.ProbeStates([f"r{i}" for i in range(6)], tf.distribute.get_strategy())
    v = tf.constant([1.5, np.nan, 2.0][:len(rows)], tf.float64)
    update = states.update({"abs_median": [(rows, v)], "logit_max": [([4], tf.constant(
        [np.nan], tf.float64))]}).numpy()
    want = states.empty.copy()
    for i, x in zip(rows, v.numpy(), strict=True):
        if np.isfinite(x):
            want[i, 0:2] = [x, 1.0]
    want[4, 2 * len(probes.MEANS) + probes.MAXIMA.index("logit_max")] = np.nan
    np.testing.assert_array_equal(update, want)
