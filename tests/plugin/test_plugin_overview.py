"""The overview's numpy kernels against plain-Python reference implementations."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tb_introspect import slots
from tb_introspect.plugin import overview
from tb_introspect.read import provider
from tb_introspect.read.series import RunSeries, Series, TagInfo


def stack_reference(column: list[float]) -> list[float]:
    """The toolkit's ``_log_normalize`` (natural log), one step, written out plainly."""
    logs = {i: math.log(r) for i, r in enumerate(column) if math.isfinite(r) and r > 0}
    if not logs:
        return [0.0] * len(column)
    low = min(logs.values())
    shifted = {i: v - (low - 1) for i, v in logs.items()}
    total = sum(shifted.values())
    return [shifted.get(i, 0.0) / total for i in range(len(column))]


rms_values = st.one_of(
    st.floats(1e-30, 1e30),
    st.sampled_from([0.0, np.nan, np.inf, -1.0]),
)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, max_side=7),
                  elements=rms_values))
def test_stack_fractions_match_reference(rms: np.ndarray) -> None:
    got = overview.stack_fractions(rms)
    assert got.shape == rms.shape
    for j in range(rms.shape[1]):
        np.testing.assert_allclose(got[:, j], stack_reference(list(rms[:, j])),
                                   rtol=1e-9, atol=1e-12)
        total = got[:, j].sum()
        assert total == pytest.approx(1.0) or total == 0.0


def test_stack_fractions_smallest_layer_gets_one_unit() -> None:
    # rms e^-3, e^-1, 1: logs -3, -1, 0 -> shifted 1, 3, 4 -> fractions 1/8, 3/8, 4/8.
    got = overview.stack_fractions(np.array([[math.exp(-3)], [math.exp(-1)], [1.0]]))
    np.testing.assert_allclose(got[:, 0], [1 / 8, 3 / 8, 4 / 8])


def test_stack_fractions_have_the_toolkits_contrast() -> None:
    # Five layers, RMS 1e-4 .. 1: ln gives 1 .. 1 + ln(1e4) = 10.21 (log10 would give 1 .. 5).
    got = overview.stack_fractions(np.logspace(-4, 0, 5)[:, None])[:, 0]
    assert got[-1] / got[0] == pytest.approx(1 + math.log(1e4))
    assert got[-1] / got[0] > 10.2


def test_stack_rows_pick_each_layers_largest_tensor_in_depth_order() -> None:
    from tb_introspect.read.series import Series, TagInfo

    def tensor(name: str, layer: str, depth: int, count: float) -> Series:
        info = TagInfo(tag=f"introspect/variable/{name}", kind="tensor_stats", version=1,
                       name=name, fields=("count", "rms"), view="variable", layer=layer,
                       depth=depth)
        return Series(info, np.arange(2), np.zeros(2), np.array([[count, 1.0]] * 2))

    series = [
        tensor("bn/beta", "bn", 1, 16), tensor("bn/gamma", "bn", 1, 16),
        tensor("conv/bias", "conv", 0, 16), tensor("conv/kernel", "conv", 0, 432),
        tensor("out/bias", "out", 2, 10), tensor("out/kernel", "out", 2, 160),
    ]
    rows = overview.stack_rows(series)
    # One band per layer; a tie (beta, gamma) keeps the first, as the toolkit's strict ">" does.
    assert [series[i].info.name for i in rows] == ["conv/kernel", "bn/beta", "out/kernel"]


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, max_side=6),
                  elements=st.one_of(st.floats(-1e6, 1e6), st.sampled_from([np.nan, np.inf]))))
def test_band_and_row_summaries_match_reference(m: np.ndarray) -> None:
    q = [0, 25, 50, 90, 100]
    bands = overview.band_over_rows(m, q)
    summary = overview.summarise_rows(m)
    for j in range(m.shape[1]):
        col = [v for v in m[:, j] if math.isfinite(v)]
        if not col:
            assert np.isnan(bands[:, j]).all()
            assert np.isnan(summary["mean"][j]) and summary["worst"][j] == -1
            continue
        np.testing.assert_allclose(bands[:, j], np.percentile(col, q), rtol=1e-9, atol=1e-9)
        assert summary["mean"][j] == pytest.approx(sum(col) / len(col), rel=1e-9, abs=1e-6)
        assert summary["min"][j] == min(col) and summary["max"][j] == max(col)
        assert m[summary["worst"][j], j] == max(col)


def test_column_subset_keeps_first_and_last() -> None:
    idx = overview.column_subset(10_001, 500)
    assert len(idx) <= 500 and idx[0] == 0 and idx[-1] == 10_000
    assert (np.diff(idx) > 0).all()
    np.testing.assert_array_equal(overview.column_subset(7, 500), np.arange(7))
    np.testing.assert_array_equal(overview.column_subset(7, 0), np.arange(7))


def test_epoch_band_from_steps_groups_by_epoch() -> None:
    steps = np.arange(6)
    epochs = np.array([0, 0, 0, 1, 1, np.nan])
    values = np.array([3.0, 1.0, np.nan, 5.0, 7.0, 9.0])
    band = overview.epoch_band_from_steps(values, epochs, steps)
    assert band["epochs"] == [0, 1]
    assert band["steps"] == [2, 4]
    assert band["count"] == [2, 2]
    assert band["min"] == [1.0, 5.0] and band["max"] == [3.0, 7.0]
    assert band["p50"] == [2.0, 6.0] and band["mean"] == [2.0, 6.0]


# -- the implicit learning rate row ------------------------------------------------------------

ILR_LR = 0.05
ROOT = Path(__file__).resolve().parents[2]


def train_ilr_run(log_dir: Path, optimizer_name: str, views=None) -> RunSeries:
    """Three Dense layers trained 3 epochs with the Keras callback, read as the plugin reads it."""
    import keras

    from tb_introspect.keras import Introspect

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 6)).astype("float32")
    y = rng.normal(size=(256, 1)).astype("float32")
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(16, activation="tanh", name="hidden1"),
        keras.layers.Dense(8, activation="tanh", name="hidden2"),
        keras.layers.Dense(1, name="head"),
    ])
    optimizer = (keras.optimizers.SGD(ILR_LR) if optimizer_name == "sgd"
                 else keras.optimizers.Adam(1e-3))
    model.compile(optimizer, "mse")
    kwargs = {} if views is None else {"views": views}
    model.fit(x, y, batch_size=32, epochs=3, verbose=0, shuffle=False,
              callbacks=[Introspect(str(log_dir), **kwargs)])
    (run,) = provider.read_logdir(str(log_dir)).values()
    return run


def test_ilr_row_of_plain_sgd_is_the_learning_rate(tmp_path) -> None:
    run = train_ilr_run(tmp_path, "sgd")
    doc = overview.compute_overview(run)
    v = doc["views"]["variable"]
    ilr = v["ilr"]
    # One row per layer, its largest variable (the kernel), as the stack plot picks it.
    assert [entry["layer"] for entry in ilr["layers"]] == ["hidden1", "hidden2", "head"]
    picked = [v["tensors"][e["tensor"]] for e in ilr["layers"]]
    assert [t["name"].split("/")[-1] for t in picked] == ["kernel"] * 3
    assert [e["tag"] for e in ilr["layers"]] == [t["tag"] for t in picked]
    median = np.array(ilr["median"], dtype=np.float64)
    band = np.array(ilr["band"], dtype=np.float64)
    assert median.shape == (3, len(v["steps"])) == (3, 3)
    assert band.shape == (len(overview.ILR_BAND_QUANTILES), 3)
    # w_t - w_prev = -lr * (sum of the gradients): every layer's median is the rate.
    np.testing.assert_allclose(median, ILR_LR, rtol=1e-3)
    np.testing.assert_allclose(band, ILR_LR, rtol=1e-3)


def test_ilr_row_of_adam_spreads_layers_and_elements(tmp_path) -> None:
    run = train_ilr_run(tmp_path, "adam")
    ilr = overview.compute_overview(run)["views"]["variable"]["ilr"]
    median = np.array(ilr["median"], dtype=np.float64)
    band = np.array(ilr["band"], dtype=np.float64)
    assert np.isfinite(median).all()
    # Adam divides each step by the gradient's running RMS: no layer moves at its rate of
    # 1e-3 per unit gradient (this run: 4-14x), and the layers move at different rates.
    assert (np.abs(median / 1e-3 - 1.0) > 1.0).all(), median
    assert (band[-1] / band[0] > 2.0).all(), band
    np.testing.assert_array_equal(band, np.sort(band, axis=0))
    np.testing.assert_allclose(band[2], np.median(median, axis=0))
    # Within a layer, its elements' rates spread over more than a decade (Layers' ILR mode).
    kernel = run.tensors["variable"][ilr["layers"][0]["tensor"]]
    q0, q100 = kernel.field("ilr_q0"), kernel.field("ilr_q100")
    assert (q100 / q0 > 10.0).all(), (q0, q100)


def test_no_ilr_row_without_the_gradient_view(tmp_path) -> None:
    run = train_ilr_run(tmp_path, "sgd", views=("variable",))
    doc = overview.compute_overview(run)
    assert doc["views"]["variable"]["ilr"] is None
    assert doc["views"]["variable"]["rms_bands"]  # the rest of the weights' row is there


def test_no_ilr_row_in_format_version_1_data() -> None:
    run = provider.read_logdir(str(ROOT / "tests" / "data" / "format_v1"))["adam_cnn"]
    doc = overview.compute_overview(run)
    assert run.format_version == 1
    assert doc["views"]["variable"]["ilr"] is None
    # Only the variable view has the row.
    assert all("ilr" not in v for name, v in doc["views"].items() if name != "variable")


def test_median_fields_interpolate_a_layout_without_q50() -> None:
    def tensor(quantiles: tuple[float, ...]) -> Series:
        fields = tuple(slots.ILR_PREFIX + slots.quantile_field(q) for q in quantiles)
        info = TagInfo(tag="introspect/variable/d/kernel", kind="tensor_stats", version=2,
                       name="d/kernel", fields=fields, view="variable", layer="d",
                       quantiles=quantiles)
        return Series(info, np.arange(1), np.zeros(1), np.zeros((1, len(fields))))

    assert overview.median_fields(tensor((0, 50, 100))) == ("ilr_q50", "ilr_q50", 0.0)
    assert overview.median_fields(tensor((0, 40, 90, 100))) == ("ilr_q40", "ilr_q90", 0.2)
    assert overview.median_fields(tensor((60, 100))) == ("ilr_q60", "ilr_q60", 0.0)
    assert overview.median_fields(tensor(())) is None
