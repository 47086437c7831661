"""``point.py``: the slots the host fills in a collector's packed vectors (``epoch``, the
window's step counts, the skipped steps' non-finite values), the summaries of a point and the
epoch's activity maps."""

from __future__ import annotations

import numpy as np
import pytest

from tb_introspect import metadata, slots, stats_np, summary_pb
from tb_introspect.pipeline.failures import Part
from tb_introspect.pipeline.options import Options
from tb_introspect.pipeline.plan import Monitored, Plan
from tb_introspect.pipeline.point import Block, EpochActivity, Point, fill, values

RNG = np.random.default_rng(5)
VARS = [Monitored("variable", n, n.split("/")[0], d, s, "float32")
        for n, d, s in (("a/kernel", 0, (3, 4)), ("b/kernel", 1, (4, 2)), ("b/bias", 1, (2,)))]
OUTS = [Monitored("output", "relu", "relu", 0, (None, 4, 3), "float32", exact=True),
        Monitored("output", "dense", "dense", 1, (None, 5), "float32")]


def plan(every="epoch") -> Plan:
    return Plan(Options.make(every=every, flush_secs=1), variables=list(VARS), outputs=list(OUTS))


def block(view: str, specs: list[Monitored]) -> tuple[Block, np.ndarray]:
    arrays = [RNG.normal(size=[4 if d is None else d for d in s.shape]) for s in specs]
    vectors = stats_np.tensor_stats_many(arrays, view)
    return Block(view, specs, vectors), vectors


def col(view: str, name: str) -> int:
    return slots.tensor_stats_fields(view).index(name)


@pytest.mark.parametrize("every", ["epoch", 4])
def test_the_epoch_and_step_count_slots(every):
    p = plan(every)
    point = Point(window=7, stats_steps=2)
    for view in slots.VIEWS:
        specs = VARS if view in ("variable", "gradient") else OUTS
        b, before = block(view, specs)
        v = fill(b, p, 3, point)
        fields = slots.tensor_stats_fields(view)
        assert v[:, col(view, "epoch")].tolist() == [3] * len(specs)
        filled = {"epoch"}
        if view in ("output", "output_gradient"):
            assert v[:, col(view, "steps")].tolist() == [7, 7]
            assert v[:, col(view, "stats_steps")].tolist() == [2, 2]
            filled |= {"steps", "stats_steps"}
        if view == "output":
            # The rectifier's activity counts every step of the window, with every="epoch".
            want = [7, 2] if every == "epoch" else [2, 2]
            assert v[:, col(view, "activity_steps")].tolist() == want
            filled.add("activity_steps")
        else:
            assert "activity_steps" not in fields
        # Every other slot is the collector's, as it was.
        rest = [i for i, f in enumerate(fields) if f not in filled]
        np.testing.assert_array_equal(v[:, rest], before[:, rest])
        assert not np.shares_memory(v, b.vectors)


def test_the_skipped_steps_nonfinite_values_are_counted_in_the_gradient_view():
    p = plan()
    # [variables, 3]: NaN, +Inf, -Inf of the steps the optimizer skipped, in plan order.
    skipped = np.array([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [4.0, 5.0, 6.0]])
    point = Point(window=3, stats_steps=1, skipped=skipped)
    # A block of some variables, in another order: each row gets its own variable's counts.
    specs = [VARS[2], VARS[0]]
    b, before = block("gradient", specs)
    v = fill(b, p, 0, point)
    for row, i in enumerate([2, 0]):
        for j, f in enumerate(slots.NONFINITE_FIELDS):
            assert v[row, col("gradient", f)] == before[row, col("gradient", f)] + skipped[i, j]
        assert v[row, col("gradient", "count")] == before[row, col("gradient", "count")] + \
            skipped[i].sum()
        # The finite values' statistics are the sum's, without those steps.
        for f in ("finite_count", "mean", "rms", "q50"):
            assert v[row, col("gradient", f)] == before[row, col("gradient", f)]
    # Other views, and a point with no skipped values, are left as they are.
    b, before = block("variable", specs)
    v = fill(b, p, 0, point)
    assert v[:, col("variable", "nan_count")].tolist() == before[
        :, col("variable", "nan_count")].tolist()
    b, before = block("gradient", specs)
    v = fill(b, p, 0, Point(skipped=np.zeros((3, 3))))
    assert v[:, col("gradient", "count")].tolist() == before[:, col("gradient", "count")].tolist()


def test_a_points_summaries():
    p = plan(every=2)
    grads, g = block("gradient", VARS)
    outs, _ = block("output", OUTS)
    point = Point(window=2, stats_steps=1,
                  blocks=[grads, Block("variable", [], np.zeros((0, 0))), outs])
    views = summary_pb.ViewSummaries()
    first = values(p, point, 1, views)
    tags = [s.tag for s in first]
    assert tags == ["introspect/gradient/a/kernel", "introspect/gradient/b/kernel",
                    "introspect/gradient/b/bias", metadata.summary_tag("gradient"),
                    "introspect/output/relu", "introspect/output/dense",
                    metadata.summary_tag("output")]
    np.testing.assert_array_equal(first[0].array, fill(grads, p, 1, point)[0])
    info = metadata.parse_plugin_data(first[1].metadata.plugin_data.content)
    assert (info.view, info.name, info.layer, info.depth, info.cadence) == (
        "gradient", "b/kernel", "b", 1, "step")
    assert list(info.shape) == [4, 2]
    # The view summary's rows are the point's tensors; its metadata goes with the first only.
    assert first[3].metadata is not None
    again = values(p, point, 2, views)
    assert again[3].metadata is None
    # So does every tensor's: TensorBoard keeps a tag's first metadata.
    assert all(s.metadata is not None for s in first)
    assert not any(s.metadata is not None for s in again)
    assert again[0].array[col("gradient", "epoch")] == 2


def activity_row(arrays: list[np.ndarray]) -> np.ndarray:
    """A front-end's activity counts of an output: elements, non-zeros per channel, per
    position."""
    x = np.concatenate(arrays)
    nz = (x != 0).reshape(x.shape[0], -1, x.shape[-1])
    return np.concatenate([[x.size], nz.sum(axis=(0, 1)),
                           nz.sum(axis=(0, 2)) if x.ndim >= 3 else []])


def test_the_epochs_activity_maps_are_the_rates_of_every_counted_row():
    p = plan()
    relu = [np.maximum(RNG.normal(size=(5, 4, 3)) + [-9.0, 0.0, 1.0], 0) for _ in range(3)]
    dense = [RNG.normal(size=(5, 5)) * [1, 1, 0, 1, 1] for _ in range(3)]
    acts = EpochActivity()
    for k in range(3):  # three points in the epoch
        acts.add({0: activity_row([relu[k]]), 1: activity_row([dense[k]])})
    summaries = summary_pb.ViewSummaries()
    maps = acts.take(p, {0: (3, 4), 1: (5, 0)}, epoch=6, summaries=summaries)
    assert [m.tag for m in maps] == [metadata.activity_tag("relu"),
                                              metadata.activity_tag("dense")]
    for m, arrays in zip(maps, (relu, dense), strict=True):
        x = np.concatenate(arrays) != 0
        v = m.array
        channels = x.mean(axis=tuple(range(x.ndim - 1)))
        spatial = x.mean(axis=(0, 2)) if x.ndim == 3 else np.zeros(0)
        np.testing.assert_allclose(v, [6, 15, *channels, *spatial], rtol=1e-12)
    assert maps[0].array[2] == 0  # the dead channel
    # the counts started again
    assert acts.take(p, {0: (3, 4), 1: (5, 0)}, epoch=7, summaries=summaries) == []
    # A map's metadata (a slot name per unit) is in the file once, with its tag's first map.
    assert all(m.metadata is not None for m in maps)
    acts.add({0: activity_row([relu[0]])})
    again = acts.take(p, {0: (3, 4), 1: (5, 0)}, epoch=8, summaries=summaries)
    assert [(m.tag, m.metadata) for m in again] == [(metadata.activity_tag("relu"), None)]
    summaries.restart()  # a new event file
    acts.add({0: activity_row([relu[0]])})
    assert acts.take(p, {0: (3, 4)}, epoch=9, summaries=summaries)[0].metadata is not None


def test_no_map_without_counts_a_written_output_or_units():
    p = plan()
    one = Monitored("output", "scalar", "scalar", 2, (None, 1))
    p.outputs.append(one)
    acts = EpochActivity()
    acts.add({0: np.zeros(1 + 3 + 4), 1: activity_row([np.ones((2, 5))]),
              2: activity_row([np.ones((2, 1))])})
    p.failures.switch_off(Part("output", "dense"))
    # relu: nothing counted; dense: switched off; scalar: one channel, no positions.
    assert acts.take(p, {0: (3, 4), 1: (5, 0), 2: (1, 0)}, epoch=0,
                     summaries=summary_pb.ViewSummaries()) == []
