"""``./probes``: a run's transformer probes per row and field, read from real event files.

The probes are written with ``summary_pb.probes_pb`` next to the synthetic run of
``plugin_testlib.write_run``; the served values are compared with what was written, and the
massive-activation ratio with max(|min|, |max|) of the written output vectors over the
written ``abs_median``, computed here independently of the reader.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2

from tb_introspect import metadata, schema, slots, summary_pb
from tb_introspect.pipeline.sink import EventSink
from tests.plugin.plugin_testlib import App, write_run

STEPS = list(range(0, 40, 4))
NAN = math.nan
ROWS = ("dense", "dense_1", "attn", "out")


def probe_values(row: str, step: int) -> list[float]:
    """abs_median, kurtosis, attn_logit_max, logit_max, logit_lse of ``row`` at ``step``."""
    if row == "attn":
        return [NAN, NAN, 2.0 + step, NAN, NAN]
    if row == "out":
        return [0.25, 3.5, NAN, 1.0 + 0.5 * step, 2.0 + 0.1 * step]
    return [0.01 * (1 + step), 3.0 + 0.1 * step, NAN, NAN, NAN]


def write_probes(run_dir, steps=STEPS, steps_per_epoch=10) -> None:
    sink = EventSink(run_dir)
    for n, step in enumerate(steps):
        pb = summary_pb.probes_pb({r: probe_values(r, step) for r in ROWS},
                                  epoch=step // steps_per_epoch, rows=ROWS,
                                  with_metadata=n == 0)
        sink.add_event(event_pb2.Event(wall_time=2000.0 + step, step=step, summary=pb))
    sink.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("probes")
    written = write_run(str(root / "lm"), STEPS)
    write_probes(str(root / "lm"))  # a second event file of the same run
    write_run(str(root / "old"), STEPS, format_version=3)
    # Another model's probes written later into the same run directory: TensorBoard keeps the
    # first metadata, so those points' rows are not the rows it names.
    write_run(str(root / "mixed"), STEPS)
    write_probes(str(root / "mixed"), STEPS[:5])
    sink = EventSink(str(root / "mixed"))
    for step in STEPS[5:]:
        # As many rows as the first model's (a point of another width is unreadable), in
        # another order: "dense" sits in a slot the metadata gives to another row.
        other = ("other.attn", "dense", "x", "y")
        pb = summary_pb.probes_pb({r: [0.5, 3.0, 7.0, NAN, NAN] for r in other}, rows=other,
                                  with_metadata=False)
        sink.add_event(event_pb2.Event(wall_time=3000.0 + step, step=step, summary=pb))
    sink.close()
    return App(str(root)), written


def test_probes_series_match_what_was_written(env) -> None:
    app, written = env
    doc = app.get("probes?run=lm")
    assert doc["steps"] == STEPS
    assert doc["references"] == schema.PROBE_REFERENCES
    names = [r["name"] for r in doc["rows"]]
    assert sorted(names) == sorted(ROWS)
    kinds = {r["name"]: r["kind"] for r in doc["rows"]}
    assert kinds == {"dense": "output", "dense_1": "output", "attn": "attention", "out": "head"}
    for i, name in enumerate(names):
        for j, f in enumerate(slots.PROBE_VALUE_FIELDS):
            want = [probe_values(name, s)[j] for s in STEPS]
            got = doc["values"][f][i]
            for w, g in zip(want, got, strict=True):
                assert (g is None) if math.isnan(w) else g == pytest.approx(w, rel=1e-6)


def test_massive_ratio_is_max_abs_over_abs_median(env) -> None:
    app, written = env
    doc = app.get("probes?run=lm&field=massive_ratio&field=max_abs")
    assert doc["fields"] == ["massive_ratio", "max_abs"]
    names = [r["name"] for r in doc["rows"]]
    # Only rows with an output tensor of that name have a max|a|: the attention row has none.
    assert sorted(names) == ["dense", "dense_1", "out"]
    for i, name in enumerate(names):
        steps, stats = written.stats[metadata.stats_tag("output", name)]
        max_abs = np.maximum(np.abs(stats["min"]), np.abs(stats["max"]))
        med = np.array([probe_values(name, s)[0] for s in steps])
        np.testing.assert_allclose(doc["values"]["max_abs"][i], max_abs, rtol=1e-9)
        np.testing.assert_allclose(doc["values"]["massive_ratio"][i], max_abs / med, rtol=1e-6)


def test_run_lists_the_probes_and_older_runs_have_none(env) -> None:
    app, _ = env
    run = app.get("run?run=lm")
    assert run["probes"] == {"tag": metadata.probes_tag(), "rows": list(ROWS), "cadence": "step"}
    old = app.get("run?run=old")
    assert old["probes"] is None and old["format_version"] == 3
    doc = app.get("probes?run=old")
    assert doc["rows"] == [] and doc["steps"] == []
    # The rest of an old run reads as before.
    assert len(old["views"]["output"]) == 3


@pytest.mark.parametrize("route, status, message", [
    ("probes", 400, "run"),
    ("probes?run=lm&field=entropy", 400, "unknown probe field 'entropy'"),
    ("probes?run=nope", 404, "not found"),
    (f"series?run=lm&tag={metadata.probes_tag()}", 400, "./probes"),
])
def test_bad_probes_requests_get_a_clear_4xx(env, route, status, message) -> None:
    app, _ = env
    body = app.get(route, status=status)
    assert message in body["error"]


def test_points_whose_rows_are_not_the_metadata_rows_are_null(env) -> None:
    app, _ = env
    doc = app.get("probes?run=mixed&field=abs_median&field=attn_logit_max")
    assert doc["steps"] == STEPS
    rows = {r["name"]: i for i, r in enumerate(doc["rows"])}
    dense = doc["values"]["abs_median"][rows["dense"]]
    assert dense[:5] == pytest.approx([probe_values("dense", s)[0] for s in STEPS[:5]])
    assert dense[5:] == [None] * 5  # another model's row in that slot
    assert doc["values"]["attn_logit_max"][rows["attn"]][5:] == [None] * 5
