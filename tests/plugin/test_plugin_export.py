"""``./export``: one tag's every point as a CSV or JSON download, past TensorBoard's own
1,000-point exports, with the step, the epoch, the wall time and every slot."""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest

from tb_introspect import metadata, slots
from tb_introspect.plugin import export
from tests.plugin.plugin_testlib import PREFIX, App, write_run

STEPS = 1500  # more than TensorBoard's exports and the tab's downsampled reads hold
TAG = metadata.stats_tag("gradient", "dense/kernel")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    written = write_run(str(root / "run:1"), range(STEPS), steps_per_epoch=100,
                        views={"gradient": [("dense/kernel", "dense", 0)]})
    return App(str(root)), written


def test_csv_holds_every_point_and_slot(app) -> None:
    a, written = app
    r = a.client.get(PREFIX + f"export?run=run:1&tag={TAG}&format=csv")
    assert r.status_code == 200 and r.mimetype == "text/csv"
    assert r.headers["Content-Disposition"] == \
        'attachment; filename="run_1__gradient_dense_kernel.csv"'
    rows = list(csv.reader(io.StringIO(r.get_data(as_text=True))))
    fields = [f for f in slots.tensor_stats_fields("gradient") if f != "epoch"]
    assert rows[0] == ["step", "epoch", "wall_time", *fields]
    steps, values = written.stats[TAG]
    assert len(rows) == 1 + STEPS
    got = np.array([[float(x) for x in row] for row in rows[1:]])
    np.testing.assert_array_equal(got[:, 0], steps)
    np.testing.assert_array_equal(got[:, 1], steps // 100)
    np.testing.assert_array_equal(got[:, 2], 1000.0 + steps)
    for j, f in enumerate(fields):  # float32 on disk, written back with every digit
        np.testing.assert_allclose(got[:, 3 + j], values[f], rtol=1e-6, err_msg=f)


def test_json_matches_the_series_route(app) -> None:
    a, _ = app
    doc = a.get(f"export?run=run:1&tag={TAG}&format=json")
    series = a.get(f"series?run=run:1&tag={TAG}")["series"][TAG]
    assert doc["run"] == "run:1" and doc["tag"] == TAG
    assert {k: v for k, v in doc.items() if k not in ("run", "tag")} == series
    assert len(doc["steps"]) == STEPS and doc["sampled"] is False


def test_a_metric_exports_its_value(app) -> None:
    a, written = app
    body = a.get(f"export?run=run:1&tag={metadata.metric_tag('loss')}").decode()
    rows = list(csv.reader(io.StringIO(body)))
    assert rows[0] == ["step", "epoch", "wall_time", "value"] and len(rows) == 1 + STEPS
    np.testing.assert_allclose([float(r[3]) for r in rows[1:]], written.metrics["loss"][2],
                               rtol=1e-6)


def test_non_finite_values_read_back() -> None:
    from tb_introspect.read.series import Series, TagInfo

    info = TagInfo(tag="introspect/metric/x", kind="metric", version=1, name="x",
                   fields=("epoch", "value"))
    s = Series(info=info, steps=np.array([1, 2, 3]), wall_times=np.array([1.0, 2.0, 3.0]),
               values=np.array([[0, math.nan], [np.nan, math.inf], [1, -math.inf]]))
    rows = list(csv.reader(io.StringIO(export.csv_bytes(s).decode())))
    assert rows[1:] == [["1", "0", "1.0", "nan"], ["2", "", "2.0", "inf"],
                        ["3", "1", "3.0", "-inf"]]


@pytest.mark.parametrize(("query", "status", "text"), [
    (f"run=run:1&tag={TAG}&format=xml", 400, "format must be one of csv, json"),
    (f"run=run:1&tag={TAG}x", 404, "has no tb-introspect tag"),
    ("run=run:1", 400, "tag"),
    (f"run=nope&tag={TAG}", 404, "nope"),
])
def test_bad_requests_get_a_message(app, query, status, text) -> None:
    a, _ = app
    doc = a.get(f"export?{query}", status=status)
    assert text in doc["error"], doc
